"""dapo.report on synthetic MLflow experiments whose final numbers are chosen here, so every table cell is known.

Store (module fixture, tmp SQLite): experiment `full` has 6 rows x 2 seeds; experiment `gappy` lacks row 03,
row 04 lacks the entropy and maj@32 metrics, and row 05 has a single seed (so its CI is the run's bootstrap).
"""

from __future__ import annotations

import csv
import json
import math
import time

import numpy as np
import pytest

from dapo import metric_names as M
from dapo.report import pipeline
from dapo.report.figures import FIGURES, seed_band
from dapo.report.load import ExperimentNotFound, load_experiment

R = list(M.PAPER_TABLE1)
# final avg@32 per row and seed (percent)
FULL = {
    R[0]: [20.0, 24.0],
    R[1]: [30.0, 31.0],
    R[2]: [33.0, 35.0],
    R[3]: [36.0, 36.0],
    R[4]: [40.0, 37.0],
    R[5]: [45.0, 48.0],
}
GAPPY = {R[0]: [20.0, 24.0], R[1]: [30.0, 31.0], R[2]: [33.0, 35.0], R[4]: [40.0, 37.0], R[5]: [45.0]}
T_975_DF1 = 12.706204736174705  # Student t quantile 0.975 with 1 degree of freedom
STEPS = 10


@pytest.fixture(scope="module")
def store(tmp_path_factory):
    from _synthetic_experiment import build_synthetic_experiment

    d = tmp_path_factory.mktemp("mlflow")
    uri = f"sqlite:///{d}/mlflow.db"
    build_synthetic_experiment(uri, "full", FULL, total_steps=STEPS, eval_every=5)
    build_synthetic_experiment(
        uri, "gappy", GAPPY, total_steps=STEPS, eval_every=5, drop_metrics={R[4]: [M.ENTROPY, M.eval_maj(32)]}
    )
    # a later standalone `dapo eval` run with the same row/seed tags but no training curves
    from mlflow.tracking import MlflowClient

    c = MlflowClient(uri)
    run = c.create_run(
        c.get_experiment_by_name("gappy").experiment_id,
        run_name=f"eval-{R[0]}-s0",
        tags={M.TAG_ROW: R[0], M.TAG_SEED: "0"},
        start_time=int(time.time() * 1000) + 10_000,
    )
    c.log_metric(run.info.run_id, M.eval_avg(32), 99.0, step=0)
    c.set_terminated(run.info.run_id, "FINISHED")
    return uri


@pytest.fixture(scope="module")
def full_report(store, tmp_path_factory):
    out = tmp_path_factory.mktemp("report_full")
    pipeline.build_report("full", store, out, x_axis="updates", gpus_per_run=8)
    return out


@pytest.fixture(scope="module")
def gappy_report(store, tmp_path_factory):
    out = tmp_path_factory.mktemp("report_gappy")
    pipeline.build_report("gappy", store, out, x_axis="rollout")
    return out


def _csv(path) -> dict[str, dict[str, str]]:
    with open(path) as f:
        return {r["row"]: r for r in csv.DictReader(f)}


def test_table1_holds_the_mean_over_seeds_delta_and_paper_column(full_report):
    rows = _csv(full_report / "table1.csv")
    assert list(rows) == R  # PAPER_TABLE1 order
    means = {r: float(np.mean(v)) for r, v in FULL.items()}
    assert [float(rows[r]["avg_mean"]) for r in R] == pytest.approx([22.0, 30.5, 34.0, 36.0, 38.5, 46.5])
    assert [float(rows[r]["avg_mean"]) for r in R] == pytest.approx([means[r] for r in R])
    assert rows[R[0]]["delta"] == ""  # nothing above row 00
    assert [float(rows[r]["delta"]) for r in R[1:]] == pytest.approx([8.5, 3.5, 2.0, 2.5, 8.0])
    assert [float(rows[r]["paper_avg"]) for r in R] == [30, 36, 38, 41, 42, 50]
    assert [float(rows[r]["paper_delta"]) for r in R[1:]] == [6, 2, 3, 1, 8]
    # synthetic curves: pass@32 = avg + 30, maj@32 = avg + 5 at every step
    assert float(rows[R[5]]["pass_mean"]) == pytest.approx(76.5)
    assert float(rows[R[5]]["maj_mean"]) == pytest.approx(51.5)
    assert rows[R[0]]["final_step"] == f"{STEPS} {STEPS}"  # the last eval, not an earlier one


def test_table1_ci_is_a_t_interval_over_two_seeds(full_report):
    r = _csv(full_report / "table1.csv")[R[0]]
    sd = math.sqrt(((20 - 22) ** 2 + (24 - 22) ** 2) / 1)  # 2.828
    half = T_975_DF1 * sd / math.sqrt(2)  # 25.41
    assert float(r["avg_std"]) == pytest.approx(sd)
    assert (float(r["ci_low"]), float(r["ci_high"])) == pytest.approx((22 - half, 22 + half))
    same = _csv(full_report / "table1.csv")[R[3]]  # equal seeds: zero-width interval
    assert (float(same["ci_low"]), float(same["ci_high"])) == pytest.approx((36.0, 36.0))


def test_table1_markdown_and_latex_show_ours_beside_the_paper(full_report):
    md = (full_report / "table1.md").read_text()
    assert "| Naive GRPO | 22.0 ± 2.8 | [-3.4, 47.4] | — | — | 30 | — | 52.0 | 27.0 | 2 | 160 | t over 2 seeds |" in md
    # Δ 46.5 - 38.5 with Welch's interval: s^2 4.5 and 4.5 over 2 seeds each, df 2, t 4.303: ±9.13
    assert (
        "| + Dynamic Sampling (DAPO) | 46.5 ± 2.1 |" in md
        and "| +8.0 [-1.1, +17.1] | +24.5 [+12.9, +36.1] | 50 | +8 |" in md
    )
    assert "Nothing missing." in md
    tex = (full_report / "table1.tex").read_text()
    assert r"\toprule" in tex and r"+ Clip-Higher & 34.0 $\pm$ 1.4" in tex


def test_compute_table_counts_tokens_and_gpu_hours(full_report):
    rows = _csv(full_report / "compute.csv")
    # per step tokens 4000 + 100 s over steps 1..10 (x3 per-step growth for row 05); elapsed 60 (s + 1) s
    assert float(rows[R[0]]["tokens_generated"]) == pytest.approx(40000 + 100 * 55)
    assert float(rows[R[5]]["tokens_generated"]) == pytest.approx(40000 + 300 * 55)
    assert float(rows[R[0]]["wall_clock_s"]) == pytest.approx(660)
    assert float(rows[R[0]]["device_hours"]) == pytest.approx(8 * 660 / 3600)  # --gpus-per-run 8
    assert float(rows[R[0]]["avg_per_device_hour"]) == pytest.approx(22.0 / (8 * 660 / 3600))
    assert float(rows[R[5]]["device_hours"]) == pytest.approx(8 * 990 / 3600)
    assert "GPU-hours" in (full_report / "compute.md").read_text()


def test_every_figure_is_written_as_png_and_pdf(full_report):
    import numpy as np
    from _synthetic_experiment import curves

    logged = set(curves(0, 50.0, 0, np.arange(3), 32, 16))
    for spec in FIGURES:
        if spec.needs is not None and spec.needs not in logged:  # e.g. the habits world's: not drawn without habits
            assert not (full_report / "figures" / f"{spec.name}.png").exists()
            continue
        png, pdf = full_report / "figures" / f"{spec.name}.png", full_report / "figures" / f"{spec.name}.pdf"
        assert png.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n" and png.stat().st_size > 10_000
        assert pdf.read_bytes()[:5] == b"%PDF-"
    assert {s.name for s in FIGURES} >= {
        "fig1_full_recipe",
        "fig2_clip_higher",
        "fig3a_clipped_prob",
        "fig3b_all_correct",
        "fig4_token_level_loss",
        "fig5_overlong_filtering",
        "fig6_dynamic_sampling",
        "response_length",
    }


def test_missing_row_and_metrics_are_named_not_raised(gappy_report, capsys):
    md = (gappy_report / "table1.md").read_text()
    missing = md.split("### Missing")[1]
    assert "row 03_soft_overlong_punishment" in missing
    assert f"run {R[4]}-s0: metric {M.eval_maj(32)} missing" in missing
    rows = _csv(gappy_report / "table1.csv")
    assert float(rows[R[0]]["avg_mean"]) == pytest.approx(22.0)  # the training run, not the eval run
    warnings = json.loads((gappy_report / "warnings.json").read_text())
    assert any(f"not eval-{R[0]}-s0" in w for w in warnings)
    assert rows[R[3]]["avg_mean"] == "" and rows[R[4]]["delta"] == ""  # no row above to compare with
    assert float(rows[R[4]]["avg_mean"]) == pytest.approx(38.5)
    # one seed: the run's own bootstrap CI (synthetic: avg -/+ 6)
    assert (float(rows[R[5]]["ci_low"]), float(rows[R[5]]["ci_high"])) == pytest.approx((39.0, 51.0))
    assert rows[R[5]]["ci_method"] == "bootstrap (1 seed)"
    report = (gappy_report / "report.md").read_text().split("## Missing")[1]
    assert f"fig4_token_level_loss: row {R[3]}" in report
    assert f"fig4_token_level_loss: {M.ENTROPY} for run {R[4]}-s0" in report
    for spec in (s for s in FIGURES if s.needs is None):  # still drawn, with what exists
        assert (gappy_report / "figures" / f"{spec.name}.png").is_file()


def test_x_axis_maps_rollout_steps_to_gradient_updates(store):
    exp = load_experiment("full", store)
    assert exp.k == 32 and len(exp.runs) == 12 and exp.warnings == []
    run = exp.runs_of(R[2])[0]
    steps = np.array([0, 5, 10])
    assert run.x_of(steps, "rollout").tolist() == [0, 5, 10]
    assert run.x_of(steps, "updates").tolist() == [0, 80, 160]  # 512 / 32 = 16 updates per rollout step
    del run.history[M.GRAD_UPDATES]  # falls back to the params
    assert run.x_of(np.array([3]), "updates").tolist() == [48]


def test_seed_band_is_mean_and_sd_over_the_seeds_present():
    x, mean, sd, n = seed_band(
        [(np.array([0, 1, 2]), np.array([1.0, 2.0, 3.0])), (np.array([0, 1]), np.array([3.0, 4.0]))]
    )
    assert x.tolist() == [0, 1, 2] and mean.tolist() == [2.0, 3.0, 3.0] and n.tolist() == [2, 2, 1]
    assert sd == pytest.approx([math.sqrt(2), math.sqrt(2), 0.0])


def test_unknown_experiment_names_the_known_ones(store, tmp_path, capsys):
    from dapo.cli import main

    with pytest.raises(ExperimentNotFound, match="full"):
        load_experiment("nope", store)
    assert main(["report", "--experiment", "nope", "--tracking-uri", store, "--out", str(tmp_path)]) == 2
    err = capsys.readouterr().err
    assert "'nope' not found" in err and "gappy" in err and "Traceback" not in err


@pytest.mark.slow
def test_cli_executes_the_notebooks_and_saves_them(store, tmp_path):
    from dapo.cli import main

    out = tmp_path / "report"
    assert (
        main(
            [
                "report",
                "--experiment",
                "gappy",
                "--tracking-uri",
                store,
                "--out",
                str(out),
                "--x-axis",
                "rollout",
                "--gpus-per-run",
                "0",
                "--cpus-per-run",
                "2",
            ]
        )
        == 0
    )
    for nb in ("table1", "figures"):
        cells = json.loads((out / "notebooks" / f"{nb}.ipynb").read_text())["cells"]
        code = [c for c in cells if c["cell_type"] == "code"]
        assert code and all(c.get("execution_count") for c in code)  # every cell ran
        assert any("injected-parameters" in c["metadata"].get("tags", []) for c in code)
    assert _csv(out / "table1.csv")[R[1]]["avg_mean"] == "30.5"
    comp = _csv(out / "compute.csv")[R[0]]
    assert comp["resources_per_run"] == "2 CPU"  # 0 GPUs -> CPU-hours
    assert float(comp["device_hours"]) == pytest.approx(2 * 660 / 3600)
    assert json.loads((out / "figures.json").read_text())["x_axis"] == "rollout"
    assert "row 03_soft_overlong_punishment" in (out / "report.md").read_text()


def _run(row: str, seed: int, avg: list[tuple[int, float]]):
    from dapo.report.runs import RunData, Series

    steps, values = zip(*avg, strict=True)
    return RunData(
        run_id=f"id-{row}-{seed}",
        name=f"{row}-s{seed}",
        row=row,
        seed=seed,
        status="finished",
        params={},
        tags={},
        start_ms=None,
        end_ms=None,
        history={M.eval_avg(4): Series(np.array(steps), np.array(values))},
    )


def test_user_rows_follow_the_paper_rows_and_survive_latex():
    from dapo.report.formats import to_latex
    from dapo.report.runs import Experiment
    from dapo.report.table1 import build_table1, table1_table

    # the last step wins even if logged first; a user's variant row comes after the paper's rows
    runs = [_run(R[0], 0, [(10, 40.0), (0, 5.0), (5, 20.0)]), _run("06_my_variant", 0, [(10, 45.0)])]
    exp = Experiment("e", "uri", 4, runs)
    t = build_table1(exp)
    assert [r.row for r in t.rows] == R + ["06_my_variant"]
    assert t.rows[0].mean == 40.0 and t.rows[-1].mean == 45.0 and t.rows[-1].paper is None
    assert t.rows[-1].delta is None  # row 05 above it has no runs
    assert f"run {R[0]}-s0: metric {M.eval_pass(4)} missing" in t.missing
    assert f"run {R[0]}-s0: metric {M.ci_low(M.eval_avg(4))} missing (no CI for one seed)" in t.missing
    tex = to_latex(table1_table(t))
    assert r"06\_my\_variant & 45.0 &" in tex and r"row 01\_overlong\_filtering (+ Overlong" in tex


def test_a_placebo_rows_change_is_read_against_its_twin_not_the_row_listed_above_it():
    from dapo.designs import placebo_run
    from dapo.report.runs import Experiment
    from dapo.report.table1 import build_table1

    placebo = placebo_run().name  # listed after row 05, a copy of row 04 with another sampling seed
    runs = [
        _run(row, seed, [(10, avg + seed)])
        for row, avg in ((R[4], 40.0), (R[5], 60.0), (placebo, 42.0))
        for seed in (0, 1)
    ]
    t = build_table1(Experiment("e", "uri", 4, runs))
    assert [r.row for r in t.rows][-2:] == [R[5], placebo]
    row = t.rows[-1]
    assert row.delta == pytest.approx(2.0)  # against row 04 (40.5), not row 05 (60.5)
    assert row.vs_first is None  # row 00 has no runs here


# --------------------------------------------------------------- per-problem samples: problems x seeds intervals
# Per-problem accuracy (percent) of each seed's final eval, 3 problems x 10 samples; the same numbers as the
# hand-worked cases in tests/test_algos_evalstats.py.
ROW_B = [[60, 40, 20], [80, 60, 40]]  # row 01 (and full DAPO below)
ROW_A = [[50, 50, 10], [50, 50, 10]]  # row 00 (and DAPO without clip-higher below)


def _samples(per_problem: list[int]) -> np.ndarray:
    return np.array([[j < pct // 10 for j in range(10)] for pct in per_problem])


@pytest.fixture(scope="module")
def evidence_report(store, tmp_path_factory):
    from _synthetic_experiment import build_synthetic_experiment

    rows = {R[0]: ROW_A, R[1]: ROW_B, R[5]: ROW_B, "dapo_minus_clip_higher": ROW_A}
    samples = {row: [_samples(seed) for seed in seeds] for row, seeds in rows.items()}
    build_synthetic_experiment(
        store, "evidence", {row: [0.0, 0.0] for row in rows}, total_steps=STEPS, eval_every=5, samples=samples
    )
    out = tmp_path_factory.mktemp("report_evidence")
    pipeline.build_report("evidence", store, out, x_axis="updates")
    return out


def test_table1_interval_counts_problems_and_seeds_from_the_eval_samples(evidence_report):
    from scipy import stats

    rows = _csv(evidence_report / "table1.csv")
    assert "dapo_minus_clip_higher" not in rows  # design runs have their own table
    r = rows[R[1]]
    assert r["ci_method"] == "problems x seeds" and float(r["avg_mean"]) == pytest.approx(50.0)
    var = 400 / 3 + 100  # problems 400 / 3, seeds 200 / 2
    half = stats.t.ppf(0.975, var**2 / ((400 / 3) ** 2 / 2 + 100**2)) * math.sqrt(var)
    assert (float(r["ci_low"]), float(r["ci_high"])) == pytest.approx((50 - half, 50 + half))
    # Δ row above, paired on problems: problems 400 / 9, seeds 100 + 0
    dvar = 400 / 9 + 100
    dhalf = stats.t.ppf(0.975, dvar**2 / ((400 / 9) ** 2 / 2 + 100**2)) * math.sqrt(dvar)
    d = 50 - 110 / 3
    assert float(r["delta"]) == pytest.approx(d)
    assert (float(r["delta_ci_low"]), float(r["delta_ci_high"])) == pytest.approx((d - dhalf, d + dhalf))


def test_marginal_effects_table_fills_each_design_with_its_runs(evidence_report):
    with open(evidence_report / "marginal_effects.csv") as f:
        rows = {r["toggle"]: r for r in csv.DictReader(f)}
    assert list(rows) == [
        "overlong_filtering",
        "clip_higher",
        "soft_overlong_punishment",
        "token_level_loss",
        "dynamic_sampling",
    ]
    loo = rows["clip_higher"]  # full DAPO (ROW_B) - DAPO without clip-higher (ROW_A): as row 01 - row 00 above
    assert (loo["leave_one_out_with"], loo["leave_one_out_without"]) == (R[5], "dapo_minus_clip_higher")
    assert float(loo["leave_one_out_delta"]) == pytest.approx(50 - 110 / 3)
    cum = rows["overlong_filtering"]
    assert float(cum["cumulative_delta"]) == pytest.approx(float(loo["leave_one_out_delta"]))
    assert cum["cumulative_ci_low"] == loo["leave_one_out_ci_low"]
    assert float(cum["paper_delta"]) == 6.0
    assert rows["clip_higher"]["one_at_a_time_delta"] == ""  # no grpo_plus_clip_higher runs: named, not faked
    md = (evidence_report / "marginal_effects.md").read_text()
    assert "one_at_a_time: no final eval for grpo_plus_clip_higher" in md.split("### Missing")[1]
    assert r"leave-one-out" in (evidence_report / "marginal_effects.tex").read_text()


def test_mechanisms_table_reports_every_declaration_with_its_verdict(full_report):
    from dapo.report.mechanisms import MECHANISMS

    with open(full_report / "mechanisms.csv") as f:
        rows = list(csv.DictReader(f))
    assert [(r["toggle"], r["metric"]) for r in rows] == [(m.toggle, m.metric_label()) for m in MECHANISMS]
    by = {(r["toggle"], r["metric"]): r for r in rows}
    # synthetic curves: trained groups with zero advantage 0.3 in every row but 0 with dynamic sampling
    zero = by[("dynamic_sampling", M.ZERO_ADV_TRAINED_FRAC)]
    assert (zero["without_row"], zero["with_row"]) == (R[4], R[5])
    assert float(zero["delta"]) == pytest.approx(-0.3) and zero["verdict"] == "as the paper"
    trunc = by[("overlong_filtering", M.TRUNC_LOSS_TOKEN_FRAC)]
    assert float(trunc["delta"]) == pytest.approx(-0.08) and trunc["verdict"] == "as the paper"
    ent = by[("clip_higher", M.ENTROPY)]  # entropy collapses in rows 00-01, holds from row 02 on
    assert float(ent["delta"]) > 0 and float(ent["ci_low"]) > 0 and ent["verdict"] == "as the paper"
    length = by[("token_level_loss", M.RESP_LEN_MEAN)]  # synthetic lengths grow with the row: against the paper
    assert float(length["ci_low"]) > 0 and length["verdict"] == "against the paper"
    md = (full_report / "mechanisms.md").read_text()
    assert "toggles moved their primary quantity in the paper's direction" in md
    assert "Moved against the paper" in md and "token_level_loss" in md.split("Moved against the paper")[1]
    png = full_report / "figures" / "mechanisms.png"
    assert png.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n" and (full_report / "figures" / "mechanisms.pdf").is_file()
    report = (full_report / "report.md").read_text()
    assert "## Mechanisms" in report and "## Marginal effect" in report and "figures/mechanisms.png" in report


def test_compare_prints_curves_and_mechanisms_and_writes_a_figure(store, tmp_path, capsys):
    from dapo.cli import main

    out = tmp_path / "cmp"
    args = ["compare", "04", "05", "--experiment", "full", "--tracking-uri", store, "--out", str(out)]
    assert main(args) == 0
    text = capsys.readouterr().out
    assert "eval avg@32 over training" in text and "Mechanism statistics" in text
    assert "final avg@32, 05_dynamic_sampling - 04_token_level_loss: +8.0 [-1.1, +17.1]" in text
    stem = f"{R[4]}_vs_{R[5]}"
    assert (out / f"{stem}.png").read_bytes()[:4] == b"\x89PNG" and (out / f"{stem}.pdf").is_file()
    with open(out / f"{stem}_curve.csv") as f:
        curve = list(csv.DictReader(f))
    assert [int(r["step"]) for r in curve] == [0, 5, 10] and float(curve[-1]["delta"]) == pytest.approx(8.0)
    with open(out / f"{stem}_mechanisms.csv") as f:
        mech = {(r["toggle"], r["metric"]): r["verdict"] for r in csv.DictReader(f)}
    assert mech[("dynamic_sampling", M.ZERO_ADV_TRAINED_FRAC)] == "as the paper"  # 05 vs 04 is that toggle's pair
    assert mech[("clip_higher", M.ENTROPY)] == "not this toggle's pair"


def test_compare_names_the_rows_when_one_is_unknown(store, tmp_path, capsys):
    from dapo.cli import main

    args = ["compare", "00", "07", "--experiment", "full", "--tracking-uri", store, "--out", str(tmp_path)]
    assert main(args) == 2
    err = capsys.readouterr().err
    assert "'07' is not a row with runs" in err and R[5] in err and "Traceback" not in err
    args[2] = "0"  # a prefix of six rows
    assert main(args) == 2 and "matches several rows" in capsys.readouterr().err


def test_runs_that_differ_in_more_than_their_toggle_are_reported_as_not_a_clean_ablation(tmp_path):
    """A ladder run on purpose with allow_confounded_ladder (or rows trained with different overrides): the runs'
    own params show it, and Table 1, the mechanisms and the marginal effects say so."""
    from dapo.report.runs import Experiment

    runs = [_run(row, 0, [(0, 10.0), (10, 20.0 + i)]) for i, row in enumerate(R)]
    for r in runs:  # what the trainer logs: the flat config; the row tag and run folder differ, as they must
        r.params.update(
            {"algorithm.eps_high": "0.2", "trainer.lr": "5e-05", "tracking.row": r.row, "trainer.seed": "0"}
        )
        r.params["trainer.output_dir"] = f"/results/runs/{r.row}/s0"
    for r in runs[2:]:
        r.params["algorithm.eps_high"] = "0.28"  # clip-higher, from row 02 on: its own key
    pipeline.write_tables(Experiment("e", "uri", 4, runs), tmp_path / "clean")
    assert "clean ablation" not in (tmp_path / "clean" / "table1.md").read_text()

    for r in runs[3:]:
        r.params["trainer.lr"] = "0.0001"  # row 03 also raised the learning rate
    exp = Experiment("e", "uri", 4, runs)
    pipeline.write_tables(exp, tmp_path / "confounded")
    for table in ("table1", "mechanisms", "marginal_effects"):
        text = (tmp_path / "confounded" / f"{table}.md").read_text()
        assert "**Not a clean ablation**" in text, table
        assert (
            f"{R[3]} vs {R[2]} (soft_overlong_punishment): trainer.lr = '0.0001' (in {R[2]}: '5e-05'): a scale" in text
        )
        assert f"{R[2]} vs {R[1]}" not in text  # clip-higher's change is its own
    assert any("Not a clean ablation" in w for w in json.loads((tmp_path / "confounded" / "warnings.json").read_text()))


def test_the_variants_report_compares_each_variant_with_its_parent_row(tmp_path):
    """Variant runs in the experiment: report/variants.md holds every declared statistic of each variant against the
    ladder row its file inherits (Δ over seeds with Welch's interval) and figures/variants.png draws them; a report
    without variant runs writes neither and does not call them missing."""
    from _synthetic_experiment import build_synthetic_experiment

    from dapo.report.pipeline import build_report
    from dapo.report.variants import VARIANT_STATISTICS

    uri = f"sqlite:///{tmp_path}/v.db"
    finals = {
        "00_naive_grpo": [20.0, 22.0, 21.0],
        "dr_grpo": [30.0, 33.0, 31.0],
        "05_dynamic_sampling": [40.0, 41.0, 42.0],
    }
    finals["gspo"] = [40.5, 40.0, 42.5]
    build_synthetic_experiment(uri, "v", finals, k=4, total_steps=10, eval_every=5)
    out = tmp_path / "report"
    build_report("v", uri, out)
    rows = list(csv.DictReader((out / "variants.csv").open()))
    assert {(r["variant"], r["parent"]) for r in rows} == {
        ("dr_grpo", "00_naive_grpo"),
        ("gspo", "05_dynamic_sampling"),
    }
    assert len(rows) == 2 * len(VARIANT_STATISTICS)
    final = {r["variant"]: r for r in rows if r["statistic"] == "final"}
    assert float(final["dr_grpo"]["delta"]) == pytest.approx(31.333 - 21.0, abs=0.01)
    assert final["dr_grpo"]["verdict"] == "clear change" and final["gspo"]["verdict"] == "no clear change"
    assert all(r["delta"] for r in rows), "every declared statistic has a value"
    assert (out / "figures" / "variants.png").is_file() and "## Variants" in (out / "report.md").read_text()
    plain = tmp_path / "plain"
    build_synthetic_experiment(uri, "plain", {k: finals[k] for k in ("00_naive_grpo", "05_dynamic_sampling")}, k=4)
    build_report("plain", uri, plain)
    assert not (plain / "variants.md").exists() and "variants" not in (plain / "report.md").read_text()


def test_the_async_report_compares_each_carried_row_with_itself_and_reads_the_rows_order(tmp_path):
    """Carried-over runs (`async_<row>`) in the experiment: report/async.md holds every declared statistic of each
    against its synchronous row (Δ over seeds with Welch's interval), a statistic a run did not log is named missing,
    and a note gives the rows' order by final accuracy each way with Kendall's tau; Table 1 lists the ladder rows
    only. Without such runs no async table is written."""
    from _synthetic_experiment import build_synthetic_experiment

    from dapo.report.pipeline import build_report
    from dapo.report.staleness import ASYNC_STATISTICS, kendall_tau

    assert kendall_tau([1, 2, 3], [10, 20, 30]) == 1 and kendall_tau([1, 2, 3], [3, 2, 1]) == -1
    assert kendall_tau([1, 2, 3, 4], [1, 2, 4, 3]) == pytest.approx(4 / 6)
    uri = f"sqlite:///{tmp_path}/a.db"
    finals = {
        "00_naive_grpo": [20.0, 22.0, 21.0],
        "05_dynamic_sampling": [40.0, 41.0, 42.0],
        "async_00_naive_grpo": [45.0, 44.0, 46.0],  # the carried rows swap places
        "async_05_dynamic_sampling": [30.0, 31.0, 29.0],
    }
    build_synthetic_experiment(uri, "a", finals, k=4, total_steps=10, eval_every=5)
    out = tmp_path / "report"
    build_report("a", uri, out)
    rows = list(csv.DictReader((out / "async.csv").open()))
    assert {(r["carried_run"], r["row"]) for r in rows} == {
        ("async_00_naive_grpo", "00_naive_grpo"),
        ("async_05_dynamic_sampling", "05_dynamic_sampling"),
    }
    assert len(rows) == 2 * len(ASYNC_STATISTICS)
    final = {r["row"]: r for r in rows if r["statistic"] == "final"}
    assert float(final["00_naive_grpo"]["delta"]) == pytest.approx(45.0 - 21.0, abs=0.01)
    assert final["05_dynamic_sampling"]["verdict"] == "clear change"
    text = (out / "async.md").read_text()
    assert "synchronous 05_dynamic_sampling, 00_naive_grpo; carried over 00_naive_grpo, 05_dynamic_sampling" in text
    assert "Kendall's tau -1.00; the same order: no" in text
    assert "generation seconds per rollout step: time/generate missing" in text  # not logged by these runs
    assert "async_" not in (out / "table1.md").read_text() and "## Carry-over" in (out / "report.md").read_text()
    plain = tmp_path / "plain"
    build_synthetic_experiment(uri, "plain", {k: finals[k] for k in ("00_naive_grpo", "05_dynamic_sampling")}, k=4)
    build_report("plain", uri, plain)
    assert not (plain / "async.md").exists()
