"""Data loaders: the public files' layouts, deduplication of repeated rows, errors that name file and line."""

from __future__ import annotations

import json
import random

import pyarrow as pa
import pyarrow.parquet as pq
import pytest

from dapo.data.loaders import DataError, load_problems, load_problems_with_stats, write_problems
from dapo.data.prompts import DAPO_PREFIX, DAPO_SUFFIX, apply_dapo_template, build_prompt

AIME24_ANSWERS = [
    204,
    25,
    809,
    116,
    104,
    294,
    540,
    197,
    480,
    113,
    371,
    385,
    110,
    104,
    721,
    73,
    236,
    45,
    33,
    80,
    55,
    699,
    127,
    902,
    468,
    601,
    23,
    321,
    211,
    315,
]


def _write_jsonl(path, rows):
    path.write_text("".join(json.dumps(r) + "\n" for r in rows))
    return path


def test_an_aime_style_jsonl_gives_30_problems_with_their_answers_and_the_dapo_template(test_data):
    problems = load_problems(test_data / "aime2024.jsonl")
    assert len(problems) == 30
    assert [int(p.answer) for p in problems] == AIME24_ANSWERS  # the published answers, in contest order
    assert problems[0].id == "2024-I-1" and problems[-1].id == "2024-II-15"
    for p in problems:
        prompt = build_prompt(p.problem, None, use_chat_template=False)
        assert prompt == DAPO_PREFIX + p.problem + DAPO_SUFFIX
        assert prompt.count("Solve the following math problem") == 1  # the template is applied once


def test_a_deduplicated_dapo17k_jsonl_uses_its_prompt_field_and_keeps_every_row(test_data):
    problems, stats = load_problems_with_stats(test_data / "dapo_math_17k_sample.jsonl")
    assert stats.rows == stats.unique == len(problems) == 5 and stats.duplicates == 0
    assert problems[0].id == "dapo17k-00000" and problems[0].answer == "13"
    assert problems[0].problem.startswith("A rectangle") and problems[3].answer == "-3"
    assert problems[4].problem == "求 $1+2+\\cdots+20$ 的值。"  # non-ASCII text read as written


def test_aime_style_file_with_32_shuffled_copies_collapses_to_unique_problems(tmp_path):
    rows = [{"id": f"p{i}", "problem": f"What is {i} + {i}?", "answer": str(2 * i)} for i in range(3)] * 32
    random.Random(0).shuffle(rows)
    problems, stats = load_problems_with_stats(_write_jsonl(tmp_path / "aime.jsonl", rows))
    assert (stats.rows, stats.unique, stats.duplicates) == (96, 3, 93)
    assert sorted((p.problem, p.answer) for p in problems) == [(f"What is {i} + {i}?", str(2 * i)) for i in range(3)]
    # first occurrence wins, in file order
    assert [p.id for p in problems] == list(dict.fromkeys(r["id"] for r in rows))


def test_duplicate_text_with_another_answer_keeps_the_first_and_is_counted(tmp_path):
    rows = [{"problem": "x?", "answer": "1"}, {"problem": "y?", "answer": "2"}, {"problem": "x?", "answer": "7"}]
    problems, stats = load_problems_with_stats(_write_jsonl(tmp_path / "d.jsonl", rows))
    assert [(p.problem, p.answer) for p in problems] == [("x?", "1"), ("y?", "2")]
    assert stats.conflicting_answers == 1 and stats.duplicates == 1
    assert [p.id for p in problems] == ["d-0", "d-1"]  # no id field: file stem and row index


def test_dapo_parquet_layout_strips_the_template_and_dedups_the_100_copies(tmp_path):
    """DAPO-Math-17k rows: templated chat prompt, reward_model.ground_truth, extra_info.index; 100 copies each."""
    raw = ["Find $x$ if $\\{x\\} = 3$.", "Compute 2+2."]
    rows = [
        {
            "data_source": "math_dapo",
            "prompt": [{"role": "user", "content": apply_dapo_template(r)}],
            "ability": "MATH",
            "reward_model": {"ground_truth": a, "style": "rule-lighteval/MATH_v2"},
            "extra_info": {"index": f"uuid-{i}"},
        }
        for i, (r, a) in enumerate(zip(raw, ["3", "4"], strict=True))
    ] * 100
    pq.write_table(pa.Table.from_pylist(rows), tmp_path / "dapo-math-17k.parquet")
    problems, stats = load_problems_with_stats(tmp_path / "dapo-math-17k.parquet")
    assert stats.rows == 200 and [(p.id, p.problem, p.answer) for p in problems] == [
        ("uuid-0", raw[0], "3"),
        ("uuid-1", raw[1], "4"),
    ]


def test_aime_parquet_layout_reads_raw_problem(tmp_path):
    rows = [
        {
            "prompt": [{"role": "user", "content": apply_dapo_template("Q")}],
            "reward_model": {"ground_truth": "204"},
            "extra_info": {"index": 25, "raw_problem": "Q"},
        }
    ] * 32
    pq.write_table(pa.Table.from_pylist(rows), tmp_path / "aime-2024.parquet")
    assert [(p.id, p.problem, p.answer) for p in load_problems(tmp_path / "aime-2024.parquet")] == [("25", "Q", "204")]


@pytest.mark.parametrize(
    ("bad", "message"),
    [
        ({"problem": "no answer here"}, "no answer"),
        ({"problem": "empty answer", "answer": " "}, "`answer` is empty"),
        ({"problem": ["not", "text"], "answer": "1"}, "`problem` must be non-empty text"),
        ({"problem": "answer is a list", "answer": [1]}, "`answer` must be a string or number"),
    ],
)
def test_a_broken_row_names_the_file_and_its_1_based_line(tmp_path, bad, message):
    path = tmp_path / "broken.jsonl"
    path.write_text(json.dumps({"problem": "ok", "answer": "1"}) + "\n\n" + json.dumps(bad) + "\n")
    with pytest.raises(DataError) as err:
        load_problems(path)
    assert f"{path}:3:" in str(err.value) and message in str(err.value)  # line 3: blank lines still count


def test_unparseable_json_and_missing_files_are_named(tmp_path):
    path = tmp_path / "bad.jsonl"
    path.write_text('{"problem": "a", "answer": "1"}\n{"problem": \n')
    with pytest.raises(DataError, match=rf"{path}:2: not valid JSON"):
        load_problems(path)
    with pytest.raises(DataError, match="file not found"):
        load_problems(tmp_path / "missing.parquet")
    with pytest.raises(DataError, match="neither a local"):
        load_problems("not-a-dataset")


def test_parquet_errors_name_the_row(tmp_path):
    rows = [{"problem": "a", "answer": "1"}, {"problem": "b", "answer": None}]
    pq.write_table(pa.Table.from_pylist(rows), tmp_path / "t.parquet")
    with pytest.raises(DataError, match="t.parquet: row 2: no answer"):
        load_problems(tmp_path / "t.parquet")


def test_written_problems_load_back_identically(tmp_path):
    problems = load_problems(_write_jsonl(tmp_path / "a.jsonl", [{"id": "a", "problem": "ü {x}", "answer": 5}]))
    assert problems[0].answer == "5"  # numeric answers become strings, as DAPO's ground truth is
    write_problems(tmp_path / "b.jsonl", problems)
    assert load_problems(tmp_path / "b.jsonl") == problems
