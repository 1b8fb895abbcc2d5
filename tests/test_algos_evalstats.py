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


# ---------------------------------------------------------------------- intervals over problems and seeds
# Fixed inputs, numbers worked by hand (percent). Rows are seeds, columns problems.
B = np.array([[60.0, 40.0, 20.0], [80.0, 60.0, 40.0]])  # seed 1 is 20 points better on every problem
A = np.array([[50.0, 50.0, 10.0], [50.0, 50.0, 10.0]])  # two identical seeds


def test_seed_variance_is_the_two_way_anova_component():
    from dapo.algos.evalstats import seed_variance

    # B: seed means 40, 60 -> MS_seeds = P * var = 3 * 200 = 600; residuals all 0 -> MS_res = 0; (600 - 0) / 3
    assert seed_variance(B) == pytest.approx(200.0)
    assert seed_variance(A) == 0.0
    # residuals (+-8.33, +-3.33, -+11.67) give MS_res = 433.33 / 2 = 216.67 > MS_seeds = 16.67: clamped at 0
    assert seed_variance(np.array([[100.0, 50.0, 0.0], [80.0, 40.0, 20.0]])) == 0.0
    with pytest.raises(ValueError, match="2 seeds"):
        seed_variance(B[:1])


def test_row_interval_adds_problems_and_seeds_with_satterthwaite_df():
    from scipy import stats

    from dapo.algos.evalstats import contrast_interval

    iv = contrast_interval([B], [1.0])
    # problems: problem means 70, 50, 30 -> var 400 -> 400 / 3; seeds: 200 / 2 seeds = 100
    assert iv.estimate == pytest.approx(50.0)
    assert iv.parts == pytest.approx({"problems": 400 / 3, "seeds": 100.0})
    var = 400 / 3 + 100
    df = var**2 / ((400 / 3) ** 2 / 2 + 100**2 / 1)  # 2.882
    assert iv.df == pytest.approx(df) and iv.df == pytest.approx(2.8824, abs=1e-4)
    half = stats.t.ppf(0.975, df) * math.sqrt(var)
    assert (iv.low, iv.high) == pytest.approx((50 - half, 50 + half))
    assert iv.method == "problems x seeds"


def test_difference_is_paired_on_problems():
    from scipy import stats

    from dapo.algos.evalstats import contrast_interval

    iv = contrast_interval([B, A], [1.0, -1.0])
    # per-problem differences of seed means: 70-50, 50-50, 30-10 = 20, 0, 20 -> var 133.33 -> / 3 = 44.44
    # seeds: B 200 / 2 = 100, A 0
    assert iv.estimate == pytest.approx(50.0 - 110.0 / 3)
    assert iv.parts == pytest.approx({"problems": 400 / 9, "seeds": 100.0})
    var = 400 / 9 + 100
    df = var**2 / ((400 / 9) ** 2 / 2 + 100**2 / 1)  # 1.899
    half = stats.t.ppf(0.975, df) * math.sqrt(var)
    assert (iv.low, iv.high) == pytest.approx((iv.estimate - half, iv.estimate + half))
    # a problem hard for both rows cancels: adding 30 points to one problem in both leaves the interval alone
    shifted = contrast_interval([B + [0, 0, 30], A + [0, 0, 30]], [1.0, -1.0])
    assert (shifted.low, shifted.high) == pytest.approx((iv.low, iv.high))


def test_one_seed_interval_covers_problems_only():
    from scipy import stats

    from dapo.algos.evalstats import contrast_interval

    iv = contrast_interval([B[:1]], [1.0])  # 60, 40, 20: var 400 / 3 problems, df 2
    half = stats.t.ppf(0.975, 2) * math.sqrt(400 / 3)
    assert iv.method == "problems only (1 seed)" and iv.parts == pytest.approx({"problems": 400 / 3})
    assert (iv.low, iv.high) == pytest.approx((40 - half, 40 + half))
    with pytest.raises(ValueError, match="same P"):
        contrast_interval([B, A[:, :2]], [1.0, -1.0])


def test_welch_and_seed_t_intervals():
    from scipy import stats

    from dapo.algos.evalstats import seed_mean_interval, welch_interval

    iv = welch_interval([45.0, 48.0], [40.0, 37.0])
    # each side: s^2 = 4.5, / 2 seeds = 2.25; se^2 = 4.5; df = 4.5^2 / (2.25^2 + 2.25^2) = 2
    half = stats.t.ppf(0.975, 2) * math.sqrt(4.5)
    assert iv.estimate == 8.0 and iv.df == pytest.approx(2.0)
    assert (iv.low, iv.high) == pytest.approx((8 - half, 8 + half)) and not iv.excludes_zero()
    assert welch_interval([1.0], [0.0, 2.0]).low is None  # one seed: no interval
    one = seed_mean_interval([20.0, 24.0])  # mean 22, s 2.83, t(1) 12.706: 22 -+ 25.41
    assert (one.low, one.high) == pytest.approx((22 - 12.706204736174705 * 2, 22 + 12.706204736174705 * 2))
    equal = welch_interval([0.3, 0.3], [0.0, 0.0])  # no spread: a zero-width interval that excludes 0
    assert (equal.low, equal.high) == (0.3, 0.3) and equal.excludes_zero()
