"""SIGTERM / SIGUSR1 -> "stop at the next safe point, checkpoint, exit with RESUME_EXIT_CODE".

SLURM sends SIGTERM at the time limit and on preemption (and SIGUSR1 ahead of it with `--signal=USR1@120`); a
grace period later it sends SIGKILL. The handler only sets a flag: the loop polls it between generation batches
and at the end of each rollout step, where the state is consistent, and never inside a gradient update.
"""

from __future__ import annotations

import logging
import signal
from types import FrameType
from typing import Any

log = logging.getLogger(__name__)

STOP_SIGNALS = (signal.SIGTERM, signal.SIGUSR1)


class StopFlag:
    """Set by a stop signal; a context manager that installs and restores the handlers."""

    def __init__(self, signals: tuple[signal.Signals, ...] = STOP_SIGNALS) -> None:
        self.signals = signals
        self.signum: int | None = None
        self._previous: dict[int, Any] = {}

    @property
    def requested(self) -> bool:
        return self.signum is not None

    def request(self, signum: int = signal.SIGTERM) -> None:
        """Ask for a stop (what the handler does; also a test hook)."""
        if self.signum is None:
            self.signum = signum

    def _handle(self, signum: int, frame: FrameType | None) -> None:
        first = self.signum is None
        self.request(signum)
        if first:
            log.warning(
                "received %s: stopping at the next safe point, checkpointing, then exiting for resume",
                signal.Signals(signum).name,
            )

    def __enter__(self) -> StopFlag:
        for s in self.signals:
            self._previous[s] = signal.signal(s, self._handle)
        return self

    def __exit__(self, *exc: object) -> None:
        for s, h in self._previous.items():
            signal.signal(s, h)
        self._previous.clear()
