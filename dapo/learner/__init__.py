"""The learner: the policy under DeepSpeed, behind one small interface.

    from dapo.learner import Learner, LossSpec, PolicyBatch, response_mask

    learner = Learner(model_path, loss=LossSpec(eps_low=0.2, eps_high=0.28, loss_agg="token-mean"),
                      lr=1e-6, warmup_steps=20, weight_decay=0.1, grad_clip=1.0, zero_stage=2,
                      dtype="auto", micro_batch_tokens=32768)
    batch = PolicyBatch(prompt_ids, response_ids, advantages, loss_mask, group_ids)   # this rank's part
    batch.old_logp, entropy = learner.compute_logprobs(batch)     # no grad; entropy [N, R] to log
    learner.schedule(step)                                        # the lr of rollout step `step` (0-based): warm-up
    for rows in mini_batches:                                     # e.g. 16 per rollout step (paper)
        metrics = learner.update(batch.select(rows))              # one optimizer step; dapo.metric_names keys
    engine.sync_weights(learner.named_parameters_for_sync())      # HF names, full tensors (gathered on ZeRO-3)
    learner.save_checkpoint(dir); learner.load_checkpoint(dir)    # model + optimizer + schedule, exact
    learner.save_hf(dir)                                          # final model + tokenizer files

Contracts:

- Process group: `Learner` joins torchrun / SLURM ranks from the environment, or runs as one process
  (`dapo.distributed`). Every method is collective: every rank calls it, with its own part of the batch.
  A trainer that holds the whole batch on every rank takes its part with `batch.shard(rank, world_size,
  pack_prompts=...)` (sequences with near-equal token counts per rank; a group may straddle ranks, and `update`
  sums the group-token-mean's per-group counts over ranks). Passing the whole batch on every rank is also exact
  (counts and losses both grow W-fold), only the compute is repeated.
- KL to a reference policy (`kl_coef > 0`, off in every DAPO row): `batch.ref_logp` from
  `ReferencePolicy(model_path, ...).compute_logprobs(batch)`, the frozen initial model under the same ranks and
  ZeRO stage (partitioned at ZeRO-3), through the same chunked head (`dapo.learner.reference`).
- Batch (`PolicyBatch`): per response the prompt and response token ids, the advantage, the loss mask over
  response tokens (all 0 for overlong-filtered responses), the group id, old log-probs (for `update`).
  Per-token tensors are [N, R], right-padded. `LossSpec` holds eps_low / eps_high / dual_clip_c / kl_coef /
  loss_agg / seq_token_sum_constant / temperature (plain values; the trainer maps the run config onto them).
- `update` normalises by the whole mini-batch (all micro-batches, all ranks) before any backward pass; the
  gradient equals the world-size-1, single-micro-batch gradient (tests/test_learner.py checks it to 1e-6).
- Learning rate: linear warm-up over `warmup_steps` rollout steps, then constant (`dapo.learner.optim.lr_at`),
  set by `learner.schedule(rollout_step)` from the trainer's step count; every `update` reports it.
- Non-finite loss (any rank) or gradient norm: the step is skipped, weights and optimizer state unchanged,
  `metrics[UPDATE_SKIPPED] == 1.0`.
- dtype "auto": bfloat16 on GPUs that have it, float32 otherwise. ZeRO stages 0-3.
"""

from dapo.distributed import DistInfo, init_distributed, shutdown
from dapo.learner.batch import LossSpec, PolicyBatch, pad_rows, plan_micro_batches, response_mask
from dapo.learner.learner import UPDATE_SKIPPED, Learner
from dapo.learner.optim import lr_at
from dapo.learner.reference import ReferencePolicy

__all__ = [
    "UPDATE_SKIPPED",
    "DistInfo",
    "Learner",
    "LossSpec",
    "PolicyBatch",
    "ReferencePolicy",
    "init_distributed",
    "lr_at",
    "pad_rows",
    "plan_micro_batches",
    "response_mask",
    "shutdown",
]
