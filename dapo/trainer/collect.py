"""The rollout half of a step: generate G responses per prompt on every replica, score, shape, and (row 5) refill.

The paper's sections 3.2 (dynamic sampling) and 3.4 (overlong reward shaping). Each prompt's G responses form a `Group`.
Its rewards are the +1/-1 correctness score plus, when soft overlong punishment is on, R_length (Eq. 13). Dynamic
sampling keeps a group iff its *correctness* varies (not the shaped reward) and generates further batches of
`gen_batch_size` prompts until `train_batch_size` groups are kept or the cap is reached (`RefillAccumulator`). Without
dynamic sampling one batch of `train_batch_size` prompts is generated and every group trains.

Replicas (`Sampler.sample`, `dapo.rollout.replicas`): each generation batch is cut into one share of its samples per
replica (part of every prompt's group where it can, so no replica draws all the responses of the hardest prompts);
each replica generates and scores its share (scoring where the samples are spreads the verifier's CPU work over the
job instead of piling it on one rank), and an all-gather gives every rank every replica's part, put back together
into the batch's groups in order. Every rank then runs the same refill decision on the same groups, so the kept count is
over all replicas, every replica stops at the same generation batch, and the token count includes what every
replica generated, dropped groups included.

Timers accumulate over every generation batch of the step (a timer reset per refill undercounts dynamic
sampling) and take the slowest replica's time per batch (what the step waited for); the Fig 3b fractions are
taken over every generated group, before any filter.
"""

from __future__ import annotations

import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from typing import Any

import torch

from dapo.algos.dynamic_sampling import RefillAccumulator, RefillStats, keep_groups
from dapo.algos.metrics import group_sameness
from dapo.algos.overlong import soft_overlong_penalty
from dapo.rollout.base import RolloutEngine
from dapo.rollout.replicas import ReplicaLayout, Share, gather_shares, merge_by_prompt, split_samples
from dapo.rollout.seeds import sampling_seed, share_seeds
from dapo.trainer.components import HabitTagger, Scorer
from dapo.types import GroupOutcome, Problem, Sample

# Seed streams (first key after the run's seed): training rollouts and evaluation never share a seed.
TRAIN_STREAM, EVAL_STREAM = 0, 1


@dataclass
class Group:
    """One prompt and its G sampled responses, scored."""

    problem: Problem
    prompt_ids: list[int]
    samples: list[Sample]
    scores: list[float]  # +1 / -1 correctness score
    correct: list[bool]
    penalties: list[float]  # R_length * factor (all 0 when the soft punishment is off)
    tags: list[list[str]] = field(default_factory=list)  # per response: its habit tags (a `HabitTagger`'s), or none

    @property
    def rewards(self) -> list[float]:
        """Shaped rewards: score + overlong penalty (what the advantages are computed from)."""
        return [s + p for s, p in zip(self.scores, self.penalties, strict=True)]

    @property
    def num_tokens(self) -> int:
        return sum(len(s.response_ids) for s in self.samples)


def outcome_of(g: Group, kind: str = "") -> GroupOutcome:
    """What the metrics keep of one generated group."""
    distinct, repeat_log_chance = group_sameness([x.response_ids for x in g.samples], [x.logprobs for x in g.samples])
    return GroupOutcome(
        correct=list(g.correct),
        rewards=g.rewards,
        lengths=[len(x.response_ids) for x in g.samples],
        truncated=[x.truncated for x in g.samples],
        tags=[list(t) for t in g.tags] or [[] for _ in g.samples],
        kind=kind,
        distinct=distinct,
        repeat_log_chance=repeat_log_chance,
    )


@dataclass(frozen=True)
class RolloutSettings:
    """Plain values for the rollout half (the config stops at the trainer boundary)."""

    n: int
    max_tokens: int
    temperature: float = 1.0
    top_p: float = 1.0
    overlong_penalty: bool = False
    overlong_buffer_len: int = 1
    overlong_penalty_factor: float = 1.0
    dynamic_sampling: bool = False
    train_batch_size: int = 1
    gen_batch_size: int | None = None
    max_num_gen_batches: int = 0
    at_refill_cap: str = "partial"


@dataclass
class Sampled:
    """One generation batch, scored: its groups in prompt order (every replica's), and the slowest replica's
    "generate" and "score" seconds."""

    groups: list[Group]
    timings: dict[str, float]


@dataclass
class Collected:
    """What a rollout step collected. `groups` train; the rest is for metrics."""

    groups: list[Group]
    stats: RefillStats
    generated: list[GroupOutcome]  # every generated group, before filtering
    timings: dict[str, float] = field(default_factory=dict)  # "generate", "score": summed over batches

    @property
    def all_correct(self) -> list[list[bool]]:
        return [o.correct for o in self.generated]

    @property
    def all_rewards(self) -> list[list[float]]:
        return [o.rewards for o in self.generated]


class StopDuringRefill(Exception):  # noqa: N818 (a control-flow signal, not an error)
    """A stop was requested between generation batches; `.state` resumes the refill (a checkpoint stores it as JSON)."""

    def __init__(self, state: dict[str, Any]):
        super().__init__("stop requested during the dynamic-sampling refill")
        self.state = state


def make_groups(
    problems: Sequence[Problem],
    prompts: Sequence[list[int]],
    outs: Sequence[list[Sample]],
    scores: Sequence[Any],
    s: RolloutSettings,
    tagger: HabitTagger | None = None,
) -> list[Group]:
    """Groups from generated samples and their scores (`dapo.rewards.Score`, flat, prompt by prompt), with the
    soft overlong penalty added when it is on."""
    lengths = torch.tensor([len(smp.response_ids) for group in outs for smp in group])
    if s.overlong_penalty:
        pens = soft_overlong_penalty(
            lengths, s.max_tokens, s.overlong_buffer_len, s.overlong_penalty_factor, dtype=torch.float64
        ).tolist()
    else:
        pens = [0.0] * len(lengths)
    groups, k = [], 0
    for pb, prompt, samples in zip(problems, prompts, outs, strict=True):
        g = len(samples)
        sc = scores[k : k + g]
        groups.append(
            Group(
                problem=pb,
                prompt_ids=list(prompt),
                samples=list(samples),
                scores=[float(x.score) for x in sc],
                correct=[bool(x.correct) for x in sc],
                penalties=[float(p) for p in pens[k : k + g]],
                tags=[list(tagger.tags(pb.problem, x.text, x.truncated)) for x in samples] if tagger else [],
            )
        )
        k += g
    return groups


def join_groups(pieces: Sequence[Group]) -> Group:
    """One prompt's group from the pieces that replicas sampled of it, in sample order."""
    first = pieces[0]
    return Group(
        problem=first.problem,
        prompt_ids=first.prompt_ids,
        samples=[x for g in pieces for x in g.samples],
        scores=[x for g in pieces for x in g.scores],
        correct=[x for g in pieces for x in g.correct],
        penalties=[x for g in pieces for x in g.penalties],
        tags=[x for g in pieces for x in g.tags],
    )


class Sampler:
    """Generation batches on every rollout replica of the job (one replica, and no collective, in one process).

    Args:
        engine: this rank's engine (its replica's, with tensor parallel > 1).
        scorer: (responses, answers) -> scores; run by each replica's leader on its own share.
        layout: the job's replicas.
        s: rollout settings.
        seed: the run's seed; sample j of prompt i of generation batch b of step t is drawn with
            `sample_seed(sampling_seed(seed, TRAIN_STREAM, t, b), i, j)`, whichever replica draws it.
        tagger: what a world knows of its responses (the habits world: tags, problem kinds, habit metrics), or None.
    """

    def __init__(
        self,
        engine: RolloutEngine,
        scorer: Scorer,
        layout: ReplicaLayout,
        s: RolloutSettings,
        seed: int,
        tagger: HabitTagger | None = None,
    ) -> None:
        self.engine, self.scorer, self.layout, self.s, self.seed = engine, scorer, layout, s, seed
        self.tagger = tagger

    def sample(self, step: int, gen_batch: int, problems: list[Problem], prompts: list[list[int]]) -> Sampled:
        """Generation batch `gen_batch` of rollout step `step` (1-based): this replica generates and scores its
        share of the samples, and every rank gets every replica's part, put back together into the batch's groups.
        Collective: every rank calls it with the same prompts."""
        shares = split_samples(len(problems), self.s.n, self.layout.num_replicas)
        share = shares[self.layout.replica]
        base = sampling_seed(self.seed, TRAIN_STREAM, step, gen_batch)
        mine = self._generate_and_score(
            [problems[i] for i in share.prompts], [prompts[i] for i in share.prompts], share, base
        )
        parts = gather_shares(self.layout, shares, mine)
        pieces = merge_by_prompt(len(problems), [(sh, part.groups) for sh, part in parts])
        return Sampled(
            [join_groups(p) for p in pieces],
            {k: max(part.timings.get(k, 0.0) for _, part in parts) for k in ("generate", "score")},
        )

    def kind(self, problem: str) -> str:
        """The problem's kind for the step's metrics ("" without a tagger)."""
        return self.tagger.kind(problem) if self.tagger is not None else ""

    def world_metrics(self, generated: Sequence[GroupOutcome]) -> dict[str, float]:
        """The tagger's metrics over every generated group of a step (the habits world's `habit/*`), else none."""
        return self.tagger.metrics(generated) if self.tagger is not None else {}

    def _generate_and_score(
        self, problems: list[Problem], prompts: list[list[int]], share: Share, base: int
    ) -> Sampled:
        s = self.s
        seeds = share_seeds(base, share.prompts, share.counts, share.first)
        t0 = time.perf_counter()
        outs = self.engine.generate(
            prompts, n=share.counts, max_tokens=s.max_tokens, temperature=s.temperature, top_p=s.top_p, seeds=seeds
        )
        t1 = time.perf_counter()
        if not self.layout.is_leader:  # a tensor-parallel member: the same samples as its leader, whose result is kept
            return Sampled([], {"generate": t1 - t0})
        texts = [smp.text for group in outs for smp in group]
        answers = [pb.answer for pb, group in zip(problems, outs, strict=True) for _ in group]
        scores = self.scorer(texts, answers)
        groups = make_groups(problems, prompts, outs, scores, s, self.tagger)
        return Sampled(groups, {"generate": t1 - t0, "score": time.perf_counter() - t1})


def collect(
    sampler: Sampler,
    step: int,
    next_batch: Callable[[int], tuple[list[Problem], list[list[int]]]],
    s: RolloutSettings,
    *,
    should_stop: Callable[[], bool] = lambda: False,
    resume: dict[str, Any] | None = None,
) -> Collected:
    """Rollout step `step`'s groups, refilling when dynamic sampling is on.

    Args:
        sampler: generates and scores each generation batch on every replica (`Sampler.sample`).
        step: the rollout step (1-based).
        next_batch: k -> the next k problems and their prompt token ids (the seeded data order; every rank draws
            the same ones).
        s: rollout settings.
        should_stop: polled before each refill batch (on every rank: make it collective); when True, raises
            `StopDuringRefill` with the state.
        resume: a `StopDuringRefill.state` to continue from (after a restart).

    Raises:
        RefillCapReached: at the cap with at_refill_cap="fail" (its `.stats` has the counts).
    """
    if not s.dynamic_sampling:
        problems, prompts = next_batch(s.train_batch_size)
        batch = sampler.sample(step, 0, problems, prompts)
        groups = batch.groups
        stats = RefillStats(
            gen_batches=1,
            groups_generated=len(groups),
            groups_kept=len(groups),
            tokens_generated=sum(g.num_tokens for g in groups),
            full=True,
        )
        generated = [outcome_of(g, sampler.kind(g.problem.problem)) for g in groups]
        return Collected(groups, stats, generated, dict(batch.timings))

    if resume is not None:
        acc, generated, timings = resume["acc"], resume["generated"], dict(resume["timings"])
    else:
        acc = RefillAccumulator(s.train_batch_size, s.max_num_gen_batches, s.at_refill_cap)  # type: ignore[arg-type]
        generated, timings = [], {}
    gen_size = s.gen_batch_size or s.train_batch_size
    while not acc.done:
        if acc.stats.gen_batches > 0 and should_stop():
            raise StopDuringRefill({"acc": acc, "generated": generated, "timings": timings})
        problems, prompts = next_batch(gen_size)
        batch = sampler.sample(step, acc.stats.gen_batches, problems, prompts)
        for k, v in batch.timings.items():
            timings[k] = timings.get(k, 0.0) + v
        groups = batch.groups
        generated += [outcome_of(g, sampler.kind(g.problem.problem)) for g in groups]
        keep = keep_groups(torch.tensor([g.correct for g in groups], dtype=torch.bool))
        acc.add(groups, keep, sum(g.num_tokens for g in groups))  # may raise RefillCapReached
    kept, stats = acc.result()
    return Collected(kept, stats, generated, timings)
