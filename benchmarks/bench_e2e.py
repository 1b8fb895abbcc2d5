"""End to end: wall-clock of the tiny `all_ablations` workflow, and of each of its jobs, from nothing (tiny world
build included) into a fresh results folder.

    .venv/bin/python benchmarks/bench_e2e.py [--cores all] [--results /tmp/bench_results] [--dry-run]

Runs `snakemake --cores all all_ablations --config results=<fresh dir>` and reads each job's start and finish
from Snakemake's own log (`[timestamp]` lines before `rule X:` and `Finished jobid: N`), so the per-rule
durations come from the scheduler that ran them (1 s resolution). Target: 15 minutes on this 2-core machine.
"""

from __future__ import annotations

import argparse
import datetime as dt
import json
import os
import re
import signal
import subprocess
import sys
import time
from collections import defaultdict
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))

_TS = re.compile(r"^\[(\w{3} \w{3} +\d+ \d\d:\d\d:\d\d \d{4})\]$")
_RULE = re.compile(r"^(?:local)?rule (\w+):$")
_JOBID = re.compile(r"^\s+jobid: (\d+)$")
_WILD = re.compile(r"^\s+wildcards: (.+)$")
_DONE = re.compile(r"^Finished job(?:id:)? (\d+)")


def parse_snakemake_log(text: str) -> list[dict]:
    """Jobs with rule, wildcards, start and end datetimes, from a Snakemake log (stderr of `snakemake`)."""
    jobs: dict[str, dict] = {}
    ts, cur = None, None
    for line in text.splitlines():
        if m := _TS.match(line.strip()):
            ts = dt.datetime.strptime(" ".join(m.group(1).split()), "%a %b %d %H:%M:%S %Y")
        elif m := _RULE.match(line.strip()):
            cur = {"rule": m.group(1), "start": ts, "wildcards": ""}
        elif cur is not None and (m := _JOBID.match(line)):
            jobs[m.group(1)] = cur
        elif cur is not None and (m := _WILD.match(line)):
            cur["wildcards"] = m.group(1)
        elif (m := _DONE.match(line.strip())) and m.group(1) in jobs:
            jobs[m.group(1)]["end"] = ts
    return [j for j in jobs.values() if "end" in j]


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--cores", default="all")
    ap.add_argument("--results", default="/tmp/bench_results")
    ap.add_argument("--dry-run", action="store_true", help="plan only (snakemake -n), nothing recorded")
    ap.add_argument(
        "--extra",
        nargs="*",
        default=[],
        help="more `--config` key=value pairs, e.g. tiny_world=DIR to reuse a built tiny world",
    )
    ap.add_argument("--timeout", type=float, default=None, help="stop after this many seconds; record the jobs done")
    args = ap.parse_args()
    from _common import ROOT, machine, md_table, print_table, record

    info = machine()
    results = Path(args.results) / time.strftime("%Y%m%d-%H%M%S")
    snakemake = str(Path(sys.executable).with_name("snakemake"))
    cmd = [snakemake, "--cores", args.cores, "all_ablations", "--config", f"results={results}", *args.extra]
    if args.dry_run:
        cmd.append("-n")
    t0 = time.perf_counter()
    # its own session, so a timeout can stop snakemake and the jobs it started (and nothing else)
    p = subprocess.Popen(
        cmd, cwd=ROOT, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True, start_new_session=True
    )
    try:
        log, _ = p.communicate(timeout=args.timeout)
    except subprocess.TimeoutExpired:
        os.killpg(p.pid, signal.SIGTERM)
        log, _ = p.communicate()
        p.returncode = "timeout"
    wall = time.perf_counter() - t0
    results.mkdir(parents=True, exist_ok=True)
    (results / "snakemake.out").write_text(log)
    if args.dry_run:
        print(log[-3000:])
        return
    jobs = parse_snakemake_log(log)
    per_rule: dict[str, list[float]] = defaultdict(list)
    rows = []
    for j in sorted(jobs, key=lambda j: j["start"]):
        d = (j["end"] - j["start"]).total_seconds()
        per_rule[j["rule"]].append(d)
        rows.append([j["rule"], j["wildcards"], j["start"].strftime("%H:%M:%S"), f"{d:.0f}"])
    summary = [[r, len(ds), f"{sum(ds):.0f}", f"{max(ds):.0f}"] for r, ds in per_rule.items()]
    summary.append(["all_ablations (wall-clock)", len(jobs), f"{wall:.0f}", f"{wall / 60:.1f} min"])
    for kv in args.extra:  # a reused tiny world: show what its build cost when it was made
        if kv.startswith("tiny_world="):
            m = json.loads((Path(kv.split("=", 1)[1]) / "manifest.json").read_text())
            summary.append(
                [
                    "tiny_world (reused; its manifest)",
                    1,
                    f"{m.get('build_seconds', 0):.0f}",
                    f"{m.get('build_cpu_seconds', 0):.0f} CPU s",
                ]
            )
    header, sheader = ["rule", "wildcards", "start", "seconds"], ["rule", "jobs", "sum s", "max s"]
    print_table("Jobs", header, rows)
    print_table(f"all_ablations: {'ok' if p.returncode == 0 else f'FAILED rc={p.returncode}'}", sheader, summary)
    status = (
        "finished"
        if p.returncode == 0
        else f"stopped after --timeout {args.timeout:.0f} s"
        if p.returncode == "timeout"
        else f"FAILED (snakemake exit {p.returncode}; log {results}/snakemake.out)"
    )
    body = (
        f"Status: {status}. Wall-clock {wall:.0f} s ({wall / 60:.1f} min); target 15 min.\n\n"
        f"{md_table(sheader, summary)}\n\n<details><summary>every job</summary>\n\n{md_table(header, rows)}\n\n"
        f"</details>"
    )
    record("e2e", ".venv/bin/python benchmarks/bench_e2e.py " + " ".join(sys.argv[1:]), info, body)


if __name__ == "__main__":
    main()
