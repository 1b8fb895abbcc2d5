#!/usr/bin/env bash
# Start a multi-node SLURM cluster on this one machine, for contributors and CI (as root): each node a network
# namespace with its own address, its own hostname (a UTS namespace) and its own slurmd, joined to the others by a
# bridge, as compute nodes are joined by a switch. The controller (slurmctld), accounting (slurmdbd over MariaDB, so
# that `sacct`, which Snakemake's SLURM executor polls, works) and munge run on this machine, on the bridge's address
# that every node reaches. Node names resolve on every node (/etc/hosts, shared by the namespaces). Everything made is
# recorded in $STATE/made, and scripts/slurm/stop.sh removes exactly that. Installs Debian's packages the first time.
# Idempotent: a running cluster of the same size is left alone.
#   DAPO_SLURM_NODES=N  nodes n1..nN (default 3: the node-failure tests run a 2-node job and need a node to spare)
#   DAPO_SLURM_NET      the /24 the nodes live in (default 10.77.0: the bridge .1, node i .(10+i)); refused when
#                       this machine already routes it
#   FAKE_GPUS=N         advertise N count-only GPUs on every node (no devices), so GPU requests can be scheduled
#   DAPO_SLURM_STATE    where PIDs, logs, state and the record live (default /tmp/dapo-slurm)
# scripts/slurm/node.sh takes one node down and back (a host that dies, a link that drops) for the failure tests.
set -euo pipefail
STATE=${DAPO_SLURM_STATE:-/tmp/dapo-slurm}
NODES=${DAPO_SLURM_NODES:-3}
NET=${DAPO_SLURM_NET:-10.77.0}
BRIDGE=dapo-br
HERE=$(cd "$(dirname "$0")" && pwd)
if [ "$(id -u)" != 0 ]; then echo "start.sh: run as root (it installs and starts system daemons, makes namespaces)" >&2; exit 1; fi
if [ -s "$STATE/slurmctld.pid" ] && kill -0 "$(cat "$STATE/slurmctld.pid")" 2>/dev/null && sinfo -h >/dev/null 2>&1; then
  have=$(sinfo -h -N -o '%N' | sort -u | grep -c .)
  if [ "$have" = "$NODES" ]; then echo "slurm already running: $have nodes (state in $STATE)"; exit 0; fi
  echo "slurm is running with $have nodes, $NODES asked for: restarting it" >&2
  bash "$HERE/stop.sh"
fi
need=()
for b in slurmctld slurmd sinfo munged slurmdbd mariadbd nsenter ip; do
  command -v "$b" >/dev/null || [ -x "/usr/sbin/$b" ] || need+=("$b")
done
if [ ${#need[@]} -gt 0 ]; then
  echo "installing SLURM and iproute2 (missing: ${need[*]})"
  export DEBIAN_FRONTEND=noninteractive
  apt-get update -qq >/dev/null
  apt-get install -y -qq slurmctld slurmd slurm-client slurmdbd munge mariadb-server iproute2 util-linux >/dev/null
fi
# a network this machine already has a route to (other than its default route) is someone else's
if ! ip link show "$BRIDGE" >/dev/null 2>&1; then
  taken=$(ip -o route show to match "$NET.1" | grep -v '^default' || true)
  if [ -n "$taken" ]; then
    echo "start.sh: this machine already routes $NET.0/24 ($taken); pick another network for the test nodes" \
      "with DAPO_SLURM_NET=10.x.y" >&2
    exit 1
  fi
fi
mkdir -p "$STATE"/{ctld,d,log} /etc/slurm /run/munge /run/mysqld
MADE="$STATE/made"   # one line per thing made: "netns NAME", "link NAME", "hosts MARK"
made() { grep -qxF "$*" "$MADE" 2>/dev/null || echo "$*" >> "$MADE"; }
NCPU=$(nproc)
MEM_MB=$(awk '/MemTotal/ {printf "%d", $2/1024*0.9}' /proc/meminfo)
CTL=$(hostname -s)

# ---------------------------------------------------------------------------------------------- the network
# The bridge (this machine's side: the controller's address), then one namespace per node with a veth into it.
if ! ip link show "$BRIDGE" >/dev/null 2>&1; then
  ip link add "$BRIDGE" type bridge
  made link "$BRIDGE"
fi
ip addr replace "$NET.1/24" dev "$BRIDGE"
ip link set "$BRIDGE" up
MARK="# dapo-slurm"
hosts_lines="$NET.1 dapo-ctl $MARK"$'\n'
for i in $(seq 1 "$NODES"); do
  ns=dapo-n$i host=vh$i peer=ve$i
  if ! ip netns list | grep -qw "$ns"; then ip netns add "$ns"; fi
  made netns "$ns"
  if ! ip link show "$host" >/dev/null 2>&1; then
    ip link add "$host" type veth peer name "$peer"
    ip link set "$peer" netns "$ns"
  fi
  made link "$host"
  ip link set "$host" master "$BRIDGE"
  ip link set "$host" up
  ip -n "$ns" addr replace "$NET.$((10 + i))/24" dev "$peer"
  ip -n "$ns" link set "$peer" up
  ip -n "$ns" link set lo up
  ip -n "$ns" route replace default via "$NET.1"
  hosts_lines+="$NET.$((10 + i)) n$i $MARK"$'\n'
done
# This machine resolves the node names through /etc/hosts (rewritten in place: it may be a bind mount), and each
# node through a hosts file of its own, mounted over /etc/hosts in the node's mount namespace (scripts/slurm/node.sh):
# the same names everywhere, as a cluster's DNS gives them, and one node's resolution can be broken on its own
# (the rendezvous tests make a node resolve its own name to 127.0.1.1, as Debian's default /etc/hosts does).
kept=$(grep -vF "$MARK" /etc/hosts || true)
printf '%s\n%s' "$kept" "$hosts_lines" > /etc/hosts
made hosts "$MARK"
for i in $(seq 1 "$NODES"); do printf '%s\n%s' "$kept" "$hosts_lines" > "$STATE/hosts.n$i"; done
# The nodes reach no DNS server (only each other and the controller): they look names up in their hosts files only,
# as a cluster without DNS does. Otherwise every lookup of an address not listed (torch's store names its clients'
# addresses) waits out the resolver's timeout: 10 s at each rank's start.
sed 's/^hosts:.*/hosts: files/' /etc/nsswitch.conf > "$STATE/nsswitch.conf"

# ---------------------------------------------------------------------------------------------- SLURM's config
GRES_NODE=""; GRES_TYPES=""
FAKE_GPUS=${FAKE_GPUS:-0}
if [ "$FAKE_GPUS" -gt 0 ]; then
  # gres/gpu wants File= entries that are character devices; links to /dev/null pass the check.
  mkdir -p "$STATE/fakegpu"
  for i in $(seq 0 $((FAKE_GPUS - 1))); do ln -sf /dev/null "$STATE/fakegpu/nvidia$i"; done
  echo "NodeName=n[1-$NODES] Name=gpu Type=${FAKE_GPU_TYPE:-h100} File=$STATE/fakegpu/nvidia[0-$((FAKE_GPUS - 1))]" \
    > /etc/slurm/gres.conf
  GRES_NODE="Gres=gpu:${FAKE_GPU_TYPE:-h100}:$FAKE_GPUS"; GRES_TYPES="GresTypes=gpu"
else
  rm -f /etc/slurm/gres.conf
fi
node_lines=""
for i in $(seq 1 "$NODES"); do
  node_lines+="NodeName=n$i NodeAddr=$NET.$((10 + i)) CPUs=$NCPU RealMemory=$MEM_MB $GRES_NODE State=UNKNOWN"$'\n'
done
# written aside and renamed: a client reading it meanwhile (squeue, scontrol) sees the old file or the new, never half
cat > /etc/slurm/slurm.conf.new <<CONF
ClusterName=dapo
SlurmctldHost=$CTL($NET.1)
SlurmUser=root
SlurmdUser=root
AuthType=auth/munge
# a requeued job waits out its old credential's lifetime before it starts again (120 s by default; here 15 s,
# measured 17 s from scontrol requeue to running again): the tests requeue. It must cover a step's launch on a
# busy node (slurmd checks the credential then)
AuthInfo=cred_expire=15
CredType=cred/munge
StateSaveLocation=$STATE/ctld
SlurmdSpoolDir=$STATE/d/%n
SlurmctldPidFile=$STATE/slurmctld.pid
SlurmdPidFile=$STATE/slurmd.%n.pid
SlurmctldLogFile=$STATE/log/slurmctld.log
SlurmdLogFile=$STATE/log/slurmd.%n.log
MpiDefault=none
# ports SLURM hands to a job step that asks (srun --resv-ports): no two steps sharing a node get the same one
MpiParams=ports=12000-12999
ProctrackType=proctrack/linuxproc
TaskPlugin=task/none
SchedulerType=sched/backfill
SelectType=select/cons_tres
SelectTypeParameters=CR_Core_Memory
JobAcctGatherType=jobacct_gather/none
AccountingStorageType=accounting_storage/slurmdbd
AccountingStoreFlags=job_comment
AccountingStorageHost=$NET.1
JobCompType=jobcomp/none
# a node that comes back (its slurmd registers again) takes jobs again, with no administrator
ReturnToService=2
# a node that stops answering is declared DOWN after this (SLURM's default: 300 s); its jobs are requeued
SlurmdTimeout=20
MinJobAge=600
KillWait=30
$GRES_TYPES
$node_lines
PartitionName=main Nodes=ALL Default=YES MaxTime=INFINITE State=UP
CONF
mv /etc/slurm/slurm.conf.new /etc/slurm/slurm.conf

# ---------------------------------------------------------------------------------------------- daemons
# munge: Debian's postinst creates a key; make one if it did not. One munged serves every node (a socket file).
[ -s /etc/munge/munge.key ] || mungekey --create
chown munge:munge /run/munge /etc/munge/munge.key; chmod 0755 /run/munge
if ! pgrep -x munged >/dev/null; then
  runuser -u munge -- /usr/sbin/munged --pid-file=/run/munge/munged.pid
  cp /run/munge/munged.pid "$STATE/munged.pid" 2>/dev/null || pgrep -x munged > "$STATE/munged.pid"
fi
# MariaDB (a socket file) + slurmdbd (on the bridge's address), so sacct answers as on real clusters
chown mysql:mysql /run/mysqld
if ! mysqladmin --socket=/run/mysqld/mysqld.sock ping >/dev/null 2>&1; then
  rm -f /run/mysqld/mysqld.sock   # a stale socket from a killed server
  # mariadbd runs as mysql: its pid file must be somewhere mysql can write; we copy it into $STATE.
  nohup /usr/sbin/mariadbd --user=mysql --socket=/run/mysqld/mysqld.sock --pid-file=/run/mysqld/mysqld.pid \
    --skip-networking >"$STATE/log/mariadb.log" 2>&1 &
  for _ in $(seq 1 60); do mysqladmin --socket=/run/mysqld/mysqld.sock ping >/dev/null 2>&1 && break; sleep 0.5; done
  cp /run/mysqld/mysqld.pid "$STATE/mariadb.pid"
fi
mysql --socket=/run/mysqld/mysqld.sock -e "CREATE USER IF NOT EXISTS 'slurm'@'localhost' IDENTIFIED BY 'slurmpw';
  GRANT ALL ON slurm_acct_db.* TO 'slurm'@'localhost';"
cat > /etc/slurm/slurmdbd.conf <<DBD
AuthType=auth/munge
DbdHost=$CTL
DbdAddr=$NET.1
SlurmUser=root
PidFile=$STATE/slurmdbd.pid
LogFile=$STATE/log/slurmdbd.log
StorageType=accounting_storage/mysql
StorageHost=localhost
StorageUser=slurm
StoragePass=slurmpw
StorageLoc=slurm_acct_db
DBD
chmod 600 /etc/slurm/slurmdbd.conf
/usr/sbin/slurmdbd
for _ in $(seq 1 60); do (exec 3<>"/dev/tcp/$NET.1/6819") 2>/dev/null && break; sleep 0.5; done
/usr/sbin/slurmctld -c   # -c: clean job and node state
for i in $(seq 1 "$NODES"); do bash "$HERE/node.sh" start "n$i"; done
for i in $(seq 1 60); do
  idle=$(sinfo -h -N -o '%N %T' 2>/dev/null | awk '$2 == "idle"' | sort -u | grep -c . || true)
  if [ "$idle" -ge "$NODES" ] && sacct -n -X >/dev/null 2>&1; then
    echo "slurm ready after $((i / 2)) s: nodes n[1-$NODES] at $NET.11-$((10 + NODES)), controller at $NET.1" \
      "(state in $STATE; stop with scripts/slurm/stop.sh)"
    exit 0
  fi
  sleep 0.5
done
echo "slurm did not come up; nodes:" >&2
sinfo -N >&2 || true
tail -n 20 "$STATE"/log/*.log >&2
exit 1
