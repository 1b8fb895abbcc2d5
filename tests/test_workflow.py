"""The Snakemake workflow: validation before scheduling, the paper-scale plan, resumable train jobs. The whole tiny
ablation through a real SLURM cluster is tests/test_slurm.py's, with the other tests that share the cluster."""

from __future__ import annotations

import json
import os
import re
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

from dapo.metric_names import PAPER_TABLE1
from dapo.trainer import RESUME_EXIT_CODE

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
def job(run_dir: Path, log: Path, *cmd: str, env: dict | None = None, max_resubmits: int = 5, srun: str = ""):
    """workflow/scripts/train_job.sh around a command, as the train rule calls it."""
    return subprocess.run(
        ["bash", str(TRAIN_JOB), str(run_dir), str(log), str(max_resubmits), str(RESUME_EXIT_CODE), srun, "", *cmd],
        capture_output=True,
        text=True,
        env={**os.environ, **(env or {})},
    )


def verdicts(run_dir: Path) -> list[str]:
    return [json.loads(ln)["verdict"] for ln in (run_dir / "attempts.jsonl").read_text().splitlines()]


@pytest.mark.parametrize(
    "script, want_rc, verdict",
    [
        ("exit 0", 0, "done"),
        ("exit 75", 75, "resume"),  # stopped for resume (time limit, preemption)
        ("kill -TERM $$", 75, "resume"),  # killed by a stop signal before it could answer: resumable
        ("kill -KILL $$", 75, "resume"),  # killed at the end of the grace period
        ("exit 3", 3, "failed"),  # its own failure: final
        ("kill -SEGV $$", 139, "failed"),
        # the trainer's own word wins over the launcher's code (srun kills the other ranks once one exits 75)
        ('echo \'{"code": 75}\' > "$RUN/EXIT.json"; exit 137', 75, "resume"),
        ('echo \'{"code": 2}\' > "$RUN/EXIT.json"; exit 137', 2, "failed"),
    ],
)
def test_train_job_sorts_done_resume_and_failure(tmp_path, script, want_rc, verdict):
    run_dir, log = tmp_path / "run", tmp_path / "logs" / "train.log"
    r = job(run_dir, log, "bash", "-c", f"echo trace-out; {script}", env={"RUN": str(run_dir)})
    assert r.returncode == want_rc, r.stderr
    assert verdicts(run_dir) == [verdict]
    assert (run_dir / "FAILED").exists() == (verdict == "failed")
    if verdict == "failed":
        # reported with its log path; every attempt's output is kept in the run directory
        assert str(run_dir / "train.log") in r.stderr and (run_dir / "FAILED").read_text().strip() == str(want_rc)
    if verdict == "resume":
        assert "run the same command again to resume" in r.stderr  # outside SLURM nothing requeues
    assert "trace-out" in log.read_text() and "trace-out" in (run_dir / "train.log").read_text()


def test_an_old_exit_file_and_an_old_failure_do_not_decide_a_new_attempt(tmp_path):
    run_dir, log = tmp_path / "run", tmp_path / "train.log"
    assert (
        job(run_dir, log, "bash", "-c", 'echo \'{"code": 1}\' > "$0/EXIT.json"; exit 1', str(run_dir)).returncode == 1
    )
    assert (run_dir / "FAILED").exists()
    log.write_text("")  # what Snakemake may do to a rule's log
    r = job(run_dir, log, "bash", "-c", "echo second; exit 0")
    assert r.returncode == 0 and not (run_dir / "FAILED").exists() and verdicts(run_dir) == ["failed", "done"]
    kept = (run_dir / "train.log").read_text()  # every attempt's output survives a truncated rule log
    assert "== attempt 1" in kept and "== attempt 2" in kept and "second" in kept


def _fake_slurm(tmp_path: Path) -> dict[str, str]:
    """`srun` and `scontrol` stand-ins that record their arguments (the decision logic, without a cluster)."""
    bin_dir = tmp_path / "bin"
    bin_dir.mkdir()
    calls = tmp_path / "calls"
    (bin_dir / "srun").write_text(
        f'#!/bin/bash\necho "srun $*" >> {calls}\nwhile [[ $1 == --* ]]; do shift; done\nexec "$@"\n'
    )
    (bin_dir / "scontrol").write_text(f'#!/bin/bash\necho "scontrol $*" >> {calls}\n')
    for f in bin_dir.iterdir():
        f.chmod(0o755)
    return {"PATH": f"{bin_dir}:{os.environ['PATH']}", "SLURM_JOB_ID": "4242"}


def test_under_slurm_a_stop_requeues_the_job_up_to_max_resubmits(tmp_path):
    run_dir, log, env = tmp_path / "run", tmp_path / "train.log", _fake_slurm(tmp_path)
    srun = "--nodes=1 --ntasks=2 --ntasks-per-node=2 --kill-on-bad-exit=1"
    for _ in range(3):
        r = job(run_dir, log, "bash", "-c", "exit 75", env=env, max_resubmits=2, srun=srun)
        assert r.returncode == 75
    calls = (tmp_path / "calls").read_text().splitlines()
    assert calls.count(f"srun {srun} bash -c exit 75") == 3  # the layout is spelled out to srun every time
    assert calls.count("scontrol requeue 4242") == 2  # the third stop is beyond max_resubmits=2
    assert "already resubmitted 2 time(s)" in r.stderr and "rerun the workflow" in r.stderr
    r = job(run_dir, log, "bash", "-c", "exit 5", env=env, srun=srun)
    assert r.returncode == 5 and (tmp_path / "calls").read_text().count("requeue") == 2  # a failure never requeues
    assert verdicts(run_dir) == ["resume", "resume", "resume", "failed"]


def test_under_slurm_a_task_that_failed_alone_fails_and_a_lost_node_resumes(tmp_path):
    """Two verdicts only SLURM's side knows. A task that exits 1 while the ranks import (before they can report
    it) makes srun stop rank 0, which says "resume" (a stop during start-up): srun's own line for the task is the
    verdict, so a crash is not resubmitted (unless a rank had found a peer lost: then it is that loss). A trainer
    that ends with 1 while a node of the job is down or not responding (its ranks died with it; NCCL's watchdog
    aborted the others) resumes instead of failing for good."""
    run_dir, log, env = tmp_path / "run", tmp_path / "train.log", _fake_slurm(tmp_path)
    srun = "--nodes=2 --ntasks=2 --ntasks-per-node=1 --kill-on-bad-exit=1"
    crash = (
        'echo "srun: error: n2: task 1: Exited with exit code 1" >&2; echo \'{"code": 75}\' > "$0/EXIT.json"; exit 75'
    )
    r = job(run_dir, log, "bash", "-c", crash, str(run_dir), env=env, srun=srun)
    assert r.returncode == 1 and verdicts(run_dir) == ["failed"], r.stderr
    assert "a task exited with 1 before its ranks could report it" in (run_dir / "train.log").read_text()
    # ... but once a rank found a peer lost, another task's 1 is that loss seen from its side: resume
    lost = 'echo "ERROR dapo.distributed: a peer is lost (rank 1 sent no heartbeat for 121 s)"; ' + crash
    r = job(run_dir, log, "bash", "-c", lost, str(run_dir), env=env, srun=srun)
    assert r.returncode == 75 and verdicts(run_dir) == ["failed", "resume"], r.stderr
    sinfo = Path(env["PATH"].split(":")[0]) / "sinfo"
    sinfo.write_text('#!/bin/bash\necho "n1 mixed"; echo "n2 down*"\n')
    sinfo.chmod(0o755)
    r = job(run_dir, log, "bash", "-c", "exit 1", env={**env, "SLURM_JOB_NODELIST": "n[1-2]"}, srun=srun)
    assert r.returncode == 75 and verdicts(run_dir) == ["failed", "resume", "resume"], r.stderr
    assert "node(s) of this job are down or not responding: n2 (down*)" in (run_dir / "train.log").read_text()
    assert (tmp_path / "calls").read_text().count("scontrol requeue 4242") == 2


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
    # the trainer evaluates inside its own job: no separate evaluation jobs
    assert stats["train"] == 12 and "evaluate" not in stats and stats["report"] == 1
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
    """`snakemake -n --profile slurm all_ablations` with the 32B preset prints the plan, no GPUs needed."""
    r = snakemake("-n", "--profile", "slurm", "all_ablations", "--config", "preset=qwen2.5-32b", f"results={tmp_path}")
    assert r.returncode == 0, r.stderr[-3000:]
    out = r.stdout + r.stderr
    assert "Using profile slurm" in out
    assert (
        "16 node(s) x 8 rank(s) per node (8 GPU(s) h100 per node), 32 rollout replica(s)" in out and "GPU-hours" in out
    )
    stats = _job_stats(r.stdout)
    assert stats["train"] == 6 and stats["base_model"] == 1 and "evaluate" not in stats
    # per node: 8 GPUs, 8 tasks, memory that fits a 512 GB node; the rule runs in the batch step (mpi) and starts
    # the 128 ranks itself with the layout spelled out; the preemption signal goes to every rank, ahead of the limit
    train = next(b for b in r.stdout.split("\nrule ") if b.startswith("train:"))
    for want in ("nodes=16", "gres=gpu:h100:8", "tasks_per_node=8", "mpi=srun", "mem_mb=460000", "tasks_per_gpu=0"):
        assert want in train, want
    assert "slurm_extra=--signal=USR1@1800 --open-mode=append" in train and "B:" not in train
    assert (
        "--nodes=16 --ntasks=128 --ntasks-per-node=8 --gpus-per-node=8 --cpus-per-task=12 --kill-on-bad-exit=1" in train
    )
    assert "--job-name=dapo-00_naive_grpo-s0" in out
    # downloads and the store run on the submitting machine (local rules: no SLURM resources), never as GPU jobs
    for rule in ("base_model", "prepare_data", "tracking_store"):
        block = next(b for b in r.stdout.split("\nrule ") if b.startswith(f"{rule}:"))
        assert "nodes=" not in block and "gres=" not in block, rule
    # the per-GPU memory budget with its arithmetic, and the cost of every row (dapo.plan, dapo.cost: test_plan.py)
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


@pytest.mark.parametrize("preset", ["qwen2.5-math-7b", "qwen2.5-math-7b-1node", "qwen2.5-1.5b-1gpu"])
def test_every_budgets_preset_dry_runs_to_a_plan_that_fits(tmp_path, preset):
    r = snakemake("-n", "--profile", "slurm", "all_ablations", "--config", f"preset={preset}", f"results={tmp_path}")
    assert r.returncode == 0, r.stderr[-3000:]
    out = r.stdout + r.stderr
    assert ": fits" in out and "cost per row" in out and "WARNING" not in out
    assert _job_stats(r.stdout)["train"] == 6


def test_an_unknown_gpu_stops_the_submission_with_the_fix(tmp_path):
    """A cluster that calls its H100s nvidia_h100_80gb_hbm3: named as the GPU, the plan cannot size anything and
    refuses; named as the GRES type beside gpu_model h100, the job asks SLURM for that GRES and the budget runs."""
    run = ["-n", "--profile", "slurm", "all_ablations", "--config", "preset=qwen2.5-32b", f"results={tmp_path}"]
    r = snakemake(*run, 'overrides=["resources.train.gpu_model=nvidia_h100_80gb_hbm3"]')
    err = r.stdout + r.stderr
    assert (
        r.returncode != 0 and "'nvidia_h100_80gb_hbm3' is not in the GPU table" in err and "Job stats" not in r.stdout
    )
    assert "resources.train.gres_type" in err and "gpu_memory_gib" in err and "gpu_hbm_tb_s" in err
    r = snakemake(*run, 'overrides=["resources.train.gres_type=nvidia_h100_80gb_hbm3"]')
    assert r.returncode == 0, r.stderr[-3000:]
    train = next(b for b in r.stdout.split("\nrule ") if b.startswith("train:"))
    assert "gres=gpu:nvidia_h100_80gb_hbm3:8" in train and ": fits" in r.stderr


def test_qwen_math_context_must_be_raised_for_the_7b_recipe(tmp_path):
    """Qwen2.5-Math-7B ships a 4,096-token context; the recipe's 2,048 + 8,192 needs the override the preset sets."""
    r = snakemake(
        "-n", "--profile", "slurm", "all_ablations", "--config", "preset=qwen2.5-math-7b", f"results={tmp_path}",
        'overrides=["model.config_overrides.max_position_embeddings=4096"]',
    )  # fmt: skip
    out = r.stdout + r.stderr
    assert r.returncode != 0 and "model.config_overrides.max_position_embeddings to at least 10,240" in out


def test_a_second_controller_of_a_results_folder_is_refused_and_a_dead_ones_lock_taken_over(tmp_path):
    from dapo.cluster import CONTROLLER_LOCK, ControllerLockError, acquire_controller_lock, release_controller_lock

    # a live controller on this machine (a process whose command line names snakemake)
    other = subprocess.Popen(
        [sys.executable, "-c", "print(flush=True); import time; time.sleep(60)", "snakemake"], stdout=subprocess.PIPE
    )
    other.stdout.readline()  # its command line is its own from here on (not pytest's, as right after the fork)
    try:
        (tmp_path / CONTROLLER_LOCK).write_text(
            json.dumps({"host": __import__("socket").gethostname(), "pid": other.pid})
        )
        with pytest.raises(ControllerLockError, match=rf"pid {other.pid} on this machine.*delete .*{CONTROLLER_LOCK}"):
            acquire_controller_lock(tmp_path, ["snakemake"])
    finally:
        other.kill()
        other.wait()
    # gone: taken over, with a note; released by its holder only
    assert "took over" in acquire_controller_lock(tmp_path, ["snakemake"])
    assert json.loads((tmp_path / CONTROLLER_LOCK).read_text())["pid"] == os.getpid()
    release_controller_lock(tmp_path)
    assert not (tmp_path / CONTROLLER_LOCK).exists()
    # on another host nothing can be checked from here: refused, naming that host
    (tmp_path / CONTROLLER_LOCK).write_text(json.dumps({"host": "login2", "pid": 1}))
    with pytest.raises(ControllerLockError, match="host login2"):
        acquire_controller_lock(tmp_path, ["snakemake"])
    release_controller_lock(tmp_path)  # not ours: kept
    assert (tmp_path / CONTROLLER_LOCK).exists()


def test_the_workflows_controller_command_holds_the_lock_for_snakemakes_pid(tmp_path):
    """`dapo controller start|stop`, what the workflow's onstart/onsuccess/onerror run: the lock names the
    Snakemake process given (not the short-lived command), a second controller is refused with nothing submitted, and
    only the holder's stop releases it."""
    from dapo.cluster import CONTROLLER_LOCK

    def controller(*args):
        cmd = [sys.executable, "-c", "import sys; from dapo.cli import main; sys.exit(main())", "controller", *args]
        return subprocess.run([*cmd, "--results", str(tmp_path)], capture_output=True, text=True)

    snakemake = subprocess.Popen(
        [sys.executable, "-c", "print(flush=True); import time; time.sleep(60)", "snakemake"], stdout=subprocess.PIPE
    )
    snakemake.stdout.readline()
    try:
        r = controller("start", "--pid", str(snakemake.pid), "--argv=snakemake --profile slurm all_ablations")
        assert r.returncode == 0, r.stderr
        held = json.loads((tmp_path / CONTROLLER_LOCK).read_text())
        assert held["pid"] == snakemake.pid and held["argv"] == ["snakemake", "--profile", "slurm", "all_ablations"]
        second = controller("start", "--pid", str(os.getpid()))
        assert second.returncode == 1
        assert "nothing was submitted: another Snakemake controller" in second.stderr
        assert f"pid {snakemake.pid}" in second.stderr
        assert controller("stop", "--pid", str(os.getpid())).returncode == 0
        assert (tmp_path / CONTROLLER_LOCK).exists()  # not the holder: kept
        assert controller("stop", "--pid", str(snakemake.pid)).returncode == 0
        assert not (tmp_path / CONTROLLER_LOCK).exists()
    finally:
        snakemake.kill()
        snakemake.wait()


def test_no_workflow_file_imports_dapo():
    """The rules call the `dapo` CLI only (docs/architecture.md, "The workflow")."""
    files = [*(REPO / "workflow").rglob("*.smk"), REPO / "workflow" / "Snakefile"]
    found = [
        f"{f.relative_to(REPO)}: {line.strip()}"
        for f in files
        for line in f.read_text().splitlines()
        if re.match(r"\s*(from dapo[\s.]|import dapo\b)", line)
    ]
    assert len(files) > 3 and not found, found


def test_train_jobs_are_found_by_the_slurm_plugins_comment():
    from dapo.cluster import parse_train_jobs

    out = "\n".join(
        [
            "101|RUNNING|rule_train_wildcards_05_dynamic_sampling_2",
            "102|PENDING|rule_train_wildcards_dapo_minus_clip_higher_0",
            "103|RUNNING|rule_report",
            "104|PENDING|something else",
        ]
    )
    assert parse_train_jobs(out) == {
        ("05_dynamic_sampling", 2): ("101", "RUNNING"),
        ("dapo_minus_clip_higher", 0): ("102", "PENDING"),
    }


def test_a_one_task_train_job_still_runs_in_the_batch_step(tmp_path):
    """One rank: the plugin refuses `mpi` with one task, so the rule's `mpi` is empty (the job step still runs the
    rule in the batch step, where the trainer gets its own srun step and the preemption signal)."""
    r = snakemake("-n", "-p", "--profile", "slurm", "row_00_naive_grpo", "--config", f"results={tmp_path}")
    assert r.returncode == 0, r.stderr[-3000:]
    train = next(b for b in r.stdout.split("\nrule ") if b.startswith("train:"))
    assert (
        "mpi=," in train
        and "tasks_per_node" not in train
        and "slurm_extra=--signal=USR1@60 --open-mode=append" in train
    )
    assert "--nodes=1 --ntasks=1 --ntasks-per-node=1 --cpus-per-task=1" in train
    assert " env dapo train " in train  # outside SLURM: one process (an empty launcher word would be lost)


def test_an_unreachable_tracking_server_stops_the_workflow_before_any_job(tmp_path):
    import socket

    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        port = sock.getsockname()[1]
    uri = f"http://127.0.0.1:{port}"
    r = snakemake("--cores", "1", "all_ablations", "--config", f"results={tmp_path}", f"tracking_uri={uri}")
    out = r.stdout + r.stderr
    assert r.returncode != 0
    assert "nothing was submitted" in out and uri in out and "mlflow server" in out
    assert not (tmp_path / "tiny" / "tiny_world").exists() and not (tmp_path / "tiny" / "data").exists()


def test_sqlite_on_a_network_file_system_is_refused_under_a_cluster_executor(tmp_path):
    from dapo.cluster import TrackingStoreError, check_tracking_store, filesystem_type

    mounts = "/dev/sda1 / ext4 rw 0 0\nnas:/export /shared nfs4 rw 0 0\nnas:/x /shared/fast lustre rw 0 0\n"
    assert filesystem_type("/shared/results/mlflow.db", mounts) == "nfs4"
    assert filesystem_type("/shared/fast/a", mounts) == "lustre" and filesystem_type("/home/u", mounts) == "ext4"
    with pytest.raises(TrackingStoreError, match="nfs4 file system.*Use a tracking server.*tracking_uri="):
        check_tracking_store("sqlite:////shared/results/mlflow.db", cluster=True, mounts=mounts)
    (warning,) = check_tracking_store("sqlite:////home/u/mlflow.db", cluster=True, mounts=mounts)
    assert "only jobs on this node" in warning
    assert check_tracking_store("sqlite:////shared/results/mlflow.db", cluster=False, mounts=mounts) == []


def _clone(tmp_path: Path) -> Path:
    """A user's clone of the repository (package, configs, workflow), whose files a test may edit; run Snakemake in
    it with `PYTHONPATH=<clone>` so that its own `dapo` (and so its own configs/ablations) is the one imported."""
    clone = tmp_path / "clone"
    for part in ("dapo", "configs", "workflow", "slurm"):
        shutil.copytree(REPO / part, clone / part, ignore=shutil.ignore_patterns("__pycache__"))
    shutil.copy(REPO / "Snakefile", clone / "Snakefile")
    return clone


def test_a_confounded_ladder_stops_the_workflow_before_any_job_unless_allowed(tmp_path):
    """A row that also sets trainer.lr (as the released recipe's per-row scripts differed) would train and report as
    if it measured one toggle: the dry run stops, naming the row file, the key and both values."""
    clone = _clone(tmp_path)
    row = clone / "configs" / "ablations" / "03_soft_overlong_punishment.yaml"
    row.write_text(row.read_text() + "trainer:\n  lr: 1.0e-4\n")
    results = tmp_path / "results"
    run = [SNAKEMAKE, "-n", "all_ablations", "--config", f"results={results}"]
    env = {**os.environ, "PYTHONPATH": str(clone)}
    r = subprocess.run(run, cwd=clone, capture_output=True, text=True, timeout=120, env=env)
    out = r.stdout + r.stderr
    assert r.returncode != 0 and "nothing was submitted" in out and "Job stats" not in out
    assert f"{row}: differs from 02_clip_higher.yaml in more than soft_overlong_punishment" in out
    assert "trainer.lr = 0.0001 (in 02_clip_higher.yaml: 5e-05): a scale key" in out
    assert "allow_confounded_ladder=true" in out and not results.exists()
    r = subprocess.run([*run, "allow_confounded_ladder=true"], cwd=clone, capture_output=True, text=True, env=env)
    assert r.returncode == 0, r.stderr[-3000:]
    assert "WARNING: not a clean ablation (allow_confounded_ladder)" in r.stderr and _job_stats(r.stdout)["train"] == 6


def test_a_batch_shell_signal_in_the_train_jobs_options_is_refused_before_any_job(tmp_path):
    """`--signal=B:USR1@60` reaches only the batch shell: a finished row's job could die wrapping up, and Snakemake
    would delete its DONE.json. Refused, with the option to use instead."""
    for extra in ('"--signal=B:USR1@60 --open-mode=append"', '"--signal RB:USR1@90"'):
        r = snakemake(
            "-n", "--profile", "slurm", "row_00_naive_grpo", "--config", f"results={tmp_path}",
            "--set-resources", f"train:slurm_extra={extra}",
        )  # fmt: skip
        out = r.stdout + r.stderr
        assert r.returncode != 0 and "nothing was submitted" in out and "Job stats" not in out, extra
        assert "a `B:` signal goes to the job's batch shell only" in out
        assert "`--signal=USR1@60`" in out and "without `B:`" in out  # what to use instead
    r = snakemake(
        "-n", "--profile", "slurm", "row_00_naive_grpo", "--config", f"results={tmp_path}",
        "--set-resources", 'train:slurm_extra="--signal=USR1@90 --open-mode=append"',
    )  # fmt: skip
    assert r.returncode == 0, r.stderr[-3000:]
    assert not any(tmp_path.iterdir())


SHELL_TEMPLATES = """
import json, sys
from pathlib import Path
from snakemake.api import SnakemakeApi
from snakemake.settings.types import ConfigSettings, OutputSettings, ResourceSettings

with SnakemakeApi(OutputSettings()) as api:
    wf = api.workflow(
        resource_settings=ResourceSettings(),
        config_settings=ConfigSettings(config={"results": sys.argv[1], "preset": sys.argv[2]}),
        snakefile=Path("Snakefile"),
        workdir=Path("."),
    )
    print(json.dumps({r.name: r.shellcmd for r in wf._workflow.rules if r.shellcmd}))
"""


@pytest.mark.parametrize("preset", ["tiny", "qwen2.5-32b"])  # each has a rule the other has not (its base model)
def test_every_field_of_every_rules_shell_command_is_quoted(tmp_path, preset):
    """Each `{...}` of a rule's shell command is quoted with `:q` (a list: each word), so a value's spaces or shell
    characters can never split it or run; what the rules write in directly goes through `q()`."""
    import string

    r = subprocess.run(
        [sys.executable, "-c", SHELL_TEMPLATES, str(tmp_path), preset], cwd=REPO, capture_output=True, text=True
    )
    assert r.returncode == 0, r.stderr[-3000:]
    templates = json.loads(r.stdout.splitlines()[-1])
    assert {"train", "report", "prepare_data"} <= set(templates) and len(templates) >= 6
    for rule, cmd in templates.items():
        fields = [(name, spec) for _, name, spec, _ in string.Formatter().parse(cmd) if name is not None]
        assert fields or rule != "train"
        for name, spec in fields:
            assert spec.endswith("q"), f"rule {rule}: {{{name}}} is not quoted ({{{name}:q}}): {cmd}"


def test_a_path_with_spaces_and_quotes_stays_one_word_in_the_train_command(tmp_path):
    import shlex

    results = tmp_path / "my results" / "it's"
    r = snakemake("-n", "-p", "row_00_naive_grpo", "--config", f"results={results}")
    assert r.returncode == 0, r.stderr[-3000:]
    line = next(ln for ln in r.stdout.splitlines() if "train_job.sh" in ln)
    words = shlex.split(line.split("Shell command:", 1)[-1])
    run_dir = str(results.resolve() / "tiny" / "runs" / "00_naive_grpo" / "s0")
    assert words.count(run_dir) == 2  # the job script's run directory and `dapo train --run-dir`
    assert f"data.train={results.resolve()}/tiny/data/train.jsonl" in words


def _job_stats(stdout: str) -> dict[str, int]:
    lines = stdout.split("Job stats:")[1].splitlines()
    stats = {}
    for line in lines[3:]:
        parts = line.split()
        if len(parts) != 2 or not parts[1].isdigit():
            break
        stats[parts[0]] = int(parts[1])
    return stats
