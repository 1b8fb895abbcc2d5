"""Metric helpers over loss tokens (docs/algorithm.md section 7; Fig 3a and Fig 3b of the paper).

All take tensors and return python floats. A mean over an empty set is NaN (never a warning or an error): for
Fig 3a "no token was clipped at the upper bound" is not the same as "their mean probability was 0", so a
tracker should skip or show NaN points rather than log 0.
"""

from __future__ import annotations

import math

import torch
from torch import Tensor


def masked_mean(values: Tensor, mask: Tensor) -> float:
    """Mean of `values` where `mask` is set ([N, T] each); NaN when the mask is empty."""
    m = mask.to(torch.bool)
    n = int(m.sum().item())
    if n == 0:
        return math.nan
    return float(values.detach().to(torch.float64)[m].sum().item() / n)


def clip_fractions(clipped_lower: Tensor, clipped_upper: Tensor, mask: Tensor) -> tuple[float, float]:
    """(lower, upper): fractions of loss tokens whose lower / upper clip bound was active. [N, T] each.

    Logged separately because clip-higher only moves the upper one; a combined fraction hides its effect.
    """
    return masked_mean(clipped_lower.float(), mask), masked_mean(clipped_upper.float(), mask)


def clipped_upper_old_prob(old_logp: Tensor, clipped_upper: Tensor, mask: Tensor) -> float:
    """Fig 3a: mean old-policy probability exp(old_logp) of loss tokens clipped at the upper bound; NaN if none.

    The paper's point: these are low-probability tokens (mean below 0.2), the exploration clip-higher frees.
    """
    return masked_mean(torch.exp(old_logp.detach()), clipped_upper.to(torch.bool) & mask.to(torch.bool))


def approx_kl(logp: Tensor, old_logp: Tensor, mask: Tensor) -> float:
    """k3 estimate of KL(pi_old || pi_theta) on tokens sampled from pi_old, averaged over loss tokens:
    r - 1 - log r with r = pi_theta / pi_old (>= 0, unbiased, low variance)."""
    log_r = (logp.detach() - old_logp.detach()).to(torch.float64)
    return masked_mean(torch.expm1(log_r) - log_r, mask)


def group_outcome_fractions(correct: Tensor) -> tuple[float, float]:
    """Fig 3b: (fraction of groups with every response correct, fraction with every response wrong).

    Args:
        correct: [B, G] bool, before any dynamic-sampling filter.
    """
    c = correct.to(torch.bool)
    if c.shape[0] == 0:
        return math.nan, math.nan
    return float(c.all(dim=1).float().mean().item()), float((~c).all(dim=1).float().mean().item())
