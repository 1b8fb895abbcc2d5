"""The mechanisms table: did each toggle move the quantity the paper says it moves?

Declared here once, before any evidence is run (docs/evidence.md lists the same; a test checks they agree): for each
toggle, the quantities the paper says it moves, each with metric, window, per-run statistic, the sign the paper
expects for (row adding the toggle) - (row above), and the paper's place. The primary quantity is the one the evidence
goal counts; every declared statistic is reported, whichever way it comes out.

Per run one number; per row its mean over seeds; the difference has Welch's interval over seeds (95% by default: the
seed is the replicated unit, steps are not independent). A verdict says whether it excludes zero, and on which side.
Statistics: `mean`; `successive_diff_sd` (s.d. of step-to-step changes: jumpiness); `at_common_updates` (the eval
curve interpolated at the largest update count every compared run reached); `rise`, `final`, `area_*`
(`statistic_label`). Windows: `all` (steps 1..T), `last_third` (> 2T/3), `first_third` (<= T/3).
"""

from __future__ import annotations

from dataclasses import asdict, dataclass, field, replace
from pathlib import Path
from typing import Literal

import numpy as np

from dapo import metric_names as M
from dapo.algos.evalstats import Interval, welch_interval
from dapo.report.figures import save_figure
from dapo.report.formats import Table, bounds
from dapo.report.runs import Experiment, RunData

Statistic = Literal["mean", "successive_diff_sd", "at_common_updates", "rise", "final", "area_updates", "area_tokens"]
Window = Literal["all", "last_third", "first_third"]
Role = Literal["mechanism", "condition", "effect", "wiring"]


@dataclass(frozen=True)
class Mechanism:
    toggle: str  # a toggle of the ladder (`dapo.designs.toggles()`): the row stem without its number
    quantity: str  # what is measured, in words
    metric: str | None  # a metric name from dapo.metric_names; None: eval avg@k (k is the run's eval.n)
    statistic: Statistic
    window: Window
    expected_sign: int  # +1 / -1: the sign the paper expects for (row with the toggle) - (row above)
    source: str  # where the paper makes the claim
    primary: bool = False  # the toggle's headline quantity (one per toggle)
    # Version 2 (MECHANISMS_V2) only. `role`: a condition is read in the row *without* the toggle, met when its seed
    # mean times `expected_sign` reaches `threshold` times the sign; an effect compares with / without like version 1;
    # a wiring check is an effect true by construction (the toggle is wired, not the paper right).
    role: Role = "mechanism"
    threshold: float | None = None
    rows: tuple[str, str] | None = None  # (with, without) rows when not the toggle's own pair (the headline)

    def metric_name(self, k: int) -> str:
        return M.eval_avg(k) if self.metric is None else self.metric

    def metric_label(self) -> str:
        return "eval avg@k" if self.metric is None else self.metric

    def statistic_label(self) -> str:
        window = {"all": "all steps", "last_third": "last third of steps", "first_third": "first third of steps"}[
            self.window
        ]
        return {
            "mean": f"mean over {window}",
            "successive_diff_sd": f"s.d. of step-to-step change, {window}",
            "at_common_updates": "at equal gradient updates (last common)",
            "rise": "mean over the last third minus mean over the first third",
            "final": "at the last step",
            "area_updates": "area under the curve over gradient updates (its mean)",
            "area_tokens": "area under the curve over tokens generated, to the pair's common budget (its mean)",
        }[self.statistic]

    def condition_label(self) -> str:
        """`>= 0.1` / `<= 0.1` / `> 0` for a condition (the side `expected_sign` says)."""
        t = self.threshold if self.threshold is not None else 0.0
        if self.statistic == "rise":
            return "> 0" if self.expected_sign > 0 else "< 0"
        return f"{'>=' if self.expected_sign > 0 else '<='} {t:g}"


# The declarations. Changing one after evidence has been run is changing the hypothesis: say so in docs/evidence.md.
# fmt: off
MECHANISMS: tuple[Mechanism, ...] = (  # toggle, quantity, metric, statistic, window, expected sign, source
    Mechanism("overlong_filtering", "share of the loss's tokens on truncated responses", M.TRUNC_LOSS_TOKEN_FRAC,
              "mean", "all", -1, "section 3.4 (truncated samples masked out of the loss)", primary=True),
    Mechanism("overlong_filtering", "jumpiness of training accuracy", M.ACC_MEAN, "successive_diff_sd", "all", -1,
              "Fig 5 (accuracy more stable with the filter)"),
    Mechanism("clip_higher", "entropy of generated tokens", M.ENTROPY, "mean", "last_third", +1,
              "Fig 2 (entropy collapses without it)", primary=True),
    Mechanism("clip_higher", "fraction of tokens clipped at the upper bound", M.CLIPFRAC_HIGH, "mean", "all", -1,
              "section 3.1 (the raised bound binds less often)"),
    Mechanism("soft_overlong_punishment", "fraction of responses truncated", M.RESP_TRUNC_FRAC, "mean", "last_third",
              -1, "section 3.4, Eq. 13 (length penalty near the cap)", primary=True),
    Mechanism("soft_overlong_punishment", "mean response length", M.RESP_LEN_MEAN, "mean", "last_third", -1,
              "section 3.4, Eq. 13"),
    Mechanism("token_level_loss", "entropy of generated tokens", M.ENTROPY, "mean", "last_third", -1,
              "Fig 4a (sample-level loss: unhealthy rise in entropy)", primary=True),
    Mechanism("token_level_loss", "mean response length", M.RESP_LEN_MEAN, "mean", "last_third", -1,
              "Fig 4b (sample-level loss: unhealthy rise in length)"),
    Mechanism("dynamic_sampling", "eval accuracy at equal gradient updates", None, "at_common_updates", "all", +1,
              "Fig 6 (same accuracy in fewer updates)", primary=True),
    Mechanism("dynamic_sampling", "share of trained groups with zero advantage", M.ZERO_ADV_TRAINED_FRAC, "mean",
              "all", -1, "section 3.2 (groups without gradient are filtered out)"),
    Mechanism("dynamic_sampling", "tokens generated per rollout step (the cost)", M.DS_TOKENS_GENERATED, "mean",
              "all", +1, "section 3.2 (dropped groups cost generation)"),
)
# fmt: on

# Version 2 (issue 25), declared before any confirmatory run, for the habits world (dapo/tinyworld/habits.py): per
# toggle, its condition (read in the row without it), the effect that follows if the paper is right (not true by
# construction), and its `wiring` checks; plus the headline effect, full DAPO against naive GRPO. Changing any is a
# new version: bump MECHANISMS_VERSION and record the new digest (tests/test_mechanisms.py checks both).
MECHANISMS_VERSION = 2


def _restated(toggle: str, metric: str, **changes) -> Mechanism:
    """A version-1 declaration made again in version 2, in the role `changes` give it (not primary unless said)."""
    m = next(m for m in MECHANISMS if m.toggle == toggle and m.metric == metric)
    return replace(m, **{"primary": False, **changes})


HEADLINE = "dapo_vs_grpo"  # the toggle field of the headline effect (row 05 against row 00)
# fmt: off
MECHANISMS_V2: tuple[Mechanism, ...] = (  # toggle, quantity, metric, statistic, window, expected sign, source, ...
    # --- conditions (the row without the toggle)
    Mechanism("overlong_filtering", "responses cut off by the cap with sound working so far", M.HABIT_SOUND_TRUNCATED,
              "mean", "all", +1, "section 3.4 (truncation penalises sound reasoning)", role="condition",
              threshold=0.05),
    Mechanism("clip_higher", "rare tokens with positive advantage clipped at the upper bound", M.CLIPFRAC_HIGH_RARE,
              "mean", "first_third", +1, "section 3.1, Fig 3a (the upper clip caps rare tokens' rise)",
              role="condition", threshold=0.10),
    Mechanism("soft_overlong_punishment", "fraction of responses truncated", M.RESP_TRUNC_FRAC, "mean", "last_third",
              +1, "section 3.4 (many responses reach the cap)", role="condition", threshold=0.10),
    Mechanism("token_level_loss", "responses in a repetition loop", M.HABIT_LOOP, "mean", "all", +1,
              "Fig 4 (long low-quality patterns)", role="condition", threshold=0.06),
    Mechanism("token_level_loss", "length of wrong responses over right ones", M.LEN_WRONG_OVER_RIGHT, "mean", "all",
              +1, "section 3.3 (per-sample averaging under-weights long responses)", role="condition", threshold=1.5),
    Mechanism("dynamic_sampling", "groups with zero advantage, before the filter", M.ZERO_ADV_GROUP_FRAC, "mean",
              "all", +1, "section 3.2, Fig 3b (many groups all correct or all wrong)", role="condition",
              threshold=0.35),
    Mechanism("dynamic_sampling", "rise of groups with zero advantage over training", M.ZERO_ADV_GROUP_FRAC, "rise",
              "all", +1, "Fig 3b (the all-correct share climbs)", role="condition", threshold=0.0),
    # --- effects (row with the toggle - the row above)
    Mechanism("overlong_filtering", "accuracy on long problems (training, before any filter)", M.HABIT_ACC_LONG,
              "mean", "all", +1, "Fig 5 (filtering truncated samples stabilises and improves training)", primary=True,
              role="effect"),
    Mechanism("clip_higher", "adoption of the rare right operation at the fork", M.HABIT_FORK_RIGHT, "mean", "all",
              +1, "section 3.1, Figs 2, 3a (low-probability exploration tokens can rise)", primary=True,
              role="effect"),
    _restated("soft_overlong_punishment", M.RESP_TRUNC_FRAC, primary=True, role="effect"),
    Mechanism("token_level_loss", "responses in a repetition loop", M.HABIT_LOOP, "mean", "last_third", -1,
              "section 3.3, Fig 4 (token-level loss penalises long low-quality patterns)", primary=True,
              role="effect"),
    Mechanism("dynamic_sampling", "accuracy of every generated response (area under the curve)", M.ACC_GENERATED,
              "mean", "all", +1, "section 3.2, Fig 6 (faster learning at equal updates)", primary=True,
              role="effect"),
    Mechanism(HEADLINE, "accuracy of every generated response (area under the curve)", M.ACC_GENERATED, "mean", "all",
              +1, "Table 1 (DAPO above naive GRPO)", role="effect", rows=("05_dynamic_sampling", "00_naive_grpo")),
    # --- wiring checks (true by construction: the toggle is wired)
    _restated("overlong_filtering", M.TRUNC_LOSS_TOKEN_FRAC, role="wiring"),
    _restated("clip_higher", M.CLIPFRAC_HIGH, role="wiring"),
    Mechanism("soft_overlong_punishment", "mean length penalty", M.OVERLONG_PENALTY_MEAN, "mean", "all", -1,
              "Eq. 13 (the penalty is applied)", role="wiring"),
    _restated("dynamic_sampling", M.ZERO_ADV_TRAINED_FRAC, role="wiring"),
    _restated("dynamic_sampling", M.DS_TOKENS_GENERATED, role="wiring"),
)
# fmt: on


def declarations_digest(declarations: tuple[Mechanism, ...]) -> str:
    """A short hash of a set of declarations (every field): a declared statistic cannot change unnoticed."""
    import hashlib
    import json

    text = json.dumps([asdict(m) for m in declarations], sort_keys=True)
    return hashlib.sha256(text.encode()).hexdigest()[:16]


AS_PAPER, AGAINST, UNCLEAR, NO_INTERVAL, MISSING, NOT_JUDGED = (
    "as the paper",
    "against the paper",
    "no clear change",
    "no interval (1 seed)",
    "missing",
    "not this toggle's pair",
)


def _last_step(run: RunData, series_steps: np.ndarray) -> int:
    counter = run.history.get(M.ROLLOUT_STEP)
    if counter is not None and counter.steps.size:
        return int(counter.steps.max())
    return int(series_steps.max())


def _area(x: np.ndarray, y: np.ndarray, end: float) -> float | None:
    """The mean of y over [x[0], end] by the trapezoid rule (y interpolated at `end`); None without a span."""
    keep = np.isfinite(y)
    x, y = x[keep], y[keep]
    if x.size < 2 or end <= x[0]:
        return None
    inside = x < end
    xs = np.concatenate([x[inside], [end]])
    ys = np.concatenate([y[inside], [float(np.interp(end, x, y))]])
    return float(np.sum((xs[1:] - xs[:-1]) * (ys[1:] + ys[:-1]) / 2) / (end - xs[0]))


def tokens_axis(run: RunData, steps: np.ndarray) -> np.ndarray | None:
    """Cumulative tokens generated at each rollout step (the run's own counter), None when it did not log it."""
    tot = run.history.get(M.DS_TOKENS_GENERATED_TOTAL)
    if tot is None or not tot.steps.size:
        return None
    return np.interp(steps, np.concatenate([[0], tot.steps]), np.concatenate([[0.0], tot.values]))


def run_statistic(
    m: Mechanism, run: RunData, k: int, common_updates: float | None = None, common_tokens: float | None = None
) -> float | None:
    """The declared statistic of one run (None: not logged); `common_*`: where the compared curves end together."""
    s = run.history.get(m.metric_name(k))
    if s is None or not s.steps.size:
        return None
    if m.statistic == "final":
        return s.last()[1]
    if m.statistic in ("area_updates", "area_tokens"):
        train = s.steps >= 1
        steps, values = s.steps[train], s.values[train]
        if m.statistic == "area_updates":
            x = run.x_of(steps, "updates")
            return _area(x, values, float(x.max())) if x.size else None
        x = tokens_axis(run, steps)
        if x is None or common_tokens is None:
            return None
        return _area(x, values, common_tokens)
    if m.statistic == "at_common_updates":
        if common_updates is None:
            return None
        x = run.x_of(s.steps, "updates")
        if common_updates > x.max() + 1e-9:
            return None
        return float(np.interp(common_updates, x, s.values))
    keep = s.steps >= 1  # training steps (an eval logged at step 0 is the base model)
    last = _last_step(run, s.steps)
    if m.statistic == "rise":
        late = keep & (s.steps > 2 * last / 3) & np.isfinite(s.values)
        early = keep & (s.steps <= last / 3) & np.isfinite(s.values)
        if not late.any() or not early.any():
            return None
        return float(s.values[late].mean() - s.values[early].mean())
    if m.window == "last_third":
        keep &= s.steps > 2 * last / 3
    elif m.window == "first_third":
        keep &= s.steps <= last / 3
    values = s.values[keep]
    values = values[np.isfinite(values)]
    if m.statistic == "mean":
        return float(values.mean()) if values.size else None
    if m.statistic == "successive_diff_sd":
        return float(np.std(np.diff(values), ddof=1)) if values.size >= 3 else None
    raise ValueError(f"unknown statistic {m.statistic!r}")


def common_updates(runs: list[RunData], metric: str) -> float | None:
    """The largest gradient-update count at which every run logged `metric` (or interpolates it)."""
    ends = []
    for run in runs:
        s = run.history.get(metric)
        if s is None or not s.steps.size:
            continue
        ends.append(float(run.x_of(s.steps, "updates").max()))
    return min(ends) if ends else None


def common_tokens(runs: list[RunData]) -> float | None:
    """The fewest tokens any of the runs generated in all: the budget a token-axis area is taken to."""
    ends = [float(s.values.max()) for r in runs if (s := r.history.get(M.DS_TOKENS_GENERATED_TOTAL)) and s.steps.size]
    return min(ends) if ends else None


@dataclass
class MechanismResult:
    mechanism: Mechanism
    with_row: str  # the row with the toggle (B)
    without_row: str  # the row it is compared with (A)
    with_values: list[float] = field(default_factory=list)  # one per seed
    without_values: list[float] = field(default_factory=list)
    interval: Interval | None = None  # of mean(with) - mean(without)
    missing: list[str] = field(default_factory=list)
    judged: bool = True  # False: the rows differ in more than this toggle, so the paper's sign is no test

    @property
    def verdict(self) -> str:
        iv = self.interval
        if iv is None:
            return MISSING
        if not self.judged:
            return NOT_JUDGED
        if iv.low is None or iv.high is None:
            return NO_INTERVAL
        if not iv.excludes_zero():
            return UNCLEAR
        return AS_PAPER if np.sign(iv.estimate) == self.mechanism.expected_sign else AGAINST


def compare_mechanism(
    exp: Experiment, m: Mechanism, with_row: str, without_row: str, confidence: float = 0.95
) -> MechanismResult:
    """One mechanism's statistic for two rows (any two: a toggle's row and the row above, or `dapo compare`'s)."""
    res = MechanismResult(m, with_row, without_row)
    runs_b, runs_a = exp.runs_of(with_row), exp.runs_of(without_row)
    metric = m.metric_name(exp.k)
    cu = common_updates(runs_b + runs_a, metric) if m.statistic == "at_common_updates" else None
    ct = common_tokens(runs_b + runs_a) if m.statistic == "area_tokens" else None
    lacking = []
    for runs, values, row in ((runs_b, res.with_values, with_row), (runs_a, res.without_values, without_row)):
        if not runs:
            res.missing.append(f"row {row}: no runs")
        for run in runs:
            v = run_statistic(m, run, exp.k, cu, ct)
            if v is None:
                lacking.append(run.label)
            else:
                values.append(v)
    if lacking:
        res.missing.append(f"{metric} missing (or too few steps) in runs {', '.join(lacking)}")
    if res.with_values and res.without_values:
        res.interval = welch_interval(res.with_values, res.without_values, confidence)
    return res


def toggle_rows() -> dict[str, tuple[str, str]]:
    """toggle -> (the row that adds it, the row above it): the cumulative ladder's pairs."""
    from dapo.designs import toggles

    return {t.name: (t.row, t.above) for t in toggles()}


def cumulative_results(exp: Experiment, confidence: float = 0.95) -> list[MechanismResult]:
    """Every declared mechanism, the row that adds its toggle against the row above (the cumulative ladder)."""
    rows = toggle_rows()
    return [compare_mechanism(exp, m, *rows[m.toggle], confidence) for m in MECHANISMS]


def fmt_value(x: float | None) -> str:
    """Three significant digits: the quantities range from clip fractions (1e-3) to tokens (1e4)."""
    if x is None or not np.isfinite(x):
        return "—"
    return f"{x:.3g}"


def fmt_delta(iv: Interval | None) -> str:
    if iv is None:
        return "—"
    point = f"{iv.estimate:+.3g}"
    if iv.low is None or iv.high is None:
        return point
    return f"{point} [{iv.low:+.3g}, {iv.high:+.3g}]"


def mean_txt(values: list[float]) -> str:
    """The mean over seeds and their number: `0.123 (n=2)`."""
    return f"{fmt_value(float(np.mean(values)))} (n={len(values)})" if values else "—"


def results_table(
    results: list[MechanismResult], title: str, notes: list[str], confidence: float = 0.95, with_source: bool = True
) -> Table:
    """One line per result, whatever its verdict. with_source: the paper's claim and CSV `primary` (else role)."""
    cells, raw, missing = [], [], []
    for r in results:
        m, iv = r.mechanism, r.interval
        source = [m.source] if with_source else []
        cells.append(
            [
                m.toggle + (" *" if m.primary else ""),
                f"{m.quantity} (`{m.metric_label()}`)",
                m.statistic_label(),
                *source,
                "+" if m.expected_sign > 0 else "−",
                f"{r.without_row}: {mean_txt(r.without_values)}",
                f"{r.with_row}: {mean_txt(r.with_values)}",
                fmt_delta(iv),
                r.verdict,
            ]
        )
        raw.append(
            [
                m.toggle,
                m.primary if with_source else m.role,
                m.quantity,
                m.metric_label(),
                m.statistic,
                m.window,
                m.expected_sign,
                *source,
                r.without_row,
                r.with_row,
                " ".join(repr(v) for v in r.without_values),
                " ".join(repr(v) for v in r.with_values),
                *bounds(iv),
                iv.df if iv else None,
                r.verdict,
            ]
        )
        missing += [f"{m.toggle} / {m.quantity}: {x}" for x in r.missing]
    return Table(
        title=title,
        columns=[
            "Toggle",
            "Quantity (metric)",
            "Statistic",
            *(["Paper", "Expected"] if with_source else ["Paper's sign"]),
            "Without",
            "With",
            f"Δ [{round(100 * confidence)}% CI]",
            "Verdict",
        ],
        cells=cells,
        csv_columns=[
            "toggle",
            "primary" if with_source else "role",
            "quantity",
            "metric",
            "statistic",
            "window",
            "expected_sign",
            *(["source"] if with_source else []),
            "without_row",
            "with_row",
            "without_per_seed",
            "with_per_seed",
            "delta",
            "ci_low",
            "ci_high",
            "df",
            "verdict",
        ],
        csv_rows=raw,
        notes=notes,
        missing=missing,
    )


def mechanisms_table(results: list[MechanismResult], confidence: float = 0.95, title: str = "") -> Table:
    """The mechanisms table: one line per declared mechanism, whatever its verdict."""
    primaries = [r for r in results if r.mechanism.primary]
    agree = sum(r.verdict == AS_PAPER for r in primaries)
    against = [r.mechanism.toggle for r in results if r.verdict == AGAINST]
    notes = [
        f"* primary quantity. {agree} of {len(primaries)} toggles moved their primary quantity in the paper's "
        f"direction with a {round(100 * confidence)}% interval that excludes 0.",
        "Δ = mean over seeds of (with) - (without); interval: Welch's t over seeds. Statistics declared in "
        "dapo/report/mechanisms.py (and docs/evidence.md) before the evidence was run; every one is reported.",
    ]
    if against:
        notes.append(f"Moved against the paper (interval excludes 0): {', '.join(against)}.")
    title = title or "Mechanisms: what each toggle moved (row with the toggle vs the row above)"
    return results_table(results, title, notes, confidence)


def mechanisms_figure(
    results: list[MechanismResult],
    out_dir: str | Path,
    name: str = "mechanisms",
    confidence: float = 0.95,
    title: str = "Mechanisms",
) -> list[Path]:
    """One small panel per mechanism: Δ and its interval against 0, the paper's expected side shaded."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    n = max(1, len(results))
    fig, axes = plt.subplots(n, 1, figsize=(8.0, 0.62 * n + 1.0), squeeze=False)
    for ax, r in zip(axes[:, 0], results, strict=False):
        m, iv = r.mechanism, r.interval
        lo = hi = 0.0
        if iv is not None:
            lo = iv.low if iv.low is not None else iv.estimate
            hi = iv.high if iv.high is not None else iv.estimate
        span = max(abs(lo), abs(hi), 1e-12) * 1.3
        ax.set_xlim(-span, span)
        side = (0, span) if m.expected_sign > 0 else (-span, 0)
        ax.axvspan(*side, color="tab:green", alpha=0.08, lw=0)
        ax.axvline(0, color="grey", lw=0.8)
        if iv is not None:
            color = {AS_PAPER: "tab:green", AGAINST: "tab:red"}.get(r.verdict, "tab:grey")
            ax.errorbar([iv.estimate], [0], xerr=[[iv.estimate - lo], [hi - iv.estimate]], fmt="o", color=color)
        else:
            ax.text(0.5, 0.5, "missing", transform=ax.transAxes, ha="center", va="center", color="grey", fontsize=7)
        ax.set_yticks([])
        ax.tick_params(axis="x", labelsize=6)
        ax.set_ylabel(
            f"{m.toggle}{' *' if m.primary else ''}\n{m.quantity}", rotation=0, ha="right", va="center", fontsize=6.5
        )
    fig.suptitle(
        f"{title}: Δ (with - without the toggle), {confidence:.0%} interval over seeds; green: the paper's side",
        fontsize=9,
    )
    fig.tight_layout(rect=(0.25, 0, 1, 0.97))
    return save_figure(fig, out_dir, name)
