"""Data-parallel rollouts: the ranks of a job form R = world_size / tensor_parallel_size engine replicas (replica k
is ranks [k * tp, (k + 1) * tp)); each generates its share of a batch, and every rank ends up holding all of it.

A batch of P prompts x n samples is cut by samples (`split_samples`): the samples are numbered sample-major (sample j
of prompt i is j * P + i) and replica k takes the k-th of R contiguous runs of near-equal size. Seeds are hashed
from where a sample sits, never counted, and nothing else enters (not R, not how the batch was split); the layout,
how each engine uses the seeds and why: docs/distributed.md, "The layout" and "One rollout step on W ranks".

    call base   = sampling_seed(run seed, stream, step, generation batch)      (training; evaluation: its shard)
    sample seed = sample_seed(call base, prompt index in the batch, sample index in the prompt's group)
    continued   = segment_seed(call base, prompt index, sample index, segment)  (carry-over: the base of the batch
                  the response was drawn in; segment 0 is its sample seed)
"""

from __future__ import annotations

import hashlib
import random
import struct
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any, TypeVar

import numpy as np

from dapo import distributed as dist
from dapo.rollout.base import RolloutEngine
from dapo.types import Sample

# Seeds stay below 2**31: numpy's legacy seeding takes 32 bits, torch and vLLM take more.
SEED_MASK = 0x7FFFFFFF


def sampling_seed(seed: int, *where: int) -> int:
    """The base seed of one sampling call from the run's seed and where the call sits, e.g. (stream, step,
    generation batch): the same again in a resumed run. Sample seeds are hashed from it (`sample_seed`).

    numpy's seeding treats trailing zeros as absent ([s, 1, 3] and [s, 1, 3, 0] give the same base): the callers'
    streams differ in the first key after the seed (TRAIN_STREAM, EVAL_STREAM), so no two calls share a base."""
    return int(np.random.default_rng([seed, *where]).integers(2**31 - 1))


def _hash(*values: int) -> int:
    digest = hashlib.blake2b(struct.pack(f"<{len(values)}q", *values), digest_size=8).digest()
    return int.from_bytes(digest, "little") & SEED_MASK


def sample_seed(base: int, prompt: int, sample: int) -> int:
    """The seed of sample `sample` of prompt `prompt` (its index in the batch) under the call base `base`."""
    return _hash(base, prompt, sample)


def segment_seed(base: int, prompt: int, sample: int, segment: int) -> int:
    """The seed of segment `segment` of a response carried over rollout steps (`rollout.max_staleness`): segment 0 is
    `sample_seed(base, prompt, sample)`, a later one a hash of the same place and its number, so a continued sample
    draws the same seed on any number of replicas."""
    return sample_seed(base, prompt, sample) if segment == 0 else _hash(base, prompt, sample, segment)


def share_seeds(base: int, prompts: Sequence[int], counts: Sequence[int], first: Sequence[int]) -> list[list[int]]:
    """Per-sample seeds of a replica's share (`replicas.Share`: batch indices, counts, first sample index): one list
    per prompt of the share, `counts[i]` seeds each, for samples first[i] .. first[i] + counts[i] - 1."""
    return [
        [sample_seed(base, i, j) for j in range(j0, j0 + k)] for i, k, j0 in zip(prompts, counts, first, strict=True)
    ]


def call_seed(seeds: Sequence[Sequence[int]]) -> int:
    """One seed for a whole call, from its per-sample seeds (for engines that cannot seed each request): a hash of
    all of them, so two calls (two replicas, two steps) that hold different samples get different seeds."""
    flat = [s for group in seeds for s in group]
    return _hash(len(flat), *flat) if flat else 0


def seed_global_generators(seed: int) -> None:
    """Seed every global generator an engine may sample from: python's `random`, numpy's global generator (vLLM's
    Model Runner V2 draws each unseeded request's seed from it) and torch's (vLLM's V1 sampler and transformers'
    `generate` sample from it; `torch.manual_seed` seeds the CUDA generators too)."""
    import torch

    random.seed(seed)
    np.random.seed(seed & SEED_MASK)
    torch.manual_seed(seed)


T = TypeVar("T")
R = TypeVar("R")


@dataclass(frozen=True)
class ReplicaLayout:
    """Which rollout replica this rank (global `rank` of `world_size`) belongs to; `tensor_parallel_size` ranks each
    (`rollout.tensor_parallel_size`)."""

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
    """One replica's part of a batch of P prompts x n samples: the `prompts` it samples (batch indices, ascending),
    `counts` of each (>= 1), and the index among that prompt's n samples of the `first` (they are consecutive)."""

    prompts: list[int]
    counts: list[int]
    first: list[int]


def split_samples(num_prompts: int, n: int, replicas: int) -> list[Share]:
    """Cut P prompts x n samples into `replicas` shares differing by at most one sample: numbered sample-major
    (j * P + i), replica k takes the k-th contiguous run (`split_evenly`), so each prompt's samples spread over the
    replicas (n / R each when R divides n). The shares partition the samples; one prompt's are consecutive in j."""
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


def generate_share(
    engine: RolloutEngine,
    layout: ReplicaLayout,
    prompt_ids: Sequence[list[int]],
    n: int,
    seed_base: int,
    max_tokens: int,
    temperature: float = 1.0,
    top_p: float = 1.0,
    *,
    offset: int = 0,
) -> tuple[Share, list[list[Sample]]]:
    """This replica's share of a batch of P prompts x n samples (`split_samples`), sampled: sample j of prompt i is
    drawn with the seed `sample_seed(seed_base, offset + i, j)`, whichever replica draws it.
    Returns the share and one list of samples per prompt of the share."""
    share = split_samples(len(prompt_ids), n, layout.num_replicas)[layout.replica]
    if not share.prompts:
        return share, []
    seeds = share_seeds(seed_base, [offset + i for i in share.prompts], share.counts, share.first)
    prompts = [list(prompt_ids[i]) for i in share.prompts]
    outs = engine.generate(
        prompts, n=share.counts, max_tokens=max_tokens, temperature=temperature, top_p=top_p, seeds=seeds
    )
    return share, outs


def gather_by_prompt(
    layout: ReplicaLayout, n: int, num_prompts: int, mine: Sequence[T], extra: Any = None
) -> tuple[list[list[T]], list[Any]]:
    """Every replica's pieces of a batch of `num_prompts` prompts x n samples, on every rank: each prompt's pieces in
    sample order, and each replica's `extra` (e.g. its timings). `mine`: one piece per prompt of this replica's share
    (`generate_share`), from its leader. Collective: every rank calls it."""
    shares = split_samples(num_prompts, n, layout.num_replicas)
    parts = gather_shares(layout, shares, (list(mine), extra))
    return merge_by_prompt(num_prompts, [(share, got[0]) for share, got in parts]), [got[1] for _, got in parts]
