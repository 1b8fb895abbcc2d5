"""`dapo build-tiny`: build (or reuse) the tiny world for a config (`tiny.dir`, or --out). Re-running with the same
`tiny:` settings is a no-op (the manifest's hash matches); `--force` rebuilds. A progress bar on a terminal, plain
lines otherwise (logs, Snakemake)."""

from __future__ import annotations

import argparse
import json
import sys
import time

from dapo.commands.config import add_config_arguments


def add_arguments(p: argparse.ArgumentParser) -> None:
    add_config_arguments(p)
    p.add_argument("--out", help="Build here instead of tiny.dir.")
    p.add_argument("--force", action="store_true", help="Rebuild even if a matching build exists.")


class _PlainProgress:
    """One line per phase change and every 10% of supervised steps, for logs."""

    def __init__(self) -> None:
        self.t0 = time.perf_counter()
        self.last: tuple[str, int] = ("", -1)

    def __call__(self, phase: str, done: int, total: int) -> None:
        tenth = (10 * done) // max(1, total)
        if (phase, tenth) == self.last:
            return
        self.last = (phase, tenth)
        print(f"[build-tiny {time.perf_counter() - self.t0:6.1f}s] {phase} {done}/{total}", flush=True)


def run(args: argparse.Namespace) -> int:
    from dapo.config import load_config
    from dapo.tinyworld.build import is_built, read_manifest, tiny_paths

    cfg = load_config(args.config, preset=args.preset, overrides=args.overrides)
    root = args.out or cfg.tiny.dir
    if not args.force and is_built(root, cfg.tiny):
        print(f"tiny world up to date: {root} (hash {read_manifest(root)['hash']}); --force rebuilds")
        return 0
    from dapo.tinyworld.build import ensure_tiny_world

    if sys.stderr.isatty():
        from rich.progress import BarColumn, Progress, TextColumn, TimeElapsedColumn

        columns = (TextColumn("{task.description}"), BarColumn(), TextColumn("{task.completed}/{task.total}"))
        with Progress(*columns, TimeElapsedColumn()) as bar:
            tasks: dict[str, int] = {}

            def progress(phase: str, done: int, total: int) -> None:
                if phase not in tasks:
                    tasks[phase] = bar.add_task(phase, total=total)
                bar.update(tasks[phase], completed=done, total=total)

            path = ensure_tiny_world(cfg, out=root, force=args.force, progress=progress)
    else:
        path = ensure_tiny_world(cfg, out=root, force=args.force, progress=_PlainProgress())
    m = read_manifest(path) or {}
    ev = m.get("eval", {})
    keys = ("build_seconds", "param_count", "vocab_size", "max_prompt_tokens", "weights_sha256")
    summary = {k: m.get(k) for k in keys}
    print(
        f"tiny world built: {tiny_paths(path).model}\n{json.dumps(summary)}\neval {json.dumps(ev)}\n"
        f"train groups {json.dumps(m.get('train_groups', {}))}"
    )
    return 0
