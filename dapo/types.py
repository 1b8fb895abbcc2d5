"""Plain data types shared across modules (no behaviour, no heavy imports)."""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Literal, get_args

# How a loss is aggregated over a mini-batch's tokens (dapo.algos.aggregation has the formulas): the one list,
# read by the config's schema and the algorithm alike.
LossAggMode = Literal["seq-mean-token-mean", "token-mean", "group-token-mean", "seq-mean-token-sum"]
LOSS_AGG_MODES: tuple[str, ...] = get_args(LossAggMode)
# The policy loss by name (dapo.algos.policy_loss) and the rollout/learner mismatch correction
# (dapo.algos.rollout_correction): one list each, read by the config's schema and the algorithm alike.
PolicyLossName = Literal["ppo_clip", "gspo", "cispo", "clip_cov", "kl_cov", "sapo", "gmpo", "dppo_tv", "dppo_kl"]
POLICY_LOSSES: tuple[str, ...] = get_args(PolicyLossName)
RolloutCorrection = Literal["none", "token_tis", "sequence_tis", "token_mis", "sequence_mis"]
ROLLOUT_CORRECTIONS: tuple[str, ...] = get_args(RolloutCorrection)


@dataclass(frozen=True)
class Problem:
    """A raw problem: its text without any template, and its ground-truth answer as a string."""

    id: str
    problem: str
    answer: str


@dataclass
class Sample:
    """One generated response. `finish_reason` is "stop" (ended by EOS) or "length" (hit the cap), or "abort" for a
    response stopped before its end that continues in the next rollout step (`rollout.max_staleness` >= 1).
    `segments`: with carry-over, [first token, weight version] of each part generated under one version of the
    weights, in order (the version: rollout steps completed when it was sampled); empty otherwise."""

    response_ids: list[int]
    logprobs: list[float] | None
    finish_reason: str
    text: str
    segments: list[list[int]] = field(default_factory=list)

    @property
    def truncated(self) -> bool:
        return self.finish_reason == "length"

    @property
    def finished(self) -> bool:
        """Ended by EOS or the cap ("abort": it continues)."""
        return self.finish_reason in ("stop", "length")

    def token_versions(self) -> list[int]:
        """The weight version of each response token, from `segments` (one per token; none without segments)."""
        if not self.segments:
            return []
        bounds = [start for start, _ in self.segments[1:]] + [len(self.response_ids)]
        return [v for (start, v), end in zip(self.segments, bounds, strict=True) for _ in range(start, end)]


@dataclass
class Group:
    """One prompt and its G sampled responses, scored (a rollout step's unit: dynamic sampling keeps or drops it)."""

    problem: Problem
    prompt_ids: list[int]
    samples: list[Sample]
    scores: list[float]  # +1 / -1 correctness score
    correct: list[bool]
    penalties: list[float]  # R_length * factor (all 0 when the soft punishment is off)
    tags: list[list[str]] = field(default_factory=list)  # per response: a world's habit tags, or none

    @property
    def rewards(self) -> list[float]:
        """Shaped rewards: score + overlong penalty (what the advantages are computed from)."""
        return [s + p for s, p in zip(self.scores, self.penalties, strict=True)]

    @property
    def num_tokens(self) -> int:
        return sum(len(s.response_ids) for s in self.samples)


@dataclass
class GroupOutcome:
    """What the metrics keep of every generated group, dropped ones included (the groups themselves are not kept:
    at the paper's scale their tokens would triple what a step holds)."""

    correct: list[bool]
    rewards: list[float]  # shaped
    lengths: list[int]  # response tokens
    truncated: list[bool]
    tags: list[list[str]]  # per response, the habit tags (empty lists without a tagger)
    kind: str = ""  # the problem's kind, from the tagger ("" without one)
    distinct: int = 0  # distinct responses in the group (0: not counted)
    repeat_log_chance: float | None = None  # log-chance bound of its repeats under independent draws (None: none)
