"""The tiny world's task family: reproducible per seed, disjoint splits, correct answers, the DAPO answer format."""

from __future__ import annotations

import random
import re
from collections import Counter

from dapo.tinyworld.tasks import (
    CONNECTIVES,
    Step,
    Task,
    final_integer_answer,
    is_correct,
    make_splits,
    solution_lines,
    solution_text,
)

MIA = Task(
    "Mia",
    "She",
    "apples",
    7,
    (Step("+", 12, "buys 12 more"), Step("-", 5, "gives away 5"), Step("*", 2, "doubles them")),
    "Mia has 7 apples. She buys 12 more. She gives away 5. She doubles them. How many apples does Mia have now?",
    28,
)

_VERBS = [
    (r"(?:buys|finds|gets) (\d+) more", lambda a, k: a + k),
    (r"(?:gives away|loses|sells) (\d+)", lambda a, k: a - k),
    (r"doubles them", lambda a, k: a * 2),
    (r"triples them", lambda a, k: a * 3),
    (r"halves them", lambda a, k: a // 2),
]


def _solve_from_text(text: str) -> int:
    """An independent reading of the problem sentence by sentence (not the generator's own numbers)."""
    sentences = text.split(". ")
    value = int(re.search(r"has (\d+)", sentences[0]).group(1))
    for s in sentences[1:-1]:
        for pattern, fn in _VERBS:
            m = re.search(pattern, s)
            if m:
                value = fn(value, int(m.group(1)) if m.groups() else 0)
                break
        else:
            raise AssertionError(f"unknown sentence {s!r}")
    return value


def test_hand_worked_example_in_every_style():
    assert solution_text(MIA) == "7 + 12 = 19\n19 - 5 = 14\n14 * 2 = 28\nAnswer: 28"
    assert solution_text(MIA, verbose=True) == (
        "Mia has 7 apples.\nShe buys 12 more: 7 + 12 = 19.\n"
        "She gives away 5: 19 - 5 = 14.\nShe doubles them: 14 * 2 = 28.\n"
        "Mia has 28 apples now.\nAnswer: 28"
    )
    # a guess has no working and the true answer, whatever the other flags say
    assert solution_text(MIA, guess=True) == solution_text(MIA, guess=True, corrupt=True, verbose=True) == "Answer: 28"
    assert _solve_from_text(MIA.text) == 28


def test_connectives_open_some_lines_and_change_nothing_else():
    plain = solution_text(MIA).splitlines()
    seen = set()
    for seed in range(40):
        lines = solution_text(MIA, connectives=0.75, rng=random.Random(seed)).splitlines()
        assert lines[-1] == "Answer: 28" and len(lines) == len(plain)
        for got, want in zip(lines[:-1], plain[:-1], strict=True):
            word, _, rest = got.partition(" ")
            if got != want:  # an opening word, then the very same equation
                assert word.lower() in CONNECTIVES and rest == want
                seen.add(word)
    assert seen == {w.capitalize() for w in CONNECTIVES}
    # 0 draws nothing from the generator: the worlds built before the option are reproduced bit for bit
    rng = random.Random(5)
    solution_text(MIA, corrupt=True, rng=rng)
    after_plain = rng.random()
    rng = random.Random(5)
    solution_text(MIA, corrupt=True, connectives=0.0, rng=rng)
    assert rng.random() == after_plain


def test_world_hash_ignores_connectives_at_zero_only():
    from dapo.config import TinyWorldConfig
    from dapo.tinyworld.build import world_hash

    base = TinyWorldConfig()
    assert world_hash(base) == world_hash(TinyWorldConfig(sft_connectives=0.0))
    assert world_hash(TinyWorldConfig(sft_connectives=0.75)) != world_hash(base)


def test_same_seed_same_tasks_other_seed_other_tasks():
    a, b, c = (make_splits(s, 4, 200, 30, 300) for s in (3, 3, 4))
    for split in ("train", "eval", "sft"):
        assert [(t.text, t.answer) for t in getattr(a, split)] == [(t.text, t.answer) for t in getattr(b, split)]
    assert [t.text for t in a.train] != [t.text for t in c.train]


def test_splits_do_not_overlap_and_eval_is_balanced_over_difficulty():
    s = make_splits(0, 4, 2000, 30, 3000)
    train, ev, sft = ({t.text for t in x} for x in (s.train, s.eval, s.sft))
    assert len(train) == 2000 and len(ev) == 30  # no repeats inside a split
    assert not train & ev and not sft & ev
    assert Counter(t.n_ops for t in s.eval) == {1: 8, 2: 8, 3: 7, 4: 7}
    assert set(Counter(t.n_ops for t in s.train)) == {1, 2, 3, 4}
    assert Counter(t.n_ops for t in make_splits(0, 2, 10, 5, 10).eval) == {1: 3, 2: 2}


def test_answers_follow_from_the_text_and_clean_solutions_are_right_line_by_line():
    rng = random.Random(0)
    for t in make_splits(1, 4, 300, 30, 0).train:
        assert t.answer == _solve_from_text(t.text) >= 0
        lines, final = solution_lines(t, verbose=False, corrupt=False, rng=rng)
        assert final == t.answer and lines[-1] == f"Answer: {t.answer}" and len(lines) == t.n_ops + 1
        prev = t.start
        for line in lines[:-1]:
            a, op, b, r = re.fullmatch(r"(\d+) ([-+*/]) (\d+) = (\d+)", line).groups()
            assert (
                int(a) == prev
                and int(r)
                == {"+": int(a) + int(b), "-": int(a) - int(b), "*": int(a) * int(b), "/": int(a) // int(b)}[op]
            )
            prev = int(r)


def test_corrupted_solutions_keep_the_format_and_are_mostly_wrong():
    rng = random.Random(0)
    tasks = make_splits(2, 4, 500, 30, 0).train
    wrong = 0
    for t in tasks:
        lines, final = solution_lines(t, verbose=False, corrupt=True, rng=rng)
        assert lines[-1] == f"Answer: {final}" and len(lines) == t.n_ops + 1  # may go negative: it is an error
        wrong += final != t.answer
    assert wrong / len(tasks) > 0.9  # a later halving can occasionally absorb an off-by-one


def test_answer_extraction_reads_the_last_answer_line():
    assert final_integer_answer("7 + 12 = 19\nAnswer: 19") == "19"
    assert final_integer_answer("Answer: 5\nAnswer: 6\n") == "6"
    assert final_integer_answer("Answer: 007") == "7"
    assert final_integer_answer("Answer: 5 apples") is None and final_integer_answer("19") is None
    assert is_correct("x\nAnswer: 28", "28") and not is_correct("Answer: 27", 28)


def test_the_worlds_strict_check_agrees_with_the_rewards_on_its_own_format():
    """`is_correct` (measuring the base model while building) and the trainer's reward see the same answers."""
    from dapo.rewards import score_responses

    rng = random.Random(3)
    tasks = make_splits(5, 4, 200, 30, 0).train
    texts = [
        solution_text(t, verbose=rng.random() < 0.3, corrupt=rng.random() < 0.3, guess=rng.random() < 0.3, rng=rng)
        for t in tasks
    ]
    answers = [str(t.answer) for t in tasks]
    scores = score_responses(texts, answers, workers=0)
    assert [s.correct for s in scores] == [is_correct(x, a) for x, a in zip(texts, answers, strict=True)]
    assert 0 < sum(s.correct for s in scores) < len(scores)  # both outcomes occur


def test_large_eval_split_is_held_out_balanced_and_stable_in_n():
    from dapo.tinyworld.tasks import make_large_eval

    s = make_splits(0, 4, 2000, 30, 3000)
    seen = {t.text for t in s.train + s.eval + s.sft}
    big = make_large_eval(0, 4, 640, seen)
    texts = [t.text for t in big]
    assert len(set(texts)) == 640 and not set(texts) & seen  # never trained on, never in the AIME-sized split
    assert Counter(t.n_ops for t in big) == {1: 160, 2: 160, 3: 160, 4: 160}
    assert [t.n_ops for t in big] == sorted(t.n_ops for t in big)
    # the first m problems drawn do not depend on n: a smaller split is a subset of a larger one
    assert {t.text for t in make_large_eval(0, 4, 100, seen)} <= set(texts)
    assert {t.text for t in make_large_eval(1, 4, 100, seen)} != {t.text for t in make_large_eval(0, 4, 100, seen)}
