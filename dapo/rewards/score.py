"""Score responses against ground-truth answers: +1 if equivalent, else -1 (docs/algorithm.md section 4). Model
output never makes scoring raise. How a batch is scored, and measured rates: docs/architecture.md, "rewards/"."""

from __future__ import annotations

import atexit
import logging
import os
import threading
from dataclasses import dataclass

from dapo.rewards.dapo_rule import dapo_rule_correct
from dapo.rewards.extract import clean_answer, extract_answer
from dapo.rewards.mv_check import check, fast_equivalent, interrupted
from dapo.rewards.pool import BoundedPool

log = logging.getLogger(__name__)

VERIFIERS = ("math_verify", "dapo_rule")
INLINE_MAX = 64  # below this many distinct checks, the pool's IPC costs more than it saves
HARD_GRACE_S = 1.0  # the parent kills a worker this long after the worker's own deadline
MAX_WORKERS = 16
WORKER_MEM_BYTES = 3 << 30  # address-space cap per worker: a LaTeX bomb gets a MemoryError, not the machine

_pools: dict[int, BoundedPool] = {}
_pools_lock = threading.Lock()


@dataclass(frozen=True)
class Score:
    """One response's reward. `score` is +1.0 or -1.0; `extracted` is the answer as the verifier compared it
    (math_verify: with `$`, `\\boxed{}` etc. removed; dapo_rule: the rule's normal form), None if none."""

    score: float
    correct: bool
    extracted: str | None


def _score(correct: bool, extracted: str | None) -> Score:
    return Score(1.0 if correct else -1.0, bool(correct), extracted)


def default_workers() -> int:
    """CPUs this process may use, capped at MAX_WORKERS."""
    try:
        n = len(os.sched_getaffinity(0))
    except (AttributeError, OSError):
        n = os.cpu_count() or 1
    return max(1, min(MAX_WORKERS, n))


def get_pool(workers: int) -> BoundedPool:
    """The process-wide persistent pool with `workers` processes (created on first use)."""
    with _pools_lock:
        if workers not in _pools:
            # A worker retires after a timed-out check (the interrupted computation may have left sympy's
            # caches half-updated); replacements fork from a warm forkserver in milliseconds.
            _pools[workers] = BoundedPool(
                check,
                workers,
                warmup=("2", "\\frac{4}{2}", 60.0),
                preload=("dapo.rewards._preload",),
                retire_if=interrupted,
                mem_limit_bytes=WORKER_MEM_BYTES,
            )
        return _pools[workers]


@atexit.register
def shutdown_pools() -> None:
    """Stop every scoring worker (also run at interpreter exit)."""
    with _pools_lock:
        for pool in _pools.values():
            pool.close()
        _pools.clear()


def _gold(answer: object) -> str:
    text = str(answer)
    return clean_answer(text, max_chars=None) or text.strip()


def score_dapo_rule(response: str, answer: str) -> Score:
    """One response under the paper's string rule (bounded time, in-process)."""
    correct, extracted = dapo_rule_correct(response if isinstance(response, str) else "", str(answer))
    return _score(correct, extracted)


def score_math_verify(response: str, answer: str, timeout_s: float = 5.0) -> Score:
    """One response under math-verify. Bounded by `timeout_s` when called from the main thread; from another
    thread it goes through the pool (signals cannot interrupt a non-main thread)."""
    return score_responses([response], [answer], "math_verify", timeout_s)[0]


def score_responses(
    responses: list[str],
    answers: list[str],
    verifier: str = "math_verify",
    timeout_s: float = 5.0,
    workers: int | None = None,
) -> list[Score]:
    """One `Score` per response, in order: `responses[i]` (model output, hostile input expected) against
    `answers[i]`, under `verifier` ("math_verify" or "dapo_rule"); a check past `timeout_s` scores -1. `workers`:
    the pool's size; None: the CPUs available (at most 16); 0: always inline (main thread only)."""
    if len(responses) != len(answers):
        raise ValueError(f"{len(responses)} responses but {len(answers)} answers")
    if verifier not in VERIFIERS:
        raise ValueError(f"unknown verifier {verifier!r}; choose one of {VERIFIERS}")
    if verifier == "dapo_rule":
        return [score_dapo_rule(r, a) for r, a in zip(responses, answers, strict=True)]

    extracted = [extract_answer(r) for r in responses]
    keys = [None if ext is None else (ext, _gold(ans)) for ext, ans in zip(extracted, answers, strict=True)]
    # One check per distinct (answer, gold) pair; plain numbers (every gold of AIME and DAPO-Math-17k) are decided
    # here in microseconds.
    outcomes: dict[tuple[str, str], tuple[str, bool]] = {}
    hard: list[tuple[str, str]] = []
    for key in keys:
        if key is not None and key not in outcomes:
            fast = fast_equivalent(*key)
            outcomes[key] = ("ok", bool(fast))
            if fast is None:
                hard.append(key)
    tasks = [(ext, gold, float(timeout_s)) for ext, gold in hard]
    in_main = threading.current_thread() is threading.main_thread()
    if in_main and (workers == 0 or len(hard) < INLINE_MAX):
        results = [check(task) for task in tasks]
    else:
        pool = get_pool(workers or default_workers())
        mapped = pool.map(tasks, float(timeout_s) + HARD_GRACE_S)
        raised = [value for status, value in mapped if status == "error" and value]
        if raised:  # `check` does not raise on an answer: this is a bug, scored -1 and named here
            log.warning("%d answer checks raised in the scoring worker, e.g. %s", len(raised), raised[0])
        results = [value if status == "ok" else (status, False) for status, value in mapped]
    outcomes.update(zip(hard, results, strict=True))
    timeouts = sum(status != "ok" for status, _ in outcomes.values())
    if timeouts:
        log.warning("%d of %d answer checks timed out or failed (scored -1)", timeouts, len(outcomes))
    return [_score(False, None) if key is None else _score(outcomes[key][1], key[0]) for key in keys]
