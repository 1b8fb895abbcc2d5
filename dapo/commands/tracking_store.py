"""`dapo tracking-store`: create the MLflow store and the experiment the runs log into, as the trainer would."""

from __future__ import annotations

import argparse


def add_arguments(p: argparse.ArgumentParser) -> None:
    p.description = (
        "Create the MLflow store and the experiment once, before runs start side by side (two processes creating a "
        "fresh SQLite store's tables at once make one of them fail). The experiment is made as dapo.tracking.Tracker "
        "makes it: for an SQLite store its artifacts go beside the database (mlartifacts/), for a server under the "
        "server's own artifact root. An experiment that exists already is kept. The workflow's tracking_store rule "
        "runs this."
    )
    p.add_argument(
        "--tracking-uri", help="MLflow tracking URI (default: $MLFLOW_TRACKING_URI, else sqlite:///results/mlflow.db)."
    )
    p.add_argument("--experiment", required=True, help="The experiment's name (the workflow's: dapo-<preset>).")


def run(args: argparse.Namespace) -> int:
    import sys

    from mlflow.tracking import MlflowClient

    from dapo.tracking import _local_artifact_root, ensure_experiment, fail_fast_http, refused, resolve_uri, store_lock

    uri = resolve_uri(args.tracking_uri)
    try:
        with fail_fast_http(), store_lock(uri):
            client = MlflowClient(tracking_uri=uri)
            exp_id = ensure_experiment(client, uri, args.experiment)
            location = client.get_experiment(exp_id).artifact_location
    except Exception as e:
        if (no := refused(uri, e, f"create experiment {args.experiment!r}")) is not None:
            raise no from e
        raise
    print(f"MLflow {uri}: experiment {args.experiment!r} (id {exp_id}), artifacts in {location}")
    want = _local_artifact_root(uri)
    if want is not None and location != want:
        print(
            f"warning: experiment {args.experiment!r} keeps its artifacts in {location}, not beside the database "
            f"({want}): it was created by something other than dapo; its runs still log there",
            file=sys.stderr,
        )
    return 0
