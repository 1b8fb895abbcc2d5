"""Table 1 of the paper (AIME 2024 avg@32 per cumulative ablation row), regenerated from our runs.

Per row (PAPER_TABLE1 order, then user rows; design runs such as `dapo_minus_*` have their own table): avg@k, pass@k
and maj@k of each run's last eval, their mean and s.d. over seeds with an interval, the change from the row above
and from the first row, the gradient updates behind the final eval, and the paper's number beside ours. The
intervals count problems and seeds where the runs kept their eval samples, else seeds alone (docs/evidence.md
section 2).
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

import numpy as np

from dapo import metric_names as M
from dapo.algos.evalstats import Interval, contrast_interval, seed_mean_interval, welch_interval
from dapo.designs import parse_run, placebo_twin
from dapo.report.formats import Column, Table, column_table, fmt, fmt_interval, interval_columns
from dapo.report.runs import Experiment, RunData


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
    updates: float | None = None  # gradient updates behind this eval
    problems: dict[str, float] | None = None  # per-problem accuracy (percent) of the final eval's samples


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
    delta_ci: Interval | None = None
    vs_first: Interval | None = None  # our mean minus the first row's (naive GRPO), with its interval
    paper_delta: float | None = None
    updates: float | None = None  # mean over seeds of the gradient updates behind the final eval


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

    def at_step(name: str) -> float | None:
        s = run.history.get(name)
        return None if s is None else s.at(step) if s.at(step) is not None else s.last()[1]

    pass_name, maj_name = M.eval_pass(k), M.eval_maj(k)
    got = {n: at_step(n) for n in (pass_name, maj_name, M.ci_low(avg_name), M.ci_high(avg_name))}
    missing = [f"run {run.label}: metric {n} missing" for n in (pass_name, maj_name) if got[n] is None]
    updates = float(run.x_of(np.array([step]), "updates")[0])
    return FinalEval(run.label, run.seed, step, value, *got.values(), updates, run.problems), missing


def problem_matrices(groups: list[list[FinalEval]]) -> list[np.ndarray] | None:
    """y [S_r, P] per group of evals, on the problems every eval of every group has (same order); None when an
    eval lacks per-problem data or fewer than two problems are shared."""
    if not groups or any(not g or any(e.problems is None for e in g) for g in groups):
        return None
    ids = sorted(set.intersection(*(set(e.problems) for g in groups for e in g)))  # type: ignore[arg-type]
    if len(ids) < 2:
        return None
    return [np.array([[e.problems[i] for i in ids] for e in g]) for g in groups]  # type: ignore[index]


def row_interval(evals: list[FinalEval], confidence: float) -> Interval | None:
    """A row's mean final avg@k with its interval: problems x seeds when every run has its samples."""
    if not evals:
        return None
    ys = problem_matrices([evals])
    if ys is not None:
        return contrast_interval(ys, [1.0], confidence)
    if len(evals) >= 2:
        return seed_mean_interval([e.avg for e in evals], confidence)
    e = evals[0]
    method = "bootstrap (1 seed)" if e.ci_low is not None else ""
    return Interval(e.avg, e.ci_low, e.ci_high, None, None, method)


def difference_interval(b: list[FinalEval], a: list[FinalEval], confidence: float) -> Interval | None:
    """mean(b) - mean(a) of final avg@k with its interval: paired on problems x seeds when every run has its
    samples, else Welch's over seeds (no bounds with one seed on either side)."""
    if not b or not a:
        return None
    ys = problem_matrices([b, a])
    if ys is not None:
        return contrast_interval(ys, [1.0, -1.0], confidence)
    return welch_interval([e.avg for e in b], [e.avg for e in a], confidence)


def evals_of(exp: Experiment, row: str) -> tuple[list[FinalEval], list[str]]:
    """Every run of `row`'s final eval, and what is missing."""
    evals, missing = [], []
    for run in exp.runs_of(row):
        fe, miss = final_eval(run, exp.k)
        missing += miss
        if fe is not None:
            evals.append(fe)
    return evals, missing


def build_table1(exp: Experiment, confidence: float = 0.95) -> Table1:
    """Table 1 from a loaded experiment; rows with no runs stay in the table (empty) and are named in `missing`."""
    rows: list[Table1Row] = []
    missing: list[str] = []
    for name in (r for r in exp.rows() if parse_run(r) is None):  # the other designs' runs have their own table
        label, paper = M.PAPER_TABLE1.get(name, (name, None))
        tr = Table1Row(row=name, label=label, paper=float(paper) if paper is not None else None)
        if not exp.runs_of(name):
            missing.append(f"row {name} ({label}): no runs in experiment {exp.name!r}")
        tr.evals, miss = evals_of(exp, name)
        missing += miss
        iv = row_interval(tr.evals, confidence)
        if iv is not None:
            tr.mean, tr.ci_low, tr.ci_high, tr.ci_method = iv.estimate, iv.low, iv.high, iv.method
            if len(tr.evals) >= 2:
                tr.std = float(np.std([e.avg for e in tr.evals], ddof=1))
            if len(tr.evals) == 1 and iv.low is None:
                missing.append(
                    f"run {tr.evals[0].run}: metric {M.ci_low(M.eval_avg(exp.k))} missing (no CI for one seed)"
                )
        tr.pass_mean = mean_of([e.pass_k for e in tr.evals])
        tr.maj_mean = mean_of([e.maj for e in tr.evals])
        tr.updates = mean_of([e.updates for e in tr.evals])
        rows.append(tr)
    by_name = {tr.row: tr for tr in rows}
    for above, tr in zip(rows, rows[1:], strict=False):
        above = by_name.get(placebo_twin(tr.row) or "", above)  # a placebo is read against its twin, not row 05
        if tr.mean is not None and above.mean is not None:
            tr.delta_ci = difference_interval(tr.evals, above.evals, confidence)  # not None: both rows have evals
            tr.delta = tr.delta_ci.estimate if tr.delta_ci is not None else None
        if tr.paper is not None and above.paper is not None:
            tr.paper_delta = tr.paper - above.paper
    for tr in rows[1:]:
        tr.vs_first = difference_interval(tr.evals, rows[0].evals, confidence)
    return Table1(experiment=exp.name, k=exp.k, confidence=confidence, rows=rows, missing=missing)


def mean_of(xs: list[float | None]) -> float | None:
    """The mean of the values that are there; None when none is."""
    vals = [x for x in xs if x is not None]
    return float(np.mean(vals)) if vals else None


def _avg_text(r: Any) -> str:
    if r.mean is None:
        return "missing"
    return fmt(r.mean) if r.std is None else f"{fmt(r.mean)} ± {fmt(r.std)}"


def table1_table(t: Table1) -> Table:
    """Display form of Table 1 (Markdown / CSV / LaTeX via dapo.report.formats)."""
    k, c = t.k, round(100 * t.confidence)
    first = t.rows[0].row if t.rows else "00"
    shown: list[Column] = [
        ("Row", lambda r: r.label),
        (f"avg@{k} (mean ± s.d.)", _avg_text),
        (f"{c}% CI", lambda r: f"[{fmt(r.ci_low)}, {fmt(r.ci_high)}]" if r.ci_low is not None else "—"),
        (f"Δ row above [{c}% CI]", lambda r: fmt_interval(r.delta_ci)),
        (f"Δ vs row {first[:2]} [{c}% CI]", lambda r: fmt_interval(r.vs_first)),
        ("Paper avg@32", lambda r: fmt(r.paper, 0)),
        ("Paper Δ", lambda r: fmt(r.paper_delta, 0, signed=True)),
        (f"pass@{k}", lambda r: fmt(r.pass_mean)),
        (f"maj@{k}", lambda r: fmt(r.maj_mean)),
        ("Seeds", lambda r: str(len(r.evals))),
        ("Updates", lambda r: fmt(r.updates, 0)),
        ("CI method", lambda r: r.ci_method or "—"),
    ]
    raw: list[Column] = [
        ("row", lambda r: r.row),
        ("label", lambda r: r.label),
        ("k", lambda r: k),
        ("n_seeds", lambda r: len(r.evals)),
        ("seeds", lambda r: " ".join(str(e.seed) for e in r.evals)),
        ("avg_mean", lambda r: r.mean),
        ("avg_std", lambda r: r.std),
        ("ci_low", lambda r: r.ci_low),
        ("ci_high", lambda r: r.ci_high),
        ("ci_method", lambda r: r.ci_method),
        *interval_columns(lambda r: r.delta_ci, "delta", "delta_"),
        *interval_columns(lambda r: r.vs_first, "vs_first", "vs_first_"),
        ("paper_avg", lambda r: r.paper),
        ("paper_delta", lambda r: r.paper_delta),
        ("pass_mean", lambda r: r.pass_mean),
        ("maj_mean", lambda r: r.maj_mean),
        ("updates", lambda r: r.updates),
        ("avg_per_seed", lambda r: " ".join(str(e.avg) for e in r.evals)),
        ("final_step", lambda r: " ".join(str(e.step) for e in r.evals)),
    ]
    notes = [
        f"Experiment {t.experiment!r}; each run's last eval; values in percent. Paper: one seed, AIME 2024 "
        "avg@32; reference DeepSeek-R1-Zero-Qwen-32B 47. Updates: gradient updates behind the "
        "final eval (mean over seeds), so rows with equal updates are compared at equal updates.",
        f"CI ({c}%): problems x seeds when every run kept its final eval's samples (variance over problems of "
        "the seed-averaged accuracy, paired on problems for a Δ, plus the between-seed variance; t with "
        "Satterthwaite's df); else a t interval over seeds (Welch's for a Δ), or one run's bootstrap over "
        "problems. Δ: change in our mean. A placebo row's Δ row above is against its twin (the same row, another "
        "sampling seed): a clear change there is noise alone.",
    ]
    title = f"Table 1: eval avg@{k} per cumulative ablation row (ours vs paper)"
    return column_table(title, t.rows, shown, raw, notes, list(t.missing))
