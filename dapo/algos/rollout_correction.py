"""The rollout/learner mismatch: how far the engine's log-probs are from the learner's on the tokens the engine
sampled, and the importance weights that correct the loss for it (docs/algorithm.md section 11).

The engine samples in its own numerics (vLLM's kernels, bf16, another attention) and the learner recomputes the
old log-probs in its own, so the tokens were drawn from pi_rollout, not from the pi_old that PPO's ratio
pi_theta / pi_old starts from. With d_t = log pi_old(y_t) - log pi_rollout(y_t) on sampled tokens:

    mismatch (`dapo.algos.metrics.mismatch_stats`, logged every step): mean |d_t|, k3 = E[e^d - 1 - d] (an
                estimate of KL(pi_rollout || pi_old) from pi_rollout's samples), the largest per-response mean
                |d_t|, the share of tokens with |d_t| above a bound

    token_tis:     w_t = min(e^{d_t}, C)                 truncated importance sampling, per token
    sequence_tis:  w_i = min(e^{sum_t d_t}, C)           ... per response (the product of its token ratios)
    token_mis:     w_t = e^{d_t} if floor <= e^{d_t} <= C, else 0     masked importance sampling, per token
    sequence_mis:  w_i = e^{sum_t d_t} if floor <= ... <= C, else 0   ... per response

The weight multiplies each token's policy loss after the clip (and before any KL term), detached; the loss's
normaliser is unchanged (a masked token still counts in it). Sources, whose formulas these match on the same
tensors (tests/test_algos_rollout_correction.py): verl's `rollout_correction` (`rollout_is: token | sequence` with
`rollout_is_threshold: C` for TIS, `"floor_C"` for the masked form it calls IcePop; default C = 2) and TRL's
`vllm_importance_sampling_mode` (`token_truncate`, `sequence_truncate`, `token_mask`, `sequence_mask`; C = 3).
The log-ratio is clamped to +-20 before exp (verl's guard; TRL's inf gives the same weights).

Weights are computed once per rollout step on whole responses, before the batch is split into mini-batches,
micro-batches and ranks, so a sequence-level weight sees every token of its response whatever the split.
"""

from __future__ import annotations

import math

import torch
from torch import Tensor

from dapo.algos.metrics import log_ratio
from dapo.algos.policy_loss import _LOG_RATIO_CLAMP
from dapo.types import ROLLOUT_CORRECTIONS, RolloutCorrection

__all__ = ["ROLLOUT_CORRECTIONS", "RolloutCorrection", "correction_weights"]


def correction_weights(
    old_logp: Tensor,
    engine_logp: Tensor,
    mask: Tensor,
    mode: RolloutCorrection,
    cap: float,
    floor: float | None = None,
) -> tuple[Tensor, dict[str, float]]:
    """Per-token importance weights for the policy loss, and what they did.

    Args:
        old_logp: [N, T] the learner's log-probs of the sampled tokens (pi_old).
        engine_logp: [N, T] the engine's log-probs of the same tokens (pi_rollout, the sampling distribution).
        mask: [N, T] 1 on response tokens.
        mode: one of ROLLOUT_CORRECTIONS ("none": all ones).
        cap: C, the truncation (TIS) or upper masking bound (MIS); > 0.
        floor: MIS only: the lower masking bound (None: none).

    Returns:
        (weights [N, T] float32, 0 off the mask; stats): `weight_mean` (over response tokens), `capped_frac` (TIS:
        share of responses or tokens, as the mode works, whose ratio exceeded C), `masked_frac` (MIS: share set
        to 0).
    """
    if mode not in ROLLOUT_CORRECTIONS:
        raise ValueError(f"unknown rollout correction {mode!r}; choose one of {ROLLOUT_CORRECTIONS}")
    if cap <= 0 or (floor is not None and not 0 <= floor < cap):
        raise ValueError(f"need cap > 0 and 0 <= floor < cap, got cap={cap}, floor={floor}")
    m = mask.to(torch.bool)
    if mode == "none":
        return m.float(), {}
    d = log_ratio(old_logp, engine_logp, mask)
    per_sequence = mode.startswith("sequence")
    units = d.sum(dim=-1, keepdim=True) if per_sequence else d  # [N, 1] or [N, T]
    valid = m.any(dim=-1, keepdim=True) if per_sequence else m
    ratio = torch.exp(units.clamp(-_LOG_RATIO_CLAMP, _LOG_RATIO_CLAMP))
    stats: dict[str, float] = {}
    n_units = max(int(valid.sum()), 1)
    if mode.endswith("tis"):
        w = ratio.clamp(max=cap)
        stats["capped_frac"] = float(((ratio > cap) & valid).sum()) / n_units
    else:
        keep = (ratio <= cap) & (ratio >= (floor if floor is not None else -math.inf))
        w = torch.where(keep, ratio, torch.zeros_like(ratio))
        stats["masked_frac"] = float((~keep & valid).sum()) / n_units
    w = torch.where(m, w.expand_as(d), torch.zeros_like(d))
    stats["weight_mean"] = float(w[m].mean()) if m.any() else math.nan
    return w.float(), stats
