"""The per-token policy losses, chosen by name (`algorithm.policy_loss`): DAPO's and those it is compared with. Each is
a pure function of per-token tensors [N, T] returning per-token losses (`SurrogateOut`); the mask and normaliser are
the aggregation's, and the learner adds the k3 KL term (`k3_to_reference`) and the rollout correction's weights to
every one alike. r = pi_theta / pi_old per token, A the response's advantage, sg the stop-gradient; sources, defaults
and how each is exact in any split (GSPO's ratio needs a whole response, which never straddles micro-batches or
ranks; the covariance rule takes the whole mini-batch's means and k-th token): docs/algorithm.md sections 2 and 12.

    ppo_clip (Eq. 10):  l = -min(r A, clip(r, 1 - eps_low, 1 + eps_high) A); dual-clip (A < 0): min(l, -c A)
    gspo:               s_i = exp(mean_t log r), l = -min(s_i A, clip(s_i, 1 - eps_low, 1 + eps_high) A), per token
                        as log s_{i,t} = sg(log s_i) + log pi_theta(y_t) - sg(log pi_theta(y_t))
    cispo:              l = -sg(min(r, clip_max)) A log pi_theta(y_t)
    clip_cov:           ppo_clip with the loss of k tokens drawn among the unclipped with lb < cov < ub cut
    kl_cov:             l = -r A, plus coef |log r| on the k tokens of largest cov
                        cov_t = (A - mean A)(log pi_theta(y_t) - mean log pi_theta), k = max(1, floor(ratio x tokens))
    sapo:               l = -A f(r), f(r) = (4 / tau) sigmoid(tau (r - 1)), tau = tau_pos (A > 0) or tau_neg: a soft
                        trust region, its gradient -A 4 s(1 - s) r grad log pi (s = sigmoid(tau (r - 1))) the policy
                        gradient's at r = 1, fading smoothly as r leaves 1 where a clip would stop it
    gmpo:               rho_i = exp(mean_t c(log r)), c(x) = sgn A min(sgn A x, sgn A clamp(x, -eps_low, eps_high)),
                        l = -A rho_i per token as log rho_{i,t} = sg(log rho_i) + c(log r_t) - sg(c(log r_t))
    dppo_tv, dppo_kl:   l = -A sg(r) log pi_theta(y_t) on the tokens whose update stays in the trust region: TV drops
                        A > 0 with pi - pi_old > eps_high and A < 0 with pi - pi_old < -eps_low; KL drops those moving
                        away (A > 0: pi > pi_old; A < 0: pi < pi_old) with the Bernoulli KL(pi_old || pi) of the
                        sampled token above eps_high (A > 0) or eps_low
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass

import torch
from torch import Tensor

from dapo.types import POLICY_LOSSES, PolicyLossName

__all__ = ["POLICY_LOSSES", "PolicyLossName", "per_token_loss"]
COVARIANCE_LOSSES = ("clip_cov", "kl_cov")  # the ones that need the mini-batch's covariance selection first


# exp() of a log-ratio beyond this overflows float32 on wild tokens; verl clamps the same way. Within the clamp (ratio
# in [2e-9, 5e8]) the loss and its gradient are untouched.
_LOG_RATIO_CLAMP = 20.0


@dataclass
class SurrogateOut:
    """Per-token outputs, all [N, T]. Flags are bool and mark where a bound is *active*, i.e. where it set the
    loss and zeroed the gradient; they ignore the loss mask (metrics apply it)."""

    loss: Tensor
    clipped_lower: Tensor  # rho < 1 - eps_low and A < 0
    clipped_upper: Tensor  # rho > 1 + eps_high and A > 0 (Fig 3a's tokens)
    dual_clipped: Tensor  # A < 0 and the dual-clip bound -c*A was taken (all False when c is None)
    capped: Tensor | None = None  # CISPO: the importance weight was capped
    selected: Tensor | None = None  # Clip-Cov / KL-Cov: chosen by the covariance rule


def _no_flags(like: Tensor) -> Tensor:
    return torch.zeros(like.shape, dtype=torch.bool, device=like.device)


def _adv(advantages: Tensor, like: Tensor) -> Tensor:
    adv = advantages.unsqueeze(-1) if advantages.dim() == like.dim() - 1 else advantages
    return adv.to(like.dtype).detach()


def clipped_surrogate(
    logp: Tensor,
    old_logp: Tensor,
    advantages: Tensor,
    eps_low: float,
    eps_high: float,
    dual_clip_c: float | None = None,
) -> SurrogateOut:
    """Per-token PPO-clip losses with decoupled clip bounds (module docstring): `logp` [N, T] log pi_theta (requires
    grad), `old_logp` [N, T] log pi_old (no grad), `advantages` [N] (broadcast over tokens) or [N, T]; `dual_clip_c`
    c > 1 for A < 0 (released recipe: 10), None: off. `loss` [N, T] is differentiable w.r.t. logp."""
    if eps_low < 0 or eps_high < 0 or eps_low > 1:  # eps_low 1: no lower bound (Clip-Cov's recipe)
        raise ValueError(f"need 0 <= eps_low <= 1 and eps_high >= 0, got eps_low={eps_low}, eps_high={eps_high}")
    if dual_clip_c is not None and dual_clip_c <= 1:
        raise ValueError(f"dual_clip_c must be > 1 (released recipe: 10) or None, got {dual_clip_c}")
    if logp.shape != old_logp.shape:
        raise ValueError(f"logp {tuple(logp.shape)} and old_logp {tuple(old_logp.shape)} differ in shape")
    adv = _adv(advantages, logp)
    ratio = torch.exp(torch.clamp(logp - old_logp.detach(), -_LOG_RATIO_CLAMP, _LOG_RATIO_CLAMP))
    loss = torch.maximum(-adv * ratio, -adv * torch.clamp(ratio, 1.0 - eps_low, 1.0 + eps_high))
    r = ratio.detach()
    clipped_lower = (r < 1.0 - eps_low) & (adv < 0)
    clipped_upper = (r > 1.0 + eps_high) & (adv > 0)
    dual_clipped = torch.zeros_like(clipped_lower)
    if dual_clip_c is not None:
        bound = -adv * dual_clip_c  # positive where A < 0
        dual_clipped = (adv < 0) & (loss.detach() > bound)
        loss = torch.where(adv < 0, torch.minimum(loss, bound), loss)
    return SurrogateOut(loss, clipped_lower, clipped_upper, dual_clipped)


def k3_to_reference(logp: Tensor, ref_logp: Tensor) -> Tensor:
    """k3 estimator of KL(pi_theta || pi_ref) per token on samples of pi_theta: pi_ref/pi - log(pi_ref/pi) - 1 >= 0.
    [N, T]; differentiable w.r.t. logp (GRPO's KL term, which the learner adds to any loss times `kl_coef`)."""
    d = torch.clamp(ref_logp.detach() - logp, -_LOG_RATIO_CLAMP, _LOG_RATIO_CLAMP)
    return torch.exp(d) - d - 1.0


def gspo_surrogate(
    logp: Tensor, old_logp: Tensor, advantages: Tensor, mask: Tensor, eps_low: float, eps_high: float
) -> SurrogateOut:
    """GSPO's sequence-level clipped surrogate, per token (module docstring). `mask` [N, T]: the tokens the sequence
    mean runs over; eps_* clip s_i (paper: 3e-4, 4e-4). The clip flags mark every token of a clipped response."""
    m = mask.to(logp.dtype)
    adv = _adv(advantages, logp)
    log_r = torch.clamp(logp - old_logp.detach(), -_LOG_RATIO_CLAMP, _LOG_RATIO_CLAMP)
    seq_log_s = (log_r * m).sum(-1, keepdim=True) / m.sum(-1, keepdim=True).clamp(min=1.0)  # [N, 1]
    log_s = seq_log_s.detach() + logp - logp.detach()  # value log s_i, gradient that of log pi_theta(y_t)
    s = torch.exp(log_s)
    loss = torch.maximum(-adv * s, -adv * torch.clamp(s, 1.0 - eps_low, 1.0 + eps_high))
    r = s.detach()
    return SurrogateOut(
        loss=loss,
        clipped_lower=(r < 1.0 - eps_low) & (adv < 0),
        clipped_upper=(r > 1.0 + eps_high) & (adv > 0),
        dual_clipped=torch.zeros_like(r, dtype=torch.bool),
    )


def cispo_loss(logp: Tensor, old_logp: Tensor, advantages: Tensor, clip_max: float) -> SurrogateOut:
    """CISPO's clipped-weight REINFORCE, per token (module docstring). `clip_max`: the importance weight's cap
    (MiniMax-M1's 1 + eps_high^IS; default 5.0). `capped` marks capped tokens, `clipped_upper` those with A > 0."""
    if clip_max <= 0:
        raise ValueError(f"cispo's clip_max must be > 0 (default 5.0), got {clip_max}")
    adv = _adv(advantages, logp)
    r = torch.exp(torch.clamp(logp.detach() - old_logp.detach(), -_LOG_RATIO_CLAMP, _LOG_RATIO_CLAMP))
    w = torch.clamp(r, max=clip_max)
    capped = r > clip_max
    return SurrogateOut(
        loss=-w * adv * logp,
        clipped_lower=torch.zeros_like(capped),
        clipped_upper=capped & (adv > 0),
        dual_clipped=torch.zeros_like(capped),
        capped=capped,
    )


def token_covariance(logp: Tensor, advantages: Tensor, mask: Tensor, mean_adv: float, mean_logp: float) -> Tensor:
    """cov_{i,t} = (A_i - mean A)(log pi_theta - mean log pi_theta) on loss tokens, -inf elsewhere, [N, T] float64;
    the means are the whole mini-batch's (`covariance_sums` gives each rank's part)."""
    m = mask.to(torch.bool)
    adv = _adv(advantages, logp).double().expand_as(logp)
    cov = (adv - mean_adv) * (logp.detach().double() - mean_logp)
    return torch.where(m, cov, torch.full_like(cov, -torch.inf))


def covariance_sums(logp: Tensor, advantages: Tensor, mask: Tensor) -> Tensor:
    """[loss tokens, sum of A over them, sum of log pi_theta over them]: a rank's part of the means, to all-reduce."""
    m = mask.to(torch.float64)
    adv = _adv(advantages, logp).double().expand_as(logp)
    return torch.stack([m.sum(), (adv * m).sum(), (logp.detach().double() * m).sum()])


def selection_size(ratio: float, num_tokens: float) -> int:
    """k = max(1, floor(ratio * tokens)) over the mini-batch's loss tokens (0 when it has none)."""
    return max(1, int(ratio * num_tokens)) if num_tokens > 0 else 0


def token_keys(sample_ids: Tensor, width: int, salt: int) -> Tensor:
    """A pseudo-random key in [0, 1) per token, a function of (salt, the response's id in the rollout step, the
    token's position) only: Clip-Cov's random draw, the same whatever the split. [N] ids -> [N, width] float64."""
    x = (sample_ids.to(torch.int64).unsqueeze(-1) * 1_000_003 + torch.arange(width, dtype=torch.int64)) ^ (
        salt * 0x9E3779B1
    )
    for mult in (0xBF58476D1CE4E5B, 0x94D049BB133111E):  # splitmix64-style rounds, kept to 63 bits
        x = (x ^ (x >> 31)) & 0x7FFFFFFFFFFFFFFF
        x = (x * mult) & 0x7FFFFFFFFFFFFFFF
    x = x ^ (x >> 29)
    return (x & ((1 << 52) - 1)).double() / float(1 << 52)


def _best_first(scores: Tensor, neg_keys: Tensor) -> Tensor:
    """Indices ordering (score, -key) pairs best first: higher score, then on a tie the smaller key."""
    by_key = torch.argsort(neg_keys, descending=True, stable=True)
    return by_key[torch.argsort(scores[by_key], descending=True, stable=True)]


def ranked(scores: Tensor, keys: Tensor, eligible: Tensor, k: int) -> Tensor:
    """This rank's (at most k) best eligible tokens as rows [score, -key], best first (higher score; tie: smaller
    key): what each rank sends for the mini-batch's k-th best (`kth_largest`)."""
    s, nk = scores[eligible].double(), -keys[eligible].double()
    if s.numel() == 0 or k <= 0:
        return torch.zeros(0, 2, dtype=torch.float64)
    idx = _best_first(s, nk)[:k]
    return torch.stack([s[idx], nk[idx]], dim=1)


def kth_largest(rows: list[Tensor], k: int) -> tuple[float, float] | None:
    """The k-th best (score, -key) pair over every rank's `ranked` rows; None when there are fewer than k (then
    every eligible token is selected)."""
    parts = [r for r in rows if r.numel()]
    if not parts or k <= 0:
        return None
    allrows = torch.cat(parts, dim=0)
    if allrows.shape[0] < k:
        return None
    best = allrows[_best_first(allrows[:, 0], allrows[:, 1])[k - 1]]
    return float(best[0]), float(best[1])


def select(scores: Tensor, keys: Tensor, eligible: Tensor, kth: tuple[float, float] | None) -> Tensor:
    """Eligible tokens ranked at or above the k-th best pair (all eligible ones when `kth` is None). [N, T] bool."""
    if kth is None:
        return eligible.clone()
    s, nk = scores.double(), -keys.double()
    above = (s > kth[0]) | ((s == kth[0]) & (nk >= kth[1]))
    return eligible & above


def clip_cov_eligible(cov: Tensor, clipped: Tensor, mask: Tensor, lb: float, ub: float) -> Tensor:
    """Clip-Cov's candidates: loss tokens not already clipped with lb < cov < ub. [N, T] bool."""
    return mask.to(torch.bool) & ~clipped & (cov > lb) & (cov < ub)


def clip_cov_surrogate(
    logp: Tensor,
    old_logp: Tensor,
    advantages: Tensor,
    selected: Tensor,
    eps_low: float,
    eps_high: float,
    dual_clip_c: float | None = None,
) -> SurrogateOut:
    """The PPO-clip loss with the selected tokens' loss (value and gradient) cut. `selected` [N, T] bool."""
    out = clipped_surrogate(logp, old_logp, advantages, eps_low, eps_high, dual_clip_c)
    out.loss = torch.where(selected, torch.zeros_like(out.loss), out.loss)
    out.selected = selected
    return out


def kl_cov_surrogate(logp: Tensor, old_logp: Tensor, advantages: Tensor, selected: Tensor, coef: float) -> SurrogateOut:
    """-A r on every token (no clip), plus coef * |log pi_theta - log pi_old| on the selected ones. [N, T]."""
    adv = _adv(advantages, logp)
    log_r = torch.clamp(logp - old_logp.detach(), -_LOG_RATIO_CLAMP, _LOG_RATIO_CLAMP)
    ratio = torch.exp(log_r)
    loss = -adv * ratio + torch.where(selected, coef * (logp - old_logp.detach()).abs(), torch.zeros_like(ratio))
    none = torch.zeros_like(selected)
    return SurrogateOut(
        loss=loss,
        clipped_lower=none,
        clipped_upper=none,
        dual_clipped=none,
        selected=selected,
    )


def sapo_loss(logp: Tensor, old_logp: Tensor, advantages: Tensor, tau_pos: float, tau_neg: float) -> SurrogateOut:
    """SAPO's soft-gated surrogate, per token (module docstring; Gao et al. 2025, arXiv 2511.20347). `tau_pos`,
    `tau_neg`: the gate's temperature for A > 0 / A <= 0 (paper: 1.0, 1.05: negative tokens' gradients fade faster,
    their updates raising many other tokens). No flags: the gate weighs each gradient by 4 s(1 - s) r (1 at r = 1)."""
    if tau_pos <= 0 or tau_neg <= 0:
        raise ValueError(f"sapo's temperatures must be > 0 (the paper: 1.0, 1.05), got {tau_pos}, {tau_neg}")
    adv = _adv(advantages, logp)
    ratio = torch.exp(torch.clamp(logp - old_logp.detach(), -_LOG_RATIO_CLAMP, _LOG_RATIO_CLAMP))
    tau = torch.where(adv > 0, logp.new_tensor(tau_pos), logp.new_tensor(tau_neg))  # in the loss's dtype, exactly
    none = _no_flags(logp)
    return SurrogateOut(-torch.sigmoid(tau * (ratio - 1.0)) * (4.0 / tau) * adv, none, none, none)


def gmpo_surrogate(
    logp: Tensor, old_logp: Tensor, advantages: Tensor, mask: Tensor, eps_low: float, eps_high: float
) -> SurrogateOut:
    """GMPO's geometric-mean surrogate, per token (module docstring; Zhao et al. 2025, arXiv 2507.20673): one ratio a
    response, the geometric mean of its token ratios, each clipped in log space at [-eps_low, eps_high] on the side A
    pushes (paper: (e^-0.4, e^0.4)). With `seq-mean-token-mean` the loss is mean_i -A rho_i, its gradient -A rho_i
    mean_t grad c(log r_t). `mask`: the tokens the mean runs over; the clip flags mark tokens the clip held."""
    m = mask.to(logp.dtype)
    adv = _adv(advantages, logp)
    sign = torch.sign(adv)
    log_r = torch.clamp(logp - old_logp.detach(), -_LOG_RATIO_CLAMP, _LOG_RATIO_CLAMP)
    held = torch.clamp(log_r, -eps_low, eps_high)
    c = sign * torch.minimum(sign * log_r, sign * held)
    seq_log_rho = (c * m).sum(-1, keepdim=True) / m.sum(-1, keepdim=True).clamp(min=1.0)  # [N, 1]
    log_rho = seq_log_rho.detach() + c - c.detach()
    clipped = (log_r.detach() != held.detach()) & (c.detach() == held.detach())
    none = _no_flags(logp)
    return SurrogateOut(-adv * torch.exp(log_rho), clipped & (adv < 0), clipped & (adv > 0), none)


def dppo_loss(
    kind: str, logp: Tensor, old_logp: Tensor, advantages: Tensor, eps_low: float, eps_high: float
) -> SurrogateOut:
    """DPPO's divergence-masked policy gradient, per token (module docstring; Qi et al. 2026, arXiv 2602.04879, the
    Binary-TV and Binary-KL approximations verl ships; `kind` "tv" or "kl"): the stopped ratio weighs -A log pi_theta
    as in CISPO (the authors' cap of 10,000 never binds), and a token whose update would leave the trust region (on the
    sampled token's probability; eps_low for A < 0, eps_high for A > 0, authors: 0.15 TV, 0.05 KL) is dropped; the
    clip flags mark the dropped tokens."""
    adv = _adv(advantages, logp)
    log_r = torch.clamp(logp.detach() - old_logp.detach(), -_LOG_RATIO_CLAMP, _LOG_RATIO_CLAMP)
    p, p_old = logp.detach().exp(), old_logp.detach().exp()
    if kind == "tv":
        keep = torch.where(adv > 0, p - p_old <= eps_high, p - p_old >= -eps_low)
    elif kind == "kl":
        eps = 1e-8  # verl's, inside the Bernoulli's second log
        kl = p_old * (old_logp.detach() - logp.detach()) + (1 - p_old) * torch.log((1 - p_old + eps) / (1 - p + eps))
        keep = torch.where(adv > 0, (kl <= eps_high) | (p <= p_old), (kl <= eps_low) | (p >= p_old))
    else:
        raise ValueError(f"dppo kind must be tv or kl, got {kind!r}")
    loss = torch.where(keep, -adv * torch.exp(log_r) * logp, torch.zeros_like(logp))
    return SurrogateOut(loss, ~keep & (adv < 0), ~keep & (adv > 0), _no_flags(logp))


def per_token_loss(
    name: str,
    logp: Tensor,
    old_logp: Tensor,
    advantages: Tensor,
    mask: Tensor,
    *,
    eps_low: float,
    eps_high: float,
    dual_clip_c: float | None = None,
    cispo_clip_max: float = 5.0,
    kl_cov_coef: float = 1.0,
    sapo_tau_pos: float = 1.0,
    sapo_tau_neg: float = 1.05,
    selected: Tensor | None = None,
) -> SurrogateOut:
    """The policy loss `name` (POLICY_LOSSES) per token, [N, T] in and out, without KL term or rollout correction
    (the learner adds both). `selected`: the covariance rule's choice, required by clip_cov and kl_cov."""
    if name == "ppo_clip":
        return clipped_surrogate(logp, old_logp, advantages, eps_low, eps_high, dual_clip_c)
    if name == "gspo":
        return gspo_surrogate(logp, old_logp, advantages, mask, eps_low, eps_high)
    if name == "cispo":
        return cispo_loss(logp, old_logp, advantages, cispo_clip_max)
    if name == "sapo":
        return sapo_loss(logp, old_logp, advantages, sapo_tau_pos, sapo_tau_neg)
    if name == "gmpo":
        return gmpo_surrogate(logp, old_logp, advantages, mask, eps_low, eps_high)
    if name in ("dppo_tv", "dppo_kl"):
        return dppo_loss(name.removeprefix("dppo_"), logp, old_logp, advantages, eps_low, eps_high)
    if name in COVARIANCE_LOSSES:
        if selected is None:
            raise ValueError(f"{name} needs the covariance rule's selection (`selected`)")
        if name == "clip_cov":
            return clip_cov_surrogate(logp, old_logp, advantages, selected, eps_low, eps_high, dual_clip_c)
        return kl_cov_surrogate(logp, old_logp, advantages, selected, kl_cov_coef)
    raise ValueError(f"unknown policy loss {name!r}; choose one of {POLICY_LOSSES} (algorithm.policy_loss)")


def covariance_selection(
    name: str,
    logp: Tensor,
    old_logp: Tensor,
    advantages: Tensor,
    mask: Tensor,
    sample_ids: Tensor,
    salt: int,
    *,
    ratio: float,
    eps_low: float = 0.2,
    eps_high: float = 0.2,
    dual_clip_c: float | None = None,
    lb: float = 1.0,
    ub: float = 5.0,
    sum_over_ranks: Callable[[Tensor], Tensor] = lambda x: x,
    gather_from_ranks: Callable[[Tensor], list[Tensor]] = lambda x: [x],
) -> Tensor:
    """This rank's tokens ([N, T] bool) that Clip-Cov ("clip_cov") or KL-Cov ("kl_cov") acts on, chosen over the
    whole mini-batch: k = max(1, floor(ratio * tokens)). `logp`: the current policy's (no grad), `sample_ids` [N] each
    row's index in the step (`token_keys`); eps_* / dual_clip_c: Clip-Cov's PPO clip (clipped tokens are not
    candidates), lb / ub its covariance band; `sum_over_ranks` / `gather_from_ranks`: all-reduce / all-gather."""
    m = mask.to(torch.bool)
    n, sum_adv, sum_logp = sum_over_ranks(covariance_sums(logp, advantages, m)).tolist()
    cov = token_covariance(logp, advantages, m, sum_adv / max(n, 1.0), sum_logp / max(n, 1.0))
    keys = token_keys(sample_ids, m.shape[1], salt)
    k = selection_size(ratio, n)
    if name == "clip_cov":
        out = clipped_surrogate(logp.detach(), old_logp, advantages, eps_low, eps_high, dual_clip_c)
        eligible = clip_cov_eligible(cov, out.clipped_lower | out.clipped_upper, m, lb, ub)
        scores = torch.zeros_like(cov)  # a random draw: the k smallest keys among the candidates
    elif name == "kl_cov":
        eligible, scores = m, cov
    else:
        raise ValueError(f"covariance_selection: {name!r} is not one of {COVARIANCE_LOSSES}")
    kth = kth_largest(gather_from_ranks(ranked(scores, keys, eligible, k)), k)
    return select(scores, keys, eligible, kth)
