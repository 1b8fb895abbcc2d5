"""The model side of the learner: loading a Hugging Face causal LM for RL, and the module DeepSpeed wraps.

`PolicyModule.forward` returns per-token log-probs (and entropies) of given target tokens from the final hidden
states and the output head, through `dapo.algos.logprobs.chunked_logprobs_entropy`, so [T, V] logits never exist
at once (20480 tokens x 152K vocabulary would be 12 GiB in float32).
"""

from __future__ import annotations

import importlib
import importlib.util
import logging
import shutil
from collections.abc import Mapping
from pathlib import Path
from typing import Any

import torch
from torch import Tensor, nn

from dapo.algos.logprobs import chunked_logprobs_entropy

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


class PolicyModule(nn.Module):
    """The causal LM as DeepSpeed sees it. `lm` is the Hugging Face model; its parameter names are the HF ones."""

    def __init__(self, lm: nn.Module) -> None:
        super().__init__()
        self.lm = lm

    def head_weight(self) -> nn.Parameter:
        head = self.lm.get_output_embeddings()
        if getattr(head, "bias", None) is not None:
            raise ValueError("an output head with a bias is not supported (chunked log-probs use the weight only)")
        return head.weight

    def forward(
        self,
        input_ids: Tensor,
        attention_mask: Tensor,
        positions: Tensor,
        targets: Tensor,
        temperature: float,
        chunk_size: int,
        with_entropy: bool,
        position_ids: Tensor | None = None,
    ) -> tuple[Tensor, Tensor | None]:
        """input_ids, attention_mask [B, L]; positions [T] flat indices into B*L; targets [T] ->
        (logp [T], entropy [T] or None), logits divided by `temperature` as when sampling.
        A packed micro-batch passes a [B, 1, L, L] bool mask and position_ids [B, L] (`collate_packed`)."""
        if attention_mask.dim() == 4:
            # transformers passes a 4D mask through as is; additive, so eager attention reads it too.
            dtype = self.head_weight().dtype
            attention_mask = torch.zeros(attention_mask.shape, dtype=dtype, device=attention_mask.device).masked_fill_(
                ~attention_mask, torch.finfo(dtype).min
            )
        out = self.lm.base_model(
            input_ids=input_ids, attention_mask=attention_mask, position_ids=position_ids, use_cache=False
        )
        hidden = out.last_hidden_state
        hidden = hidden.reshape(-1, hidden.shape[-1]).index_select(0, positions)
        return chunked_logprobs_entropy(hidden, self.head_weight(), targets, chunk_size, temperature, with_entropy)


# Config keys with which transformers' causal LMs change the logits after the output head (transformers 5.x:
# Gemma 2/3 soft-cap with tanh, Cohere multiplies, Granite divides and HyperCLOVA X multiplies by
# `logits_scaling`, MuseGlimmer multiplies by `output_multiplier`), each with the value that changes nothing.
LOGIT_TRANSFORM_KEYS: dict[str, float | None] = {
    "final_logit_softcapping": None,
    "logit_scale": 1.0,
    "logits_scaling": 1.0,
    "output_multiplier": 1.0,
}


def check_plain_logits(config: Any, source: str) -> None:
    """Raise if the model's config transforms the logits after the output head.

    The chunked head (`dapo.algos.logprobs`) computes logits as hidden @ head^T / temperature; a model that
    soft-caps or scales them would get log-probs of another distribution than the one the engine samples from,
    and the ratio to the old policy would be wrong without any error. Nested configs (`text_config`) count too.
    """
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


PACKABLE_ATTENTION = ("sdpa", "eager")  # attention implementations that honour a custom 4D mask


def check_packable(lm: nn.Module) -> None:
    """Raise if the model's attention ignores custom 4D masks (flash-attn 2 does), which packing needs."""
    impl = getattr(lm.config, "_attn_implementation", None)
    if impl not in PACKABLE_ATTENTION:
        raise ValueError(
            f"trainer.pack_prompts needs attention that takes a 4D mask ({', '.join(PACKABLE_ATTENTION)}); "
            f"this model uses {impl!r}. Set trainer.pack_prompts: false."
        )


def prepare_deepspeed() -> None:
    """Quiet DeepSpeed's INFO logs, and skip its shared-memory all-reduce op on CPUs: it is JIT-built on first
    use (~35 s on each new machine, DeepSpeed 0.19.8) and gloo's all-reduce is enough for a CPU-sized world. GPU
    accelerators have no such op, so nothing changes there."""
    import deepspeed

    deepspeed.utils.logging.logger.setLevel(logging.WARNING)
    # By name: the attribute `deepspeed.comm.torch` is the torch package itself (re-exported).
    ds_torch_comm = importlib.import_module("deepspeed.comm.torch")
    if not torch.cuda.is_available():
        ds_torch_comm.build_shm_op = lambda: None


def apply_config_overrides(config: Any, overrides: Mapping[str, Any] | None, where: str) -> Any:
    """Set `overrides` (config.json names) on a transformers config before the model is built from it: the
    learner's and the HF engine's side of `model.config_overrides` (vLLM takes the same mapping as hf_overrides).
    A key the config does not have is refused, naming `where` (the model) and the key: a typo would otherwise be
    kept as a stray attribute that changes nothing."""
    unknown = sorted(k for k in (overrides or {}) if not hasattr(config, k))
    if unknown:
        raise ValueError(
            f"model.config_overrides: {where} has no config key(s) {unknown} (config.json names, e.g. "
            "max_position_embeddings)"
        )
    for key, value in (overrides or {}).items():
        setattr(config, key, value)
    return config


def load_policy(
    model_path: str,
    dtype: torch.dtype,
    gradient_checkpointing: bool,
    ds_config: dict[str, Any],
    config_overrides: Mapping[str, Any] | None = None,
) -> PolicyModule:
    """The HF model at `model_path` in `dtype`, with `config_overrides` applied to its config (e.g. a longer
    max_position_embeddings) and every dropout set to 0 (the first update on freshly computed old log-probs must
    see ratio 1), wrapped for DeepSpeed. A model whose config transforms the logits after the head is refused
    before any weight is loaded (`check_plain_logits`).

    Under ZeRO-3, transformers' `HfDeepSpeedConfig` makes `from_pretrained` build the model already partitioned
    (zero.Init), so no rank ever holds the whole model. That needs the `accelerate` package; without it every rank
    loads the whole model and `deepspeed.initialize` partitions it (fine for small models, heavy on host memory
    at 32B). The `HfDeepSpeedConfig` lives only for this load: transformers keeps it in a process-wide weak
    reference, and while it lives every `from_pretrained` in the process builds a partitioned model, the HF
    rollout engine's too (whose first forward then fails: "'weight' must be 2-D"; found on a GPU machine by
    scripts/gpu_check.py). Nothing after the load needs it: `deepspeed.initialize` keeps the partitioning.
    """
    from transformers import AutoConfig, AutoModelForCausalLM

    zero_init = None
    if ds_config["zero_optimization"]["stage"] == 3 and importlib.util.find_spec("accelerate") is not None:
        import deepspeed
        from transformers.integrations import HfDeepSpeedConfig

        # zero.Init reads the world size from DeepSpeed's own communicator, which `deepspeed.initialize` sets up
        # only after the load: without it each rank of a multi-rank job saw world size 1 and failed DeepSpeed's
        # batch-size check ("2 != 1 * 1 * 1"). This adopts the torch process group that already exists.
        deepspeed.init_distributed(dist_backend=torch.distributed.get_backend(), auto_mpi_discovery=False)
        zero_init = HfDeepSpeedConfig(ds_config)
    config = apply_config_overrides(AutoConfig.from_pretrained(model_path), config_overrides, model_path)
    check_plain_logits(config, f"{model_path}/config.json")
    for key, value in config.to_dict().items():
        if "dropout" in key and isinstance(value, float):
            setattr(config, key, 0.0)
    lm = AutoModelForCausalLM.from_pretrained(model_path, config=config, dtype=dtype)
    del zero_init  # the weak reference dies with it: later loads in this process are ordinary again
    if gradient_checkpointing:
        lm.gradient_checkpointing_enable(gradient_checkpointing_kwargs={"use_reentrant": False})
    return PolicyModule(lm)


def copy_tokenizer_files(src: str | Path, dst: Path) -> None:
    """Copy the tokenizer files found in a local model directory `src` to `dst` (a hub id: nothing to copy)."""
    src = Path(src)
    for name in TOKENIZER_FILES:
        if (src / name).is_file():
            shutil.copy2(src / name, dst / name)
