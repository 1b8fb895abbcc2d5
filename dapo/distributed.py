"""The job's process group: joining it, the trainer's few collectives, failing fast together (identity in one
process). docs/distributed.md, "The layout" and "Collective safety"."""

from __future__ import annotations

import datetime
import logging
import os
import re
import sys
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

import torch
import torch.distributed as dist

log = logging.getLogger("dapo.distributed")

FAILURE_KEY = "dapo/first_failure"
_FAILURE_COUNT_KEY = "dapo/failures"


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


# ---------------------------------------------------------------------------------------------- joining
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
    """RANK / WORLD_SIZE / LOCAL_RANK / MASTER_ADDR / MASTER_PORT from torchrun or SLURM, else None (one process)."""
    env = os.environ if env is None else env
    if "RANK" in env and "WORLD_SIZE" in env:
        rank, world, local = env["RANK"], env["WORLD_SIZE"], env.get("LOCAL_RANK", "0")
        addr, port = env.get("MASTER_ADDR", "127.0.0.1"), env.get("MASTER_PORT", "29500")
    elif "SLURM_PROCID" in env and "SLURM_NTASKS" in env:
        rank, world, local = env["SLURM_PROCID"], env["SLURM_NTASKS"], env.get("SLURM_LOCALID", "0")
        nodelist = env.get("SLURM_JOB_NODELIST") or env.get("SLURM_NODELIST") or "127.0.0.1"
        addr = env.get("MASTER_ADDR") or first_slurm_host(nodelist)
        port = env.get("MASTER_PORT") or str(20000 + int(env.get("SLURM_JOB_ID", "9500")) % 20000)
    else:
        return None
    return {"RANK": rank, "WORLD_SIZE": world, "LOCAL_RANK": local, "MASTER_ADDR": addr, "MASTER_PORT": port}


def init_distributed(backend: str | None = None, timeout_s: float | None = None) -> DistInfo:
    """Join (or create) the default process group, idempotently; `backend` default NCCL with CUDA, else gloo;
    `timeout_s`: any collective's wait before failing (None: torch's; docs/distributed.md, "Collective safety")."""
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
        timeout = None if timeout_s is None else datetime.timedelta(seconds=timeout_s)
        if world == 1:
            # One process (also a one-task SLURM job): an in-memory store needs no free port and cannot collide
            # with other runs on the node.
            dist.init_process_group(backend, store=dist.HashStore(), rank=0, world_size=1, timeout=timeout)
        else:
            dist.init_process_group(backend, init_method="env://", rank=rank, world_size=world, timeout=timeout)
        _forget_deepspeed_world_group()
    object_group()  # made now, at the same point on every rank (making a group is itself collective)
    return DistInfo(rank=dist.get_rank(), world_size=dist.get_world_size(), local_rank=local, device=device)


def _forget_deepspeed_world_group() -> None:
    """Drop DeepSpeed's clone of the world group (`deepspeed.utils.groups._WORLD_GROUP`, no public reset): after the
    default group is made anew, a second learner would use the dead clone ("Group ... is not registered")."""
    groups = sys.modules.get("deepspeed.utils.groups")
    if groups is not None and getattr(groups, "_WORLD_GROUP", None) is not None:
        groups._WORLD_GROUP = None


def shutdown() -> None:
    """End a run cleanly: a barrier then `destroy_process_group` (without them, ranks can abort at exit)."""
    global _OBJECT_GROUP
    if dist.is_initialized():
        if dist.get_world_size() > 1:
            dist.barrier()
        dist.destroy_process_group()
    _OBJECT_GROUP = None


# The group pickled objects travel over: the default one if gloo, else a gloo group over the same ranks (over NCCL,
# `all_gather_object` stages world x the largest pickle on every GPU: GBs at 128 ranks). docs/distributed.md.
_OBJECT_GROUP: Any = None


def object_group() -> Any:
    """The group of `broadcast` and `all_gather` (None: the default, when gloo); made by `init_distributed`."""
    global _OBJECT_GROUP
    if not dist.is_initialized() or dist.get_world_size() == 1 or dist.get_backend() == "gloo":
        return None
    world = dist.group.WORLD
    if _OBJECT_GROUP is None or _OBJECT_GROUP[0] is not world:  # a default group made anew needs its own
        _OBJECT_GROUP = (world, dist.new_group(backend="gloo"))
    return _OBJECT_GROUP[1]


# ---------------------------------------------------------------------------------------------- collectives
def world_size() -> int:
    return dist.get_world_size() if dist.is_initialized() else 1


def rank() -> int:
    return dist.get_rank() if dist.is_initialized() else 0


def is_main() -> bool:
    return rank() == 0


def _device() -> torch.device | None:
    """Where tensor collectives move their bytes: NCCL moves only CUDA tensors."""
    return torch.device("cuda", torch.cuda.current_device()) if dist.get_backend() == "nccl" else None


def broadcast(obj: Any) -> Any:
    """Rank 0's `obj` on every rank (pickled, over the CPU `object_group`); one process: `obj` itself."""
    if world_size() == 1:
        return obj
    box = [obj if is_main() else None]
    dist.broadcast_object_list(box, src=0, group=object_group(), device=torch.device("cpu"))
    return box[0]


def all_gather(obj: Any) -> list[Any]:
    """Every rank's `obj` (pickled), in rank order, over the CPU `object_group` (host memory only)."""
    if world_size() == 1:
        return [obj]
    out: list[Any] = [None] * world_size()
    dist.all_gather_object(out, obj, group=object_group())
    return out


def all_reduce(values: torch.Tensor, op: str = "sum") -> torch.Tensor:
    """All-reduce ("sum" or "max") a small tensor across ranks on the backend's device; a copy at world size 1."""
    out = values.detach().clone()
    if dist.is_initialized() and dist.get_world_size() > 1:
        dev = _device() or out.device
        buf = out.to(dev)
        dist.all_reduce(buf, op=dist.ReduceOp.SUM if op == "sum" else dist.ReduceOp.MAX)
        out = buf.to(values.device)
    return out


def any_rank(flag: bool) -> bool:
    """True on every rank when `flag` is True on any rank (a stop signal seen by one rank stops all)."""
    if world_size() == 1:
        return flag
    return bool(all_reduce(torch.tensor([float(flag)]), op="max").item() > 0)


def barrier() -> None:
    if world_size() > 1:
        dist.barrier()


# ---------------------------------------------------------------------------------------------- failing together
class FailureWatch:
    """Ends every rank soon after any rank fails (docs/distributed.md, "Collective safety"); a no-op in one process.
    An exception (not a SystemExit) leaving the block is reported to the others; call `report` before re-raising to
    learn whether another rank failed first. `on_peer_failure(report)` runs in the watch thread before this rank exits
    with `exit_code` (its errors are logged); `linger_s`: `report`'s wait, so others read it even when this rank hosts
    the store (an `srun` job's rank 0) and ends right after; `poll_s`: between looks at the store.
    """

    def __init__(
        self,
        *,
        poll_s: float = 1.0,
        on_peer_failure: Callable[[str], None] | None = None,
        exit_code: int = 1,
        linger_s: float = 3.0,
    ) -> None:
        self.poll_s, self.on_peer_failure, self.exit_code, self.linger_s = poll_s, on_peer_failure, exit_code, linger_s
        self._store: Any = None
        self._stop = threading.Event()
        self._thread: threading.Thread | None = None
        self._reported = False

    def __enter__(self) -> FailureWatch:
        if world_size() > 1:
            self._store = _job_store()
            if self._store is not None:
                self._thread = threading.Thread(target=self._watch, name="dapo-failure-watch", daemon=True)
                self._thread.start()
        return self

    def __exit__(self, exc_type: type[BaseException] | None, exc: BaseException | None, tb: object) -> None:
        if isinstance(exc, Exception) and not self._reported:
            self.report(exc)
        self._stop.set()

    def report(self, error: BaseException) -> str | None:
        """Tell every rank this one failed; the first failure's report if another rank failed first, else None."""
        if self._store is None:
            return None
        self._reported = True
        text = f"rank {rank()}: {type(error).__name__}: {error}"
        try:
            if int(self._store.add(_FAILURE_COUNT_KEY, 1)) == 1:
                self._store.set(FAILURE_KEY, text)
                time.sleep(self.linger_s)
                return None
            return self._read()
        except Exception as e:  # the store is gone (its host ended): nothing more to tell anyone
            log.warning("could not report this rank's failure to the job's store: %s", e)
            return None

    def _read(self) -> str | None:
        if not self._store.check([FAILURE_KEY]):
            return None
        return self._store.get(FAILURE_KEY).decode(errors="replace")

    def _watch(self) -> None:
        me = f"rank {rank()}:"
        while not self._stop.wait(self.poll_s):
            try:
                report = self._read()
            except Exception as e:  # noqa: BLE001 (any store error means its host, a rank, is gone)
                if self._stop.is_set() or self._reported:
                    return
                report = f"the job's store stopped answering ({type(e).__name__}: {e}): the rank hosting it ended"
            if report is None or report.startswith(me) or self._reported:
                continue
            log.error("another rank failed (%s); ending rank %d with exit code %d", report, rank(), self.exit_code)
            if self.on_peer_failure is not None:
                try:
                    self.on_peer_failure(report)
                except Exception:  # noqa: BLE001 (the exit below matters more than a failed note)
                    log.exception("while recording the failure of another rank")
            for h in logging.getLogger().handlers:
                h.flush()
            sys.stderr.flush()
            os._exit(self.exit_code)


def _job_store() -> Any:
    """A client of its own to the job's rendezvous store: the watch thread never shares the collectives' connection."""
    addr, port = os.environ.get("MASTER_ADDR"), os.environ.get("MASTER_PORT")
    if not addr or not port:
        return None
    try:
        return dist.TCPStore(
            addr, int(port), is_master=False, timeout=datetime.timedelta(seconds=30), wait_for_workers=False
        )
    except Exception as e:  # noqa: BLE001 (without it ranks still fail, only more slowly)
        log.warning("no failure watch (cannot reach the job's store at %s:%s: %s)", addr, port, e)
        return None
