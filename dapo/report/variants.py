"""The variants design's table and figure: each variant of configs/variants/ against the ladder row it inherits.

The statistics, declared before any variant was run (docs/variants.md), each a difference of means over seeds
(variant - parent) with Welch's interval, and every one reported whichever way it comes out:

- final eval avg@k (the run's last evaluation);
- the accuracy of every generated response, as the area under its curve over gradient updates and over tokens
  generated (to the pair's common budget), each divided by its span: ScaleRL (arXiv 2510.13786) found that such
  choices mostly change how fast accuracy rises per unit of compute, which an area shows and a final value does not;
- the entropy of generated tokens (mean over the run: what Clip-Cov and KL-Cov set out to keep up);
- tokens generated per rollout step (the cost).

There is no paper sign to test a variant against, so the verdict is only whether the interval excludes 0.
"""

from __future__ import annotations

from pathlib import Path

from dapo import metric_names as M
from dapo.report.figures import save_figure
from dapo.report.formats import Table, bounds
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
    cells, raw, missing = [], [], []
    c = round(100 * confidence)
    for variant, parent, rs in results:
        for r in rs:
            m, iv = r.mechanism, r.interval
            cells.append(
                [
                    variant,
                    f"{m.quantity} (`{m.metric_label()}`)",
                    f"{parent}: {mean_txt(r.without_values)}",
                    f"{variant}: {mean_txt(r.with_values)}",
                    fmt_delta(iv),
                    verdict(r),
                ]
            )
            raw.append(
                [
                    variant,
                    parent,
                    m.quantity,
                    m.metric_label(),
                    m.statistic,
                    " ".join(repr(v) for v in r.without_values),
                    " ".join(repr(v) for v in r.with_values),
                    *bounds(iv),
                    iv.df if iv else None,
                    verdict(r),
                ]
            )
            missing += [f"{variant} / {m.quantity}: {x}" for x in r.missing]
    notes = [
        "Δ = mean over seeds of (variant) - (its parent row); interval: Welch's t over seeds. The statistics were "
        "declared before any variant ran (dapo/report/variants.py); every one is reported, whichever way it came out.",
        "Areas are the mean of the curve over its span: over gradient updates, and over tokens generated up to the "
        "fewest tokens any run of the pair generated.",
    ]
    if not results:
        missing.append("no variant runs in this experiment (`snakemake all_variants`)")
    return Table(
        title="Variants: each loss against the ladder row it inherits",
        columns=["Variant", "Quantity (metric)", "Parent", "Variant's", f"Δ [{c}% CI]", "Verdict"],
        cells=cells,
        csv_columns=[
            "variant",
            "parent",
            "quantity",
            "metric",
            "statistic",
            "parent_per_seed",
            "variant_per_seed",
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
