"""The rollout step's batch, built from the kept groups: advantages, the overlong-filter loss mask, and the shuffled
mini-batches. It is the learner's own type, `dapo.learner.PolicyBatch`, from here to the updates: one batch, one name
for each of its tensors (`old_logp`, the old policy's log-probs, set by the step).

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

import numpy as np
import torch

from dapo.algos.advantages import group_advantages
from dapo.algos.overlong import overlong_loss_mask
from dapo.learner.batch import PolicyBatch, pad_rows
from dapo.trainer.collect import Group


def build_batch(groups: Sequence[Group], *, norm_adv_by_std: bool, overlong_filter: bool) -> PolicyBatch:
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
    engine_logp = (
        pad_rows([s.logprobs for s in samples], width)  # type: ignore[misc]
        if all(s.logprobs is not None for s in samples)
        else None
    )
    return PolicyBatch(
        prompt_ids=[list(g.prompt_ids) for g in groups for _ in g.samples],
        response_ids=[list(s.response_ids) for s in samples],
        advantages=adv,
        loss_mask=loss_mask,
        group_ids=group_ids,
        truncated=truncated,
        response_mask=response_mask,
        engine_logp=engine_logp,
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


def group_rows(batch: PolicyBatch, group_idx: Sequence[int]) -> list[int]:
    """Response rows of the given groups, group by group."""
    gid = batch.group_ids
    return [int(r) for g in group_idx for r in (gid == g).nonzero().flatten()]
