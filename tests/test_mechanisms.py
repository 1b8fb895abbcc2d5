"""The mechanisms table: its declarations (one primary quantity per toggle, the same in docs/evidence.md), the two
metrics the trainer logs for it (computed on a hand-built batch), and each statistic on fixed curves."""

from __future__ import annotations

import re
from pathlib import Path

import numpy as np
import pytest

from dapo import metric_names as M
from dapo.designs import toggles
from dapo.report.mechanisms import MECHANISMS, common_updates, run_statistic
from dapo.report.runs import RunData, Series

DOC = Path(__file__).resolve().parent.parent / "docs" / "evidence.md"


def test_every_toggle_has_declarations_and_exactly_one_primary():
    names = [t.name for t in toggles()]
    assert {m.toggle for m in MECHANISMS} == set(names)
    for name in names:
        assert sum(m.primary for m in MECHANISMS if m.toggle == name) == 1, name
    known = set(M.all_training_metrics())
    assert all(m.metric is None or m.metric in known for m in MECHANISMS)
    assert all(m.expected_sign in (-1, 1) for m in MECHANISMS)


def test_docs_declare_the_same_statistics_as_the_code():
    """docs/evidence.md is where a reader finds the hypotheses; it must say what the code computes."""
    section_3 = DOC.read_text().split("\n## 3.")[1].split("\n## 4.")[0]  # later sections' tables are other versions'
    rows = [ln for ln in section_3.splitlines() if ln.startswith("| ") and "`" in ln]
    declared = []
    for ln in rows:
        cells = [c.strip() for c in ln.strip("|").split("|")]
        if len(cells) >= 6 and cells[0].strip("* ") in {t.name for t in toggles()}:
            metric = re.search(r"`([^`]+)`", cells[2]).group(1)
            declared.append((cells[0].strip("* "), cells[0].endswith("*"), metric, cells[3], cells[4]))
    want = [
        (m.toggle, m.primary, m.metric_label(), m.statistic_label(), "+" if m.expected_sign > 0 else "−")
        for m in MECHANISMS
    ]
    assert declared == want


# ------------------------------------------------------------------------- what the trainer logs for the table
def _group(lengths: list[int], truncated: list[bool], correct: list[bool]):
    from dapo.types import Group, Problem, Sample

    samples = [
        Sample(list(range(n)), None, "length" if t else "stop", "") for n, t in zip(lengths, truncated, strict=True)
    ]
    return Group(
        Problem("p", "q", "1"), [1, 2], samples, [1.0 if c else -1.0 for c in correct], correct, [0.0] * len(correct)
    )


@pytest.mark.parametrize("overlong_filter, share", [(False, 3 / 10), (True, 0.0)])
def test_trained_batch_reports_truncated_loss_share_and_zero_advantage_groups(overlong_filter, share):
    from dapo.algos.advantages import group_advantages
    from dapo.algos.dynamic_sampling import RefillStats
    from dapo.algos.overlong import overlong_loss_mask
    from dapo.trainer.metrics import outcome_of, rollout_metrics
    from dapo.trainer.step import policy_batch, rewards_of

    # group 0: both wrong (advantages all 0), one truncated (2 of its tokens); group 1: one right, one truncated
    groups = [_group([3, 2], [False, True], [False, False]), _group([4, 1], [False, True], [True, False])]
    batch = policy_batch(groups, group_advantages(rewards_of(groups)).reshape(-1))
    if overlong_filter:  # the step's phase 6
        batch.loss_mask = overlong_loss_mask(batch.response_mask, batch.truncated)
    m = rollout_metrics(groups, RefillStats(gen_batches=1), [outcome_of(g) for g in groups], batch, {}, True)
    # loss tokens 3 + 2 + 4 + 1 = 10, of them on truncated responses 2 + 1 = 3; the filter zeroes those rows
    assert m[M.TRUNC_LOSS_TOKEN_FRAC] == pytest.approx(share)
    assert m[M.ZERO_ADV_TRAINED_FRAC] == pytest.approx(0.5)


# ------------------------------------------------------------------------------------- statistics on fixed curves
def _run(history: dict[str, tuple[list[int], list[float]]], ups: int = 8) -> RunData:
    h = {k: Series(np.array(s), np.array(v, dtype=float)) for k, (s, v) in history.items()}
    last = max(max(s) for s, _ in history.values())
    steps = np.arange(1, last + 1)
    h[M.ROLLOUT_STEP] = Series(steps, steps.astype(float))
    h[M.GRAD_UPDATES] = Series(steps, ups * steps.astype(float))
    return RunData("id", "r-s0", "r", 0, "finished", {}, {}, None, None, h)


def _mech(toggle: str, primary: bool):
    return next(m for m in MECHANISMS if m.toggle == toggle and m.primary == primary)


def test_mean_over_the_last_third_of_training():
    m = _mech("clip_higher", True)  # entropy, mean over steps > 2T/3
    run = _run({M.ENTROPY: (list(range(1, 10)), [9, 8, 7, 6, 5, 4, 3, 2, 1])})  # T = 9: steps 7, 8, 9
    assert run_statistic(m, run, k=4) == pytest.approx((3 + 2 + 1) / 3)


def test_mean_over_all_training_steps_leaves_out_step_zero():
    m = _mech("overlong_filtering", True)
    run = _run({M.TRUNC_LOSS_TOKEN_FRAC: ([0, 1, 2, 3], [0.9, 0.1, 0.2, 0.3])})
    assert run_statistic(m, run, k=4) == pytest.approx(0.2)


def test_jumpiness_is_the_sd_of_step_to_step_changes():
    m = _mech("overlong_filtering", False)
    run = _run({M.ACC_MEAN: ([1, 2, 3, 4], [0.1, 0.3, 0.2, 0.6])})  # changes +0.2, -0.1, +0.4
    d = np.array([0.2, -0.1, 0.4])
    assert run_statistic(m, run, k=4) == pytest.approx(float(np.std(d, ddof=1)))
    assert run_statistic(m, _run({M.ACC_MEAN: ([1, 2], [0.1, 0.3])}), k=4) is None  # one change: no s.d.


def test_accuracy_at_equal_gradient_updates_interpolates_the_eval_curve():
    m = _mech("dynamic_sampling", True)
    a = _run({M.eval_avg(4): ([0, 10, 20], [30.0, 40.0, 50.0])}, ups=8)  # updates 0, 80, 160
    b = _run({M.eval_avg(4): ([0, 10, 15], [30.0, 50.0, 60.0])}, ups=8)  # stopped at 120 updates
    cu = common_updates([a, b], M.eval_avg(4))
    assert cu == 120.0
    assert run_statistic(m, a, k=4, common_updates=cu) == pytest.approx(45.0)  # halfway from 80 to 160
    assert run_statistic(m, b, k=4, common_updates=cu) == pytest.approx(60.0)
    assert run_statistic(m, a, k=4, common_updates=200.0) is None  # never extrapolated


# ------------------------------------------------------------------------------------- version 2 (issue 25)
# The digest of each version's declarations, recorded when the version was frozen (docs/evidence.md). Changing a
# declared statistic without bumping MECHANISMS_VERSION (and recording the new digest here) fails the next test.
FROZEN = {1: "07cb8363fea8be6d", 2: "be908683ad4a2f08"}


def test_declared_statistics_do_not_change_without_a_version_bump():
    from dapo.report.mechanisms import MECHANISMS_V2, MECHANISMS_VERSION, declarations_digest

    assert declarations_digest(MECHANISMS) == FROZEN[1], "version 1 is frozen: its evidence was run"
    assert MECHANISMS_VERSION == max(FROZEN)
    assert declarations_digest(MECHANISMS_V2) == FROZEN[MECHANISMS_VERSION], (
        "a version-2 declaration changed: bump MECHANISMS_VERSION, record the new digest in FROZEN, say so in "
        "docs/evidence.md"
    )


def test_docs_declare_the_same_version_2_statistics_as_the_code():
    """docs/evidence.md, section 7, lists version 2's declarations: role, toggle, metric, statistic and the
    threshold or direction, in the code's order, with the digest the test above freezes."""
    from dapo.report.mechanisms import MECHANISMS_V2, declarations_digest

    text = DOC.read_text()
    declared = []
    for ln in text.splitlines():
        cells = [c.strip() for c in ln.strip().strip("|").split("|")]
        if ln.startswith("| ") and len(cells) == 5 and cells[0] in ("condition", "effect", "wiring"):
            metric = re.search(r"`([^`]+)`", cells[2]).group(1)
            declared.append((cells[0], cells[1].split(" (")[0], metric, cells[3], cells[4]))
    want = [
        (
            m.role,
            m.toggle,
            m.metric_label(),
            m.statistic_label(),
            m.condition_label() if m.role == "condition" else ("+" if m.expected_sign > 0 else "−"),
        )
        for m in MECHANISMS_V2
    ]
    assert declared == want
    assert f"digest `{declarations_digest(MECHANISMS_V2)}`" in text


def test_version_2_gives_every_toggle_a_condition_and_one_effect_and_the_headline():
    from dapo.report.mechanisms import HEADLINE, MECHANISMS_V2

    names = {t.name for t in toggles()}
    known = set(M.all_training_metrics())
    assert {m.toggle for m in MECHANISMS_V2 if m.role == "condition"} == names
    effects = [m for m in MECHANISMS_V2 if m.role == "effect"]
    assert sorted(m.toggle for m in effects) == sorted(names | {HEADLINE})
    assert all(m.metric in known for m in MECHANISMS_V2)
    assert all(m.threshold is not None for m in MECHANISMS_V2 if m.role == "condition")
    # no effect is a quantity its toggle sets by construction (those are wiring checks)
    wiring = {(m.toggle, m.metric) for m in MECHANISMS_V2 if m.role == "wiring"}
    assert not wiring & {(m.toggle, m.metric) for m in effects}


def test_rise_and_first_third_statistics():
    from dapo.report.mechanisms import Mechanism

    rise = Mechanism("t", "q", M.ZERO_ADV_GROUP_FRAC, "rise", "all", +1, "", role="condition", threshold=0.0)
    early = Mechanism("t", "q", M.CLIPFRAC_HIGH_RARE, "mean", "first_third", +1, "", role="condition", threshold=0.1)
    run = _run({M.ZERO_ADV_GROUP_FRAC: (list(range(1, 10)), [1, 2, 3, 4, 5, 6, 7, 8, 9])})  # T = 9
    assert run_statistic(rise, run, k=1) == pytest.approx((7 + 8 + 9) / 3 - (1 + 2 + 3) / 3)
    run = _run({M.CLIPFRAC_HIGH_RARE: (list(range(1, 10)), [0.3, 0.2, 0.1, 0, 0, 0, 0, 0, 0])})
    assert run_statistic(early, run, k=1) == pytest.approx(0.2)  # steps 1..3


def _experiment(rows: dict[str, list[dict]]):
    from dapo.report.runs import Experiment

    runs = []
    for row, per_seed in rows.items():
        for seed, hist in enumerate(per_seed):
            r = _run(hist)
            r.row, r.seed, r.name = row, seed, f"{row}-s{seed}"
            runs.append(r)
    return Experiment("e", "sqlite://", 1, runs)


def test_a_condition_is_read_in_the_row_without_the_toggle_and_met_on_the_declared_side():
    from dapo.report.evidence import condition_results

    steps = list(range(1, 10))
    exp = _experiment(
        {
            "01_overlong_filtering": [{M.CLIPFRAC_HIGH_RARE: (steps, [v] * 9)} for v in (0.15, 0.09)],  # mean 0.12
            "02_clip_higher": [{M.CLIPFRAC_HIGH_RARE: (steps, [0.0] * 9)}],  # the row with it: not read
            "04_token_level_loss": [{M.ZERO_ADV_GROUP_FRAC: (steps, [0.5] * 9)}],  # flat: mean met, rise not
        }
    )
    res = {(r.mechanism.toggle, r.mechanism.metric, r.mechanism.statistic): r for r in condition_results(exp)}
    clip = res[("clip_higher", M.CLIPFRAC_HIGH_RARE, "mean")]
    assert clip.row == "01_overlong_filtering" and clip.values == pytest.approx([0.15, 0.09]) and clip.met is True
    assert res[("dynamic_sampling", M.ZERO_ADV_GROUP_FRAC, "mean")].met is True
    assert res[("dynamic_sampling", M.ZERO_ADV_GROUP_FRAC, "rise")].met is False  # a flat share does not rise
    assert res[("token_level_loss", M.HABIT_LOOP, "mean")].met is None  # row 03 not run: missing, not "not met"


def test_the_placebo_is_its_twin_with_another_sampling_seed_only():
    from dapo.config import load_config
    from dapo.designs import PLACEBO_SEED_OFFSET, ladder, placebo_run, placebo_twin

    spec = placebo_run()
    twin = placebo_twin(spec.name)
    assert twin == ladder()[-2] and spec.config.stem == twin
    a = load_config(spec.config, preset="tiny", overrides=list(spec.overrides)).flat()
    b = load_config(spec.config, preset="tiny").flat()
    assert {k for k in a if a[k] != b[k]} == {"rollout.sampling_seed_offset", "tracking.row"}
    assert a["rollout.sampling_seed_offset"] == PLACEBO_SEED_OFFSET and a["tracking.row"] == spec.name


def test_the_placebo_table_counts_clear_changes_and_the_conditions_only_mode_hides_every_effect(tmp_path):
    from dapo.designs import placebo_run
    from dapo.report.evidence import evidence_tables

    steps = list(range(1, 10))
    twin, placebo = "04_token_level_loss", placebo_run().name
    same = [{M.HABIT_LOOP: (steps, [0.10 + 0.01 * s] * 9), M.ZERO_ADV_GROUP_FRAC: (steps, [0.5] * 9)} for s in range(3)]
    moved = [
        {M.HABIT_LOOP: (steps, [0.30 + 0.01 * s] * 9), M.ZERO_ADV_GROUP_FRAC: (steps, [0.5] * 9)} for s in range(3)
    ]
    tables = evidence_tables(_experiment({twin: same, placebo: moved}))
    assert set(tables) == {"conditions", "effects", "wiring", "placebo"}
    clear = [row for row in tables["placebo"].csv_rows if row[-1] == "clear change"]
    assert [(row[0], row[1]) for row in clear] == [("token_level_loss", "responses in a repetition loop")]
    assert "1 of" in tables["placebo"].notes[0] and "clean" in tables["placebo"].notes[0]
    only = evidence_tables(_experiment({twin: same, placebo: moved}), conditions_only=True)
    assert set(only) == {"conditions"}


def test_the_effects_figure_is_drawn_for_the_habits_world_only(tmp_path):
    from dapo.report.pipeline import write_figures

    steps = list(range(1, 10))
    loops = {
        "03_soft_overlong_punishment": [{M.HABIT_LOOP: (steps, [0.10 + 0.01 * s] * 9)} for s in range(3)],
        "04_token_level_loss": [{M.HABIT_LOOP: (steps, [0.02 + 0.01 * s] * 9)} for s in range(3)],
    }
    drawn = {r.name: r for r in write_figures(_experiment(loops), tmp_path / "habits")}
    effects = drawn["effects"]
    assert (tmp_path / "habits" / "figures" / "effects.png").read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"
    assert not any(m.startswith("token_level_loss") for m in effects.missing)  # its panel has an interval
    assert any(m.startswith("clip_higher") for m in effects.missing)  # rows 01/02 not run: listed, its panel says so
    plain = {M.RESP_LEN_MEAN: (steps, [30.0] * 9)}  # the arithmetic world logs no habit: no version-2 figure
    names = {r.name for r in write_figures(_experiment({"04_token_level_loss": [plain]}), tmp_path / "plain")}
    assert "effects" not in names and not (tmp_path / "plain" / "figures" / "effects.png").exists()
