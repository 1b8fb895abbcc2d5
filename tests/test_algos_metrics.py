"""The metric formulas' one owner (dapo.algos.metrics): an update's sums and metrics (clip fractions over loss
tokens, Fig 3a's probability, the k3 approximate KL, rare positive tokens clipped above), Fig 3b's group fractions."""

from __future__ import annotations

import math

import pytest
import torch

from dapo import metric_names as M
from dapo.algos.metrics import RARE_TOKEN_PROB, group_outcome_fractions, update_metrics, update_sums
from dapo.algos.policy_loss import SurrogateOut, clipped_surrogate

MASK = torch.tensor([[1, 1, 1, 0], [1, 0, 0, 0]], dtype=torch.bool)


def metrics(out: SurrogateOut, old: torch.Tensor, new: torch.Tensor, adv: torch.Tensor, mask: torch.Tensor, **kw):
    """One whole mini-batch's metrics: its sums, divided."""
    sums = update_sums(out, torch.tensor(0.0), old, new, adv, mask)
    m = mask.to(torch.bool)
    return update_metrics(
        {k: float(v) for k, v in sums.items()},
        float(m.sum()),
        float(m.any(-1).sum()),
        kw.get("loss", "ppo_clip"),
        False,
    )


def flags(lower: torch.Tensor, upper: torch.Tensor) -> SurrogateOut:
    z = torch.zeros_like(lower)
    return SurrogateOut(loss=z.float(), clipped_lower=lower, clipped_upper=upper, dual_clipped=z)


def test_clip_fractions_over_loss_tokens_only_and_fig3a_over_the_upper_clipped():
    lower = torch.tensor([[True, False, False, True], [False, False, False, False]])  # (0, 3) is padding
    upper = torch.tensor([[False, True, False, True], [True, False, True, False]])  # (0, 3), (1, 2) are padding
    # float64 log-probs: the log/exp round trip behind Fig 3a's mean rounds at ~1e-16, not float32's ~1e-7
    old = torch.log(torch.tensor([[0.1, 0.3, 0.9, 0.5], [0.1, 0.5, 0.5, 0.5]], dtype=torch.float64))
    m = metrics(flags(lower, upper), old, old, torch.ones(2), MASK)
    assert (m[M.CLIPFRAC_LOW], m[M.CLIPFRAC_HIGH]) == (pytest.approx(0.25), pytest.approx(0.5))
    assert m[M.CLIP_HIGH_PROB] == pytest.approx(0.2)  # mean pi_old of the two upper-clipped loss tokens
    none = metrics(flags(lower, torch.zeros_like(upper)), old, old, torch.ones(2), MASK)
    assert math.isnan(none[M.CLIP_HIGH_PROB])  # nothing clipped: no point, not 0


def test_with_the_surrogate_flags_and_rare_positive_tokens():
    # Low-probability tokens whose probability grew beyond 1 + eps_high are the ones clipped at the top.
    old = torch.log(torch.tensor([[0.05, 0.5, 0.6]], dtype=torch.float64))
    new = torch.log(torch.tensor([[0.1, 0.55, 0.3]], dtype=torch.float64))
    out = clipped_surrogate(new, old, torch.tensor([1.0], dtype=torch.float64), 0.2, 0.28)
    m = metrics(out, old, new, torch.tensor([1.0], dtype=torch.float64), torch.ones(1, 3, dtype=torch.bool))
    assert (m[M.CLIPFRAC_LOW], m[M.CLIPFRAC_HIGH]) == (0.0, pytest.approx(1 / 3))
    assert m[M.CLIP_HIGH_PROB] == pytest.approx(0.05)
    assert 0.05 < RARE_TOKEN_PROB < 0.5 and m[M.CLIPFRAC_HIGH_RARE] == 1.0  # the one rare positive token: clipped


def test_approx_kl_k3():
    new = torch.log(torch.tensor([[0.5, 0.5]], dtype=torch.float64))  # float64: k3 of float32 logs rounds at 1e-7
    old = torch.log(torch.tensor([[0.25, 0.5]], dtype=torch.float64))
    z = torch.zeros(1, 2, dtype=torch.bool)
    # r = 2: 2 - 1 - log 2; r = 1: 0. Second token is padding.
    assert metrics(flags(z, z), old, new, torch.ones(1), torch.tensor([[True, False]]))[M.APPROX_KL] == pytest.approx(
        1 - math.log(2)
    )
    both = metrics(flags(z, z), old, new, torch.ones(1), torch.tensor([[True, True]]))
    assert both[M.APPROX_KL] == pytest.approx((1 - math.log(2)) / 2)


def test_a_loss_own_metric_is_reported_for_that_loss_only():
    z = torch.zeros(2, 4, dtype=torch.bool)
    gspo = metrics(flags(z, MASK), torch.zeros(2, 4), torch.zeros(2, 4), torch.ones(2), MASK, loss="gspo")
    assert gspo[M.SEQ_CLIPFRAC_HIGH] == 1.0 and M.SEQ_CLIPFRAC_HIGH not in metrics(
        flags(z, MASK), torch.zeros(2, 4), torch.zeros(2, 4), torch.ones(2), MASK
    )


def test_group_outcome_fractions():
    correct = torch.tensor([[True, True], [False, False], [True, False], [True, True]])
    assert group_outcome_fractions(correct) == (0.5, 0.25)
    assert all(math.isnan(x) for x in group_outcome_fractions(torch.zeros(0, 4, dtype=torch.bool)))


def test_every_update_metric_of_every_loss_reaches_the_step_metrics():
    """What the learner reports for each loss is averaged into the step's metrics (and so logged), over the updates
    that were applied; the lr is the step's own. The entropy has one owner, the step (the old policy's, over the
    whole batch): an update reports none."""
    from dapo.algos.metrics import UPDATE_SUMS
    from dapo.trainer.metrics import update_means
    from dapo.types import POLICY_LOSSES

    sums = dict.fromkeys(UPDATE_SUMS, 1.0)
    for loss in POLICY_LOSSES:
        reported = {**update_metrics(sums, 10.0, 2.0, loss, with_kl=True), M.GRAD_NORM: 2.0, M.LR: 1e-6}
        assert M.ENTROPY not in reported
        skipped = dict.fromkeys(reported, 100.0) | {M.UPDATE_SKIPPED: 1.0}
        means = update_means([{**reported, M.UPDATE_SKIPPED: 0.0}, skipped])
        assert set(means) == set(reported) - {M.LR} | {M.UPDATE_SKIPPED}, loss
        assert means[M.GRAD_NORM] == 2.0 and means[M.UPDATE_SKIPPED] == 0.5  # the skipped update's values left out
