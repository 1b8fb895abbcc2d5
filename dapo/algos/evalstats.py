"""Evaluation statistics: avg@k, unbiased pass@k, maj@k, each with a bootstrap confidence interval, in percent.

avg@n is the mean accuracy over all P x n samples; pass@k the unbiased 1 - C(n-c, k) / C(n, k) per problem (Chen et
al. 2021); maj@n scores each problem's most frequent extracted answer (None never wins). All three are means over
problems, so the interval is a seeded percentile bootstrap over problems (docs/algorithm.md section 5). Across runs,
`contrast_interval` gives the interval of a row's mean or a difference of rows over problems and training seeds, and
`welch_interval` compares one statistic per seed between two rows (docs/evidence.md, section 2).
"""

from __future__ import annotations

import math
from collections.abc import Iterable, Sequence
from dataclasses import dataclass, field

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


# ------------------------------------------------------------------------------------ across runs: seeds x problems
@dataclass(frozen=True)
class Interval:
    """A point estimate with a two-sided confidence interval (None where it cannot be estimated).

    `parts` are the variance components that make up `se**2` ("problems", "seeds"), so a reader can see which
    source dominates; `df` is the Satterthwaite (or Welch) degrees of freedom of the t quantile used.
    """

    estimate: float
    low: float | None
    high: float | None
    se: float | None
    df: float | None
    method: str
    parts: dict[str, float] = field(default_factory=dict)

    def excludes_zero(self) -> bool:
        return self.low is not None and self.high is not None and (self.low > 0 or self.high < 0)


def t_quantile(confidence: float, df: float) -> float:
    """The two-sided Student t quantile t_{(1+c)/2, df} (df may be fractional, as Satterthwaite's is)."""
    from scipy import stats

    if not 0 < confidence < 1:
        raise ValueError(f"confidence must be in (0, 1), got {confidence}")
    return float(stats.t.ppf((1 + confidence) / 2, df))


def _from_parts(estimate: float, parts: list[tuple[str, float, float]], confidence: float, method: str) -> Interval:
    """Combine variance terms (name, variance, df) into a t interval with Satterthwaite's df."""
    var = sum(v for _, v, _ in parts)
    named: dict[str, float] = {}
    for name, v, _ in parts:
        named[name] = named.get(name, 0.0) + v
    if var <= 0:
        return Interval(estimate, estimate, estimate, 0.0, None, method, named)
    df = var**2 / sum(v**2 / d for _, v, d in parts if v > 0)
    half = t_quantile(confidence, df) * math.sqrt(var)
    return Interval(estimate, estimate - half, estimate + half, math.sqrt(var), df, method, named)


def seed_variance(y: np.ndarray) -> float:
    """Between-seed variance of the training outcome, net of eval noise, from y [S, P] (S >= 2).

    Two-way crossed ANOVA (seeds x problems, one cell each): E[MS_seeds] = s2_e + P s2_seed and
    E[MS_residual] = s2_e, so s2_seed = (MS_seeds - MS_residual) / P, clamped at 0 (a negative estimate means
    the seeds differ less than eval noise alone would make them).
    """
    y = np.asarray(y, dtype=np.float64)
    s, p = y.shape
    if s < 2:
        raise ValueError(f"a seed variance needs at least 2 seeds, got {s}")
    rows, cols, grand = y.mean(axis=1), y.mean(axis=0), y.mean()
    ms_seeds = p * float(np.var(rows, ddof=1))
    resid = y - rows[:, None] - cols[None, :] + grand
    ms_resid = float((resid**2).sum()) / ((s - 1) * (p - 1)) if p > 1 else 0.0
    return max(0.0, (ms_seeds - ms_resid) / p)


def contrast_interval(rows: Sequence[np.ndarray], weights: Sequence[float], confidence: float = 0.95) -> Interval:
    """Interval of sum_r w_r * M_r, where M_r is the mean of rows[r] = y_r [S_r, P] (per-problem accuracy of
    each seed's final eval, the same P problems in the same order for every row; seeds differ between rows).

    Two sources of error, added (the runs of different rows are independent; the problems are shared):
    - problems: with c_r[p] the mean over row r's seeds of problem p and z[p] = sum_r w_r c_r[p], the term is
      var(z) / P (df P - 1). It holds the within-problem sampling noise too, and for a difference it is paired:
      a problem that is hard for both rows cancels.
    - seeds: sum_r w_r^2 * seed_variance(y_r) / S_r (df S_r - 1 each); a row with one seed has no estimate, and
      the method then says the interval covers problems only.
    The t quantile uses Satterthwaite's degrees of freedom for the sum. One row with weight 1 is a row's mean;
    weights (1, -1) are the difference of two rows.
    """
    if len(rows) != len(weights) or not rows:
        raise ValueError("need one weight per row and at least one row")
    ys = [np.atleast_2d(np.asarray(y, dtype=np.float64)) for y in rows]
    p = ys[0].shape[1]
    if p < 2 or any(y.shape[1] != p or y.shape[0] < 1 for y in ys):
        raise ValueError(f"every row needs the same P >= 2 problems, got shapes {[y.shape for y in ys]}")
    estimate = float(sum(w * y.mean() for w, y in zip(weights, ys, strict=True)))
    z = sum(w * y.mean(axis=0) for w, y in zip(weights, ys, strict=True))
    parts = [("problems", float(np.var(z, ddof=1)) / p, float(p - 1))]
    parts += [
        ("seeds", w * w * seed_variance(y) / y.shape[0], float(y.shape[0] - 1))
        for w, y in zip(weights, ys, strict=True)
        if y.shape[0] >= 2
    ]
    method = "problems x seeds" if all(y.shape[0] >= 2 for y in ys) else "problems only (1 seed)"
    return _from_parts(estimate, parts, confidence, method)


def seed_mean_interval(values: Sequence[float], confidence: float = 0.95) -> Interval:
    """Student t interval of the mean of one value per seed (n >= 2; one value: no interval)."""
    x = np.asarray(values, dtype=np.float64)
    if x.size == 0:
        raise ValueError("no values")
    if x.size == 1:
        return Interval(float(x[0]), None, None, None, None, "1 seed: no interval")
    var = float(np.var(x, ddof=1)) / x.size
    return _from_parts(float(x.mean()), [("seeds", var, float(x.size - 1))], confidence, f"t over {x.size} seeds")


def welch_interval(b: Sequence[float], a: Sequence[float], confidence: float = 0.95) -> Interval:
    """Welch's interval of mean(b) - mean(a), one value per seed in each (independent runs); None bounds when
    either side has fewer than 2 seeds."""
    xb, xa = np.asarray(b, dtype=np.float64), np.asarray(a, dtype=np.float64)
    if xb.size == 0 or xa.size == 0:
        raise ValueError("both sides need at least one value")
    est = float(xb.mean() - xa.mean())
    if xb.size < 2 or xa.size < 2:
        return Interval(est, None, None, None, None, "fewer than 2 seeds: no interval")
    parts = [
        ("seeds", float(np.var(xb, ddof=1)) / xb.size, float(xb.size - 1)),
        ("seeds", float(np.var(xa, ddof=1)) / xa.size, float(xa.size - 1)),
    ]
    return _from_parts(est, parts, confidence, f"Welch over {xb.size} vs {xa.size} seeds")
