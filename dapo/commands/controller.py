"""`dapo controller`: the Snakemake controller's start and end checks, which the workflow runs once per invocation
(its `onstart`, `onsuccess` and `onerror`): one controller per results folder, a tracking store the runs can use."""

from __future__ import annotations

import argparse


def add_arguments(p: argparse.ArgumentParser) -> None:
    p.description = (
        "start: take the results folder's controller lock for the Snakemake process PID (a second controller of the "
        "same folder, from any clone or with --nolock, would submit the same rows twice; a lock whose process is gone "
        "is taken over) and check the tracking store the runs will use; exit 1, naming the holder or the store's "
        "problem, with nothing submitted. stop: release the lock if PID holds it. The workflow runs both."
    )
    p.add_argument("action", choices=("start", "stop"))
    p.add_argument("--results", required=True, help="The workflow's results folder (results/<preset>).")
    p.add_argument("--pid", type=int, required=True, help="The controlling Snakemake process.")
    p.add_argument("--tracking-uri", help="start: the MLflow store the runs log into.")
    p.add_argument("--cluster", action="store_true", help="start: jobs run on SLURM nodes (SQLite must be local).")
    p.add_argument("--argv", default="", help="start: the controller's command line (one string), kept in the lock.")


def run(args: argparse.Namespace) -> int:
    import shlex
    import sys
    from pathlib import Path

    from dapo import cluster as C

    results = Path(args.results)
    if args.action == "stop":
        C.release_controller_lock(results, args.pid)
        return 0
    try:
        note = C.acquire_controller_lock(results, shlex.split(args.argv), args.pid)
    except C.ControllerLockError as e:
        print(f"nothing was submitted: {e}", file=sys.stderr)
        return 1
    if note:
        print(f"note: {note}", file=sys.stderr)
    if args.tracking_uri:
        try:
            for warning in C.check_tracking_store(args.tracking_uri, cluster=args.cluster):
                print(f"warning: {warning}", file=sys.stderr)
        except C.TrackingStoreError as e:
            C.release_controller_lock(results, args.pid)
            print(f"nothing was submitted: {e}", file=sys.stderr)
            return 1
    return 0
