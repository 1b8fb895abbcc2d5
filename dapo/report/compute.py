"""The compute table: what each ablation row cost, per row the mean over its seeds of the tokens generated
(dropped groups too: DS_TOKENS_GENERATED_TOTAL, else the sum of DS_TOKENS_GENERATED), the wall-clock (TIME_TOTAL, else
MLflow's start/end times), the device-hours and the final avg@k per device-hour. GPUs per run: `gpus_per_run`, else
the run's tag `dapo.gpus`; a run on 0 GPUs is costed in CPU-hours (`cpus_per_run`, else the tag `dapo.cpus`, else 1,
said in a note).
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
    notes = [
        "Means over seeds. Tokens count every generated response, including groups dropped by "
        "dynamic sampling. Device-hours = devices per run x wall-clock."
    ]
    missing: list[str] = []
    acc = {r.row: r.mean for r in t1.rows}
    per_row = [(row, [run_cost(r, gpus_per_run, cpus_per_run) for r in exp.runs_of(row)]) for row in exp.rows()]
    for c in (c for _, costs in per_row for c in costs):
        if c.tokens is None:
            missing.append(
                f"run {c.run}: metrics {M.DS_TOKENS_GENERATED_TOTAL} and {M.DS_TOKENS_GENERATED} "
                "missing (tokens generated unknown)"
            )
        if c.seconds_source == "mlflow times":
            notes.append(f"run {c.run}: no {M.TIME_TOTAL} metric; wall-clock from MLflow start/end times")
        elif c.seconds is None:
            missing.append(f"run {c.run}: metric {M.TIME_TOTAL} missing and no end time (wall-clock unknown)")
    assumed = [row for row, costs in per_row if any(c.devices_assumed for c in costs)]
    if assumed:
        notes.append(
            f"no GPU or CPU count for rows {', '.join(assumed)}: their CPU-hours assume 1 CPU per run "
            "(pass --gpus-per-run or --cpus-per-run)"
        )
    units = {c.unit for _, cs in per_row for c in cs} or {"GPU"}
    hours_name = f"{'/'.join(sorted(units, reverse=True))}-hours"
    cells, raw = [], []
    for row, costs in per_row:
        label = M.PAPER_TABLE1.get(row, (row, None))[0]
        tokens = mean_of([c.tokens for c in costs])
        hours = mean_of([None if c.seconds is None else c.seconds / 3600 for c in costs])
        dev_hours = mean_of([c.device_hours for c in costs])
        res = ", ".join(sorted({f"{c.devices:g} {c.unit}" for c in costs}))
        a = acc.get(row)
        per = a / dev_hours if a is not None and dev_hours else None
        tokens_txt = "—" if tokens is None else f"{tokens:,.0f}"
        cells.append([label, str(len(costs)), tokens_txt, fmt(hours, 3), res or "—", fmt(dev_hours, 3), fmt(per, 2)])
        raw.append([row, label, len(costs), tokens, None if hours is None else hours * 3600, res, dev_hours, a, per])
    columns = ["Row", "Seeds", "Tokens generated (incl. dropped)", "Wall-clock (h)", "Resources per run", hours_name]
    columns.append(f"avg@{exp.k} per {hours_name[:-1]}")
    csv_columns = "row label n_seeds tokens_generated wall_clock_s resources_per_run device_hours".split()
    csv_columns += [f"avg_at_{exp.k}", "avg_per_device_hour"]
    return Table("Compute per ablation row", columns, cells, csv_columns, raw, notes, missing)
