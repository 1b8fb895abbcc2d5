"""`dapo train`: train one ablation row; rerunning the same command on the same run directory resumes it.

    dapo train --config configs/ablations/05_dynamic_sampling.yaml --preset tiny trainer.seed=1 --run-dir DIR

Exit codes: 0 done (`<run-dir>/DONE.json` written), 1 failed, 75 stopped by SIGTERM/SIGUSR1 after a checkpoint
(resume by running the same command again).
"""

from __future__ import annotations

import argparse

from dapo.config_cli import add_config_arguments


def add_arguments(p: argparse.ArgumentParser) -> None:
    add_config_arguments(p)
    p.add_argument(
        "--run-dir",
        help="Run directory (checkpoints, final model, DONE.json); default trainer.output_dir. "
        "An existing run directory with checkpoints is resumed.",
    )
    p.add_argument(
        "--progress",
        choices=["auto", "bar", "log"],
        default="auto",
        help="A rich progress bar (`bar`), one log line per step (`log`), or bar only on a terminal.",
    )


def run(args: argparse.Namespace) -> int:
    import logging
    from pathlib import Path

    from dapo.config import load_config
    from dapo.trainer.loop import Trainer
    from dapo.trainer.setup import build_components

    logging.basicConfig(level=logging.INFO, format="%(asctime)s %(levelname)s %(name)s: %(message)s")
    cfg = load_config(args.config, preset=args.preset, overrides=args.overrides)
    if args.run_dir:
        cfg.trainer.output_dir = args.run_dir
    run_dir = Path(cfg.trainer.output_dir)
    components = build_components(cfg, run_dir)
    try:
        progress = {"auto": None, "bar": True, "log": False}[args.progress]
        return Trainer(cfg, run_dir, components, progress=progress).run()
    finally:
        components.close()
