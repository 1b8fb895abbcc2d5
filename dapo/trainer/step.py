"""One rollout step of DAPO (the paper's sections 2-3, Algorithm 1), as one function that reads top to bottom:

    1 generate -> 2 score -> 3 shape -> 4 refill -> 5 advantages -> 6 mask -> 7 old log-probs -> 8 updates
    -> 9 metrics -> 10 sync

Rows 0-5 of Table 1 differ only in the settings passed in: overlong filtering (6), clip-higher (8), soft overlong
punishment (3), token-level loss (8), dynamic sampling (4); each is one pure function of `dapo.algos`. Every rank
runs this function (docs/distributed.md, "One rollout step on W ranks"). Nothing here calls back into the loop; a
stop raises `StopMidStep` with the part-done step, which a restart passes back as `resume` (docs/architecture.md,
"trainer/"). `Counters.step` counts rollout steps (the lr schedule's unit), `grad_updates` optimizer updates (the
paper's x-axis); generation batches advance neither. With `rollout.max_staleness` >= 1, phases 1-2 are a carry-over
round instead (`trainer/carry.py`: the groups in flight continued until enough have finished); everything else is the
same code.
"""

from __future__ import annotations

import logging
import math
import random
import time
from dataclasses import dataclass, field
from typing import Any

import numpy as np
import torch

from dapo import metric_names as M
from dapo.algos.advantages import group_advantages
from dapo.algos.dynamic_sampling import RefillAccumulator, RefillStats, keep_groups
from dapo.algos.overlong import overlong_loss_mask, soft_overlong_penalty
from dapo.algos.rollout_correction import correction_weights
from dapo.learner.batch import PolicyBatch, pad_rows, pad_versions
from dapo.rewards.score import score_responses
from dapo.rollout.base import RolloutEngine
from dapo.rollout.replicas import ReplicaLayout, gather_by_prompt, generate_share, sampling_seed
from dapo.trainer import OVERFILL
from dapo.trainer.carry import Carry, InFlight
from dapo.trainer.components import HabitTagger, PolicyLearner, ReferencePolicy
from dapo.trainer.data_order import PromptSource
from dapo.trainer.metrics import outcome_of, rollout_metrics, staleness_metrics, update_means
from dapo.trainer.signals import StopFlag
from dapo.types import Group, GroupOutcome, Problem, Sample

log = logging.getLogger("dapo.train")

# Seed streams (first key after the run's seed): training rollouts and evaluation never share a seed.
TRAIN_STREAM, EVAL_STREAM = 0, 1


@dataclass(frozen=True)
class StepSettings:
    """Plain values for one rollout step (the run config stops at the trainer boundary: `setup.run_settings`)."""

    n: int  # responses per prompt (G)
    max_tokens: int  # the response cap L_max
    train_batch_size: int  # prompts (groups) per rollout step
    mini_batch_size: int  # prompts per gradient update
    epochs: int = 1  # passes over the step's groups
    temperature: float = 1.0
    top_p: float = 1.0
    verifier: str = "math_verify"
    overlong_penalty: bool = False  # row 3: R_length of Eq. 13 added to the reward
    overlong_buffer_len: int = 1
    overlong_penalty_factor: float = 1.0
    dynamic_sampling: bool = False  # row 5: keep groups of mixed correctness, refill to train_batch_size
    gen_batch_size: int | None = None  # prompts per generation batch with dynamic sampling (None: train_batch_size)
    max_num_gen_batches: int = 0  # its cap (0: none)
    at_refill_cap: str = "partial"
    norm_adv_by_std: bool = True  # GRPO's std division (False: Dr. GRPO)
    overlong_filter: bool = False  # row 1: truncated responses get loss weight 0
    rollout_correction: str = "none"  # importance weights for the engine/learner gap (dapo.algos.rollout_correction)
    correction_cap: float = 2.0
    correction_floor: float | None = None
    seed: int = 0  # the run's seed: the mini-batch shuffle and the step's global generators
    sampling_seed: int = 0  # the rollouts' seed stream (seed + rollout.sampling_seed_offset)
    max_consecutive_nonfinite: int = 3  # stop updating after this many skipped updates in a row
    max_staleness: int = 0  # eta: 0 samples each step's batch to its end; >= 1 carries responses over (carry.py)

    @property
    def gen_batch_prompts(self) -> int:
        """Prompts per generation batch: `gen_batch_size` with dynamic sampling, else the one batch that trains."""
        return (self.gen_batch_size or self.train_batch_size) if self.dynamic_sampling else self.train_batch_size

    @property
    def in_flight(self) -> int:
        """Groups a carry-over round keeps in flight: the generation batch and `OVERFILL` of the train batch more,
        so that it can stop while the longest groups are still decoding."""
        return self.gen_batch_prompts + math.ceil(OVERFILL * self.train_batch_size)


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
    """What one rollout step works with (the loop builds it once per run): this rank's engine (slept during the
    updates, synced at the end), the policy, the seeded data order, the replica layout (this rank's share of each
    generation batch), the stop flag (polled collectively between generation batches and updates), the KL term's
    frozen reference (`kl_coef > 0`), a world's tagger (the habits world's tags, kinds and metrics) or None, and the
    groups in flight between steps (carry-over; the loop checkpoints them with the data order)."""

    engine: RolloutEngine
    learner: PolicyLearner
    prompts: PromptSource
    layout: ReplicaLayout
    stop: StopFlag
    reference: ReferencePolicy | None = None
    tagger: HabitTagger | None = None
    carry: Carry = field(default_factory=Carry)


@dataclass
class PartialStep:
    """A rollout step in progress (refill, generated outcomes, the batch once built, update metrics so far, phase
    seconds): a stop saves it in the checkpoint and the restarted run finishes the step from it."""

    refill: RefillAccumulator
    generated: list[GroupOutcome] = field(default_factory=list)
    timings: dict[str, float] = field(default_factory=dict)
    batch: PolicyBatch | None = None
    update_stats: list[dict[str, float]] = field(default_factory=list)
    correction: dict[str, float] = field(default_factory=dict)  # what the rollout correction did (its metrics)
    forward_padded_fraction: float = math.nan  # the learner's padding in the old-log-prob pass


# Everything a PartialStep holds, for a checkpoint loader that allows only named types.
PARTIAL_STEP_TYPES = (
    PartialStep, Group, GroupOutcome, PolicyBatch, Problem, Sample, RefillAccumulator, RefillStats, Carry, InFlight
)  # fmt: skip


class StopMidStep(Exception):  # noqa: N818 (a control-flow signal, not an error)
    """A stop was requested during the step; `.partial` finishes it after a restart."""

    def __init__(self, partial: PartialStep):
        super().__init__("stop requested during the rollout step")
        self.partial = partial


def rollout_step(
    step: int, io: StepIO, s: StepSettings, counters: Counters, resume: PartialStep | None = None
) -> dict[str, float]:
    """Run rollout step `step` (1-based), advance `counters`, return its metrics; `resume`: what a stopped run saved
    mid-step. Raises StopMidStep (checkpoint its `.partial`) or RefillCapReached (`at_refill_cap: fail`)."""
    t_step = time.perf_counter()
    if resume is None:
        seed_step(s.seed, step)
    part = resume or PartialStep(refill=new_refill(s))
    if not part.refill.done:
        io.learner.offload_states()  # the engine generates on the accelerator the learner frees
        io.engine.wake_up()
        while not part.refill.done:
            if part.refill.stats.gen_batches > 0 and io.stop.anywhere():
                raise StopMidStep(part)
            if not s.max_staleness:  # a fresh batch, each response sampled to its end
                problems, prompts = io.prompts.take(s.gen_batch_prompts)
                base = sampling_seed(s.sampling_seed, TRAIN_STREAM, step, part.refill.stats.gen_batches)
                t0 = time.perf_counter()
                share, outs = generate_share(
                    io.engine, io.layout, prompts, s.n, base, s.max_tokens, s.temperature, s.top_p
                )
                t1 = time.perf_counter()  # 1. generate: this replica's share of the batch's samples
                scores = score_share(problems, share.prompts, outs, s.verifier) if io.layout.is_leader else []
                t2 = time.perf_counter()  # 2. score: +1 / -1 by the verifier (the replica's leader, its share)
                groups, seconds = gather_groups(io.layout, s.n, outs, scores, problems, prompts, t1 - t0, t2 - t1)
                tokens = sum(g.num_tokens for g in groups)
            else:  # 1-2. carry-over: the groups in flight, topped up, continued until enough have finished, scored
                base = sampling_seed(s.sampling_seed, TRAIN_STREAM, step, part.refill.stats.gen_batches)
                needed = part.refill.target_groups - part.refill.stats.groups_kept
                r = io.carry.round(io.engine, io.layout, io.prompts, base, step - 1, s, needed)
                groups, seconds, tokens = r.groups, r.seconds, r.tokens
            shape_rewards(groups, s, io.tagger)  # 3. shape: the soft overlong penalty (Eq. 13), with the tags
            part.generated += [outcome_of(g, io.tagger) for g in groups]
            for k, v in seconds.items():
                part.timings[k] = part.timings.get(k, 0.0) + v
            keep = (
                keep_groups(torch.tensor([g.correct for g in groups])) if s.dynamic_sampling else [True] * len(groups)
            )
            part.refill.add(groups, keep, tokens)  # 4. refill: until enough groups
        io.engine.sleep()
        io.learner.reload_states()
        groups, _ = part.refill.result()
        if groups:
            t0 = time.perf_counter()
            advantages = group_advantages(rewards_of(groups), norm_by_std=s.norm_adv_by_std)  # 5. advantages
            part.batch = policy_batch(groups, advantages.reshape(-1))
            if s.overlong_filter:  # 6. mask: truncated responses leave the loss (row 1)
                part.batch.loss_mask = overlong_loss_mask(part.batch.response_mask, part.batch.truncated)
            part.batch.old_logp, part.batch.entropy = io.learner.compute_logprobs(part.batch)  # 7. old log-probs
            part.forward_padded_fraction = io.learner.padded_fraction(part.batch, forward_only=True)
            if io.reference is not None:
                part.batch.ref_logp = io.reference.compute_logprobs(part.batch)
            if s.rollout_correction != "none":
                part.batch.is_weights, part.correction = correct_for_engine(part.batch, s)
            part.timings["old_logprob"] = time.perf_counter() - t0
    lr = io.learner.schedule(step - 1)  # the warm-up counts rollout steps, not updates
    update(step, part, io, s, counters)  # 8. updates
    groups, stats = part.refill.result()
    counters.step = step
    counters.tokens_total += stats.tokens_generated
    metrics = rollout_metrics(groups, stats, part.generated, part.batch, part.correction, s.norm_adv_by_std)  # 9.
    metrics.update(io.tagger.metrics(part.generated) if io.tagger is not None else {})  # the world's `habit/*`
    metrics.update(update_means(part.update_stats))
    metrics[M.LEARNER_FORWARD_PADDED_FRACTION] = part.forward_padded_fraction
    if s.max_staleness:  # how old the trained tokens were, what waits for the next step
        metrics.update(staleness_metrics(part.batch, step - 1, io.carry.tokens(), len(io.carry.groups)))
    t_sync = sync(io.engine, io.learner)  # 10. sync: every replica loads the new weights
    metrics.update(timing_metrics(counters, stats, part.timings, lr, t_sync, time.perf_counter() - t_step))
    return metrics


def seed_step(seed: int, step: int) -> None:
    """Seed python, numpy and torch from (seed, step), so other draws (the tests' fake engines) are the step's too."""
    s = int(np.random.default_rng([seed, step]).integers(2**31 - 1))
    random.seed(s)
    np.random.seed(s)
    torch.manual_seed(s)


def new_refill(s: StepSettings) -> RefillAccumulator:
    """Dynamic sampling: batches until `train_batch_size` mixed groups are kept (capped); else one batch, all train."""
    if s.dynamic_sampling:
        return RefillAccumulator(s.train_batch_size, s.max_num_gen_batches, s.at_refill_cap)  # type: ignore[arg-type]
    return RefillAccumulator(s.train_batch_size, 1, "partial")


def score_share(problems: list[Problem], prompts: list[int], outs: list[list[Sample]], verifier: str) -> list[Any]:
    """Phase 2: the verifier's score of each of a share's samples (`prompts`: the share's batch indices)."""
    texts = [x.text for group in outs for x in group]
    answers = [problems[i].answer for i, group in zip(prompts, outs, strict=True) for _ in group]
    return list(score_responses(texts, answers, verifier=verifier))


def gather_groups(
    layout: ReplicaLayout,
    n: int,
    outs: list[list[Sample]],
    scores: list[Any],
    problems: list[Problem],
    prompts: list[list[int]],
    t_generate: float,
    t_score: float,
) -> tuple[list[Group], dict[str, float]]:
    """Every replica's samples and scores, on every rank, as a `Group` per prompt in batch order, and the slowest
    replica's "generate" and "score" seconds."""
    scored = iter(scores)
    mine = [[(x, next(scored)) for x in group] for group in outs] if layout.is_leader else []
    pieces, timings = gather_by_prompt(layout, n, len(prompts), mine, {"generate": t_generate, "score": t_score})
    groups = []
    for problem, prompt, parts in zip(problems, prompts, pieces, strict=True):
        pairs = [pair for piece in parts for pair in piece]
        groups.append(
            Group(
                problem=problem,
                prompt_ids=list(prompt),
                samples=[x for x, _ in pairs],
                scores=[float(sc.score) for _, sc in pairs],
                correct=[bool(sc.correct) for _, sc in pairs],
                penalties=[0.0] * len(pairs),
            )
        )
    return groups, {k: max(t[k] for t in timings) for k in ("generate", "score")}


def shape_rewards(groups: list[Group], s: StepSettings, tagger: HabitTagger | None) -> None:
    """Phase 3: the soft overlong penalty R_length (Eq. 13, row 3) joins each score (`Group.rewards`); tags."""
    if s.overlong_penalty:
        lengths = torch.tensor([len(x.response_ids) for g in groups for x in g.samples])
        pens = iter(
            soft_overlong_penalty(
                lengths, s.max_tokens, s.overlong_buffer_len, s.overlong_penalty_factor, dtype=torch.float64
            ).tolist()
        )
        for g in groups:
            g.penalties = [float(next(pens)) for _ in g.samples]
    if tagger is not None:
        for g in groups:
            g.tags = [list(tagger.tags(g.problem.problem, x.text, x.truncated)) for x in g.samples]


def rewards_of(groups: list[Group]) -> torch.Tensor:
    """[B, G] shaped rewards of the kept groups (score + overlong penalty)."""
    return torch.tensor([g.rewards for g in groups], dtype=torch.float32)


def policy_batch(groups: list[Group], advantages: torch.Tensor) -> PolicyBatch:
    """The learner's batch: a row per response with advantage, response mask (the loss mask until phase 6),
    truncation, the engine's log-probs (if given) and group index (for the group-token-mean)."""
    samples = [x for g in groups for x in g.samples]
    lengths = torch.tensor([len(x.response_ids) for x in samples])
    width = max(int(lengths.max()), 1)
    response_mask = (torch.arange(width)[None, :] < lengths[:, None]).to(torch.float32)  # [N, T]
    engine_logp = None
    if all(x.logprobs is not None for x in samples):
        engine_logp = pad_rows([x.logprobs for x in samples], width)  # type: ignore[misc]
    versions = None
    if any(x.segments for x in samples):  # carry-over: the weight version that sampled each token (a response
        # with no token has no segment: its row stays -1, so one empty response cannot switch the check off)
        versions = pad_versions([x.token_versions() for x in samples], width)
    return PolicyBatch(
        prompt_ids=[list(g.prompt_ids) for g in groups for _ in g.samples],
        response_ids=[list(x.response_ids) for x in samples],
        advantages=advantages,
        loss_mask=response_mask.clone(),
        group_ids=torch.arange(len(groups)).repeat_interleave(torch.tensor([len(g.samples) for g in groups])),
        truncated=torch.tensor([x.truncated for x in samples], dtype=torch.bool),
        response_mask=response_mask,
        engine_logp=engine_logp,
        versions=versions,
    )


def correct_for_engine(batch: PolicyBatch, s: StepSettings) -> tuple[torch.Tensor, dict[str, float]]:
    """The rollout correction's weights (`algorithm.rollout_correction`), on whole responses: exact per sequence."""
    if batch.engine_logp is None:
        raise ValueError(
            f"algorithm.rollout_correction={s.rollout_correction} needs the engine's log-probs of its samples, and "
            "this engine returned none"
        )
    return correction_weights(
        batch.old_logp,
        batch.engine_logp,
        batch.response_mask,
        s.rollout_correction,  # type: ignore[arg-type]
        s.correction_cap,
        s.correction_floor,
    )


def update(step: int, part: PartialStep, io: StepIO, s: StepSettings, counters: Counters) -> None:
    """Phase 8: the epochs x (groups / mini_batch_size) updates `part` has not done, each on a mini-batch of whole
    groups (`minibatch_plan`), metrics into `part.update_stats`; StopMidStep when a stop comes between two."""
    t0 = time.perf_counter()
    batch = part.batch
    if batch is None:  # dynamic sampling stopped at its cap (at_refill_cap=partial) without an informative group
        log.warning(
            "rollout step %d: no informative group within %d generation batches; no update",
            step,
            part.refill.stats.gen_batches,
        )
        return
    plan = minibatch_plan(int(batch.group_ids.max()) + 1, s.mini_batch_size, s.epochs, s.seed, step)
    try:
        for k in range(len(part.update_stats), len(plan)):
            if io.stop.anywhere():
                raise StopMidStep(part)
            rows = [int(r) for g in plan[k] for r in (batch.group_ids == g).nonzero().flatten()]
            out = io.learner.update(batch.select(rows), salt=counters.grad_updates)  # salt: the covariance draw
            part.update_stats.append(out)
            counters.grad_updates += 1
            if not out.get(M.UPDATE_SKIPPED):
                counters.nonfinite_streak = 0
                continue
            counters.nonfinite_total += 1
            counters.nonfinite_streak += 1
            log.warning(
                "non-finite loss or gradient at rollout step %d: update skipped (%d in a row)",
                step,
                counters.nonfinite_streak,
            )
            if counters.gave_up(s.max_consecutive_nonfinite):
                break  # the trainer fails the run
    finally:
        part.timings["update"] = part.timings.get("update", 0.0) + time.perf_counter() - t0


def minibatch_plan(num_groups: int, mini_batch_size: int, epochs: int, seed: int, step: int) -> list[list[int]]:
    """Group indices of each mini-batch in update order: a permutation per (seed, step, epoch), so a resume needs no
    saved state. Groups never split (the group-token-mean sees whole groups); a smaller last one takes a remainder."""
    plan = []
    for epoch in range(epochs):
        perm = np.random.default_rng([seed, step, epoch]).permutation(num_groups)
        plan += [perm[i : i + mini_batch_size].tolist() for i in range(0, num_groups, mini_batch_size)]
    return plan


def timing_metrics(
    counters: Counters, stats: RefillStats, timings: dict[str, float], lr: float, t_sync: float, t_step: float
) -> dict[str, float]:
    """The step's counters, lr and phase timings."""
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
        M.TIME_UPDATE: timings.get("update", 0.0),
        M.TIME_SYNC: t_sync,
        M.TIME_STEP: t_step,
        M.TOKENS_PER_SEC: stats.tokens_generated / gen_t if gen_t > 0 else math.nan,
    }


def sync(engine: RolloutEngine, learner: PolicyLearner) -> float:
    """Phase 10: every replica loads the new weights (always: a level-2 sleep discarded the old); seconds taken."""
    t0 = time.perf_counter()
    engine.sync_weights(learner.named_parameters_for_sync())
    return time.perf_counter() - t0
