"""`dapo status`: each run's state, its SLURM jobs and attempts, and MLflow records still waiting to be delivered,
read from the run directories (`MARKERS`) and, where `sacct` answers, SLURM's accounting. A requeued job keeps its
id, so one job may hold several attempts."""

from __future__ import annotations

import argparse
import json
import shutil
import subprocess
import sys
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

MARKERS = ("DONE.json", "FAILED", "attempts.jsonl", "checkpoints", "mlflow_spool", "train.log")


def add_arguments(p: argparse.ArgumentParser) -> None:
    p.add_argument("path", nargs="?", default="results", help="A results folder or one run directory.")
    p.add_argument("--replay", action="store_true", help="Deliver MLflow records still spooled under PATH first.")
    p.add_argument("--out", help="Also write the table as Markdown to this file.")
    p.add_argument("--no-sacct", action="store_true", help="Do not ask SLURM's accounting (sacct).")


@dataclass
class RunStatus:
    """What one run directory says about itself."""

    name: str
    state: str
    step: int | None
    attempts: list[dict[str, Any]] = field(default_factory=list)
    jobs: dict[str, str] = field(default_factory=dict)  # SLURM job id -> state (and tasks of its training step)
    mlflow_run: str | None = None
    waiting: int = 0  # MLflow records not yet delivered
    undelivered: bool = False
    final: str = ""


def find_runs(root: Path) -> list[Path]:
    """Run directories under `root` (folders holding any of MARKERS; not looking inside a run)."""
    if any((root / m).exists() for m in MARKERS):
        return [root]
    children = sorted(p for p in root.iterdir() if p.is_dir()) if root.is_dir() else []
    return [run for child in children for run in find_runs(child)]


def _checkpoint_step(run: Path) -> int | None:
    from dapo.trainer.checkpoint import latest_checkpoint

    last = latest_checkpoint(run)
    return None if last is None else int(json.loads((last / "trainer_state.json").read_text())["step"])


def run_status(run: Path, root: Path) -> RunStatus:
    from dapo.tracking import UNDELIVERED, find_spools, read_run_file

    attempts = []
    for line in _lines(run / "attempts.jsonl"):
        try:
            attempts.append(json.loads(line))
        except json.JSONDecodeError:
            continue
    started = sum(1 for ln in _lines(run / "train.log") if ln.startswith("== attempt "))
    done = run / "DONE.json"
    step = _checkpoint_step(run)
    final = ""
    if done.is_file():
        summary = json.loads(done.read_text())
        state, step = "done", summary.get("step", step)
        avg = {k: v for k, v in (summary.get("eval") or {}).items() if "avg_at" in k and "_ci_" not in k}
        final = ", ".join(f"{k} {v:.1f}" for k, v in sorted(avg.items()))
    elif (run / "FAILED").is_file():
        state = f"failed (exit {(run / 'FAILED').read_text().strip()})"
    elif started > len(attempts):
        state = "running (or killed without a word)"
    elif attempts and attempts[-1].get("verdict") == "resume":
        state = "stopped for resume"
    else:
        state = "not started" if step is None else "stopped"
    spools = find_spools(run / "mlflow_spool")
    recorded = read_run_file(run / "mlflow_spool")
    return RunStatus(
        name=str(run.relative_to(root)) if run != root else run.name,
        state=state,
        step=step,
        attempts=attempts,
        jobs={a["job"]: "" for a in attempts if a.get("job")},
        mlflow_run=recorded["run_id"] if recorded else None,
        waiting=sum(len(_lines(p)) for p in spools),
        undelivered=any(p.with_suffix(UNDELIVERED).is_file() for p in spools),
        final=final,
    )


def _lines(path: Path) -> list[str]:
    return [ln for ln in path.read_text(errors="replace").splitlines() if ln.strip()] if path.is_file() else []


def sacct_states(job_ids: list[str]) -> dict[str, str]:
    """job id -> "STATE" of its latest record, plus ", step N tasks" for its training step."""
    if not job_ids or shutil.which("sacct") is None:
        return {}
    cmd = ["sacct", "-n", "-P", "-D", "-j", ",".join(job_ids), "-o", "JobID,JobName,NTasks,State"]
    try:
        out = subprocess.run(cmd, capture_output=True, text=True, timeout=60).stdout
    except (OSError, subprocess.SubprocessError):
        return {}
    states: dict[str, str] = {}
    tasks: dict[str, str] = {}
    for line in out.splitlines():
        parts = line.split("|")
        if len(parts) < 4:
            continue
        jid, name, ntasks, state = parts[:4]
        base, _, step = jid.partition(".")
        if not step:
            states[base] = state.split()[0]  # later records (after a requeue) win
        elif name.startswith("dapo-"):
            tasks[base] = ntasks
    return {j: states.get(j, "?") + (f", training step {tasks[j]} task(s)" if j in tasks else "") for j in job_ids}


def collect(root: Path, use_sacct: bool = True) -> list[RunStatus]:
    runs = [run_status(r, root) for r in find_runs(root)]
    if use_sacct:
        found = sacct_states(sorted({j for r in runs for j in r.jobs}))
        for r in runs:
            r.jobs = {j: found.get(j, "") for j in r.jobs}
    return runs


def markdown(runs: list[RunStatus]) -> str:
    head = "| run | state | step | attempts | SLURM jobs | MLflow run | spooled records | final eval |"
    rows = [head, "|" + "---|" * 8]
    for r in runs:
        jobs = "; ".join(f"{j} {s}".strip() for j, s in r.jobs.items()) or "-"
        verdicts = ", ".join(a.get("verdict", "?") for a in r.attempts) or "-"
        spool = f"{r.waiting}{' (undelivered)' if r.undelivered else ''}" if r.waiting else "0"
        rows.append(
            f"| {r.name} | {r.state} | {'' if r.step is None else r.step} | {len(r.attempts)} ({verdicts}) | {jobs} "
            f"| {r.mlflow_run or '-'} | {spool} | {r.final or '-'} |"
        )
    return "\n".join(rows) + "\n"


def run(args: argparse.Namespace) -> int:
    root = Path(args.path)
    if not root.exists():
        print(f"dapo status: {root} does not exist", file=sys.stderr)
        return 2
    if args.replay:
        from dapo.tracking import replay_pending

        for s in replay_pending(root):
            how = "delivered" if not s.waiting else f"{s.waiting} still waiting ({s.uri} unreachable)"
            print(f"MLflow run {s.run_id}: {s.delivered} spooled record(s) {how}")
    runs = collect(root, use_sacct=not args.no_sacct)
    text = markdown(runs)
    print(text, end="")
    waiting = [r for r in runs if r.waiting]
    if waiting:
        print(
            f"warning: {len(waiting)} run(s) hold MLflow records the store has not received; "
            "`dapo status --replay` delivers them once it answers",
            file=sys.stderr,
        )
    if args.out:
        out = Path(args.out)
        out.parent.mkdir(parents=True, exist_ok=True)
        note = (
            f"\n**{len(waiting)} run(s) have MLflow records that were not delivered**: their metrics in MLflow (and "
            "in this report) are incomplete until `dapo status --replay` delivers them.\n"
        )
        out.write_text(f"# Runs\n\n{text}{note if waiting else ''}")
    return 0
