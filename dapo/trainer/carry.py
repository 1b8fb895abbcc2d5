"""Rollouts that carry over to the next step (`rollout.max_staleness` = eta >= 1; docs/algorithm.md section 13).

A step keeps more groups in flight than it trains on (`StepSettings.in_flight`: the generation batch and a quarter of
the train batch more), the groups carried from the step before first, topped up with fresh prompts. One generation
round continues every unfinished response from its prompt and what it has so far, under the weights the engine holds
now, until enough groups have finished (with dynamic sampling: enough informative ones); the engine then aborts the
rest, which stay in flight with their tokens and the log-probs they were sampled with. Every response records the
weight version of each of its segments (`Sample.segments`).

Staleness: a token sampled with version v (the rollout steps completed when it was drawn) and trained at step t, whose
proximal policy is version t - 1, is t - 1 - v versions old. A group is never dropped for its age: one whose first
tokens would be more than eta versions old at the next step must finish in this one (`must_finish`), and the round
goes on until it has; finished groups are handed to the refill oldest first. Carried groups are bounded by the train
batch (`should_stop`), so the next step's must-finish groups always fit in its batch.

    one round:  top up -> requests (prompt + prefix, the remaining cap, `segment_seed` of where each sample sits)
                -> engine.generate_partial, polled after every decode step: each finished response is scored by
                   its replica's leader, gathered on every rank, and `should_stop` asks whether enough have finished
                -> the finished groups, oldest first (`plan_offer`) -> the step's refill; the rest stay in flight
"""

from __future__ import annotations

import time
from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import Any, Protocol

from dapo import distributed as dist
from dapo.rewards.score import score_responses
from dapo.rollout.base import Continuation, RolloutEngine
from dapo.rollout.replicas import ReplicaLayout, segment_seed, split_evenly
from dapo.trainer.data_order import PromptSource
from dapo.types import Group, Problem, Sample


class RoundSettings(Protocol):
    """What a round reads of the step's settings (`step.StepSettings`)."""

    n: int
    max_tokens: int
    temperature: float
    top_p: float
    verifier: str
    max_staleness: int
    dynamic_sampling: bool
    train_batch_size: int

    @property
    def in_flight(self) -> int: ...


@dataclass
class InFlight:
    """One group in flight: its problem and prompt, where it was drawn (the seed base of its generation batch and its
    index there: its samples' seeds), the weight version its first tokens were sampled with (`born`), its G responses
    so far ("abort" while unfinished) and, once each has finished, its score."""

    problem: Problem
    prompt_ids: list[int]
    seed_base: int
    index: int
    born: int
    samples: list[Sample]
    scores: list[float | None]
    correct: list[bool | None]

    @property
    def complete(self) -> bool:
        return all(x.finished for x in self.samples)

    def group(self) -> Group:
        """The finished group, scored, as the step's phases take it (penalties 0 until phase 3)."""
        return Group(
            problem=self.problem,
            prompt_ids=list(self.prompt_ids),
            samples=list(self.samples),
            scores=[float(x) for x in self.scores],  # type: ignore[arg-type]
            correct=[bool(x) for x in self.correct],
            penalties=[0.0] * len(self.samples),
        )


def fresh(problem: Problem, prompt_ids: list[int], seed_base: int, index: int, born: int, n: int) -> InFlight:
    """A group drawn this round, none of its responses started."""
    samples = [Sample([], [], "abort", "") for _ in range(n)]
    return InFlight(problem, list(prompt_ids), seed_base, index, born, samples, [None] * n, [None] * n)


@dataclass
class Round:
    """What one round hands the step: the finished groups to offer the refill (oldest first), the slowest replica's
    generation and scoring seconds, and the tokens it generated (continued prefixes not counted again)."""

    groups: list[Group]
    seconds: dict[str, float]
    tokens: int


def must_finish(born: int, version: int, max_staleness: int) -> bool:
    """A group that may not wait for the next step: trained there (proximal policy `version` + 1) its first tokens
    would be more than `max_staleness` versions old."""
    return version + 1 - born > max_staleness


def plan_offer(
    complete: Sequence[bool], born: Sequence[int], needed: int, dynamic_sampling: bool
) -> tuple[list[int], list[int]]:
    """(groups offered to the refill, groups kept in flight), as indices into the pool. Finished groups go oldest first
    (then in pool order). With dynamic sampling all of them (the refill keeps the informative ones it needs, drops the
    rest as the synchronous step does); without, the `needed` oldest, the others waiting finished for the next step."""
    done = sorted((i for i, c in enumerate(complete) if c), key=lambda i: (born[i], i))
    offered = done if dynamic_sampling else done[:needed]
    taken = set(offered)
    return offered, [i for i in range(len(complete)) if i not in taken]


def should_stop(
    complete: Sequence[bool],
    informative: Sequence[bool | None],
    born: Sequence[int],
    *,
    left: int,
    needed: int,
    version: int,
    max_staleness: int,
    capacity: int,
    dynamic_sampling: bool,
) -> bool:
    """Whether a round may stop: nothing is left to decode (`left` responses), or every must-finish group has
    finished, enough groups have (`needed`; with dynamic sampling, informative ones), and the groups that would wait
    until a step where they must finish number at most `capacity` (the train batch: they must all fit in it)."""
    if left == 0:
        return True
    if any(must_finish(b, version, max_staleness) and not c for b, c in zip(born, complete, strict=True)):
        return False
    ready = sum(c and (bool(i) or not dynamic_sampling) for c, i in zip(complete, informative, strict=True))
    if ready < needed:
        return False
    _, waiting = plan_offer(complete, born, needed, dynamic_sampling)
    return sum(must_finish(born[i], version + 1, max_staleness) for i in waiting) <= capacity


@dataclass
class Carry:
    """The groups in flight between rounds and steps; a checkpoint keeps them (`trainer/checkpoint.py`)."""

    groups: list[InFlight] = field(default_factory=list)

    def tokens(self) -> int:
        """Response tokens held in flight."""
        return sum(len(x.response_ids) for g in self.groups for x in g.samples)

    def round(
        self,
        engine: RolloutEngine,
        layout: ReplicaLayout,
        prompts: PromptSource,
        seed_base: int,
        version: int,
        s: RoundSettings,
        needed: int,
    ) -> Round:
        """One generation round (module docstring): top up to `s.in_flight` groups with prompts drawn under
        `seed_base`, continue every unfinished response under weight `version`, stop when `should_stop` says, and
        return the finished groups the refill is offered (`needed`: groups it still wants). Collective."""
        problems, ids = prompts.take(max(0, s.in_flight - len(self.groups)))
        self.groups += [
            fresh(p, x, seed_base, i, version, s.n) for i, (p, x) in enumerate(zip(problems, ids, strict=True))
        ]
        # sample-major, as `replicas.split_samples`: each replica takes part of every group
        work = [(g, j) for j in range(s.n) for g in range(len(self.groups)) if not self.groups[g].samples[j].finished]
        mine = list(split_evenly(len(work), layout.num_replicas)[layout.replica])
        requests = [self._request(*work[w], s.max_tokens) for w in mine]
        before = [len(self.groups[g].samples[j].response_ids) for g, j in work]
        left = [len(work)]
        timing = {"score": 0.0}
        t0 = time.perf_counter()

        def poll(finished: list[tuple[int, Sample]]) -> bool:
            t = time.perf_counter()
            done = [(mine[k], x) for k, x in finished] if layout.is_leader else []
            scores = _score(self.groups, work, done, s.verifier)
            timing["score"] += time.perf_counter() - t
            for w, x, sc in _gather(layout, [(w, x, sc) for (w, x), sc in zip(done, scores, strict=True)]):
                self._record(work[w], x, before[w], version, sc)
                left[0] -= 1
            return should_stop(
                [g.complete for g in self.groups],
                [_informative(g) for g in self.groups],
                [g.born for g in self.groups],
                left=left[0],
                needed=needed,
                version=version,
                max_staleness=s.max_staleness,
                capacity=s.train_batch_size,
                dynamic_sampling=s.dynamic_sampling,
            )

        outs = engine.generate_partial(requests, s.temperature, s.top_p, poll)
        mine_secs = {"generate": time.perf_counter() - t0 - timing["score"], "score": timing["score"]}
        aborted = [(w, x) for w, x in zip(mine, outs, strict=True) if not x.finished] if layout.is_leader else []
        gathered = dist.all_gather((aborted, mine_secs)) if layout.world_size > 1 else [(aborted, mine_secs)]
        for pieces, _ in gathered:
            for w, x in pieces:
                self._record(work[w], x, before[w], version, None)
        tokens = sum(len(self.groups[g].samples[j].response_ids) for g, j in work) - sum(before)
        offered, waiting = plan_offer(
            [g.complete for g in self.groups], [g.born for g in self.groups], needed, s.dynamic_sampling
        )
        late = [i for i in waiting if must_finish(self.groups[i].born, version, s.max_staleness)]
        if late:  # should_stop never lets this happen: a group would be trained older than max_staleness
            raise RuntimeError(f"carry-over: {len(late)} group(s) would wait past rollout.max_staleness")
        groups = [self.groups[i].group() for i in offered]
        self.groups = [self.groups[i] for i in waiting]
        seconds = {k: max(secs[k] for _, secs in gathered) for k in ("generate", "score")}
        return Round(groups, seconds, tokens)

    def _request(self, g: int, j: int, max_tokens: int) -> Continuation:
        group = self.groups[g]
        x = group.samples[j]
        return Continuation(
            prompt_ids=group.prompt_ids,
            prefix_ids=list(x.response_ids),
            prefix_logprobs=list(x.logprobs or []),
            max_tokens=max_tokens - len(x.response_ids),
            seed=segment_seed(group.seed_base, group.index, j, len(x.segments)),
        )

    def _record(self, where: tuple[int, int], x: Sample, before: int, version: int, score: Any) -> None:
        """Sample j of group g as the engine returned it, with the segment this round added (if any) and its score."""
        g, j = where
        group = self.groups[g]
        added = [[before, version]] if len(x.response_ids) > before else []
        segments = group.samples[j].segments + added
        group.samples[j] = Sample(x.response_ids, x.logprobs, x.finish_reason, x.text, segments)
        if score is not None:
            group.scores[j], group.correct[j] = float(score.score), bool(score.correct)


def _informative(g: InFlight) -> bool | None:
    """Dynamic sampling's test of a finished group (0 < #correct < G), None before it has finished."""
    if not g.complete:
        return None
    return len(set(g.correct)) > 1


def _score(
    groups: list[InFlight], work: list[tuple[int, int]], done: list[tuple[int, Sample]], verifier: str
) -> list[Any]:
    """The verifier's score of each finished response (its whole text), on the leader of the replica that drew it."""
    if not done:
        return []
    answers = [groups[work[w][0]].problem.answer for w, _ in done]
    return list(score_responses([x.text for _, x in done], answers, verifier=verifier))


def _gather(layout: ReplicaLayout, mine: list[Any]) -> list[Any]:
    """Every replica leader's list, concatenated in replica order, on every rank (one collective; alone: `mine`)."""
    if layout.world_size == 1:
        return mine
    got = dist.all_gather(mine if layout.is_leader else [])
    return [item for r in layout.leader_ranks for item in got[r]]
