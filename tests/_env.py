"""The environment of a `dapo` process a test starts: offline, CPU, one thread per process, the project and the
venv found first, and nothing of a launcher, a SLURM job or a test hook inherited from the pytest process (a
test that wants one passes it in `extra`)."""

from __future__ import annotations

import os
import socket
import sys
from pathlib import Path

REPO = Path(__file__).resolve().parent.parent
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
        PYTHONPATH=str(REPO),
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
