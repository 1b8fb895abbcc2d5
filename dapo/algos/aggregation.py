"""Loss aggregation with a global normaliser (token-level loss, Table 1 row 4): docs/algorithm.md section 3.

Modes (l = per-token loss, m = loss mask, |o_i| = sum_t m_{i,t}, sums over the whole mini-batch):

- `seq-mean-token-mean` (GRPO):  1/S * sum_i 1/|o_i| * sum_t m l              S = responses with |o_i| > 0
- `token-mean` (verl/TRL code):  1/K * sum_{i,t} m l                           K = sum_i |o_i|
- `group-token-mean` (Eq. 12):   1/P * sum_p 1/K_p * sum_{i in p, t} m l       K_p = tokens of prompt p's
                                                                               responses, P = prompts with K_p > 0
- `seq-mean-token-sum` (Dr. GRPO): 1/S * sum_i 1/C * sum_t m l                 C a constant (e.g. max length)

Each mode is a per-response scale times the mask, so the loss is `(loss * token_weights).sum()`. Summing that over
micro-batches gives the mini-batch loss exactly (value and gradient) as long as the weights use the mini-batch's
counts. How a caller does it:

    counts = local_counts(mask, group_ids)                 # rank-local mini-batch; all-reduce (sum) each value
    w = token_weights(mask, mode, group_ids, **global_counts, seq_sum_constant=C)   # whole rank-local mini-batch
    for rows in micro_batches: (loss_mb * w[rows]).sum().backward()    # with a data-parallel *sum* of gradients

Responses whose mask is all zero (overlong filtering) count nowhere. Group token counts K_p come from the
rank-local mini-batch, so groups may be split across micro-batches but never across ranks (the trainer shards
by prompt). Data-parallel engines that *average* gradients over W ranks need the loss multiplied by W.
"""

from __future__ import annotations

from typing import Literal

import torch
from torch import Tensor

LossAggMode = Literal["seq-mean-token-mean", "token-mean", "group-token-mean", "seq-mean-token-sum"]
MODES: tuple[str, ...] = ("seq-mean-token-mean", "token-mean", "group-token-mean", "seq-mean-token-sum")


def local_counts(mask: Tensor, group_ids: Tensor | None = None) -> dict[str, int]:
    """Counts of the rank-local mini-batch that a caller sums across ranks.

    Args:
        mask: [N, T] loss mask (bool or 0/1), whole rank-local mini-batch.
        group_ids: [N] int, the prompt each response belongs to (needed for `num_groups`).

    Returns:
        {"num_tokens": loss tokens, "num_seqs": responses with >= 1 loss token,
         "num_groups": prompts with >= 1 loss token (0 without group_ids)}.
    """
    lengths = mask.to(torch.float64).sum(dim=-1)
    alive = lengths > 0
    num_groups = 0 if group_ids is None else int(torch.unique(group_ids[alive]).numel())
    return {"num_tokens": int(lengths.sum().item()), "num_seqs": int(alive.sum().item()), "num_groups": num_groups}


def sequence_scales(
    lengths: Tensor,
    mode: LossAggMode,
    group_ids: Tensor | None = None,
    *,
    num_tokens: float,
    num_seqs: float,
    num_groups: float = 0,
    seq_sum_constant: float | None = None,
) -> Tensor:
    """Per-response scale s_i such that token (i, t) weighs m_{i,t} * s_i.

    Args:
        lengths: [N] loss tokens per response |o_i| over the whole rank-local mini-batch.
        mode: one of MODES.
        group_ids: [N] int prompt index per response (required for `group-token-mean`).
        num_tokens, num_seqs, num_groups: the global counts (`local_counts` summed over ranks).
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
        if group_ids is None:
            raise ValueError("group-token-mean needs group_ids (the prompt index of each response)")
        _, inverse = torch.unique(group_ids, return_inverse=True)
        group_tokens = torch.zeros(
            int(inverse.max().item()) + 1 if inverse.numel() else 0, dtype=torch.float64, device=lengths.device
        )
        group_tokens.index_add_(0, inverse, lengths)
        scale = 1.0 / (group_tokens[inverse].clamp(min=1.0) * max(num_groups, 1))
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
    num_groups: float = 0,
    seq_sum_constant: float | None = None,
    dtype: torch.dtype = torch.float32,
) -> Tensor:
    """[N, T] weights for the whole rank-local mini-batch: the loss is `(loss * weights).sum()`.

    Args and counts as in `sequence_scales`; `mask` [N, T] is the loss mask (after overlong filtering).
    The weights carry no gradient; slice their rows per micro-batch.
    """
    scales = sequence_scales(
        mask.to(torch.float64).sum(dim=-1),
        mode,
        group_ids,
        num_tokens=num_tokens,
        num_seqs=num_seqs,
        num_groups=num_groups,
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
    num_tokens: float | None = None,
    num_seqs: float | None = None,
    num_groups: float | None = None,
    seq_sum_constant: float | None = None,
) -> Tensor:
    """Scalar loss of a batch [N, T]. Counts left None are taken from this batch (the whole mini-batch case).

    For micro-batches use `token_weights` on the whole mini-batch: `group-token-mean` needs the mini-batch's
    per-group token counts, which a micro-batch alone does not have.
    """
    local = local_counts(mask, group_ids)
    w = token_weights(
        mask,
        mode,
        group_ids,
        num_tokens=local["num_tokens"] if num_tokens is None else num_tokens,
        num_seqs=local["num_seqs"] if num_seqs is None else num_seqs,
        num_groups=local["num_groups"] if num_groups is None else num_groups,
        seq_sum_constant=seq_sum_constant,
        dtype=loss.dtype,
    )
    return weighted_sum(loss, w)
