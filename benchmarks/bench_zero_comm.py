"""ZeRO's collectives in one learner update on 2 gloo ranks, before and after the learner set `overlap_comm`, the
stage-3 prefetch bucket and persistence threshold as DeepSpeed recommends: how many collectives of each kind, and
how many bytes each rank hands them. A CPU cannot show the overlap itself (gloo runs a collective when it is called);
what it shows is what goes on the wire, and that the counts follow the schedule docs/distributed.md gives.

    python benchmarks/bench_zero_comm.py [--stages 1 2 3] [--quick]

Each (stage, settings) runs in a 2-process gloo job of its own: a random Qwen2 (hidden 256, 4 layers), a mini-batch of
16 responses split over the ranks into about 3 micro-batches each (packed), one warm-up update, then one update
during which every torch.distributed collective is counted (`torch.distributed.*` wrapped before DeepSpeed binds
them). "before": the stage alone (ZeRO-3 also with prefetch bucket 0 and persistence threshold 0, as the learner had
it); "after": `dapo.learner.optim.zero_optimization`.
"""

from __future__ import annotations

import argparse
import collections
import json
import os
import subprocess
import sys
import tempfile
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))
from _common import machine, md_table, print_table, random_qwen2, record  # noqa: E402

MODEL = dict(vocab=4096, hidden=256, layers=4, heads=4, intermediate=1024)
QUICK = dict(vocab=512, hidden=64, layers=2, heads=4, intermediate=128)
OPS = ("all_reduce", "reduce_scatter_tensor", "all_gather_into_tensor", "reduce_scatter", "all_gather", "broadcast",
       "all_to_all_single", "reduce", "_all_gather_base", "_reduce_scatter_base")  # fmt: skip
COUNTS: collections.Counter = collections.Counter()
BYTES: collections.Counter = collections.Counter()
ON = [False]


def _count(name: str, fn):
    def wrapped(*args, **kwargs):
        if ON[0]:
            tensors = [a for a in (*args, *kwargs.values()) if hasattr(a, "element_size")]
            lists = [t for a in (*args, *kwargs.values()) if isinstance(a, list) for t in a if hasattr(t, "numel")]
            biggest = max((t.numel() * t.element_size() for t in tensors + lists), default=0)
            COUNTS[name] += 1
            BYTES[name] += biggest
        return fn(*args, **kwargs)

    return wrapped


def worker(model: str, stage: int, settings: str, out: str) -> None:
    """One rank: the learner at `stage` with `settings` ("before" or "after"), an update counted."""
    import torch
    import torch.distributed as dist

    for name in OPS:  # before DeepSpeed binds any of them
        for mod in (dist, dist.distributed_c10d):
            if hasattr(mod, name):
                setattr(mod, name, _count(name, getattr(mod, name)))
    import dapo.learner.optim as optim
    from dapo.learner import Learner, LossSpec, PolicyBatch, response_mask

    if settings == "before":

        def old_zero(zero_stage: int, hidden: int | None) -> dict:  # noqa: ARG001
            zero = {"stage": zero_stage}
            if zero_stage == 3:
                zero.update({"stage3_param_persistence_threshold": 0, "stage3_prefetch_bucket_size": 0})
            return zero

        optim.zero_optimization = old_zero
    learner = Learner(
        model, loss=LossSpec(loss_agg="token-mean"), lr=1e-4, zero_stage=stage, dtype="float32",
        micro_batch_tokens=300, logprob_chunk_size=256,
    )  # fmt: skip
    g = torch.Generator().manual_seed(0)
    prompts = [[5 + k] * 20 for k in range(2) for _ in range(8)]
    responses = [torch.randint(10, 400, (int(torch.randint(40, 120, (1,), generator=g)),), generator=g).tolist()
                 for _ in range(16)]  # fmt: skip
    batch = PolicyBatch(prompts, responses, torch.randn(16, generator=g), response_mask(responses),
                        torch.arange(16) // 8)  # fmt: skip
    batch.old_logp, _ = learner.compute_logprobs(batch)
    learner.update(batch)  # warm-up: buffers allocated, nothing counted
    mine = batch.select(learner.passes.my_rows(batch))
    passes = len(learner.passes.plan(mine))
    ON[0] = True
    learner.update(batch)
    ON[0] = False
    if dist.get_rank() == 0:
        Path(out).write_text(json.dumps({"counts": COUNTS, "bytes": BYTES, "micro_batches": passes}))
    dist.barrier()
    dist.destroy_process_group()


def run(model: Path, stage: int, settings: str) -> dict:
    out = Path(tempfile.mkstemp(suffix=".json")[1])
    # Each rank's stderr to a file: with pipes, a rank whose (deprecation-warning) output filled its pipe while this
    # process waited on the other would block, and the other with it inside a collective.
    logs = [Path(tempfile.mkstemp(suffix=f".rank{rank}.log")[1]) for rank in range(2)]
    procs = []
    env = {k: v for k, v in os.environ.items() if k not in ("RANK", "WORLD_SIZE", "LOCAL_RANK")}
    port = 29700 + stage * 2 + (settings == "after")
    for rank in range(2):
        e = dict(env, RANK=str(rank), WORLD_SIZE="2", LOCAL_RANK=str(rank), MASTER_ADDR="127.0.0.1",
                 MASTER_PORT=str(port), OMP_NUM_THREADS="1", DS_ACCELERATOR="cpu", HF_HUB_OFFLINE="1")  # fmt: skip
        cmd = [sys.executable, __file__, "--worker", str(model), str(stage), settings, str(out)]
        with logs[rank].open("w") as log:
            procs.append(subprocess.Popen(cmd, env=e, stdout=subprocess.DEVNULL, stderr=log))
    for p in procs:
        p.wait(timeout=600)
    if any(p.returncode for p in procs):
        raise SystemExit(f"stage {stage} {settings}: {logs[0].read_text()[-3000:]}")
    return json.loads(out.read_text())


def main() -> None:
    if len(sys.argv) > 1 and sys.argv[1] == "--worker":
        worker(sys.argv[2], int(sys.argv[3]), sys.argv[4], sys.argv[5])
        return
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--stages", type=int, nargs="+", default=[1, 2, 3])
    ap.add_argument("--quick", action="store_true", help="a tiny model, nothing recorded")
    args = ap.parse_args()
    info = machine()
    kw = QUICK if args.quick else MODEL
    model = random_qwen2("zero-comm-" + ("quick" if args.quick else "h256-l4"), **kw)
    rows = []
    for stage in args.stages:
        for settings in ("before", "after"):
            r = run(model, stage, settings)
            ops = ", ".join(f"{op} {n}" for op, n in sorted(r["counts"].items()))
            mb = sum(r["bytes"].values()) / 2**20
            rows.append([f"ZeRO-{stage}", settings, r["micro_batches"], sum(r["counts"].values()), ops, f"{mb:,.1f}"])
    header = ["stage", "settings", "micro-batches a rank", "collectives", "by kind", "MiB a rank hands them"]
    title = f"one update, 2 gloo ranks, model {json.dumps(kw)}"
    print_table(title, header, rows)
    if not args.quick:
        record(
            "zero_comm", ".venv/bin/python benchmarks/bench_zero_comm.py", info, f"{title}\n\n{md_table(header, rows)}"
        )


if __name__ == "__main__":
    main()
