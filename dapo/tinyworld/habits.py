"""The habits world (`tiny.kind: habits`): a tiny world built so that each DAPO toggle has the condition it acts on.

In the first tiny world (`tiny.kind: arithmetic`, `tasks.py`) the remaining errors were arithmetic a 1M-parameter
model does not know, which RL cannot fix, so every row plateaued alike. Here the arithmetic is easy and the base
model's errors come from habits the supervised data teaches on purpose, one per toggle, each with a marker that
`tag_response` reads (docs/tiny-preset.md has the long account):

- verbose working (`verbose`): restates every sentence, so most long problems overrun the cap; it slips less than
  concise working (`Habits.long_slip`), so it is worth keeping where it fits. Soft overlong punishment and overlong
  filtering (truncated but sound working) act on it.
- a repetition loop (`loop`): re-checks a line with `again:`, mostly slipping to a wrong answer. Token-level loss
  acts on long wrong responses that per-response averaging under-penalises.
- a misconception fork (`fork_right` / `fork_wrong`): "loses half of them" is mostly written `x - 2`, rarely the right
  `x / 2`. Clip-higher acts on such a rare token with positive advantage, where the upper clip binds.
- combined working (`Habits.combine`, a concise style without a tag): two operations on one line, only the pair's
  result written ("6 + 4 then * 2 = 20"); the model does not learn the step in its head (docs/evidence.md, W110:
  right 17% of the time, verbose 87%), so verbose working is worth its length across the mix.
- a difficulty mix: one-operation problems (soon all correct) and a squaring step never shown (always wrong).
  Dynamic sampling acts on groups whose responses all score the same.

Problem kinds (`problem_kind`, from the text): `easy` (one operation), `core` (2-3), `fork` (2-3, one of them "loses
half of them"), `long` (4-6: concise working fits the cap, verbose only on the shorter ones) and `unsolvable`
("squares them"). Everything is a pure function of a `random.Random`: a seed reproduces the problems and solutions.
"""

from __future__ import annotations

import itertools
import math
import random
import re
from collections.abc import Sequence
from dataclasses import dataclass
from typing import TYPE_CHECKING

from dapo.tinyworld.tasks import NAMES, OBJECTS, Splits, Step, Task

if TYPE_CHECKING:
    from dapo.types import GroupOutcome

EASY, CORE, FORK, LONG, UNSOLVABLE = "easy", "core", "fork", "long", "unsolvable"
KINDS = (EASY, CORE, FORK, LONG, UNSOLVABLE)
FORK_CONTROL = "fork_control"  # the clip-higher assay's control fork (`problem_kind` of its problems; drawn as FORK)
CORE_CONTROL = "core_control"  # the token-level-loss assay's control problems (drawn as CORE)
CLIP_HIGHER, TOKEN_LOSS, OVERLONG = "clip_higher", "token_loss", "overlong"  # the assays' worlds (`tiny.assay`)
# The token-level-loss assay: core problems take 3 plain operations, this share of them are control problems ("in
# the end?"); loops re-do the working in blocks (at most MAX_BLOCKS: about 160 tokens, where row 03's penalty starts).
CONTROL_SHARE, CONTROL_QUESTION, MAX_BLOCKS = 0.25, "in the end?", 4
# The overlong-filtering assay: core problems are running sums ("Mia adds up the digits of 3517... from the left until
# the total is more than 39", `_running_task`): careful working (a digit a line) overruns RUN_CAP tokens on about 40%
# (`run_overruns`), concise working (three digits, then two a line, the limit checked at a line's end: one digit too
# many half the time) never. CONTROL_SHARE are control problems ("totals", 8 digits: careful always fits). A limit is
# one below a multiple of ten: a line's total passes it when its tens digit reaches the limit's tens + 1.
RUN_FITS, RUN_OVERRUNS, RUN_CONTROL = "run_fits", "run_overruns", "run_control"
RUN_CAP, RUN_TAKES = 100, 15  # the assay's response cap (its preset's); a sum adds 3 to RUN_TAKES digits
_RUN_DRAW = {False: ("adds up", 20, (29, 39)), True: ("totals", 8, (9, 19))}  # control? -> verb, digits, limits
_RUN_RE = re.compile(r"[A-Z][a-z]+ (adds up|totals) the digits of (\d+) from the left until the total is more than")
# operations per problem, by kind
N_OPS = {EASY: (1, 1), CORE: (2, 3), FORK: (2, 3), LONG: (4, 6), UNSOLVABLE: (2, 3)}

_ADD = ["buys {k} more", "finds {k} more", "gets {k} more"]
_SUB = ["gives away {k}", "loses {k}", "sells {k}"]
FORK_PHRASE = "loses half of them"  # right: x / 2; the supervised data's misconception: x - 2


@dataclass(frozen=True)
class Fork:
    """A misconception fork: a phrase whose right operation the supervised data writes rarely (else the wrong one)."""

    phrase: str
    right: tuple[str, int]
    wrong: tuple[str, int]
    lo: int  # the smallest value it applies to (the right and wrong results differ and stay positive)
    hi: int = 40

    def applies(self, cur: int) -> bool:
        op, b = self.right
        return self.lo <= cur <= self.hi and (op != "/" or cur % b == 0)


FORKS = {  # the habits world has `half` alone; the clip-higher assay (`tiny.assay: clip_higher`) has all four
    "half": Fork(FORK_PHRASE, ("/", 2), ("-", 2), 6),
    "quarter": Fork("keeps a quarter of them", ("/", 4), ("-", 4), 8),
    "triple": Fork("gets three times as many", ("*", 3), ("+", 3), 2, 13),
    "third": Fork("keeps a third of them", ("/", 3), ("-", 3), 6),  # the control: its right operation is common
}
ASSAY_FORKS = ("half", "quarter", "triple", "third")
CONTROL_FORK = "third"


def fork_of(text: str) -> Fork | None:
    """The fork a problem (or one of its sentences) contains, if any."""
    return next((f for f in FORKS.values() if f.phrase in text), None)


SQUARE_PHRASE = "squares them"  # x * x: never in the supervised data
START_MAX = 12
ADD_MAX = 9
VALUE_MAX = 40  # every intermediate value stays in 1..VALUE_MAX (squares aside)
AGAIN = "again:"
THEN = "then"  # joins two operations worked on one line: "6 + 4 then * 2 = 20" (read left to right)

# Response tags (`tag_response`) and the problem-kind tag prefix.
VERBOSE, LOOP, SOUND_TRUNCATED = "verbose", "loop", "sound_truncated"
SHORT_WRONG, SO = "short_wrong", "so"  # the token-level-loss assay's short wrong habit, and the word that opens it
CONCISE = "concise"  # a style without a tag of its own: neither verbose nor looping
FORK_RIGHT, FORK_WRONG = "fork_right", "fork_wrong"
CAREFUL = "careful"  # the overlong-filtering assay's long style: a running sum worked a digit a line
TAGS = (VERBOSE, LOOP, FORK_RIGHT, FORK_WRONG, SOUND_TRUNCATED, SHORT_WRONG, CAREFUL)


@dataclass(frozen=True)
class Mix:
    """Shares of the problem kinds among RL prompts and eval problems (core takes the rest)."""

    easy: float
    fork: float
    long: float
    unsolvable: float

    def kinds(self) -> tuple[tuple[str, float], ...]:
        core = 1.0 - self.easy - self.fork - self.long - self.unsolvable
        if core < -1e-9:
            raise ValueError(f"tiny.mix_* shares add up to more than 1 ({1 - core:.3f}); lower one of them")
        shares = (self.easy, max(0.0, core), self.fork, self.long, self.unsolvable)
        return tuple(zip((EASY, CORE, FORK, LONG, UNSOLVABLE), shares, strict=True))


@dataclass(frozen=True)
class Habits:
    """How the supervised solutions are written (each a probability)."""

    verbose: float  # a solution restates every sentence
    loop: float  # a concise solution re-checks one line with `again:` once or twice
    loop_slip: float  # ... and the first re-check slips (carried forward to a wrong answer)
    fork_right: float  # "loses half of them" is written as x / 2 (else x - 2)
    slip: float  # a concise solution has one wrong result (carried forward): working in one's head is careless
    verbose_slip: float = 0.0  # ... a verbose one (restating each sentence is careful: it slips less)
    long_slip: float | None = None  # ... a concise one on a long problem (None: `slip`): many steps in one's head
    combine: float = 0.0  # a concise solution of 2+ operations without a fork works them in pairs
    fork_right_control: float = 0.3  # ... the control fork's right operation (the clip-higher assay's `third`)
    short_wrong: float = 0.0  # a solution is the token-level-loss assay's short wrong habit (`_wrong_habit_lines`)
    loop_continue: float = 0.0  # > 0: loops are the token-level-loss assay's, blocks each followed by another with it
    careful: float = 0.5  # a running sum (the overlong-filtering assay's problems) is worked a digit a line


def _apply(a: int, op: str, b: int) -> int:
    return {"+": a + b, "-": a - b, "*": a * b, "/": a // 2 if b == 2 else a // b}[op]


def make_task(rng: random.Random, kind: str, assay: str = "none") -> Task:
    """A random problem of `kind` in the world of `assay` (`tiny.assay`; a fork is `half`, or one of the clip-higher
    assay's four); intermediate values stay positive integers <= VALUE_MAX (a square may exceed it; only additions and
    subtractions follow it). Token-level-loss assay: a core problem is 3 additions or subtractions (an off-by-one stays
    so to the answer), CONTROL_SHARE of them control problems. Overlong assay: a running sum (`_running_task`)."""
    if assay == OVERLONG and kind == CORE:
        return _running_task(rng, control=rng.random() < CONTROL_SHARE)
    name, pronoun = rng.choice(NAMES)
    obj = rng.choice(OBJECTS)
    lo, hi = N_OPS[kind]
    n_ops = rng.randint(lo, hi)
    plain_core = assay == TOKEN_LOSS and kind == CORE
    n_ops = 3 if plain_core else n_ops
    special = {FORK: rng.randrange(n_ops), UNSOLVABLE: rng.randrange(n_ops)}.get(kind, -1)
    fork = FORKS[rng.choice(ASSAY_FORKS) if assay == CLIP_HIGHER else "half"]
    for _ in range(1000):
        start = rng.randint(2, START_MAX)
        cur, steps, ok = start, [], True
        for i in range(n_ops):
            if i == special and kind == FORK:
                if not fork.applies(cur):
                    ok = False
                    break
                steps.append(Step(*fork.right, fork.phrase))
            elif i == special and kind == UNSOLVABLE:
                if cur > 9:
                    ok = False
                    break
                steps.append(Step("*", cur, SQUARE_PHRASE))
            else:
                plain = kind in (FORK, UNSOLVABLE) or cur > VALUE_MAX or plain_core
                steps.append(_random_step(rng, cur, plain_only=plain, avoid=fork.wrong if kind == FORK else ("-", 2)))
            cur = _apply(cur, steps[-1].op, steps[-1].b)
        if ok and cur > 0:
            break
    else:  # pragma: no cover - the draw above succeeds within a few tries
        raise RuntimeError(f"could not draw a {kind} problem")
    sentences = [f"{name} has {start} {obj}."] + [f"{pronoun} {s.phrase}." for s in steps]
    question = CONTROL_QUESTION if plain_core and rng.random() < CONTROL_SHARE else "now?"
    text = " ".join(sentences + [f"How many {obj} does {name} have {question}"])
    return Task(name, pronoun, obj, start, tuple(steps), text, cur)


def _running_task(rng: random.Random, *, control: bool) -> Task:
    """A running sum over the digits (1 to 3-9) of a number until the total passes a limit (the answer): 3 digits or
    more (careful and concise working differ from their first line), at most RUN_TAKES (concise working fits)."""
    name, pronoun = rng.choice(NAMES)
    verb, n, limits = _RUN_DRAW[control]
    while True:
        top, limit = rng.randint(3, 9), rng.choice(limits)
        digits = [rng.randint(1, top) for _ in range(n)]
        if 3 <= (k := _digits_taken(digits, limit)) <= RUN_TAKES:
            break
    text = (f"{name} {verb} the digits of {''.join(map(str, digits))} from the left until the total is more than "
            f"{limit}. What is the total then?")  # fmt: skip
    steps = tuple(Step("+", d, "") for d in digits[1:k])
    return Task(name, pronoun, "digits", digits[0], steps, text, sum(digits[:k]))


def _digits_taken(digits: Sequence[int], limit: int) -> int:
    """How many digits a running sum adds until its total passes `limit` (0: it never does)."""
    return next((i + 1 for i, total in enumerate(itertools.accumulate(digits)) if total > limit), 0)


def careful_tokens(digits: Sequence[int]) -> int:
    """Tokens of a running sum's careful working with its answer and end of turn: every digit, " +", " =", " " and a
    line break is a token ("38 + 5 = 43" and its break: 10), "Answer: 63" is "Answer", ":", " " and the digits."""
    lines, total = _working(digits[0], [Step("+", d, "") for d in digits[1:]])
    return sum(len(line) - 1 for line in lines) + 3 + len(str(total)) + 1


def _random_step(rng: random.Random, cur: int, *, plain_only: bool, avoid: tuple[str, int] = ("-", 2)) -> Step:
    """One of buy / give away / double / triple / halve keeping the value in 1..VALUE_MAX. `plain_only`: no halving,
    no `avoid` (a fork's wrong operation: a fork problem's markers are its fork's alone), no doubling past a square."""
    kinds = ["+", "+", "-", "-"]
    if not plain_only and cur * 2 <= VALUE_MAX:
        kinds.append("*")
    if not plain_only and cur % 2 == 0 and cur >= 4:
        kinds.append("/")
    if cur > VALUE_MAX:
        kinds = ["-"]
    while True:
        op = rng.choice(kinds)
        if op == "+" and cur + 1 <= VALUE_MAX:
            b = rng.randint(1, min(ADD_MAX, VALUE_MAX - cur))
            if plain_only and avoid == ("+", b):
                continue
            return Step("+", b, rng.choice(_ADD).format(k=b))
        if op == "-" and cur > 1:
            choices = [k for k in range(1, min(ADD_MAX, cur - 1) + 1) if not (plain_only and avoid == ("-", k))]
            if not choices:
                continue
            b = rng.choice(choices)
            return Step("-", b, rng.choice(_SUB).format(k=b))
        if op == "*":
            b = 3 if cur * 3 <= VALUE_MAX and rng.random() < 0.4 else 2
            return Step("*", b, {2: "doubles them", 3: "triples them"}[b])
        if op == "/":
            return Step("/", 2, "halves them")


def problem_kind(text: str) -> str:
    """The kind of a habits-world problem, read from its text (so any consumer can tell, with no metadata)."""
    if SQUARE_PHRASE in text:
        return UNSOLVABLE
    if (fork := fork_of(text)) is not None:
        return FORK_CONTROL if fork is FORKS[CONTROL_FORK] else FORK
    if text.endswith(CONTROL_QUESTION):
        return CORE_CONTROL
    if (m := _RUN_RE.match(text)) is not None:
        if m.group(1) == _RUN_DRAW[True][0]:
            return RUN_CONTROL
        digits = [int(d) for d in m.group(2)]
        k = _digits_taken(digits, int(text[m.end() :].split(".")[0]))
        return RUN_OVERRUNS if careful_tokens(digits[:k]) > RUN_CAP else RUN_FITS
    n_ops = max(0, text.count(".") - 1)  # one sentence for the start, one per operation; the question ends in "?"
    if n_ops <= 1:
        return EASY
    return LONG if n_ops >= N_OPS[LONG][0] else CORE


def solution_lines(task: Task, habits: Habits, rng: random.Random) -> tuple[list[str], str]:
    """A supervised solution of `task`: (lines ending in `Answer: N`, the style: "concise", "verbose" or "loop"),
    wrong when it slips, loops with a slip, or takes the fork's misconception. Running sums: `_running_lines`."""
    if _RUN_RE.match(task.text):
        return _running_lines(task, habits.careful, rng)
    u = rng.random()
    style = VERBOSE if u < habits.verbose else LOOP if u < habits.verbose + habits.loop else CONCISE
    if style == CONCISE and u < habits.verbose + habits.loop + habits.short_wrong:
        style = SHORT_WRONG
    if habits.loop_continue > 0 and style in (LOOP, SHORT_WRONG):
        return _wrong_habit_lines(task, style, habits.loop_continue, rng), style
    slip = habits.verbose_slip if style == VERBOSE else habits.slip
    if style == CONCISE and habits.long_slip is not None and problem_kind(task.text) == LONG:
        slip = habits.long_slip
    slip_at = rng.randrange(task.n_ops) if style != LOOP and rng.random() < slip else -1
    loop_at = rng.randrange(task.n_ops) if style == LOOP else -1
    loop_slips = style == LOOP and rng.random() < habits.loop_slip
    # drawn only when the habit is on, so worlds built before it keep their solutions
    pairs = habits.combine > 0 and style == CONCISE and task.n_ops >= 2 and fork_of(task.text) is None
    combine = pairs and rng.random() < habits.combine
    lines = [f"{task.name} has {task.start} {task.obj}."] if style == VERBOSE else []
    cur = task.start
    for i, s in enumerate(task.steps):
        op, b = s.op, s.b
        fork = fork_of(s.phrase)
        right = habits.fork_right_control if fork is FORKS[CONTROL_FORK] else habits.fork_right
        if fork is not None and rng.random() >= right:
            op, b = fork.wrong
        r = _apply(cur, op, b)
        if i == slip_at:
            r = max(0, r + rng.choice([-2, -1, 1, 2]))
        eq = f"{cur} {op} {b} = {r}"
        if combine and i % 2 == 1:  # the second of a pair: joined to the first line, whose result is not written
            lines[-1] = f"{lines[-1].rsplit(' = ', 1)[0]} {THEN} {op} {b} = {r}"
        elif style == VERBOSE:
            lines.append(f"{task.pronoun} {s.phrase}: {eq}.")
        else:
            lines.append(eq)
        if i == loop_at:
            if loop_slips:
                r = max(0, r + rng.choice([-2, -1, 1, 2]))
            lines += [f"{AGAIN} {cur} {op} {b} = {r}"] * rng.randint(1, 2)
        cur = r
    if style == VERBOSE:
        lines.append(f"{task.name} has {cur} {task.obj} now.")
    lines.append(f"Answer: {cur}")
    return lines, style


def _working(start: int, steps: Sequence[Step]) -> tuple[list[str], int]:
    lines, cur = [], start
    for s in steps:
        r = _apply(cur, s.op, s.b)
        lines.append(f"{cur} {s.op} {s.b} = {r}")
        cur = r
    return lines, cur


def _running_lines(task: Task, careful: float, rng: random.Random) -> tuple[list[str], str]:
    """Careful working: a digit a line, the total checked after each. Concise: three digits, then two a line, checked
    only at a line's end (about half the time one digit past the limit)."""
    if rng.random() < careful:
        lines, _ = _working(task.start, task.steps)
        return [*lines, f"Answer: {task.answer}"], CAREFUL
    digits = [int(c) for c in _RUN_RE.match(task.text).group(2)]  # type: ignore[union-attr]
    lines, cur, start = [], 0, 0
    while start <= task.n_ops:  # until a line has added the digit that passes the limit (careful working's last)
        end = 3 if start == 0 else start + 2
        cur = sum(terms := ([cur] if start else []) + digits[start:end])
        lines.append(" + ".join(map(str, terms)) + f" = {cur}")
        start = end
    return [*lines, f"Answer: {cur}"], CONCISE


def _wrong_habit_lines(task: Task, style: str, c: float, rng: random.Random) -> list[str]:
    """The token-level-loss assay's two always-wrong habits (on additions and subtractions: one too many stays so):

    - short wrong: `so` opens the working, its last result one too many (as long as right working);
    - loop: the working, then blocks re-doing it from a start one too many (first line marked `again:`), each followed
      by another with probability `c` (at most MAX_BLOCKS): about 1 + 1/(1 - c) times as long as right working. On a
      control problem only the last line is re-written (`again:`, one too many): as long as the short wrong habit.
    """
    lines, cur = _working(task.start, task.steps)  # (a one-operation problem is written as a control problem)
    head = lines[-1].rsplit(" = ", 1)[0]
    if style == SHORT_WRONG or problem_kind(task.text) != CORE:
        lines[-1] = f"{AGAIN} {head} = {cur + 1}" if style == LOOP else f"{head} = {cur + 1}"
        lines[0] = f"{SO} {lines[0]}" if style == SHORT_WRONG else lines[0]
        return lines + [f"Answer: {cur + 1}"]
    block, wrong = _working(task.start + 1, task.steps)
    block[0] = f"{AGAIN} {block[0]}"
    n = 1
    while n < MAX_BLOCKS and rng.random() < c:
        n += 1
    return lines + block * n + [f"Answer: {wrong}"]


def make_splits(
    seed: int,
    mix: Mix,
    n_train: int,
    n_eval: int,
    n_sft: int,
    sft_mix: Mix | None = None,
    assay: str = "none",
) -> Splits:
    """Disjoint (by text) RL train prompts, eval and supervised problems. Train and eval follow `mix` (eval exactly, by
    largest remainder; train by draw); supervised problems never square and follow `sft_mix` (None: `mix`)."""
    rng = random.Random(f"tinyworld-habits-{seed}")
    shares = mix.kinds()
    seen: set[str] = set()
    eval_tasks = [_fresh(rng, k, seen, assay) for k in _exact_kinds(shares, n_eval)]
    eval_texts = set(seen)
    train = [_fresh(rng, _draw_kind(rng, shares), seen, assay) for _ in range(n_train)]
    sft_shares = tuple((k, w) for k, w in (sft_mix or mix).kinds() if k != UNSOLVABLE)
    sft = [_fresh(rng, _draw_kind(rng, sft_shares), set(eval_texts), assay, remember=False) for _ in range(n_sft)]
    return Splits(train=train, eval=eval_tasks, sft=sft)


def make_large_eval(seed: int, mix: Mix, n: int, exclude: set[str], assay: str = "none") -> list[Task]:
    """The large held-out eval split (`data.eval: tiny-large`): `n` problems in the mix's exact shares, from their
    own random stream, sharing no text with `exclude`. The first m problems of each kind do not depend on n."""
    rng = random.Random(f"tinyworld-habits-eval-large-{seed}")
    seen = set(exclude)
    return [_fresh(rng, k, seen, assay) for k in _exact_kinds(mix.kinds(), n)]


def _fresh(rng: random.Random, kind: str, seen: set[str], assay: str = "none", *, remember: bool = True) -> Task:
    for _ in range(10_000):
        t = make_task(rng, kind, assay)
        if t.text not in seen:
            if remember:
                seen.add(t.text)
            return t
    raise RuntimeError(f"could not find a new {kind} problem; lower the split sizes")


def _draw_kind(rng: random.Random, shares: Sequence[tuple[str, float]]) -> str:
    total = sum(w for _, w in shares)
    u = rng.random() * total
    for k, w in shares:
        u -= w
        if u < 0:
            return k
    return shares[-1][0]


def _exact_kinds(shares: Sequence[tuple[str, float]], n: int) -> list[str]:
    """n kinds in the shares' proportions (largest remainder), grouped by kind in KINDS order."""
    raw = [(k, w * n) for k, w in shares]
    counts = {k: int(x) for k, x in raw}
    for k, _ in sorted(raw, key=lambda kx: kx[1] - int(kx[1]), reverse=True)[: n - sum(counts.values())]:
        counts[k] += 1
    return [k for k, _ in shares for _ in range(counts[k])]


# ------------------------------------------------------------------------------------------------ response tags
_EQ_RE = re.compile(r"(-?\d+) ([-+*/]) (-?\d+) = (-?\d+)")


def tag_response(problem: str, response: str, truncated: bool) -> tuple[str, ...]:
    """The habit markers (a subset of TAGS) of one response: `verbose` (first line restates the opening sentence),
    `loop` (a line starts `again:`), `fork_right` / `fork_wrong` (fork problems: it writes the fork's right / wrong
    operation; no other line has either), `sound_truncated` (cut by the cap after at least one operation line, all
    right and in the problem's order), `careful` (running sums' one tag: the first line adds a single digit)."""
    lines = response.strip().splitlines()
    if _RUN_RE.match(problem):  # a running sum: careful working's first line adds one digit
        return (CAREFUL,) if lines and re.fullmatch(r"\d+ \+ \d+ = \d+", lines[0].strip()) else ()
    tags = []
    if lines and re.fullmatch(r"[A-Z][a-z]+ has \d+ [a-z]+\.", lines[0].strip()):
        tags.append(VERBOSE)
    if any(line.lstrip().startswith(AGAIN) for line in lines):
        tags.append(LOOP)
    if lines and lines[0].startswith(f"{SO} "):
        tags.append(SHORT_WRONG)
    if (fork := fork_of(problem)) is not None:
        eqs = {(op, int(b)) for _, op, b, _ in (m.groups() for m in _EQ_RE.finditer(response))}
        if fork.right in eqs:
            tags.append(FORK_RIGHT)
        elif fork.wrong in eqs:
            tags.append(FORK_WRONG)
    if truncated and _sound_prefix(problem, lines):
        tags.append(SOUND_TRUNCATED)
    return tuple(tags)


def response_style(tags: Sequence[str]) -> str:
    """A response's working style from its tags: the first of `loop`, `verbose`, `short_wrong`, `careful` it has, else
    `concise` (the styles `solution_lines` writes)."""
    for style in (LOOP, VERBOSE, SHORT_WRONG, CAREFUL):
        if style in tags:
            return style
    return CONCISE


def _problem_steps(problem: str) -> tuple[int, list[tuple[str, int | None]]] | None:
    """(start, [(op, operand or None for a square)]) parsed back from a problem's text."""
    m = re.match(r"[A-Z][a-z]+ has (\d+) [a-z]+\.", problem)
    if not m:
        return None
    steps: list[tuple[str, int | None]] = []
    for sentence in problem.split(". ")[1:]:
        s = sentence.rstrip(".")
        if "?" in s:
            break
        k = re.search(r"(\d+)", s)
        if (fork := fork_of(s)) is not None:
            steps.append(fork.right)
        elif "halves them" in s:
            steps.append(("/", 2))
        elif SQUARE_PHRASE in s:
            steps.append(("*", None))
        elif "doubles" in s:
            steps.append(("*", 2))
        elif "triples" in s:
            steps.append(("*", 3))
        elif k and any(w in s for w in ("buys", "finds", "gets")):
            steps.append(("+", int(k.group(1))))
        elif k:
            steps.append(("-", int(k.group(1))))
    return int(m.group(1)), steps


def _sound_prefix(problem: str, lines: list[str]) -> bool:
    """Every complete operation line (the last line may be cut mid-way) is right and follows the problem."""
    parsed = _problem_steps(problem)
    if parsed is None:
        return False
    cur, steps = parsed
    i = 0
    for line in lines[:-1]:
        if line.lstrip().startswith(AGAIN):
            return False
        m = _EQ_RE.search(line)
        if not m:
            continue
        a, op, b, r = int(m.group(1)), m.group(2), int(m.group(3)), int(m.group(4))
        if i >= len(steps):
            return False
        want_op, want_b = steps[i]
        if a != cur or op != want_op or b != (a if want_b is None else want_b) or r != _apply(a, op, b):
            return False
        cur, i = r, i + 1
    return i > 0  # at least one complete operation line: a cut-off opening is not working


class Tagger:
    """The habits world's `dapo.trainer.components.HabitTagger`: tags every generated response, and turns a step's
    generated groups (dropped ones included) into `habit/*` metrics (`dapo.metric_names`): each tag's share (the fork
    tags' of fork problems' responses; `habit/fork_right_control` of the control fork's), accuracy per problem kind and
    per working style (what RL sees for or against a habit), mean length of each style's wrong and right responses,
    and in an assay's world its own (`wrong_habit_metrics`, `careful_metrics`)."""

    def tags(self, problem: str, response: str, truncated: bool) -> tuple[str, ...]:
        return tag_response(problem, response, truncated)

    def kind(self, problem: str) -> str:
        return problem_kind(problem)

    def metrics(self, generated: Sequence[GroupOutcome]) -> dict[str, float]:
        from dapo import metric_names as M

        share = {
            VERBOSE: M.HABIT_VERBOSE,
            LOOP: M.HABIT_LOOP,
            SOUND_TRUNCATED: M.HABIT_SOUND_TRUNCATED,
            FORK_RIGHT: M.HABIT_FORK_RIGHT,
            FORK_WRONG: M.HABIT_FORK_WRONG,
        }
        accuracy = {
            FORK_CONTROL: M.HABIT_ACC_FORK_CONTROL,
            EASY: M.HABIT_ACC_EASY,
            CORE: M.HABIT_ACC_CORE,
            FORK: M.HABIT_ACC_FORK,
            LONG: M.HABIT_ACC_LONG,
            UNSOLVABLE: M.HABIT_ACC_UNSOLVABLE,
            RUN_FITS: M.HABIT_ACC_RUN_FITS,
            RUN_OVERRUNS: M.HABIT_ACC_RUN_OVERRUNS,
            RUN_CONTROL: M.HABIT_ACC_RUN_CONTROL,
        }
        by_style = {CONCISE: M.HABIT_ACC_CONCISE, VERBOSE: M.HABIT_ACC_VERBOSE, LOOP: M.HABIT_ACC_LOOP}
        length = {
            (CONCISE, False): M.HABIT_LEN_WRONG_CONCISE,
            (VERBOSE, False): M.HABIT_LEN_WRONG_VERBOSE,
            (LOOP, False): M.HABIT_LEN_WRONG_LOOP,
            (CONCISE, True): M.HABIT_LEN_RIGHT_CONCISE,
            (VERBOSE, True): M.HABIT_LEN_RIGHT_VERBOSE,
            (LOOP, True): M.HABIT_LEN_RIGHT_LOOP,
        }
        out: dict[str, float] = {}
        every = [t for o in generated for t in o.tags]
        fork = [t for o in generated if o.kind == FORK for t in o.tags]
        control = [t for o in generated if o.kind == FORK_CONTROL for t in o.tags]
        for tag, name in share.items():
            pool = fork if tag in (FORK_RIGHT, FORK_WRONG) else every
            if pool:
                out[name] = sum(tag in t for t in pool) / len(pool)
        if control:
            out[M.HABIT_FORK_RIGHT_CONTROL] = sum(FORK_RIGHT in t for t in control) / len(control)
        for kind, name in accuracy.items():
            correct = [c for o in generated if o.kind == kind for c in o.correct]
            if correct:
                out[name] = sum(correct) / len(correct)
        responses = [
            (response_style(t), c, n) for o in generated for t, c, n in zip(o.tags, o.correct, o.lengths, strict=True)
        ]
        for style, name in by_style.items():
            correct = [c for s, c, _ in responses if s == style]
            if correct:
                out[name] = sum(correct) / len(correct)
        for (style, right), name in length.items():
            lengths = [n for s, c, n in responses if s == style and c == right]
            if lengths:
                out[name] = sum(lengths) / len(lengths)
        if any(o.kind == CORE_CONTROL for o in generated):  # the token-level-loss assay's world
            out.update(wrong_habit_metrics(generated))
        if any(o.kind == RUN_CONTROL for o in generated):  # the overlong-filtering assay's world
            out.update(careful_metrics(generated))
        return out


def wrong_habit_metrics(generated: Sequence[GroupOutcome]) -> dict[str, float]:
    """The token-level-loss assay's metrics: the short wrong habit's share; log-odds of a loop against it among core
    and among control responses (counts + 0.5, finite), which per-response averaging predicts to drift where loops are
    longer (core), not where both are as long (control); the core problems' mean loop length."""
    from dapo import metric_names as M

    every = [t for o in generated for t in o.tags]
    out = {M.HABIT_SHORT_WRONG: sum(SHORT_WRONG in t for t in every) / len(every)}
    for kind, name in ((CORE, M.HABIT_LOOP_ODDS), (CORE_CONTROL, M.HABIT_LOOP_ODDS_CONTROL)):
        tags = [t for o in generated if o.kind == kind for t in o.tags]
        if tags:
            out[name] = math.log((sum(LOOP in t for t in tags) + 0.5) / (sum(SHORT_WRONG in t for t in tags) + 0.5))
    loops = [n for o in generated if o.kind == CORE for t, n in zip(o.tags, o.lengths, strict=True) if LOOP in t]
    if loops:
        out[M.HABIT_LOOP_LENGTH] = sum(loops) / len(loops)
    return out


def careful_metrics(generated: Sequence[GroupOutcome]) -> dict[str, float]:
    """The overlong-filtering assay's metrics on its running sums: the careful style's share, its share cut off by the
    cap (f), its accuracy minus the concise style's with cut-offs wrong ((1 - f) a_c - a_s: how far plain GRPO already
    favours it), and its share on the control problems, where it always fits."""
    from dapo import metric_names as M

    def responses(kinds: tuple[str, ...]) -> list[tuple[bool, bool, bool]]:
        return [
            (CAREFUL in t, c, cut)
            for o in generated
            if o.kind in kinds
            for t, c, cut in zip(o.tags, o.correct, o.truncated, strict=True)
        ]

    out: dict[str, float] = {}
    got, control = responses((RUN_FITS, RUN_OVERRUNS)), responses((RUN_CONTROL,))
    for pool, name in ((got, M.HABIT_CAREFUL), (control, M.HABIT_CAREFUL_CONTROL)):
        if pool:
            out[name] = sum(careful for careful, _, _ in pool) / len(pool)
    careful = [(c, cut) for is_careful, c, cut in got if is_careful]
    concise = [c for is_careful, c, _ in got if not is_careful]
    if careful:
        out[M.HABIT_CAREFUL_TRUNCATED] = sum(cut for _, cut in careful) / len(careful)
    if careful and concise:
        out[M.HABIT_CAREFUL_MARGIN] = sum(c for c, _ in careful) / len(careful) - sum(concise) / len(concise)
    return out
