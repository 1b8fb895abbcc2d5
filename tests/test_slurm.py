"""Training rows through a real SLURM cluster: the contributors' and CI's multi-node one (scripts/slurm/start.sh:
three nodes n1-n3, each a network namespace with its own address, hostname, hosts file and slurmd). Rows whose
ranks meet across hosts and equal the same row on one node; a preemption signal, the time limit and an outside
`scontrol requeue` that reach every rank on every node; a node that dies (the first one, which runs the batch
script, or another) and a link that drops mid-step, each resumed onto the nodes left into the same MLflow run with
the weights of an unbroken run; where the ranks meet when a node's own name resolves to loopback, and a meeting
that cannot happen; a failed row that is not submitted again; and the whole tiny ablation. Skipped without a
cluster, except in CI (CI=true), where they must run. One module, so that `make test`'s workers run them one after
another (`--dist loadfile`): they share the cluster.

Each test runs `snakemake --profile slurm` on one row of the tiny preset cut to seconds a step (HF engine, a
20-step tiny world; the row-05 test runs vLLM replicas on the cached tiny world). A requeued SLURM job is held
until its old job credential expires before it may start again (a job started earlier is killed with "Job
credential revoked"): 120 s by default, 15 s on the test cluster (`cred_expire`); a node that stops answering is
declared down after `SlurmdTimeout` (300 s by default, 20 s on the test cluster). Each fault test appends what it
measured (detection, resume) to results/slurm_faults.jsonl; docs/failure-modes.md has the figures.
"""

from __future__ import annotations

import json
import os
import re
import shutil
import subprocess
import sys
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pytest
import torch
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


NODES = ["n1", "n2", "n3"]  # the test cluster's nodes (scripts/slurm/start.sh: DAPO_SLURM_NODES=3, the default)
# The fault tests' run: row 00 on 2 ranks, 6 steps, a checkpoint after each, a peer lost after 10 s of silence.
FAULT_RUN = [
    "trainer.zero_stage=1",
    "trainer.total_steps=6",
    "trainer.checkpoint_every=1",
    "trainer.heartbeat_timeout_s=10",
]
ONE_NODE = ["resources.train.tasks_per_node=2"]  # 1 node x 2 ranks
TWO_NODES = ["resources.train.nodes=2"]  # 2 nodes x 1 rank
NODE_SH = REPO / "scripts" / "slurm" / "node.sh"
FAULT_LOG = REPO / "results" / "slurm_faults.jsonl"


def node(action: str, name: str) -> None:
    """scripts/slurm/node.sh: `kill` (a host that died), `start` (it boots), `link-down` / `link-up`."""
    subprocess.run(["bash", str(NODE_SH), action, name], check=True, capture_output=True, timeout=60)


def node_states() -> dict[str, str]:
    out = subprocess.run(["sinfo", "-h", "-N", "-o", "%N %T"], capture_output=True, text=True).stdout
    return dict(line.split() for line in out.splitlines() if line.strip())


def all_nodes_back(timeout: float = 120) -> None:
    """Every node up and taking jobs (a test that killed one or cut its link gives it back)."""
    for n in NODES:
        node("link-up", n)
        node("start", n)
    deadline = time.monotonic() + timeout
    while True:
        states = node_states()
        if all(states.get(n) in ("idle", "mixed", "allocated") for n in NODES):
            return
        assert time.monotonic() < deadline, f"the test cluster's nodes did not come back: {states}"
        time.sleep(1)


def job_hosts(job: str) -> list[str]:
    """The hosts of a running job, in its node list's order (the first runs the batch script)."""
    from dapo.rendezvous import slurm_hosts

    out = subprocess.run(["squeue", "-h", "-j", job, "-o", "%N"], capture_output=True, text=True).stdout.strip()
    return slurm_hosts(out) if out and out != "(null)" else []


def record(test: str, **figures: float | str) -> None:
    """What a fault test measured, for docs/failure-modes.md (results/ is not committed)."""
    FAULT_LOG.parent.mkdir(parents=True, exist_ok=True)
    with FAULT_LOG.open("a") as f:
        f.write(json.dumps({"test": test, "time": time.time(), **figures}) + "\n")
    print(test, figures)


def require_cluster(in_ci: bool) -> None:
    """A SLURM cluster answers here with the test cluster's nodes, or the test skips (fails under CI=true)."""
    ok = shutil.which("sinfo") and shutil.which("sacct")
    if ok:
        r = subprocess.run(["sinfo", "-h", "-o", "%T"], capture_output=True, text=True)
        s = subprocess.run(["sacct", "-n", "-X"], capture_output=True, text=True)
        ok = r.returncode == 0 and any(x in r.stdout for x in ("idle", "mixed", "alloc")) and s.returncode == 0
    if not ok:
        if in_ci:
            pytest.fail("CI=true but no SLURM cluster answers: .ci/run starts one (scripts/slurm/start.sh)")
        pytest.skip("no SLURM cluster answers here (start one with `make services`, as root)")
    missing = [n for n in NODES if n not in node_states()]
    assert not missing, f"the test cluster lacks {missing}: restart it with `make services` (3 nodes by default)"


@pytest.fixture(autouse=True)
def cluster(in_ci):
    require_cluster(in_ci)
    all_nodes_back()
    yield
    all_nodes_back()


@pytest.fixture(scope="module")
def world(small_world) -> Path:
    return small_world


class Workflow:
    """`snakemake --profile slurm <row>` (`local`: `--cores 2`, on this machine) in the background, with what it
    printed and the run it drives."""

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
        dry_run_first: bool = False,
        local: bool = False,
        **env_extra: str,
    ) -> None:
        self.results = tmp / "results"
        self.out = tmp / log_name
        folder = Path(preset).stem  # the workflow's results/<preset>/
        self.run_dir = self.results / folder / "runs" / row / "s0"
        self.uri = f"sqlite:///{self.results / folder / 'mlflow.db'}"
        # the profile polls SLURM every 10 s; the tests every 3 s (each test waits out the last poll of its job)
        where = ["--cores", "2"] if local else ["--profile", "slurm", "--seconds-between-status-checks", "3"]
        self.cmd = [SNAKEMAKE, *where, f"row_{row}", "--config", f"results={self.results}"]
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
        self.dry_run = ""
        if dry_run_first:  # the plan of exactly this command, before it runs (the layout it promises)
            r = subprocess.run([*self.cmd, "-n"], cwd=REPO, capture_output=True, text=True, env=self.env, timeout=300)
            assert r.returncode == 0, r.stdout[-2000:] + r.stderr[-3000:]
            self.dry_run = r.stdout + r.stderr
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


# ------------------------------------------------------------------------------------------ rows across nodes
@dataclass
class Outcome:
    """What a finished run produced that must not depend on where its ranks ran or how often it was interrupted."""

    weights: dict[str, Any]  # the final model's tensors
    metrics: dict[str, list[tuple[int, float]]]  # every MLflow curve but wall-clock ones: (step, value)
    samples: str  # the final evaluation's samples, as written

    @classmethod
    def of(cls, wf: Workflow) -> Outcome:
        from mlflow.tracking import MlflowClient
        from safetensors.torch import load_file

        weights: dict[str, Any] = {}
        for f in sorted((wf.run_dir / "final").glob("*.safetensors")):
            weights.update(load_file(f))
        run, _ = one_run(wf.uri)
        client = MlflowClient(wf.uri)
        timed = [k for k in run.data.metrics if k.startswith("time/") or k == M.TOKENS_PER_SEC]
        metrics = {
            k: sorted((m.step, m.value) for m in client.get_metric_history(run.info.run_id, k))
            for k in run.data.metrics
            if k not in timed
        }
        return cls(weights, metrics, (wf.run_dir / M.EVAL_SAMPLES_ARTIFACT).read_text())

    def assert_same_as(self, other: Outcome, what: str) -> None:
        """Equal to the bit. Bound: 0. With 2 ranks every all-reduce adds two numbers, and a + b == b + a in floating
        point, so no placement of the ranks over hosts can change a sum; gloo's ring, with more ranks, would add in
        an order set by the rank numbers, which the layout keeps. A resume is bit-identical by design
        (docs/failure-modes.md)."""
        assert self.samples == other.samples, f"{what}: the final evaluation sampled other responses"
        assert self.metrics.keys() == other.metrics.keys(), f"{what}: {self.metrics.keys() ^ other.metrics.keys()}"
        for k in self.metrics:
            assert self.metrics[k] == other.metrics[k], f"{what}: {k} differs: {self.metrics[k]} != {other.metrics[k]}"
        assert self.weights.keys() == other.weights.keys()
        differ = [k for k in self.weights if not torch.equal(self.weights[k], other.weights[k])]
        assert not differ, f"{what}: final weights differ in {differ[:5]} ({len(differ)} tensors)"


@pytest.fixture(scope="module")
def reference(small_world, tmp_path_factory) -> Outcome:
    """The fault tests' row, unbroken, with its 2 ranks on one node: the workflow without the cluster, on this
    machine (torchrun, 2 processes), the same data, config and seeds. What every multi-node and interrupted run of
    it must reproduce."""
    wf = Workflow(tmp_path_factory.mktemp("reference"), small_world, [*FAULT_RUN, *ONE_NODE], local=True)
    assert wf.wait() == 0, wf.text()[-4000:] + wf.train_log()[-3000:]
    assert [a["verdict"] for a in wf.attempts()] == ["done"]
    assert "torchrun --standalone --nproc-per-node=2 --no-python dapo train" in wf.train_log()
    return Outcome.of(wf)


def ranks_on(log: str) -> dict[int, str]:
    """Each rank's host, as its `dapo train` line says (the last attempt's)."""
    return {int(r): h for r, h in re.findall(r"dapo train: rank (\d+) of \d+ on (\S+) ", log)}


def test_two_nodes_meet_equal_one_node_and_stop_together_at_a_signal_and_an_outside_requeue(world, reference, tmp_path):
    """Row 00 as 2 nodes x 1 rank through `snakemake --profile slurm`: the dry run's layout is what ran (SLURM's node
    list, the hosts the ranks logged, the replicas); the ranks meet over the nodes' shared interface; a preemption
    signal (what --signal=USR1@T sends at T) mid-step 2 and an outside `scontrol requeue` (an administrator's, or a
    preemption in REQUEUE mode) mid-step 4 reach both ranks on both nodes, which stop at the same step each time,
    checkpoint, and resume; one MLflow run, one point per step; and the samples, curves and final weights equal the
    same row's on one node (`reference`), to the bit."""
    m2, m4 = tmp_path / "slow2", tmp_path / "slow4"
    wf = Workflow(
        tmp_path, world, [*FAULT_RUN, *TWO_NODES], dry_run_first=True, DAPO_TEST_SLOW_AT=f"0:2:8:{m2},0:4:8:{m4}"
    )
    assert "train job: 2 node(s) x 1 rank(s) per node (CPU per node), 2 rollout replica(s)" in wf.dry_run
    job = wf.job_id()
    wf.until(m2.exists)
    hosts = job_hosts(job)
    subprocess.run(["scancel", "--signal=USR1", job], check=True)
    wf.until(m4.exists)
    subprocess.run(["scontrol", "requeue", job], check=True)
    assert wf.wait() == 0, wf.text()[-4000:] + wf.train_log()[-4000:]

    log = wf.train_log()
    assert len(hosts) == 2 and set(ranks_on(log).values()) == set(hosts), (hosts, ranks_on(log))
    for rank, host in ranks_on(log).items():
        assert re.search(rf"rank {rank} of 2 on {host} meets the others at {hosts[0]}:\d+ .* over interface ve\d", log)
    steps = [r for r in sacct(job) if r[1] == "dapo-00_naive_grpo-s0"]
    assert [r[2] for r in steps] == ["2", "2", "2"], sacct(job)  # each attempt's training step: 2 tasks
    assert log.count("received SIGUSR1") == 2 and log.count("received SIGTERM") >= 2  # every rank, every node
    stops = [int(x) for x in re.findall(r"stopped by signal at rollout step (\d+)", log)]  # rank 0's word
    resumes = [int(x) for x in re.findall(r"resumed from \S+ at rollout step (\d+)", log)]  # every rank's
    assert len(stops) == 2 and resumes == [s for s in stops for _ in range(2)], (stops, resumes)  # one step, both
    assert [(a["job"], a["verdict"]) for a in wf.attempts()] == [(job, "resume"), (job, "resume"), (job, "done")]
    run, points = one_run(wf.uri)
    assert run.info.status == "FINISHED" and run.data.tags[M.TAG_REPLICAS] == "2"
    assert points[M.GRAD_UPDATES] == list(range(1, 7))
    Outcome.of(wf).assert_same_as(reference, "2 nodes x 1 rank, stopped twice, against 1 node x 2 ranks unbroken")


def test_row_05_samples_on_a_vllm_replica_on_each_node(tiny_world_dir, tmp_path):
    """Row 05 (dynamic sampling) as a 2-node job with the vLLM engine, on the cached tiny world (whose policy gets
    some prompts right and some wrong, so groups are kept): each node's rank starts its own replica under `srun`
    (vLLM's external launcher on the job's process group), the replicas share every generation batch of one
    prompt and refill until 2 informative groups are kept at every step, both ranks train on them, and the run
    finishes. Which half each replica draws, and that the result equals one rank's, is tests/test_trainer_dist.py's
    (under torchrun, through the same code)."""
    from mlflow.tracking import MlflowClient

    wf = Workflow(
        tmp_path,
        tiny_world_dir,
        [
            *TWO_NODES,
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
    assert len(set(ranks_on(log).values())) == 2, ranks_on(log)  # a replica on each node
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


# ------------------------------------------------------------------------------------------ a node dies, a link drops
def timeline(wf: Workflow, job: str, t0: float, hosts: list[str], timeout: float = 600) -> dict[str, float]:
    """Seconds from `t0` (the fault) until: a surviving rank said it lost a peer (when its log reaches train.log),
    SLURM took the job off its first nodes (requeued, pending or running elsewhere), the run resumed, and it
    finished (DONE.json)."""
    seen: dict[str, float] = {}
    deadline = time.monotonic() + timeout
    marks = wf.train_log().count("resumed from")
    while "done" not in seen:
        now = time.monotonic() - t0
        log = wf.train_log()
        if "lost" not in seen and "a peer is lost" in log:
            seen["lost"] = now
        if "requeued" not in seen and job_hosts(job) != hosts:
            seen["requeued"] = now
        if "resumed" not in seen and log.count("resumed from") > marks:
            seen["resumed"] = now
        if (wf.run_dir / "DONE.json").is_file():
            seen["done"] = now
        assert wf.proc.poll() is None or "done" in seen, f"snakemake ended first\n{wf.text()[-3000:]}\n{log[-4000:]}"
        assert time.monotonic() < deadline, f"timed out: {seen}\n{log[-4000:]}"
        time.sleep(0.5)
    return {k: round(v, 1) for k, v in seen.items()}


def assert_resumed_elsewhere(wf: Workflow, reference: Outcome, dead: str, what: str) -> None:
    """The run finished on the nodes left, resumed once from a checkpoint into its one MLflow run, each step's point
    once, with the samples, curves and weights of the unbroken run."""
    assert wf.wait() == 0, wf.text()[-4000:] + wf.train_log()[-4000:]
    log = wf.train_log()
    assert dead not in ranks_on(log).values() and len(set(ranks_on(log).values())) == 2, ranks_on(log)
    resumed = re.findall(r"resumed from (\S+/checkpoints/step_\S+) at rollout step (\d+)", log)
    assert len(resumed) == 2 and len(set(resumed)) == 1, resumed  # once, by both ranks, from one checkpoint
    run, points = one_run(wf.uri)
    assert run.info.status == "FINISHED" and points[M.GRAD_UPDATES] == list(range(1, 7))
    Outcome.of(wf).assert_same_as(reference, what)


def test_a_node_other_than_the_first_dies_mid_step(world, reference, tmp_path):
    """Every process of the second node (its slurmd, the job's step and rank 1) killed while rank 1 is in step 3's
    update and rank 0 waits for it in a collective: rank 0's collective breaks, no rank reported a failure, so the
    peer is lost, not failed: exit 75 within seconds; SLURM declares the node down (SlurmdTimeout) and the job
    comes back on the two nodes left, resumes from step 2's checkpoint and finishes as the unbroken run did."""
    marker = tmp_path / "slow"
    wf = Workflow(tmp_path, world, [*FAULT_RUN, *TWO_NODES], DAPO_TEST_SLOW_AT=f"1:3:60:{marker}")
    job = wf.job_id()
    wf.until(marker.exists)
    hosts = job_hosts(job)
    t0 = time.monotonic()
    node("kill", hosts[1])
    seen = timeline(wf, job, t0, hosts)
    record("node_other_than_first_killed", **seen)
    assert seen["lost"] < 20, seen  # the broken connection, then 3 s for a failure report that never comes
    assert seen["resumed"] < 240, seen
    assert "lost a peer" in wf.train_log() and "exit 75" in wf.train_log()
    assert_resumed_elsewhere(wf, reference, hosts[1], "the second node killed mid-step 3")


def test_the_first_node_dies_mid_step(world, reference, tmp_path):
    """The first node, which runs the batch script, killed while rank 0 (on it) is in step 3's update: nothing is
    left to requeue the job but SLURM, which declares the node down (SlurmdTimeout) and requeues the job (the
    profile submits with --requeue) onto the two nodes left; the run resumes from step 2's checkpoint."""
    marker = tmp_path / "slow"
    wf = Workflow(tmp_path, world, [*FAULT_RUN, *TWO_NODES], DAPO_TEST_SLOW_AT=f"0:3:60:{marker}")
    job = wf.job_id()
    wf.until(marker.exists)
    hosts = job_hosts(job)
    t0 = time.monotonic()
    node("kill", hosts[0])
    seen = timeline(wf, job, t0, hosts)
    record("first_node_killed", **seen)
    assert seen["requeued"] < 90 and seen["resumed"] < 240, seen
    assert "NODE_FAIL" in [r[3] for r in sacct(job)], sacct(job)
    assert_resumed_elsewhere(wf, reference, hosts[0], "the first node killed mid-step 3")


def test_a_link_flap_goes_unnoticed_and_a_cut_link_resumes_on_the_nodes_left(world, reference, tmp_path):
    """The second node's link down for 2 s mid-step 2 (shorter than every bound: TCP resends, the run goes on, no
    restart), then down mid-step 4 for 45 s, its processes alive (a host that vanished without closing anything):
    rank 0's collective would wait for the collective timeout, but rank 1's heartbeat stops, so rank 0 takes the
    peer for lost after trainer.heartbeat_timeout_s (10 s here) and exits 75; SLURM declares the node down and the
    job resumes on the nodes left; when the link comes back the node takes jobs again."""
    m2, m4 = tmp_path / "slow2", tmp_path / "slow4"
    wf = Workflow(tmp_path, world, [*FAULT_RUN, *TWO_NODES], DAPO_TEST_SLOW_AT=f"1:2:6:{m2},1:4:60:{m4}")
    job = wf.job_id()
    wf.until(m2.exists)
    hosts = job_hosts(job)
    node("link-down", hosts[1])
    time.sleep(2)
    node("link-up", hosts[1])
    wf.until(m4.exists)
    assert "a peer is lost" not in wf.train_log() and "resumed from" not in wf.train_log()  # the flap: nothing
    t0 = time.monotonic()
    node("link-down", hosts[1])
    try:
        wf.until(lambda: "a peer is lost" in wf.train_log() or time.monotonic() - t0 > 45, timeout=60)
        lost = time.monotonic() - t0
        time.sleep(max(0.0, 45 - (time.monotonic() - t0)))
    finally:
        node("link-up", hosts[1])
    seen = timeline(wf, job, t0, hosts)
    seen["lost"] = round(lost, 1)
    record("link_cut", **seen)
    assert 10 <= seen["lost"] < 25, seen  # the heartbeat timeout, then a poll
    assert "sent no heartbeat for" in wf.train_log()
    assert_resumed_elsewhere(wf, reference, hosts[1], "a 2 s flap at step 2, a cut link at step 4")


# ------------------------------------------------------------------------------------------ where the ranks meet
MEET = [sys.executable, str(REPO / "tests" / "_meet_worker.py")]


def srun_meet(*args: str, per_node: int = 1, timeout: float = 120) -> subprocess.CompletedProcess:
    env = {**os.environ, "PYTHONPATH": f"{REPO}{os.pathsep}{REPO / 'tests'}"}
    for k in ("RANK", "WORLD_SIZE", "LOCAL_RANK", "MASTER_ADDR", "MASTER_PORT", "GLOO_SOCKET_IFNAME"):
        env.pop(k, None)
    return subprocess.run(
        ["srun", "--nodes=2", f"--ntasks-per-node={per_node}", "--nodelist=n1,n2", *MEET, *args],  # each to its end
        capture_output=True, text=True, env=env, timeout=timeout,
    )  # fmt: skip


@pytest.fixture
def hosts_files():
    """Each node's own hosts file (scripts/slurm/start.sh mounts it over the node's /etc/hosts), edited in place for
    one test and given back."""
    state = Path(os.environ.get("DAPO_SLURM_STATE", "/tmp/dapo-slurm"))
    files = {n: state / f"hosts.{n}" for n in NODES}
    kept = {n: f.read_text() for n, f in files.items()}
    yield files
    for n, f in files.items():
        f.write_text(kept[n])


def test_ranks_meet_across_nodes_whose_own_names_resolve_to_loopback(hosts_files):
    """Debian's default /etc/hosts line `127.0.1.1 <hostname>` on both nodes: gloo, binding what its hostname
    resolves to, would advertise 127.0.1.1 to the other node (a connect timeout). The ranks bind the interface their
    route to the other node leaves by, and meet: 2 nodes x 2 ranks."""
    for n in ("n1", "n2"):
        hosts_files[n].write_text(f"127.0.1.1 {n}\n" + hosts_files[n].read_text())
    r = srun_meet("3", "10", "30", per_node=2)
    out = r.stdout + r.stderr
    assert r.returncode == 0, out[-4000:]
    assert (
        "rank 0 of 4 on n1 meets the others at n1:" in out and "(resolved here to 127.0.1.1) over interface ve1" in out
    )
    assert "GLOO_SOCKET_IFNAME=ve2" in out and "met: rank 3 of 4 on n2" in out and out.count("step 3: 4") == 4


def test_a_rendezvous_host_that_resolves_to_an_unreachable_address_fails_in_bound_naming_it(hosts_files):
    """The second node resolves the first node's name to an address nobody answers: both ranks give up within the
    rendezvous bound (8 s here, not the collective timeout), each naming the host, the port, what it resolved to
    and the interface, and exit 75, the code the job script resubmits (tests/test_workflow.py)."""
    text = hosts_files["n2"].read_text()
    hosts_files["n2"].write_text(re.sub(r"^\S+ n1 ", "10.77.0.99 n1 ", text, flags=re.M))
    t0 = time.monotonic()
    r = srun_meet("3", "10", "8")
    took = time.monotonic() - t0
    out = r.stdout + r.stderr
    assert r.returncode == 75 and took < 60, (took, out[-4000:])
    assert re.search(r"rank 1 of 2 on n2 could not meet the others at n1:\d+ \(resolved here to 10\.77\.0\.99\) "
                     r"over interface ve2 \(10\.77\.0\.12\) within 8 s", out), out[-4000:]  # fmt: skip
    assert "rank 0 of 2 on n1 could not meet the others" in out and "getent hosts" in out


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
