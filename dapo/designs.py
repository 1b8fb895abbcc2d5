"""Ablation designs generated from the one config ladder in configs/ablations/ (no copied files).

The ladder is cumulative (the paper's Table 1): row k inherits row k-1 and sets only its own toggle's keys, so a
toggle *is* the keys its row file sets (`tracking.row` aside), with the values it sets and the values they had
in the row above. Three designs follow, each a reference run and one run per toggle:

- cumulative: row k against row k-1 (the paper's; each gain is conditional on every toggle above it);
- leave_one_out: full DAPO (the last row) against full DAPO with one toggle's keys reverted,
  run `dapo_minus_<toggle>`;
- one_at_a_time: naive GRPO (the first row) against naive GRPO with one toggle's keys set, run
  `grpo_plus_<toggle>`.

A design run is (a ladder row file, overrides): the toggle's keys set or reverted, and `tracking.row` naming it.
Where a design run's config equals a ladder row's (full DAPO minus the last toggle *is* the row above it; naive
GRPO plus the first toggle *is* row 01), the design reuses that row's runs rather than training a copy.

    from dapo.designs import design_runs, marginal_pairs
    design_runs("leave_one_out")      # [RunSpec(name="dapo_minus_overlong_filtering", ...), ...]
"""

from __future__ import annotations

import json
from dataclasses import dataclass
from functools import cache
from pathlib import Path
from typing import Any, Literal

import yaml

from dapo.config import ABLATIONS_DIR, load_config, read_chain

Design = Literal["cumulative", "leave_one_out", "one_at_a_time"]
DESIGNS: tuple[Design, ...] = ("cumulative", "leave_one_out", "one_at_a_time")
# Design runs are named by their prefix and the toggle: readable in the MLflow UI, parsed back by `parse_run`.
PREFIX: dict[Design, str] = {"leave_one_out": "dapo_minus_", "one_at_a_time": "grpo_plus_"}
ROW_KEY = "tracking.row"


@dataclass(frozen=True)
class Toggle:
    """One rung of the ladder: the row that adds it, the row above, and the keys it sets (dotted -> value)."""

    name: str  # the row's stem without its number: "clip_higher"
    row: str  # "02_clip_higher"
    above: str  # "01_overlong_filtering"
    values: dict[str, Any]  # what the row sets: {"algorithm.eps_high": 0.28}
    reverted: dict[str, Any]  # the same keys in the row above: {"algorithm.eps_high": 0.2}


@dataclass(frozen=True)
class RunSpec:
    """What one run of a design trains: a ladder row file plus overrides, under run name `name`."""

    name: str  # the MLflow row tag and run folder: a ladder row, or dapo_minus_<t> / grpo_plus_<t>
    config: Path  # the ladder row file it starts from
    overrides: tuple[str, ...]  # section.key=value, `tracking.row=<name>` last; empty for a ladder row
    design: Design
    toggle: str | None  # None for a design's reference run

    @property
    def is_ladder_row(self) -> bool:
        return not self.overrides


def ladder(ablations_dir: Path = ABLATIONS_DIR) -> list[str]:
    """The ladder's row names (file stems), in order."""
    return sorted(p.stem for p in Path(ablations_dir).glob("*.yaml"))


def toggle_name(row: str) -> str:
    """`02_clip_higher` -> `clip_higher` (the numeric prefix orders the ladder; it is not part of the toggle)."""
    head, _, rest = row.partition("_")
    return rest if head.isdigit() and rest else row


def _own_keys(path: Path) -> dict[str, Any]:
    """The dotted keys a row file itself sets (its `inherits:` and `tracking.row` aside)."""
    own = read_chain(path)[-1][1]
    out: dict[str, Any] = {}

    def walk(prefix: str, d: dict) -> None:
        for k, v in d.items():
            key = f"{prefix}{k}"
            if isinstance(v, dict):
                walk(key + ".", v)
            elif key != ROW_KEY:
                out[key] = v

    walk("", own)
    return out


@cache
def toggles(ablations_dir: Path = ABLATIONS_DIR) -> tuple[Toggle, ...]:
    """Every toggle of the ladder, in row order (the first row is the baseline and adds none).

    A key may be set by one row only: a design reverts or sets a toggle's keys alone, which is only that toggle
    if no other row touches them. Raises ValueError naming the rows otherwise.
    """
    rows = ladder(ablations_dir)
    if len(rows) < 2:
        raise ValueError(f"{ablations_dir}: a ladder needs at least two rows, found {rows}")
    out, seen = [], {}
    for above, row in zip(rows, rows[1:], strict=False):
        path = Path(ablations_dir) / f"{row}.yaml"
        values = _own_keys(path)
        if not values:
            raise ValueError(f"{path}: sets no key besides {ROW_KEY}; every row after the first adds a toggle")
        for k in values:
            if k in seen:
                raise ValueError(
                    f"{path}: key `{k}` is already set by {seen[k]}.yaml; each toggle's keys must belong to one row "
                    "for the leave-one-out and one-at-a-time designs to change that toggle alone"
                )
            seen[k] = row
        prev = load_config(Path(ablations_dir) / f"{above}.yaml").flat()
        out.append(Toggle(toggle_name(row), row, above, values, {k: prev[k] for k in values}))
    return tuple(out)


def override(key: str, value: Any) -> str:
    """A `section.key=value` override that `dapo.config.parse_override` reads back as `value` (YAML text: a plain
    string where YAML reads it back unchanged, else JSON, which YAML also reads)."""
    if isinstance(value, str) and yaml.safe_load(value) == value:
        return f"{key}={value}"
    return f"{key}={json.dumps(value)}"


def _ladder_spec(row: str, design: Design, toggle: str | None, ablations_dir: Path) -> RunSpec:
    return RunSpec(row, Path(ablations_dir) / f"{row}.yaml", (), design, toggle)


def _computation(spec: RunSpec) -> dict[str, Any]:
    """The resolved config minus where results go and how the run is tagged (what the run computes)."""
    flat = load_config(spec.config, overrides=list(spec.overrides)).flat()
    return {k: v for k, v in flat.items() if not k.startswith(("tracking.", "trainer.output_dir"))}


def design_runs(design: Design, ablations_dir: Path = ABLATIONS_DIR) -> list[RunSpec]:
    """The runs of one design: its reference first, then one per toggle (in ladder order).

    cumulative: every ladder row. leave_one_out: the last row, then it with each toggle reverted.
    one_at_a_time: the first row, then it with each toggle set. A design run that computes exactly what a
    ladder row computes is that ladder row (same name, no overrides), so its runs are shared.
    """
    ablations_dir = Path(ablations_dir)
    rows = ladder(ablations_dir)
    ts = toggles(ablations_dir)
    if design == "cumulative":
        return [_ladder_spec(rows[0], design, None, ablations_dir)] + [
            _ladder_spec(t.row, design, t.name, ablations_dir) for t in ts
        ]
    if design not in PREFIX:
        raise ValueError(f"unknown design {design!r}; designs are {', '.join(DESIGNS)}")
    ref_row = rows[-1] if design == "leave_one_out" else rows[0]
    out = [_ladder_spec(ref_row, design, None, ablations_dir)]
    ladder_specs = [_ladder_spec(r, design, None, ablations_dir) for r in rows]
    for t in ts:
        name = f"{PREFIX[design]}{t.name}"
        values = t.reverted if design == "leave_one_out" else t.values
        spec = RunSpec(
            name,
            ablations_dir / f"{ref_row}.yaml",
            tuple(override(k, v) for k, v in values.items()) + (f"{ROW_KEY}={name}",),
            design,
            t.name,
        )
        same = [r for r in ladder_specs if _computation(r) == _computation(spec)]
        out.append(_ladder_spec(same[0].name, design, t.name, ablations_dir) if same else spec)
    return out


# The placebo: the row dynamic sampling builds on, run again under another name with another sampling seed only.
PLACEBO_PREFIX = "placebo_"
PLACEBO_SEED_OFFSET = 1000  # rollout.sampling_seed_offset of the placebo: its rollouts draw other samples


def placebo_run(ablations_dir: Path = ABLATIONS_DIR) -> RunSpec:
    """The placebo row: the ladder's second-to-last row (what the last toggle is measured against) with only its
    rollouts' sampling seed changed (`rollout.sampling_seed_offset`; the data order, the evaluations and every
    other setting are its twin's). Compared with its twin, every declared statistic should show no clear change:
    whatever does is what noise alone produces at this number of seeds. Generated from the ladder, not a file."""
    twin = ladder(ablations_dir)[-2]
    name = f"{PLACEBO_PREFIX}{twin}"
    overrides = (f"rollout.sampling_seed_offset={PLACEBO_SEED_OFFSET}", f"{ROW_KEY}={name}")
    return RunSpec(name, Path(ablations_dir) / f"{twin}.yaml", overrides, "cumulative", None)


def placebo_twin(name: str) -> str | None:
    """`placebo_04_token_level_loss` -> `04_token_level_loss`; any other name -> None."""
    return name[len(PLACEBO_PREFIX) :] if name.startswith(PLACEBO_PREFIX) and len(name) > len(PLACEBO_PREFIX) else None


def all_design_runs(ablations_dir: Path = ABLATIONS_DIR) -> dict[str, RunSpec]:
    """Every run name any design uses -> its spec (a ladder row appears once, as itself), and the placebo."""
    out: dict[str, RunSpec] = {}
    for design in DESIGNS:
        for spec in design_runs(design, ablations_dir):
            out.setdefault(spec.name, spec)
    placebo = placebo_run(ablations_dir)
    out[placebo.name] = placebo
    return out


def marginal_pairs(design: Design, ablations_dir: Path = ABLATIONS_DIR) -> list[tuple[str, str, str]]:
    """(toggle, with, without) run names whose difference is each toggle's marginal effect under `design`:
    cumulative: (row, row above); leave_one_out: (full DAPO, DAPO minus it); one_at_a_time: (GRPO plus it, GRPO)."""
    runs = design_runs(design, ablations_dir)
    ref, members = runs[0], runs[1:]
    if design == "cumulative":
        by_toggle = {t.name: t for t in toggles(Path(ablations_dir))}
        return [(m.toggle, m.name, by_toggle[m.toggle].above) for m in members]
    if design == "leave_one_out":
        return [(m.toggle, ref.name, m.name) for m in members]
    return [(m.toggle, m.name, ref.name) for m in members]


def parse_run(name: str) -> tuple[Design, str] | None:
    """`dapo_minus_clip_higher` -> ("leave_one_out", "clip_higher"); a ladder row or any other name -> None."""
    for design, prefix in PREFIX.items():
        if name.startswith(prefix) and len(name) > len(prefix):
            return design, name[len(prefix) :]
    return None


def run_label(name: str) -> str:
    """A short display label for a design run (`DAPO - clip_higher`), or the name unchanged."""
    parsed = parse_run(name)
    if parsed is None:
        return name
    design, toggle = parsed
    return f"DAPO - {toggle}" if design == "leave_one_out" else f"GRPO + {toggle}"
