"""`dapo tracking-store`: create the MLflow store and the experiment the runs log into, as the trainer would."""

from __future__ import annotations

import argparse
import contextlib
from collections.abc import Iterator


def add_arguments(p: argparse.ArgumentParser) -> None:
    p.description = (
        "Create the MLflow store and the experiment once, before runs start side by side (two processes creating a "
        "fresh SQLite store's tables at once make one of them fail). The experiment is made as dapo.tracking.Tracker "
        "makes it: for an SQLite store its artifacts go beside the database (mlartifacts/), for a server under the "
        "server's own artifact root. An experiment that exists already is kept. The workflow's tracking_store rule "
        "runs this."
    )
    p.add_argument(
        "--tracking-uri",
        default=None,
        help="MLflow tracking URI (default: $MLFLOW_TRACKING_URI, else sqlite:///results/mlflow.db).",
    )
    p.add_argument("--experiment", required=True, help="The experiment's name (the workflow's: dapo-<preset>).")


@contextlib.contextmanager
def _store_lock(uri: str) -> Iterator[None]:
    """The lock the trainer's Tracker takes around an SQLite store's creation (`<db>.lock`), so that this command and
    a run starting at the same moment do not both create its tables."""
    if not uri.startswith("sqlite:///"):
        yield
        return
    from pathlib import Path

    from filelock import FileLock

    db = Path(uri.removeprefix("sqlite:///"))
    db.parent.mkdir(parents=True, exist_ok=True)
    with FileLock(str(db) + ".lock", timeout=300):
        yield


def ensure_experiment(uri: str | None, name: str) -> tuple[str, str]:
    """The experiment `name` in the store at `uri` (created there, with the artifact location the trainer's Tracker
    gives a new one, when missing): (experiment id, artifact location)."""
    import os

    from dapo.tracking import _HTTP_ENV, _local_artifact_root, refused, resolve_uri

    uri = resolve_uri(uri)
    for k, v in _HTTP_ENV.items():
        os.environ.setdefault(k, v)
    from mlflow.tracking import MlflowClient

    try:
        with _store_lock(uri):
            client = MlflowClient(tracking_uri=uri)
            exp = client.get_experiment_by_name(name)
            if exp is None:
                try:
                    client.create_experiment(name, artifact_location=_local_artifact_root(uri))
                except Exception:
                    if client.get_experiment_by_name(name) is None:  # not a run that created it meanwhile
                        raise
                exp = client.get_experiment_by_name(name)
    except Exception as e:
        if (no := refused(uri, e, f"create experiment {name!r}")) is not None:
            raise no from e
        raise
    return exp.experiment_id, exp.artifact_location


def run(args: argparse.Namespace) -> int:
    import sys

    from dapo.tracking import _local_artifact_root, resolve_uri

    uri = resolve_uri(args.tracking_uri)
    exp_id, location = ensure_experiment(uri, args.experiment)
    print(f"MLflow {uri}: experiment {args.experiment!r} (id {exp_id}), artifacts in {location}")
    want = _local_artifact_root(uri)
    if want is not None and location != want:
        print(
            f"warning: experiment {args.experiment!r} keeps its artifacts in {location}, not beside the database "
            f"({want}): it was created by something other than dapo; its runs still log there",
            file=sys.stderr,
        )
    return 0
