"""Training rows through a real SLURM cluster (the CI one: one 2-CPU node with accounting): the right number of
ranks, a preemption signal that reaches every rank, a stop before the time limit, resubmission decided by the
job script (requeue, same job id), a failed row that is not submitted again, and the whole tiny ablation. Skipped
without a cluster, except in CI (CI=true), where they must run. One module, so that `make test`'s workers run them
one after another (`--dist loadfile`): they share the cluster's one node.

Each test runs `snakemake --profile slurm` on one row of the tiny preset cut to seconds a step (HF engine, a
20-step tiny world; the row-05 test runs vLLM replicas on the cached tiny world). A requeued SLURM job is held
until its old job credential expires before it may start again (a job started earlier is killed with "Job
credential revoked"): 120 s by default, 30 s on the test cluster (scripts/slurm/start.sh sets `cred_expire`), so
each requeue costs these tests half a minute.
"""

from __future__ import annotations

import json
import os
import re
import shutil
import subprocess
import sys
import time
from pathlib import Path

import pytest
from _env import FAULTS

from dapo import metric_names as M

pytestmark = [pytest.mark.slurm, pytest.mark.slow]
REPO = Path(__file__).resolve().parent.parent
SNAKEMAKE = str(Path(sys.executable).parent / "snakemake")
WORLD = ["tiny.sft_steps=20", "tiny.n_train=64", "tiny.n_eval=4"]
SMALL = [
    *WORLD,
    "trainer.train_batch_size=2",
    "trainer.mini_batch_size=1",
    "rollout.n=4",
    "rollout.max_response_length=24",
    "rollout.engine=hf",
    "algorithm.overlong_buffer_len=8",
    "data.eval=tiny",  # the world's own eval split, not the preset's 640 problems
    "eval.n=2",
    "eval.every=0",
    "eval.pass_k=[1,2]",
    "eval.bootstrap=20",
]


@pytest.fixture(autouse=True)
def cluster(in_ci):
    ok = shutil.which("sinfo") and shutil.which("sacct")
    if ok:
        r = subprocess.run(["sinfo", "-h", "-o", "%T"], capture_output=True, text=True)
        s = subprocess.run(["sacct", "-n", "-X"], capture_output=True, text=True)
        ok = r.returncode == 0 and any(x in r.stdout for x in ("idle", "mixed", "alloc")) and s.returncode == 0
    if not ok:
        if in_ci:
            pytest.fail("CI=true but no SLURM cluster answers: .ci/run starts one (scripts/slurm/start.sh)")
        pytest.skip("no SLURM cluster answers here (start one with `make services`, as root)")


@pytest.fixture(scope="module")
def world(small_world) -> Path:
    return small_world


class Workflow:
    """`snakemake --profile slurm <row>` in the background, with what it printed and the run it drives."""

    def __init__(
        self,
        tmp: Path,
        world: Path,
        overrides: list[str],
        *config: str,
        row: str = "00_naive_grpo",
        base: list[str] = SMALL,
        preset: str = "tiny",
        log_name: str = "snakemake.log",
        **env_extra: str,
    ) -> None:
        self.results = tmp / "results"
        self.out = tmp / log_name
        folder = Path(preset).stem  # the workflow's results/<preset>/
        self.run_dir = self.results / folder / "runs" / row / "s0"
        self.uri = f"sqlite:///{self.results / folder / 'mlflow.db'}"
        self.cmd = [SNAKEMAKE, "--profile", "slurm", f"row_{row}", "--config", f"results={self.results}"]
        self.cmd += [f"preset={preset}", f"tiny_world={world}", f"overrides={json.dumps([*base, *overrides])}", *config]
        # what `make` exports, and names as its own CPU defaults (Makefile): the jobs inherit it
        self.env = {
            **os.environ,
            "HF_HUB_OFFLINE": "1",
            "DS_ACCELERATOR": "cpu",
            "DAPO_CPU_DEFAULTS": "HF_HUB_OFFLINE DS_ACCELERATOR",
            "PYTHONPATH": str(FAULTS),  # a DAPO_TEST_* fault in env_extra reaches the jobs' dapo processes
            **env_extra,
        }
        self.proc = subprocess.Popen(
            self.cmd, cwd=REPO, stdout=self.out.open("w"), stderr=subprocess.STDOUT, env=self.env
        )

    def text(self) -> str:
        return self.out.read_text(errors="replace")

    def train_log(self) -> str:
        p = self.run_dir / "train.log"
        return p.read_text(errors="replace") if p.is_file() else ""

    def until(self, what, timeout: float = 900, poll: float = 1.0):
        deadline = time.monotonic() + timeout
        while True:
            found = what()
            if found:
                return found
            assert self.proc.poll() is None or what(), (
                f"snakemake ended first\n{self.text()[-3000:]}\n{self.train_log()[-3000:]}"
            )
            assert time.monotonic() < deadline, f"timed out\n{self.text()[-3000:]}\n{self.train_log()[-3000:]}"
            time.sleep(poll)

    def job_id(self) -> str:
        pattern = re.compile(r"Job \d+ has been submitted with SLURM jobid (\d+) \(log: [^)]*rule_train")
        return self.until(lambda: (m := pattern.search(self.text())) and m.group(1))

    def wait(self, timeout: float = 1200) -> int:
        try:
            return self.proc.wait(timeout)
        finally:
            self.proc.kill()

    def attempts(self) -> list[dict]:
        return [json.loads(ln) for ln in (self.run_dir / "attempts.jsonl").read_text().splitlines()]


def sacct(job: str) -> list[list[str]]:
    out = subprocess.run(
        ["sacct", "-n", "-P", "-D", "-j", job, "-o", "JobID,JobName,NTasks,State"], capture_output=True, text=True
    ).stdout
    return [line.split("|") for line in out.splitlines()]


def one_run(uri: str) -> tuple[object, dict[str, list[int]]]:
    from mlflow.tracking import MlflowClient

    c = MlflowClient(uri)
    runs = c.search_runs([c.get_experiment_by_name("dapo-tiny").experiment_id])
    assert len(runs) == 1, [r.info.run_id for r in runs]
    rid = runs[0].info.run_id
    steps = {k: sorted(m.step for m in c.get_metric_history(rid, k)) for k in runs[0].data.metrics}
    for key, s in steps.items():
        assert len(s) == len(set(s)), f"{key}: two points at one step: {s}"
    return runs[0], steps


def test_a_two_rank_row_trains_on_both_and_a_preemption_signal_stops_both_at_one_step(world, tmp_path):
    wf = Workflow(
        tmp_path,
        world,
        [
            "resources.train.tasks_per_node=2",
            "trainer.zero_stage=1",
            "trainer.total_steps=8",
            "trainer.checkpoint_every=3",
        ],
    )
    job = wf.job_id()
    wf.until(lambda: "step 2/8" in wf.train_log())
    subprocess.run(["scancel", "--signal=USR1", job], check=True)  # what --signal=USR1@T does at T
    assert wf.wait() == 0, wf.text()[-4000:]

    log = wf.train_log()
    steps = [r for r in sacct(job) if r[1] == "dapo-00_naive_grpo-s0"]
    assert [r[2] for r in steps] == ["2", "2"], sacct(job)  # the training step of each attempt: 2 tasks
    assert log.count("rank 0 of 2") == 2 and log.count("rank 1 of 2") == 2
    assert log.count("received SIGUSR1") == 2  # both ranks got the signal ...
    stopped = int(re.search(r"stopped by signal at rollout step (\d+)", log).group(1))
    # ... at one step; a checkpoint taken mid-step right after that step's periodic one is named step_<N>.1
    checkpoint = rf"{re.escape(str(wf.run_dir))}/checkpoints/step_{stopped:06d}(\.\d+)?"
    assert re.search(rf"resumed from {checkpoint} at rollout step {stopped} ", log)
    assert [(a["job"], a["verdict"]) for a in wf.attempts()] == [(job, "resume"), (job, "done")]
    assert "REQUEUED" in [r[3] for r in sacct(job)]
    final = sorted((wf.run_dir / "checkpoints").glob("step_*/learner/*/zero_pp_rank_*_optim_states.pt"))
    assert {p.name[:14] for p in final} == {"zero_pp_rank_0", "zero_pp_rank_1"}  # both ranks hold optimizer state
    run, points = one_run(wf.uri)
    assert run.info.status == "FINISHED" and points[M.GRAD_UPDATES] == list(range(1, 9))
    # every attempt's SLURM log beside the run's own log; `dapo status` names the job and its 2-task step
    slurm_log = (wf.run_dir / "slurm" / f"{job}.log").read_text()
    assert "DUE TO JOB REQUEUE" in slurm_log
    status = subprocess.run(
        [sys.executable, "-m", "dapo.cli", "status", str(wf.results / "tiny")], capture_output=True, text=True
    ).stdout
    assert f"{job} COMPLETED, training step 2 task(s)" in status and "2 (resume, done)" in status


def test_a_two_task_job_samples_row_05_on_two_vllm_replicas(tiny_world_dir, tmp_path):
    """Row 05 (dynamic sampling) as a 2-task SLURM job with the vLLM engine, on the cached tiny world (whose policy
    gets some prompts right and some wrong, so groups are kept): each task starts its own replica under `srun`
    (vLLM's external launcher on the job's process group), the replicas share every generation batch of one
    prompt and refill until 2 informative groups are kept at every step, both ranks train on them, and the run
    finishes. Which half each replica draws, and that the result equals one rank's, is tests/test_trainer_dist.py's
    (under torchrun, through the same code)."""
    from mlflow.tracking import MlflowClient

    wf = Workflow(
        tmp_path,
        tiny_world_dir,
        [
            "resources.train.tasks_per_node=2",
            "rollout.engine=vllm",
            "trainer.total_steps=2",
            "algorithm.gen_batch_size=1",  # one prompt's 4 samples a batch, 2 per replica: every step refills
            "algorithm.max_num_gen_batches=0",  # until 2 groups are kept
        ],
        row="05_dynamic_sampling",
        base=[x for x in SMALL if x not in WORLD],
    )
    job = wf.job_id()
    assert wf.wait() == 0, wf.text()[-4000:] + wf.train_log()[-4000:]
    log = wf.train_log()
    steps = [r for r in sacct(job) if r[1] == "dapo-05_dynamic_sampling-s0"]
    assert [r[2] for r in steps] == ["2"], sacct(job)  # one training step of 2 tasks
    assert log.count("rank 0 of 2") == 1 and log.count("rank 1 of 2") == 1
    run, points = one_run(wf.uri)
    assert run.info.status == "FINISHED" and run.data.tags[M.TAG_REPLICAS] == "2"
    history = MlflowClient(wf.uri).get_metric_history
    batches = {m.step: m.value for m in history(run.info.run_id, M.DS_GEN_BATCHES)}
    tokens = {m.step: m.value for m in history(run.info.run_id, M.DS_TOKENS_GENERATED)}
    kept = {m.step: m.value for m in history(run.info.run_id, M.DS_GROUPS_KEPT)}
    assert sorted(batches) == sorted(tokens) == sorted(kept) == [1, 2]
    assert all(v > 0 for v in tokens.values()) and all(v >= 2 for v in batches.values())
    assert all(v == 2 for v in kept.values())  # train_batch_size groups kept at every step, refilled as needed
    assert points[M.GRAD_UPDATES] == [1, 2] and "done: 2 rollout steps, 4 updates" in log  # 2 mini-batches a step


def test_a_one_task_row_stops_before_its_time_limit_and_at_a_signal_then_gives_up(world, tmp_path):
    """A 3-minute job with a 40-second margin: the trainer knows the job's end (squeue) and stops in time, at its
    own deadline or at the profile's USR1 (whichever comes first: SLURM may send it up to a minute early), never at
    the kill; the job requeues itself and resumes there. A second stop (a preemption signal) after max_resubmits=1
    ends the row for this invocation, without a new submission."""
    wf = Workflow(
        tmp_path,
        world,
        [
            "trainer.total_steps=10000",
            "trainer.checkpoint_every=0",
            "trainer.stop_margin_s=40",
            "resources.train.runtime_min=3",
        ],
        "max_resubmits=1",
    )
    job = wf.job_id()
    wf.until(lambda: "resumed from" in wf.train_log())
    wf.until(lambda: re.search(r"step \d+/10000", wf.train_log().split("resumed from")[-1]))
    subprocess.run(["scancel", "--signal=USR1", job], check=True)
    assert wf.wait() != 0

    first, second = wf.train_log().split("resumed from")
    assert re.search(r"the job ends at .* \(in \d+ s\)", first)  # read from SLURM inside the job
    assert "left before the job's time limit" in first or "received SIGUSR1" in first
    stopped = int(re.search(r"stopped by signal at rollout step (\d+)", first).group(1))
    assert stopped >= 1 and f"at rollout step {stopped} " in second
    assert "received SIGUSR1" in second  # a one-task job's trainer gets the signal (it runs in its own step)
    assert [(a["code"], a["verdict"]) for a in wf.attempts()] == [(75, "resume"), (75, "resume")]
    assert [r[3] for r in sacct(job) if r[0] == job][0] == "REQUEUED"  # not TIMEOUT: it stopped before the kill
    assert "already resubmitted 1 time(s)" in (wf.run_dir / "slurm" / f"{job}.log").read_text()
    assert len(re.findall(r"has been submitted with SLURM jobid \d+ \(log: [^)]*rule_train", wf.text())) == 1
    run, points = one_run(wf.uri)
    assert run.info.status == "RUNNING" and run.data.tags[M.TAG_STATUS] == "preempted"
    assert points[M.GRAD_UPDATES][0] == 1


def test_a_row_that_fails_for_good_is_not_submitted_again(world, tmp_path):
    """Non-finite losses from step 1 on (a test hook): the trainer fails (exit 1) keeping its checkpoint; the row
    fails once, with its log, and no job is submitted for it again."""
    wf = Workflow(
        tmp_path,
        world,
        ["trainer.total_steps=3", "trainer.max_consecutive_nonfinite=1"],
        "max_resubmits=5",
        DAPO_TEST_POISON_STEP="1",
    )
    assert wf.wait() != 0
    assert (wf.run_dir / "FAILED").read_text().strip() == "1"
    assert [a["verdict"] for a in wf.attempts()] == ["failed"]
    assert len(re.findall(r"has been submitted with SLURM jobid \d+ \(log: [^)]*rule_train", wf.text())) == 1
    assert "non-finite updates in a row" in wf.train_log()
    # the tiny preset runs on CPUs: make's CPU defaults reach its job
    assert "== environment: DS_ACCELERATOR=cpu HF_HUB_OFFLINE=1" in wf.train_log()
    (slurm_log,) = (wf.run_dir / "slurm").glob("*.log")  # the job's own SLURM log, kept beside the run's
    assert "dapo train failed (exit 1)" in slurm_log.read_text()


def test_makes_cpu_defaults_stay_out_of_a_real_model_presets_job(world, tmp_path):
    """`make` exports DS_ACCELERATOR=cpu and HF_HUB_OFFLINE=1 for the tests and the tiny world, and the profile
    submits with --export=ALL: a preset with a real model (here the tiny world's model and data as local files, so
    that it runs on this CPU cluster) gets neither in its SLURM job, and trains without them."""
    preset = tmp_path / "local-model.yaml"
    preset.write_text(
        f"inherits: {REPO / 'configs' / 'presets' / 'tiny.yaml'}\n"
        f"model: {{path: {world / 'model'}}}\n"
        f"data: {{train: {world / 'train.jsonl'}, eval: {world / 'eval.jsonl'}}}\n"
        "tracking: {preset: local-model}\n"
    )
    own_eval = [x for x in SMALL if not x.startswith("data.eval")]  # the preset's eval file
    wf = Workflow(tmp_path, world, ["trainer.total_steps=1"], base=own_eval, preset=str(preset))
    assert wf.wait() == 0, wf.text()[-4000:] + wf.train_log()[-3000:]
    assert "not passed on to the jobs of preset local-model (make's CPU defaults)" in wf.text()
    assert "== environment: DS_ACCELERATOR=<unset> HF_HUB_OFFLINE=<unset>" in wf.train_log()
    assert json.loads((wf.run_dir / "DONE.json").read_text())["step"] == 1


def test_a_second_controller_is_refused_and_a_rerun_waits_for_the_job_a_dead_one_left(world, tmp_path):
    """One controller per results folder: a second one (--nolock: Snakemake's own lock covers only its working
    directory) is refused before it submits anything. A controller that dies (SIGKILL: the login node rebooted)
    leaves its lock and its SLURM job; the rerun takes the lock over, finds the job by its train comment and this
    folder's files in its batch script, and waits for it instead of submitting the row again."""
    overrides = ["trainer.total_steps=6", "trainer.checkpoint_every=0"]
    hold = tmp_path / "hold"  # the job waits at its first step until the rerun has attached to it (no race with it)
    hold.touch()
    first = Workflow(tmp_path, world, overrides, "attach_poll_s=2", DAPO_TEST_HOLD=str(hold))
    job = first.job_id()
    first.until(lambda: (first.results / "tiny" / ".controller.json").is_file())

    second = subprocess.run(
        [*first.cmd, "--nolock"], cwd=REPO, capture_output=True, text=True, env=first.env, timeout=300
    )
    out = second.stdout + second.stderr
    assert second.returncode != 0 and "another Snakemake controller" in out and "nothing was submitted" in out
    assert "has been submitted with SLURM jobid" not in out
    assert f"00_naive_grpo s0 is SLURM job {job}" in out  # it had found the first controller's job

    first.proc.kill()  # the controller dies; its SLURM job goes on
    first.proc.wait()
    unlock = subprocess.run([*first.cmd, "--unlock"], cwd=REPO, capture_output=True, text=True, env=first.env)
    assert unlock.returncode == 0, unlock.stderr[-2000:]
    rerun = Workflow(tmp_path, world, overrides, "attach_poll_s=2", log_name="rerun.log")
    rerun.until(lambda: f"00_naive_grpo s0 is SLURM job {job}" in rerun.text())
    hold.unlink()
    assert rerun.wait() == 0, rerun.text()[-4000:] + rerun.train_log()[-3000:]
    text = rerun.text()
    assert "took over" in text and f"00_naive_grpo s0 is SLURM job {job}" in text and "attach_train" in text
    assert "has been submitted with SLURM jobid" not in text  # no second job for the row
    assert [a["job"] for a in rerun.attempts()] == [job] and (rerun.run_dir / "DONE.json").is_file()
    assert not (rerun.results / "tiny" / ".controller.json").exists()  # released when the rerun ended


# ------------------------------------------------------------------------------------------ the whole ablation
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


def snakemake(*args: str, timeout: float) -> subprocess.CompletedProcess:
    """`snakemake` from the repository root, as a user runs it (the profile is looked up relative to it)."""
    return subprocess.run([SNAKEMAKE, *args], cwd=REPO, capture_output=True, text=True, timeout=timeout)


def test_all_ablations_through_slurm(tmp_path, tiny_world_dir):
    """The whole tiny ablation, six rows, through the cluster on the cached tiny world; a rerun does nothing."""
    results = tmp_path / "results"
    workflow = ["--profile", "slurm", "all_ablations", "--config", f"results={results}"]
    workflow += [f"overrides={json.dumps(CI_OVERRIDES)}", f"tiny_world={tiny_world_dir}"]
    r = snakemake(*workflow, timeout=1800)
    log = r.stdout[-4000:] + r.stderr[-6000:]
    assert r.returncode == 0, log
    # every training job went through the cluster: the job script keeps each SLURM job's log in the run's folder
    for row in M.PAPER_TABLE1:
        slurm_logs = list((results / "tiny" / "runs" / row / "s0" / "slurm").glob("*.log"))
        assert slurm_logs, (row, log)
    report = results / "tiny" / "report"
    table = (report / "table1.md").read_text()
    for label, _paper in M.PAPER_TABLE1.values():
        assert label in table
    # every row's MLflow run finished, with its eval metrics, on the CPU kernels the tiny world was built with
    # (pinned through the job script and srun, whatever this host's CPU offers)
    from mlflow.tracking import MlflowClient

    from dapo.tinyworld import pinned_kernels

    client = MlflowClient(tracking_uri=f"sqlite:///{results / 'tiny' / 'mlflow.db'}")
    exp = client.get_experiment_by_name("dapo-tiny")
    runs = client.search_runs([exp.experiment_id])
    by_row = {run.data.tags.get(M.TAG_ROW): run for run in runs}
    assert set(M.PAPER_TABLE1) <= set(by_row), sorted(by_row)
    for row in M.PAPER_TABLE1:
        run = by_row[row]
        assert run.info.status == "FINISHED", (row, run.info.status)
        assert M.eval_avg(2) in run.data.metrics, (row, sorted(run.data.metrics))
        if pinned_kernels("avx2"):  # on x86-64
            assert run.data.tags[M.TAG_CPU_KERNELS] == "AVX2", (row, run.data.tags)
    # a rerun skips finished work
    r2 = snakemake(*workflow, timeout=300)
    assert r2.returncode == 0 and "Nothing to be done" in r2.stdout + r2.stderr
