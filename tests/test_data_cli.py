"""`dapo prepare-data`: sources resolved from the config, deduplicated, length-filtered, written as JSONL."""

from __future__ import annotations

import json

from dapo.cli import main
from dapo.config import load_config
from dapo.data.loaders import load_problems
from dapo.tinyworld.build import tiny_paths, world_hash


def _jsonl(path, rows):
    path.write_text("".join(json.dumps(r) + "\n" for r in rows))
    return path


def test_local_sources_are_deduplicated_and_written(tmp_path, capsys):
    train = _jsonl(tmp_path / "train.jsonl", [{"prompt": f"Compute {i}+1.", "answer": i + 1} for i in range(5)] * 100)
    ev = _jsonl(tmp_path / "aime.jsonl", [{"id": "a", "problem": "P?", "answer": "7"}] * 32)
    out = tmp_path / "out"
    rc = main(
        [
            "prepare-data",
            "--preset",
            "tiny",
            "--out",
            str(out),
            "--no-length-filter",
            f"data.train={train}",
            f"data.eval={ev}",
        ]
    )
    assert rc == 0
    assert [(p.problem, p.answer) for p in load_problems(out / "train.jsonl")] == [
        (f"Compute {i}+1.", str(i + 1)) for i in range(5)
    ]
    assert [(p.id, p.answer) for p in load_problems(out / "eval.jsonl")] == [("a", "7")]
    printed = capsys.readouterr().out
    assert "train: 5 problems" in printed and "500 rows, 495 duplicates removed" in printed
    assert "eval: 1 problems" in printed and "32 rows, 31 duplicates removed" in printed


def test_prompts_over_max_prompt_length_are_dropped_with_the_models_tokenizer(tmp_path, capsys):
    from dapo.data.prompts import apply_dapo_template
    from dapo.tinyworld.tokenizer import train_tokenizer

    tok = train_tokenizer([apply_dapo_template("Mia has 3 apples.")] * 20, 300)
    tok.save_pretrained(tmp_path / "model")
    n_short = len(
        tok(
            tok.apply_chat_template(
                [{"role": "user", "content": apply_dapo_template("Short.")}], tokenize=False, add_generation_prompt=True
            ),
            add_special_tokens=False,
        )["input_ids"]
    )
    data = _jsonl(
        tmp_path / "d.jsonl", [{"problem": "Short.", "answer": "1"}, {"problem": "Much longer " * 30, "answer": "2"}]
    )
    rc = main(
        [
            "prepare-data",
            "--preset",
            "tiny",
            "--out",
            str(tmp_path / "out"),
            f"model.path={tmp_path / 'model'}",
            f"data.train={data}",
            f"data.eval={data}",
            f"data.max_prompt_length={n_short}",
        ]
    )
    assert rc == 0
    assert [p.problem for p in load_problems(tmp_path / "out" / "train.jsonl")] == ["Short."]
    assert f"1 over {n_short} prompt tokens dropped" in capsys.readouterr().out


def test_tiny_resolves_to_the_tiny_worlds_files(tmp_path, capsys):
    """A (fake, pre-built) tiny world is reused, not rebuilt, and its generated files become the run's data."""
    root = tmp_path / "tw"
    cfg = load_config(preset="tiny", overrides=[f"tiny.dir={root}"])
    paths = tiny_paths(root)
    (paths.model).mkdir(parents=True)
    (paths.model / "config.json").write_text("{}")  # no tokenizer: the length filter is skipped, and says so
    _jsonl(paths.train, [{"id": "t0", "problem": "A?", "answer": "1"}, {"id": "t1", "problem": "B?", "answer": "2"}])
    _jsonl(paths.eval, [{"id": "e0", "problem": "C?", "answer": "3"}])
    paths.manifest.write_text(json.dumps({"hash": world_hash(cfg.tiny)}))
    out = str(tmp_path / "out")
    assert main(["prepare-data", "--preset", "tiny", "--out", out, f"tiny.dir={root}", "data.eval=tiny"]) == 0
    assert [p.id for p in load_problems(tmp_path / "out" / "train.jsonl")] == ["t0", "t1"]
    assert [p.id for p in load_problems(tmp_path / "out" / "eval.jsonl")] == ["e0"]
    assert "length filter skipped" in capsys.readouterr().out


def test_an_unloadable_source_fails_with_the_file_and_line(tmp_path, capsys):
    bad = _jsonl(tmp_path / "bad.jsonl", [{"problem": "no answer"}])
    rc = main(
        [
            "prepare-data",
            "--preset",
            "tiny",
            "--out",
            str(tmp_path / "o"),
            "--no-length-filter",
            f"data.train={bad}",
            f"data.eval={bad}",
        ]
    )
    assert rc == 2 and f"{bad}:1: no answer" in capsys.readouterr().err
