"""A test hook that kills the process at a named point, to prove that no moment of a run loses or doubles data.

    DAPO_TEST_KILL_AT=checkpoint.published:2 dapo train ...   # SIGKILL the 2nd time a checkpoint is published

Points are passed with `kill_point(name)` at the boundaries where a crash could leave MLflow and the run
directory disagreeing (see `POINTS`). Unset, a point costs one dictionary lookup.
"""

from __future__ import annotations

import os
import signal

ENV = "DAPO_TEST_KILL_AT"
POINTS = (
    "tracking.before_log",  # a step's metrics are about to be written (or spooled)
    "tracking.after_log",  # they were written (or spooled)
    "tracking.replayed",  # spooled records were sent, the spool file not yet rewritten
    "checkpoint.written",  # a checkpoint's files are complete in its temporary folder, not yet renamed
    "checkpoint.published",  # renamed into place, older checkpoints not yet pruned
    "checkpoint.pruned",  # older checkpoints deleted
)
_passed: dict[str, int] = {}


def kill_point(name: str) -> None:
    """SIGKILL this process if `DAPO_TEST_KILL_AT` names this point and this is its n-th pass."""
    spec = os.environ.get(ENV)
    if not spec:
        return
    point, _, nth = spec.partition(":")
    if point != name:
        return
    _passed[name] = _passed.get(name, 0) + 1
    if _passed[name] == int(nth or 1):
        os.kill(os.getpid(), signal.SIGKILL)
