"""Bad configs and bad data files, each with the message it must produce: tests/corpus/configs/*.yaml (the first
lines say `# expect: <text>` and, for what only `dapo train`'s pre-flight can see, `# stage: preflight`) and
tests/corpus/data/ (EXPECTED.yaml says what loading each file must raise or report). Adding a case is adding a
file. `dapo train` and `dapo eval` print these errors as one message with exit 2, never a traceback."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest
import yaml

from dapo.config import ConfigError, load_config
from dapo.data.loaders import DataError, load_problems_with_stats
from dapo.tinyworld import TinyWorld
from dapo.trainer.preflight import preflight

CORPUS = Path(__file__).resolve().parent / "corpus"
CONFIGS = sorted((CORPUS / "configs").glob("*.yaml"))
DATA = yaml.safe_load((CORPUS / "data" / "EXPECTED.yaml").read_text())


def header(path: Path) -> tuple[str, list[str]]:
    stage, expects = "load", []
    for line in path.read_text().splitlines():
        if line.startswith("# stage:"):
            stage = line.split(":", 1)[1].strip()
        elif line.startswith("# expect:"):
            expects.append(line.split(":", 1)[1].strip())
    return stage, expects


@pytest.fixture(scope="module")
def model_dir(tmp_path_factory) -> Path:
    """A tokenizer and a config.json: all the pre-flight checks read of a model."""
    from dapo.data.prompts import apply_dapo_template
    from dapo.tinyworld.tokenizer import train_tokenizer

    d = tmp_path_factory.mktemp("model")
    train_tokenizer([apply_dapo_template("Mia has 3 apples and buys 4 more.")] * 20, 300).save_pretrained(d)
    (d / "config.json").write_text('{"model_type": "qwen2"}')
    return d


def materialise(case: Path, tmp: Path, model: Path) -> Path:
    out = tmp / case.name
    out.write_text(case.read_text().replace("{corpus}", str(CORPUS)).replace("{model}", str(model)))
    return out


def test_the_corpora_are_big_enough():
    assert len(CONFIGS) >= 25 and len(DATA) >= 10
    assert all(header(c)[1] for c in CONFIGS), "every bad config says what it must produce"
    assert {p.name for p in (CORPUS / "data").iterdir()} - {"EXPECTED.yaml"} == set(DATA)


@pytest.mark.parametrize("case", CONFIGS, ids=lambda p: p.stem)
def test_a_bad_config_is_refused_with_its_message(case, model_dir, tmp_path):
    stage, expects = header(case)
    path = materialise(case, tmp_path, model_dir)
    with pytest.raises((ConfigError, DataError)) as err:
        cfg = load_config(path, preset="tiny")
        assert stage == "preflight", f"{case.name} loaded without an error"
        preflight(cfg, world_size=1, world=TinyWorld(cfg))
    for text in expects:
        assert text in str(err.value), f"{case.name}: {text!r} not in:\n{err.value}"


@pytest.mark.parametrize("name", sorted(DATA))
def test_a_bad_data_file_says_what_is_wrong_and_where(name):
    path = CORPUS / "data" / name
    want = DATA[name]
    if "error" in want:
        with pytest.raises(DataError) as err:
            load_problems_with_stats(path)
        found = str(err.value)
    else:
        _, stats = load_problems_with_stats(path)
        found = stats.describe(str(path))
    for text in want.get("error") or want["report"]:
        assert text in found, f"{name}: {text!r} not in:\n{found}"


def _dapo(*argv: str) -> subprocess.CompletedProcess:
    env = dict(os.environ, HF_HUB_OFFLINE="1", DS_ACCELERATOR="cpu")
    return subprocess.run(
        [sys.executable, "-m", "dapo.cli", *argv], capture_output=True, text=True, env=env, timeout=300
    )


@pytest.mark.parametrize(
    "command, case, start",
    [
        ("train", "prompts_all_too_long.yaml", "dapo train: data.max_prompt_length = 5"),
        ("train", "world_size.yaml", "dapo train: dapo train was started as 1 process(es)"),
        ("train", "eval_corrupt.yaml", "dapo train: "),
        ("eval", "eval_corrupt.yaml", "dapo eval: "),
    ],
)
def test_train_and_eval_print_the_message_not_a_traceback(command, case, start, model_dir, tmp_path):
    path = materialise(CORPUS / "configs" / case, tmp_path, model_dir)
    extra = ["--run-dir", str(tmp_path / "run")] if command == "train" else ["--model", str(model_dir)]
    if command == "eval":
        extra += ["--out", str(tmp_path / "out")]
    r = _dapo(command, "-c", str(path), "-p", "tiny", *extra)
    assert r.returncode == 2, r.stderr[-2000:]
    assert "Traceback" not in r.stderr and start in r.stderr
    for text in header(CORPUS / "configs" / case)[1]:
        assert text in r.stderr
