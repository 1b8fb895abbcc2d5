"""The model side of the learner: the module DeepSpeed wraps, and loading it (the model itself comes from
`dapo.modeling`, which the rollout engines share).

`PolicyModule.forward` returns per-token log-probs (and entropies) of given target tokens from the final hidden
states and the output head, through `dapo.algos.logprobs.chunked_logprobs_entropy`, so [T, V] logits never exist
at once (20480 tokens x 152K vocabulary would be 12 GiB in float32).
"""

from __future__ import annotations

import importlib
import importlib.util
import logging
from collections.abc import Mapping
from typing import Any

import torch
from torch import Tensor, nn

from dapo.algos.logprobs import chunked_logprobs_entropy
from dapo.modeling import ATTENTION_PADDED, PackedRow, load_causal_lm


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
        attention_mask: Tensor | None,
        positions: Tensor,
        targets: Tensor,
        temperature: float,
        chunk_size: int,
        with_entropy: bool,
        position_ids: Tensor | None = None,
        packed_row: PackedRow | None = None,
    ) -> tuple[Tensor, Tensor | None]:
        """input_ids [B, L]; positions [T] flat indices into B*L; targets [T] -> (logp [T], entropy [T] or None),
        logits divided by `temperature` as when sampling. Padded (`collate`): attention_mask [B, L]. Packed
        (`collate_packed`, B = 1): no mask; position_ids [1, L] restart at each sequence and `packed_row` says where
        the sequences are (`dapo.modeling.packed_attention` reads it in every layer)."""
        extra = {} if packed_row is None else {"packed_row": packed_row}
        out = self.lm.base_model(
            input_ids=input_ids, attention_mask=attention_mask, position_ids=position_ids, use_cache=False, **extra
        )
        hidden = out.last_hidden_state
        hidden = hidden.reshape(-1, hidden.shape[-1]).index_select(0, positions)
        return chunked_logprobs_entropy(hidden, self.head_weight(), targets, chunk_size, temperature, with_entropy)


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


def load_policy(
    model_path: str,
    dtype: torch.dtype,
    gradient_checkpointing: bool,
    ds_config: dict[str, Any],
    config_overrides: Mapping[str, Any] | None = None,
    attention: str = ATTENTION_PADDED,
) -> PolicyModule:
    """The HF model at `model_path` in `dtype` with `attention` (`dapo.modeling.load_causal_lm`: `config_overrides`
    applied, e.g. a longer max_position_embeddings, every dropout at 0 so that the first update on freshly computed
    old log-probs sees ratio 1, a model that transforms its logits refused before any weight is loaded), wrapped
    for DeepSpeed.

    Under ZeRO-3, transformers' `HfDeepSpeedConfig` makes `from_pretrained` build the model already partitioned
    (zero.Init), so no rank ever holds the whole model. That needs the `accelerate` package; without it every rank
    loads the whole model and `deepspeed.initialize` partitions it (fine for small models, heavy on host memory
    at 32B). The `HfDeepSpeedConfig` lives only for this load: transformers keeps it in a process-wide weak
    reference, and while it lives every `from_pretrained` in the process builds a partitioned model, the HF
    rollout engine's too (whose first forward then fails: "'weight' must be 2-D"; found on a GPU machine by
    scripts/gpu_check.py). Nothing after the load needs it: `deepspeed.initialize` keeps the partitioning.
    """
    zero_init = None
    if ds_config["zero_optimization"]["stage"] == 3 and importlib.util.find_spec("accelerate") is not None:
        import deepspeed
        from transformers.integrations import HfDeepSpeedConfig

        # zero.Init reads the world size from DeepSpeed's own communicator, which `deepspeed.initialize` sets up
        # only after the load: without it each rank of a multi-rank job saw world size 1 and failed DeepSpeed's
        # batch-size check ("2 != 1 * 1 * 1"). This adopts the torch process group that already exists.
        deepspeed.init_distributed(dist_backend=torch.distributed.get_backend(), auto_mpi_discovery=False)
        zero_init = HfDeepSpeedConfig(ds_config)
    lm = load_causal_lm(model_path, dtype, config_overrides, attention=attention, no_dropout=True)
    del zero_init  # the weak reference dies with it: later loads in this process are ordinary again
    if gradient_checkpointing:
        lm.gradient_checkpointing_enable(gradient_checkpointing_kwargs={"use_reentrant": False})
    return PolicyModule(lm)
