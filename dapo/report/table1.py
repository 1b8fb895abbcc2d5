"""Table 1 of the paper (AIME 2024 avg@32 per cumulative ablation row), regenerated from our runs.

Per row, in PAPER_TABLE1 order (then any user rows): avg@k, pass@k and maj@k of each run's final eval (its last
logged step), the mean over seeds, their sample s.d., a confidence interval and the change from the row above,
with the paper's number beside ours. k is the preset's eval.n (32 for the paper, so avg@32).

Confidence interval (docs/algorithm.md section 5: 30 problems is a small benchmark):
- more than one seed: Student t-interval over seeds, mean ± t_{(1+c)/2, n-1} · s / sqrt(n);
- one seed: the run's own percentile bootstrap over problems (its ci_low / ci_high metrics).
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field

import numpy as np

from dapo import metric_names as M
from dapo.report.formats import Table, fmt
from dapo.report.load import Experiment, RunData

PAPER_REFERENCE = ("DeepSeek-R1-Zero-Qwen-32B", 47)


@dataclass
class FinalEval:
    """One run's last eval: values in percent (None where the metric was not logged)."""

    run: str
    seed: int | None
    step: int
    avg: float
    pass_k: float | None
    maj: float | None
    ci_low: float | None
    ci_high: float | None


@dataclass
class Table1Row:
    row: str
    label: str
    paper: float | None
    evals: list[FinalEval] = field(default_factory=list)
    mean: float | None = None
    std: float | None = None  # sample s.d. over seeds (ddof 1); None for one seed
    ci_low: float | None = None
    ci_high: float | None = None
    ci_method: str = ""
    pass_mean: float | None = None
    maj_mean: float | None = None
    delta: float | None = None  # our mean minus the row above's
    paper_delta: float | None = None


@dataclass
class Table1:
    experiment: str
    k: int
    confidence: float
    rows: list[Table1Row]
    missing: list[str]


def final_eval(run: RunData, k: int) -> tuple[FinalEval | None, list[str]]:
    """The run's eval at the last step where avg@k was logged, and what it lacks (named, for the report)."""
    avg_name = M.eval_avg(k)
    avg = run.history.get(avg_name)
    if avg is None or not avg.steps.size:
        return None, [f"run {run.label}: metric {avg_name} missing (no eval logged)"]
    step, value = avg.last()
    missing = []

    def at_step(name: str) -> float | None:
        s = run.history.get(name)
        if s is None:
            return None
        v = s.at(step)
        return v if v is not None else s.last()[1]

    got = {}
    for name in (M.eval_pass(k), M.eval_maj(k)):
        got[name] = at_step(name)
        if got[name] is None:
            missing.append(f"run {run.label}: metric {name} missing")
    lo, hi = at_step(M.ci_low(avg_name)), at_step(M.ci_high(avg_name))
    return FinalEval(
        run=run.label,
        seed=run.seed,
        step=step,
        avg=value,
        pass_k=got[M.eval_pass(k)],
        maj=got[M.eval_maj(k)],
        ci_low=lo,
        ci_high=hi,
    ), missing


def t_interval(values: list[float], confidence: float) -> tuple[float, float, float, float]:
    """(mean, sample s.d., low, high) of a Student t confidence interval over `values` (n >= 2)."""
    from scipy import stats

    x = np.asarray(values, dtype=float)
    n = x.size
    mean, sd = float(x.mean()), float(x.std(ddof=1))
    half = float(stats.t.ppf((1 + confidence) / 2, n - 1)) * sd / math.sqrt(n)
    return mean, sd, mean - half, mean + half


def _mean(xs: list[float | None]) -> float | None:
    vals = [x for x in xs if x is not None]
    return float(np.mean(vals)) if vals else None


def build_table1(exp: Experiment, confidence: float = 0.95) -> Table1:
    """Table 1 from a loaded experiment; rows with no runs stay in the table (empty) and are named in `missing`."""
    rows: list[Table1Row] = []
    missing: list[str] = []
    for name in exp.rows():
        label, paper = M.PAPER_TABLE1.get(name, (name, None))
        tr = Table1Row(row=name, label=label, paper=float(paper) if paper is not None else None)
        runs = exp.runs_of(name)
        if not runs:
            missing.append(f"row {name} ({label}): no runs in experiment {exp.name!r}")
        for run in runs:
            fe, miss = final_eval(run, exp.k)
            missing += miss
            if fe is not None:
                tr.evals.append(fe)
        avgs = [e.avg for e in tr.evals]
        if len(avgs) >= 2:
            tr.mean, tr.std, tr.ci_low, tr.ci_high = t_interval(avgs, confidence)
            tr.ci_method = f"t over {len(avgs)} seeds"
        elif len(avgs) == 1:
            e = tr.evals[0]
            tr.mean, tr.ci_low, tr.ci_high = e.avg, e.ci_low, e.ci_high
            tr.ci_method = "bootstrap (1 seed)" if e.ci_low is not None else ""
            if e.ci_low is None:
                missing.append(f"run {e.run}: metric {M.ci_low(M.eval_avg(exp.k))} missing (no CI for one seed)")
        tr.pass_mean = _mean([e.pass_k for e in tr.evals])
        tr.maj_mean = _mean([e.maj for e in tr.evals])
        rows.append(tr)
    for above, tr in zip(rows, rows[1:], strict=False):
        if tr.mean is not None and above.mean is not None:
            tr.delta = tr.mean - above.mean
        if tr.paper is not None and above.paper is not None:
            tr.paper_delta = tr.paper - above.paper
    return Table1(experiment=exp.name, k=exp.k, confidence=confidence, rows=rows, missing=missing)


def table1_table(t: Table1) -> Table:
    """Display form of Table 1 (Markdown / CSV / LaTeX via dapo.report.formats)."""
    k, c = t.k, round(100 * t.confidence)
    columns = [
        "Row",
        f"avg@{k} (mean ± s.d.)",
        f"{c}% CI",
        "Δ row above",
        "Paper avg@32",
        "Paper Δ",
        f"pass@{k}",
        f"maj@{k}",
        "Seeds",
        "CI method",
    ]
    cells, raw = [], []
    for r in t.rows:
        if r.mean is None:
            avg_txt = "missing"
        elif r.std is None:
            avg_txt = fmt(r.mean)
        else:
            avg_txt = f"{fmt(r.mean)} ± {fmt(r.std)}"
        ci_txt = f"[{fmt(r.ci_low)}, {fmt(r.ci_high)}]" if r.ci_low is not None else "—"
        seeds = [e.seed for e in r.evals]
        cells.append(
            [
                r.label,
                avg_txt,
                ci_txt,
                fmt(r.delta, signed=True),
                fmt(r.paper, 0),
                fmt(r.paper_delta, 0, signed=True),
                fmt(r.pass_mean),
                fmt(r.maj_mean),
                str(len(seeds)),
                r.ci_method or "—",
            ]
        )
        raw.append(
            [
                r.row,
                r.label,
                k,
                len(seeds),
                " ".join(str(s) for s in seeds),
                r.mean,
                r.std,
                r.ci_low,
                r.ci_high,
                r.ci_method,
                r.delta,
                r.paper,
                r.paper_delta,
                r.pass_mean,
                r.maj_mean,
                " ".join(str(e.avg) for e in r.evals),
                " ".join(str(e.step) for e in r.evals),
            ]
        )
    csv_cols = [
        "row",
        "label",
        "k",
        "n_seeds",
        "seeds",
        "avg_mean",
        "avg_std",
        "ci_low",
        "ci_high",
        "ci_method",
        "delta",
        "paper_avg",
        "paper_delta",
        "pass_mean",
        "maj_mean",
        "avg_per_seed",
        "final_step",
    ]
    notes = [
        f"Experiment {t.experiment!r}; each run's last eval; values in percent. Paper: one seed, AIME 2024 "
        f"avg@32; reference {PAPER_REFERENCE[0]} {PAPER_REFERENCE[1]}.",
        f"CI: t-interval over seeds when there are several; else the run's own bootstrap over problems "
        f"({c}%). Δ: change in our mean from the row above.",
    ]
    return Table(
        title=f"Table 1: eval avg@{k} per cumulative ablation row (ours vs paper)",
        columns=columns,
        cells=cells,
        csv_columns=csv_cols,
        csv_rows=raw,
        notes=notes,
        missing=list(t.missing),
    )
