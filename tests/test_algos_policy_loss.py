"""The policy losses by name (dapo.algos.policy_loss): hand-computed cases, the invariances their papers imply, and
the covariance rules' selection, the same whatever the split (tests/test_learner.py runs them through the learner
on 1 and 2 ranks; tests/test_peer_parity.py against TRL and verl)."""

from __future__ import annotations

import math
import threading

import pytest
import torch

from dapo.algos.advantages import group_advantages
from dapo.algos.aggregation import aggregate, sequence_scales
from dapo.algos.policy_loss import (
    POLICY_LOSSES,
    cispo_loss,
    clipped_surrogate,
    covariance_selection,
    dppo_loss,
    gmpo_surrogate,
    gspo_surrogate,
    per_token_loss,
    sapo_loss,
    token_keys,
)
from dapo.algos.rollout_correction import off_policy_sequence_mask

F64 = torch.float64


def grad_of(fn, logp: torch.Tensor) -> torch.Tensor:
    x = logp.clone().requires_grad_()
    (g,) = torch.autograd.grad(fn(x), x)
    return g


def test_gspo_hand_computed() -> None:
    """One response of two tokens, log-ratios 0.1 and 0.3: s = exp(0.2); A = 1 with eps_high 0.1 clips it (1.2214 >
    1.1): the loss is -1.1 at each token and no gradient flows; A = -1: not clipped, loss s, gradient s/2 per token."""
    # float64: the sequence ratio exp(mean log r) is then exact to ~1e-16 (float32's inputs round log r at ~1e-7)
    old = torch.tensor([[-1.0, -2.0]], dtype=torch.float64)
    logp = old + torch.tensor([[0.1, 0.3]], dtype=torch.float64)
    mask = torch.ones(1, 2, dtype=torch.float64)
    s = math.exp(0.2)
    out = gspo_surrogate(logp, old, torch.tensor([1.0]), mask, 0.1, 0.1)
    assert out.loss[0].tolist() == pytest.approx([-1.1, -1.1]) and out.clipped_upper.all()
    unclipped = gspo_surrogate(logp, old, torch.tensor([-1.0]), mask, 0.1, 0.1)
    assert unclipped.loss[0].tolist() == pytest.approx([s, s]) and not unclipped.clipped_lower.any()
    g = grad_of(lambda x: gspo_surrogate(x, old, torch.tensor([1.0]), mask, 0.1, 0.1).loss.mean(), logp)
    assert g.abs().max() == 0
    g = grad_of(lambda x: gspo_surrogate(x, old, torch.tensor([-1.0]), mask, 0.1, 0.1).loss.mean(), logp)
    assert g[0].tolist() == pytest.approx([s / 2, s / 2])  # d/dx of mean_t s = s * mean of d(mean log r)/dx


def test_gspo_with_one_token_responses_is_the_token_level_loss() -> None:
    g = torch.Generator().manual_seed(0)
    # float64: the two forms round differently (exp of a one-term mean against exp), a few eps64 apart
    old = torch.randn(8, 1, generator=g, dtype=torch.float64)
    logp = old + 0.3 * torch.randn(8, 1, generator=g, dtype=torch.float64)
    adv = torch.randn(8, generator=g, dtype=torch.float64)
    mask = torch.ones(8, 1, dtype=torch.float64)
    gspo = gspo_surrogate(logp, old, adv, mask, 0.2, 0.28)
    token = clipped_surrogate(logp, old, adv, 0.2, 0.28)
    assert torch.allclose(gspo.loss, token.loss, atol=1e-6)
    assert torch.allclose(
        grad_of(lambda x: gspo_surrogate(x, old, adv, mask, 0.2, 0.28).loss.sum(), logp),
        grad_of(lambda x: clipped_surrogate(x, old, adv, 0.2, 0.28).loss.sum(), logp),
        atol=1e-6,
    )


def test_gspo_ratio_ignores_padding_and_its_gradient_is_the_sequence_ratios() -> None:
    """Padding (mask 0) does not enter s_i; with nothing clipped, the seq-mean-token-mean gradient of GSPO's loss is
    that of -A_i s_i, with s_i differentiated as the paper writes it (exp of the mean log-ratio)."""
    g = torch.Generator().manual_seed(1)
    old = torch.randn(3, 5, generator=g, dtype=torch.float64)  # float64: 1e-6 below is ~10^10 eps64
    logp = old + 0.05 * torch.randn(3, 5, generator=g, dtype=torch.float64)
    mask = torch.tensor([[1, 1, 1, 0, 0], [1, 1, 1, 1, 1], [1, 0, 0, 0, 0]], dtype=torch.float64)
    adv = torch.tensor([0.5, -1.0, 2.0], dtype=torch.float64)
    noisy = logp.clone()
    noisy[mask == 0] = 50.0  # garbage where the mask is 0
    a = gspo_surrogate(noisy, old, adv, mask, 1.0, 1.0)
    b = gspo_surrogate(logp, old, adv, mask, 1.0, 1.0)
    assert torch.allclose(a.loss[mask > 0], b.loss[mask > 0])  # -A s_i at each token: nothing clipped

    def paper(x: torch.Tensor) -> torch.Tensor:
        s = torch.exp(((x - old) * mask).sum(-1) / mask.sum(-1))
        return (-adv * s).mean()

    ours = grad_of(
        lambda x: aggregate(gspo_surrogate(x, old, adv, mask, 1.0, 1.0).loss, mask, "seq-mean-token-mean"), logp
    )
    assert torch.allclose(ours * mask, grad_of(paper, logp) * mask, atol=1e-6)


def test_cispo_hand_computed_and_no_gradient_is_dropped_by_the_cap() -> None:
    """r = e^1 = 2.718 capped at 2: loss -2 A log p, gradient -2 A (the capped weight times the REINFORCE gradient):
    where PPO's clip would zero the gradient, CISPO keeps it, scaled."""
    old = torch.tensor([[-2.0, -1.0]])
    logp = torch.tensor([[-1.0, -1.0]])
    adv = torch.tensor([1.0])
    out = cispo_loss(logp, old, adv, clip_max=2.0)
    assert out.loss[0].tolist() == pytest.approx([2.0, 1.0]) and out.capped.tolist() == [[True, False]]
    assert grad_of(lambda x: cispo_loss(x, old, adv, 2.0).loss.sum(), logp)[0].tolist() == pytest.approx([-2.0, -1.0])
    ppo = grad_of(lambda x: clipped_surrogate(x, old, adv, 0.2, 0.28).loss.sum(), logp)
    assert ppo[0, 0] == 0  # the clip drops that token's gradient


def test_cispo_gradient_is_the_unclipped_policy_gradient_where_no_weight_is_capped() -> None:
    g = torch.Generator().manual_seed(2)
    old = torch.randn(4, 6, generator=g, dtype=torch.float64)  # float64: 1e-6 below is ~10^10 eps64
    logp = old + 0.1 * torch.randn(4, 6, generator=g, dtype=torch.float64)
    adv = torch.randn(4, generator=g, dtype=torch.float64)
    mask = torch.ones(4, 6, dtype=torch.float64)
    cispo = grad_of(lambda x: aggregate(cispo_loss(x, old, adv, 10.0).loss, mask, "token-mean"), logp)
    pg = grad_of(lambda x: aggregate(-adv[:, None] * torch.exp(x - old), mask, "token-mean"), logp)
    assert torch.allclose(cispo, pg, atol=1e-6)


def test_dr_grpo_advantages_and_normaliser_as_the_paper_writes_them() -> None:
    """Dr. GRPO (Liu et al. 2025, Eq. 3): A_i = r_i - mean(r) (no std), and the loss sums each response's tokens over a
    constant (the max generation length), not over |o_i|: 1/G sum_i 1/C sum_t."""
    rewards = torch.tensor([[1.0, -1.0, -1.0, -1.0]])
    assert group_advantages(rewards, norm_by_std=False).tolist() == [[1.5, -0.5, -0.5, -0.5]]
    lengths = torch.tensor([3.0, 10.0, 7.0, 1.0])
    scales = sequence_scales(lengths, "seq-mean-token-sum", num_tokens=21, num_seqs=4, seq_sum_constant=16.0)
    assert scales.tolist() == pytest.approx([1 / (4 * 16)] * 4)  # the same per-token weight for short and long


def test_every_loss_by_name_and_unknown_names_refused() -> None:
    old = torch.zeros(2, 3)
    logp = torch.full((2, 3), 0.1)
    mask = torch.ones(2, 3)
    sel = torch.zeros(2, 3, dtype=torch.bool)
    for name in POLICY_LOSSES:
        out = per_token_loss(name, logp, old, torch.ones(2), mask, eps_low=0.2, eps_high=0.2, selected=sel)
        assert out.loss.shape == (2, 3) and torch.isfinite(out.loss).all(), name
    with pytest.raises(ValueError, match="algorithm.policy_loss"):
        per_token_loss("ppo", logp, old, torch.ones(2), mask, eps_low=0.2, eps_high=0.2)
    with pytest.raises(ValueError, match="covariance"):
        per_token_loss("kl_cov", logp, old, torch.ones(2), mask, eps_low=0.2, eps_high=0.2)


def batch(seed: int = 3, n: int = 10, t: int = 12) -> dict[str, torch.Tensor]:
    g = torch.Generator().manual_seed(seed)
    lengths = torch.randint(2, t + 1, (n,), generator=g)
    mask = (torch.arange(t)[None, :] < lengths[:, None]).float()
    old = -torch.rand(n, t, generator=g) * 3 * mask
    return {
        "logp": (old + 0.2 * torch.randn(n, t, generator=g)) * mask,
        "old": old,
        "adv": torch.randn(n, generator=g) * 2,
        "mask": mask,
        "ids": torch.arange(n),
    }


class ThreadRanks:
    """Ranks as threads, with the two collectives the selection takes (an all-reduce sum and an all-gather)."""

    def __init__(self, world: int) -> None:
        self.world, self.barrier, self.slots = world, threading.Barrier(world), [None] * world

    def _exchange(self, rank: int, value):  # noqa: ANN001, ANN202
        self.barrier.wait()
        self.slots[rank] = value
        self.barrier.wait()
        out = list(self.slots)
        self.barrier.wait()
        return out

    def run(self, fn) -> list:  # noqa: ANN001
        results: list = [None] * self.world

        def body(rank: int) -> None:
            results[rank] = fn(rank, lambda x: sum(self._exchange(rank, x)), lambda x: self._exchange(rank, x))

        threads = [threading.Thread(target=body, args=(r,)) for r in range(self.world)]
        for t in threads:
            t.start()
        for t in threads:
            t.join(timeout=60)
        return results


@pytest.mark.parametrize("name", ["clip_cov", "kl_cov"])
def test_covariance_selection_is_the_same_whatever_the_split(name: str) -> None:
    """The rows split over three ranks (in another order) select exactly the tokens one process selects: the means
    and the k-th token are the whole batch's, and Clip-Cov's random draw is keyed by where a token sits."""
    b = batch()
    kw = dict(ratio=0.08, lb=-10.0, ub=10.0, eps_low=0.2, eps_high=0.2)
    whole = covariance_selection(name, b["logp"], b["old"], b["adv"], b["mask"], b["ids"], 5, **kw)
    assert int(whole.sum()) == max(1, int(0.08 * b["mask"].sum()))
    parts = [[7, 2, 9], [0, 4], [1, 3, 5, 6, 8]]

    def rank_fn(rank: int, reduce, gather):  # noqa: ANN001, ANN202
        idx = torch.tensor(parts[rank])
        args = (b["logp"][idx], b["old"][idx], b["adv"][idx], b["mask"][idx], b["ids"][idx], 5)
        return covariance_selection(name, *args, sum_over_ranks=reduce, gather_from_ranks=gather, **kw)

    got = torch.zeros_like(whole)
    for rank, piece in enumerate(ThreadRanks(len(parts)).run(rank_fn)):
        got[torch.tensor(parts[rank])] = piece
    assert torch.equal(got, whole)


def test_kl_cov_selects_the_largest_covariances_and_clip_cov_draws_within_the_band() -> None:
    b = batch(seed=4)
    m = b["mask"] > 0
    sel = covariance_selection("kl_cov", b["logp"], b["old"], b["adv"], m, b["ids"], 0, ratio=0.1)
    a, lp = b["adv"][:, None].expand_as(b["logp"]), b["logp"]
    cov = (a - a[m].mean()) * (lp - lp[m].mean())
    k = int(sel.sum())
    assert set(torch.topk(cov[m], k).indices.tolist()) == set(torch.nonzero(sel[m]).flatten().tolist())
    band = covariance_selection("clip_cov", lp, b["old"], b["adv"], m, b["ids"], 0, ratio=0.05, lb=0.5, ub=3.0)
    assert band.sum() >= 1 and ((cov[band] > 0.5) & (cov[band] < 3.0)).all()
    other_salt = covariance_selection("clip_cov", lp, b["old"], b["adv"], m, b["ids"], 1, ratio=0.05, lb=0.5, ub=3.0)
    assert int(other_salt.sum()) == int(band.sum())  # the same number, another draw (the salt is the update count)


def test_token_keys_are_uniform_looking_and_deterministic() -> None:
    k = token_keys(torch.arange(200), 50, 7)
    assert torch.equal(k, token_keys(torch.arange(200), 50, 7)) and not torch.equal(
        k, token_keys(torch.arange(200), 50, 8)
    )
    assert 0 <= float(k.min()) and float(k.max()) < 1 and abs(float(k.mean()) - 0.5) < 0.02
    assert len(set(k.flatten().tolist())) == k.numel()


# ------------------------------------------------------------------------------------------ the 2026 baselines
def _case(seed: int = 0, n: int = 6, t: int = 5, spread: float = 1.2):
    """float64 log-probs of n responses of up to t tokens (a loss mask with two short ones), advantages of both
    signs, and log-ratios of up to +-spread / 2."""
    g = torch.Generator().manual_seed(seed)
    old = -torch.rand(n, t, generator=g, dtype=F64) * 3 - 0.05
    logp = (old + (torch.rand(n, t, generator=g, dtype=F64) - 0.5) * spread).clamp(max=-1e-3)
    mask = (torch.arange(t)[None] < torch.tensor([t, 3, t, 2, t, 4][:n])[:, None]).to(F64)
    adv = torch.tensor([1.0, -1.0, 0.5, -2.0, 1.5, -0.5][:n], dtype=F64)
    return old, logp, mask, adv


def test_sapo_is_its_papers_soft_gate() -> None:
    """SAPO (arXiv 2511.20347, Eq. 4-6), written out per token: f(r) = (4 / tau) sigmoid(tau (r - 1)), tau by the
    advantage's sign; its gradient in log pi at r = 1 is the policy gradient's (-A), and it fades with |r - 1|. A
    mutant with one temperature for both signs differs where A < 0. The temperatures are the log-probs' dtype: 1.05 in
    float32 (1.0499999523) would be off by 5e-8 in a float64 loss."""
    old, logp, mask, adv = _case()
    out = sapo_loss(logp, old, adv, 1.0, 1.05)
    r = (logp - old).exp()
    tau = torch.where(adv[:, None] > 0, torch.tensor(1.0, dtype=F64), torch.tensor(1.05, dtype=F64))
    assert torch.allclose(out.loss, -adv[:, None] * torch.sigmoid(tau * (r - 1)) * 4 / tau, rtol=0, atol=1e-15)
    at_one = grad_of(lambda x: sapo_loss(x, x.detach(), adv, 1.0, 1.05).loss.sum(), logp)
    assert torch.allclose(at_one, -adv[:, None].expand_as(at_one), rtol=0, atol=1e-15)
    g = grad_of(lambda x: sapo_loss(x, old, adv, 1.0, 1.05).loss.sum(), logp)
    s = torch.sigmoid(tau * (r - 1))
    assert torch.allclose(g, -adv[:, None] * 4 * s * (1 - s) * r, rtol=0, atol=1e-14)
    assert not out.clipped_upper.any() and not out.clipped_lower.any()  # nothing is clipped, only weighed
    mutant = sapo_loss(logp, old, adv, 1.0, 1.0)
    assert (mutant.loss - out.loss)[adv < 0].abs().max() > 1e-3 and torch.equal(mutant.loss[adv > 0], out.loss[adv > 0])


def test_gmpo_is_the_geometric_mean_of_clipped_token_ratios() -> None:
    """GMPO (arXiv 2507.20673, Eq. 8): per response rho = exp(mean over its tokens of the sign-aware clipped
    log-ratio), loss -A rho; under seq-mean-token-mean our per-token form has that loss and its gradient. A mutant
    that clips both sides alike (clamp, not the sign-aware min) differs."""
    old, logp, mask, adv = _case(1)
    eps = 0.2

    def paper(x: torch.Tensor, sign_aware: bool = True) -> torch.Tensor:
        log_r = x - old
        clamped = log_r.clamp(-eps, eps)
        sgn = torch.sign(adv)[:, None]
        c = sgn * torch.minimum(sgn * log_r, sgn * clamped) if sign_aware else clamped
        rho = torch.exp((c * mask).sum(-1) / mask.sum(-1))
        return (-adv * rho).mean()

    ours = lambda x: aggregate(gmpo_surrogate(x, old, adv, mask, eps, eps).loss, mask, "seq-mean-token-mean")  # noqa: E731
    assert float(ours(logp)) == pytest.approx(float(paper(logp)), abs=1e-15)
    assert torch.allclose(grad_of(ours, logp) * mask, grad_of(paper, logp) * mask, rtol=0, atol=1e-15)
    out = gmpo_surrogate(logp, old, adv, mask, eps, eps)
    held = (((logp - old) > eps) & (adv[:, None] > 0)) & (mask > 0)
    assert (out.clipped_upper & (mask > 0)).equal(held) and held.any()
    assert abs(float(paper(logp, sign_aware=False)) - float(paper(logp))) > 1e-3


@pytest.mark.parametrize("kind", ["tv", "kl"])
def test_dppo_keeps_the_tokens_inside_its_trust_region(kind: str) -> None:
    """DPPO (arXiv 2602.04879, Binary-TV and Binary-KL, as verl ships them): -A sg(r) log pi on the tokens whose
    sampled-token divergence from the old policy stays within the bound in the advantage's direction; the others
    give no loss and no gradient. A mutant that drops in both directions (|pi - pi_old| > delta) differs."""
    old, logp, mask, adv = _case(2, spread=3.0)
    delta = 0.15 if kind == "tv" else 0.05
    out = dppo_loss(kind, logp, old, adv, delta, delta)
    p, q = logp.exp(), old.exp()
    a = adv[:, None].expand_as(p)
    if kind == "tv":
        leave = ((a > 0) & (p - q > delta)) | ((a < 0) & (p - q < -delta))
    else:
        bkl = q * (old - logp) + (1 - q) * torch.log((1 - q + 1e-8) / (1 - p + 1e-8))
        leave = (bkl > delta) & (((a > 0) & (p > q)) | ((a < 0) & (p < q)))
    expected = torch.where(leave, 0.0, -a * (logp - old).exp() * logp)
    assert torch.allclose(out.loss, expected, rtol=0, atol=1e-15) and (leave & (mask > 0)).any()
    g = grad_of(lambda x: dppo_loss(kind, x, old, adv, delta, delta).loss.sum(), logp)
    assert torch.equal(g[leave], torch.zeros_like(g[leave]))
    assert torch.allclose(g[~leave], (-a * (logp - old).exp())[~leave], rtol=0, atol=1e-15)  # the ratio, stopped
    assert torch.equal(out.clipped_upper, leave & (a > 0)) and torch.equal(out.clipped_lower, leave & (a < 0))
    if kind == "tv":
        both_ways = ((p - q).abs() > delta) & (mask > 0)
        assert (both_ways & ~leave).any()  # the mutant would drop tokens moving back towards the old policy


def test_the_off_policy_mask_is_deepseek_v3_2s_and_drops_only_negative_responses() -> None:
    """DeepSeek-V3.2 (arXiv 2512.02556, Eq. 9): M_i = 0 iff A_i < 0 and the mean over its tokens of
    log pi_sample - log pi_theta exceeds delta. A mutant without the sign condition would drop a positive one."""
    old, logp, mask, adv = _case(3)
    sampling = logp + torch.tensor([0.3, 0.3, 0.0, 0.05, 0.3, 0.2], dtype=F64)[:, None]  # per-response offsets
    keep = off_policy_sequence_mask(adv, logp, sampling, mask, 0.1)
    assert keep.shape == (6, 1) and keep[:, 0].tolist() == [1.0, 0.0, 1.0, 1.0, 1.0, 0.0]
    assert (adv > 0)[0] and (sampling - logp)[0, 0] > 0.1  # response 0: positive, far off-policy, kept
    with pytest.raises(ValueError, match="> 0"):
        off_policy_sequence_mask(adv, logp, sampling, mask, 0.0)


def test_every_new_loss_is_reachable_by_name() -> None:
    old, logp, mask, adv = _case()
    for name in ("sapo", "gmpo", "dppo_tv", "dppo_kl"):
        assert name in POLICY_LOSSES
        out = per_token_loss(name, logp, old, adv, mask, eps_low=0.2, eps_high=0.2)
        assert out.loss.shape == logp.shape and torch.isfinite(out.loss).all()
