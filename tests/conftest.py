"""Shared test fixtures. Tests that need ../shared (public data for checks) skip with a reason where it is absent,
as on a user's clone; tests that need a SLURM cluster skip without one unless CI=true."""

from __future__ import annotations

import os
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parent.parent
SHARED = Path(os.environ.get("DAPO_SHARED", REPO.parent / "shared"))
SHARED_DATA = SHARED / "data"

os.environ.setdefault("HF_HUB_OFFLINE", "1")
os.environ.setdefault("TRANSFORMERS_OFFLINE", "1")
os.environ.setdefault("HF_DATASETS_OFFLINE", "1")
os.environ.setdefault("DS_ACCELERATOR", "cpu")
os.environ.setdefault("TOKENIZERS_PARALLELISM", "false")


@pytest.fixture
def shared_data() -> Path:
    if not (SHARED_DATA / "aime2024.jsonl").is_file():
        pytest.skip(f"needs the public data in {SHARED_DATA} (absent on a user's clone)")
    return SHARED_DATA


@pytest.fixture
def in_ci() -> bool:
    return os.environ.get("CI", "").lower() in ("1", "true", "yes")


@pytest.fixture(scope="session")
def tiny_world_dir() -> Path:
    """The default tiny world, built once (a few CPU-minutes) and cached under results/, as the workflow does."""
    from dapo.config import load_config
    from dapo.tinyworld import ensure_tiny_world

    out = REPO / "results" / "tiny_world"  # the tiny preset's default tiny.dir, shared with the tinyworld tests
    cfg = load_config(preset="tiny", overrides=[f"tiny.dir={out}"])
    return Path(ensure_tiny_world(cfg))
