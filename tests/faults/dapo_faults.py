"""Faults injected into a `dapo` run from outside the package, for the tests that prove a run survives them.

A process started with this folder on PYTHONPATH (`_env.child_env` does it) and one of these variables set gets
the fault, installed by `sitecustomize` as each `dapo` module is imported; a test in the pytest process applies
the same patches with `install(faults, monkeypatch.setattr)`:

    DAPO_TEST_KILL_AT=POINT[:N]  SIGKILL the process the N-th time (default 1) it passes POINT (`POINTS`)
    DAPO_TEST_FAIL_AT=RANK:STEP  that rank raises in rollout step STEP's first update; STEP 0: while the run's
                                 parts are built, before the learner joins the others in its first collective
    DAPO_TEST_POISON_STEP=S      from rollout step S on, advantages are NaN, so every update's loss is non-finite
    DAPO_TEST_SYNC=skip:TEXT     the weight sync after each step streams no tensor whose name contains TEXT (a layer
                                 the engine's loader skips); DAPO_TEST_SYNC=nothing: it streams none at all
    DAPO_TEST_SYNC=drain|copy    the engine reads the whole stream and loads none of it (drain), or loads it into
                                 copies the model does not use (copy): `plant_sync_fault`
    DAPO_TEST_SAME_SEEDS=R       each prompt's sample seeds repeat R times, as R replicas drawing the same seeds give
                                 (each its share of the group: samples 0 .. G/R - 1 again); R = G: one seed a group
    DAPO_TEST_HOLD=PATH          each rollout step waits to start while the file PATH exists (a test removes it when
                                 what it must see while the run is in progress has happened)
    DAPO_TEST_SLOW_AT=RANK:STEP:SECONDS:MARKER[,...]
                                 that rank, in rollout step STEP's first update, creates the file MARKER and sleeps
                                 SECONDS, once per run (not again when MARKER exists: the resumed step runs at full
                                 speed), so that the others wait for it in a collective mid-step while a test kills a
                                 host or cuts a link

Every point wraps a function the package has anyway, at a boundary where a crash could leave MLflow and the run
directory disagreeing: the patches below name them.
"""

from __future__ import annotations

import dataclasses
import functools
import importlib.abc
import importlib.util
import os
import signal
import sys
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

KILL_ENV, FAIL_ENV, POISON_ENV = "DAPO_TEST_KILL_AT", "DAPO_TEST_FAIL_AT", "DAPO_TEST_POISON_STEP"
SYNC_ENV, SEEDS_ENV, HOLD_ENV = "DAPO_TEST_SYNC", "DAPO_TEST_SAME_SEEDS", "DAPO_TEST_HOLD"
SLOW_ENV = "DAPO_TEST_SLOW_AT"
ENV_VARS = (KILL_ENV, FAIL_ENV, POISON_ENV, SYNC_ENV, SEEDS_ENV, HOLD_ENV, SLOW_ENV)
POINTS = (
    "tracking.before_log",  # a step's metrics are about to be written (or spooled): Tracker.log_metrics starts
    "tracking.after_log",  # they were written (or spooled): Tracker.log_metrics returned
    "tracking.replayed",  # spooled records were sent, the spool file not yet rewritten
    "checkpoint.written",  # a checkpoint's files are complete in its temporary folder: checkpoint.publish starts
    "checkpoint.published",  # renamed into place, older checkpoints not yet pruned: checkpoint.publish returned
    "checkpoint.pruned",  # older checkpoints deleted: checkpoint.prune returned
)


@dataclass(frozen=True)
class Faults:
    __test__ = False  # not a pytest class

    kill_at: tuple[str, int] | None = None  # (point, n-th pass)
    fail_at: tuple[int, int] | None = None  # (rank, rollout step)
    poison_from_step: int = 0
    sync: str = ""  # "" | "nothing" | "skip:<text>" | "drain" | "copy"
    same_seeds: int = 0  # R: the replicas that share seeds (0: none)
    hold: str = ""  # a file whose existence holds each rollout step back ("": none)
    slow_at: tuple[tuple[int, int, float, str], ...] = ()  # (rank, rollout step, seconds, marker file)

    @classmethod
    def from_env(cls, env: dict[str, str] | os._Environ = os.environ) -> Faults:
        kill, fail = env.get(KILL_ENV, ""), env.get(FAIL_ENV, "")
        point, _, nth = kill.partition(":")
        if kill and point not in POINTS:
            raise ValueError(f"{KILL_ENV}={kill!r}: no such point; points are {POINTS}")
        rank, _, step = fail.partition(":")
        return cls(
            kill_at=(point, int(nth or 1)) if kill else None,
            fail_at=(int(rank), int(step)) if fail else None,
            poison_from_step=int(env.get(POISON_ENV, "0") or 0),
            sync=env.get(SYNC_ENV, ""),
            same_seeds=int(env.get(SEEDS_ENV, "0") or 0),
            hold=env.get(HOLD_ENV, ""),
            slow_at=tuple(
                (int(r), int(st), float(sec), marker)
                for r, st, sec, marker in (x.split(":", 3) for x in env.get(SLOW_ENV, "").split(",") if x)
            ),
        )


_passes: dict[str, int] = {}
_step = [0]  # the rollout step in progress (set by the wrapped `rollout_step`)


def _kill_point(faults: Faults, name: str) -> None:
    if faults.kill_at is None or faults.kill_at[0] != name:
        return
    _passes[name] = _passes.get(name, 0) + 1
    if _passes[name] == faults.kill_at[1]:
        os.kill(os.getpid(), signal.SIGKILL)


def _around(fn: Callable, faults: Faults, before: str | None = None, after: str | None = None) -> Callable:
    @functools.wraps(fn)
    def wrapped(*args: Any, **kwargs: Any) -> Any:
        if before:
            _kill_point(faults, before)
        out = fn(*args, **kwargs)
        if after:
            _kill_point(faults, after)
        return out

    return wrapped


class FaultyLearner:
    """A learner whose `update` fails or is poisoned at the chosen rollout step; everything else delegates."""

    def __init__(self, inner: Any, faults: Faults) -> None:
        self._inner, self._faults = inner, faults

    def update(self, batch: Any, *, salt: int = 0) -> dict[str, float]:
        import torch

        from dapo import distributed as dist

        f, step = self._faults, _step[0]
        for rank, at, seconds, marker in f.slow_at:
            if (rank, at) == (dist.rank(), step) and not os.path.exists(marker):
                import time

                open(marker, "w").close()
                time.sleep(seconds)
        if f.fail_at is not None and f.fail_at == (dist.rank(), step):
            raise RuntimeError(f"test hook {FAIL_ENV}: rank {dist.rank()} fails in rollout step {step}")
        if f.poison_from_step and step >= f.poison_from_step:
            batch = dataclasses.replace(batch, advantages=torch.full_like(batch.advantages, float("nan")))
        return self._inner.update(batch, salt=salt)

    def __getattr__(self, name: str) -> Any:
        return getattr(self._inner, name)


def _kills_in(faults: Faults, part: str) -> bool:
    return faults.kill_at is not None and faults.kill_at[0].startswith(part + ".")


def _patch_loop(module: Any, faults: Faults, setattr_: Callable) -> None:
    if faults.fail_at is None and not faults.poison_from_step and not faults.hold and not faults.slow_at:
        return
    step_fn = module.rollout_step

    @functools.wraps(step_fn)
    def rollout_step(step: int, *args: Any, **kwargs: Any) -> Any:
        import time

        while faults.hold and os.path.exists(faults.hold):
            time.sleep(0.2)
        _step[0] = step
        return step_fn(step, *args, **kwargs)

    setattr_(module, "rollout_step", rollout_step)


def _patch_setup(module: Any, faults: Faults, setattr_: Callable) -> None:
    if faults.fail_at is None and not faults.poison_from_step and not faults.slow_at:
        return
    build = module.build_components

    @functools.wraps(build)
    def build_components(*args: Any, **kwargs: Any) -> Any:
        from dapo import distributed as dist

        if faults.fail_at is not None and faults.fail_at == (dist.rank(), 0):
            raise RuntimeError(f"test hook {FAIL_ENV}: rank {dist.rank()} fails while the run is built")
        c = build(*args, **kwargs)
        return dataclasses.replace(c, learner=FaultyLearner(c.learner, faults))

    setattr_(module, "build_components", build_components)


def _patch_checkpoint(module: Any, faults: Faults, setattr_: Callable) -> None:
    if not _kills_in(faults, "checkpoint"):
        return
    setattr_(module, "publish", _around(module.publish, faults, "checkpoint.written", "checkpoint.published"))
    setattr_(module, "prune", _around(module.prune, faults, after="checkpoint.pruned"))


def _patch_tracking(module: Any, faults: Faults, setattr_: Callable) -> None:
    if not _kills_in(faults, "tracking"):
        return
    t = module.Tracker
    setattr_(t, "log_metrics", _around(t.log_metrics, faults, "tracking.before_log", "tracking.after_log"))
    journal = module.SpoolJournal
    setattr_(journal, "rewrite", _around(journal.rewrite, faults, before="tracking.replayed"))


ENGINE_SYNC_FAULTS = ("drain", "copy")


class _Sink(dict):
    """A model's state_dict that finds every name and keeps nothing: each tensor is copied into a throwaway."""

    def get(self, name: str, default: Any = None) -> Any:
        real = super().get(name)
        return None if real is None else real.detach().clone()


def plant_sync_fault(engine: Any, mode: str, setattr_: Callable = setattr) -> None:
    """Make `engine`'s weight syncs read every tensor and apply none, as an engine would that
    - "drain": reads the stream and loads nothing (vLLM: a `reload_weights` that drains its iterator and returns;
      transformers: every tensor copied into a throwaway),
    - "copy": loads into copies the model does not use (vLLM: the layer-wise loader fills each layer's temporary
      tensors and puts the old ones back, unprocessed; transformers: the load writes into clones of the parameters).
    The engine's own checks (the stream count, vLLM's skip log) see nothing wrong with either."""
    import torch

    llm = getattr(engine, "llm", None)
    if llm is not None and mode == "drain":
        rpc = llm.collective_rpc

        def drained(method: Any, timeout: Any = None, args: tuple = (), kwargs: dict | None = None) -> Any:
            if method != "reload_weights":
                return rpc(method, timeout, args, kwargs)
            for _ in kwargs["weights_iterator"]:
                pass
            return [None]

        setattr_(llm, "collective_rpc", drained)
    elif llm is not None:
        from vllm.model_executor.model_loader.reload import layerwise as lw

        def load_into_copy(layer: torch.nn.Module, info: Any) -> None:  # vLLM 0.32's `_layerwise_process`, cut short
            lw.materialize_layer(layer, info)
            for param in lw.get_layer_tensors(layer).values():
                param.weight_loader = lw._get_original_loader(param)
            for name, bound in info.loaded_weights:
                bound.arguments["param"] = getattr(layer, name)
                getattr(layer, name).weight_loader(*bound.args, **bound.kwargs)
            lw._place_kernel_tensors(layer, info)  # the old tensors back; the loaded ones dropped
            info.reset()

        setattr_(lw, "_layerwise_process", load_into_copy)
    else:
        state_dict = engine.model.state_dict
        if mode == "drain":
            setattr_(engine.model, "state_dict", lambda *a, **k: _Sink(state_dict(*a, **k)))
        else:
            clones = lambda *a, **k: {n: t.detach().clone() for n, t in state_dict(*a, **k).items()}  # noqa: E731
            setattr_(engine.model, "state_dict", clones)


def _patch_engine_class(module: Any, faults: Faults, setattr_: Callable) -> None:
    if faults.sync not in ENGINE_SYNC_FAULTS:
        return
    cls = module.VLLMEngine if hasattr(module, "VLLMEngine") else module.HFEngine
    init = cls.__init__

    @functools.wraps(init)
    def planted(self: Any, *args: Any, **kwargs: Any) -> None:
        init(self, *args, **kwargs)
        plant_sync_fault(self, faults.sync)

    setattr_(cls, "__init__", planted)


def _patch_step(module: Any, faults: Faults, setattr_: Callable) -> None:
    if not faults.sync or faults.sync in ENGINE_SYNC_FAULTS:
        return

    def sync(engine: Any, learner: Any) -> float:
        stream = learner.named_parameters_for_sync()
        if faults.sync == "nothing":
            kept: Any = iter(())
        else:
            text = faults.sync.removeprefix("skip:")
            kept = ((n, t) for n, t in stream if text not in n)
        engine.sync_weights(kept)
        return 0.0

    setattr_(module, "sync", sync)


def _patch_replicas(module: Any, faults: Faults, setattr_: Callable) -> None:
    if not faults.same_seeds:
        return
    share_seeds = module.share_seeds

    def same(*args: Any, **kwargs: Any) -> list[list[int]]:
        seeds = share_seeds(*args, **kwargs)
        return [[g[j % max(1, len(g) // faults.same_seeds)] for j in range(len(g))] for g in seeds]

    setattr_(module, "share_seeds", same)


PATCHES: dict[str, Callable[[Any, Faults, Callable], None]] = {
    "dapo.trainer.step": _patch_step,
    "dapo.rollout.replicas": _patch_replicas,
    "dapo.rollout.vllm_engine": _patch_engine_class,
    "dapo.rollout.hf_engine": _patch_engine_class,
    "dapo.trainer.loop": _patch_loop,
    "dapo.trainer.setup": _patch_setup,
    "dapo.trainer.checkpoint": _patch_checkpoint,
    "dapo.tracking": _patch_tracking,
}


def install(faults: Faults, setattr_: Callable = setattr) -> None:
    """Patch the modules now (a test in the pytest process passes `monkeypatch.setattr`, which undoes them)."""
    for name, patch in PATCHES.items():
        patch(importlib.import_module(name), faults, setattr_)


class _PatchAfterImport(importlib.abc.MetaPathFinder):
    """Patches each module of `PATCHES` right after Python executes it, before anything imports names from it."""

    def __init__(self, faults: Faults) -> None:
        self.faults = faults

    def find_spec(self, name: str, path: Any = None, target: Any = None) -> Any:
        patch = PATCHES.get(name)
        if patch is None:
            return None
        sys.meta_path.remove(self)
        try:
            spec = importlib.util.find_spec(name)
        finally:
            sys.meta_path.insert(0, self)
        if spec is None or spec.loader is None:
            return spec
        execute = spec.loader.exec_module

        def exec_module(module: Any) -> None:
            execute(module)
            patch(module, self.faults, setattr)

        spec.loader.exec_module = exec_module  # type: ignore[method-assign]
        return spec


def install_on_import(faults: Faults) -> None:
    sys.meta_path.insert(0, _PatchAfterImport(faults))
