"""The torch process group the learner runs in, set up from the launcher's environment, without DeepSpeed's help.

Why not `deepspeed.init_distributed`: on a CPU machine it builds a shared-memory all-reduce op first (~35 s on
each new machine, FINDINGS.md), and without launcher variables it goes looking for MPI (`No module named
'mpi4py'`). Once a torch process group exists, DeepSpeed adopts it as is.

Where rank and world size come from, first match wins:

- torchrun (or any launcher that sets them): RANK, WORLD_SIZE, LOCAL_RANK, MASTER_ADDR, MASTER_PORT.
- SLURM `srun`: SLURM_PROCID, SLURM_NTASKS, SLURM_LOCALID; MASTER_ADDR from the environment, else the first host
  of SLURM_JOB_NODELIST / SLURM_NODELIST; MASTER_PORT from the environment, else one derived from SLURM_JOB_ID
  (so jobs sharing a node do not fight over one port).
- nothing set: one process (world size 1) over an in-memory store: no port, no MPI discovery.

The backend is NCCL when CUDA is available, else gloo. The resolved values are written back to RANK, WORLD_SIZE,
LOCAL_RANK (and MASTER_*), because DeepSpeed reads them from the environment too.
"""

from __future__ import annotations

import os
import re
from dataclasses import dataclass

import torch
import torch.distributed as dist


@dataclass(frozen=True)
class DistInfo:
    """Where this process sits: global rank, world size, rank on its node, and its torch device."""

    rank: int
    world_size: int
    local_rank: int
    device: torch.device

    @property
    def is_main(self) -> bool:
        return self.rank == 0


def first_slurm_host(nodelist: str) -> str:
    """The first host of a SLURM node list: `gpu-[03-05,9],cpu1` -> `gpu-03` (zero padding kept)."""
    first = re.match(r"[^,\[]*(\[[^\]]*\])?", nodelist.strip())
    item = first.group(0) if first else nodelist
    if "[" not in item:
        return item
    prefix, ranges = item.split("[", 1)
    start = ranges.rstrip("]").split(",")[0].split("-")[0]
    return prefix + start


def launcher_env(env: dict[str, str] | os._Environ | None = None) -> dict[str, str] | None:
    """RANK / WORLD_SIZE / LOCAL_RANK / MASTER_ADDR / MASTER_PORT from torchrun or SLURM variables, or None when
    neither launcher set them (a single process)."""
    env = os.environ if env is None else env
    if "RANK" in env and "WORLD_SIZE" in env:
        return {
            "RANK": env["RANK"],
            "WORLD_SIZE": env["WORLD_SIZE"],
            "LOCAL_RANK": env.get("LOCAL_RANK", "0"),
            "MASTER_ADDR": env.get("MASTER_ADDR", "127.0.0.1"),
            "MASTER_PORT": env.get("MASTER_PORT", "29500"),
        }
    if "SLURM_PROCID" in env and "SLURM_NTASKS" in env:
        nodelist = env.get("SLURM_JOB_NODELIST") or env.get("SLURM_NODELIST") or "127.0.0.1"
        return {
            "RANK": env["SLURM_PROCID"],
            "WORLD_SIZE": env["SLURM_NTASKS"],
            "LOCAL_RANK": env.get("SLURM_LOCALID", "0"),
            "MASTER_ADDR": env.get("MASTER_ADDR") or first_slurm_host(nodelist),
            "MASTER_PORT": env.get("MASTER_PORT") or str(20000 + int(env.get("SLURM_JOB_ID", "9500")) % 20000),
        }
    return None


def init_distributed(backend: str | None = None) -> DistInfo:
    """Join (or create) the default process group; idempotent. Returns this process's `DistInfo`."""
    use_cuda = torch.cuda.is_available()
    backend = backend or ("nccl" if use_cuda else "gloo")
    found = launcher_env()
    if found is None:
        found = {"RANK": "0", "WORLD_SIZE": "1", "LOCAL_RANK": "0"}
    for key, value in found.items():
        os.environ.setdefault(key, value)
    rank, world, local = int(found["RANK"]), int(found["WORLD_SIZE"]), int(found["LOCAL_RANK"])
    device = torch.device("cuda", local) if use_cuda else torch.device("cpu")
    if use_cuda:
        torch.cuda.set_device(device)
    if not dist.is_initialized():
        if world == 1:
            # One process (also a one-task SLURM job): an in-memory store needs no free port and cannot collide
            # with other runs on the node.
            dist.init_process_group(backend, store=dist.HashStore(), rank=0, world_size=1)
        else:
            dist.init_process_group(backend, init_method="env://", rank=rank, world_size=world)
    return DistInfo(rank=dist.get_rank(), world_size=dist.get_world_size(), local_rank=local, device=device)


def all_reduce(values: torch.Tensor, op: str = "sum") -> torch.Tensor:
    """All-reduce a small tensor across data-parallel ranks (a no-op copy at world size 1); returns the result.

    `op` is "sum" or "max". The tensor travels on the backend's device (NCCL needs CUDA tensors).
    """
    out = values.detach().clone()
    if dist.is_initialized() and dist.get_world_size() > 1:
        dev = torch.device("cuda", torch.cuda.current_device()) if dist.get_backend() == "nccl" else out.device
        buf = out.to(dev)
        dist.all_reduce(buf, op=dist.ReduceOp.SUM if op == "sum" else dist.ReduceOp.MAX)
        out = buf.to(values.device)
    return out


def shutdown() -> None:
    """End a run cleanly: a barrier then `destroy_process_group` (ranks can abort at exit otherwise, FINDINGS)."""
    if dist.is_initialized():
        if dist.get_world_size() > 1:
            dist.barrier()
        dist.destroy_process_group()
