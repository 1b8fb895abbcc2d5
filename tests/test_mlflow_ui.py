"""The MLflow UI shows an ablation the way a user compares it: one experiment, runs named `<row>-s<seed>`, and
each run's headline avg@k under the same metric name, readable in the runs table, sorted by it.

Drives scripts/mlflow_screenshot.py (the script that makes the README's picture from a real run) over a synthetic
SQLite store: it starts `mlflow server`, drives headless Chromium with Playwright and saves a screenshot, which
stays in the test's temporary directory (a fixture picture of made-up numbers, never the README's). Skips without
Chromium or Playwright, except under CI=true, where they are required.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

from dapo import metric_names as M

pytestmark = [pytest.mark.browser, pytest.mark.slow]

CHROMIUM = os.environ.get("DAPO_CHROMIUM", "/usr/bin/chromium")
REPO = Path(__file__).resolve().parent.parent
SCRIPT = REPO / "scripts" / "mlflow_screenshot.py"
R = list(M.PAPER_TABLE1)
FINAL = {r: [20.0 + 4.5 * i, 21.5 + 4.5 * i] for i, r in enumerate(R)}  # made-up final avg@32, one decimal


def _need_browser(in_ci: bool) -> None:
    try:
        import playwright.sync_api  # noqa: F401

        why = None
    except ImportError:
        why = "Python playwright is not installed (the `test` extra)"
    if not Path(CHROMIUM).exists():
        why = f"Chromium not found at {CHROMIUM} (Debian: apt-get install -y chromium)"
    if why:
        if in_ci:
            pytest.fail(f"CI=true but {why}")
        pytest.skip(why)


@pytest.fixture(scope="module")
def store(tmp_path_factory) -> str:
    """A synthetic 6 rows x 2 seeds experiment in a SQLite store."""
    from _synthetic_experiment import build_synthetic_experiment

    d = tmp_path_factory.mktemp("mlflow_ui")
    uri = f"sqlite:///{d}/mlflow.db"
    build_synthetic_experiment(uri, "dapo-ablation", FINAL, total_steps=5, eval_every=5)
    return uri


def _screenshot(*args: str) -> subprocess.CompletedProcess:
    return subprocess.run(
        [sys.executable, str(SCRIPT), *args], capture_output=True, text=True, timeout=600, cwd=REPO, check=False
    )


def test_runs_share_the_headline_metric_names(store):
    from mlflow.tracking import MlflowClient

    client = MlflowClient(store)
    runs = client.search_runs([client.get_experiment_by_name("dapo-ablation").experiment_id])
    headline = {M.eval_avg(32), M.eval_pass(32), M.eval_maj(32)}
    assert sorted(r.info.run_name for r in runs) == sorted(f"{r}-s{s}" for r in R for s in (0, 1))
    assert all(headline <= set(r.data.metrics) for r in runs)


def test_the_runs_table_shows_every_run_with_its_avg_at_k_sorted(store, in_ci, tmp_path):
    _need_browser(in_ci)
    shot, shown = tmp_path / "mlflow_ui.png", tmp_path / "shown.json"
    p = _screenshot("--tracking-uri", store, "--experiment", "dapo-ablation", "--out", str(shot), "--json", str(shown))
    assert p.returncode == 0, p.stdout[-2000:] + p.stderr[-4000:]
    table = json.loads(shown.read_text())
    assert {name: float(v) for name, v in table.items()} == {f"{r}-s{s}": FINAL[r][s] for r in R for s in (0, 1)}
    values = [float(v) for v in table.values()]  # in display order
    assert values == sorted(values, reverse=True)  # sorted by avg@32
    assert shot.read_bytes()[:4] == b"\x89PNG" and shot.stat().st_size > 20_000
    assert "eval/avg_at_32" in p.stdout


def test_the_script_names_what_is_missing_before_starting_anything(store, tmp_path):
    missing = _screenshot("--tracking-uri", f"sqlite:///{tmp_path}/none.db", "--out", str(tmp_path / "x.png"))
    assert missing.returncode == 2 and "does not exist (run `make ablation` first)" in missing.stderr
    wrong = _screenshot("--tracking-uri", store, "--experiment", "dapo-tiny", "--out", str(tmp_path / "x.png"))
    assert wrong.returncode == 2 and "'dapo-tiny' is not in" in wrong.stderr and "dapo-ablation" in wrong.stderr
    assert not (tmp_path / "x.png").exists()
