"""The rollout correction: importance weights for the gap between the engine's sampling and the learner's old
log-probs, d_t = log pi_old(y_t) - log pi_rollout(y_t) on sampled tokens (docs/algorithm.md section 11: the sources,
verl's `rollout_correction` and TRL's `vllm_importance_sampling_mode`, whose weights these match on the same tensors):

    token_tis:     w_t = min(e^{d_t}, C)                 sequence_tis:  w_i = min(e^{sum_t d_t}, C)
    token_mis:     w_t = e^{d_t} if floor <= e^{d_t} <= C, else 0     sequence_mis: the same per response

The weight multiplies each token's policy loss after the clip (and before any KL term), detached; the normaliser is
unchanged. Weights are made once per rollout step on whole responses, before any split, so a sequence-level weight
sees every token of its response whatever the split. The gap itself is a metric (`dapo.algos.metrics.mismatch_stats`).
`token_mis` with a floor is IcePop's two-sided token mask (Ling team, arXiv 2510.18855; its bounds [0.5, 5]).

DeepSeek-V3.2's off-policy sequence mask (arXiv 2512.02556, Eq. 9; `algorithm.off_policy_mask`) is a mask of the
same kind made at every update instead, on the current policy: a response with A < 0 whose mean log-ratio of the
sampling policy to the current one, mean_t (log pi_rollout(y_t) - log pi_theta(y_t)), exceeds delta leaves the loss
(`off_policy_sequence_mask`).
"""

from __future__ import annotations

import math

import torch
from torch import Tensor

from dapo.algos.metrics import log_ratio
from dapo.algos.policy_loss import _LOG_RATIO_CLAMP
from dapo.types import ROLLOUT_CORRECTIONS, RolloutCorrection

__all__ = ["ROLLOUT_CORRECTIONS", "RolloutCorrection", "correction_weights", "off_policy_sequence_mask"]


def off_policy_sequence_mask(
    advantages: Tensor, logp: Tensor, sampling_logp: Tensor, mask: Tensor, threshold: float
) -> Tensor:
    """DeepSeek-V3.2's off-policy sequence mask: [N, 1] float, 0 for a response with A < 0 whose mean over its loss
    tokens of log pi_sampling - log pi_theta (the KL of the sampling policy to the current one, estimated on the
    samples) is above `threshold`, 1 otherwise. Detached; exact in any split (a response never straddles one).

    Args:
        advantages: [N]; logp: [N, T] the current policy's log-probs; sampling_logp: [N, T] the engine's (the old
            policy's where the engine gave none); mask: [N, T] the loss mask; threshold: delta > 0.
    """
    if threshold <= 0:
        raise ValueError(f"the off-policy mask's threshold must be > 0, got {threshold}")
    m = mask.to(logp.dtype)
    kl = ((sampling_logp.detach() - logp.detach()) * m).sum(-1, keepdim=True) / m.sum(-1, keepdim=True).clamp(min=1)
    keep = (advantages.reshape(-1, 1) >= 0) | (kl <= threshold)
    return keep.to(logp.dtype)


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
