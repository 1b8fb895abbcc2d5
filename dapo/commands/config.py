"""`dapo config`: print the resolved config of a row x preset, or every key with its default."""

from __future__ import annotations

import argparse


def add_config_arguments(p: argparse.ArgumentParser) -> None:
    """The options every command that takes a run config shares."""
    p.add_argument("--config", "-c", help="Row config YAML (e.g. configs/ablations/05_dynamic_sampling.yaml).")
    p.add_argument("--preset", "-p", help="Scale preset: a name in configs/presets/ (tiny, qwen2.5-32b) or a path.")
    p.add_argument(
        "overrides",
        nargs="*",
        metavar="section.key=value",
        help="Overrides, parsed as YAML (e.g. trainer.total_steps=5 trainer.seed=1).",
    )


def add_ladder_argument(p: argparse.ArgumentParser) -> None:
    p.add_argument(
        "--allow-confounded-ladder",
        action="store_true",
        help="A row of a ladder (configs/ablations/) is checked with every other row: each must differ from the row "
        "above only in its own toggle's keys and set no scale key; a file elsewhere whose run is labelled a row "
        "(tracking.row) is checked as that row. With this flag a failed check is a warning.",
    )


def add_arguments(p: argparse.ArgumentParser) -> None:
    add_config_arguments(p)
    p.add_argument("--keys", action="store_true", help="List every key with its default and meaning.")
    add_ladder_argument(p)


def run(args: argparse.Namespace) -> int:
    import sys

    import yaml

    from dapo.config import describe, load_config
    from dapo.designs import check_run_file

    if args.keys:
        print(describe())
        return 0
    cfg = load_config(args.config, preset=args.preset, overrides=args.overrides)
    # a ladder row means something only beside the row above it: check it (and its ladder) as such
    for problem in check_run_file(args.config, args.preset, args.overrides, allow=args.allow_confounded_ladder):
        print(f"warning: not a clean ablation: {problem}", file=sys.stderr)
    print(yaml.safe_dump(cfg.model_dump(mode="json"), sort_keys=False), end="")
    print(f"# config hash {cfg.config_hash()}  run name {cfg.run_name()}  updates/step {cfg.trainer.updates_per_step}")
    return 0
