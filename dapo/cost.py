"""What a run will cost before anything is scheduled: hours per step and per row, GPU-hours, SLURM jobs, and the
checkpoints' time and disk. Plain values in, dataclasses out; the arithmetic and the sources of every default are in
docs/cost.md, "Cost per row". Estimates of the order of magnitude, not measurements."""

from __future__ import annotations

import dataclasses
import math
import random
from collections.abc import Mapping
from dataclasses import dataclass
from functools import lru_cache

from dapo.decode import BatchTime, LengthModel, Replica, batch_seconds, carry_batch_seconds
from dapo.packing import Lengths, learner_tokens
from dapo.shapes import ModelShape, PlanError

SEGMENTS = 16  # a run's response-length growth is summed over this many equal parts of its steps


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
    """Expected generation batches dynamic sampling draws to keep `needed` groups (each kept with probability
    `informative`; `cap` 0: none): E[K] = sum_k P(Binomial(k x batch_prompts, informative) < needed) (docs/cost.md)."""
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
    """Evaluations in a run, as the trainer does: at start, every `every` steps and at the end (every = 0: end only)."""
    if every <= 0:
        return 1
    return 1 + total_steps // every + (1 if total_steps % every else 0)


def checkpoints_per_run(total_steps: int, every: int) -> int:
    """Checkpoints a run writes: every `every` steps, and the last step's (every = 0: only that one)."""
    return max(1, total_steps // every) if every > 0 else 1


@dataclass(frozen=True)
class CostInputs:
    """One row's run as plain values: its (colocated) vLLM replica, layout, batch, lengths and the stated rates."""

    replica: Replica
    world_size: int
    nodes: int
    prompts_per_step: int  # trainer.train_batch_size: the groups that train
    n: int  # responses per prompt
    mean_prompt_tokens: float
    response_tokens_start: float  # mean response length at the first rollout step
    response_tokens_end: float  # ... and at the last one (linear in between)
    max_response_tokens: int
    dynamic_sampling: bool
    gen_batch_prompts: int  # algorithm.gen_batch_size (or the train batch)
    max_gen_batches: int  # algorithm.max_num_gen_batches (0: no cap)
    informative_fraction: float
    packing: str  # trainer.packing: what the learner pads (learner_padding)
    micro_batch_tokens: int  # the update's budget ...
    forward_micro_batch_tokens: int  # ... and the no-grad passes'
    mini_batch_prompts: int  # prompts per gradient update
    gradient_checkpointing: bool
    reference_forward: bool  # kl_coef > 0: one more forward per token
    total_steps: int
    eval_every: int
    eval_problems: int
    eval_n: int
    eval_max_tokens: int
    train_mfu: float  # share of the bf16 peak the learner sustains on what it computes (recompute included)
    step_overhead_s: float  # weight sync, sleep / wake, scoring, per rollout step
    checkpoint_every: int
    keep_checkpoints: int
    checkpoint_gb_s_per_node: float  # checkpoint write bandwidth each node gets from the file system

    @property
    def replicas(self) -> int:
        return max(1, self.world_size // self.replica.tensor_parallel)

    def response_tokens_at(self, fraction: float) -> float:
        """Mean response length `fraction` of the way through the run (0: first step, 1: last)."""
        return self.response_tokens_start + (self.response_tokens_end - self.response_tokens_start) * fraction

    covariance_forward: bool = False  # Clip-Cov / KL-Cov: a no-grad forward per update before it (the selection)
    max_staleness: int = 0  # rollout.max_staleness: >= 1 prices each step's generation with carry-over
    overfill_groups: int = 0  # carry-over: groups in flight beyond the generation batch (trainer.OVERFILL of it)

    def stop_fraction(self) -> float:
        """Carry-over: the share of the groups in flight that must have ended before a round stops: the train batch
        of the generation batch and the over-fill (with dynamic sampling, the groups that hold a train batch's worth
        of informative ones, at plan.informative_fraction)."""
        pool = (
            self.gen_batch_prompts + self.overfill_groups
            if self.dynamic_sampling
            else (self.prompts_per_step + self.overfill_groups)
        )
        need = (
            self.prompts_per_step / max(self.informative_fraction, 1e-9)
            if self.dynamic_sampling
            else (self.prompts_per_step)
        )
        return min(1.0, need / pool)

    def padding_at(self, fraction: float) -> Padding:
        """The learner's padded shares `fraction` through the run: linear between the first and last step's."""
        a, b = (self.padding(self.response_tokens_at(x)) for x in (0.0, 1.0))
        return Padding(a.update + (b.update - a.update) * fraction, a.forward + (b.forward - a.forward) * fraction)

    def padding(self, mean_response: float) -> Padding:
        return learner_padding(
            self.packing, mean_response, self.max_response_tokens, self.mean_prompt_tokens, self.prompts_per_step,
            self.n, self.mini_batch_prompts, self.world_size, self.micro_batch_tokens, self.forward_micro_batch_tokens,
        )  # fmt: skip


@dataclass(frozen=True)
class Padding:
    """Of the tokens the learner computes, the share that is padding: in the updates and in the no-grad passes."""

    update: float
    forward: float


@lru_cache(maxsize=256)
def learner_padding(
    packing: str,
    mean_response: float,
    cap: int,
    prompt_tokens: float,
    prompts: int,
    n: int,
    mini_batch_prompts: int,
    world_size: int,
    micro_batch_tokens: int,
    forward_micro_batch_tokens: int,
) -> Padding:
    """The learner's padded shares (`dapo.packing.learner_tokens`, the learner's own arithmetic) on one step's
    responses drawn from the length model (seeded exponential of the capped mean): updates per mini-batch at
    `micro_batch_tokens`, the old-log-prob pass over the step at `forward_micro_batch_tokens`."""
    model = LengthModel.of(mean_response, cap)
    rng = random.Random(0)

    def draw() -> int:
        return cap if math.isinf(model.scale) else min(cap, max(1, math.ceil(rng.expovariate(1 / model.scale))))

    responses = tuple(draw() for _ in range(prompts * n))
    p = max(1, round(prompt_tokens))
    lengths = Lengths((p,) * len(responses), responses, tuple(i // n for i in range(len(responses))))
    computed = padding = 0
    for first in range(0, prompts, mini_batch_prompts):
        rows = range(first * n, min(prompts, first + mini_batch_prompts) * n)
        counts = learner_tokens(lengths.select(rows), world_size, micro_batch_tokens, packing)
        computed, padding = computed + counts.computed, padding + counts.padding
    forward = learner_tokens(lengths, world_size, forward_micro_batch_tokens, packing).padded_fraction
    return Padding(padding / computed if computed else 0.0, forward)


@dataclass(frozen=True)
class StepCost:
    """One rollout step at one mean response length."""

    response_tokens: float  # the mean the length model was given (the cap cuts it where it is longer)
    gen_tokens: float  # response tokens generated, dropped groups included
    train_tokens: float  # tokens through the learner (prompts and responses), padding not counted
    padding: Padding  # the learner's padded shares: the FLOPs spent on padding, on top of train_tokens'
    batch: BatchTime  # one generation batch on one replica
    gen_s: float  # every generation batch of the step
    train_s: float
    eval_s: float  # one evaluation at this length

    def step_s(self, overhead_s: float) -> float:
        return self.gen_s + self.train_s + overhead_s


@dataclass(frozen=True)
class RowCost:
    gen_batches: float  # expected generation batches per step (1 without dynamic sampling)
    first: StepCost
    last: StepCost
    step_s_mean: float  # over the run
    evals: int
    eval_s_total: float
    checkpoints: int
    checkpoint_bytes: float  # one checkpoint (ZeRO states of every rank)
    checkpoint_s: float  # writing one
    run_disk_bytes: float  # what a run keeps: keep_checkpoints checkpoints and the final model
    hours: float  # the training job's work: steps, evaluations and checkpoints
    gpu_hours: float


def forward_flops_per_token(s: ModelShape, mean_context: float) -> float:
    """2 x the matmul parameters, plus attention's QK^T and AV over `mean_context` earlier tokens."""
    return 2 * s.matmul_params + 4 * s.layers * s.q_dim * mean_context


def checkpoint_bytes(s: ModelShape, dtype_bytes: int) -> float:
    """A learner checkpoint, all shards: weights in their dtype plus fp32 optimizer state (mixed precision: master
    weights and two Adam moments, 12 B; fp32: the moments, 8 B)."""
    return s.params * (dtype_bytes + (12 if dtype_bytes == 2 else 8))


def step_cost(c: CostInputs, fraction: float, gen_batches: float) -> StepCost:
    """Generation, training and one evaluation `fraction` of the way through the run (0: the first step)."""
    mean_response = c.response_tokens_at(fraction)
    r, w = c.replica, c.world_size
    s = r.shape
    lengths = LengthModel.of(mean_response, c.max_response_tokens)
    m = lengths.mean
    # every replica draws its share of each generation batch: gen_batch_prompts x n over the replicas
    batch_prompts = c.gen_batch_prompts if c.dynamic_sampling else c.prompts_per_step
    batch = batch_seconds(r, batch_prompts * c.n / c.replicas, c.mean_prompt_tokens, lengths)
    gen_tokens = gen_batches * batch_prompts * c.n * m
    gen_s = gen_batches * batch.seconds
    if c.max_staleness:  # the step's last batch stops early; in a steady state it carries in what it carries out
        carry = carry_batch_seconds(r, batch_prompts * c.n / c.replicas, c.mean_prompt_tokens, lengths, c.n,
                                    c.stop_fraction())  # fmt: skip
        gen_s += carry.seconds - batch.seconds
        batch = carry

    seq = c.mean_prompt_tokens + m
    per_group = c.mean_prompt_tokens + c.n * m if c.packing == "prompts" else c.n * seq
    train_tokens = c.prompts_per_step * per_group
    # update: forward + backward (2x) + recompute; one forward each for old log-probs, the reference (KL on) and the
    # covariance selection; each over real tokens / (1 - padded share) (`learner_padding`).
    pad = c.padding_at(fraction)
    update_passes = (3 + c.gradient_checkpointing) / (1 - pad.update) + c.covariance_forward / (1 - pad.forward)
    forward_passes = (1 + c.reference_forward) / (1 - pad.forward)
    flops = train_tokens * (update_passes + forward_passes) * forward_flops_per_token(s, seq / 2)
    train = flops / (w * r.bf16_tflops * 1e12 * c.train_mfu)

    # evaluation: shards no larger than a generation batch, each split over the replicas
    eval_lengths = LengthModel.of(min(mean_response, c.eval_max_tokens), c.eval_max_tokens)
    shards = math.ceil(c.eval_problems / batch_prompts)
    eval_batch = batch_seconds(r, c.eval_problems / shards * c.eval_n / c.replicas, c.mean_prompt_tokens, eval_lengths)
    eval_s = shards * eval_batch.seconds
    return StepCost(mean_response, gen_tokens, train_tokens, pad, batch, gen_s, train, eval_s)


def row_cost(c: CostInputs) -> RowCost:
    """Expected time per rollout step and per row, with response lengths growing through the run."""
    if c.dynamic_sampling:
        k = expected_gen_batches(c.prompts_per_step, c.gen_batch_prompts, c.informative_fraction, c.max_gen_batches)
    else:
        k = 1.0
    first = step_cost(c, 0.0, k)
    last = step_cost(c, 1.0, k)
    evals = evals_per_run(c.total_steps, c.eval_every)
    steps_s, evals_s = 0.0, first.eval_s  # the evaluation before the first step
    for i in range(SEGMENTS):
        mid = step_cost(c, (i + 0.5) / SEGMENTS, k)
        steps_s += c.total_steps / SEGMENTS * mid.step_s(c.step_overhead_s)
        evals_s += (evals - 1) / SEGMENTS * mid.eval_s
    ckpts = checkpoints_per_run(c.total_steps, c.checkpoint_every)
    ckpt_bytes = checkpoint_bytes(c.replica.shape, c.replica.dtype_bytes)
    ckpt_s = ckpt_bytes / (c.nodes * c.checkpoint_gb_s_per_node * 1e9)
    disk = min(c.keep_checkpoints, ckpts) * ckpt_bytes + c.replica.shape.params * c.replica.dtype_bytes
    hours = (steps_s + evals_s + ckpts * ckpt_s) / 3600
    step_s = steps_s / c.total_steps
    return RowCost(k, first, last, step_s, evals, evals_s, ckpts, ckpt_bytes, ckpt_s, disk, hours, hours * c.world_size)


def padding_line(c: CostInputs, rc: RowCost) -> str:
    """What the learner pads and costs, beside the padded layout (`trainer.packing: none`)."""

    def shares(cost: CostInputs) -> tuple[str, float]:
        a, b = cost.padding_at(0.0), cost.padding_at(1.0)
        extra = sum(step_cost(cost, x, 1.0).train_s for x in (0.0, 1.0))
        return (
            f"{a.update:.1%}-{b.update:.1%} of an update's tokens and {a.forward:.1%}-{b.forward:.1%} of the "
            "old-log-prob pass's",
            extra,
        )

    mine, t_mine = shares(c)
    line = f"    learner (trainer.packing: {c.packing}): padding is {mine} (first-last step)"
    if c.packing != "none":
        padded, t_padded = shares(dataclasses.replace(c, packing="none"))
        line += f"; padded (packing: none) it would be {padded}, {t_padded / t_mine:.2f}x the training time"
    return line


def carry_lines(rows: Mapping[str, CostInputs], costs: Mapping[str, RowCost]) -> list[str]:
    """What carry-over (`rollout.max_staleness: 1`) would change of each row: its generation seconds per step, first to
    last, and its hours; and where its last step's batch would stop (docs/cost.md, "Carry-over")."""
    c0 = next(iter(rows.values()))
    if c0.max_staleness:
        return []
    carried = {row: row_cost(dataclasses.replace(c, max_staleness=1)) for row, c in rows.items()}
    out = [
        "    carry-over (rollout.max_staleness: 1), from the same length model: a round stops once the groups that "
        f"fill the train batch have ended ({c0.overfill_groups} more in flight; a group ends with its longest "
        "response), and what a replica's unfinished responses still need is decoded in the next step among a full "
        "batch; generation seconds per step (first-last step), where the last step's last wave stops, hours per row:"
    ]
    for row, rc in costs.items():
        a, b = rc.first, rc.last
        ca, cb = carried[row].first, carried[row].last
        saved = 1 - carried[row].hours / rc.hours if rc.hours else 0.0
        out.append(
            f"      - {row}: {a.gen_s:,.0f}-{b.gen_s:,.0f} s -> {ca.gen_s:,.0f}-{cb.gen_s:,.0f} s "
            f"({1 - ca.gen_s / a.gen_s:.0%}-{1 - cb.gen_s / b.gen_s:.0%} less; stops at {rows[row].stop_fraction():.0%}"
            f" of the groups, decode step {cb.batch.stop or 0:,.0f} of {cb.batch.longest:,.0f}), "
            f"{rc.hours:.1f} -> {carried[row].hours:.1f} h ({saved:.1%} less)"
        )
    return out


def jobs_needed(hours: float, limit_h: float, restart_h: float, step_h: float) -> int | None:
    """SLURM jobs a run of `hours` needs: each loses its start-up (`restart_h`) and the step it is cut off in; None:
    no job gets a step done."""
    usable = limit_h - restart_h - step_h
    return max(1, math.ceil(hours / usable)) if usable > 0 else None


def fmt_tokens(n: float) -> str:
    """A token count, short: 32.8M, 4.2K."""
    return f"{n / 1e6:.1f}M" if n >= 1e6 else f"{n / 1e3:.1f}K" if n >= 1e3 else f"{n:.0f}"


def fmt_bytes(n: float) -> str:
    """Bytes in decimal units, as disks are sold: 458.7 GB, 2.8 TB."""
    return f"{n / 1e12:.1f} TB" if n >= 1e12 else f"{n / 1e9:.1f} GB"


def render_costs(
    rows: Mapping[str, CostInputs],
    *,
    seeds: int,
    limit_h: float,
    max_resubmits: int,
    restart_h: float,
    concurrent_runs: int,
    stop_margin_s: float | None = None,
    carry_over: bool = True,
) -> tuple[str, list[str]]:
    """The cost table and warnings: rows that cannot finish within limit x (1 + resubmissions), and a stop margin
    shorter than a generation batch plus a checkpoint write; with `carry_over`, what carry-over would save."""
    costs = {row: row_cost(c) for row, c in rows.items()}
    c0, rc0 = next(iter(rows.values())), next(iter(costs.values()))
    lines = [
        f"    assumed: mean response length growing linearly from the first to the last step (column `responses`; "
        f"plan.response_tokens, per row plan.rows), prompts {c0.mean_prompt_tokens:,.0f}; decode at "
        f"{c0.replica.efficiency:.0%} of the GPU's bandwidth and peak "
        f"(plan.decode_efficiency); learner at {c0.train_mfu:.0%} of {c0.replica.bf16_tflops:g} TFLOP/s "
        f"(plan.train_mfu); {c0.step_overhead_s:g} s per step for sync and scoring; dynamic sampling keeps "
        f"{c0.informative_fraction:.0%} of groups (plan.informative_fraction)",
        f"    {'row':<28}{'responses':>12}{'gen batches':>12}{'tokens':>8}{'gen s':>12}{'train s':>12}{'h/step':>11}"
        f"{'evals':>11}{'h/row':>7}{'GPU-h':>9}{'jobs':>6}",
    ]
    warnings: list[str] = []
    allowed = 1 + max_resubmits
    for row, rc in costs.items():
        c = rows[row]
        a, b = rc.first, rc.last
        step_a, step_b = a.step_s(c.step_overhead_s) / 3600, b.step_s(c.step_overhead_s) / 3600
        jobs = jobs_needed(rc.hours, limit_h, restart_h, step_b)
        batches = f"{rc.gen_batches:.2f}x{c.gen_batch_prompts}" if c.dynamic_sampling else "1"
        lines.append(
            f"    {row:<28}{f'{fmt_tokens(a.response_tokens)}-{fmt_tokens(b.response_tokens)}':>12}{batches:>12}"
            f"{fmt_tokens(b.gen_tokens):>8}{f'{a.gen_s:.0f}-{b.gen_s:.0f}':>12}"
            f"{f'{a.train_s:.0f}-{b.train_s:.0f}':>12}{f'{step_a:.2f}-{step_b:.2f}':>11}"
            f"{f'{rc.evals}x{rc.eval_s_total / rc.evals:.0f}s':>11}{rc.hours:7.1f}"
            f"{f'{rc.gpu_hours:,.0f}' if rc.gpu_hours >= 10 else f'{rc.gpu_hours:.1f}':>9}"
            f"{jobs or 'never':>6}"
        )
        if jobs is None or jobs > allowed:
            warnings.append(
                f"row {row} needs about {rc.hours:.0f} h of training ({jobs or 'no number of'} "
                f"jobs of {limit_h:g} h less {restart_h:.2f} h start-up and one {step_b:.2f} h step each), "
                f"more than the time limit x (1 + max_resubmits) = {limit_h:g} h x {allowed} allows: raise "
                "resources.train.runtime_min or max_resubmits, or lower trainer.total_steps"
            )
    lines.append(padding_line(c0, rc0))
    tail = rc0.last.batch
    lines.append(
        f"    a generation batch lasts as long as its longest response: at the last step each of the "
        f"{c0.replicas} replicas runs {tail.concurrency:,.0f} sequences at once and its last wave drains for "
        f"{tail.longest:,.0f} decode steps ({tail.drain_s:,.0f} of the batch's {tail.seconds:,.0f} s; "
        f"{LengthModel.of(c0.response_tokens_end, c0.max_response_tokens).truncated:.1%} of responses hit the "
        f"{c0.max_response_tokens:,}-token cap)"
    )
    lines += carry_lines(rows, costs) if carry_over else []
    total = sum(rc.gpu_hours for rc in costs.values()) * seeds
    runs = len(costs) * seeds
    at_once = max(1, min(runs, concurrent_runs))
    lines.append(
        f"    checkpoints: {fmt_bytes(rc0.checkpoint_bytes)} each ({c0.replica.shape.params / 1e9:.2f}B parameters x "
        f"{rc0.checkpoint_bytes / c0.replica.shape.params:.0f} B: weights and fp32 optimizer state), "
        f"{rc0.checkpoint_s:,.0f} s to write at {c0.checkpoint_gb_s_per_node:g} GB/s per node "
        f"(plan.checkpoint_gb_s_per_node), {rc0.checkpoints} per run; a run keeps "
        f"{min(c0.keep_checkpoints, rc0.checkpoints)} and its final model: {fmt_bytes(rc0.run_disk_bytes)}; "
        f"{at_once} run(s) at once (of {runs}; the profile's `jobs:`, --resources train_nodes): "
        f"{fmt_bytes(at_once * rc0.run_disk_bytes)}, "
        f"{fmt_bytes(runs * rc0.run_disk_bytes)} when every run is kept"
    )
    lines.append(
        f"    all rows x {seeds} seed(s): about {f'{total:,.0f}' if total >= 10 else f'{total:.1f}'} GPU-hours of "
        "training jobs"
    )
    if stop_margin_s is not None:
        worst = max(rc.last.batch.seconds for rc in costs.values()) + rc0.checkpoint_s
        if stop_margin_s < worst:
            warnings.append(
                f"trainer.stop_margin_s ({stop_margin_s:g} s) is shorter than a generation batch at the last step "
                f"plus a checkpoint write (about {worst:,.0f} s): a job signalled that close to its time limit can "
                f"be killed before its checkpoint is written; raise trainer.stop_margin_s (docs/distributed.md)"
            )
    return "\n".join(lines), warnings
