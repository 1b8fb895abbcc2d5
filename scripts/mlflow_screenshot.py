"""Screenshot the MLflow UI's runs table of an ablation: one row per run (`<row>-s<seed>`), with the eval columns
(avg@k, pass@k, maj@k at the largest k the runs logged), sorted by avg@k. The README's picture comes from here,
after a real run:

    make ablation
    .venv/bin/python scripts/mlflow_screenshot.py --tracking-uri sqlite:///results/tiny/mlflow.db \\
        --experiment dapo-tiny --out docs/img/mlflow_ui.png

For a SQLite store it starts `mlflow server` on a free local port and stops it afterwards; an http(s) URI is
used as it is. Drives headless Chromium through Playwright (the `test` extra; Debian: `apt-get install -y
chromium`, or set DAPO_CHROMIUM). `--json` also writes what the table showed, {run name: avg@k}, so a caller can
check the picture's numbers against the store.
"""

from __future__ import annotations

import argparse
import json
import os
import re
import signal
import socket
import subprocess
import sys
import tempfile
import time
import urllib.request
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path

REPO = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(REPO))

from dapo import metric_names as M  # noqa: E402

CHROMIUM = os.environ.get("DAPO_CHROMIUM", "/usr/bin/chromium")
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
SERVER_START_S = 180  # ~6 s on an idle machine, much more on a busy one


class ScreenshotError(RuntimeError):
    """Something the user can fix: the message says what."""


def sqlite_path(uri: str) -> Path | None:
    return Path(uri.removeprefix("sqlite:///")) if uri.startswith("sqlite:///") else None


def experiment_runs(uri: str, experiment: str) -> tuple[str, int, list[str]]:
    """(experiment id, the largest k with an eval/avg_at_k metric, run names), or ScreenshotError saying what is
    missing. Read straight from the store, before any server or browser starts."""
    from mlflow.tracking import MlflowClient

    path = sqlite_path(uri)
    if path is not None and not path.is_file():
        raise ScreenshotError(f"--tracking-uri {uri}: {path} does not exist (run `make ablation` first)")
    client = MlflowClient(tracking_uri=uri)
    exp = client.get_experiment_by_name(experiment)
    if exp is None:
        names = sorted(e.name for e in client.search_experiments())
        raise ScreenshotError(f"--experiment {experiment!r} is not in {uri}; it has: {', '.join(names) or 'none'}")
    runs = client.search_runs([exp.experiment_id])
    prefix = M.eval_avg(0).removesuffix("0")  # eval/avg_at_
    ks = {int(key[len(prefix) :]) for r in runs for key in r.data.metrics if re.fullmatch(rf"{prefix}\d+", key)}
    if not ks:
        raise ScreenshotError(f"experiment {experiment!r} in {uri}: no run has logged {prefix}<k> yet")
    return exp.experiment_id, max(ks), [r.info.run_name for r in runs]


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


@contextmanager
def ui_server(uri: str) -> Iterator[str]:
    """The UI's base URL: an http(s) tracking URI as it is, or a local `mlflow server` over a SQLite store,
    stopped by its process id afterwards."""
    if uri.startswith(("http://", "https://")):
        yield uri.rstrip("/")
        return
    port = _free_port()
    with tempfile.TemporaryDirectory(prefix="mlflow-ui-") as tmp:
        log = open(Path(tmp) / "server.log", "w")
        proc = subprocess.Popen(
            [
                sys.executable,
                "-m",
                "mlflow",
                "server",
                "--backend-store-uri",
                uri,
                "--default-artifact-root",
                (Path(tmp) / "artifacts").as_uri(),
                "--host",
                "127.0.0.1",
                "--port",
                str(port),
                "--workers",
                "1",
            ],
            stdout=log,
            stderr=subprocess.STDOUT,
            start_new_session=True,
        )
        url = f"http://127.0.0.1:{port}"
        try:
            deadline = time.time() + SERVER_START_S
            while True:
                try:
                    urllib.request.urlopen(f"{url}/health", timeout=2)
                    break
                except OSError:
                    if proc.poll() is not None or time.time() > deadline:
                        log.flush()
                        tail = (Path(tmp) / "server.log").read_text()[-2000:]
                        raise ScreenshotError(f"mlflow server did not start:\n{tail}") from None
                    time.sleep(0.5)
            yield url
        finally:
            proc.terminate()  # SIGTERM to the parent stops its workers
            try:
                proc.wait(15)
            except subprocess.TimeoutExpired:
                os.killpg(proc.pid, signal.SIGKILL)  # the session this script started, by its id
                proc.wait(5)
            log.close()


def screenshot(url: str, exp_id: str, k: int, out: Path, width: int, height: int, wait_for: str) -> dict[str, str]:
    """Open the experiment's runs table sorted by avg@k, show the eval columns, save a PNG; return
    {run name: avg@k as shown}."""
    from playwright.sync_api import sync_playwright

    avg = M.eval_avg(k)
    sort = f"metrics.%60{avg.replace('/', '%2F')}%60"
    shown: dict[str, dict[str, str]] = {}
    with tempfile.TemporaryDirectory(prefix="chromium-") as profile, sync_playwright() as p:
        browser = p.chromium.launch_persistent_context(
            profile, executable_path=CHROMIUM, args=CHROMIUM_ARGS, viewport={"width": width, "height": height}
        )
        try:
            page = browser.new_page()
            # workflowType=machine_learning: the "Model training" view (MLflow 3 opens in its GenAI view otherwise)
            page.goto(
                f"{url}/#/experiments/{exp_id}/runs?workflowType=machine_learning&orderByKey={sort}&orderByAsc=false"
            )
            page.get_by_text(wait_for).first.wait_for(timeout=90_000)
            close = page.get_by_role("button", name="Close")  # the assistant side panel, if open
            if close.count():
                close.first.click()
            page.get_by_role("button", name="Columns", exact=True).click()
            for name in (avg, M.eval_pass(k), M.eval_maj(k)):
                page.get_by_text(name, exact=True).first.click()
            page.keyboard.press("Escape")
            page.mouse.move(0, 0)
            page.locator(f'[role=gridcell][col-id="metrics.`{avg}`"]').first.wait_for(timeout=30_000)
            # ag-grid splits a row over pinned/centre containers; `row-index` ties the halves together
            rows = page.locator("[role=row][row-index]")
            for i in range(rows.count()):
                row = rows.nth(i)
                index = row.get_attribute("row-index")
                name = row.locator('[col-id="attributes.`Run Name`"]')
                if name.count():
                    shown.setdefault(index, {})["name"] = name.inner_text().split()[-1]
                cell = row.locator(f'[col-id="metrics.`{avg}`"]')
                if cell.count() and cell.is_visible():
                    shown.setdefault(index, {})["avg"] = cell.inner_text().strip()
            out.parent.mkdir(parents=True, exist_ok=True)
            page.screenshot(path=str(out))
        finally:
            browser.close()
    ordered = [v for _, v in sorted(shown.items(), key=lambda kv: int(kv[0])) if "name" in v and "avg" in v]
    return {v["name"]: v["avg"] for v in ordered}


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0], formatter_class=argparse.RawTextHelpFormatter)
    ap.add_argument(
        "--tracking-uri", default="sqlite:///results/tiny/mlflow.db", help="the store (default: %(default)s)"
    )
    ap.add_argument("--experiment", default="dapo-tiny", help="the experiment (default: %(default)s)")
    ap.add_argument("--out", type=Path, default=REPO / "docs" / "img" / "mlflow_ui.png", help="the PNG to write")
    ap.add_argument("--json", type=Path, help="also write {run name: avg@k as shown} here, in display order")
    ap.add_argument("--width", type=int, default=1800)
    ap.add_argument("--height", type=int, default=760)
    args = ap.parse_args(argv)
    try:
        exp_id, k, names = experiment_runs(args.tracking_uri, args.experiment)
        if not Path(CHROMIUM).exists():
            raise ScreenshotError(
                f"Chromium not found at {CHROMIUM} (Debian: apt-get install -y chromium; or set DAPO_CHROMIUM)"
            )
        with ui_server(args.tracking_uri) as url:
            shown = screenshot(url, exp_id, k, args.out, args.width, args.height, wait_for=sorted(names)[0])
    except ScreenshotError as e:
        print(f"mlflow_screenshot: {e}", file=sys.stderr)
        return 2
    if args.json:
        args.json.write_text(json.dumps(shown, indent=1))
    print(f"wrote {args.out}: {len(shown)} runs of {args.experiment!r}, sorted by {M.eval_avg(k)}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
