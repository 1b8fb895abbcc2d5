"""The report's steps as plain functions: the analysis notebooks call these, and so does `dapo report
--engine python`, so both paths write the same files.

    out/table1.{md,csv,tex}     Table 1 (ours beside the paper's)
    out/mechanisms.{md,csv,tex} what each toggle moved, against the paper's expected sign (declared statistics, v1)
    out/conditions, effects, wiring, placebo.{md,csv,tex}  version 2 (dapo.report.evidence): each toggle's condition
                                in the row without it, its effect, what it moves by construction, and the placebo
    out/marginal_effects.{md,csv,tex}  each toggle's effect under the cumulative, leave-one-out, one-at-a-time designs
    out/compute.{md,csv,tex}    tokens, wall-clock, GPU-hours (or CPU-hours) per row
    out/variants.{md,csv,tex}   each variant of configs/variants/ against its parent row (when variant runs exist)
    out/async.{md,csv,tex}      each ladder row carried over against itself synchronous (when async runs exist)
    out/figures/*.{png,pdf}     the paper's figures, the mechanisms' intervals and (habits world) version 2's
                                effects' intervals; out/figures.json lists each with what it misses
    out/warnings.json           odd things about the runs (duplicates, unfinished runs, ...)
    out/report.md               all of it on one page, with a Missing section
"""

from __future__ import annotations

import json
import sys
from pathlib import Path

from dapo import metric_names as M
from dapo.report.assays import assay_results, assays_table
from dapo.report.compute import compute_table
from dapo.report.evidence import effect_results, evidence_tables
from dapo.report.figures import FigureResult, make_figures
from dapo.report.formats import write_table
from dapo.report.load import load_experiment
from dapo.report.marginal import confounds, marginal_effects, marginal_table
from dapo.report.mechanisms import MechanismResult, cumulative_results, mechanisms_figure, mechanisms_table
from dapo.report.runs import Experiment, XAxis
from dapo.report.staleness import async_results, async_table
from dapo.report.table1 import build_table1, table1_table
from dapo.report.variants import variant_results, variants_figure, variants_table

TABLES = ("table1", "conditions", "effects", "wiring", "placebo", "mechanisms", "marginal_effects", "compute")


def warn(lines: list[str]) -> None:
    """One `warning:` line per problem on stderr (named, never a traceback)."""
    for line in lines:
        print(f"warning: {line}", file=sys.stderr)


def write_tables(
    exp: Experiment,
    out_dir: str | Path,
    gpus_per_run: float | None = None,
    cpus_per_run: float | None = None,
    confidence: float = 0.95,
) -> list[str]:
    """Every table (md, csv, tex) and warnings.json into out_dir; returns every missing item's name."""
    out = Path(out_dir)
    t1 = build_table1(exp, confidence)
    tables = {
        "table1": table1_table(t1),
        "mechanisms": mechanisms_table(cumulative_results(exp, confidence), confidence),
        **evidence_tables(exp, confidence=confidence),
        "marginal_effects": marginal_table(*marginal_effects(exp, confidence), exp.k, confidence),
    }
    unclean = confounds(exp)
    if unclean:  # the runs' own configs say so, whatever the workflow was told
        note = (
            "**Not a clean ablation**: these runs differ in more than the toggle they are compared on, so their "
            "difference is not that toggle's effect alone: " + " | ".join(unclean)
        )
        for table in tables.values():
            table.notes.insert(0, note)
        exp.warnings.append(note.replace("**", ""))
    tables["compute"] = compute_table(exp, t1, gpus_per_run, cpus_per_run)
    variants = variant_results(exp, confidence)
    if variants:  # only where variants ran: a ladder's report has no such section
        tables["variants"] = variants_table(variants, confidence)
    carried = async_results(exp, confidence)
    if carried:  # only where the async design's runs ran
        tables["async"] = async_table(carried, confidence)
    assays = assay_results(exp)
    if assays:  # only where an assay's rows ran
        tables["assays"] = assays_table(assays)
    for stem, table in tables.items():
        write_table(table, out, stem)
    (out / "warnings.json").write_text(json.dumps(exp.warnings, indent=1))
    missing = [m for table in tables.values() for m in table.missing]
    warn(exp.warnings + [f"missing: {m}" for m in missing])
    return missing


def write_conditions(exp: Experiment, out_dir: str | Path) -> Path:
    """The development mode: the version-2 conditions alone (conditions.md/.csv/.tex), no effect, no Table 1; and
    the assays' conditions (assay_conditions.*) where an assay's rows ran."""
    out = Path(out_dir)
    table = evidence_tables(exp, conditions_only=True)["conditions"]
    write_table(table, out, "conditions")
    warn(exp.warnings + [f"missing: {m}" for m in table.missing])
    assays = assay_results(exp)
    if assays:
        write_table(assays_table(assays, conditions_only=True), out, "assay_conditions")
        return out / "assay_conditions.md"
    return out / "conditions.md"


def write_figures(exp: Experiment, out_dir: str | Path, x_axis: XAxis = "updates") -> list[FigureResult]:
    """Every figure (PNG and PDF) into out_dir/figures, and out_dir/figures.json as their manifest."""
    out = Path(out_dir)
    results = make_figures(exp, out / "figures", x_axis)
    confidence = 0.95

    def intervals(name: str, label: str, what: str, stats: list[MechanismResult]) -> FigureResult:
        """One panel per statistic, its Δ and interval; statistics without an interval are listed as missing."""
        paths = mechanisms_figure(stats, out / "figures", name, confidence, title=label)
        missing = [f"{r.mechanism.toggle} / {r.mechanism.quantity}" for r in stats if r.interval is None]
        return FigureResult(name, f"{label}: {what}, {confidence:.0%} interval over seeds", paths, missing)

    mech = cumulative_results(exp, confidence)
    results.append(intervals("mechanisms", "Mechanisms", "each toggle's Δ on its declared quantities", mech))
    if any(M.HABIT_LOOP in run.history for run in exp.runs):  # version 2's effects need the habits world's metrics
        effects = effect_results(exp, "effect", confidence)
        results.append(intervals("effects", "Effects (version 2)", "each toggle's Δ and the headline", effects))
    variants = variant_results(exp, confidence)
    if variants:
        title = f"Variants: each against its parent row, {confidence:.0%} interval over seeds"
        missing = [f"{v} / {r.mechanism.quantity}" for v, _, rs in variants for r in rs if r.interval is None]
        results.append(FigureResult("variants", title, variants_figure(variants, out / "figures", confidence), missing))
    manifest = [
        {"name": r.name, "title": r.title, "files": [p.name for p in r.paths], "missing": r.missing} for r in results
    ]
    (out / "figures.json").write_text(json.dumps({"x_axis": x_axis, "figures": manifest}, indent=1))
    warn([f"{r.name}: missing {m}" for r in results for m in r.missing])
    return results


def write_index(out_dir: str | Path, experiment: str = "") -> Path:
    """report.md: the tables, the figures and one Missing section, from the files the steps above wrote.

    Whatever step did not run (its file is absent) is itself listed as missing.
    """
    out = Path(out_dir)
    parts = [f"# DAPO ablation report{': ' + experiment if experiment else ''}", ""]
    missing: list[str] = []
    for stem in (*TABLES, "variants", "async"):
        p = out / f"{stem}.md"
        if stem in ("variants", "async") and not p.is_file():
            continue  # written only where variants (the async design's runs) ran
        if p.is_file():
            text = p.read_text()
            body, _, miss = text.partition("### Missing")
            parts.append(body.rstrip() + "\n")
            missing += [ln[2:] for ln in miss.splitlines() if ln.startswith("- ")]
        else:
            missing.append(f"{stem}.md was not written")
    fj = out / "figures.json"
    if fj.is_file():
        man = json.loads(fj.read_text())
        parts.append(f"## Figures (x-axis: {'gradient updates' if man['x_axis'] == 'updates' else 'rollout steps'})\n")
        for f in man["figures"]:
            png = next((n for n in f["files"] if n.endswith(".png")), None)
            parts.append(f"### {f['title']}\n\n![{f['name']}](figures/{png})\n" if png else f"### {f['title']}\n")
            missing += [f"{f['name']}: {m}" for m in f["missing"]]
    else:
        missing.append("figures.json was not written (figures not made)")
    wj = out / "warnings.json"
    warnings = json.loads(wj.read_text()) if wj.is_file() else []
    if warnings:
        parts += ["## Warnings", ""] + [f"- {w}" for w in warnings] + [""]
    parts += ["## Missing", ""] + ([f"- {m}" for m in missing] if missing else ["Nothing missing."])
    index = out / "report.md"
    index.write_text("\n".join(parts) + "\n")
    return index


def build_report(
    experiment: str,
    tracking_uri: str | None = None,
    out_dir: str | Path = "results/report",
    x_axis: XAxis = "updates",
    gpus_per_run: float | None = None,
    cpus_per_run: float | None = None,
) -> Path:
    """The plain-Python path: read the experiment once, write every table and figure and report.md."""
    exp = load_experiment(experiment, tracking_uri)
    write_tables(exp, out_dir, gpus_per_run, cpus_per_run)
    write_figures(exp, out_dir, x_axis)
    return write_index(out_dir, experiment)
