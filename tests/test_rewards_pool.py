"""The scoring pool under hostile model output: every response gets a Score, in bounded time, and a worker
stuck where no signal reaches it is killed and replaced instead of blocking training."""

from __future__ import annotations

import os
import signal
import threading
import time

import pytest

from dapo.rewards import score_responses
from dapo.rewards.pool import BoundedPool
from dapo.rewards.score import HARD_GRACE_S, get_pool, shutdown_pools

TIMEOUT_S = 3.0  # a real check takes milliseconds; 1 s let a loaded CI machine time out a correct one
WORKERS = 2
BOMB = "Answer: $10^{10^{10^{10}}}$"  # sympy evaluates the tower: > 15 s without a bound (measured)


@pytest.fixture(scope="module")
def warm_pool():
    """Start the scoring pool once (its cold start is not what the bounds below measure)."""
    get_pool(WORKERS).map([("1/2", "0.5", 30.0)], 60.0)
    yield get_pool(WORKERS)
    shutdown_pools()


def hostile_corpus() -> tuple[list[str], list[str]]:
    """Responses a policy can produce, built here from code (with the answer each is scored against)."""
    rtl_zw = "\u202e\u200f\u200b\u2066\ufeff"
    items = [
        ("x" * 100_000, "1"),  # 100k, no answer
        (("step\n" * 20_000)[:100_000] + "Answer: 7", "7"),  # 100k, answer at the end
        ("Answer: " + "\\frac{" * 10_000 + "1" + "}" * 10_000, "1"),  # 10k-deep LaTeX
        ("\\frac{" * 10_000 + "\\boxed{" * 10_000, "1"),  # unbalanced, 20k open braces
        ("\\boxed{" * 50_000 + "2", "2"),  # 50k unclosed boxes
        ("Answer: " + "}" * 5_000 + "{" * 5_000, "1"),  # inverted braces
        ("Answer:\n" * 20_000, "1"),  # 20k empty answer lines
        ("Answer: " + rtl_zw * 20 + "42", "42"),  # bidi and zero-width marks
        ("Answer: 4\ud800\udfff\x00\x01" + "\ud83d" * 1000 + "2", "42"),  # lone surrogates, NUL
        ("Answer: " + "(" * 3_000 + "1" + ")" * 3_000, "1"),  # deep parentheses
        ("Answer: " + "9" * 5_000, "9" * 5_000),  # a 5000-digit number
        ("Answer: " + "2^{" * 200 + "2" + "}" * 200, "4"),  # power tower
        ("Answer: $" + "\\sqrt{" * 100 + "2" + "}" * 100 + "$", "2"),
        ("Answer: \\begin{matrix}" + "1&" * 2000 + "\\end{matrix}", "1"),
        ("Answer: " + "a_{b_{c_{" * 500, "1"),
        ("Answer: " + "1" * 31, "7"),  # past Decimal's 28 digits
        (BOMB, "3"),  # would hang math-verify
        ("Answer: $(10^{10})!$", "3"),  # factorial of 10^10
        ("Answer: $\\frac{408}{2}$", "204"),  # a normal correct one
        ("Answer: \\frac12", "0.5"),  # another one
    ]
    return [r for r, _ in items], [a for _, a in items]


@pytest.mark.parametrize("path", ["inline", "pool"])
def test_hostile_corpus_is_scored_in_bounded_time(warm_pool, monkeypatch, path):
    import dapo.rewards.score as score_mod

    responses, answers = hostile_corpus()
    if path == "pool":  # a batch this small would run inline; send it through the pool instead
        monkeypatch.setattr(score_mod, "INLINE_MAX", 0)
    t0 = time.monotonic()
    scores = score_responses(responses, answers, timeout_s=TIMEOUT_S, workers=WORKERS)
    elapsed = time.monotonic() - t0
    assert len(scores) == len(responses)
    assert all(s.score in (1.0, -1.0) and s.correct == (s.score == 1.0) for s in scores)
    assert [s.score for s in scores[-2:]] == [1.0, 1.0]  # the normal ones
    assert scores[-4].score == -1.0 and scores[-4].extracted == "10^{10^{10^{10}}}"  # kept for inspection
    assert scores[-3].score == -1.0 and scores[-3].extracted == "(10^{10})!"
    assert scores[0].extracted is None and scores[1].score == 1.0
    assert scores[7].score == 1.0 and scores[8].score == 1.0  # marks and NUL stripped
    assert scores[10].score == -1.0  # a cut 300-digit answer does not match the 5000-digit gold
    assert all(s.extracted is None or len(s.extracted) <= 300 for s in scores)
    # Bound: every answer-bearing check timing out, spread over the workers (one at a time inline), plus
    # slack for a loaded 2-core machine.
    n_checks = sum(s.extracted is not None for s in scores)
    per_check = TIMEOUT_S if path == "inline" else (TIMEOUT_S + HARD_GRACE_S) / WORKERS
    assert elapsed < n_checks * per_check + 10


def test_a_bomb_is_cut_off_by_the_timeout_in_the_pool(warm_pool):
    answers = [f"{k}" for k in range(80)]  # 80 distinct checks: above the inline threshold
    responses = [BOMB] + [f"Answer: \\frac{{{2 * k}}}{{2}}" for k in range(1, 80)]
    t0 = time.monotonic()
    scores = score_responses(responses, answers, timeout_s=TIMEOUT_S, workers=WORKERS)
    elapsed = time.monotonic() - t0
    assert scores[0].score == -1.0 and scores[0].extracted == "10^{10^{10^{10}}}"
    assert [s.score for s in scores[1:]] == [1.0] * 79
    assert elapsed < (TIMEOUT_S + HARD_GRACE_S) * 4 + 20


def test_scoring_from_a_thread_is_bounded_too(warm_pool):
    """Off the main thread no signal can interrupt a check: even small batches go through the pool."""
    out: list = []
    t0 = time.monotonic()
    th = threading.Thread(
        target=lambda: out.extend(
            score_responses([BOMB, "Answer: $\\frac{6}{2}$"], ["3", "3"], timeout_s=TIMEOUT_S, workers=WORKERS)
        )
    )
    th.start()
    th.join(timeout=60)
    assert not th.is_alive()
    assert [s.score for s in out] == [-1.0, 1.0]
    assert time.monotonic() - t0 < (TIMEOUT_S + HARD_GRACE_S) * 3 + 20


# ------------------------------------------------------------------------ the pool itself, with a fake check
def stuck_or_double(item):
    """A check that hangs where no signal can interrupt it (SIGALRM blocked, as in a long C call)."""
    if item == "hang":
        signal.pthread_sigmask(signal.SIG_BLOCK, {signal.SIGALRM})
        signal.setitimer(signal.ITIMER_REAL, 0.1)
        time.sleep(3600)
    if item == "die":
        os._exit(3)
    if item == "raise":
        raise RuntimeError("boom")
    return item * 2


def test_a_hung_worker_is_killed_and_replaced():
    pool = BoundedPool(stuck_or_double, 2)
    try:
        items = [1, 2, "hang", 3, 4, 5, "die", 6, "raise", 7] + list(range(8, 40))
        t0 = time.monotonic()
        out = pool.map(items, hard_timeout_s=1.0)
        elapsed = time.monotonic() - t0
        assert out[2] == ("timeout", None)
        assert out[6] == ("crash", None)
        assert out[8] == ("error", "RuntimeError: boom")  # named, so a caller can report it
        assert [v for k, (s, v) in enumerate(out) if k not in (2, 6, 8)] == [
            x * 2 for k, x in enumerate(items) if k not in (2, 6, 8)
        ]
        assert pool.restarts == 2
        assert elapsed < 30  # ~1 s for the hang; the rest is worker start-up on a loaded machine
        # the replacements serve the next map, and a second hang costs one more restart
        assert pool.map([10, "hang", 11], hard_timeout_s=1.0) == [("ok", 20), ("timeout", None), ("ok", 22)]
        assert pool.restarts == 3
    finally:
        pool.close()


def test_a_worker_whose_warm_up_fails_stops_the_map_with_its_reason():
    """The scoring workers' warm-up is what makes math-verify correct in them (mv_check.warm_up): a worker whose
    warm-up raised must not take items and score them."""
    pool = BoundedPool(stuck_or_double, 1, warmup="raise")
    try:
        with pytest.raises(RuntimeError, match="failed its warm-up: RuntimeError: boom"):
            pool.map([1, 2], hard_timeout_s=5.0)
    finally:
        pool.close()
