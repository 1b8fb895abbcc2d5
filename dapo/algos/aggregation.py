"""Loss aggregation with a global normaliser (token-level loss, Table 1 row 4): docs/algorithm.md section 3.

Modes (l = per-token loss, m = loss mask, |o_i| = sum_t m_{i,t}, sums over the whole mini-batch):

- `seq-mean-token-mean` (GRPO):  1/S * sum_i 1/|o_i| * sum_t m l              S = responses with |o_i| > 0
- `token-mean` (verl/TRL code):  1/K * sum_{i,t} m l                           K = sum_i |o_i|
- `group-token-mean` (Eq. 12):   1/P * sum_p 1/K_p * sum_{i in p, t} m l       K_p = tokens of prompt p's
                                                                               responses, P = prompts with K_p > 0
- `seq-mean-token-sum` (Dr. GRPO): 1/S * sum_i 1/C * sum_t m l                 C a constant (e.g. max length)

Each mode is a per-response scale times the mask, so the loss is `(loss * token_weights).sum()`. Summing that over
micro-batches and ranks gives the mini-batch loss exactly (value and gradient) as long as the weights use the
mini-batch's counts, whatever the split. How a caller does it:

    counts = local_counts(mask)                            # rank-local part; all-reduce (sum) each value
    group_tokens = group_token_counts(mask, group_ids, n)  # group-token-mean only; all-reduce (sum) the vector
    w = token_weights(mask, mode, group_ids, **counts, group_tokens=group_tokens, seq_sum_constant=C)
    for rows in micro_batches: (loss_mb * w[rows]).sum().backward()    # with a data-parallel *sum* of gradients

Responses whose mask is all zero (overlong filtering) count nowhere. A response never straddles two ranks, so
|o_i| is always local; a group may (the learner splits mini-batches by tokens, not by prompt), which is why the
group-token-mean takes its K_p from the all-reduced `group_token_counts` rather than from the rank-local rows.
Data-parallel engines that *average* gradients over W ranks need the loss multiplied by W.
"""

from __future__ import annotations

import torch
from torch import Tensor

from dapo.types import LOSS_AGG_MODES, LossAggMode

MODES = LOSS_AGG_MODES


def local_counts(mask: Tensor) -> dict[str, int]:
    """{"num_tokens": loss tokens, "num_seqs": responses with >= 1 loss token} of a rank's [N, T] mask (bool or 0/1),
    for the caller to sum across ranks."""
    lengths = mask.to(torch.float64).sum(dim=-1)
    return {"num_tokens": int(lengths.sum().item()), "num_seqs": int((lengths > 0).sum().item())}


def group_token_counts(mask: Tensor, group_ids: Tensor, num_slots: int | None = None) -> Tensor:
    """[num_slots] float64: loss tokens of each group id's responses (K_p of the group-token-mean), for the caller to
    sum across ranks. `group_ids` [N]: small non-negative ints (the group's index in the step); `num_slots`: the same
    on every rank (the largest id over all ranks + 1; None: this batch's)."""
    ids = group_ids.to(torch.long)
    top = int(ids.max().item()) + 1 if ids.numel() else 0
    num_slots = top if num_slots is None else num_slots
    if ids.numel() and (int(ids.min().item()) < 0 or top > num_slots):
        raise ValueError(
            f"group_ids must lie in [0, {num_slots}) (pass num_slots = the largest id over all ranks + 1); "
            f"got ids from {int(ids.min().item())} to {top - 1}"
        )
    out = torch.zeros(num_slots, dtype=torch.float64, device=mask.device)
    return out.index_add_(0, ids.to(mask.device), mask.to(torch.float64).sum(dim=-1))


def sequence_scales(
    lengths: Tensor,
    mode: LossAggMode,
    group_ids: Tensor | None = None,
    *,
    num_tokens: float,
    num_seqs: float,
    group_tokens: Tensor | None = None,
    seq_sum_constant: float | None = None,
) -> Tensor:
    """[N] float64 per-response scales s_i (token (i, t) weighs m_{i,t} s_i; 0 without loss tokens) from `lengths`
    [N] = |o_i| and the mini-batch's counts summed over ranks (`local_counts`; for `group-token-mean` `group_ids` and
    `group_tokens`, whose P is the groups with K_p > 0; for `seq-mean-token-sum` C = `seq_sum_constant`)."""
    lengths = lengths.to(torch.float64)
    alive = lengths > 0
    if mode == "token-mean":
        scale = torch.full_like(lengths, 1.0 / max(num_tokens, 1))
    elif mode == "seq-mean-token-mean":
        scale = 1.0 / (lengths.clamp(min=1.0) * max(num_seqs, 1))
    elif mode == "seq-mean-token-sum":
        if seq_sum_constant is None or seq_sum_constant <= 0:
            raise ValueError(
                f"seq-mean-token-sum needs seq_sum_constant > 0 (e.g. the max response length), got {seq_sum_constant}"
            )
        scale = torch.full_like(lengths, 1.0 / (seq_sum_constant * max(num_seqs, 1)))
    elif mode == "group-token-mean":
        if group_ids is None or group_tokens is None:
            raise ValueError(
                "group-token-mean needs group_ids (the prompt index of each response) and group_tokens "
                "(group_token_counts of the whole mini-batch)"
            )
        group_tokens = group_tokens.to(device=lengths.device, dtype=torch.float64)
        num_groups = int((group_tokens > 0).sum().item())
        scale = 1.0 / (group_tokens[group_ids.to(torch.long)].clamp(min=1.0) * max(num_groups, 1))
    else:
        raise ValueError(f"unknown loss aggregation {mode!r}; choose one of {MODES}")
    return torch.where(alive, scale, torch.zeros_like(scale))


def token_weights(
    mask: Tensor,
    mode: LossAggMode,
    group_ids: Tensor | None = None,
    *,
    num_tokens: float,
    num_seqs: float,
    group_tokens: Tensor | None = None,
    seq_sum_constant: float | None = None,
    dtype: torch.dtype = torch.float32,
) -> Tensor:
    """[N, T] weights (no gradient) of a rank's part of a mini-batch, loss = `(loss * weights).sum()`; arguments as
    `sequence_scales`, `mask` after overlong filtering. Slice their rows per micro-batch."""
    scales = sequence_scales(
        mask.to(torch.float64).sum(dim=-1),
        mode,
        group_ids,
        num_tokens=num_tokens,
        num_seqs=num_seqs,
        group_tokens=group_tokens,
        seq_sum_constant=seq_sum_constant,
    )
    return (mask.to(torch.float64) * scales.unsqueeze(-1)).to(dtype)


def weighted_sum(loss: Tensor, weights: Tensor) -> Tensor:
    """sum(loss * weights) that ignores non-finite losses at weight-0 positions (padding), value and gradient."""
    w = weights.to(loss.dtype)
    return torch.where(w != 0, loss * w, torch.zeros_like(loss)).sum()


def aggregate(
    loss: Tensor,
    mask: Tensor,
    mode: LossAggMode,
    group_ids: Tensor | None = None,
    *,
    seq_sum_constant: float | None = None,
) -> Tensor:
    """Scalar loss of a whole mini-batch [N, T] with its own counts (the reference; split ones: `token_weights`)."""
    counts = local_counts(mask)
    group_tokens = None if group_ids is None else group_token_counts(mask, group_ids)
    w = token_weights(
        mask,
        mode,
        group_ids,
        **counts,
        group_tokens=group_tokens,
        seq_sum_constant=seq_sum_constant,
        dtype=loss.dtype,
    )
    return weighted_sum(loss, w)
