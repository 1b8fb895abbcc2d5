"""The optimizer, the learning-rate schedule and the DeepSpeed config: plain functions of plain values.

Schedule (docs/algorithm.md section 5: linear warm-up, then constant), counted in rollout steps, not gradient
updates, so the number of mini-batches per step (or a dynamic-sampling refill) cannot stretch it:

    lr(s) = lr * min(1, (s + 1) / warmup_steps)      s = rollout steps completed (0 during the first step)

The first rollout step trains at lr / warmup_steps rather than 0 (the HF/verl form starts at 0, a wasted step).
"""

from __future__ import annotations

from collections.abc import Iterable
from typing import Any

import torch

from dapo.plan import ZERO2_BUCKET  # the plan counts its buffers


def lr_at(rollout_step: int, lr: float, warmup_steps: int) -> float:
    """The learning rate in effect during rollout step `rollout_step` (0-based)."""
    if warmup_steps <= 0:
        return lr
    return lr * min(1.0, (rollout_step + 1) / warmup_steps)


def make_optimizer(
    params: Iterable[torch.nn.Parameter],
    lr: float,
    weight_decay: float,
    betas: tuple[float, float],
) -> torch.optim.Optimizer:
    """The torch optimizer DeepSpeed wraps: torch's fused AdamW (one kernel per parameter tensor on CPU and GPU;
    the default for-loop form took twice as long per step on the CPU: bench_learner_flops.py); DeepSpeed's own
    AdamW builds a C++ op first (~75 s on 2 CPU cores, DeepSpeed 0.19.8)."""
    return torch.optim.AdamW(list(params), lr=lr, betas=betas, weight_decay=weight_decay, fused=True)


def zero_optimization(zero_stage: int, hidden_size: int | None) -> dict[str, Any]:
    """The `zero_optimization` section as DeepSpeed and transformers' integration recommend for each stage (their
    sources and what each does: docs/distributed.md, "ZeRO's collectives").

    Stages 1-2: gradients reduced in buckets while the backward still runs (`overlap_comm`) into one contiguous
    buffer (`contiguous_gradients`), by reduce-scatter. Stage 3: the same for its reduce-scatters, and the next
    modules' parameters all-gathered while the current one computes (`stage3_prefetch_bucket_size`, 0.9 x hidden^2
    elements), parameters below 10 x hidden elements (norms, biases) kept whole on every rank rather than gathered
    in every pass (`stage3_param_persistence_threshold`), a reduce bucket of hidden^2: transformers' "auto" values
    (`HfTrainerDeepSpeedConfig`). Without a hidden size (a model config without one), DeepSpeed's own defaults."""
    if zero_stage not in (0, 1, 2, 3):
        raise ValueError(f"zero_stage must be 0, 1, 2 or 3, got {zero_stage}")
    zero: dict[str, Any] = {"stage": zero_stage}
    if zero_stage in (1, 2):
        zero.update(
            overlap_comm=True,
            contiguous_gradients=True,
            reduce_scatter=True,
            reduce_bucket_size=ZERO2_BUCKET,
            allgather_bucket_size=ZERO2_BUCKET,
        )
    elif zero_stage == 3:
        zero.update(overlap_comm=True, contiguous_gradients=True)
        if hidden_size:
            zero.update(
                reduce_bucket_size=hidden_size * hidden_size,
                stage3_prefetch_bucket_size=int(0.9 * hidden_size * hidden_size),
                stage3_param_persistence_threshold=10 * hidden_size,
            )
    return zero


def deepspeed_config(
    zero_stage: int, bf16: bool, grad_clip: float, world_size: int, hidden_size: int | None = None
) -> dict[str, Any]:
    """The DeepSpeed config. The learner owns micro-batching and the accumulation boundary, so DeepSpeed sees
    one sample per micro-step and accumulation steps 1 (it never rescales the loss by 1/accumulation)."""
    return {
        "train_micro_batch_size_per_gpu": 1,
        "gradient_accumulation_steps": 1,
        "train_batch_size": world_size,
        "gradient_clipping": grad_clip,
        "zero_optimization": zero_optimization(zero_stage, hidden_size),
        "bf16": {"enabled": bf16},
        "zero_allow_untested_optimizer": True,  # a torch optimizer (see make_optimizer)
        "steps_per_print": 10**12,
        "wall_clock_breakdown": False,
    }
