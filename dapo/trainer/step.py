"""One rollout step of DAPO (the paper's sections 2-3, Algorithm 1), as one function that reads top to bottom.

    prepare: generate -> score -> shape -> refill -> advantages -> overlong mask -> old log-probs    (1-7)
    update: the lr for this step, then the mini-batch updates                                       (8)
    step_metrics (9) -> sync: every replica loads the new weights                                   (10)

Rows 0-5 of Table 1 differ only in the settings passed in: overlong filtering (the loss mask), clip-higher (the
learner's clip range), soft overlong punishment (reward shaping in `collect`), token-level loss (the learner's
aggregation), dynamic sampling (the refill in `collect`).

Every rank runs this function. Each rollout replica generates and scores its share of every generation batch and
every rank then holds the whole step (`collect`); each rank computes old log-probs and updates on its shard, and
the learner sums the loss normaliser over ranks, so the update is the one-process update. Engine and learner
share the accelerator: the learner's states are offloaded while the engine generates, and the engine sleeps while
the learner trains (no-ops on CPUs).

Counters: `Counters.step` counts rollout steps (the lr schedule's unit), `grad_updates` counts optimizer updates
(the paper's x-axis); generation batches never advance either.

A stop request is honoured between phases: between generation batches (`StopDuringRefill`) and before each
update (`StopMidStep`); both carry what a restarted run needs to finish the step exactly as it would have, and
`rollout_step` takes it back as `resume`: a cut-off refill goes on inside `prepare`, a step cut off between
updates goes straight to `update`. Nothing else in the step knows about resuming.
"""

from __future__ import annotations

import dataclasses
import logging
import math
import random
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

import numpy as np
import torch

from dapo import distributed as dist
from dapo import metric_names as M
from dapo.algos.dynamic_sampling import RefillAccumulator, RefillStats
from dapo.algos.rollout_correction import correction_weights
from dapo.learner.batch import PolicyBatch
from dapo.learner.learner import UPDATE_SKIPPED
from dapo.rollout.base import RolloutEngine
from dapo.trainer.collect import Collected, Group, RolloutSettings, Sampler, collect
from dapo.trainer.components import PolicyLearner, ReferencePolicy
from dapo.trainer.metrics import mean_update_stats, rollout_metrics
from dapo.trainer.rollout_batch import build_batch, group_rows, minibatch_plan
from dapo.types import GroupOutcome, Problem, Sample

log = logging.getLogger("dapo.train")

# Keys the learner's update() reports, averaged over the step's updates: every one `dapo.algos.metrics.update_metrics`
# gives but the entropy (the step logs the old policy's, over the whole batch), and the gradient norm.
UPDATE_KEYS = (
    M.POLICY_LOSS,
    M.CLIPFRAC_LOW,
    M.CLIPFRAC_HIGH,
    M.CLIPFRAC_HIGH_RARE,
    M.CLIP_HIGH_PROB,
    M.DUAL_CLIPFRAC,
    M.APPROX_KL,
    M.KL_REF,
    M.SEQ_CLIPFRAC_LOW,
    M.SEQ_CLIPFRAC_HIGH,
    M.CISPO_CAPPED_FRAC,
    M.COV_SELECTED_FRAC,
    M.GRAD_NORM,
)


@dataclass(frozen=True)
class StepSettings:
    """Plain values for one rollout step (the run config stops at the trainer boundary)."""

    rollout: RolloutSettings
    norm_adv_by_std: bool  # GRPO's std division (False: Dr. GRPO)
    overlong_filter: bool  # row 1: truncated responses get loss weight 0
    mini_batch_size: int  # prompts per gradient update
    epochs: int  # passes over the step's groups
    seed: int
    max_consecutive_nonfinite: int  # stop updating after this many skipped updates in a row
    pack_prompts: bool = False  # the learner's: a shard then counts each prompt once per rank (PolicyBatch.shard)
    rollout_correction: str = "none"  # importance weights for the engine/learner gap (dapo.algos.rollout_correction)
    correction_cap: float = 2.0  # its C
    correction_floor: float | None = None  # its lower masking bound (masked forms)


@dataclass
class Counters:
    """The run's counters; a checkpoint stores them."""

    step: int = 0  # rollout steps completed
    grad_updates: int = 0  # optimizer updates attempted (skipped ones included)
    nonfinite_total: int = 0  # updates skipped as non-finite, ever
    nonfinite_streak: int = 0  # ... in a row, now
    tokens_total: int = 0  # tokens generated, dropped groups included

    def gave_up(self, max_consecutive_nonfinite: int) -> bool:
        """Too many non-finite updates in a row: the step stops updating and the trainer fails the run."""
        return self.nonfinite_streak >= max_consecutive_nonfinite


@dataclass
class StepIO:
    """What one rollout step talks to.

    Attributes:
        sampler: generates and scores each generation batch on every replica (`collect.Sampler`; with a world's
            tagger, its habit tags and metrics).
        next_prompts: k -> the next k problems and prompt ids of the seeded data order.
        engine: this rank's rollout engine (slept during the updates, synced at the end).
        learner: the policy.
        reference: the frozen policy of the KL term, when `kl_coef > 0`.
        should_stop: collective poll of the stop flag, between phases.
    """

    sampler: Sampler
    next_prompts: Callable[[int], tuple[list[Problem], list[list[int]]]]
    engine: RolloutEngine
    learner: PolicyLearner
    reference: ReferencePolicy | None = None
    should_stop: Callable[[], bool] = lambda: False


@dataclass
class PartialStep:
    """A rollout step in progress: what `prepare` made (`collected`, `batch` with its old log-probs, the timings)
    and the updates done so far (`update_stats`). A stop request saves it in the checkpoint so that the restarted
    run finishes the step: cut off between generation batches, only `refill` (collect's state) is set; before an
    update, the rest, with `updates_done`."""

    refill: dict[str, Any] | None = None
    collected: Collected | None = None
    batch: PolicyBatch | None = None
    updates_done: int = 0
    update_stats: list[dict[str, float]] = field(default_factory=list)
    timings: dict[str, float] = field(default_factory=dict)
    correction: dict[str, float] = field(default_factory=dict)  # what the rollout correction did (its metrics)


# Everything a PartialStep holds, for a checkpoint loader that allows only named types.
PARTIAL_STEP_TYPES = (
    PartialStep,
    Collected,
    Group,
    GroupOutcome,
    PolicyBatch,
    Problem,
    Sample,
    RefillAccumulator,
    RefillStats,
)


class StopMidStep(Exception):  # noqa: N818 (a control-flow signal, not an error)
    """A stop was requested during the step; `.partial` finishes it after a restart."""

    def __init__(self, partial: PartialStep):
        super().__init__("stop requested during the rollout step")
        self.partial = partial


def seed_step(seed: int, step: int) -> None:
    """Seed python, numpy and torch from (seed, step) at the start of a step, so whatever else draws from them
    (the tests' fake engines) is a function of the step too; the engines get their own seed per call."""
    s = int(np.random.default_rng([seed, step]).integers(2**31 - 1))
    random.seed(s)
    np.random.seed(s)
    torch.manual_seed(s)


def rollout_step(
    step: int, io: StepIO, s: StepSettings, counters: Counters, resume: PartialStep | None = None
) -> dict[str, float]:
    """Run rollout step `step` (1-based) and return its metrics; advances `counters`. `resume` is what a stopped run
    saved mid-step: the step goes on from the phase it was cut off in.

    Raises:
        StopDuringRefill, StopMidStep: a stop was requested; checkpoint their state and exit for resume.
        RefillCapReached: dynamic sampling hit its cap with `at_refill_cap: fail`.
    """
    t_step = time.perf_counter()
    if resume is None:
        seed_step(s.seed, step)
    if resume is None or resume.refill is not None:  # 1-7
        partial = prepare(step, io, s, resume)
    else:
        partial = resume  # cut off between updates: the batch and its old log-probs are in the checkpoint
    lr = io.learner.schedule(step - 1)  # the warm-up counts rollout steps, not updates
    update(step, partial, io, s, counters)  # 8
    metrics = step_metrics(step, partial, counters, s, io.sampler)  # 9
    t_sync = sync(io.engine, io.learner)  # 10
    metrics.update(timing_metrics(partial, lr, counters, t_sync, time.perf_counter() - t_step))
    return metrics


def prepare(step: int, io: StepIO, s: StepSettings, resume: PartialStep | None) -> PartialStep:
    """Steps 1-7: the step's groups, their advantages and loss mask, and old log-probs; no update done yet."""
    # 1-4. generate G responses per prompt on every replica, score them, shape the rewards (soft overlong
    # punishment) and, with dynamic sampling, refill until enough groups have varied correctness
    io.learner.offload_states()
    io.engine.wake_up()
    collected = collect(
        io.sampler,
        step,
        io.next_prompts,
        s.rollout,
        should_stop=io.should_stop,
        resume=resume.refill if resume else None,
    )
    io.engine.sleep()
    io.learner.reload_states()
    batch, correction, t_old = None, {}, 0.0
    if collected.groups:
        # 5-6. group-normalised advantages and the overlong-filter loss mask
        batch = build_batch(collected.groups, norm_adv_by_std=s.norm_adv_by_std, overlong_filter=s.overlong_filter)
        # 7. old log-probs (and the reference policy's, for a KL term), each rank on its shard, gathered
        t0 = time.perf_counter()
        batch.old_logp, batch.entropy = sharded_logprobs(io.learner.compute_logprobs, batch, s.pack_prompts)
        if io.reference is not None:
            batch.ref_logp = sharded_logprobs(_with_no_entropy(io.reference), batch, s.pack_prompts)[0]
        if s.rollout_correction != "none":  # on whole responses, before any split: exact for sequence weights
            if batch.engine_logp is None:
                raise ValueError(
                    f"algorithm.rollout_correction={s.rollout_correction} needs the engine's log-probs of its samples, "
                    "and this engine returned none"
                )
            batch.is_weights, correction = correction_weights(
                batch.old_logp,
                batch.engine_logp,
                batch.response_mask,
                s.rollout_correction,  # type: ignore[arg-type]
                s.correction_cap,
                s.correction_floor,
            )
        t_old = time.perf_counter() - t0
    timings = {**collected.timings, "old_logprob": t_old}
    return PartialStep(collected=collected, batch=batch, timings=timings, correction=correction)


def update(step: int, partial: PartialStep, io: StepIO, s: StepSettings, counters: Counters) -> None:
    """Step 8: epochs x (groups / mini_batch_size) optimizer steps, the ones `partial` has not done yet; appends each
    update's stats to `partial.update_stats`. Raises `StopMidStep` (carrying `partial`) when a stop comes between
    two."""
    collected, batch = partial.collected, partial.batch
    assert collected is not None
    t_upd = time.perf_counter()
    if batch is not None:
        plan = minibatch_plan(len(collected.groups), s.mini_batch_size, s.epochs, s.seed, step)
        for k in range(len(partial.update_stats), len(plan)):
            if io.should_stop():
                partial.timings["update"] = partial.timings.get("update", 0.0) + time.perf_counter() - t_upd
                raise StopMidStep(dataclasses.replace(partial, updates_done=k))
            mini_batch = batch.select(group_rows(batch, plan[k]))
            shard = mini_batch.shard(dist.rank(), dist.world_size(), pack_prompts=s.pack_prompts)
            out = io.learner.update(shard, salt=counters.grad_updates)  # salt: the covariance losses' draw
            partial.update_stats.append(out)
            counters.grad_updates += 1
            if out.get(UPDATE_SKIPPED):
                counters.nonfinite_total += 1
                counters.nonfinite_streak += 1
                log.warning(
                    "non-finite loss or gradient at rollout step %d: update skipped (%d in a row)",
                    step,
                    counters.nonfinite_streak,
                )
                if counters.gave_up(s.max_consecutive_nonfinite):
                    break  # the trainer fails the run
            else:
                counters.nonfinite_streak = 0
    else:
        # dynamic sampling stopped at its cap (at_refill_cap=partial) without one informative group
        log.warning(
            "rollout step %d: no informative group within %d generation batches; no update",
            step,
            collected.stats.gen_batches,
        )
    partial.timings["update"] = partial.timings.get("update", 0.0) + time.perf_counter() - t_upd


def step_metrics(
    step: int, partial: PartialStep, counters: Counters, s: StepSettings, sampler: Sampler
) -> dict[str, float]:
    """Step 9: the step is done; its counters and metrics (Table 1's training curves, the mechanisms' inputs)."""
    collected, batch, stats = partial.collected, partial.batch, partial.update_stats
    assert collected is not None
    counters.step = step
    counters.tokens_total += collected.stats.tokens_generated
    metrics = rollout_metrics(collected, batch, partial.correction, norm_adv_by_std=s.norm_adv_by_std)
    metrics.update(sampler.world_metrics(collected.generated))  # the habits world's `habit/*`
    metrics.update(mean_update_stats([x for x in stats if not x.get(UPDATE_SKIPPED)], UPDATE_KEYS))
    metrics.update(mean_update_stats(stats, [UPDATE_SKIPPED]))  # the fraction of this step's updates skipped
    return metrics


def sync(engine: RolloutEngine, learner: PolicyLearner) -> float:
    """Step 10: every replica loads the new weights (a sleeping engine's weights wake first); always, as a level-2
    sleep discarded the old ones. Returns the seconds it took."""
    t0 = time.perf_counter()
    engine.sync_weights(learner.named_parameters_for_sync())
    return time.perf_counter() - t0


def timing_metrics(
    partial: PartialStep, lr: float, counters: Counters, t_sync: float, t_step: float
) -> dict[str, float]:
    """The step's counters, lr and phase timings."""
    collected, timings = partial.collected, partial.timings
    assert collected is not None
    gen_t = timings.get("generate", 0.0)
    return {
        M.ROLLOUT_STEP: counters.step,
        M.GRAD_UPDATES: counters.grad_updates,
        M.LR: lr,
        M.NONFINITE_SKIPPED: counters.nonfinite_total,
        M.DS_TOKENS_GENERATED_TOTAL: counters.tokens_total,
        M.TIME_GENERATE: gen_t,
        M.TIME_SCORE: timings.get("score", 0.0),
        M.TIME_OLD_LOGPROB: timings.get("old_logprob", 0.0),
        M.TIME_UPDATE: timings["update"],
        M.TIME_SYNC: t_sync,
        M.TIME_STEP: t_step,
        M.TOKENS_PER_SEC: collected.stats.tokens_generated / gen_t if gen_t > 0 else math.nan,
    }


def sharded_logprobs(
    compute: Callable[[PolicyBatch], tuple[torch.Tensor, torch.Tensor]], batch: PolicyBatch, pack_prompts: bool = False
) -> tuple[torch.Tensor, torch.Tensor]:
    """`compute` (per-token values [N, T], e.g. log-probs and entropies) over the whole batch: each rank computes
    its token-balanced shard of rows (`PolicyBatch.shard_rows`, as the updates split), and the ranks gather them
    (the updates re-shard by mini-batch, and the metrics need every row). Rows are independent here (no
    normaliser), so any split gives the same numbers."""
    world = dist.world_size()
    if world == 1:
        return compute(batch)
    rows = batch.shard_rows(dist.rank(), world, pack_prompts=pack_prompts)
    lp, ent = compute(batch.select(rows))
    a, b = torch.zeros_like(batch.loss_mask), torch.zeros_like(batch.loss_mask)
    for r, part_a, part_b in dist.all_gather((rows, lp, ent)):
        if r:
            a[r], b[r] = part_a, part_b
    return a, b


def _with_no_entropy(reference: ReferencePolicy) -> Callable[[PolicyBatch], tuple[torch.Tensor, torch.Tensor]]:
    def compute(batch: PolicyBatch) -> tuple[torch.Tensor, torch.Tensor]:
        lp = reference.compute_logprobs(batch)
        return lp, torch.zeros_like(lp)

    return compute
