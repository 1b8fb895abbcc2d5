"""The tiny world: a CPU stand-in for Qwen2.5-32B + DAPO-Math-17k + AIME, built from code by `dapo build-tiny`.

    <tiny.dir>/model/        Qwen2 base model + tokenizer (save_pretrained; AutoModel/AutoTokenizer/vLLM load it)
    <tiny.dir>/train.jsonl   RL train prompts (id, problem, answer, n_ops)
    <tiny.dir>/eval.jsonl    the AIME stand-in (tiny.n_eval problems, balanced over difficulty)
    <tiny.dir>/eval_large_<n>.jsonl  the large eval split (data.eval: tiny-large; drawn on first use, in seconds)
    <tiny.dir>/manifest.json seed, config, hash, build time, accuracy measured at build end

`ensure_tiny_world(cfg)` builds it when missing (or built from another tiny config) and returns `<tiny.dir>`;
`resolve_model_path(cfg)` turns `model.path: tiny` into `<tiny.dir>/model`, `resolve_source(cfg, split)` turns
`data.train` / `data.eval` (`tiny`, `tiny-large`) into file paths. `pinned_kernels(tiny.kernels)` is the environment
that pins the CPU kernels of the build and of the workflow's tiny runs. `TinyWorld(cfg)` is what the world adds to a
run, as the trainer's `World` plug-in (`dapo train` passes it in). Nothing heavy is imported here.
"""

from __future__ import annotations

from dapo.tinyworld.build import (
    TINY,
    TINY_LARGE,
    ensure_large_eval,
    ensure_tiny_world,
    resolve_model_path,
    resolve_source,
    tiny_paths,
)
from dapo.tinyworld.kernels import pinned_kernels
from dapo.tinyworld.plugin import TinyWorld

__all__ = [
    "TINY",
    "TINY_LARGE",
    "TinyWorld",
    "ensure_large_eval",
    "ensure_tiny_world",
    "pinned_kernels",
    "resolve_model_path",
    "resolve_source",
    "tiny_paths",
]
