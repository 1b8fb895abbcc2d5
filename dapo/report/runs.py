"""What the report reads out of a tracking store, as plain data: one `RunData` per (row, seed) with its metric
histories (`Series`), and the `Experiment` that holds them. `dapo.report.load` fills them from MLflow; every
table, figure and statistic of the report reads them, so none of those needs the loader (or MLflow).
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Literal

import numpy as np

from dapo import metric_names as M

XAxis = Literal["updates", "rollout"]


class ExperimentNotFound(LookupError):
    """The experiment name is not in the tracking store (the message lists the ones that are)."""


@dataclass
class Series:
    """One metric's history: `steps` [S] rollout steps (sorted on construction), `values` [S]."""

    steps: np.ndarray
    values: np.ndarray

    def __post_init__(self) -> None:
        order = np.argsort(np.asarray(self.steps), kind="stable")  # "last" means the latest step
        self.steps = np.asarray(self.steps, dtype=int)[order]
        self.values = np.asarray(self.values, dtype=float)[order]

    def last(self) -> tuple[int, float]:
        return int(self.steps[-1]), float(self.values[-1])

    def at(self, step: int) -> float | None:
        hit = np.nonzero(self.steps == step)[0]
        return float(self.values[hit[-1]]) if hit.size else None


@dataclass
class RunData:
    run_id: str
    name: str
    row: str
    seed: int | None
    status: str  # dapo.status tag, else MLflow's own status (lower case)
    params: dict[str, str]
    tags: dict[str, str]
    start_ms: int | None
    end_ms: int | None
    history: dict[str, Series] = field(default_factory=dict)
    # final eval, per problem id: percent of its samples correct (None: the run has no samples artifact)
    problems: dict[str, float] | None = None

    @property
    def label(self) -> str:
        return self.name or f"{self.row}-s{self.seed}"

    def updates_per_step(self) -> int | None:
        """train_batch_size // mini_batch_size * epochs from the run's params (None when absent)."""
        try:
            tb = int(self.params["trainer.train_batch_size"])
            mb = int(self.params["trainer.mini_batch_size"])
            ep = int(self.params.get("trainer.epochs", 1))
        except (KeyError, ValueError):
            return None
        return (tb // mb) * ep if mb > 0 else None

    def x_of(self, steps: np.ndarray, axis: XAxis) -> np.ndarray:
        """Map rollout steps [S] to the chosen x-axis [S]: rollout steps, or cumulative gradient updates from the run's
        own GRAD_UPDATES history (interpolated), so a run whose updates per step vary (dynamic sampling at its refill
        cap) is drawn truthfully; without that history, the params' updates per step."""
        steps = np.asarray(steps, dtype=float)
        if axis == "rollout":
            return steps
        upd = self.history.get(M.GRAD_UPDATES)
        if upd is not None and upd.steps.size:
            xs = np.concatenate([[0.0], upd.steps.astype(float)])  # sorted: a Series sorts its steps, all >= 0
            ys = np.concatenate([[0.0], upd.values.astype(float)])
            out = np.interp(steps, xs, ys)
            # beyond the last logged point, continue at the last observed rate
            rate = ys[-1] / xs[-1] if xs[-1] > 0 else 0.0
            beyond = steps > xs[-1]
            out[beyond] = ys[-1] + (steps[beyond] - xs[-1]) * rate
            return out
        ups = self.updates_per_step()
        return steps * ups if ups else steps

    def resource(self, key: str) -> float | None:
        """A count the run logged as tag (or param) `key`, e.g. M.TAG_GPUS; None when absent or not a number."""
        for source in (self.tags, self.params):
            if key in source:
                try:
                    return float(source[key])
                except ValueError:
                    continue
        return None


@dataclass
class Experiment:
    name: str
    tracking_uri: str
    k: int  # samples per problem of the eval (avg@k); the preset's eval.n
    runs: list[RunData]
    warnings: list[str] = field(default_factory=list)

    def rows(self) -> list[str]:
        """Paper rows first (Table 1 order), then any other row tags found (user variants), sorted."""
        return list(M.PAPER_TABLE1) + sorted({r.row for r in self.runs} - set(M.PAPER_TABLE1))

    def runs_of(self, row: str) -> list[RunData]:
        return sorted((r for r in self.runs if r.row == row), key=lambda r: (r.seed is None, r.seed or 0))
