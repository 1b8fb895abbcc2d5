"""How a batch's sequences are shared out, on lengths alone: over ranks (`split_by_tokens`), into micro-batches
padded (`plan_micro_batches`) or packed (`plan_packed_micro_batches`), and what a pass over them computes
(`learner_tokens`). Plain arithmetic, no torch: the learner plans its passes with it, its `perf/learner_padded_fraction`
counts with it, and `dapo plan` prices a preset's length model with it.

A sequence is a prompt and a response; its model input is the prompt and the response but its last token (which
predicts nothing), `input_length`. Packings (`trainer.packing`, dapo/learner/batch.py lays them out):

- `none`: length-sorted rows, each right-padded to the longest of its micro-batch; a budget of rows x longest row.
- `sequences`: whole sequences end to end in one row; a budget of real tokens.
- `prompts`: the same, the responses of one prompt behind a single copy of it (`share_prompts`).
"""

from __future__ import annotations

import heapq
from collections.abc import Sequence
from dataclasses import dataclass


@dataclass(frozen=True)
class Lengths:
    """What planning needs of N sequences: prompt and response token counts, [N] each, and `key` [N], equal for the
    same prompt token for token (what `prompts` packing shares)."""

    prompt: tuple[int, ...]
    response: tuple[int, ...]
    key: tuple[int, ...]

    @classmethod
    def of(cls, prompt_ids: Sequence[Sequence[int]], response_ids: Sequence[Sequence[int]]) -> Lengths:
        """From token ids: prompts equal token for token share a key."""
        keys: dict[tuple[int, ...], int] = {}
        key = tuple(keys.setdefault(tuple(p), len(keys)) for p in prompt_ids)
        return cls(tuple(len(p) for p in prompt_ids), tuple(len(r) for r in response_ids), key)

    def __len__(self) -> int:
        return len(self.prompt)

    def select(self, rows: Sequence[int]) -> Lengths:
        return Lengths(*(tuple(col[i] for i in rows) for col in (self.prompt, self.response, self.key)))

    def input_length(self, i: int) -> int:
        """Model-input tokens of sequence i alone (0 without a response: nothing to compute)."""
        return self.prompt[i] + self.response[i] - 1 if self.response[i] else 0


def split_by_tokens(lengths: Lengths, world_size: int, *, share_prompts: bool = False) -> list[list[int]]:
    """Split sequences over `world_size` ranks so each rank's forward tokens are near the mean: world_size ascending
    lists of indices, every index exactly once.

    A sequence costs its model-input length (prompt + response - 1; 0 without a response); with `share_prompts` a
    prompt costs once per rank holding any of its responses (`plan_packed_micro_batches`). Two deterministic passes:
    longest-processing-time-first over units (a sequence, or with `share_prompts` one prompt's responses) to the
    least-loaded rank; then, while it lowers the busiest rank's load without making another as busy, a piece moves
    from the busiest rank to where it ends lowest (cutting groups where whole ones cannot balance). Bounds: the busiest
    rank holds at most the mean plus the longest sequence, and unshared at most 4/3 of the best split.

    Tokens, not FLOPs: attention is only ~6% of a 6K-token sequence's FLOPs at Qwen2.5-32B's width (~19% at 22.5K);
    `benchmarks/bench_sharding.py` prints the imbalance in both.
    """
    if world_size < 1:
        raise ValueError(f"split_by_tokens: world_size must be >= 1, got {world_size}")
    prompt = lengths.key
    live = [r > 0 for r in lengths.response]
    shared = [p if share_prompts else 0 for p in lengths.prompt]  # the part of a cost paid once per rank
    own = [lengths.input_length(i) - shared[i] if live[i] else 0 for i in range(len(lengths))]
    units: dict[int, list[int]] = {}
    for i in range(len(lengths)):
        units.setdefault(prompt[i] if share_prompts and live[i] else -1 - i, []).append(i)

    load = [0] * world_size
    out: list[list[int]] = [[] for _ in range(world_size)]
    held: list[dict[int, list[int]]] = [{} for _ in range(world_size)]  # rank -> prompt -> its live rows there

    def added(rows: list[int], k: int) -> int:
        """Tokens that `rows` (one prompt's) add to rank k, which does not hold them."""
        first = rows[0]
        return sum(own[i] for i in rows) + (shared[first] if live[first] and prompt[first] not in held[k] else 0)

    def freed(rows: list[int], k: int) -> int:
        """Tokens that removing `rows` (one prompt's, live) frees on rank k, which holds them."""
        first = rows[0]
        return sum(own[i] for i in rows) + (shared[first] if len(rows) == len(held[k][prompt[first]]) else 0)

    def place(rows: list[int], to: int, frm: int | None = None) -> None:
        if frm is not None:
            load[frm] -= freed(rows, frm)
            out[frm] = [i for i in out[frm] if i not in rows]
            left = [i for i in held[frm][prompt[rows[0]]] if i not in rows]
            held[frm][prompt[rows[0]]] = left
            if not left:
                del held[frm][prompt[rows[0]]]
        load[to] += added(rows, to)
        out[to].extend(rows)
        if live[rows[0]]:
            held[to].setdefault(prompt[rows[0]], []).extend(rows)

    order = sorted(units.values(), key=lambda rows: (-(sum(own[i] for i in rows) + shared[rows[0]]), rows[0]))
    least = [(0, k) for k in range(world_size)]  # (load, rank): the least-loaded rank, ties to the lowest
    for rows in order:
        _, k = heapq.heappop(least)
        place(rows, k)
        heapq.heappush(least, (load[k], k))

    while True:
        a = max(range(world_size), key=lambda k: (load[k], -k))
        by_load = sorted(range(world_size), key=lambda k: (load[k], k))
        pieces = [[i] for rows in held[a].values() for i in rows]
        pieces += [rows for rows in held[a].values() if share_prompts and len(rows) > 1]
        best: tuple[int, int, int, list[int]] | None = None
        for piece in pieces:
            gone = freed(piece, a)
            # Where the piece ends lowest: the least-loaded rank without its prompt, or one that has it already.
            spare = next((b for b in by_load if b != a and prompt[piece[0]] not in held[b]), None)
            targets = [b for b in range(world_size) if b != a and prompt[piece[0]] in held[b]]
            for b in targets + ([] if spare is None else [spare]):
                grown = load[b] + added(piece, b)
                key = (max(load[a] - gone, grown), grown, b, piece)
                if gone > 0 and grown < load[a] and (best is None or key < best):
                    best = key
        if best is None:
            return [sorted(rows) for rows in out]
        place(list(best[3]), best[2], frm=a)


def rank_loads(lengths: Lengths, split: list[list[int]], *, share_prompts: bool = False) -> list[int]:
    """Forward tokens of each rank under `split` (the cost `split_by_tokens` balances)."""
    loads = []
    for rows in split:
        live = [i for i in rows if lengths.response[i]]
        tokens = sum(lengths.input_length(i) for i in live)
        if share_prompts:  # each distinct prompt once
            once = {lengths.key[i]: lengths.prompt[i] for i in live}
            tokens -= sum(lengths.prompt[i] for i in live) - sum(once.values())
        loads.append(tokens)
    return loads


def plan_micro_batches(seq_lengths: Sequence[int], token_budget: int) -> list[list[int]]:
    """Padded micro-batches (`trainer.packing: none`) of at most `token_budget` = rows x longest row (a longer
    sequence alone), as index lists longest first (the first is the most memory-hungry: an OOM shows at once);
    `seq_lengths` 0 are left out.

    Of the splits of the length-sorted sequences into consecutive runs, the fewest micro-batches (passes; at ZeRO-3
    a gather each), then the fewest padded tokens: greedy filling pads more ([20K, 6K | 3K, 1K] at a 45K budget
    computes 46K tokens, [20K | 6K, 3K, 1K] 38K).
    """
    order = sorted((i for i, n in enumerate(seq_lengths) if n > 0), key=lambda i: (-seq_lengths[i], i))
    n = len(order)
    # best[j]: (micro-batches, padded tokens, start of the last run) of the best split of order[:j].
    best: list[tuple[int, int, int]] = [(0, 0, 0)] + [(n + 1, 0, 0)] * n
    for i in range(n):
        width = seq_lengths[order[i]]  # the run order[i:j] is padded to its first (longest) row
        for j in range(i + 1, n + 1):
            if j - i > 1 and (j - i) * width > token_budget:
                break
            cand = (best[i][0] + 1, best[i][1] + (j - i) * width, i)
            best[j] = min(best[j], cand)
    out: list[list[int]] = []
    j = n
    while j > 0:
        i = best[j][2]
        out.append(order[i:j])
        j = i
    return out[::-1]


def packing_units(lengths: Lengths, token_budget: int, share_prompts: bool) -> list[list[int]]:
    """A packed micro-batch's pieces (index lists): one sequence each, or with `share_prompts` one prompt's responses
    behind one copy of it, cut at the budget (each cut repeats the prompt). Empty responses are left out."""
    if not share_prompts:
        return [[i] for i, r in enumerate(lengths.response) if r]
    groups: dict[int, list[int]] = {}
    for i, r in enumerate(lengths.response):
        if r:
            groups.setdefault(lengths.key[i], []).append(i)
    units: list[list[int]] = []
    for members in groups.values():
        prompt = lengths.prompt[members[0]]
        unit: list[int] = []
        width = prompt
        for i in sorted(members, key=lambda i: (-lengths.response[i], i)):
            extra = lengths.response[i] - 1  # the last response token is never an input
            if unit and width + extra > token_budget:
                units.append(unit)
                unit, width = [], prompt
            unit.append(i)
            width += extra
        units.append(unit)
    return units


def unit_length(lengths: Lengths, unit: Sequence[int], share_prompts: bool) -> int:
    """Model-input tokens of a packing unit (`share_prompts`: the prompt once, each response but its last token)."""
    if not share_prompts:
        return sum(lengths.input_length(i) for i in unit)
    return lengths.prompt[unit[0]] + sum(lengths.response[i] - 1 for i in unit)


def plan_packed_micro_batches(
    lengths: Lengths, token_budget: int, share_prompts: bool = False
) -> list[list[list[int]]]:
    """Packed micro-batches of `packing_units`, at most `token_budget` real tokens each (a longer unit alone), by
    first-fit decreasing (within 11/9 of the fewest passes, plus one; ties by first index), the fullest first."""
    units = packing_units(lengths, token_budget, share_prompts)
    sizes = [unit_length(lengths, u, share_prompts) for u in units]
    bins: list[list[int]] = []
    room: list[int] = []
    for k in sorted(range(len(units)), key=lambda k: (-sizes[k], units[k][0])):
        fit = next((b for b, left in enumerate(room) if left >= sizes[k]), None)
        if fit is None:
            bins.append([k])
            room.append(token_budget - sizes[k])
        else:
            bins[fit].append(k)
            room[fit] -= sizes[k]
    order = sorted(range(len(bins)), key=lambda b: (room[b], b))
    return [[units[k] for k in bins[b]] for b in order]


@dataclass(frozen=True)
class TokenCounts:
    """One learner pass over a batch, all ranks: tokens `computed` (padding and dummies included), of them
    `padding`, and the micro-batch passes each rank runs."""

    computed: int
    padding: int
    passes_per_rank: int

    @property
    def padded_fraction(self) -> float:
        return self.padding / self.computed if self.computed else 0.0


def learner_tokens(lengths: Lengths, world_size: int, token_budget: int, packing: str) -> TokenCounts:
    """What one learner pass computes: each rank's shard (`split_by_tokens`) in its `packing` micro-batches, and a
    one-token dummy pass per micro-batch a rank has fewer than the busiest (keeping ZeRO's collectives in step)."""
    share = packing == "prompts"
    computed, useful, passes = 0, 0, []
    for rows in split_by_tokens(lengths, world_size, share_prompts=share):
        mine = lengths.select(rows)
        if packing == "none":
            sizes = [mine.input_length(i) for i in range(len(mine))]
            plan: list = plan_micro_batches(sizes, token_budget)
            computed += sum(len(mb) * sizes[mb[0]] for mb in plan)
            useful += sum(sizes)
        else:
            plan = plan_packed_micro_batches(mine, token_budget, share)
            tokens = sum(unit_length(mine, u, share) for mb in plan for u in mb)
            computed += tokens
            useful += tokens
        passes.append(len(plan))
    most = max(1, max(passes, default=0))
    dummies = sum(most - k for k in passes)  # one token each
    return TokenCounts(computed + dummies, computed - useful + dummies, most)
