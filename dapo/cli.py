"""`dapo`: the command line, dispatching by name to a module per subcommand (dapo/commands/__init__.py): their
`add_arguments` import nothing heavy, so `dapo --help` is instant and `import dapo` needs neither vLLM nor a GPU."""

from __future__ import annotations

import argparse
import importlib
import sys

# name -> (module, one-line help)
COMMANDS: dict[str, tuple[str, str]] = {
    "build-tiny": ("dapo.commands.build_tiny", "Build the tiny world (task data, tokenizer, base model) from nothing."),
    "prepare-data": (
        "dapo.commands.prepare_data",
        "Load, deduplicate and template train/eval data; write JSONL for a run.",
    ),
    "train": ("dapo.commands.train", "Train one ablation row (resumes from its run directory)."),
    "eval": ("dapo.commands.eval", "Evaluate a model: avg@k, pass@k, maj@k with confidence intervals."),
    "report": ("dapo.commands.report", "Regenerate Table 1 and the paper's figures from an MLflow experiment."),
    "compare": ("dapo.report.compare", "Two rows side by side: eval curves and mechanism statistics, from MLflow."),
    "config": ("dapo.commands.config", "Show the resolved config, or every key with its default and meaning."),
    "status": ("dapo.status", "Each run's state, SLURM jobs and attempts; deliver MLflow records still spooled."),
    "plan": ("dapo.commands.plan", "The ablation's plan: runs, GPUs, hours, per-GPU memory and cost; or its spec."),
    "controller": ("dapo.commands.controller", "The workflow's start and end: one controller per results folder."),
    "tracking-store": ("dapo.commands.tracking_store", "Create the MLflow store and experiment the runs log into."),
}


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(
        prog="dapo",
        description="Reproduce the DAPO paper's cumulative ablation (Table 1) end to end.",
        epilog="Run `dapo <command> --help` for a command's options. The whole ablation runs through the "
        "Snakemake workflow: `snakemake --cores all all_ablations` (tiny CPU world) or "
        "`snakemake --profile slurm all_ablations` (a SLURM cluster).",
    )
    sub = parser.add_subparsers(dest="command", metavar="<command>")
    for name, (module, help_text) in COMMANDS.items():
        p = sub.add_parser(name, help=help_text, description=help_text)
        mod = importlib.import_module(module)
        mod.add_arguments(p)
        p.set_defaults(_module=mod)
    return parser


def main(argv: list[str] | None = None) -> int:
    parser = build_parser()
    args = parser.parse_args(argv)
    if args.command is None:
        parser.print_help()
        return 2
    from dapo.config import ConfigError
    from dapo.data.loaders import DataError

    try:
        return int(args._module.run(args) or 0)
    except (ConfigError, DataError) as e:
        # the user's input is wrong: the message says where and how to fix it; a traceback would bury it
        print(f"dapo {args.command}: {e}", file=sys.stderr)
        return 2


if __name__ == "__main__":
    sys.exit(main())
