"""Data-parallel rollouts: sampled tokens per second of 2 ranks x 1 thread (two vLLM replicas under torchrun, each
generating half of the batch, gathered) versus 1 rank x 2 threads (one engine, the whole batch), on the same cores;
and the CPU time each side spends per token (all its processes), which a busy machine distorts less than wall time.

    .venv/bin/python benchmarks/bench_replicas.py [--quick] [--rounds 3] [--reps 3] [--model tiny|world]
        [--omp-wait default|passive]

Both sides run the trainer's path (`dapo.rollout.replicas.split_samples` and `gather_shares` over
`make_engine("vllm", ...)`), on the tiny world's base model (`--model world`, built if missing) or a random Qwen2 of
the same shape (`tiny`, default: no build). Each side is a fresh launch (engine start excluded from the timing: one
warm-up call, then `--reps` timed calls, the median kept); launches alternate A, B, A, B for `--rounds` rounds so the
shared machine's drift falls on both. The tokens counted are those returned (every replica's). Both sides keep OpenMP's
default waiting policy (what `dapo train` gets); `--omp-wait passive` sets OMP_WAIT_POLICY=PASSIVE on both and
records a separate section.
"""

from __future__ import annotations

import argparse
import json
import os
import random
import subprocess
import sys
import tempfile
import time
import warnings
from pathlib import Path

os.environ.setdefault("HF_HUB_OFFLINE", "1")
os.environ.setdefault("VLLM_LOGGING_LEVEL", "WARNING")
os.environ.setdefault("DS_ACCELERATOR", "cpu")
sys.path.insert(0, str(Path(__file__).resolve().parent))
warnings.filterwarnings("ignore")

from _common import add_omp_wait_option, child_env, omp_wait_label  # noqa: E402

ROOT = Path(__file__).resolve().parent.parent
# the tiny preset's rollout: 32 prompts x 8 responses, up to 64 new tokens
PROMPTS, N, MAX_TOKENS, PROMPT_LEN = 32, 8, 64, 96


def worker(model: str, reps: int, out: str) -> None:
    """One side's launch: every rank builds its engine, then timed calls of the whole batch on every replica."""
    import torch

    from dapo import distributed as dist
    from dapo.rollout import make_engine
    from dapo.rollout.replicas import ReplicaLayout, gather_shares, sampling_seed, share_seeds, split_samples

    dist.init_distributed()
    layout = ReplicaLayout.of_this_process(1)
    engine = make_engine("vllm", model, dtype="float32", max_model_len=PROMPT_LEN + MAX_TOKENS + 8, seed=0)
    rng = random.Random(0)
    prompts = [[rng.randrange(3, 300) for _ in range(PROMPT_LEN)] for _ in range(PROMPTS)]

    def call(k: int) -> tuple[float, int, float]:
        dist.barrier()
        t0, c0 = time.perf_counter(), time.process_time()
        base = sampling_seed(0, k)
        shares = split_samples(len(prompts), N, layout.num_replicas)
        share = shares[layout.replica]
        groups = engine.generate(
            [prompts[i] for i in share.prompts],
            share.counts,
            MAX_TOKENS,
            seeds=share_seeds(base, share.prompts, share.counts, share.first),
        )
        parts = gather_shares(layout, shares, sum(len(s.response_ids) for g in groups for s in g))
        wall, cpu = time.perf_counter() - t0, time.process_time() - c0
        return wall, sum(tokens for _, tokens in parts), sum(dist.all_gather(cpu))  # CPU seconds of every rank

    call(0)  # warm-up
    timed = [call(k + 1) for k in range(reps)]
    if dist.is_main():
        Path(out).write_text(
            json.dumps({"threads": torch.get_num_threads(), "world": layout.world_size, "calls": timed})
        )
    dist.barrier()
    engine.close()


def launch(side: str, model: str, reps: int, omp_wait: str) -> dict:
    """Run one side in fresh processes; returns the worker's record."""
    with tempfile.TemporaryDirectory() as d:
        out = str(Path(d) / "out.json")
        script = [str(Path(__file__).resolve()), "--worker", model, str(reps), out]
        if side == "2 ranks x 1 thread":
            env = child_env(omp_wait, threads=1)
            cmd = [sys.executable, "-m", "torch.distributed.run", "--standalone", "--nproc-per-node=2", *script]
        else:
            env = child_env(omp_wait, threads=2)
            cmd = [sys.executable, *script]
        p = subprocess.run(cmd, env=env, cwd=ROOT, capture_output=True, text=True, timeout=1800)
        if p.returncode != 0:
            raise RuntimeError(f"{side} failed:\n{p.stdout[-2000:]}\n{p.stderr[-4000:]}")
        return json.loads(Path(out).read_text())


def model_path(kind: str) -> str:
    if kind == "world":
        from dapo.config import load_config
        from dapo.tinyworld import ensure_tiny_world

        return str(Path(ensure_tiny_world(load_config(preset="tiny"))) / "model")
    from _common import random_qwen2

    # the tiny world's shape: hidden 128, 4 layers, 2 heads of 64, a 512-token vocabulary
    return str(random_qwen2("replicas-tiny", vocab=512, hidden=128, layers=4, heads=2))


def main() -> None:
    if len(sys.argv) > 1 and sys.argv[1] == "--worker":
        worker(sys.argv[2], int(sys.argv[3]), sys.argv[4])
        return
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--rounds", type=int, default=3)
    ap.add_argument("--reps", type=int, default=3)
    ap.add_argument("--model", choices=["tiny", "world"], default="tiny")
    ap.add_argument("--quick", action="store_true", help="1 round of 1 call per side, nothing recorded")
    add_omp_wait_option(ap)
    args = ap.parse_args()
    from _common import machine, md_table, median, print_table, record

    info = machine()
    rounds, reps = (1, 1) if args.quick else (args.rounds, args.reps)
    model = model_path(args.model)
    sides = ["2 ranks x 1 thread", "1 rank x 2 threads"]
    tps: dict[str, list[float]] = {s: [] for s in sides}
    cpu_per_k: dict[str, list[float]] = {s: [] for s in sides}  # CPU seconds per 1,000 tokens, all processes
    for r in range(rounds):
        for side in sides[r % 2 :] + sides[: r % 2]:
            rec = launch(side, model, reps, args.omp_wait)
            tps[side].append(median([tok / sec for sec, tok, _ in rec["calls"]]))
            cpu_per_k[side].append(median([1000 * cpu / tok for _, tok, cpu in rec["calls"]]))
    header = ["side", "launches", "median tokens/s", "min-max tokens/s", "CPU s / 1K tokens"]
    rows = [
        [s, len(v), f"{median(v):,.0f}", f"{min(v):,.0f}-{max(v):,.0f}", f"{median(cpu_per_k[s]):.3f}"]
        for s, v in tps.items()
    ]
    ratio = median(tps[sides[0]]) / median(tps[sides[1]])
    wait = omp_wait_label(args.omp_wait)
    print_table(f"Rollouts: {PROMPTS} prompts x {N} x up to {MAX_TOKENS} tokens (vLLM, float32, CPU)", header, rows)
    print(f"2 replicas / 1 engine: {ratio:.2f}x")
    if not args.quick:
        body = (
            f"{rounds} launches per side, alternating; in each, {reps} timed calls after a warm-up call, median "
            f"kept; {wait} on both sides. Batch: {PROMPTS} prompts of {PROMPT_LEN} tokens x {N} responses x up to "
            f"{MAX_TOKENS} tokens; "
            f"model `{args.model}`.\n\n{md_table(header, rows)}\n\n2 replicas / 1 engine: **{ratio:.2f}x**"
        )
        name = "replicas" if args.omp_wait == "default" else f"replicas-{args.omp_wait}"
        record(name, "benchmarks/bench_replicas.py " + " ".join(sys.argv[1:]), info, body)


if __name__ == "__main__":
    main()
