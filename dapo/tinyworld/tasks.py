"""The tiny world's task family: multi-step arithmetic word problems with integer answers.

A problem starts a person with some objects and applies 1..`difficulty` operations (buy, give away, double, triple,
halve), one short sentence each; its worked solution is one `a op b = r` line per step, then `Answer: N`. The
supervised phase's styles (concise, verbose, a bare guess; at top_p 0.7 the base model's concise answers were 47%
right, its guesses 8%) and slips: docs/tiny-preset.md, "The tiny worlds, in full". Pure functions of a `random.Random`.
"""

from __future__ import annotations

import random
import re
from dataclasses import dataclass

NAMES = [
    ("Mia", "She"),
    ("Tom", "He"),
    ("Ava", "She"),
    ("Leo", "He"),
    ("Zoe", "She"),
    ("Max", "He"),
    ("Amy", "She"),
    ("Sam", "He"),
    ("Eva", "She"),
    ("Ben", "He"),
    ("Ivy", "She"),
    ("Dan", "He"),
]
OBJECTS = [
    "apples",
    "pens",
    "coins",
    "books",
    "cards",
    "shells",
    "stamps",
    "marbles",
    "cookies",
    "beads",
    "toys",
    "rocks",
    "eggs",
    "cups",
    "keys",
    "balls",
]

# op -> (symbol, phrasings). `{k}` is the operand; multiplications and the halving carry their operand in the verb.
_ADD = ("+", ["buys {k} more", "finds {k} more", "gets {k} more"])
_SUB = ("-", ["gives away {k}", "loses {k}", "sells {k}"])
_MUL = {2: "doubles them", 3: "triples them"}
_DIV = {2: "halves them"}

# Small numbers keep most lines one- or two-digit arithmetic that a 1M-parameter model learns in minutes (with
# operands up to 20 a 600-step build reached only ~6% avg@16).
START_MAX = 15
ADD_MAX = 9
MUL_MAX_INPUT = 15

# Free phrasing (`tiny.sft_connectives`, off by default): a worked line may open with a connective word. The choice
# never changes the answer, so the base model samples it at ~1/4 each (none, so, then, now): uncertain,
# reward-neutral tokens, as real reasoning text has. Tried as a way to make the upper clip bind (only a token with
# old probability below 1 / (1 + eps_high) can be upper-clipped); it raised entropy 0.25 -> 0.36 but not the
# clip fraction (docs/tiny-preset.md), so the default world has none.
CONNECTIVES = ("so", "then", "now")

_ANSWER_RE = re.compile(r"^\s*Answer:\s*(-?\d+)\s*$")


@dataclass(frozen=True)
class Step:
    """One operation: `a op b = r` with the true values."""

    op: str  # "+", "-", "*", "/"
    b: int
    phrase: str  # the verb phrase of the sentence ("buys 12 more")


@dataclass(frozen=True)
class Task:
    """A generated problem. `text` is the raw problem (no template); `answer` the true integer."""

    name: str
    pronoun: str
    obj: str
    start: int
    steps: tuple[Step, ...]
    text: str
    answer: int

    @property
    def n_ops(self) -> int:
        return len(self.steps)


def _apply(a: int, op: str, b: int) -> int:
    if op == "+":
        return a + b
    if op == "-":
        return a - b
    if op == "*":
        return a * b
    return a // b


def make_task(rng: random.Random, n_ops: int) -> Task:
    """A random problem with exactly `n_ops` operations; every intermediate value stays a positive integer."""
    name, pronoun = rng.choice(NAMES)
    obj = rng.choice(OBJECTS)
    start = rng.randint(2, START_MAX)
    cur, steps = start, []
    for _ in range(n_ops):
        kinds = ["+", "+", "-", "-"]
        if cur <= MUL_MAX_INPUT:
            kinds.append("*")
        if cur % 2 == 0 and cur >= 4:
            kinds.append("/")
        op = rng.choice(kinds)
        if op == "+":
            b = rng.randint(1, ADD_MAX)
            phrase = rng.choice(_ADD[1]).format(k=b)
        elif op == "-" and cur > 1:
            b = rng.randint(1, min(ADD_MAX, cur - 1))
            phrase = rng.choice(_SUB[1]).format(k=b)
        elif op == "*":
            b = rng.choice([k for k in _MUL if cur * k <= 3 * MUL_MAX_INPUT])
            phrase = _MUL[b]
        elif op == "/":
            b, phrase = 2, _DIV[2]
        else:  # "-" with nothing to give away: buy instead
            op, b = "+", rng.randint(1, ADD_MAX)
            phrase = rng.choice(_ADD[1]).format(k=b)
        steps.append(Step(op, b, phrase))
        cur = _apply(cur, op, b)
    sentences = [f"{name} has {start} {obj}."] + [f"{pronoun} {s.phrase}." for s in steps]
    text = " ".join(sentences + [f"How many {obj} does {name} have now?"])
    return Task(name, pronoun, obj, start, tuple(steps), text, cur)


def solution_lines(
    task: Task, *, verbose: bool, corrupt: bool, rng: random.Random, guess: bool = False, connectives: float = 0.0
) -> tuple[list[str], int]:
    """Worked solution lines ending in `Answer: N`, and N (the true answer unless `corrupt`).

    A corrupted solution gets one error at a random step: a wrong result (off by 1-3) or a miscopied operand;
    later steps compute correctly from the wrong value, so the chain is coherent but the answer wrong.
    A `guess` is the bare `Answer: N` with the true N and no working: a writer who did it in their head. A small
    model imitating it must produce a multi-step result in one token, and mostly cannot.
    `connectives`: the probability that a worked line opens with one of `CONNECTIVES` (uniform), e.g. `So 7 + 3 =
    10` or, verbose, `She buys 3 more: then 7 + 3 = 10.`
    """
    if guess:
        return [f"Answer: {task.answer}"], task.answer
    bad_step = rng.randrange(task.n_ops) if corrupt else -1
    bad_kind = rng.choice(["result", "operand"]) if corrupt else ""
    lines = [f"{task.name} has {task.start} {task.obj}."] if verbose else []
    cur = task.start
    for i, s in enumerate(task.steps):
        b = s.b
        if i == bad_step and bad_kind == "operand" and s.op in "+-":
            b = max(1, b + rng.choice([-2, -1, 1, 2]))
            if s.op == "-":
                b = min(b, cur)  # never a negative count
            if b == s.b:
                b = s.b + 1 if s.op == "+" or s.b < cur else s.b - 1
        r = _apply(cur, s.op, b)
        if i == bad_step and (bad_kind == "result" or s.op in "*/"):
            r = max(0, r + rng.choice([-3, -2, -1, 1, 2, 3]))
            if r == _apply(cur, s.op, b):
                r += 1
        eq = f"{cur} {s.op} {b} = {r}"
        if connectives > 0 and rng.random() < connectives:
            word = rng.choice(CONNECTIVES)
            eq = f"{word} {eq}" if verbose else f"{word.capitalize()} {eq}"
        lines.append(f"{task.pronoun} {s.phrase}: {eq}." if verbose else eq)
        cur = r
    if verbose:
        lines.append(f"{task.name} has {cur} {task.obj} now.")
    lines.append(f"Answer: {cur}")
    return lines, cur


def solution_text(
    task: Task,
    *,
    verbose: bool = False,
    corrupt: bool = False,
    guess: bool = False,
    connectives: float = 0.0,
    rng: random.Random | None = None,
) -> str:
    """The response text (no EOS): lines joined by newlines."""
    lines, _ = solution_lines(
        task, verbose=verbose, corrupt=corrupt, guess=guess, connectives=connectives, rng=rng or random.Random(0)
    )
    return "\n".join(lines)


def final_integer_answer(response: str) -> str | None:
    """The integer on the last line of the form `Answer: N` (nothing else on the line), or None.

    The tiny world's own strict check, used while building it (`measure.py`: how the base model does). Rewards
    use `dapo.rewards.extract_answer`, which accepts any answer format a model writes and cleans it for a
    verifier; on the solutions of the tiny world's format (`Answer: N` lines) the two agree (a test checks it)."""
    for line in reversed(response.strip().splitlines()[-20:]):
        m = _ANSWER_RE.match(line)
        if m:
            return str(int(m.group(1)))
    return None


def is_correct(response: str, answer: str | int) -> bool:
    got = final_integer_answer(response)
    return got is not None and got == str(int(answer))


@dataclass(frozen=True)
class Splits:
    """Disjoint (by problem text) task lists: RL train prompts, eval problems, supervised examples."""

    train: list[Task]
    eval: list[Task]
    sft: list[Task]


def make_splits(seed: int, difficulty: int, n_train: int, n_eval: int, n_sft: int) -> Splits:
    """Deterministic per seed. Eval is balanced over 1..difficulty operations (counts differ by at most one);
    train and sft draw the number of operations uniformly. No text appears in two splits (sft may repeat
    train texts: it is the base model's pre-training, and RL prompts are the same kind of problem)."""
    rng = random.Random(f"tinyworld-tasks-{seed}")
    seen: set[str] = set()

    def fresh(n_ops: int, exclude: set[str]) -> Task:
        for _ in range(10_000):
            t = make_task(rng, n_ops)
            if t.text not in exclude:
                return t
        raise RuntimeError(f"could not find a new problem with {n_ops} operations; lower the split sizes")

    eval_tasks = []
    for i in range(n_eval):
        t = fresh(1 + i % difficulty, seen)
        seen.add(t.text)
        eval_tasks.append(t)
    eval_tasks.sort(key=lambda t: t.n_ops)
    eval_texts = set(seen)
    train = []
    for _ in range(n_train):
        t = fresh(rng.randint(1, difficulty), seen)
        seen.add(t.text)
        train.append(t)
    sft = [fresh(rng.randint(1, difficulty), eval_texts) for _ in range(n_sft)]
    return Splits(train=train, eval=eval_tasks, sft=sft)


def make_large_eval(seed: int, difficulty: int, n: int, exclude: set[str]) -> list[Task]:
    """A held-out eval split of `n` problems, balanced over 1..difficulty operations like the AIME-sized split, drawn
    from its own random stream and sharing no text with `exclude` (the world's train, eval and supervised problems).

    Its own stream keeps the world's other splits, and so the base model, independent of `n`: a larger or smaller
    split is a new file made in seconds, not a new world. The first m problems drawn are the same for every n >= m.
    """
    rng = random.Random(f"tinyworld-eval-large-{seed}")
    seen = set(exclude)
    tasks = []
    for i in range(n):
        n_ops = 1 + i % difficulty
        for _ in range(10_000):
            t = make_task(rng, n_ops)
            if t.text not in seen:
                break
        else:
            raise RuntimeError(f"could not find a new problem with {n_ops} operations; lower tiny.n_eval_large")
        seen.add(t.text)
        tasks.append(t)
    return sorted(tasks, key=lambda t: t.n_ops)
