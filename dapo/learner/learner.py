"""`Learner`: the policy under DeepSpeed. Old log-probs, one clipped-surrogate update per mini-batch, weights out.

One update (docs/algorithm.md sections 2, 3 and 8; the rules: docs/architecture.md, "learner/"): the aggregation's
counts are summed over ranks before any backward pass; each rank's loss is multiplied by W to undo DeepSpeed's
gradient averaging; every rank runs the same number of micro-batches (a rank with fewer runs zero-weight dummy ones:
ZeRO gathers collectively); a non-finite loss or gradient norm skips the optimizer step, weights and state unchanged.
"""

from __future__ import annotations

import contextlib
import math
from collections.abc import Callable, Iterator, Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import torch
from torch import Tensor

from dapo import metric_names as M
from dapo.algos.aggregation import group_token_counts, local_counts, token_weights, weighted_sum
from dapo.algos.metrics import UPDATE_SUMS, update_metrics, update_sums
from dapo.algos.policy_loss import COVARIANCE_LOSSES, covariance_selection, k3_to_reference, per_token_loss
from dapo.algos.rollout_correction import off_policy_sequence_mask
from dapo.algos.staleness import staleness_violation
from dapo.distributed import all_gather, all_reduce, init_distributed
from dapo.learner.batch import LossSpec, MicroBatch, PolicyBatch, dummy_micro_batch
from dapo.learner.forward import ChunkedForward
from dapo.learner.model import load_policy, prepare_deepspeed
from dapo.learner.optim import deepspeed_config, lr_at, make_optimizer
from dapo.modeling import (
    ATTENTION_PACKED,
    ATTENTION_PADDED,
    copy_tokenizer_files,
    model_hidden_size,
    register_packed_attention,
    resolve_dtype,
)

# The per-update "this step was skipped" flag (1.0 / 0.0); the cumulative count is M.NONFINITE_SKIPPED.
UPDATE_SKIPPED = M.UPDATE_SKIPPED
_CKPT_TAG = "learner"


class StalenessError(RuntimeError):
    """An update was handed a token older than `rollout.max_staleness` weight versions (carry-over): a bug in what the
    step carried, never trained on."""


@dataclass(frozen=True)
class MiniBatchCounts:
    """The normaliser counts of a whole mini-batch, summed over ranks (`dapo.algos.aggregation`): loss tokens,
    responses with a loss token, and for the group-token-mean the loss tokens of each group id, [slots]."""

    num_tokens: float
    num_seqs: float
    group_tokens: Tensor | None = None


class Learner:
    """The policy being trained, under a DeepSpeed engine. See `dapo.learner` for the API and its contracts."""

    def __init__(
        self,
        model_path: str,
        *,
        loss: LossSpec,
        lr: float,
        warmup_steps: int = 0,
        weight_decay: float = 0.0,
        betas: tuple[float, float] = (0.9, 0.999),
        grad_clip: float = 1.0,
        zero_stage: int = 2,
        dtype: str = "auto",
        micro_batch_tokens: int = 32768,
        forward_micro_batch_tokens: int | None = None,
        logprob_chunk_size: int = 1024,
        gradient_checkpointing: bool = False,
        optimizer: Callable[[list[torch.nn.Parameter]], torch.optim.Optimizer] | None = None,
        packing: str = "sequences",
        config_overrides: Mapping[str, Any] | None = None,
    ) -> None:
        import deepspeed

        prepare_deepspeed()
        self.dist = init_distributed()
        self.model_path, self.loss, self.zero_stage = model_path, loss, zero_stage
        self.base_lr, self.warmup_steps = lr, warmup_steps
        self.dtype = resolve_dtype(dtype)
        # ZeRO-0 in float32 steps the bare torch optimizer (no non-finite skip, no norm): the learner computes the
        # norm itself (`_step`) and clips with it, instead of DeepSpeed computing it a second time.
        self._own_step = zero_stage == 0 and self.dtype == torch.float32
        self.grad_clip = grad_clip
        ds_clip = 0.0 if self._own_step else grad_clip
        ds_config = deepspeed_config(
            zero_stage, self.dtype == torch.bfloat16, ds_clip, self.dist.world_size, model_hidden_size(model_path)
        )
        attention = ATTENTION_PADDED if packing == "none" else ATTENTION_PACKED
        policy = load_policy(model_path, self.dtype, gradient_checkpointing, ds_config, config_overrides, attention)
        self._torch_opt = (
            make_optimizer(policy.parameters(), lr, weight_decay, betas)
            if optimizer is None
            else optimizer(list(policy.parameters()))
        )
        self.engine, *_ = deepspeed.initialize(model=policy, optimizer=self._torch_opt, config=ds_config)
        # micro-batches (packed or padded: learner.batch) and the chunked head
        self.passes = ChunkedForward(
            self.engine,
            self.dist,
            micro_batch_tokens,
            forward_micro_batch_tokens or micro_batch_tokens,
            logprob_chunk_size,
            packing,
        )
        if zero_stage == 3:
            # The head weight is read in PolicyModule.forward, outside the head module's own forward.
            deepspeed.zero.register_external_parameter(self.engine.module, self.engine.module.head_weight())
        if zero_stage == 0 and self.dist.world_size == 1:
            # DeepSpeed's ZeRO-0 all-reduce flattens every gradient into one buffer, scales it by 1/world and copies
            # it back, even alone: ~10% of a 66M update on the CPU for an identity (bench_learner_flops.py).
            self.engine.enable_backward_allreduce = False
        self.engine.train()
        # The own step exactly where DeepSpeed wraps no optimizer (its wrappers skip non-finite steps and clip).
        if self._own_step == hasattr(self.engine.optimizer, "overflow"):
            raise RuntimeError(
                f"unexpected DeepSpeed optimizer {type(self.engine.optimizer).__name__} at ZeRO-{zero_stage}, {dtype}"
            )
        self._offloaded = False
        self._host_buffers: dict[tuple[str, int], Tensor] = {}  # ZeRO-3 master weights and Adam state, offloaded
        self.schedule(0)

    # ------------------------------------------------------------------------------------------ lr schedule
    def schedule(self, rollout_step: int) -> float:
        """Set and return the lr of 0-based rollout step `rollout_step` (the trainer calls it before each step's
        updates: the warm-up counts rollout steps, and the trainer's counters are the only ones)."""
        self.lr = lr_at(rollout_step, self.base_lr, self.warmup_steps)
        self._set_lr(self.lr)
        self.version = rollout_step  # the weights' version: the rollout steps they have been trained through
        return self.lr

    def _set_lr(self, value: float) -> None:
        # ZeRO wrappers step the torch optimizer they wrap, with that optimizer's param_groups.
        for opt in {id(o): o for o in (self._torch_opt, self.engine.optimizer)}.values():
            for group in opt.param_groups:
                group["lr"] = value

    # ------------------------------------------------------------------------------------------ forward
    @torch.no_grad()
    def compute_logprobs(self, batch: PolicyBatch) -> tuple[Tensor, Tensor]:
        """(logp [N, R], entropy [N, R]) of the responses under the current weights: float32 on the CPU, R =
        batch.loss_mask.shape[1], zeros after each response. Every rank calls it with the whole batch, computes its
        shard (ZeRO-3 gathers collectively) and gets every row."""
        logp, entropy = self.passes.whole_batch(batch, self.loss.temperature, with_entropy=True)
        assert entropy is not None
        return logp, entropy

    def set_packing(self, packing: str) -> None:
        """Lay later passes out as `packing` (`trainer.packing`), attention to match (benchmarks, tests)."""
        register_packed_attention()
        self.passes.packing = packing
        self.engine.module.lm.set_attn_implementation(ATTENTION_PADDED if packing == "none" else ATTENTION_PACKED)

    def padded_fraction(self, batch: PolicyBatch, *, forward_only: bool) -> float:
        """Padding's share of the tokens one pass (`compute_logprobs` if `forward_only`, else `update`) computes over
        every rank, dummies included. Arithmetic on lengths, no collective."""
        return self.passes.tokens(batch, forward_only).padded_fraction

    # ------------------------------------------------------------------------------------------ update
    def update(self, batch: PolicyBatch, *, salt: int = 0) -> dict[str, float]:
        """One optimizer step: every rank calls it with the whole mini-batch and trains its token-balanced shard
        (`PolicyBatch.shard`). `salt` keys the covariance losses' draw (`policy_loss.token_keys`): the trainer passes
        its update count, so a resumed run draws the same tokens.

        Returns metrics over the whole mini-batch (`dapo.metric_names`): loss, clip fractions, old probability of
        upper-clipped tokens (NaN if none), dual-clip fraction, KL to old and reference policy, grad norm before
        clipping, lr, UPDATE_SKIPPED (1.0: skipped as non-finite), `M.LEARNER_PADDED_FRACTION`, and the loss's own.
        """
        if batch.old_logp is None:
            raise ValueError("update needs batch.old_logp (Learner.compute_logprobs before the first update)")
        if self.loss.kl_coef > 0 and batch.ref_logp is None:
            raise ValueError("kl_coef > 0 needs batch.ref_logp (`dapo.learner.ReferencePolicy.compute_logprobs`)")
        if batch.versions is not None:  # carry-over: no trained token older than the bound, ever
            problem = staleness_violation(batch.versions, batch.loss_mask, self.version, self.loss.max_staleness)
            if problem is not None:
                raise StalenessError(problem)
        spec, world = self.loss, self.dist.world_size
        whole = batch
        batch = batch.select(self.passes.my_rows(batch)) if world > 1 else batch
        counts = self._global_counts(batch)
        weights = token_weights(
            batch.loss_mask,
            spec.loss_agg,
            batch.group_ids,
            num_tokens=counts.num_tokens,
            num_seqs=counts.num_seqs,
            group_tokens=counts.group_tokens,
            seq_sum_constant=spec.seq_token_sum_constant,
        )
        selected = self._covariance_selection(batch, salt)
        # Accumulated on the device, in UPDATE_SUMS order: no host sync per micro-batch.
        sums = torch.zeros(len(UPDATE_SUMS), dtype=torch.float64, device=self.dist.device)
        local_bad = torch.zeros((), dtype=torch.bool, device=self.dist.device)
        plan = self.passes.plan(batch)
        for k, rows in enumerate(plan):
            last = k == len(plan) - 1
            self.engine.set_gradient_accumulation_boundary(last)
            if rows:
                mb = self.passes.collate(batch, rows)
                loss, part = self._micro_loss(batch, mb, weights, selected)
                sums += torch.stack([part[name] for name in UPDATE_SUMS])
                local_bad |= ~torch.isfinite(loss.detach())
            else:
                dummy = dummy_micro_batch(self.passes.packed)
                lp, _ = self.passes.run(dummy, self.loss.temperature, with_entropy=False)
                loss = lp.sum() * 0.0
            if last and bool(all_reduce(local_bad.double().reshape(1), "max").item()):
                # A non-finite loss anywhere: make every rank's gradient non-finite, so the overflow check
                # below skips the step everywhere, even where NaNs did not reach the gradient.
                loss = loss * float("nan")
            self.engine.backward(loss * world, scale_wrt_gas=False)
        grad_norm, applied = self._step()
        summed = dict(zip(UPDATE_SUMS, all_reduce(sums, "sum").tolist(), strict=True))
        metrics = update_metrics(
            summed, counts.num_tokens, counts.num_seqs, spec.policy_loss, spec.kl_coef > 0, spec.off_policy_mask
        )
        padded = self.passes.tokens(whole, forward_only=False).padded_fraction
        return {
            **metrics,
            M.GRAD_NORM: grad_norm,
            M.LR: self.lr,
            UPDATE_SKIPPED: 0.0 if applied else 1.0,
            M.LEARNER_PADDED_FRACTION: padded,
        }

    def _covariance_selection(self, batch: PolicyBatch, salt: int) -> Tensor | None:
        """Clip-Cov's / KL-Cov's tokens of this rank's rows, [N, R] bool, chosen over the mini-batch from a no-grad
        pass (`policy_loss.covariance_selection`); None for other losses."""
        spec = self.loss
        if spec.policy_loss not in COVARIANCE_LOSSES:
            return None
        # the current policy's log-probs; collective under ZeRO-3: every rank runs it
        logp, _ = self.passes.per_token(batch, self.loss.temperature, with_entropy=False)
        return covariance_selection(
            spec.policy_loss,
            logp,
            batch.old_logp,
            batch.advantages,
            batch.loss_mask,
            batch.sample_ids,
            salt,
            ratio=spec.clip_cov_ratio if spec.policy_loss == "clip_cov" else spec.kl_cov_ratio,
            eps_low=spec.eps_low,
            eps_high=spec.eps_high,
            dual_clip_c=spec.dual_clip_c,
            lb=spec.clip_cov_lb,
            ub=spec.clip_cov_ub,
            sum_over_ranks=lambda x: all_reduce(x, "sum"),
            gather_from_ranks=all_gather,
        )

    def _global_counts(self, batch: PolicyBatch) -> MiniBatchCounts:
        """The aggregation's counts over all ranks: one all-reduce (group-token-mean: two, the vector length first)."""
        local = local_counts(batch.loss_mask)
        head = torch.tensor([local["num_tokens"], local["num_seqs"]], dtype=torch.float64)
        if self.loss.loss_agg != "group-token-mean":
            num_tokens, num_seqs = all_reduce(head, "sum").tolist()
            return MiniBatchCounts(num_tokens, num_seqs)
        top = int(batch.group_ids.max().item()) + 1 if len(batch) else 0
        slots = int(all_reduce(torch.tensor([top], dtype=torch.float64), "max").item())
        total = all_reduce(torch.cat([head, group_token_counts(batch.loss_mask, batch.group_ids, slots)]), "sum")
        return MiniBatchCounts(float(total[0]), float(total[1]), total[2:])

    def _micro_loss(
        self, batch: PolicyBatch, mb: MicroBatch, weights: Tensor, selected: Tensor | None
    ) -> tuple[Tensor, dict[str, Tensor]]:
        """The micro-batch's weighted loss sum and metric sums; flat outputs laid out [rows, width] (whole rows)."""
        spec, dev = self.loss, self.dist.device
        logp_flat, _ = self.passes.run(mb, spec.temperature, with_entropy=False)
        idx = torch.as_tensor(mb.rows, dtype=torch.long)
        where = torch.full((len(batch),), -1, dtype=torch.long)
        where[idx] = torch.arange(len(idx))
        at = (where[mb.token_rows].to(dev), mb.token_cols.to(dev))
        width = int(mb.token_cols.max()) + 1

        def grid(flat: Tensor) -> Tensor:  # differentiable: the gradient flows back to the flat outputs
            return torch.zeros(len(idx), width, dtype=flat.dtype, device=dev).index_put(at, flat)

        def take(t: Tensor) -> Tensor:  # a per-token batch tensor's rows of this micro-batch
            return t[idx, :width].to(dev)

        logp, old, m = grid(logp_flat), take(batch.old_logp), take(batch.loss_mask) > 0
        adv = batch.advantages[idx].to(dev)
        out = per_token_loss(
            spec.policy_loss,
            logp,
            old,
            adv,
            m,
            eps_low=spec.eps_low,
            eps_high=spec.eps_high,
            dual_clip_c=spec.dual_clip_c,
            cispo_clip_max=spec.cispo_clip_max,
            kl_cov_coef=spec.kl_cov_coef,
            sapo_tau_pos=spec.sapo_tau_pos,
            sapo_tau_neg=spec.sapo_tau_neg,
            selected=None if selected is None else take(selected),
        )
        per_token = out.loss
        if batch.is_weights is not None:  # the rollout correction: after the clip, before the KL term
            per_token = per_token * take(batch.is_weights)
        masked = None
        if spec.off_policy_mask is not None:  # DeepSeek-V3.2's: on the current policy, so at every update
            sampling = take(batch.engine_logp) if batch.engine_logp is not None else old
            keep = off_policy_sequence_mask(adv, logp, sampling, m, spec.off_policy_mask)
            per_token, masked = per_token * keep, (keep == 0).expand_as(m)
        kl = None
        if batch.ref_logp is not None:
            kl = k3_to_reference(logp, take(batch.ref_logp))
            if spec.kl_coef > 0:
                per_token = per_token + spec.kl_coef * kl
        loss = weighted_sum(per_token, take(weights))
        part = update_sums(out, loss, old, logp, adv, m, kl, masked)
        return loss, part

    def _step(self) -> tuple[float, bool]:
        """The optimizer step at the accumulation boundary; returns (grad norm before clipping, applied)."""
        if self._own_step:
            params = [p for p in self.engine.module.parameters() if p.grad is not None]
            # One foreach pass in the gradients' dtype (a float64 copy of every gradient cost ~8x more:
            # BENCHMARKS.md section 1); a NaN or inf anywhere still makes the norm non-finite.
            total = torch.nn.utils.get_total_norm([p.grad for p in params]) if params else torch.zeros(())
            norm = float(total)
            if not math.isfinite(norm):
                self.engine.zero_grad()
                applied = False
            else:
                if self.grad_clip > 0:  # as DeepSpeed clips: g * min(1, clip / (norm + 1e-6))
                    torch.nn.utils.clip_grads_with_norm_(params, self.grad_clip, total)
                self.engine.step()
                applied = True
        else:
            self.engine.step()
            applied = self.engine.was_step_applied()
            norm = self.engine.get_global_grad_norm()
            norm = float(norm) if norm is not None else math.nan
        return norm, applied

    # ------------------------------------------------------------------------------------------ colocation
    def offload_states(self) -> None:
        """Move this rank's ZeRO states (shards, gradients, fp32 masters, optimizer state) to host memory while the
        colocated engine generates (DeepSpeed's `offload_states`); a no-op without a GPU and at ZeRO 0."""
        if self.dist.device.type == "cuda" and self.zero_stage > 0 and not self._offloaded:
            if self.zero_stage == 3:
                from deepspeed.runtime.zero.offload_config import OffloadStateTypeEnum as State

                # DeepSpeed 0.19's ZeRO-3 offloads masters and optimizer state only for its own FusedAdam (assert
                # "Offloading is supported only for DeepSpeed FusedAdam"; an nvcc-built op). We step torch's fused
                # AdamW, so those two move here (found on an H100 by scripts/gpu_check.py).
                self.engine.offload_states(include=[State.lp_params, State.lp_grads, State.contiguous_grad_buffer])
                for key, t in self._master_and_adam_tensors():
                    host = self._host_buffers.get(key)
                    if host is None:
                        host = self._host_buffers[key] = torch.empty_like(t, device="cpu").pin_memory()
                    host.copy_(t)
                    t.data = host
            else:
                self.engine.offload_states()
            self._offloaded = True

    def reload_states(self) -> None:
        """Undo `offload_states`; every other method needs the states back on the GPU."""
        if self._offloaded:
            self.engine.reload_states()
            for _, t in self._master_and_adam_tensors():
                t.data = t.data.to(self.dist.device)
            self._offloaded = False

    @contextlib.contextmanager
    def _states_on_device(self) -> Iterator[None]:
        """The states on the device for the duration: checkpoints and ZeRO-3's gathers read the GPU buffers that
        `offload_states` empties (a ZeRO-3 resume failed in `load_checkpoint` otherwise: scripts/gpu_check.py)."""
        offloaded = self._offloaded
        self.reload_states()
        try:
            yield
        finally:
            if offloaded:
                self.offload_states()

    def _master_and_adam_tensors(self) -> Iterator[tuple[tuple[str, int], Tensor]]:
        """ZeRO-3's fp32 master partitions and their Adam moments, keyed to reuse a pinned host buffer per offload;
        kept out of the optimizer's state dict (DeepSpeed's helper puts them there: checkpointed, reloaded to GPU)."""
        if self.zero_stage != 3:
            return
        zero = self.engine.optimizer
        for i, master in enumerate(zero.fp32_partitioned_groups_flat):
            yield ("master", i), master
            state = zero.optimizer.state.get(master, {})
            for name in ("exp_avg", "exp_avg_sq"):
                if name in state:
                    yield (name, i), state[name]

    # ------------------------------------------------------------------------------------------ weights out
    def named_parameters_for_sync(self) -> Iterator[tuple[str, Tensor]]:
        """(Hugging Face name, full tensor) for every parameter, for the rollout engine's weight sync.

        Under ZeRO-3 each is gathered (a collective: every rank exhausts the iterator) and is the consumer's own: the
        gathered buffer, which DeepSpeed releases from the parameter (pointing it at an empty tensor) when the gather
        ends. No copy: with NCCL the sync holds one parameter at a time (gloo briefly twice: BENCHMARKS.md section 9).
        Otherwise the live weight, detached: copy it before the next update to keep it. Tied weights appear once.
        Embedding and head come last (`_vocab_last`; docs/distributed.md, "Weight sync from a sharded learner").
        """
        import deepspeed

        with self._states_on_device():
            if self.zero_stage == 3:  # a no-grad forward's prefetch can leave parameters in flight: settle them first
                self.engine.empty_partition_cache()
            for name, p in _vocab_last(self.engine.module.lm):
                if self.zero_stage == 3:
                    with deepspeed.zero.GatheredParameters([p], modifier_rank=None):
                        t = p.detach()
                    yield name, t
                    del t  # one gathered buffer alive at a time: not this one while the next is gathered
                else:
                    yield name, p.detach()

    def state_dict_on_main(self) -> dict[str, Tensor]:
        """The whole model as CPU tensors on rank 0 (nothing elsewhere), gathered one parameter at a time: one host
        copy per node (about 65 GB at 32B bf16), not eight. Every rank must call it (ZeRO-3 gathers collectively)."""
        state: dict[str, Tensor] = {}
        for name, t in self.named_parameters_for_sync():
            if self.dist.is_main:
                state[name] = t.to("cpu", copy=True)
        return state

    def save_hf(self, directory: str | Path) -> None:
        """The model as an HF checkpoint plus the input model's tokenizer files; all ranks call, rank 0 writes."""
        directory = Path(directory)
        state = self.state_dict_on_main()
        if self.dist.is_main:
            directory.mkdir(parents=True, exist_ok=True)
            self.engine.module.lm.save_pretrained(directory, state_dict=state)
            copy_tokenizer_files(self.model_path, directory)
        if self.dist.world_size > 1:
            torch.distributed.barrier()

    # ------------------------------------------------------------------------------------------ checkpoints
    def save_checkpoint(self, directory: str | Path) -> None:
        """Weights and optimizer state (ZeRO partitions per rank) through DeepSpeed; every rank, same directory. Step
        counters are the trainer's (trainer_state.json); `schedule` sets the lr from them."""
        with self._states_on_device():
            self.engine.save_checkpoint(str(directory), tag=_CKPT_TAG)

    def load_checkpoint(self, directory: str | Path) -> None:
        """Restore exactly what `save_checkpoint` wrote (same world size and ZeRO stage)."""
        with self._states_on_device():
            path, _ = self.engine.load_checkpoint(
                str(directory), tag=_CKPT_TAG, load_optimizer_states=True, load_lr_scheduler_states=False
            )
        if path is None:
            raise FileNotFoundError(f"{directory}: no learner checkpoint (expected DeepSpeed tag {_CKPT_TAG!r})")
        self.lr = self._torch_opt.param_groups[0]["lr"]  # as saved; the next rollout step sets its own


def _vocab_last(lm: torch.nn.Module) -> list[tuple[str, torch.nn.Parameter]]:
    """The parameters in model order, the vocabulary's (embedding, untied head) last: vLLM pads a vocabulary to 64
    rows and finishes a layer only once every row is loaded, so first in the stream it would overlap every layer."""
    vocab = {id(m.weight) for m in (lm.get_input_embeddings(), lm.get_output_embeddings()) if m is not None}
    named = list(lm.named_parameters())
    return [x for x in named if id(x[1]) not in vocab] + [x for x in named if id(x[1]) in vocab]
