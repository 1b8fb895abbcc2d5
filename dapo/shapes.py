"""Shapes a plan is sized by: the model's (layers, heads, widths, vocabulary) and the GPU's (memory, bf16 peak,
memory bandwidth). Plain tables and readers; `dapo.plan`, `dapo.decode` and `dapo.cost` do the arithmetic."""

from __future__ import annotations

import dataclasses
import json
import re
from collections.abc import Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any


class PlanError(ValueError):
    """A plan that cannot run as configured; the message names the key to change."""


# ---------------------------------------------------------------------------------------------- the model
@dataclass(frozen=True)
class ModelShape:
    """A decoder-only transformer (Llama/Qwen2 family: RMSNorm, grouped-query attention, SwiGLU MLP)."""

    hidden: int
    layers: int
    heads: int
    kv_heads: int
    intermediate: int
    vocab: int
    tied: bool
    head_dim: int = 0  # 0: hidden // heads
    qkv_bias: bool = False
    max_positions: int = 0  # config.json's max_position_embeddings (0: unknown); model.config_overrides may raise it

    @property
    def d_head(self) -> int:
        return self.head_dim or self.hidden // self.heads

    @property
    def q_dim(self) -> int:
        return self.heads * self.d_head

    @property
    def kv_dim(self) -> int:
        return self.kv_heads * self.d_head

    @property
    def layer_params(self) -> int:
        attn = self.hidden * (self.q_dim + 2 * self.kv_dim) + self.q_dim * self.hidden
        bias = self.q_dim + 2 * self.kv_dim if self.qkv_bias else 0
        return attn + bias + 3 * self.hidden * self.intermediate + 2 * self.hidden  # + 2 RMSNorm weights

    @property
    def embedding_params(self) -> int:
        return self.vocab * self.hidden

    @property
    def params(self) -> int:
        heads_out = 1 if self.tied else 2  # the embedding, and an output head of its own when untied
        return self.layers * self.layer_params + heads_out * self.embedding_params + self.hidden

    @property
    def matmul_params(self) -> int:
        """Parameters that take part in a matmul per token: every layer and the output head (not the lookup)."""
        return self.layers * self.layer_params + self.embedding_params

    @property
    def largest_module_params(self) -> int:
        """What ZeRO-3 gathers at once: one decoder layer, or the embedding / output head when larger."""
        return max(self.layer_params, self.embedding_params)


# Shapes of known hub models (their config.json on huggingface.co/<id>), so a dry run needs no download.
# Overridable (`plan.model`). The Qwen2.5-Math models ship a 4,096-token context (max_position_embeddings), which
# the DAPO recipes raise to 32,768 (model.config_overrides); Qwen3-32B is here for docs/cost.md's NeMo RL check.
KNOWN_MODELS: dict[str, ModelShape] = {
    "Qwen/Qwen2.5-0.5B": ModelShape(896, 24, 14, 2, 4864, 151936, tied=True, qkv_bias=True, max_positions=32768),
    "Qwen/Qwen2.5-1.5B": ModelShape(1536, 28, 12, 2, 8960, 151936, tied=True, qkv_bias=True, max_positions=131072),
    "Qwen/Qwen2.5-Math-1.5B": ModelShape(1536, 28, 12, 2, 8960, 151936, tied=True, qkv_bias=True, max_positions=4096),
    "Qwen/Qwen2.5-7B": ModelShape(3584, 28, 28, 4, 18944, 152064, tied=False, qkv_bias=True, max_positions=131072),
    "Qwen/Qwen2.5-Math-7B": ModelShape(3584, 28, 28, 4, 18944, 152064, tied=False, qkv_bias=True, max_positions=4096),
    "Qwen/Qwen2.5-14B": ModelShape(5120, 48, 40, 8, 13824, 152064, tied=False, qkv_bias=True, max_positions=131072),
    "Qwen/Qwen2.5-32B": ModelShape(5120, 64, 40, 8, 27648, 152064, tied=False, qkv_bias=True, max_positions=131072),
    "Qwen/Qwen2.5-72B": ModelShape(8192, 80, 64, 8, 29568, 152064, tied=False, qkv_bias=True, max_positions=131072),
    "Qwen/Qwen3-32B": ModelShape(5120, 64, 64, 8, 25600, 151936, tied=False, head_dim=128, max_positions=40960),
}

# config.json key -> ModelShape field (the names `plan.model` overrides use too)
HF_KEYS = {
    "hidden_size": "hidden",
    "num_hidden_layers": "layers",
    "num_attention_heads": "heads",
    "num_key_value_heads": "kv_heads",
    "intermediate_size": "intermediate",
    "vocab_size": "vocab",
    "tie_word_embeddings": "tied",
    "head_dim": "head_dim",
    "attention_bias": "qkv_bias",
    "max_position_embeddings": "max_positions",
}


def shape_from_hf_config(cfg: Mapping[str, Any]) -> ModelShape:
    """A `ModelShape` from a Hugging Face config.json (dict). Missing optional keys take the Qwen2/Llama
    defaults: KV heads = heads, untied head, a q/k/v bias for qwen2 only."""
    required = ("hidden_size", "num_hidden_layers", "num_attention_heads", "intermediate_size", "vocab_size")
    missing = [k for k in required if k not in cfg]
    if missing:
        raise PlanError(f"config.json lacks {', '.join(missing)}")
    return ModelShape(
        hidden=int(cfg["hidden_size"]),
        layers=int(cfg["num_hidden_layers"]),
        heads=int(cfg["num_attention_heads"]),
        kv_heads=int(cfg.get("num_key_value_heads") or cfg["num_attention_heads"]),
        intermediate=int(cfg["intermediate_size"]),
        vocab=int(cfg["vocab_size"]),
        tied=bool(cfg.get("tie_word_embeddings", False)),
        head_dim=int(cfg.get("head_dim") or 0),
        qkv_bias=bool(cfg.get("attention_bias", cfg.get("model_type") == "qwen2")),
        max_positions=int(cfg.get("max_position_embeddings") or 0),
    )


def resolve_shape(
    model: str, local_dirs: tuple[Path, ...] = (), overrides: Mapping[str, Any] | None = None
) -> tuple[ModelShape | None, str]:
    """The model's shape and where it came from: the first `local_dirs` entry with a config.json, else the
    known-hub-model table; `overrides` (config.json key names) win over either. (None, why) when unknown."""
    overrides = dict(overrides or {})
    unknown = sorted(set(overrides) - set(HF_KEYS))
    if unknown:
        raise PlanError(f"plan.model: unknown key(s) {unknown}; keys are config.json names: {', '.join(HF_KEYS)}")
    local = next((f for f in (Path(d) / "config.json" for d in local_dirs) if f.is_file()), None)
    base: dict[str, Any] = {}
    source = ""
    if local is not None:
        base, source = json.loads(local.read_text()), str(local)
    elif model in KNOWN_MODELS:
        base = {k: getattr(KNOWN_MODELS[model], field) for k, field in HF_KEYS.items()}
        source = "the known-model table"
    elif not overrides:
        return None, f"shapes of {model!r} unknown (not a local directory, not in {sorted(KNOWN_MODELS)})"
    base.update(overrides)
    try:
        shape = shape_from_hf_config(base)
    except PlanError as e:
        return None, f"shapes of {model!r}: {e}; set them in plan.model"
    return shape, (f"{source} + plan.model" if overrides and source else source or "plan.model")


# ------------------------------------------------------------------------------------------------ the GPU
@dataclass(frozen=True)
class GpuSpec:
    memory_gib: float  # usable memory, about what nvidia-smi reports
    bf16_tflops: float  # dense bf16 tensor-core peak (datasheet)
    hbm_tb_s: float  # memory bandwidth (datasheet)


# SXM parts where there are several, and the H100's PCIe and NVL and the H200's NVL cards apart (lower peaks: 756,
# 835 and 835 TFLOP/s dense, half the datasheets' figures with sparsity). `a100` is the 40 GB card (the smaller, so
# no plan passes by mistake).
GPUS: dict[str, GpuSpec] = {
    "h100": GpuSpec(79.6, 989.0, 3.35),
    "h100-pcie": GpuSpec(79.6, 756.0, 2.0),
    "h100-nvl": GpuSpec(93.6, 835.0, 3.9),
    "h800": GpuSpec(79.6, 989.0, 3.35),
    "h200": GpuSpec(140.4, 989.0, 4.8),
    "h200-nvl": GpuSpec(140.4, 835.0, 4.8),
    "h20": GpuSpec(95.6, 148.0, 4.0),
    "a100": GpuSpec(40.0, 312.0, 1.555),
    "a100-40": GpuSpec(40.0, 312.0, 1.555),
    "a100-80": GpuSpec(80.0, 312.0, 2.039),
    "a800": GpuSpec(80.0, 312.0, 2.039),  # the A100 80GB's export variant: same memory, peak and bandwidth
    "l40s": GpuSpec(45.0, 362.0, 0.864),
    "b200": GpuSpec(179.1, 2250.0, 8.0),
}


def gpu_spec(name: str | None, overrides: Mapping[str, float | None] | None = None) -> GpuSpec | None:
    """The GPU's spec by SLURM model name (case-insensitive), each field overridable; None when unknown and
    not fully given."""
    o = {k: v for k, v in (overrides or {}).items() if v is not None}
    base = GPUS.get((name or "").lower())
    if base is None:
        return GpuSpec(**o) if {"memory_gib", "bf16_tflops", "hbm_tb_s"} <= set(o) else None
    return dataclasses.replace(base, **o)


def dtype_bytes(dtype: str) -> int:
    """Bytes per element of the learner and engine dtype (`auto` is bf16 on a GPU)."""
    return 4 if dtype == "float32" else 2


def vllm_batching_defaults(gpu_name: str | None, gpu_memory_gib: float) -> tuple[int, int]:
    """vLLM's default (max_num_batched_tokens, max_num_seqs) for its `LLM` class: 16384 and 1024 on GPUs of
    70 GiB and more other than A100s, 8192 and 256 otherwise (vllm/engine/arg_utils.py). The engine does not
    set them."""
    big = gpu_memory_gib >= 70 and "a100" not in (gpu_name or "").lower()
    return (16384, 1024) if big else (8192, 256)


def gpu_of_device(device_name: str) -> str | None:
    """The GPU table's key for a CUDA device as torch names it ("NVIDIA H100 80GB HBM3" -> h100, "NVIDIA H100 PCIe"
    -> h100-pcie, "NVIDIA H100 NVL" -> h100-nvl, "NVIDIA A100-SXM4-80GB" -> a100-80), or None: a variant's key where
    its word (or its size in GB) is in the name, else the family's, so that a card is not given the SXM part's peak."""
    words = set(re.split(r"[^a-z0-9]+", device_name.lower()))
    for key in sorted(GPUS, key=len, reverse=True):  # variants ("h100-pcie") before their family ("h100")
        family, _, variant = key.partition("-")
        if family in words and (not variant or variant in words or f"{variant}gb" in words):
            return key
    return None
