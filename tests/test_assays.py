"""The assays' declared statistics (dapo/report/assays.py) on runs whose curves are known: time to a level with its
interpolation and censoring, the ratio's two intervals, the verdicts against the registered predictions, and the
workflow's assay target naming the rows the statistics compare."""

import math

import numpy as np
import pytest

from dapo import metric_names as M
from dapo.designs import assay_pairs
from dapo.report import assays as A
from dapo.report.runs import Experiment, RunData, Series

EFFECT = next(s for s in A.ASSAY_STATISTICS if s.role == "effect")
START = next(s for s in A.ASSAY_STATISTICS if s.statistic == "start")
CONTROL = next(s for s in A.ASSAY_STATISTICS if s.role == "control")


def _run(row: str, seed: int, share: np.ndarray, control: np.ndarray | None = None) -> RunData:
    steps = np.arange(1, share.size + 1)
    history = {
        M.HABIT_FORK_RIGHT: Series(steps, share),
        M.GRAD_UPDATES: Series(steps, 16.0 * steps),
        M.ROLLOUT_STEP: Series(steps, steps.astype(float)),
    }
    if control is not None:
        history[M.HABIT_FORK_RIGHT_CONTROL] = Series(steps, control)
    params = {"trainer.train_batch_size": "32", "trainer.mini_batch_size": "2", "tiny.assay": "clip_higher"}
    return RunData(f"id-{row}-{seed}", f"{row}-s{seed}", row, seed, "finished", params, {}, None, None, history)


def _growth(p0: float, g: float, n: int = 30) -> np.ndarray:
    """A share that grows by `g` a step from p0 (capped below 1): a cap-limited rise."""
    return np.minimum(0.95, p0 * g ** np.arange(n))


def test_updates_to_a_level_interpolates_on_the_two_step_average_and_censors_a_run_that_never_gets_there():
    share = np.array([0.02, 0.04, 0.10, 0.30, 0.50])  # 2-step averages: .02 .03 .07 .20 .40
    value, censored = A.run_statistic(EFFECT, _run("01_overlong_filtering", 0, share))
    assert not censored and value == pytest.approx(16 * 4)  # reaches 0.2 exactly at step 4 (update 64)
    share = np.array([0.02, 0.04, 0.10, 0.26, 0.50])  # averages .07 then .18 then .38: crosses 0.2 in step 4-5
    value, _ = A.run_statistic(EFFECT, _run("01_overlong_filtering", 0, share))
    assert value == pytest.approx(16 * (4 + (0.2 - 0.18) / (0.38 - 0.18)))
    value, censored = A.run_statistic(EFFECT, _run("01_overlong_filtering", 0, np.full(10, 0.05)))
    assert censored and value == 160.0  # the run's last update
    assert A.run_statistic(START, _run("01_overlong_filtering", 0, share))[0] == pytest.approx(0.03)


def _experiment(g_without: float, g_with: float, seeds=range(5), control_g=(1.1, 1.1)) -> Experiment:
    runs = []
    for with_row, without_row in assay_pairs("clip_higher"):  # the ladder's pair and the one-at-a-time pair
        for s in seeds:
            jitter = 1 + 0.01 * s
            for row, g, cg in ((without_row, g_without, control_g[0]), (with_row, g_with, control_g[1])):
                runs.append(_run(row, s, _growth(0.02 * jitter, g), _growth(0.3, cg)))
    return Experiment("assay", "sqlite://", 1, runs)


def test_a_cap_limited_speed_up_is_in_the_predicted_range_and_the_control_is_unchanged():
    results = A.assay_results(_experiment(1.2, 1.28))
    effect = next(r for r in results if r.statistic is EFFECT)
    welch, paired = effect.effect(paired=False), effect.effect(paired=True)
    # ln(10)/ln(1.28) over ln(10)/ln(1.2) steps, up to the interpolation and the 2-step average
    assert welch.estimate == pytest.approx(math.log(1.2) / math.log(1.28), abs=0.05)
    assert welch.high < 1 and paired.high < 1 and paired.high - paired.low < welch.high - welch.low
    assert effect.verdict == "below 1; in the predicted range"
    control = next(r for r in results if r.statistic is CONTROL)
    assert control.effect(paired=True).estimate == pytest.approx(1.0)
    starts = next(r for r in results if r.statistic is START)
    assert starts.without_row == "01_overlong_filtering" and starts.verdict == "met"


def test_a_speed_up_beyond_what_any_clip_allows_counts_against_the_mechanism():
    effect = next(r for r in A.assay_results(_experiment(1.2, 1.6)) if r.statistic is EFFECT)
    assert effect.verdict.startswith("beyond the bound")
    same = next(r for r in A.assay_results(_experiment(1.2, 1.2)) if r.statistic is EFFECT)
    assert same.verdict.startswith("not clear of 1") or same.verdict.startswith("above 1")


def test_the_table_hides_effects_in_the_development_mode_and_has_every_statistic_otherwise():
    results = A.assay_results(_experiment(1.2, 1.28))
    full, dev = A.assays_table(results), A.assays_table(results, conditions_only=True)
    assert {row[1] for row in full.cells} == {"condition", "effect", "control"}
    assert {row[1] for row in dev.cells} == {"condition"}
    clip = [s for s in A.ASSAY_STATISTICS if s.assay == "clip_higher"]  # the only assay whose rows ran here
    assert len(full.cells) == 2 * len(clip)  # every statistic on both pairs: 01/02 and 00/grpo_plus_clip_higher
    assert len(dev.cells) == 2 * len([s for s in clip if s.role == "condition"])
    assert {row[3] for row in dev.cells} == {"01_overlong_filtering", "00_naive_grpo"}  # read in the rows without


def test_the_declarations_are_frozen_by_their_digest():
    """Changing a declared statistic after a confirmatory run changes the hypothesis: bump ASSAYS_VERSION and record
    the digest here (docs/evidence.md, section 8, names the same digest)."""
    from pathlib import Path

    digests = {a: A.assays_digest(a) for a in A.WORLDS}
    assert A.ASSAYS_VERSION == 3
    assert digests == {
        "clip_higher": "842d93da10d66756",
        "token_level_loss": "d48e9f64fbf91541",
        "overlong_filtering": "cd27309de76456ea",
    }
    text = (Path(__file__).resolve().parents[1] / "docs" / "evidence.md").read_text()
    assert all(f"`{d}`" in text for d in digests.values())


def test_the_report_loads_every_declared_metric_and_names_one_no_run_logged():
    """The control's metric was once left out of what the report loads: its statistic then read "missing" with
    nothing listed under the table's Missing."""
    from dapo.report.load import report_metrics

    assert {s.metric for s in A.ASSAY_STATISTICS} <= set(report_metrics(1))
    exp = _experiment(1.2, 1.28)
    for run in exp.runs:
        del run.history[M.HABIT_FORK_RIGHT_CONTROL]
    table = A.assays_table(A.assay_results(exp))
    assert any("habit/fork_right_control in no run of 02_clip_higher" in m for m in table.missing)


TOKEN = {(s.role, s.metric): s for s in A.ASSAY_STATISTICS if s.assay == "token_level_loss"}


def _token_run(row: str, seed: int, odds_slope: float, length_rise: float) -> RunData:
    steps = np.arange(1, 21)
    odds = -0.5 + odds_slope * steps + 0.01 * (seed % 2) * (-1) ** steps  # a little noise about the line
    history = {
        M.HABIT_LOOP_ODDS: Series(steps, odds),
        M.HABIT_LOOP_ODDS_CONTROL: Series(steps, np.full(20, 0.3)),
        M.HABIT_LOOP_LENGTH: Series(steps, 90 + length_rise * steps),
        M.HABIT_LOOP: Series(steps, np.linspace(0.2, 0.0, 20)),
        M.GRAD_UPDATES: Series(steps, 8.0 * steps),
    }
    params = {"tiny.assay": "token_loss"}
    return RunData(f"id-{row}-{seed}", f"{row}-s{seed}", row, seed, "finished", params, {}, None, None, history)


def test_the_token_assay_reads_slopes_and_drifts_in_fixed_windows_and_compares_them_as_differences():
    run = _token_run("03_soft_overlong_punishment", 0, 0.1, 1.0)
    assert A.run_statistic(TOKEN["effect", M.HABIT_LOOP_ODDS], run)[0] == pytest.approx(0.1)  # steps 1-10
    # the middle third of 20 steps is 7-13 (mean 10 -> length 100), the start steps 1-2 (mean 1.5 -> 91.5)
    assert A.run_statistic(TOKEN["effect", M.HABIT_LOOP_LENGTH], run)[0] == pytest.approx(8.5)
    mid_loops = next(s for s in A.ASSAY_STATISTICS if s.metric == M.HABIT_LOOP and s.statistic == "mid")
    assert A.run_statistic(mid_loops, run)[0] == pytest.approx(0.2 * (1 - 9 / 19))  # the linspace at step 10
    runs = [_token_run(row, s, slope, rise) for s in range(5)
            for row, slope, rise in (("03_soft_overlong_punishment", 0.1, 1.0), ("04_token_level_loss", 0.0, 0.0),
                                     ("00_naive_grpo", 0.1, 1.0))]  # fmt: skip
    results = A.assay_results(Experiment("assay", "sqlite://", 1, runs))
    assert {r.statistic.assay for r in results} == {"token_level_loss"}  # row 00 here ran in the token world
    effect = next(r for r in results if r.statistic is TOKEN["effect", M.HABIT_LOOP_ODDS])
    assert effect.effect(paired=True).estimate == pytest.approx(-0.1, abs=1e-3)  # a difference, not a ratio
    assert effect.verdict == "below 0; in the predicted range"
    control = next(r for r in results if r.statistic is TOKEN["control", M.HABIT_LOOP_ODDS_CONTROL])
    assert control.effect(paired=False).estimate == pytest.approx(0.0, abs=1e-9)
    assert control.verdict.startswith("no interval") or "in the predicted range" in control.verdict
    table = A.assays_table(results)
    assert "token_level_loss `" in table.notes[0] and "clip_higher" not in table.notes[0]  # only the assay that ran


def test_the_overlong_assay_reads_means_over_the_run_and_its_last_third_and_compares_means_as_differences():
    def run(row: str, seed: int, share: np.ndarray) -> RunData:
        steps = np.arange(1, 21)
        history = {M.HABIT_CAREFUL: Series(steps, share), M.HABIT_CAREFUL_CONTROL: Series(steps, np.full(20, 0.6)),
                   M.GRAD_UPDATES: Series(steps, 8.0 * steps)}  # fmt: skip
        return RunData(f"{row}-{seed}", f"{row}-s{seed}", row, seed, "finished", {"tiny.assay": "overlong"}, {},
                       None, None, history)  # fmt: skip

    without, with_ = np.linspace(0.4, 0.7, 20), np.linspace(0.4, 0.95, 20)
    stat = {(s.role, s.metric, s.statistic): s for s in A.ASSAY_STATISTICS if s.assay == "overlong_filtering"}
    last = A.run_statistic(stat["condition", M.HABIT_CAREFUL, "last"], run("00_naive_grpo", 0, without))[0]
    assert last == pytest.approx(without[13:].mean())  # the last third of 20 steps: 14-20
    runs = [run(row, s, share + 0.01 * s) for s in range(5)
            for row, share in (("00_naive_grpo", without), ("01_overlong_filtering", with_))]  # fmt: skip
    results = A.assay_results(Experiment("assay", "sqlite://", 1, runs))
    assert sorted(id(r.statistic) for r in results) == sorted(map(id, stat.values()))  # each once: one pair, 01 / 00
    effect = next(r for r in results if r.statistic is stat["effect", M.HABIT_CAREFUL, "mean"])
    assert effect.effect(paired=True).estimate == pytest.approx((with_ - without).mean())  # 0.125: a difference
    assert effect.verdict == "above 0; outside the predicted range"
    control = next(r for r in results if r.statistic is stat["control", M.HABIT_CAREFUL_CONTROL, "mean"])
    assert control.effect(paired=False).estimate == pytest.approx(0.0, abs=1e-12)
