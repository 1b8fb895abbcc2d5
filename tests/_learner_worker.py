"""Runs every learner case of tests/test_learner.py in one process of a (1- or 2-rank) world.

    RANK=r WORLD_SIZE=2 LOCAL_RANK=r MASTER_ADDR=127.0.0.1 MASTER_PORT=p python tests/_learner_worker.py \
        MODEL_DIR BATCH.pt OUT.pt WORK_DIR

The same `run_cases` runs in the pytest process for world size 1, so both worlds execute identical code. Each
case starts from the model's initial weights (a DeepSpeed checkpoint taken right after construction), makes one
update on the whole mini-batch (each rank trains its shard, split by tokens, so groups straddle the ranks) and
records the full (gathered) parameters: for every engine (ZeRO 2, 3, 0 and 1; ZeRO 2 with gradient checkpointing), every
packing (`none`, `sequences`, `prompts`) and every policy loss (ppo_clip under each aggregation, GSPO, CISPO,
Clip-Cov, KL-Cov, and the rollout correction's weights), at one micro-batch and at several (ZeRO 2) or several
only. Rank 0 writes {case name: {"params": float64 vector, "metrics": dict, "micro_batches": int}} to OUT.pt,
named `engine/loss/packing/budget` (`case_name`).
"""

from __future__ import annotations

import math
import os
import sys
import warnings
from pathlib import Path

os.environ.setdefault("DS_ACCELERATOR", "cpu")
os.environ.setdefault("HF_HUB_OFFLINE", "1")

import torch  # noqa: E402

from dapo.algos.aggregation import MODES  # noqa: E402
from dapo.learner import Learner, LossSpec, PolicyBatch  # noqa: E402

WORKER_FILES = ("batch.pt", "w2.pt", "w2")  # what the test passes after the model: the batch, the output, a folder
BIG_BUDGET = 100_000  # one micro-batch
SMALL_BUDGET = 34  # 4 micro-batches for the test batch at world size 1 (2-3 per rank at 2)
SEQ_SUM_C = 16.0
SGD_LR = 1.0  # one SGD step = the gradient itself, so any normaliser error shows in the weights
CLIP = 0.5


# The other policy losses, each with the aggregation its paper uses (GSPO: a mean per response) or a stricter one,
# and settings that make each act on this small batch (every clip range binds; the covariance rules select tokens).
POLICY_LOSS_CASES = {
    "gspo": "seq-mean-token-mean",
    "cispo": "token-mean",
    "clip_cov": "token-mean",
    "kl_cov": "group-token-mean",
    "sapo": "seq-mean-token-mean",
    "gmpo": "seq-mean-token-mean",
    "dppo_tv": "seq-mean-token-sum",
    "dppo_kl": "seq-mean-token-sum",
}
NEW_LOSSES = ("sapo", "gmpo", "dppo_tv", "dppo_kl", "off_policy_mask")  # the 2026 baselines: on ZeRO 2 and 3 only
POLICY_LOSS_SETTINGS = dict(
    cispo_clip_max=1.1, clip_cov_ratio=0.05, clip_cov_lb=0.0, clip_cov_ub=10.0, kl_cov_ratio=0.05,
    sapo_tau_pos=1.0, sapo_tau_neg=1.05,
)  # fmt: skip
# DPPO's trust regions are on probabilities, ~1/101 for this model's tokens: bounds at that scale, so that they bind
# (the authors' 0.15 and 0.05 are for a trained model's); every other loss 0.2 / 0.28
EPS = {"dppo_tv": (0.002, 0.002), "dppo_kl": (2e-4, 2e-4)}
OFF_POLICY_MASK = 0.1  # drops some negative responses of the test batch (its engine log-probs are noisy)
SALT = 3  # the covariance rules' draw


def loss_spec(mode: str, policy_loss: str = "ppo_clip", off_policy_mask: float | None = None) -> LossSpec:
    eps_low, eps_high = EPS.get(policy_loss, (0.2, 0.28))
    return LossSpec(
        eps_low=eps_low,
        eps_high=eps_high,
        dual_clip_c=1.5,
        loss_agg=mode,
        seq_token_sum_constant=SEQ_SUM_C,
        temperature=0.7,
        policy_loss=policy_loss,
        off_policy_mask=off_policy_mask,
        **POLICY_LOSS_SETTINGS,
    )


def is_weights(batch: PolicyBatch) -> torch.Tensor:
    """Rollout-correction weights as the trainer makes them (on whole responses): fixed, varied, 0 on padding."""
    g = torch.Generator().manual_seed(7)
    return (torch.rand(batch.loss_mask.shape, generator=g) * 2.0) * (batch.old_logp != 0)


def flat_params(learner: Learner) -> torch.Tensor:
    """The learner's weights in the model's parameter order (its sync stream puts the vocabulary last)."""
    streamed = {n: t.detach().double().cpu() for n, t in learner.named_parameters_for_sync()}
    return torch.cat([streamed[n].reshape(-1) for n, _ in learner.engine.module.lm.named_parameters()])


PACKINGS = ("none", "sequences", "prompts")
# every policy loss with its aggregation (ppo_clip once per aggregation) and the rollout correction's weights
LOSS_CASES = [(mode, "ppo_clip") for mode in MODES] + [(mode, name) for name, mode in POLICY_LOSS_CASES.items()]


def case_name(engine: str, loss: str, packing: str, budget: int) -> str:
    return f"{engine}/{loss}/{packing}/{budget}"


def run_cases(model_dir: str, batch: PolicyBatch, work_dir: Path) -> dict[str, dict]:
    """Each engine x packing x loss (x budget on z2) from the same initial weights; see the module docstring."""
    results: dict[str, dict] = {}
    engines = {  # name: (zero stage, grad clip, gradient checkpointing)
        "z2": (2, 1e6, False),
        "z3": (3, CLIP, False),
        "z0": (0, CLIP, False),
        "z1": (1, CLIP, False),  # the 7B presets' stage
        "z2c": (2, 1e6, True),
    }
    weighted = batch.select(list(range(len(batch))))
    weighted.is_weights = is_weights(batch)
    for ename, (stage, clip, ckpt) in engines.items():
        learner = Learner(
            model_dir,
            loss=loss_spec("token-mean"),
            lr=SGD_LR,
            grad_clip=clip,
            zero_stage=stage,
            dtype="float32",
            optimizer=lambda params: torch.optim.SGD(params, lr=SGD_LR),  # one step = lr x gradient
            micro_batch_tokens=BIG_BUDGET,
            logprob_chunk_size=7,
            gradient_checkpointing=ckpt,
        )
        world = learner.dist.world_size
        # Every rank passes the whole mini-batch; the learner trains its shard, split by tokens: at world size 2 some
        # groups have responses on both ranks (the test checks it).
        init_dir = work_dir / f"init_{ename}_w{world}"
        learner.save_checkpoint(init_dir)
        results[f"{ename}/init"] = {"params": flat_params(learner)}

        def one(
            name: str,
            mode: str,
            budget: int,
            b: PolicyBatch,
            learner: Learner = learner,
            init_dir: Path = init_dir,
            packing: str = "none",
            policy_loss: str = "ppo_clip",
            ename: str = ename,
        ) -> None:
            learner.load_checkpoint(init_dir)
            learner.set_packing(packing)
            mask_at = OFF_POLICY_MASK if name.split("/")[1] == "off_policy_mask" else None
            learner.loss, learner.passes.micro_batch_tokens = loss_spec(mode, policy_loss, mask_at), budget
            mine = b.select(learner.passes.my_rows(b))  # what the update trains
            plan = [r for r in learner.passes.plan(mine) if r]
            metrics = learner.update(b, salt=SALT)
            logp, entropy = learner.compute_logprobs(b) if ename == "z2" and budget == SMALL_BUDGET else (None, None)
            results[name] = {
                "params": flat_params(learner),
                "metrics": metrics,
                "micro_batches": len(plan),
                "logp_after": logp,
                "entropy_after": entropy,
            }

        budgets = (BIG_BUDGET, SMALL_BUDGET) if ename == "z2" else (SMALL_BUDGET,)
        for packing in PACKINGS:
            for budget in budgets:
                for mode, policy_loss in LOSS_CASES:
                    loss = mode if policy_loss == "ppo_clip" else policy_loss
                    if loss in NEW_LOSSES and ename not in ("z2", "z3"):
                        continue
                    one(case_name(ename, loss, packing, budget), mode, budget, batch, packing=packing,
                        policy_loss=policy_loss)  # fmt: skip
                if ename in ("z2", "z3"):  # DeepSeek-V3.2's sequence mask, on the clipped surrogate
                    one(case_name(ename, "off_policy_mask", packing, budget), "token-mean", budget, batch,
                        packing=packing)  # fmt: skip
                # The rollout correction's weights, made on whole responses, then split with the batch.
                one(case_name(ename, "is_weights", packing, budget), "token-mean", budget, weighted, packing=packing)
        if ename in ("z2", "z0"):
            # A NaN advantage on one response that trains (on the last rank only, at world size 2).
            bad = batch.select(list(range(len(batch))))
            bad.advantages = bad.advantages.clone()
            bad.advantages[_row_on_last_rank(batch, world)] = math.nan
            one(f"{ename}/nan", "token-mean", SMALL_BUDGET, bad, packing="sequences")
            if ename == "z2":
                # The engine is sane after a skipped step: the next update is the ordinary one.
                metrics = learner.update(batch)
                results["z2/after_nan"] = {"params": flat_params(learner), "metrics": metrics}
        if ename == "z3":
            # The final save at ZeRO-3: rank 0 alone holds the gathered model, and writes it.
            held = learner.state_dict_on_main()
            per_rank = [len(held)]
            if world > 1:
                per_rank = [None] * world
                torch.distributed.all_gather_object(per_rank, len(held))
            learner.save_hf(work_dir / f"hf_z3_w{world}")
            results["z3/save"] = {
                "params": flat_params(learner),
                "tensors_held_per_rank": per_rank,
                "hf_dir": str(work_dir / f"hf_z3_w{world}"),
            }
    return results


def _row_on_last_rank(batch: PolicyBatch, world: int) -> int:
    """A response with loss tokens that the last rank's shard holds."""
    last = batch.select(batch.shard_rows(world - 1, world))
    keep = last.loss_mask.sum(dim=1) > 0
    row_in_shard = int(torch.nonzero(keep)[0].item())
    target = (
        last.prompt_ids[row_in_shard],
        last.response_ids[row_in_shard],
        int(last.group_ids[row_in_shard]),
    )
    for i in range(len(batch)):
        if (batch.prompt_ids[i], batch.response_ids[i], int(batch.group_ids[i])) == target:
            return i
    raise AssertionError("row not found")


def main() -> None:
    # DeepSpeed calls collectives that torch 2.13 marks deprecated, once per call: thousands of lines otherwise
    warnings.filterwarnings("ignore", message=".*is deprecated", category=FutureWarning)
    model_dir, batch_path, out_path, work_dir = sys.argv[1:5]
    torch.set_num_threads(1)
    batch = torch.load(batch_path, weights_only=False)
    results = run_cases(model_dir, batch, Path(work_dir))
    if int(os.environ.get("RANK", "0")) == 0:
        torch.save(results, out_path)
    from dapo.learner import shutdown

    shutdown()


if __name__ == "__main__":
    main()
