"""How a batch becomes micro-batches: `dapo.packing`'s plans on lengths, and `dapo.learner.batch` laying them out,
padded (`trainer.packing: none`) or packed (`sequences`, `prompts`), with the packed attention's own test; what each
costs in tokens (`learner_tokens`, which the learner's padded-share metric and `dapo plan` read); and the split over
ranks. The numbers the learner computes from them are tests/test_learner.py's."""

from __future__ import annotations

import itertools

import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st

from dapo.learner import PolicyBatch, response_mask
from dapo.learner.batch import collate, collate_packed
from dapo.modeling import ATTENTION_PACKED, PackedRow
from dapo.packing import (
    Lengths,
    TokenCounts,
    learner_tokens,
    plan_micro_batches,
    plan_packed_micro_batches,
    rank_loads,
    split_by_tokens,
    unit_length,
)

EPS32 = torch.finfo(torch.float32).eps


# ------------------------------------------------------------------------------------------------ padded
def test_micro_batches_respect_the_token_budget_and_cover_every_sequence():
    lengths = [5, 17, 3, 0, 9, 9, 12, 1, 30]
    plan = plan_micro_batches(lengths, token_budget=20)
    flat = sorted(i for mb in plan for i in mb)
    assert flat == [0, 1, 2, 4, 5, 6, 7, 8]  # the empty sequence (3) has nothing to compute
    for mb in plan:
        widest = max(lengths[i] for i in mb)
        assert len(mb) * widest <= 20 or len(mb) == 1  # 30 > budget: alone
        assert [lengths[i] for i in mb] == sorted((lengths[i] for i in mb), reverse=True)
    assert plan[0] == [8]  # longest first
    assert plan_micro_batches(lengths, 10**6) == [[8, 1, 6, 4, 5, 0, 2, 7]]


def _greedy_plan(lengths: list[int], budget: int) -> list[list[int]]:
    """Fill each micro-batch to the budget before opening the next (the fewest passes, not the least padding)."""
    out: list[list[int]] = []
    for i in sorted((i for i, n in enumerate(lengths) if n > 0), key=lambda i: (-lengths[i], i)):
        if out and (len(out[-1]) + 1) * lengths[out[-1][0]] <= budget:
            out[-1].append(i)
        else:
            out.append([i])
    return out


def _padded(lengths: list[int], plan: list[list[int]]) -> int:
    return sum(len(mb) * max(lengths[i] for i in mb) for mb in plan)


def test_micro_batches_pad_less_than_filling_each_to_the_budget():
    """[20K, 6K | 3K, 1K] computes 46K tokens; [20K | 6K, 3K, 1K] 38K, in as many passes."""
    lengths = [20000, 6000, 3000, 1000]
    assert plan_micro_batches(lengths, 45056) == [[0], [1, 2, 3]]
    assert _padded(lengths, _greedy_plan(lengths, 45056)) == 46000 and _padded(lengths, [[0], [1, 2, 3]]) == 38000


@settings(max_examples=80, deadline=None)
@given(lengths=st.lists(st.integers(0, 50), min_size=1, max_size=14), budget=st.integers(1, 200))
def test_micro_batches_are_as_few_as_filling_and_never_pad_more(lengths, budget):
    plan = plan_micro_batches(lengths, budget)
    greedy = _greedy_plan(lengths, budget)
    assert sorted(i for mb in plan for i in mb) == [i for i, n in enumerate(lengths) if n > 0]
    assert all(len(mb) == 1 or len(mb) * lengths[mb[0]] <= budget for mb in plan)
    assert len(plan) == len(greedy) and _padded(lengths, plan) <= _padded(lengths, greedy)


def test_collate_puts_each_target_at_the_position_that_predicts_it():
    mb = collate([[7, 8], [9]], [[1, 2, 3], [4]], rows=[0, 1])
    assert mb.input_ids.tolist() == [[7, 8, 1, 2], [9, 0, 0, 0]]  # last response token is never an input
    assert mb.attention_mask.tolist() == [[1, 1, 1, 1], [1, 0, 0, 0]]
    assert mb.positions.tolist() == [1, 2, 3, 4]  # row 1 position 0 = flat 4
    assert mb.targets.tolist() == [1, 2, 3, 4]
    assert mb.token_rows.tolist() == [0, 0, 0, 1] and mb.token_cols.tolist() == [0, 1, 2, 0]


# ------------------------------------------------------------------------------------------------ packed
def test_sequences_pack_end_to_end_with_positions_restarting():
    """`sequences`: one row, each sequence prompt + response[:-1], positions from 0 at each; response token t of a
    sequence is predicted at its start + p - 1 + t."""
    prompts, responses = [[7, 8], [9], [7, 8]], [[1, 2, 3], [4], []]
    plan = plan_packed_micro_batches(Lengths.of(prompts, responses), token_budget=100)
    assert plan == [[[0], [1]]]  # the empty response has nothing to compute
    mb = collate_packed(prompts, responses, plan[0])
    assert mb.input_ids.tolist() == [[7, 8, 1, 2, 9]] and mb.attention_mask is None
    assert mb.position_ids.tolist() == [[0, 1, 2, 3, 0]]
    assert mb.packed_row == PackedRow((0, 4, 5))
    assert mb.positions.tolist() == [1, 2, 3, 4] and mb.targets.tolist() == [1, 2, 3, 4]
    assert mb.token_rows.tolist() == [0, 0, 0, 1] and mb.token_cols.tolist() == [0, 1, 2, 0]


def test_prompts_packing_shares_one_copy_and_each_response_sees_it_and_itself():
    """`prompts`: the prompt once, then each response but its last token with positions restarting at the prompt's
    end; response token 0 is predicted at the prompt's last position, and each response attends to the whole
    prompt (its prefix) and causally to itself, never to another response."""
    prompts, responses = [[7, 8], [7, 8], [9], [7, 8]], [[1, 2, 3], [4], [5, 6], []]
    plan = plan_packed_micro_batches(Lengths.of(prompts, responses), token_budget=100, share_prompts=True)
    assert plan == [[[0, 1], [2]]]
    mb = collate_packed(prompts, responses, plan[0], share_prompts=True)
    assert mb.input_ids.tolist() == [[7, 8, 1, 2, 9, 5]]  # response 1 (one token) adds no input
    assert mb.position_ids.tolist() == [[0, 1, 2, 3, 0, 1]]
    assert mb.packed_row == PackedRow((0, 2, 4, 5, 6), ((0, 0), (0, 2), (0, 0), (4, 5)))
    # response 0: token 0 <- the prompt's end (1), then its own tokens (2, 3); response 1 <- 1; response 2 <- 4, 5
    assert mb.positions.tolist() == [1, 2, 3, 1, 4, 5]
    assert mb.targets.tolist() == [1, 2, 3, 4, 5, 6]
    assert mb.token_rows.tolist() == [0, 0, 0, 1, 2, 2] and mb.token_cols.tolist() == [0, 1, 2, 0, 0, 1]
    # Over the budget: the group is cut into units that each repeat the prompt.
    cut = plan_packed_micro_batches(
        Lengths.of([[7, 8]] * 3, [[1] * 6, [2] * 6, [3] * 6]), token_budget=12, share_prompts=True
    )
    assert sorted(i for mb in cut for unit in mb for i in unit) == [0, 1, 2]
    assert all(len(unit) <= 2 for mb in cut for unit in mb)


@settings(max_examples=80, deadline=None)
@given(
    lengths=st.lists(st.tuples(st.integers(1, 4), st.integers(0, 40)), min_size=1, max_size=16),
    budget=st.integers(8, 120),
    share=st.booleans(),
)
def test_packed_micro_batches_cover_every_sequence_within_the_budget(lengths, budget, share):
    """Every sequence with a response exactly once; each micro-batch holds at most the budget in real tokens (or one
    unit, if that alone is longer); and first-fit's own bound on the count: at most one is no more than half full
    (else the later one's units would have fitted in the earlier)."""
    prompts = [[7] * p for p, _ in lengths]  # equal lengths share a prompt
    responses = [[1] * r for _, r in lengths]
    plan = plan_packed_micro_batches(Lengths.of(prompts, responses), budget, share)
    assert sorted(i for mb in plan for unit in mb for i in unit) == [i for i, r in enumerate(responses) if r]
    sizes = [sum(unit_length(Lengths.of(prompts, responses), u, share) for u in mb) for mb in plan]
    assert all(size <= budget or len(mb) == 1 for size, mb in zip(sizes, plan, strict=True))
    assert sum(size <= budget / 2 for size in sizes) <= 1
    for mb in plan:
        mb_in = collate_packed(prompts, responses, mb, share)
        assert mb_in.input_ids.shape == (1, sum(unit_length(Lengths.of(prompts, responses), u, share) for u in mb))


def test_learner_tokens_count_padding_and_the_dummy_passes():
    """Two sequences of 10 and 4 input tokens: padded to one row of 10 they cost 20 (6 of them padding); packed, 14
    (none); in two passes of their own, 14 padded too. Three over two ranks at a budget of 10: the rank with two
    runs two passes, the other one and a one-token dummy."""
    prompts, responses = [[5] * 4, [6] * 2], [[1] * 7, [2] * 3]
    assert learner_tokens(Lengths.of(prompts, responses), 1, 100, "none") == TokenCounts(20, 6, 1)
    assert learner_tokens(Lengths.of(prompts, responses), 1, 100, "none").padded_fraction == pytest.approx(6 / 20)
    assert learner_tokens(Lengths.of(prompts, responses), 1, 100, "sequences") == TokenCounts(14, 0, 1)
    assert learner_tokens(Lengths.of(prompts, responses), 1, 12, "none") == TokenCounts(14, 0, 2)
    assert learner_tokens(Lengths.of(prompts, responses), 2, 100, "sequences") == TokenCounts(14, 0, 1)  # one each
    p3, r3 = prompts + [[5] * 4], responses + [[3] * 7]
    assert learner_tokens(Lengths.of(p3, r3), 2, 10, "sequences") == TokenCounts(10 + 4 + 10 + 1, 1, 2)
    # `prompts`: the two sequences behind [5] * 4 share one copy of it: 4 + 6 + 6, and [6] * 2 + 2
    assert learner_tokens(Lengths.of(p3, r3), 1, 100, "prompts") == TokenCounts(4 + 6 + 6 + 2 + 2, 0, 1)


def test_learner_tokens_are_what_the_collated_micro_batches_hold():
    """The count the metric and `dapo plan` use is the size of the micro-batches the learner builds."""
    g = torch.Generator().manual_seed(0)
    prompts = [[3] * int(torch.randint(1, 9, (1,), generator=g)) for _ in range(5) for _ in range(4)]
    responses = [[4] * int(torch.randint(0, 30, (1,), generator=g)) for _ in range(20)]
    for packing in ("none", "sequences", "prompts"):
        for budget in (16, 40, 1000):
            if packing == "none":
                lengths = [len(p) + len(r) - 1 if r else 0 for p, r in zip(prompts, responses, strict=True)]
                mbs = [collate(prompts, responses, rows) for rows in plan_micro_batches(lengths, budget)]
                real = sum(int(mb.attention_mask.sum()) for mb in mbs)
            else:
                share = packing == "prompts"
                mbs = [collate_packed(prompts, responses, mb, share)
                       for mb in plan_packed_micro_batches(Lengths.of(prompts, responses), budget, share)]  # fmt: skip
                real = sum(mb.input_ids.numel() for mb in mbs)
            counts = learner_tokens(Lengths.of(prompts, responses), 1, budget, packing)
            assert counts.computed == sum(mb.input_ids.numel() for mb in mbs), (packing, budget)
            assert counts.padding == counts.computed - real and counts.passes_per_rank == len(mbs)


def _tiny_qwen2(tmp_path, **kw):
    from transformers import Qwen2Config, Qwen2ForCausalLM

    torch.manual_seed(0)
    cfg = Qwen2Config(vocab_size=50, hidden_size=32, intermediate_size=64, num_hidden_layers=2,
                      num_attention_heads=4, num_key_value_heads=2, max_position_embeddings=64, **kw)  # fmt: skip
    Qwen2ForCausalLM(cfg).save_pretrained(tmp_path / "m")
    return tmp_path / "m"


def test_packed_attention_computes_each_sequence_as_if_alone(tmp_path):
    """Through a real Qwen2 with `dapo_packed` attention: a packed row's hidden states are each sequence's run alone
    under transformers' own attention, and under `prompts` each response's are those of prompt + response alone.
    Float32, the same weights, matmuls of other shapes: within eps x 32 (the hidden size: the longest dot product
    before the final norm) x the largest |hidden state|."""
    from dapo.modeling import load_causal_lm

    path = _tiny_qwen2(tmp_path)
    plain = load_causal_lm(str(path), torch.float32)
    packed = load_causal_lm(str(path), torch.float32, attention=ATTENTION_PACKED)
    g = torch.Generator().manual_seed(1)
    prompts = [torch.randint(1, 50, (n,), generator=g).tolist() for n in (3, 3, 5)]
    prompts[1] = prompts[0]
    responses = [torch.randint(1, 50, (n,), generator=g).tolist() for n in (6, 2, 4)]
    with torch.no_grad():
        for share in (False, True):
            (mb,) = plan_packed_micro_batches(Lengths.of(prompts, responses), 100, share)
            batch = collate_packed(prompts, responses, mb, share)

            def run(row: PackedRow, batch=batch) -> torch.Tensor:  # the hidden states that predict each response token
                out = packed.model(input_ids=batch.input_ids, position_ids=batch.position_ids, packed_row=row)
                return out.last_hidden_state[0][batch.positions]

            h = run(batch.packed_row)
            alone = torch.cat([
                plain.model(input_ids=torch.tensor([prompts[i] + responses[i][:-1]])).last_hidden_state[0][
                    len(prompts[i]) - 1 :] for i in batch.rows])  # fmt: skip
            assert (h - alone).abs().max() <= 32 * EPS32 * alone.abs().max(), share
            # a response that saw another's tokens would differ by far more: the same row with one boundary removed
            leaky = PackedRow(batch.packed_row.bounds[:1] + batch.packed_row.bounds[2:], None)
            assert (run(leaky) - alone).abs().max() > 1e3 * 32 * EPS32 * alone.abs().max()


def test_packed_attention_refuses_what_it_does_not_implement(tmp_path):
    """A sliding-window model under packed attention stops at its first forward, naming the key that avoids it."""
    from dapo.modeling import load_causal_lm

    path = _tiny_qwen2(tmp_path, use_sliding_window=True, sliding_window=4, max_window_layers=0)
    lm = load_causal_lm(str(path), torch.float32, attention=ATTENTION_PACKED)
    row = PackedRow((0, 3, 6))
    with pytest.raises(ValueError, match="trainer.packing: none"):
        lm.model(input_ids=torch.ones(1, 6, dtype=torch.long), position_ids=torch.tensor([[0, 1, 2, 0, 1, 2]]),
                 packed_row=row)  # fmt: skip


# ------------------------------------------------------------------------------------------------ ranks
def _costs(prompts, responses):
    return [len(p) + len(r) - 1 if r else 0 for p, r in zip(prompts, responses, strict=True)]


@settings(max_examples=60, deadline=None)
@given(
    lengths=st.lists(st.tuples(st.integers(1, 40), st.integers(0, 60)), min_size=1, max_size=9),
    world=st.integers(1, 4),
    pack=st.booleans(),
)
def test_split_by_tokens_covers_every_row_once_within_its_bounds(lengths, world, pack):
    """Every row on exactly one rank, rows ascending, the same split when asked again; the busiest rank within
    mean + longest sequence, and (unpacked) within 4/3 of the best split found by brute force."""
    prompts = [[7] * p for p, _ in lengths]  # equal lengths share a prompt: the packing case
    responses = [[1] * r for _, r in lengths]
    split = split_by_tokens(Lengths.of(prompts, responses), world, share_prompts=pack)
    assert len(split) == world and sorted(i for rows in split for i in rows) == list(range(len(lengths)))
    assert all(rows == sorted(rows) for rows in split)
    assert split == split_by_tokens(Lengths.of(prompts, responses), world, share_prompts=pack)
    cost = _costs(prompts, responses)
    loads = rank_loads(Lengths.of(prompts, responses), split, share_prompts=pack)
    assert max(loads) <= sum(cost) / world + max(cost)
    if not pack and len(lengths) <= 7:
        best = min(
            max(sum(c for c, k in zip(cost, owner, strict=True) if k == r) for r in range(world))
            for owner in itertools.product(range(world), repeat=len(cost))
        )
        assert max(loads) <= (4 / 3 - 1 / (3 * world)) * best + 1e-9


def test_split_by_tokens_balances_where_whole_groups_cannot():
    """Two groups of four over four ranks: whole groups leave two ranks idle; by sequence every rank gets one
    long and one short response, at the mean exactly."""
    prompts = [[5, 5]] * 4 + [[6, 6]] * 4
    responses = [[1] * n for n in (30, 10, 30, 10, 30, 10, 30, 10)]
    split = split_by_tokens(Lengths.of(prompts, responses), 4)
    assert rank_loads(Lengths.of(prompts, responses), split) == [sum(_costs(prompts, responses)) // 4] * 4
    batch = PolicyBatch(prompts, responses, torch.zeros(8), response_mask(responses), torch.tensor([0] * 4 + [1] * 4))
    shards = [batch.shard_rows(r, 4) for r in range(4)]
    assert [len(s) for s in shards] == [2, 2, 2, 2]
    assert shards[3] == split[3] and batch.shard_rows(0, 1) == list(range(8))
    with pytest.raises(ValueError, match="rank 4 is outside a world of size 4"):
        batch.shard_rows(4, 4)


def test_packed_split_keeps_a_group_on_one_rank_when_its_prompt_dominates():
    """Long prompts, short responses (the tiny preset's shape): a split group would compute its prompt twice,
    so with `prompts` packing each group stays whole and the ranks' packed loads are equal."""
    prompts = [[5] * 100] * 4 + [[6] * 100] * 4
    responses = [[1] * 9] * 8
    split = split_by_tokens(Lengths.of(prompts, responses), 2, share_prompts=True)
    assert sorted(split) == [[0, 1, 2, 3], [4, 5, 6, 7]]
    assert rank_loads(Lengths.of(prompts, responses), split, share_prompts=True) == [100 + 4 * 8] * 2
