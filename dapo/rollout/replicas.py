"""Data-parallel rollouts: the ranks of a job form R = world_size / tensor_parallel_size engine replicas, each
generates its share of a batch, and every rank ends up holding all of it.

Layout (vLLM's "external launcher" layout, as verl's SPMD rollout uses it): replica k is the consecutive ranks
[k * tp, (k + 1) * tp). With tensor parallel 1 every rank is a replica of its own: an in-process engine that vLLM
builds on the job's process group, independent of the others (a replica may generate fewer prompts, or none).
With tensor parallel tp > 1 the tp ranks of a replica run one engine together: each must call `generate` with the
same prompts, sampling settings and seed, and gets the same outputs.

A batch is cut into R contiguous shares of near-equal size (`split_evenly`); replica k takes share k, its first
rank (the leader) keeps the result, and an all-gather hands every rank the leaders' results in replica order, so
the concatenation is in the batch's own order whatever R is.

Seeds: replica k samples with `sampling_seed(seed, ..., k)`, a function of the run's seed, where in the run the
call sits (step, generation batch) and the replica, so replicas draw different samples and a resumed run draws
the same ones again.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import TypeVar

import numpy as np

from dapo import distributed as dist

T = TypeVar("T")
R = TypeVar("R")


@dataclass(frozen=True)
class ReplicaLayout:
    """Which rollout replica this rank belongs to.

    Attributes:
        world_size: ranks in the job.
        tensor_parallel_size: ranks per replica (`rollout.tensor_parallel_size`).
        rank: this process's global rank.
    """

    world_size: int
    tensor_parallel_size: int
    rank: int

    def __post_init__(self) -> None:
        if self.tensor_parallel_size < 1 or self.world_size % self.tensor_parallel_size:
            raise ValueError(
                f"rollout.tensor_parallel_size={self.tensor_parallel_size} does not divide the job's "
                f"{self.world_size} ranks: each rollout replica takes tensor_parallel_size consecutive ranks; use a "
                "divisor of the number of ranks (GPUs) of the training job"
            )

    @classmethod
    def of_this_process(cls, tensor_parallel_size: int = 1) -> ReplicaLayout:
        return cls(dist.world_size(), tensor_parallel_size, dist.rank())

    @property
    def num_replicas(self) -> int:
        return self.world_size // self.tensor_parallel_size

    @property
    def replica(self) -> int:
        """This rank's replica index, 0 .. num_replicas - 1."""
        return self.rank // self.tensor_parallel_size

    @property
    def is_leader(self) -> bool:
        """The replica's first rank: the one whose result is kept (the others' are identical)."""
        return self.rank % self.tensor_parallel_size == 0

    @property
    def leader_ranks(self) -> list[int]:
        return list(range(0, self.world_size, self.tensor_parallel_size))


def split_evenly(n: int, parts: int) -> list[range]:
    """`parts` contiguous ranges covering 0..n-1, sizes differing by at most one (the larger ones first)."""
    base, extra = divmod(n, parts)
    out, start = [], 0
    for k in range(parts):
        size = base + (1 if k < extra else 0)
        out.append(range(start, start + size))
        start += size
    return out


def sampling_seed(seed: int, *where: int) -> int:
    """A seed for one sampling call from the run's seed and where the call sits, e.g. (step, generation batch,
    replica): different for every replica and every call, and the same again in a resumed run."""
    return int(np.random.default_rng([seed, *where]).integers(2**31 - 1))


def map_on_replicas(layout: ReplicaLayout, items: Sequence[T], fn: Callable[[list[T], bool], R]) -> list[R]:
    """Apply `fn(share, is_leader)` on every replica's share of `items`; return the leaders' results, one per
    replica, in replica order, on every rank. Collective: every rank must call it with the same `items`.

    `fn` runs on every rank of a replica (tensor-parallel members must all call the engine); a member that is not
    the leader may return anything cheap (it is dropped), which spares it work such as scoring.
    """
    share = split_evenly(len(items), layout.num_replicas)[layout.replica]
    result = fn([items[i] for i in share], layout.is_leader)
    if layout.world_size == 1:
        return [result]
    gathered = dist.all_gather(result if layout.is_leader else None)
    return [gathered[r] for r in layout.leader_ranks]
