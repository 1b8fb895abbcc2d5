"""Per-token log-probs and entropy from final hidden states and the output head, in chunks.

    z = (h @ W^T) / temperature          logp_t = z_t[y_t] - logsumexp(z_t)       H_t = -sum_v p_tv log p_tv

A [T, V] logits tensor for long responses and a 150K vocabulary is many GiB (20480 x 152064 fp32 = 12 GiB), and
autograd would keep it for backward. `chunked_logprobs_entropy` never holds more than `chunk_size x V` logits:
forward keeps only the per-token logsumexp and entropy, and backward recomputes each chunk's logits. The
gradient is the naive one (tests compare both in float64):

    dlogp_t/dz_tv = 1[v = y_t] - p_tv          dH_t/dz_tv = -p_tv (log p_tv + H_t)

Logits of half-precision inputs are upcast to float32 before the softmax, as the naive `logits.float()` does.
The sampling temperature divides the logits, so log-probs match what the rollout engine sampled from.
"""

from __future__ import annotations

from typing import Any

import torch
import torch.nn.functional as F
from torch import Tensor


def _compute_dtype(dtype: torch.dtype) -> torch.dtype:
    return torch.float32 if dtype in (torch.float16, torch.bfloat16) else dtype


class _ChunkedLogprobEntropy(torch.autograd.Function):
    @staticmethod
    def forward(
        ctx: Any,
        hidden: Tensor,
        weight: Tensor,
        targets: Tensor,
        chunk_size: int,
        temperature: float,
        with_entropy: bool,
    ) -> tuple[Tensor, Tensor]:
        cdt = _compute_dtype(hidden.dtype)
        n = hidden.shape[0]
        logp = torch.empty(n, dtype=cdt, device=hidden.device)
        lse = torch.empty(n, dtype=cdt, device=hidden.device)
        entropy = torch.empty(n if with_entropy else 0, dtype=cdt, device=hidden.device)
        for s in range(0, n, chunk_size):
            e = min(s + chunk_size, n)
            z = (hidden[s:e] @ weight.t()).to(cdt) / temperature
            lse[s:e] = torch.logsumexp(z, dim=-1)
            logp[s:e] = z.gather(-1, targets[s:e].unsqueeze(-1)).squeeze(-1) - lse[s:e]
            if with_entropy:
                p = torch.exp(z - lse[s:e].unsqueeze(-1))
                entropy[s:e] = lse[s:e] - (p * z).sum(dim=-1)
        ctx.save_for_backward(hidden, weight, targets, lse, entropy)
        ctx.chunk_size, ctx.temperature, ctx.with_entropy = chunk_size, temperature, with_entropy
        ctx.set_materialize_grads(False)
        if not with_entropy:
            ctx.mark_non_differentiable(entropy)
        return logp, entropy

    @staticmethod
    def backward(ctx: Any, grad_logp: Tensor | None, grad_entropy: Tensor | None) -> tuple:
        hidden, weight, targets, lse, entropy = ctx.saved_tensors
        need_h, need_w = ctx.needs_input_grad[0], ctx.needs_input_grad[1]
        if not ctx.with_entropy:
            grad_entropy = None
        if (grad_logp is None and grad_entropy is None) or not (need_h or need_w):
            return None, None, None, None, None, None
        cdt = _compute_dtype(hidden.dtype)
        n, c = hidden.shape[0], ctx.chunk_size
        grad_h = torch.empty_like(hidden) if need_h else None
        # Accumulate the head's gradient at least in float32 across chunks (bf16 sums lose the small terms).
        grad_w = torch.zeros(weight.shape, dtype=cdt, device=weight.device) if need_w else None
        for s in range(0, n, c):
            e = min(s + c, n)
            h = hidden[s:e]
            z = (h @ weight.t()).to(cdt) / ctx.temperature
            logp_all = z - lse[s:e].unsqueeze(-1)
            p = torch.exp(logp_all)
            gz = torch.zeros_like(z)
            if grad_logp is not None:
                g = grad_logp[s:e].to(cdt).unsqueeze(-1)
                gz -= p * g
                gz.scatter_add_(-1, targets[s:e].unsqueeze(-1), g)
            if grad_entropy is not None:
                g = grad_entropy[s:e].to(cdt).unsqueeze(-1)
                gz -= g * p * (logp_all + entropy[s:e].unsqueeze(-1))
            gz = (gz / ctx.temperature).to(hidden.dtype)
            if need_h:
                grad_h[s:e] = gz @ weight
            if need_w:
                grad_w += (gz.t() @ h).to(cdt)
        return grad_h, (grad_w.to(weight.dtype) if need_w else None), None, None, None, None


def chunked_logprobs_entropy(
    hidden: Tensor,
    weight: Tensor,
    targets: Tensor,
    chunk_size: int = 1024,
    temperature: float = 1.0,
    with_entropy: bool = True,
) -> tuple[Tensor, Tensor | None]:
    """Log-probs of `targets` (and the entropy of the full distribution) without materialising [T, V] logits.

    Args:
        hidden: [..., H] final hidden states (after the last norm), positions that predict `targets`.
        weight: [V, H] output head (lm_head or the tied embedding); no bias.
        targets: [...] int64 token ids in [0, V) (pad positions need a valid id; mask them in the loss).
        chunk_size: positions per chunk; peak extra memory is about 3 x chunk_size x V floats in backward.
        temperature: the sampling temperature; logits are divided by it.
        with_entropy: also return the per-position entropy (differentiable; the trainer logs it detached).

    Returns:
        (logp [...], entropy [...] or None), float32 for half-precision inputs, else the input dtype.
    """
    if chunk_size <= 0:
        raise ValueError(f"chunk_size must be > 0, got {chunk_size}")
    if temperature <= 0:
        raise ValueError(f"temperature must be > 0, got {temperature}")
    if hidden.shape[:-1] != targets.shape:
        raise ValueError(f"hidden {tuple(hidden.shape)} and targets {tuple(targets.shape)} disagree")
    lead = targets.shape
    logp, ent = _ChunkedLogprobEntropy.apply(
        hidden.reshape(-1, hidden.shape[-1]),
        weight,
        targets.reshape(-1).long(),
        chunk_size,
        float(temperature),
        with_entropy,
    )
    return logp.reshape(lead), (ent.reshape(lead) if with_entropy else None)


def naive_logprobs_entropy(
    hidden: Tensor, weight: Tensor, targets: Tensor, temperature: float = 1.0
) -> tuple[Tensor, Tensor]:
    """The reference: full logits, log_softmax, gather. Same shapes and dtypes as `chunked_logprobs_entropy`."""
    z = (hidden @ weight.t()).to(_compute_dtype(hidden.dtype)) / temperature
    logp_all = F.log_softmax(z, dim=-1)
    logp = logp_all.gather(-1, targets.long().unsqueeze(-1)).squeeze(-1)
    return logp, -(logp_all.exp() * logp_all).sum(dim=-1)
