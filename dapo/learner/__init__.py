"""The learner: the policy under DeepSpeed, behind one small interface.

    from dapo.learner import Learner, LossSpec, PolicyBatch, response_mask

    learner = Learner(model_path, loss=LossSpec(eps_low=0.2, eps_high=0.28, loss_agg="token-mean"),
                      lr=1e-6, warmup_steps=20, weight_decay=0.1, grad_clip=1.0, zero_stage=2,
                      dtype="auto", micro_batch_tokens=32768)
    batch = PolicyBatch(prompt_ids, response_ids, advantages, loss_mask, group_ids)   # every rank: the whole batch
    batch.old_logp, entropy = learner.compute_logprobs(batch)     # no grad; each rank its shard, all get every row
    learner.schedule(step)                                        # the lr of rollout step `step` (0-based): warm-up
    for rows in mini_batches:                                     # e.g. 16 per rollout step (paper)
        metrics = learner.update(batch.select(rows))              # one optimizer step, each rank on its shard
    engine.sync_weights(learner.named_parameters_for_sync())      # HF names, full tensors (gathered on ZeRO-3)
    learner.save_checkpoint(dir); learner.load_checkpoint(dir)    # model + optimizer + schedule, exact
    learner.save_hf(dir)                                          # final model + tokenizer files

The contracts (collective calls, the global normaliser, the lr schedule, non-finite steps): docs/architecture.md,
"learner/".
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
