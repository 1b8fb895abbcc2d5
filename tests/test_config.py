"""The run config: composition order, provenance in errors, and the ablation ladder's exact differences."""

from __future__ import annotations

from pathlib import Path

import pytest
import yaml

from dapo.config import ABLATIONS_DIR, PRESETS_DIR, ConfigError, load_config, read_chain

ROWS = sorted(ABLATIONS_DIR.glob("*.yaml"))
PRESETS = sorted(p.stem for p in PRESETS_DIR.glob("*.yaml"))


def test_six_rows_in_paper_order():
    assert [p.stem for p in ROWS] == [
        "00_naive_grpo",
        "01_overlong_filtering",
        "02_clip_higher",
        "03_soft_overlong_punishment",
        "04_token_level_loss",
        "05_dynamic_sampling",
    ]


def _flat(cfg) -> dict:
    return cfg.flat()


def test_every_budget_has_a_preset():
    gpu = ["qwen2.5-1.5b-1gpu", "qwen2.5-32b", "qwen2.5-math-7b", "qwen2.5-math-7b-1node"]
    assert [p for p in PRESETS if not p.startswith("tiny")] == gpu


@pytest.mark.parametrize("preset", PRESETS)
@pytest.mark.parametrize("i", range(1, 6))
def test_each_row_differs_from_the_row_above_in_exactly_its_declared_keys(preset, i):
    """The released recipe's per-row scripts differed in more than the toggle; ours may not."""
    above, row = ROWS[i - 1], ROWS[i]
    declared = read_chain(row)[-1][1]
    assert declared.pop("inherits") if "inherits" in declared else True
    declared_keys = {f"{s}.{k}" for s, d in declared.items() for k in d}
    a, b = _flat(load_config(above, preset=preset)), _flat(load_config(row, preset=preset))
    changed = {k for k in a if a[k] != b[k]}
    assert changed == declared_keys
    # exactly one algorithm toggle per row, plus the row tag
    assert declared_keys - {"tracking.row"} and len(declared_keys - {"tracking.row"}) == 1
    assert read_chain(row)[-2][0] == above.resolve()


def test_rows_set_no_scale_keys():
    """Scale lives in presets, so the same ladder runs tiny and at 32B."""
    for row in ROWS:
        own = yaml.safe_load(row.read_text())
        assert set(own) <= {"inherits", "algorithm", "tracking"}, row.name


def _ladder_copy(tmp_path: Path, **extra: str) -> Path:
    """A copy of the ladder in tmp_path/ablations, with `extra[row]` appended to that row's file."""
    d = tmp_path / "ablations"
    d.mkdir()
    for row in ROWS:
        (d / row.name).write_text(row.read_text() + extra.get(row.stem, ""))
    return d


def test_our_ladder_is_a_clean_ablation_under_every_preset():
    from dapo.designs import ladder_problems

    for preset in (None, "tiny", "qwen2.5-32b"):
        assert ladder_problems(preset=preset) == [], preset


def test_a_confounded_ladder_names_each_row_its_extra_keys_and_their_values(tmp_path):
    """What the released recipe's per-row scripts did (rows that also changed scale), and its cousins."""
    from dapo.designs import ladder_problems

    d = _ladder_copy(
        tmp_path,
        **{
            "00_naive_grpo": "rollout:\n  n: 4\n",  # the baseline sets scale
            "03_soft_overlong_punishment": "trainer:\n  lr: 1.0e-4\n",  # a scale key beside the toggle
            "04_token_level_loss": "  kl_coef: 0.01\n",  # under algorithm: a key no toggle of this row owns
            "05_dynamic_sampling": "  overlong_buffer_len: 16\n",  # an algorithm key presets own, at tiny's value
        },
    )
    (d / "02_clip_higher.yaml").write_text(  # builds on row 00, not on the row above
        (d / "02_clip_higher.yaml").read_text().replace("01_overlong_filtering.yaml", "00_naive_grpo.yaml")
    )
    found = ladder_problems(d, preset="tiny")
    assert [p.split(":")[0] for p in found] == [
        str(d / f"{r}.yaml") for r in [ROWS[0].stem, *(r.stem for r in ROWS[2:])]
    ]
    text = "\n".join(found)
    assert f"{d / '00_naive_grpo.yaml'}: the ladder's first row sets rollout.n = 4: a scale key" in text
    assert "algorithm.overlong_filter = False (in 01_overlong_filtering.yaml: True): not a key of clip_higher" in text
    assert "(it inherits 00_naive_grpo.yaml, not the row above, 01_overlong_filtering.yaml)" in text
    assert f"{d / '03_soft_overlong_punishment.yaml'}: differs from 02_clip_higher.yaml in more than" in text
    assert "trainer.lr = 0.0001 (in 02_clip_higher.yaml: 5e-05): a scale key" in text
    assert "algorithm.kl_coef = 0.01 (in 03_soft_overlong_punishment.yaml: 0.0): not a key of token_level_loss" in text
    # equal to the tiny preset's value, so nothing differs under it; still a key that overrides every other preset
    assert "algorithm.overlong_buffer_len = 16 (in 04_token_level_loss.yaml: 16): a scale key" in text


def test_dapo_config_stops_on_a_confounded_ladder_unless_allowed(tmp_path, capsys):
    from dapo.cli import main

    d = _ladder_copy(tmp_path, **{"03_soft_overlong_punishment": "trainer:\n  lr: 1.0e-4\n"})
    row = str(d / "05_dynamic_sampling.yaml")  # any row: it means something only beside the rows above it
    assert main(["config", "-c", row, "-p", "tiny"]) == 2
    err = capsys.readouterr().err
    assert f"{d / '03_soft_overlong_punishment.yaml'}: differs from 02_clip_higher.yaml" in err
    assert "trainer.lr = 0.0001 (in 02_clip_higher.yaml: 5e-05): a scale key" in err
    assert "--allow-confounded-ladder" in err and "allow_confounded_ladder=true" in err  # the way to run it anyway
    assert main(["config", "-c", row, "-p", "tiny", "--allow-confounded-ladder"]) == 0
    out = capsys.readouterr()
    assert "warning: not a clean ablation" in out.err and "lr: 0.0001" in out.out
    assert main(["config", "-c", str(ROWS[5]), "-p", "qwen2.5-32b"]) == 0  # our own ladder passes
    assert "warning" not in capsys.readouterr().err


def test_a_file_outside_the_ladder_labelled_a_row_is_checked_as_that_row_by_config_and_train(
    tmp_path, capsys, monkeypatch
):
    """A file elsewhere that inherits row 04 and calls itself row 05 would be reported as row 05: `dapo config` and
    `dapo train` (before loading anything) refuse it as they refuse that file inside the ladder; so for a user's
    own ladder, and for a label inherited from row 05 itself."""
    import dapo.trainer.preflight
    from dapo.cli import main

    monkeypatch.setattr(dapo.trainer.preflight, "preflight", lambda *a, **k: pytest.fail("dapo train went on"))
    own = _ladder_copy(tmp_path)  # a user's own ladder, outside configs/
    mine = tmp_path / "mine"
    mine.mkdir()

    def write(name: str, parent: Path, extra: str) -> str:
        (mine / name).write_text(f"inherits: {parent}\n{extra}")
        return str(mine / name)

    row05 = "tracking:\n  row: 05_dynamic_sampling\nalgorithm:\n  dynamic_sampling: true\n"
    lr = "trainer:\n  lr: 1.0e-4\n"
    for parent, ladder in ((ROWS[4], ABLATIONS_DIR), (own / ROWS[4].name, own)):
        bad = write("05_faster.yaml", parent, row05 + lr)
        for cmd in (["config"], ["train", "--run-dir", str(tmp_path / "run")]):
            assert main([*cmd, "-c", bad, "-p", "tiny"]) == 2
            err = capsys.readouterr().err
            assert f"{bad}: its run is labelled 05_dynamic_sampling, a row of {ladder}" in err
            assert "trainer.lr = 0.0001 (in 04_token_level_loss.yaml: 5e-05): a scale key" in err
            assert "tracking.row: <name>" in err and "--allow-confounded-ladder" in err  # the fixes
        assert not (tmp_path / "run").exists()
    assert main(["config", "-c", write("inherited.yaml", ROWS[5], lr), "-p", "tiny"]) == 2  # labelled 05 by row 05
    assert "labelled 05_dynamic_sampling" in capsys.readouterr().err
    assert main(["config", "-c", write("clean.yaml", ROWS[4], row05), "-p", "tiny"]) == 0  # row 04 + its toggle
    named = write("named.yaml", ROWS[4], row05.replace("05_dynamic_sampling", "faster") + lr)
    assert main(["config", "-c", named, "-p", "tiny"]) == 0  # a run of its own name is not reported as row 05
    assert main(["config", "-c", bad, "-p", "tiny", "--allow-confounded-ladder"]) == 0
    assert "warning: not a clean ablation" in capsys.readouterr().err


def test_row_values_match_spec_section_3():
    cfg = {p.stem: load_config(p, preset="tiny").algorithm for p in ROWS}
    assert (cfg["00_naive_grpo"].eps_low, cfg["00_naive_grpo"].eps_high) == (0.2, 0.2)
    assert cfg["00_naive_grpo"].loss_agg == "seq-mean-token-mean"
    assert cfg["01_overlong_filtering"].overlong_filter and not cfg["00_naive_grpo"].overlong_filter
    assert cfg["02_clip_higher"].eps_high == 0.28
    assert cfg["03_soft_overlong_punishment"].overlong_penalty
    assert cfg["04_token_level_loss"].loss_agg == "token-mean"
    full = cfg["05_dynamic_sampling"]
    assert full.dynamic_sampling and full.overlong_filter and full.overlong_penalty and full.eps_high == 0.28
    assert full.kl_coef == 0.0


def test_paper_preset_is_the_papers_run():
    """docs/algorithm.md section 5, the paper's settings and the released recipe's."""
    c = load_config(ROWS[-1], preset="qwen2.5-32b")
    assert c.rollout.n == 16 and c.rollout.max_response_length == 20480
    assert (c.rollout.temperature, c.rollout.top_p, c.data.max_prompt_length) == (1.0, 1.0, 2048)
    assert c.trainer.train_batch_size == 512 and c.trainer.updates_per_step == 16
    t = c.trainer
    assert (t.lr, t.weight_decay, tuple(t.betas), t.grad_clip, t.warmup_steps) == (1e-6, 0.1, (0.9, 0.999), 1.0, 20)
    a = c.algorithm
    assert a.overlong_buffer_len == 4096 and a.overlong_penalty_factor == 1.0
    assert a.gen_batch_size == 1536 and a.max_num_gen_batches == 10
    assert (c.eval.n, c.eval.top_p, c.eval.every) == (32, 0.7, 5)
    # the released recipe's dual-clip bound, in every row (a row-independent setting is no confound)
    assert {load_config(row, preset="qwen2.5-32b").algorithm.dual_clip_c for row in ROWS} == {10.0}
    assert c.resources.model_fields_set == {"train"}  # no unused job kinds (resources.prepare is the tiny world's)


def test_verl_7b_preset_is_the_published_recipe():
    """recipe/dapo/test_dapo_7b_math.sh in volcengine/verl, value by value (the preset's comments cite each)."""
    c = load_config(ROWS[4], preset="qwen2.5-math-7b")
    assert (c.model.path, c.model.dtype, c.model.config_overrides) == (
        "Qwen/Qwen2.5-Math-7B",
        "bfloat16",
        {"max_position_embeddings": 32768},
    )
    assert (c.data.max_prompt_length, c.rollout.max_response_length, c.rollout.n) == (2048, 8192, 16)
    assert (c.rollout.temperature, c.rollout.top_p, c.rollout.tensor_parallel_size) == (1.0, 1.0, 4)
    assert c.rollout.gpu_memory_utilization == 0.8
    a = c.algorithm
    assert (a.eps_low, a.eps_high, a.dual_clip_c, a.loss_agg) == (0.2, 0.28, 10.0, "token-mean")
    assert (a.overlong_penalty, a.overlong_buffer_len, a.overlong_penalty_factor) == (True, 4096, 1.0)
    t = c.trainer
    assert (t.total_steps, t.train_batch_size, t.mini_batch_size, t.updates_per_step) == (200, 512, 32, 16)
    assert (t.lr, t.weight_decay, t.grad_clip, t.warmup_steps, t.micro_batch_tokens) == (1e-6, 0.1, 1.0, 10, 20480)
    assert (t.forward_micro_batch_tokens, t.zero_stage, t.packing) == (30720, 1, "sequences")  # infer x 3; the plan
    assert (t.checkpoint_every, c.eval.every, c.eval.n, c.eval.top_p, c.eval.temperature) == (10, 10, 32, 0.7, 1.0)
    r = c.resources.train
    assert (r.nodes, r.gpus_per_node, r.world_size, r.gpu_model) == (8, 8, 64, "h100")
    assert c.resources.model_fields_set == {"train"}  # no unused job kinds (resources.prepare is the tiny world's)


def test_one_node_7b_preset_keeps_the_algorithm_and_scales_the_batch():
    """The recipe's algorithm on 8 GPUs: the same clip, lengths, lr and 16 updates per step; a quarter of the
    batch, 300 steps, evaluation every 20 (configs/presets/qwen2.5-math-7b-1node.yaml says why)."""
    full = load_config(ROWS[5], preset="qwen2.5-math-7b")
    one = load_config(ROWS[5], preset="qwen2.5-math-7b-1node")
    changed = {k for k, v in one.flat().items() if full.flat()[k] != v}
    assert changed == {
        "rollout.tensor_parallel_size",
        "rollout.gpu_memory_utilization",
        "algorithm.gen_batch_size",
        "trainer.total_steps",
        "trainer.train_batch_size",
        "trainer.mini_batch_size",
        "eval.every",
        "tracking.preset",
        "resources.train.nodes",
        "resources.train.mem_mb",  # its 8 ranks' offloaded states a node: 8 x 41.9 GB against 8 x 31.9 (dapo plan)
    }
    assert (one.trainer.train_batch_size, one.trainer.mini_batch_size, one.trainer.total_steps) == (128, 8, 300)
    assert one.trainer.updates_per_step == full.trainer.updates_per_step == 16
    assert (one.algorithm.gen_batch_size, one.eval.every, one.rollout.tensor_parallel_size) == (384, 20, 2)
    assert (one.resources.train.world_size, one.rollout.gpu_memory_utilization) == (8, 0.7)


def test_one_gpu_smoke_preset_runs_the_real_path_small():
    """The real path on one GPU, set for speed there (issue 47): ZeRO-2, since ZeRO-3 on one rank gathers every layer
    for nothing (ZeRO-2 keeps the states' offload for the engine), and no gradient checkpointing, since the plan's
    training phase fits without it at 8,192 tokens a micro-batch (no recomputed forward)."""
    c = load_config(ROWS[5], preset="qwen2.5-1.5b-1gpu")
    assert (c.model.path, c.rollout.engine, c.rollout.enable_sleep_mode, c.trainer.zero_stage) == (
        "Qwen/Qwen2.5-1.5B",
        "vllm",
        True,
        2,
    )
    assert (c.model.gradient_checkpointing, c.trainer.micro_batch_tokens) == (False, 8192)
    assert (c.resources.train.world_size, c.resources.train.runtime_min) == (1, 60)
    t = c.trainer
    assert (t.total_steps, t.checkpoint_every, t.train_batch_size, t.mini_batch_size) == (10, 2, 16, 8)
    assert (c.rollout.max_response_length, c.eval.n, c.eval.every, c.data.eval) == (
        1024,
        4,
        5,
        "BytedTsinghua-SIA/AIME-2024",
    )


def test_overrides_win_and_parse_as_yaml():
    c = load_config(
        ROWS[0], preset="tiny", overrides=["trainer.seed=7", "eval.n=2", "eval.pass_k=[1,2]", "model.path=x"]
    )
    assert (c.trainer.seed, c.eval.pass_k, c.model.path) == (7, [1, 2], "x")
    assert c.run_name() == "00_naive_grpo-s7"


@pytest.mark.parametrize(
    "override, names",
    [
        ("algorithm.eps_hgih=0.3", ["command line", "algorithm.eps_hgih", "did you mean `algorithm.eps_high`"]),
        ("algorithm.eps_high=0.1", ["eps_high", "eps_low", "command line", "00_naive_grpo.yaml"]),
        ("rollout.n=1", ["command line", "rollout.n", "greater than or equal to 2"]),
        ("rollout.max_response_length=0", ["rollout.max_response_length", "greater than 0"]),
        ("algorithm.overlong_buffer_len=999", ["L_cache", "L_max", "tiny.yaml"]),
        ("nonsense", ["section.key=value"]),
        # carry-over without the decoupled objective's weight: the key, where it came from, and the fix
        (
            "rollout.max_staleness=1",
            ["rollout.max_staleness", "command line", "algorithm.rollout_correction: token_tis"],
        ),
        ("rollout.max_staleness=-1", ["rollout.max_staleness", "greater than or equal to 0"]),
    ],
)
def test_bad_values_name_file_key_and_fix(override, names):
    with pytest.raises(ConfigError) as e:
        load_config(ROWS[3], preset="tiny", overrides=[override])
    for n in names:
        assert n in str(e.value), str(e.value)


def test_carry_over_needs_a_correction_and_an_engine_that_batches(tmp_path: Path):
    """`rollout.max_staleness` >= 1 trains tokens older weights sampled: refused without a rollout correction when a
    file leaves it at none (naming that file), and with a batch-invariant engine, which never has a response in flight
    beside others; with the correction it loads, and 0 (the default) needs neither."""
    f = tmp_path / "carried.yaml"
    f.write_text(f"inherits: {ROWS[0]}\nrollout:\n  max_staleness: 2\n")
    with pytest.raises(ConfigError, match=r"(?s)rollout.max_staleness \(2\).*token_tis.*carried\.yaml"):
        load_config(f, preset="tiny")
    ok = load_config(f, preset="tiny", overrides=["algorithm.rollout_correction=token_tis"])
    assert ok.rollout.max_staleness == 2 and load_config(ROWS[0], preset="tiny").rollout.max_staleness == 0
    with pytest.raises(ConfigError, match=r"rollout.batch_invariant: false, or rollout.max_staleness: 0"):
        load_config(f, preset="tiny", overrides=["algorithm.rollout_correction=token_tis", "rollout.batch_invariant=1"])


def test_unknown_key_in_a_file_names_that_file(tmp_path: Path):
    bad = tmp_path / "row.yaml"
    bad.write_text(f"inherits: {ROWS[0]}\nalgorithm:\n  clip_hi: 0.3\n")
    with pytest.raises(ConfigError, match=r"row\.yaml: unknown key `algorithm.clip_hi`"):
        load_config(bad, preset="tiny")


def test_missing_file_and_cycle(tmp_path: Path):
    with pytest.raises(ConfigError, match="file not found"):
        load_config(tmp_path / "nope.yaml")
    a, b = tmp_path / "a.yaml", tmp_path / "b.yaml"
    a.write_text("inherits: b.yaml\n")
    b.write_text("inherits: a.yaml\n")
    with pytest.raises(ConfigError, match="cycle"):
        load_config(a)
    with pytest.raises(ConfigError, match="known presets: .*tiny"):
        load_config(ROWS[0], preset="nope")


def test_a_duplicated_section_or_key_is_refused_with_file_line_and_key(tmp_path: Path):
    """YAML keeps the last of two equal keys: a row with two `algorithm:` blocks would train with the second only."""
    row = tmp_path / "row.yaml"
    row.write_text(f"inherits: {ROWS[1]}\nalgorithm:\n  eps_high: 0.28\nalgorithm:\n  loss_agg: token-mean\n")
    with pytest.raises(ConfigError, match=r"row\.yaml: line 4: key `algorithm` is given twice \(first on line 2\)"):
        load_config(row, preset="tiny")
    row.write_text("trainer:\n  lr: 1.0e-5\n  seed: 1\n  lr: 1.0e-6\n")
    with pytest.raises(ConfigError, match=r"row\.yaml: line 4: key `trainer.lr` is given twice \(first on line 2\)"):
        load_config(row)
    # a parent's duplicate names the parent; `<<` merge keys may still be overridden
    parent = tmp_path / "parent.yaml"
    parent.write_text("eval:\n  n: 4\n  n: 8\n")
    row.write_text("inherits: parent.yaml\n")
    with pytest.raises(ConfigError, match=r"parent\.yaml: line 3: key `eval.n`"):
        load_config(row)
    row.write_text("resources:\n  prepare: &job {nodes: 1, mem_mb: 2000}\n  train:\n    <<: *job\n    mem_mb: 3000\n")
    assert load_config(row).resources.train.mem_mb == 3000


def test_pass_at_k_above_the_samples_per_problem_is_refused_naming_both_keys():
    with pytest.raises(ConfigError) as e:
        load_config(ROWS[0], preset="qwen2.5-32b", overrides=["eval.n=16"])
    msg = str(e.value)
    assert "eval.pass_k asks for k = [32] > eval.n (16)" in msg
    assert "eval.n from command line" in msg and "qwen2.5-32b.yaml" in msg  # where each value came from
    assert load_config(ROWS[0], preset="qwen2.5-32b", overrides=["eval.n=16", "eval.pass_k=[1,16]"]).eval.n == 16


def test_a_missing_parent_names_the_inheriting_file_the_key_and_the_path(tmp_path: Path):
    row = tmp_path / "rows" / "row.yaml"
    row.parent.mkdir()
    row.write_text("inherits: ../base/parent.yaml\n")
    with pytest.raises(ConfigError) as e:
        load_config(row)
    assert str(e.value).startswith(f"{row}: `inherits: ../base/parent.yaml`: {tmp_path / 'base' / 'parent.yaml'}: ")
    assert "file not found" in str(e.value)


def test_config_hash_ignores_where_results_go():
    a = load_config(ROWS[0], preset="tiny", overrides=["trainer.output_dir=/a"])
    b = load_config(ROWS[0], preset="tiny", overrides=["trainer.output_dir=/b", "tracking.experiment=x"])
    c = load_config(ROWS[1], preset="tiny")
    assert a.config_hash() == b.config_hash() != c.config_hash()


# ------------------------------------------------------------------ the other designs, from the same ladder
@pytest.mark.parametrize("preset", PRESETS)
@pytest.mark.parametrize("design", ["leave_one_out", "one_at_a_time"])
def test_each_design_run_differs_from_its_reference_in_exactly_its_toggles_keys(preset, design):
    """Leave-one-out: full DAPO with one toggle's keys reverted to the row above it; one-at-a-time: naive GRPO with
    one toggle's keys set as its row sets them. Nothing else may differ (the run's name aside)."""
    from dapo.designs import design_runs, toggles

    by_toggle = {t.name: t for t in toggles()}
    runs = design_runs(design)
    ref = runs[0]
    assert ref.toggle is None and ref.name == (ROWS[-1].stem if design == "leave_one_out" else ROWS[0].stem)
    assert sorted(r.toggle for r in runs[1:]) == sorted(by_toggle)
    a = _flat(load_config(ref.config, preset=preset, overrides=list(ref.overrides)))
    for run in runs[1:]:
        t = by_toggle[run.toggle]
        b = _flat(load_config(run.config, preset=preset, overrides=list(run.overrides)))
        assert {k for k in a if a[k] != b[k]} == set(t.values) | {"tracking.row"}, run.name
        want = t.reverted if design == "leave_one_out" else t.values
        assert {k: b[k] for k in t.values} == want, run.name
        assert b["tracking.row"] == run.name


def test_a_design_run_equal_to_a_ladder_row_is_that_row():
    """Full DAPO minus the last toggle is the row above it; naive GRPO plus the first toggle is row 01: no copy."""
    from dapo.designs import design_runs, parse_run

    loo = {r.toggle: r for r in design_runs("leave_one_out")}
    oat = {r.toggle: r for r in design_runs("one_at_a_time")}
    assert loo["dynamic_sampling"].name == ROWS[-2].stem and not loo["dynamic_sampling"].overrides
    assert oat["overlong_filtering"].name == ROWS[1].stem and not oat["overlong_filtering"].overrides
    assert loo["clip_higher"].name == "dapo_minus_clip_higher" and loo["clip_higher"].overrides
    assert oat["token_level_loss"].name == "grpo_plus_token_level_loss"
    assert parse_run("dapo_minus_clip_higher") == ("leave_one_out", "clip_higher")
    assert parse_run("05_dynamic_sampling") is None


def test_a_key_set_by_two_rows_is_refused(tmp_path):
    from dapo.designs import toggles

    for row in ROWS[:3]:
        (tmp_path / row.name).write_text(row.read_text())
    (tmp_path / "03_again.yaml").write_text("inherits: 02_clip_higher.yaml\nalgorithm:\n  eps_high: 0.3\n")
    with pytest.raises(ValueError, match=r"eps_high.*already set by 02_clip_higher"):
        toggles(tmp_path)


def test_every_config_key_says_what_it_is():
    """`dapo train --help`, the config reference and a wrong value's error all read a key's description: a key
    without one leaves a user guessing."""
    from pydantic import BaseModel

    from dapo.config import RunConfig

    def missing(model: type[BaseModel], prefix: str) -> list[str]:
        out = []
        for name, f in model.model_fields.items():
            if isinstance(f.annotation, type) and issubclass(f.annotation, BaseModel):
                out += missing(f.annotation, f"{prefix}{name}.")
            elif not f.description:
                out.append(prefix + name)
        return out

    assert missing(RunConfig, "") == []
