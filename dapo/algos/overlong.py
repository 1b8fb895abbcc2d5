"""Overlong handling: the loss mask of overlong filtering (row 1) and the soft overlong punishment (row 3, Eq. 13).

Soft overlong punishment, with L_max the hard cap and L_cache the penalty band (paper Eq. 13):

    R_length(y) = 0                                    if |y| <= L_max - L_cache
                = ((L_max - L_cache) - |y|) / L_cache  if L_max - L_cache < |y| <= L_max
                = -1                                   if |y| > L_max

The released recipe multiplies it by a penalty factor (1.0) and adds it to the +1/-1 correctness reward.
"""

from __future__ import annotations

import torch
from torch import Tensor


def overlong_loss_mask(response_mask: Tensor, truncated: Tensor) -> Tensor:
    """Zero the loss mask of truncated responses (finish reason "length").

    Args:
        response_mask: [N, T] (bool or float) 1 on response tokens.
        truncated: [N] bool, True for responses that hit the generation cap.

    Returns:
        [N, T] mask of the same dtype; truncated rows are all 0, so `aggregation` leaves them out of every count.
        Their rewards are untouched and still enter their group's mean and std.
    """
    if truncated.shape != response_mask.shape[:1]:
        raise ValueError(f"truncated {tuple(truncated.shape)} must be [N] for a mask of {tuple(response_mask.shape)}")
    keep = ~truncated.to(torch.bool).unsqueeze(-1)
    return response_mask * keep if response_mask.dtype != torch.bool else response_mask & keep


def soft_overlong_penalty(
    lengths: Tensor, max_len: int, buffer_len: int, factor: float = 1.0, dtype: torch.dtype = torch.float32
) -> Tensor:
    """R_length of Eq. 13 times `factor`.

    Args:
        lengths: [N] response lengths |y| in tokens.
        max_len: L_max, the hard cap (the generation limit).
        buffer_len: L_cache, the band before L_max where the penalty grows linearly from 0 to -1.
        factor: scales the penalty (released recipe: 1.0).

    Returns:
        [N] penalties in [-factor, 0], to add to the correctness reward.
    """
    if not 0 < buffer_len <= max_len:
        raise ValueError(f"need 0 < buffer_len (L_cache={buffer_len}) <= max_len (L_max={max_len})")
    y = lengths.to(torch.float64)
    expected = float(max_len - buffer_len)
    band = (expected - y) / buffer_len
    pen = torch.where(y <= expected, torch.zeros_like(y), torch.where(y <= max_len, band, torch.full_like(y, -1.0)))
    return (pen * factor).to(dtype)
