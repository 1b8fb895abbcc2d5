"""Dynamic sampling's cost: tokens generated per kept group, and generation's share of wall-clock, per row, over a
short tiny training run of row 04 (token-level loss, no dynamic sampling) and row 05 (full DAPO).

    .venv/bin/python benchmarks/bench_dynamic_sampling.py [--steps 6] [--quick]

Each row runs `dapo train --preset tiny` for `--steps` rollout steps (eval only at the end, no intermediate
checkpoints) in its own process (OMP_NUM_THREADS=1, as the workflow's train jobs), one after the other, into a
fresh MLflow SQLite store; the per-step metrics (`dynamic_sampling/*`, `time/*`) are read back from MLflow.
Generation's share is sum(time/generate) / sum(time/step) over the training steps (the final eval and start-up
are outside time/step; they are in the run's wall-clock, shown separately).
The tiny world is built once (or reused) under --tiny-dir.
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))

ROWS = ["04_token_level_loss", "05_dynamic_sampling"]
KEYS = [
    "dynamic_sampling/tokens_generated",
    "dynamic_sampling/groups_kept",
    "dynamic_sampling/groups_dropped",
    "dynamic_sampling/gen_batches",
    "time/generate",
    "time/step",
    "time/update",
    "time/old_logprob",
    "time/score",
    "time/weight_sync",
]


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--steps", type=int, default=6)
    ap.add_argument("--quick", action="store_true", help="2 steps, nothing recorded")
    ap.add_argument("--tiny-dir", default="/tmp/bench_tiny_world")
    ap.add_argument("--out", default="/tmp/bench_ds")
    args = ap.parse_args()
    from _common import ROOT, fmt, machine, md_table, print_table, record
    from mlflow.tracking import MlflowClient

    info = machine()
    steps = 2 if args.quick else args.steps
    out = Path(args.out) / time.strftime("%H%M%S")
    out.mkdir(parents=True)
    uri = f"sqlite:///{out}/mlflow.db"
    env = dict(os.environ, HF_HUB_OFFLINE="1", OMP_NUM_THREADS=os.environ.get("OMP_NUM_THREADS", "1"))
    dapo = str(Path(sys.executable).with_name("dapo"))
    rows, walls = [], {}
    for row in ROWS:
        cmd = [
            dapo,
            "train",
            "--config",
            str(ROOT / "configs/ablations" / f"{row}.yaml"),
            "--preset",
            "tiny",
            f"trainer.total_steps={steps}",
            "eval.every=0",
            "trainer.checkpoint_every=0",
            f"tiny.dir={args.tiny_dir}",
            f"tracking.uri={uri}",
            "--run-dir",
            str(out / row),
            "--progress",
            "log",
        ]
        t0 = time.perf_counter()
        with open(out / f"{row}.log", "w") as log:
            rc = subprocess.run(cmd, stdout=log, stderr=subprocess.STDOUT, env=env, cwd=ROOT, check=False).returncode
        walls[row] = time.perf_counter() - t0
        if rc != 0:
            raise SystemExit(f"{row}: dapo train exited {rc}; see {out / (row + '.log')}")
        run_id = json.loads((out / row / "DONE.json").read_text())["run_id"]
        client = MlflowClient(uri)
        sums = {k: sum(m.value for m in client.get_metric_history(run_id, k)) for k in KEYS}
        kept = sums["dynamic_sampling/groups_kept"]
        gen, step = sums["time/generate"], sums["time/step"]
        rows.append(
            [
                row,
                steps,
                f"{sums['dynamic_sampling/gen_batches']:.0f}",
                f"{kept:.0f}",
                f"{sums['dynamic_sampling/groups_dropped']:.0f}",
                f"{sums['dynamic_sampling/tokens_generated']:,.0f}",
                fmt(sums["dynamic_sampling/tokens_generated"] / kept if kept else float("nan")),
                fmt(gen),
                fmt(sums["time/update"] + sums["time/old_logprob"]),
                fmt(step),
                f"{gen / step:.0%}" if step else "-",
                fmt(walls[row]),
            ]
        )
    header = [
        "row",
        "rollout steps",
        "gen batches",
        "groups kept",
        "groups dropped",
        "tokens generated",
        "tokens / kept group",
        "generate s",
        "old logprob + update s",
        "train steps s",
        "generation share",
        "process wall s",
    ]
    print_table("Dynamic sampling over a short tiny run", header, rows)
    if not args.quick:
        body = (
            f"`dapo train --preset tiny` with `trainer.total_steps={steps} eval.every=0 "
            f"trainer.checkpoint_every=0`, rows run one after the other; metrics summed over the steps from "
            f"MLflow ({uri}).\n\n{md_table(header, rows)}"
        )
        record(
            "dynamic_sampling",
            ".venv/bin/python benchmarks/bench_dynamic_sampling.py " + " ".join(sys.argv[1:]),
            info,
            body,
        )


if __name__ == "__main__":
    main()
