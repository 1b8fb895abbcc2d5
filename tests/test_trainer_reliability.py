"""`dapo train` when things go wrong, as real processes: a kill at every log and checkpoint boundary, stop signals
through the workflow's job script (during start-up, and to every process of the job), the stop before a job's
time limit, and the tracking server lost mid-run, at a restart and at the end.

Real engine (HF: bitwise-reproducible sampling), real DeepSpeed, real MLflow (SQLite, and a real `mlflow server`
for the outages), on a very small tiny world (20 supervised steps, built once per session): these tests check
the machinery, not learning.
"""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest
from _env import child_env as env

from dapo import metric_names as M
from dapo.trainer import RESUME_EXIT_CODE
from dapo.trainer import checkpoint as ck

pytestmark = pytest.mark.slow
REPO = Path(__file__).resolve().parent.parent
TRAIN_JOB = REPO / "workflow" / "scripts" / "train_job.sh"
TIMING = ("time/", "perf/")


@pytest.fixture(scope="session")
def world(small_world) -> Path:
    return small_world


WORLD = ["tiny.sft_steps=20", "tiny.n_train=64", "tiny.n_eval=4"]


def args(world: Path, uri: str, *extra: str) -> list[str]:
    return [
        "--config",
        str(REPO / "configs" / "ablations" / "00_naive_grpo.yaml"),
        "--preset",
        "tiny",
        f"tiny.dir={world}",
        *WORLD,
        "trainer.total_steps=3",
        "trainer.train_batch_size=2",
        "trainer.mini_batch_size=1",
        "trainer.checkpoint_every=1",
        "trainer.keep_checkpoints=2",
        "rollout.n=4",
        "rollout.max_response_length=24",
        "rollout.engine=hf",
        "algorithm.overlong_buffer_len=8",
        "data.eval=tiny",  # the world's 4 eval problems: a 640-problem eval at every eval step cost minutes in CI
        "eval.n=2",
        "eval.every=2",
        "eval.pass_k=[1,2]",
        "eval.bootstrap=20",
        f"tracking.uri={uri}",
        "tracking.experiment=rel",
        "tracking.finish_timeout_s=2",
        *extra,
    ]


def train_cmd(run_dir: Path, argv: list[str]) -> list[str]:
    return [sys.executable, "-m", "dapo.cli", "train", *argv, "--run-dir", str(run_dir), "--progress", "log"]


def train(run_dir: Path, argv: list[str], timeout: float = 900, **env_extra: str) -> int:
    run_dir.parent.mkdir(parents=True, exist_ok=True)
    with open(run_dir.parent / f"{run_dir.name}.log", "ab") as log:
        return subprocess.run(
            train_cmd(run_dir, argv), env=env(**env_extra), stdout=log, stderr=subprocess.STDOUT, timeout=timeout
        ).returncode


def log_text(run_dir: Path) -> str:
    p = run_dir.parent / f"{run_dir.name}.log"
    return p.read_text(errors="replace") if p.is_file() else ""


def store(uri: str, experiment: str = "rel") -> tuple[list, dict[str, list[tuple[int, float]]]]:
    """The experiment's runs, and the only run's points: metric -> [(step, value)] in step order."""
    from mlflow.tracking import MlflowClient

    c = MlflowClient(uri)
    runs = c.search_runs([c.get_experiment_by_name(experiment).experiment_id])
    points = {}
    if len(runs) == 1:
        rid = runs[0].info.run_id
        points = {k: sorted((m.step, m.value) for m in c.get_metric_history(rid, k)) for k in runs[0].data.metrics}
    return runs, points


def assert_one_point_per_step(points: dict[str, list[tuple[int, float]]]) -> None:
    for key, pts in points.items():
        steps = [s for s, _ in pts]
        assert len(steps) == len(set(steps)), f"{key}: two points at one step: {steps}"


# ---------------------------------------------------------------------------------------- exactly once
@pytest.fixture(scope="session")
def reference(world, tmp_path_factory):
    """An uninterrupted run: what every interrupted one must end up with."""
    tmp = tmp_path_factory.mktemp("reference")
    uri = f"sqlite:///{tmp / 'mlflow.db'}"
    assert train(tmp / "run", args(world, uri)) == 0, log_text(tmp / "run")
    return store(uri)[1]


# A chain of kills through one run, one at each kind of boundary (the n-th pass counts within one process):
KILLS = [
    "tracking.before_log:1",  # the first evaluation's points are about to be written; no checkpoint yet
    "tracking.after_log:2",  # step 1's points are in MLflow, its checkpoint is not: step 1 is recomputed
    "checkpoint.written:1",  # checkpoint 1 complete but not renamed: a restart from scratch again
    "checkpoint.published:2",  # checkpoint 2 published, 1 not yet pruned
    "tracking.after_log:2",  # (resumed at step 2) step 3's and the final evaluation's points logged, no checkpoint
    "checkpoint.pruned:1",  # step 3's checkpoint published and the old one pruned, DONE.json not written
]


def test_a_kill_at_every_log_and_checkpoint_boundary_leaves_one_run_and_one_point_per_step(world, reference, tmp_path):
    uri = f"sqlite:///{tmp_path / 'mlflow.db'}"
    run_dir = tmp_path / "run"
    for spec in KILLS:
        rc = train(run_dir, args(world, uri), DAPO_TEST_KILL_AT=spec)
        assert rc == -signal.SIGKILL, f"{spec}: the kill point was not reached (exit {rc})\n{log_text(run_dir)[-3000:]}"
        assert not (run_dir / "DONE.json").exists()
    assert train(run_dir, args(world, uri)) == 0, log_text(run_dir)[-3000:]
    runs, points = store(uri)
    assert len(runs) == 1, "a restart must resume the recorded run, not start a second one"
    assert runs[0].info.status == "FINISHED"
    assert_one_point_per_step(points)
    assert {k: [s for s, _ in v] for k, v in points.items()} == {k: [s for s, _ in v] for k, v in reference.items()}
    for key in reference:  # resumed steps are bit-identical, so each kept point equals the uninterrupted run's
        if not key.startswith(TIMING):
            assert points[key] == reference[key], key
    assert json.loads((run_dir / "DONE.json").read_text())["run_id"] == runs[0].info.run_id


# ------------------------------------------------------------------------- signals through the job script
def start_job(run_dir: Path, log: Path, argv: list[str], **env_extra: str) -> subprocess.Popen:
    """The workflow's job script around `dapo train`, in its own process group (as a SLURM job's processes)."""
    return subprocess.Popen(
        ["bash", str(TRAIN_JOB), str(run_dir), str(log), "5", str(RESUME_EXIT_CODE), "", "", *train_cmd(run_dir, argv)],
        env=env(**env_extra),
        start_new_session=True,
        stdout=subprocess.DEVNULL,
        stderr=subprocess.PIPE,
        text=True,
    )


def wait_for(path: Path, text: str, proc: subprocess.Popen, timeout: float = 600) -> None:
    deadline = time.monotonic() + timeout
    while not (path.is_file() and text in path.read_text(errors="replace")):
        assert proc.poll() is None, f"ended (exit {proc.returncode}) before {text!r}: {proc.stderr.read()[-2000:]}"
        assert time.monotonic() < deadline, f"no {text!r} in {path}"
        time.sleep(0.2)


def attempts(run_dir: Path) -> list[dict]:
    return [json.loads(ln) for ln in (run_dir / "attempts.jsonl").read_text().splitlines()]


def test_a_stop_signal_during_start_up_resumes_instead_of_failing(world, tmp_path):
    run_dir, log = tmp_path / "run", tmp_path / "logs" / "train.log"
    p = start_job(run_dir, log, args(world, f"sqlite:///{tmp_path}/m.db"))
    try:
        wait_for(run_dir / "train.log", "dapo train: rank 0 of 1", p)  # loading data, engine and model now
        os.killpg(p.pid, signal.SIGTERM)
        assert p.wait(300) == RESUME_EXIT_CODE, p.stderr.read()
    finally:
        p.kill()
    assert not (run_dir / "FAILED").exists()
    assert attempts(run_dir)[-1]["verdict"] == "resume" and attempts(run_dir)[-1]["code"] == RESUME_EXIT_CODE
    assert "during start-up" in (run_dir / "train.log").read_text()


def test_sigterm_to_every_process_of_the_job_still_exits_75_with_a_checkpoint(world, tmp_path):
    run_dir, log = tmp_path / "run", tmp_path / "logs" / "train.log"
    argv = args(world, f"sqlite:///{tmp_path}/m.db", "trainer.total_steps=6", "trainer.checkpoint_every=100")
    p = start_job(run_dir, log, argv)
    try:
        wait_for(run_dir / "train.log", "step 1/6", p)
        os.killpg(p.pid, signal.SIGTERM)  # the job script's shell, its tee, and the trainer at once
        assert p.wait(300) == RESUME_EXIT_CODE, p.stderr.read()
    finally:
        p.kill()
    assert not (run_dir / "FAILED").exists()
    (last,) = attempts(run_dir)
    assert last["verdict"] == "resume" and last["code"] == RESUME_EXIT_CODE
    state, _, _ = ck.load_checkpoint_state(ck.latest_checkpoint(run_dir))
    assert 1 <= state["step"] < 6  # checkpointed at the signal (periodic checkpoints are off)
    # the log's tee survived the signal: both logs hold the trainer's last words
    assert "exit 75" in (run_dir / "train.log").read_text() and "exit 75" in log.read_text()


def test_the_run_stops_before_the_jobs_time_limit_and_resumes(world, tmp_path):
    """A job that ends in 10 minutes with a 20-minute stop margin: the first step already does not fit."""
    run_dir, uri = tmp_path / "run", f"sqlite:///{tmp_path}/m.db"
    argv = args(world, uri, "trainer.total_steps=2", "trainer.checkpoint_every=0", "trainer.stop_margin_s=1200")
    rc = train(run_dir, argv, SLURM_JOB_END_TIME=str(time.time() + 600))
    assert rc == RESUME_EXIT_CODE, log_text(run_dir)[-3000:]
    assert "left before the job's time limit" in log_text(run_dir)
    state, _, _ = ck.load_checkpoint_state(ck.latest_checkpoint(run_dir))
    assert state["step"] == 1
    assert train(run_dir, argv) == 0  # no limit now: it resumes and finishes into the same run
    runs, points = store(uri)
    assert len(runs) == 1 and [s for s, _ in points[M.GRAD_UPDATES]] == [1, 2]


# ------------------------------------------------------------------------------ the tracking server away
@pytest.mark.timeout(1800)
def test_the_server_lost_at_a_restart_and_at_the_end_loses_nothing(world, tmp_path):
    from _env import free_port, start_mlflow_server, stop_mlflow_server

    server = tmp_path / "server"
    server.mkdir()
    port = free_port()
    uri = f"http://127.0.0.1:{port}"
    run_dir = tmp_path / "run"
    proc = start_mlflow_server(server, port)
    try:
        assert train(run_dir, args(world, uri), DAPO_TEST_KILL_AT="checkpoint.published:2") == -signal.SIGKILL
        stop_mlflow_server(proc)
        # the restart finds the server down: not fatal, it trains to the end and keeps what it could not send
        assert train(run_dir, args(world, uri)) == 0, log_text(run_dir)[-3000:]
        spool = run_dir / "mlflow_spool"
        (note,) = spool.glob("*.undelivered")
        assert "could not be delivered" in note.read_text()
        assert "MLflow unreachable at finish" in log_text(run_dir)
        # a later invocation with the server still down says so, and finishes at once
        assert train(run_dir, args(world, uri)) == 0 and "still wait" in log_text(run_dir)

        proc = start_mlflow_server(server, port)
        assert train(run_dir, args(world, uri)) == 0  # finds the spool, delivers it, marks the run
        runs, points = store(uri)
        assert len(runs) == 1 and runs[0].info.status == "FINISHED"
        assert runs[0].data.tags[M.TAG_STATUS] == "finished"
        assert_one_point_per_step(points)
        assert [s for s, _ in points[M.GRAD_UPDATES]] == [1, 2, 3]
        assert [s for s, _ in points[M.eval_avg(2)]] == [0, 2, 3]
        assert not list(spool.glob("*.undelivered")) and not [p for p in spool.glob("*.jsonl") if p.stat().st_size]
    finally:
        stop_mlflow_server(proc)
