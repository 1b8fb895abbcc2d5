"""Build the loop's components from a `RunConfig`: the config stops here, everything below gets plain values."""

from __future__ import annotations

import functools
import logging
import os
import subprocess
from pathlib import Path
from typing import TYPE_CHECKING, Any

from dapo import metric_names as M
from dapo.config import REPO_ROOT, RunConfig
from dapo.trainer.components import Components, EvalSet, MetricsTracker, PlainWorld, World
from dapo.types import Problem

if TYPE_CHECKING:
    from dapo.evaluation.evaluate import EvalSettings
    from dapo.learner import Learner, ReferencePolicy
    from dapo.trainer.loop import RunSettings
    from dapo.trainer.tripwires import Tripwires

log = logging.getLogger("dapo.train")


@functools.cache
def git_commit() -> str:
    """The repository's commit (with `-dirty` when the tree has changes), or "unknown" outside a checkout."""
    try:
        sha = subprocess.run(
            ["git", "-C", str(REPO_ROOT), "rev-parse", "HEAD"], capture_output=True, text=True, timeout=10, check=True
        ).stdout.strip()
        dirty = subprocess.run(
            ["git", "-C", str(REPO_ROOT), "status", "--porcelain", "--untracked-files=no"],
            capture_output=True,
            text=True,
            timeout=10,
        ).stdout.strip()
        return sha + ("-dirty" if dirty else "")
    except (OSError, subprocess.SubprocessError):
        return "unknown"


def _pick(section: Any, *names: str) -> dict[str, Any]:
    """Config values handed on under the names they have in the config."""
    return {name: getattr(section, name) for name in names}


def run_settings(cfg: RunConfig) -> RunSettings:
    """The run config as the loop's plain settings (the config stops here)."""
    from dapo.trainer.loop import RunSettings
    from dapo.trainer.step import StepSettings

    t, a, r = cfg.trainer, cfg.algorithm, cfg.rollout
    step = StepSettings(
        max_tokens=r.max_response_length,
        **_pick(r, "n", "temperature", "top_p"),
        **_pick(a, "verifier", "overlong_penalty", "overlong_buffer_len", "overlong_penalty_factor"),
        **_pick(a, "dynamic_sampling", "gen_batch_size", "max_num_gen_batches", "at_refill_cap"),
        **_pick(a, "norm_adv_by_std", "overlong_filter", "rollout_correction"),
        correction_cap=a.rollout_correction_cap,
        correction_floor=a.rollout_correction_floor,
        sampling_seed=t.seed + r.sampling_seed_offset,
        max_staleness=r.max_staleness,
        **_pick(t, "train_batch_size", "mini_batch_size", "epochs", "seed", "max_consecutive_nonfinite"),
    )
    return RunSettings(
        step=step,
        total_steps=t.total_steps,
        eval_every=cfg.eval.every,
        **_pick(t, "checkpoint_every", "keep_checkpoints", "stop_margin_s", "seed", "heartbeat_timeout_s"),
        config_hash=cfg.config_hash(),
        params=cfg.flat(),
        tags=run_tags(cfg),
        tripwires=tripwires(cfg),
    )


def tripwires(cfg: RunConfig) -> Tripwires:
    """The tripwires of a run (dapo.trainer.tripwires): the log-prob gap's bound for the dtype the engine and the
    learner run in (trainer.logprob_gap_bound overrides it), checked only where the engine's log-probs are of the
    distribution the learner computes (top_p 1)."""
    from dapo.rollout.base import dtype_name
    from dapo.trainer.tripwires import LOGPROB_GAP_BOUND, Tripwires

    dtype = dtype_name(cfg.model.dtype)
    bound = cfg.trainer.logprob_gap_bound or LOGPROB_GAP_BOUND.get(dtype)
    return Tripwires(
        logprob_gap=bound if cfg.rollout.top_p >= 1.0 else None, dtype=dtype, enabled=cfg.trainer.tripwires
    )


def run_tags(cfg: RunConfig) -> dict[str, str]:
    """MLflow tags that line runs up in the UI's compare view."""
    import torch

    from dapo import distributed as dist

    # one GPU per rank when there are GPUs, else the CPU threads (of each rank)
    gpus = dist.world_size() if torch.cuda.is_available() else 0
    return {
        M.TAG_ROW: cfg.tracking.row,
        M.TAG_SEED: str(cfg.trainer.seed),
        M.TAG_PRESET: cfg.tracking.preset,
        M.TAG_GIT: git_commit(),
        M.TAG_CONFIG_HASH: cfg.config_hash(),
        M.TAG_GPUS: str(gpus),
        M.TAG_CPUS: str(torch.get_num_threads()),
        M.TAG_CPU_KERNELS: torch.backends.cpu.get_cpu_capability(),
    }


def model_path(cfg: RunConfig, world: World) -> str:
    """`model.path` as the world resolves it (the tiny world's `tiny`: its base model, built on first use)."""
    return world.model_path(cfg.model.path)


def load_problems(cfg: RunConfig, split: str, world: World) -> list[Problem]:
    """Train or eval problems from `data.train` / `data.eval` as the world resolves them (a hub id or a local
    .jsonl/.parquet, deduplicated by `dapo.data`)."""
    from dapo.data.loaders import load_problems as load

    return load(world.data_source(split, cfg.data.train if split == "train" else cfg.data.eval))


def build_components(cfg: RunConfig, run_dir: Path, world: World | None = None) -> Components:
    """The world's model and data (built when asked for), the tokenizer, this rank's rollout engine, the learner,
    reward, eval set and tracker. Every rank of a job calls it at the same time (engines build their groups
    collectively). `world`: what a built world adds (the command wiring the run passes it; None: `PlainWorld`)."""
    import torch
    from transformers import AutoTokenizer

    if not torch.cuda.is_available():
        os.environ.setdefault("DS_ACCELERATOR", "cpu")
    from dapo import distributed as dist
    from dapo.data.prompts import tokenize_problems
    from dapo.rewards import shutdown_pools
    from dapo.rollout import make_engine
    from dapo.rollout.replicas import ReplicaLayout
    from dapo.tracking import Tracker

    d, r, t = cfg.data, cfg.rollout, cfg.trainer
    world = world or PlainWorld()
    # torchrun / srun ranks (or one process): join the group now (the learner and the engines adopt it), so that
    # rank 0 alone builds a world when it is missing while the others wait for it.
    main = dist.init_distributed(timeout_s=t.collective_timeout_s, rendezvous_timeout_s=t.rendezvous_timeout_s).is_main
    ReplicaLayout.of_this_process(r.tensor_parallel_size)  # a layout that cannot be built fails before any load
    if main:
        model_path(cfg, world)
        load_problems(cfg, "train", world)
    dist.barrier()
    path = model_path(cfg, world)
    tok = AutoTokenizer.from_pretrained(path)
    problems, prompts, dropped = tokenize_problems(
        load_problems(cfg, "train", world),
        tok,
        use_chat_template=d.use_chat_template,
        max_prompt_length=d.max_prompt_length,
    )
    if dropped:
        log.warning("dropped %d training prompts longer than data.max_prompt_length=%d", dropped, d.max_prompt_length)
    if not problems:
        raise ValueError(f"no training prompts left from data.train={d.train!r}")
    learner = make_learner(cfg, path)
    reference = make_reference(cfg, path) if cfg.algorithm.kl_coef > 0 else None
    eval_set = make_eval_set(cfg, tok, world)
    max_len = d.max_prompt_length + max(r.max_response_length, cfg.resolved_eval_max_tokens())
    # every rank samples: one engine per rollout replica (tensor_parallel_size ranks share one); on GPUs the
    # engine sizes its KV cache from the memory it finds free, so the learner's states make room first
    learner.offload_states()
    engine = make_engine(
        r.engine,
        path,
        dtype=cfg.model.dtype,
        max_model_len=max_len,
        seed=t.seed,
        tensor_parallel_size=r.tensor_parallel_size,
        gpu_memory_utilization=r.gpu_memory_utilization,
        cpu_kv_cache_gib=r.cpu_kv_cache_gib,
        enable_sleep_mode=r.enable_sleep_mode,
        config_overrides=cfg.model.config_overrides,
        batch_invariant=r.batch_invariant,
    )

    def make_tracker(run_id: str | None) -> MetricsTracker:
        return Tracker(
            cfg.tracking.uri,
            cfg.tracking.experiment,
            cfg.run_name(),
            run_id=run_id,
            spool_dir=Path(run_dir) / "mlflow_spool",
            finish_timeout_s=cfg.tracking.finish_timeout_s,
        )

    return Components(
        tagger=world.tagger(cfg.model.path),
        engine=engine,
        learner=learner,
        problems=problems,
        prompts=prompts,
        make_tracker=make_tracker,
        eval_set=eval_set,
        tensor_parallel_size=r.tensor_parallel_size,
        cleanup=shutdown_pools,
        reference=reference,
    )


def make_learner(cfg: RunConfig, path: str) -> Learner:
    """The learner of a run: the model at `path` under DeepSpeed, with the run's loss and optimizer settings."""
    from dapo.learner import Learner, LossSpec

    r, a, t = cfg.rollout, cfg.algorithm, cfg.trainer
    loss = LossSpec(
        seq_token_sum_constant=a.seq_token_sum_constant or r.max_response_length,
        temperature=r.temperature,
        **_pick(a, "eps_low", "eps_high", "dual_clip_c", "kl_coef", "loss_agg", "policy_loss", "cispo_clip_max"),
        **_pick(a, "clip_cov_ratio", "clip_cov_lb", "clip_cov_ub", "kl_cov_ratio", "kl_cov_coef"),
        **_pick(a, "sapo_tau_pos", "sapo_tau_neg", "off_policy_mask"),
        max_staleness=r.max_staleness,
    )
    return Learner(
        path,
        loss=loss,
        betas=tuple(t.betas),
        gradient_checkpointing=cfg.model.gradient_checkpointing,
        micro_batch_tokens=t.micro_batch_tokens,
        forward_micro_batch_tokens=t.resolved_forward_micro_batch_tokens(),
        **_pick(t, "lr", "warmup_steps", "weight_decay", "grad_clip"),
        **_learner_model(cfg),
    )


def _learner_model(cfg: RunConfig) -> dict[str, Any]:
    """What the learner and the KL term's reference policy both take: the model, its ZeRO stage and packing."""
    t = cfg.trainer
    return {
        **_pick(t, "zero_stage", "logprob_chunk_size", "packing"),
        **_pick(cfg.model, "dtype", "config_overrides"),
    }


def make_reference(cfg: RunConfig, path: str) -> ReferencePolicy:
    """The KL term's reference policy (algorithm.kl_coef > 0): the initial model at `path`, frozen, on the learner's
    ranks and ZeRO stage, through the learner's chunked head at the sampling temperature (docs/algorithm.md
    section 9)."""
    from dapo.learner import ReferencePolicy

    return ReferencePolicy(
        path,
        temperature=cfg.rollout.temperature,
        micro_batch_tokens=cfg.trainer.resolved_forward_micro_batch_tokens(),  # it only runs no-grad passes
        **_learner_model(cfg),
    )


def make_eval_set(cfg: RunConfig, tokenizer: Any, world: World) -> EvalSet:
    """The eval problems (data.eval), their prompts, and eval.* as `EvalSettings`."""
    from dapo.data.prompts import tokenize_problems

    problems, prompts, dropped = tokenize_problems(
        load_problems(cfg, "eval", world),
        tokenizer,
        use_chat_template=cfg.data.use_chat_template,
        max_prompt_length=cfg.data.max_prompt_length,
    )
    if dropped:
        log.warning("dropped %d eval prompts longer than data.max_prompt_length", dropped)
    return EvalSet(problems, prompts, eval_settings(cfg))


def eval_settings(cfg: RunConfig) -> EvalSettings:
    """eval.* as `EvalSettings`: one reading of the config for the trainer's evaluations and `dapo eval`."""
    from dapo.evaluation.evaluate import EvalSettings

    e = cfg.eval
    return EvalSettings(
        max_tokens=cfg.resolved_eval_max_tokens(),
        pass_k=tuple(e.pass_k),
        verifier=cfg.algorithm.verifier,
        seed=cfg.trainer.seed,
        **_pick(e, "n", "temperature", "top_p", "bootstrap", "confidence"),
    )
