"""Build the loop's components from a `RunConfig`: the config stops here, everything below gets plain values."""

from __future__ import annotations

import functools
import subprocess
from pathlib import Path
from typing import Any

from dapo import metric_names as M
from dapo.config import REPO_ROOT, RunConfig


@functools.cache
def git_commit() -> str:
    """The repository's commit (with `-dirty` when the tree has changes), or "unknown" outside a checkout."""
    try:
        sha = subprocess.run(["git", "-C", str(REPO_ROOT), "rev-parse", "HEAD"], capture_output=True, text=True,
                             timeout=10, check=True).stdout.strip()
        dirty = subprocess.run(["git", "-C", str(REPO_ROOT), "status", "--porcelain", "--untracked-files=no"],
                               capture_output=True, text=True, timeout=10).stdout.strip()
        return sha + ("-dirty" if dirty else "")
    except (OSError, subprocess.SubprocessError):
        return "unknown"


def run_tags(cfg: RunConfig) -> dict[str, str]:
    """MLflow tags that line runs up in the UI's compare view."""
    return {M.TAG_ROW: cfg.tracking.row, M.TAG_SEED: str(cfg.trainer.seed), M.TAG_PRESET: cfg.tracking.preset,
            M.TAG_GIT: git_commit(), M.TAG_CONFIG_HASH: cfg.config_hash()}


def build_components(cfg: RunConfig, run_dir: Path) -> Any:
    """Tiny world (when asked for), data, tokenizer, rollout engine, learner, reward, eval and tracker."""
    raise NotImplementedError("wired in once the learner, data and evaluation modules land")
