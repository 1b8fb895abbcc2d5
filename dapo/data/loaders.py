"""Load math problems (DAPO-Math-17k, AIME 2024/2025, the tiny world) as `Problem(id, problem, answer)` from a hub
dataset id or a local `.parquet` / `.jsonl` file. The row layouts understood, deduplication and what is logged:
docs/architecture.md, "data/ and tinyworld/"; a broken row raises `DataError` naming the file, the 1-based line
or row, and the fix (docs/failure-modes.md)."""

from __future__ import annotations

import json
import logging
import re
from collections.abc import Iterable, Iterator, Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from dapo.data.prompts import strip_dapo_template
from dapo.types import Problem

log = logging.getLogger(__name__)
SHOWN = 3  # line numbers quoted per kind of problem
_INTEGER = re.compile(r"[-+]?\d+")
# Datasets whose every answer is an integer: a non-integer answer there is a data error to report.
_INTEGER_KINDS = re.compile(r"aime|dapo[-_]?math|tiny", re.IGNORECASE)


class DataError(ValueError):
    """A data file problem, naming the file and the 1-based line or row."""


@dataclass(frozen=True)
class LoadStats:
    """What loading did: rows read, duplicates removed (same problem text) and of those how many disagreed on the
    answer, answers that are not integers where the dataset's are (kept, doubted). `*_at` hold the first few
    "file:line" places; `origins` the place of each problem returned, in order."""

    rows: int
    unique: int
    duplicates: int
    conflicting_answers: int
    non_integer_answers: int = 0
    duplicates_at: tuple[str, ...] = ()
    conflicts_at: tuple[str, ...] = ()
    non_integer_at: tuple[str, ...] = ()
    origins: tuple[str, ...] = field(default=(), repr=False)

    def describe(self, source: str) -> str:
        """One line: what was read, dropped and doubted, with the first few places."""
        text = (
            f"source {source}: {self.rows} rows, "
            f"{self.duplicates} duplicates removed{places_note(self.duplicates_at)}, "
            f"{self.conflicting_answers} with a conflicting answer{places_note(self.conflicts_at)}"
        )
        if self.non_integer_answers:
            text += (
                f", {self.non_integer_answers} answers that are not integers although this dataset's answers are "
                f"(kept, doubtful){places_note(self.non_integer_at)}"
            )
        return text

    @property
    def clean(self) -> bool:
        return not (self.duplicates or self.non_integer_answers)


def places_note(at: tuple[str, ...] | list[str]) -> str:
    return f" (first: {', '.join(at)})" if at else ""


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
    with path.open("rb") as fh:
        for lineno, raw in enumerate(fh, start=1):
            try:
                line = raw.decode("utf-8")
            except UnicodeDecodeError as e:
                raise DataError(
                    f"{path}:{lineno}: byte 0x{raw[e.start]:02x} at column {e.start + 1} is not UTF-8. JSONL must be "
                    f"UTF-8: re-encode the file (e.g. `iconv -f latin1 -t utf-8 {path.name}`) or fix that line."
                ) from None
            if not line.strip():
                continue
            try:
                yield f"{path}:{lineno}", json.loads(line)
            except json.JSONDecodeError as e:
                raise DataError(
                    f"{path}:{lineno}: not valid JSON ({e.msg} at column {e.colno}); each line must be one JSON object"
                ) from None


def _iter_parquet(path: Path) -> Iterator[tuple[str, Any]]:
    import pyarrow as pa
    import pyarrow.parquet as pq

    try:
        rows = pq.read_table(path).to_pylist()
    except (pa.ArrowException, OSError) as e:
        raise DataError(
            f"{path}: not a readable parquet file ({type(e).__name__}: {str(e).splitlines()[0][:200]}). The file is "
            "damaged or not parquet: download or export it again, or convert it to JSONL."
        ) from None
    for i, row in enumerate(rows, start=1):
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
    if path.suffix in (".jsonl", ".parquet") or path.is_file():
        if not path.is_file():
            raise DataError(f"{path}: file not found")
        return _iter_parquet(path) if path.suffix == ".parquet" else _iter_jsonl(path)
    if path.exists():
        raise DataError(f"{path}: expected a .jsonl or .parquet file")
    if "/" not in source:
        raise DataError(f"{source!r}: neither a local .jsonl/.parquet file nor a hub dataset id (owner/name)")
    return _iter_hub(source, split)


def dedup_problems(
    problems: Iterable[Problem], origins: Iterable[str] | None = None, *, integer_answers: bool = False
) -> tuple[list[Problem], LoadStats]:
    """Keep the first problem of each distinct text (order preserved); count and place what was dropped, and
    (with `integer_answers`) the answers that are not integers."""
    problems = list(problems)
    places = list(origins) if origins is not None else [f"row {i}" for i in range(1, len(problems) + 1)]
    first: dict[str, int] = {}
    dup_at: list[str] = []
    conflict_at: list[str] = []
    for i, p in enumerate(problems):
        j = first.setdefault(p.problem, i)
        if j != i:
            dup_at.append(places[i])
            if problems[j].answer != p.answer:
                conflict_at.append(f"{places[i]} vs {places[j]}")
    kept = sorted(first.values())
    odd = [places[i] for i in kept if integer_answers and not _INTEGER.fullmatch(problems[i].answer.strip())]
    return [problems[i] for i in kept], LoadStats(
        rows=len(problems),
        unique=len(kept),
        duplicates=len(dup_at),
        conflicting_answers=len(conflict_at),
        non_integer_answers=len(odd),
        duplicates_at=tuple(dup_at[:SHOWN]),
        conflicts_at=tuple(conflict_at[:SHOWN]),
        non_integer_at=tuple(odd[:SHOWN]),
        origins=tuple(places[i] for i in kept),
    )


def integer_answer_kind(source: str, answers: list[str]) -> bool:
    """True when the dataset's answers are integers: a known integer dataset by name (AIME, DAPO-Math-17k, the
    tiny world), or a file where at least 90% of the (10 or more) answers are integers."""
    if _INTEGER_KINDS.search(str(source)):
        return True
    ints = sum(1 for a in answers if _INTEGER.fullmatch(a.strip()))
    return len(answers) >= 10 and ints >= 0.9 * len(answers)


_CACHE: dict[tuple, tuple[list[Problem], LoadStats]] = {}


def load_problems_with_stats(
    source: str | Path, *, split: str = "train", dedup: bool = True
) -> tuple[list[Problem], LoadStats]:
    """All problems of `source` (deduplicated by problem text unless `dedup=False`) and what loading did.

    Logs what was dropped or doubted (once per file version: the trainer's pre-flight check and its setup load
    the same file). Raises `DataError` for a source without a single row."""
    path = Path(str(source))
    key = (str(source), split, dedup, *((path.stat().st_mtime_ns, path.stat().st_size) if path.is_file() else ()))
    if key in _CACHE:
        problems, stats = _CACHE[key]
        return list(problems), stats
    stem = path.stem or str(source).rsplit("/", 1)[-1]
    rows = list(iter_rows(source, split))
    if not rows:
        raise DataError(
            f"{source}: no rows. An empty data set cannot be trained or evaluated on: point data.train / "
            "data.eval at a file with problems (one JSON object per line, or a parquet table)."
        )
    problems = [row_to_problem(row, where, f"{stem}-{i}") for i, (where, row) in enumerate(rows)]
    origins = [where for where, _ in rows]
    integers = integer_answer_kind(str(source), [p.answer for p in problems])
    kept, stats = dedup_problems(problems, origins, integer_answers=integers)
    if dedup:
        problems = kept
    else:  # every row stays: only the doubted answers are reported
        n, odd = len(problems), stats.non_integer_answers
        stats = LoadStats(n, n, 0, 0, odd, non_integer_at=stats.non_integer_at, origins=tuple(origins))
    (log.info if stats.clean else log.warning)("%s", stats.describe(str(source)))
    _CACHE[key] = (list(problems), stats)
    return problems, stats


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
