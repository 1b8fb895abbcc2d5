"""Evaluate a policy: sample n responses per problem, score them, and summarise as avg@n, pass@k and maj@n with
bootstrap confidence intervals (the paper's section 4.1: AIME 2024, n = 32, temperature 1.0, top_p 0.7).

`evaluate` runs in one process (`dapo eval`); `evaluate_on_replicas` inside a training job, shard by shard across
the rollout replicas, returning None on a stop request between shards (the trainer redoes the whole evaluation after
the restart). docs/architecture.md, "evaluation/"; on replicas: docs/distributed.md, "One rollout step on W ranks".
"""

from __future__ import annotations

import json
from collections.abc import Callable, Iterator, Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from dapo.metric_names import EVAL_LEN_MEAN, EVAL_TRUNC_FRAC
from dapo.rollout.base import RolloutEngine
from dapo.rollout.replicas import ReplicaLayout, gather_by_prompt, generate_share
from dapo.types import Problem, Sample


@dataclass(frozen=True)
class EvalSettings:
    """How to sample and summarise (plain values; `eval.*` of the run config).

    Attributes:
        n: samples per problem (avg@n, maj@n).
        max_tokens: generation cap; responses that hit it count as truncated (and are scored as they are).
        temperature, top_p: sampling (the paper: 1.0 and 0.7).
        pass_k: the k of pass@k; each must be <= n (larger k are skipped).
        verifier: "math_verify" or "dapo_rule" (`dapo.rewards`).
        bootstrap, confidence: bootstrap confidence intervals over problems.
        seed: the bootstrap's seed, and the base of the sampling seeds.
    """

    n: int
    max_tokens: int
    temperature: float = 1.0
    top_p: float = 1.0
    pass_k: tuple[int, ...] = (1,)
    verifier: str = "math_verify"
    bootstrap: int = 1000
    confidence: float = 0.95
    seed: int = 0


@dataclass
class EvalResult(Mapping[str, float]):
    """Eval metrics (`metric_names.eval_avg(n)`, `eval_pass(k)`, `eval_maj(n)`, with `_ci_low` / `_ci_high`, in
    percent) and one record per sample. Reads as the metrics mapping, so `dict(result)` is the metrics."""

    metrics: dict[str, float]
    samples: list[dict[str, Any]] = field(default_factory=list)

    def __getitem__(self, key: str) -> float:
        return self.metrics[key]

    def __iter__(self) -> Iterator[str]:
        return iter(self.metrics)

    def __len__(self) -> int:
        return len(self.metrics)


def evaluate(
    engine: RolloutEngine,
    problems: Sequence[Problem],
    prompt_ids: Sequence[list[int]],
    settings: EvalSettings,
    *,
    seed_base: int | None = None,
) -> EvalResult:
    """Sample, score and summarise, in this process.

    Args:
        engine: a `dapo.rollout.RolloutEngine` (anything with its `generate`).
        problems: P problems (their answers are what the responses are checked against).
        prompt_ids: their P prompts, built and tokenised (`dapo.data.prompts.tokenize_problems`).
        settings: how to sample and summarise.
        seed_base: the base of the sampling seeds: sample j of problem i is drawn with
            `dapo.rollout.replicas.sample_seed(seed_base, i, j)` (None: the engine's own stream).
    Returns:
        EvalResult: metrics in percent; samples [P * n] dicts with problem_id, sample_index, text, extracted,
        answer, score, correct, truncated, num_tokens.
    """
    _check(problems, prompt_ids)
    s = settings
    if seed_base is None:
        groups = engine.generate(
            [list(p) for p in prompt_ids], [s.n] * len(prompt_ids), s.max_tokens, s.temperature, s.top_p
        )
    else:
        _, groups = generate_share(
            engine, ReplicaLayout(1, 1, 0), prompt_ids, s.n, seed_base, s.max_tokens, s.temperature, s.top_p
        )
    return summarise([r for piece in score_records(list(problems), groups, [0] * len(groups), s) for r in piece], s)


def evaluate_on_replicas(
    engine: RolloutEngine,
    layout: ReplicaLayout,
    problems: Sequence[Problem],
    prompt_ids: Sequence[list[int]],
    settings: EvalSettings,
    *,
    seed_base: int,
    shard_sequences: int,
    should_stop: Callable[[], bool] = lambda: False,
) -> EvalResult | None:
    """`evaluate` on every replica of a job; every rank returns the same result, or None when stopped.

    Args:
        layout: the job's replicas (one process: a single replica, and this is `evaluate` in shards).
        seed_base: the base of the sampling seeds, as in `evaluate` (problem i is its index in `problems`): the
            samples do not depend on the shards or on which replica draws them.
        shard_sequences: responses per shard over all replicas (at least one problem's n): the longest stretch
            between two stop checks is one shard's generation.
        should_stop: polled before each shard but the first (collective, on every rank).
    """
    _check(problems, prompt_ids)
    s = settings
    per_shard = max(1, shard_sequences // s.n)
    records: list[dict[str, Any]] = []
    for k, start in enumerate(range(0, len(problems), per_shard)):
        if k > 0 and should_stop():
            return None
        shard = list(problems[start : start + per_shard])
        share, groups = generate_share(
            engine, layout, prompt_ids[start : start + per_shard], s.n, seed_base, s.max_tokens, s.temperature,
            s.top_p, offset=start,
        )  # fmt: skip
        mine = score_records([shard[i] for i in share.prompts], groups, share.first, s) if layout.is_leader else []
        pieces, _ = gather_by_prompt(layout, s.n, len(shard), mine)
        records += [r for parts in pieces for piece in parts for r in piece]
    return summarise(records, s)


def _check(problems: Sequence[Problem], prompt_ids: Sequence[list[int]]) -> None:
    if not problems:
        raise ValueError("evaluate: no problems (the eval set is empty, or every prompt was too long)")
    if len(problems) != len(prompt_ids):
        raise ValueError(f"evaluate: {len(problems)} problems but {len(prompt_ids)} prompts")


def score_records(
    problems: list[Problem], groups: list[list[Sample]], first: list[int], settings: EvalSettings
) -> list[list[dict[str, Any]]]:
    """The samples of each problem, scored: one record per sample (see `evaluate`), a list per problem; `first[i]`
    is the index of problem i's first sample among its n (a replica draws part of each problem's samples)."""
    from dapo.rewards import score_responses

    texts = [smp.text for g in groups for smp in g]
    answers = [p.answer for p, g in zip(problems, groups, strict=True) for _ in g]
    scores = iter(score_responses(texts, answers, verifier=settings.verifier))
    out: list[list[dict[str, Any]]] = []
    for p, g, j0 in zip(problems, groups, first, strict=True):
        scored = [(smp, next(scores)) for smp in g]
        out.append(
            [
                {
                    "problem_id": p.id,
                    "sample_index": j,
                    "text": smp.text,
                    "extracted": sc.extracted,
                    "answer": p.answer,
                    "score": float(sc.score),
                    "correct": bool(sc.correct),
                    "truncated": smp.truncated,
                    "num_tokens": len(smp.response_ids),
                }
                for j, (smp, sc) in enumerate(scored, start=j0)
            ]
        )
    return out


def summarise(records: Sequence[dict[str, Any]], settings: EvalSettings) -> EvalResult:
    """avg@n / pass@k / maj@n with intervals (and the truncated fraction, mean length) from the sample records
    of every problem, n consecutive records per problem."""
    from dapo.algos.evalstats import eval_summary

    n = settings.n
    if not records or len(records) % n:
        raise ValueError(f"summarise: {len(records)} sample records is not a whole number of problems x n={n}")
    correct = [[bool(r["correct"]) for r in records[i : i + n]] for i in range(0, len(records), n)]
    extracted = [[r["extracted"] for r in records[i : i + n]] for i in range(0, len(records), n)]
    ks = [k for k in settings.pass_k if k <= n]
    metrics = eval_summary(
        correct, extracted, pass_k=ks, bootstrap=settings.bootstrap, confidence=settings.confidence, seed=settings.seed
    )
    # how often eval responses hit the cap, and how long they are (the overlong toggles act on these)
    metrics[EVAL_TRUNC_FRAC] = sum(r["truncated"] for r in records) / len(records)
    metrics[EVAL_LEN_MEAN] = sum(r["num_tokens"] for r in records) / len(records)
    return EvalResult({k: float(v) for k, v in metrics.items()}, list(records))


def write_samples(samples: Sequence[Mapping[str, Any]], path: str | Path) -> Path:
    """One JSON object per line (problem_id, sample_index, text, extracted, score, truncated, ...)."""
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    with path.open("w") as f:
        for s in samples:
            f.write(json.dumps(s, ensure_ascii=False) + "\n")
    return path
