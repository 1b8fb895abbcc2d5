"""`dapo plan`: what the ablation workflow would run, and whether it fits, from its config (dapo.workflow_spec)."""

from __future__ import annotations

import argparse

DESCRIPTION = """\
The ablation's plan in words, before anything runs: rows x seeds, jobs, nodes, GPUs and their hours; for a GPU
preset the per-GPU memory budget (a plan that does not fit is refused, exit 1, naming the keys to change) and the
expected cost of each row. It reads configs/workflow.yaml (the Snakemake workflow's config) with --config on top,
and resolves and validates every run config: a bad one stops here with the file, the key and the fix (exit 2).
The Snakemake workflow runs `dapo plan --json` when it parses, and prints the same plan on a dry run.

examples:
  dapo plan                                           # the tiny CPU ablation of configs/workflow.yaml
  dapo plan --config preset=qwen2.5-32b seeds=[0,1]   # the paper's scale (what `snakemake -n` prints)
  dapo plan --config preset=qwen2.5-32b 'plan={gpu_memory_gib: 40}' --jobs 64 --train-nodes 32
"""


def _key_value(text: str) -> tuple[str, object]:
    import yaml

    key, sep, value = text.partition("=")
    if not sep or not key:
        raise argparse.ArgumentTypeError(f"{text!r}: expected KEY=VALUE (VALUE read as YAML, e.g. seeds=[0,1])")
    return key, yaml.safe_load(value)


def add_arguments(p: argparse.ArgumentParser) -> None:
    p.description = DESCRIPTION
    p.formatter_class = argparse.RawDescriptionHelpFormatter
    p.add_argument(
        "--workflow-config", metavar="YAML", help="The workflow's config file (default: configs/workflow.yaml)."
    )
    p.add_argument(
        "--config",
        nargs="+",
        default=[],
        type=_key_value,
        metavar="KEY=VALUE",
        help="Workflow config keys over the file, as Snakemake's --config takes them (values read as YAML): "
        "preset=qwen2.5-32b rows=[00_naive_grpo] 'overrides=[\"trainer.total_steps=2\"]'.",
    )
    p.add_argument(
        "--config-json",
        metavar="JSON",
        help="The whole workflow config as one JSON object (what the workflow passes; the file is not read).",
    )
    p.add_argument(
        "--jobs",
        type=int,
        help="Snakemake's --jobs (the SLURM profile's `jobs:`): caps the runs at once.",
    )
    p.add_argument(
        "--train-nodes",
        type=float,
        metavar="N",
        help="Snakemake's --resources train_nodes=N: nodes of training jobs at once (docs/cluster.md).",
    )
    p.add_argument(
        "--train-slurm-extra",
        metavar="OPTIONS",
        help="The train rule's slurm_extra as --set-resources sets it: a `B:` signal there is refused.",
    )
    p.add_argument(
        "--json",
        action="store_true",
        help="Print the workflow's whole spec (runs, resources, plan text, refusal) as JSON on stdout; always "
        'exit 0 then, with {"error": ...} for a config that cannot run.',
    )
    p.add_argument("--no-plan", action="store_true", help="Leave out the plan text and its refusal (a job's parse).")
    p.add_argument(
        "--live-jobs",
        action="store_true",
        help="Include the SLURM training jobs an earlier controller of the results folder left queued or running.",
    )


def load(args: argparse.Namespace) -> dict:
    """The workflow config: --config-json, or the file with --config on top; schema defaults filled in, validated."""
    import json

    import yaml
    from snakemake.utils import update_config

    from dapo import workflow_spec as W

    if args.config_json is not None:
        config = json.loads(args.config_json)
        where = "the workflow's config (--config)"
    else:
        path = args.workflow_config or W.WORKFLOW_CONFIG
        config = yaml.safe_load(open(path).read()) or {}
        for key, value in args.config:  # as Snakemake's --config (its own function): a mapping updates, key by key
            update_config(config, {key: value})
        where = f"{path} (or --config)"
    config = W.with_defaults(config)
    W.validate(config, where)
    return config


def run(args: argparse.Namespace) -> int:
    import json
    import sys

    from dapo import workflow_spec as W
    from dapo.config import ConfigError

    try:
        spec = W.build_spec(
            load(args),
            jobs=args.jobs,
            train_nodes_limit=args.train_nodes,
            train_slurm_extra=args.train_slurm_extra,
            with_plan=not args.no_plan,
            live_jobs=args.live_jobs,
        )
    except ConfigError as e:
        if not args.json:
            raise
        print(json.dumps({"error": str(e)}))
        return 0
    if args.json:
        print(json.dumps(spec))
        return 0
    if spec["plan_text"]:
        print(spec["plan_text"])
    if spec["refusal"]:
        print(spec["refusal"], file=sys.stderr)
        return 1
    return 0
