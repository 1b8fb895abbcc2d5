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
    gspo_surrogate,
    per_token_loss,
    token_keys,
)


def grad_of(fn, logp: torch.Tensor) -> torch.Tensor:
    x = logp.clone().requires_grad_()
    (g,) = torch.autograd.grad(fn(x), x)
    return g


def test_gspo_hand_computed() -> None:
    """One response of two tokens, log-ratios 0.1 and 0.3: s = exp(0.2); A = 1 with eps_high 0.1 clips it (1.2214 >
    1.1): the loss is -1.1 at each token and no gradient flows; A = -1: not clipped, loss s, gradient s/2 per token."""
    old = torch.tensor([[-1.0, -2.0]])
    logp = old + torch.tensor([[0.1, 0.3]])
    mask = torch.ones(1, 2)
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
    old = torch.randn(8, 1, generator=g)
    logp = old + 0.3 * torch.randn(8, 1, generator=g)
    adv = torch.randn(8, generator=g)
    mask = torch.ones(8, 1)
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
    old = torch.randn(3, 5, generator=g)
    logp = old + 0.05 * torch.randn(3, 5, generator=g)
    mask = torch.tensor([[1, 1, 1, 0, 0], [1, 1, 1, 1, 1], [1, 0, 0, 0, 0]], dtype=torch.float32)
    adv = torch.tensor([0.5, -1.0, 2.0])
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
    old = torch.randn(4, 6, generator=g)
    logp = old + 0.1 * torch.randn(4, 6, generator=g)
    adv = torch.randn(4, generator=g)
    mask = torch.ones(4, 6)
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
