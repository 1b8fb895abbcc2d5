"""Read an MLflow experiment into `dapo.report.runs` objects: one run per (row, seed), selected by the tags in
`dapo.metric_names`, with the histories of the metrics the report reads and, where the run kept its final eval's
samples (`eval/samples.jsonl`), its per-problem accuracy (docs/evidence.md section 2). Odd data (a run without a row
tag, two runs for one (row, seed), runs that disagree on k) become warning lines, never exceptions.
"""

from __future__ import annotations

import re
from collections import Counter

import numpy as np

from dapo import metric_names as M
from dapo.report.runs import Experiment, ExperimentNotFound, RunData, Series


def report_metrics(k: int) -> list[str]:
    """Every metric the report reads, for eval size k: those of the figures, the declared statistics, `dapo
    compare`'s curves, the x-axes and the compute table."""
    from dapo.report.assays import ASSAY_STATISTICS
    from dapo.report.figures import COMPARE_CURVES, FIGURES
    from dapo.report.mechanisms import MECHANISMS, MECHANISMS_V2
    from dapo.report.staleness import ASYNC_STATISTICS
    from dapo.report.variants import VARIANT_STATISTICS

    ev = [M.eval_avg(k), M.eval_pass(k), M.eval_maj(k)]
    ev += [M.ci_low(n) for n in ev] + [M.ci_high(n) for n in ev]
    counters = [
        M.GRAD_UPDATES,
        M.ROLLOUT_STEP,
        M.DS_TOKENS_GENERATED,
        M.DS_TOKENS_GENERATED_TOTAL,
        M.TIME_TOTAL,
        *COMPARE_CURVES,
    ]
    figures = [metric(k) for spec in FIGURES for p in spec.panels for metric in p.metrics]
    stats = [m.metric_name(k) for m in MECHANISMS + MECHANISMS_V2 + VARIANT_STATISTICS + ASYNC_STATISTICS]
    stats += [s.metric for s in ASSAY_STATISTICS]
    return list(dict.fromkeys(ev + counters + figures + stats))


def problem_accuracy(lines: list[str]) -> dict[str, float]:
    """Per problem id, the percent of its samples marked correct, from `dapo eval`'s samples.jsonl lines."""
    import json

    hits: dict[str, list[int]] = {}
    for line in lines:
        if line.strip():
            rec = json.loads(line)
            hits.setdefault(str(rec["problem_id"]), []).append(bool(rec["correct"]))
    return {pid: 100.0 * sum(c) / len(c) for pid, c in hits.items()}


def load_problems(client, run_id: str, warnings: list[str], label: str) -> dict[str, float] | None:
    """The run's final-eval per-problem accuracy from its samples artifact; None when it has none."""
    import os
    import tempfile

    os.environ.setdefault("MLFLOW_ENABLE_ARTIFACTS_PROGRESS_BAR", "false")  # one bar per run buries the warnings
    try:
        if not any(a.path == M.EVAL_SAMPLES_ARTIFACT for a in client.list_artifacts(run_id, M.EVAL_SAMPLES_FOLDER)):
            return None
        with tempfile.TemporaryDirectory(prefix="dapo-report-") as tmp:
            path = client.download_artifacts(run_id, M.EVAL_SAMPLES_ARTIFACT, tmp)
            with open(path) as fh:
                return problem_accuracy(fh.readlines()) or None
    except Exception as e:  # an unreadable artifact costs the run its per-problem interval, not the report
        warnings.append(f"run {label}: could not read {M.EVAL_SAMPLES_ARTIFACT} ({type(e).__name__}: {e})")
        return None


_AVG_RE = re.compile("^" + re.escape(M.eval_avg(0)).replace("0", r"(\d+)") + "$")


def infer_k(runs: list, warnings: list[str]) -> int:
    """k = the runs' `eval.n` param (the most common one); else the largest k among their avg@k metrics; else 32."""
    ns = Counter(r.data.params["eval.n"] for r in runs if "eval.n" in r.data.params)
    if ns:
        (top, _), *rest = ns.most_common()
        if rest:
            warnings.append(f"runs disagree on eval.n ({dict(ns)}); using k = {top}")
        return int(top)
    ks = [int(m.group(1)) for r in runs for name in r.data.metrics if (m := _AVG_RE.match(name))]
    if not ks:
        warnings.append(f"no run has an eval.n param or an {M.eval_avg(0).replace('0', 'k')} metric; assuming k = 32")
    return max(ks, default=32)


def load_experiment(experiment: str, tracking_uri: str | None = None) -> Experiment:
    """Read every tagged run of `experiment` with the histories of the metrics the report needs.

    Raises ExperimentNotFound (with the known names) when the experiment does not exist; everything else that
    is odd about the runs becomes a line in `Experiment.warnings`.
    """
    from mlflow.tracking import MlflowClient

    from dapo.tracking import resolve_uri

    uri = resolve_uri(tracking_uri)
    client = MlflowClient(tracking_uri=uri)
    exp = client.get_experiment_by_name(experiment)
    if exp is None:
        known = sorted(e.name for e in client.search_experiments())
        raise ExperimentNotFound(
            f"experiment {experiment!r} not found at {uri}; known experiments: {', '.join(known) or '(none)'}"
        )
    raw, token = [], None
    while True:
        page = client.search_runs([exp.experiment_id], max_results=1000, page_token=token)
        raw += page
        if not (token := page.token):
            break
    tagged = [r for r in raw if M.TAG_ROW in r.data.tags]
    untagged = [r.info.run_name or r.info.run_id for r in raw if M.TAG_ROW not in r.data.tags]
    warnings = [f"run {name} has no {M.TAG_ROW} tag; left out" for name in untagged]
    k = infer_k(tagged, warnings)

    chosen: dict[tuple[str, str], object] = {}
    for r in tagged:
        key = (r.data.tags[M.TAG_ROW], r.data.tags.get(M.TAG_SEED, r.data.params.get("trainer.seed", "")))
        prev = chosen.setdefault(key, r)
        if prev is not r:
            keep, drop = (r, prev) if _preference(r) > _preference(prev) else (prev, r)
            warnings.append(
                f"two runs for row {key[0]} seed {key[1]}: using {keep.info.run_name} "
                f"({keep.info.run_id[:8]}), not {drop.info.run_name} ({drop.info.run_id[:8]})"
            )
            chosen[key] = keep

    wanted = report_metrics(k)
    runs = []
    for r in chosen.values():
        tags, params = dict(r.data.tags), dict(r.data.params)
        seed_txt = str(tags.get(M.TAG_SEED, params.get("trainer.seed", "")))
        rd = RunData(
            run_id=r.info.run_id,
            name=r.info.run_name or "",
            row=tags[M.TAG_ROW],
            seed=int(seed_txt) if seed_txt.lstrip("-").isdigit() else None,
            status=_status(r),
            params=params,
            tags=tags,
            start_ms=r.info.start_time,
            end_ms=r.info.end_time,
        )
        rd.history = {n: _series(client.get_metric_history(r.info.run_id, n)) for n in wanted if n in r.data.metrics}
        rd.problems = load_problems(client, r.info.run_id, warnings, rd.label)
        if rd.seed is not None and rd.name != f"{rd.row}-s{rd.seed}":
            warnings.append(
                f"run {rd.name or rd.run_id} is not named {rd.row}-s{rd.seed}: the MLflow UI lines runs up by name"
            )
        if rd.status.lower() != "finished":
            warnings.append(f"run {rd.label} has status {rd.status!r}: its last logged eval is used")
        runs.append(rd)
    runs.sort(key=lambda r: (r.row, r.seed is None, r.seed or 0))
    return Experiment(name=experiment, tracking_uri=uri, k=k, runs=runs, warnings=warnings)


def _status(r) -> str:
    """The dapo.status tag, else MLflow's own status (lower case)."""
    return r.data.tags.get(M.TAG_STATUS, (r.info.status or "").lower())


def _preference(r) -> tuple:
    """Among runs of one (row, seed): a training run (a standalone `dapo eval` run carries the same tags but no
    training curves), then a finished one, then the most recent."""
    trained = M.ROLLOUT_STEP in r.data.metrics or M.GRAD_UPDATES in r.data.metrics
    return (trained, _status(r).lower() == "finished", r.info.start_time or 0)


def _series(points) -> Series:
    """MLflow metric history -> Series; a step logged twice keeps its latest value (a resumed run)."""
    by_step: dict[int, tuple[int, float]] = {}
    for p in points:
        prev = by_step.get(p.step)
        if prev is None or p.timestamp >= prev[0]:
            by_step[p.step] = (p.timestamp, p.value)
    steps = np.array(sorted(by_step), dtype=int)
    values = np.array([by_step[s][1] for s in steps], dtype=float)
    return Series(steps=steps, values=values)
