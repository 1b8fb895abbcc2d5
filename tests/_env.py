"""The environment of a `dapo` process a test starts: offline, CPU, one thread per process, the project and the
venv found first, and nothing of a launcher, a SLURM job or a test hook inherited from the pytest process (a
test that wants one passes it in `extra`)."""

from __future__ import annotations

import os
import signal
import socket
import subprocess
import sys
import time
import urllib.request
from pathlib import Path

REPO = Path(__file__).resolve().parent.parent
FAULTS = REPO / "tests" / "faults"  # injects the faults a DAPO_TEST_* variable asks for (tests/faults/dapo_faults.py)
INHERITED_NOT = (
    "RANK",
    "WORLD_SIZE",
    "LOCAL_RANK",
    "MASTER_ADDR",
    "MASTER_PORT",
    "SLURM_JOB_ID",
    "SLURM_JOB_END_TIME",
    "SLURM_PROCID",
    "SLURM_NTASKS",
    "DAPO_TEST_KILL_AT",
    "DAPO_TEST_FAIL_AT",
    "DAPO_TEST_POISON_STEP",
    "DAPO_TEST_SYNC",
    "DAPO_TEST_SAME_SEEDS",
    "DAPO_TEST_SLOW_AT",
)


def child_env(**extra: str) -> dict[str, str]:
    e = dict(
        os.environ,
        HF_HUB_OFFLINE="1",
        TRANSFORMERS_OFFLINE="1",
        DS_ACCELERATOR="cpu",
        OMP_NUM_THREADS="1",
        TOKENIZERS_PARALLELISM="false",
        PYTHONHASHSEED="0",
        PYTHONPATH=f"{REPO}{os.pathsep}{FAULTS}",
        PATH=f"{Path(sys.executable).parent}{os.pathsep}{os.environ.get('PATH', '')}",
    )
    for key in INHERITED_NOT:
        e.pop(key, None)
    e.update(extra)
    return e


def free_port() -> int:
    """A TCP port nothing listens on now (for a rendezvous or a server a test starts)."""
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def rank_env(rank: int, world: int, port: int) -> dict[str, str]:
    """The environment of rank `rank` of a `world`-process group a test starts by hand (torchrun's variables)."""
    return dict(
        os.environ,
        RANK=str(rank),
        WORLD_SIZE=str(world),
        LOCAL_RANK=str(rank),
        MASTER_ADDR="127.0.0.1",
        MASTER_PORT=str(port),
        OMP_NUM_THREADS="1",
    )


def start_mlflow_server(store: Path, port: int, admin_password: str | None = None) -> subprocess.Popen:
    """An MLflow tracking server on 127.0.0.1:`port` over a SQLite store in `store`, answering /health.

    With `admin_password`: MLflow's authenticated server (`--app-name basic-auth`, which needs Flask-WTF:
    mlflow[auth]), its users in `store`/basic_auth.db, the admin `admin`, and READ for every user by default."""
    mlflow_bin = Path(sys.executable).with_name("mlflow")
    env = dict(os.environ)
    auth: list[str] = []
    if admin_password is not None:
        ini = store / "basic_auth.ini"
        ini.write_text(
            "[mlflow]\ndefault_permission = READ\n"
            f"database_uri = sqlite:///{store / 'basic_auth.db'}\nadmin_username = admin\n"
            f"admin_password = {admin_password}\n"
            "authorization_function = mlflow.server.auth:authenticate_request_basic_auth\n"
        )
        env.update(MLFLOW_AUTH_CONFIG_PATH=str(ini), MLFLOW_FLASK_SERVER_SECRET_KEY=os.urandom(16).hex())
        auth = ["--app-name", "basic-auth"]
    proc = subprocess.Popen(
        [
            str(mlflow_bin),
            "server",
            *auth,
            "--backend-store-uri",
            f"sqlite:///{store / 'mlflow.db'}",
            "--artifacts-destination",
            str(store / "artifacts"),
            "--host",
            "127.0.0.1",
            "--port",
            str(port),
            "--workers",
            "1",
        ],
        cwd=store,
        env=env,
        stdout=subprocess.DEVNULL,
        stderr=subprocess.DEVNULL,
        start_new_session=True,
    )
    deadline = time.time() + 180  # a shared 2-core machine can take a minute to start it
    while time.time() < deadline:
        try:
            with socket.create_connection(("127.0.0.1", port), timeout=0.5):
                pass
            with urllib.request.urlopen(f"http://127.0.0.1:{port}/health", timeout=2) as r:
                if r.status == 200:
                    return proc
        except OSError:
            time.sleep(0.3)
        if proc.poll() is not None:
            raise RuntimeError(f"mlflow server exited with {proc.returncode}")
    stop_mlflow_server(proc)
    raise RuntimeError("mlflow server did not answer in 180 s")


def stop_mlflow_server(proc: subprocess.Popen) -> None:
    # the server was started in its own session: signal its group (its uvicorn worker) through our child's pid
    if proc.poll() is None:
        os.killpg(proc.pid, signal.SIGTERM)
        try:
            proc.wait(timeout=15)
        except subprocess.TimeoutExpired:
            os.killpg(proc.pid, signal.SIGKILL)
            proc.wait()
