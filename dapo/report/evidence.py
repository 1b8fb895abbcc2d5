"""The mechanisms table, version 2: for each toggle the condition it acts under, the effect that follows, the wiring
checks, and the placebo (declarations: `dapo.report.mechanisms.MECHANISMS_V2`).

- **Conditions** are read in the row *without* the toggle (the row above it): the mean over seeds of the declared
  statistic, met when it reaches the threshold. A toggle whose condition is not met has nothing to act on, and its
  effect says nothing about the paper either way.
- **Effects**: the row with the toggle minus the row above (the headline: full DAPO minus naive GRPO), Welch's
  interval over seeds, and a verdict against the paper's sign, as in version 1.
- **Wiring checks**: quantities a toggle moves by construction (truncated tokens leave the loss, zero-advantage
  groups leave the batch); they show the toggle is wired, and are not counted as evidence.
- **Placebo**: the row dynamic sampling builds on, run again with another sampling seed only
  (`dapo.designs.placebo_run`), against its twin on every effect and wiring statistic: each "clear change" there
  is noise, so more than one means the intervals are too optimistic for this number of seeds.

`conditions_only=True` gives the development mode: the conditions alone, with every effect hidden, so that a world
can be tuned on its conditions without seeing (and tuning towards) the effects.
"""

from __future__ import annotations

from dataclasses import dataclass, field

import numpy as np

from dapo.report.formats import Table, bounds
from dapo.report.mechanisms import (
    AS_PAPER,
    HEADLINE,
    MECHANISMS_V2,
    MECHANISMS_VERSION,
    Mechanism,
    MechanismResult,
    compare_mechanism,
    fmt_delta,
    fmt_value,
    mean_txt,
    results_table,
    run_statistic,
    toggle_rows,
)
from dapo.report.runs import Experiment

CLEAR, NOT_CLEAR = "clear change", "no clear change"


@dataclass
class ConditionResult:
    mechanism: Mechanism
    row: str  # the row without the toggle, where the condition is read
    values: list[float] = field(default_factory=list)  # one per seed
    missing: list[str] = field(default_factory=list)

    @property
    def mean(self) -> float | None:
        return float(np.mean(self.values)) if self.values else None

    @property
    def met(self) -> bool | None:
        """The mean over seeds on the declared side of the threshold (None: no run logged it)."""
        if self.mean is None:
            return None
        m = self.mechanism
        t = m.threshold if m.threshold is not None else 0.0
        if m.statistic == "rise":
            return self.mean * m.expected_sign > t
        return self.mean * m.expected_sign >= t * m.expected_sign


def condition_results(exp: Experiment) -> list[ConditionResult]:
    pairs = toggle_rows()
    out = []
    for m in MECHANISMS_V2:
        if m.role != "condition":
            continue
        row = pairs[m.toggle][1]
        res = ConditionResult(m, row)
        runs = exp.runs_of(row)
        if not runs:
            res.missing.append(f"row {row}: no runs")
        for run in runs:
            v = run_statistic(m, run, exp.k)
            if v is None:
                res.missing.append(f"{m.metric_label()} missing in run {run.label}")
            else:
                res.values.append(v)
        out.append(res)
    return out


def effect_results(exp: Experiment, role: str = "effect", confidence: float = 0.95) -> list[MechanismResult]:
    """The effects (or, role="wiring", the wiring checks): row with the toggle against the row above."""
    pairs = toggle_rows()
    out = []
    for m in MECHANISMS_V2:
        if m.role != role:
            continue
        with_row, without_row = m.rows or pairs[m.toggle]
        out.append(compare_mechanism(exp, m, with_row, without_row, confidence))
    return out


def placebo_results(exp: Experiment, confidence: float = 0.95) -> list[MechanismResult] | None:
    """Every effect and wiring statistic, the placebo row against its twin; None when the placebo was not run."""
    from dapo.designs import placebo_run, placebo_twin

    placebo = placebo_run().name
    if not exp.runs_of(placebo):
        return None
    twin = placebo_twin(placebo)
    assert twin is not None
    return [
        compare_mechanism(exp, m, placebo, twin, confidence) for m in MECHANISMS_V2 if m.role in ("effect", "wiring")
    ]


def _seeds(values: list[float]) -> str:
    return " / ".join(fmt_value(v) for v in values) if values else "—"


def conditions_table(results: list[ConditionResult]) -> Table:
    cells, raw, missing = [], [], []
    for r in results:
        m = r.mechanism
        met = {True: "met", False: "NOT met", None: "missing"}[r.met]
        cells.append(
            [
                m.toggle,
                f"{m.quantity} (`{m.metric_label()}`)",
                m.statistic_label(),
                r.row,
                m.condition_label(),
                f"{fmt_value(r.mean)} ({_seeds(r.values)})",
                met,
                m.source,
            ]
        )
        raw.append(
            [
                m.toggle,
                m.quantity,
                m.metric_label(),
                m.statistic,
                m.window,
                r.row,
                m.threshold,
                m.expected_sign,
                " ".join(repr(v) for v in r.values),
                r.mean,
                met,
            ]
        )
        missing += [f"{m.toggle} / {m.quantity}: {x}" for x in r.missing]
    n_met = sum(r.met is True for r in results)
    return Table(
        title=f"Conditions (version {MECHANISMS_VERSION}): does each toggle have something to act on? (read in the "
        "row without it)",
        columns=["Toggle", "Quantity (metric)", "Statistic", "Row", "Needs", "Mean (per seed)", "Condition", "Paper"],
        cells=cells,
        csv_columns=[
            "toggle",
            "quantity",
            "metric",
            "statistic",
            "window",
            "row",
            "threshold",
            "sign",
            "per_seed",
            "mean",
            "condition",
        ],
        csv_rows=raw,
        notes=[
            f"{n_met} of {len(results)} conditions met (the mean over seeds on the declared side of the threshold)."
        ],
        missing=missing,
    )


def placebo_table(results: list[MechanismResult] | None, confidence: float = 0.95) -> Table:
    from dapo.designs import placebo_run

    name = placebo_run().name
    table = Table(
        title=f"Placebo: {name} (the same row, another sampling seed) against its twin",
        columns=["Statistic", "Twin", "Placebo", f"Δ [{round(100 * confidence)}% CI]", "Verdict"],
        cells=[],
        csv_columns=["toggle", "quantity", "delta", "ci_low", "ci_high", "verdict"],
        csv_rows=[],
    )
    if results is None:
        table.title = "Placebo: the same row with another sampling seed"
        table.notes = ["The placebo was not run (`snakemake all_evidence` runs it with the ladder)."]
        table.missing = [f"row {name}: no runs"]
        return table
    for r in results:
        m, iv = r.mechanism, r.interval
        verdict = "missing" if iv is None or iv.low is None else CLEAR if iv.excludes_zero() else NOT_CLEAR
        table.cells.append(
            [
                f"{m.toggle}: {m.quantity} (`{m.metric_label()}`)",
                mean_txt(r.without_values),
                mean_txt(r.with_values),
                fmt_delta(iv),
                verdict,
            ]
        )
        table.csv_rows.append([m.toggle, m.quantity, *bounds(iv), verdict])
        table.missing += [f"{m.toggle} / {m.quantity}: {x}" for x in r.missing]
    n_clear = sum(row[-1] == CLEAR for row in table.csv_rows)
    table.notes = [
        f"{n_clear} of {len(results)} statistics show a clear change between two runs of one config: "
        f"{'clean' if n_clear <= 1 else 'NOT clean'} (at most one is allowed; every clear change here is noise)."
    ]
    return table


def evidence_tables(exp: Experiment, conditions_only: bool = False, confidence: float = 0.95) -> dict[str, Table]:
    """stem -> table: `conditions`, and unless `conditions_only`, `effects`, `wiring` and `placebo`."""
    out = {"conditions": conditions_table(condition_results(exp))}
    if conditions_only:
        return out
    effects = effect_results(exp, "effect", confidence)
    toggles = [r for r in effects if r.mechanism.toggle != HEADLINE]
    agree = sum(r.verdict == AS_PAPER for r in toggles)
    head = next((r for r in effects if r.mechanism.toggle == HEADLINE), None)
    out["effects"] = results_table(
        effects,
        f"Effects (version {MECHANISMS_VERSION}): what each toggle changed (row with it - the row above)",
        [
            f"{agree} of {len(toggles)} toggles moved their effect statistic in the paper's direction with a "
            f"{round(100 * confidence)}% interval that excludes 0; the headline ({HEADLINE}: row "
            f"{head.with_row if head else '05'} - row {head.without_row if head else '00'}): "
            f"{head.verdict if head else 'missing'}. Welch's interval over seeds; declared in "
            "dapo/report/mechanisms.py (MECHANISMS_V2) before the confirmatory run."
        ],
        confidence,
        with_source=False,
    )
    out["wiring"] = results_table(
        effect_results(exp, "wiring", confidence),
        "Wiring checks: what each toggle changes by construction (not evidence for the paper)",
        ["These hold whenever the toggle is wired; they are reported to show that it is, and are not counted."],
        confidence,
        with_source=False,
    )
    out["placebo"] = placebo_table(placebo_results(exp, confidence), confidence)
    return out
