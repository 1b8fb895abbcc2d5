"""Ablation designs generated from the one config ladder in configs/ablations/ (no copied files).

The ladder is cumulative (the paper's Table 1): row k inherits row k-1 and sets only its own toggle's keys, so a
toggle *is* the keys its row file sets (`tracking.row` aside). Three designs follow, each a reference run and one
run per toggle (a design run equal to a ladder row is that row's run):

- cumulative: row k against row k-1 (the paper's; each gain is conditional on every toggle above it);
- leave_one_out: full DAPO (the last row) against full DAPO with one toggle's keys reverted, run `dapo_minus_<toggle>`;
- one_at_a_time: naive GRPO (the first row) against naive GRPO with one toggle's keys set, run `grpo_plus_<toggle>`.

A fourth, configs/variants/, runs each beside its parent row (`variant_runs`; docs/variants.md). A fifth, `async`,
runs each ladder row again with rollouts carried over to the next step (`rollout.max_staleness: 1` and the decoupled
objective's weight, `async_runs`; docs/staleness.md). Details: docs/evidence.md, section 4; docs/architecture.md,
"designs.py".
"""

from __future__ import annotations

import json
from dataclasses import dataclass
from functools import cache
from pathlib import Path
from typing import Any, Literal

import yaml

from dapo.config import ABLATIONS_DIR, PRESETS_DIR, REPO_ROOT, ConfigError, load_config, read_chain, resolve_preset

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
    design: str  # one of DESIGNS, or "variants"
    toggle: str | None  # None for a design's reference run (a variant's name for a variant run)


def ladder(ablations_dir: Path = ABLATIONS_DIR) -> list[str]:
    """The ladder's row names (file stems), in order."""
    return sorted(p.stem for p in Path(ablations_dir).glob("*.yaml"))


def toggle_name(row: str) -> str:
    """`02_clip_higher` -> `clip_higher` (the numeric prefix orders the ladder; it is not part of the toggle)."""
    head, _, rest = row.partition("_")
    return rest if head.isdigit() and rest else row


def _dotted(d: dict[str, Any], prefix: str = "") -> dict[str, Any]:
    """{"algorithm": {"eps_high": 0.28}} -> {"algorithm.eps_high": 0.28}."""
    out: dict[str, Any] = {}
    for k, v in d.items():
        out.update(_dotted(v, f"{prefix}{k}.") if isinstance(v, dict) else {f"{prefix}{k}": v})
    return out


def _own_keys(path: Path) -> dict[str, Any]:
    """The dotted keys a row file itself sets (its `inherits:` and `tracking.row` aside)."""
    return {k: v for k, v in _dotted(read_chain(path)[-1][1]).items() if k != ROW_KEY}


@cache
def toggles(ablations_dir: Path = ABLATIONS_DIR) -> tuple[Toggle, ...]:
    """Every toggle of the ladder, in row order (the first row adds none). A key may be set by one row only (a
    design reverts or sets a toggle's keys alone); ValueError naming the rows otherwise."""
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
    """A `section.key=value` override `dapo.config.parse_override` reads back as `value` (plain string or JSON)."""
    if isinstance(value, str) and yaml.safe_load(value) == value:
        return f"{key}={value}"
    return f"{key}={json.dumps(value)}"


def _ladder_spec(row: str, design: Design, toggle: str | None, ablations_dir: Path) -> RunSpec:
    return RunSpec(row, Path(ablations_dir) / f"{row}.yaml", (), design, toggle)


# Keys that name or place a run rather than say what it computes.
RUN_KEYS = ("tracking.", "trainer.output_dir")


def _computation(spec: RunSpec) -> dict[str, Any]:
    """The resolved config minus where results go and how the run is tagged (what the run computes)."""
    flat = load_config(spec.config, overrides=list(spec.overrides)).flat()
    return {k: v for k, v in flat.items() if not k.startswith(RUN_KEYS)}


def assay_pairs(toggle: str) -> list[tuple[str, str]]:
    """(with, without) runs of `toggle`'s assay (dapo.report.assays): its cumulative and one-at-a-time pairs."""
    t = next(t for t in toggles() if t.name == toggle)
    return [(t.row, t.above), (PREFIX["one_at_a_time"] + t.name, ladder()[0])]


def design_runs(design: Design, ablations_dir: Path = ABLATIONS_DIR) -> list[RunSpec]:
    """The runs of one design (the module docstring): its reference first, then one per toggle (in ladder order); a
    design run that computes exactly what a ladder row computes is that ladder row (same name, no overrides)."""
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
    """The placebo: the ladder's second-to-last row with only `rollout.sampling_seed_offset` changed (data order,
    evals, all else its twin's). Against its twin no declared statistic should change: whatever does is noise at this
    number of seeds. Generated from the ladder, not a file."""
    twin = ladder(ablations_dir)[-2]
    name = f"{PLACEBO_PREFIX}{twin}"
    overrides = (f"rollout.sampling_seed_offset={PLACEBO_SEED_OFFSET}", f"{ROW_KEY}={name}")
    return RunSpec(name, Path(ablations_dir) / f"{twin}.yaml", overrides, "cumulative", None)


def placebo_twin(name: str) -> str | None:
    """`placebo_04_token_level_loss` -> `04_token_level_loss`; any other name -> None."""
    return name[len(PLACEBO_PREFIX) :] if name.startswith(PLACEBO_PREFIX) and len(name) > len(PLACEBO_PREFIX) else None


# The async design: each ladder row with its rollouts carried over to the next step, one weight version stale at most,
# and the decoupled objective's truncated importance weight (docs/algorithm.md section 13), run `async_<row>`.
ASYNC_PREFIX = "async_"
ASYNC_OVERRIDES = (("rollout.max_staleness", 1), ("algorithm.rollout_correction", "token_tis"))


def async_runs(ablations_dir: Path = ABLATIONS_DIR) -> list[RunSpec]:
    """The async design's carry-over runs: each ladder row's file with `ASYNC_OVERRIDES` (its row beside it)."""
    return [
        RunSpec(
            f"{ASYNC_PREFIX}{row}",
            Path(ablations_dir) / f"{row}.yaml",
            tuple(override(k, v) for k, v in ASYNC_OVERRIDES) + (f"{ROW_KEY}={ASYNC_PREFIX}{row}",),
            "async",
            row,
        )
        for row in ladder(ablations_dir)
    ]


def async_pairs(ablations_dir: Path = ABLATIONS_DIR) -> list[tuple[str, str]]:
    """(carry-over run, its synchronous ladder row) for every row."""
    return [(spec.name, spec.toggle) for spec in async_runs(ablations_dir)]  # type: ignore[misc]


def all_design_runs(ablations_dir: Path = ABLATIONS_DIR, variants_dir: Path | None = None) -> dict[str, RunSpec]:
    """Every run name any design uses -> its spec (a ladder row once), the placebo, the variants and the async
    design's carry-over runs."""
    out: dict[str, RunSpec] = {}
    for design in DESIGNS:
        for spec in design_runs(design, ablations_dir):
            out.setdefault(spec.name, spec)
    placebo = placebo_run(ablations_dir)
    out[placebo.name] = placebo
    for spec in variant_runs(variants_dir or VARIANTS_DIR, ablations_dir):
        out.setdefault(spec.name, spec)
    for spec in async_runs(ablations_dir):
        out.setdefault(spec.name, spec)
    return out


# ------------------------------------------------------------------------------------------------- variants
VARIANTS_DIR = REPO_ROOT / "configs" / "variants"
# The keys each variant may set: its loss and that loss's parameters (dapo/algos/policy_loss.py), Dr. GRPO's advantage
# and normaliser, the rollout correction's mode and bounds. Anything else would measure more than itself: refused.
VARIANT_KEYS: dict[str, frozenset[str]] = {
    "gspo": frozenset({"algorithm.policy_loss", "algorithm.eps_low", "algorithm.eps_high", "algorithm.loss_agg"}),
    "cispo": frozenset({"algorithm.policy_loss", "algorithm.cispo_clip_max", "algorithm.loss_agg"}),
    "clip_cov": frozenset(  # with the PPO clip it replaces clip-higher in: its authors' 1 / 1, no dual-clip
        {"algorithm.policy_loss", "algorithm.clip_cov_ratio", "algorithm.clip_cov_lb", "algorithm.clip_cov_ub"}
        | {"algorithm.eps_low", "algorithm.eps_high", "algorithm.dual_clip_c"}
    ),
    "kl_cov": frozenset({"algorithm.policy_loss", "algorithm.kl_cov_ratio", "algorithm.kl_cov_coef"}),
    "dr_grpo": frozenset({"algorithm.norm_adv_by_std", "algorithm.loss_agg", "algorithm.seq_token_sum_constant"}),
    "tis": frozenset(
        {"algorithm.rollout_correction", "algorithm.rollout_correction_cap", "algorithm.rollout_correction_floor"}
    ),
    "sapo": frozenset(
        {"algorithm.policy_loss", "algorithm.sapo_tau_pos", "algorithm.sapo_tau_neg", "algorithm.loss_agg"}
    ),
    "gmpo": frozenset({"algorithm.policy_loss", "algorithm.eps_low", "algorithm.eps_high", "algorithm.loss_agg"}),
    "dppo_tv": frozenset({"algorithm.policy_loss", "algorithm.eps_low", "algorithm.eps_high", "algorithm.loss_agg"}),
    "dppo_kl": frozenset({"algorithm.policy_loss", "algorithm.eps_low", "algorithm.eps_high", "algorithm.loss_agg"}),
    "off_policy_mask": frozenset({"algorithm.off_policy_mask"}),
}


@dataclass(frozen=True)
class Variant:
    """One file of configs/variants/: its name (the file's stem), the ladder row it inherits and what it sets."""

    name: str
    parent: str  # a ladder row: "05_dynamic_sampling"
    path: Path
    values: dict[str, Any]


def variants(variants_dir: Path = VARIANTS_DIR, ablations_dir: Path = ABLATIONS_DIR) -> tuple[Variant, ...]:
    """Every variant file, checked (a `VARIANT_KEYS` name, a ladder row as parent, only its own keys): ConfigError."""
    variants_dir, ablations_dir = Path(variants_dir), Path(ablations_dir).resolve()
    rows = set(ladder(ablations_dir))
    out = []
    for path in sorted(variants_dir.glob("*.yaml")):
        name = path.stem
        if name not in VARIANT_KEYS:
            raise ConfigError(
                f"{path}: no variant is named {name!r}; the variants are {', '.join(VARIANT_KEYS)} (a new one "
                "needs its keys in dapo.designs.VARIANT_KEYS)"
            )
        chain = read_chain(path)
        parent = chain[-2][0] if len(chain) > 1 else None
        if parent is None or parent.parent != ablations_dir or parent.stem not in rows:
            raise ConfigError(
                f"{path}: a variant inherits a row of the ladder ({ablations_dir}), not "
                f"{parent or 'nothing'}: set `inherits: ../ablations/<row>.yaml`"
            )
        own = _dotted(chain[-1][1])
        if own.get(ROW_KEY, name) != name:
            raise ConfigError(f"{path}: `{ROW_KEY}: {own[ROW_KEY]}`: a variant's row is its file's name, {name}")
        values = {k: v for k, v in own.items() if k != ROW_KEY}
        extra = sorted(set(values) - VARIANT_KEYS[name])
        if extra:
            raise ConfigError(
                f"{path}: sets `{extra[0]}`{' (and ' + ', '.join(extra[1:]) + ')' if extra[1:] else ''}, which is not "
                f"a key of variant {name} (its keys: {', '.join(sorted(VARIANT_KEYS[name]))}): a variant changes only "
                "its own keys against its parent row, as a ladder row does; move scale keys to a preset"
            )
        if not values:
            raise ConfigError(f"{path}: sets none of its keys ({', '.join(sorted(VARIANT_KEYS[name]))})")
        out.append(Variant(name, parent.stem, path, values))
    return tuple(out)


def variant_runs(variants_dir: Path = VARIANTS_DIR, ablations_dir: Path = ABLATIONS_DIR) -> list[RunSpec]:
    """The variants design: each variant (run name = its file's stem) and each variant's parent row, parents first."""
    vs = variants(variants_dir, ablations_dir) if Path(variants_dir).is_dir() else ()
    parents = sorted({v.parent for v in vs})
    return [_ladder_spec(p, "variants", None, ablations_dir) for p in parents] + [
        RunSpec(v.name, v.path, (f"{ROW_KEY}={v.name}",), "variants", v.name) for v in vs
    ]


def variant_pairs(variants_dir: Path = VARIANTS_DIR, ablations_dir: Path = ABLATIONS_DIR) -> list[tuple[str, str]]:
    """(variant, its parent row) for every variant."""
    return [(v.name, v.parent) for v in variants(variants_dir, ablations_dir)]


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


def parse_run(name: str) -> tuple[str, str] | None:
    """`dapo_minus_clip_higher` -> ("leave_one_out", "clip_higher"), `async_02_clip_higher` -> ("async",
    "02_clip_higher"); a ladder row or any other name -> None."""
    for design, prefix in {**PREFIX, "async": ASYNC_PREFIX}.items():
        if name.startswith(prefix) and len(name) > len(prefix):
            return design, name[len(prefix) :]
    return None


# --------------------------------------------------------------------------- is a ladder a clean ablation?
# The keys each of the paper's toggles may set (a row names its toggle: `02_clip_higher`); a user's own toggle may set
# any algorithm key no preset sets. Anything else is scale (presets own it) or another toggle's: a row changing it
# measures more than its toggle (the released recipe's per-row scripts differed in such keys).
TOGGLE_KEYS: dict[str, frozenset[str]] = {
    "overlong_filtering": frozenset({"algorithm.overlong_filter"}),
    "clip_higher": frozenset({"algorithm.eps_high", "algorithm.eps_low"}),
    "soft_overlong_punishment": frozenset({"algorithm.overlong_penalty"}),
    "token_level_loss": frozenset({"algorithm.loss_agg"}),
    "dynamic_sampling": frozenset({"algorithm.dynamic_sampling"}),
}
TOGGLE_SECTION = "algorithm"
# How a user runs a ladder that fails the check on purpose (the report then says the rows are not a clean ablation).
ALLOW_FLAG = "--allow-confounded-ladder"  # dapo config, dapo train
ALLOW_KEY = "allow_confounded_ladder"  # configs/workflow.yaml
LADDER_FIX = (
    "fix: move scale keys into a preset (configs/presets/) or the workflow's `overrides` (every row alike), and each "
    f"other change into a row of its own; to run this ladder on purpose: `dapo config` or `dapo train` {ALLOW_FLAG}, "
    f"or the workflow's `--config {ALLOW_KEY}=true` (the report then says the rows are not a clean ablation)"
)


def preset_keys(preset: str | Path | None = None) -> frozenset[str]:
    """Every dotted key a preset sets (each preset in configs/presets/, and `preset`): scale, which no row may set."""
    files = sorted(PRESETS_DIR.glob("*.yaml")) + ([resolve_preset(preset)] if preset is not None else [])
    return frozenset(k for f in files for _, d in read_chain(f) for k in _dotted(d))


def why_not(key: str, toggle: str | None, scale: frozenset[str]) -> str | None:
    """Why a step that adds `toggle` (None: the ladder's first row) may not set or change `key`; None if it may."""
    if key == ROW_KEY:
        return None
    section = key.split(".", 1)[0]
    if key in scale or section not in (TOGGLE_SECTION, "tracking"):
        return "a scale key (presets own it)"
    if section != TOGGLE_SECTION:
        return "not a toggle's key (it says where the run is logged)"
    declared = TOGGLE_KEYS.get(toggle or "")
    if declared is not None and key not in declared:
        return f"not a key of {toggle}"
    return None


def departures(
    row: dict[str, Any],
    above: dict[str, Any],
    toggle: str | None,
    scale: frozenset[str],
    also: dict[str, Any] | None = None,
    skip: tuple[str, ...] = (ROW_KEY,),
) -> dict[str, tuple[Any, Any, str]]:
    """Where `row` is not `above` plus `toggle` (flat configs or MLflow params): key -> (above, row, why), on shared
    keys but `skip`; `also` (the row file's keys) adds forbidden ones even when equal (a scale key set to one preset's
    value still overrides every other preset's)."""
    changed = {k for k in row.keys() & above.keys() if row[k] != above[k]}
    out = {}
    for k in sorted(changed | set(also or ())):
        if k.startswith(skip):
            continue
        why = why_not(k, toggle, scale)
        if why is not None:
            out[k] = (above.get(k), row[k] if k in row else (also or {}).get(k), why)
    return out


def describe_departures(bad: dict[str, tuple[Any, Any, str]], above: str) -> list[str]:
    return [f"{k} = {new!r} (in {above}: {old!r}): {why}" for k, (old, new, why) in bad.items()]


def _differs(row: str, above: str, bad: dict[str, tuple[Any, Any, str]]) -> str:
    declared = TOGGLE_KEYS.get(toggle_name(row))
    what = f"{toggle_name(row)} ({', '.join(sorted(declared))})" if declared else f"its toggle {toggle_name(row)}"
    lines = describe_departures(bad, f"{above}.yaml")
    return f"differs from {above}.yaml in more than {what}:\n" + "\n".join(f"      {line}" for line in lines)


def ladder_problems(
    ablations_dir: Path = ABLATIONS_DIR, preset: str | Path | None = None, overrides: list[str] | tuple[str, ...] = ()
) -> list[str]:
    """Why the ladder is not a clean cumulative ablation under `preset`: per row file, the keys beyond its toggle's
    (`TOGGLE_KEYS`) where it differs from the row above, and scale keys it sets; empty when clean."""
    ablations_dir = Path(ablations_dir)
    rows = ladder(ablations_dir)
    scale = preset_keys(preset)
    flats = {r: load_config(ablations_dir / f"{r}.yaml", preset=preset, overrides=overrides).flat() for r in rows}
    out = []
    for i, row in enumerate(rows):
        path = ablations_dir / f"{row}.yaml"
        own = _own_keys(path)
        if i == 0:
            lines = [f"{k} = {v!r}: {why}" for k, v in own.items() if (why := why_not(k, None, scale))]
            if lines:
                out.append(f"{path}: the ladder's first row sets " + "; ".join(lines))
            continue
        above = rows[i - 1]
        bad = departures(flats[row], flats[above], toggle_name(row), scale, also=own)
        if not bad:
            continue
        text = f"{path}: {_differs(row, above, bad)}"
        parent = read_chain(path)[-2][0] if len(read_chain(path)) > 1 else None
        if parent != (ablations_dir / f"{above}.yaml").resolve():
            text += f"\n      (it inherits {parent.name if parent else 'nothing'}, not the row above, {above}.yaml)"
        out.append(text)
    return out


def check_ladder(
    ablations_dir: Path = ABLATIONS_DIR,
    preset: str | Path | None = None,
    overrides: list[str] | tuple[str, ...] = (),
    allow: bool = False,
) -> list[str]:
    """Raise ConfigError naming every row that is not one toggle away from the row above (`ladder_problems`),
    with the fix; with `allow`, return the problems instead (for a warning)."""
    problems = ladder_problems(ablations_dir, preset, overrides)
    if problems and not allow:
        raise ConfigError(
            f"the ladder in {ablations_dir} is not a clean ablation: each row may differ from the row above only in "
            "its own toggle's keys, and no row may set a scale key\n"
            + "\n".join(f"  {p}" for p in problems)
            + f"\n  {LADDER_FIX}"
        )
    return problems


def check_run_file(
    config: str | Path | None,
    preset: str | Path | None = None,
    overrides: list[str] | tuple[str, ...] = (),
    allow: bool = False,
) -> list[str]:
    """The ladder check of a run's config file (`dapo config`, `dapo train`): a ladder row with its whole ladder; a
    file outside whose `tracking.row` names a row (of the ladder its `inherits:` chain passes, else configs/ablations/)
    as that row, against the row above. ConfigError with the fix, or with `allow` the problems."""
    if config is None:
        return []
    if (ladder_dir := ladder_dir_of(config)) is not None:
        return check_ladder(ladder_dir, preset, overrides, allow)
    chain = read_chain(config)
    at = [i + 1 for i, (p, _) in enumerate(chain[:-1]) if ladder_dir_of(p) is not None] or [0]
    ablations_dir = ladder_dir_of(chain[at[-1] - 1][0]) if at[-1] else ABLATIONS_DIR
    flat, rows = load_config(config, preset=preset, overrides=overrides).flat(), ladder(ablations_dir)
    if (row := flat[ROW_KEY]) not in rows:
        return []
    i = rows.index(row)
    above = rows[max(i - 1, 0)]  # the first row: against itself, where only scale is refused (as in the ladder)
    own = {k: v for _, d in chain[at[-1] :] for k, v in _dotted(d).items() if k != ROW_KEY}  # below the ladder
    above_flat = load_config(ablations_dir / f"{above}.yaml", preset=preset, overrides=overrides).flat()
    bad = departures(flat, above_flat, toggle_name(row) if i else None, preset_keys(preset), also=own)
    if not bad:
        return []
    what = _differs(row, above, bad) if i else "sets " + "; ".join(describe_departures(bad, f"{above}.yaml"))
    problem = f"{config}: its run is labelled {row}, a row of {ablations_dir}, and it {what}"
    if not allow:
        raise ConfigError(f"{problem}\n  {LADDER_FIX}; or name the run otherwise (`{ROW_KEY}: <name>`)")
    return [problem]


def ladder_dir_of(config: str | Path | None) -> Path | None:
    """The ladder (folder of 2+ `<number>_<toggle>.yaml` rows) a config file is a row of, else None."""
    if config is None:
        return None
    path = Path(config).resolve()
    numbered = [p for p in path.parent.glob("*.yaml") if toggle_name(p.stem) != p.stem]
    return path.parent if path in numbered and len(numbered) >= 2 else None
