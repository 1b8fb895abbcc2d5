#!/usr/bin/env bash
# Start a one-node SLURM cluster on this machine, as on a real one: munge, MariaDB + slurmdbd (so `sacct`, which
# Snakemake's SLURM executor polls, works), slurmctld and slurmd. For contributors and CI; needs root.
# Installs Debian's packages the first time (~20 s). Idempotent: a running cluster is left alone.
#   FAKE_GPUS=N  advertise N count-only GPUs (no devices) so GPU resource requests can be scheduled (dry runs).
#   DAPO_SLURM_STATE  where PIDs, logs and state live (default /tmp/dapo-slurm)
# Stop it with scripts/slurm/stop.sh (by PID).
set -euo pipefail
STATE=${DAPO_SLURM_STATE:-/tmp/dapo-slurm}
if [ "$(id -u)" != 0 ]; then echo "start.sh: run as root (it installs and starts system daemons)" >&2; exit 1; fi
if [ -s "$STATE/slurmctld.pid" ] && kill -0 "$(cat "$STATE/slurmctld.pid")" 2>/dev/null && sinfo -h >/dev/null 2>&1; then
  echo "slurm already running (state in $STATE)"; exit 0
fi
need=()
for b in slurmctld slurmd sinfo munged slurmdbd mariadbd; do command -v "$b" >/dev/null || [ -x "/usr/sbin/$b" ] || need+=("$b"); done
if [ ${#need[@]} -gt 0 ]; then
  echo "installing SLURM (missing: ${need[*]})"
  export DEBIAN_FRONTEND=noninteractive
  apt-get update -qq >/dev/null
  apt-get install -y -qq slurmctld slurmd slurm-client slurmdbd munge mariadb-server >/dev/null
fi
mkdir -p "$STATE"/{ctld,d,log} /etc/slurm /run/munge /run/mysqld
NODE=$(hostname -s)
NCPU=$(nproc)
MEM_MB=$(awk '/MemTotal/ {printf "%d", $2/1024*0.9}' /proc/meminfo)
FAKE_GPUS=${FAKE_GPUS:-0}
GRES_NODE=""; GRES_TYPES=""
if [ "$FAKE_GPUS" -gt 0 ]; then
  # gres/gpu wants File= entries that are character devices; links to /dev/null pass the check.
  mkdir -p "$STATE/fakegpu"
  for i in $(seq 0 $((FAKE_GPUS - 1))); do ln -sf /dev/null "$STATE/fakegpu/nvidia$i"; done
  echo "NodeName=$NODE Name=gpu Type=${FAKE_GPU_TYPE:-h100} File=$STATE/fakegpu/nvidia[0-$((FAKE_GPUS - 1))]" > /etc/slurm/gres.conf
  GRES_NODE="Gres=gpu:${FAKE_GPU_TYPE:-h100}:$FAKE_GPUS"; GRES_TYPES="GresTypes=gpu"
else
  rm -f /etc/slurm/gres.conf
fi
cat > /etc/slurm/slurm.conf <<CONF
ClusterName=dapo
SlurmctldHost=$NODE(127.0.0.1)
SlurmUser=root
SlurmdUser=root
AuthType=auth/munge
# a requeued job waits out its old credential's lifetime before it starts again (120 s by default): the tests requeue
AuthInfo=cred_expire=30
CredType=cred/munge
StateSaveLocation=$STATE/ctld
SlurmdSpoolDir=$STATE/d
SlurmctldPidFile=$STATE/slurmctld.pid
SlurmdPidFile=$STATE/slurmd.pid
SlurmctldLogFile=$STATE/log/slurmctld.log
SlurmdLogFile=$STATE/log/slurmd.log
MpiDefault=none
ProctrackType=proctrack/linuxproc
TaskPlugin=task/none
SchedulerType=sched/backfill
SelectType=select/cons_tres
SelectTypeParameters=CR_Core_Memory
JobAcctGatherType=jobacct_gather/none
AccountingStorageType=accounting_storage/slurmdbd
AccountingStoreFlags=job_comment
AccountingStorageHost=localhost
JobCompType=jobcomp/none
ReturnToService=2
MinJobAge=600
KillWait=30
$GRES_TYPES
NodeName=$NODE NodeAddr=127.0.0.1 CPUs=$NCPU RealMemory=$MEM_MB $GRES_NODE State=UNKNOWN
PartitionName=main Nodes=ALL Default=YES MaxTime=INFINITE State=UP
CONF
# munge: Debian's postinst creates a key; make one if it did not
[ -s /etc/munge/munge.key ] || mungekey --create
chown munge:munge /run/munge /etc/munge/munge.key; chmod 0755 /run/munge
if ! pgrep -x munged >/dev/null; then
  runuser -u munge -- /usr/sbin/munged --pid-file=/run/munge/munged.pid
  cp /run/munge/munged.pid "$STATE/munged.pid" 2>/dev/null || pgrep -x munged > "$STATE/munged.pid"
fi
# MariaDB + slurmdbd, so sacct answers as on real clusters
chown mysql:mysql /run/mysqld
if ! mysqladmin --socket=/run/mysqld/mysqld.sock ping >/dev/null 2>&1; then
  rm -f /run/mysqld/mysqld.sock   # a stale socket from a killed server
  # mariadbd runs as mysql: its pid file must be somewhere mysql can write; we copy it into $STATE.
  nohup /usr/sbin/mariadbd --user=mysql --socket=/run/mysqld/mysqld.sock --pid-file=/run/mysqld/mysqld.pid \
    >"$STATE/log/mariadb.log" 2>&1 &
  for _ in $(seq 1 60); do mysqladmin --socket=/run/mysqld/mysqld.sock ping >/dev/null 2>&1 && break; sleep 0.5; done
  cp /run/mysqld/mysqld.pid "$STATE/mariadb.pid"
fi
mysql --socket=/run/mysqld/mysqld.sock -e "CREATE USER IF NOT EXISTS 'slurm'@'localhost' IDENTIFIED BY 'slurmpw';
  GRANT ALL ON slurm_acct_db.* TO 'slurm'@'localhost';"
cat > /etc/slurm/slurmdbd.conf <<DBD
AuthType=auth/munge
DbdHost=localhost
DbdAddr=127.0.0.1
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
for _ in $(seq 1 60); do (exec 3<>/dev/tcp/127.0.0.1/6819) 2>/dev/null && break; sleep 0.5; done
/usr/sbin/slurmctld -c   # -c: clean job and node state
/usr/sbin/slurmd
for i in $(seq 1 60); do
  if sinfo -h -N -o '%T' 2>/dev/null | grep -qx idle && sacct -n -X >/dev/null 2>&1; then
    echo "slurm ready after $((i / 2)) s (state in $STATE; stop with scripts/slurm/stop.sh)"; exit 0
  fi
  sleep 0.5
done
echo "slurm did not come up; logs:" >&2
tail -n 20 "$STATE"/log/*.log >&2
exit 1
