"""Each toggle's marginal effect on the final eval avg@k under each design of `dapo.designs` (cumulative,
leave-one-out, one-at-a-time; docs/evidence.md section 4), with Table 1's intervals. A design whose runs are
missing leaves its column empty, named under Missing.
"""

from __future__ import annotations

import functools
from dataclasses import dataclass

from dapo import metric_names as M
from dapo.algos.evalstats import Interval
from dapo.designs import (
    DESIGNS,
    RUN_KEYS,
    Design,
    departures,
    describe_departures,
    marginal_pairs,
    preset_keys,
    toggles,
)
from dapo.report.formats import Table, bounds, fmt, fmt_interval
from dapo.report.runs import Experiment
from dapo.report.table1 import difference_interval, evals_of

DESIGN_TITLES: dict[Design, str] = {
    "cumulative": "cumulative (row - row above)",
    "leave_one_out": "leave-one-out (DAPO - DAPO without it)",
    "one_at_a_time": "one-at-a-time (GRPO with it - GRPO)",
}


@dataclass
class Effect:
    toggle: str
    design: Design
    with_run: str
    without_run: str
    interval: Interval | None


def marginal_effects(exp: Experiment, confidence: float = 0.95) -> tuple[list[Effect], list[str]]:
    """Every (toggle, design) effect, and what is missing (rows without runs or without a final eval)."""
    effects, missing = [], []

    @functools.cache
    def evals(row: str) -> list:
        return evals_of(exp, row)[0]

    for design in DESIGNS:
        absent = set()
        for toggle, with_run, without_run in marginal_pairs(design):
            for row in (with_run, without_run):
                if not evals(row):
                    absent.add(row)
            iv = difference_interval(evals(with_run), evals(without_run), confidence)
            effects.append(Effect(toggle, design, with_run, without_run, iv))
        missing += [f"{design}: no final eval for {row}" for row in sorted(absent)]
    return effects, missing


def confounds(exp: Experiment) -> list[str]:
    """One line per pair of rows that a design compares whose runs' params (the config each trained with) differ
    in more than the toggle between them: `dapo.designs.check_ladder` made again on what ran, so a ladder run with
    allow_confounded_ladder, or rows trained with different overrides, is named."""
    out, scale = [], preset_keys()
    skip = (*RUN_KEYS, "trainer.seed")  # seeds are the replicates, not a row's definition
    for design in DESIGNS:
        for toggle, with_run, without_run in marginal_pairs(design):
            a, b = exp.runs_of(without_run), exp.runs_of(with_run)
            if not a or not b:
                continue
            bad = departures(b[0].params, a[0].params, toggle, scale, skip=skip)
            line = f"{with_run} vs {without_run} ({toggle}): " + "; ".join(describe_departures(bad, without_run))
            if bad and line not in out:
                out.append(line)
    return out


def marginal_table(effects: list[Effect], missing: list[str], k: int, confidence: float = 0.95) -> Table:
    c = round(100 * confidence)
    paper = {t.name: (M.PAPER_TABLE1.get(t.row), M.PAPER_TABLE1.get(t.above)) for t in toggles()}
    by = {(e.toggle, e.design): e for e in effects}
    cells, raw = [], []
    for name in dict.fromkeys(e.toggle for e in effects):
        es = [by[name, d] for d in DESIGNS]
        b, a = paper.get(name, (None, None))
        pd = b[1] - a[1] if b and a else None
        cells.append([name, *(fmt_interval(e.interval) for e in es), fmt(pd, 0, signed=True)])
        raw.append([name, *(x for e in es for x in (e.with_run, e.without_run, *bounds(e.interval))), pd])
    columns = ["Toggle", *(f"{DESIGN_TITLES[d]} [{c}% CI]" for d in DESIGNS), "Paper Δ (cumulative)"]
    stats = ("with", "without", "delta", "ci_low", "ci_high")
    csv_columns = ["toggle", *(f"{d}_{x}" for d in DESIGNS for x in stats), "paper_delta"]
    notes = [
        "Percentage points. Cumulative: the paper's design, each gain conditional on every toggle above it. "
        "Leave-one-out: against full DAPO (runs dapo_minus_<toggle>). One-at-a-time: against naive GRPO "
        "(runs grpo_plus_<toggle>). A design run identical to a ladder row reuses that row's runs.",
        f"{c}% CI: problems x seeds (paired on problems) when the runs kept their final eval's samples, "
        "else Welch's over seeds.",
    ]
    title = f"Marginal effect of each toggle on the final eval avg@{k}, under each design"
    return Table(title, columns, cells, csv_columns, raw, notes, missing)
