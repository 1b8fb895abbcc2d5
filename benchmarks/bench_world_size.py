"""One tiny-preset rollout step at world size 2 (two ranks x 1 thread: two vLLM replicas, two learner shards)
versus world size 1 (one rank x 2 threads), on the same 2 cores, through `dapo train` itself.

    .venv/bin/python benchmarks/bench_world_size.py [--quick] [--rounds 3] [--steps 6] [--row 00_naive_grpo]
        [--omp-wait default|passive] [--world1-threads 2|1] [--set trainer.zero_stage=2 ...]

Each launch trains `--steps` rollout steps of the tiny preset (the default tiny world, built if missing) from the
base model, with no checkpoint but the last and no evaluation but the final one; the step time is MLflow's
`time/step` of every step after the first (which carries the warm-up), median over the launch, and the same for
its phases (generation, old log-probs, the updates, the weight sync; scoring and bookkeeping are the rest).
Launches alternate world 2, world 1, ... for `--rounds` rounds. The target (issue 12): world 2 at least 1.3x faster.

Both sides run in the environment a user's `dapo train` gets: OpenMP's own waiting policy (GNU OpenMP spins a while
before it sleeps). `--omp-wait passive` sets OMP_WAIT_POLICY=PASSIVE for both sides instead, and records a separate
section: threads that sleep at once slow world 1's two-thread matrix products by about 13% (BENCHMARKS.md 10).
`--world1-threads 1` gives world 1 one thread, so each of world 2's ranks brings a core of its own, as each GPU
rank brings its GPU: how far the 2-rank path itself scales, apart from what two threads already take from a core.
"""

from __future__ import annotations

import argparse
import os
import subprocess
import sys
import tempfile
import warnings
from pathlib import Path

os.environ.setdefault("HF_HUB_OFFLINE", "1")
os.environ.setdefault("DS_ACCELERATOR", "cpu")
sys.path.insert(0, str(Path(__file__).resolve().parent))
warnings.filterwarnings("ignore")

from _common import add_omp_wait_option, child_env, omp_wait_label  # noqa: E402

ROOT = Path(__file__).resolve().parent.parent

from dapo import metric_names as M  # noqa: E402

PHASES = (M.TIME_GENERATE, M.TIME_OLD_LOGPROB, M.TIME_UPDATE, M.TIME_SYNC)  # the parts of M.TIME_STEP reported


def launch(
    world: int, threads: int, row: str, steps: int, tiny_dir: Path, overrides: list[str], omp_wait: str
) -> dict[str, list[float]]:
    """Seconds per rollout step (steps 2..) of one `dapo train` launch: `time/step` and its phases."""
    from mlflow.tracking import MlflowClient

    with tempfile.TemporaryDirectory() as d:
        env = child_env(omp_wait, threads) | {"TOKENIZERS_PARALLELISM": "false"}
        launcher = (
            [sys.executable, "-m", "torch.distributed.run", "--standalone", "--nproc-per-node=2"]
            if world == 2
            else [sys.executable]
        )
        cmd = [
            *launcher,
            "-m",
            "dapo.cli",
            "train",
            "--config",
            str(ROOT / "configs" / "ablations" / f"{row}.yaml"),
            "--preset",
            "tiny",
            f"tiny.dir={tiny_dir}",
            f"trainer.total_steps={steps}",
            "trainer.checkpoint_every=0",
            "eval.every=0",
            f"resources.train.tasks_per_node={world}",  # dapo train refuses a world size its config did not ask for
            f"tracking.uri=sqlite:///{d}/mlflow.db",
            "tracking.experiment=bench",
            *overrides,
            "--run-dir",
            f"{d}/run",
            "--progress",
            "log",
        ]
        p = subprocess.run(cmd, env=env, cwd=ROOT, capture_output=True, text=True, timeout=3600)
        if p.returncode != 0:
            raise RuntimeError(f"world {world} failed:\n{p.stdout[-2000:]}\n{p.stderr[-4000:]}")
        c = MlflowClient(f"sqlite:///{d}/mlflow.db")
        (run,) = c.search_runs([c.get_experiment_by_name("bench").experiment_id])
        out = {}
        for key in (M.TIME_STEP, *PHASES):
            hist = {m.step: m.value for m in c.get_metric_history(run.info.run_id, key)}
            out[key] = [hist[s] for s in sorted(hist) if s > 1]
        return out


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--rounds", type=int, default=3)
    ap.add_argument("--steps", type=int, default=6)
    ap.add_argument("--row", default="00_naive_grpo")
    ap.add_argument("--quick", action="store_true", help="1 round of 3 steps, nothing recorded")
    add_omp_wait_option(ap)
    ap.add_argument(
        "--world1-threads",
        type=int,
        choices=(2, 1),
        default=2,
        help="threads of the 1-rank side: 2 (the same cores as world 2) or 1 (one core per rank)",
    )
    ap.add_argument("--set", nargs="*", default=[], metavar="KEY=VALUE", help="config overrides for both world sizes")
    args = ap.parse_args()
    from _common import machine, md_table, median, print_table, record

    from dapo.config import load_config
    from dapo.tinyworld import ensure_tiny_world

    info = machine()
    tiny_dir = Path(ensure_tiny_world(load_config(preset="tiny")))
    rounds, steps = (1, 3) if args.quick else (args.rounds, args.steps)
    threads = {2: 1, 1: args.world1_threads}  # OpenMP threads per rank
    per_launch: dict[int, list[float]] = {2: [], 1: []}
    phases: dict[int, dict[str, list[float]]] = {2: {k: [] for k in PHASES}, 1: {k: [] for k in PHASES}}
    for r in range(rounds):
        for world in (2, 1) if r % 2 == 0 else (1, 2):
            t = launch(world, threads[world], args.row, steps, tiny_dir, args.set, args.omp_wait)
            per_launch[world].append(median(t[M.TIME_STEP]))
            for k in PHASES:
                phases[world][k].append(median(t[k]))
    header = ["world size", "ranks x threads", "launches", "median s / step", "min-max s / step"]
    header += [f"{k.split('/')[1]} s" for k in PHASES]
    rows = [
        [w, f"{w} x {threads[w]}", len(v), f"{median(v):.2f}", f"{min(v):.2f}-{max(v):.2f}"]
        + [f"{median(phases[w][k]):.3f}" for k in PHASES]
        for w, v in per_launch.items()
    ]
    speedup = median(per_launch[1]) / median(per_launch[2])
    wait = omp_wait_label(args.omp_wait)
    print_table(f"Tiny preset, row {args.row}: one rollout step ({wait})", header, rows)
    target = "target 1.3x" if args.world1_threads == 2 else "world 1 on one core: not the target's comparison"
    print(f"world 2 vs world 1: {speedup:.2f}x faster ({target})")
    if not args.quick:
        body = (
            f"`dapo train` row {args.row}, tiny preset, {steps} steps per launch (step 1 left out), {rounds} "
            f"launches per world size, alternating; {wait} on both sides.\n\n{md_table(header, rows)}\n\n"
            f"world 2 vs world 1: **{speedup:.2f}x** ({target})"
        )
        name = "world-size" + ("" if args.omp_wait == "default" else f"-{args.omp_wait}")
        name += "" if args.world1_threads == 2 else "-one-core-per-rank"
        record(name, "benchmarks/bench_world_size.py " + " ".join(sys.argv[1:]), info, body)


if __name__ == "__main__":
    main()
