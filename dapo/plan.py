"""What a run needs per GPU, and what it will cost, before anything is scheduled.

The colocated design: every GPU holds one tensor-parallel shard of a vLLM engine and one ZeRO shard of the
learner. The engine sleeps while the learner updates (its weights and KV cache leave the GPU), and the learner's
sharded states stay resident while the engine generates. Two estimates, both plain arithmetic:

- `memory_budget`: per-GPU memory in each phase, every line with its formula; `plan_problems` says why a plan
  does not fit and which config key to change (the workflow refuses such a plan before submitting a job).
- `row_cost`: tokens per rollout step (dynamic sampling's extra generation batches included), hours per step
  and per row at stated per-GPU throughputs, GPU-hours, and how many SLURM jobs (time limit each) a row needs.

Plain values in, dataclasses out: no Snakemake, torch or config objects. The workflow's dry run prints both
(`print_plan` in workflow/rules/common.smk); docs/cost.md works the paper's preset through by hand, with the
sources of the default throughputs. These are estimates of the order of magnitude, not measurements.
"""

from __future__ import annotations

import dataclasses
import math
from collections.abc import Mapping
from dataclasses import dataclass

from dapo.shapes import ModelShape, PlanError

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
    kv_bytes_per_token_per_gpu: int
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
    if n >= 1e9:
        return f"{n / 1e9:.2f}B"
    if n >= 1e6:
        return f"{n / 1e6:.1f}M"
    return f"{n:,.0f}"


def zero_state_bytes_per_param(dtype_b: int, zero_stage: int, world: int) -> tuple[float, str]:
    """Bytes per parameter a GPU holds for the learner's states under ZeRO, and the formula.

    Mixed precision (bf16): the bf16 weight (2) and gradient (2), AdamW's fp32 master weight and two moments
    (4 + 4 + 4). fp32: weight, gradient, two moments (4 each). Stage 1 shards the optimizer state over the
    world size, stage 2 also the gradients, stage 3 also the weights. (The optimizer step's fp32 copy of the
    gradient shard, 4 B / world, lives after the activations are freed, so it never adds to the peak.)"""
    parts = [(dtype_b, zero_stage >= 3), (dtype_b, zero_stage >= 2), (12 if dtype_b == 2 else 8, zero_stage >= 1)]
    whole = [x for x, sharded in parts if not sharded]
    split = [x for x, sharded in parts if sharded]
    terms = ([f"{' + '.join(map(str, whole))} B"] if whole else []) + (
        [f"({' + '.join(map(str, split))}) B / {world}"] if split else []
    )
    return sum(whole) + sum(split) / world, " + ".join(terms)


def activation_bytes_per_token_layer(s: ModelShape, b: int) -> int:
    """What one decoder layer saves for backward, per token (sdpa / flash attention: no L x L scores).

    Two RMSNorms: the fp32 upcast input and the normalised output (4H + bH each); q, k after projection, after
    rotate_half and after RoPE (3b(Hq + Hkv)); v (b Hkv); the attention output (b Hq); the MLP's gate, up,
    silu(gate) and their product (4bI). Sum: 8H + 2bH + 4b(Hq + Hkv) + 4bI."""
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
    kv_tok = s.layers * kv_heads_gpu * s.d_head * 2 * b
    kv_tokens = max(0, int(kv * GIB // kv_tok))
    states, states_how = zero_state_bytes_per_param(b, m.zero_stage, w)
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
        Line("learner states", p * states / GIB, f"{_b(p)} x {states_how}"),
    ]
    if m.zero_stage == 3:
        big = s.largest_module_params
        gen.append(Line("weight sync", big * b / GIB, f"one gathered parameter at a time: {_b(big)} x {b} B"))
    gen.append(Line("allowance", m.allowance_gib, "CUDA context, NCCL buffers, fragmentation (plan.allowance_gib)"))

    # --- training: the learner's states, working set, activations and head; the engine asleep
    t = m.micro_batch_tokens
    tr: list[Line] = []
    if m.sleep_mode:
        tr.append(Line("vLLM (asleep)", 0.0, f"sleep level {m.sleep_level} frees its weights and KV cache"))
    else:
        tr.append(Line("vLLM (awake)", pool, "rollout.enable_sleep_mode is false: its share stays allocated"))
    tr.append(Line("learner states", p * states / GIB, f"{_b(p)} x {states_how}"))
    bucket = min(ZERO_REDUCE_BUCKET, p)
    if m.zero_stage == 3:
        big = s.largest_module_params
        tr.append(
            Line(
                "ZeRO-3 working set",
                (2 * big + bucket) * b / GIB,
                f"largest gathered module and its full gradient 2 x {_b(big)} x {b} B + reduce bucket "
                f"{_b(bucket)} x {b} B",
            )
        )
    elif m.zero_stage == 2:
        tr.append(Line("ZeRO-2 buckets", bucket * b / GIB, f"reduce bucket {_b(bucket)} x {b} B"))
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
    head_in = 2 * t * s.hidden * b
    chunk_buf = 3 * chunk * s.vocab * 4
    head_grad = s.embedding_params * 4
    tr.append(
        Line(
            "log-prob head",
            (head_in + chunk_buf + head_grad) / GIB,
            f"hidden states and their gradient 2 x {t:,} x {s.hidden} x {b} B + chunk buffers 3 x {chunk} x "
            f"{s.vocab:,} x 4 B (trainer.logprob_chunk_size) + the head's fp32 gradient {_b(s.embedding_params)} x 4 B",
        )
    )
    tr.append(Line("allowance", m.allowance_gib, "CUDA context, NCCL buffers, vLLM asleep, fragmentation"))
    if m.sleep_mode and m.sleep_level == 1:
        notes.append(f"sleep level 1 keeps the weights in host memory: {weights:.1f} GiB per GPU of pinned host memory")
    return MemoryBudget(m, tuple(gen), tuple(tr), kv, kv_tok, kv_tokens, tuple(notes))


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


# ----------------------------------------------------------------------------------------------- cost
def _binom_cdf_below(k: int, n: int, p: float) -> float:
    """P(X < k) for X ~ Binomial(n, p)."""
    if k <= 0:
        return 0.0
    if p <= 0.0 or k > n:
        return 1.0
    if p >= 1.0:
        return 0.0  # X = n >= k
    lp, lq = math.log(p), math.log1p(-p)
    base = math.lgamma(n + 1)
    return min(
        1.0, sum(math.exp(base - math.lgamma(j + 1) - math.lgamma(n - j + 1) + j * lp + (n - j) * lq) for j in range(k))
    )


def expected_gen_batches(needed: int, batch_prompts: int, informative: float, cap: int) -> float:
    """Expected number of generation batches dynamic sampling draws in one rollout step.

    Each batch samples `batch_prompts` prompts; a prompt's group is kept (0 < #correct < G) with probability
    `informative`, independently. Sampling stops once `needed` groups are kept, or after `cap` batches (0: no
    cap). E[K] = sum_{k>=0} P(K > k) = sum_k P(Binomial(k x batch_prompts, informative) < needed)."""
    if not 0.0 <= informative <= 1.0:
        raise PlanError(f"plan.informative_fraction must be in [0, 1], got {informative}")
    if informative == 0.0:
        if cap <= 0:
            raise PlanError(
                "plan.informative_fraction is 0 and algorithm.max_num_gen_batches is 0 (no cap): dynamic sampling "
                "would never stop"
            )
        return float(cap)
    expected, k = 0.0, 0
    while cap <= 0 or k < cap:
        p_more = _binom_cdf_below(needed, k * batch_prompts, informative)
        if p_more < 1e-12:
            break
        expected += p_more
        k += 1
    return expected


def evals_per_run(total_steps: int, every: int) -> int:
    """Evaluations inside one training run: before the first step and every `every` steps, plus one at the end
    when the last step is not a multiple (every = 0: at the end only), as the trainer does."""
    if every <= 0:
        return 1
    return 1 + total_steps // every + (1 if total_steps % every else 0)


@dataclass(frozen=True)
class CostInputs:
    """One ablation row's run, as plain values: its shape and layout, the preset's batch and lengths, and the
    stated throughputs the estimate rests on."""

    shape: ModelShape
    dtype_bytes: int
    world_size: int
    tensor_parallel: int
    gpu_bf16_tflops: float
    gpu_hbm_tb_s: float
    prompts_per_step: int  # trainer.train_batch_size: the groups that train
    n: int  # responses per prompt
    mean_prompt_tokens: float
    mean_response_tokens: float
    max_response_tokens: int
    dynamic_sampling: bool
    gen_batch_prompts: int  # algorithm.gen_batch_size (or the train batch)
    max_gen_batches: int  # algorithm.max_num_gen_batches (0: no cap)
    informative_fraction: float
    pack_prompts: bool
    gradient_checkpointing: bool
    reference_forward: bool  # kl_coef > 0: one more forward per token
    total_steps: int
    eval_every: int
    eval_problems: int
    eval_n: int
    eval_mean_response_tokens: float
    eval_max_tokens: int
    gen_tokens_per_s_per_gpu: float
    train_mfu: float  # fraction of the bf16 peak the learner sustains on what it computes (recompute included)
    step_overhead_s: float  # weight sync, sleep / wake, scoring, per rollout step


@dataclass(frozen=True)
class RowCost:
    gen_batches: float  # expected generation batches per step (1 without dynamic sampling)
    gen_prompts: float
    gen_tokens: float  # response tokens generated per step, dropped groups included
    train_tokens: float  # tokens through the learner per step (prompts and responses)
    gen_s: float
    gen_floor_s: float  # a batch lasts at least its longest response at one decode step per weight read
    train_s: float
    step_s: float
    evals: int
    eval_s: float  # one evaluation
    eval_floor_s: float
    hours: float  # the training job's work: steps and evaluations
    gpu_hours: float


def forward_flops_per_token(s: ModelShape, mean_context: float) -> float:
    """2 x the matmul parameters, plus attention's QK^T and AV over `mean_context` earlier tokens."""
    return 2 * s.matmul_params + 4 * s.layers * s.q_dim * mean_context


def decode_floor_s(s: ModelShape, dtype_b: int, tp: int, max_tokens: int, hbm_tb_s: float) -> float:
    """The shortest a generation batch can take: its longest response needs `max_tokens` decode steps, and each
    step reads the GPU's weight shard from memory at least once."""
    return max_tokens * s.params * dtype_b / tp / (hbm_tb_s * 1e12)


def eval_seconds(c: CostInputs, gpus: int) -> tuple[float, float]:
    """One evaluation on `gpus` GPUs, and its floor (the longest response): (seconds, floor seconds)."""
    tokens = c.eval_problems * c.eval_n * c.eval_mean_response_tokens
    floor = decode_floor_s(c.shape, c.dtype_bytes, c.tensor_parallel, c.eval_max_tokens, c.gpu_hbm_tb_s)
    return max(tokens / (gpus * c.gen_tokens_per_s_per_gpu), floor), floor


def row_cost(c: CostInputs) -> RowCost:
    """Expected tokens and time per rollout step and per row (see docs/cost.md for the arithmetic)."""
    s, w = c.shape, c.world_size
    if c.dynamic_sampling:
        k = expected_gen_batches(c.prompts_per_step, c.gen_batch_prompts, c.informative_fraction, c.max_gen_batches)
        prompts = k * c.gen_batch_prompts
    else:
        k, prompts = 1.0, float(c.prompts_per_step)
    gen_tokens = prompts * c.n * c.mean_response_tokens
    floor = decode_floor_s(s, c.dtype_bytes, c.tensor_parallel, c.max_response_tokens, c.gpu_hbm_tb_s)
    # each generation batch waits for its own longest response
    gen = max(gen_tokens / (w * c.gen_tokens_per_s_per_gpu), math.ceil(k) * floor)

    seq = c.mean_prompt_tokens + c.mean_response_tokens
    per_group = c.mean_prompt_tokens + c.n * c.mean_response_tokens if c.pack_prompts else c.n * seq
    train_tokens = c.prompts_per_step * per_group
    # update: forward + backward (2x) + the recompute of checkpointed layers; old log-probs: one forward;
    # the reference policy's log-probs: one more when the KL term is on
    passes = 3 + (1 if c.gradient_checkpointing else 0) + 1 + (1 if c.reference_forward else 0)
    flops = train_tokens * passes * forward_flops_per_token(s, seq / 2)
    train = flops / (w * c.gpu_bf16_tflops * 1e12 * c.train_mfu)
    step = gen + train + c.step_overhead_s

    evals = evals_per_run(c.total_steps, c.eval_every)
    one_eval, eval_floor = eval_seconds(c, w)
    hours = (c.total_steps * step + evals * one_eval) / 3600
    return RowCost(
        k, prompts, gen_tokens, train_tokens, gen, floor, train, step, evals, one_eval, eval_floor, hours, hours * w
    )


def jobs_needed(hours: float, limit_h: float, restart_h: float, step_h: float) -> int | None:
    """SLURM jobs a run of `hours` needs under a time limit: each job loses its start-up (`restart_h`: loading
    the model, the checkpoint and the engine) and the step it is cut off in. None: no job gets a step done."""
    usable = limit_h - restart_h - step_h
    return max(1, math.ceil(hours / usable)) if usable > 0 else None


def fmt_tokens(n: float) -> str:
    """A token count, short: 32.8M, 4.2K."""
    return f"{n / 1e6:.1f}M" if n >= 1e6 else f"{n / 1e3:.1f}K" if n >= 1e3 else f"{n:.0f}"


def render_costs(
    rows: Mapping[str, CostInputs],
    *,
    seeds: int,
    limit_h: float,
    max_resubmits: int,
    restart_h: float,
    resubmits_key: str = "max_resubmits",
) -> tuple[str, list[str]]:
    """The cost table (one line per row) and the warnings: rows that cannot finish within the time limit x
    (1 + resubmissions)."""
    costs = {row: row_cost(c) for row, c in rows.items()}
    c0 = next(iter(rows.values()))
    lines = [
        f"    assumed: responses {c0.mean_response_tokens:,.0f} tokens on average (plan.mean_response_tokens), prompts "
        f"{c0.mean_prompt_tokens:,.0f}; vLLM {c0.gen_tokens_per_s_per_gpu:,.0f} tokens/s per GPU "
        f"(plan.gen_tokens_per_s_per_gpu); learner at {c0.train_mfu:.0%} of {c0.gpu_bf16_tflops:g} TFLOP/s "
        f"(plan.train_mfu); {c0.step_overhead_s:g} s per step for sync and scoring; dynamic sampling keeps "
        f"{c0.informative_fraction:.0%} of groups (plan.informative_fraction)",
        f"    {'row':<28}{'gen batches':>12}{'generated':>11}{'trained':>9}{'gen s':>7}{'train s':>8}"
        f"{'h/step':>7}{'evals':>10}{'h/row':>7}{'GPU-h':>9}{'jobs':>6}",
    ]
    warnings: list[str] = []
    allowed = 1 + max_resubmits
    for row, rc in costs.items():
        c = rows[row]
        jobs = jobs_needed(rc.hours, limit_h, restart_h, rc.step_s / 3600)
        batches = f"{rc.gen_batches:.2f}x{c.gen_batch_prompts}" if c.dynamic_sampling else "1"
        lines.append(
            f"    {row:<28}{batches:>12}{fmt_tokens(rc.gen_tokens):>11}{fmt_tokens(rc.train_tokens):>9}{rc.gen_s:7.0f}"
            f"{rc.train_s:8.0f}{rc.step_s / 3600:7.2f}{f'{rc.evals}x{rc.eval_s:.0f}s':>10}{rc.hours:7.1f}"
            f"{rc.gpu_hours:9,.0f}{jobs or 'never':>6}"
        )
        if jobs is None or jobs > allowed:
            warnings.append(
                f"row {row} needs about {rc.hours:.0f} h of training ({jobs or 'no number of'} "
                f"jobs of {limit_h:g} h less {restart_h:.2f} h start-up and one {rc.step_s / 3600:.2f} h step each), "
                f"more than the time limit x (1 + {resubmits_key}) = {limit_h:g} h x {allowed} allows: raise "
                f"resources.train.runtime_min or {resubmits_key}, or lower trainer.total_steps"
            )
    rc0 = next(iter(costs.values()))
    binds = []
    if any(rc.gen_s <= math.ceil(rc.gen_batches) * rc.gen_floor_s for rc in costs.values()):
        binds.append("rollout steps")
    if any(rc.eval_s <= rc.eval_floor_s for rc in costs.values()):
        binds.append("evaluations")
    lines.append(
        f"    a generation batch lasts at least its longest response: {c0.max_response_tokens:,} decode steps x one "
        f"read of the {c0.shape.params * c0.dtype_bytes / c0.tensor_parallel / 1e9:.1f} GB weight shard at "
        f"{c0.gpu_hbm_tb_s:g} TB/s = {rc0.gen_floor_s:.0f} s"
        + (f" (this bound sets the time of the {' and '.join(binds)})" if binds else "")
    )
    total = sum(rc.gpu_hours for rc in costs.values()) * seeds
    lines.append(f"    all rows x {seeds} seed(s): about {total:,.0f} GPU-hours of training jobs")
    return "\n".join(lines), warnings
