"""The rollout/learner mismatch (dapo.algos.rollout_correction): hand-computed weights and gap statistics, a group's
sameness (dapo.algos.metrics.group_sameness) and the tripwires that read them (dapo.trainer.tripwires)."""

from __future__ import annotations

import math

import numpy as np
import pytest
import torch

from dapo import metric_names as M
from dapo.algos.aggregation import local_counts, token_weights, weighted_sum
from dapo.algos.metrics import IMPLAUSIBLE_LOG_CHANCE, group_sameness, mismatch_stats
from dapo.algos.policy_loss import clipped_surrogate
from dapo.algos.rollout_correction import correction_weights
from dapo.trainer.tripwires import LOGPROB_GAP_BOUND, Tripwires

L2, L3 = math.log(2.0), math.log(3.0)


def case() -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """Two responses, log-ratios (learner - engine) log 3, 0, -log 2 and 0.1, 0.2 (then padding, garbage)."""
    old = torch.tensor([[L3, 0.0, -L2], [0.1, 0.2, 9.0]])
    return old, torch.zeros(2, 3), torch.tensor([[1.0, 1.0, 1.0], [1.0, 1.0, 0.0]])


def test_token_and_sequence_tis_by_hand() -> None:
    old, eng, mask = case()
    w, st = correction_weights(old, eng, mask, "token_tis", cap=2.0)
    assert torch.allclose(w, torch.tensor([[2.0, 1.0, 0.5], [math.exp(0.1), math.exp(0.2), 0.0]]))
    assert st["capped_frac"] == pytest.approx(1 / 5)  # one token of five exceeded C
    w, st = correction_weights(old, eng, mask, "sequence_tis", cap=2.0)
    # first response: 3 * 1 * 0.5 = 1.5 (under C); second: e^0.3
    assert torch.allclose(w, torch.tensor([[1.5, 1.5, 1.5], [math.exp(0.3), math.exp(0.3), 0.0]]))
    assert st["capped_frac"] == 0.0


def test_token_and_sequence_mis_by_hand() -> None:
    old, eng, mask = case()
    w, st = correction_weights(old, eng, mask, "token_mis", cap=2.0, floor=0.6)
    assert torch.allclose(w, torch.tensor([[0.0, 1.0, 0.0], [math.exp(0.1), math.exp(0.2), 0.0]]))  # 3 > C, 0.5 < floor
    assert st["masked_frac"] == pytest.approx(2 / 5)
    w, st = correction_weights(old, eng, mask, "sequence_mis", cap=1.4)
    assert torch.allclose(w, torch.tensor([[0.0, 0.0, 0.0], [math.exp(0.3), math.exp(0.3), 0.0]]))  # 1.5 > 1.4
    assert st["masked_frac"] == pytest.approx(1 / 2)


def test_no_correction_and_bad_bounds() -> None:
    old, eng, mask = case()
    assert torch.equal(correction_weights(old, eng, mask, "none", cap=2.0)[0], mask)
    with pytest.raises(ValueError, match="floor"):
        correction_weights(old, eng, mask, "token_mis", cap=2.0, floor=3.0)
    with pytest.raises(ValueError, match="unknown rollout correction"):
        correction_weights(old, eng, mask, "tis", cap=2.0)  # type: ignore[arg-type]


def test_the_loss_with_weights_split_over_micro_batches_is_the_whole_batchs() -> None:
    """Weights made on whole responses, then the batch's rows cut into pieces (micro-batches or ranks) whose partial
    weighted sums use the whole mini-batch's counts: the sum and its gradient are the one-piece loss's. In float64
    (the weights themselves come out float32, the same on both sides), so the pieces' other order of summation
    rounds at ~1e-16 and 1e-12 is generous."""
    g = torch.Generator().manual_seed(0)
    old = torch.randn(6, 5, generator=g, dtype=torch.float64) * 0.3
    eng = old + 0.2 * torch.randn(6, 5, generator=g, dtype=torch.float64)
    mask = (torch.arange(5)[None] < torch.tensor([5, 3, 4, 1, 5, 2])[:, None]).double()
    adv = torch.randn(6, generator=g, dtype=torch.float64)
    logp = (old + 0.1 * torch.randn(6, 5, generator=g, dtype=torch.float64)).requires_grad_()
    for mode in ("token_tis", "sequence_tis", "token_mis", "sequence_mis"):
        w, _ = correction_weights(old, eng, mask, mode, cap=1.3, floor=0.8 if mode.endswith("mis") else None)
        counts = local_counts(mask)
        tw = token_weights(mask, "token-mean", **counts)

        def piece(rows: list[int], w: torch.Tensor = w, tw: torch.Tensor = tw) -> torch.Tensor:
            r = torch.tensor(rows)
            out = clipped_surrogate(logp[r], old[r], adv[r], 0.2, 0.28)
            return weighted_sum(out.loss * w[r], tw[r])

        whole = piece(list(range(6)))
        (g_whole,) = torch.autograd.grad(whole, logp)
        split = piece([0, 3]) + piece([5, 1, 2]) + piece([4])
        (g_split,) = torch.autograd.grad(split, logp)
        assert float(split.detach()) == pytest.approx(float(whole.detach()), abs=1e-12)
        assert torch.allclose(g_split, g_whole, rtol=0, atol=1e-12)
        # a split that miscounted the mini-batch by one token (normaliser n + 1) would move it far past the bound
        n = counts["num_tokens"]
        assert abs(float(whole) * n / (n + 1) - float(whole)) > 1e-6


def test_mismatch_stats_by_hand() -> None:
    old, eng, mask = case()
    st = mismatch_stats(old, eng, mask, token_bound=0.7)
    d = [L3, 0.0, -L2, 0.1, 0.2]
    assert st["abs_diff"] == pytest.approx(sum(abs(x) for x in d) / 5)
    assert st["k3"] == pytest.approx(sum(math.expm1(x) - x for x in d) / 5)
    assert st["seq_abs_diff_max"] == pytest.approx((L3 + L2) / 3)
    assert st["beyond_frac"] == pytest.approx(1 / 5)  # only log 3 exceeds 0.7
    assert mismatch_stats(old, old, mask, L2)["abs_diff"] == 0.0
    assert math.isnan(mismatch_stats(old, eng, torch.zeros_like(mask), L2)["abs_diff"])


def test_group_sameness() -> None:
    # distinct responses: counted, no coincidence
    assert group_sameness([[1, 2], [1, 3]], [[-0.1, -0.2], [-0.1, -0.3]]) == (2, None)
    # 8 copies of a 30-token response at p = 0.7 a token: independent samples would essentially never coincide
    lp = [math.log(0.7)] * 30
    distinct, chance = group_sameness([[5] * 30] * 8, [lp] * 8)
    assert distinct == 1 and chance == pytest.approx(7 * 30 * math.log(0.7)) and chance < IMPLAUSIBLE_LOG_CHANCE
    # a confident policy repeating a short answer: plausible
    _, chance = group_sameness([[5, 6, 7]] * 8, [[math.log(0.9)] * 3] * 8)
    assert chance > IMPLAUSIBLE_LOG_CHANCE
    assert group_sameness([[5]] * 4, [None] * 4) == (1, None)  # no log-probs: nothing to judge by
    # two replicas drawing the same seeds: every response twice (4 distinct of 8), each pair log C(8,2) + log p
    group = [[k] * 30 for k in range(4)] * 2
    distinct, chance = group_sameness(group, [lp] * 8)
    assert distinct == 4 and chance == pytest.approx(4 * (math.log(28) + 30 * math.log(0.7)))
    assert chance < IMPLAUSIBLE_LOG_CHANCE
    # one pair of short confident answers among distinct ones: the bound is capped at a chance of 1
    assert group_sameness([[1], [1], [2], [3]], [[math.log(0.5)]] * 4) == (3, 0.0)


def test_group_sameness_bounds_the_chance_of_repeats_under_independent_draws() -> None:
    """Over groups drawn independently, a log-chance below log(alpha) happens in at most a share alpha of them: the
    bound is one (a loose bound would still pass; a bound that is too small, e.g. without C(G, k), fails)."""
    rng = np.random.default_rng(0)
    probs = np.array([0.2, 0.1, 0.05] + [0.65 / 200] * 200)  # a few likely responses and a long tail
    groups = rng.choice(len(probs), size=(40_000, 8), p=probs)
    logp = np.log(probs)
    chances = np.array([group_sameness([[int(r)] for r in g], [[float(logp[r])] for r in g])[1] or 0.0 for g in groups])
    for alpha in (0.3, 0.1, 0.03, 0.01):
        assert (chances < math.log(alpha)).mean() <= alpha


def test_tripwires_fire_on_a_gap_or_implausible_groups_and_stay_silent_otherwise() -> None:
    t = Tripwires(logprob_gap=LOGPROB_GAP_BOUND["float32"], dtype="float32")
    quiet = {M.MISMATCH_ABS_DIFF: 2e-6, M.IMPLAUSIBLE_GROUP_FRAC: 0.0}
    assert t.check(3, quiet) is None
    msg = t.check(3, {**quiet, M.MISMATCH_ABS_DIFF: 0.05})
    assert msg is not None and "weight sync did not load" in msg and "rollout step 3" in msg
    msg = t.check(1, {**quiet, M.IMPLAUSIBLE_GROUP_FRAC: 0.9})
    assert msg is not None and "sharing one seed" in msg and "repeat responses" in msg
    assert Tripwires(logprob_gap=None).check(1, {**quiet, M.MISMATCH_ABS_DIFF: 5.0}) is None  # top_p < 1: unchecked
    assert Tripwires(logprob_gap=1e-3, enabled=False).check(1, {M.MISMATCH_ABS_DIFF: 5.0}) is None
    assert t.check(1, {}) is None  # an engine without log-probs logs no gap
