"""One-GPU check of the CUDA paths, before a cluster run: what a CPU cannot exercise, on one GPU, in minutes.

    python scripts/gpu_check.py [--out DIR] [--world results/tiny_world] [--skip-train]

Needs a GPU, the package's dependencies (vLLM is not used: the HF engine stands in for it, see below) and a tiny
world (`dapo build-tiny`). Two parts, each printed as a table and written to DIR/gpu_check.json:

1. **Weight sync from a ZeRO-3 learner on the GPU** (the process group is NCCL, world size 1), for a tied and an
   untied random Qwen2: the trainer's sequence (generate, engine asleep, one large SGD update, stream the learner's
   parameters into the engine, wake up, sample again) with the learner built partitioned (zero.Init through
   accelerate, as at 32B). Measured: the GPU memory the learner's stream adds on top of what was allocated before
   it (`torch.cuda.max_memory_allocated` while every tensor is gathered, handed out and dropped) against the
   model's bytes and its largest tensor, and the largest difference between the engine's log-probs of newly
   sampled responses and the learner's (float32; the learner computes them in chunks, the engine in one pass).
2. **`dapo train` on the GPU** for three settings of the tiny world (bfloat16 at ZeRO 3 and 0, float32 at ZeRO 2
   with the learner's states offloaded during generation): 3 rollout steps with a checkpoint after each, killed
   (SIGKILL) after the second checkpoint, then the same command again, which must resume from step 2 (checkpoints
   of partitioned states and CUDA random states) and finish with an evaluation in DONE.json.

3. **The one-GPU preset end to end, when vLLM is installed** (`configs/presets/qwen2.5-1.5b-1gpu.yaml`: Qwen2.5-1.5B
   on the DAPO data): row 05 through vLLM's CUDA build with sleep mode, the ZeRO-3 weight stream into the engine
   after every step, checkpoints, killed (SIGKILL) after its second checkpoint and resumed from it, and the final
   AIME evaluation in DONE.json. It needs the model and both datasets: online, or in the Hugging Face cache
   (`HF_HUB_OFFLINE=0 python scripts/gpu_check.py` fetches them), or as local copies (`--smoke-overrides
   model.path=/models/Qwen2.5-1.5B data.train=/data/dapo-math-17k.parquet data.eval=/data/aime-2024.parquet`).

What it cannot check on one GPU: tensor parallel, NCCL between ranks (one GPU cannot hold two NCCL ranks), and
ZeRO's partitioning across ranks; docs/distributed.md says what differs there. Exit code 0 when every check passed,
1 otherwise.
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import time
from pathlib import Path

os.environ.setdefault("HF_HUB_OFFLINE", "1")
ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT / "benchmarks"))

SYNC_MODELS = {  # name -> random Qwen2 shape; untied: the head is its own tensor, streamed separately
    "tied-h256-l4-v32k": dict(vocab=32000, hidden=256, layers=4, heads=4, tie=True),
    "untied-h1024-l12-v32k": dict(vocab=32000, hidden=1024, layers=12, heads=16, tie=False),
}
ROW00, ROW05 = "configs/ablations/00_naive_grpo.yaml", "configs/ablations/05_dynamic_sampling.yaml"
SMOKE_PRESET = "qwen2.5-1.5b-1gpu"  # checkpoint_every 2: the kill after the second checkpoint is at step 4
TRAIN_SETTINGS = {  # name -> overrides of the tiny preset (model.dtype=auto: bfloat16 on GPUs that have it)
    "row05-zero3-bf16": (ROW05, ["model.dtype=auto", "trainer.zero_stage=3"]),
    "row00-zero0-bf16": (ROW00, ["model.dtype=auto", "trainer.zero_stage=0"]),
    "row05-zero2-fp32": (ROW05, ["trainer.zero_stage=2"]),
}
PROMPTS = [[5, 17, 33, 60], [100, 7], [250, 251, 252, 9, 11, 3]]
N, MAX_TOKENS, LOGPROB_TOL = 4, 24, 1e-3


def sync_check(model_dir: Path) -> dict:
    """The trainer's sync sequence on one GPU (tests/_sync_worker.py runs the same on CPU ranks)."""
    import torch

    from dapo import distributed as dist
    from dapo.learner import Learner, LossSpec, PolicyBatch, response_mask
    from dapo.rollout import make_engine

    dist.init_distributed()
    learner = Learner(
        str(model_dir),
        loss=LossSpec(loss_agg="token-mean"),
        lr=2.0,
        grad_clip=1e6,
        zero_stage=3,
        dtype="float32",
        optimizer=lambda params: torch.optim.SGD(params, lr=2.0),  # one step = lr x gradient
        logprob_chunk_size=64,
    )
    learner.offload_states()
    engine = make_engine("hf", str(model_dir), dtype="float32", max_model_len=128, seed=0)

    def batch_of(groups: list) -> PolicyBatch:
        samples = [s for g in groups for s in g]
        responses = [s.response_ids for s in samples]
        return PolicyBatch(
            prompt_ids=[s.prompt_ids for s in samples],
            response_ids=responses,
            advantages=torch.tensor([1.0 if i % 2 == 0 else -1.0 for i in range(len(samples))]),
            loss_mask=response_mask(responses),
            group_ids=torch.arange(len(samples)) // N,
        )

    batch = batch_of(engine.generate(PROMPTS, N, MAX_TOKENS, seed=1))
    engine.sleep()
    learner.reload_states()
    batch.old_logp, _ = learner.compute_logprobs(batch)
    learner.update(batch)

    model_bytes = largest = 0
    for p in learner.engine.module.parameters():
        size = p.ds_numel * p.element_size()
        model_bytes, largest = model_bytes + size, max(largest, size)
    # The learner's stream alone (each tensor dropped as the engine would): what the gather adds on the GPU.
    gpu = torch.cuda.is_available()  # False only in a `--cpu` trial of this script
    if gpu:
        torch.cuda.synchronize()
        before = torch.cuda.memory_allocated()
        torch.cuda.reset_peak_memory_stats()
    for _, t in learner.named_parameters_for_sync():
        del t
    extra = torch.cuda.max_memory_allocated() - before if gpu else 0
    residual = torch.cuda.memory_allocated() - before if gpu else 0
    # Then the engine's sync (its model asleep in host memory): the log-prob check below.
    t0 = time.perf_counter()
    engine.sync_weights(learner.named_parameters_for_sync())
    seconds = time.perf_counter() - t0
    learner.offload_states()
    engine.wake_up()

    new = batch_of(engine.generate(PROMPTS, N, MAX_TOKENS, seed=2))
    sampled = engine.score(new.prompt_ids, new.response_ids)
    learner.reload_states()
    lp, _ = learner.compute_logprobs(new)
    diff = max(
        (abs(a - b) for i, row in enumerate(sampled) for a, b in zip(row, lp[i, : len(row)].tolist(), strict=True)),
        default=0.0,
    )
    engine.close()
    return {
        "model_bytes": model_bytes,
        "largest_tensor_bytes": largest,
        "sync_extra_gpu_bytes": extra,
        "after_sync_gpu_bytes": residual,
        "sync_s": seconds,
        "max_logprob_diff": diff,
        "tokens_compared": sum(len(r) for r in new.response_ids),
        "ok": diff < LOGPROB_TOL and extra <= 2 * largest,
    }


def offload_check(model_dir: Path) -> dict:
    """ZeRO-3 states to host memory and back between two AdamW updates: the GPU memory freed, and the weights
    equal to a second learner's that made the same two updates without the round trip."""
    import torch

    from dapo import distributed as dist
    from dapo.learner import Learner, LossSpec, PolicyBatch, response_mask

    dist.init_distributed()
    g = torch.Generator().manual_seed(0)
    prompts = [torch.randint(10, 500, (int(n),), generator=g).tolist() for n in torch.randint(4, 24, (16,))]
    responses = [torch.randint(10, 500, (int(n),), generator=g).tolist() for n in torch.randint(4, 48, (16,))]
    batch = PolicyBatch(
        prompt_ids=prompts,
        response_ids=responses,
        advantages=torch.randn(16, generator=g),
        loss_mask=response_mask(responses),
        group_ids=torch.arange(16) // N,
    )
    weights, memory = [], {}
    for round_trip in (True, False):
        learner = Learner(str(model_dir), loss=LossSpec(), lr=1e-3, zero_stage=3, dtype="float32")
        batch.old_logp, _ = learner.compute_logprobs(batch)
        learner.update(batch)
        if round_trip:
            gpu = torch.cuda.is_available()
            memory["before_offload"] = torch.cuda.memory_allocated() if gpu else 0
            learner.offload_states()
            memory["offloaded"] = torch.cuda.memory_allocated() if gpu else 0
            learner.reload_states()
            memory["reloaded"] = torch.cuda.memory_allocated() if gpu else 0
        learner.update(batch)
        weights.append({n: t.float().cpu() for n, t in learner.named_parameters_for_sync()})
        del learner
    diff = max(float((weights[0][n] - weights[1][n]).abs().max()) for n in weights[0])
    return {
        **{f"gpu_bytes_{k}": v for k, v in memory.items()},
        "max_weight_diff": diff,
        "ok": diff <= 1e-6 and memory["offloaded"] < memory["before_offload"] / 2,
    }


def dapo_train(args: list[str], log: Path, env: dict[str, str] | None = None) -> tuple[int, str]:
    cmd = [sys.executable, "-c", "import sys; from dapo.cli import main; sys.exit(main())", "train", *args]
    with log.open("a") as f:
        # a DAPO_TEST_* fault is injected by the tests' fault module (tests/faults), found through PYTHONPATH
        env = {**os.environ, "PYTHONPATH": str(ROOT / "tests" / "faults"), **(env or {})}
        p = subprocess.run(cmd, cwd=ROOT, stdout=f, stderr=subprocess.STDOUT, env=env)
    return p.returncode, log.read_text()


def train_check(name: str, config: str, overrides: list[str], out: Path, world: Path) -> dict:
    run_dir = out / name
    common = [
        "-c",
        config,
        "-p",
        "tiny",
        "--run-dir",
        str(run_dir),
        "--progress",
        "log",
        f"model.path={world / 'model'}",
        "rollout.engine=hf",
        "trainer.total_steps=3",
        "trainer.checkpoint_every=1",
        "eval.every=0",
        "data.eval=tiny",
        f"tracking.uri=sqlite:///{out / 'mlflow.db'}",
        *overrides,
    ]
    log = out / f"{name}.log"
    t0 = time.perf_counter()
    # killed (SIGKILL) right after its second checkpoint, then the same command again must resume from it
    rc1, _ = dapo_train(common, log, env={"DAPO_TEST_KILL_AT": "checkpoint.published:2"})
    rc2, text = dapo_train(common, log)
    done_file = run_dir / "DONE.json"
    done = json.loads(done_file.read_text()) if done_file.is_file() else {}
    resumed = "at rollout step 2" in text
    return {
        "exit_codes": [rc1, rc2],
        "resumed_at_step_2": resumed,
        "final_step": done.get("step"),
        "grad_updates": done.get("grad_updates"),
        "nonfinite_skipped": done.get("nonfinite_skipped"),
        "eval_avg": done.get("eval", {}).get("eval/avg_at_1"),
        "seconds": time.perf_counter() - t0,
        "ok": rc1 == -9 and rc2 == 0 and resumed and done.get("step") == 3,
    }


def smoke_check(out: Path, overrides: list[str]) -> dict:
    """The one-GPU preset's row 05 through vLLM: killed after its second checkpoint, then resumed to the end."""
    from dapo.config import load_config

    run_dir = out / "smoke"
    common = [
        "-c", ROW05, "-p", SMOKE_PRESET, "--run-dir", str(run_dir), "--progress", "log",
        f"tracking.uri=sqlite:///{out / 'mlflow.db'}", *overrides,
    ]  # fmt: skip
    steps = load_config(ROW05, preset=SMOKE_PRESET, overrides=overrides).trainer.total_steps
    log = out / "smoke.log"
    t0 = time.perf_counter()
    rc1, _ = dapo_train(common, log, env={"DAPO_TEST_KILL_AT": "checkpoint.published:2"})
    rc2, text = dapo_train(common, log)
    done_file = run_dir / "DONE.json"
    done = json.loads(done_file.read_text()) if done_file.is_file() else {}
    avg = {k: v for k, v in done.get("eval", {}).items() if "avg_at" in k and "_ci_" not in k}
    resumed = "at rollout step 4" in text
    return {
        "exit_codes": [rc1, rc2],
        "resumed_at_step_4": resumed,
        "final_step": done.get("step"),
        "eval": avg,
        "seconds": time.perf_counter() - t0,
        "ok": rc1 == -9 and rc2 == 0 and resumed and done.get("step") == steps and bool(avg),
    }


def in_subprocess(kind: str, model: Path) -> dict:
    p = subprocess.run(
        [sys.executable, __file__, "--worker", f"{kind}:{model}"], cwd=ROOT, capture_output=True, text=True
    )
    line = next((x for x in p.stdout.splitlines() if x.startswith("RESULT ")), None)
    if p.returncode != 0 or line is None:
        return {"ok": False, "error": (p.stdout + p.stderr)[-3000:]}
    return json.loads(line[len("RESULT ") :])


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--out", type=Path, default=ROOT / "results" / "gpu_check")
    ap.add_argument("--world", type=Path, default=ROOT / "results" / "tiny_world", help="a built tiny world")
    ap.add_argument("--skip-train", action="store_true", help="only the weight-sync and offload checks")
    ap.add_argument("--train", nargs="*", choices=list(TRAIN_SETTINGS), help="these training settings only")
    ap.add_argument("--cpu", action="store_true", help="run on a CPU anyway (a trial of this script; no GPU figures)")
    ap.add_argument("--skip-smoke", action="store_true", help=f"not the {SMOKE_PRESET} run (vLLM, real model)")
    ap.add_argument("--smoke-overrides", nargs="*", default=[], help="section.key=value for that run (local copies)")
    ap.add_argument("--worker", help=argparse.SUPPRESS)
    args = ap.parse_args()
    if args.worker:  # one check in its own process (one process group per process)
        kind, model = args.worker.split(":", 1)
        check = {"sync": sync_check, "offload": offload_check}[kind]
        print("RESULT " + json.dumps(check(Path(model))))
        return 0

    import torch

    if not torch.cuda.is_available() and not args.cpu:
        print("gpu_check: no CUDA device (this check is for GPU machines; the CPU paths are the test suite's)")
        return 1
    from _common import random_qwen2

    args.out.mkdir(parents=True, exist_ok=True)
    import deepspeed
    import transformers

    report: dict = {
        "gpu": torch.cuda.get_device_name() if torch.cuda.is_available() else "none (--cpu)",
        "torch": torch.__version__,
        "cuda": torch.version.cuda,
        "nccl": ".".join(map(str, torch.cuda.nccl.version())) if torch.cuda.is_available() else None,
        "deepspeed": deepspeed.__version__,
        "transformers": transformers.__version__,
        "sync": {},
        "offload": {},
        "train": {},
        "smoke": {},
    }
    print(
        f"{report['gpu']}: torch {report['torch']}, CUDA {report['cuda']}, NCCL {report['nccl']}, "
        f"DeepSpeed {report['deepspeed']}, transformers {report['transformers']}"
    )
    for name, shape in SYNC_MODELS.items():
        path = random_qwen2(f"gpucheck-{name}", **shape)
        r = report["sync"][name] = in_subprocess("sync", path)
        if "error" in r:
            print(f"sync {name}: FAILED\n{r['error']}")
        else:
            mib = 2**20
            print(
                f"sync {name}: model {r['model_bytes'] / mib:.1f} MiB, largest tensor "
                f"{r['largest_tensor_bytes'] / mib:.1f} MiB, extra GPU memory while streaming "
                f"{r['sync_extra_gpu_bytes'] / mib:.1f} MiB ({r['sync_extra_gpu_bytes'] / r['model_bytes']:.3f} of "
                f"the model; {r['after_sync_gpu_bytes'] / mib:.1f} MiB still allocated after it), "
                f"{r['sync_s']:.2f} s; engine vs learner log-probs: max |diff| "
                f"{r['max_logprob_diff']:.2e} over {r['tokens_compared']} tokens -> {'ok' if r['ok'] else 'FAILED'}"
            )
    path = random_qwen2("gpucheck-offload", vocab=4096, hidden=512, layers=4, heads=8)
    r = report["offload"]["adamw-zero3"] = in_subprocess("offload", path)
    if "error" in r:
        print(f"offload: FAILED\n{r['error']}")
    else:
        mib = 2**20
        print(
            f"offload at ZeRO-3 (AdamW, fp32): learner's GPU memory {r['gpu_bytes_before_offload'] / mib:.1f} MiB, "
            f"offloaded {r['gpu_bytes_offloaded'] / mib:.1f} MiB, reloaded {r['gpu_bytes_reloaded'] / mib:.1f} MiB; "
            f"weights after the next update vs no round trip: max |diff| {r['max_weight_diff']:.2e} -> "
            f"{'ok' if r['ok'] else 'FAILED'}"
        )
    if not args.skip_train:
        for name, (config, overrides) in TRAIN_SETTINGS.items():
            if args.train and name not in args.train:
                continue
            r = report["train"][name] = train_check(name, config, overrides, args.out, args.world)
            print(
                f"train {name}: exit codes {r['exit_codes']}, resumed at step 2: {r['resumed_at_step_2']}, "
                f"final step {r['final_step']}, updates {r['grad_updates']}, non-finite skipped "
                f"{r['nonfinite_skipped']}, eval avg@1 {r['eval_avg']}, {r['seconds']:.0f} s -> "
                f"{'ok' if r['ok'] else 'FAILED (log: ' + str(args.out / (name + '.log')) + ')'}"
            )
    if not args.skip_smoke:
        import importlib.util

        if importlib.util.find_spec("vllm") is None:
            print(f"smoke {SMOKE_PRESET}: skipped (vLLM is not installed)")
        else:
            r = report["smoke"][SMOKE_PRESET] = smoke_check(args.out, args.smoke_overrides)
            print(
                f"smoke {SMOKE_PRESET} (vLLM, sleep mode, ZeRO-3 stream, kill and resume, evaluation): exit codes "
                f"{r['exit_codes']}, resumed at step 4: {r['resumed_at_step_4']}, final step {r['final_step']}, "
                f"eval {r['eval']}, {r['seconds']:.0f} s -> "
                f"{'ok' if r['ok'] else 'FAILED (log: ' + str(args.out / 'smoke.log') + ')'}"
            )
    (args.out / "gpu_check.json").write_text(json.dumps(report, indent=1))
    ok = all(r["ok"] for part in ("sync", "offload", "train", "smoke") for r in report[part].values())
    print("gpu_check:", "all checks passed" if ok else "FAILED")
    return 0 if ok else 1


if __name__ == "__main__":
    sys.exit(main())
