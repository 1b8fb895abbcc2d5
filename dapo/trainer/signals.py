"""SIGTERM / SIGUSR1 -> "stop at the next safe point, checkpoint, exit with RESUME_EXIT_CODE", from the first
line of `dapo train` to its last.

SLURM sends SIGTERM at the time limit and on preemption (and SIGUSR1 ahead of it with `--signal=USR1@600`, which
reaches the job steps' tasks, i.e. every rank); KillWait seconds later it sends SIGKILL. Three phases:

- start-up (`StartupGuard`, installed first thing): data, engine and model are loading and there is nothing to
  save, so a stop signal ends the process at once with RESUME_EXIT_CODE (resuming is restarting);
- training (`StopFlag`, installed by the loop): the handler only sets a flag, which the loop polls between
  phases, where the state is consistent, and never inside a gradient update;
- after the loop (`StartupGuard.disarm`): the run is done or its checkpoint written; a late signal is noted
  and the process exits with the loop's code.

`Deadline` stops a run before the job's time limit without waiting for a signal: a 32B step can outlast any
signal lead, so the loop asks `should_stop(last step's seconds)` after each step and stops when the next one
would end inside the margin.
"""

from __future__ import annotations

import datetime as _dt
import logging
import os
import signal
import subprocess
import time
from collections.abc import Callable
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

    def anywhere(self) -> bool:
        """Collective: True on every rank when any rank got a stop signal (every rank must ask at the same point)."""
        from dapo import distributed as dist

        return dist.any_rank(self.requested)

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


class StartupStop(SystemExit):
    """Raised by the start-up handler: a SystemExit, so library code that catches Exception lets it through."""


class StartupGuard:
    """Stop signals before the loop takes over end the process with `code`; after `disarm()` they are ignored
    (logged). The loop's `StopFlag` saves and restores this handler around training."""

    def __init__(self, code: int, signals: tuple[signal.Signals, ...] = STOP_SIGNALS) -> None:
        self.code = code
        self.signals = signals
        self.armed = True
        self.received: int | None = None

    def _handle(self, signum: int, frame: FrameType | None) -> None:
        self.received = signum
        name = signal.Signals(signum).name
        if self.armed:
            log.warning("received %s during start-up: nothing to checkpoint yet, exiting %d (resume)", name, self.code)
            raise StartupStop(self.code)
        log.warning("received %s after the run ended its work; exiting normally", name)

    def install(self) -> StartupGuard:
        for s in self.signals:
            signal.signal(s, self._handle)
        return self

    def disarm(self) -> None:
        self.armed = False


def job_end_time(
    env: dict[str, str] | os._Environ | None = None, run: Callable[..., Any] = subprocess.run
) -> float | None:
    """The SLURM job's end time (epoch seconds), or None outside a job or without a limit.

    SLURM_JOB_END_TIME where SLURM sets it (newer versions; also a test hook), else `squeue -h -j <id> -o %e`
    (the end time in the local time zone, as squeue prints it)."""
    env = os.environ if env is None else env
    if env.get("SLURM_JOB_END_TIME"):
        return float(env["SLURM_JOB_END_TIME"])
    job = env.get("SLURM_JOB_ID")
    if not job:
        return None
    try:
        out = run(["squeue", "-h", "-j", job, "-o", "%e"], capture_output=True, text=True, timeout=30).stdout.strip()
        return _dt.datetime.fromisoformat(out).timestamp()
    except (OSError, ValueError, subprocess.SubprocessError):
        return None  # "UNLIMITED", "N/A", no squeue: no deadline to keep


class Deadline:
    """ "Should I stop now?" before a job's time limit: stop once the next step would end within `margin_s` of
    `end_time`. The next step is assumed as long as the longest one seen (steps with an evaluation are longer)."""

    def __init__(self, end_time: float | None, margin_s: float, clock: Callable[[], float] = time.time) -> None:
        self.end_time = end_time
        self.margin_s = margin_s
        self.clock = clock
        self.longest_step_s = 0.0
        if end_time is not None:
            log.info(
                "the job ends at %s (in %.0f s): stopping for resume when a step would end within "
                "trainer.stop_margin_s=%.0f s of it",
                time.strftime("%Y-%m-%d %H:%M:%S", time.localtime(end_time)),
                end_time - clock(),
                margin_s,
            )

    def should_stop(self, last_step_s: float) -> bool:
        if self.end_time is None:
            return False
        self.longest_step_s = max(self.longest_step_s, last_step_s)
        left = self.end_time - self.clock()
        if left >= self.longest_step_s + self.margin_s:
            return False
        log.warning(
            "%.0f s left before the job's time limit: the next step (~%.0f s) and the stop margin "
            "(trainer.stop_margin_s=%.0f) do not fit; stopping for resume",
            left,
            self.longest_step_s,
            self.margin_s,
        )
        return True
