"""What occupies each GPU in each phase of a colocated rollout step (engine and learner on the same GPUs), for
memory budgets (`dapo plan`) and the docs. Plain data: no torch, no vLLM.

A rollout step on every GPU, in order:

1. generation (and evaluation): the learner's states are offloaded to host memory (DeepSpeed `offload_states`,
   ZeRO 1-3); the engine holds its weights (1/tp of the model) and its KV cache;
2. training (old log-probs, updates): the engine sleeps at `ENGINE_SLEEP_LEVEL` (weights and KV cache discarded);
   the learner holds its ZeRO shards (parameters, gradients, optimizer state) and the activations of one
   micro-batch;
3. weight sync: the engine's weight buffers are back (filled by the sync), the learner's shards are resident, and
   one gathered tensor at a time crosses over (`Learner.named_parameters_for_sync`); then the learner offloads
   and the engine's KV cache comes back for the next generation.

Why level 2 and not 1: level 1 copies the engine's weights to host memory and back every step, but the sync
overwrites them right after waking anyway; level 2 skips the copy and the host memory it needs (a full copy of
the weights per GPU).
"""

from __future__ import annotations

from dataclasses import dataclass

# vLLM sleep level used between rollouts (see the module docstring).
ENGINE_SLEEP_LEVEL = 2


@dataclass(frozen=True)
class PhaseResidency:
    """What one GPU holds during one phase: the engine's allocations and the learner's, by name.

    Engine: "weights" (1/tensor_parallel_size of the model), "kv_cache" (the rest of
    `rollout.gpu_memory_utilization`). Learner: "param_shards", "grad_shards", "optimizer_shards" (1/world of
    each at ZeRO-3; ZeRO-1/2 shard only gradients and optimizer state), "activations" (one micro-batch of
    `trainer.micro_batch_tokens`), "gathered_tensor" (one full parameter, during the sync).
    """

    phase: str
    engine: tuple[str, ...]
    learner: tuple[str, ...]


def gpu_residency(zero_stage: int) -> list[PhaseResidency]:
    """The phases of a colocated rollout step and what each GPU holds in them, at the given ZeRO stage. At ZeRO 0
    DeepSpeed cannot offload (a plain torch optimizer), so the learner's states stay through generation."""
    states = ("param_shards", "grad_shards", "optimizer_shards")
    offloaded = zero_stage > 0
    return [
        PhaseResidency("generation", ("weights", "kv_cache"), () if offloaded else states),
        PhaseResidency("training", (), (*states, "activations")),
        PhaseResidency("weight_sync", ("weights",), (*states, "gathered_tensor")),
    ]
