"""Load math problems (DAPO-Math-17k, AIME 2024/2025, the tiny world) as `Problem(id, problem, answer)`.

Sources: a hub dataset id (`BytedTsinghua-SIA/DAPO-Math-17k`, `BytedTsinghua-SIA/AIME-2024`; read with the
`datasets` library, only when a config names one), or a local `.parquet` / `.jsonl` file.

Row layouts understood (first match wins):

- problem text: `extra_info.raw_problem` (DAPO's AIME parquet) | `problem` | `prompt` as a string (the local
  JSONL copies) | `prompt` as a chat list (DAPO's parquet: the last user turn), with the DAPO template stripped
  so it is applied exactly once, later, by `prompts.build_prompt`;
- answer: `reward_model.ground_truth` (DAPO's parquet) | `answer`;
- id: `id` | `extra_info.index` | `<file stem>-<row number>`.

Upstream files repeat rows (DAPO-Math-17k: every prompt 100 times; DAPO's AIME parquet: every problem 32 times,
so that eval samples once per row). `dedup_problems` keeps the first row of each distinct problem text; eval
then samples n responses per unique problem instead (docs/algorithm.md section 8, last pitfall).

A row without an answer or with an unreadable field raises `DataError` naming the file and the 1-based line
(JSONL) or row (parquet, hub) number.
"""

from __future__ import annotations

import json
from collections.abc import Iterable, Iterator, Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from dapo.data.prompts import strip_dapo_template
from dapo.types import Problem


class DataError(ValueError):
    """A data file problem, naming the file and the 1-based line or row."""


@dataclass(frozen=True)
class LoadStats:
    """What loading did: rows read, duplicates removed (same problem text), and of those, how many disagreed
    on the answer (the first row's answer is kept, as open-r1's deduplicated copy does)."""

    rows: int
    unique: int
    duplicates: int
    conflicting_answers: int


def is_local_source(source: str) -> bool:
    return source.endswith((".jsonl", ".parquet")) or Path(source).exists()


def _get(row: Mapping[str, Any], dotted: str) -> Any:
    cur: Any = row
    for part in dotted.split("."):
        if not isinstance(cur, Mapping) or part not in cur:
            return None
        cur = cur[part]
    return cur


def _problem_text(row: Mapping[str, Any], where: str) -> str:
    for key in ("extra_info.raw_problem", "problem"):
        value = _get(row, key)
        if value is not None:
            if not isinstance(value, str) or not value.strip():
                raise DataError(f"{where}: field `{key}` must be non-empty text, got {value!r:.80}")
            return value
    prompt = row.get("prompt")
    if isinstance(prompt, str) and prompt.strip():
        return strip_dapo_template(prompt)
    if isinstance(prompt, list | tuple) and prompt:
        users = [m for m in prompt if isinstance(m, Mapping) and m.get("role") == "user"]
        content = (users or [prompt[-1]])[-1]
        content = content.get("content") if isinstance(content, Mapping) else None
        if isinstance(content, str) and content.strip():
            return strip_dapo_template(content)
    raise DataError(
        f"{where}: no problem text (looked for extra_info.raw_problem, problem, prompt); row keys: {sorted(row)}"
    )


def _answer(row: Mapping[str, Any], where: str) -> str:
    for key in ("reward_model.ground_truth", "answer"):
        value = _get(row, key)
        if value is None:
            continue
        if isinstance(value, bool) or not isinstance(value, str | int | float):
            raise DataError(f"{where}: field `{key}` must be a string or number, got {type(value).__name__}")
        text = str(value).strip()
        if not text:
            raise DataError(f"{where}: field `{key}` is empty: a problem needs an answer to be rewarded")
        return text
    raise DataError(f"{where}: no answer (looked for reward_model.ground_truth, answer); row keys: {sorted(row)}")


def row_to_problem(row: Any, where: str, default_id: str) -> Problem:
    """One upstream row -> Problem. `where` ("file:line") prefixes every error."""
    if not isinstance(row, Mapping):
        raise DataError(f"{where}: expected a JSON object per row, got {type(row).__name__}")
    pid = row.get("id")
    if pid is None:
        pid = _get(row, "extra_info.index")
    return Problem(
        id=str(pid) if pid is not None else default_id, problem=_problem_text(row, where), answer=_answer(row, where)
    )


def _iter_jsonl(path: Path) -> Iterator[tuple[str, Any]]:
    with path.open(encoding="utf-8") as fh:
        for lineno, line in enumerate(fh, start=1):
            if not line.strip():
                continue
            try:
                yield f"{path}:{lineno}", json.loads(line)
            except json.JSONDecodeError as e:
                raise DataError(f"{path}:{lineno}: not valid JSON ({e.msg} at column {e.colno})") from None


def _iter_parquet(path: Path) -> Iterator[tuple[str, Any]]:
    import pyarrow.parquet as pq

    for i, row in enumerate(pq.read_table(path).to_pylist(), start=1):
        yield f"{path}: row {i}", row


def _iter_hub(dataset_id: str, split: str) -> Iterator[tuple[str, Any]]:
    import datasets

    ds = datasets.load_dataset(dataset_id, split=split)
    for i, row in enumerate(ds, start=1):
        yield f"{dataset_id}[{split}]: row {i}", row


def iter_rows(source: str | Path, split: str = "train") -> Iterator[tuple[str, Any]]:
    """(where, raw row) for a local .jsonl / .parquet file or a hub dataset id."""
    source = str(source)
    path = Path(source)
    if path.suffix == ".jsonl" or (path.is_file() and path.suffix != ".parquet"):
        if not path.is_file():
            raise DataError(f"{path}: file not found")
        return _iter_jsonl(path)
    if path.suffix == ".parquet":
        if not path.is_file():
            raise DataError(f"{path}: file not found")
        return _iter_parquet(path)
    if path.exists():
        raise DataError(f"{path}: expected a .jsonl or .parquet file")
    if "/" not in source:
        raise DataError(f"{source!r}: neither a local .jsonl/.parquet file nor a hub dataset id (owner/name)")
    return _iter_hub(source, split)


def dedup_problems(problems: Iterable[Problem]) -> tuple[list[Problem], LoadStats]:
    """Keep the first problem of each distinct text (order preserved)."""
    first: dict[str, Problem] = {}
    rows = conflicts = 0
    for p in problems:
        rows += 1
        kept = first.setdefault(p.problem, p)
        if kept is not p and kept.answer != p.answer:
            conflicts += 1
    unique = list(first.values())
    return unique, LoadStats(
        rows=rows, unique=len(unique), duplicates=rows - len(unique), conflicting_answers=conflicts
    )


def load_problems_with_stats(
    source: str | Path, *, split: str = "train", dedup: bool = True
) -> tuple[list[Problem], LoadStats]:
    """All problems of `source` (deduplicated by problem text unless `dedup=False`) and what loading did."""
    stem = Path(str(source)).stem or str(source).rsplit("/", 1)[-1]
    problems = [row_to_problem(row, where, f"{stem}-{i}") for i, (where, row) in enumerate(iter_rows(source, split))]
    if not dedup:
        return problems, LoadStats(len(problems), len(problems), 0, 0)
    return dedup_problems(problems)


def load_problems(source: str | Path, *, split: str = "train", dedup: bool = True) -> list[Problem]:
    """All problems of a hub id or local .jsonl/.parquet file, deduplicated by problem text."""
    return load_problems_with_stats(source, split=split, dedup=dedup)[0]


def write_problems(path: str | Path, problems: Iterable[Problem]) -> int:
    """Write `{"id", "problem", "answer"}` JSONL (the format `prepare-data` hands to a run); returns the count."""
    n = 0
    with Path(path).open("w", encoding="utf-8") as fh:
        for p in problems:
            fh.write(json.dumps({"id": p.id, "problem": p.problem, "answer": p.answer}, ensure_ascii=False) + "\n")
            n += 1
    return n
