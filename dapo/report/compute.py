"""The compute table: what each ablation row cost.

Per row (mean over its seeds): tokens generated, counting those of groups that dynamic sampling dropped
(DS_TOKENS_GENERATED_TOTAL, else the sum of the per-step DS_TOKENS_GENERATED); wall-clock (TIME_TOTAL, else the
run's MLflow start/end times); GPU-hours = GPUs per run x wall-clock; and accuracy (the final avg@k) per GPU-hour.

GPUs per run: `gpus_per_run` (the CLI / notebook parameter) wins; else the run's tag `dapo.gpus` (the trainer
writes it); else 0. A run on 0 GPUs is costed in CPU-hours instead (CPUs from `cpus_per_run`, else the tag
`dapo.cpus`, else 1, said in a note).
"""

from __future__ import annotations

from dataclasses import dataclass

from dapo import metric_names as M
from dapo.report.formats import Table, fmt
from dapo.report.runs import Experiment, RunData
from dapo.report.table1 import Table1, mean_of


@dataclass
class RunCost:
    run: str
    tokens: float | None
    seconds: float | None
    seconds_source: str  # "metric" | "mlflow times" | ""
    devices: float  # GPUs (or CPUs when unit == "CPU")
    unit: str  # "GPU" | "CPU"
    devices_assumed: bool  # no parameter, tag or param said how many CPUs

    @property
    def device_hours(self) -> float | None:
        return None if self.seconds is None else self.devices * self.seconds / 3600.0


def run_cost(run: RunData, gpus_per_run: float | None = None, cpus_per_run: float | None = None) -> RunCost:
    tot = run.history.get(M.DS_TOKENS_GENERATED_TOTAL)
    per_step = run.history.get(M.DS_TOKENS_GENERATED)
    tokens = tot.last()[1] if tot is not None else (float(per_step.values.sum()) if per_step is not None else None)
    elapsed = run.history.get(M.TIME_TOTAL)
    if elapsed is not None:
        seconds, source = float(elapsed.values.max()), "metric"
    elif run.start_ms and run.end_ms:
        seconds, source = (run.end_ms - run.start_ms) / 1000.0, "mlflow times"
    else:
        seconds, source = None, ""
    gpus = gpus_per_run if gpus_per_run is not None else run.resource(M.TAG_GPUS)
    if gpus:
        return RunCost(run.label, tokens, seconds, source, float(gpus), "GPU", False)
    cpus = cpus_per_run if cpus_per_run is not None else run.resource(M.TAG_CPUS)
    return RunCost(run.label, tokens, seconds, source, float(cpus or 1), "CPU", not cpus)


def compute_table(
    exp: Experiment, t1: Table1, gpus_per_run: float | None = None, cpus_per_run: float | None = None
) -> Table:
    """The compute table (display + CSV form), rows in Table 1 order; missing metrics are named."""
    missing: list[str] = []
    notes: list[str] = []
    acc = {r.row: r.mean for r in t1.rows}
    per_row = []
    assumed: list[str] = []
    for row in exp.rows():
        costs = [run_cost(r, gpus_per_run, cpus_per_run) for r in exp.runs_of(row)]
        for c in costs:
            if c.tokens is None:
                missing.append(
                    f"run {c.run}: metrics {M.DS_TOKENS_GENERATED_TOTAL} and {M.DS_TOKENS_GENERATED} "
                    "missing (tokens generated unknown)"
                )
            if c.seconds_source == "mlflow times":
                notes.append(f"run {c.run}: no {M.TIME_TOTAL} metric; wall-clock from MLflow start/end times")
            elif c.seconds is None:
                missing.append(f"run {c.run}: metric {M.TIME_TOTAL} missing and no end time (wall-clock unknown)")
        if costs and any(c.devices_assumed for c in costs):
            assumed.append(row)
        per_row.append((row, costs))
    if assumed:
        notes.append(
            f"no GPU or CPU count for rows {', '.join(assumed)}: their CPU-hours assume 1 CPU per run "
            "(pass --gpus-per-run or --cpus-per-run)"
        )
    units = {c.unit for _, cs in per_row for c in cs} or {"GPU"}
    hours_name = f"{'/'.join(sorted(units, reverse=True))}-hours"
    k = exp.k
    columns = [
        "Row",
        "Seeds",
        "Tokens generated (incl. dropped)",
        "Wall-clock (h)",
        "Resources per run",
        hours_name,
        f"avg@{k} per {hours_name[:-1]}",
    ]
    cells, raw = [], []
    for row, costs in per_row:
        label = M.PAPER_TABLE1.get(row, (row, None))[0]
        tokens = mean_of([c.tokens for c in costs])
        hours = mean_of([None if c.seconds is None else c.seconds / 3600 for c in costs])
        dev_hours = mean_of([c.device_hours for c in costs])
        res = sorted({f"{c.devices:g} {c.unit}" for c in costs})
        a = acc.get(row)
        per = a / dev_hours if a is not None and dev_hours else None
        cells.append(
            [
                label,
                str(len(costs)),
                "—" if tokens is None else f"{tokens:,.0f}",
                fmt(hours, 3),
                ", ".join(res) or "—",
                fmt(dev_hours, 3),
                fmt(per, 2),
            ]
        )
        raw.append(
            [row, label, len(costs), tokens, None if hours is None else hours * 3600, ", ".join(res), dev_hours, a, per]
        )
    csv_cols = [
        "row",
        "label",
        "n_seeds",
        "tokens_generated",
        "wall_clock_s",
        "resources_per_run",
        "device_hours",
        f"avg_at_{k}",
        "avg_per_device_hour",
    ]
    notes.insert(
        0,
        "Means over seeds. Tokens count every generated response, including groups dropped by "
        "dynamic sampling. Device-hours = devices per run x wall-clock.",
    )
    return Table(
        title="Compute per ablation row",
        columns=columns,
        cells=cells,
        csv_columns=csv_cols,
        csv_rows=raw,
        notes=notes,
        missing=missing,
    )
