"""What the trainer hands the learner (`PolicyBatch`, `LossSpec`), and how a batch becomes micro-batches.

`trainer.packing` says how (docs/architecture.md, "learner/"):

- `sequences` (the default): one row of whole sequences end to end, positions restarting at each, each attending
  causally to itself (`dapo.modeling.packed_attention`); the budget counts real tokens (`collate_packed`). No padding.
- `prompts`: the same, one prompt's responses behind a single copy of it (each attends to it and itself): a prompt is
  computed once per micro-batch, not per response (the tiny worlds' ~100-token prompts before ~30-token responses).
- `none`: length-sorted rows right-padded to the longest, budget rows x longest row (`collate`): transformers' own
  attention with a padding mask, for models the packed attention does not take.

The arithmetic on lengths is `dapo.packing`'s (shared with `perf/learner_padded_fraction` and `dapo plan`); this module
lays the planned micro-batches out.
"""

from __future__ import annotations

from dataclasses import dataclass, replace
from typing import Literal

import torch
from torch import Tensor

from dapo.modeling import PackedRow
from dapo.packing import Lengths, split_by_tokens

Packing = Literal["sequences", "prompts", "none"]


@dataclass(frozen=True)
class LossSpec:
    """The loss hyper-parameters (docs/algorithm.md sections 2 and 3); plain values, fixed for a run.

    eps_low / eps_high: the clip range [1 - eps_low, 1 + eps_high] (naive GRPO 0.2/0.2, DAPO 0.2/0.28), also GSPO's
    sequence clip, Clip-Cov's PPO clip, GMPO's log-ratio clip and DPPO's trust region. dual_clip_c: None for off
    (released recipe 10). kl_coef: k3 KL towards a reference (0 in every DAPO row; needs `ref_logp`).
    seq_token_sum_constant: `seq-mean-token-sum`'s divisor C. temperature divides the logits, as when sampling.
    policy_loss: by name (`dapo.algos.policy_loss`). off_policy_mask: DeepSeek-V3.2's sequence mask threshold
    (`dapo.algos.rollout_correction`), None for off; it reads `engine_logp` (else the old log-probs). max_staleness:
    `rollout.max_staleness`, the oldest a trained token may be (`PolicyBatch.versions`; an update refuses older).
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
    sapo_tau_pos: float = 1.0
    sapo_tau_neg: float = 1.05
    off_policy_mask: float | None = None
    max_staleness: int = 0


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


def pad_versions(rows: list[list[int]], width: int) -> Tensor:
    """Each response token's weight version (carry-over) -> [N, width] int64, -1 after each row."""
    out = torch.full((len(rows), width), -1, dtype=torch.int64)
    for i, r in enumerate(rows):
        out[i, : len(r)] = torch.as_tensor(r, dtype=torch.int64)
    return out


# PolicyBatch's [N, R] fields
PER_TOKEN_FIELDS = (
    "loss_mask", "old_logp", "ref_logp", "is_weights", "response_mask", "engine_logp", "entropy", "versions"
)  # fmt: skip


@dataclass
class PolicyBatch:
    """N sampled responses with what the loss needs. Per-token tensors are [N, R], R >= the longest response,
    right-padded; column t of row i is response token t.

    prompt_ids (templates applied, repeated per response) and response_ids: token ids. advantages [N] float
    (group-normalised, docs/algorithm.md section 2). loss_mask [N, R] float: 1 on tokens that train, 0 on padding and
    overlong-filtered responses. group_ids [N] int: the group's index in the rollout step (the group-token-mean counts
    tokens per id over all ranks). old_logp: the sampling policy's (`Learner.compute_logprobs`), needed by `update`.
    ref_logp: only when `kl_coef > 0`. is_weights: the rollout correction's, multiplying each token's policy loss.
    sample_ids [N]: the index in the step's batch (kept through `select`: keys the covariance draw); None: 0 .. N-1.

    The trainer's own fields (`dapo.trainer.step.policy_batch`), for the step's metrics: `truncated` [N] bool,
    `response_mask` (the loss mask before overlong filtering), `engine_logp` (the engine's log-probs; the learner
    reads it only for the off-policy mask) and `entropy` (the old policy's, on the sampled tokens). `versions` [N, R]
    int64: with carry-over (`rollout.max_staleness` >= 1), the weight version that sampled each token (-1 after the
    response); the learner refuses a trained token older than `LossSpec.max_staleness`.
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
    versions: Tensor | None = None

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
        for name in PER_TOKEN_FIELDS:
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
            versions=pick(self.versions),
        )

    def shard_rows(self, rank: int, world_size: int, *, share_prompts: bool = False) -> list[int]:
        """The rows (ascending) rank `rank` trains on when every rank holds the batch: `split_by_tokens(...)[rank]`,
        deterministic, so the shards partition the batch; a group's responses may land on different ranks."""
        if not 0 <= rank < world_size:
            raise ValueError(f"shard_rows: rank {rank} is outside a world of size {world_size}")
        if world_size == 1:
            return list(range(len(self)))
        return split_by_tokens(self.lengths(), world_size, share_prompts=share_prompts)[rank]

    def lengths(self) -> Lengths:
        """What planning reads of the batch (`dapo.packing`)."""
        return Lengths.of(self.prompt_ids, self.response_ids)


@dataclass
class MicroBatch:
    """Model inputs of some sequences and where their response tokens' predictions sit. Padded (`collate`):
    input_ids, attention_mask [B, L] (prompt + response[:-1]). Packed (`collate_packed`): input_ids, position_ids
    [1, L], no mask, `packed_row`. positions [T]: flat indices into B*L of the hidden states predicting `targets` [T];
    `rows`: batch rows in micro-batch order; `token_rows`, `token_cols` [T]: each target's (batch row, position)."""

    rows: list[int]
    input_ids: Tensor
    attention_mask: Tensor | None
    positions: Tensor
    targets: Tensor
    token_rows: Tensor
    token_cols: Tensor
    position_ids: Tensor | None = None
    packed_row: PackedRow | None = None


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
    prompt_ids: list[list[int]], response_ids: list[list[int]], units: list[list[int]], share_prompts: bool = False
) -> MicroBatch:
    """The packed micro-batch of `units` (`plan_packed_micro_batches`): one row, the units end to end. A `sequences`
    unit is prompt + response[:-1] (token t predicted at p - 1 + t); a `prompts` unit the shared prompt (positions
    0..p-1), then each response[:-1] at positions from p (token 0 predicted at the prompt's last position), each
    seeing the whole prompt and itself causally (its `PackedRow` prefix)."""
    ids: list[int] = []
    pos: list[int] = []
    bounds = [0]
    prefixes: list[tuple[int, int]] = []
    positions, targets, token_rows, token_cols = [], [], [], []

    def document(tokens: list[int], first_position: int, prefix: tuple[int, int] = (0, 0)) -> int:
        start = len(ids)
        ids.extend(tokens)
        pos.extend(range(first_position, first_position + len(tokens)))
        bounds.append(len(ids))
        prefixes.append(prefix)
        return start

    for unit in units:
        prompt = prompt_ids[unit[0]]
        p = len(prompt)
        if not share_prompts:
            (i,) = unit
            start = document(prompt + response_ids[i][:-1], 0)
            positions.append(start + p - 1 + torch.arange(len(response_ids[i])))
        else:
            at = document(list(prompt), 0)
            for i in unit:
                if prompt_ids[i] != prompt:
                    raise ValueError(f"collate_packed: a unit mixes prompts (sequence {i})")
                resp = response_ids[i]
                start = len(ids)
                if len(resp) > 1:
                    document(resp[:-1], p, (at, at + p))
                # token 0 <- the prompt's last position; token t > 0 <- this response's token t - 1
                positions.append(torch.cat([torch.tensor([at + p - 1]), start + torch.arange(len(resp) - 1)]))
        for i in unit:
            targets.append(torch.as_tensor(response_ids[i], dtype=torch.long))
            token_rows.append(torch.full((len(response_ids[i]),), i, dtype=torch.long))
            token_cols.append(torch.arange(len(response_ids[i])))
    return MicroBatch(
        rows=[i for unit in units for i in unit],
        input_ids=torch.tensor([ids], dtype=torch.long),
        attention_mask=None,
        positions=torch.cat(positions),
        targets=torch.cat(targets),
        token_rows=torch.cat(token_rows),
        token_cols=torch.cat(token_cols),
        position_ids=torch.tensor([pos], dtype=torch.long),
        packed_row=PackedRow(tuple(bounds), tuple(prefixes) if share_prompts else None),
    )


def dummy_micro_batch(packed: bool) -> MicroBatch:
    """A one-token micro-batch whose loss is multiplied by 0: equal pass counts on every rank (ZeRO's collectives)."""
    return collate_packed([[0]], [[0]], [[0]]) if packed else collate([[0]], [[0]], [0])
