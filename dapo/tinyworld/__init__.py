"""The tiny world: a CPU stand-in for Qwen2.5-32B + DAPO-Math-17k + AIME, built from code by `dapo build-tiny`. Its
files and functions: docs/architecture.md, "data/ and tinyworld/"; `TinyWorld(cfg)` is the trainer's `World` plug-in
(`dapo train` passes it in), `pinned_kernels` the build's CPU kernels. Nothing heavy is imported here."""

from __future__ import annotations

from dapo.tinyworld.build import ensure_large_eval, ensure_tiny_world, resolve_model_path, resolve_source, tiny_paths
from dapo.tinyworld.kernels import pinned_kernels
from dapo.tinyworld.plugin import TinyWorld

__all__ = [
    "TinyWorld",
    "ensure_large_eval",
    "ensure_tiny_world",
    "pinned_kernels",
    "resolve_model_path",
    "resolve_source",
    "tiny_paths",
]
