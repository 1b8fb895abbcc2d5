"""Where a job's ranks meet: the rendezvous host and port, the network interface gloo binds, and a meeting that either
happens within a bound or fails naming all three (docs/cluster.md, "Where the ranks meet").

Hand-written, not torch's `env://`: that waits for the collective timeout (an hour by default) on a host it cannot
reach and then names neither the host nor the interface; and gloo, left to itself, advertises whatever address the
node's own hostname resolves to, which on a node with Debian's default /etc/hosts (`127.0.1.1 <hostname>`) or a
management network is one the other nodes cannot reach.
"""

from __future__ import annotations

import ipaddress
import logging
import os
import re
import socket
import zlib
from collections.abc import Mapping
from dataclasses import dataclass

log = logging.getLogger("dapo.distributed")

# The ports a job derives its rendezvous port from when SLURM reserved none for its step: below Linux's ephemeral range
# (net.ipv4.ip_local_port_range, 32768-60999 by default), from which any outgoing connection on the node takes its
# local port, so a busy node's own connections cannot hold the one a job derives.
PORT_BASE, PORT_SPAN = 20000, 12000


class RendezvousError(RuntimeError):
    """The ranks could not meet. `dapo train` exits 75 on it (the workflow's job script requeues the job): a host or
    link that is down now may be up at the next attempt, which also takes another port (`rendezvous_port`)."""


# ---------------------------------------------------------------------------------------------- the host and port
def slurm_hosts(nodelist: str) -> list[str]:
    """The hosts of a SLURM node list, in order: `gpu-[03-05,9],cpu1` -> gpu-03, gpu-04, gpu-05, gpu-9, cpu1 (zero
    padding kept, as `scontrol show hostnames` prints them); several bracketed ranges in one name expand as SLURM's
    hostlist does, the last one fastest: `r[1-2]n[01-02]` -> r1n01, r1n02, r2n01, r2n02."""
    hosts: list[str] = []
    for name in re.findall(r"(?:[^,\[]|\[[^\]]*\])+", nodelist.strip()):
        names = [""]
        for text, ranges in re.findall(r"([^\[]*)(?:\[([^\]]*)\])?", name):
            names = [n + text + x for n in names for x in _expand(ranges)]
        hosts += names
    return hosts


def _expand(ranges: str) -> list[str]:
    """`03-05,9` -> 03, 04, 05, 9 (zero padding kept); "" -> "" (no brackets)."""
    if not ranges:
        return [""]
    out: list[str] = []
    for part in ranges.split(","):
        lo, _, hi = part.partition("-")
        width = len(lo) if lo.startswith("0") else 0
        out += [f"{n:0{width}d}" for n in range(int(lo), int(hi) + 1)] if hi else [lo]
    return out


def rendezvous_port(env: Mapping[str, str]) -> int:
    """The port rank 0 serves the job's store on. SLURM's reserved ports for the step (`SLURM_STEP_RESV_PORTS`, where
    the cluster sets `MpiParams=ports=...`): no two steps sharing a node get the same one. Otherwise one derived from
    the job, its restart count and the step, so two jobs (or two attempts of one, after a port was taken) rarely
    share it: every rank computes the same one."""
    reserved = env.get("SLURM_STEP_RESV_PORTS", "")
    if reserved:
        return int(re.split(r"[-,]", reserved)[0])
    return PORT_BASE + zlib.crc32(_attempt_key(env).encode()) % PORT_SPAN


def _attempt_key(env: Mapping[str, str]) -> str:
    return "/".join(env.get(k, "") for k in ("SLURM_JOB_ID", "SLURM_RESTART_COUNT", "SLURM_STEP_ID"))


def store_namespace(env: Mapping[str, str]) -> str:
    """The prefix of every key this attempt writes in the rendezvous store (the process group's, the heartbeats, the
    failure reports): should another job's store hold the same port, its keys and ours never meet, and this job's
    ranks wait for their own rank 0 (and fail within the rendezvous bound) instead of joining that job's group."""
    return f"dapo/{_attempt_key(env)}/{env.get('TORCHELASTIC_RUN_ID', '')}/"


# ---------------------------------------------------------------------------------------------- the interface
def interface_addresses() -> dict[str, list[str]]:
    """This host's interfaces and their IPv4 addresses (those that have one), secondary addresses included."""
    import psutil  # DeepSpeed's dependency, so installed wherever dapo is

    found = {
        name: [a.address for a in addrs if a.family == socket.AF_INET] for name, addrs in psutil.net_if_addrs().items()
    }
    return {name: addrs for name, addrs in found.items() if addrs}


def _pairs(own: Mapping[str, str | list[str]]) -> list[tuple[str, str]]:
    """(interface, address) for each address of `own` (an interface's one address, or its list)."""
    return [(name, a) for name, v in own.items() for a in ([v] if isinstance(v, str) else v)]


def route_to(address: str) -> str:
    """The local address this host's routing table sends packets to `address` from (a UDP connect: nothing is sent)."""
    with socket.socket(socket.AF_INET, socket.SOCK_DGRAM) as s:
        s.connect((address, 9))
        return s.getsockname()[0]


def resolve(host: str) -> str:
    """`host`'s IPv4 address as this node resolves it."""
    return socket.gethostbyname(host)


@dataclass(frozen=True)
class MeetingPoint:
    """Where this rank meets its peers, as it sees it: the rendezvous host, its address from here, the port, and the
    interface (with its address) this rank's sockets use toward the other nodes."""

    host: str
    address: str
    port: int
    interface: str
    local_address: str

    def describe(self) -> str:
        return (
            f"{self.host}:{self.port} (resolved here to {self.address}) over interface {self.interface} "
            f"({self.local_address})"
        )


def is_local(address: str, own: Mapping[str, str | list[str]]) -> bool:
    return ipaddress.ip_address(address).is_loopback or any(a == address for _, a in _pairs(own))


def meeting_point(
    host: str, port: int, peers: list[str], own: Mapping[str, str | list[str]] | None = None
) -> MeetingPoint:
    """Where this rank meets the others: the interface the route to the rendezvous host leaves by, or, on the
    rendezvous host itself (whose own name may resolve to a loopback address), the route to the first other host of
    the job (`peers`: every host of the job, in node-list order). Raises RendezvousError when a name does not
    resolve."""
    own = interface_addresses() if own is None else own
    try:
        address = resolve(host)
    except OSError as e:
        raise RendezvousError(f"the rendezvous host {host!r} does not resolve on {socket.gethostname()} ({e})") from e
    toward = address
    if is_local(address, own):
        me = socket.gethostname()
        for peer in peers:
            if peer in (host, me, me.split(".")[0]):
                continue
            try:
                toward = resolve(peer)
            except OSError as e:
                raise RendezvousError(f"the job's host {peer!r} does not resolve on {me} ({e})") from e
            break
    local = route_to(toward)
    interface = next((name for name, a in _pairs(own) if a == local), "?")
    if interface == "?":
        log.warning(
            "no interface of %s holds %s, the address the route to %s leaves from: GLOO_SOCKET_IFNAME is left as it "
            "is, and gloo may advertise an address the other nodes cannot reach (set it: docs/cluster.md)",
            socket.gethostname(),
            local,
            toward,
        )
    return MeetingPoint(host=host, address=address, port=port, interface=interface, local_address=local)


def choose_socket_interface(point: MeetingPoint, env: dict[str, str] | os._Environ) -> str:
    """Make gloo bind the meeting interface (`GLOO_SOCKET_IFNAME`, when the user did not set it), so that it
    advertises an address the other nodes reach, whatever this host's name resolves to. NCCL's own choice (its
    bootstrap and socket transport) is left to `NCCL_SOCKET_IFNAME`; a setting that excludes the meeting interface
    is warned about. What was chosen, in words, for the rank's log line."""
    notes = []
    if env.get("GLOO_SOCKET_IFNAME"):
        named = env["GLOO_SOCKET_IFNAME"].split(",")
        notes.append(f"GLOO_SOCKET_IFNAME={env['GLOO_SOCKET_IFNAME']} (set by the user)")
        if point.interface not in named:
            log.warning(
                "GLOO_SOCKET_IFNAME=%s, but the route to the other nodes leaves by %s: the ranks may not meet",
                env["GLOO_SOCKET_IFNAME"],
                point.interface,
            )
    elif point.interface not in ("?", "lo"):
        env["GLOO_SOCKET_IFNAME"] = point.interface
        notes.append(f"GLOO_SOCKET_IFNAME={point.interface}")
    nccl = env.get("NCCL_SOCKET_IFNAME")
    if nccl:
        notes.append(f"NCCL_SOCKET_IFNAME={nccl}")
        if not nccl_may_use(nccl, point.interface):
            log.warning("NCCL_SOCKET_IFNAME=%s excludes %s, the interface the nodes meet on", nccl, point.interface)
    return ", ".join(notes)


def nccl_may_use(setting: str, interface: str) -> bool:
    """Whether NCCL_SOCKET_IFNAME lets NCCL use `interface`: a list of prefixes, `=` for exact names, `^` to exclude
    (NCCL's documented syntax)."""
    exclude = setting.startswith("^")
    body = setting[1:] if exclude else setting
    exact = body.startswith("=")
    names = (body[1:] if exact else body).split(",")
    hit = any(interface == n if exact else interface.startswith(n) for n in names if n)
    return not hit if exclude else hit
