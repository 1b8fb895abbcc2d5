"""Evaluate a policy: sample n responses per problem, score them, and summarise as avg@n, pass@k and maj@n with
bootstrap confidence intervals (SPEC section 5: AIME 2024, n = 32, temperature 1.0, top_p 0.7).

Each problem is sampled n times by the engine (never repeated n times in the eval file, a pitfall of SPEC
section 8), scored by `dapo.rewards.score_responses` (the training reward's verifier) and summarised by
`dapo.algos.evalstats.eval_summary`. The same function runs in-process inside training (every `eval.every`
steps, on the training engine with its current weights) and from `dapo eval`.
"""

from __future__ import annotations

import json
from collections.abc import Iterator, Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from dapo.metric_names import EVAL_LEN_MEAN, EVAL_TRUNC_FRAC
from dapo.types import Problem


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
    engine: Any,
    problems_or_tokenizer: Any,
    prompts_or_problems: Sequence[Any],
    *,
    n: int,
    max_tokens: int,
    temperature: float = 1.0,
    top_p: float = 1.0,
    pass_k: Sequence[int] = (1,),
    verifier: str = "math_verify",
    bootstrap: int = 1000,
    confidence: float = 0.95,
    seed: int = 0,
    use_chat_template: bool = True,
) -> EvalResult:
    """Sample, score and summarise.

    Two call forms:
        evaluate(engine, problems, prompt_ids, ...)        prompts already built and tokenised (the trainer)
        evaluate(engine, tokenizer, problems, ...)         prompts built here with `dapo.data` (DAPO template,
                                                           chat template when `use_chat_template`)
    Args:
        engine: a `dapo.rollout.RolloutEngine` (anything with its `generate`).
        n: samples per problem (avg@n, maj@n); each k in `pass_k` must be <= n (larger k are skipped).
        max_tokens: generation cap; responses that hit it count as truncated (and are scored as they are).
        verifier: "math_verify" or "dapo_rule" (`dapo.rewards`).
        bootstrap, confidence, seed: bootstrap CIs over problems (`eval_summary`).
    Returns:
        EvalResult: metrics in percent; samples [P * n] dicts with problem_id, sample_index, text, extracted,
        score, correct, truncated, num_tokens.
    """
    from dapo.algos.evalstats import eval_summary
    from dapo.rewards import score_responses

    problems, prompt_ids = _problems_and_prompts(problems_or_tokenizer, prompts_or_problems, use_chat_template)
    if not problems:
        raise ValueError("evaluate: no problems")
    groups = engine.generate(prompt_ids, n=n, max_tokens=max_tokens, temperature=temperature, top_p=top_p)
    texts = [s.text for g in groups for s in g]
    answers = [p.answer for p, g in zip(problems, groups, strict=True) for _ in g]
    scores = score_responses(texts, answers, verifier=verifier)
    correct: list[list[bool]] = []
    extracted: list[list[str | None]] = []
    samples: list[dict[str, Any]] = []
    it = iter(scores)
    for p, g in zip(problems, groups, strict=True):
        if len(g) != n:
            raise RuntimeError(f"engine returned {len(g)} samples for problem {p.id}, expected {n}")
        row_c, row_a = [], []
        for j, s in enumerate(g):
            sc = next(it)
            row_c.append(bool(sc.correct))
            row_a.append(sc.extracted)
            samples.append(
                {
                    "problem_id": p.id,
                    "sample_index": j,
                    "text": s.text,
                    "extracted": sc.extracted,
                    "answer": p.answer,
                    "score": float(sc.score),
                    "correct": bool(sc.correct),
                    "truncated": s.finish_reason == "length",
                    "num_tokens": len(s.response_ids),
                }
            )
        correct.append(row_c)
        extracted.append(row_a)
    ks = [k for k in pass_k if k <= n]
    metrics = eval_summary(correct, extracted, pass_k=ks, bootstrap=bootstrap, confidence=confidence, seed=seed)
    if samples:  # how often eval responses hit the cap, and how long they are (the overlong toggles act on these)
        metrics[EVAL_TRUNC_FRAC] = sum(s["truncated"] for s in samples) / len(samples)
        metrics[EVAL_LEN_MEAN] = sum(s["num_tokens"] for s in samples) / len(samples)
    return EvalResult({k: float(v) for k, v in metrics.items()}, samples)


def _problems_and_prompts(a: Any, b: Sequence[Any], use_chat_template: bool) -> tuple[list[Problem], list[list[int]]]:
    if isinstance(a, Sequence) and all(isinstance(p, Problem) for p in a):
        problems, prompts = list(a), [list(x) for x in b]
        if len(problems) != len(prompts):
            raise ValueError(f"{len(problems)} problems but {len(prompts)} prompts")
        return problems, prompts
    from dapo.data.prompts import build_prompt, encode_prompt

    tokenizer, problems = a, list(b)
    return problems, [encode_prompt(build_prompt(p.problem, tokenizer, use_chat_template), tokenizer) for p in problems]


def write_samples(samples: Sequence[Mapping[str, Any]], path: str | Path) -> Path:
    """One JSON object per line (problem_id, sample_index, text, extracted, score, truncated, ...)."""
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    with path.open("w") as f:
        for s in samples:
            f.write(json.dumps(s, ensure_ascii=False) + "\n")
    return path
