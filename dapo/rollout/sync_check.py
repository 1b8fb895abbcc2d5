"""Proof that a weight sync loaded: after each sync, the engine's checksums of a sample of its tensors must equal
the learner's checksums of the tensors it streamed into them (docs/distributed.md, "The sync check").

A checksum is exact and independent of element order and layout (`digest`), so a fused engine tensor (vLLM's
`qkv_proj` holds q, k and v) sums its parts' checksums, a padded one (a vocabulary padded to a multiple of 64) adds
nothing for its zero rows, and a tensor-parallel shard's checksums add up to the whole. Each sync checks every
`ROTATION`-th engine tensor from an offset that moves by one, so a run covers every tensor every `ROTATION` syncs.
"""

from __future__ import annotations

from collections.abc import Iterable, Iterator, Mapping

import torch
from torch import Tensor

from dapo.rollout.base import SyncError, strip_prefix

ROTATION = 8  # syncs per pass over the engine's tensors (the cost per sync: BENCHMARKS.md, section 13)
_M32, _CHUNK = 0xFFFFFFFF, 1 << 24
_BITS = {2: torch.int16, 4: torch.int32}


def digest(t: Tensor, dtype: torch.dtype) -> int:
    """Checksum of `t` as `dtype` holds it: the int64 sum of a 32-bit mix of each element's bits. The mix (multiply
    and xor-shift rounds, multipliers below 2^31 so every product is exact in int64) keeps a +1 ulp change of one
    element from cancelling a -1 ulp change of another, which a plain sum of bits would; +0.0 mixes to 0."""
    flat = t.detach().reshape(-1)
    total = torch.zeros((), dtype=torch.int64, device=flat.device)
    for i in range(0, flat.numel(), _CHUNK):  # chunks: the int64 copy of a 32B model's embedding would be 6 GB
        x = flat[i : i + _CHUNK].to(dtype).view(_BITS[dtype.itemsize]).to(torch.int64)
        x.bitwise_and_(_M32).mul_(0x2C1B3C6D).bitwise_and_(_M32)
        x ^= x >> 15
        x.mul_(0x297A2D39).bitwise_and_(_M32)
        x ^= x >> 16
        total += x.sum()
    return int(total)


class SyncCheck:
    """One engine's rotation of checked tensors, and the learner's checksums during one sync.

    Args:
        sources: every engine tensor's name -> the learner's (Hugging Face) tensors it holds, in the engine's order:
            a fused tensor its parts, a tied head the embedding.
        dtype: the engine's dtype (the learner's tensors are cast to it, as the engine's loader casts them).
    """

    def __init__(self, sources: Mapping[str, list[str]], dtype: torch.dtype) -> None:
        self.sources, self.dtype, self.syncs = dict(sources), dtype, 0
        self.sample: list[str] = []
        self.learner: dict[str, int] = {}
        self.streamed: set[str] = set()

    def watch(self, named_tensors: Iterable[tuple[str, Tensor]]) -> Iterator[tuple[str, Tensor]]:
        """Start a sync: pick its sample, and pass the learner's stream through (names without DeepSpeed's prefix),
        taking the checksums of the sample's tensors on the way, so nothing is gathered twice."""
        names = list(self.sources)
        k = max(1, min(ROTATION, len(names)))
        self.sample, self.learner, self.streamed = names[self.syncs % k :: k], {}, set()
        self.syncs += 1
        wanted = {h for n in self.sample for h in self.sources[n]}

        def stream() -> Iterator[tuple[str, Tensor]]:
            for name, t in named_tensors:
                name = strip_prefix(name)
                self.streamed.add(name)
                if name in wanted:
                    self.learner[name] = digest(t, self.dtype)
                yield name, t

        return stream()

    def verify(self, engine: Mapping[str, int]) -> None:
        """Compare the engine's checksums of the sample (read after the sync) with the learner's: SyncError names the
        first tensor that differs. A tensor the learner did not stream is left to the stream's own checks, but not a
        fused one it streamed part of (vLLM reports no such layer), whichever tensors are in the sample."""
        for name, parts in self.sources.items():
            if self.streamed.isdisjoint(parts) or self.streamed.issuperset(parts):
                continue
            raise SyncError(
                f"weight sync: the learner streamed {', '.join(p for p in parts if p in self.streamed)} but not "
                f"{', '.join(p for p in parts if p not in self.streamed)}, which the engine's {name} also holds: "
                "that part of it keeps its old weights. Stream every parameter under its Hugging Face name"
            )
        for name in self.sample:
            parts = self.sources[name]
            if all(p in self.learner for p in parts) and engine[name] != sum(self.learner[p] for p in parts):
                raise SyncError(
                    f"weight sync: the engine's {name} does not hold the learner's {' + '.join(parts)} after the sync "
                    f"(checksums in {str(self.dtype).removeprefix('torch.')} differ): the engine read the weights but "
                    "samples from others, e.g. a loader that wrote into tensors the model no longer uses, or none. "
                    "Check that the installed vLLM is in the supported range (dapo/rollout/versions.py)"
                )
