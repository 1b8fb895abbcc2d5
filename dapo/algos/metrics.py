"""The formulas of the metrics an update and a rollout step log (docs/algorithm.md section 7; Figs 3a and 3b of the
paper), their one owner: the learner adds up `update_sums` over micro-batches and ranks and logs `update_metrics`;
the trainer's step metrics call `group_outcome_fractions`, `group_sameness` and `mismatch_stats`. A mean over an
empty set is NaN (never a warning or an error).
"""

from __future__ import annotations

import math
from collections.abc import Mapping

import torch
from torch import Tensor

from dapo import metric_names as M
from dapo.algos.policy_loss import _LOG_RATIO_CLAMP, SurrogateOut

# A token is rare below this old-policy probability: the paper's Fig 3a finds the upper-clipped tokens' mean
# probability below 0.2, and such a token with positive advantage is what clip-higher lets rise (section 3.1).
RARE_TOKEN_PROB = 0.2
# What one update adds up, in the order its vector is all-reduced: each a float64 sum over loss tokens (the
# SEQ_CLIPFRAC_* over responses) of one micro-batch, which the learner sums over micro-batches and ranks before
# `update_metrics` divides. RARE_POSITIVE is the denominator of CLIPFRAC_HIGH_RARE (not logged).
RARE_POSITIVE = "rare_positive_tokens"
UPDATE_SUMS: tuple[str, ...] = (
    M.POLICY_LOSS,
    M.CLIPFRAC_LOW,
    M.CLIPFRAC_HIGH,
    M.DUAL_CLIPFRAC,
    M.CLIP_HIGH_PROB,
    M.APPROX_KL,
    M.KL_REF,
    M.CLIPFRAC_HIGH_RARE,
    RARE_POSITIVE,
    M.SEQ_CLIPFRAC_LOW,
    M.SEQ_CLIPFRAC_HIGH,
    M.CISPO_CAPPED_FRAC,
    M.COV_SELECTED_FRAC,
    M.OFF_POLICY_MASKED_FRAC,
)


def update_sums(
    out: SurrogateOut,
    loss: Tensor,
    old_logp: Tensor,
    logp: Tensor,
    advantages: Tensor,
    mask: Tensor,
    kl: Tensor | None = None,
    masked: Tensor | None = None,
) -> dict[str, Tensor]:
    """One micro-batch's part of every update metric (`UPDATE_SUMS`), 0-d float64 tensors on the inputs' device, from
    the loss's flags (`per_token_loss`), its weighted loss sum (0-d), [N, T] log pi_old / log pi_theta / mask,
    advantages [N], the k3 to the reference and the off-policy-masked tokens (each [N, T] or None).

    The sums: active clip flags (CLIP_HIGH_PROB = sum of pi_old over upper-clipped tokens, Fig 3a); APPROX_KL = sum of
    r - 1 - log r (k3 of KL(pi_old || pi_theta)); rare positive tokens (pi_old < RARE_TOKEN_PROB, A > 0) and those
    clipped above; GSPO's clipped responses, CISPO's capped weights, the covariance losses' selected tokens, and the
    responses the off-policy mask left out."""
    m = mask.to(torch.bool)
    zero = torch.zeros((), dtype=torch.float64, device=loss.device)

    def msum(x: Tensor, where: Tensor = m) -> Tensor:
        return torch.where(where, x.detach().double(), zero).sum()

    def rows_with(flag: Tensor) -> Tensor:  # responses with a loss token where `flag` is set
        return (flag & m).any(dim=-1).double().sum()

    log_r = (logp.detach() - old_logp.detach()).double()
    upper = out.clipped_upper & m
    rare_pos = m & (old_logp.exp() < RARE_TOKEN_PROB) & (advantages.reshape(-1, 1) > 0)
    return {
        M.POLICY_LOSS: loss.detach().double(),
        M.CLIPFRAC_LOW: msum(out.clipped_lower.double()),
        M.CLIPFRAC_HIGH: msum(upper.double()),
        M.DUAL_CLIPFRAC: msum(out.dual_clipped.double()),
        M.CLIP_HIGH_PROB: msum(old_logp.exp(), upper),
        M.APPROX_KL: msum(torch.expm1(log_r) - log_r),
        M.KL_REF: msum(kl) if kl is not None else zero,
        M.CLIPFRAC_HIGH_RARE: msum(upper.double(), rare_pos),
        RARE_POSITIVE: msum(rare_pos.double()),
        M.SEQ_CLIPFRAC_LOW: rows_with(out.clipped_lower),
        M.SEQ_CLIPFRAC_HIGH: rows_with(out.clipped_upper),
        M.CISPO_CAPPED_FRAC: msum(out.capped.double()) if out.capped is not None else zero,
        M.COV_SELECTED_FRAC: msum(out.selected.double()) if out.selected is not None else zero,
        M.OFF_POLICY_MASKED_FRAC: rows_with(masked) if masked is not None else zero,
    }


def update_metrics(
    sums: Mapping[str, float],
    num_tokens: float,
    num_seqs: float,
    policy_loss: str,
    with_kl: bool,
    off_policy_mask: float | None = None,
) -> dict[str, float]:
    """An update's metrics from its `update_sums` (over micro-batches and ranks) and the mini-batch's loss tokens and
    responses: fractions and means, Fig 3a's mean pi_old of upper-clipped tokens, and the loss's own. A mean over
    nothing is NaN, never 0 (Fig 3a's "none clipped" is not "mean probability 0"): a tracker skips the point."""

    def frac(x: float, n: float) -> float:
        return x / n if n > 0 else math.nan

    per_token = [M.CLIPFRAC_LOW, M.CLIPFRAC_HIGH, M.DUAL_CLIPFRAC, M.APPROX_KL]
    per_token += [M.KL_REF] if with_kl else []
    per_token += [M.CISPO_CAPPED_FRAC] if policy_loss == "cispo" else []
    per_token += [M.COV_SELECTED_FRAC] if policy_loss in ("clip_cov", "kl_cov") else []
    out = {M.POLICY_LOSS: sums[M.POLICY_LOSS]}  # already the mini-batch loss (the aggregation's weights)
    out.update({name: frac(sums[name], num_tokens) for name in per_token})
    if policy_loss == "gspo":
        out.update({name: frac(sums[name], num_seqs) for name in (M.SEQ_CLIPFRAC_LOW, M.SEQ_CLIPFRAC_HIGH)})
    if off_policy_mask is not None:
        out[M.OFF_POLICY_MASKED_FRAC] = frac(sums[M.OFF_POLICY_MASKED_FRAC], num_seqs)
    out[M.CLIP_HIGH_PROB] = frac(sums[M.CLIP_HIGH_PROB], sums[M.CLIPFRAC_HIGH])
    out[M.CLIPFRAC_HIGH_RARE] = frac(sums[M.CLIPFRAC_HIGH_RARE], sums[RARE_POSITIVE])
    return out


def group_outcome_fractions(correct: Tensor) -> tuple[float, float]:
    """Fig 3b: (share of groups all correct, share all wrong) of `correct` [B, G] bool, before any filter."""
    c = correct.to(torch.bool)
    if c.shape[0] == 0:
        return math.nan, math.nan
    return float(c.all(dim=1).float().mean().item()), float((~c).all(dim=1).float().mean().item())


# A group's repeats are implausible for independent samples when the chance of them is below this: a one-in-a-million
# event (log 1e-6). A confident policy repeating a short answer stays above it (8 copies of a 3-token answer at
# p = 0.9 a token: log chance -2.2); independent samples of a 30-token response at 0.7 a token fall far below
# (8 copies: -75; 4 responses twice each, what two replicas sharing seeds give: -29).
IMPLAUSIBLE_LOG_CHANCE = math.log(1e-6)


def group_sameness(responses: list[list[int]], logprobs: list[list[float] | None]) -> tuple[int, float | None]:
    """How alike a group's responses are: (distinct responses, log of the chance of its repeats).

    Independent draws repeat a response only as often as its probability allows. For a group of G draws in which
    responses r_1 .. r_m (probabilities p_1 .. p_m under the engine's own log-probs) occur k_1 .. k_m >= 2 times,
    the chance that G independent draws repeat any responses at most that probable at least that often is at most

        prod_i C(G, k_i) p_i^(k_i - 1)

    (a union bound over which responses repeat, each count binomial, the multinomial's counts negatively
    associated): each repeated response adds log C(G, k_i) + (k_i - 1) log p_i, only those below zero kept. G copies
    of one response give (G - 1) log p; R replicas sharing a seed give every response R times, caught too.

    `logprobs`: the engine's per-token log-probs of each response, or None. The bound is None when nothing repeats or
    no log-probs were given; below `IMPLAUSIBLE_LOG_CHANCE` the samples were not drawn independently.
    """
    first: dict[tuple[int, ...], int] = {}
    counts: dict[tuple[int, ...], int] = {}
    for i, r in enumerate(responses):
        key = tuple(r)
        first.setdefault(key, i)
        counts[key] = counts.get(key, 0) + 1
    distinct, g = len(counts), len(responses)
    repeated = [(key, k) for key, k in counts.items() if k >= 2]
    if not repeated or any(logprobs[first[key]] is None for key, _ in repeated):
        return distinct, None
    terms = [math.log(math.comb(g, k)) + (k - 1) * float(sum(logprobs[first[key]])) for key, k in repeated]
    return distinct, sum(min(t, 0.0) for t in terms)


def log_ratio(old_logp: Tensor, engine_logp: Tensor, mask: Tensor) -> Tensor:
    """d = log pi_old - log pi_rollout on response tokens, 0 elsewhere. [N, T] each, float64 out."""
    m = mask.to(torch.bool)
    d = old_logp.detach().double() - engine_logp.detach().double()
    return torch.where(m, d, torch.zeros_like(d))


def mismatch_stats(old_logp: Tensor, engine_logp: Tensor, mask: Tensor, token_bound: float) -> dict[str, float]:
    """How far the engine's log-probs are from the learner's on the sampled tokens ([N, T] each, d = `log_ratio`):
    `abs_diff` mean |d_t|; `k3` mean (e^d - 1 - d) >= 0; `seq_abs_diff_max` the largest per-response mean |d_t|;
    `beyond_frac` the share with |d_t| > token_bound. NaN each when no token is masked in."""
    m = mask.to(torch.bool)
    if not m.any():
        return {k: math.nan for k in ("abs_diff", "k3", "seq_abs_diff_max", "beyond_frac")}
    d = log_ratio(old_logp, engine_logp, mask)
    a = d.abs()
    lengths = m.sum(dim=-1)
    per_seq = a.sum(dim=-1)[lengths > 0] / lengths[lengths > 0]
    dc = d.clamp(-_LOG_RATIO_CLAMP, _LOG_RATIO_CLAMP)
    return {
        "abs_diff": float(a[m].mean()),
        "k3": float((torch.expm1(dc) - dc)[m].mean()),
        "seq_abs_diff_max": float(per_seq.max()),
        "beyond_frac": float((a[m] > token_bound).double().mean()),
    }
