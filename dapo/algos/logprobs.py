"""Per-token log-probs and entropy from final hidden states and the output head, in chunks (docs/algorithm.md
section 10; its memory: BENCHMARKS.md section 2).

    z = (h @ W^T) / temperature          logp_t = z_t[y_t] - logsumexp(z_t)       H_t = -sum_v p_tv log p_tv
    dlogp_t/dz_tv = 1[v = y_t] - p_tv          dH_t/dz_tv = -p_tv (log p_tv + H_t)

No [T, V] logits tensor is held (20480 x 152064 fp32 = 12 GiB, which autograd would keep): forward keeps only the
per-token logsumexp and entropy, and backward recomputes each chunk's logits and overwrites them with their gradient
in place, so about two [chunk, V] float32 buffers are alive at once. The entropy is computed from logits shifted by
their row maximum m (every shifted logit s <= 0): with S = 1 + rest, rest = sum of exp(s_v) over every other
position, H = log1p(rest) - sum_v exp(s_v) s_v / S, a sum of two non-negative terms, so a confident row keeps
float32's relative accuracy (the textbook logsumexp(z) - sum(p z) loses the largest logit's rounding). Half-precision
logits are upcast to float32 before the softmax. Models that change the logits after the head are refused at load
(`dapo.learner.model.check_plain_logits`).
"""

from __future__ import annotations

from typing import Any

import torch
import torch.nn.functional as F
from torch import Tensor


def _compute_dtype(dtype: torch.dtype) -> torch.dtype:
    return torch.float32 if dtype in (torch.float16, torch.bfloat16) else dtype


def _chunk_logits(h: Tensor, weight: Tensor, cdt: torch.dtype, temperature: float) -> Tensor:
    """[c, V] logits / temperature in the compute dtype, as a fresh tensor the caller may overwrite."""
    z = h @ weight.t()
    z = z.to(cdt) if z.dtype != cdt else z
    if temperature != 1.0:
        z.div_(temperature)
    return z


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
        # log p = z - rowmax - log_sumexp, in that order (as log_softmax does): adding the two first would round
        # the sum to the largest logit's precision.
        rowmax = torch.empty(n, dtype=cdt, device=hidden.device)
        log_sumexp = torch.empty(n, dtype=cdt, device=hidden.device)
        entropy = torch.empty(n if with_entropy else 0, dtype=cdt, device=hidden.device)
        for s in range(0, n, chunk_size):
            e = min(s + chunk_size, n)
            z = _chunk_logits(hidden[s:e], weight, cdt, temperature)
            m, top = z.max(dim=-1, keepdim=True)
            z.sub_(m)  # shifted logits s, all <= 0; s = 0 at `top`
            z_target = z.gather(-1, targets[s:e].unsqueeze(-1)).squeeze(-1)
            # S = 1 + rest, where rest sums exp(s) over every position but `top`: log S = log1p(rest) keeps the
            # relative precision of a small `rest` (a confident row), which 1 + rest would round away.
            if with_entropy:
                p = z.exp().scatter_(-1, top, 0.0)  # exp(s) except at `top`: the second [c, V] buffer
                rest = p.sum(dim=-1)
                log_sumexp[s:e] = torch.log1p(rest)
                # sum_v exp(s_v) s_v / S: `top` adds exp(0) * 0 = 0, so leaving it out of p changes nothing. In
                # place and summed by torch.sum, which accumulates as accurately as the naive head's sum (a bmm
                # row dot product needs no buffer either but was ~5x less accurate in float32 at V = 5000).
                entropy[s:e] = log_sumexp[s:e] - p.mul_(z).sum(dim=-1) / (1.0 + rest)
                del p
            else:
                log_sumexp[s:e] = torch.log1p(z.exp_().scatter_(-1, top, 0.0).sum(dim=-1))
            logp[s:e] = z_target - log_sumexp[s:e]
            rowmax[s:e] = m.squeeze(-1)
            del z
        ctx.save_for_backward(hidden, weight, targets, rowmax, log_sumexp, entropy)
        ctx.chunk_size, ctx.temperature, ctx.with_entropy = chunk_size, temperature, with_entropy
        ctx.set_materialize_grads(False)
        if not with_entropy:
            ctx.mark_non_differentiable(entropy)
        return logp, entropy

    @staticmethod
    def backward(ctx: Any, grad_logp: Tensor | None, grad_entropy: Tensor | None) -> tuple:
        hidden, weight, targets, rowmax, log_sumexp, entropy = ctx.saved_tensors
        need_h, need_w = ctx.needs_input_grad[0], ctx.needs_input_grad[1]
        if not ctx.with_entropy:
            grad_entropy = None
        if (grad_logp is None and grad_entropy is None) or not (need_h or need_w):
            return None, None, None, None, None, None
        cdt = _compute_dtype(hidden.dtype)
        n, c, temperature = hidden.shape[0], ctx.chunk_size, ctx.temperature
        g_lp = grad_logp.to(cdt) if grad_logp is not None else None
        g_h = grad_entropy.to(cdt) if grad_entropy is not None else None
        grad_h = torch.empty_like(hidden) if need_h else None
        # Accumulate the head's gradient at least in float32 across chunks (bf16 sums lose the small terms).
        grad_w = torch.zeros(weight.shape, dtype=cdt, device=weight.device) if need_w else None
        for s in range(0, n, c):
            e = min(s + c, n)
            h = hidden[s:e]
            gz = _chunk_logits(h, weight, cdt, temperature)
            gz.sub_(rowmax[s:e].unsqueeze(-1)).sub_(log_sumexp[s:e].unsqueeze(-1))  # log p
            if g_h is not None:
                p = gz.exp()  # the second [c, V] buffer
                # dH/dz = -p (log p + H), times the incoming entropy gradient
                gz.add_(entropy[s:e].unsqueeze(-1)).mul_(p).mul_(-g_h[s:e].unsqueeze(-1))
                if g_lp is not None:
                    gz.addcmul_(p, g_lp[s:e].unsqueeze(-1), value=-1.0)  # dlogp/dz = -p (+ one-hot below)
                del p
            else:
                gz.exp_().mul_(-g_lp[s:e].unsqueeze(-1))  # -p * g, in the one buffer
            if g_lp is not None:
                gz.scatter_add_(-1, targets[s:e].unsqueeze(-1), g_lp[s:e].unsqueeze(-1))
            if temperature != 1.0:
                gz.div_(temperature)
            gz_in = gz if gz.dtype == hidden.dtype else gz.to(hidden.dtype)
            if need_h:
                grad_h[s:e] = gz_in @ weight
            if need_w:
                if gz_in.dtype == cdt:
                    grad_w.addmm_(gz_in.t(), h)
                else:
                    grad_w.add_(gz_in.t() @ h)
            del gz, gz_in
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
        chunk_size: positions per chunk; peak extra memory is about 2 x chunk_size x V floats (forward with
            entropy, and backward).
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
