"""The workflow's spec and plan (dapo.workflow_spec, `dapo plan`), in Python: no Snakemake here
(tests/test_workflow.py runs the workflow's dry runs)."""

from __future__ import annotations

import json
import re
from pathlib import Path

import pytest

from dapo import workflow_spec as W
from dapo.cli import main
from dapo.config import load_config
from dapo.designs import ladder
from dapo.metric_names import PAPER_TABLE1
from dapo.trainer import RESUME_EXIT_CODE

REPO = Path(__file__).resolve().parent.parent


def config(**keys):
    """configs/workflow.yaml with `keys` on top, as the workflow validates it (schema defaults filled in)."""
    import yaml

    cfg = W.with_defaults({**yaml.safe_load(W.WORKFLOW_CONFIG.read_text()), **keys})
    W.validate(cfg)
    return cfg


def test_the_rows_are_the_ladders_files_and_the_papers_labels_name_each_of_them():
    """One list of rows: the workflow's `rows: all` is the ladder's files, and the paper's Table 1 labels it."""
    assert ladder() == sorted(p.stem for p in (REPO / "configs" / "ablations").glob("*.yaml"))
    assert list(PAPER_TABLE1) == ladder()


def test_the_schema_owns_the_defaults():
    cfg = W.with_defaults({"preset": "tiny", "rows": "all", "seeds": [0], "overrides": [], "results": "r"})
    assert cfg["max_resubmits"] == 5 and cfg["attach_poll_s"] == 60 and cfg["allow_confounded_ladder"] is False
    assert cfg["tracking_uri"] is None and cfg["experiment"] is None and cfg["tiny_world"] is None
    # the rules spell no default of their own
    for smk in (REPO / "workflow").rglob("*.smk"):
        assert "config.get(" not in smk.read_text(), smk


def test_tiny_spec_has_every_run_with_its_command_and_the_cpu_plan(tmp_path):
    spec = W.build_spec(config(results=str(tmp_path), seeds=[0, 1], tiny_world=str(tmp_path / "world")))
    assert json.loads(json.dumps(spec)) == spec  # plain JSON
    results = tmp_path.resolve() / "tiny"
    assert spec["rows"] == ladder() and spec["seeds"] == [0, 1] and spec["base_model"]["source"] == "tiny"
    assert spec["resume_exit_code"] == RESUME_EXIT_CODE and spec["max_resubmits"] == 5
    assert spec["base_model"]["source"] == "tiny" and spec["base_model"]["marker"].endswith("world/manifest.json")
    assert {"dapo_minus_clip_higher", "grpo_plus_dynamic_sampling", *ladder()} <= set(spec["runs"])
    run = spec["runs"]["dapo_minus_clip_higher"]
    assert run["config"].endswith("configs/ablations/05_dynamic_sampling.yaml")
    s1 = run["seeds"]["1"]
    assert s1["run_dir"] == str(results / "runs" / "dapo_minus_clip_higher" / "s1") and s1["priority"] == 1
    assert s1["train_args"][:6] == ["--config", run["config"], "--preset", "tiny", "--run-dir", s1["run_dir"]]
    assert "algorithm.eps_high=0.2" in s1["train_args"] and "trainer.seed=1" in s1["train_args"]
    assert f"tracking.uri=sqlite:///{results}/mlflow.db" in s1["train_args"]
    assert s1["srun"].endswith("--job-name=dapo-dapo_minus_clip_higher-s1")
    assert spec["runs"]["00_naive_grpo"]["seeds"]["0"]["priority"] == 0
    assert spec["resources"]["train"]["slurm_extra"] == "--signal=USR1@60 --open-mode=append"
    assert spec["local_launcher"]["train"] == "env" and spec["refusal"] is None
    assert "CPU only (no GPU budget)" in spec["plan_text"] and "+ Dynamic Sampling (DAPO)" in spec["plan_text"]
    assert set(spec["designs"]) == {
        "leave_one_out",
        "one_at_a_time",
        "designs",
        "evidence",
        "variants",
        "assay_clip_higher",
        "assay_token_level_loss",
        "assay_overlong_filtering",
        "async",
    }
    # the async design: every row beside itself carried over, the row's own file with the two carry-over keys
    assert spec["designs"]["async"] == [*ladder(), *(f"async_{row}" for row in ladder())]
    carried = spec["runs"]["async_02_clip_higher"]["seeds"]["1"]["train_args"]
    assert carried[1].endswith("configs/ablations/02_clip_higher.yaml")
    assert {"rollout.max_staleness=1", "algorithm.rollout_correction=token_tis"} <= set(carried)
    # the overlong-filtering assay: its ladder pair (row 01 is row 00 with the filter: its one-at-a-time pair too)
    assert spec["designs"]["assay_overlong_filtering"] == ["00_naive_grpo", "01_overlong_filtering"]
    # the clip-higher assay: its ladder pair (its one-at-a-time pair trains the same runs in its world)
    assay = spec["designs"]["assay_clip_higher"]
    assert assay == ["01_overlong_filtering", "02_clip_higher"]
    assert all(r in spec["runs"] for r in assay)
    # the token-level-loss assay: both pairs (its loops never reach the cap, but rows 00 and 03 differ in the clip)
    token = spec["designs"]["assay_token_level_loss"]
    assert token == [
        "00_naive_grpo",
        "03_soft_overlong_punishment",
        "04_token_level_loss",
        "grpo_plus_token_level_loss",
    ]
    assert all(r in spec["runs"] for r in token)
    # the variants design: each variant of configs/variants/ and the rows they inherit, every one a run of the spec
    variants = spec["designs"]["variants"]
    assert {"gspo", "cispo", "clip_cov", "kl_cov", "dr_grpo", "tis", "00_naive_grpo", "05_dynamic_sampling"} | {
        "sapo",
        "gmpo",
        "dppo_tv",
        "dppo_kl",
        "off_policy_mask",
    } <= set(variants)
    assert all(v in spec["runs"] for v in variants)
    gspo = spec["runs"]["gspo"]["seeds"]["0"]["train_args"]
    assert gspo[1].endswith("configs/variants/gspo.yaml") and "tracking.row=gspo" in gspo
    assert "--allow-confounded-ladder" not in s1["train_args"]  # `dapo train` checks the ladder too, unless told
    allowed = W.build_spec(config(results=str(tmp_path), allow_confounded_ladder=True), with_plan=False)
    assert allowed["plan_text"] is None
    assert "--allow-confounded-ladder" in allowed["runs"]["02_clip_higher"]["seeds"]["0"]["train_args"]


def test_the_paper_plan_fits_and_a_small_gpu_is_refused_with_the_keys(tmp_path):
    spec = W.build_spec(config(preset="qwen2.5-32b", results=str(tmp_path)), jobs=64)
    assert spec["refusal"] is None and ": fits" in spec["plan_text"] and "cost per row" in spec["plan_text"]
    # the variants' costs: what they change, and a line each
    text = spec["plan_text"]
    assert "variants (`all_variants`" in text and "Clip-Cov and KL-Cov add one no-grad forward" in text
    # carry-over's price beside each row (the variants' section prices none): less generation, never more
    carry = [ln for ln in text.splitlines() if ln.startswith("      - ")]
    assert [ln.split()[1].rstrip(":") for ln in carry] == spec["rows"]
    for ln in carry:
        hours = re.search(r"([\d.]+) -> ([\d.]+) h \(", ln)
        assert hours and float(hours.group(2)) <= float(hours.group(1)), ln
    names = ("05_dynamic_sampling", "gspo", "clip_cov")
    rows = {
        ln.split()[0]: ln.split()[1:] for ln in text.splitlines() if ln.startswith("    ") and ln.split()[0] in names
    }
    assert rows["gspo"] == rows["05_dynamic_sampling"]  # the same cost as its parent, column for column
    train_s = {k: float(v[4].split("-")[0]) for k, v in rows.items()}  # "train s" at the first step
    assert train_s["clip_cov"] > train_s["05_dynamic_sampling"]  # one more forward pass per update
    assert spec["resources"]["train"]["gres"] == "gpu:h100:8" and spec["base_model"]["source"] == "hub"
    small = config(preset="qwen2.5-32b", results=str(tmp_path))
    small["plan"] = {**small["plan"], "gpu_memory_gib": 40}
    spec = W.build_spec(small)
    assert "DOES NOT FIT" in spec["plan_text"] and "trainer.micro_batch_tokens" in spec["refusal"]
    assert spec["refusal"].startswith(str(REPO / "configs" / "presets" / "qwen2.5-32b.yaml"))


def test_concurrency_follows_jobs_and_train_nodes():
    assert W.train_concurrency(12, 16, None, None) == 12
    assert W.train_concurrency(12, 16, 64, 32) == 2
    assert W.train_concurrency(12, 16, 4, None) == 4 and W.train_concurrency(12, 16, None, 8) == 1


def test_a_run_whose_resources_differ_from_the_first_rows_is_refused_by_name():
    row = REPO / "configs" / "ablations"
    first = load_config(row / "00_naive_grpo.yaml", preset="tiny")
    other = load_config(row / "02_clip_higher.yaml", preset="tiny", overrides=["resources.train.mem_mb=9000"])
    W.check_shared({("00_naive_grpo", 0): first, ("02_clip_higher", 0): first})
    with pytest.raises(W.WorkflowSpecError, match=r"run 02_clip_higher \(seed 0\) resolves resources.train.mem_mb"):
        W.check_shared({("00_naive_grpo", 0): first, ("02_clip_higher", 0): other})


def test_a_batch_signal_is_refused_before_anything_is_submitted(tmp_path):
    with pytest.raises(W.WorkflowSpecError, match="nothing was submitted: .*a `B:` signal"):
        W.build_spec(config(results=str(tmp_path)), train_slurm_extra="--signal=B:USR1@60", with_plan=False)


def test_dapo_plan_json_answers_an_error_with_the_fix(tmp_path, capsys):
    assert main(["plan", "--json", "--config", f"results={tmp_path}", "rows=[06_magic]"]) == 0
    answer = json.loads(capsys.readouterr().out)
    assert "06_magic" in answer["error"] and "00_naive_grpo" in answer["error"]
    assert main(["plan", "--config", f"results={tmp_path}", "seeds=oops"]) == 2
    assert "seeds" in capsys.readouterr().err
    assert main(["plan", "--config", f"results={tmp_path}", "preset=qwen2.5-32b", "plan={gpu_memory_gib: 40}"]) == 1
    out = capsys.readouterr()
    assert "per-GPU memory" in out.out and "change the keys named" in out.err


def test_a_reused_world_built_with_other_settings_is_refused_before_it_is_rebuilt_over(tmp_path):
    """`tiny_world=DIR` names a world to reuse. Built with other tiny.* settings, the workflow's build would replace it
    in place; the spec refuses instead, naming each key with both values, and reuses it once the overrides match."""
    from dapo.tinyworld.build import world_hash

    tiny = load_config(preset="tiny", overrides=["tiny.seed=7", "tiny.sft_steps=50"]).tiny
    world = tmp_path / "world"
    world.mkdir()
    manifest = {"hash": world_hash(tiny), "build_version": 4, "tiny": tiny.model_dump(mode="json")}
    (world / "manifest.json").write_text(json.dumps(manifest))
    reuse = dict(results=str(tmp_path / "results"), tiny_world=str(world))
    with pytest.raises(W.WorkflowSpecError, match=r"tiny.seed=7 \(this config: 0\), tiny.sft_steps=50 \(this config"):
        W.build_spec(config(**reuse), with_plan=False)
    spec = W.build_spec(config(**reuse, overrides=["tiny.seed=7", "tiny.sft_steps=50"]), with_plan=False)
    assert spec["tiny_dir"] == str(world)
    assert json.loads((world / "manifest.json").read_text()) == manifest  # untouched


@pytest.mark.parametrize("preset, tagged", [("tiny-habits", True), ("tiny", False)])
def test_a_workflow_run_on_the_habits_world_counts_its_habits(tmp_path, preset, tagged):
    """Each workflow run resolves its config from the train arguments the spec gives it (the world's model directory,
    its prepared split as a file), not `model.path: tiny`: a habits-world run must still get the habit tagger, or its
    `habit/*` metrics, which the version-2 conditions read, are never logged."""
    from dapo.cli import build_parser
    from dapo.tinyworld import TinyWorld

    spec = W.build_spec(config(results=str(tmp_path), preset=preset, rows=["00_naive_grpo"]), with_plan=False)
    args = build_parser().parse_args(["train", *spec["runs"]["00_naive_grpo"]["seeds"]["0"]["train_args"]])
    cfg = load_config(args.config, preset=args.preset, overrides=args.overrides)
    assert cfg.model.path != "tiny" and cfg.data.train.endswith("train.jsonl")  # as the workflow runs it
    assert (TinyWorld(cfg).tagger(cfg.model.path) is not None) is tagged
