"""`dapo compare ROW_A ROW_B`: two rows (ladder rows or design runs) side by side, from MLflow (docs/evidence.md
section 5): each row's eval curve, the final avg@k difference B - A with its interval, and every declared mechanism
statistic for both, with a verdict against the paper's sign only where B and A differ by exactly that toggle in one
of the designs; the curves as a figure and the tables as Markdown and CSV go to --out.

    dapo compare 00 05                                   # prefixes are enough: 00_naive_grpo vs 05_dynamic_sampling
"""

from __future__ import annotations

import argparse
import sys
from dataclasses import dataclass
from pathlib import Path

import numpy as np

from dapo import metric_names as M
from dapo.algos.evalstats import Interval
from dapo.report.formats import Column, Table, column_table, fmt, fmt_interval, write_table
from dapo.report.runs import Experiment, XAxis


def add_arguments(p: argparse.ArgumentParser) -> None:
    p.add_argument("row_a", metavar="ROW_A", help="The reference row or design run (a unique prefix is enough).")
    p.add_argument("row_b", metavar="ROW_B", help="The row compared with it: differences are B - A.")
    p.add_argument(
        "--preset",
        default="tiny",
        help="Defaults as the workflow: experiment dapo-<preset>, store results/<preset>/mlflow.db.",
    )
    p.add_argument("--experiment", default=None, help="MLflow experiment (default: dapo-<preset>).")
    p.add_argument(
        "--tracking-uri",
        default=None,
        help="MLflow tracking URI (default: $MLFLOW_TRACKING_URI, else sqlite:///results/<preset>/mlflow.db).",
    )
    p.add_argument("--out", default=None, help="Folder for the figure and tables (default: results/<preset>/compare).")
    p.add_argument("--x-axis", choices=("updates", "rollout"), default="updates", help="The figure's x-axis.")


@dataclass
class Comparison:
    row_a: str
    row_b: str
    k: int
    curve: Table
    final: Interval | None
    mechanisms: Table
    results: list  # the MechanismResult behind each line of `mechanisms`
    figure: list[Path]
    missing: list[str]
    confidence: float  # of every interval above


def resolve_row(exp: Experiment, name: str) -> str:
    """A row tag of the experiment from its name or a unique prefix; ValueError listing the rows otherwise."""
    present = [r for r in exp.rows() if exp.runs_of(r)]
    if name in present:
        return name
    hits = [r for r in present if r.startswith(name)]
    if len(hits) == 1:
        return hits[0]
    what = "matches several rows" if hits else "is not a row with runs"
    raise ValueError(f"{name!r} {what} in experiment {exp.name!r}; rows with runs: {', '.join(present) or '(none)'}")


def eval_curve(exp: Experiment, row_a: str, row_b: str) -> Table:
    """Per eval step: each row's avg@k mean ± s.d. over its seeds (n seeds) and gradient updates, and B - A."""
    from dapo.report.figures import seed_band

    k, name = exp.k, M.eval_avg(exp.k)
    bands = {}
    for row in (row_a, row_b):
        curves, ups = [], []
        for run in exp.runs_of(row):
            s = run.history.get(name)
            if s is not None and s.steps.size:
                curves.append((s.steps, s.values))
                ups.append((s.steps, run.x_of(s.steps, "updates")))
        x, mean, sd, n = seed_band(curves)
        ux, umean, _, _ = seed_band(ups)
        bands[row] = {int(s): (m, d, int(c), float(u)) for s, m, d, c, u in zip(x, mean, sd, n, umean, strict=True)}
        assert np.array_equal(x, ux)
    steps = sorted(set(bands[row_a]) | set(bands[row_b]))
    cells, raw = [], []

    def shown(v: tuple | None) -> list[str]:  # one row at one step: updates, mean ± s.d. (n seeds)
        if v is None:
            return ["—", "—"]
        return [fmt(v[3], 0), f"{fmt(v[0])} ± {fmt(v[1])} (n={v[2]})" if v[2] > 1 else f"{fmt(v[0])} (n=1)"]

    def raw_of(v: tuple | None) -> list:
        return [v[3], v[0], v[1]] if v else [None, None, None]  # updates, mean, s.d.

    for s in steps:
        a, b = bands[row_a].get(s), bands[row_b].get(s)
        d = b[0] - a[0] if a and b else None
        cells.append([str(s), *shown(a), *shown(b), fmt(d, signed=True)])
        raw.append([s, *raw_of(a), *raw_of(b), d])
    title = f"eval avg@{k} over training: {row_a} (A) vs {row_b} (B)"
    columns = ["Step", "Updates A", f"A avg@{k}", "Updates B", f"B avg@{k}", "B - A"]
    csv_columns = ["step", "updates_a", "mean_a", "sd_a", "updates_b", "mean_b", "sd_b", "delta"]
    notes = ["Mean ± s.d. over seeds at each eval (rollout step); Updates: gradient updates at that step."]
    return Table(title, columns, cells, csv_columns, raw, notes)


def compare(
    exp: Experiment, row_a: str, row_b: str, out_dir: str | Path, x_axis: XAxis = "updates", confidence: float = 0.95
) -> Comparison:
    """Everything `dapo compare` prints and writes, for two rows of a loaded experiment."""
    from dapo.designs import DESIGNS, marginal_pairs
    from dapo.report.figures import AVG, COMPARE_CURVES, FigureSpec, draw_figure, panel
    from dapo.report.mechanisms import MECHANISMS, compare_mechanism, mechanisms_table
    from dapo.report.table1 import difference_interval, evals_of

    out = Path(out_dir)
    a_evals, miss_a = evals_of(exp, row_a)
    b_evals, miss_b = evals_of(exp, row_b)
    final = difference_interval(b_evals, a_evals, confidence)
    pairs = {(t, w, wo) for d in DESIGNS for t, w, wo in marginal_pairs(d)}
    results = []
    for m in MECHANISMS:
        r = compare_mechanism(exp, m, row_b, row_a, confidence)
        r.judged = (m.toggle, row_b, row_a) in pairs
        results.append(r)
    mech = mechanisms_table(
        results, confidence, title=f"Mechanism statistics: {row_b} (with) vs {row_a} (without), Δ = B - A"
    )
    curve = eval_curve(exp, row_a, row_b)

    panels = (AVG, *(panel(metric, ylabel) for metric, ylabel in COMPARE_CURVES.items()))
    stem = f"{row_a}_vs_{row_b}"
    spec = FigureSpec(stem, lambda k: f"{row_a} vs {row_b}", (row_a, row_b), panels, ncols=3)
    fig = draw_figure(exp, spec, out, x_axis)
    write_table(curve, out, f"{stem}_curve")
    write_table(mech, out, f"{stem}_mechanisms")
    missing = miss_a + miss_b + fig.missing + mech.missing
    return Comparison(row_a, row_b, exp.k, curve, final, mech, results, fig.paths, missing, confidence)


def run(args: argparse.Namespace) -> int:
    from rich.console import Console

    from dapo.report.load import ExperimentNotFound, load_experiment
    from dapo.tracking import resolve_uri

    experiment = args.experiment or f"dapo-{args.preset}"
    try:
        exp = load_experiment(experiment, resolve_uri(args.tracking_uri, Path("results", args.preset)))
        row_a, row_b = resolve_row(exp, args.row_a), resolve_row(exp, args.row_b)
    except (ExperimentNotFound, ValueError) as e:
        print(f"dapo compare: {e}", file=sys.stderr)
        return 2
    out = Path(args.out or Path("results", args.preset, "compare"))
    c = compare(exp, row_a, row_b, out, args.x_axis)
    console = Console() if sys.stdout.isatty() else Console(width=160)  # logs and pipes: no 80-column squeeze
    _print(console, c.curve)
    console.print(
        f"final avg@{c.k}, {row_b} - {row_a}: {fmt_interval(c.final)}"
        + (f"  ({c.final.method})" if c.final and c.final.method else "")
    )
    _print(console, _compact(c))
    for m in c.missing:
        print(f"missing: {m}", file=sys.stderr)
    console.print(f"wrote {', '.join(str(p) for p in c.figure)} and the tables beside them")
    return 0


def _compact(c: Comparison) -> Table:
    """The mechanisms for a terminal: what, A, B, Δ and verdict (the written tables hold every column)."""
    from dapo.report.mechanisms import fmt_delta, fmt_value

    def mean(v: list[float]) -> str:
        return fmt_value(float(np.mean(v))) if v else "—"

    shown: list[Column] = [
        (
            "Mechanism (* primary)",
            lambda r: f"{r.mechanism.toggle}{' *' if r.mechanism.primary else ''}: {r.mechanism.quantity}",
        ),
        ("Statistic", lambda r: r.mechanism.statistic_label()),
        ("A", lambda r: mean(r.without_values)),
        ("B", lambda r: mean(r.with_values)),
        (f"B - A [{c.confidence:.0%} CI]", lambda r: fmt_delta(r.interval)),
        ("Paper", lambda r: "+" if r.mechanism.expected_sign > 0 else "−"),
        ("Verdict", lambda r: r.verdict),
    ]
    note = "Means over seeds; Welch's interval over seeds. Paper: the sign it expects for adding the toggle."
    return column_table(c.mechanisms.title, c.results, shown, [], [note], [])


def _print(console, t: Table) -> None:
    from rich.table import Table as RichTable

    rt = RichTable(title=t.title, title_justify="left")
    for col in t.columns:
        rt.add_column(col)
    for row in t.cells:
        rt.add_row(*row)
    console.print(rt)
    for n in t.notes:
        console.print(f"  {n}", style="dim")
