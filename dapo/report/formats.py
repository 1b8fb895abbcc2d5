"""One small table type written three ways: Markdown (for the report, and to paste into a README), CSV (for your own
analysis: raw numbers, full precision) and LaTeX (booktabs, for a paper). A table also carries the names of what
was missing, which the Markdown prints in a "Missing" section rather than hiding."""

from __future__ import annotations

import csv
import io
import math
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from dapo.algos.evalstats import Interval


@dataclass
class Table:
    title: str
    columns: list[str]  # display headers (Markdown / LaTeX)
    cells: list[list[str]]  # display text, one list per row
    csv_columns: list[str]  # machine-readable headers
    csv_rows: list[list[object]]  # raw values (None -> empty)
    notes: list[str] = field(default_factory=list)
    missing: list[str] = field(default_factory=list)


Column = tuple[str, Callable[[Any], Any]]  # a header, and how an item of the table gives its value


def column_table(
    title: str, items: list, shown: list[Column], raw: list[Column], notes: list[str], missing: list[str]
) -> Table:
    """One line per item, from column records (display and CSV), so that a column is added in one place."""
    cells = [[value(i) for _, value in shown] for i in items]
    raw_rows = [[value(i) for _, value in raw] for i in items]
    return Table(title, [h for h, _ in shown], cells, [h for h, _ in raw], raw_rows, notes, missing)


def fmt(x: float | None, digits: int = 1, signed: bool = False) -> str:
    """A number for display; None or NaN -> an em dash (the value is missing, see the Missing section)."""
    if x is None or (isinstance(x, float) and math.isnan(x)):
        return "—"
    return f"{x:+.{digits}f}" if signed else f"{x:.{digits}f}"


def fmt_interval(iv: Interval | None) -> str:
    """`+2.1 [-1.0, +5.2]`; the point alone when there are no bounds; an em dash for nothing."""
    if iv is None or (isinstance(iv.estimate, float) and math.isnan(iv.estimate)):
        return "—"
    point = fmt(iv.estimate, signed=True)
    if iv.low is None or iv.high is None:
        return point
    return f"{point} [{fmt(iv.low, signed=True)}, {fmt(iv.high, signed=True)}]"


def to_markdown(t: Table, heading_level: int = 2) -> str:
    h = "#" * heading_level
    lines = [f"{h} {t.title}", "", "| " + " | ".join(t.columns) + " |", "|" + "|".join("---" for _ in t.columns) + "|"]
    lines += ["| " + " | ".join(c.replace("|", "\\|") for c in row) + " |" for row in t.cells]
    if t.notes:
        lines += [""] + [f"- {n}" for n in t.notes]
    lines += ["", f"{h}# Missing", ""]
    lines += [f"- {m}" for m in t.missing] if t.missing else ["Nothing missing."]
    return "\n".join(lines) + "\n"


def to_csv(t: Table) -> str:
    buf = io.StringIO()
    w = csv.writer(buf, lineterminator="\n")
    w.writerow(t.csv_columns)
    for row in t.csv_rows:
        w.writerow(["" if v is None or (isinstance(v, float) and math.isnan(v)) else v for v in row])
    return buf.getvalue()


_TEX_ESCAPE = {
    "&": r"\&",
    "%": r"\%",
    "$": r"\$",
    "#": r"\#",
    "_": r"\_",
    "{": r"\{",
    "}": r"\}",
    "~": r"\textasciitilde{}",
    "^": r"\textasciicircum{}",
    "±": r"$\pm$",
    "—": "--",
    "Δ": r"$\Delta$",
}


def tex_escape(s: str) -> str:
    out = s.replace("\\", r"\textbackslash{}")
    for a, b in _TEX_ESCAPE.items():
        out = out.replace(a, b)
    return out


def to_latex(t: Table) -> str:
    """A booktabs tabular inside a table environment (needs \\usepackage{booktabs})."""
    spec = "l" + "r" * (len(t.columns) - 1)
    lines = [
        r"\begin{table}[t]",
        r"\centering",
        rf"\caption{{{tex_escape(t.title)}}}",
        rf"\begin{{tabular}}{{{spec}}}",
        r"\toprule",
        " & ".join(tex_escape(c) for c in t.columns) + r" \\",
        r"\midrule",
    ]
    lines += [" & ".join(tex_escape(c) for c in row) + r" \\" for row in t.cells]
    lines += [r"\bottomrule", r"\end{tabular}"]
    if t.missing:
        lines.append(r"\par\smallskip\footnotesize Missing: " + tex_escape("; ".join(t.missing)))
    lines.append(r"\end{table}")
    return "\n".join(lines) + "\n"


def write_table(t: Table, out_dir: str | Path, stem: str) -> list[Path]:
    """Write `<stem>.md`, `<stem>.csv` and `<stem>.tex` into out_dir; returns the three paths."""
    out = Path(out_dir)
    out.mkdir(parents=True, exist_ok=True)
    paths = []
    for ext, text in (("md", to_markdown(t)), ("csv", to_csv(t)), ("tex", to_latex(t))):
        p = out / f"{stem}.{ext}"
        p.write_text(text)
        paths.append(p)
    return paths


def bounds(iv: Interval | None) -> list[float | None]:
    """An interval's estimate, low and high, for a CSV row (three empty cells for no interval)."""
    return [iv.estimate, iv.low, iv.high] if iv is not None else [None, None, None]


def interval_columns(get: Callable[[Any], Interval | None], estimate: str, prefix: str = "") -> list[Column]:
    """An interval's three CSV columns: `estimate`, `<prefix>ci_low` and `<prefix>ci_high` (empty for none)."""
    names = (estimate, f"{prefix}ci_low", f"{prefix}ci_high")
    return [(name, lambda i, j=j: bounds(get(i))[j]) for j, name in enumerate(names)]
