#!/usr/bin/env bash
# What the integration tests need beside the venv, for contributors and CI (as root):
#   start: a SLURM cluster of three nodes on this machine, each a network namespace with its own address and
#          slurmd, with accounting (scripts/slurm/start.sh; DAPO_SLURM_NODES=N for another size), and Debian's
#          Chromium for the MLflow UI browser test;  stop: stop the cluster and remove what it made.
set -euo pipefail
cd "$(dirname "$0")/.."
case "${1:-start}" in
  start)
    if ! command -v chromium >/dev/null; then
      echo "installing chromium (MLflow UI browser test)"
      export DEBIAN_FRONTEND=noninteractive
      apt-get update -qq >/dev/null && apt-get install -y -qq chromium >/dev/null
    fi
    if ! command -v cc >/dev/null; then
      echo "installing a C compiler (the tiny world's MKL vendor library, tiny.kernels: portable)"
      export DEBIAN_FRONTEND=noninteractive
      apt-get update -qq >/dev/null && apt-get install -y -qq gcc libc6-dev >/dev/null
    fi
    bash scripts/slurm/start.sh ;;
  stop)
    bash scripts/slurm/stop.sh ;;
  *) echo "usage: $0 start|stop" >&2; exit 2 ;;
esac
