#!/usr/bin/env bash
# Stop what scripts/slurm/start.sh started and remove what it made, by its records: the daemons by their PID files
# (every node's slurmd, slurmctld, slurmdbd, MariaDB, munged), then every process left in a node's namespace, the
# namespaces, the links and the /etc/hosts lines listed in $STATE/made. Nothing it did not record is touched.
STATE=${DAPO_SLURM_STATE:-/tmp/dapo-slurm}
stop_pid() {
  local f=$1 pid
  [ -s "$f" ] || return 0
  pid=$(cat "$f")
  kill "$pid" 2>/dev/null || true
  for _ in $(seq 1 40); do kill -0 "$pid" 2>/dev/null || break; sleep 0.25; done
  if kill -0 "$pid" 2>/dev/null; then kill -9 "$pid" 2>/dev/null || true; fi  # never a PID reused since it ended
  rm -f "$f"
}
for f in "$STATE"/slurmd*.pid; do stop_pid "$f"; done
for name in slurmctld slurmdbd mariadb munged; do stop_pid "$STATE/$name.pid"; done
MADE="$STATE/made"
if [ -f "$MADE" ]; then
  while read -r kind name; do
    case "$kind" in
      netns)
        for pid in $(ip netns pids "$name" 2>/dev/null); do kill -9 "$pid" 2>/dev/null || true; done
        ip netns del "$name" 2>/dev/null || true ;;
    esac
  done < "$MADE"
  while read -r kind name; do
    case "$kind" in
      link) ip link del "$name" 2>/dev/null || true ;;
      hosts)
        # /etc/hosts may be a bind mount (containers): rewrite it in place
        kept=$(grep -vF "$name" /etc/hosts || true)
        printf '%s\n' "$kept" > /etc/hosts ;;
    esac
  done < "$MADE"
  rm -f "$MADE"
fi
echo "slurm stopped"
