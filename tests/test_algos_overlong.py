"""Overlong filtering mask and the soft overlong punishment (Eq. 13)."""

from __future__ import annotations

import pytest
import torch

from dapo.algos.aggregation import group_token_counts, local_counts
from dapo.algos.overlong import overlong_loss_mask, soft_overlong_penalty


def test_filter_zeroes_truncated_rows_only():
    mask = torch.tensor([[1.0, 1.0, 0.0], [1.0, 1.0, 1.0], [1.0, 0.0, 0.0]])
    out = overlong_loss_mask(mask, torch.tensor([False, True, False]))
    torch.testing.assert_close(out, torch.tensor([[1.0, 1.0, 0.0], [0.0, 0.0, 0.0], [1.0, 0.0, 0.0]]))
    assert local_counts(out) == {"num_tokens": 3, "num_seqs": 2}
    assert group_token_counts(out, torch.tensor([0, 0, 1])).tolist() == [2.0, 1.0]
    bool_out = overlong_loss_mask(mask.bool(), torch.tensor([True, False, False]))
    assert bool_out.dtype == torch.bool and bool_out.sum().item() == 4
    with pytest.raises(ValueError, match=r"\[N\]"):
        overlong_loss_mask(mask, torch.tensor([True]))


def test_eq13_small_numbers():
    # L_max 20, L_cache 4: no penalty up to 16, linear to -1 at 20, -1 beyond.
    lengths = torch.tensor([0, 10, 16, 17, 18, 19, 20, 21, 100])
    pen = soft_overlong_penalty(lengths, max_len=20, buffer_len=4)
    torch.testing.assert_close(pen, torch.tensor([0, 0, 0, -0.25, -0.5, -0.75, -1.0, -1.0, -1.0]))
    torch.testing.assert_close(soft_overlong_penalty(lengths, 20, 4, factor=0.5), pen * 0.5)


def test_eq13_paper_setting():
    # L_max 20480, L_cache 4096: expected length 16384.
    pen = soft_overlong_penalty(torch.tensor([16384, 16385, 18432, 20480]), 20480, 4096, dtype=torch.float64)
    torch.testing.assert_close(pen, torch.tensor([0.0, -1 / 4096, -0.5, -1.0], dtype=torch.float64))


def test_bad_band_is_an_error():
    with pytest.raises(ValueError, match="L_cache"):
        soft_overlong_penalty(torch.tensor([1]), max_len=10, buffer_len=11)
    with pytest.raises(ValueError, match="L_cache"):
        soft_overlong_penalty(torch.tensor([1]), max_len=10, buffer_len=0)
