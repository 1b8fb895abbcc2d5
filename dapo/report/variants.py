"""The variants design's table and figure: each variant of configs/variants/ against the ladder row it inherits, on
statistics declared before any variant ran (docs/variants.md, "The declared statistics"), each a difference of means
over seeds (variant - parent) with Welch's interval, reported whichever way it comes out. No paper gives a sign for a
variant, so the verdict is only whether the interval excludes 0.
"""

from __future__ import annotations

from pathlib import Path

from dapo import metric_names as M
from dapo.report.figures import save_figure
from dapo.report.formats import Column, Table, column_table, interval_columns
from dapo.report.mechanisms import Mechanism, MechanismResult, Statistic, compare_mechanism, fmt_delta, mean_txt
from dapo.report.runs import Experiment

_SOURCE = "docs/variants.md"


def _declared(quantity: str, metric: str | None, statistic: Statistic) -> Mechanism:
    """A variant statistic: no paper sign to test it against (only whether its interval excludes 0)."""
    return Mechanism(toggle="variant", quantity=quantity, metric=metric, statistic=statistic, window="all",
                     expected_sign=+1, source=_SOURCE)  # fmt: skip


VARIANT_STATISTICS: tuple[Mechanism, ...] = (
    _declared("final eval accuracy", None, "final"),
    _declared("training accuracy, area over updates", M.ACC_GENERATED, "area_updates"),
    _declared("training accuracy, area over tokens", M.ACC_GENERATED, "area_tokens"),
    _declared("entropy of generated tokens", M.ENTROPY, "mean"),
    _declared("tokens generated per rollout step", M.DS_TOKENS_GENERATED, "mean"),
)
CLEAR, UNCLEAR, NO_INTERVAL, MISSING = "clear change", "no clear change", "no interval (1 seed)", "missing"


def verdict(r: MechanismResult) -> str:
    iv = r.interval
    if iv is None:
        return MISSING
    if iv.low is None or iv.high is None:
        return NO_INTERVAL
    return CLEAR if iv.excludes_zero() else UNCLEAR


def variant_results(exp: Experiment, confidence: float = 0.95) -> list[tuple[str, str, list[MechanismResult]]]:
    """(variant, parent, one result per declared statistic) for every variant with runs in the experiment."""
    from dapo.designs import variant_pairs

    present = {r.row for r in exp.runs}
    return [
        (v, parent, [compare_mechanism(exp, m, v, parent, confidence) for m in VARIANT_STATISTICS])
        for v, parent in variant_pairs()
        if v in present
    ]


def variants_table(results: list[tuple[str, str, list[MechanismResult]]], confidence: float = 0.95) -> Table:
    """One line per (variant, statistic): the parent's and the variant's means over seeds and Δ with its interval."""
    lines = [r for _, _, rs in results for r in rs]  # with_row: the variant, without_row: its parent
    shown: list[Column] = [
        ("Variant", lambda r: r.with_row),
        ("Quantity (metric)", lambda r: f"{r.mechanism.quantity} (`{r.mechanism.metric_label()}`)"),
        ("Parent", lambda r: f"{r.without_row}: {mean_txt(r.without_values)}"),
        ("Variant's", lambda r: f"{r.with_row}: {mean_txt(r.with_values)}"),
        (f"Δ [{round(100 * confidence)}% CI]", lambda r: fmt_delta(r.interval)),
        ("Verdict", verdict),
    ]
    raw: list[Column] = [
        ("variant", lambda r: r.with_row),
        ("parent", lambda r: r.without_row),
        ("quantity", lambda r: r.mechanism.quantity),
        ("metric", lambda r: r.mechanism.metric_label()),
        ("statistic", lambda r: r.mechanism.statistic),
        ("parent_per_seed", lambda r: " ".join(repr(v) for v in r.without_values)),
        ("variant_per_seed", lambda r: " ".join(repr(v) for v in r.with_values)),
        *interval_columns(lambda r: r.interval, "delta"),
        ("df", lambda r: r.interval.df if r.interval else None),
        ("verdict", verdict),
    ]
    notes = [
        "Δ = mean over seeds of (variant) - (its parent row); interval: Welch's t over seeds. The statistics were "
        "declared before any variant ran (dapo/report/variants.py); every one is reported, whichever way it came out.",
        "Areas are the mean of the curve over its span: over gradient updates, and over tokens generated up to the "
        "fewest tokens any run of the pair generated.",
    ]
    missing = [f"{r.with_row} / {r.mechanism.quantity}: {x}" for r in lines for x in r.missing]
    title = "Variants: each loss against the ladder row it inherits"
    return column_table(title, lines, shown, raw, notes, missing)


def variants_figure(
    results: list[tuple[str, str, list[MechanismResult]]], out_dir: str | Path, confidence: float = 0.95
) -> list[Path]:
    """One panel per declared statistic: each variant's Δ against its parent with its interval (a forest plot)."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    stats = VARIANT_STATISTICS
    fig, axes = plt.subplots(1, len(stats), figsize=(3.2 * len(stats), 0.45 * max(2, len(results)) + 1.4))
    names = [f"{v}\n(vs {p})" for v, p, _ in results]
    for j, (ax, m) in enumerate(zip(axes, stats, strict=True)):
        for i, (_, _, rs) in enumerate(results):
            iv = rs[j].interval
            if iv is None:
                ax.text(0, i, "missing", ha="center", va="center", color="grey", fontsize=7)
                continue
            lo = iv.low if iv.low is not None else iv.estimate
            hi = iv.high if iv.high is not None else iv.estimate
            color = "tab:blue" if verdict(rs[j]) == CLEAR else "tab:grey"
            ax.errorbar([iv.estimate], [i], xerr=[[iv.estimate - lo], [hi - iv.estimate]], fmt="o", color=color)
        ax.axvline(0, color="grey", lw=0.8)
        ax.set_yticks(range(len(results)))
        ax.set_yticklabels(names if j == 0 else [""] * len(results), fontsize=7)
        ax.set_ylim(-0.6, len(results) - 0.4)
        ax.invert_yaxis()
        ax.set_title(m.quantity, fontsize=8)
        ax.tick_params(axis="x", labelsize=6)
    fig.suptitle(
        f"Variants: Δ (variant - its parent row), {confidence:.0%} interval over seeds; blue: the interval excludes 0",
        fontsize=9,
    )
    fig.tight_layout(rect=(0, 0, 1, 0.93))
    return save_figure(fig, out_dir, "variants")
