"""The rollout half of a step: generate G responses per prompt, score, shape, and (row 5) refill.

SPEC sections 3-4. Each prompt's G responses form a `Group`. Its rewards are the +1/-1 correctness score plus,
when soft overlong punishment is on, R_length (Eq. 13). Dynamic sampling keeps a group iff its *correctness*
varies (not the shaped reward) and generates further batches of `gen_batch_size` prompts until
`train_batch_size` groups are kept or the cap is reached (`RefillAccumulator`). Without dynamic sampling one
batch of `train_batch_size` prompts is generated and every group trains.

Timers accumulate over every generation batch of the step (SPEC pitfall: a timer reset per refill undercounts
dynamic sampling), and the Fig 3b fractions are taken over every generated group, before any filter.
"""

from __future__ import annotations

import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from typing import Any

import torch

from dapo.algos.dynamic_sampling import RefillAccumulator, RefillStats, keep_groups
from dapo.algos.overlong import soft_overlong_penalty
from dapo.types import Problem, Sample

ScoreFn = Callable[[list[str], list[str]], list[Any]]  # (responses, answers) -> [Score(score, correct, ...)]


@dataclass
class Group:
    """One prompt and its G sampled responses, scored."""

    problem: Problem
    prompt_ids: list[int]
    samples: list[Sample]
    scores: list[float]  # +1 / -1 correctness score
    correct: list[bool]
    penalties: list[float]  # R_length * factor (all 0 when the soft punishment is off)

    @property
    def rewards(self) -> list[float]:
        """Shaped rewards: score + overlong penalty (what the advantages are computed from)."""
        return [s + p for s, p in zip(self.scores, self.penalties, strict=True)]

    @property
    def num_tokens(self) -> int:
        return sum(len(s.response_ids) for s in self.samples)


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
class Collected:
    """What a rollout step collected. `groups` train; the rest is for metrics."""

    groups: list[Group]
    stats: RefillStats
    all_correct: list[list[bool]]  # correctness of every generated group, before filtering
    all_rewards: list[list[float]]  # shaped rewards of every generated group
    timings: dict[str, float] = field(default_factory=dict)  # "generate", "score": summed over batches


class StopDuringRefill(Exception):  # noqa: N818 (a control-flow signal, not an error)
    """A stop was requested between generation batches; `.state` resumes the refill (pickle it)."""

    def __init__(self, state: dict[str, Any]):
        super().__init__("stop requested during the dynamic-sampling refill")
        self.state = state


def make_groups(
    engine: Any,
    problems: Sequence[Problem],
    prompts: Sequence[list[int]],
    s: RolloutSettings,
    score_fn: ScoreFn,
    timings: dict[str, float],
) -> list[Group]:
    """Generate `s.n` responses per prompt, score them and add the overlong penalty. Adds to `timings`."""
    t0 = time.perf_counter()
    outs = engine.generate(
        [list(p) for p in prompts], n=s.n, max_tokens=s.max_tokens, temperature=s.temperature, top_p=s.top_p
    )
    t1 = time.perf_counter()
    texts = [smp.text for group in outs for smp in group]
    answers = [pb.answer for pb, group in zip(problems, outs, strict=True) for _ in group]
    scores = score_fn(texts, answers)
    t2 = time.perf_counter()
    timings["generate"] = timings.get("generate", 0.0) + (t1 - t0)
    timings["score"] = timings.get("score", 0.0) + (t2 - t1)

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
            )
        )
        k += g
    return groups


def collect(
    engine: Any,
    next_batch: Callable[[int], tuple[list[Problem], list[list[int]]]],
    s: RolloutSettings,
    score_fn: ScoreFn,
    *,
    should_stop: Callable[[], bool] = lambda: False,
    resume: dict[str, Any] | None = None,
) -> Collected:
    """One rollout step's groups, refilling when dynamic sampling is on.

    Args:
        engine: a `RolloutEngine`.
        next_batch: k -> the next k problems and their prompt token ids (the seeded data order).
        s: rollout settings.
        score_fn: (responses, answers) -> scores, e.g. `dapo.rewards.score_responses` with the verifier bound.
        should_stop: polled before each refill batch; when True, raises `StopDuringRefill` with the state.
        resume: a `StopDuringRefill.state` to continue from (after a restart).

    Raises:
        RefillCapReached: at the cap with at_refill_cap="fail" (its `.stats` has the counts).
    """
    if not s.dynamic_sampling:
        timings: dict[str, float] = {}
        problems, prompts = next_batch(s.train_batch_size)
        groups = make_groups(engine, problems, prompts, s, score_fn, timings)
        stats = RefillStats(
            gen_batches=1,
            groups_generated=len(groups),
            groups_kept=len(groups),
            tokens_generated=sum(g.num_tokens for g in groups),
            full=True,
        )
        return Collected(groups, stats, [g.correct for g in groups], [g.rewards for g in groups], timings)

    if resume is not None:
        acc, all_correct, all_rewards = resume["acc"], resume["all_correct"], resume["all_rewards"]
        timings = dict(resume["timings"])
    else:
        acc = RefillAccumulator(s.train_batch_size, s.max_num_gen_batches, s.at_refill_cap)  # type: ignore[arg-type]
        all_correct, all_rewards, timings = [], [], {}
    gen_size = s.gen_batch_size or s.train_batch_size
    while not acc.done:
        if acc.stats.gen_batches > 0 and should_stop():
            raise StopDuringRefill(
                {"acc": acc, "all_correct": all_correct, "all_rewards": all_rewards, "timings": timings}
            )
        problems, prompts = next_batch(gen_size)
        groups = make_groups(engine, problems, prompts, s, score_fn, timings)
        all_correct += [g.correct for g in groups]
        all_rewards += [g.rewards for g in groups]
        keep = keep_groups(torch.tensor([g.correct for g in groups], dtype=torch.bool))
        acc.add(groups, keep, sum(g.num_tokens for g in groups))  # may raise RefillCapReached
    kept, stats = acc.result()
    return Collected(kept, stats, all_correct, all_rewards, timings)
