"""Loss aggregation: hand-computed modes, masked-out responses, and exactness under micro-batch / rank splits
(groups cut across ranks included)."""

from __future__ import annotations

import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st

from dapo.algos.aggregation import MODES, aggregate, group_token_counts, local_counts, token_weights, weighted_sum

# Three responses (groups 0, 0, 1) with 4, 2 and 1 loss tokens; a fourth (group 1) and a fifth (group 2) are
# overlong-filtered (all mask 0) and carry a huge loss that must not leak into any value or count.
LOSS = torch.tensor(
    [[1.0, 2, 3, 4], [10, 20, 0, 0], [6, 0, 0, 0], [1e6, 1e6, 1e6, 1e6], [-1e6, 0, 0, 0]], dtype=torch.float64
)
MASK = torch.tensor([[1, 1, 1, 1], [1, 1, 0, 0], [1, 0, 0, 0], [0, 0, 0, 0], [0, 0, 0, 0]], dtype=torch.float64)
GROUPS = torch.tensor([0, 0, 1, 1, 2])

EXPECTED = {
    "token-mean": 46 / 7,  # (10 + 30 + 6) / 7 tokens
    "seq-mean-token-mean": (10 / 4 + 30 / 2 + 6 / 1) / 3,  # mean over the 3 live responses
    "group-token-mean": ((10 + 30) / 6 + 6 / 1) / 2,  # Eq. 12: per prompt, then mean over 2 live prompts
    "seq-mean-token-sum": (10 + 30 + 6) / 4 / 3,  # constant C = 4
}


@pytest.mark.parametrize("mode", MODES)
def test_hand_computed_and_filtered_rows_count_nowhere(mode):
    value = aggregate(LOSS, MASK, mode, GROUPS, seq_sum_constant=4)
    assert value.item() == pytest.approx(EXPECTED[mode], rel=1e-12)
    # Without the filtered rows: the same value.
    assert aggregate(LOSS[:3], MASK[:3], mode, GROUPS[:3], seq_sum_constant=4).item() == pytest.approx(value.item())


def test_local_counts_skip_masked_out_responses_and_groups():
    assert local_counts(MASK) == {"num_tokens": 7, "num_seqs": 3}
    assert local_counts(MASK.bool()) == {"num_tokens": 7, "num_seqs": 3}
    # Groups 0, 1, 2 have 6, 1 and 0 loss tokens; a longer vector (the ids of other ranks) is zero beyond.
    assert group_token_counts(MASK, GROUPS).tolist() == [6.0, 1.0, 0.0]
    assert group_token_counts(MASK, GROUPS, num_slots=5).tolist() == [6.0, 1.0, 0.0, 0.0, 0.0]
    with pytest.raises(ValueError, match="num_slots"):
        group_token_counts(MASK, GROUPS, num_slots=2)


def test_group_token_mean_uses_mini_batch_group_counts():
    # Group 0 split across two micro-batches: each row's weight is 1 / (6 tokens * 2 groups), not per micro-batch.
    w = token_weights(
        MASK,
        "group-token-mean",
        GROUPS,
        num_tokens=7,
        num_seqs=3,
        group_tokens=group_token_counts(MASK, GROUPS),
        dtype=torch.float64,
    )
    torch.testing.assert_close(w[0], torch.full((4,), 1 / 12, dtype=torch.float64))
    torch.testing.assert_close(w[1], torch.tensor([1 / 12, 1 / 12, 0, 0], dtype=torch.float64))
    torch.testing.assert_close(w[2], torch.tensor([1 / 2, 0, 0, 0], dtype=torch.float64))
    assert torch.all(w[3:] == 0)
    # Row 1 alone (group 0 cut across ranks): its weight still uses the group's 6 tokens, not its own 2.
    alone = token_weights(
        MASK[1:2],
        "group-token-mean",
        GROUPS[1:2],
        num_tokens=7,
        num_seqs=3,
        group_tokens=group_token_counts(MASK, GROUPS),
        dtype=torch.float64,
    )
    torch.testing.assert_close(alone[0], w[1])


def test_equal_lengths_token_mean_equals_seq_mean():
    g = torch.Generator().manual_seed(0)
    loss = torch.randn(6, 5, generator=g, dtype=torch.float64)
    mask = torch.ones(6, 5, dtype=torch.float64)
    groups = torch.tensor([0, 0, 1, 1, 2, 2])
    values = {m: aggregate(loss, mask, m, groups, seq_sum_constant=5).item() for m in MODES}
    assert values["token-mean"] == pytest.approx(values["seq-mean-token-mean"], rel=1e-12)
    assert values["token-mean"] == pytest.approx(values["group-token-mean"], rel=1e-12)  # equal group sizes too
    assert values["token-mean"] == pytest.approx(values["seq-mean-token-sum"], rel=1e-12)  # C = the length


def test_token_mean_weighs_long_responses_more():
    # One long wrong response (loss 1 per token, 8 tokens) and one short (loss -1, 2 tokens).
    loss = torch.tensor([[1.0] * 8, [-1.0, -1.0] + [0.0] * 6], dtype=torch.float64)  # float64: 1e-16 rounding
    mask = torch.tensor([[1.0] * 8, [1.0, 1.0] + [0.0] * 6], dtype=torch.float64)
    assert aggregate(loss, mask, "seq-mean-token-mean").item() == pytest.approx(0.0, abs=1e-15)
    assert aggregate(loss, mask, "token-mean").item() == pytest.approx(6 / 10)


def test_empty_batch_and_padding_nan_are_harmless():
    loss = torch.tensor([[float("nan"), 1.0]], requires_grad=True)
    mask = torch.tensor([[0.0, 1.0]])
    value = aggregate(loss, mask, "token-mean")
    value.backward()
    assert value.item() == 1.0 and loss.grad.tolist() == [[0.0, 1.0]]
    assert aggregate(torch.ones(2, 3), torch.zeros(2, 3), "seq-mean-token-mean").item() == 0.0


def test_errors_name_the_fix():
    with pytest.raises(ValueError, match="seq_sum_constant"):
        aggregate(LOSS, MASK, "seq-mean-token-sum")
    with pytest.raises(ValueError, match="group_ids"):
        aggregate(LOSS, MASK, "group-token-mean")
    with pytest.raises(ValueError, match="unknown loss aggregation"):
        aggregate(LOSS, MASK, "sum")


@pytest.mark.parametrize("mode", MODES)
def test_a_ranks_weights_come_from_the_mini_batch_counts_it_is_given(mode):
    """The pitfall of docs/algorithm.md section 8 (each part normalised by its own count, then averaged): weights
    built on one rank's part of the mini-batch (group 0 cut across two ranks), from the mini-batch's summed counts,
    are that part's rows of the whole mini-batch's weights, so the parts' weighted sums add up to the mini-batch
    loss."""
    parts = [[0], [1, 2], [3, 4]]  # three ranks
    glob = local_counts(MASK)
    # what the learner's all-reduce (sum) of each rank's per-group vector gives
    group_tokens = sum(group_token_counts(MASK[rows], GROUPS[rows], num_slots=3) for rows in parts)
    whole = token_weights(
        MASK, mode, GROUPS, **glob, group_tokens=group_tokens, seq_sum_constant=4, dtype=torch.float64
    )
    total = 0.0
    for rows in parts:
        w = token_weights(
            MASK[rows], mode, GROUPS[rows], **glob, group_tokens=group_tokens, seq_sum_constant=4, dtype=torch.float64
        )
        torch.testing.assert_close(w, whole[rows])
        total += weighted_sum(LOSS[rows], w).item()
    assert total == pytest.approx(EXPECTED[mode], rel=1e-12)


def _split_loss_and_grad(params, mask, groups, mode, rank_rows, micro_rows):
    """Sum of micro-batch losses over ranks with the global normaliser; gradient w.r.t. params."""
    per_rank = [local_counts(mask[r]) for r in rank_rows]
    glob = {k: sum(c[k] for c in per_rank) for k in per_rank[0]}  # what an all-reduce (sum) gives
    slots = int(groups.max()) + 1  # the all-reduced (max) length of the per-group vector
    group_tokens = sum(group_token_counts(mask[r], groups[r], slots) for r in rank_rows)
    total = torch.zeros((), dtype=torch.float64)
    for r, micro in zip(rank_rows, micro_rows, strict=True):
        w = token_weights(
            mask[r], mode, groups[r], **glob, group_tokens=group_tokens, seq_sum_constant=7.0, dtype=torch.float64
        )
        for mb in micro:
            rows = r[mb]
            loss_mb = torch.tanh(params[rows]) * (1 + rows[:, None])  # any per-token loss of the params
            total = total + weighted_sum(loss_mb, w[mb])
    (grad,) = torch.autograd.grad(total, params)
    return total, grad


@settings(max_examples=30, deadline=None)
@given(
    num_prompts=st.integers(1, 6),
    g=st.integers(1, 4),
    t=st.integers(1, 6),
    seed=st.integers(0, 2**31 - 1),
    n_ranks=st.integers(1, 3),
    mode=st.sampled_from(MODES),
    p_filter=st.floats(0.0, 0.6),
)
def test_split_over_micro_batches_and_ranks_is_exact(num_prompts, g, t, seed, n_ranks, mode, p_filter):
    gen = torch.Generator().manual_seed(seed)
    n = num_prompts * g
    groups = torch.arange(num_prompts).repeat_interleave(g)
    lengths = torch.randint(0, t + 1, (n,), generator=gen)
    lengths[torch.rand(n, generator=gen) < p_filter] = 0  # overlong-filtered responses
    mask = (torch.arange(t)[None, :] < lengths[:, None]).to(torch.float64)
    params = torch.randn(n, t, dtype=torch.float64, generator=gen, requires_grad=True)

    rows = torch.arange(n)
    whole_loss = torch.tanh(params) * (1 + rows[:, None])
    whole = aggregate(whole_loss, mask, mode, groups, seq_sum_constant=7.0)
    (whole_grad,) = torch.autograd.grad(whole, params)

    # Each response to a random rank (the learner splits by tokens, so groups are cut across ranks), and
    # micro-batches cut each rank's rows at random.
    rank_of = torch.randint(0, n_ranks, (n,), generator=gen)
    rank_rows = [rows[rank_of == k] for k in range(n_ranks)]
    rank_rows = [r[torch.randperm(len(r), generator=gen)] for r in rank_rows if len(r)]
    micro_rows = []
    for r in rank_rows:
        cuts = sorted(torch.randint(0, len(r) + 1, (2,), generator=gen).tolist())
        micro_rows.append([torch.arange(a, b) for a, b in zip([0, *cuts], [*cuts, len(r)], strict=True) if b > a])
    split, split_grad = _split_loss_and_grad(params, mask, groups, mode, rank_rows, micro_rows)
    # float64 end to end: sums reordered over at most 144 terms round by ~1e-14; 1e-6 catches a miscounted divisor
    torch.testing.assert_close(split, whole, rtol=1e-6, atol=1e-6)
    torch.testing.assert_close(split_grad, whole_grad, rtol=1e-6, atol=1e-6)
