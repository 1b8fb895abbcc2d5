"""The trainer's view of the data-parallel ranks (torchrun / srun), no-ops in one process.

Design (one rollout, many learners): rank 0 alone owns the rollout engine, the tracker and the run directory's
own files; it generates, scores and refills a step, then broadcasts what it collected, so every rank builds the
same batch and trains on its `PolicyBatch.shard`. Rollouts are not generated on every rank because vLLM's
sampling is not guaranteed identical across processes.
"""

from __future__ import annotations

from typing import Any

import torch
import torch.distributed as dist


def world_size() -> int:
    return dist.get_world_size() if dist.is_initialized() else 1


def rank() -> int:
    return dist.get_rank() if dist.is_initialized() else 0


def is_main() -> bool:
    return rank() == 0


def broadcast(obj: Any) -> Any:
    """Rank 0's `obj` on every rank (pickled; CPU tensors inside are fine). One process: `obj` itself."""
    if world_size() == 1:
        return obj
    box = [obj if is_main() else None]
    dist.broadcast_object_list(box, src=0, device=_device())
    return box[0]


def all_gather(obj: Any) -> list[Any]:
    """Every rank's `obj`, in rank order."""
    if world_size() == 1:
        return [obj]
    out: list[Any] = [None] * world_size()
    dist.all_gather_object(out, obj)
    return out


def any_rank(flag: bool) -> bool:
    """True on every rank when `flag` is True on any rank (a stop signal seen by one rank stops all)."""
    if world_size() == 1:
        return flag
    from dapo.learner.distributed import all_reduce

    return bool(all_reduce(torch.tensor([float(flag)]), op="max").item() > 0)


def barrier() -> None:
    if world_size() > 1:
        dist.barrier()


def _device() -> torch.device | None:
    return torch.device("cuda", torch.cuda.current_device()) if dist.get_backend() == "nccl" else None


class NullEngine:
    """The rollout engine of ranks > 0: they never generate, but still drain the learner's weight iterator,
    which under ZeRO-3 gathers every tensor collectively."""

    def sync_weights(self, params: Any) -> None:
        for _ in params:
            pass

    def sleep(self) -> None:
        pass

    def wake_up(self) -> None:
        pass

    def close(self) -> None:
        pass


class Null:
    """Accepts any call and returns None: the tracker and progress display of ranks > 0."""

    run_id = None

    def __getattr__(self, name: str) -> Any:
        return lambda *a, **k: None
