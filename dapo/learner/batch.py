"""What the trainer hands the learner (`PolicyBatch`, `LossSpec`), and how a batch becomes micro-batches.

By default micro-batches are length-sorted and right-padded under a token budget that counts padded tokens (rows x
longest row), not packed: plain causal attention on every model, the same per-token numbers on CPU and GPU.
`trainer.pack_prompts` packs a group's responses behind one copy of their prompt instead (`plan_packed_micro_batches`,
`collate_packed`), under a block mask that grows as L^2 per row: worth it where prompts are a large share of the
tokens, as in the tiny preset. docs/architecture.md, "learner/".
"""

from __future__ import annotations

from dataclasses import dataclass, replace

import torch
from torch import Tensor


@dataclass(frozen=True)
class LossSpec:
    """The loss hyper-parameters (docs/algorithm.md sections 2 and 3); plain values, fixed for a run.

    Attributes:
        eps_low, eps_high: clip range [1 - eps_low, 1 + eps_high]. Naive GRPO 0.2/0.2; DAPO 0.2/0.28.
        dual_clip_c: dual-clip bound for negative advantages (released recipe 10), None for off.
        kl_coef: k3 KL coefficient towards a reference policy (0 in every DAPO row); needs `ref_logp`.
        loss_agg: `seq-mean-token-mean`, `token-mean`, `group-token-mean` or `seq-mean-token-sum`.
        seq_token_sum_constant: the divisor C of `seq-mean-token-sum` (e.g. the max response length).
        temperature: the sampling temperature; logits are divided by it, as when sampling.
        policy_loss: the per-token loss by name (`dapo.algos.policy_loss`): ppo_clip (the paper's), gspo, cispo,
            clip_cov, kl_cov; eps_low / eps_high are GSPO's sequence clip range and Clip-Cov's PPO clip too.
        cispo_clip_max: CISPO's cap on the importance weight.
        clip_cov_ratio, clip_cov_lb, clip_cov_ub: Clip-Cov's share of tokens and covariance band.
        kl_cov_ratio, kl_cov_coef: KL-Cov's share of tokens and the coefficient of their |log-ratio| penalty.
    """

    eps_low: float = 0.2
    eps_high: float = 0.2
    dual_clip_c: float | None = None
    kl_coef: float = 0.0
    loss_agg: str = "seq-mean-token-mean"
    seq_token_sum_constant: float | None = None
    temperature: float = 1.0
    policy_loss: str = "ppo_clip"
    cispo_clip_max: float = 5.0
    clip_cov_ratio: float = 2e-4
    clip_cov_lb: float = 1.0
    clip_cov_ub: float = 5.0
    kl_cov_ratio: float = 2e-4
    kl_cov_coef: float = 1.0


def response_mask(response_ids: list[list[int]], width: int | None = None) -> Tensor:
    """[N, R] float mask, 1 on each response's tokens; R = `width` or the longest response."""
    lengths = torch.tensor([len(r) for r in response_ids], dtype=torch.long)
    width = int(lengths.max().item()) if width is None and len(response_ids) else (width or 0)
    return (torch.arange(width).unsqueeze(0) < lengths.unsqueeze(1)).float()


def pad_rows(rows: list[list[float]], width: int | None = None) -> Tensor:
    """Ragged per-token values (e.g. the engine's log-probs) -> [N, R] float32, zeros after each row."""
    width = max((len(r) for r in rows), default=0) if width is None else width
    out = torch.zeros(len(rows), width, dtype=torch.float32)
    for i, r in enumerate(rows):
        out[i, : len(r)] = torch.as_tensor(r, dtype=torch.float32)
    return out


@dataclass
class PolicyBatch:
    """N sampled responses with what the loss needs. Per-token tensors are [N, R], R >= the longest response,
    right-padded; column t of row i is response token t.

    Attributes:
        prompt_ids: N prompts as token ids (templates applied; repeated for each response of a group).
        response_ids: N responses as token ids.
        advantages: [N] float, one advantage per response (group-normalised, docs/algorithm.md section 2).
        loss_mask: [N, R] float, 1 on response tokens that train; 0 on padding and on every token of an
            overlong-filtered response (`dapo.algos.overlong_loss_mask`).
        group_ids: [N] int, the prompt (group) each response belongs to: small non-negative ids (the group's
            index in the rollout step; the group-token-mean counts tokens per id over all ranks).
        old_logp: [N, R] log-probs under the policy that sampled (from `Learner.compute_logprobs`); needed by
            `Learner.update`, not by `compute_logprobs`.
        ref_logp: [N, R] reference-policy log-probs, only when `LossSpec.kl_coef > 0`.
        is_weights: [N, R] the rollout correction's importance weights (`dapo.algos.rollout_correction`), which
            multiply each token's policy loss; None: no correction.
        sample_ids: [N] int, each response's index in the rollout step's batch (kept through `select` and `shard`:
            what the covariance losses' random draw is keyed by); None: 0 .. N-1.

    The trainer carries its rollout step in this one type from the rollout to the learner
    (`dapo.trainer.step.policy_batch`); four fields are its own, for the step's metrics, and the learner reads
    none of them: `truncated` [N] bool (finish reason "length"), `response_mask` [N, R] (1 on response tokens, the
    loss mask before overlong filtering), `engine_logp` [N, R] (the rollout engine's log-probs of its samples) and
    `entropy` [N, R] (the old policy's, on the sampled tokens).
    """

    prompt_ids: list[list[int]]
    response_ids: list[list[int]]
    advantages: Tensor
    loss_mask: Tensor
    group_ids: Tensor
    old_logp: Tensor | None = None
    ref_logp: Tensor | None = None
    is_weights: Tensor | None = None
    sample_ids: Tensor | None = None
    truncated: Tensor | None = None
    response_mask: Tensor | None = None
    engine_logp: Tensor | None = None
    entropy: Tensor | None = None

    def __post_init__(self) -> None:
        n = len(self.prompt_ids)
        if self.sample_ids is None:
            self.sample_ids = torch.arange(n)
        if len(self.response_ids) != n or self.advantages.shape != (n,) or self.group_ids.shape != (n,):
            raise ValueError(
                f"PolicyBatch: {n} prompts, {len(self.response_ids)} responses, advantages "
                f"{tuple(self.advantages.shape)}, group_ids {tuple(self.group_ids.shape)}: need N each"
            )
        width = max((len(r) for r in self.response_ids), default=0)
        for name in ("loss_mask", "old_logp", "ref_logp", "is_weights", "response_mask", "engine_logp", "entropy"):
            t = getattr(self, name)
            if t is not None and (t.dim() != 2 or t.shape[0] != n or t.shape[1] < width):
                raise ValueError(
                    f"PolicyBatch.{name} is {tuple(t.shape)}; need [N={n}, R>={width}] (R: longest response)"
                )
        if any(len(p) == 0 for p in self.prompt_ids):
            raise ValueError("PolicyBatch: empty prompt (the first response token needs a position to predict it)")

    def __len__(self) -> int:
        return len(self.prompt_ids)

    def select(self, rows: list[int] | Tensor) -> PolicyBatch:
        """The sub-batch of `rows` (in that order), e.g. one mini-batch of a rollout batch."""
        idx = torch.as_tensor(rows, dtype=torch.long)
        rows = idx.tolist()
        pick = lambda t: None if t is None else t[idx]  # noqa: E731
        return replace(
            self,
            prompt_ids=[self.prompt_ids[i] for i in rows],
            response_ids=[self.response_ids[i] for i in rows],
            advantages=self.advantages[idx],
            loss_mask=self.loss_mask[idx],
            group_ids=self.group_ids[idx],
            old_logp=pick(self.old_logp),
            ref_logp=pick(self.ref_logp),
            is_weights=pick(self.is_weights),
            sample_ids=self.sample_ids[idx],
            truncated=pick(self.truncated),
            response_mask=pick(self.response_mask),
            engine_logp=pick(self.engine_logp),
            entropy=pick(self.entropy),
        )

    def shard_rows(self, rank: int, world_size: int, *, pack_prompts: bool = False) -> list[int]:
        """The rows (ascending) that rank `rank` of `world_size` trains on when every rank holds the batch whole:
        `split_by_tokens(...)[rank]`, sequences balanced by the tokens of their forward pass, so a group's responses
        may land on different ranks (the learner sums the group-token-mean's per-group counts over ranks).
        Deterministic, so the shards partition the batch. `pack_prompts` as the learner's: a prompt then costs once
        per rank that holds its group."""
        if not 0 <= rank < world_size:
            raise ValueError(f"shard_rows: rank {rank} is outside a world of size {world_size}")
        if world_size == 1:
            return list(range(len(self)))
        return split_by_tokens(self.prompt_ids, self.response_ids, world_size, pack_prompts=pack_prompts)[rank]


def split_by_tokens(
    prompt_ids: list[list[int]], response_ids: list[list[int]], world_size: int, *, pack_prompts: bool = False
) -> list[list[int]]:
    """Split sequences over `world_size` ranks so that each rank's forward tokens are near the mean.

    A sequence costs its model-input length (prompt + response - 1; nothing without a response). With
    `pack_prompts` a rank computes each distinct prompt once, before all the responses of it that it holds
    (`plan_packed_micro_batches`), so a prompt costs once per rank that holds any of its responses.

    Two passes, both deterministic. First, longest-processing-time-first over units: each unit, longest first,
    goes to the least-loaded rank; a unit is one sequence, or with `pack_prompts` all the responses of one prompt
    (a cut group pays its prompt twice). Then, while it lowers the busiest rank's load without making another
    rank as busy, a piece (one sequence, or with `pack_prompts` all of one prompt's sequences on that rank) moves
    from the busiest rank to where it ends lowest: this cuts groups where whole ones cannot balance. Bounds: the
    busiest rank holds at most the mean load plus the longest sequence (its unpacked cost), and without packing
    at most 4/3 of the best possible split. One sequence longer than the mean load makes the mean unreachable;
    only splitting that sequence (context parallelism) would help.

    Tokens, not FLOPs: attention's cost grows with the square of a sequence's length, but at Qwen2.5-32B's width
    it is only ~6% of a 6K-token sequence's FLOPs (~19% of a 22.5K-token one's); `benchmarks/bench_sharding.py`
    prints the split's imbalance in both.

    Returns:
        world_size lists of sequence indices, each ascending; together every index exactly once.
    """
    if world_size < 1:
        raise ValueError(f"split_by_tokens: world_size must be >= 1, got {world_size}")
    keys: dict[tuple[int, ...], int] = {}  # prompt identity as packing sees it (equal token ids share one copy)
    prompt = [keys.setdefault(tuple(p), len(keys)) for p in prompt_ids]
    live = [bool(r) for r in response_ids]
    shared = [len(p) if pack_prompts else 0 for p in prompt_ids]  # the part of a cost paid once per rank
    own = [len(p) + len(r) - 1 - s if r else 0 for p, r, s in zip(prompt_ids, response_ids, shared, strict=True)]
    units: dict[int, list[int]] = {}
    for i in range(len(prompt_ids)):
        units.setdefault(prompt[i] if pack_prompts and live[i] else -1 - i, []).append(i)

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
    for rows in order:
        place(rows, min(range(world_size), key=lambda k: (load[k], k)))

    while True:
        a = max(range(world_size), key=lambda k: (load[k], -k))
        by_load = sorted(range(world_size), key=lambda k: (load[k], k))
        pieces = [[i] for rows in held[a].values() for i in rows]
        pieces += [rows for rows in held[a].values() if pack_prompts and len(rows) > 1]
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


def rank_loads(
    prompt_ids: list[list[int]], response_ids: list[list[int]], split: list[list[int]], *, pack_prompts: bool = False
) -> list[int]:
    """Forward tokens of each rank under `split` (the cost `split_by_tokens` balances)."""
    loads = []
    for rows in split:
        live = [i for i in rows if response_ids[i]]
        tokens = sum(len(prompt_ids[i]) + len(response_ids[i]) - 1 for i in live)
        if pack_prompts:  # each distinct prompt once
            tokens -= sum(len(prompt_ids[i]) for i in live) - sum(len(q) for q in {tuple(prompt_ids[i]) for i in live})
        loads.append(tokens)
    return loads


def plan_micro_batches(seq_lengths: list[int], token_budget: int) -> list[list[int]]:
    """Split sequences into micro-batches of at most `token_budget` padded tokens, longest first.

    Among the splits of the length-sorted sequences into consecutive runs, the one with the fewest micro-batches
    (each is a forward and backward pass, and at ZeRO-3 a gather of every parameter), and among those the fewest
    padded tokens (compute spent on nothing). Filling each micro-batch to the budget before opening the next gives
    the fewest passes but can pad a lot: [20K, 6K | 3K, 1K] at a 45K budget computes 46K tokens, [20K | 6K, 3K, 1K]
    38K.

    Args:
        seq_lengths: model-input length of each sequence (0: nothing to compute, left out).
        token_budget: max rows x longest row per micro-batch; a longer sequence gets a micro-batch to itself.

    Returns:
        Lists of sequence indices; each list is sorted by length, longest first (the first micro-batch is the
        most memory-hungry, so an out-of-memory shows up at once).
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


def plan_packed_micro_batches(
    prompt_ids: list[list[int]], response_ids: list[list[int]], token_budget: int
) -> list[list[list[int]]]:
    """Split sequences into packed rows (one prompt, then the responses that share it) and the rows into
    micro-batches of at most `token_budget` padded tokens, as `plan_micro_batches` does for plain rows.

    A group whose packed row would exceed the budget is cut into several rows (each repeats the prompt).
    Returns micro-batches as lists of packed rows, each a list of sequence indices (empty responses left out).
    """
    groups: dict[tuple[int, ...], list[int]] = {}
    for i, (p, r) in enumerate(zip(prompt_ids, response_ids, strict=True)):
        if r:
            groups.setdefault(tuple(p), []).append(i)
    rows: list[list[int]] = []
    for prompt, members in groups.items():
        row: list[int] = []
        width = len(prompt)
        for i in sorted(members, key=lambda i: (-len(response_ids[i]), i)):
            extra = len(response_ids[i]) - 1  # the last response token is never an input
            if row and width + extra > token_budget:
                rows.append(row)
                row, width = [], len(prompt)
            row.append(i)
            width += extra
        rows.append(row)
    lengths = [packed_length(prompt_ids, response_ids, row) for row in rows]
    return [[rows[k] for k in mb] for mb in plan_micro_batches(lengths, token_budget)]


def packed_length(prompt_ids: list[list[int]], response_ids: list[list[int]], row: list[int]) -> int:
    """Model-input length of a packed row: the shared prompt once, then each response but its last token."""
    return len(prompt_ids[row[0]]) + sum(len(response_ids[i]) - 1 for i in row)


@dataclass
class MicroBatch:
    """Right-padded model inputs of some rows and where their response tokens' predictions sit.

    input_ids, attention_mask: [B, L] (prompt + response[:-1], the last token predicts nothing). Packed
    (`collate_packed`): attention_mask is a [B, 1, L, L] bool block mask (True: may attend) and position_ids
    [B, L] restart each response at its prompt's length.
    positions: [T] flat indices into B*L of the hidden states that predict `targets` [T] (the rows' response
    tokens, row by row). `rows`: the batch rows, in micro-batch order. `token_rows`, `token_cols`: [T] each, the
    (row in the batch, response position) of each target, to gather per-token batch tensors.
    """

    rows: list[int]
    input_ids: Tensor
    attention_mask: Tensor
    positions: Tensor
    targets: Tensor
    token_rows: Tensor
    token_cols: Tensor
    position_ids: Tensor | None = None


def collate(prompt_ids: list[list[int]], response_ids: list[list[int]], rows: list[int], pad_id: int = 0) -> MicroBatch:
    """Build the padded micro-batch of `rows` (indices into prompt_ids / response_ids)."""
    seqs = [prompt_ids[i] + response_ids[i][:-1] for i in rows]
    width = max(len(s) for s in seqs)
    input_ids = torch.full((len(rows), width), pad_id, dtype=torch.long)
    attention = torch.zeros(len(rows), width, dtype=torch.long)
    positions, targets, token_rows, token_cols = [], [], [], []
    for b, (i, s) in enumerate(zip(rows, seqs, strict=True)):
        input_ids[b, : len(s)] = torch.as_tensor(s, dtype=torch.long)
        attention[b, : len(s)] = 1
        p, r = len(prompt_ids[i]), len(response_ids[i])
        # Hidden state at position p - 1 + t predicts response token t.
        positions.append(b * width + p - 1 + torch.arange(r))
        targets.append(torch.as_tensor(response_ids[i], dtype=torch.long))
        token_rows.append(torch.full((r,), i, dtype=torch.long))
        token_cols.append(torch.arange(r))
    return MicroBatch(
        rows=list(rows),
        input_ids=input_ids,
        attention_mask=attention,
        positions=torch.cat(positions),
        targets=torch.cat(targets),
        token_rows=torch.cat(token_rows),
        token_cols=torch.cat(token_cols),
    )


def collate_packed(
    prompt_ids: list[list[int]], response_ids: list[list[int]], rows: list[list[int]], pad_id: int = 0
) -> MicroBatch:
    """Build the micro-batch of packed `rows` (from `plan_packed_micro_batches`): row b is the shared prompt P
    (length p) then response[:-1] of each member. Response token 0 is predicted at position p - 1 (the
    prompt's last token, shared), token t > 0 at the response's own token t - 1; positions restart at p for
    each response, and each response attends to the whole prompt and causally to itself."""
    widths = [packed_length(prompt_ids, response_ids, row) for row in rows]
    width = max(widths)
    input_ids = torch.full((len(rows), width), pad_id, dtype=torch.long)
    position_ids = torch.zeros(len(rows), width, dtype=torch.long)
    # Padding attends to itself only: a query row with nothing to attend to is NaN under sdpa's bool mask.
    mask = torch.eye(width, dtype=torch.bool).repeat(len(rows), 1, 1)
    causal = torch.ones(width, width, dtype=torch.bool).tril()
    positions, targets, token_rows, token_cols = [], [], [], []
    for b, row in enumerate(rows):
        prompt = prompt_ids[row[0]]
        p = len(prompt)
        input_ids[b, :p] = torch.as_tensor(prompt, dtype=torch.long)
        position_ids[b, :p] = torch.arange(p)
        mask[b, :p, :p] = causal[:p, :p]
        start = p
        for i in row:
            if prompt_ids[i] != prompt:
                raise ValueError(f"collate_packed: row {b} mixes prompts (sequence {i})")
            resp = response_ids[i]
            n = len(resp) - 1
            end = start + n
            input_ids[b, start:end] = torch.as_tensor(resp[:-1], dtype=torch.long)
            position_ids[b, start:end] = torch.arange(p, p + n)
            mask[b, start:end, :p] = True
            mask[b, start:end, start:end] = causal[:n, :n]
            # token 0 <- prompt's last position; token t > 0 <- this response's token t - 1
            positions.append(b * width + torch.cat([torch.tensor([p - 1]), torch.arange(start, end)]))
            targets.append(torch.as_tensor(resp, dtype=torch.long))
            token_rows.append(torch.full((n + 1,), i, dtype=torch.long))
            token_cols.append(torch.arange(n + 1))
            start = end
    return MicroBatch(
        rows=[i for row in rows for i in row],
        input_ids=input_ids,
        attention_mask=mask.unsqueeze(1),
        positions=torch.cat(positions),
        targets=torch.cat(targets),
        token_rows=torch.cat(token_rows),
        token_cols=torch.cat(token_cols),
        position_ids=position_ids,
    )


def dummy_micro_batch() -> MicroBatch:
    """A one-token micro-batch whose loss a rank multiplies by 0: it keeps the number of forward/backward passes
    equal on every rank (ZeRO gathers and reduces parameters collectively in each pass)."""
    return collate([[0]], [[0]], [0])
