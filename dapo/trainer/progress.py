"""Progress display: a rich progress bar on a terminal, one plain log line per step otherwise (SLURM logs)."""

from __future__ import annotations

import logging
import sys
from typing import Any

from dapo import metric_names as M

log = logging.getLogger("dapo.train")

# (metric, short label, format) shown for each step
_FIELDS = [
    (M.REWARD_MEAN, "reward", "{:+.3f}"),
    (M.ACC_MEAN, "acc", "{:.3f}"),
    (M.ENTROPY, "entropy", "{:.3f}"),
    (M.RESP_LEN_MEAN, "len", "{:.1f}"),
    (M.TOKENS_PER_SEC, "tok/s", "{:.0f}"),
    (M.TIME_STEP, "s/step", "{:.2f}"),
]


def summary(metrics: dict[str, float]) -> str:
    parts = []
    for key, label, fmt in _FIELDS:
        if key in metrics:
            parts.append(f"{label} {fmt.format(metrics[key])}")
    return "  ".join(parts)


class Progress:
    """`update(step, metrics)` after each rollout step; `note(text)` for evals and checkpoints."""

    def __init__(self, total: int, start: int = 0, *, rich: bool | None = None) -> None:
        self.total = total
        use_rich = sys.stderr.isatty() if rich is None else rich
        self._bar: Any = None
        if use_rich:
            from rich.progress import BarColumn, MofNCompleteColumn, TextColumn, TimeRemainingColumn
            from rich.progress import Progress as RichProgress

            self._bar = RichProgress(
                TextColumn("[bold]train"),
                BarColumn(),
                MofNCompleteColumn(),
                TimeRemainingColumn(),
                TextColumn("{task.fields[info]}"),
                transient=False,
            )
            self._bar.start()
            self._task = self._bar.add_task("train", total=total, completed=start, info="")

    def update(self, step: int, metrics: dict[str, float]) -> None:
        text = summary(metrics)
        if self._bar is not None:
            self._bar.update(self._task, completed=step, info=text)
        else:
            log.info("step %d/%d  %s", step, self.total, text)

    def note(self, text: str) -> None:
        if self._bar is not None:
            self._bar.console.log(text)
        else:
            log.info("%s", text)

    def close(self) -> None:
        if self._bar is not None:
            self._bar.stop()
            self._bar = None
