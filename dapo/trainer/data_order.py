"""A seeded, resumable order over the training prompts.

Epoch e visits every prompt once, in the permutation drawn from `numpy.random.default_rng([seed, e])`; a batch
that runs past the end of an epoch continues into the next one. The state is two integers (epoch, position), so
a checkpoint restores the exact order without storing the permutation, and the order does not depend on how
many generation batches each rollout step used (dynamic sampling draws more prompts; the order stays the same).
"""

from __future__ import annotations

from collections.abc import Sequence

import numpy as np

from dapo.types import Problem


class PromptOrder:
    """Indices into a list of `n` prompts, drawn in seeded epochs."""

    def __init__(self, n: int, seed: int) -> None:
        if n <= 0:
            raise ValueError(f"need at least one training prompt, got n={n}")
        self.n = n
        self.seed = seed
        self.epoch = 0
        self.position = 0
        self._perm = self._permutation(0)

    def _permutation(self, epoch: int) -> np.ndarray:
        return np.random.default_rng([self.seed, epoch]).permutation(self.n)

    def take(self, k: int) -> list[int]:
        """The next `k` prompt indices (crossing into the next epoch when this one runs out)."""
        out: list[int] = []
        while len(out) < k:
            if self.position >= self.n:
                self.epoch += 1
                self.position = 0
                self._perm = self._permutation(self.epoch)
            m = min(k - len(out), self.n - self.position)
            out.extend(int(i) for i in self._perm[self.position : self.position + m])
            self.position += m
        return out

    @property
    def consumed(self) -> int:
        """Prompts drawn so far (all epochs)."""
        return self.epoch * self.n + self.position

    def state_dict(self) -> dict[str, int]:
        return {"n": self.n, "seed": self.seed, "epoch": self.epoch, "position": self.position}

    def load_state_dict(self, state: dict[str, int]) -> None:
        if state["n"] != self.n or state["seed"] != self.seed:
            raise ValueError(
                f"checkpoint's data order is for n={state['n']} prompts with seed {state['seed']}, "
                f"this run has n={self.n} with seed {self.seed}: resume with the same config"
            )
        self.epoch = int(state["epoch"])
        self.position = int(state["position"])
        self._perm = self._permutation(self.epoch)


class PromptSource:
    """The training problems and their prompt ids, handed out in the seeded order (`PromptOrder`)."""

    def __init__(self, problems: Sequence[Problem], prompts: Sequence[list[int]], seed: int) -> None:
        self.problems, self.prompts = problems, prompts
        self.order = PromptOrder(len(problems), seed)

    def take(self, k: int) -> tuple[list[Problem], list[list[int]]]:
        """The next `k` problems and their prompt ids (every rank draws the same ones)."""
        idx = self.order.take(k)
        return [self.problems[i] for i in idx], [self.prompts[i] for i in idx]
