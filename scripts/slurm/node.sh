#!/usr/bin/env bash
# One node of the test cluster (scripts/slurm/start.sh), for the failure tests and for contributors trying them:
#   node.sh start NODE       start its slurmd (in the node's network namespace, under its own hostname): a host that
#                            boots; with ReturnToService=2 SLURM gives it jobs again once it registers
#   node.sh kill NODE        SIGKILL every process of the node, its slurmd, job steps and ranks: a host that died
#   node.sh link-down NODE   cut its link (the bridge's end of its veth): a host that vanished, its processes alive
#   node.sh link-up NODE     mend it
#   node.sh pids NODE        the processes of the node
# Each node resolves names through its own hosts file, $STATE/hosts.NODE (mounted over its /etc/hosts): edit it in
# place (not by replacing the file) to change what that node alone resolves.
# NODE is n1, n2, ...
set -euo pipefail
STATE=${DAPO_SLURM_STATE:-/tmp/dapo-slurm}
what=${1:?usage: node.sh start|kill|link-down|link-up|pids NODE} node=${2:?which node: n1, n2, ...}
i=${node#n}
ns=dapo-n$i
[ -e "/run/netns/$ns" ] || { echo "node.sh: no node $node (no network namespace $ns: scripts/slurm/start.sh)" >&2; exit 2; }
case "$what" in
  start)
    pidfile="$STATE/slurmd.$node.pid"
    if [ -s "$pidfile" ] && kill -0 "$(cat "$pidfile")" 2>/dev/null; then exit 0; fi
    ip link set "vh$i" up
    mkdir -p "$STATE/d/$node"
    # `ip netns exec` would mount a /sys without the cgroup file system slurmd reads: enter the network only, then
    # a hostname (UTS namespace) and an /etc/hosts and /etc/nsswitch.conf (mount namespace) of the node's own
    nsenter --net="/run/netns/$ns" unshare --uts --mount --propagation private \
      sh -c "mount --bind '$STATE/hosts.$node' /etc/hosts && mount --bind '$STATE/nsswitch.conf' /etc/nsswitch.conf \
             && hostname $node && exec /usr/sbin/slurmd -N $node"
    for _ in $(seq 1 40); do [ -s "$pidfile" ] && break; sleep 0.25; done ;;
  kill)
    for pid in $(ip netns pids "$ns"); do kill -9 "$pid" 2>/dev/null || true; done
    for _ in $(seq 1 40); do [ -z "$(ip netns pids "$ns")" ] && break; sleep 0.25; done
    rm -f "$STATE/slurmd.$node.pid" ;;
  link-down) ip link set "vh$i" down ;;
  link-up) ip link set "vh$i" up ;;
  pids) ip netns pids "$ns" ;;
  *) echo "node.sh: unknown action $what (start|kill|link-down|link-up|pids)" >&2; exit 2 ;;
esac
