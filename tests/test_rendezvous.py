"""Where a job's ranks meet (dapo/rendezvous.py, `dapo.distributed.meet`) and how they end when a peer is lost
(`dapo.distributed.FailureWatch`'s heartbeat and broken connections). The pure parts here; plain processes on this
machine for the watch (a peer killed, a peer frozen without closing anything, a rank alone at the meeting, a peer
that ended normally); tests/test_slurm.py runs the same across the hosts of the multi-node test cluster."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest
from _env import child_env, free_port

from dapo import distributed as D
from dapo import rendezvous as R

WORKER = Path(__file__).with_name("_meet_worker.py")


# ------------------------------------------------------------------------------------------ the host and the port
def test_launcher_env_from_torchrun_slurm_or_nothing():
    assert D.launcher_env({}) is None
    tr = D.launcher_env({"RANK": "3", "WORLD_SIZE": "8", "LOCAL_RANK": "1", "MASTER_ADDR": "h", "MASTER_PORT": "1"})
    assert (tr["RANK"], tr["WORLD_SIZE"], tr["LOCAL_RANK"], tr["MASTER_ADDR"]) == ("3", "8", "1", "h")
    job = {"SLURM_PROCID": "5", "SLURM_NTASKS": "16", "SLURM_LOCALID": "5"}
    sl = D.launcher_env({**job, "SLURM_JOB_NODELIST": "gpu-[003-004,010],cpu1"})
    assert (sl["RANK"], sl["WORLD_SIZE"], sl["LOCAL_RANK"], sl["MASTER_ADDR"]) == ("5", "16", "5", "gpu-003")
    # SLURM's reserved ports for the step win (MpiParams=ports): no two steps on a node get the same one
    assert D.launcher_env({**job, "SLURM_STEP_RESV_PORTS": "12003-12004"})["MASTER_PORT"] == "12003"


def test_the_node_list_expands_as_scontrol_show_hostnames_does():
    assert R.slurm_hosts("gpu-[003-004,010],cpu1") == ["gpu-003", "gpu-004", "gpu-010", "cpu1"]
    assert R.slurm_hosts("n[7-9]") == ["n7", "n8", "n9"] and R.slurm_hosts("n[08-10]") == ["n08", "n09", "n10"]
    assert R.slurm_hosts("nodeA,nodeB") == ["nodeA", "nodeB"] and R.slurm_hosts("n[1,3]") == ["n1", "n3"]
    # several ranges in one name (racks and nodes), the last one fastest, as SLURM's hostlist expands them
    assert R.slurm_hosts("r[1-2]n[01-02],login") == ["r1n01", "r1n02", "r2n01", "r2n02", "login"]


def test_the_derived_port_differs_between_jobs_attempts_and_steps_and_agrees_across_ranks():
    """Without reserved ports the port is a hash of the job, its restart count and the step: every rank of a step
    computes the same one, and two jobs on a node (or the attempt after one whose port was taken) rarely share it."""
    base = {"SLURM_JOB_ID": "101", "SLURM_RESTART_COUNT": "0", "SLURM_STEP_ID": "0"}
    variants = [
        base,
        {**base, "SLURM_JOB_ID": "102"},
        {**base, "SLURM_RESTART_COUNT": "1"},
        {**base, "SLURM_STEP_ID": "1"},
    ]
    ports = [R.rendezvous_port(v) for v in variants]
    assert len(set(ports)) == 4 and all(R.PORT_BASE <= p < R.PORT_BASE + R.PORT_SPAN for p in ports)
    assert R.rendezvous_port(dict(base)) == ports[0]  # the same job step: the same port on every rank
    # jobs 20000 apart met on one port with the old job-id-modulo rule; the hash keeps them apart
    assert R.rendezvous_port({**base, "SLURM_JOB_ID": "20101"}) != ports[0]
    low, _ = (int(x) for x in Path("/proc/sys/net/ipv4/ip_local_port_range").read_text().split())
    assert R.PORT_BASE + R.PORT_SPAN <= low  # never a port the node's own outgoing connections are handed


def test_two_jobs_on_one_store_port_never_read_each_others_keys():
    """Should two jobs derive the same port, a rank of one that reached the other's store reads and writes only its
    own attempt's keys: no failure report, heartbeat or process-group key crosses (`store_namespace`); and a
    failure report is written once, atomically: the first stands."""
    import datetime

    import torch.distributed as tdist

    server = tdist.TCPStore("127.0.0.1", 0, is_master=True, wait_for_workers=False,
                            timeout=datetime.timedelta(seconds=5))  # fmt: skip
    jobs = [{"SLURM_JOB_ID": j, "SLURM_RESTART_COUNT": "0", "SLURM_STEP_ID": "0"} for j in ("101", "102")]
    a, b = (tdist.PrefixStore(R.store_namespace(env), server) for env in jobs)
    watch_a, watch_b = D.FailureWatch(), D.FailureWatch()
    watch_a._store, watch_b._store = a, b
    assert watch_a._announce("rank 1: RuntimeError: boom") and watch_b._read() is None
    assert not watch_a._announce("rank 0: a later one") and watch_a._read() == "rank 1: RuntimeError: boom"
    assert R.store_namespace({**jobs[0], "SLURM_RESTART_COUNT": "1"}) != R.store_namespace(jobs[0])


def test_a_heartbeat_outlives_a_store_that_stops_answering_for_a_while(monkeypatch):
    """A blip on the store's network: the pulse reconnects and goes on, so the judge does not take a healthy rank for
    lost once the blip is over (it used to stop at the first error, for good)."""

    class Store:
        def __init__(self, fails: int) -> None:
            self.fails, self.count = fails, 0

        def add(self, key: str, n: int) -> int:
            if self.fails > 0:
                self.fails -= 1
                raise RuntimeError("Connection reset by peer")
            self.count += n
            return self.count

    flaky, fresh = Store(fails=3), Store(fails=0)
    monkeypatch.setattr(D, "_job_store", lambda quiet=False: fresh)
    beat = D.Heartbeat(flaky, rank=1, interval_s=0.01)
    beat._thread.start()
    until(lambda: fresh.count >= 5, 10)
    beat.stop(done=False)


# ------------------------------------------------------------------------------------------ the interface
def test_the_rendezvous_host_meets_over_the_interface_toward_the_other_nodes(monkeypatch):
    """Debian's default /etc/hosts maps a host's own name to 127.0.1.1: on the rendezvous host the route to it is
    loopback, and gloo left alone would advertise an address no other node reaches. The interface chosen is the
    one the route to the next host of the job leaves by; on the other hosts, the route to the rendezvous host."""
    names = {"n1": "127.0.1.1", "n2": "10.0.0.12"}
    own = {"lo": "127.0.0.1", "docker0": "172.17.0.1", "eth1": "10.0.0.11"}
    monkeypatch.setattr(R, "resolve", lambda host: names[host])
    monkeypatch.setattr(R, "route_to", lambda address: "10.0.0.11" if address.startswith("10.") else "127.0.0.1")
    monkeypatch.setattr(R.socket, "gethostname", lambda: "n1")
    point = R.meeting_point("n1", 12001, ["n1", "n2"], own)
    assert (point.address, point.interface, point.local_address) == ("127.0.1.1", "eth1", "10.0.0.11")
    env: dict[str, str] = {}
    assert R.choose_socket_interface(point, env) == "GLOO_SOCKET_IFNAME=eth1" and env["GLOO_SOCKET_IFNAME"] == "eth1"
    # a user's own choice stands (and is named in the rank's log line)
    env = {"GLOO_SOCKET_IFNAME": "ib0", "NCCL_SOCKET_IFNAME": "^lo,docker0"}
    assert (
        R.choose_socket_interface(point, env)
        == "GLOO_SOCKET_IFNAME=ib0 (set by the user), NCCL_SOCKET_IFNAME=^lo,docker0"
    )
    assert env["GLOO_SOCKET_IFNAME"] == "ib0"
    with pytest.raises(R.RendezvousError, match="'n3' does not resolve"):
        monkeypatch.setattr(R, "resolve", lambda host: (_ for _ in ()).throw(OSError("Name or service not known")))
        R.meeting_point("n3", 1, ["n3"], own)


def test_nccls_interface_setting_is_read_as_nccl_documents_it():
    assert R.nccl_may_use("eth", "eth0") and not R.nccl_may_use("ib", "eth0")
    assert R.nccl_may_use("^lo,docker0", "eth0") and not R.nccl_may_use("^eth", "eth0")
    assert R.nccl_may_use("=eth0", "eth0") and not R.nccl_may_use("=eth", "eth0")


def test_only_a_collectives_broken_connection_counts_as_a_lost_peer():
    gloo = RuntimeError(
        "[../third_party/gloo/gloo/transport/tcp/pair.cc:553] Connection closed by peer [10.77.0.12]:42697"
    )
    assert D.is_broken_connection(gloo)
    try:  # raised from one: what DeepSpeed or our collectives re-raise keeps the cause
        raise ValueError("all_gather failed") from gloo
    except ValueError as e:
        assert D.is_broken_connection(e)
    assert not D.is_broken_connection(RuntimeError("CUDA out of memory"))
    assert not D.is_broken_connection(ConnectionResetError("Connection reset by peer"))  # MLflow's, not a peer's
    nccl = RuntimeError(  # a surviving rank's collective on a GPU cluster (torch's NCCL error detail)
        "NCCL error in: ProcessGroupNCCL.cpp:2066, remote process exited or there was a network error, NCCL version "
        "2.27.3\nncclRemoteError: A call failed possibly due to a network error or a remote process exiting "
        "prematurely."
    )
    assert D.is_broken_connection(nccl)
    assert not D.is_broken_connection(RuntimeError("NCCL error: unhandled cuda error (run with NCCL_DEBUG=INFO)"))


# ------------------------------------------------------------------------------------------ plain ranks here
def start_ranks(tmp: Path, *args: str, world: int = 2, ranks: range | None = None) -> list[subprocess.Popen]:
    port = free_port()
    procs = []
    for rank in ranks if ranks is not None else range(world):
        env = child_env(RANK=str(rank), WORLD_SIZE=str(world), LOCAL_RANK=str(rank), MASTER_ADDR="127.0.0.1",
                        MASTER_PORT=str(port))  # fmt: skip
        out = (tmp / f"rank{rank}.log").open("w")
        procs.append(subprocess.Popen([sys.executable, str(WORKER), *args], stdout=out, stderr=subprocess.STDOUT,
                                      env=env, start_new_session=True))  # fmt: skip
    return procs


def log_of(tmp: Path, rank: int) -> str:
    return (tmp / f"rank{rank}.log").read_text(errors="replace")


def until(what, timeout: float) -> None:
    deadline = time.monotonic() + timeout
    while not what():
        assert time.monotonic() < deadline, "timed out"
        time.sleep(0.2)


def ended_within(proc: subprocess.Popen, timeout: float) -> tuple[int, float]:
    t0 = time.monotonic()
    try:
        return proc.wait(timeout), time.monotonic() - t0
    finally:
        if proc.poll() is None:
            proc.kill()


def test_a_peer_killed_mid_collective_is_lost_not_failed(tmp_path):
    """SIGKILL of rank 1 (what a host's crash or the OOM killer does to a process; here the kernel closes its
    sockets): rank 0's collective breaks, no rank reported a failure, so rank 0 exits 75 (resume) at once, not 1."""
    r0, r1 = start_ranks(tmp_path, "0", "30", "60")
    until(lambda: "step 3:" in log_of(tmp_path, 0), 120)
    r1.kill()
    code, took = ended_within(r0, 60)
    assert code == 75, log_of(tmp_path, 0)[-3000:]
    assert took < 15, f"rank 0 took {took:.0f} s"  # the broken connection, then linger_s (3 s) for a report
    lost = log_of(tmp_path, 0).split("PeerLost: rank 0 on", 1)[-1]  # gloo's words depend on where the read was
    assert "Connection closed by peer" in lost or "Connection reset by peer" in lost, log_of(tmp_path, 0)[-2000:]


def test_a_frozen_peer_is_lost_after_the_heartbeat_timeout(tmp_path):
    """SIGSTOP of rank 1: its sockets stay open, as a host's do when it vanishes (power, link), so rank 0's
    collective waits; rank 0's watch sees rank 1's heartbeat stand still and ends the job with 75 after the
    heartbeat timeout (4 s here), not at the collective timeout (600 s here)."""
    r0, r1 = start_ranks(tmp_path, "0", "4", "60")
    until(lambda: "step 3:" in log_of(tmp_path, 0), 120)
    os.kill(r1.pid, signal.SIGSTOP)
    try:
        code, took = ended_within(r0, 60)
    finally:
        r1.kill()
    assert code == 75, log_of(tmp_path, 0)[-3000:]
    assert 4 <= took < 15, f"rank 0 took {took:.0f} s"
    assert "rank 1 sent no heartbeat for" in log_of(tmp_path, 0) and "exit code 75 (resume)" in log_of(tmp_path, 0)
    assert "forced exit with 75" in log_of(tmp_path, 0)  # the exit hook ran before os._exit: the exit file is written


def test_a_rank_alone_at_the_meeting_fails_within_the_bound_naming_host_port_and_interface(tmp_path):
    (r0,) = start_ranks(tmp_path, "1", "30", "3", ranks=range(1))  # rank 1 of 2 never comes
    code, took = ended_within(r0, 60)
    text = log_of(tmp_path, 0)
    assert code == 75 and took < 30, text[-3000:]
    assert "RendezvousError: rank 0 of 2 on" in text and "could not meet the others at 127.0.0.1:" in text
    assert "over interface lo (127.0.0.1) within 3 s" in text and "GLOO_SOCKET_IFNAME" in text


def test_a_peer_that_ended_normally_is_not_lost(tmp_path):
    """Rank 1 finishes and exits; rank 0 stays in its watch three heartbeat timeouts longer (writing the final model,
    MLflow's last retries) and still ends with 0: a rank marks itself done at exit."""
    r0, r1 = start_ranks(tmp_path, "3", "2", "60", "7")
    assert ended_within(r1, 60)[0] == 0, log_of(tmp_path, 1)[-2000:]
    assert ended_within(r0, 60)[0] == 0, log_of(tmp_path, 0)[-2000:]
    assert "sent no heartbeat" not in log_of(tmp_path, 0)
