"""`ReferencePolicy`: the frozen policy that the KL term pulls towards (GRPO's reference model; off in DAPO).

The model the run starts from (`model.path`), loaded a second time without an optimizer, with the learner's dtype
and ranks; its log-probs come from the learner's micro-batching and chunked head (`ChunkedForward`) at the same
temperature, so with unchanged weights they equal the learner's old log-probs exactly. Every rank calls
`compute_logprobs` with the whole batch (ZeRO-3 gathers collectively). Sharding, memory: docs/algorithm.md section 9.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

import torch
from torch import Tensor

from dapo.distributed import init_distributed
from dapo.learner.batch import PolicyBatch
from dapo.learner.forward import ChunkedForward
from dapo.learner.model import load_policy, prepare_deepspeed
from dapo.learner.optim import deepspeed_config
from dapo.modeling import ATTENTION_PACKED, ATTENTION_PADDED, model_hidden_size, resolve_dtype


class ReferencePolicy:
    """The frozen reference policy pi_ref of the k3 KL term (see the module docstring)."""

    def __init__(
        self,
        model_path: str,
        *,
        zero_stage: int,
        dtype: str = "auto",
        micro_batch_tokens: int = 32768,
        logprob_chunk_size: int = 1024,
        temperature: float = 1.0,
        packing: str = "sequences",
        config_overrides: Mapping[str, Any] | None = None,
    ) -> None:
        import deepspeed

        prepare_deepspeed()
        self.dist = init_distributed()
        self.model_path, self.temperature = model_path, temperature
        self.dtype = resolve_dtype(dtype)
        # Stages 1 and 2 partition optimizer state and gradients only; without either they would be stage 0.
        self.zero_stage = 3 if zero_stage == 3 else 0
        ds_config = deepspeed_config(
            self.zero_stage, self.dtype == torch.bfloat16, 1.0, self.dist.world_size, model_hidden_size(model_path)
        )
        attention = ATTENTION_PADDED if packing == "none" else ATTENTION_PACKED
        policy = load_policy(model_path, self.dtype, False, ds_config, config_overrides, attention)
        policy.requires_grad_(False)
        self.engine, *_ = deepspeed.initialize(model=policy, config=ds_config)
        if self.zero_stage == 3:
            # The head weight is read in PolicyModule.forward, outside the head module's own forward.
            deepspeed.zero.register_external_parameter(self.engine.module, self.engine.module.head_weight())
        self.engine.eval()
        # no update: every pass is a no-grad one, at the forward budget (`micro_batch_tokens`: the learner's)
        self.passes = ChunkedForward(
            self.engine, self.dist, micro_batch_tokens, micro_batch_tokens, logprob_chunk_size, packing
        )

    @torch.no_grad()
    def compute_logprobs(self, batch: PolicyBatch) -> Tensor:
        """Per-token log-probs [N, R] (float32, CPU, zeros after each response) of the batch's responses under the
        reference policy, at the sampling temperature. Every rank must call it, with the whole batch."""
        logp, _ = self.passes.whole_batch(batch, self.temperature, with_entropy=False)
        return logp
