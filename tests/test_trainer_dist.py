"""`dapo train` as two torchrun processes matches the one-process run: rank 0 generates and broadcasts the step,
each rank updates on its shard with the all-reduced normaliser, so the trained weights agree (same seed, same
rollouts); and only rank 0 talks to MLflow and writes DONE.json.

Real engine (HF), real DeepSpeed (ZeRO 2 on gloo), real MLflow, on the cached tiny world; 2 rollout steps of 4
prompts x 4 responses, mini-batches of 2 prompts, so every update puts one whole group on each rank.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest
import torch

from dapo import metric_names as M
from dapo.trainer import checkpoint as ck

pytestmark = pytest.mark.slow
REPO = Path(__file__).resolve().parent.parent


def args(world: Path, tmp: Path) -> list[str]:
    eval_file = tmp / "eval4.jsonl"  # 4 eval problems: the run's end-of-training eval stays short
    eval_file.write_text("".join((world / "eval.jsonl").read_text().splitlines(keepends=True)[:4]))
    return [
        "--config",
        str(REPO / "configs" / "ablations" / "04_token_level_loss.yaml"),
        "--preset",
        "tiny",
        f"tiny.dir={world}",
        f"data.eval={eval_file}",
        "trainer.total_steps=2",
        "trainer.train_batch_size=4",
        "trainer.mini_batch_size=2",
        "trainer.zero_stage=2",
        "trainer.checkpoint_every=1",
        "trainer.keep_checkpoints=1",
        "rollout.engine=hf",
        "rollout.n=4",
        "rollout.max_response_length=24",
        "algorithm.overlong_buffer_len=8",
        "eval.n=2",
        "eval.every=0",
        "eval.pass_k=[1,2]",
        "eval.bootstrap=20",
        f"tracking.uri=sqlite:///{tmp}/mlflow.db",
        "tracking.experiment=dist",
    ]


def train(tmp: Path, world: Path, nproc: int) -> Path:
    tmp.mkdir()
    run_dir = tmp / "run"
    launcher = [sys.executable, "-m", "torch.distributed.run", "--standalone", f"--nproc-per-node={nproc}"]
    cmd = [
        *(launcher if nproc > 1 else [sys.executable]),
        "-m",
        "dapo.cli",
        "train",
        *args(world, tmp),
        "--run-dir",
        str(run_dir),
        "--progress",
        "log",
    ]
    env = dict(
        os.environ,
        HF_HUB_OFFLINE="1",
        TRANSFORMERS_OFFLINE="1",
        DS_ACCELERATOR="cpu",
        OMP_NUM_THREADS="1",
        TOKENIZERS_PARALLELISM="false",
        PYTHONHASHSEED="0",
    )
    for key in ("RANK", "WORLD_SIZE", "LOCAL_RANK", "MASTER_ADDR", "MASTER_PORT", "SLURM_PROCID", "SLURM_NTASKS"):
        env.pop(key, None)
    p = subprocess.run(cmd, cwd=tmp, env=env, capture_output=True, text=True, timeout=600)
    assert p.returncode == 0, p.stdout[-4000:] + p.stderr[-8000:]
    return run_dir


def final_params(run_dir: Path) -> dict[str, torch.Tensor]:
    from safetensors.torch import load_file

    return load_file(str(run_dir / "final" / "model.safetensors"))


def test_two_ranks_train_the_same_model_as_one(tiny_world_dir, tmp_path):
    from mlflow.tracking import MlflowClient

    one = train(tmp_path / "one", tiny_world_dir, 1)
    two = train(tmp_path / "two", tiny_world_dir, 2)

    for run_dir in (one, two):
        done = json.loads((run_dir / "DONE.json").read_text())
        assert done["step"] == 2 and done["grad_updates"] == 4  # 4 prompts / 2 per mini-batch, 2 steps
        assert [p.name for p in ck.list_checkpoints(run_dir)] == ["step_000002"]
    # two ranks really trained: ZeRO 2 saved one optimizer partition per rank into the same checkpoint

    def parts(d):
        return sorted(p.name for p in ck.latest_checkpoint(d).rglob("zero_pp_rank_*_optim_states.pt"))

    assert parts(one) == ["zero_pp_rank_0_mp_rank_00_optim_states.pt"]
    assert parts(two) == ["zero_pp_rank_0_mp_rank_00_optim_states.pt", "zero_pp_rank_1_mp_rank_00_optim_states.pt"]
    a, b = final_params(one), final_params(two)
    assert a.keys() == b.keys()
    base = final_params_base(tiny_world_dir)
    moved = max((a[k].float() - base[k].float()).abs().max().item() for k in a if k in base)
    assert moved > 1e-4  # the updates did change the weights ...
    for k in a:  # ... identically in both world sizes
        torch.testing.assert_close(b[k], a[k], atol=1e-5, rtol=0)

    hist = {}
    for run_dir in (one, two):
        c = MlflowClient(f"sqlite:///{run_dir.parent}/mlflow.db")
        runs = c.search_runs([c.get_experiment_by_name("dist").experiment_id])
        assert len(runs) == 1 and runs[0].info.status == "FINISHED"  # rank 1 opened no run of its own
        rid = runs[0].info.run_id
        hist[run_dir] = {
            k: {m.step: m.value for m in c.get_metric_history(rid, k)}
            for k in (M.GRAD_UPDATES, M.REWARD_MEAN, M.POLICY_LOSS, M.ENTROPY)
        }
    assert hist[two][M.GRAD_UPDATES] == {1: 2.0, 2: 4.0}
    assert hist[two][M.REWARD_MEAN] == hist[one][M.REWARD_MEAN]  # the same rollouts
    for key in (M.POLICY_LOSS, M.ENTROPY):  # over all ranks, not rank 0's half
        assert hist[two][key].keys() == {1, 2}
        for step, v in hist[one][key].items():
            assert hist[two][key][step] == pytest.approx(v, abs=1e-5), (key, step)


def final_params_base(world: Path) -> dict[str, torch.Tensor]:
    from safetensors.torch import load_file

    return load_file(str(next((world / "model").glob("*.safetensors"))))
