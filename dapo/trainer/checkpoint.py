"""Atomic run checkpoints: write to a temporary folder, fsync, rename; a half-written one is never loaded.

Layout of `<run-dir>/checkpoints/`:

    step_000010/            completed rollout steps = 10
        learner/            model, optimizer and lr schedule (the learner's own save_checkpoint)
        trainer_state.json  counters, data-order position, MLflow run id, the config hash
        rng.pt              python, numpy and torch RNG states
        refill.pt           (only when stopped in the middle of a dynamic-sampling refill) the groups kept so far
        COMPLETE            written last, before the rename
    step_000012.1/          a second checkpoint at the same step count (e.g. a stop mid-refill after a
                            periodic checkpoint); later suffixes win

A folder is a checkpoint only if its name parses and it holds COMPLETE; `.tmp-*` folders (a crash while
writing) are ignored and swept on the next save. Pruning keeps the newest `keep` checkpoints.
"""

from __future__ import annotations

import json
import os
import random
import re
import shutil
from collections.abc import Callable
from pathlib import Path
from typing import Any

import numpy as np
import torch

_NAME = re.compile(r"^step_(\d{6,})(?:\.(\d+))?$")
COMPLETE = "COMPLETE"
STATE_FILE = "trainer_state.json"
RNG_FILE = "rng.pt"
REFILL_FILE = "refill.pt"
LEARNER_DIR = "learner"


def checkpoints_dir(run_dir: Path) -> Path:
    return Path(run_dir) / "checkpoints"


def list_checkpoints(run_dir: Path) -> list[Path]:
    """Complete checkpoints, oldest first (by step, then suffix)."""
    root = checkpoints_dir(run_dir)
    if not root.is_dir():
        return []
    found = []
    for p in root.iterdir():
        m = _NAME.match(p.name)
        if m and p.is_dir() and (p / COMPLETE).is_file():
            found.append(((int(m.group(1)), int(m.group(2) or 0)), p))
    return [p for _, p in sorted(found)]


def latest_checkpoint(run_dir: Path) -> Path | None:
    ckpts = list_checkpoints(run_dir)
    return ckpts[-1] if ckpts else None


def _fsync_tree(root: Path) -> None:
    """fsync every file and folder under root (and root), so the rename publishes durable data."""
    for dirpath, _, files in os.walk(root):
        for f in files:
            fd = os.open(os.path.join(dirpath, f), os.O_RDONLY)
            try:
                os.fsync(fd)
            finally:
                os.close(fd)
        _fsync_dir(Path(dirpath))


def _fsync_dir(path: Path) -> None:
    fd = os.open(path, os.O_RDONLY)
    try:
        os.fsync(fd)
    finally:
        os.close(fd)


def rng_state() -> dict[str, Any]:
    state: dict[str, Any] = {
        "python": random.getstate(),
        "numpy": np.random.get_state(),
        "torch": torch.get_rng_state(),
    }
    if torch.cuda.is_available():
        state["cuda"] = torch.cuda.get_rng_state_all()
    return state


def set_rng_state(state: dict[str, Any]) -> None:
    random.setstate(state["python"])
    np.random.set_state(state["numpy"])
    torch.set_rng_state(state["torch"])
    if "cuda" in state and torch.cuda.is_available():
        torch.cuda.set_rng_state_all(state["cuda"])


def save_checkpoint(
    run_dir: Path,
    step: int,
    state: dict[str, Any],
    save_learner: Callable[[Path], None],
    *,
    refill: Any = None,
    keep: int = 2,
    rng: dict[str, Any] | None = None,
) -> Path:
    """Write checkpoint `step` atomically and prune old ones; returns its folder.

    Args:
        run_dir: the run directory.
        step: completed rollout steps.
        state: JSON-able trainer state (counters, data order, MLflow run id, ...).
        save_learner: writes the learner's model/optimizer/scheduler into the folder it is given.
        refill: picklable partial dynamic-sampling state (None at a step boundary).
        keep: how many complete checkpoints to keep (the new one included).
        rng: RNG states to store (default: the current ones).
    """
    # Several ranks (torchrun/srun): every rank writes its learner part (DeepSpeed, collective) into the folder
    # rank 0 picked; rank 0 alone writes the trainer's files and publishes the folder with the rename.
    from dapo import distributed as dist

    root = checkpoints_dir(run_dir)
    tmp = final = None
    if dist.is_main():
        root.mkdir(parents=True, exist_ok=True)
        for stale in root.glob(".tmp-*"):  # a previous save that crashed half-way
            shutil.rmtree(stale, ignore_errors=True)
        name = f"step_{step:06d}"
        suffix = 0
        while (root / name).exists():
            suffix += 1
            name = f"step_{step:06d}.{suffix}"
        tmp, final = root / f".tmp-{name}-{os.getpid()}", root / name
        tmp.mkdir()
    tmp, final = dist.broadcast((tmp, final))
    save_learner(tmp / LEARNER_DIR)
    dist.barrier()
    if dist.is_main():
        (tmp / STATE_FILE).write_text(json.dumps(state, indent=1, sort_keys=True))
        torch.save(rng if rng is not None else rng_state(), tmp / RNG_FILE)
        if refill is not None:
            torch.save(refill, tmp / REFILL_FILE)
        (tmp / COMPLETE).write_text(final.name + "\n")
        _fsync_tree(tmp)
        os.rename(tmp, final)
        _fsync_dir(root)
        prune(run_dir, keep)
    dist.barrier()  # no rank goes on (or reads the checkpoint list) before the folder is published
    return final


def prune(run_dir: Path, keep: int) -> None:
    """Delete all but the newest `keep` complete checkpoints (never the newest)."""
    for old in list_checkpoints(run_dir)[: -max(keep, 1)]:
        # Rename first so that a crash mid-delete leaves no folder that looks complete but is not.
        doomed = old.with_name(f".tmp-deleting-{old.name}")
        os.rename(old, doomed)
        shutil.rmtree(doomed, ignore_errors=True)


def load_checkpoint_state(path: Path) -> tuple[dict[str, Any], dict[str, Any], Any]:
    """(trainer state, rng state, refill state or None) of a checkpoint folder. Our own files: full unpickle."""
    if not (path / COMPLETE).is_file():
        raise FileNotFoundError(f"{path} is not a complete checkpoint (no {COMPLETE} marker)")
    state = json.loads((path / STATE_FILE).read_text())
    rng = torch.load(path / RNG_FILE, weights_only=False)
    refill = torch.load(path / REFILL_FILE, weights_only=False) if (path / REFILL_FILE).is_file() else None
    return state, rng, refill
