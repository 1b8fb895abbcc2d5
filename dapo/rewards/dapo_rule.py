"""The DAPO paper's own answer rule, the `dapo_rule` verifier (docs/algorithm.md section 4): the released recipe's
Minerva-style rule (verl `math_dapo.compute_score`, from lm-evaluation-harness) plus one addition, `204.0` -> `204`.
Linear-time work on at most 300 characters, so it needs no timeout and runs in-process."""

from __future__ import annotations

import re

WINDOW_CHARS = 300  # the released rule: "the longest answer in MATH-500 has 159 characters"

_ANSWER_RE = re.compile(r"(?i)Answer\s*:\s*([^\n]+)")
# (before, after) replacements, applied in this order (the order matters: "an " before " ").
_SUBSTITUTIONS = (
    ("an ", ""),
    ("a ", ""),
    (".$", "$"),
    ("\\$", ""),
    ("\\ ", ""),
    (" ", ""),
    ("mbox", "text"),
    (",\\text{and}", ","),
    ("\\text{and}", ","),
    ("\\text{m}", "\\text{}"),
)
# Unit words and LaTeX spacing removed outright, in this order, as in the released rule (split on single spaces).
_REMOVED = tuple(
    "square ways integers dollars mph inches hours km units \\ldots sue points feet minutes digits cents degrees cm gm "
    "pounds meters meals edges students childrentickets multiples \\text{s} \\text{.} \\text{\ns} \\text{}^2 "
    '\\text{}^3 \\text{\n} \\text{} \\mathrm{th} ^\\circ ^{\\circ} \\; ,\\! {,} " \\dots'.split(" ")
)
_UNWRAP = (
    (re.compile(r"(.*?)(\$)(.*?)(\$)(.*)"), "$\\3$"),  # keep only the first $...$ span
    (re.compile(r"(\\text\{)(.*?)(\})"), "\\2"),
    (re.compile(r"(\\textbf\{)(.*?)(\})"), "\\2"),
    (re.compile(r"(\\overline\{)(.*?)(\})"), "\\2"),
    (re.compile(r"(\\boxed\{)(.*)(\})"), "\\2"),
    (re.compile(r"(frac)([^{])(.)"), "frac{\\2}{\\3}"),  # \fracab -> \frac{a}{b}
    (re.compile(r"(sqrt)([^{])"), "sqrt{\\2}"),  # \sqrta -> \sqrt{a}
)
_ZERO_FRACTION = re.compile(r"(-?\d+)\.0+")


def normalize_final_answer(answer: str) -> str:
    """Minerva-style normal form of an answer string (inputs of <= 300 chars): keep what follows the last `=`,
    drop `$`, spaces and unit words, unwrap `\\boxed{}` and the like, expand `\\fracab`, drop thousands commas."""
    answer = answer.split("=")[-1]
    for before, after in _SUBSTITUTIONS:
        answer = answer.replace(before, after)
    for unit in _REMOVED:
        answer = answer.replace(unit, "")
    for pattern, repl in _UNWRAP:
        answer = pattern.sub(repl, answer)
    answer = answer.replace("$", "")
    if answer.replace(",", "").isdigit():
        answer = answer.replace(",", "")
    answer = answer.strip()
    zero = _ZERO_FRACTION.fullmatch(answer)  # the one addition to the released rule: 204.0 -> 204
    return zero.group(1) if zero else answer


def dapo_rule_extract(response: str) -> str | None:
    """The raw answer the rule reads: the last `Answer: ...` match in the last 300 characters, or None."""
    matches = _ANSWER_RE.findall(response[-WINDOW_CHARS:])
    return (matches[-1].strip() or None) if matches else None


def dapo_rule_correct(response: str, answer: str) -> tuple[bool, str | None]:
    """(correct, normalised answer) under the paper's rule, as the released code returns its `pred`, so that
    majority voting groups `$204$` with `204`; (False, None) without an `Answer:` line. Plain bounded string and
    regex work on a 300-character window: it does not raise on any text (tests/test_rewards.py feeds it hostile
    input), and a bug that made it raise should surface rather than score -1."""
    extracted = dapo_rule_extract(response)
    if extracted is None:
        return False, None
    pred = normalize_final_answer(extracted)
    return bool(pred) and pred == normalize_final_answer(str(answer)[-WINDOW_CHARS:]), pred or None
