"""A training job of two ranks: two rollout replicas that each generate half the samples of every prompt of
every generation batch (dynamic sampling's refill included) and of the evaluation, and train to the weights of a
one-rank run on the same collected batch; a failure on one rank ends both, naming it, with the failure code.

The loop and the learner are real (DeepSpeed ZeRO 2 on gloo) in `_trainer_worker.py`, with an engine that answers
from the prompt alone, so both world sizes collect the same batch. `dapo train` itself runs under torchrun with
real vLLM replicas on the cached tiny world.
"""

from __future__ import annotations

import json
import subprocess
import sys
import time
from pathlib import Path

import pytest
import torch
from _env import child_env as env
from _env import free_port

from dapo import metric_names as M

pytestmark = pytest.mark.slow
REPO = Path(__file__).resolve().parent.parent
WORKER = Path(__file__).resolve().parent / "_trainer_worker.py"
EPS32 = torch.finfo(torch.float32).eps


def torchrun(nproc: int) -> list[str]:
    return [sys.executable, "-m", "torch.distributed.run", "--standalone", f"--nproc-per-node={nproc}"]


@pytest.fixture(scope="module")
def model_dir(tmp_path_factory) -> Path:
    from test_rollout import build_tiny_qwen2

    return build_tiny_qwen2(tmp_path_factory.mktemp("model"), tie=False)


def run_worker(
    model_dir: Path, out: Path, nproc: int, *overrides: str, **env_extra: str
) -> subprocess.CompletedProcess:
    out.mkdir(parents=True, exist_ok=True)
    cmd = [*(torchrun(nproc) if nproc > 1 else [sys.executable]), str(WORKER), str(model_dir), str(out), *overrides]
    return subprocess.run(cmd, env=env(**env_extra), capture_output=True, text=True, timeout=600)


def calls(out: Path, rank: int) -> list[dict]:
    return json.loads((out / f"calls.rank{rank}.json").read_text())


def test_two_replicas_split_every_batch_and_train_the_one_rank_weights(model_dir, tmp_path):
    one, two = tmp_path / "one", tmp_path / "two"
    for out, nproc in ((one, 1), (two, 2)):
        p = run_worker(model_dir, out, nproc)
        assert p.returncode == 0, p.stdout[-3000:] + p.stderr[-6000:]
    a, b = torch.load(one / "result.pt"), torch.load(two / "result.pt")

    # the same collected steps: the same refill, rewards and token counts over all replicas
    for key in (M.DS_GEN_BATCHES, M.DS_GROUPS_KEPT, M.DS_TOKENS_GENERATED, M.REWARD_MEAN, M.GRAD_UPDATES):
        assert b["metrics"][key] == a["metrics"][key], key
    assert max(a["metrics"][M.DS_GEN_BATCHES].values()) >= 2  # dynamic sampling refilled
    # ... and the same training: weights moved, identically at world size 1 and 2
    moved = max((a["params"][k] - b0).abs().max().item() for k, b0 in initial(model_dir).items())
    assert moved > 1e-4
    # The two worlds sum each gradient in another order. AdamW normalises every step to about lr, so rounding changes
    # a step by lr x the gradient's relative rounding (n_tokens x eps, ~1e-5 here), except where a gradient is itself
    # of rounding size and its step may turn: no bound follows from eps alone. What the comparison must catch moves
    # weights by the order of `moved` (4 updates x lr): a rank that trains another shard or skips the all-reduce.
    # So 1/32 of it.
    for k, v in a["params"].items():
        torch.testing.assert_close(b["params"][k], v, atol=moved / 32, rtol=0)
    # a mean over the step's loss tokens (at most 4 x 4 x 6 = 96), of terms |A rho| and entropies below log V ~ 6,
    # summed in another order: 96 x eps x 6 each side; rank 0's part alone would be off by O(0.1)
    for key in (M.POLICY_LOSS, M.ENTROPY):  # over all ranks, not rank 0's part
        for step, v in a["metrics"][key].items():
            assert b["metrics"][key][step] == pytest.approx(v, abs=2 * 96 * EPS32 * 6), (key, step)
    # the final evaluation, sharded over the replicas and summarised once, gives the one-rank numbers
    assert b["metrics"][M.eval_avg(2)] == a["metrics"][M.eval_avg(2)] and 2 in a["metrics"][M.eval_avg(2)]

    # what each replica generated: a different half of the samples of every prompt of every generation batch, the
    # evaluation included
    solo, r0, r1 = calls(one, 0), calls(two, 0), calls(two, 1)
    assert len(r0) == len(r1) == len(solo)
    for whole, h0, h1 in zip(solo, r0, r1, strict=True):
        assert h0["problems"] == h1["problems"] == whole["problems"]
        assert h0["counts"] == h1["counts"] == [k // 2 for k in whole["counts"]]
    assert {k for c in solo for k in c["counts"]} == {4, 2}  # rollouts (n=4) and evaluation (n=2)


def test_two_replicas_carry_over_as_one(model_dir, tmp_path):
    """Carry-over (`rollout.max_staleness: 1`) on two replicas: each continues its part of the groups in flight and the
    engine's poll gathers every replica's finished responses after each decode step, so both stop together; with an
    engine whose samples depend on their seeds alone (`_trainer_worker.py`), one and two replicas carry the same
    responses over, keep the same groups and train the same weights."""
    one, two = tmp_path / "one", tmp_path / "two"
    carry = ("rollout.max_staleness=1", "algorithm.rollout_correction=token_tis", "trainer.tripwires=false")
    # 4 groups train, 5 in flight: one waits every step; responses of 6 tokens on average, up to 16
    carry += ("algorithm.dynamic_sampling=false", "rollout.max_response_length=16", "algorithm.overlong_buffer_len=4")
    for out, nproc in ((one, 1), (two, 2)):
        p = run_worker(model_dir, out, nproc, *carry, "trainer.total_steps=3")
        assert p.returncode == 0, p.stdout[-3000:] + p.stderr[-6000:]
    a, b = torch.load(one / "result.pt"), torch.load(two / "result.pt")
    assert max(a["metrics"][M.STALENESS_MAX].values()) == 1 and max(a["metrics"][M.STALENESS_SPANNING_FRAC].values())
    for key in (M.STALENESS_TOKENS_CARRIED, M.STALENESS_GROUPS_CARRIED, M.STALENESS_MEAN, M.DS_GEN_BATCHES):
        assert b["metrics"][key] == a["metrics"][key], key
    for key in (M.DS_GROUPS_KEPT, M.DS_TOKENS_GENERATED, M.REWARD_MEAN, M.GRAD_UPDATES):
        assert b["metrics"][key] == a["metrics"][key], key
    moved = max((a["params"][k] - b0).abs().max().item() for k, b0 in initial(model_dir).items())
    assert moved > 1e-4
    for k, v in a["params"].items():  # the bound of the test above: 1/32 of what the updates moved
        torch.testing.assert_close(b["params"][k], v, atol=moved / 32, rtol=0)


def initial(model_dir: Path) -> dict[str, torch.Tensor]:
    from safetensors.torch import load_file

    return load_file(str(model_dir / "model.safetensors"))


def plain_ranks(tmp: Path, cmd: list[str], **env_extra: str) -> tuple[list[int], list[str], float]:
    """Two plain processes of one job, as `srun` starts them: no launcher ends one when the other fails. Returns
    their exit codes, their logs, and how many seconds the slower one ended after the faster one."""
    port, procs, logs = free_port(), [], []
    for rank in (0, 1):
        logs.append(tmp / f"rank{rank}.log")
        launch = dict(RANK=str(rank), WORLD_SIZE="2", LOCAL_RANK=str(rank), MASTER_ADDR="127.0.0.1")
        e = env(**launch, MASTER_PORT=str(port), **env_extra)
        procs.append(subprocess.Popen(cmd, cwd=tmp, env=e, stdout=open(logs[-1], "w"), stderr=subprocess.STDOUT))
    ended: dict[int, float] = {}
    deadline = time.monotonic() + 400
    try:
        while len(ended) < 2 and time.monotonic() < deadline:
            for r, p in enumerate(procs):
                if r not in ended and p.poll() is not None:
                    ended[r] = time.monotonic()
            time.sleep(0.2)
    finally:
        for p in procs:
            p.kill()
            p.wait()
    text = [log.read_text(errors="replace") for log in logs]
    assert len(ended) == 2, "a rank was still running after 400 s:\n" + text[0][-3000:] + text[1][-3000:]
    return [p.returncode for p in procs], text, max(ended.values()) - min(ended.values())


def test_a_failure_on_one_rank_ends_every_rank_with_the_failure_code(model_dir, tmp_path):
    """Rank 1 raises in step 2; rank 0, waiting for it in a collective whose timeout is 10 minutes here, is told
    through the job's store and exits 1 too within a minute, naming rank 1 and its error."""
    cmd = [sys.executable, str(WORKER), str(model_dir), str(tmp_path / "out"), "trainer.collective_timeout_s=600"]
    codes, text, apart_s = plain_ranks(tmp_path, cmd, DAPO_TEST_FAIL_AT="1:2")
    assert codes == [1, 1], text[0][-3000:] + text[1][-3000:]
    assert apart_s < 60, f"rank 0 ended {apart_s:.0f} s after rank 1"
    assert "test hook DAPO_TEST_FAIL_AT: rank 1 fails in rollout step 2" in text[1]
    assert "rank 1: RuntimeError: test hook DAPO_TEST_FAIL_AT: rank 1 fails in rollout step 2" in text[0]
    assert not (tmp_path / "out" / "result.pt").exists()


def test_a_rank_that_fails_while_the_run_is_built_ends_every_rank(tiny_world_dir, tmp_path):
    """`dapo train` as two plain ranks: rank 1 fails before its learner joins the others (a model that does not
    load on one node); rank 0, building its own parts and waiting for rank 1 in a collective, ends within a
    minute with the failure code (not at the 10-minute timeout), naming rank 1's error."""
    cmd = [sys.executable, "-m", "dapo.cli", "train", *train_args(tiny_world_dir, tmp_path)]
    cmd += ["resources.train.tasks_per_node=2", "rollout.engine=hf", "trainer.collective_timeout_s=600"]
    cmd += ["--run-dir", str(tmp_path / "run"), "--progress", "log"]
    codes, text, apart_s = plain_ranks(tmp_path, cmd, DAPO_TEST_FAIL_AT="1:0")
    assert codes == [1, 1], text[0][-3000:] + text[1][-3000:]
    assert apart_s < 60, f"rank 0 ended {apart_s:.0f} s after rank 1"
    assert "rank 1: RuntimeError: test hook DAPO_TEST_FAIL_AT: rank 1 fails while the run is built" in text[0]


# ------------------------------------------------------------------------------------------------ dapo train
def train_args(world: Path, tmp: Path) -> list[str]:
    eval_file = tmp / "eval4.jsonl"  # 4 eval problems: the run's end-of-training eval stays short
    eval_file.write_text("".join((world / "eval.jsonl").read_text().splitlines(keepends=True)[:4]))
    return [
        "--config",
        str(REPO / "configs" / "ablations" / "05_dynamic_sampling.yaml"),
        "--preset",
        "tiny",
        f"tiny.dir={world}",
        f"data.eval={eval_file}",
        "trainer.total_steps=2",
        "trainer.train_batch_size=4",
        "trainer.mini_batch_size=2",
        "trainer.checkpoint_every=1",
        "trainer.keep_checkpoints=1",
        "rollout.n=4",
        "rollout.max_response_length=24",
        "algorithm.overlong_buffer_len=8",
        "algorithm.gen_batch_size=4",
        "algorithm.max_num_gen_batches=0",  # refill until 4 groups are kept: 2 updates a step
        "eval.n=2",
        "eval.every=0",
        "eval.pass_k=[1,2]",
        "eval.bootstrap=20",
        f"tracking.uri=sqlite:///{tmp}/mlflow.db",
        "tracking.experiment=dist",
    ]


def dapo_train(tmp: Path, world: Path, *extra: str, **env_extra: str) -> tuple[subprocess.CompletedProcess, float]:
    tmp.mkdir()
    # resources.train asks for the 2 ranks torchrun starts: dapo train refuses a world size its config did not ask for
    cmd = [*torchrun(2), "-m", "dapo.cli", "train", *train_args(world, tmp), "resources.train.tasks_per_node=2", *extra]
    cmd += ["--run-dir", str(tmp / "run"), "--progress", "log"]
    t0 = time.monotonic()
    p = subprocess.run(cmd, cwd=tmp, env=env(**env_extra), capture_output=True, text=True, timeout=600)
    return p, time.monotonic() - t0


def test_dapo_train_runs_two_vllm_replicas_under_torchrun(tiny_world_dir, tmp_path, vllm):
    from mlflow.tracking import MlflowClient

    p, _ = dapo_train(tmp_path / "ok", tiny_world_dir)
    assert p.returncode == 0, p.stdout[-4000:] + p.stderr[-8000:]
    done = json.loads((tmp_path / "ok" / "run" / "DONE.json").read_text())
    assert done["step"] == 2 and done["grad_updates"] == 4 and M.eval_avg(2) in done["eval"]
    c = MlflowClient(f"sqlite:///{tmp_path}/ok/mlflow.db")
    runs = c.search_runs([c.get_experiment_by_name("dist").experiment_id])
    assert len(runs) == 1 and runs[0].info.status == "FINISHED"  # rank 1 opened no run of its own
    assert runs[0].data.tags[M.TAG_REPLICAS] == "2"
    tokens = {m.step: m.value for m in c.get_metric_history(runs[0].info.run_id, M.DS_TOKENS_GENERATED)}
    assert sorted(tokens) == [1, 2] and all(v > 0 for v in tokens.values())


def test_dapo_train_under_torchrun_fails_with_code_1_when_a_rank_raises(tiny_world_dir, tmp_path):
    from mlflow.tracking import MlflowClient

    extra = ("rollout.engine=hf", "trainer.collective_timeout_s=900")  # a hang would outlast the 600 s limit
    p, _ = dapo_train(tmp_path / "fail", tiny_world_dir, *extra, DAPO_TEST_FAIL_AT="1:2")
    out = p.stdout + p.stderr
    assert p.returncode == 1, out[-6000:]
    assert "rank 1 fails in rollout step 2" in out
    assert not (tmp_path / "fail" / "run" / "DONE.json").exists()
    c = MlflowClient(f"sqlite:///{tmp_path}/fail/mlflow.db")
    (run,) = c.search_runs([c.get_experiment_by_name("dist").experiment_id])
    assert run.info.status == "FAILED" and run.data.tags[M.TAG_STATUS] == "failed"
