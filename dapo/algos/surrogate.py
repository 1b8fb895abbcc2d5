"""The clipped surrogate with decoupled bounds (clip-higher), optional dual-clip and k3 KL: docs/algorithm.md section 2.

    rho_{i,t} = exp(logp - old_logp)
    l_{i,t}   = -min(rho * A_i, clip(rho, 1 - eps_low, 1 + eps_high) * A_i)        (paper Eq. 10)
    dual-clip (A_i < 0):  l_{i,t} = min(l_{i,t}, -c * A_i)                           (verl's form, c > 1)
    k3 KL:    l_{i,t} += beta * (pi_ref/pi - log(pi_ref/pi) - 1)                     (GRPO, off in DAPO)

eps_low = eps_high = 0.2 is naive GRPO; DAPO raises eps_high to 0.28. Returns per-token losses; the loss mask and
the normaliser are applied by `aggregation`, so this function is the same for every row of Table 1.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch
from torch import Tensor

# exp() of a log-ratio beyond this overflows float32 on wild tokens; verl clamps the same way. Within the
# clamp (ratio in [2e-9, 5e8]) the loss and its gradient are untouched.
_LOG_RATIO_CLAMP = 20.0


@dataclass
class SurrogateOut:
    """Per-token outputs, all [N, T]. Flags are bool and mark where a bound is *active*, i.e. where it set the
    loss and zeroed the gradient; they ignore the loss mask (metrics apply it)."""

    loss: Tensor
    clipped_lower: Tensor  # rho < 1 - eps_low and A < 0
    clipped_upper: Tensor  # rho > 1 + eps_high and A > 0 (Fig 3a's tokens)
    dual_clipped: Tensor  # A < 0 and the dual-clip bound -c*A was taken (all False when c is None)
    ratio: Tensor  # rho, detached
    kl: Tensor | None  # k3 KL to the reference per token (None without ref_logp)
    capped: Tensor | None = None  # CISPO: the importance weight was capped (dapo.algos.policy_loss)
    selected: Tensor | None = None  # Clip-Cov / KL-Cov: chosen by the covariance rule


def clipped_surrogate(
    logp: Tensor,
    old_logp: Tensor,
    advantages: Tensor,
    eps_low: float,
    eps_high: float,
    dual_clip_c: float | None = None,
    ref_logp: Tensor | None = None,
    kl_coef: float = 0.0,
) -> SurrogateOut:
    """Per-token PPO-clip losses with decoupled clip bounds.

    Args:
        logp: [N, T] log pi_theta of the sampled tokens (requires grad).
        old_logp: [N, T] log pi_old of the same tokens (the policy that generated them; no grad).
        advantages: [N] (one per response, broadcast over tokens) or [N, T].
        eps_low, eps_high: clip range [1 - eps_low, 1 + eps_high].
        dual_clip_c: bound c > 1 for negative advantages (released recipe: 10); None turns it off.
        ref_logp: [N, T] log pi_ref for the k3 KL term; required when kl_coef > 0.
        kl_coef: beta of the k3 KL term (0 in every DAPO row).

    Returns:
        SurrogateOut with per-token `loss` [N, T] (differentiable w.r.t. logp) and the clip flags.
    """
    if eps_low < 0 or eps_high < 0 or eps_low >= 1:
        raise ValueError(f"need 0 <= eps_low < 1 and eps_high >= 0, got eps_low={eps_low}, eps_high={eps_high}")
    if dual_clip_c is not None and dual_clip_c <= 1:
        raise ValueError(f"dual_clip_c must be > 1 (released recipe: 10) or None, got {dual_clip_c}")
    if kl_coef > 0 and ref_logp is None:
        raise ValueError("kl_coef > 0 needs ref_logp (log-probs of the reference policy)")
    if logp.shape != old_logp.shape:
        raise ValueError(f"logp {tuple(logp.shape)} and old_logp {tuple(old_logp.shape)} differ in shape")
    adv = advantages.unsqueeze(-1) if advantages.dim() == logp.dim() - 1 else advantages
    adv = adv.to(logp.dtype).detach()

    log_ratio = torch.clamp(logp - old_logp.detach(), -_LOG_RATIO_CLAMP, _LOG_RATIO_CLAMP)
    ratio = torch.exp(log_ratio)
    unclipped = -adv * ratio
    clipped = -adv * torch.clamp(ratio, 1.0 - eps_low, 1.0 + eps_high)
    loss = torch.maximum(unclipped, clipped)  # = -min(rho A, clip(rho) A)

    r = ratio.detach()
    clipped_lower = (r < 1.0 - eps_low) & (adv < 0)
    clipped_upper = (r > 1.0 + eps_high) & (adv > 0)

    if dual_clip_c is not None:
        bound = -adv * dual_clip_c  # positive where A < 0
        neg = adv < 0
        dual_clipped = neg & (loss.detach() > bound)
        loss = torch.where(neg, torch.minimum(loss, bound), loss)
    else:
        dual_clipped = torch.zeros_like(clipped_lower)

    kl = None
    if ref_logp is not None:
        kl = k3_to_reference(logp, ref_logp)
        if kl_coef > 0:
            loss = loss + kl_coef * kl
        kl = kl.detach() if kl_coef == 0 else kl
    return SurrogateOut(
        loss=loss, clipped_lower=clipped_lower, clipped_upper=clipped_upper, dual_clipped=dual_clipped, ratio=r, kl=kl
    )


def k3_to_reference(logp: Tensor, ref_logp: Tensor) -> Tensor:
    """k3 estimator of KL(pi_theta || pi_ref) per token on samples of pi_theta: pi_ref/pi - log(pi_ref/pi) - 1 >= 0.
    [N, T]; differentiable w.r.t. logp (the GRPO KL term)."""
    d = torch.clamp(ref_logp.detach() - logp, -_LOG_RATIO_CLAMP, _LOG_RATIO_CLAMP)
    return torch.exp(d) - d - 1.0
