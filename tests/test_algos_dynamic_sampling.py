"""Dynamic sampling: the informative-group mask and the refill accumulator's edge cases."""

from __future__ import annotations

import pytest
import torch

from dapo.algos.dynamic_sampling import RefillAccumulator, RefillCapReached, keep_groups


def test_keep_groups_from_correctness():
    correct = torch.tensor([[True, True, True], [False, False, False], [True, False, False], [False, True, True]])
    assert keep_groups(correct).tolist() == [False, False, True, True]
    # Any values: kept iff not all equal (std > 0).
    assert keep_groups(torch.tensor([[1.0, 1.0], [0.0, 1.0]])).tolist() == [False, True]
    assert keep_groups(torch.tensor([[True]])).tolist() == [False]  # G = 1 is never informative


def test_exactly_full_in_one_batch():
    acc = RefillAccumulator(target_groups=3, max_gen_batches=10)
    assert acc.add(["a", "b", "c", "d"], [True, False, True, True], tokens_generated=40) is True
    kept, s = acc.result()
    assert kept == ["a", "c", "d"]
    assert (s.gen_batches, s.groups_kept, s.groups_dropped, s.tokens_generated) == (1, 3, 1, 40)
    assert s.full and not s.hit_cap and (s.groups_filtered, s.groups_surplus) == (1, 0)


def test_refill_then_surplus_dropped():
    acc = RefillAccumulator(target_groups=4, max_gen_batches=0)
    assert acc.add([0, 1, 2], torch.tensor([True, False, False]), 30) is False
    assert acc.add([3, 4, 5], [False, False, False], 25) is False
    assert acc.add([6, 7, 8, 9, 10], [True, True, False, True, True], 50) is True
    kept, s = acc.result()
    assert kept == [0, 6, 7, 9]  # first informative groups in order; 10 is surplus
    assert (s.gen_batches, s.groups_generated, s.groups_kept) == (3, 11, 4)
    assert (s.groups_filtered, s.groups_surplus, s.groups_dropped) == (6, 1, 7)
    assert s.tokens_generated == 105  # dropped groups' tokens included
    with pytest.raises(RuntimeError, match="done"):
        acc.add([11], [True], 1)


def test_cap_fail_raises_with_a_clear_message_and_state():
    acc = RefillAccumulator(target_groups=4, max_gen_batches=2, at_cap="fail")
    assert acc.add([0, 1], [True, False], 10) is False
    with pytest.raises(RefillCapReached) as err:
        acc.add([2, 3], [False, True], 12)
    msg = str(err.value)
    assert "kept 2/4" in msg and "2 generation batches" in msg and "max_num_gen_batches=2" in msg
    assert "at_refill_cap=partial" in msg
    assert err.value.kept == [0, 3] and err.value.stats.tokens_generated == 22


def test_cap_partial_returns_what_was_kept():
    acc = RefillAccumulator(target_groups=4, max_gen_batches=2, at_cap="partial")
    assert acc.add([0, 1], [True, False], 10) is False
    assert acc.add([2, 3], [False, False], 12) is True
    kept, s = acc.result()
    assert kept == [0] and s.hit_cap and not s.full and s.groups_dropped == 3 and s.gen_batches == 2


def test_full_on_the_cap_batch_is_full_not_capped():
    acc = RefillAccumulator(target_groups=2, max_gen_batches=2, at_cap="fail")
    acc.add([0], [True], 1)
    assert acc.add([1, 2], [True, True], 2) is True
    kept, s = acc.result()
    assert kept == [0, 1] and s.full and not s.hit_cap and s.groups_surplus == 1


def test_no_cap_keeps_going():
    acc = RefillAccumulator(target_groups=1, max_gen_batches=0, at_cap="fail")
    for i in range(50):
        assert acc.add([i], [False], 1) is False
    assert acc.add([50], [True], 1) is True
    assert acc.result()[1].gen_batches == 51


def test_misuse_is_an_error():
    with pytest.raises(ValueError):
        RefillAccumulator(0)
    with pytest.raises(ValueError):
        RefillAccumulator(2, at_cap="retry")
    acc = RefillAccumulator(2)
    with pytest.raises(ValueError, match="flags"):
        acc.add([1, 2], [True], 1)
    with pytest.raises(RuntimeError, match="not done"):
        acc.result()
