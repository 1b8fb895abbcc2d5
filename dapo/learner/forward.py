"""The per-token forward that the learner and the reference policy share (each holds a `ChunkedForward`): this
rank's responses, in token-budget micro-batches, through the model's chunked log-prob head (`PolicyModule.forward`).

Both run under DeepSpeed, so the same rules hold for both: every rank runs the same number of micro-batch passes
(a rank with fewer runs empty dummy passes), because under ZeRO-3 each forward gathers parameters collectively.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

import torch
from torch import Tensor

from dapo.distributed import DistInfo, all_gather, all_reduce
from dapo.learner.batch import MicroBatch, PolicyBatch, collate, collate_packed, dummy_micro_batch
from dapo.packing import TokenCounts, learner_tokens, plan_micro_batches, plan_packed_micro_batches


@dataclass
class ChunkedForward:
    """Micro-batch planning and the chunked-head forward of a DeepSpeed-wrapped `PolicyModule`: the learner and the
    reference policy each hold one (`.passes`), built once their DeepSpeed engine exists.

    Attributes:
        engine: the DeepSpeed engine around the `PolicyModule`.
        dist: this rank's place in the job (`dapo.distributed.DistInfo`).
        micro_batch_tokens: the token budget of an update's micro-batch (real tokens when packed; rows x longest
            row with `packing: none`).
        forward_micro_batch_tokens: the same for the no-grad passes (old log-probs, the reference's, the covariance
            losses' selection), which keep no activations for a backward.
        chunk_size: positions per chunk of the log-prob head.
        packing: `sequences`, `prompts` or `none` (`dapo.learner.batch`).
    """

    engine: Any
    dist: DistInfo
    micro_batch_tokens: int
    forward_micro_batch_tokens: int
    chunk_size: int
    packing: str

    @property
    def packed(self) -> bool:
        return self.packing != "none"

    def budget(self, forward_only: bool) -> int:
        return self.forward_micro_batch_tokens if forward_only else self.micro_batch_tokens

    def plan(self, batch: PolicyBatch, forward_only: bool = False) -> list[list[Any]]:
        """Micro-batches of this rank (sequence indices; lists of packing units when packed), padded with empty ones
        ([]: a dummy pass) to the most any rank has."""
        budget, lengths = self.budget(forward_only), batch.lengths()
        if self.packed:
            plan: list[list[Any]] = plan_packed_micro_batches(lengths, budget, self.packing == "prompts")
        else:
            plan = plan_micro_batches([lengths.input_length(i) for i in range(len(lengths))], budget)
        # At least one pass, so a step always follows a backward (a mini-batch without responses).
        most = max(1, int(all_reduce(torch.tensor([len(plan)], dtype=torch.float64), "max").item()))
        return plan + [[] for _ in range(most - len(plan))]

    def collate(self, batch: PolicyBatch, item: list[Any]) -> MicroBatch:
        """The model inputs of one planned micro-batch ([]: the dummy pass)."""
        if not item:
            return dummy_micro_batch(self.packed)
        if self.packed:
            return collate_packed(batch.prompt_ids, batch.response_ids, item, self.packing == "prompts")
        return collate(batch.prompt_ids, batch.response_ids, item)

    def tokens(self, batch: PolicyBatch, forward_only: bool) -> TokenCounts:
        """What one pass over `batch` (held whole by every rank) computes on all ranks together: no collective."""
        return learner_tokens(batch.lengths(), self.dist.world_size, self.budget(forward_only), self.packing)

    def run(self, mb: MicroBatch, temperature: float, with_entropy: bool) -> tuple[Tensor, Tensor | None]:
        """(log-probs [T], entropies [T] or None) of the micro-batch's targets, logits divided by `temperature`."""
        dev = self.dist.device
        return self.engine(
            input_ids=mb.input_ids.to(dev),
            attention_mask=None if mb.attention_mask is None else mb.attention_mask.to(dev),
            positions=mb.positions.to(dev),
            targets=mb.targets.to(dev),
            temperature=temperature,
            chunk_size=self.chunk_size,
            with_entropy=with_entropy,
            position_ids=None if mb.position_ids is None else mb.position_ids.to(dev),
            packed_row=mb.packed_row,
        )

    def my_rows(self, batch: PolicyBatch) -> list[int]:
        """This rank's token-balanced shard (`PolicyBatch.shard_rows`) of a batch that every rank holds whole, checked
        to be the same size on every rank: a rank that passed only its own part would train on a shard of it."""
        world = self.dist.world_size
        if world > 1:
            size = torch.tensor([len(batch), sum(len(r) for r in batch.response_ids)], dtype=torch.float64)
            if not torch.equal(all_reduce(size, "max"), -all_reduce(-size, "max")):
                raise ValueError(
                    f"rank {self.dist.rank} passed {len(batch)} responses, another rank a batch of another size: "
                    "every rank passes the whole batch to the learner, which takes its own shard"
                )
        return batch.shard_rows(self.dist.rank, world, share_prompts=self.packing == "prompts")

    @torch.no_grad()
    def whole_batch(self, batch: PolicyBatch, temperature: float, with_entropy: bool) -> tuple[Tensor, Tensor | None]:
        """`per_token` of a batch every rank holds whole: each rank computes its token-balanced shard of rows
        (`PolicyBatch.shard_rows`, as the updates split) and the ranks gather every row. Rows are independent here
        (no normaliser), so any split gives the same numbers."""
        if self.dist.world_size == 1:
            return self.per_token(batch, temperature, with_entropy)
        rows = self.my_rows(batch)
        logp, entropy = self.per_token(batch.select(rows), temperature, with_entropy)
        whole = [torch.zeros_like(batch.loss_mask), torch.zeros_like(batch.loss_mask) if with_entropy else None]
        for r, *parts in all_gather((rows, logp, entropy)):
            for out, part in zip(whole, parts, strict=True):
                if r and out is not None:
                    out[r] = part
        return whole[0], whole[1]

    @torch.no_grad()
    def per_token(self, batch: PolicyBatch, temperature: float, with_entropy: bool) -> tuple[Tensor, Tensor | None]:
        """(logp [N, R], entropy [N, R] or None) of this rank's rows, float32 on the CPU, zeros after each response."""
        n, width = batch.loss_mask.shape
        logp = torch.zeros(n, width, dtype=torch.float32)
        entropy = torch.zeros(n, width, dtype=torch.float32) if with_entropy else None
        for rows in self.plan(batch, forward_only=True):
            mb = self.collate(batch, rows)
            lp, ent = self.run(mb, temperature, with_entropy)
            if rows:
                logp[mb.token_rows, mb.token_cols] = lp.float().cpu()
                if entropy is not None:
                    entropy[mb.token_rows, mb.token_cols] = ent.float().cpu()
        return logp, entropy
