"""Tracking: an embedded SQLite round trip; the run id recorded before anything is logged; one point per (metric,
step) across restarts; and a real `mlflow server` killed mid-run, at a restart and at the end: every point logged
while it was away arrives exactly once, in order, nothing lost, and the run's status lands with them."""

from __future__ import annotations

import json
import time
from pathlib import Path

import pytest
from _env import REPO, free_port, start_mlflow_server, stop_mlflow_server

from dapo import metric_names as M
from dapo.tracking import (
    MAX_PARAM_VAL_LENGTH,
    RUN_FILE,
    UNDELIVERED,
    Tracker,
    TrackingUnavailable,
    read_run_file,
    replay_pending,
    resolve_uri,
)


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


@pytest.mark.slow
@pytest.mark.timeout(600)
def test_server_killed_mid_run_loses_no_point(tmp_path: Path) -> None:
    store = tmp_path / "server"
    store.mkdir()
    port = free_port()
    proc = start_mlflow_server(store, port)
    try:
        tr = Tracker(
            f"http://127.0.0.1:{port}", "exp-resilient", "row5-s0", spool_dir=tmp_path / "spool", retry_interval_s=0.0
        )
        tr.log_params({"algorithm.eps_high": 0.28})
        for step in range(0, 5):
            tr.log_metrics({"reward/accuracy": step / 10, "time/step": 1.0 + step}, step=step)

        stop_mlflow_server(proc)
        t0 = time.monotonic()
        for step in range(5, 10):  # training goes on while the server is away
            tr.log_metrics({"reward/accuracy": step / 10, "time/step": 1.0 + step}, step=step)
        tr.set_tags({"dapo.status": "running"})
        assert time.monotonic() - t0 < 30, "an unreachable server must not block training for long"
        spooled = tr.spool_path.read_text().splitlines()
        assert len(spooled) == 5 * 2 + 1  # 5 steps x 2 metrics + 1 tag, waiting in order
        assert not tr.flush()

        proc = start_mlflow_server(store, port)  # same port, same store
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
        stop_mlflow_server(proc)


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


# ------------------------------------------------------------------------------------ one run, one point per step
def _points(tr: Tracker, key: str) -> list[tuple[int, float]]:
    return sorted((m.step, m.value) for m in tr.client.get_metric_history(tr.run_id, key))


def test_the_run_id_is_recorded_before_anything_is_logged_and_a_restart_reuses_it(tmp_path: Path) -> None:
    uri, spool = f"sqlite:///{tmp_path / 'mlflow.db'}", tmp_path / "run" / "mlflow_spool"
    first = Tracker(uri, "exp", "row-s0", spool_dir=spool, record_run=True)
    assert read_run_file(spool)["run_id"] == first.run_id  # durable before the first point
    # a kill before the first checkpoint: the restarted run has no run id of its own, and finds the recorded one
    again = Tracker(uri, "exp", "row-s0", spool_dir=spool)
    assert again.run_id == first.run_id
    runs = again.client.search_runs([again.client.get_experiment_by_name("exp").experiment_id])
    assert [r.info.run_id for r in runs] == [first.run_id]  # no orphan run
    # an eval's folder (no run.json) always starts its own run
    other = Tracker(uri, "exp", "eval", spool_dir=tmp_path / "eval" / "mlflow_spool")
    assert other.run_id != first.run_id and not (tmp_path / "eval" / "mlflow_spool" / RUN_FILE).exists()


def test_a_resumed_run_keeps_one_point_per_metric_and_step(tmp_path: Path) -> None:
    uri, spool = f"sqlite:///{tmp_path / 'mlflow.db'}", tmp_path / "spool"
    first = Tracker(uri, "exp", "r", spool_dir=spool, record_run=True)
    for step in range(6):  # the first attempt got to step 5; its last checkpoint was at step 2
        first.log_metrics({"reward/mean": float(step), "eval/avg_at_2": 10.0 + step}, step=step)
    resumed = Tracker(uri, "exp", None, spool_dir=spool)
    for step in range(3, 9):  # the resumed attempt recomputes steps 3-5 (here with other values) and goes on
        resumed.log_metrics({"reward/mean": 100.0 + step}, step=step)
    resumed.log_metrics({"eval/avg_at_2": 50.0}, step=8)
    assert _points(resumed, "reward/mean") == [(s, float(s)) for s in range(6)] + [(s, 100.0 + s) for s in (6, 7, 8)]
    assert [s for s, _ in _points(resumed, "eval/avg_at_2")] == [0, 1, 2, 3, 4, 5, 8]
    assert resumed.dropped_points == 3


def test_a_new_run_with_the_server_down_stops_after_its_start_timeout(tmp_path: Path) -> None:
    uri = f"http://127.0.0.1:{free_port()}"  # nothing listens there
    t0 = time.monotonic()
    with pytest.raises(TrackingUnavailable) as err:
        Tracker(uri, "exp", "r", spool_dir=tmp_path / "spool", start_timeout_s=3.0, record_run=True)
    assert 3.0 <= time.monotonic() - t0 < 120
    msg = str(err.value)
    assert uri in msg and "tracking.start_timeout_s" in msg and "mlflow server" in msg
    assert not (tmp_path / "spool" / RUN_FILE).exists()


@pytest.mark.slow
@pytest.mark.timeout(900)
def test_restart_and_finish_while_the_server_is_down_lose_nothing(tmp_path: Path) -> None:
    """A restart while the server is down resumes in spool mode (not fatal); the first attempt's spool and the
    resumed attempt's points merge into one point per step; an outage at the end keeps the spool with a note, and
    a later replay delivers it and marks the run FINISHED."""
    store, spool = tmp_path / "server", tmp_path / "run" / "mlflow_spool"
    store.mkdir()
    port = free_port()
    uri = f"http://127.0.0.1:{port}"
    proc = start_mlflow_server(store, port)
    try:
        first = Tracker(uri, "exp", "r", spool_dir=spool, record_run=True, retry_interval_s=0.0)
        for step in range(5):
            first.log_metrics({"m": float(step)}, step=step)
        stop_mlflow_server(proc)
        for step in (5, 6):  # spooled; then the process is killed (its checkpoint was at step 3)
            first.log_metrics({"m": float(step)}, step=step)
        del first

        resumed = Tracker(uri, "exp", None, spool_dir=spool, retry_interval_s=0.0, finish_timeout_s=1.0)
        for step in range(4, 9):  # recomputes 4-6, then new steps
            resumed.log_metrics({"m": 100.0 + step}, step=step)
        assert resumed.finish("FINISHED") is False
        note = resumed.spool_path.with_suffix(UNDELIVERED)
        assert note.is_file() and "could not be delivered" in note.read_text()

        proc = start_mlflow_server(store, port)
        from mlflow.tracking import MlflowClient

        client = MlflowClient(uri)
        assert client.get_run(resumed.run_id).info.status == "RUNNING"  # nothing delivered yet
        (state,) = replay_pending(tmp_path / "run")
        assert state.waiting == 0 and state.run_id == resumed.run_id
        pts = sorted((m.step, m.value) for m in client.get_metric_history(resumed.run_id, "m"))
        assert pts == [(s, float(s)) for s in range(7)] + [(7, 107.0), (8, 108.0)]
        assert client.get_run(resumed.run_id).info.status == "FINISHED"
        assert not note.exists() and replay_pending(tmp_path / "run") == []
        runs = client.search_runs([client.get_experiment_by_name("exp").experiment_id])
        assert len(runs) == 1
    finally:
        stop_mlflow_server(proc)


@pytest.mark.slow
@pytest.mark.timeout(900)
def test_a_tiny_training_logs_to_an_authenticated_server_with_credentials_from_the_environment(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, tiny_world_dir: Path
) -> None:
    """The cluster setup the README recommends: `mlflow server --app-name basic-auth`, a user created by the admin,
    credentials only in the environment. The workflow's check and `dapo train` work with them; a request without
    them is refused, and so is a run: at once, as a final error (exit 2), not as a server to wait for (exit 75)."""
    import subprocess
    import sys
    import urllib.error
    import urllib.request

    from _env import child_env
    from mlflow.server import get_app_client
    from mlflow.tracking import MlflowClient

    from dapo.cluster import TrackingStoreError, check_tracking_store
    from dapo.tracking import TrackingRefused

    store = tmp_path / "server"
    store.mkdir()
    port = free_port()
    uri = f"http://127.0.0.1:{port}"
    alice = {"MLFLOW_TRACKING_USERNAME": "alice", "MLFLOW_TRACKING_PASSWORD": "alice-secret-4711"}
    proc = start_mlflow_server(store, port, admin_password="admin-secret-0815")
    try:
        monkeypatch.setenv("MLFLOW_TRACKING_USERNAME", "admin")
        monkeypatch.setenv("MLFLOW_TRACKING_PASSWORD", "admin-secret-0815")
        get_app_client("basic-auth", tracking_uri=uri).create_user(
            alice["MLFLOW_TRACKING_USERNAME"], "alice-secret-4711"
        )
        monkeypatch.delenv("MLFLOW_TRACKING_USERNAME")
        monkeypatch.delenv("MLFLOW_TRACKING_PASSWORD")

        # without credentials: the API refuses, the workflow's check stops (naming the variables), a run stops at once
        with pytest.raises(urllib.error.HTTPError) as http:
            urllib.request.urlopen(f"{uri}/api/2.0/mlflow/experiments/search?max_results=1", timeout=30)
        assert http.value.code == 401
        with pytest.raises(TrackingStoreError, match="MLFLOW_TRACKING_USERNAME and MLFLOW_TRACKING_PASSWORD"):
            check_tracking_store(uri, cluster=True)
        t0 = time.monotonic()
        with pytest.raises(TrackingRefused, match="UNAUTHENTICATED for user \\(none set\\).*MLFLOW_TRACKING_PASSWORD"):
            Tracker(uri, "auth", "r", spool_dir=tmp_path / "spool", start_timeout_s=120)
        assert time.monotonic() - t0 < 60  # refused, not retried for start_timeout_s

        # with alice's credentials in the environment: the check passes and a tiny training lands in the server
        for k, v in alice.items():
            monkeypatch.setenv(k, v)
        assert check_tracking_store(uri, cluster=True) == []
        run_dir = tmp_path / "run"
        argv = [sys.executable, "-m", "dapo.cli", "train", "--config", "configs/ablations/00_naive_grpo.yaml"]
        argv += ["--preset", "tiny", "--run-dir", str(run_dir), "--progress", "log", f"tiny.dir={tiny_world_dir}"]
        argv += [
            "data.eval=tiny",
            "trainer.total_steps=1",
            "trainer.train_batch_size=2",
            "trainer.mini_batch_size=1",
            "trainer.checkpoint_every=0",
            "rollout.engine=hf",
            "rollout.n=2",
            "rollout.max_response_length=16",
            "algorithm.overlong_buffer_len=8",
            "eval.every=0",
            "eval.bootstrap=10",
            f"tracking.uri={uri}",
            "tracking.experiment=auth",
        ]
        r = subprocess.run(argv, cwd=REPO, env=child_env(**alice), capture_output=True, text=True, timeout=600)
        assert r.returncode == 0, r.stderr[-3000:]
        client = MlflowClient(uri)
        (run,) = client.search_runs([client.get_experiment_by_name("auth").experiment_id])
        assert run.info.status == "FINISHED" and run.data.tags[M.TAG_ROW] == "00_naive_grpo"
        assert M.eval_avg(1) in run.data.metrics and client.get_metric_history(run.info.run_id, M.REWARD_MEAN)
        assert "alice-secret" not in json.dumps(run.data.params) + r.stdout + r.stderr  # nothing logs the password

        # a wrong password: `dapo train` stops with the config-error code (2), which the job script never requeues
        from dapo.commands.train import _exit_code_of, _open_run
        from dapo.config import ConfigError, load_config

        monkeypatch.setenv("MLFLOW_TRACKING_PASSWORD", "guess")
        cfg = load_config(preset="tiny", overrides=[f"tracking.uri={uri}", "tracking.experiment=auth"])
        with pytest.raises(ConfigError, match="refused to start a run.*UNAUTHENTICATED for user alice") as err:
            _open_run(cfg, tmp_path / "run-refused")
        assert _exit_code_of(err.value) == 2
    finally:
        stop_mlflow_server(proc)


def test_a_refused_record_loses_only_itself_and_the_run_names_it(tmp_path: Path) -> None:
    """A param the store refuses (here: changed on resume) used to take its whole batch down with it; now the
    rest of the batch is written, and the refused record is counted in a run tag and named in the log."""
    uri = f"sqlite:///{tmp_path / 'mlflow.db'}"
    tr = Tracker(uri, "exp", "r", spool_dir=tmp_path / "spool")
    tr.log_params({"trainer.lr": 1e-6})
    tr.log_params({"a.x": 1, "b.y": 2, "trainer.lr": 2e-6, "c.z": 3, "d.w": 4})  # one batch, one bad record
    tr.finish("FINISHED")
    run = tr.client.get_run(tr.run_id)
    kept = {k: run.data.params[k] for k in ("a.x", "b.y", "c.z", "d.w")}
    assert kept == {"a.x": "1", "b.y": "2", "c.z": "3", "d.w": "4"}
    assert run.data.params["trainer.lr"] == "1e-06"
    assert tr.refused == ["param trainer.lr"]
    assert run.data.tags[M.TAG_REFUSED_RECORDS] == "1" and run.info.status == "FINISHED"


def test_a_watcher_thread_finishing_the_run_waits_for_the_loops_write(tmp_path: Path) -> None:
    """A peer's failure is noticed on a watcher thread, which marks the run failed and finishes it while the
    training loop may be writing: the finish waits for that write instead of interleaving with it."""
    import threading

    tr = Tracker(f"sqlite:///{tmp_path / 'mlflow.db'}", "exp", "r", spool_dir=tmp_path / "spool")
    entered, release = threading.Event(), threading.Event()
    real_write = tr.sink._write

    def slow_write(kind, recs):
        if kind == "metric" and not release.is_set():
            entered.set()
            release.wait(10)
        real_write(kind, recs)

    tr.sink._write = slow_write
    loop = threading.Thread(target=tr.log_metrics, args=({"reward/mean": 1.0}, 1))
    loop.start()
    assert entered.wait(10)
    watcher = threading.Thread(target=tr.finish, args=("FAILED",))
    watcher.start()
    watcher.join(0.5)
    assert watcher.is_alive()  # held back while the loop's write is under way
    release.set()
    loop.join(10)
    watcher.join(10)
    run = tr.client.get_run(tr.run_id)
    assert run.info.status == "FAILED" and run.data.metrics["reward/mean"] == 1.0


def test_a_tracker_leaves_the_process_environment_as_it_found_it(tmp_path: Path, monkeypatch: pytest.MonkeyPatch):
    """MLflow's HTTP retry and timeout settings (read from os.environ per request) are set around the tracker's own
    calls only: its constructor, writes and finish leave the environment as they found it, and a user's own value
    wins inside the scope and stays after it."""
    import os

    from dapo import tracking

    for k in tracking._HTTP_ENV:
        monkeypatch.delenv(k, raising=False)
    before = dict(os.environ)
    tr = Tracker(f"sqlite:///{tmp_path / 'mlflow.db'}", "exp", "r", spool_dir=tmp_path / "spool")
    assert dict(os.environ) == before
    seen, real_log_batch = [], tr.client.log_batch

    def log_batch(*args, **kwargs):
        seen.append({k: os.environ.get(k) for k in tracking._HTTP_ENV})
        return real_log_batch(*args, **kwargs)

    tr.client.log_batch = log_batch
    tr.log_metrics({"reward/mean": 1.0}, step=0)
    tr.finish("FINISHED")
    assert dict(os.environ) == before
    assert seen == [tracking._HTTP_ENV]  # inside the tracker's call, MLflow saw the fail-fast settings
    monkeypatch.setenv("MLFLOW_HTTP_REQUEST_TIMEOUT", "60")
    with tracking.fail_fast_http():
        assert (
            os.environ["MLFLOW_HTTP_REQUEST_TIMEOUT"] == "60" and os.environ["MLFLOW_HTTP_REQUEST_MAX_RETRIES"] == "1"
        )
    assert os.environ["MLFLOW_HTTP_REQUEST_TIMEOUT"] == "60" and "MLFLOW_HTTP_REQUEST_MAX_RETRIES" not in os.environ
