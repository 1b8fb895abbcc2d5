"""Group advantages: GRPO z-score with unbiased std + 1e-6, and Dr. GRPO without the std division."""

from __future__ import annotations

import pytest
import torch

from dapo.algos.advantages import group_advantages


def test_grpo_zscore_hand_computed():
    # rewards 1,1,1,-1: mean 0.5, deviations (.5,.5,.5,-1.5), unbiased var (3*.25 + 2.25)/3 = 1 -> std 1.
    r = torch.tensor([[1.0, 1.0, 1.0, -1.0]], dtype=torch.float64)
    a = group_advantages(r)
    expected = torch.tensor([[0.5, 0.5, 0.5, -1.5]], dtype=torch.float64) / (1.0 + 1e-6)
    torch.testing.assert_close(a, expected, rtol=0, atol=1e-12)


def test_std_is_unbiased_not_population():
    # 1,-1: mean 0, unbiased std sqrt(2) (population std would be 1).
    a = group_advantages(torch.tensor([[1.0, -1.0]], dtype=torch.float64))
    torch.testing.assert_close(a, torch.tensor([[1.0, -1.0]], dtype=torch.float64) / (2**0.5 + 1e-6))


def test_dr_grpo_only_centres():
    r = torch.tensor([[1.0, 1.0, 1.0, -1.0], [2.0, 0.0, 0.0, 0.0]])
    a = group_advantages(r, norm_by_std=False)
    torch.testing.assert_close(a, torch.tensor([[0.5, 0.5, 0.5, -1.5], [1.5, -0.5, -0.5, -0.5]]))


def test_rows_are_independent_and_equal_groups_get_zero():
    r = torch.tensor([[1.0, 1.0, 1.0], [-1.0, -1.0, -1.0], [1.0, -1.0, -1.0]], dtype=torch.float64)
    a = group_advantages(r)
    assert torch.equal(a[:2], torch.zeros(2, 3, dtype=torch.float64))  # no gradient from all-correct / all-wrong groups
    torch.testing.assert_close(a[2], group_advantages(r[2:])[0])
    assert abs(float(a[2].sum())) < 1e-12  # centred: float64, three terms of ~1


def test_soft_penalty_shaped_rewards_keep_their_spread():
    # A group of wrong answers with different overlong penalties is not all-equal: advantages are non-zero.
    a = group_advantages(torch.tensor([[-1.0, -1.5, -2.0]]))
    torch.testing.assert_close(a, torch.tensor([[0.5, 0.0, -0.5]]) / (0.5 + 1e-6))  # mean -1.5, std 0.5


def test_integer_rewards_and_bad_shapes():
    assert group_advantages(torch.tensor([[1, -1]])).dtype == torch.float32
    with pytest.raises(ValueError, match="G >= 2"):
        group_advantages(torch.tensor([[1.0], [0.0]]))
    with pytest.raises(ValueError, match=r"\[B, G\]"):
        group_advantages(torch.tensor([1.0, 0.0]))
