"""Evaluation statistics: avg@n, unbiased pass@k (vs brute force), maj@n, bootstrap CIs."""

from __future__ import annotations

import itertools
import math
from fractions import Fraction

import numpy as np
import pytest

from dapo import metric_names as mn
from dapo.algos.evalstats import bootstrap_ci, eval_summary, majority_correct, pass_at_k


def _brute_pass_at_k(n: int, c: int, k: int) -> float:
    samples = [True] * c + [False] * (n - c)
    subsets = list(itertools.combinations(range(n), k))
    return sum(any(samples[i] for i in s) for s in subsets) / len(subsets)


@pytest.mark.parametrize("n", range(1, 8))
def test_pass_at_k_matches_enumeration(n):
    for c in range(n + 1):
        for k in range(1, n + 1):
            assert pass_at_k(n, c, k) == pytest.approx(_brute_pass_at_k(n, c, k), abs=1e-12)


def test_pass_at_k_large_n_is_stable_and_exact():
    exact = 1 - Fraction(math.comb(150, 32), math.comb(200, 32))
    assert pass_at_k(200, 50, 32) == pytest.approx(float(exact), rel=1e-12)
    assert pass_at_k(1000, 1, 1) == pytest.approx(0.001)
    assert pass_at_k(32, 1, 32) == 1.0 and pass_at_k(32, 0, 32) == 0.0  # pass@n = any correct


def test_pass_at_k_rejects_k_above_n():
    with pytest.raises(ValueError, match="at least k samples"):
        pass_at_k(4, 1, 5)
    with pytest.raises(ValueError):
        pass_at_k(4, 5, 1)


CORRECT = [[1, 0, 0, 1], [1, 1, 1, 1], [0, 0, 0, 0]]
ANSWERS = [["5", "7", "7", "5"], ["3", "3", "3", "3"], [None, None, None, "2"]]


def test_eval_summary_hand_computed():
    out = eval_summary(CORRECT, ANSWERS, pass_k=(1, 2, 4), bootstrap=0)
    assert set(out) == {mn.eval_avg(4), mn.eval_pass(1), mn.eval_pass(2), mn.eval_pass(4), mn.eval_maj(4)}
    assert out[mn.eval_avg(4)] == pytest.approx(50.0)  # 6 of 12 samples
    assert out[mn.eval_pass(1)] == pytest.approx(50.0)  # pass@1 = mean accuracy
    assert out[mn.eval_pass(2)] == pytest.approx(100 * (5 / 6 + 1 + 0) / 3)  # 1 - C(2,2)/C(4,2) = 5/6
    assert out[mn.eval_pass(4)] == pytest.approx(200 / 3)  # any correct: 2 of 3 problems
    # Problem 1: "5" and "7" tie 2-2, "5" was seen first and is correct; problem 3: "2" wins over None, wrong.
    assert out[mn.eval_maj(4)] == pytest.approx(200 / 3)


def test_majority_vote_rules():
    assert majority_correct([False, False, False, True], [None, None, None, "9"]) is True  # None never wins
    assert majority_correct([True, False, False], ["1", "2", "2"]) is False
    assert majority_correct([True, False], ["1", "2"]) is True  # tie: first seen
    assert majority_correct([False, True], ["2", "1"]) is False  # tie, other order: deterministic by order
    assert majority_correct([True, True], [None, None]) is False  # nothing extracted: wrong


def test_bootstrap_ci_is_seeded_and_brackets_the_mean():
    rng = np.random.default_rng(1)
    correct = rng.random((30, 8)) < 0.4
    a = eval_summary(correct, pass_k=(1, 8), bootstrap=500, seed=3)
    b = eval_summary(correct, pass_k=(1, 8), bootstrap=500, seed=3)
    c = eval_summary(correct, pass_k=(1, 8), bootstrap=500, seed=4)
    assert a == b and a != c
    for name in (mn.eval_avg(8), mn.eval_pass(1), mn.eval_pass(8)):
        assert a[mn.ci_low(name)] <= a[name] <= a[mn.ci_high(name)]
    width = a[mn.ci_high(mn.eval_avg(8))] - a[mn.ci_low(mn.eval_avg(8))]
    # 30 problems: the 95% interval of avg@8 spans roughly +-2 standard errors of the per-problem accuracy.
    se = 100 * correct.mean(axis=1).std(ddof=1) / np.sqrt(30)
    assert 2.5 * se < width < 5.5 * se


def test_bootstrap_of_constant_values_collapses():
    assert bootstrap_ci(np.full(10, 40.0), 200, 0.9, seed=0) == (40.0, 40.0)
    with pytest.raises(ValueError, match="confidence"):
        bootstrap_ci(np.ones(3), 10, 1.5, seed=0)


def test_bad_shapes():
    with pytest.raises(ValueError, match=r"\[P, n\]"):
        eval_summary([1, 0, 1])
    with pytest.raises(ValueError, match="answers"):
        eval_summary(CORRECT, [["1"] * 4])
    with pytest.raises(ValueError, match="at least k"):
        eval_summary(CORRECT, pass_k=(5,))
