"""Data: loaders (hub id, parquet, JSONL) that return `Problem`s, the DAPO template, prompt building."""

from __future__ import annotations

from dapo.data.loaders import (
    DataError,
    dedup_problems,
    load_problems,
    load_problems_with_stats,
    write_problems,
)
from dapo.data.prompts import (
    DAPO_TEMPLATE,
    apply_dapo_template,
    build_prompt,
    encode_prompt,
    tokenize_problems,
)

__all__ = [
    "DAPO_TEMPLATE",
    "DataError",
    "apply_dapo_template",
    "build_prompt",
    "dedup_problems",
    "encode_prompt",
    "load_problems",
    "load_problems_with_stats",
    "tokenize_problems",
    "write_problems",
]
