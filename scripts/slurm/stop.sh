#!/usr/bin/env bash
# Stop what scripts/slurm/start.sh started, by the PIDs it recorded (slurmd, slurmctld, slurmdbd, MariaDB, munged).
STATE=${DAPO_SLURM_STATE:-/tmp/dapo-slurm}
for name in slurmd slurmctld slurmdbd mariadb munged; do
  f="$STATE/$name.pid"
  [ -s "$f" ] || continue
  pid=$(cat "$f")
  kill "$pid" 2>/dev/null || true
  for _ in $(seq 1 40); do kill -0 "$pid" 2>/dev/null || break; sleep 0.25; done
  kill -9 "$pid" 2>/dev/null || true
  rm -f "$f"
done
echo "slurm stopped"
