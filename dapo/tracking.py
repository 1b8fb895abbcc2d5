"""MLflow tracking that training can rely on: a run is created (or resumed by id) once, and every metric point
logged afterwards reaches the store exactly once, even when the tracking server goes away for a while.

How it stays resilient:

- MLflow's HTTP client retries for minutes by default; we lower its retry count and timeout (environment
  variables it reads per request) so an unreachable server costs seconds, not minutes.
- A point that cannot be written is appended to a spool file (JSONL, one record per point, in `spool_dir`) and
  training goes on. The next successful write first replays the spool in order, then writes the new points.
- Replays are idempotent: a point keeps the timestamp it was logged with, and MLflow's SQL store keys metric
  rows by (key, timestamp, step, value), so a point sent twice (the server wrote it but the answer was lost)
  is stored once. We also never resend a point the spool already marked as sent.
- After a failure we do not try the server again for `retry_interval_s`, so a dead server is not polled on
  every `log_metrics` call.

Starting a run needs the server: if it is unreachable then, `Tracker(...)` raises (before any compute is
spent), naming the URI.
"""

from __future__ import annotations

import contextlib
import json
import logging
import os
import time
from pathlib import Path
from typing import Any

log = logging.getLogger(__name__)

# MLflow's own limits (mlflow.utils.validation): longer values are rejected, so we truncate.
MAX_PARAM_VAL_LENGTH = 6000
MAX_TAG_VAL_LENGTH = 8000
MAX_KEY_LENGTH = 250
MAX_METRICS_PER_BATCH = 1000
MAX_PARAMS_TAGS_PER_BATCH = 100

# Fail fast when the server is away (MLflow's defaults retry with backoff for minutes).
_HTTP_ENV = {
    "MLFLOW_HTTP_REQUEST_MAX_RETRIES": "1",
    "MLFLOW_HTTP_REQUEST_BACKOFF_FACTOR": "1",
    "MLFLOW_HTTP_REQUEST_BACKOFF_JITTER": "0.1",
    "MLFLOW_HTTP_REQUEST_TIMEOUT": "10",
}


def resolve_uri(uri: str | None, results_dir: str | Path = "results") -> str:
    """The tracking URI: `uri` if given, else $MLFLOW_TRACKING_URI, else `sqlite:///<results_dir>/mlflow.db`
    (absolute path; artifacts go beside it in `<results_dir>/mlartifacts`)."""
    if uri:
        return uri
    env = os.environ.get("MLFLOW_TRACKING_URI")
    if env:
        return env
    db = Path(results_dir).resolve() / "mlflow.db"
    return f"sqlite:///{db}"


def _local_artifact_root(uri: str) -> str | None:
    """For an embedded store (sqlite file), the artifact folder beside the database; None for a server, whose
    own artifact root applies."""
    if uri.startswith("sqlite:///"):
        return (Path(uri.removeprefix("sqlite:///")).parent / "mlartifacts").as_uri()
    return None


def _truncate(value: Any, limit: int) -> str:
    s = str(value)
    return s if len(s) <= limit else s[: limit - 3] + "..."


class Tracker:
    """One MLflow run.

    Args:
        uri: tracking URI (see `resolve_uri`); None resolves to the embedded default under ./results.
        experiment: experiment name, created when missing.
        run_name: display name of a new run (ignored when resuming).
        run_id: resume this run (e.g. after preemption, or to log an eval into a training run).
        tags: tags set on the run at start.
        spool_dir: where failed points wait for the server (default: ./results/mlflow_spool).
        retry_interval_s: after a failed write, how long to spool without trying the server.
        mark_running: when resuming, set the run's status back to RUNNING (a resumed training run); False
            leaves it as it is (an eval logged into a finished run).
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
    ) -> None:
        for k, v in _HTTP_ENV.items():
            os.environ.setdefault(k, v)
        from mlflow.tracking import MlflowClient

        self.uri = resolve_uri(uri)
        lock: Any = contextlib.nullcontext()
        if self.uri.startswith("sqlite:///"):
            db = Path(self.uri.removeprefix("sqlite:///"))
            db.parent.mkdir(parents=True, exist_ok=True)
            # Two runs starting at once on a fresh SQLite store both try to create its tables and one fails
            # ("table ... already exists"): serialise store creation and run start across processes.
            from filelock import FileLock

            lock = FileLock(str(db) + ".lock", timeout=300)
        self.retry_interval_s = retry_interval_s
        self._next_try = 0.0
        with lock:
            self.client = MlflowClient(tracking_uri=self.uri)
            run = self._start(experiment, run_name, run_id, mark_running)
        self.run_id: str = run.info.run_id
        self.experiment_id: str = run.info.experiment_id
        spool_root = Path(spool_dir) if spool_dir is not None else Path("results") / "mlflow_spool"
        spool_root.mkdir(parents=True, exist_ok=True)
        self.spool_path = spool_root / f"{self.run_id}.jsonl"
        if tags:
            self.set_tags(tags)

    def _start(self, experiment: str, run_name: str, run_id: str | None, mark_running: bool) -> Any:
        try:
            if run_id is None:
                exp = self.client.get_experiment_by_name(experiment)
                exp_id = exp.experiment_id if exp is not None else self._create_experiment(experiment)
                run = self.client.create_run(exp_id, run_name=run_name)
            else:
                run = self.client.get_run(run_id)
                if mark_running and run.info.status != "RUNNING":
                    self.client.update_run(run_id, status="RUNNING")
        except Exception as e:
            raise RuntimeError(f"MLflow at {self.uri} could not start the run: {e}") from e
        return run

    def _create_experiment(self, name: str) -> str:
        try:
            return self.client.create_experiment(name, artifact_location=_local_artifact_root(self.uri))
        except Exception:
            # another run created it meanwhile (parallel jobs of one ablation)
            exp = self.client.get_experiment_by_name(name)
            if exp is None:
                raise
            return exp.experiment_id

    # ------------------------------------------------------------------------------------------ logging
    def log_params(self, params: dict[str, Any]) -> None:
        """Every param, value truncated to MLflow's limit. Re-logging a param with a different value (a resumed
        run whose config changed) is refused by MLflow; we log a warning instead of failing training."""
        recs = [
            {"kind": "param", "key": _truncate(k, MAX_KEY_LENGTH), "value": _truncate(v, MAX_PARAM_VAL_LENGTH)}
            for k, v in params.items()
        ]
        self._submit(recs)

    def set_tags(self, tags: dict[str, Any]) -> None:
        recs = [
            {"kind": "tag", "key": _truncate(k, MAX_KEY_LENGTH), "value": _truncate(v, MAX_TAG_VAL_LENGTH)}
            for k, v in tags.items()
        ]
        self._submit(recs)

    def log_metrics(self, metrics: dict[str, float], step: int) -> None:
        """Log each metric at `step`, stamped now (ms). Non-numeric values are skipped with a warning."""
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
        return not self._spooled()

    def finish(self, status: str | None = "FINISHED") -> None:
        """Flush, then mark the run FINISHED / FAILED / KILLED (None: leave its status). Points still spooled
        stay in the spool file (replayed by the next Tracker on this run id) and the run is left as it is."""
        if not self.flush():
            log.warning("MLflow unreachable at finish; %s keeps the unsent points", self.spool_path)
            return
        if status is None:
            return
        try:
            self.client.set_terminated(self.run_id, status=status)
        except Exception as e:
            log.warning("could not mark run %s %s: %s", self.run_id, status, e)

    # ---------------------------------------------------------------------------------------- internals
    def _spooled(self) -> bool:
        return self.spool_path.is_file() and self.spool_path.stat().st_size > 0

    def _submit(self, recs: list[dict[str, Any]]) -> None:
        if time.monotonic() < self._next_try:  # the store failed recently: do not wait on it again yet
            self._append(recs)
            return
        if self._spooled() and not self._replay():
            self._append(recs)  # keep order: nothing overtakes points that are still waiting
            return
        sent = self._send(recs)
        if sent < len(recs):
            self._append(recs[sent:])

    def _append(self, recs: list[dict[str, Any]]) -> None:
        if not recs:
            return
        with self.spool_path.open("a") as f:
            for r in recs:
                f.write(json.dumps(r) + "\n")

    def _replay(self) -> bool:
        """Send the spool in order; keep whatever could not be sent. True when the spool is empty."""
        lines = [ln for ln in self.spool_path.read_text().splitlines() if ln.strip()]
        recs = [json.loads(ln) for ln in lines]
        sent = self._send(recs)
        rest = recs[sent:]
        tmp = self.spool_path.with_suffix(".tmp")
        tmp.write_text("".join(json.dumps(r) + "\n" for r in rest))
        tmp.replace(self.spool_path)  # atomic: a crash mid-replay leaves the old or the new spool, never half
        if sent:
            log.info("replayed %d spooled MLflow records", sent)
        return not rest

    def _send(self, recs: list[dict[str, Any]]) -> int:
        """Write records in order, in batches of consecutive same-kind records. Returns how many were
        written (a prefix of `recs`); on a connection failure, starts the retry interval."""
        i = 0
        while i < len(recs):
            j = i
            kind = recs[i]["kind"]
            limit = MAX_METRICS_PER_BATCH if kind == "metric" else MAX_PARAMS_TAGS_PER_BATCH
            while j < len(recs) and recs[j]["kind"] == kind and j - i < limit:
                j += 1
                if kind == "artifact":
                    break
            try:
                self._write(kind, recs[i:j])
            except Exception as e:
                if _is_rejection(e):
                    # the store answered and refused (e.g. a changed param on resume): retrying cannot help
                    log.warning("MLflow refused %d %s record(s): %s", j - i, kind, e)
                else:
                    log.warning("MLflow unreachable (%s); spooling to %s", type(e).__name__, self.spool_path)
                    self._next_try = time.monotonic() + self.retry_interval_s
                    return i
            i = j
        return i

    def _write(self, kind: str, recs: list[dict[str, Any]]) -> None:
        from mlflow.entities import Metric, Param, RunTag

        if kind == "metric":
            self.client.log_batch(
                self.run_id, metrics=[Metric(r["key"], r["value"], r["timestamp"], r["step"]) for r in recs]
            )
        elif kind == "param":
            self.client.log_batch(self.run_id, params=[Param(r["key"], r["value"]) for r in recs])
        elif kind == "tag":
            self.client.log_batch(self.run_id, tags=[RunTag(r["key"], r["value"]) for r in recs])
        elif kind == "artifact":
            for r in recs:
                p = Path(r["path"])
                if not p.exists():
                    log.warning("artifact %s vanished before upload; skipped", p)
                elif p.is_dir():
                    self.client.log_artifacts(self.run_id, str(p), r["artifact_path"])
                else:
                    self.client.log_artifact(self.run_id, str(p), r["artifact_path"])
        else:
            raise ValueError(f"unknown spool record kind {kind!r}")


def _is_rejection(e: Exception) -> bool:
    """True for an answer from the store that refuses the request (bad value, changed param), as opposed to
    the store being unreachable."""
    from mlflow.exceptions import MlflowException

    if not isinstance(e, MlflowException):
        return False
    code = getattr(e, "error_code", "")
    return code in ("INVALID_PARAMETER_VALUE", "RESOURCE_ALREADY_EXISTS", "BAD_REQUEST", "INVALID_STATE")
