"""Reward extraction and verifiers (docs/algorithm.md section 4): what a trainer relies on for +1/-1 to be right.

The pool and the time bounds on hostile input are in test_rewards_pool.py.
"""

from __future__ import annotations

import time

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from dapo.rewards import (
    extract_answer,
    last_boxed,
    normalize_final_answer,
    score_dapo_rule,
    score_math_verify,
    score_responses,
)
from dapo.rewards.extract import MAX_ANSWER_CHARS
from dapo.rewards.mv_check import check, fast_equivalent, warm_up

BODY = "Let $s$ be the speed. Then $\\frac{9}{s} + \\frac{t}{60} = 4$, so $s = 2.5$ and $t = 24$.\n"


# ------------------------------------------------------------------------------------------ AIME 2024
FORMATS_BOTH = ["Answer: {a}", "Answer: ${a}$", "Answer: {a}.0", "Answer: ${a}$ minutes"]
# The paper's rule scores these -1: no `Answer:` line; markdown bold is left in (`**204`).
FORMATS_MV_ONLY = ["So the final result is $\\boxed{{{a}}}$.", "**Answer:** {a}"]


@pytest.mark.parametrize("verifier", ["math_verify", "dapo_rule"])
def test_every_aime_answer_is_recognised_in_every_format(aime2024_answers, verifier):
    answers = aime2024_answers
    assert len(answers) == 30
    formats = FORMATS_BOTH + (FORMATS_MV_ONLY if verifier == "math_verify" else [])
    responses = [BODY + fmt.format(a=a) for a in answers for fmt in formats]
    golds = [a for a in answers for _ in formats]
    scores = score_responses(responses, golds, verifier=verifier, workers=0)
    wrong = [(r[-40:], g) for r, g, s in zip(responses, golds, scores, strict=True) if s.score != 1.0]
    assert wrong == []
    assert all(s.correct for s in scores)


def test_the_papers_rule_ignores_a_boxed_answer_without_an_answer_line(aime2024_answers):
    answers = aime2024_answers
    scores = score_responses([BODY + f"\\boxed{{{a}}}" for a in answers], answers, verifier="dapo_rule")
    assert [s.score for s in scores] == [-1.0] * 30
    assert all(s.extracted is None for s in scores)


@pytest.mark.parametrize("verifier", ["math_verify", "dapo_rule"])
def test_wrong_and_missing_answers_score_minus_one(aime2024_answers, verifier):
    answers = aime2024_answers
    wrong = [BODY + f"Answer: {int(a) + 1}" for a in answers]
    missing = [BODY, "", "Answer:", "Answer:   \n", "I could not solve it.", "\\boxed{"]
    scores = score_responses(wrong + missing, answers + answers[: len(missing)], verifier=verifier, workers=0)
    assert [s.score for s in scores] == [-1.0] * len(scores)
    assert [s.correct for s in scores] == [False] * len(scores)
    assert [s.extracted for s in scores[:30]] == [str(int(a) + 1) for a in answers]
    assert all(s.extracted is None for s in scores[30:])


@pytest.mark.parametrize("verifier", ["math_verify", "dapo_rule"])
def test_the_last_answer_line_wins(verifier):
    first_wrong = "Answer: 5\nWait, I made an error. Redoing it.\nAnswer: 204\n"
    last_wrong = "Answer: 204\nHmm, on reflection:\nAnswer: 5"
    empty_last = "Answer: 204\nAnswer:"  # an empty last line does not count (as in the released rule)
    scores = score_responses([first_wrong, last_wrong, empty_last], ["204"] * 3, verifier=verifier, workers=0)
    assert [s.score for s in scores] == [1.0, -1.0, 1.0]


# ------------------------------------------------------------------------------------------ math-verify
def test_math_verify_decides_equivalence_beyond_string_equality():
    warm_up()
    cases = [  # (answer line, gold, equivalent?)
        ("Answer: $\\frac{408}{2}$", "204", True),
        ("Answer: \\frac12", "0.5", True),
        ("Answer: $\\dfrac{3}{4}$", "\\frac{3}{4}", True),
        ("Answer: $2\\sqrt{3}$", "\\sqrt{12}", True),
        ("Answer: $x = 204$", "204", True),
        ("Answer: 2^{10}", "1024", True),
        ("Answer: 3\\sqrt{2}", "3", False),  # unwrapped, math-verify would read 3 here
        ("Answer: 5 or 204", "204", False),  # a hedge is a set {5, 204}, not 204
        ("Answer: $\\frac{1}{3}$", "0.5", False),
    ]
    scores = score_responses([c[0] for c in cases], [c[1] for c in cases], workers=0)
    assert [s.correct for s in scores] == [c[2] for c in cases]


def test_the_plain_number_shortcut_agrees_with_math_verify():
    from math_verify import parse, verify

    warm_up()
    pairs = [
        ("204", "204"),
        ("204.0", "204"),
        ("206.0", "204"),
        ("-3", "3"),
        ("0204", "204"),
        ("12", "120"),
        ("1.50", "1.5"),
        ("7", "7.000"),
        ("1" * 31, "204"),
        ("9" * 60, "9" * 60),
        ("9" * 59 + "8", "9" * 60),
    ]
    for extracted, gold in pairs:
        fast = fast_equivalent(extracted, gold)
        assert fast is not None
        full = verify(
            parse(f"${gold}$", parsing_timeout=None),
            parse(f"${extracted}$", parsing_timeout=None),
            timeout_seconds=None,
        )
        assert fast == full, (extracted, gold)
    assert fast_equivalent("0.3333333", "0.33333333") is None  # math-verify's rounding decides these


def test_a_check_that_would_hang_math_verify_is_cut_off_inline():
    warm_up()  # outside the clock: the one-off warm-up runs without a deadline
    bomb = "Answer: $10^{10^{10^{10}}}$"  # sympy tries to evaluate it: > 15 s unbounded (measured)
    t0 = time.monotonic()
    s = score_math_verify(bomb, "3", timeout_s=0.5)
    elapsed = time.monotonic() - t0
    assert s.score == -1.0 and not s.correct
    assert s.extracted == "10^{10^{10^{10}}}"  # kept for inspection
    assert elapsed < 0.5 * 6
    # the interrupted check left the process able to verify
    assert check(("\\frac{408}{2}", "204", 5.0)) == ("ok", True)


@pytest.mark.parametrize("failure", ["raises", "wrong"])
def test_a_verifier_that_fails_its_warm_up_stops_scoring_with_the_reason(monkeypatch, failure):
    """A process whose math-verify cannot decide known cases must not score anything (each score would be -1)."""
    from dapo.rewards import mv_check

    def broken(extracted: str, gold: str) -> bool:
        if failure == "raises":
            raise RecursionError("parser state lost")
        return False

    monkeypatch.setattr(mv_check, "_warm", False)
    monkeypatch.setattr(mv_check, "verify_equivalent", broken)
    with pytest.raises(mv_check.VerifierBroken, match="warm-up check"):
        score_responses(["Answer: \\frac{1}{2}"], ["0.5"], workers=0)


def test_the_deadline_keeps_a_callers_alarm():
    """A trainer's own SIGALRM watchdog survives scoring: re-armed with its remaining time, not cancelled."""
    import signal

    warm_up()
    fired = []
    old = signal.signal(signal.SIGALRM, lambda *_: fired.append(time.monotonic()))
    try:
        t0 = time.monotonic()
        signal.setitimer(signal.ITIMER_REAL, 0.3)
        assert check(("\\frac{408}{2}", "204", 5.0)) == ("ok", True)
        remaining = signal.getitimer(signal.ITIMER_REAL)[0]
        assert fired or 0 < remaining <= 0.3
        while not fired and time.monotonic() - t0 < 5:
            time.sleep(0.01)
        assert len(fired) == 1 and fired[0] - t0 >= 0.29
    finally:
        signal.setitimer(signal.ITIMER_REAL, 0)
        signal.signal(signal.SIGALRM, old)


def test_misuse_raises():
    with pytest.raises(ValueError, match="responses but"):
        score_responses(["Answer: 1"], [])
    with pytest.raises(ValueError, match="unknown verifier"):
        score_responses(["Answer: 1"], ["1"], verifier="exact")


# ------------------------------------------------------------------------------------------ extraction
@pytest.mark.parametrize(
    ("text", "expected"),
    [
        ("Answer: 204", "204"),
        ("answer:204.", "204"),
        ("**Answer:** $\\boxed{204}$.", "204"),
        ("Final Answer:\n\n$\\frac{1}{2}$", "\\frac{1}{2}"),  # the released rule's \s* crosses newlines
        ("Answer: \\(x^2\\)", "x^2"),
        ("Answer: $x$ = $5$", "$x$ = $5$"),  # not one span: left for the verifier
        ("thus \\boxed{\\frac{1}{\\sqrt{2}}} done", "\\frac{1}{\\sqrt{2}}"),
        ("\\boxed{1} then \\boxed{2}", "2"),
        ("\\boxed{7} and finally \\boxed{8", "7"),  # unbalanced last box: the one before
        ("\\boxed 5", "5"),
        ("\\fbox{12}", "12"),
        ("Answer: \u200f2\u200b0\u20624\ufeff", "204"),  # RTL mark, zero-width space/joiner, BOM
        ("Answer: \uff12\uff10\uff14", "204"),  # full-width digits
        ("Answer: 2\x0004\ud800", "204"),  # NUL and a lone surrogate
        ("Answer: \u2212204", "-204"),  # unicode minus
        ("no answer here", None),
        ("Answer: ** **", None),
    ],
)
def test_extract_answer(text, expected):
    assert extract_answer(text) == expected


def test_last_boxed_balances_nested_braces():
    assert last_boxed("x \\boxed{\\frac{a}{b}+\\{1\\}} y") == "\\frac{a}{b}+\\{1\\}"
    assert last_boxed("\\boxed{" * 10_000 + "1" + "}" * 10_000) == "1"
    assert last_boxed("no box") is None


@settings(max_examples=300, deadline=None)
@given(st.text(alphabet=st.characters(codec=None), max_size=400))
def test_extract_answer_never_raises_and_is_capped(text):
    out = extract_answer("Answer: " + text)
    assert out is None or (0 < len(out) <= MAX_ANSWER_CHARS and "\x00" not in out)
    assert score_dapo_rule(text + "\\boxed{" + text, "1").score in (1.0, -1.0)


@pytest.mark.parametrize(
    "text",
    [
        ("Answer: 12 {\\frac{\\boxed{" * 4000)[:100_000],
        "answer" + " " * 100_000 + "x",  # quadratic backtracking bait for a naive `\s*\**\s*`
        ("answer" + " *" * 500) * 100,
        "\\boxed{" * 20_000 + "\\fbox{" * 20_000,
        "Answer:" + " " * 100_000 + "7",
    ],
)
def test_extraction_is_fast_on_a_100k_response(text):
    t0 = time.perf_counter()
    for _ in range(5):
        extract_answer(text)
    assert (time.perf_counter() - t0) / 5 < 0.5  # ~10 ms idle; generous for a loaded machine


# ------------------------------------------------------------------------------------------ the paper's rule
@pytest.mark.parametrize(
    ("raw", "expected"),
    [
        ("$204$", "204"),
        ("204.0", "204"),  # our one addition to the released rule
        ("1{,}000", "1000"),
        ("1,000", "1000"),
        ("10 \\text{ inches}", "10"),
        ("x = 5", "5"),
        ("\\frac12", "\\frac{1}{2}"),
        ("\\boxed{\\frac{3}{4}}", "\\frac{3}{4}"),
        ("90^\\circ", "90"),
        ("2.5", "2.5"),
    ],
)
def test_normalize_final_answer(raw, expected):
    assert normalize_final_answer(raw) == expected


def test_extracted_answers_agree_across_formats_for_majority_voting():
    responses = ["Answer: $204$", "Answer: 204", "\\boxed{204}", "Answer: 204.0"]
    assert {s.extracted for s in score_responses(responses, ["1"] * 4, workers=0)} == {"204", "204.0"}
    assert {s.extracted for s in score_responses(responses, ["1"] * 4, verifier="dapo_rule")} == {"204", None}


def test_the_papers_rule_reads_only_the_last_300_characters():
    early = "Answer: 204\n" + "x" * 300
    assert score_dapo_rule(early, "204").score == -1.0
    assert score_math_verify(early, "204").score == 1.0  # our extraction reads the whole response
