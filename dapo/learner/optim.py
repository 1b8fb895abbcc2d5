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


def deepspeed_config(zero_stage: int, bf16: bool, grad_clip: float, world_size: int) -> dict[str, Any]:
    """The DeepSpeed config. The learner owns micro-batching and the accumulation boundary, so DeepSpeed sees
    one sample per micro-step and accumulation steps 1 (it never rescales the loss by 1/accumulation)."""
    if zero_stage not in (0, 1, 2, 3):
        raise ValueError(f"zero_stage must be 0, 1, 2 or 3, got {zero_stage}")
    zero: dict[str, Any] = {"stage": zero_stage}
    if zero_stage == 3:
        # Gather each layer's parameters just in time; nothing kept resident beyond what a layer needs.
        zero.update({"stage3_param_persistence_threshold": 0, "stage3_prefetch_bucket_size": 0})
    return {
        "train_micro_batch_size_per_gpu": 1,
        "gradient_accumulation_steps": 1,
        "train_batch_size": world_size,
        "gradient_clipping": grad_clip,
        "zero_optimization": zero,
        "bf16": {"enabled": bf16},
        "zero_allow_untested_optimizer": True,  # a torch optimizer (see make_optimizer)
        "steps_per_print": 10**12,
        "wall_clock_breakdown": False,
    }


def resolve_dtype(dtype: str) -> torch.dtype:
    """ "auto" -> bfloat16 on a GPU that has it, else float32 (CPU runs and tests stay exact in float32)."""
    if dtype == "auto":
        return torch.bfloat16 if torch.cuda.is_available() and torch.cuda.is_bf16_supported() else torch.float32
    table = {"float32": torch.float32, "bfloat16": torch.bfloat16}
    if dtype not in table:
        raise ValueError(f"dtype must be auto, float32 or bfloat16, got {dtype!r}")
    return table[dtype]
