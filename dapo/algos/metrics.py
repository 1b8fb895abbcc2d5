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


# A group of identical responses is implausible for independent samples when the chance of the coincidence is below
# this: a one-in-a-million event (log 1e-6). A confident policy repeating a short answer stays above it (8 copies of
# a 3-token answer at p = 0.9 a token: log chance -2.2); independent samples of a 30-token response at 0.7 a token
# fall far below (-75).
IMPLAUSIBLE_LOG_CHANCE = math.log(1e-6)


def group_sameness(responses: list[list[int]], logprobs: list[list[float] | None]) -> tuple[int, float | None]:
    """How alike a group's responses are: (distinct responses, log-chance of the coincidence).

    Args:
        responses: the G responses of one prompt, as token ids.
        logprobs: the engine's log-prob of each sampled token of each response (its sampling distribution), or None.

    Returns:
        The number of distinct responses, and for a group whose G >= 2 responses are all the same, the log of the
        probability that G independent draws all give it, (G - 1) * log p(response) (None when they differ or
        the engine gave no log-probs). Below `IMPLAUSIBLE_LOG_CHANCE`, the samples were not drawn independently.
    """
    distinct = len({tuple(r) for r in responses})
    if distinct != 1 or len(responses) < 2 or logprobs[0] is None:
        return distinct, None
    return distinct, (len(responses) - 1) * float(sum(logprobs[0]))
