"""The MLflow UI shows an ablation the way a user compares it: one experiment, runs named `<row>-s<seed>`, and
each run's headline avg@k under the same metric name, readable in the runs table.

Starts `mlflow server` on 127.0.0.1 (free port) over a synthetic SQLite store, drives headless Chromium with
playwright, and saves a screenshot (set DAPO_UPDATE_DOCS_IMG=1 to copy it to docs/img/mlflow_ui.png for the
README). Skips without Chromium, except under CI=true, where Chromium is required.
"""

from __future__ import annotations

import os
import shutil
import signal
import socket
import subprocess
import sys
import time
import urllib.request
from pathlib import Path

import pytest

from dapo import metric_names as M

pytestmark = [pytest.mark.browser, pytest.mark.slow]

CHROMIUM = os.environ.get("DAPO_CHROMIUM", "/usr/bin/chromium")
REPO = Path(__file__).resolve().parent.parent
R = list(M.PAPER_TABLE1)
FINAL = {r: [20.0 + 4.5 * i, 21.5 + 4.5 * i] for i, r in enumerate(R)}  # made-up final avg@32, one decimal
CHROMIUM_ARGS = [
    "--headless",
    "--no-sandbox",
    "--disable-gpu",
    "--disable-quic",
    "--no-first-run",
    "--disable-background-networking",
    "--disable-component-update",
    "--disable-sync",
]


def _need_browser(in_ci: bool):
    try:
        from playwright.sync_api import sync_playwright
    except ImportError:
        sync_playwright = None
    why = None if sync_playwright else "Python playwright is not installed (the `test` extra)"
    if not Path(CHROMIUM).exists():
        why = f"Chromium not found at {CHROMIUM} (Debian: apt-get install -y chromium)"
    if why:
        if in_ci:
            pytest.fail(f"CI=true but {why}")
        pytest.skip(why)
    return sync_playwright


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


@pytest.fixture(scope="module")
def server(tmp_path_factory):
    """A synthetic 6 rows x 2 seeds experiment behind `mlflow server`; stopped by its PID afterwards."""
    from dapo.report.synthetic import build_synthetic_experiment

    d = tmp_path_factory.mktemp("mlflow_ui")
    store = f"sqlite:///{d}/mlflow.db"
    exp_id = build_synthetic_experiment(store, "dapo-ablation", FINAL, total_steps=5, eval_every=5)
    port = _free_port()
    log = open(d / "server.log", "w")
    proc = subprocess.Popen(
        [
            sys.executable,
            "-m",
            "mlflow",
            "server",
            "--backend-store-uri",
            store,
            "--default-artifact-root",
            (d / "artifacts").as_uri(),
            "--host",
            "127.0.0.1",
            "--port",
            str(port),
            "--workers",
            "1",
        ],
        stdout=log,
        stderr=subprocess.STDOUT,
        cwd=d,
        start_new_session=True,
    )
    url = f"http://127.0.0.1:{port}"
    try:
        deadline = time.time() + 180  # ~6 s on an idle machine, much more on a busy one
        while True:
            try:
                urllib.request.urlopen(f"{url}/health", timeout=2)
                break
            except OSError:
                if proc.poll() is not None or time.time() > deadline:
                    pytest.fail(f"mlflow server did not start: {(d / 'server.log').read_text()[-2000:]}")
                time.sleep(0.5)
        yield url, exp_id
    finally:
        proc.terminate()  # SIGTERM to the parent stops its workers
        try:
            proc.wait(15)
        except subprocess.TimeoutExpired:
            os.killpg(proc.pid, signal.SIGKILL)  # the session this test started, by its id
            proc.wait(5)
        log.close()


def test_runs_share_the_headline_metric_names(server):
    from mlflow.tracking import MlflowClient

    url, exp_id = server
    runs = MlflowClient(url).search_runs([exp_id])
    headline = {M.eval_avg(32), M.eval_pass(32), M.eval_maj(32)}
    assert sorted(r.info.run_name for r in runs) == sorted(f"{r}-s{s}" for r in R for s in (0, 1))
    assert all(headline <= set(r.data.metrics) for r in runs)


def test_experiment_page_lists_runs_with_their_avg_at_k(server, in_ci, tmp_path):
    sync_playwright = _need_browser(in_ci)
    url, exp_id = server
    avg = M.eval_avg(32)
    sort = f"metrics.%60{avg.replace('/', '%2F')}%60"
    shot = tmp_path / "mlflow_ui.png"
    with sync_playwright() as p:
        browser = p.chromium.launch_persistent_context(
            str(tmp_path / "chromium-profile"),
            executable_path=CHROMIUM,
            args=CHROMIUM_ARGS,
            viewport={"width": 1800, "height": 760},
        )
        try:
            page = browser.new_page()
            # workflowType=machine_learning: the "Model training" view (MLflow 3 opens in its GenAI view otherwise)
            page.goto(
                f"{url}/#/experiments/{exp_id}/runs?workflowType=machine_learning&orderByKey={sort}&orderByAsc=false"
            )
            page.get_by_text(f"{R[5]}-s1").wait_for(timeout=90_000)
            close = page.get_by_role("button", name="Close")  # the assistant side panel, if open
            if close.count():
                close.first.click()
            page.get_by_role("button", name="Columns", exact=True).click()
            for name in (avg, M.eval_pass(32), M.eval_maj(32)):
                page.get_by_text(name, exact=True).first.click()
            page.keyboard.press("Escape")
            page.mouse.move(0, 0)
            cells = page.locator(f'[role=gridcell][col-id="metrics.`{avg}`"]')
            cells.first.wait_for(timeout=30_000)
            # ag-grid splits a row over pinned/centre containers; `row-index` ties the halves together
            shown = {}
            for i in range(page.locator("[role=row][row-index]").count()):
                row = page.locator("[role=row][row-index]").nth(i)
                name = row.locator('[col-id="attributes.`Run Name`"]')
                if name.count():
                    shown.setdefault(row.get_attribute("row-index"), {})["name"] = name.inner_text().split()[-1]
                cell = row.locator(f'[col-id="metrics.`{avg}`"]')
                if cell.count():
                    assert cell.is_visible()
                    shown.setdefault(row.get_attribute("row-index"), {})["avg"] = cell.inner_text().strip()
            page.screenshot(path=str(shot))
        finally:
            browser.close()
    got = {v["name"]: float(v["avg"]) for v in shown.values()}
    assert got == {f"{r}-s{s}": FINAL[r][s] for r in R for s in (0, 1)}
    order = [v["avg"] for _, v in sorted(shown.items(), key=lambda kv: int(kv[0]))]
    assert [float(a) for a in order] == sorted((float(a) for a in order), reverse=True)  # sorted by avg@32
    assert shot.read_bytes()[:4] == b"\x89PNG" and shot.stat().st_size > 20_000
    if os.environ.get("DAPO_UPDATE_DOCS_IMG"):
        (REPO / "docs" / "img").mkdir(parents=True, exist_ok=True)
        shutil.copy(shot, REPO / "docs" / "img" / "mlflow_ui.png")
