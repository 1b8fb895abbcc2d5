"""Atomic run checkpoints that load no pickles: write to a temporary folder, fsync, rename (never half-written).

Layout of `<run-dir>/checkpoints/`:

    step_000010/            completed rollout steps = 10
        learner/            model, optimizer and lr schedule (the learner's own save_checkpoint: DeepSpeed)
        trainer_state.json  counters, data-order position, MLflow run id, the config hash
        rng.json            python and numpy RNG states
        rng.safetensors     torch (and CUDA) RNG states
        partial.json        (only when stopped in the middle of a rollout step) what the step had done: the refill
        partial.safetensors   so far, or the collected groups, the batch and its old log-probs, the updates done
        carry.json          (carry-over runs, `rollout.max_staleness` >= 1) the groups in flight: their tokens,
                            log-probs, weight versions and scores so far, consistent with the data order's position
        COMPLETE            written last, before the rename
    step_000012.1/          a second checkpoint at the same step count (e.g. a stop mid-refill after a
                            periodic checkpoint); later suffixes win

A folder is a checkpoint only if its name parses and it holds COMPLETE; `.tmp-*` folders (a crash while writing)
are swept on the next save. Pruning keeps the newest `keep`.

Nothing here executes code from a checkpoint: our files are JSON and safetensors, a part-done step goes through a codec
knowing only `step.PARTIAL_STEP_TYPES`, and DeepSpeed's files are read with `torch.load(weights_only=True)` and three
allowlisted DeepSpeed classes (`load_learner`). Anything else is refused (`CheckpointError`); no full-unpickle switch.
"""

from __future__ import annotations

import contextlib
import dataclasses
import json
import os
import random
import re
import shutil
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import numpy as np
import torch

from dapo.fsio import fsync_dir

_NAME = re.compile(r"^step_(\d{6,})(?:\.(\d+))?$")
COMPLETE = "COMPLETE"
STATE_FILE = "trainer_state.json"
RNG_FILE = "rng.json"
RNG_TENSORS = "rng.safetensors"
PARTIAL_FILE = "partial.json"
PARTIAL_TENSORS = "partial.safetensors"
CARRY_FILE = "carry.json"
LEARNER_DIR = "learner"


class CheckpointError(RuntimeError):
    """A checkpoint that cannot be loaded safely (or at all); the message says what to do."""


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
        fsync_dir(Path(dirpath))


# ------------------------------------------------------------------------------------------------ RNG
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


def _save_rng(state: dict[str, Any], folder: Path) -> None:
    from safetensors.torch import save_file

    version, mt, gauss = state["python"]
    kind, keys, pos, has_gauss, cached = state["numpy"]
    doc = {
        "python": {"version": version, "state": list(mt), "gauss_next": gauss},
        "numpy": {"kind": kind, "keys": np.asarray(keys).tolist(), "pos": int(pos), "has_gauss": int(has_gauss)},
    }
    doc["numpy"]["cached_gaussian"] = float(cached)
    (folder / RNG_FILE).write_text(json.dumps(doc))
    tensors = {"torch": state["torch"].contiguous()}
    tensors.update({f"cuda.{i}": t.contiguous() for i, t in enumerate(state.get("cuda", []))})
    save_file(tensors, str(folder / RNG_TENSORS))


def _load_rng(folder: Path) -> dict[str, Any]:
    from safetensors.torch import load_file

    doc = json.loads((folder / RNG_FILE).read_text())
    py, npy = doc["python"], doc["numpy"]
    tensors = load_file(str(folder / RNG_TENSORS))
    state: dict[str, Any] = {
        "python": (py["version"], tuple(py["state"]), py["gauss_next"]),
        "numpy": (
            npy["kind"],
            np.asarray(npy["keys"], dtype=np.uint32),
            npy["pos"],
            npy["has_gauss"],
            npy["cached_gaussian"],
        ),
        "torch": tensors["torch"],
    }
    cuda = sorted((int(k.split(".")[1]), t) for k, t in tensors.items() if k.startswith("cuda."))
    if cuda:
        state["cuda"] = [t for _, t in cuda]
    return state


# ------------------------------------------------------------------------------------ part-done step codec
def _codec_types() -> dict[str, type]:
    """The only types a part-done step may hold besides JSON values and tensors."""
    from dapo.trainer.step import PARTIAL_STEP_TYPES

    return {t.__name__: t for t in PARTIAL_STEP_TYPES}


def encode_partial(obj: Any, tensors: dict[str, torch.Tensor]) -> Any:
    """A part-done step as JSON values: tensors go into `tensors` (named in place); an allowed type becomes
    {"__type__": name, "fields": ...} (its dataclass fields, or its `state_dict()`)."""
    if obj is None or isinstance(obj, bool | int | float | str):
        return obj
    if isinstance(obj, torch.Tensor):
        name = f"t{len(tensors)}"
        tensors[name] = obj.detach().cpu().clone()  # a copy: safetensors refuses tensors that share memory
        return {"__tensor__": name}
    if isinstance(obj, list | tuple):
        return [encode_partial(x, tensors) for x in obj]
    if isinstance(obj, dict):
        if not all(isinstance(k, str) for k in obj) or {"__type__", "__tensor__"} & set(obj):
            raise TypeError(f"a checkpoint's dict keys must be strings (not __type__/__tensor__): {list(obj)[:5]}")
        return {k: encode_partial(v, tensors) for k, v in obj.items()}
    cls = _codec_types().get(type(obj).__name__)
    if cls is type(obj):
        if hasattr(cls, "from_state_dict"):
            fields = obj.state_dict()
        else:
            fields = {f.name: getattr(obj, f.name) for f in dataclasses.fields(obj)}
        return {"__type__": cls.__name__, "fields": encode_partial(fields, tensors)}
    raise TypeError(
        f"cannot store a {type(obj).__module__}.{type(obj).__qualname__} in a checkpoint: add it to "
        "dapo.trainer.step.PARTIAL_STEP_TYPES (JSON values, tensors and the types listed there only)"
    )


def decode_partial(doc: Any, tensors: dict[str, torch.Tensor]) -> Any:
    if isinstance(doc, list):
        return [decode_partial(x, tensors) for x in doc]
    if not isinstance(doc, dict):
        return doc
    if "__tensor__" in doc:
        return tensors[doc["__tensor__"]]
    if "__type__" in doc:
        cls = _codec_types().get(doc["__type__"])
        if cls is None:
            raise CheckpointError(f"a checkpoint's part-done step names an unknown type {doc['__type__']!r}")
        fields = decode_partial(doc["fields"], tensors)
        return cls.from_state_dict(fields) if hasattr(cls, "from_state_dict") else cls(**fields)
    return {k: decode_partial(v, tensors) for k, v in doc.items()}


# ------------------------------------------------------------------------------------------ save
def save_checkpoint(
    run_dir: Path,
    step: int,
    state: dict[str, Any],
    save_learner: Callable[[Path], None],
    *,
    refill: Any = None,
    keep: int = 2,
    rng: dict[str, Any] | None = None,
    carry: Any = None,
) -> Path:
    """Write checkpoint `step` (completed rollout steps) atomically, prune to `keep` (the new one included), return
    its folder. `state`: JSON-able trainer state; `save_learner(folder)`: the learner's DeepSpeed save; `refill`: what
    a step cut off by a stop had done (None at a boundary); `rng`: default the current states; `carry`: the groups in
    flight (carry-over runs; None: none kept)."""
    # Every rank writes its learner part (collective) into the folder rank 0 picked; rank 0 writes the rest and renames.
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
        _save_rng(rng if rng is not None else rng_state(), tmp)
        if refill is not None:
            from safetensors.torch import save_file

            tensors: dict[str, torch.Tensor] = {}
            (tmp / PARTIAL_FILE).write_text(json.dumps(encode_partial(refill, tensors)))
            save_file(tensors, str(tmp / PARTIAL_TENSORS))
        if carry is not None:
            held: dict[str, torch.Tensor] = {}
            (tmp / CARRY_FILE).write_text(json.dumps(encode_partial(carry, held)))
            if held:
                raise TypeError("the groups in flight hold tokens and log-probs as lists, never tensors")
        (tmp / COMPLETE).write_text(final.name + "\n")
        _fsync_tree(tmp)
        publish(tmp, final)
        prune(run_dir, keep)
    dist.barrier()  # no rank goes on (or reads the checkpoint list) before the folder is published
    return final


def publish(tmp: Path, final: Path) -> None:
    """Rename a complete temporary folder into place (atomic) and make the rename durable."""
    os.rename(tmp, final)
    fsync_dir(final.parent)


def prune(run_dir: Path, keep: int) -> None:
    """Delete all but the newest `keep` complete checkpoints (never the newest)."""
    for old in list_checkpoints(run_dir)[: -max(keep, 1)]:
        # Rename first so that a crash mid-delete leaves no folder that looks complete but is not.
        doomed = old.with_name(f".tmp-deleting-{old.name}")
        os.rename(old, doomed)
        shutil.rmtree(doomed, ignore_errors=True)


# ------------------------------------------------------------------------------------------ load
def load_checkpoint_state(path: Path) -> tuple[dict[str, Any], dict[str, Any], Any]:
    """(trainer state, rng state, refill state or None) of a checkpoint folder, without unpickling anything."""
    if not (path / COMPLETE).is_file():
        raise FileNotFoundError(f"{path} is not a complete checkpoint (no {COMPLETE} marker)")
    if not (path / RNG_FILE).is_file():
        raise CheckpointError(
            f"{path} has no {RNG_FILE}: not a checkpoint this version writes. Delete the folder (the run restarts "
            "from the checkpoint before it, or from scratch)."
        )
    state = json.loads((path / STATE_FILE).read_text())
    rng = _load_rng(path)
    refill = None
    if (path / PARTIAL_FILE).is_file():
        from safetensors.torch import load_file

        tensors = load_file(str(path / PARTIAL_TENSORS)) if (path / PARTIAL_TENSORS).is_file() else {}
        refill = decode_partial(json.loads((path / PARTIAL_FILE).read_text()), tensors)
    return state, rng, refill


def load_carry(path: Path) -> Any:
    """The groups in flight a carry-over run's checkpoint kept (`step.PARTIAL_STEP_TYPES`' codec), or None."""
    if not (path / CARRY_FILE).is_file():
        return None
    return decode_partial(json.loads((path / CARRY_FILE).read_text()), {})


# DeepSpeed's checkpoints pickle these beside tensors (ZeRO 1-3, fp32 and bf16): data classes and an enum.
DEEPSPEED_SAFE_GLOBALS = (
    "deepspeed.runtime.fp16.loss_scaler.LossScaler",
    "deepspeed.runtime.zero.config.ZeroStageEnum",
    "deepspeed.utils.tensor_fragment.fragment_address",
)


@contextlib.contextmanager
def weights_only_loads() -> Iterator[None]:
    """Every `torch.load` inside (DeepSpeed's weights_only=False too) unpickles only tensors, containers and the
    allowlisted DeepSpeed classes."""
    import importlib

    allowed = []
    for name in DEEPSPEED_SAFE_GLOBALS:
        module, _, attr = name.rpartition(".")
        with contextlib.suppress(ImportError, AttributeError):
            allowed.append(getattr(importlib.import_module(module), attr))
    previous = os.environ.get("TORCH_FORCE_WEIGHTS_ONLY_LOAD")
    os.environ["TORCH_FORCE_WEIGHTS_ONLY_LOAD"] = "1"
    try:
        with torch.serialization.safe_globals(allowed):
            yield
    finally:
        if previous is None:
            os.environ.pop("TORCH_FORCE_WEIGHTS_ONLY_LOAD", None)
        else:
            os.environ["TORCH_FORCE_WEIGHTS_ONLY_LOAD"] = previous


def load_learner(learner: Any, path: Path) -> None:
    """Restore the learner's DeepSpeed state from checkpoint folder `path`, refusing pickled code."""
    import pickle

    try:
        with weights_only_loads():
            learner.load_checkpoint(path / LEARNER_DIR)
    except pickle.UnpicklingError as e:
        raise CheckpointError(_refusal(path / LEARNER_DIR, e)) from None


def _refusal(path: Path, e: BaseException) -> str:
    found = re.search(r"GLOBAL ([\w.]+)", str(e))
    what = f"it needs `{found.group(1)}`, which is not on the allowlist" if found else str(e).splitlines()[0]
    return (
        f"{path}: refused to load: {what}. Loading it would run code stored in the file. If this checkpoint "
        f"came from elsewhere, do not resume from it: delete the checkpoint folder (the run restarts from the "
        "one before, or from scratch)."
    )
