"""`dapo report`: regenerate the tables and the paper's figures from an existing MLflow experiment, without
retraining: by executing the analysis notebooks (papermill; the executed copies under <out>/notebooks), or with
`--engine python` the same package functions directly. Missing rows or metrics are warnings, never a traceback."""

from __future__ import annotations

import argparse
import sys


def add_arguments(p: argparse.ArgumentParser) -> None:
    p.add_argument("--experiment", required=True, help="MLflow experiment name (one per ablation).")
    p.add_argument(
        "--tracking-uri", help="MLflow tracking URI (default: $MLFLOW_TRACKING_URI, else sqlite:///results/mlflow.db)."
    )
    p.add_argument("--out", default="results/report", help="Output folder (default: results/report).")
    p.add_argument(
        "--runs",
        help="Run directories to look in first for MLflow records still spooled (a server outage at a run's end), "
        "delivered before the report reads the experiment.",
    )
    p.add_argument(
        "--x-axis",
        choices=("updates", "rollout"),
        default="updates",
        help="Figures' x-axis: gradient updates (the paper's) or rollout steps.",
    )
    p.add_argument(
        "--gpus-per-run",
        type=float,
        help="GPUs each run used, for GPU-hours (default: a run's tag/param, else 0: CPU-hours).",
    )
    p.add_argument(
        "--cpus-per-run",
        type=float,
        help="CPUs each run used, for CPU-hours when a run had no GPU (default: tag/param, else 1).",
    )
    p.add_argument(
        "--conditions-only",
        action="store_true",
        help="Development mode: print and write only the version-2 conditions (does each toggle have something to "
        "act on, read in the row without it), hiding Table 1 and every effect, so a world can be tuned on its "
        "conditions without seeing the effects.",
    )
    p.add_argument(
        "--engine",
        choices=("notebook", "python"),
        default="notebook",
        help="notebook: execute the analysis notebooks with papermill (saved beside the outputs); "
        "python: call the same functions directly.",
    )


def run(args: argparse.Namespace) -> int:
    from pathlib import Path

    from dapo.report.load import ExperimentNotFound, load_experiment
    from dapo.report.pipeline import write_index
    from dapo.tracking import resolve_uri

    uri = resolve_uri(args.tracking_uri)
    out = Path(args.out).resolve()
    if args.runs:
        from dapo.tracking import replay_pending

        for s in replay_pending(args.runs):
            if s.waiting:
                print(
                    f"warning: MLflow run {s.run_id} misses {s.waiting} record(s) still spooled in {s.path}",
                    file=sys.stderr,
                )
    try:
        exp = load_experiment(args.experiment, uri)  # fail fast, with the known names, before any kernel starts
    except ExperimentNotFound as e:
        print(f"dapo report: {e}", file=sys.stderr)
        return 2
    out.mkdir(parents=True, exist_ok=True)
    if args.conditions_only:
        from dapo.report.pipeline import write_conditions

        path = write_conditions(exp, out)
        print(path.read_text())
        return 0
    engine = args.engine
    if engine == "notebook":
        from dapo.report.notebooks import ANALYSIS_DIR

        if not (ANALYSIS_DIR / "table1.py").is_file():  # an installed wheel ships no analysis/ folder
            print(
                f"warning: no analysis notebooks in {ANALYSIS_DIR} (not a source checkout); using --engine python",
                file=sys.stderr,
            )
            engine = "python"
    if engine == "python":
        from dapo.report.pipeline import write_figures, write_tables

        write_tables(exp, out, args.gpus_per_run, args.cpus_per_run)
        write_figures(exp, out, args.x_axis)
    else:
        from dapo.report.notebooks import NotebookFailed, run_notebooks

        common = {"experiment": args.experiment, "tracking_uri": uri}
        try:
            run_notebooks(
                dict(common, gpus_per_run=args.gpus_per_run, cpus_per_run=args.cpus_per_run), out, ("table1",)
            )
            run_notebooks(dict(common, x_axis=args.x_axis), out, ("figures",))
        except NotebookFailed as e:
            print(f"dapo report: {e}", file=sys.stderr)
            write_index(out, args.experiment)
            return 1
        except Exception as e:  # no kernel could start (Jupyter missing or broken): say so, offer the way round
            print(
                f"dapo report: could not execute the notebooks ({type(e).__name__}: {e}); "
                "`--engine python` writes the same outputs without Jupyter",
                file=sys.stderr,
            )
            return 1
    index = write_index(out, args.experiment)
    print(f"dapo report: wrote {index} ({len(exp.runs)} runs, k = {exp.k})")
    return 0
