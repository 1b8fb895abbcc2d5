"""Evaluation statistics: avg@k, unbiased pass@k, maj@k, each with a bootstrap confidence interval.

- avg@n: mean accuracy over all P x n samples (the paper's headline AIME avg@32), in percent.
- pass@k: the unbiased estimator 1 - C(n-c, k) / C(n, k) per problem (Chen et al. 2021), averaged over problems.
  pass@n with n samples is "any of them correct".
- maj@n: per problem, the most frequent extracted answer among the n samples is scored (None never wins).

All three are means over problems of a per-problem value, so the confidence interval is a percentile bootstrap
over problems (resample P problems with replacement, seeded): AIME has only 30 problems, and the problem
sample, not the n draws per problem, dominates the uncertainty. Every value is in percent.
"""

from __future__ import annotations

from collections.abc import Iterable, Sequence

import numpy as np

from dapo import metric_names


def pass_at_k(n: int, c: int, k: int) -> float:
    """Unbiased pass@k from n samples with c correct: 1 - C(n-c, k) / C(n, k), in [0, 1].

    Computed as 1 - prod_{i=n-c+1}^{n} (1 - k/i), which never forms the huge binomials.
    """
    if not (0 <= c <= n) or k < 1:
        raise ValueError(f"need 0 <= c <= n and k >= 1, got n={n}, c={c}, k={k}")
    if k > n:
        raise ValueError(f"pass@{k} needs at least k samples per problem, got n={n}")
    if n - c < k:
        return 1.0
    return float(1.0 - np.prod(1.0 - k / np.arange(n - c + 1, n + 1, dtype=np.float64)))


def majority_correct(correct_row: Sequence[bool], answers_row: Sequence[str | None]) -> bool:
    """Whether the majority answer of one problem is correct.

    Ties go to the answer seen first (deterministic). None answers (nothing extracted) never win; a problem
    with no extracted answer at all counts as wrong.
    """
    counts: dict[str, int] = {}
    first: dict[str, int] = {}
    for j, a in enumerate(answers_row):
        if a is None:
            continue
        counts[a] = counts.get(a, 0) + 1
        first.setdefault(a, j)
    if not counts:
        return False
    best = max(counts, key=lambda a: (counts[a], -first[a]))
    return bool(correct_row[first[best]])


def bootstrap_ci(per_problem: np.ndarray, n_boot: int, confidence: float, seed: int) -> tuple[float, float]:
    """Percentile bootstrap CI of the mean of `per_problem` [P], resampling problems with replacement."""
    if not 0 < confidence < 1:
        raise ValueError(f"confidence must be in (0, 1), got {confidence}")
    rng = np.random.default_rng(seed)
    p = per_problem.shape[0]
    means = per_problem[rng.integers(0, p, size=(n_boot, p))].mean(axis=1)
    alpha = (1.0 - confidence) / 2.0
    lo, hi = np.quantile(means, [alpha, 1.0 - alpha])
    return float(lo), float(hi)


def eval_summary(
    correct: Sequence[Sequence[bool]] | np.ndarray,
    answers: Sequence[Sequence[str | None]] | None = None,
    pass_k: Iterable[int] = (1,),
    bootstrap: int = 1000,
    confidence: float = 0.95,
    seed: int = 0,
) -> dict[str, float]:
    """avg@n, pass@k for each k, maj@n (when answers are given), in percent, with bootstrap CIs.

    Args:
        correct: [P, n] bool, sample j of problem p is correct (anything np.asarray accepts, e.g. a tensor).
        answers: [P][n] extracted answers (None: nothing extracted), for maj@n; None skips maj@n.
        pass_k: the k of pass@k (each <= n).
        bootstrap: bootstrap resamples; 0 skips the CI entries.
        confidence: CI level (0.95: the 2.5th and 97.5th percentiles).
        seed: bootstrap seed (same inputs and seed give the same CI).

    Returns:
        {eval_avg(n), eval_pass(k)..., eval_maj(n): value} plus ci_low(name) / ci_high(name) for each.
    """
    c = np.asarray(correct, dtype=bool)
    if c.ndim != 2 or c.shape[0] == 0 or c.shape[1] == 0:
        raise ValueError(f"correct must be a non-empty [P, n] array, got shape {c.shape}")
    p, n = c.shape
    n_correct = c.sum(axis=1)
    per_problem: dict[str, np.ndarray] = {metric_names.eval_avg(n): 100.0 * n_correct / n}
    for k in pass_k:
        per_problem[metric_names.eval_pass(k)] = 100.0 * np.array([pass_at_k(n, int(ci), k) for ci in n_correct])
    if answers is not None:
        if len(answers) != p or any(len(row) != n for row in answers):
            raise ValueError(f"answers must be [P][n] = [{p}][{n}] like correct")
        per_problem[metric_names.eval_maj(n)] = 100.0 * np.array(
            [majority_correct(c[i], answers[i]) for i in range(p)], dtype=np.float64
        )
    out: dict[str, float] = {}
    for name, values in per_problem.items():
        out[name] = float(values.mean())
        if bootstrap > 0:
            lo, hi = bootstrap_ci(values, bootstrap, confidence, seed)
            out[metric_names.ci_low(name)], out[metric_names.ci_high(name)] = lo, hi
    return out
