"""Find the final answer in a model response (docs/algorithm.md section 4), robustly and in linear time: model
output is hostile input, so every step is a single linear scan or works on a bounded window, and only a short,
cleaned string of at most `MAX_ANSWER_CHARS` characters ever reaches a verifier."""

from __future__ import annotations

import re
import unicodedata

MAX_ANSWER_CHARS = 300  # the longest MATH-500 answer has 159 characters; DAPO's rule reads 300
_LINE_SCAN = 4 * MAX_ANSWER_CHARS  # raw characters read after `Answer:` (zero-width marks may pad it)
_BOXED_SCAN = 2000  # characters scanned for the brace that closes a \boxed{
_BOXED_TRIES = 8  # unbalanced \boxed{ occurrences tried, from the last, before giving up

# `answer:` anywhere (also `**Answer:**`, `Final Answer:`, a full-width colon), then any whitespace, newlines
# included, as in the released rule's `Answer\s*:\s*([^\n]+)`. The possessive `*+` matters: with
# `\s*\**\s*` a long run of spaces after "answer" backtracks quadratically (8,000 spaces took 1.3 s).
_ANSWER_RE = re.compile(r"answer[\s*]*+[:：]\s*", re.IGNORECASE)
_BOXED_RE_NAMES = ("\\boxed", "\\fbox")
# Categories dropped from an extracted answer: controls (NUL...), format (zero-width, RTL/LTR marks, BOM),
# surrogates, private use, unassigned. Newline and tab are whitespace and are collapsed instead.
_DROP_CATEGORIES = frozenset({"Cc", "Cf", "Cs", "Co", "Cn"})
_FULLWIDTH = {c: c - 0xFEE0 for c in range(0xFF01, 0xFF5F)}  # full-width ASCII forms -> ASCII
_FULLWIDTH.update({0x2212: ord("-"), 0x3000: ord(" ")})  # unicode minus, ideographic space


def sanitize(text: str) -> str:
    """Drop invisible and invalid code points, map full-width digits to ASCII, collapse whitespace.

    Meant for short strings (an extracted answer); it is linear but per-character Python.
    """
    kept = "".join(
        ch if unicodedata.category(ch) not in _DROP_CATEGORIES else (" " if ch in "\n\t\r" else "")
        for ch in text.translate(_FULLWIDTH)
    )
    return " ".join(kept.split())


def _matching_brace(text: str, open_idx: int, limit: int) -> int | None:
    """Index of the `}` closing the `{` at `open_idx`, scanning at most `limit` characters; None if absent."""
    depth = 0
    end = min(len(text), open_idx + limit)
    i = open_idx
    while i < end:
        ch = text[i]
        if ch == "\\":  # an escaped brace (\{ \}) does not count
            i += 2
            continue
        if ch == "{":
            depth += 1
        elif ch == "}":
            depth -= 1
            if depth == 0:
                return i
        i += 1
    return None


def last_boxed(text: str) -> str | None:
    """Content of the last balanced `\\boxed{...}` (or `\\fbox{...}`, or `\\boxed 5`) in `text`, or None.

    Nested braces are balanced (`\\boxed{\\frac{1}{2}}` gives `\\frac{1}{2}`); an unbalanced last box is
    skipped for the one before it, at most `_BOXED_TRIES` times, each scan bounded by `_BOXED_SCAN`.
    """
    end = len(text)
    for _ in range(_BOXED_TRIES):
        pos, name = max((text.rfind(n, 0, end), n) for n in _BOXED_RE_NAMES)
        if pos < 0:
            return None
        j = pos + len(name)
        if j < len(text) and text[j] == "{":
            close = _matching_brace(text, j, _BOXED_SCAN)
            if close is not None:
                return text[j + 1 : close]
        elif j < len(text) and text[j] == " ":  # `\boxed 5`: the next whitespace-delimited token
            token = text[j : j + MAX_ANSWER_CHARS].split(maxsplit=1)
            if token:
                return token[0].split("$")[0]
        end = pos
    return None


def _strip_wrappers(ans: str) -> str:
    """Remove markup around a whole answer: `**x**`, `$x$`, `\\(x\\)`, `\\[x\\]`, `\\boxed{x}`, a final
    period."""
    for _ in range(4):  # wrappers nest a few deep at most ("$\\boxed{204}$."); bounded either way
        before = ans
        ans = ans.strip().strip("*").strip()
        if ans.endswith(".") and not ans.endswith("..."):
            ans = ans[:-1].rstrip()
        for left, right in (("$$", "$$"), ("$", "$"), ("\\(", "\\)"), ("\\[", "\\]")):
            inner = ans[len(left) : -len(right)]
            if len(ans) >= len(left) + len(right) and ans.startswith(left) and ans.endswith(right) and "$" not in inner:
                ans = inner.strip()
                break
        for name in _BOXED_RE_NAMES:
            if ans.startswith(name + "{") and _matching_brace(ans, len(name), len(ans)) == len(ans) - 1:
                ans = ans[len(name) + 1 : -1].strip()
        if ans == before:
            break
    return ans


def clean_answer(raw: str, max_chars: int | None = MAX_ANSWER_CHARS) -> str | None:
    """Sanitised, unwrapped form of an answer string, cut to `max_chars` (None: whole, for trusted ground
    truth, so that a cut model answer never equals a long gold by sharing its prefix); None if empty."""
    if max_chars is not None:
        raw = raw[: 4 * max_chars]
    ans = _strip_wrappers(sanitize(raw))
    return (ans if max_chars is None else ans[:max_chars]).strip() or None


def answer_line(text: str) -> str | None:
    """Raw content of the last `Answer:` line that has something on it (not cleaned), or None."""
    ends = [m.end() for m in _ANSWER_RE.finditer(text)]
    for end in reversed(ends):
        line = text[end : end + _LINE_SCAN].split("\n", 1)[0]
        if line.strip().strip("*").strip():
            return line
    return None


def extract_answer(text: str) -> str | None:
    """The response's final answer as a short clean string, or None if it gives none.

    Order: the last non-empty `Answer: ...` line (the DAPO template's format), else the last balanced
    `\\boxed{...}`. Wrappers (`$...$`, `**...**`, `\\boxed{}`, a final period) are removed so that `204`,
    `$204$` and `\\boxed{204}` all come out as `204` (which also makes majority voting over answers fair).
    Never raises; linear in `len(text)`.
    """
    if not isinstance(text, str):
        return None
    line = answer_line(text)
    if line is not None:
        ans = clean_answer(line)
        if ans is not None:
            return ans
    boxed = last_boxed(text)
    return clean_answer(boxed) if boxed is not None else None
