"""The CPU kernels a tiny world is built and trained with, by `tiny.kernels`: the environment of the build's child
process and of the workflow's tiny runs on x86-64 (elsewhere nothing is pinned). `avx2`: ATen and oneDNN pinned to
their AVX2 code, MKL to its AVX2 branch (`MKL_CBWR=AVX2`); `portable` (the default): those pins, and `mkl_vendor.c`
preloaded so that MKL takes its Intel paths on every x86-64 CPU. Why: docs/evidence.md, section 6, "Why builds
differed: the CPU's kernels" to "On a real Intel host". vLLM's CPU kernels need no pin: its AVX2 and AVX-512 builds
sampled the same tokens with the same log-probs from the tiny model, under either MKL path.
"""

from __future__ import annotations

import hashlib
import os
import platform
import shutil
import subprocess
from pathlib import Path

from dapo.config import ConfigError

_AVX2 = {"ATEN_CPU_CAPABILITY": "avx2", "MKL_CBWR": "AVX2", "ONEDNN_MAX_CPU_ISA": "AVX2"}
KERNEL_PINS = {"avx2": _AVX2, "portable": _AVX2}  # the environment variables; portable adds the preload below
MKL_INTEL_PATHS = ("portable",)  # the settings that make MKL take its Intel paths on every vendor's CPU
MKL_VENDOR_SOURCE = Path(__file__).with_name("mkl_vendor.c")


class KernelPinError(ConfigError):
    """`tiny.kernels: portable` cannot be set up on this machine (no C compiler, or the library did not build)."""


def pinned_kernels(kernels: str) -> dict[str, str]:
    """The environment that pins a `tiny.kernels` setting's CPU kernels on this machine (empty where nothing is
    pinned). For `portable` it preloads the MKL vendor library before any preload the environment already has."""
    if platform.machine().lower() not in ("x86_64", "amd64"):
        return {}
    env = dict(KERNEL_PINS[kernels])
    if kernels in MKL_INTEL_PATHS:
        env["LD_PRELOAD"] = ":".join(
            p for p in (str(mkl_vendor_library(intel=True)), os.environ.get("LD_PRELOAD")) if p
        )
    return env


def kernels_record(kernels: str) -> dict[str, str]:
    """What a manifest records of the pins: the variables, and MKL's vendor paths (the library's path is this
    machine's, not part of the world)."""
    pins = {k: v for k, v in pinned_kernels(kernels).items() if k != "LD_PRELOAD"}
    if pins and kernels in MKL_INTEL_PATHS:
        pins["mkl_vendor_paths"] = "intel"
    return pins


def mkl_vendor_library(*, intel: bool, cache: Path | None = None) -> Path:
    """`mkl_vendor.c` compiled to answer as an Intel CPU (`intel=True`) or as another vendor's, once per source and
    answer, into `cache` (default: $XDG_CACHE_HOME/dapo, else ~/.cache/dapo). Raises KernelPinError, with the fix,
    where no C compiler is found or the compile fails."""
    src = MKL_VENDOR_SOURCE.read_bytes()
    cache = cache or Path(os.environ.get("XDG_CACHE_HOME") or Path.home() / ".cache") / "dapo"
    lib = cache / f"mkl_as_{'intel' if intel else 'other'}-{hashlib.sha256(src).hexdigest()[:12]}.so"
    if lib.exists():
        return lib
    cc = os.environ.get("CC") or shutil.which("cc") or shutil.which("gcc")
    fix = (
        "install a C compiler (Debian: apt install gcc), or set tiny.kernels: avx2 (a world that differs between "
        "Intel and AMD CPUs)"
    )
    if not cc:
        raise KernelPinError(f"tiny.kernels: portable compiles a small library and no C compiler was found: {fix}")
    cache.mkdir(parents=True, exist_ok=True)
    tmp = lib.with_name(f"{lib.name}.{os.getpid()}.tmp")
    cmd = [cc, f"-DAS_INTEL={int(intel)}", "-shared", "-fPIC", "-O2", "-o", str(tmp), str(MKL_VENDOR_SOURCE), "-ldl"]
    r = subprocess.run(cmd, capture_output=True, text=True)
    if r.returncode != 0:
        tmp.unlink(missing_ok=True)
        raise KernelPinError(f"tiny.kernels: portable: `{' '.join(cmd)}` failed:\n{r.stderr.strip()}\n{fix}")
    os.replace(tmp, lib)  # atomic: runs that start together never load a half-written library
    return lib
