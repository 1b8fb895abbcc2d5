"""dapo.plan: the per-GPU memory budget and the cost estimate, checked against numbers worked out by hand for a
small made-up architecture (the arithmetic is in the comments), and the refusals a user sees."""

from __future__ import annotations

import dataclasses
import json

import pytest

from dapo.plan import (
    GIB,
    CostInputs,
    MemoryInputs,
    evals_per_run,
    expected_gen_batches,
    jobs_needed,
    memory_budget,
    plan_problems,
    render_costs,
    render_memory,
    row_cost,
)
from dapo.shapes import KNOWN_MODELS, ModelShape, PlanError, gpu_spec, resolve_shape

# hidden 64, 2 layers, 4 heads of 16 (q 64), 2 KV heads (kv 32), MLP 128, vocabulary 1000, untied head
TOY = ModelShape(hidden=64, layers=2, heads=4, kv_heads=2, intermediate=128, vocab=1000, tied=False)
# one layer: q, k, v 64 x (64 + 32 + 32) = 8,192; o 64 x 64 = 4,096; MLP 3 x 64 x 128 = 24,576; norms 2 x 64
TOY_LAYER = 8192 + 4096 + 24576 + 128  # 36,992
TOY_PARAMS = 2 * TOY_LAYER + 2 * 64_000 + 64  # layers, embedding and head (1000 x 64 each), final norm: 202,048


def toy_memory(**kw) -> MemoryInputs:
    base = dict(
        shape=TOY,
        dtype_bytes=2,
        world_size=4,
        tensor_parallel=2,
        zero_stage=3,
        gpu_memory_gib=1.0,
        gpu_memory_utilization=0.5,
        max_model_len=256,
        mean_seq_tokens=100,
        micro_batch_tokens=512,
        logprob_chunk_tokens=128,
        gradient_checkpointing=True,
        sleep_mode=True,
        sleep_level=2,
        allowance_gib=0.0,
        vllm_batched_tokens=256,
        vllm_max_seqs=8,
    )
    return MemoryInputs(**{**base, **kw})


def lines(phase) -> dict[str, float]:
    """label -> bytes"""
    return {x.label: round(x.gib * GIB) for x in phase}


def test_toy_shape_counts_parameters_by_hand():
    assert TOY.layer_params == TOY_LAYER
    assert TOY.params == TOY_PARAMS == 202_048
    assert TOY.matmul_params == 2 * TOY_LAYER + 64_000  # the head is a matmul, the embedding a lookup
    assert TOY.largest_module_params == 64_000
    # the paper's model: the published 32.8B parameters
    assert KNOWN_MODELS["Qwen/Qwen2.5-32B"].params == pytest.approx(32.76e9, rel=1e-3)


def test_generation_phase_by_hand():
    b = memory_budget(toy_memory())
    gen = lines(b.generation)
    assert gen["vLLM share"] == GIB // 2  # 0.5 x 1 GiB
    assert gen["weights"] == 202_048  # 202,048 params x 2 B / TP 2
    # profile run: 256 tokens x 2 B x (2 x 64 + (64 + 2 x 32 + 3 x 128) / 2) + 8 seqs x 1000 x 4 B x 2
    assert gen["activations"] == 256 * 2 * 384 + 64_000
    assert gen["KV cache"] == GIB // 2 - 202_048 - 260_608
    # per token per GPU: 2 layers x (2 KV heads / TP 2) x 16 x 2 (K, V) x 2 B = 128 B
    assert b.kv_bytes_per_token_per_gpu == 128
    assert b.kv_tokens_per_replica == (GIB // 2 - 202_048 - 260_608) // 128 == 4_190_689
    assert gen["learner states"] == 202_048 * (2 + 2 + 12) // 4  # ZeRO-3 over 4 GPUs
    assert gen["weight sync"] == 64_000 * 2  # the embedding, the largest module, gathered
    assert round(b.generation_gib * GIB) == GIB // 2 + 808_192 + 128_000


def test_training_phase_by_hand():
    b = memory_budget(toy_memory())
    tr = lines(b.training)
    assert tr["vLLM (asleep)"] == 0
    assert tr["learner states"] == 808_192
    # the largest module and its full gradient, and a reduce bucket (the whole model here): (2 x 64,000 + 202,048) x 2 B
    assert tr["ZeRO-3 working set"] == 660_096
    # per token and layer: 8H + 2bH + 4b(Hq + Hkv) + 4bI = 512 + 256 + 768 + 1024 = 2,560 B;
    # checkpoints 2 x 512 x 64 x 2 + one layer 512 x 2,560 + MLP gradients 2 x 512 x 128 x 2
    assert tr["activations"] == 131_072 + 1_310_720 + 262_144
    # hidden states and their gradient 2 x 512 x 64 x 2 + chunks 3 x 128 x 1000 x 4 + the head's fp32 gradient
    assert tr["log-prob head"] == 131_072 + 1_536_000 + 256_000
    assert round(b.training_gib * GIB) == 5_095_296
    assert b.peak_phase == "generation" and plan_problems(b) == []
    assert "fits" in render_memory(b) and "DOES NOT FIT" not in render_memory(b)


def test_without_sleep_the_engine_stays_in_the_training_phase():
    b = memory_budget(toy_memory(sleep_mode=False))
    assert lines(b.training)["vLLM (awake)"] == GIB // 2


def test_sleep_level_one_keeps_the_weights_in_host_memory():
    assert memory_budget(toy_memory()).notes == ()
    (note,) = memory_budget(toy_memory(sleep_level=1)).notes
    assert "host memory" in note
    # the GPU budget is the same at both levels: each frees the weights and the KV cache
    assert memory_budget(toy_memory(sleep_level=1)).training_gib == memory_budget(toy_memory()).training_gib


def test_zero_stages_shard_what_they_say():
    def states(stage: int) -> int:
        return lines(memory_budget(toy_memory(zero_stage=stage)).training)["learner states"]

    assert states(0) == 202_048 * 16
    assert states(1) == 202_048 * (2 + 2) + 202_048 * 12 // 4
    assert states(2) == 202_048 * 2 + 202_048 * (2 + 12) // 4
    assert states(3) == 202_048 * 16 // 4


def test_a_micro_batch_too_large_is_refused_naming_the_key_and_a_value_that_fits():
    b = memory_budget(toy_memory(micro_batch_tokens=400_000))
    problems = plan_problems(b)
    assert len(problems) == 1 and "trainer.micro_batch_tokens" in problems[0]
    # training bytes = 3,260,288 + 3,584 x tokens (states, working set, chunks and head gradient; then 256 + 2,560 +
    # 512 + 256 B per token): the largest that fits 1 GiB is (1 GiB - 3,260,288) / 3,584 = 298,683 tokens
    assert "at most 298,683" in problems[0]
    ok = memory_budget(toy_memory(micro_batch_tokens=298_683))
    assert ok.training_gib <= 1.0 and plan_problems(ok) == []
    assert plan_problems(memory_budget(toy_memory(micro_batch_tokens=298_684))) != []
    assert "DOES NOT FIT" in render_memory(b)


def test_a_vllm_share_too_large_is_refused_with_the_largest_that_fits():
    # beside vLLM's share: the learner's states 808,192 B, the sync 128,000 B and a 0.1 GiB allowance
    b = memory_budget(toy_memory(gpu_memory_utilization=0.95, allowance_gib=0.1))
    (problem,) = plan_problems(b)
    assert "rollout.gpu_memory_utilization (0.95) to at most 0.89" in problem
    assert plan_problems(memory_budget(toy_memory(gpu_memory_utilization=0.89, allowance_gib=0.1))) == []


def test_a_kv_cache_without_room_for_one_sequence_is_refused():
    (problem,) = plan_problems(memory_budget(toy_memory(max_model_len=5_000_000)))
    assert "4,190,689 tokens per replica" in problem and "rollout.gpu_memory_utilization" in problem
    (problem,) = plan_problems(memory_budget(toy_memory(gpu_memory_utilization=0.0001)))
    assert "does not hold its weights" in problem and "rollout.tensor_parallel_size" in problem


def test_the_paper_preset_fits_an_h100_and_not_an_a100_40gb():
    """Qwen2.5-32B on 128 GPUs, TP 4, ZeRO-3, 45,056-token micro-batches, vLLM at 0.8: the preset's numbers."""
    m = MemoryInputs(
        shape=KNOWN_MODELS["Qwen/Qwen2.5-32B"],
        dtype_bytes=2,
        world_size=128,
        tensor_parallel=4,
        zero_stage=3,
        gpu_memory_gib=gpu_spec("H100").memory_gib,
        gpu_memory_utilization=0.8,
        max_model_len=2048 + 20480,
        mean_seq_tokens=4200,
        micro_batch_tokens=45056,
        logprob_chunk_tokens=256,
        gradient_checkpointing=True,
        sleep_mode=True,
        sleep_level=2,
        allowance_gib=4.0,
        vllm_batched_tokens=16384,
        vllm_max_seqs=1024,
    )
    b = memory_budget(m)
    # KV per token per GPU: 64 layers x 2 KV heads x 128 x 2 x 2 B = 64 KiB; a replica holds many full sequences
    assert b.kv_bytes_per_token_per_gpu == 64 * 1024
    assert b.kv_tokens_per_replica // m.max_model_len >= 30
    assert plan_problems(b) == []
    small = memory_budget(dataclasses.replace(m, gpu_memory_gib=gpu_spec("a100").memory_gib))
    assert any("trainer.micro_batch_tokens" in p for p in plan_problems(small))


# ------------------------------------------------------------------------------------------------ cost
def test_expected_generation_batches():
    # one kept group needed, one prompt a batch, kept with probability 1/2: a geometric number of batches, mean 2
    assert expected_gen_batches(1, 1, 0.5, cap=0) == pytest.approx(2.0)
    # two needed: negative binomial, mean 2 / p
    assert expected_gen_batches(2, 1, 0.5, cap=0) == pytest.approx(4.0)
    # the paper's batch: 512 groups from batches of 1536 prompts
    assert expected_gen_batches(512, 1536, 0.5, cap=10) == pytest.approx(1.0)  # 768 kept on average: one batch
    assert expected_gen_batches(512, 1536, 0.25, cap=10) == pytest.approx(2.0)  # 384, then 768: two
    assert expected_gen_batches(512, 1536, 0.01, cap=10) == pytest.approx(10.0)  # the cap
    with pytest.raises(PlanError, match="max_num_gen_batches"):
        expected_gen_batches(512, 1536, 0.0, cap=0)


def test_evals_per_run_follow_the_trainer():
    assert evals_per_run(400, 5) == 81  # before step 1, then every 5 steps
    assert evals_per_run(7, 5) == 3  # 0, 5, and the end
    assert evals_per_run(10, 0) == 1  # the end only


def toy_cost(**kw) -> CostInputs:
    base = dict(
        shape=TOY,
        dtype_bytes=2,
        world_size=8,
        tensor_parallel=2,
        gpu_bf16_tflops=1e-6,  # 1 MFLOP/s per GPU, so the toy's training takes seconds
        gpu_hbm_tb_s=1e-9,  # 1 KB/s, so the decode floor shows
        prompts_per_step=4,
        n=2,
        mean_prompt_tokens=10,
        mean_response_tokens=30,
        max_response_tokens=64,
        dynamic_sampling=False,
        gen_batch_prompts=6,
        max_gen_batches=0,
        informative_fraction=0.5,
        pack_prompts=False,
        gradient_checkpointing=True,
        reference_forward=False,
        total_steps=10,
        eval_every=5,
        eval_problems=3,
        eval_n=2,
        eval_mean_response_tokens=30,
        eval_max_tokens=64,
        gen_tokens_per_s_per_gpu=0.5,
        train_mfu=0.5,
        step_overhead_s=1.0,
    )
    return CostInputs(**{**base, **kw})


def test_cost_arithmetic_by_hand():
    c = row_cost(toy_cost())
    assert c.gen_batches == 1 and c.gen_prompts == 4
    assert c.gen_tokens == 4 * 2 * 30  # 240 response tokens
    # the decode floor: 64 steps x the GPU's weight shard 202,048 x 2 B / TP 2 at 1 KB/s = 12,931 s
    assert c.gen_floor_s == pytest.approx(64 * 202_048 / 1e3)
    assert c.gen_s == pytest.approx(max(240 / (8 * 0.5), 64 * 202.048))  # the floor binds: 12,931 s
    assert c.train_tokens == 4 * 2 * (10 + 30)  # 320
    # forward per token: 2 x 137,984 matmul params + 4 x 2 layers x 64 x 20 (mean context) = 286,208 FLOPs;
    # 5 passes (forward, backward 2x, recompute, old log-probs), over 8 GPUs at 0.5 x 1 MFLOP/s
    assert c.train_s == pytest.approx(320 * 5 * 286_208 / (8 * 1e6 * 0.5))
    assert c.step_s == pytest.approx(c.gen_s + c.train_s + 1.0)
    assert c.evals == 3 and c.eval_s == pytest.approx(64 * 202.048)  # 180 tokens would take 45 s: the floor
    assert c.hours == pytest.approx((10 * c.step_s + 3 * c.eval_s) / 3600)
    assert c.gpu_hours == pytest.approx(8 * c.hours)


def test_cost_of_dynamic_sampling_packing_and_a_reference_model():
    fast = dict(gpu_hbm_tb_s=1.0)  # no decode floor
    plain = row_cost(toy_cost(**fast))
    ds = row_cost(toy_cost(dynamic_sampling=True, informative_fraction=0.25, **fast))
    # 4 groups needed from batches of 6 prompts kept with p 1/4: E[K] = sum_k P(Bin(6k, 1/4) < 4)
    assert ds.gen_batches == pytest.approx(expected_gen_batches(4, 6, 0.25, 0))
    assert ds.gen_tokens == pytest.approx(ds.gen_batches * 6 * 2 * 30)
    assert ds.train_tokens == plain.train_tokens  # the kept groups train, the rest only cost generation
    packed = row_cost(toy_cost(pack_prompts=True, **fast))
    assert packed.train_tokens == 4 * (10 + 2 * 30)  # one prompt per group
    with_ref = row_cost(toy_cost(reference_forward=True, **fast))
    assert with_ref.train_s == pytest.approx(plain.train_s * 6 / 5)


def test_a_row_that_cannot_finish_within_its_resubmissions_is_warned_about():
    assert jobs_needed(67.8, limit_h=48, restart_h=1 / 6, step_h=0.16) == 2
    # 10 steps of an hour (generation and training take no time at these throughputs)
    c = toy_cost(gpu_hbm_tb_s=1.0, gen_tokens_per_s_per_gpu=1e9, gpu_bf16_tflops=1.0, step_overhead_s=3600.0)
    text, warnings = render_costs({"00_naive_grpo": c}, seeds=1, limit_h=4.5, max_resubmits=1, restart_h=0.5)
    # each 4.5 h job does 4.5 - 0.5 (start-up) - 1 (the step cut off) = 3 h of work: 10 h need 4 jobs, 1 + 1 allowed
    assert "00_naive_grpo" in text
    (w,) = warnings
    assert "00_naive_grpo" in w and "4 jobs" in w and "max_resubmits" in w and "resources.train.runtime_min" in w
    _, none = render_costs({"00_naive_grpo": c}, seeds=1, limit_h=4.5, max_resubmits=3, restart_h=0.5)
    assert none == []


# ------------------------------------------------------------------------------------- shapes and GPUs
def test_shapes_come_from_a_local_config_json_with_overrides(tmp_path):
    cfg = {
        "model_type": "qwen2",
        "hidden_size": 64,
        "num_hidden_layers": 2,
        "num_attention_heads": 4,
        "num_key_value_heads": 2,
        "intermediate_size": 128,
        "vocab_size": 1000,
    }
    (tmp_path / "config.json").write_text(json.dumps(cfg))
    shape, source = resolve_shape("tiny", (tmp_path,))
    assert shape == dataclasses.replace(TOY, qkv_bias=True) and source.endswith("config.json")
    shape, _ = resolve_shape("tiny", (tmp_path,), {"num_hidden_layers": 4})
    assert shape.layers == 4
    assert resolve_shape("Qwen/Qwen2.5-32B")[0] == KNOWN_MODELS["Qwen/Qwen2.5-32B"]
    shape, why = resolve_shape("org/unknown-model")
    assert shape is None and "unknown" in why
    with pytest.raises(PlanError, match="hidden_sise"):
        resolve_shape("Qwen/Qwen2.5-32B", (), {"hidden_sise": 1})


def test_gpu_specs_by_slurm_name():
    assert gpu_spec("H100").memory_gib == pytest.approx(79.6)
    assert gpu_spec("h100", {"memory_gib": 94.0, "bf16_tflops": None}).memory_gib == 94.0
    assert gpu_spec("mi300x") is None
    assert gpu_spec("mi300x", {"memory_gib": 192, "bf16_tflops": 1307, "hbm_tb_s": 5.3}).memory_gib == 192
