"""Equivalence of an extracted answer and the ground truth by math-verify, under one time bound (in the scoring
workers, and in the caller's main thread for small batches). A check past the deadline counts as wrong; C code that
never returns to the interpreter is the pool's to kill (docs/architecture.md, "rewards/")."""

from __future__ import annotations

import re
import signal
import threading
import time
from decimal import Decimal
from functools import lru_cache
from types import FrameType
from typing import Any

_REPEAT_S = 0.1  # the alarm fires again at this interval, in case a library swallowed the first exception


class CheckTimeout(BaseException):
    """Raised by the deadline; a BaseException, so sympy's and math-verify's `except Exception` let it by."""


class Deadline:
    """`with Deadline(s):` raises CheckTimeout in the main thread once `s` seconds have passed.

    A no-op outside the main thread (signals can only be handled there); callers there need an outside bound.
    Restores the previous SIGALRM handler and re-arms a caller's pending timer with its remaining time (a
    caller's alarm due during the check fires right after it: delayed, never lost).
    """

    def __init__(self, seconds: float) -> None:
        self.seconds = max(float(seconds), 1e-3)
        self.armed = False
        self.active = False
        self._old: Any = None
        self._old_timer: tuple[float, float] = (0.0, 0.0)
        self._t0 = 0.0

    def _fire(self, signum: int, frame: FrameType | None) -> None:
        if self.armed:
            raise CheckTimeout(f"check exceeded {self.seconds:.3g} s")

    def __enter__(self) -> Deadline:
        if threading.current_thread() is threading.main_thread():
            self.active = True
            self._old = signal.signal(signal.SIGALRM, self._fire)
            self.armed = True
            self._t0 = time.monotonic()
            self._old_timer = signal.setitimer(signal.ITIMER_REAL, self.seconds, _REPEAT_S)
        return self

    def __exit__(self, *exc: object) -> bool:
        if not self.active:
            return False
        try:
            self.armed = False  # from here on a firing is a no-op
        finally:
            # Reached even if the alarm fired just before the line above; the next firing is >= 0.1 s away.
            self.armed = False
            signal.setitimer(signal.ITIMER_REAL, 0)
            signal.signal(signal.SIGALRM, self._old)
            delay, interval = self._old_timer
            if delay > 0:
                left = max(delay - (time.monotonic() - self._t0), 1e-3)
                signal.setitimer(signal.ITIMER_REAL, left, interval)
        return False


def _quiet_math_verify() -> None:
    """Silence math-verify's one-off 'timeout is disabled' warning: our deadline is the timeout."""
    import math_verify.grader
    import math_verify.parser

    math_verify.grader.TIMEOUT_WARNING_SHOWN = True
    math_verify.parser.TIMEOUT_WARNING_SHOWN = True


def _as_latex(answer: str) -> str:
    # Measured with math-verify 0.9: unwrapped, `\\frac12` and `2^{10}` do not parse, `3\\sqrt{2}` parses as 3 and
    # `5 or 204` as 204; wrapped as inline LaTeX the last one is the set {5, 204}: a hedge is wrong.
    return "$" + answer.replace("\\$", "").replace("$", "").strip() + "$"


def _parse(answer: str) -> list:
    from math_verify import parse

    return parse(_as_latex(answer), parsing_timeout=None)  # type: ignore[arg-type]


@lru_cache(maxsize=4096)
def _parse_gold(gold: str) -> list:
    # The same gold comes G times per prompt (and every epoch): parse it once per worker process.
    return _parse(gold)


_PLAIN_NUMBER = re.compile(r"-?\d{1,60}(?:\.\d{1,60})?")


def fast_equivalent(extracted: str, gold: str) -> bool | None:
    """Decide the easy cases without math-verify (it spends ~5 ms in its LaTeX parser on `$204$`).

    True for identical strings and for plain decimal numbers of equal value (`204.0` vs `204`); False for two
    different integer values (`206.0` vs `204`), where math-verify's exact comparison says the same. None
    otherwise:
    the caller asks math-verify (e.g. `0.3333333` vs `1/3` is decided by its rounding rules, not here).
    """
    a, b = extracted.strip(), gold.strip()
    if a == b:
        return True
    if _PLAIN_NUMBER.fullmatch(a) and _PLAIN_NUMBER.fullmatch(b):
        x, y = Decimal(a), Decimal(b)
        if x == y:  # exact at any length (comparison does not round)
            return True
        # two different integers (206.0 is one). `x % 1` would raise DivisionImpossible past the context's 28
        # digits (a 31-digit answer from a tiny policy crashed a training run); to_integral_value is exact.
        if x == x.to_integral_value() and y == y.to_integral_value():
            return False
    return None


def verify_equivalent(extracted: str, gold: str) -> bool:
    """math-verify equivalence of two short answer strings, with no time bound of its own (see `check`).

    The easy cases short-cut (`fast_equivalent`); an unparsable side compares as a string.
    """
    fast = fast_equivalent(extracted, gold)
    if fast is not None:
        return fast
    from math_verify import verify

    _quiet_math_verify()
    gold_parsed = _parse_gold(gold)
    target = _parse(extracted)
    if not gold_parsed or not target:
        return False
    return bool(verify(gold_parsed, target, timeout_seconds=None))  # type: ignore[arg-type]


# (extracted, gold, expected): checks that exercise the LaTeX parser and sympy (plain numbers never reach them).
_WARM_UP = (
    ("\\frac{1}{2}", "0.5", True),
    ("x = 2", "2", True),
    ("\\boxed{3}", "3", True),
    ("1, 2", "\\{1,2\\}", True),
    ("(1,2]", "(1,2]", True),
    ("2\\sqrt{3}", "\\sqrt{12}", True),
    ("50\\%", "0.5", True),
    ("\\text{B}", "B", True),
    ("x^2+1", "1+x^2", True),
    ("\\frac{1}{3}", "0.5", False),
)
_warm = False


class VerifierBroken(RuntimeError):
    """math-verify failed a check whose answer is known: its results in this process cannot be trusted."""


def warm_up() -> None:
    """Run a few checks with known answers and no deadline, once per process; raise `VerifierBroken` if one
    raises or gives the wrong answer.

    Needed for correctness, not just speed: the first checks initialise module-level state in the LaTeX
    parser (ANTLR) and sympy; an alarm that interrupts that initialisation leaves it broken, and every later
    check of the process fails (measured: after a timed-out first check, `204.0` no longer verified as 204).
    So a warm-up that fails is not skipped: every reward of the process would be wrong.
    """
    global _warm
    if _warm:
        return
    for extracted, gold, expected in _WARM_UP:
        try:
            got = verify_equivalent(extracted, gold)
        except Exception as e:
            raise VerifierBroken(
                f"math-verify raised on its warm-up check {extracted!r} vs {gold!r}: {type(e).__name__}: {e} "
                "(check the installed math-verify[antlr4_13_2] and its antlr4 runtime)"
            ) from e
        if got != expected:
            raise VerifierBroken(
                f"math-verify says {got} for its warm-up check {extracted!r} vs {gold!r} (expected {expected}): "
                "check the installed math-verify[antlr4_13_2] version (this project pins 0.9.0)"
            )
    _warm = True


def check(task: tuple[str, str, float]) -> tuple[str, bool]:
    """Worker entry point: `(extracted, gold, timeout_s) -> (status, correct)`.

    status is "ok", "timeout" (the deadline fired: correct is False) or "error" (math-verify raised on this
    answer: it is not verified). Raises `VerifierBroken` when the process's warm-up fails (no answer could be
    trusted), and CheckTimeout only if it escapes a teardown race, which the pool maps to a timeout.
    """
    extracted, gold, timeout_s = task
    warm_up()
    try:
        with Deadline(timeout_s):
            return "ok", verify_equivalent(extracted, gold)
    except CheckTimeout:
        return "timeout", False
    except Exception:  # e.g. RecursionError on deep LaTeX, MemoryError: the answer is not verified
        return "error", False


def interrupted(outcome: tuple[str, bool]) -> bool:
    """True for a `check` outcome whose computation the deadline interrupted (its worker is retired)."""
    return outcome[0] == "timeout"
