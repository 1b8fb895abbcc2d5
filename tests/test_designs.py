"""The leave-one-out and one-at-a-time designs as workflow targets (dry runs: what would be trained, and how)."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parent.parent
SNAKEMAKE = str(Path(sys.executable).parent / "snakemake")


def dry_run(*args: str) -> subprocess.CompletedProcess:
    return subprocess.run(
        [SNAKEMAKE, "-n", "-p", *args], cwd=REPO, capture_output=True, text=True, timeout=300, env=dict(os.environ)
    )


def _job_stats(stdout: str) -> dict[str, int]:
    stats = {}
    for line in stdout.split("Job stats:")[1].splitlines()[3:]:
        parts = line.split()
        if len(parts) != 2 or not parts[1].isdigit():
            break
        stats[parts[0]] = int(parts[1])
    return stats


def _train_commands(stdout: str) -> dict[str, str]:
    """run name -> the `dapo train ...` command line of its seed-0 job."""
    out = {}
    for line in stdout.splitlines():
        if " dapo train " in line and "/s0 " in line:
            run = line.split("--run-dir ")[1].split()[0].rstrip("/").split("/")[-2]
            out[run] = line
    return out


@pytest.mark.parametrize(
    "target, runs",
    [
        (
            "all_leave_one_out",
            {
                "05_dynamic_sampling",
                "04_token_level_loss",  # DAPO without dynamic sampling is row 04: trained once, as that row
                "dapo_minus_overlong_filtering",
                "dapo_minus_clip_higher",
                "dapo_minus_soft_overlong_punishment",
                "dapo_minus_token_level_loss",
            },
        ),
        (
            "all_one_at_a_time",
            {
                "00_naive_grpo",
                "01_overlong_filtering",  # GRPO with overlong filtering is row 01
                "grpo_plus_clip_higher",
                "grpo_plus_soft_overlong_punishment",
                "grpo_plus_token_level_loss",
                "grpo_plus_dynamic_sampling",
            },
        ),
    ],
)
def test_design_targets_train_each_run_once_per_seed_then_report(tmp_path, target, runs):
    r = dry_run(target, "--config", f"results={tmp_path}", "seeds=[0,1]")
    assert r.returncode == 0, r.stderr[-3000:]
    stats = _job_stats(r.stdout)
    assert stats["train"] == 2 * len(runs) and "evaluate" not in stats and stats["design_report"] == 1
    cmds = _train_commands(r.stdout)
    assert set(cmds) == runs
    design = target.removeprefix("all_")
    assert str(tmp_path / "tiny" / "report" / design / "marginal_effects.md") in r.stdout
    assert not any(tmp_path.iterdir())  # a dry run writes nothing


def test_a_design_run_is_its_reference_row_file_plus_the_toggles_keys(tmp_path):
    r = dry_run("all_designs", "--config", f"results={tmp_path}")
    assert r.returncode == 0, r.stderr[-3000:]
    cmds = _train_commands(r.stdout)
    assert len(cmds) == 14  # 6 ladder rows + 4 leave-one-out + 4 one-at-a-time runs
    minus = cmds["dapo_minus_clip_higher"]
    assert "configs/ablations/05_dynamic_sampling.yaml" in minus
    assert "algorithm.eps_high=0.2 tracking.row=dapo_minus_clip_higher" in minus
    plus = cmds["grpo_plus_token_level_loss"]
    assert "configs/ablations/00_naive_grpo.yaml" in plus and "algorithm.loss_agg=token-mean" in plus
    row = cmds["02_clip_higher"]  # a ladder row's command is unchanged: its own file, no design overrides
    assert "configs/ablations/02_clip_higher.yaml" in row and "tracking.row=" not in row


def test_all_async_plans_each_row_beside_itself_carried_over(tmp_path):
    """`snakemake all_async` (a dry run): every ladder row and its carry-over twin (the row's own file with
    rollout.max_staleness 1 and token_tis), every seed, then one report with the async table."""
    r = dry_run("all_async", "--config", f"results={tmp_path}", "seeds=[0,1]")
    assert r.returncode == 0, r.stderr[-3000:]
    stats = _job_stats(r.stdout)
    rows = {p.stem for p in (REPO / "configs" / "ablations").glob("*.yaml")}
    assert stats["train"] == 2 * 2 * len(rows) and stats["async_report"] == 1
    cmds = _train_commands(r.stdout)
    assert set(cmds) == rows | {f"async_{row}" for row in rows}
    carried = cmds["async_03_soft_overlong_punishment"]
    assert "configs/ablations/03_soft_overlong_punishment.yaml" in carried
    assert "rollout.max_staleness=1 algorithm.rollout_correction=token_tis" in carried
    assert "max_staleness" not in cmds["03_soft_overlong_punishment"]
    assert str(tmp_path / "tiny" / "report" / "async" / "async.md") in r.stdout


@pytest.mark.parametrize("preset", ["tiny", "qwen2.5-32b"])
def test_all_variants_plans_each_variant_beside_its_parent(tmp_path, preset):
    """`snakemake all_variants` (a dry run, for the tiny and the paper's preset): every variant file and the ladder
    rows they inherit, each seed, then one variants report."""
    r = dry_run("all_variants", "--config", f"results={tmp_path}", f"preset={preset}", "seeds=[0,1,2]")
    assert r.returncode == 0, r.stderr[-3000:]
    stats = _job_stats(r.stdout)
    runs = {"00_naive_grpo", "05_dynamic_sampling", "gspo", "cispo", "clip_cov", "kl_cov", "dr_grpo", "tis"}
    runs |= {"sapo", "gmpo", "dppo_tv", "dppo_kl", "off_policy_mask"}  # the 2026 baselines
    assert stats["train"] == 3 * len(runs) and stats["variants_report"] == 1
    cmds = _train_commands(r.stdout)
    assert set(cmds) == runs
    assert "configs/variants/gspo.yaml" in cmds["gspo"] and "tracking.row=gspo" in cmds["gspo"]
    assert "configs/ablations/05_dynamic_sampling.yaml" in cmds["05_dynamic_sampling"]
    assert str(tmp_path / preset / "report" / "variants" / "variants.md") in r.stdout
    if preset == "qwen2.5-32b":
        assert "Clip-Cov and KL-Cov add one no-grad forward pass per update" in r.stderr


def test_a_variant_that_sets_more_than_its_keys_is_refused_with_the_file_and_the_key(tmp_path):
    from dapo.config import ConfigError
    from dapo.designs import ABLATIONS_DIR, variants

    d = tmp_path / "variants"
    d.mkdir()
    parent = os.path.relpath(ABLATIONS_DIR / "05_dynamic_sampling.yaml", d)
    (d / "gspo.yaml").write_text(
        f"inherits: {parent}\nalgorithm:\n  policy_loss: gspo\n  eps_low: 3.0e-4\ntrainer:\n  lr: 1.0e-5\n"
    )
    with pytest.raises(ConfigError) as err:
        variants(d)
    assert str(d / "gspo.yaml") in str(err.value) and "`trainer.lr`" in str(err.value)
    assert "not a key of variant gspo" in str(err.value)
    (d / "gspo.yaml").write_text("algorithm:\n  policy_loss: gspo\n")  # no parent row
    with pytest.raises(ConfigError, match="inherits a row of the ladder"):
        variants(d)
    (d / "gspo.yaml").unlink()
    (d / "gpso.yaml").write_text(f"inherits: {parent}\nalgorithm:\n  policy_loss: gspo\n")
    with pytest.raises(ConfigError, match="no variant is named 'gpso'"):
        variants(d)
