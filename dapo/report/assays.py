"""The assays' statistics (version 3 of the mechanisms: docs/evidence.md, section 8), declared before any
confirmatory run, each with a numeric prediction, and their table.

An assay is a tiny world built so that one toggle's condition holds (configs/presets/tiny-assay-*.yaml), run on two
pairs of rows only: the toggle's pair on the cumulative ladder and its one-at-a-time pair (naive GRPO with and
without it). Roles:

- `condition`: read in the row *without* the toggle, met when the mean over seeds falls in `band`;
- `effect`: the toggle's predicted effect, the ratio with / without of a per-run statistic, predicted in `band`;
  a ratio beyond `falsified_below` is faster than the mechanism allows, and counts against it even in the right
  direction;
- `control`: the same statistic on a unit of the world the mechanism predicts is unaffected (ratio in `band`).

Ratios are of geometric means over seeds, with two 95% intervals on the log scale: Welch's (runs independent) and
paired by training seed (the two rows of a seed share the base model and their first rollouts). A `slope`, a
`drift` or a `mean` can be 0 or negative, so its effect is the difference with - without of means over seeds instead.

Statistics (per run, over its rollout steps 1..T): `start`, the metric's mean over steps 1-2 (where RL starts);
`mid`, its mean over the middle third (T/3 < step <= 2T/3); `last`, over the last third (step > 2T/3); `mean`, over
every step (an area); `drift`, mid minus start; `slope`, its least-squares
slope per step over the first half (step <= T/2); `updates_to`, the gradient updates until the metric's two-step
moving average first reaches `level` (interpolated between steps; a run that never reaches it counts its last
update, and is marked censored).
"""

from __future__ import annotations

import math
from dataclasses import asdict, dataclass
from typing import Literal

import numpy as np

from dapo import metric_names as M
from dapo.algos.evalstats import Interval, seed_mean_interval, welch_interval
from dapo.designs import assay_pairs
from dapo.report.formats import Table
from dapo.report.runs import Experiment, RunData

ASSAYS_VERSION = 3
DIFFERENCES = ("drift", "slope", "mean")  # compared as with - without; the other statistics as ratios
# each assay's world (`tiny.assay`)
WORLDS = {"clip_higher": "clip_higher", "token_level_loss": "token_loss", "overlong_filtering": "overlong"}


@dataclass(frozen=True)
class AssayStatistic:
    assay: str  # the toggle the assay is built for (a ladder toggle's name)
    role: Literal["condition", "effect", "control"]
    quantity: str
    metric: str
    statistic: Literal["start", "mid", "last", "mean", "drift", "slope", "updates_to"]
    band: tuple[float, float]  # a condition's range (row without); an effect's or control's predicted ratio
    level: float | None = None  # updates_to: the level reached
    falsified_below: float | None = None  # an effect: a ratio below this is faster than the mechanism allows


# The declarations, each assay's frozen by its digest before its confirmatory run: changing one after it is changing
# the hypothesis (bump ASSAYS_VERSION and record the new digest; tests/test_assays.py checks). The clip-higher
# numbers: while the upper clip is what holds a rare token back, its probability grows at most (1 + eps_high)(1 + d)
# per rollout step (d: one update's overshoot), so reaching a level takes ln(1.2)/ln(1.28) = 0.74 as many steps at
# eps_high 0.28 with d = 0, 0.85 at d = 0.1; no clip allows more than 1/1.4.
# The token-level-loss numbers: per-response averaging gives a response's tokens 1/L of its advantage, so of two
# always-wrong habits the one 3x as long declines about 0.5x as fast (docs/evidence.md, section 8): their log-odds
# rise by the difference of the decline rates, about 0.1 a step where the short one falls from 0.2 to 0.03 in 10
# steps, and do not move under token-mean; where both habits are as long (control problems) neither mode moves them.
# The loops' length drifts up under per-response averaging (short loops are pushed down harder), not under
# token-mean.
# fmt: off
TOKEN_LOSS_STATISTICS: tuple[AssayStatistic, ...] = (
    AssayStatistic("token_level_loss", "condition", "loops' share of responses, at the start", M.HABIT_LOOP, "start",
                   (0.1, 0.4)),
    AssayStatistic("token_level_loss", "condition", "the short wrong habit's share, at the start", M.HABIT_SHORT_WRONG,
                   "start", (0.1, 0.4)),
    AssayStatistic("token_level_loss", "condition", "loops' share in the middle third", M.HABIT_LOOP, "mid",
                   (0.03, 1.0)),
    AssayStatistic("token_level_loss", "condition", "the short wrong habit's share in the middle third",
                   M.HABIT_SHORT_WRONG, "mid", (0.03, 1.0)),
    AssayStatistic("token_level_loss", "condition", "core problems' loops' tokens at the start (right working: about "
                   "30; the penalty starts at 160)", M.HABIT_LOOP_LENGTH, "start", (85.0, 150.0)),
    AssayStatistic("token_level_loss", "condition", "soft overlong penalty in the middle third",
                   M.OVERLONG_PENALTY_MEAN, "mid", (-0.01, 0.0)),
    AssayStatistic("token_level_loss", "effect", "slope a step of the loop : short wrong log-odds, core problems, "
                   "first half (with - without)", M.HABIT_LOOP_ODDS, "slope", (-0.2, -0.03)),
    AssayStatistic("token_level_loss", "effect", "drift of the core problems' loops' tokens, middle third minus start "
                   "(with - without)", M.HABIT_LOOP_LENGTH, "drift", (-40.0, -3.0)),
    AssayStatistic("token_level_loss", "control", "slope a step of the log-odds on control problems, where both "
                   "habits are as long (with - without)", M.HABIT_LOOP_ODDS_CONTROL, "slope", (-0.03, 0.03)),
)
# The overlong-filtering numbers: the filter masks the loss of cut-off responses but keeps their reward in the group's
# baseline, so a careful style cut off a share f of the time drifts up with margin m0 + f * mu instead of m0 =
# (1 - f) a_c - a_s (mu: the group's mean reward); at m0 about 0.09 and f * mu about 0.2 (R about 3) a logistic
# projection puts the careful share's mean over the run 0.15-0.25 higher with the filter; the accuracy where careful
# working fits rises by that times the gap to concise working there (about 0.4). Control problems, where careful
# working always fits, have nothing for the filter to mask.
OVERLONG_STATISTICS: tuple[AssayStatistic, ...] = (
    AssayStatistic("overlong_filtering", "condition", "careful working's share of the running sums, at the start",
                   M.HABIT_CAREFUL, "start", (0.3, 0.6)),
    AssayStatistic("overlong_filtering", "condition", "share of careful working the cap cuts off (f), at the start",
                   M.HABIT_CAREFUL_TRUNCATED, "start", (0.3, 0.5)),
    AssayStatistic("overlong_filtering", "condition", "careful accuracy (cut off: wrong) minus concise accuracy (m0), "
                   "at the start", M.HABIT_CAREFUL_MARGIN, "start", (0.03, 0.15)),
    AssayStatistic("overlong_filtering", "condition", "careful working's share in the last third (not yet the rule "
                   "without the filter)", M.HABIT_CAREFUL, "last", (0.0, 0.8)),
    AssayStatistic("overlong_filtering", "effect", "careful working's share of the running sums, mean over the run "
                   "(with - without)", M.HABIT_CAREFUL, "mean", (0.15, 0.25)),
    AssayStatistic("overlong_filtering", "effect", "accuracy on the running sums careful working fits, mean over "
                   "the run (with - without)", M.HABIT_ACC_RUN_FITS, "mean", (0.03, 0.15)),
    AssayStatistic("overlong_filtering", "control", "careful working's share of the control problems, which it "
                   "always fits, mean over the run (with - without)", M.HABIT_CAREFUL_CONTROL, "mean", (-0.05, 0.05)),
)
ASSAY_STATISTICS: tuple[AssayStatistic, ...] = (  # assay, role, quantity, metric, statistic, band, ...
    AssayStatistic("clip_higher", "condition", "right operation's share at the rare forks, at the start",
                   M.HABIT_FORK_RIGHT, "start", (0.015, 0.05)),
    AssayStatistic("clip_higher", "condition", "updates until the rare forks' right share reaches 0.2, as a share of "
                   "the run's updates", M.HABIT_FORK_RIGHT, "updates_to", (0.25, 0.75), level=0.2),
    AssayStatistic("clip_higher", "effect", "updates until the rare forks' right share reaches 0.2",
                   M.HABIT_FORK_RIGHT, "updates_to", (0.74, 0.85), level=0.2, falsified_below=1 / 1.4),
    AssayStatistic("clip_higher", "control", "updates until the control fork's right share reaches 0.6 (from about "
                   "0.3)", M.HABIT_FORK_RIGHT_CONTROL, "updates_to", (0.9, 1.1), level=0.6),
    *TOKEN_LOSS_STATISTICS,
    *OVERLONG_STATISTICS,
)
# fmt: on


def assays_digest(assay: str) -> str:
    import hashlib
    import json

    text = json.dumps([asdict(s) for s in ASSAY_STATISTICS if s.assay == assay], sort_keys=True)
    return hashlib.sha256(text.encode()).hexdigest()[:16]


def run_statistic(s: AssayStatistic, run: RunData) -> tuple[float, bool] | None:
    """(value, censored) of one run; None when the run did not log the metric."""
    series = run.history.get(s.metric)
    if series is None or not series.steps.size:
        return None
    keep = (series.steps >= 1) & np.isfinite(series.values)
    steps, values = series.steps[keep], series.values[keep]
    if not steps.size:
        return None
    start = float(values[steps <= 2].mean()) if (steps <= 2).any() else None
    last = float(steps[-1])
    middle, end = values[(steps > last / 3) & (steps <= 2 * last / 3)], values[steps > 2 * last / 3]
    mid = float(middle.mean()) if middle.size else None
    if s.statistic in ("start", "mid", "last", "mean", "drift"):
        drift = None if start is None or mid is None else mid - start
        ends = {"last": float(end.mean()) if end.size else None, "mean": float(values.mean())}
        return {"start": start, "mid": mid, "drift": drift, **ends}[s.statistic], False
    if s.statistic == "slope":
        half = steps <= last / 2
        return (float(np.polyfit(steps[half], values[half], 1)[0]) if half.sum() >= 3 else None), False
    assert s.level is not None
    x = run.x_of(steps, "updates")
    smooth = np.convolve(values, [0.5, 0.5])[: values.size]  # the mean of a step and the one before it
    smooth[0] = values[0]
    above = np.flatnonzero(smooth >= s.level)
    per = float(x[-1]) if s.role == "condition" else 1.0  # a condition reads it as a share of the run's updates
    if not above.size:
        return float(x[-1]) / per, True
    i = int(above[0])
    f = 0.0 if i == 0 else (s.level - smooth[i - 1]) / (smooth[i] - smooth[i - 1])
    return float(x[max(i - 1, 0)] + f * (x[i] - x[max(i - 1, 0)])) / per, False


@dataclass
class AssayResult:
    statistic: AssayStatistic
    with_row: str
    without_row: str
    values: dict[str, dict[int, float]]  # row -> seed -> value
    censored: int  # runs that never reached the level

    def effect(self, paired: bool) -> Interval | None:
        """with / without: a geometric-mean ratio (Welch) or the mean per-seed ratio (paired), 95% on logs; for a
        slope or a drift, the difference with - without of means (Welch) or the mean per-seed difference."""
        a, b = self.values.get(self.without_row, {}), self.values.get(self.with_row, {})
        diff = self.statistic.statistic in DIFFERENCES
        if not a or not b or (not diff and min(list(a.values()) + list(b.values())) <= 0):
            return None
        f = (lambda v: v) if diff else math.log
        if paired:
            seeds = sorted(set(a) & set(b))
            if not seeds:
                return None
            iv = seed_mean_interval([f(b[s]) - f(a[s]) for s in seeds])
        else:
            iv = welch_interval([f(v) for v in b.values()], [f(v) for v in a.values()])
        if diff:
            return iv
        exp = lambda v: None if v is None else math.exp(v)  # noqa: E731
        return Interval(math.exp(iv.estimate), exp(iv.low), exp(iv.high), iv.se, iv.df, iv.method)

    def condition_mean(self) -> float | None:
        v = list(self.values.get(self.without_row, {}).values())
        return float(np.mean(v)) if v else None

    @property
    def verdict(self) -> str:
        s = self.statistic
        lo, hi = s.band
        if s.role == "condition":
            m = self.condition_mean()
            return "missing" if m is None else "met" if lo <= m <= hi else "not met"
        iv = self.effect(paired=False)
        if iv is None:
            return "missing"
        if s.falsified_below is not None and iv.estimate < s.falsified_below:
            return f"beyond the bound (< {s.falsified_below:.3g}): against the mechanism"
        inside = "in the predicted range" if lo <= iv.estimate <= hi else "outside the predicted range"
        if iv.low is None or iv.high is None:
            return f"no interval; {inside}"
        null = 0 if s.statistic in DIFFERENCES else 1
        clear = f"below {null}" if iv.high < null else f"above {null}" if iv.low > null else f"not clear of {null}"
        return f"{clear}; {inside}"


def assay_results(exp: Experiment) -> list[AssayResult]:
    """Every declared statistic of every assay whose rows the experiment has, in the assay's world, for each of its
    pairs (rows 00's runs belong to the world they ran in, not to every assay that compares against row 00)."""
    out = []
    for s in ASSAY_STATISTICS:
        world = WORLDS[s.assay]
        runs_of = lambda row, world=world: [r for r in exp.runs_of(row) if r.params.get("tiny.assay") == world]  # noqa: E731
        seen = set()  # a condition of two pairs with one row without (overlong filtering's 00) is read once
        for with_row, without_row in assay_pairs(s.assay):
            rows = (without_row,) if s.role == "condition" else (without_row, with_row)
            if rows in seen or not all(runs_of(r) for r in rows):
                continue
            seen.add(rows)
            values: dict[str, dict[int, float]] = {}
            censored = 0
            for row in rows:
                for i, run in enumerate(runs_of(row)):
                    got = run_statistic(s, run)
                    if got is not None and got[0] is not None:
                        values.setdefault(row, {})[run.seed if run.seed is not None else -i] = got[0]
                        censored += got[1]
            out.append(AssayResult(s, with_row, without_row, values, censored))
    return out


def _fmt(iv: Interval | None) -> str:
    if iv is None or iv.low is None or iv.high is None:
        return "—" if iv is None else f"{iv.estimate:.3g}"
    return f"{iv.estimate:.3g} [{iv.low:.3g}, {iv.high:.3g}]"


def assays_table(results: list[AssayResult], conditions_only: bool = False) -> Table:
    """One line per (statistic, pair): the rows' per-seed values, the ratio with both intervals (a condition: the
    mean), the prediction and the verdict. `conditions_only` leaves out every effect and control (for tuning a
    development world)."""
    lines = []
    for r in results:
        s, cond = r.statistic, r.statistic.role == "condition"
        if conditions_only and not cond:
            continue
        welch, paired = (None, None) if cond else (r.effect(False), r.effect(True))
        lines.append({
            "assay": s.assay, "role": s.role, "quantity": f"{s.quantity} (`{s.metric}`)", "statistic": s.statistic,
            "rows": r.without_row if cond else f"{r.with_row} / {r.without_row}",
            "per_seed": "; ".join(f"{row}: " + " ".join(f"{v:.3g}" for _, v in sorted(d.items()))
                                  for row, d in r.values.items()),
            "estimate": f"{m:.3g}" if cond and (m := r.condition_mean()) is not None else _fmt(welch),
            "paired": _fmt(paired), "predicted": f"{s.band[0]:g} to {s.band[1]:g}",
            "verdict": r.verdict + (f" ({r.censored} censored)" if r.censored else ""),
        })  # fmt: skip
    shown = ["assay", "role", "quantity", "rows", "per_seed", "estimate", "paired", "predicted", "verdict"]
    return Table(
        title="Assays: declared statistics (version 3)",
        columns=["Assay", "Role", "Quantity (metric)", "Rows (with / without)", "Per seed",
                 "With / without or with - without [95% Welch] (a condition: mean)", "Paired [95%]",
                 "Predicted / needed", "Verdict"],
        cells=[[line[k] for k in shown] for line in lines],
        csv_columns=list(lines[0]) if lines else shown,
        csv_rows=[list(line.values()) for line in lines],
        missing=[f"{r.statistic.assay} / {r.statistic.quantity}: {r.statistic.metric} in no run of {r.with_row} or "
                 f"{r.without_row}" for r in results if r.verdict == "missing"],
        notes=[
            f"Declared in dapo/report/assays.py (version {ASSAYS_VERSION}; digests: "
            + ", ".join(f"{a} `{assays_digest(a)}`" for a in dict.fromkeys(r.statistic.assay for r in results))
            + ") before the confirmatory runs. A condition is read in the row without the toggle (an `updates_to` "
            "condition as a share of the run's updates); an effect or control is the ratio with / without of geometric "
            "means over seeds (a slope or a drift: the difference with - without of means), with Welch's interval and "
            "the interval paired by training seed."
        ],
    )  # fmt: skip
