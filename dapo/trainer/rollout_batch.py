"""The rollout step's batch (`RolloutBatch`): advantages, the overlong-filter loss mask, and the shuffled
mini-batches, built from the kept groups. What the learner receives is its view of it, `dapo.learner.PolicyBatch`.

The paper's sections 2.2 (GRPO's group-normalised advantage) and 3.4 (overlong filtering). From the kept groups of a
rollout step:

- advantages A_i = (r_i - mean(r_group)) / (std(r_group) + 1e-6) on the *shaped* rewards, every response of the
  group included (overlong filtering leaves truncated responses' rewards in their group's mean and std);
- loss mask: 1 on response tokens; with overlong filtering a truncated response's row is all 0, so it is left
  out of every token count of the aggregation (row 1);
- mini-batches: `mini_batch_size` prompts each (a group never splits across mini-batches, so group-token-mean
  sees whole groups), in a fresh seeded shuffle for each of `epochs` passes.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass, field, fields, replace

import numpy as np
import torch
from torch import Tensor

from dapo.algos.advantages import group_advantages
from dapo.algos.overlong import overlong_loss_mask
from dapo.learner.batch import PolicyBatch, pad_rows
from dapo.trainer.collect import Group


@dataclass
class RolloutBatch:
    """N responses, flattened group by group (G consecutive rows per prompt). Tensors are right-padded to T, the
    longest response in the batch."""

    prompt_ids: list[list[int]]
    response_ids: list[list[int]]
    group_ids: Tensor  # [N] long, index of the prompt (group) each response belongs to
    advantages: Tensor  # [N] float32
    truncated: Tensor  # [N] bool, finish reason "length"
    response_mask: Tensor  # [N, T] float32, 1 on response tokens
    loss_mask: Tensor  # [N, T] float32, response_mask with filtered rows zeroed
    engine_logprobs: Tensor | None = None  # [N, T] the engine's, of its samples (None: an engine that gives none)
    old_logprobs: Tensor | None = None  # [N, T] from the learner, before any update of the step
    entropy: Tensor | None = None  # [N, T] of the old policy on the sampled tokens
    ref_logprobs: Tensor | None = None  # [N, T] of the frozen reference policy (only with the KL term)
    is_weights: Tensor | None = None  # [N, T] the rollout correction's weights (algorithm.rollout_correction)
    correction: dict[str, float] = field(default_factory=dict)  # what the correction did (its metrics)

    def __len__(self) -> int:
        return len(self.response_ids)

    def to_policy_batch(self) -> PolicyBatch:
        """The learner's view (`dapo.learner.PolicyBatch`): ids, advantages, loss mask, groups, old (and
        reference) log-probs."""
        return PolicyBatch(
            prompt_ids=self.prompt_ids,
            response_ids=self.response_ids,
            advantages=self.advantages,
            loss_mask=self.loss_mask,
            group_ids=self.group_ids,
            old_logp=self.old_logprobs,
            ref_logp=self.ref_logprobs,
            is_weights=self.is_weights,
        )

    def rows(self, idx: Sequence[int]) -> RolloutBatch:
        """A sub-batch of the given response rows (padding width kept)."""
        ix = torch.as_tensor(list(idx), dtype=torch.long)
        out = {}
        for f in fields(self):
            v = getattr(self, f.name)
            if isinstance(v, Tensor):
                out[f.name] = v[ix]
            elif isinstance(v, list):
                out[f.name] = [v[i] for i in idx]
            else:
                out[f.name] = v
        return replace(self, **out)


def build_batch(groups: Sequence[Group], *, norm_adv_by_std: bool, overlong_filter: bool) -> RolloutBatch:
    """Advantages and loss masks for the groups that train.

    Args:
        groups: B groups of G responses each.
        norm_adv_by_std: GRPO's std division (False: Dr. GRPO).
        overlong_filter: row 1's toggle, truncated responses get loss weight 0.
    """
    if not groups:
        raise ValueError("no groups to train on")
    rewards = torch.tensor([g.rewards for g in groups], dtype=torch.float32)  # [B, G]
    adv = group_advantages(rewards, norm_by_std=norm_adv_by_std).reshape(-1)  # [B*G]
    samples = [s for g in groups for s in g.samples]
    lengths = torch.tensor([len(s.response_ids) for s in samples])
    width = max(int(lengths.max()), 1)
    response_mask = (torch.arange(width)[None, :] < lengths[:, None]).to(torch.float32)  # [N, T]
    truncated = torch.tensor([s.finish_reason == "length" for s in samples], dtype=torch.bool)
    loss_mask = overlong_loss_mask(response_mask, truncated) if overlong_filter else response_mask.clone()
    group_ids = torch.arange(len(groups)).repeat_interleave(torch.tensor([len(g.samples) for g in groups]))
    engine_logprobs = (
        pad_rows([s.logprobs for s in samples], width)  # type: ignore[misc]
        if all(s.logprobs is not None for s in samples)
        else None
    )
    return RolloutBatch(
        prompt_ids=[list(g.prompt_ids) for g in groups for _ in g.samples],
        response_ids=[list(s.response_ids) for s in samples],
        group_ids=group_ids,
        advantages=adv,
        truncated=truncated,
        response_mask=response_mask,
        loss_mask=loss_mask,
        engine_logprobs=engine_logprobs,
    )


def minibatch_plan(num_groups: int, mini_batch_size: int, epochs: int, seed: int, step: int) -> list[list[int]]:
    """Group indices of each mini-batch, in update order.

    Each epoch draws a fresh permutation from (seed, step, epoch), so the plan is a function of the step alone
    and a resumed run reproduces it without saved state. A last, smaller mini-batch takes the remainder when
    dynamic sampling stopped short at its cap.
    """
    plan = []
    for epoch in range(epochs):
        perm = np.random.default_rng([seed, step, epoch]).permutation(num_groups)
        plan += [perm[i : i + mini_batch_size].tolist() for i in range(0, num_groups, mini_batch_size)]
    return plan


def group_rows(batch: RolloutBatch, group_idx: Sequence[int]) -> list[int]:
    """Response rows of the given groups, group by group."""
    gid = batch.group_ids
    return [int(r) for g in group_idx for r in (gid == g).nonzero().flatten()]
