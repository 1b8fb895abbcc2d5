"""The async design's table: each ladder row with its rollouts carried over to the next step (`async_<row>`,
`rollout.max_staleness: 1`) against the same row synchronous, on statistics declared before it ran (docs/staleness.md),
each a difference of means over seeds (carried - synchronous) with Welch's interval, reported whichever way it comes
out; and whether the rows keep their order by final accuracy (the ablation's reading) when every one is carried over.
"""

from __future__ import annotations

from itertools import combinations

import numpy as np

from dapo import metric_names as M
from dapo.report.formats import Column, Table, column_table, interval_columns
from dapo.report.mechanisms import Mechanism, MechanismResult, compare_mechanism, fmt_delta, mean_txt
from dapo.report.runs import Experiment
from dapo.report.variants import verdict

_SOURCE = "docs/staleness.md"


def _declared(quantity: str, metric: str | None, statistic: str) -> Mechanism:
    return Mechanism(toggle="async", quantity=quantity, metric=metric, statistic=statistic, window="all",  # type: ignore[arg-type]
                     expected_sign=+1, source=_SOURCE)  # fmt: skip


ASYNC_STATISTICS: tuple[Mechanism, ...] = (
    _declared("final eval accuracy", None, "final"),
    _declared("training accuracy, area over updates", M.ACC_GENERATED, "area_updates"),
    _declared("training accuracy, area over tokens", M.ACC_GENERATED, "area_tokens"),
    _declared("entropy of generated tokens", M.ENTROPY, "mean"),
    _declared("tokens generated per rollout step", M.DS_TOKENS_GENERATED, "mean"),
    _declared("generation seconds per rollout step", M.TIME_GENERATE, "mean"),
)


def async_results(exp: Experiment, confidence: float = 0.95) -> list[tuple[str, str, list[MechanismResult]]]:
    """(carried run, its row, one result per declared statistic) for every row whose carried runs are in `exp`."""
    from dapo.designs import async_pairs

    present = {r.row for r in exp.runs}
    return [
        (a, row, [compare_mechanism(exp, m, a, row, confidence) for m in ASYNC_STATISTICS])
        for a, row in async_pairs()
        if a in present
    ]


def kendall_tau(a: list[float], b: list[float]) -> float:
    """Kendall's tau-a of two equally long score lists: (concordant - discordant pairs) / all pairs (ties: neither)."""
    pairs = list(combinations(range(len(a)), 2))
    if not pairs:
        return float("nan")
    s = sum(np.sign(a[i] - a[j]) * np.sign(b[i] - b[j]) for i, j in pairs)
    return float(s) / len(pairs)


def row_order(results: list[tuple[str, str, list[MechanismResult]]]) -> tuple[list[str], list[str], float]:
    """The rows by final accuracy (seed mean, best first) synchronous and carried over, and Kendall's tau between the
    two orders (1: the same order)."""
    final = [(row, float(np.mean(rs[0].without_values)), float(np.mean(rs[0].with_values)))
             for _, row, rs in results if rs[0].with_values and rs[0].without_values]  # fmt: skip
    sync = [row for row, s, _ in sorted(final, key=lambda x: -x[1])]
    carried = [row for row, _, c in sorted(final, key=lambda x: -x[2])]
    return sync, carried, kendall_tau([s for _, s, _ in final], [c for _, _, c in final])


def async_table(results: list[tuple[str, str, list[MechanismResult]]], confidence: float = 0.95) -> Table:
    """One line per (row, statistic): the synchronous and the carried-over means over seeds and Δ with its interval;
    notes with the rows' order each way."""
    lines = [r for _, _, rs in results for r in rs]
    shown: list[Column] = [
        ("Row", lambda r: r.without_row),
        ("Quantity (metric)", lambda r: f"{r.mechanism.quantity} (`{r.mechanism.metric_label()}`)"),
        ("Synchronous (eta 0)", lambda r: mean_txt(r.without_values)),
        ("Carried over (eta 1)", lambda r: mean_txt(r.with_values)),
        (f"Δ [{round(100 * confidence)}% CI]", lambda r: fmt_delta(r.interval)),
        ("Verdict", verdict),
    ]
    raw: list[Column] = [
        ("row", lambda r: r.without_row),
        ("carried_run", lambda r: r.with_row),
        ("quantity", lambda r: r.mechanism.quantity),
        ("metric", lambda r: r.mechanism.metric_label()),
        ("statistic", lambda r: r.mechanism.statistic),
        ("sync_per_seed", lambda r: " ".join(repr(v) for v in r.without_values)),
        ("carried_per_seed", lambda r: " ".join(repr(v) for v in r.with_values)),
        *interval_columns(lambda r: r.interval, "delta"),
        ("df", lambda r: r.interval.df if r.interval else None),
        ("verdict", verdict),
    ]
    sync, carried, tau = row_order(results)
    notes = [
        "Δ = mean over seeds of (the row carried over: rollout.max_staleness 1, token_tis) - (the row synchronous); "
        "interval: Welch's t over seeds. The statistics were declared before the design ran "
        "(dapo/report/staleness.py).",
        f"Rows by final eval accuracy, best first: synchronous {', '.join(sync) or '—'}; carried over "
        f"{', '.join(carried) or '—'} (Kendall's tau {tau:.2f}; the same order: {'yes' if sync == carried else 'no'}).",
    ]
    missing = [f"{r.with_row} / {r.mechanism.quantity}: {x}" for r in lines for x in r.missing]
    title = "Carry-over: each ladder row with rollouts carried to the next step, against itself synchronous"
    return column_table(title, lines, shown, raw, notes, missing)
