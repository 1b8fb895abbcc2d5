#!/usr/bin/env bash
# The peers' loss code that tests/test_peer_parity.py checks ours against, beside the venv (not in it):
#   TRL comes with the `test` extra (pure Python); verl's full install would pull vLLM, Ray's dependencies and more,
#   so its wheel goes into .peers/verl with only the packages `verl.trainer.ppo.core_algos` imports, --no-deps, and
#   the parity test runs it in a subprocess with that folder on PYTHONPATH (nothing of it reaches the venv).
# Re-running is cheap: it installs only when .peers/verl is missing or another verl is asked for.
set -euo pipefail
ROOT=$(cd "$(dirname "$0")/.." && pwd)
PEERS=${DAPO_PEERS_DIR:-$ROOT/.peers}
VERL=${DAPO_VERL_VERSION:-0.9.1}
PY=${PYTHON:-$ROOT/.venv/bin/python}
STAMP="$PEERS/verl/.installed"
if [ -f "$STAMP" ] && [ "$(cat "$STAMP")" = "$VERL" ]; then exit 0; fi
echo "[peers] installing verl $VERL (its loss code and what it imports) into $PEERS/verl" >&2
rm -rf "$PEERS/verl"
mkdir -p "$PEERS/verl"
"$PY" -m pip install -q --no-deps --target "$PEERS/verl" "verl==$VERL" omegaconf "tensordict>=0.8,<=0.10,!=0.9.0" \
  pyvers ray codetiming orjson
PYTHONPATH="$PEERS/verl" "$PY" -c "import verl.trainer.ppo.core_algos, verl.trainer.ppo.rollout_corr_helper" 2>/dev/null
echo "$VERL" > "$STAMP"
echo "[peers] ready: $PEERS/verl" >&2
