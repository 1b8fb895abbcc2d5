"""What the workflow's controller checks and holds on the submitting machine before any job is submitted: the
tracking store, the training job's SLURM options, the results folder's lock, and the training jobs an earlier
controller left queued or running (docs/cluster.md, "Where the controller lives").

An MLflow SQLite file on a network file system is refused: jobs on many nodes write it at once, and SQLite's locks
do not hold there (SQLite's "How To Corrupt An SQLite Database File", section 2.1).
"""

from __future__ import annotations

import json
import os
import re
import shutil
import socket
import subprocess
import time
import urllib.error
import urllib.request
from pathlib import Path

# File system types (as /proc/mounts names them) that other nodes share over the network.
NETWORK_FS = frozenset(
    "nfs nfs4 lustre gpfs beegfs cifs smb3 smbfs ceph fuse.ceph glusterfs fuse.glusterfs panfs wekafs fuse.sshfs afs "
    "orangefs 9p".split()
)
SERVER_FIX = (
    "start an authenticated one on a machine every node can reach, bound to the cluster's internal interface (e.g. "
    "`mlflow server --app-name basic-auth --host <internal address> --port 5000 --backend-store-uri "
    "sqlite:///<a local disk>/mlflow.db`, with MLFLOW_TRACKING_USERNAME / MLFLOW_TRACKING_PASSWORD exported where "
    "Snakemake runs: README, 'On a SLURM cluster') or pass --config tracking_uri=<its URI>"
)
CREDENTIALS_FIX = (
    "export MLFLOW_TRACKING_USERNAME and MLFLOW_TRACKING_PASSWORD (a user of that server) in the shell that runs "
    "Snakemake: the SLURM jobs inherit them; never write them into a config file, which is logged"
)


class TrackingStoreError(RuntimeError):
    """The tracking store would lose or corrupt runs; the message names it and the fix."""


def filesystem_type(path: str | Path, mounts: str | None = None) -> str:
    """The type of the file system holding `path` (the longest mount point above it in /proc/mounts)."""
    if mounts is None:
        try:
            mounts = Path("/proc/mounts").read_text()
        except OSError:
            return "unknown"
    target = os.path.realpath(path)
    best, kind = "", "unknown"
    for line in mounts.splitlines():
        parts = line.split()
        if len(parts) < 3:
            continue
        point = parts[1].replace("\\040", " ")
        inside = target == point or target.startswith(point.rstrip("/") + "/")
        if inside and len(point) > len(best):
            best, kind = point, parts[2]
    return kind


def server_answers(uri: str, timeout_s: float = 10.0) -> str | None:
    """None when the MLflow server at `uri` answers its health check, else why not."""
    try:
        with urllib.request.urlopen(uri.rstrip("/") + "/health", timeout=timeout_s) as r:
            return None if r.status == 200 else f"HTTP {r.status}"
    except (urllib.error.URLError, OSError, ValueError) as e:
        return str(getattr(e, "reason", e))


def credentials_refused(uri: str) -> str | None:
    """None when the server at `uri` takes the credentials in the environment (or needs none), else why not: its
    health check answers without credentials, so this asks what a run asks first, through MLflow's own client."""
    from mlflow.exceptions import MlflowException
    from mlflow.tracking import MlflowClient

    try:
        MlflowClient(tracking_uri=uri).search_experiments(max_results=1)
    except MlflowException as e:
        if e.error_code in ("UNAUTHENTICATED", "PERMISSION_DENIED"):
            user = os.environ.get("MLFLOW_TRACKING_USERNAME")
            return f"{e.error_code} for user {user or '(none set)'}"
    return None


def check_tracking_store(uri: str, *, cluster: bool, mounts: str | None = None) -> list[str]:
    """Raise `TrackingStoreError` for a store the run cannot use; return warnings for one it can. A server must answer
    and take the environment's credentials now, or every training job would queue for its GPUs, then fail."""
    if uri.startswith(("http://", "https://")):
        why = server_answers(uri)
        if why is not None:
            raise TrackingStoreError(f"the MLflow tracking server {uri} does not answer ({why}); {SERVER_FIX}.")
        why = credentials_refused(uri)
        if why is not None:
            raise TrackingStoreError(
                f"the MLflow tracking server {uri} refused the request ({why}); {CREDENTIALS_FIX}."
            )
        return []
    if not (cluster and uri.startswith("sqlite:///")):
        return []
    db = Path(uri.removeprefix("sqlite:///"))
    kind = filesystem_type(db, mounts)
    if kind in NETWORK_FS:
        raise TrackingStoreError(
            f"MLflow would write to the SQLite file {db} on a {kind} file system, from jobs on many nodes at once: "
            f"SQLite's locks do not hold on network file systems, and the database can be corrupted. Use a "
            f"tracking server instead: {SERVER_FIX}."
        )
    return [
        f"MLflow writes to the SQLite file {db} on a local ({kind}) file system: only jobs on this node can reach "
        f"it. That suits a one-node cluster; with several nodes, {SERVER_FIX}."
    ]


# `--signal=[{R|B}:]<sig_num>[@sig_time]` (sbatch(1)); newer SLURM also takes both letters, `RB:`.
_SIGNAL_OPTION = re.compile(r"--signal(?:=|\s+)['\"]?(?P<flags>[A-Za-z]+):(?P<rest>[^\s'\"]*)")


def batch_signal_problem(slurm_extra: str | None, margin_s: float) -> str | None:
    """Why the training job's SLURM options (`slurm_extra`) are refused: a `B:` signal; None when they are not."""
    for m in _SIGNAL_OPTION.finditer(slurm_extra or ""):
        if "B" in m["flags"].upper():
            return (
                f"the train job's slurm_extra asks SLURM for `--signal={m['flags']}:{m['rest']}`: a `B:` signal "
                "goes to the job's batch shell only, never to the training ranks, so the trainer does not stop to "
                "checkpoint; and one that lands while Snakemake's job script wraps up a finished row kills it, the "
                "job ends FAILED and Snakemake deletes the row's DONE.json. The train rule already asks for "
                f"`--signal=USR1@{int(margin_s)}` (to every rank; the margin is trainer.stop_margin_s): drop the "
                "option from --set-resources or the profile's set-resources, or write it without `B:`"
            )
    return None


# ------------------------------------------------------------------------------------- the controller's lock
CONTROLLER_LOCK = ".controller.json"


class ControllerLockError(RuntimeError):
    """Another controller holds the results folder; the message names it and what to do."""


def _alive_here(pid: int) -> bool:
    """Whether process `pid` on this host is a running Snakemake (a recycled pid running something else is not)."""
    try:
        cmdline = Path(f"/proc/{pid}/cmdline").read_bytes()
    except OSError:
        return False
    return b"snakemake" in cmdline


def acquire_controller_lock(results: Path, argv: list[str], pid: int | None = None) -> str | None:
    """Take `results`/.controller.json for process `pid` (default this one), or raise `ControllerLockError` when
    another live controller holds it; a lock whose process is gone (same host) is taken over, and the note says so.
    Snakemake's own lock covers one working directory, this one the results folder (docs/cluster.md)."""
    results.mkdir(parents=True, exist_ok=True)
    path = results / CONTROLLER_LOCK
    me = {"host": socket.gethostname(), "pid": pid or os.getpid(), "started": time.time(), "argv": argv}
    note = None
    for _ in range(2):
        try:
            fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o644)
        except FileExistsError:
            try:
                holder = json.loads(path.read_text())
            except (OSError, json.JSONDecodeError):
                holder = {}
            host, pid = holder.get("host"), int(holder.get("pid") or 0)
            since = time.strftime("%Y-%m-%d %H:%M", time.localtime(holder.get("started") or 0))
            if host == me["host"] and pid and not _alive_here(pid):
                path.unlink(missing_ok=True)
                note = f"took over {path}: its controller (pid {pid}, started {since}) is gone"
                continue
            where = "this machine" if host == me["host"] else f"host {host}"
            raise ControllerLockError(
                f"another Snakemake controller (pid {pid} on {where}, started {since}) drives {results}: a second "
                f"one would submit the same rows again. Wait for it to end, or watch it with `dapo status {results}`; "
                f"if that controller is gone (its machine rebooted), delete {path} and run again"
            ) from None
        with os.fdopen(fd, "w") as f:
            json.dump(me, f)
        return note
    raise ControllerLockError(f"{path}: could not be taken")


def release_controller_lock(results: Path, pid: int | None = None) -> None:
    """Remove the lock if process `pid` (default this one) holds it (a controller never removes another's)."""
    path = results / CONTROLLER_LOCK
    try:
        holder = json.loads(path.read_text())
    except (OSError, json.JSONDecodeError):
        return
    if holder.get("host") == socket.gethostname() and holder.get("pid") == (pid or os.getpid()):
        path.unlink(missing_ok=True)


# --------------------------------------------------------------------------- jobs an earlier controller left
TRAIN_COMMENT = "rule_train_wildcards_"  # the SLURM plugin's job comment: rule_<rule>_wildcards_<row>_<seed>


def parse_train_jobs(squeue_out: str) -> dict[tuple[str, int], tuple[str, str]]:
    """(run name, seed) -> (job id, state) from `squeue -h -o %i|%T|%k` (job id, state, comment) lines of train jobs."""
    found: dict[tuple[str, int], tuple[str, str]] = {}
    for line in squeue_out.splitlines():
        parts = line.strip().split("|", 2)
        if len(parts) != 3 or not parts[2].startswith(TRAIN_COMMENT):
            continue
        name, _, seed = parts[2][len(TRAIN_COMMENT) :].strip().rpartition("_")
        if name and seed.isdigit():
            found[(name, int(seed))] = (parts[0], parts[1])
    return found


def live_train_jobs(results: Path) -> dict[tuple[str, int], tuple[str, str]]:
    """Training jobs still queued or running for the runs under `results` ((run name, seed) -> (job id, state)),
    e.g. those a dead controller left: found by the SLURM plugin's comment (SLURM names a job by its controller's
    random run id) and kept when the batch script SLURM stored for them reads this results folder. Empty without
    SLURM."""

    def stdout(*cmd: str) -> str | None:
        try:
            return subprocess.run(cmd, capture_output=True, text=True, timeout=60).stdout
        except (OSError, subprocess.SubprocessError):
            return None

    out = stdout("squeue", "--me", "-h", "-o", "%i|%T|%k") if shutil.which("squeue") else None
    marker = f"{results.resolve()}/"
    return {
        key: (job, state)
        for key, (job, state) in parse_train_jobs(out or "").items()
        if marker in (stdout("scontrol", "write", "batch_script", job, "-") or "")
    }
