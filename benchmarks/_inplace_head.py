"""A lower-memory variant of `dapo.algos.logprobs.chunked_logprobs_entropy`, for the benchmark only: the same maths,
with the backward pass's per-chunk temporaries folded into two [chunk, V] buffers by in-place ops (the shipped
version allocates about seven). It shows what the fix in dapo/algos/logprobs.py would buy; `check()` compares its
gradients with the naive head's.
"""

from __future__ import annotations

from typing import Any

import torch
from torch import Tensor


def _cdt(t: Tensor) -> torch.dtype:
    return torch.float64 if t.dtype == torch.float64 else torch.float32


class _InplaceChunked(torch.autograd.Function):
    @staticmethod
    def forward(ctx: Any, hidden: Tensor, weight: Tensor, targets: Tensor, chunk: int) -> tuple[Tensor, Tensor]:
        n = hidden.shape[0]
        cdt = _cdt(hidden)
        logp, lse, ent = (torch.empty(n, dtype=cdt) for _ in range(3))
        for s in range(0, n, chunk):
            e = min(s + chunk, n)
            z = (hidden[s:e] @ weight.t()).to(cdt)
            m = z.amax(-1, keepdim=True)
            z.sub_(m)  # shifted logits (logsumexp would allocate ~3 copies)
            p = z.exp()  # the only [c, V] temporary
            sumexp = p.sum(-1)
            lse_shifted = sumexp.log()
            logp[s:e] = z.gather(-1, targets[s:e, None]).squeeze(-1) - lse_shifted
            # H = log S - sum(p z) / S; row dot products by bmm (vecdot and p * z allocate a [c, V] product)
            ent[s:e] = lse_shifted - torch.bmm(p[:, None, :], z[:, :, None]).view(-1) / sumexp
            lse[s:e] = lse_shifted + m.squeeze(-1)
            del p
        ctx.save_for_backward(hidden, weight, targets, lse, ent)
        ctx.chunk = chunk
        return logp, ent

    @staticmethod
    def backward(ctx: Any, g_logp: Tensor, g_ent: Tensor) -> tuple:
        hidden, weight, targets, lse, ent = ctx.saved_tensors
        n, c, cdt = hidden.shape[0], ctx.chunk, _cdt(hidden)
        g_logp, g_ent = g_logp.to(cdt), g_ent.to(cdt)
        grad_h, grad_w = torch.empty_like(hidden), torch.zeros_like(weight)
        for s in range(0, n, c):
            e = min(s + c, n)
            z = (hidden[s:e] @ weight.t()).to(cdt)
            z.sub_(lse[s:e, None])  # log p
            p = z.exp()  # the second [c, V] buffer
            # dH/dz = -p (log p + H);  dlogp_y/dz = 1[v = y] - p
            z.add_(ent[s:e, None]).mul_(p).mul_(-g_ent[s:e, None])
            z.addcmul_(p, g_logp[s:e, None], value=-1.0)
            del p
            z.scatter_add_(-1, targets[s:e, None], g_logp[s:e, None])
            grad_h[s:e] = z @ weight
            grad_w.addmm_(z.t(), hidden[s:e])
        return grad_h, grad_w, None, None


def inplace_chunked(hidden: Tensor, weight: Tensor, targets: Tensor, chunk: int = 1024) -> tuple[Tensor, Tensor]:
    """(logp [T], entropy [T]) for float32 hidden [T, H], weight [V, H], targets [T]; temperature 1."""
    return _InplaceChunked.apply(hidden, weight, targets, chunk)


def check() -> float:
    """Largest gradient difference against the naive head (float64, small sizes)."""
    from dapo.algos.logprobs import naive_logprobs_entropy

    torch.manual_seed(0)
    h = torch.randn(37, 16, dtype=torch.float64, requires_grad=True)
    w = torch.randn(50, 16, dtype=torch.float64, requires_grad=True)
    y = torch.randint(0, 50, (37,))
    gl, ge = torch.randn(37, dtype=torch.float64), torch.randn(37, dtype=torch.float64)
    grads = []
    for f in (lambda: naive_logprobs_entropy(h, w, y), lambda: inplace_chunked(h, w, y, chunk=8)):
        lp, en = f()
        dh, dw = torch.autograd.grad((lp * gl).sum() + (en * ge).sum(), (h, w))
        grads.append((lp.detach(), en.detach(), dh, dw))
    return max(float((a - b).abs().max()) for a, b in zip(*grads, strict=True))


if __name__ == "__main__":
    print(f"max |difference| against naive (float64): {check():.2e}")
