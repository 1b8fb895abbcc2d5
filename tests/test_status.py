"""`dapo status`: every run under a results folder with its state, step, attempts, jobs, MLflow run and the
records still waiting for the tracking server, from the files the trainer and the job script leave behind."""

from __future__ import annotations

import json
from pathlib import Path

from dapo.cli import main
from dapo.trainer import checkpoint as ck


def _run(root: Path, name: str) -> Path:
    d = root / "runs" / name / "s0"
    d.mkdir(parents=True)
    return d


def _attempts(run: Path, *rows: tuple[str, str, int]) -> None:
    (run / "attempts.jsonl").write_text(
        "".join(json.dumps({"job": j, "verdict": v, "code": c}) + "\n" for j, v, c in rows)
    )
    (run / "train.log").write_text("".join(f"== attempt {i + 1}\n" for i in range(len(rows))))


def test_status_lists_each_runs_state_attempts_jobs_and_undelivered_records(tmp_path, capsys):
    done = _run(tmp_path, "00_naive_grpo")
    _attempts(done, ("11", "resume", 75), ("11", "done", 0))
    (done / "DONE.json").write_text(
        json.dumps({"step": 30, "eval": {"eval/avg_at_16": 41.2, "eval/avg_at_16_ci_low": 30}})
    )

    failed = _run(tmp_path, "01_overlong_filtering")
    _attempts(failed, ("12", "failed", 2))
    (failed / "FAILED").write_text("2\n")

    stopped = _run(tmp_path, "02_clip_higher")
    _attempts(stopped, ("13", "resume", 75))
    ck.save_checkpoint(stopped, 3, {"step": 3}, lambda p: p.mkdir())
    spool = stopped / "mlflow_spool"
    spool.mkdir()
    (spool / "run.json").write_text(json.dumps({"run_id": "abc123"}))
    (spool / "abc123.meta.json").write_text(json.dumps({"run_id": "abc123", "uri": "http://x:5000", "experiment": "e"}))
    (spool / "abc123.jsonl").write_text('{"kind": "metric"}\n{"kind": "status", "status": "FINISHED"}\n')
    (spool / "abc123.undelivered").write_text("2 record(s) ...")

    running = _run(tmp_path, "03_soft_overlong_punishment")
    (running / "train.log").write_text("== attempt 1\n")  # started, no verdict yet

    out = tmp_path / "report" / "status.md"
    assert main(["status", str(tmp_path), "--no-sacct", "--out", str(out)]) == 0
    printed = capsys.readouterr()
    rows = {line.split("|")[1].strip(): line for line in printed.out.splitlines() if "runs/" in line}
    assert "| done | 30 | 2 (resume, done) | 11 |" in rows["runs/00_naive_grpo/s0"]
    assert "eval/avg_at_16 41.2" in rows["runs/00_naive_grpo/s0"] and "ci_low" not in rows["runs/00_naive_grpo/s0"]
    assert "| failed (exit 2) |" in rows["runs/01_overlong_filtering/s0"]
    assert "| stopped for resume | 3 | 1 (resume) | 13 | abc123 | 2 (undelivered) |" in rows["runs/02_clip_higher/s0"]
    assert "running" in rows["runs/03_soft_overlong_punishment/s0"]
    assert "1 run(s) hold MLflow records" in printed.err
    page = out.read_text()
    assert page.startswith("# Runs") and "were not delivered" in page and "runs/02_clip_higher/s0" in page
