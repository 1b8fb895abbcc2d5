"""Metric helpers: clip fractions, Fig 3a probability, approximate KL, Fig 3b group fractions."""

from __future__ import annotations

import math

import pytest
import torch

from dapo.algos.metrics import (
    approx_kl,
    clip_fractions,
    clipped_upper_old_prob,
    group_outcome_fractions,
    masked_mean,
)
from dapo.algos.surrogate import clipped_surrogate

MASK = torch.tensor([[1, 1, 1, 0], [1, 0, 0, 0]], dtype=torch.bool)


def test_clip_fractions_over_loss_tokens_only():
    lower = torch.tensor([[True, False, False, True], [False, False, False, False]])  # (0, 3) is padding
    upper = torch.tensor([[False, True, False, False], [True, False, True, False]])  # (1, 2) is padding
    assert clip_fractions(lower, upper, MASK) == (pytest.approx(0.25), pytest.approx(0.5))


def test_fig3a_mean_old_prob_of_upper_clipped_tokens():
    old_logp = torch.log(torch.tensor([[0.1, 0.3, 0.9, 0.5], [0.05, 0.5, 0.5, 0.5]]))
    upper = torch.tensor([[True, True, False, True], [False, False, False, False]])  # (0, 3) is padding
    assert clipped_upper_old_prob(old_logp, upper, MASK) == pytest.approx(0.2)
    assert math.isnan(clipped_upper_old_prob(old_logp, torch.zeros_like(upper), MASK))


def test_with_the_surrogate_flags():
    # Low-probability tokens whose probability grew beyond 1 + eps_high are the ones clipped at the top.
    old = torch.log(torch.tensor([[0.05, 0.5, 0.6]]))
    new = torch.log(torch.tensor([[0.1, 0.55, 0.3]]))
    out = clipped_surrogate(new, old, torch.tensor([1.0]), 0.2, 0.28)
    mask = torch.ones(1, 3, dtype=torch.bool)
    assert clip_fractions(out.clipped_lower, out.clipped_upper, mask) == (0.0, pytest.approx(1 / 3))
    assert clipped_upper_old_prob(old, out.clipped_upper, mask) == pytest.approx(0.05)


def test_approx_kl_k3():
    logp = torch.log(torch.tensor([[0.5, 0.5]]))
    old = torch.log(torch.tensor([[0.25, 0.5]]))
    # r = 2: 2 - 1 - log 2; r = 1: 0. Second token is padding.
    assert approx_kl(logp, old, torch.tensor([[True, False]])) == pytest.approx(1 - math.log(2))
    assert approx_kl(logp, old, torch.tensor([[True, True]])) == pytest.approx((1 - math.log(2)) / 2)


def test_group_outcome_fractions():
    correct = torch.tensor([[True, True], [False, False], [True, False], [True, True]])
    assert group_outcome_fractions(correct) == (0.5, 0.25)
    assert all(math.isnan(x) for x in group_outcome_fractions(torch.zeros(0, 4, dtype=torch.bool)))


def test_masked_mean_empty_is_nan():
    assert math.isnan(masked_mean(torch.ones(2, 2), torch.zeros(2, 2)))
    assert masked_mean(torch.tensor([[1.0, 3.0]]), torch.tensor([[1, 1]])) == 2.0
