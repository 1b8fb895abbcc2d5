"""The paper's figures (docs/algorithm.md section 6) from an MLflow experiment, as PNG and PDF.

Each figure is a declarative `FigureSpec` (which rows, which metric per panel) drawn by one function, so a new
figure is a new spec, not new plotting code. Seeds are drawn as their mean with a band of ±1 s.d. (where a row
has two or more seeds at that x); the x-axis is gradient updates (the paper's) or rollout steps. A row or metric
that is missing is left out of the drawing and named in the figure's note line, never an exception.
"""

from __future__ import annotations

import textwrap
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

import numpy as np

from dapo import metric_names as M
from dapo.report.runs import Experiment, XAxis

ROWS = list(M.PAPER_TABLE1)
R00, R01, R02, R03, R04, R05 = ROWS


@dataclass(frozen=True)
class Panel:
    metrics: tuple[Callable[[int], str], ...]  # k -> metric name (eval names depend on k)
    ylabel: Callable[[int], str]
    hline: float | None = None  # a reference level, e.g. 0.2 in Fig 3a


@dataclass(frozen=True)
class FigureSpec:
    name: str  # file stem
    title: Callable[[int], str]
    rows: tuple[str, ...] | None  # None: every row present
    panels: tuple[Panel, ...]
    ncols: int | None = None  # panels per line (None: all on one line)
    needs: str | None = None  # drawn only when some run logged this metric (the habits world's figures)


def panel(metric: str, ylabel: str, hline: float | None = None) -> Panel:
    """A panel of one metric whose name does not depend on k."""
    return Panel((lambda k: metric,), lambda k: ylabel, hline)


AVG = Panel((M.eval_avg,), lambda k: f"eval avg@{k} (%)")
ENT = panel(M.ENTROPY, "entropy of generated tokens (nats)")
LEN = panel(M.RESP_LEN_MEAN, "mean response length (tokens)")

FIGURES: tuple[FigureSpec, ...] = (
    FigureSpec(
        "fig1_full_recipe",
        lambda k: f"Fig 1: eval avg@{k} and pass@{k} over training, full DAPO recipe (row {R05})",
        (R05,),
        (Panel((M.eval_avg, M.eval_pass), lambda k: "accuracy (%)"),),
    ),
    FigureSpec(
        "fig2_clip_higher",
        lambda k: f"Fig 2: eval avg@{k} and entropy without / with clip-higher (rows {R01} vs {R02})",
        (R01, R02),
        (AVG, ENT),
    ),
    FigureSpec(
        "fig3a_clipped_prob",
        lambda k: "Fig 3a: mean old-policy probability of tokens clipped at the upper bound",
        None,
        (panel(M.CLIP_HIGH_PROB, "mean pi_old of upper-clipped tokens", hline=0.2),),
    ),
    FigureSpec(
        "fig3b_all_correct",
        lambda k: "Fig 3b: fraction of prompts whose group is all correct",
        None,
        (panel(M.ALL_CORRECT_FRAC, "all-correct group fraction"),),
    ),
    FigureSpec(
        "fig4_token_level_loss",
        lambda k: f"Fig 4: entropy and mean response length without / with token-level loss (rows {R03} vs {R04})",
        (R03, R04),
        (ENT, LEN),
    ),
    FigureSpec(
        "fig5_overlong_filtering",
        lambda k: f"Fig 5: eval avg@{k} and entropy without / with overlong filtering (rows {R00} vs {R01})",
        (R00, R01),
        (AVG, ENT),
    ),
    FigureSpec(
        "fig6_dynamic_sampling",
        lambda k: f"Fig 6: eval avg@{k} over training without / with dynamic sampling (rows {R04} vs {R05})",
        (R04, R05),
        (AVG,),
    ),
    FigureSpec("response_length", lambda k: "Mean response length over training, every row", None, (LEN,)),
    # The habits world (tiny.kind: habits): the same comparisons on the habit each toggle acts on, and the accuracy
    # of every generated response before the filter (fresh prompts every step: a learning-speed curve).
    FigureSpec(
        "fig2_clip_higher_fork",
        lambda k: (
            f"Fig 2, habits world: the rare right operation at the fork, without / with clip-higher ({R01} vs {R02})"
        ),
        (R01, R02),
        (
            panel(M.HABIT_FORK_RIGHT, "fork problems' responses that halve"),
            panel(M.CLIPFRAC_HIGH_RARE, "rare positive tokens clipped above"),
            ENT,
        ),
        needs=M.HABIT_FORK_RIGHT,
    ),
    FigureSpec(
        "fig4_token_level_loss_loop",
        lambda k: f"Fig 4, habits world: the repetition loop without / with token-level loss ({R03} vs {R04})",
        (R03, R04),
        (
            panel(M.HABIT_LOOP, "responses with an again: loop"),
            panel(M.LEN_WRONG_OVER_RIGHT, "length of wrong / right responses"),
            LEN,
        ),
        needs=M.HABIT_LOOP,
    ),
    FigureSpec(
        "fig5_overlong_filtering_long",
        lambda k: f"Fig 5, habits world: long problems without / with overlong filtering ({R00} vs {R01})",
        (R00, R01),
        (
            panel(M.HABIT_ACC_LONG, "accuracy on long problems"),
            panel(M.HABIT_SOUND_TRUNCATED, "cut off with sound working"),
            panel(M.RESP_TRUNC_FRAC, "responses truncated"),
        ),
        needs=M.HABIT_ACC_LONG,
    ),
    FigureSpec(
        "fig6_dynamic_sampling_accuracy",
        lambda k: (
            f"Fig 6, habits world: accuracy of every generated response without / with dynamic sampling ({R04} "
            f"vs {R05})"
        ),
        (R04, R05),
        (
            panel(M.ACC_GENERATED, "accuracy before the filter"),
            panel(M.ZERO_ADV_GROUP_FRAC, "groups with zero advantage"),
        ),
        needs=M.ACC_GENERATED,
    ),
    FigureSpec(
        "habits",
        lambda k: "Habits world, every row: the habits and the accuracy before the filter",
        None,
        (
            panel(M.ACC_GENERATED, "accuracy before the filter"),
            panel(M.HABIT_VERBOSE, "verbose responses"),
            panel(M.HABIT_LOOP, "again: loops"),
            panel(M.HABIT_FORK_RIGHT, "fork: right operation"),
            panel(M.RESP_TRUNC_FRAC, "truncated"),
            panel(M.ZERO_ADV_GROUP_FRAC, "zero-advantage groups"),
        ),
        ncols=3,
        needs=M.HABIT_LOOP,
    ),
)


@dataclass
class FigureResult:
    name: str
    title: str
    paths: list[Path]
    missing: list[str]


def seed_band(curves: list[tuple[np.ndarray, np.ndarray]]) -> tuple[np.ndarray, np.ndarray, np.ndarray, np.ndarray]:
    """Mean and s.d. over seeds at each x. curves: [(x [S_i], y [S_i])] -> (x [U], mean [U], sd [U], n [U]).

    U is the union of the seeds' x values; at each x only the seeds that logged it count (a seed that stopped
    early does not drag the mean down); sd is the sample s.d. (0 where one seed is present).
    """
    xs = np.unique(np.concatenate([c[0] for c in curves])) if curves else np.array([])
    mean, sd, n = np.zeros(xs.size), np.zeros(xs.size), np.zeros(xs.size, dtype=int)
    for i, x in enumerate(xs):
        vals = np.array([y[np.nonzero(cx == x)[0][-1]] for cx, y in curves if np.any(cx == x)])
        mean[i], n[i] = vals.mean(), vals.size
        sd[i] = vals.std(ddof=1) if vals.size > 1 else 0.0
    return xs, mean, sd, n


def metric_label(metric: str) -> str:
    """`eval/avg_at_32` -> `avg@32`; other names keep their last part (`actor/entropy` -> `entropy`)."""
    return metric.rsplit("/", 1)[-1].replace("_at_", "@")


def row_color(row: str) -> str:
    """One colour per row in every figure (paper rows by position, user rows after)."""
    import matplotlib

    cmap = matplotlib.colormaps["tab10"]
    idx = ROWS.index(row) if row in ROWS else len(ROWS) + sum(map(ord, row)) % 4
    return matplotlib.colors.to_hex(cmap(idx % 10))


def draw_figure(exp: Experiment, spec: FigureSpec, out_dir: str | Path, x_axis: XAxis = "updates") -> FigureResult:
    """Draw one figure; returns its paths and the names of what it could not draw."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    k = exp.k
    rows = list(spec.rows) if spec.rows is not None else [r for r in exp.rows() if exp.runs_of(r)]
    missing = [f"row {r}" for r in rows if not exp.runs_of(r)]
    if not rows:
        missing.append("every row (the experiment has no tagged runs)")
    ncols = min(spec.ncols or len(spec.panels), len(spec.panels))
    nrows = -(-len(spec.panels) // ncols)
    width = max(7.0, 5.6 * ncols)
    fig, axes = plt.subplots(nrows, ncols, figsize=(width, 4.4 * nrows), squeeze=False)
    for ax in axes.flat[len(spec.panels) :]:
        ax.set_visible(False)
    for ax, panel in zip(axes.flat, spec.panels, strict=False):
        drawn = 0
        for row in rows:
            runs = exp.runs_of(row)
            for mi, metric_of in enumerate(panel.metrics):
                metric = metric_of(k)
                curves = []
                for run in runs:
                    s = run.history.get(metric)
                    if s is None or not s.steps.size:
                        missing.append(f"{metric} for run {run.label}")
                        continue
                    curves.append((run.x_of(s.steps, x_axis), s.values))
                if not curves:
                    continue
                x, mean, sd, n = seed_band(curves)
                color, style = row_color(row), ("-", "--", ":")[mi % 3]
                what = f" {metric_label(metric)}" if len(panel.metrics) > 1 else ""
                label = f"{row}{what} ({len(curves)} seed{'s' if len(curves) > 1 else ''})"
                ax.plot(x, mean, style, color=color, label=label, marker="o" if x.size < 12 else None, ms=3)
                if n.max() > 1:
                    ax.fill_between(x, mean - sd, mean + sd, color=color, alpha=0.18, lw=0)
                drawn += 1
        if panel.hline is not None:
            ax.axhline(panel.hline, color="grey", lw=0.8, ls=":", label=f"{panel.hline:g} (reference)")
        ax.set_xlabel("gradient updates" if x_axis == "updates" else "rollout steps")
        ax.set_ylabel(panel.ylabel(k))
        ax.grid(alpha=0.3)
        if drawn:
            ax.legend(fontsize=7, loc="best")
        else:
            ax.text(0.5, 0.5, "no data", ha="center", va="center", transform=ax.transAxes, color="grey")
    title = spec.title(k)
    missing = list(dict.fromkeys(missing))
    more = f"; +{len(missing) - 4} more" if len(missing) > 4 else ""
    note = f"missing: {'; '.join(missing[:4])}{more}" if missing else "lines: mean over seeds; band: ±1 s.d."
    fig.suptitle(textwrap.fill(title, width=int(width * 14)), fontsize=10)
    # the note can name several runs: wrap it to the figure's width so none of it falls off the edge
    note = textwrap.fill(note, width=int(width * 18))
    n_lines = note.count("\n") + 1
    fig.text(0.5, 0.005, note, ha="center", va="bottom", fontsize=7, color="firebrick" if missing else "dimgray")
    fig.tight_layout(rect=(0, 0.04 * n_lines / nrows, 1, 1 - 0.05 / nrows))
    return FigureResult(spec.name, title, save_figure(fig, out_dir, spec.name), missing)


def save_figure(fig, out_dir: str | Path, name: str) -> list[Path]:
    """Write `fig` as out_dir/<name>.png and .pdf and close it; returns the paths."""
    import matplotlib.pyplot as plt

    out = Path(out_dir)
    out.mkdir(parents=True, exist_ok=True)
    paths = [out / f"{name}.{ext}" for ext in ("png", "pdf")]
    for p in paths:
        fig.savefig(p, dpi=120)
    plt.close(fig)
    return paths


def make_figures(exp: Experiment, out_dir: str | Path, x_axis: XAxis = "updates") -> list[FigureResult]:
    """Every figure of docs/algorithm.md section 6 (and response length per row) into out_dir, PNG and PDF."""
    if x_axis not in ("updates", "rollout"):
        raise ValueError(f"x_axis must be 'updates' or 'rollout', got {x_axis!r}")
    logged = {name for run in exp.runs for name in run.history}
    return [draw_figure(exp, spec, out_dir, x_axis) for spec in FIGURES if spec.needs is None or spec.needs in logged]


# The training curves `dapo compare` draws beside eval avg@k, with their axis labels.
COMPARE_CURVES = {
    M.ENTROPY: "entropy (nats)",
    M.RESP_LEN_MEAN: "mean response length",
    M.RESP_TRUNC_FRAC: "truncated fraction",
    M.CLIPFRAC_HIGH: "upper clip fraction",
    M.DS_TOKENS_GENERATED: "tokens generated per step",
}
