"""What a run needs per GPU before anything is scheduled: the memory budget of the colocated design, in its two
phases (`memory_budget`), and why a plan cannot run (`plan_problems`, `context_problem`). Plain values in,
dataclasses out; docs/cost.md, "Memory per GPU", works the paper's preset through by hand."""

from __future__ import annotations

import dataclasses
import math
from dataclasses import dataclass

from dapo.decode import kv_bytes_per_token_per_gpu
from dapo.shapes import ModelShape

GIB = 1024**3
# DeepSpeed's default reduce_bucket_size (elements): the gradient bucket it reduce-scatters at once.
ZERO_REDUCE_BUCKET = 500_000_000


# --------------------------------------------------------------------------------------------- memory
@dataclass(frozen=True)
class MemoryInputs:
    """Everything the per-GPU budget depends on, as plain values (the workflow fills it from the preset)."""

    shape: ModelShape
    dtype_bytes: int
    world_size: int
    tensor_parallel: int
    zero_stage: int
    gpu_memory_gib: float
    gpu_memory_utilization: float  # vLLM's share of the GPU
    max_model_len: int  # prompt + response cap: vLLM must hold one such sequence
    mean_seq_tokens: float  # prompt + response, for "sequences at the mean length"
    micro_batch_tokens: int
    logprob_chunk_tokens: int
    gradient_checkpointing: bool
    sleep_mode: bool  # the engine sleeps during updates
    sleep_level: int  # 1: weights to host memory; 2: weights dropped (both free the GPU)
    allowance_gib: float  # CUDA context, NCCL buffers, what vLLM keeps while asleep, fragmentation
    vllm_batched_tokens: int
    vllm_max_seqs: int


@dataclass(frozen=True)
class Line:
    label: str
    gib: float
    how: str  # the arithmetic
    depth: int = 0  # 1: a part of the line above (not added again)


@dataclass(frozen=True)
class MemoryBudget:
    inputs: MemoryInputs
    generation: tuple[Line, ...]
    training: tuple[Line, ...]
    kv_cache_gib: float
    kv_tokens_per_replica: int
    notes: tuple[str, ...]

    @property
    def generation_gib(self) -> float:
        return sum(x.gib for x in self.generation if x.depth == 0)

    @property
    def training_gib(self) -> float:
        return sum(x.gib for x in self.training if x.depth == 0)

    @property
    def peak_gib(self) -> float:
        return max(self.generation_gib, self.training_gib)

    @property
    def peak_phase(self) -> str:
        return "generation" if self.generation_gib >= self.training_gib else "training"


def _b(n: float) -> str:
    """A parameter or element count, short: 32.76B, 778.6M, 45,056."""
    return f"{n / 1e9:.2f}B" if n >= 1e9 else f"{n / 1e6:.1f}M" if n >= 1e6 else f"{n:,.0f}"


def zero_state_bytes_per_param(dtype_b: int, zero_stage: int, world: int) -> tuple[float, str]:
    """Bytes per parameter a GPU holds for the learner's states under ZeRO, and the formula (docs/cost.md, "Memory
    per GPU"): weight, gradient and AdamW's state (fp32 master weight and two moments in mixed precision)."""
    parts = [(dtype_b, zero_stage >= 3), (dtype_b, zero_stage >= 2), (12 if dtype_b == 2 else 8, zero_stage >= 1)]
    whole = [x for x, sharded in parts if not sharded]
    split = [x for x, sharded in parts if sharded]
    terms = ([f"{' + '.join(map(str, whole))} B"] if whole else []) + (
        [f"({' + '.join(map(str, split))}) B / {world}"] if split else []
    )
    return sum(whole) + sum(split) / world, " + ".join(terms)


def activation_bytes_per_token_layer(s: ModelShape, b: int) -> int:
    """What one decoder layer saves for backward, per token, item by item in docs/cost.md, "Memory per GPU"."""
    return 8 * s.hidden + 2 * b * s.hidden + 4 * b * (s.q_dim + s.kv_dim) + 4 * b * s.intermediate


def memory_budget(m: MemoryInputs) -> MemoryBudget:
    """Per-GPU memory of the colocated design in its two phases, each line with its arithmetic."""
    s, b, w, tp = m.shape, m.dtype_bytes, m.world_size, m.tensor_parallel
    total = m.gpu_memory_gib
    p = s.params
    notes: list[str] = []

    # --- generation: vLLM's share (weights shard, activations, KV cache) beside the learner's resident states
    pool = m.gpu_memory_utilization * total
    weights = p * b / tp / GIB
    act_tok = 2 * s.hidden + (s.q_dim + 2 * s.kv_dim + 3 * s.intermediate) // tp
    vllm_act = (m.vllm_batched_tokens * act_tok * b + m.vllm_max_seqs * s.vocab * 4 * 2) / GIB
    kv = pool - weights - vllm_act
    kv_heads_gpu = max(1, s.kv_heads // tp)  # vLLM replicates KV heads when TP exceeds them
    kv_tok = kv_bytes_per_token_per_gpu(s, b, tp)
    kv_tokens = max(0, int(kv * GIB // kv_tok))
    states, states_how = zero_state_bytes_per_param(b, m.zero_stage, w)
    learner = Line("learner states", p * states / GIB, f"{_b(p)} x {states_how}")
    big = s.largest_module_params
    gen = [
        Line("vLLM share", pool, f"{m.gpu_memory_utilization:g} x {total:g} GiB (rollout.gpu_memory_utilization)"),
        Line("weights", weights, f"{_b(p)} params x {b} B / TP {tp}", depth=1),
        Line(
            "activations",
            vllm_act,
            f"{m.vllm_batched_tokens:,} batched tokens x {act_tok * b:,} B + {m.vllm_max_seqs:,} seqs x "
            f"{s.vocab:,} x 4 B x 2 (sampler logits, probs)",
            depth=1,
        ),
        Line(
            "KV cache",
            kv,
            f"{pool:.1f} - {weights:.1f} - {vllm_act:.1f}: {kv_tokens:,} tokens per replica at {kv_tok // 1024} KiB "
            f"per token per GPU ({s.layers} layers x {kv_heads_gpu} KV heads x {s.d_head} x 2 (K, V) x {b} B); "
            f"{kv_tokens // m.max_model_len:,} sequences of {m.max_model_len:,}, "
            f"{int(kv_tokens // max(1.0, m.mean_seq_tokens)):,} of {m.mean_seq_tokens:,.0f} (the mean)",
            depth=1,
        ),
        learner,
    ]
    if m.zero_stage == 3:
        gen.append(Line("weight sync", big * b / GIB, f"one gathered parameter at a time: {_b(big)} x {b} B"))
    gen.append(Line("allowance", m.allowance_gib, "CUDA context, NCCL buffers, fragmentation (plan.allowance_gib)"))

    # --- training: the learner's states, working set, activations and head; the engine asleep
    t = m.micro_batch_tokens
    tr: list[Line] = []
    if m.sleep_mode:
        tr.append(Line("vLLM (asleep)", 0.0, f"sleep level {m.sleep_level} frees its weights and KV cache"))
    else:
        tr.append(Line("vLLM (awake)", pool, "rollout.enable_sleep_mode is false: its share stays allocated"))
    tr.append(learner)
    bucket = min(ZERO_REDUCE_BUCKET, p)
    bucket_how = f"reduce bucket {_b(bucket)} x {b} B"
    if m.zero_stage == 3:
        work = f"largest gathered module and its full gradient 2 x {_b(big)} x {b} B + {bucket_how}"
        tr.append(Line("ZeRO-3 working set", (2 * big + bucket) * b / GIB, work))
    elif m.zero_stage == 2:
        tr.append(Line("ZeRO-2 buckets", bucket * b / GIB, bucket_how))
    per_layer = activation_bytes_per_token_layer(s, b)
    if m.gradient_checkpointing:
        ckpt = s.layers * t * s.hidden * b
        recompute = t * per_layer
        mlp_grads = 2 * t * s.intermediate * b
        act = ckpt + recompute + mlp_grads
        act_how = (
            f"checkpoints {s.layers} layers x {t:,} tokens x {s.hidden} x {b} B = {ckpt / GIB:.1f}; one layer "
            f"recomputed {t:,} x {per_layer:,} B = {recompute / GIB:.1f}; its MLP gradients 2 x {t:,} x "
            f"{s.intermediate} x {b} B = {mlp_grads / GIB:.1f}"
        )
    else:
        act = s.layers * t * per_layer
        act_how = f"{s.layers} layers x {t:,} tokens x {per_layer:,} B (no gradient checkpointing)"
    tr.append(Line("activations", act / GIB, f"trainer.micro_batch_tokens: {act_how}"))
    chunk = min(m.logprob_chunk_tokens, t)
    head = 2 * t * s.hidden * b + 3 * chunk * s.vocab * 4 + s.embedding_params * 4  # input and its grad, chunks, grad
    how = (
        f"hidden states and their gradient 2 x {t:,} x {s.hidden} x {b} B + chunk buffers 3 x {chunk} x "
        f"{s.vocab:,} x 4 B (trainer.logprob_chunk_size) + the head's fp32 gradient {_b(s.embedding_params)} x 4 B"
    )
    tr.append(Line("log-prob head", head / GIB, how))
    tr.append(Line("allowance", m.allowance_gib, "CUDA context, NCCL buffers, vLLM asleep, fragmentation"))
    if m.sleep_mode and m.sleep_level == 1:
        notes.append(f"sleep level 1 keeps the weights in host memory: {weights:.1f} GiB per GPU of pinned host memory")
    return MemoryBudget(m, tuple(gen), tuple(tr), kv, kv_tokens, tuple(notes))


def plan_problems(budget: MemoryBudget) -> list[str]:
    """Why the plan cannot run on this GPU, each with the key to change and a value that fits; [] if it fits."""
    m, total = budget.inputs, budget.inputs.gpu_memory_gib
    out: list[str] = []
    beside_pool = budget.generation_gib - m.gpu_memory_utilization * total
    util_max = math.floor(100 * (total - beside_pool) / total) / 100  # rounded down: the value given must fit
    util_fix = (
        f"rollout.gpu_memory_utilization ({m.gpu_memory_utilization:g}; at most {util_max:.2f} fits beside the learner)"
    )
    if budget.kv_cache_gib <= 0:
        out.append(
            f"vLLM's share ({m.gpu_memory_utilization:g} x {total:g} GiB) does not hold its weights and activations: "
            f"raise {util_fix} or rollout.tensor_parallel_size ({m.tensor_parallel})"
        )
    elif budget.kv_tokens_per_replica < m.max_model_len:
        out.append(
            f"the KV cache holds {budget.kv_tokens_per_replica:,} tokens per replica, less than one sequence of "
            f"{m.max_model_len:,} (data.max_prompt_length + rollout.max_response_length; vLLM refuses to start): "
            f"raise {util_fix} or rollout.tensor_parallel_size ({m.tensor_parallel}), or lower "
            "rollout.max_response_length"
        )
    if budget.generation_gib > total:
        out.append(
            f"generation needs {budget.generation_gib:.1f} GiB > {total:g} GiB: lower rollout.gpu_memory_utilization "
            f"({m.gpu_memory_utilization:g}) to at most {util_max:.2f}"
        )
    if budget.training_gib > total:
        # training memory is linear in the micro-batch from one log-prob chunk up: solve for the largest that fits
        t0 = m.logprob_chunk_tokens
        at_t0 = memory_budget(dataclasses.replace(m, micro_batch_tokens=t0)).training_gib
        slope = (memory_budget(dataclasses.replace(m, micro_batch_tokens=t0 + 1024)).training_gib - at_t0) / 1024
        t_max = int(t0 + (total - at_t0) / slope)
        if at_t0 < total:
            fix = (
                f"lower trainer.micro_batch_tokens ({m.micro_batch_tokens:,}) to at most {t_max:,} "
                f"({slope * 1000:.2f} GiB per 1,000 tokens)"
            )
        else:
            fix = (
                f"even a micro-batch of {t0} tokens needs {at_t0:.1f} GiB: spread the learner's states over more "
                "GPUs (resources.train.nodes) or use a larger GPU (resources.train.gpu_model)"
            )
        out.append(f"training needs {budget.training_gib:.1f} GiB > {total:g} GiB: {fix}")
    return out


def render_memory(budget: MemoryBudget) -> str:
    """The budget as text, one line per item with its arithmetic."""
    rows = []
    phases = (
        ("generation (engine awake, learner states resident)", budget.generation, budget.generation_gib),
        ("training (engine asleep)", budget.training, budget.training_gib),
    )
    for title, lines, tot in phases:
        rows.append(f"    {title:<56}{tot:7.1f} GiB")
        for x in lines:
            pad = "  " * x.depth
            rows.append(f"      {pad}{x.label:<{22 - 2 * x.depth}}{x.gib:7.1f}  {x.how}")
    m = budget.inputs
    verdict = "fits" if not plan_problems(budget) else "DOES NOT FIT"
    rows.append(f"    peak {budget.peak_gib:.1f} of {m.gpu_memory_gib:g} GiB ({budget.peak_phase} phase): {verdict}")
    rows += [f"    note: {n}" for n in budget.notes]
    return "\n".join(rows)


def context_problem(max_positions: int, max_model_len: int, model: str) -> str | None:
    """Why sequences of `max_model_len` tokens do not fit the model's context (max_position_embeddings), with the key
    to change; None when they fit or the context is unknown (0). vLLM would refuse such an engine at start-up."""
    if not max_positions or max_model_len <= max_positions:
        return None
    return (
        f"{model} has a context of {max_positions:,} tokens (max_position_embeddings), shorter than "
        f"data.max_prompt_length + rollout.max_response_length (or eval.max_tokens) = {max_model_len:,}: set "
        f"model.config_overrides.max_position_embeddings to at least {max_model_len:,} (the DAPO recipes raise "
        "Qwen2.5-Math's 4,096 to 32,768), or lower rollout.max_response_length"
    )
