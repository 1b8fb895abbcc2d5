"""Loading a Hugging Face causal LM the way the learner and the engines both need it, and the attention that packed
micro-batches run through. Below both `learner` and `rollout`, so neither reaches into the other.

`load_causal_lm` applies `model.config_overrides`, refuses models whose logits are transformed after the head (the
chunked head computes plain logits), zeroes dropout where asked, and picks SDPA (`ATTENTION_PADDED`) or
`ATTENTION_PACKED`: `packed_attention`, where a packed row of whole sequences (`PackedRow`) attends causally to
itself only (and to a shared prompt, `trainer.packing: prompts`). No mask is built: on CUDA in 16 bits PyTorch's
varlen flash kernel (`torch.nn.attention.varlen.varlen_attn`, called as each torch release takes it), elsewhere
SDPA per sequence (exactly its L_i^2 scores). docs/architecture.md, "learner/", says how a micro-batch is laid out.
"""

from __future__ import annotations

import inspect
import math
import shutil
from collections import Counter
from collections.abc import Mapping
from dataclasses import dataclass
from functools import cache, lru_cache
from itertools import accumulate
from pathlib import Path
from typing import Any

import torch
import torch.nn.functional as F
from torch import Tensor, nn

ATTENTION_PADDED = "sdpa"  # transformers' own; the padded path (`trainer.packing: none`) and the HF engine
ATTENTION_PACKED = "dapo_packed"  # `packed_attention`, registered on first use

TOKENIZER_FILES = (
    "tokenizer.json",
    "tokenizer_config.json",
    "special_tokens_map.json",
    "vocab.json",
    "merges.txt",
    "added_tokens.json",
    "tokenizer.model",
    "chat_template.jinja",
)

# Config keys with which transformers 5.x causal LMs change the logits after the head (Gemma 2/3 tanh soft-cap,
# Cohere, Granite, HyperCLOVA X, MuseGlimmer scaling), each with the value that changes nothing.
LOGIT_TRANSFORM_KEYS: dict[str, float | None] = {
    "final_logit_softcapping": None,
    "logit_scale": 1.0,
    "logits_scaling": 1.0,
    "output_multiplier": 1.0,
}


# The oldest transformers the loading below works with (pyproject.toml's floor), read in each release's source and
# run: before 4.53 Qwen2 builds a 4D causal mask for every attention but FlashAttention 2 and SDPA, which
# `packed_attention` refuses; before 4.56 `from_pretrained` has no `dtype=` (it reaches the model's __init__: a
# TypeError at the first load).
TRANSFORMERS_FLOOR = "4.56"


def check_transformers(version: str) -> None:
    """Raise, naming the floor, if `version` of transformers is older than `TRANSFORMERS_FLOOR` (an environment
    assembled without pip's resolver, or a model path loaded elsewhere, can hold one)."""
    from packaging.version import Version

    if Version(version) < Version(TRANSFORMERS_FLOOR):
        raise RuntimeError(
            f"transformers {version} is older than {TRANSFORMERS_FLOOR}, the oldest the learner loads models with "
            f"(pyproject.toml): pip install 'transformers>={TRANSFORMERS_FLOOR}'"
        )


def resolve_dtype(dtype: str) -> torch.dtype:
    """ "auto" -> bfloat16 on a GPU that has it, else float32 (CPU runs and tests stay exact in float32)."""
    if dtype == "auto":
        return torch.bfloat16 if torch.cuda.is_available() and torch.cuda.is_bf16_supported() else torch.float32
    table = {"float32": torch.float32, "bfloat16": torch.bfloat16}
    if dtype not in table:
        raise ValueError(f"dtype must be auto, float32 or bfloat16, got {dtype!r}")
    return table[dtype]


def apply_config_overrides(config: Any, overrides: Mapping[str, Any] | None, where: str) -> Any:
    """Set `model.config_overrides` (config.json names) on a transformers config before the model is built (vLLM
    takes them as hf_overrides); a key the config lacks is refused, naming `where` (a typo would change nothing)."""
    unknown = sorted(k for k in (overrides or {}) if not hasattr(config, k))
    if unknown:
        raise ValueError(
            f"model.config_overrides: {where} has no config key(s) {unknown} (config.json names, e.g. "
            "max_position_embeddings)"
        )
    for key, value in (overrides or {}).items():
        setattr(config, key, value)
    return config


def check_plain_logits(config: Any, source: str) -> None:
    """Raise if the config (or a nested `text_config`) transforms the logits after the head: the chunked head
    (`dapo.algos.logprobs`) computes hidden @ head^T / temperature, so the ratios would silently be wrong."""
    configs = [("", config)]
    for sub in ("text_config", "decoder"):
        nested = getattr(config, sub, None)
        if nested is not None and not isinstance(nested, (str, bool, int, float, dict)):
            configs.append((f"{sub}.", nested))
    for prefix, cfg in configs:
        for key, neutral in LOGIT_TRANSFORM_KEYS.items():
            value = getattr(cfg, key, None)
            if value is not None and value != neutral:
                what = "soft-caps the logits with tanh" if "softcap" in key else "scales the logits"
                raise ValueError(
                    f"{source}: `{prefix}{key}` = {value!r} {what} after the output head; the learner's chunked "
                    "log-prob head computes plain logits (hidden @ head / temperature), so its log-probs would not "
                    "be those the rollout engine samples from. Models that transform their logits are not "
                    "supported: choose another model.path."
                )


def load_causal_lm(
    model_path: str,
    dtype: torch.dtype,
    config_overrides: Mapping[str, Any] | None = None,
    *,
    attention: str = ATTENTION_PADDED,
    no_dropout: bool = False,
) -> nn.Module:
    """The HF causal LM at `model_path` in `dtype` with `attention`, overrides applied and the logits checked before
    any weight loads; `no_dropout`: every dropout at 0 (the learner's: its first update must see ratio 1)."""
    import transformers
    from transformers import AutoConfig, AutoModelForCausalLM

    check_transformers(transformers.__version__)
    if attention == ATTENTION_PACKED:
        register_packed_attention()
    config = apply_config_overrides(AutoConfig.from_pretrained(model_path), config_overrides, model_path)
    check_plain_logits(config, f"{model_path}/config.json")
    if no_dropout:
        for key, value in config.to_dict().items():
            if "dropout" in key and isinstance(value, float):
                setattr(config, key, 0.0)
    return AutoModelForCausalLM.from_pretrained(model_path, config=config, dtype=dtype, attn_implementation=attention)


def model_hidden_size(model_path: str) -> int | None:
    """The config's hidden size (ZeRO-3's buckets are sized by it), or None."""
    from transformers import AutoConfig

    config = AutoConfig.from_pretrained(model_path)
    config = getattr(config, "text_config", None) or config
    return getattr(config, "hidden_size", None)


def copy_tokenizer_files(src: str | Path, dst: Path) -> None:
    """Copy the tokenizer files found in a local model directory `src` to `dst` (a hub id: nothing to copy)."""
    src = Path(src)
    for name in TOKENIZER_FILES:
        if (src / name).is_file():
            shutil.copy2(src / name, dst / name)


# ---------------------------------------------------------------------------------------------- packed attention
FLASH_DTYPES = (torch.bfloat16, torch.float16)  # what PyTorch's flash kernels take
# Layer calls of `packed_attention` in this process by the path they took ("varlen": the flash kernel; "sdpa": SDPA
# per sequence): what the GPU scripts report as the kernel used, not merely importable.
ATTENTION_CALLS: Counter[str] = Counter()


@dataclass(frozen=True)
class PackedRow:
    """Where one packed row's sequences sit: `bounds` 0 = b_0 < ... < b_D = L (sequence i is b_i:b_{i+1});
    `prefixes`, per sequence, the (start, end) of an earlier part it also attends to wholly (its shared prompt under
    `trainer.packing: prompts`; (0, 0): none), or None when no sequence has one. The model takes it as the forward
    kwarg `packed_row`, which transformers hands to every attention layer."""

    bounds: tuple[int, ...]
    prefixes: tuple[tuple[int, int], ...] | None = None

    def key_spans(self) -> list[tuple[tuple[int, int], tuple[int, int]]]:
        """Per sequence, the row positions its keys come from, in order: its prefix (lo, hi), (0, 0) if none, then
        itself (start, end)."""
        b = self.bounds
        prefixes = self.prefixes or [(0, 0)] * (len(b) - 1)
        return [(pre, (start, end)) for pre, start, end in zip(prefixes, b, b[1:], strict=False)]


def packed_attention(
    module: nn.Module,
    query: Tensor,
    key: Tensor,
    value: Tensor,
    attention_mask: Tensor | None,
    dropout: float = 0.0,
    scaling: float | None = None,
    sliding_window: int | None = None,
    softcap: float | None = None,
    packed_row: PackedRow | None = None,
    **kwargs: Any,
) -> tuple[Tensor, None]:
    """Attention over packed rows, for transformers' `AttentionInterface` (query [B, H_q, L, D], key and value
    [B, H_kv, L, D], rotary embeddings applied; returns [B, L, H_q, D]). With `packed_row` (B = 1) each sequence
    attends causally to itself (and wholly to its prefix); without, each of the B rows is one whole sequence. The
    row alone says where the sequences are: no other kwarg is read."""
    if attention_mask is not None or sliding_window is not None or softcap is not None or dropout:
        what = "a mask" if attention_mask is not None else "sliding windows, soft-capping or attention dropout"
        raise ValueError(
            f"packed attention was given {what}, which it does not implement: set trainer.packing: none for this model"
        )
    if packed_row is not None and query.shape[0] != 1:
        raise ValueError(f"a packed micro-batch is one row; got {query.shape[0]}")
    if packed_row is None:
        if query.shape[0] > 1:
            return torch.cat([packed_attention(module, q[None], k[None], v[None], None, scaling=scaling)[0]
                              for q, k, v in zip(query, key, value, strict=True)]), None  # fmt: skip
        packed_row = PackedRow((0, query.shape[2]))
    kernel = flash_kernel_for(query)
    if kernel is not None:
        ATTENTION_CALLS["varlen"] += 1
        return _flash_varlen(kernel, query, key, value, scaling, packed_row), None
    ATTENTION_CALLS["sdpa"] += 1
    out = _per_sequence(query, key, value, scaling, packed_row, gpu=_on_cuda(query))
    return out.transpose(1, 2).contiguous(), None


def _on_cuda(t: Tensor) -> bool:
    """Whether `t` is on a CUDA device: the one device test of the CUDA branch, so that tests can take that branch on
    a CPU by replacing it."""
    return t.is_cuda


def flash_kernel_for(query: Tensor) -> Any:
    """PyTorch's varlen flash kernel where it can take `query` (on CUDA, in 16 bits, on a torch that has it), else
    None: then SDPA per sequence."""
    return varlen_kernel() if _on_cuda(query) and query.dtype in FLASH_DTYPES else None


def _per_sequence(
    query: Tensor, key: Tensor, value: Tensor, scaling: float | None, row: PackedRow, gpu: bool = False
) -> Tensor:
    """[1, H_q, L, D]: each sequence through SDPA alone (causal; a prefix wholly visible). The row is split once (a
    slice per sequence would make each backward fill a whole-row gradient: quadratic in the sequences). On a GPU a
    masked call gets the query's heads repeated into key and value: CUDA's SDPA takes grouped heads only in kernels
    that refuse a mask (transformers' `use_gqa_in_sdpa` repeats them for the same reason), and would otherwise fall
    to the math kernel, which builds the H_q x n x (p + n) scores; with equal heads the memory-efficient kernel takes
    the mask."""
    gqa = query.shape[1] != key.shape[1]
    b = row.bounds
    sizes = [end - start for start, end in zip(b, b[1:], strict=False)]
    qs, ks, vs = (t.split(sizes, dim=2) for t in (query, key, value))
    starts = {start: i for i, start in enumerate(b[:-1])}
    outs = []
    for i, (q, k, v) in enumerate(zip(qs, ks, vs, strict=True)):
        lo, hi = row.prefixes[i] if row.prefixes is not None else (0, 0)
        if hi > lo:  # a response behind its shared prompt (a sequence of the row): the prompt wholly, then itself
            j = starts[lo]
            k, v = torch.cat([ks[j], k], dim=2), torch.cat([vs[j], v], dim=2)
            n = sizes[i]
            mask = torch.ones(n, hi - lo + n, dtype=torch.bool, device=query.device)
            mask[:, hi - lo :] = torch.ones(n, n, dtype=torch.bool, device=query.device).tril()
            if gpu and gqa:
                k, v = (t.repeat_interleave(q.shape[1] // t.shape[1], dim=1) for t in (k, v))
            outs.append(F.scaled_dot_product_attention(q, k, v, attn_mask=mask, scale=scaling,
                                                       enable_gqa=gqa and not gpu))  # fmt: skip
        else:
            outs.append(F.scaled_dot_product_attention(q, k, v, is_causal=True, scale=scaling, enable_gqa=gqa))
    return torch.cat(outs, dim=2)


@dataclass(frozen=True)
class VarlenCall:
    """How one torch release's `varlen_attn` is called for causal packed attention: its keyword arguments, each KV
    head repeated `repeat_kv` times first (1: not), and the query multiplied by `query_scale` first (1: not)."""

    kwargs: Mapping[str, Any]
    repeat_kv: int = 1
    query_scale: float = 1.0


def varlen_call(
    params: frozenset[str], head_dim: int, scaling: float | None, heads_q: int, heads_kv: int
) -> VarlenCall:
    """The call for a `varlen_attn` whose parameters are `params`, as each release's torch/nn/attention/varlen.py
    defines it (2.9 has no such module):

    - 2.10: `(query, key, value, cu_seq_q, cu_seq_k, max_q, max_k, is_causal=False, return_aux=None)`: causal by
      `is_causal`; no `scale` (the kernel's 1/sqrt(D): another scaling multiplies the query instead); no grouped
      heads (key and value must have the query's).
    - 2.11: keyword-only `return_aux`, `scale`, `window_size`: causal by `window_size=(-1, 0)` (compared as that
      tuple); no grouped heads.
    - 2.13, 2.14: also `enable_gqa` (and the inference-only `seqused_k`, `block_table`, `num_splits`).

    Repeated heads follow transformers' `repeat_kv` order: query head h reads KV head h // (H_q / H_kv)."""
    kwargs: dict[str, Any] = {"is_causal": True} if "is_causal" in params else {"window_size": (-1, 0)}
    query_scale = 1.0
    if scaling is not None:
        if "scale" in params:
            kwargs["scale"] = scaling
        elif not math.isclose(scaling * math.sqrt(head_dim), 1.0, rel_tol=1e-12):  # 1/sqrt(D) itself: nothing to do
            query_scale = scaling * math.sqrt(head_dim)
    repeat = 1
    if heads_q != heads_kv:
        if "enable_gqa" in params:
            kwargs["enable_gqa"] = True
        else:
            repeat = heads_q // heads_kv
    return VarlenCall(kwargs, repeat, query_scale)


def _flash_varlen(
    kernel: Any, query: Tensor, key: Tensor, value: Tensor, scaling: float | None, row: PackedRow
) -> Tensor:
    """[1, L, H_q, D] through PyTorch's varlen flash kernel: each sequence's queries against its keys, its prefix's
    tokens gathered before its own (`trainer.packing: prompts`). The kernel's causal mask is aligned to the bottom
    right where a sequence has more keys than queries (FlashAttention 2's convention, on which
    `torch.nn.attention.bias.causal_lower_right` relies too): query t of a response sees the whole prefix and the
    response up to t. No mask and no score matrix is built."""
    cu_q, cu_k, keys, max_q, max_k = _varlen_layout(row, query.device)
    q, k, v = (t[0].transpose(0, 1) for t in (query, key, value))  # [L, H, D]
    if keys is not None:
        k, v = k.index_select(0, keys), v.index_select(0, keys)
    call = varlen_call(_kernel_params(kernel), query.shape[-1], scaling, q.shape[1], k.shape[1])
    if call.repeat_kv > 1:
        k, v = (t.repeat_interleave(call.repeat_kv, dim=1) for t in (k, v))
    if call.query_scale != 1.0:
        q = q * call.query_scale
    q, k, v = (t.contiguous() for t in (q, k, v))
    return kernel(q, k, v, cu_q, cu_k, max_q, max_k, **call.kwargs)[None]


@lru_cache(maxsize=4)
def _varlen_layout(row: PackedRow, device: torch.device) -> tuple[Tensor, Tensor, Tensor | None, int, int]:
    """The kernel's int32 boundaries of queries and keys on `device`, the row positions of the keys (None: the row
    itself) and the longest of each: built once per row, not in every layer."""
    spans = row.key_spans()
    q_sizes = [end - start for _, (start, end) in spans]
    k_sizes = [hi - lo + end - start for (lo, hi), (start, end) in spans]
    cu_q, cu_k = (torch.tensor([0, *accumulate(s)], dtype=torch.int32, device=device) for s in (q_sizes, k_sizes))
    keys = None
    if any(hi > lo for (lo, hi), _ in spans):
        keys = torch.cat([torch.arange(a, b) for pre, own in spans for a, b in (pre, own) if b > a]).to(device)
    return cu_q, cu_k, keys, max(q_sizes), max(k_sizes)


@cache
def varlen_kernel() -> Any:
    """PyTorch's `varlen_attn` where this build has it (torch 2.10 and later; CUDA kernels), else None."""
    try:
        from torch.nn.attention.varlen import varlen_attn
    except ImportError:
        return None
    return varlen_attn


@cache
def _kernel_params(kernel: Any) -> frozenset[str]:
    return frozenset(inspect.signature(kernel).parameters)


@cache
def register_packed_attention() -> None:
    """Register `ATTENTION_PACKED` for `attn_implementation=`; with no mask function, transformers builds no mask."""
    from transformers import AttentionInterface

    AttentionInterface.register(ATTENTION_PACKED, packed_attention)
