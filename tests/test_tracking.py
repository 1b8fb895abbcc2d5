"""Tracking: an embedded SQLite round trip, and a real `mlflow server` killed mid-run and restarted on the same
port and store: every metric point logged while it was away arrives exactly once, in order, nothing lost."""

from __future__ import annotations

import json
import os
import signal
import socket
import subprocess
import sys
import time
from pathlib import Path

import pytest

from dapo.tracking import MAX_PARAM_VAL_LENGTH, Tracker, resolve_uri


def test_resolve_uri_prefers_config_then_env_then_embedded(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("MLFLOW_TRACKING_URI", "http://env:5000")
    assert resolve_uri("http://cfg:5000", tmp_path) == "http://cfg:5000"
    assert resolve_uri(None, tmp_path) == "http://env:5000"
    monkeypatch.delenv("MLFLOW_TRACKING_URI")
    assert resolve_uri(None, tmp_path) == f"sqlite:///{tmp_path.resolve()}/mlflow.db"


def test_sqlite_round_trip_params_tags_metrics_artifacts(tmp_path: Path) -> None:
    uri = resolve_uri(None, tmp_path / "results")
    tr = Tracker(uri, "exp-a", "row0-s0", tags={"dapo.row": "00_naive_grpo"}, spool_dir=tmp_path / "spool")
    long_value = "x" * (MAX_PARAM_VAL_LENGTH + 500)
    tr.log_params({"algorithm.eps_high": 0.28, "trainer.lr": 1e-6, "long": long_value})
    for step in range(3):
        tr.log_metrics({"reward/accuracy": 0.1 * step, "actor/entropy": 1.0 - 0.25 * step}, step=step)
    art = tmp_path / "samples.jsonl"
    art.write_text('{"a": 1}\n')
    tr.log_artifact(art, artifact_path="eval")
    tr.finish("FINISHED")

    run = tr.client.get_run(tr.run_id)
    assert run.info.status == "FINISHED"
    assert run.data.params["algorithm.eps_high"] == "0.28"
    assert len(run.data.params["long"]) == MAX_PARAM_VAL_LENGTH  # truncated, not rejected
    assert run.data.tags["dapo.row"] == "00_naive_grpo"
    hist = tr.client.get_metric_history(tr.run_id, "actor/entropy")
    assert [(m.step, m.value) for m in sorted(hist, key=lambda m: m.step)] == [(0, 1.0), (1, 0.75), (2, 0.5)]
    assert [f.path for f in tr.client.list_artifacts(tr.run_id, "eval")] == ["eval/samples.jsonl"]
    # artifacts live beside the database, not in ./mlruns of whatever the working directory was
    assert (tmp_path / "results" / "mlartifacts").is_dir()
    assert not tr.spool_path.exists() or tr.spool_path.read_text() == ""

    # resume by id: same run, new points appended, status back to RUNNING
    tr2 = Tracker(uri, "exp-a", None, run_id=tr.run_id, spool_dir=tmp_path / "spool")
    assert tr2.run_id == tr.run_id and tr2.client.get_run(tr.run_id).info.status == "RUNNING"
    tr2.log_metrics({"actor/entropy": 0.4}, step=3)
    # a resumed run whose config changed: MLflow refuses the new value; training goes on, nothing is spooled
    tr2.log_params({"algorithm.eps_high": 0.2})
    assert tr2.client.get_run(tr.run_id).data.params["algorithm.eps_high"] == "0.28"
    assert not tr2.spool_path.exists() or tr2.spool_path.read_text() == ""
    tr2.finish("KILLED")
    assert len(tr2.client.get_metric_history(tr.run_id, "actor/entropy")) == 4
    assert tr2.client.get_run(tr.run_id).info.status == "KILLED"


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def _start_server(store: Path, port: int) -> subprocess.Popen:
    mlflow_bin = Path(sys.executable).with_name("mlflow")
    proc = subprocess.Popen(
        [
            str(mlflow_bin),
            "server",
            "--backend-store-uri",
            f"sqlite:///{store / 'mlflow.db'}",
            "--artifacts-destination",
            str(store / "artifacts"),
            "--host",
            "127.0.0.1",
            "--port",
            str(port),
            "--workers",
            "1",
        ],
        cwd=store,
        stdout=subprocess.DEVNULL,
        stderr=subprocess.DEVNULL,
        start_new_session=True,
    )
    deadline = time.time() + 60
    while time.time() < deadline:
        try:
            with socket.create_connection(("127.0.0.1", port), timeout=0.5):
                pass
            import urllib.request

            with urllib.request.urlopen(f"http://127.0.0.1:{port}/health", timeout=2) as r:
                if r.status == 200:
                    return proc
        except OSError:
            time.sleep(0.3)
        if proc.poll() is not None:
            raise RuntimeError(f"mlflow server exited with {proc.returncode}")
    _stop_server(proc)
    raise RuntimeError("mlflow server did not answer in 60 s")


def _stop_server(proc: subprocess.Popen) -> None:
    # the server was started in its own session: signal its group (its uvicorn worker) through our child's pid
    if proc.poll() is None:
        os.killpg(proc.pid, signal.SIGTERM)
        try:
            proc.wait(timeout=15)
        except subprocess.TimeoutExpired:
            os.killpg(proc.pid, signal.SIGKILL)
            proc.wait()


@pytest.mark.slow
@pytest.mark.timeout(120)
def test_server_killed_mid_run_loses_no_point(tmp_path: Path) -> None:
    store = tmp_path / "server"
    store.mkdir()
    port = _free_port()
    proc = _start_server(store, port)
    try:
        tr = Tracker(
            f"http://127.0.0.1:{port}", "exp-resilient", "row5-s0", spool_dir=tmp_path / "spool", retry_interval_s=0.0
        )
        tr.log_params({"algorithm.eps_high": 0.28})
        for step in range(0, 5):
            tr.log_metrics({"reward/accuracy": step / 10, "time/step": 1.0 + step}, step=step)

        _stop_server(proc)
        t0 = time.monotonic()
        for step in range(5, 10):  # training goes on while the server is away
            tr.log_metrics({"reward/accuracy": step / 10, "time/step": 1.0 + step}, step=step)
        tr.set_tags({"dapo.status": "running"})
        assert time.monotonic() - t0 < 30, "an unreachable server must not block training for long"
        spooled = tr.spool_path.read_text().splitlines()
        assert len(spooled) == 5 * 2 + 1  # 5 steps x 2 metrics + 1 tag, waiting in order
        assert not tr.flush()

        proc = _start_server(store, port)  # same port, same store
        for step in range(10, 12):
            tr.log_metrics({"reward/accuracy": step / 10, "time/step": 1.0 + step}, step=step)
        tr.finish("FINISHED")
        assert tr.spool_path.read_text() == ""

        for key, f in (("reward/accuracy", lambda s: s / 10), ("time/step", lambda s: 1.0 + s)):
            hist = tr.client.get_metric_history(tr.run_id, key)
            steps = sorted(m.step for m in hist)
            assert steps == list(range(12)), f"{key}: every point once, none lost or doubled: {steps}"
            assert all(m.value == pytest.approx(f(m.step)) for m in hist)
        run = tr.client.get_run(tr.run_id)
        assert run.data.tags["dapo.status"] == "running" and run.info.status == "FINISHED"

        # a replay of a point the server already has (written, but the answer was lost) is stored once:
        # MLflow keys metric rows by (key, timestamp, step, value) and the spool keeps the original timestamp
        first = min(hist, key=lambda m: m.step)
        tr.spool_path.write_text(
            json.dumps(
                {
                    "kind": "metric",
                    "key": "time/step",
                    "value": first.value,
                    "step": first.step,
                    "timestamp": first.timestamp,
                }
            )
            + "\n"
        )
        assert tr.flush()
        assert len(tr.client.get_metric_history(tr.run_id, "time/step")) == 12
    finally:
        _stop_server(proc)


def _start_run(uri: str, name: str) -> str:
    from dapo.tracking import Tracker

    t = Tracker(uri, "race", name, spool_dir=Path(uri.removeprefix("sqlite:///")).parent / "spool")
    t.log_metrics({"m": 1.0}, step=0)
    t.finish("FINISHED")
    return t.run_id


def test_runs_starting_at_once_on_a_fresh_sqlite_store(tmp_path):
    """Parallel jobs of one ablation start together; a fresh SQLite store must not lose any of them."""
    import concurrent.futures as cf
    import multiprocessing as mp

    uri = f"sqlite:///{tmp_path / 'mlflow.db'}"
    with cf.ProcessPoolExecutor(3, mp_context=mp.get_context("spawn")) as ex:
        ids = list(ex.map(_start_run, [uri] * 3, ["a", "b", "c"]))
    from mlflow.tracking import MlflowClient

    client = MlflowClient(tracking_uri=uri)
    runs = client.search_runs([client.get_experiment_by_name("race").experiment_id])
    assert sorted(r.info.run_id for r in runs) == sorted(ids) and len(set(ids)) == 3
