"""Chunked log-probs and entropy: same values and gradients as the naive computation, without [T, V] saved."""

from __future__ import annotations

import math

import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st

from dapo.algos.logprobs import chunked_logprobs_entropy, naive_logprobs_entropy


def _inputs(t, h, v, seed, dtype=torch.float64, lead=()):
    g = torch.Generator().manual_seed(seed)
    hidden = torch.randn(*lead, t, h, generator=g, dtype=dtype).requires_grad_()
    weight = (torch.randn(v, h, generator=g, dtype=dtype) * 0.5).requires_grad_()
    targets = torch.randint(0, v, (*lead, t), generator=g)
    return hidden, weight, targets, g


def _grads(fn, hidden, weight, targets, up_lp, up_ent, **kw):
    logp, ent = fn(hidden, weight, targets, **kw)
    loss = (logp * up_lp).sum() + ((ent * up_ent).sum() if up_ent is not None else 0)
    gh, gw = torch.autograd.grad(loss, (hidden, weight))
    return logp.detach(), ent.detach() if ent is not None else None, gh, gw


def test_hand_computed_two_token_vocab():
    # Logits (0, log 3): p = (1/4, 3/4); log p(target 1) = log 0.75; H = -(.25 log .25 + .75 log .75).
    hidden = torch.tensor([[1.0]], dtype=torch.float64)
    weight = torch.tensor([[0.0], [math.log(3.0)]], dtype=torch.float64)
    logp, ent = chunked_logprobs_entropy(hidden, weight, torch.tensor([1]), chunk_size=1)
    assert logp.item() == pytest.approx(math.log(0.75), abs=1e-12)
    assert ent.item() == pytest.approx(-(0.25 * math.log(0.25) + 0.75 * math.log(0.75)), abs=1e-12)
    # Temperature 2 halves the logits: (0, log 3 / 2) -> p = (1 / (1 + sqrt 3), sqrt 3 / (1 + sqrt 3)).
    logp_t, _ = chunked_logprobs_entropy(hidden, weight, torch.tensor([0]), chunk_size=1, temperature=2.0)
    assert logp_t.exp().item() == pytest.approx(1 / (1 + 3**0.5), abs=1e-12)


@settings(max_examples=15, deadline=None)
@given(
    t=st.integers(1, 40),
    h=st.integers(1, 9),
    v=st.integers(2, 60),
    chunk=st.integers(1, 17),
    temperature=st.sampled_from([1.0, 0.7, 1.6]),
    seed=st.integers(0, 2**31 - 1),
)
def test_chunked_equals_naive_value_and_gradient_float64(t, h, v, chunk, temperature, seed):
    hidden, weight, targets, g = _inputs(t, h, v, seed)
    up_lp = torch.randn(t, generator=g, dtype=torch.float64)
    up_ent = torch.randn(t, generator=g, dtype=torch.float64)
    ours = _grads(
        chunked_logprobs_entropy, hidden, weight, targets, up_lp, up_ent, chunk_size=chunk, temperature=temperature
    )
    ref = _grads(naive_logprobs_entropy, hidden, weight, targets, up_lp, up_ent, temperature=temperature)
    for a, b in zip(ours, ref, strict=True):
        torch.testing.assert_close(a, b, rtol=1e-10, atol=1e-10)


def test_logp_only_gradient_and_no_entropy():
    hidden, weight, targets, g = _inputs(13, 4, 11, seed=3)
    up = torch.randn(13, generator=g, dtype=torch.float64)
    logp, ent = chunked_logprobs_entropy(hidden, weight, targets, chunk_size=5, with_entropy=False)
    assert ent is None
    gh, gw = torch.autograd.grad((logp * up).sum(), (hidden, weight))
    ref = _grads(naive_logprobs_entropy, hidden, weight, targets, up, None)
    torch.testing.assert_close(logp.detach(), ref[0], rtol=1e-12, atol=1e-12)
    torch.testing.assert_close(gh, ref[2], rtol=1e-10, atol=1e-10)
    torch.testing.assert_close(gw, ref[3], rtol=1e-10, atol=1e-10)


def test_batched_leading_dims_and_frozen_head():
    hidden, weight, targets, g = _inputs(6, 4, 9, seed=4, lead=(3,))
    logp, ent = chunked_logprobs_entropy(hidden, weight.detach(), targets, chunk_size=4)
    assert logp.shape == ent.shape == (3, 6)
    (gh,) = torch.autograd.grad(logp.sum() + ent.sum(), hidden)
    ref_lp, ref_ent = naive_logprobs_entropy(hidden, weight.detach(), targets)
    (ref_gh,) = torch.autograd.grad(ref_lp.sum() + ref_ent.sum(), hidden)
    torch.testing.assert_close(gh, ref_gh, rtol=1e-10, atol=1e-10)


def test_saves_no_tensor_of_size_t_times_v():
    t, h, v, chunk = 64, 8, 500, 8
    hidden, weight, targets, _ = _inputs(t, h, v, seed=5, dtype=torch.float32)
    saved: list[int] = []

    def pack(x):
        saved.append(x.numel())
        return x

    with torch.autograd.graph.saved_tensors_hooks(pack, lambda x: x):
        logp, ent = chunked_logprobs_entropy(hidden, weight, targets, chunk_size=chunk)
    assert saved and max(saved) == v * h  # the weight itself is the largest thing kept; no logits
    with torch.autograd.graph.saved_tensors_hooks(pack, lambda x: x):
        saved.clear()
        naive_logprobs_entropy(hidden, weight, targets)
    assert max(saved) >= t * v  # the naive path keeps the full logits for backward


def test_bf16_is_upcast_and_close_to_float32():
    hidden, weight, targets, _ = _inputs(32, 16, 100, seed=6, dtype=torch.float32)
    ref_lp, ref_ent = naive_logprobs_entropy(hidden.detach(), weight.detach(), targets)
    lp, ent = chunked_logprobs_entropy(hidden.detach().bfloat16(), weight.detach().bfloat16(), targets, 8)
    assert lp.dtype == torch.float32 and ent.dtype == torch.float32
    torch.testing.assert_close(lp, ref_lp, rtol=0.05, atol=0.1)
    torch.testing.assert_close(ent, ref_ent, rtol=0.05, atol=0.1)
    hb, wb = hidden.detach().bfloat16().requires_grad_(), weight.detach().bfloat16().requires_grad_()
    lp, _ = chunked_logprobs_entropy(hb, wb, targets, 8, with_entropy=False)
    lp.sum().backward()
    assert hb.grad.dtype == torch.bfloat16 and wb.grad.dtype == torch.bfloat16


def test_bad_arguments():
    hidden, weight, targets, _ = _inputs(4, 2, 5, seed=7)
    with pytest.raises(ValueError, match="chunk_size"):
        chunked_logprobs_entropy(hidden, weight, targets, chunk_size=0)
    with pytest.raises(ValueError, match="temperature"):
        chunked_logprobs_entropy(hidden, weight, targets, temperature=0.0)
    with pytest.raises(ValueError, match="disagree"):
        chunked_logprobs_entropy(hidden, weight, targets[:3])


# ------------------------------------------------------------------------------------ precision in float32
def _entropy_errors(z64: torch.Tensor) -> tuple[float, float, float, float]:
    """Largest |entropy error| against float64 of the chunked and the naive head, both in float32, on logits
    `z64` [T, V] (an identity head turns hidden states into exactly these logits); and their relative errors."""
    t, v = z64.shape
    eye = torch.eye(v, dtype=torch.float64)
    targets = torch.zeros(t, dtype=torch.long)
    _, exact = naive_logprobs_entropy(z64, eye, targets)
    _, ours = chunked_logprobs_entropy(z64.float(), eye.float(), targets, chunk_size=8)
    _, naive = naive_logprobs_entropy(z64.float(), eye.float(), targets)
    err_ours, err_naive = (ours.double() - exact).abs(), (naive.double() - exact).abs()
    return (
        float(err_ours.max()),
        float(err_naive.max()),
        float((err_ours / exact).max()),
        float((err_naive / exact).max()),
    )


def test_entropy_in_float32_is_as_accurate_as_the_naive_head_at_large_logits():
    """Logits around 19 (the textbook lse - sum(p z) loses ~1e-5 there): within the naive head's error."""
    g = torch.Generator().manual_seed(0)
    z = torch.randn(32, 3000, generator=g, dtype=torch.float64) * 2 + 19
    ours, naive, _, _ = _entropy_errors(z)
    # the floor: one float32 rounding of the logits' scale (eps x max |z|, 3e-6 here), below which neither head can be
    # held to the other's error
    assert ours <= max(naive, torch.finfo(torch.float32).eps * float(z.abs().max())), (ours, naive)


def test_entropy_in_float32_keeps_its_relative_precision_when_the_policy_is_confident():
    """One logit ~19-24 above the rest: entropies of 1e-5..1e-3 nats, where Figs 2 and 4 look late in training."""
    g = torch.Generator().manual_seed(1)
    z = torch.randn(32, 3000, generator=g, dtype=torch.float64)
    z[:, 0] = 19 + 5 * torch.rand(32, generator=g, dtype=torch.float64)
    ours, naive, ours_rel, naive_rel = _entropy_errors(z)
    # relative to the entropy: 10 x eps x log V (the log-sum-exp's rounding, over 3,000 logits), 1e-5
    bound = 10 * torch.finfo(torch.float32).eps * math.log(z.shape[1])
    assert ours <= naive and ours_rel < bound, (ours, naive, ours_rel, naive_rel)


@pytest.mark.parametrize("with_entropy", [True, False])
@pytest.mark.parametrize("temperature", [1.0, 0.6])
def test_gradcheck_against_finite_differences(with_entropy, temperature):
    hidden, weight, targets, _ = _inputs(9, 3, 7, seed=8)

    def f(h, w):
        logp, ent = chunked_logprobs_entropy(h, w, targets, chunk_size=4, temperature=temperature, with_entropy=True)
        return (logp, ent) if with_entropy else logp

    assert torch.autograd.gradcheck(f, (hidden, weight), eps=1e-6, atol=1e-8)


_PEAK_SCRIPT = """
import json, re, sys, torch
from dapo.algos.logprobs import chunked_logprobs_entropy, naive_logprobs_entropy
method, t, v, h, chunk = sys.argv[1], *map(int, sys.argv[2:])
def status_kib(key):
    return int(re.search(rf"^{key}:\\s+(\\d+) kB", open("/proc/self/status").read(), re.M).group(1))
# a tiny call first, so that kernel and thread-pool set-up is not counted as the head's memory
for f in (chunked_logprobs_entropy, naive_logprobs_entropy):
    a, b = f(torch.randn(4, h, requires_grad=True), torch.randn(16, h, requires_grad=True), torch.zeros(4).long())
    (a.sum() + b.sum()).backward()
torch.manual_seed(0)
hidden = (torch.randn(t, h) * 0.5).requires_grad_()
weight = (torch.randn(v, h) / h**0.5).requires_grad_()
targets = torch.randint(0, v, (t,))
open("/proc/self/clear_refs", "w").write("5")  # reset the high-water mark (VmHWM) to the RSS now
base = status_kib("VmRSS")
if method == "naive":
    logp, ent = naive_logprobs_entropy(hidden, weight, targets)
else:
    logp, ent = chunked_logprobs_entropy(hidden, weight, targets, chunk_size=chunk)
(logp.sum() + 0.1 * ent.sum()).backward()
print(json.dumps((status_kib("VmHWM") - base) * 1024))
"""


def test_peak_memory_of_forward_and_backward_is_about_two_chunks_of_logits():
    """The head's memory target (BENCHMARKS.md section 2: at most 1/10 of the naive head's at 4096 tokens and the
    default chunk 256) in miniature, tokens / chunk = 16 as there: two [chunk, V] buffers put the chunked head
    near 1/30 of naive's; the seven temporaries of a backward without in-place ops would be near 1/10. Each side
    runs in a fresh process and reads its RSS high-water mark (reset once the inputs exist); glibc's malloc is
    told to return every buffer of 1 MiB or more to the system when freed, so the mark counts live memory, not
    the allocator's cache."""
    import json
    import os
    import subprocess
    import sys

    def peak(method: str) -> int:
        out = subprocess.run(
            [sys.executable, "-c", _PEAK_SCRIPT, method, "1024", "32768", "32", "64"],
            capture_output=True,
            text=True,
            check=True,
            timeout=600,
            env=dict(os.environ, MALLOC_MMAP_THRESHOLD_=str(2**20), OMP_NUM_THREADS="1"),
        )
        return json.loads(out.stdout.strip().splitlines()[-1])

    chunked, naive = peak("chunked"), peak("naive")
    assert naive > 300 * 2**20  # [1024, 32768] float32 logits and their softmax: the naive head holds several
    assert chunked <= naive / 20, (chunked / 2**20, naive / 2**20)
