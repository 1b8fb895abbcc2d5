"""The Snakemake workflow: validation before scheduling, the paper-scale plan, resumable train jobs, and the
whole tiny ablation through a real SLURM cluster (skipped without one, except in CI where it must run)."""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
import time
from pathlib import Path

import pytest

from dapo.metric_names import PAPER_TABLE1, TAG_ROW, eval_avg

REPO = Path(__file__).resolve().parent.parent
SNAKEMAKE = str(Path(sys.executable).parent / "snakemake")
TRAIN_JOB = REPO / "workflow" / "scripts" / "train_job.sh"


def snakemake(*args: str, timeout: float = 120, env: dict | None = None) -> subprocess.CompletedProcess:
    """Run snakemake from the repository root, as a user does (the profile is looked up relative to it)."""
    return subprocess.run(
        [SNAKEMAKE, *args],
        cwd=REPO,
        capture_output=True,
        text=True,
        timeout=timeout,
        env={**os.environ, **(env or {})},
    )


# ------------------------------------------------------------------------------------------ job script
@pytest.mark.parametrize(
    "attempt, code, prior_failed, want_rc, want_failed",
    [
        (1, 0, False, 0, False),  # finished
        (1, 75, False, 75, False),  # cut off by SLURM: resubmit and resume, not a failure
        (2, 75, False, 75, False),  # cut off again
        (1, 3, False, 3, True),  # a real failure is final
        (2, 0, True, 1, True),  # a later attempt after a real failure stops at once, without running
        (1, 0, True, 0, False),  # a new Snakemake invocation (attempt 1) tries again
    ],
)
def test_train_job_sorts_resume_from_failure(tmp_path, attempt, code, prior_failed, want_rc, want_failed):
    run_dir, log, ran = tmp_path / "run", tmp_path / "logs" / "train.log", tmp_path / "ran"
    run_dir.mkdir()
    if prior_failed:
        (run_dir / "FAILED").write_text("3\n")
    r = subprocess.run(
        [
            "bash",
            str(TRAIN_JOB),
            str(run_dir),
            str(attempt),
            str(log),
            "bash",
            "-c",
            f"touch {ran}; echo trace-{code}; exit {code}",
        ],
        capture_output=True,
        text=True,
    )
    assert r.returncode == want_rc, r.stderr
    assert (run_dir / "FAILED").exists() == want_failed
    ran_now = not (prior_failed and attempt > 1)
    assert ran.exists() == ran_now
    if want_rc not in (0, 75):
        # a failed job is reported with its log path; every attempt's output is kept in the run directory
        assert str(run_dir / "train.log") in r.stderr
    if ran_now:
        assert f"trace-{code}" in log.read_text() and f"trace-{code}" in (run_dir / "train.log").read_text()


def test_first_failure_survives_snakemake_truncating_the_log(tmp_path):
    run_dir, log = tmp_path / "run", tmp_path / "train.log"
    run_dir.mkdir()
    subprocess.run(["bash", str(TRAIN_JOB), str(run_dir), "1", str(log), "bash", "-c", "echo boom-trace; exit 3"])
    log.write_text("")  # what a retry may do to the rule's log
    r = subprocess.run(["bash", str(TRAIN_JOB), str(run_dir), "2", str(log), "true"], capture_output=True, text=True)
    assert r.returncode == 1
    assert "boom-trace" in (run_dir / "train.log").read_text()


# ------------------------------------------------------------------------------------------ validation
def test_the_workflow_uses_the_tiny_world_the_tests_cache(tmp_path):
    """One default location (the config's tiny.dir, results/tiny_world): `make test` then `make ablation` build
    the default world once, whatever `results` is."""
    r = snakemake("-n", "all_ablations", "--config", f"results={tmp_path}")
    assert r.returncode == 0, r.stderr
    assert str(REPO / "results" / "tiny_world" / "manifest.json") in r.stdout
    assert "tiny_world/manifest.json" not in r.stdout.replace(str(REPO / "results" / "tiny_world"), "")


def test_bad_override_stops_the_workflow_before_any_job(tmp_path):
    r = snakemake("-n", "all_ablations", "--config", f"results={tmp_path}", 'overrides=["algorithm.eps_high=0.1"]')
    assert r.returncode != 0
    out = r.stdout + r.stderr
    assert "eps_high" in out and "command line" in out and "00_naive_grpo.yaml" in out
    assert "Job stats" not in out
    assert not any(tmp_path.iterdir())  # nothing was written


def test_unknown_row_and_schema_errors_are_named(tmp_path):
    r = snakemake("-n", "all_ablations", "--config", f"results={tmp_path}", "rows=[06_magic]")
    out = r.stdout + r.stderr
    assert r.returncode != 0 and "06_magic" in out and "00_naive_grpo" in out
    r = snakemake("-n", "all_ablations", "--config", f"results={tmp_path}", "seeds=oops")
    assert r.returncode != 0 and "seeds" in r.stdout + r.stderr


def test_tiny_plan_is_six_rows_by_seeds(tmp_path):
    world = f"tiny_world={tmp_path / 'world'}"  # a world not built yet, so the plan has its job
    r = snakemake("-n", "all_ablations", "--config", f"results={tmp_path}", "seeds=[0,1]", world)
    assert r.returncode == 0, r.stderr
    stats = _job_stats(r.stdout)
    assert stats["train"] == 12 and stats["evaluate"] == 12 and stats["report"] == 1
    assert stats["tiny_world"] == 1 and stats["prepare_data"] == 1
    assert "CPU only (no GPU budget)" in r.stderr and "per-GPU memory" not in r.stderr
    # the longest jobs (dynamic sampling) are scheduled first, so two cores stay busy to the end
    trains = [b for b in r.stdout.split("\nrule ") if b.startswith("train:")]
    first = {b.split("row=")[1].split(",")[0] for b in trains if "priority: 1" in b}
    assert first == {"05_dynamic_sampling"} and len(trains) == 12


def test_one_target_per_row(tmp_path):
    r = snakemake("-n", "row_02_clip_higher", "--config", f"results={tmp_path}")
    assert r.returncode == 0, r.stderr
    stats = _job_stats(r.stdout)
    assert stats["train"] == 1 and "report" not in stats


def test_paper_plan_dry_run_with_the_slurm_profile(tmp_path):
    """`snakemake -n --profile slurm all_ablations` with the 32B preset prints the plan in seconds, no GPUs."""
    t0 = time.monotonic()
    r = snakemake("-n", "--profile", "slurm", "all_ablations", "--config", "preset=qwen2.5-32b", f"results={tmp_path}")
    elapsed = time.monotonic() - t0
    assert r.returncode == 0, r.stderr[-3000:]
    assert elapsed < 60
    out = r.stdout + r.stderr
    assert "Using profile slurm" in out
    assert "16 node(s) x 8 GPU(s) h100" in out and "GPU-hours" in out
    stats = _job_stats(r.stdout)
    assert stats["train"] == 6 and stats["base_model"] == 1
    # the train jobs ask SLURM for 16 nodes, 128 GPUs and one srun task per GPU
    assert "nodes=16" in out and "gpu=128" in out and "gpu_model=h100" in out and "tasks=128" in out
    # the per-GPU memory budget with its arithmetic, and the cost of every row (dapo.plan; tests/test_plan.py)
    assert "per-GPU memory" in out and "KV cache" in out and "activations" in out and ": fits" in out
    assert "cost per row" in out and all(f"    {row}" in out for row in PAPER_TABLE1)


def test_paper_plan_that_does_not_fit_the_gpu_is_refused(tmp_path):
    """On a 40 GiB GPU (--config plan=...) the 32B preset does not fit: refused with the keys to change."""
    r = snakemake(
        "-n",
        "--profile",
        "slurm",
        "all_ablations",
        "--config",
        "preset=qwen2.5-32b",
        f"results={tmp_path}",
        "plan={gpu_memory_gib: 40}",
    )
    assert r.returncode != 0
    assert "DOES NOT FIT" in r.stderr and "trainer.micro_batch_tokens" in r.stderr
    assert "rollout.gpu_memory_utilization" in r.stderr and "Job stats" not in r.stdout


def _job_stats(stdout: str) -> dict[str, int]:
    lines = stdout.split("Job stats:")[1].splitlines()
    stats = {}
    for line in lines[3:]:
        parts = line.split()
        if len(parts) != 2 or not parts[1].isdigit():
            break
        stats[parts[0]] = int(parts[1])
    return stats


# ------------------------------------------------------------------------------------------ real SLURM
def _slurm_answers() -> bool:
    if not shutil.which("sinfo") or not shutil.which("sacct"):
        return False
    r = subprocess.run(["sinfo", "-h", "-o", "%T"], capture_output=True, text=True)
    s = subprocess.run(["sacct", "-n", "-X"], capture_output=True, text=True)
    return r.returncode == 0 and any(x in r.stdout for x in ("idle", "mixed")) and s.returncode == 0


# The tiny preset cut to a few steps, so six rows train and evaluate in minutes on two cores.
CI_OVERRIDES = [
    "trainer.total_steps=2",
    "trainer.train_batch_size=4",
    "trainer.mini_batch_size=2",
    "algorithm.gen_batch_size=8",
    "trainer.checkpoint_every=1",
    "eval.n=2",
    "data.eval=tiny",  # the 30-problem split: the preset's 640 would triple the eval time
    "eval.every=0",
    "eval.bootstrap=50",
    "eval.pass_k=[1,2]",
]


@pytest.mark.slurm
@pytest.mark.slow
def test_all_ablations_through_slurm(tmp_path, in_ci, tiny_world_dir):
    if not _slurm_answers():
        if in_ci:
            pytest.fail("CI=true but no SLURM cluster answers: .ci/run starts one (scripts/slurm/start.sh)")
        pytest.skip("no SLURM cluster answers here (start one with `make services`, as root)")
    results = tmp_path / "results"
    overrides = json.dumps(CI_OVERRIDES)
    r = snakemake(
        "--profile",
        "slurm",
        "all_ablations",
        "--config",
        f"results={results}",
        f"overrides={overrides}",
        f"tiny_world={tiny_world_dir}",
        timeout=1800,
    )
    log = r.stdout[-4000:] + r.stderr[-6000:]
    assert r.returncode == 0, log
    assert "sbatch" in log or "SLURM" in log  # the jobs went through the cluster
    report = results / "tiny" / "report"
    table = (report / "table1.md").read_text()
    for label, _paper in PAPER_TABLE1.values():
        assert label in table
    # every row's MLflow run finished, with its eval metrics
    from mlflow.tracking import MlflowClient

    client = MlflowClient(tracking_uri=f"sqlite:///{results / 'tiny' / 'mlflow.db'}")
    exp = client.get_experiment_by_name("dapo-tiny")
    runs = client.search_runs([exp.experiment_id])
    by_row = {run.data.tags.get(TAG_ROW): run for run in runs}
    assert set(PAPER_TABLE1) <= set(by_row), sorted(by_row)
    for row in PAPER_TABLE1:
        run = by_row[row]
        assert run.info.status == "FINISHED", (row, run.info.status)
        assert eval_avg(2) in run.data.metrics, (row, sorted(run.data.metrics))
    # a rerun skips finished work
    r2 = snakemake(
        "--profile",
        "slurm",
        "all_ablations",
        "--config",
        f"results={results}",
        f"overrides={overrides}",
        f"tiny_world={tiny_world_dir}",
        timeout=300,
    )
    assert r2.returncode == 0 and "Nothing to be done" in r2.stdout + r2.stderr
