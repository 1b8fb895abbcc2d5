"""Clipped surrogate: decoupled bounds, active-bound flags, dual-clip (verl form), k3 KL."""

from __future__ import annotations

import math

import hypothesis.extra.numpy as hnp
import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st

from dapo.algos.policy_loss import clipped_surrogate, k3_to_reference


def _run(ratios, advs, **kw):
    """Per-token losses for given ratios (old_logp = 0) and the gradient of their sum w.r.t. logp."""
    logp = torch.log(torch.tensor([ratios], dtype=torch.float64)).requires_grad_()
    out = clipped_surrogate(logp, torch.zeros_like(logp), torch.tensor([advs], dtype=torch.float64), **kw)
    out.loss.sum().backward()
    return out, logp.grad[0]


def test_hand_computed_decoupled_clip():
    #            A>0: r=1.5 (clipped up)  r=0.5  r=1.25 (inside 1.28)   A<0: r=0.5 (clipped low)  r=1.5
    ratios = [1.5, 0.5, 1.25, 0.5, 1.5]
    advs = [1.0, 1.0, 1.0, -1.0, -1.0]
    out, grad = _run(ratios, advs, eps_low=0.2, eps_high=0.28)
    torch.testing.assert_close(out.loss[0], torch.tensor([-1.28, -0.5, -1.25, 0.8, 1.5], dtype=torch.float64))
    # d(-A r)/dlogp = -A r where the unclipped branch is taken; 0 where a bound is active.
    torch.testing.assert_close(grad, torch.tensor([0.0, -0.5, -1.25, 0.0, 1.5], dtype=torch.float64))
    assert out.clipped_upper[0].tolist() == [True, False, False, False, False]
    assert out.clipped_lower[0].tolist() == [False, False, False, True, False]
    assert not out.dual_clipped.any()


def test_clip_higher_frees_the_token_that_grpo_clips():
    # r = 1.25 with A > 0: clipped (zero gradient) at eps_high 0.2, free at 0.28.
    grpo, g_grpo = _run([1.25], [1.0], eps_low=0.2, eps_high=0.2)
    dapo, g_dapo = _run([1.25], [1.0], eps_low=0.2, eps_high=0.28)
    assert grpo.loss.item() == pytest.approx(-1.2) and g_grpo.item() == 0.0 and grpo.clipped_upper.item()
    assert dapo.loss.item() == pytest.approx(-1.25) and g_dapo.item() == pytest.approx(-1.25)
    assert not dapo.clipped_upper.item()


def test_flags_mark_only_active_bounds():
    # r < 1 - eps with A > 0, and r > 1 + eps with A < 0: outside the range but the bound is inactive.
    out, grad = _run([0.5, 1.5, 0.9], [1.0, -1.0, 0.0], eps_low=0.2, eps_high=0.2)
    assert not out.clipped_lower.any() and not out.clipped_upper.any()
    assert grad[0] != 0 and grad[1] != 0
    assert out.loss[0, 2].item() == 0.0  # A = 0: no loss, no flag


def test_dual_clip_verl_form():
    # A=-1, r=5, c=3: l = min(max(5, 1.2), 3) = 3 (dual-clipped, zero grad). A=-2, r=5: min(10, 6) = 6.
    # A=-1, r=2: 2 < 3, untouched. A=+1, r=5: dual-clip never applies to positive advantages.
    out, grad = _run([5.0, 5.0, 2.0, 5.0], [-1.0, -2.0, -1.0, 1.0], eps_low=0.2, eps_high=0.28, dual_clip_c=3.0)
    torch.testing.assert_close(out.loss[0], torch.tensor([3.0, 6.0, 2.0, -1.28], dtype=torch.float64))
    torch.testing.assert_close(grad, torch.tensor([0.0, 0.0, 2.0, 0.0], dtype=torch.float64))
    assert out.dual_clipped[0].tolist() == [True, True, False, False]
    assert out.clipped_upper[0].tolist() == [False, False, False, True]


def test_k3_kl_term():
    # pi = 0.5, pi_ref = 0.25: k3 = 0.5 - log 0.5 - 1 = log 2 - 0.5; d k3 / d logp = 1 - pi_ref/pi = 0.5.
    logp = torch.tensor([[math.log(0.5)]], dtype=torch.float64, requires_grad=True)
    ref = torch.tensor([[math.log(0.25)]], dtype=torch.float64)
    kl = k3_to_reference(logp, ref)
    assert kl.item() == pytest.approx(math.log(2) - 0.5)
    kl.sum().backward()
    assert logp.grad.item() == pytest.approx(0.5)
    assert k3_to_reference(ref, ref).item() == 0.0  # at the reference: no penalty


def test_k3_kl_keeps_pulling_where_the_clip_has_stopped_the_policy_gradient():
    """A token clipped at the upper bound (A > 0, ratio 1.5 > 1.28) has no policy-gradient term left, but the KL
    term the learner adds to every loss keeps its gradient towards the reference: l = -1.28 A + beta * k3,
    dl/dlogp = beta * (1 - pi_ref/pi)."""
    beta, adv = 0.3, 2.0
    logp = torch.tensor([[math.log(0.6)]], dtype=torch.float64, requires_grad=True)  # pi = 0.6
    old = torch.tensor([[math.log(0.4)]], dtype=torch.float64)  # ratio 1.5
    ref = torch.tensor([[math.log(0.2)]], dtype=torch.float64)  # pi_ref / pi = 1/3
    out = clipped_surrogate(logp, old, torch.tensor([adv], dtype=torch.float64), 0.2, 0.28)
    loss = out.loss + beta * k3_to_reference(logp, ref)
    k3 = 1 / 3 - math.log(1 / 3) - 1
    assert out.clipped_upper.item() and loss.item() == pytest.approx(-1.28 * adv + beta * k3)
    loss.sum().backward()
    assert logp.grad.item() == pytest.approx(beta * (1 - 1 / 3))


def test_per_token_advantages_and_errors():
    logp = torch.log(torch.tensor([[1.5, 1.5]]))
    out = clipped_surrogate(logp, torch.zeros_like(logp), torch.tensor([[1.0, -1.0]]), 0.2, 0.28)
    torch.testing.assert_close(out.loss, torch.tensor([[-1.28, 1.5]]))
    with pytest.raises(ValueError, match="dual_clip_c"):
        clipped_surrogate(logp, logp, torch.ones(1), 0.2, 0.2, dual_clip_c=1.0)


def _grpo_reference(logp, old_logp, adv, eps):
    """GRPO / PPO's symmetric clip, written independently: -min(r A, clip(r, 1-eps, 1+eps) A)."""
    r = torch.exp(logp - old_logp)
    a = adv[:, None]
    return -torch.min(r * a, torch.clamp(r, 1 - eps, 1 + eps) * a)


@settings(max_examples=40, deadline=None)
@given(
    n=st.integers(1, 5),
    t=st.integers(1, 7),
    seed=st.integers(0, 2**31 - 1),
    eps=st.floats(0.05, 0.5),
    scale=st.floats(0.01, 2.0),
)
def test_equal_eps_reproduces_grpo(n, t, seed, eps, scale):
    g = torch.Generator().manual_seed(seed)
    logp = (torch.randn(n, t, generator=g, dtype=torch.float64) * scale - 1.0).requires_grad_()
    old = torch.randn(n, t, generator=g, dtype=torch.float64) * scale - 1.0
    adv = torch.randn(n, generator=g, dtype=torch.float64)
    ours = clipped_surrogate(logp, old, adv, eps, eps).loss
    ref = _grpo_reference(logp, old, adv, eps)
    torch.testing.assert_close(ours, ref, rtol=1e-12, atol=1e-12)
    (g_ours,) = torch.autograd.grad(ours.sum(), logp)
    (g_ref,) = torch.autograd.grad(ref.sum(), logp)
    torch.testing.assert_close(g_ours, g_ref, rtol=1e-12, atol=1e-12)


@settings(max_examples=40, deadline=None)
@given(
    hnp.arrays("float64", st.tuples(st.integers(1, 4), st.integers(1, 6)), elements=st.floats(-3, 3)),
    st.floats(0.0, 0.9),
    st.floats(0.0, 2.0),
)
def test_flags_are_exactly_where_the_gradient_vanishes(log_ratio, eps_low, eps_high):
    n = log_ratio.shape[0]
    logp = torch.tensor(log_ratio, requires_grad=True)
    adv = torch.linspace(-1.0, 1.0, n, dtype=torch.float64) if n > 1 else torch.ones(1, dtype=torch.float64)
    out = clipped_surrogate(logp, torch.zeros_like(logp), adv, eps_low, eps_high)
    (grad,) = torch.autograd.grad(out.loss.sum(), logp)
    a = adv[:, None].expand_as(grad)
    active = out.clipped_lower | out.clipped_upper
    assert torch.all(grad[active] == 0)
    assert torch.all(grad[~active & (a != 0)] != 0)
    assert torch.all(out.loss >= -a * logp.detach().exp() - 1e-12)  # the clipped loss is pessimistic
