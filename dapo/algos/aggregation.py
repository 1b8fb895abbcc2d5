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
    """The counts of the rank-local part of a mini-batch that a caller sums across ranks.

    Args:
        mask: [N, T] loss mask (bool or 0/1).

    Returns:
        {"num_tokens": loss tokens, "num_seqs": responses with >= 1 loss token}.
    """
    lengths = mask.to(torch.float64).sum(dim=-1)
    return {"num_tokens": int(lengths.sum().item()), "num_seqs": int((lengths > 0).sum().item())}


def group_token_counts(mask: Tensor, group_ids: Tensor, num_slots: int | None = None) -> Tensor:
    """Loss tokens per group id (K_p of the group-token-mean), a vector that a caller sums across ranks.

    Args:
        mask: [N, T] loss mask (bool or 0/1).
        group_ids: [N] int, the prompt (group) each response belongs to; ids index the result, so they must be
            small non-negative integers (the group's index in the rollout step).
        num_slots: the vector's length, the same on every rank (the largest id over all ranks, plus one);
            None: this batch's largest id plus one.

    Returns:
        [num_slots] float64; entry p is the number of loss tokens of group p's responses in `mask`.
    """
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
    """Per-response scale s_i such that token (i, t) weighs m_{i,t} * s_i.

    Args:
        lengths: [N] loss tokens per response |o_i|.
        mode: one of MODES.
        group_ids: [N] int prompt index per response (required for `group-token-mean`).
        num_tokens, num_seqs: the mini-batch's counts (`local_counts` summed over ranks).
        group_tokens: [num_slots] K_p of the whole mini-batch (`group_token_counts` summed over ranks); required
            for `group-token-mean`, whose P is the number of groups with K_p > 0.
        seq_sum_constant: the constant C of `seq-mean-token-sum`.

    Returns:
        [N] float64 scales; 0 for responses without loss tokens. All-zero when the global count is 0.
    """
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
    """[N, T] weights for the rank-local part of a mini-batch: the loss is `(loss * weights).sum()`.

    Args and counts as in `sequence_scales`; `mask` [N, T] is the loss mask (after overlong filtering).
    The weights carry no gradient; slice their rows per micro-batch.
    """
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
    """Scalar loss of a whole mini-batch [N, T], its counts taken from this batch (the reference definition).

    For a mini-batch split over micro-batches or ranks use `token_weights` with the summed counts.
    """
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
