"""What the training loop talks to, as typed interfaces, and the one `Components` record that holds them.

The interfaces list only what the loop calls, so the tests' fakes satisfy them without subclassing anything:

- `RolloutEngine` (`dapo.rollout`): generate, sync_weights, sleep / wake_up. Every rank has one.
- `PolicyLearner`: `dapo.learner.Learner` as the loop uses it.
- `ReferencePolicy`: the frozen policy of the KL term (`algorithm.kl_coef > 0`); None in every DAPO row.
- `MetricsTracker`: `dapo.tracking.Tracker`; ranks other than 0 get a `NullTracker`.
"""

from __future__ import annotations

from collections.abc import Callable, Iterable, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any, Protocol

from dapo.types import Problem

if TYPE_CHECKING:
    from torch import Tensor

    from dapo.evaluation.evaluate import EvalSettings
    from dapo.learner.batch import PolicyBatch
    from dapo.rollout.base import RolloutEngine
    from dapo.types import GroupOutcome


class PolicyLearner(Protocol):
    """The policy being trained. Every method is collective: every rank calls it (with the whole batch)."""

    def schedule(self, rollout_step: int) -> float:
        """Set and return the learning rate of rollout step `rollout_step` (0-based), before its updates."""
        ...

    def compute_logprobs(self, batch: PolicyBatch) -> tuple[Tensor, Tensor]:
        """(log-probs [N, R], entropies [N, R]) of the batch's responses under the current weights, no grad. Every
        rank passes the whole batch; each computes its shard and all get every row."""
        ...

    def padded_fraction(self, batch: PolicyBatch, *, forward_only: bool) -> float:
        """The share of padding in what one pass over `batch` computes (`compute_logprobs`'s with `forward_only`,
        else an update's): arithmetic on lengths, not collective."""
        ...

    def update(self, batch: PolicyBatch, *, salt: int = 0) -> dict[str, float]:
        """One optimizer step on a mini-batch (every rank passes all of it and trains its shard); metrics keyed by
        `dapo.metric_names`. `salt` keys any random draw of the loss (the trainer's update count: the same again
        after a resume)."""
        ...

    def named_parameters_for_sync(self) -> Iterable[tuple[str, Tensor]]:
        """(Hugging Face name, full tensor), one at a time (gathered on demand from a sharded learner)."""
        ...

    def offload_states(self) -> None:
        """Free the accelerator for the colocated engine's generation (no-op on CPUs)."""
        ...

    def reload_states(self) -> None: ...

    def save_checkpoint(self, directory: Path) -> None: ...

    def load_checkpoint(self, directory: Path) -> None: ...

    def save_hf(self, directory: Path) -> None: ...


class ReferencePolicy(Protocol):
    """A frozen policy for the KL penalty: `compute_logprobs(batch)` -> reference log-probs [N, R] of the batch
    (collective, like the learner's: every rank passes the whole batch)."""

    def compute_logprobs(self, batch: PolicyBatch) -> Tensor: ...


class HabitTagger(Protocol):
    """What a world knows about its own responses (the tiny habits world: `dapo.tinyworld.habits.Tagger`): each
    response's habit tags, each problem's kind, and the step's habit metrics over every generated group."""

    def tags(self, problem: str, response: str, truncated: bool) -> tuple[str, ...]: ...

    def kind(self, problem: str) -> str: ...

    def metrics(self, generated: Sequence[GroupOutcome]) -> dict[str, float]: ...


class World(Protocol):
    """What a world, a model and data built rather than downloaded, adds to a run: where its names lead and what it
    knows of its responses. The command that wires a run provides it (`dapo.tinyworld.TinyWorld` for the tiny
    worlds); the trainer imports no world. A run of a hub model and hub data uses `PlainWorld`."""

    def model_path(self, path: str) -> str:
        """`model.path` as a loadable path or hub id (the tiny world's `tiny`: its base model, built on first use)."""
        ...

    def data_source(self, split: str, source: str) -> str:
        """`data.train` (split "train") or `data.eval` ("eval") as a loadable path or hub id."""
        ...

    def tagger(self, model_path: str) -> HabitTagger | None:
        """The tagger of runs that start from `model_path` (the habits world's base model), else None."""
        ...


class PlainWorld:
    """No world: names are what they say, responses carry no tags."""

    def model_path(self, path: str) -> str:
        return path

    def data_source(self, split: str, source: str) -> str:
        return source

    def tagger(self, model_path: str) -> HabitTagger | None:
        return None


class MetricsTracker(Protocol):
    run_id: str | None

    def log_params(self, params: dict[str, Any]) -> None: ...

    def set_tags(self, tags: dict[str, Any]) -> None: ...

    def log_metrics(self, metrics: dict[str, float], step: int) -> None: ...

    def log_artifact(self, path: Path, artifact_path: str | None = None) -> None: ...

    def flush(self) -> bool: ...

    def finish(self, status: str | None = "FINISHED") -> None: ...


class NullTracker:
    """The tracker of ranks other than 0: rank 0 alone talks to MLflow."""

    run_id: str | None = None

    def log_params(self, params: dict[str, Any]) -> None:
        pass

    def set_tags(self, tags: dict[str, Any]) -> None:
        pass

    def log_metrics(self, metrics: dict[str, float], step: int) -> None:
        pass

    def log_artifact(self, path: Path, artifact_path: str | None = None) -> None:
        pass

    def flush(self) -> bool:
        return True

    def finish(self, status: str | None = "FINISHED") -> None:
        pass


@dataclass
class EvalSet:
    """The eval problems, their prompt token ids, and how to sample and summarise them."""

    problems: list[Problem]
    prompts: list[list[int]]
    settings: EvalSettings


@dataclass
class Components:
    """Everything a run talks to (`setup.build_components` builds the real ones; tests pass fakes)."""

    engine: RolloutEngine
    learner: PolicyLearner
    problems: list[Problem]  # training prompts (raw) ...
    prompts: list[list[int]]  # ... and their token ids (template applied)
    make_tracker: Callable[[str | None], MetricsTracker]  # run id (None: a new run) -> tracker
    eval_set: EvalSet | None = None  # None: no evaluation
    reference: ReferencePolicy | None = None  # the KL term's frozen policy (algorithm.kl_coef > 0)
    tensor_parallel_size: int = 1  # ranks per rollout replica
    cleanup: Callable[[], None] | None = None  # after the engine is closed (e.g. the reward pool)
    tagger: HabitTagger | None = None  # the world's habit tags and metrics (the tiny habits world), or None

    def close(self) -> None:
        """Close the engine (after the run's last collective: vLLM's shutdown ends the process group)."""
        try:
            self.engine.close()
        finally:
            if self.cleanup is not None:
                self.cleanup()
