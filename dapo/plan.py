"""What a run needs per GPU before anything is scheduled: the colocated design's memory budget in its two phases
(`memory_budget`), and why a plan cannot run (`plan_problems`, `context_problem`). docs/cost.md, "Memory per GPU",
works the paper's preset through by hand."""

from __future__ import annotations

import dataclasses
import math
from dataclasses import dataclass

from dapo.decode import kv_bytes_per_token_per_gpu
from dapo.shapes import ModelShape

GIB = 1024**3
# ZeRO-1/2's buckets (elements), the reduce and the all-gather bucket both, as dapo.learner.optim sets them
# (transformers' DeepSpeed examples, not the 5e8 default). With `overlap_comm` they take about 4.5 x each bucket's
# bytes: transformers' DeepSpeed guide gives the footprint as 5e8 x 2 B x 2 x 4.5 = 9 GB (at 2e8: 3.6 GB), the x 2
# being the two buckets. DeepSpeed 0.19.8's own source agrees in kind: `setup_buckets` in
# runtime/zero/stage_1_and_2.py allocates the reduce bucket twice under `overlap_comm` (double buffering, the full
# bucket size whatever the model's), and `all_gather_dp_groups` gathers the new weights in shards of the all-gather
# bucket.
ZERO2_BUCKET = 200_000_000
ZERO2_BUCKETS = 2  # reduce and all-gather
ZERO2_BUFFERS = 4.5  # overlap_comm's bytes per bucket byte


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
    gpus_per_node: int = 1
    host_memory_gib: float | None = None  # per node (resources.train.mem_mb); None: not checked


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
    host_gib_per_node: float = 0.0  # pinned host memory: offloaded learner states (and level-1 weights), a node's GPUs

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
    """(bytes per parameter a GPU holds for weight, gradient and AdamW state under ZeRO, the formula): docs/cost.md."""
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
    if m.zero_stage >= 1:  # the step offloads them for the engine (DeepSpeed offload_states; ZeRO 0 cannot)
        how = f"offloaded to host memory while the engine generates ({learner.gib:.1f} GiB a GPU, pinned)"
        resident = Line("learner states", 0.0, how)
    else:
        resident = Line("learner states", learner.gib, f"{learner.how}: resident (ZeRO-0 cannot offload them)")
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
        resident,
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
    if m.zero_stage == 3:
        # the reduce and prefetch buckets are hidden^2 and 0.9 hidden^2 elements (dapo.learner.optim)
        work = (
            f"largest gathered module and its full gradient 2 x {_b(big)} x {b} B + buckets 1.9 x {s.hidden}^2 x {b} B"
        )
        tr.append(Line("ZeRO-3 working set", (2 * big + 1.9 * s.hidden**2) * b / GIB, work))
    elif m.zero_stage in (1, 2):
        how = (
            f"overlap_comm's buffers {ZERO2_BUFFERS:g} x {ZERO2_BUCKETS} buckets (reduce, all-gather) x "
            f"{_b(ZERO2_BUCKET)} x {b} B"
        )
        tr.append(Line(f"ZeRO-{m.zero_stage} buckets", ZERO2_BUFFERS * ZERO2_BUCKETS * ZERO2_BUCKET * b / GIB, how))
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
    host = m.gpus_per_node * (learner.gib - resident.gib)
    if m.sleep_mode and m.sleep_level == 1:
        notes.append(f"sleep level 1 keeps the weights in host memory: {weights:.1f} GiB per GPU of pinned host memory")
        host += m.gpus_per_node * weights
    return MemoryBudget(m, tuple(gen), tuple(tr), kv, kv_tokens, tuple(notes), host)


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
    final_save = m.shape.params * m.dtype_bytes / GIB  # rank 0 gathers the whole model for the final save
    if m.host_memory_gib is not None and budget.host_gib_per_node + final_save > m.host_memory_gib:
        out.append(
            f"the learner states offloaded while the engine generates take {budget.host_gib_per_node:.0f} GiB of "
            f"pinned host memory per node ({m.gpus_per_node} GPUs) and the final save gathers {final_save:.0f} GiB "
            f"more: {budget.host_gib_per_node + final_save:.0f} GiB > resources.train.mem_mb ({m.host_memory_gib:.0f} "
            "GiB): "
            f"raise resources.train.mem_mb, or shard the states further (trainer.zero_stage {m.zero_stage} -> "
            f"{min(3, m.zero_stage + 1)}, or more nodes)"
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
        ("generation (engine awake; learner states offloaded at ZeRO 1-3)", budget.generation, budget.generation_gib),
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
    """Why `max_model_len` does not fit max_position_embeddings (vLLM would refuse to start), with the key to change;
    None when it fits or the context is unknown (0)."""
    if not max_positions or max_model_len <= max_positions:
        return None
    return (
        f"{model} has a context of {max_positions:,} tokens (max_position_embeddings), shorter than "
        f"data.max_prompt_length + rollout.max_response_length (or eval.max_tokens) = {max_model_len:,}: set "
        f"model.config_overrides.max_position_embeddings to at least {max_model_len:,} (the DAPO recipes raise "
        "Qwen2.5-Math's 4,096 to 32,768), or lower rollout.max_response_length"
    )


# --------------------------------------------------------------------------------------------- ZeRO stage
@dataclass(frozen=True)
class StageOption:
    stage: int
    problems: tuple[str, ...]  # why it does not fit ([] : it fits)
    gb_per_step: float  # what each GPU sends (and receives) in ZeRO's collectives in one rollout step


def zero_traffic_gb(
    stage: int, params: float, dtype_b: int, world: int, updates: int, micro: int, forward: int
) -> float:
    """GB each GPU moves in ZeRO's collectives per rollout step (`updates` of `micro` micro-batches, `forward` no-grad
    ones; a ring moves (W - 1) / W; docs/distributed.md, "ZeRO's collectives"): ZeRO 0-1 2 P per update, ZeRO-2
    (micro + 1) P, ZeRO-3 3 micro P per update + forward P, plus one P for the weight sync's gather."""
    ring = (world - 1) / world
    p = params * dtype_b * ring / 1e9
    if stage <= 1:
        return updates * 2 * p
    if stage == 2:
        return updates * (micro + 1) * p
    return updates * 3 * micro * p + (forward + 1) * p


def zero_stage_options(m: MemoryInputs, updates: int, micro: int, forward: int) -> list[StageOption]:
    """Every ZeRO stage with why it does not fit at `m` (its memory budget's problems) and its traffic per step."""
    return [
        StageOption(
            stage,
            tuple(plan_problems(memory_budget(dataclasses.replace(m, zero_stage=stage)))),
            zero_traffic_gb(stage, m.shape.params, m.dtype_bytes, m.world_size, updates, micro, forward),
        )
        for stage in (0, 1, 2, 3)
    ]


def best_zero_stage(options: list[StageOption]) -> StageOption | None:
    """The stage that fits with the least traffic (None: none fits); at equal traffic (one GPU) the one holding less,
    but not ZeRO-3, whose hooks gather and release every layer in every pass even with nothing to move."""
    fitting = [o for o in options if not o.problems]
    return min(fitting, key=lambda o: (round(o.gb_per_step, 6), o.stage == 3, -o.stage), default=None)


def render_zero_choice(options: list[StageOption], chosen: int) -> str:
    """One line per stage: fits or why not, and its traffic; the best marked, and the run's own."""
    best = best_zero_stage(options)
    rows = []
    for o in options:
        mark = " <- the least traffic that fits" if best is not None and o.stage == best.stage else ""
        mine = " (trainer.zero_stage)" if o.stage == chosen else ""
        why = "fits" if not o.problems else "does not fit: " + o.problems[0].split(":")[0]
        rows.append(f"      ZeRO-{o.stage}{mine}: {o.gb_per_step:,.0f} GB a GPU per step; {why}{mark}")
    return "\n".join(rows)
