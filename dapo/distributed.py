"""The job's process group: joining it, the trainer's few collectives, failing fast together (identity in one
process). docs/distributed.md, "The layout" and "Collective safety"."""

from __future__ import annotations

import atexit
import datetime
import logging
import os
import socket
import sys
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

import torch
import torch.distributed as dist

from dapo.rendezvous import (
    RendezvousError,
    choose_socket_interface,
    meeting_point,
    rendezvous_port,
    slurm_hosts,
    store_namespace,
)

log = logging.getLogger("dapo.distributed")

FAILURE_KEY = "dapo/first_failure"
HEARTBEAT_KEY = "dapo/heartbeat/"  # + rank: a counter each rank's heartbeat thread adds 1 to every second
HEARTBEAT_DONE_KEY = "dapo/heartbeat_done/"  # + rank: set when a rank ends normally (it is not lost)
LOST_MARK = "lost: "  # a FAILURE_KEY report that starts with this is a lost peer (resume), not a failure


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
def launcher_env(env: dict[str, str] | os._Environ | None = None) -> dict[str, str] | None:
    """RANK / WORLD_SIZE / LOCAL_RANK / MASTER_ADDR / MASTER_PORT from torchrun or SLURM, else None (one process).
    Under SLURM: the first host of the job's node list and `rendezvous.rendezvous_port`."""
    env = os.environ if env is None else env
    if "RANK" in env and "WORLD_SIZE" in env:
        rank, world, local = env["RANK"], env["WORLD_SIZE"], env.get("LOCAL_RANK", "0")
        addr, port = env.get("MASTER_ADDR", "127.0.0.1"), env.get("MASTER_PORT", "29500")
    elif "SLURM_PROCID" in env and "SLURM_NTASKS" in env:
        rank, world, local = env["SLURM_PROCID"], env["SLURM_NTASKS"], env.get("SLURM_LOCALID", "0")
        addr = env.get("MASTER_ADDR") or slurm_hosts(_nodelist(env) or "127.0.0.1")[0]
        port = env.get("MASTER_PORT") or str(rendezvous_port(env))
    else:
        return None
    return {"RANK": rank, "WORLD_SIZE": world, "LOCAL_RANK": local, "MASTER_ADDR": addr, "MASTER_PORT": port}


def _nodelist(env: dict[str, str] | os._Environ) -> str:
    return env.get("SLURM_JOB_NODELIST") or env.get("SLURM_NODELIST") or ""


def init_distributed(
    backend: str | None = None, timeout_s: float | None = None, rendezvous_timeout_s: float | None = None
) -> DistInfo:
    """Join (or create) the default process group, idempotently; `backend` default NCCL with CUDA, else gloo;
    `timeout_s`: any collective's wait before failing (None: torch's; docs/distributed.md, "Collective safety");
    `rendezvous_timeout_s`: how long the ranks may take to meet (`meet`; None: `timeout_s`)."""
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
            timeout = None if timeout_s is None else datetime.timedelta(seconds=timeout_s)
            dist.init_process_group(backend, store=dist.HashStore(), rank=0, world_size=1, timeout=timeout)
        else:
            meet(backend, rank, world, found["MASTER_ADDR"], int(found["MASTER_PORT"]), timeout_s, rendezvous_timeout_s)
        _forget_deepspeed_world_group()
    object_group()  # made now, at the same point on every rank (making a group is itself collective)
    return DistInfo(rank=dist.get_rank(), world_size=dist.get_world_size(), local_rank=local, device=device)


def meet(
    backend: str,
    rank: int,
    world: int,
    host: str,
    port: int,
    timeout_s: float | None,
    rendezvous_timeout_s: float | None,
) -> None:
    """Meet the other ranks at `host:port` within `rendezvous_timeout_s`, or raise RendezvousError naming the host,
    port and interface: rank 0 serves the job's store there (a client only under torchrun, whose agent serves it),
    every rank joins the process group with gloo bound to the interface toward the other nodes
    (`rendezvous.choose_socket_interface`), and only then do collectives get their own, longer timeout. Each rank
    logs where it met. Starts this rank's heartbeat (`Heartbeat`)."""
    me = socket.gethostname()
    point = meeting_point(host, port, slurm_hosts(_nodelist(os.environ)))
    chosen = choose_socket_interface(point, os.environ)
    log.info(
        "rank %d of %d on %s meets the others at %s%s", rank, world, me, point.describe(), f"; {chosen}" * bool(chosen)
    )
    bound = rendezvous_timeout_s or timeout_s or DEFAULT_RENDEZVOUS_S
    meeting = datetime.timedelta(seconds=bound)
    serve = rank == 0 and os.environ.get("TORCHELASTIC_USE_AGENT_STORE") != "True"
    t0 = time.monotonic()
    try:
        tcp = dist.TCPStore(host, port, world, is_master=serve, timeout=meeting, wait_for_workers=True)
        store = dist.PrefixStore(store_namespace(os.environ), tcp)  # this attempt's keys only
        dist.init_process_group(backend, store=store, rank=rank, world_size=world, timeout=meeting)
        object_group(timeout=meeting)
    except (RuntimeError, OSError, TimeoutError) as e:  # torch's network errors (DistError is a RuntimeError)
        raise RendezvousError(
            f"rank {rank} of {world} on {me} could not meet the others at {point.describe()} within {bound:.0f} s "
            f"({time.monotonic() - t0:.0f} s spent; {type(e).__name__}: {str(e)[:400]}). Check that every node "
            f"resolves {host!r} to an address the nodes share (`getent hosts {host}` on each), that nothing else "
            f"holds port {port} there, and which interface the nodes reach each other on (GLOO_SOCKET_IFNAME, "
            'NCCL_SOCKET_IFNAME; docs/cluster.md, "Where the ranks meet"). The job exits 75: the workflow '
            "resubmits it."
        ) from e
    if timeout_s is not None and timeout_s != bound:
        collective = datetime.timedelta(seconds=timeout_s)
        # NCCL makes a communicator at its first collective, its ranks reading rank 0's id from this store under the
        # store's own timeout, which the process group's does not change: the meeting bound would otherwise cut
        # short a first barrier that legitimately waits (rank 0 loading a 32B model)
        tcp.set_timeout(collective)
        set_timeout = getattr(dist.distributed_c10d, "_set_pg_timeout", None)  # torch >= 2.2; private, no public one
        if set_timeout is not None:
            set_timeout(collective)
            if _OBJECT_GROUP is not None:
                set_timeout(collective, _OBJECT_GROUP[1])
    log.info("rank %d met the others in %.1f s", rank, time.monotonic() - t0)
    Heartbeat.start_for(rank)


# How long ranks may take to meet when the caller gives no bound: the trainer passes trainer.rendezvous_timeout_s.
DEFAULT_RENDEZVOUS_S = 600.0


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


def object_group(timeout: datetime.timedelta | None = None) -> Any:
    """The group of `broadcast` and `all_gather` (None: the default, when gloo); made by `init_distributed`."""
    global _OBJECT_GROUP
    if not dist.is_initialized() or dist.get_world_size() == 1 or dist.get_backend() == "gloo":
        return None
    world = dist.group.WORLD
    if _OBJECT_GROUP is None or _OBJECT_GROUP[0] is not world:  # a default group made anew needs its own
        _OBJECT_GROUP = (world, dist.new_group(backend="gloo", timeout=timeout))
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
class PeerLost(RuntimeError):
    """A peer vanished without reporting a failure: its process was killed, or its host or link is gone. Not this
    run's fault: `dapo train` exits 75 (resume), and the workflow's job script requeues the job."""


# The text of a collective that failed because a peer's end of the connection went away (gloo's and the kernel's
# words, e.g. gloo's "[.../tcp/pair.cc:553] Connection closed by peer [10.77.0.12]:42697"); a peer that raised
# reports first (`FailureWatch.report`), so this alone does not mean "lost".
# NCCL's: `ncclRemoteError: A call failed possibly due to a network error or a remote process exiting prematurely.`
# (torch's getNcclErrorDetailStr); DistNetworkError: torch's own type for a network failure.
_BROKEN = (
    "connection closed by peer",
    "connection reset by peer",
    "broken pipe",
    "ncclremoteerror",
    "remote process exiting prematurely",
)


def is_broken_connection(error: BaseException) -> bool:
    """Whether `error` (or one it was raised from) is a collective's broken connection to a peer: torch.distributed's
    own error type, or a message from gloo's or NCCL's transport, naming a closed or reset connection."""
    seen: BaseException | None = error
    while seen is not None:
        text = str(seen).lower()
        collective = isinstance(seen, dist.DistError) or "gloo" in text or "nccl" in text
        if isinstance(seen, dist.DistNetworkError) or (collective and any(b in text for b in _BROKEN)):
            return True
        seen = seen.__cause__ or seen.__context__
    return False


class Heartbeat:
    """This rank's pulse in the job's store: a thread adds 1 to `HEARTBEAT_KEY<rank>` every `interval_s` from the
    moment the ranks meet to the process's end, whatever the main thread is doing (a collective, a long generation:
    the store's server runs in a C++ thread, so the GIL does not hold it up). A rank that ends normally sets
    `HEARTBEAT_DONE_KEY<rank>` at exit, so that the judge (`FailureWatch` on rank 0) tells it from a lost one."""

    _current: Heartbeat | None = None

    def __init__(self, store: Any, rank: int, interval_s: float = 1.0) -> None:
        self.store, self.rank, self.interval_s = store, rank, interval_s
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._beat, name="dapo-heartbeat", daemon=True)

    @classmethod
    def start_for(cls, rank: int) -> None:
        if cls._current is not None:
            cls._current.stop(done=False)
        store = _job_store()
        if store is None:
            return
        cls._current = cls(store, rank)
        cls._current._thread.start()
        atexit.register(cls._current.stop)

    def _beat(self) -> None:
        """Beat until stopped. A store that does not answer (a blip on the network it travels over, or its host
        gone) is tried again through a new connection every `interval_s`: the judge, not the pulse, decides what
        silence means, and a pulse that gave up after one error would have a healthy rank taken for lost."""
        key = f"{HEARTBEAT_KEY}{self.rank}"
        while True:
            try:
                if self.store is None:
                    self.store = _job_store(quiet=True)
                if self.store is not None:
                    self.store.add(key, 1)
            except Exception:  # noqa: BLE001 (reconnect at the next beat)
                self.store = None
            if self._stop.wait(self.interval_s):
                return

    def stop(self, done: bool = True) -> None:
        self._stop.set()
        if done and self.store is not None:
            try:
                self.store.set(f"{HEARTBEAT_DONE_KEY}{self.rank}", "1")
            except Exception:  # noqa: BLE001 (nobody is left to judge)
                pass


class FailureWatch:
    """Ends every rank soon after any rank fails or is lost (docs/distributed.md, "Collective safety"); a no-op in one
    process. An exception (not a SystemExit) leaving the block is reported to the others; call `report` before
    re-raising to learn whether another rank failed first, and `peer_lost` to learn whether the exception is a peer
    that vanished (a broken connection no rank reported). `on_peer_failure(report)` runs in the watch thread before
    this rank exits with `exit_code` (its errors are logged); `on_peer_lost(report)` likewise before `lost_exit_code`;
    `linger_s`: `report`'s wait, so others read it even when this rank hosts the store (an `srun` job's rank 0) and
    ends right after; `poll_s`: between looks at the store. With `heartbeat_timeout_s`, rank 0 also takes a peer whose
    heartbeat (`Heartbeat`) has not moved for that long for lost: its host died or its link dropped without closing
    anything, which no collective notices before its own timeout.
    """

    def __init__(
        self,
        *,
        poll_s: float = 1.0,
        on_peer_failure: Callable[[str], None] | None = None,
        exit_code: int = 1,
        linger_s: float = 3.0,
        heartbeat_timeout_s: float | None = None,
        on_peer_lost: Callable[[str], None] | None = None,
        lost_exit_code: int = 75,
    ) -> None:
        self.poll_s, self.on_peer_failure, self.exit_code, self.linger_s = poll_s, on_peer_failure, exit_code, linger_s
        self.heartbeat_timeout_s, self.on_peer_lost, self.lost_exit_code = (
            heartbeat_timeout_s,
            on_peer_lost,
            lost_exit_code,
        )
        self._store: Any = None
        self._stop = threading.Event()
        self._thread: threading.Thread | None = None
        self._reported = False
        self._seen: dict[int, tuple[int, float]] = {}  # rank -> (its heartbeat count, when it last moved)

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
            if self._announce(text):
                time.sleep(self.linger_s)
                return None
            return self._read()
        except Exception as e:  # the store is gone (its host ended): nothing more to tell anyone
            log.warning("could not report this rank's failure to the job's store: %s", e)
            return None

    def peer_lost(self, error: BaseException) -> str | None:
        """When `error` is a broken connection to a peer (`is_broken_connection`) and no rank reports a failure of
        its own within `linger_s` (a rank that raised reports before it exits): what was lost, announced to every
        rank as such; else None (a failure: `report` it)."""
        if world_size() == 1 or not is_broken_connection(error):
            return None
        what = f"rank {rank()} on {socket.gethostname()} lost a peer ({type(error).__name__}: {str(error)[:300]})"
        if self._store is None:
            return what
        deadline = time.monotonic() + self.linger_s
        while True:
            try:
                first = self._read()
            except Exception:  # noqa: BLE001 (the store's host, rank 0's, is gone too)
                self._reported = True
                return what
            if first is not None:
                if not first.startswith(LOST_MARK):
                    return None  # a peer failed and said so: its failure, not a loss
                self._reported = True
                return first[len(LOST_MARK) :]
            if time.monotonic() >= deadline:
                break
            time.sleep(min(0.2, self.poll_s))
        self._reported = True
        try:
            self._announce(LOST_MARK + what)
        except Exception:  # noqa: BLE001
            pass
        return what

    def _announce(self, text: str) -> bool:
        """Write `text` as the job's first failure unless one is there already; True when it was the first."""
        # one atomic step (a rank that won a counter and died before writing would leave the key unset forever)
        return self._store.compare_set(FAILURE_KEY, "", text).decode(errors="replace") == text

    def _read(self) -> str | None:
        if not self._store.check([FAILURE_KEY]):
            return None
        return self._store.get(FAILURE_KEY).decode(errors="replace")

    def _stale_peer(self) -> str | None:
        """Rank 0's judgement: the first peer whose heartbeat has not moved for `heartbeat_timeout_s` and that did
        not end normally, in words; else None."""
        now = time.monotonic()
        for peer in range(1, world_size()):
            count = int(self._store.add(f"{HEARTBEAT_KEY}{peer}", 0))
            last = self._seen.get(peer)
            if last is None or last[0] != count:
                self._seen[peer] = (count, now)
            elif now - last[1] > self.heartbeat_timeout_s and not self._store.check([f"{HEARTBEAT_DONE_KEY}{peer}"]):
                return (
                    f"rank {peer} sent no heartbeat for {now - last[1]:.0f} s (trainer.heartbeat_timeout_s="
                    f"{self.heartbeat_timeout_s:g}): its process, its host or its link is gone"
                )
        return None

    def _watch(self) -> None:
        me = f"rank {rank()}:"
        judge = rank() == 0 and self.heartbeat_timeout_s is not None
        while not self._stop.wait(self.poll_s):
            try:
                report = self._read()
                if report is None and judge:
                    lost = self._stale_peer()
                    if lost is not None and not self._stop.is_set():
                        self._announce(LOST_MARK + lost)
                        report = self._read()
            except Exception as e:  # noqa: BLE001 (any store error means its host, a rank, is gone)
                if self._stop.is_set() or self._reported:
                    return
                report = (
                    f"{LOST_MARK}the job's store stopped answering ({type(e).__name__}: {e}): rank 0, which serves "
                    "it, or its host is gone"
                )
            if report is None or report.startswith(me) or self._reported or self._stop.is_set():
                continue
            self._end(report)

    def _end(self, report: str) -> None:
        lost = report.startswith(LOST_MARK)
        what = report[len(LOST_MARK) :] if lost else report
        code = self.lost_exit_code if lost else self.exit_code
        if lost:
            log.error("a peer is lost (%s); ending rank %d with exit code %d (resume)", what, rank(), code)
        else:
            log.error("another rank failed (%s); ending rank %d with exit code %d", what, rank(), code)
        callback = self.on_peer_lost if lost else self.on_peer_failure
        if callback is not None:
            try:
                callback(what)
            except Exception:  # noqa: BLE001 (the exit below matters more than a failed note)
                log.exception("while recording the end of another rank")
        for hook in list(_AT_FORCED_EXIT):
            try:
                hook(code)
            except Exception:  # noqa: BLE001
                log.exception("while recording this rank's exit code")
        for h in logging.getLogger().handlers:
            h.flush()
        sys.stderr.flush()
        os._exit(code)


# What runs before the watch ends a rank with os._exit (no finally block, no atexit runs then): `at_forced_exit`.
_AT_FORCED_EXIT: list[Callable[[int], None]] = []


def at_forced_exit(hook: Callable[[int], None]) -> Callable[[], None]:
    """Run `hook(exit code)` before `FailureWatch` ends this process because another rank failed or was lost (e.g.
    `dapo train` writes its exit file, which the job script reads for its verdict). Returns what unregisters it."""
    _AT_FORCED_EXIT.append(hook)
    return lambda: _AT_FORCED_EXIT.remove(hook) if hook in _AT_FORCED_EXIT else None


def _job_store(quiet: bool = False) -> Any:
    """A client of its own to the job's rendezvous store, in this attempt's namespace (`rendezvous.store_namespace`):
    the watch and heartbeat threads never share the collectives' connection."""
    addr, port = os.environ.get("MASTER_ADDR"), os.environ.get("MASTER_PORT")
    if not addr or not port:
        return None
    try:
        tcp = dist.TCPStore(
            addr, int(port), is_master=False, timeout=datetime.timedelta(seconds=30), wait_for_workers=False
        )
    except Exception as e:  # noqa: BLE001 (without it ranks still fail, only more slowly)
        if not quiet:
            log.warning("no failure watch (cannot reach the job's store at %s:%s: %s)", addr, port, e)
        return None
    return dist.PrefixStore(store_namespace(os.environ), tcp)
