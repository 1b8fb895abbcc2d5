"""MLflow tracking that training can rely on: one run per training run, whatever kills it, and one point per
(metric, step) in that run, even when the tracking server goes away for a while. `SpoolJournal` (the records
waiting, in a file), `MlflowSink` (the run in the store) and `Tracker` (the policy between them); how each
guarantee holds: docs/architecture.md, "tracking.py"."""

from __future__ import annotations

import contextlib
import json
import logging
import os
import threading
import time
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from dapo import metric_names as M
from dapo.fsio import atomic_write

log = logging.getLogger(__name__)

# MLflow's own limits (mlflow.utils.validation): longer values are rejected, so we truncate.
MAX_PARAM_VAL_LENGTH = 6000
MAX_TAG_VAL_LENGTH = 8000
MAX_KEY_LENGTH = 250
MAX_METRICS_PER_BATCH = 1000
MAX_PARAMS_TAGS_PER_BATCH = 100
_BATCH = {"metric": MAX_METRICS_PER_BATCH, "param": MAX_PARAMS_TAGS_PER_BATCH, "tag": MAX_PARAMS_TAGS_PER_BATCH}
TERMINAL = ("FINISHED", "FAILED", "KILLED")
RUN_FILE = "run.json"  # the run this spool folder belongs to (training runs)
UNDELIVERED = ".undelivered"  # beside a spool that `finish` could not deliver

# Fail fast when the server is away (MLflow's defaults retry for minutes). Its REST store reads these from os.environ
# per request (no per-client setting), so the sink sets them around its own calls only, and only those the user has
# not set.
_HTTP_ENV = {
    "MLFLOW_HTTP_REQUEST_MAX_RETRIES": "1",
    "MLFLOW_HTTP_REQUEST_BACKOFF_FACTOR": "1",
    "MLFLOW_HTTP_REQUEST_BACKOFF_JITTER": "0.1",
    "MLFLOW_HTTP_REQUEST_TIMEOUT": "10",
}
_http_lock = threading.RLock()


@contextlib.contextmanager
def fail_fast_http() -> Iterator[None]:
    with _http_lock:  # one scope at a time (sinks on two threads take turns): it restores what it set
        added = [k for k in _HTTP_ENV if k not in os.environ]
        os.environ.update({k: _HTTP_ENV[k] for k in added})
        try:
            yield
        finally:
            for k in added:
                os.environ.pop(k, None)


class TrackingUnavailable(RuntimeError):
    """A new run could not be created because the tracking store did not answer."""


class TrackingRefused(RuntimeError):
    """The server refused the credentials (HTTP 401) or the permission (HTTP 403): no retry can help."""


# MLflow's error codes for HTTP 401 and 403 (an authenticated server: `mlflow server --app-name basic-auth`).
AUTH_ERRORS = ("UNAUTHENTICATED", "PERMISSION_DENIED")
CREDENTIALS_FIX = (
    "an authenticated MLflow server takes the user and password from MLFLOW_TRACKING_USERNAME and "
    "MLFLOW_TRACKING_PASSWORD in the environment (a SLURM job inherits the submitting shell's); never from a config "
    "file, which is logged; a 403 means that user may not write to this experiment (its owner or an admin grants it)"
)


def refused(uri: str, e: Exception, what: str) -> TrackingRefused | None:
    """A `TrackingRefused` naming the user and the fix when `e` is the server refusing credentials, else None."""
    code = getattr(e, "error_code", "")
    if code not in AUTH_ERRORS:
        return None
    user = os.environ.get("MLFLOW_TRACKING_USERNAME")
    return TrackingRefused(
        f"MLflow at {uri} refused to {what} ({code} for user {user or '(none set)'}: {_first_line(e)}). Nothing "
        f"was trained. {CREDENTIALS_FIX}."
    )


def resolve_uri(uri: str | None, results_dir: str | Path = "results") -> str:
    """`uri`, else $MLFLOW_TRACKING_URI, else `sqlite:///<results_dir>/mlflow.db` (absolute; artifacts beside it)."""
    return uri or os.environ.get("MLFLOW_TRACKING_URI") or f"sqlite:///{Path(results_dir).resolve() / 'mlflow.db'}"


def _local_artifact_root(uri: str) -> str | None:
    """For an sqlite store, the artifact folder beside the database; None for a server (its own root applies)."""
    if uri.startswith("sqlite:///"):
        return (Path(uri.removeprefix("sqlite:///")).parent / "mlartifacts").as_uri()
    return None


def kv_record(kind: str, key: Any, value: Any) -> dict[str, Any]:
    """A param or tag record, key and value truncated to MLflow's limits (longer ones are rejected)."""
    limit = MAX_PARAM_VAL_LENGTH if kind == "param" else MAX_TAG_VAL_LENGTH
    return {"kind": kind, "key": _truncate(key, MAX_KEY_LENGTH), "value": _truncate(value, limit)}


def _truncate(value: Any, limit: int) -> str:
    s = str(value)
    return s if len(s) <= limit else s[: limit - 3] + "..."


def read_run_file(spool_dir: str | Path) -> dict[str, Any] | None:
    """The run recorded in a spool folder (`run.json`), or None."""
    path = Path(spool_dir) / RUN_FILE
    if not path.is_file():
        return None
    try:
        data = json.loads(path.read_text())
    except (OSError, json.JSONDecodeError):
        return None
    return data if isinstance(data, dict) and data.get("run_id") else None


class SpoolJournal:
    """The records waiting for the store, in order: `<folder>/<run id>.jsonl`, a JSON record a line (no MLflow).
    `meta` ({"run_id", "uri", "experiment"}, for a later replay) goes beside it as `.meta.json` with the first record;
    `note` is the `.undelivered` note of a `finish` that gave up."""

    def __init__(self, folder: Path, meta: dict[str, Any]) -> None:
        self.meta = meta
        self.path = folder / f"{meta['run_id']}.jsonl"
        self.note = self.path.with_suffix(UNDELIVERED)

    def waiting(self) -> bool:
        return self.path.is_file() and self.path.stat().st_size > 0

    def append(self, recs: list[dict[str, Any]]) -> None:
        if not recs:
            return
        meta = self.path.with_suffix(".meta.json")
        if not meta.is_file():
            atomic_write(meta, json.dumps(self.meta))
        with self.path.open("a") as f:
            f.write("".join(json.dumps(r) + "\n" for r in recs))

    def read(self) -> list[dict[str, Any]]:
        recs = []
        for i, line in enumerate(self.path.read_text().splitlines() if self.path.is_file() else [], start=1):
            if not line.strip():
                continue
            try:
                recs.append(json.loads(line))
            except json.JSONDecodeError:
                # a kill in the middle of an append leaves a torn last line: that record never counted
                log.warning("%s:%d: unreadable spool record skipped", self.path, i)
        return recs

    def rewrite(self, recs: list[dict[str, Any]]) -> None:
        """Replace the journal by what a replay left: a crash leaves the old or the new one, never half of one."""
        atomic_write(self.path, "".join(json.dumps(r) + "\n" for r in recs))

    def mark_undelivered(self) -> None:
        """Write the note that records wait here (for people and `dapo status`), and warn."""
        n = len(self.read())
        self.note.write_text(
            f"{n} record(s) of MLflow run {self.meta['run_id']} could not be delivered to {self.meta['uri']} "
            f"(last try {time.strftime('%Y-%m-%d %H:%M:%S')}). They wait in {self.path.name}; the next "
            "`dapo train` on this run directory, `dapo status --replay`, or `dapo report --runs` delivers "
            "them once the server answers.\n"
        )
        log.warning("MLflow unreachable at finish: %d record(s) kept in %s (see %s)", n, self.path, self.note)


def store_lock(uri: str) -> contextlib.AbstractContextManager[Any]:
    """`<db>.lock` serialising store, experiment and run creation across processes (two on a fresh SQLite store
    both create its tables and one fails: "table ... already exists"); a null context for a server."""
    if not uri.startswith("sqlite:///"):
        return contextlib.nullcontext()
    from filelock import FileLock

    db = Path(uri.removeprefix("sqlite:///"))
    db.parent.mkdir(parents=True, exist_ok=True)
    return FileLock(str(db) + ".lock", timeout=300)


def ensure_experiment(client: Any, uri: str, name: str) -> str:
    """The id of experiment `name`, created when missing with dapo's artifact location (`_local_artifact_root`); the
    trainer and `dapo tracking-store` both create it here. Call under `store_lock(uri)`."""
    exp = client.get_experiment_by_name(name)
    if exp is not None:
        return exp.experiment_id
    try:
        return client.create_experiment(name, artifact_location=_local_artifact_root(uri))
    except Exception:
        exp = client.get_experiment_by_name(name)  # another process created it meanwhile (parallel jobs)
        if exp is None:
            raise
        return exp.experiment_id


class MlflowSink:
    """Run `run_id` in the store at `uri`, or (None) a new run in `experiment`; `reachable` is False when a resumed
    run's store did not answer at start. `send` says how many records landed: the rest are the Tracker's."""

    def __init__(self, uri: str, experiment: str, run_name: str | None, run_id: str | None, start_timeout_s: float):
        from mlflow.tracking import MlflowClient

        self.uri = uri
        self.dropped_points = 0  # points at or below a step the run already held (a resumed run's recompute)
        self.refused: list[str] = []  # records the store refused, one line each
        self.experiment_id: str | None = None  # known once the store answered
        with store_lock(self.uri):  # the client creates (or migrates) an SQLite store's tables at once
            self.client = MlflowClient(tracking_uri=uri)
        # per metric key, the highest step the run holds; None until learned (a resumed run asks the store)
        self._floor: dict[str, int] | None = None if run_id is not None else {}
        self.run_id: str = run_id if run_id is not None else self._create(experiment, run_name, start_timeout_s)
        self.reachable = run_id is None or self._resume()

    def _create(self, experiment: str, run_name: str | None, timeout_s: float) -> str:
        deadline = time.monotonic() + timeout_s
        while True:
            try:
                with fail_fast_http(), store_lock(self.uri):
                    exp_id = self.experiment_id = ensure_experiment(self.client, self.uri, experiment)
                    return self.client.create_run(exp_id, run_name=run_name).info.run_id
            except Exception as e:
                if (no := refused(self.uri, e, f"start a run in experiment {experiment!r}")) is not None:
                    raise no from e
                if _is_rejection(e) or time.monotonic() >= deadline:
                    raise TrackingUnavailable(
                        f"MLflow at {self.uri} could not start a run in experiment {experiment!r} "
                        f"({type(e).__name__}: {_first_line(e)}). Nothing was trained. Start the tracking server "
                        "(on a cluster an authenticated one, bound to the cluster's internal interface: `mlflow "
                        "server --app-name basic-auth --host <internal address> ...`, README 'On a SLURM cluster') "
                        "or point tracking.uri / MLFLOW_TRACKING_URI at one that answers; tracking.start_timeout_s "
                        f"({timeout_s:g} s here) is how long a new run waits for it."
                    ) from e
                log.warning("MLflow at %s unreachable (%s); retrying the run's start", self.uri, type(e).__name__)
                time.sleep(min(5.0, max(0.0, deadline - time.monotonic())))

    def _resume(self) -> bool:
        """A resumed run must exist in this store; an unreachable store is fine (False: the caller spools)."""
        try:
            with fail_fast_http(), store_lock(self.uri):
                self.experiment_id = self.client.get_run(self.run_id).info.experiment_id
            return True
        except Exception as e:
            if (no := refused(self.uri, e, f"resume run {self.run_id}")) is not None:
                raise no from e
            if getattr(e, "error_code", "") == "RESOURCE_DOES_NOT_EXIST":
                raise RuntimeError(
                    f"MLflow run {self.run_id} does not exist at {self.uri}: the run directory was made with "
                    "another tracking URI. Set tracking.uri to the store that holds it, or start a new run "
                    "directory."
                ) from e
            log.warning(
                "MLflow at %s unreachable at start (%s): run %s spools", self.uri, type(e).__name__, self.run_id
            )
            return False

    def send(self, recs: list[dict[str, Any]]) -> int:
        """Write records in order, batching consecutive same-kind ones; return how many were consumed (written,
        refused or dropped as held: a prefix of `recs`), fewer than all when the store could not be reached."""
        i = 0
        with fail_fast_http():
            while i < len(recs):
                kind, j = recs[i]["kind"], i + 1  # artifacts and status changes go one at a time
                while j < len(recs) and recs[j]["kind"] == kind and j - i < _BATCH.get(kind, 1):
                    j += 1
                try:
                    self._write_isolating(kind, recs[i:j])
                except Exception as e:
                    log.warning("MLflow at %s unreachable (%s); spooling", self.uri, type(e).__name__)
                    return i
                i = j
        return i

    def _write_isolating(self, kind: str, recs: list[dict[str, Any]]) -> None:
        """Write a batch; when the store refuses it (e.g. a param changed on resume), write its halves apart, down
        to single records, so a refused record (named in `refused`) loses only itself. Unreachable: propagates."""
        try:
            self._write(kind, recs)
        except Exception as e:
            if not _is_rejection(e):
                raise
            if len(recs) > 1:
                half = len(recs) // 2
                self._write_isolating(kind, recs[:half])
                self._write_isolating(kind, recs[half:])
                return
            what = f"{kind} {recs[0].get('key', recs[0].get('path', ''))}".strip()
            if kind == "metric":
                what += f" at step {recs[0]['step']}"
            if what not in self.refused:  # a batch spooled again after a lost connection is refused again
                self.refused.append(what)
                log.warning("MLflow refused %s: %s", what, _first_line(e))

    def _learn_floor(self) -> dict[str, int]:
        """Per metric key, the highest step this run already holds in the store."""
        if self._floor is None:
            keys = self.client.get_run(self.run_id).data.metrics
            steps = {k: [m.step for m in self.client.get_metric_history(self.run_id, k)] for k in keys}
            self._floor = {k: max(s) for k, s in steps.items() if s}
        return self._floor

    def _write(self, kind: str, recs: list[dict[str, Any]]) -> None:
        from mlflow.entities import Metric, Param, RunTag

        if kind == "metric":
            # in spool order: a point an earlier record (or the store) already covers is dropped
            marks = dict(self._learn_floor())
            fresh = []
            for r in recs:
                if r["key"] not in marks or r["step"] > marks[r["key"]]:
                    fresh.append(r)
                    marks[r["key"]] = r["step"]
            if metrics := [Metric(r["key"], r["value"], r["timestamp"], r["step"]) for r in fresh]:
                self.client.log_batch(self.run_id, metrics=metrics)
            if len(fresh) < len(recs):
                log.info("%d point(s) at steps run %s held were not written again", len(recs) - len(fresh), self.run_id)
            self.dropped_points += len(recs) - len(fresh)
            self._floor = marks
        elif kind == "param":
            self.client.log_batch(self.run_id, params=[Param(r["key"], r["value"]) for r in recs])
        elif kind == "tag":
            self.client.log_batch(self.run_id, tags=[RunTag(r["key"], r["value"]) for r in recs])
        elif kind == "status":
            for r in recs:
                set_status = self.client.set_terminated if r["status"] in TERMINAL else self.client.update_run
                set_status(self.run_id, status=r["status"])
        elif kind == "artifact":
            for r in recs:
                p = Path(r["path"])
                if not p.exists():
                    log.warning("artifact %s vanished before upload; skipped", p)
                    continue
                upload = self.client.log_artifacts if p.is_dir() else self.client.log_artifact
                upload(self.run_id, str(p), r["artifact_path"])
        else:
            raise ValueError(f"unknown spool record kind {kind!r}")


class Tracker:
    """One MLflow run (docs/architecture.md, "tracking.py").

    `run_id`: resume this run; None: the one in `spool_dir/run.json`, else a new one. `spool_dir`: where unsent
    records wait (default ./results/mlflow_spool). `retry_interval_s`: after a failed write, how long to spool without
    trying. `mark_running`: set a resumed run back to RUNNING (False: an eval or replay). `start_timeout_s` /
    `finish_timeout_s`: how long a new run waits for the store / `finish` retries. `record_run`: write
    `spool_dir/run.json` (durably) so later Trackers there resume it.
    """

    def __init__(
        self,
        uri: str | None,
        experiment: str,
        run_name: str | None = None,
        *,
        run_id: str | None = None,
        tags: dict[str, Any] | None = None,
        spool_dir: str | Path | None = None,
        retry_interval_s: float = 30.0,
        mark_running: bool = True,
        start_timeout_s: float = 0.0,
        finish_timeout_s: float = 0.0,
        record_run: bool = False,
    ) -> None:
        self.uri = resolve_uri(uri)
        self.experiment = experiment
        self.retry_interval_s = retry_interval_s
        self.finish_timeout_s = finish_timeout_s
        self._next_try = 0.0  # before this (time.monotonic), records go to the journal without trying the store
        # one writer at a time: the training loop logs while a watcher thread may mark the run failed and finish it
        self._lock = threading.RLock()
        self.spool_dir = Path(spool_dir) if spool_dir is not None else Path("results") / "mlflow_spool"
        self.spool_dir.mkdir(parents=True, exist_ok=True)
        resumed = run_id
        if run_id is None and (recorded := read_run_file(self.spool_dir)) is not None:
            resumed = recorded["run_id"]
            log.info("resuming MLflow run %s recorded in %s", resumed, self.spool_dir / RUN_FILE)
        self.sink = MlflowSink(self.uri, experiment, run_name, resumed, start_timeout_s)
        self.run_id: str = self.sink.run_id
        self.client, self.experiment_id, self.refused = self.sink.client, self.sink.experiment_id, self.sink.refused
        if not self.sink.reachable:
            self._next_try = time.monotonic() + retry_interval_s
        meta = {"run_id": self.run_id, "uri": self.uri, "experiment": experiment}
        if record_run:
            atomic_write(self.spool_dir / RUN_FILE, json.dumps({**meta, "run_name": run_name}))
        self.spool = SpoolJournal(self.spool_dir, meta)
        self.spool_path = self.spool.path
        if resumed is not None and mark_running:
            self._submit([{"kind": "status", "status": "RUNNING"}])
        if tags:
            self.set_tags(tags)

    @property
    def dropped_points(self) -> int:  # points at or below a step the run already held, not written again
        return self.sink.dropped_points

    def log_params(self, params: dict[str, Any]) -> None:
        """Every param, truncated to MLflow's limit; a changed value (resumed run) is refused: a warning, no crash."""
        self._submit([kv_record("param", k, v) for k, v in params.items()])

    def set_tags(self, tags: dict[str, Any]) -> None:
        self._submit([kv_record("tag", k, v) for k, v in tags.items()])

    def log_metrics(self, metrics: dict[str, float], step: int) -> None:
        """Each metric at `step`, stamped now (ms); non-numeric values skipped (warned), points at or below a step
        the run holds for that metric dropped."""
        now = int(time.time() * 1000)
        recs = []
        for k, v in metrics.items():
            try:
                value = float(v)
            except (TypeError, ValueError):
                log.warning("metric %s=%r is not a number; skipped", k, v)
                continue
            recs.append({"kind": "metric", "key": k, "value": value, "step": int(step), "timestamp": now})
        self._submit(recs)

    def log_artifact(self, path: str | Path, artifact_path: str | None = None) -> None:
        """Upload a file or folder; spooled like a metric point when the store is away."""
        self._submit([{"kind": "artifact", "path": str(Path(path).resolve()), "artifact_path": artifact_path}])

    def flush(self) -> bool:
        """Replay the spool now (ignoring the retry interval). True when nothing is left waiting."""
        self._next_try = 0.0
        self._submit([])
        return not self.spool.waiting()

    def finish(self, status: str | None = "FINISHED") -> bool:
        """Deliver everything (retrying `finish_timeout_s`), the status (None: unchanged) last, behind the points.
        True when delivered; otherwise the spool stays with a note beside it (`replay_pending`)."""
        with self._lock:  # a watcher thread may finish the run while the loop logs
            if self.refused:
                self._submit([{"kind": "tag", "key": M.TAG_REFUSED_RECORDS, "value": str(len(self.refused))}])
                n, names = len(self.refused), "; ".join(self.refused[:20]) + (" ..." if len(self.refused) > 20 else "")
                log.warning(
                    "MLflow refused %d record(s) of run %s (tag %s): %s", n, self.run_id, M.TAG_REFUSED_RECORDS, names
                )
            if status is not None:
                self._submit([{"kind": "status", "status": status}])
            deadline = time.monotonic() + self.finish_timeout_s
            while not self.flush():
                left = deadline - time.monotonic()
                if left <= 0:
                    self.spool.mark_undelivered()
                    return False
                time.sleep(min(5.0, left))
            self.spool.note.unlink(missing_ok=True)
            return True

    def _submit(self, recs: list[dict[str, Any]]) -> None:
        """Spool while the store failed recently; else replay the journal first (nothing overtakes it), send, and
        spool what did not land."""
        with self._lock:
            if time.monotonic() >= self._next_try and (not self.spool.waiting() or self._replay()):
                recs = recs[self._send(recs) :]
            self.spool.append(recs)

    def _replay(self) -> bool:
        """Send the journal in order, then rewrite it with whatever could not be sent (the only rewrite: a kill
        between the two leaves records that were sent, and resending them stores nothing twice). True when empty."""
        recs = self.spool.read()
        sent = self._send(recs)
        self.spool.rewrite(recs[sent:])
        if sent:
            log.info("replayed %d spooled MLflow records of run %s", sent, self.run_id)
        return sent == len(recs)

    def _send(self, recs: list[dict[str, Any]]) -> int:
        sent = self.sink.send(recs)
        if sent < len(recs):  # the store did not answer: leave it alone for retry_interval_s
            self._next_try = time.monotonic() + self.retry_interval_s
        return sent


def _is_rejection(e: Exception) -> bool:
    """The store answered and refused (bad value, changed param), as opposed to being unreachable."""
    from mlflow.exceptions import MlflowException

    rejections = ("INVALID_PARAMETER_VALUE", "RESOURCE_ALREADY_EXISTS", "BAD_REQUEST", "INVALID_STATE")
    return isinstance(e, MlflowException) and getattr(e, "error_code", "") in rejections


def _first_line(e: BaseException) -> str:
    text = str(e).strip()
    return text.splitlines()[0][:300] if text else ""


# ------------------------------------------------------------------------------------------------ replay
@dataclass(frozen=True)
class SpoolState:
    """One spool file found on disk and what a replay did with it."""

    path: Path
    run_id: str
    uri: str
    waiting: int  # records still waiting after the replay
    delivered: int  # records delivered (or dropped as already held) by this replay


def find_spools(root: str | Path) -> list[Path]:
    """Non-empty spool files under `root` (a run directory, a results folder, or a spool folder itself)."""
    root = Path(root)
    if not root.exists():
        return []
    return sorted(p for p in root.rglob("*.jsonl") if p.with_suffix(".meta.json").is_file() and p.stat().st_size > 0)


def replay_pending(root: str | Path, *, retry_interval_s: float = 30.0) -> list[SpoolState]:
    """Deliver every spool under `root` into its own run and store; one whose store does not answer stays (reported)."""
    out = []
    for path in find_spools(root):
        meta = json.loads(path.with_suffix(".meta.json").read_text())
        before = sum(1 for ln in path.read_text().splitlines() if ln.strip())
        try:
            t = Tracker(
                meta["uri"],
                meta.get("experiment") or "",
                run_id=meta["run_id"],
                spool_dir=path.parent,
                mark_running=False,
                retry_interval_s=retry_interval_s,
            )
            ok = t.flush()
            waiting = 0 if ok else len(t.spool.read())
        except Exception as e:  # a run that no longer exists, a store that refuses: say so, keep the spool
            log.warning("could not replay %s: %s", path, _first_line(e))
            ok, waiting = False, before
        if ok:
            path.with_suffix(UNDELIVERED).unlink(missing_ok=True)
        out.append(SpoolState(path, meta["run_id"], meta["uri"], waiting, before - waiting))
    return out
