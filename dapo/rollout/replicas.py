"""Data-parallel rollouts: the ranks of a job form R = world_size / tensor_parallel_size engine replicas, each
generates its share of a batch, and every rank ends up holding all of it.

Layout (vLLM's "external launcher" layout, as verl's SPMD rollout uses it): replica k is the consecutive ranks
[k * tp, (k + 1) * tp). With tensor parallel 1 every rank is a replica of its own: an in-process engine that vLLM
builds on the job's process group, independent of the others (a replica may generate fewer prompts, or none).
With tensor parallel tp > 1 the tp ranks of a replica run one engine together: each must call `generate` with the
same prompts, sampling settings and seed, and gets the same outputs.

A batch of P prompts x n samples is cut by samples, not by prompts (`split_samples`): the samples are numbered
sample-major (sample j of prompt i is j * P + i) and replica k takes the k-th of R contiguous runs of near-equal
size, so with R dividing n every replica draws n / R samples of every prompt. A prompt's responses tend to share
a length (its difficulty sets them); cut by prompts, the replica that drew the hard prompts generates the most
tokens and every other replica waits for it. Each replica's first rank (the leader) keeps its result, an
all-gather hands every rank the leaders' results with their shares (`gather_shares`), and the caller puts each
prompt's samples back together in sample order (`merge_by_prompt`), so the batch comes out the same whatever R is.

Seeds: every sample's seed is a function of the run's seed, where the call sits (step, generation batch) and the
sample's place in the batch (prompt, index in its group), not of the replica that draws it (`dapo.rollout.seeds`):
replicas draw different samples, a resumed run draws the same ones again, and so does a job with another number
of replicas.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from typing import TypeVar

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


@dataclass(frozen=True)
class Share:
    """One replica's part of a batch of P prompts x n samples.

    Attributes:
        prompts: the batch indices of the prompts it samples (ascending).
        counts: how many samples of each (>= 1).
        first: the index, among that prompt's n samples, of the first of them (they are consecutive).
    """

    prompts: list[int]
    counts: list[int]
    first: list[int]


def split_samples(num_prompts: int, n: int, replicas: int) -> list[Share]:
    """Cut P prompts x n samples into `replicas` shares whose sizes differ by at most one sample, numbering the
    samples sample-major (j * P + i) and giving replica k the k-th contiguous run (`split_evenly`). Each prompt's
    samples then spread over the replicas (n / R of every prompt on each when R divides n; with R > n mostly one
    sample each of about P * n / R prompts) instead of all n landing on one replica. The shares partition the
    samples, and a replica's samples of one prompt are consecutive in j (`Share.first`)."""
    if num_prompts < 0 or n < 1 or replicas < 1:
        raise ValueError(f"split_samples: need prompts >= 0, n >= 1, replicas >= 1; got {num_prompts}, {n}, {replicas}")
    shares = []
    for run in split_evenly(num_prompts * n, replicas):
        counts: dict[int, int] = {}
        first: dict[int, int] = {}
        for slot in run:
            j, i = divmod(slot, num_prompts)
            first.setdefault(i, j)
            counts[i] = counts.get(i, 0) + 1
        prompts = sorted(counts)
        shares.append(Share(prompts, [counts[i] for i in prompts], [first[i] for i in prompts]))
    return shares


def gather_shares(layout: ReplicaLayout, shares: Sequence[Share], mine: R) -> list[tuple[Share, R]]:
    """Every replica's share with its leader's result, in replica order, on every rank. Collective: every rank calls
    it with its replica's `shares` entry's result (`split_samples` over `layout.num_replicas`); a member that is not
    its replica's leader may pass anything cheap (it is dropped). One process: its own result."""
    if layout.world_size == 1:
        return [(shares[0], mine)]
    gathered = dist.all_gather(mine if layout.is_leader else None)
    return [(shares[k], gathered[r]) for k, r in enumerate(layout.leader_ranks)]


def merge_by_prompt(num_prompts: int, parts: Sequence[tuple[Share, Sequence[T]]]) -> list[list[T]]:
    """Each prompt's pieces, in sample order, from the replicas' results (`gather_shares`' output, each result one
    piece per prompt of its share, in share order): `num_prompts` lists of pieces."""
    pieces: list[list[tuple[int, T]]] = [[] for _ in range(num_prompts)]
    for share, result in parts:
        if len(result) != len(share.prompts):
            raise RuntimeError(f"a replica returned {len(result)} pieces for a share of {len(share.prompts)} prompts")
        for i, j, piece in zip(share.prompts, share.first, result, strict=True):
            pieces[i].append((j, piece))
    return [[piece for _, piece in sorted(p, key=lambda x: x[0])] for p in pieces]
