#!/usr/bin/env bash
# A real SLURM on this machine, for the `slurm` test label (docs/DESIGN.md, "Tests and
# benchmarks"): one controller and three nodes on localhost. Node `localhost` (partition `debug`,
# the default) runs the single-node cases; nodes `n1` and `n2` (partition `twonode`) make a
# two-node cluster, each slurmd in a UTS namespace of its own (hostname n1/n2). Where such namespaces cannot be made, only `localhost` is configured and the reason is kept
# in $state/twonode.unavailable.
#   scripts/local-slurm.sh                   install (Debian packages), configure and start what is
#                                            missing; idempotent
#   scripts/local-slurm.sh --check           exit 0 if a usable SLURM answers, 1 otherwise
#   scripts/local-slurm.sh --check-twonode   exit 0 if both nodes of partition `twonode` answer;
#                                            else print why not and exit 1 (both change nothing)
# It needs root (packages, daemons). It leaves an existing /etc/slurm/slurm.conf alone unless that
# file was written by this script (its first line), and rewrites one that it wrote, restarting the
# daemons when no job runs. Stopping everything: `scontrol shutdown` (the controller and every
# slurmd). Recipe and pitfalls: CONTRIBUTING.md, "A local SLURM".
set -euo pipefail

log() { echo "[local-slurm] $*"; }

conf=/etc/slurm/slurm.conf
state=/var/lib/slurm
# The first line of a configuration this script wrote. Older versions of the script wrote
# $old_marker and rewrite a file that starts with it: this one must not, or an older checkout's
# run would take the two nodes out under running daemons (slurmctld stops: "MaxNodeCount has
# changed"). This script upgrades both.
marker="# trainer: scripts/local-slurm.sh wrote this file (nodes localhost, n1, n2) and rewrites it"
old_marker="# written by trainer scripts/local-slurm.sh"
twonode_nodes=(n1 n2)

ready() {
  command -v sinfo >/dev/null 2>&1 || return 1
  # A responding idle (or mixed/allocated) node in the default partition (marked '*'), which is up.
  timeout 10 sinfo -h -o '%P %a %t' 2>/dev/null | grep -qE '^[^ ]+\* up (idle|mix|alloc)$'
}
twonode_ready() {  # both nodes of partition twonode respond (no '*' after the state)
  command -v sinfo >/dev/null 2>&1 || return 1
  [ "$(timeout 10 sinfo -h -N -p twonode -o '%t' 2>/dev/null | grep -cE '^(idle|mix|alloc)$')" = 2 ]
}
twonode_why_not() {
  if [ -s "$state/twonode.unavailable" ]; then
    cat "$state/twonode.unavailable"
  elif ! command -v sinfo >/dev/null 2>&1; then
    echo "SLURM is not installed (run scripts/local-slurm.sh as root)"
  else
    echo "partition twonode does not have two responding nodes: $(timeout 10 sinfo -h -N -p twonode \
      -o '%N %t' 2>&1 | tr '\n' ' ')(run scripts/local-slurm.sh as root)"
  fi
}

case ${1:-} in
  --check) ready; exit ;;
  --check-twonode) twonode_ready && exit 0; twonode_why_not; exit 1 ;;
  "") ;;
  *) echo "usage: $0 [--check | --check-twonode]" >&2; exit 2 ;;
esac

ours() { [ ! -f "$conf" ] || head -1 "$conf" | grep -qF -e "$marker" -e "$old_marker"; }
if [ "$(id -u)" != 0 ]; then
  if ready; then log "SLURM is up: $(sinfo -h -o '%P %a %D %t' | tr '\n' ' ')"; exit 0; fi
  log "not root: cannot install or start SLURM; the slurm tests will be skipped"
  exit 1
fi
if ready && ! ours; then
  log "SLURM is up and $conf was not written by this script: leaving it as it is"
  exit 0
fi

# Two slurmds on one host collide on the spmix_appdir_* directories of SLURM's PMIx plugin, made
# under TmpFS (default /tmp): TmpFS is per node (%n, below), and every node sees the host's one /tmp,
# so a checkout under /tmp (a CI clone) runs on n1 and n2 too. Each node's slurmd runs in a UTS
# namespace of its own, so that its tasks see its hostname.
mkdir -p "$state"
twonode=1
if ! why=$(unshare --uts true 2>&1); then
  twonode=0
  echo "this machine does not permit UTS namespaces (unshare --uts: ${why:-failed}), which the two-node cluster's slurmds need for hostnames of their own" \
    >"$state/twonode.unavailable" 2>/dev/null || true
fi

# proctrack/cgroup fails in containers; config_overrides lets CPUs=8 stand on a 2-core machine
# (the tests run 3 ranks); OverSubscribe lets several test jobs share it. A requeued job waits
# cred_expire + 1 s before it may start again (default 120 s), and the scheduler looks at pending
# jobs every sched_interval (default 60 s): short ones keep the requeue test quick. %n is the
# node's name: every slurmd has its own spool directory and pid file (a slurmd ends the one whose
# pid is in its pid file). n1 and n2 come before localhost: while `localhost` is the only node
# read, SLURM finds it under any name, and would take n1 for a duplicate of it.
conf_text() {
  cat <<EOF
$marker
ClusterName=trainer-ci
SlurmctldHost=localhost
ProctrackType=proctrack/linuxproc
TaskPlugin=task/none
SelectType=select/cons_tres
SelectTypeParameters=CR_Core
MpiDefault=none
ReturnToService=2
SlurmdParameters=config_overrides
StateSaveLocation=$state/slurmctld
SlurmdSpoolDir=$state/slurmd/%n
SlurmdPidFile=$state/slurmd-%n.pid
TmpFS=$state/tmp/%n
JobAcctGatherType=jobacct_gather/none
AccountingStorageType=accounting_storage/none
SlurmUser=root
KillWait=10
AuthInfo=cred_expire=15
SchedulerParameters=sched_interval=5,bf_interval=5
EOF
  if [ "$twonode" = 1 ]; then
    cat <<EOF
NodeName=n1 NodeAddr=127.0.0.1 Port=17001 CPUs=4 State=UNKNOWN
NodeName=n2 NodeAddr=127.0.0.1 Port=17002 CPUs=4 State=UNKNOWN
PartitionName=twonode Nodes=n1,n2 MaxTime=INFINITE State=UP OverSubscribe=YES
EOF
  fi
  cat <<EOF
NodeName=localhost CPUs=8 State=UNKNOWN
PartitionName=debug Nodes=localhost Default=YES MaxTime=INFINITE State=UP OverSubscribe=YES
EOF
}

# shellcheck source=scripts/env.sh
source "$(dirname "$0")/env.sh"
install_debian_packages slurm-wlm munge libpmix-dev

mkdir -p /etc/slurm "$state/slurmctld" /var/log/slurm /run/munge
for n in localhost "${twonode_nodes[@]}"; do  # SlurmdSpoolDir, TmpFS
  mkdir -p "$state/slurmd/$n" "$state/tmp/$n"
  chmod 1777 "$state/tmp/$n"
done
[ "$twonode" = 0 ] || rm -f "$state/twonode.unavailable"
if ! ours; then
  log "$conf exists and was not written by this script: using it as it is"
elif [ ! -f "$conf" ] || [ "$(conf_text)" != "$(cat "$conf")" ]; then
  conf_text >"$conf"
  if pgrep -x slurmctld >/dev/null; then
    # Nodes come and go only with a restart of every daemon; one with jobs running is not
    # interrupted (the old nodes stay until the script runs again with no job in the queue).
    if [ -n "$(squeue -h -o %i 2>/dev/null)" ]; then
      scontrol reconfigure || true
      log "updated $conf; jobs are running, so the daemons were not restarted: run this script again once they end"
      exit 0
    fi
    log "updated $conf: restarting the daemons (scontrol shutdown)"
    scontrol shutdown >/dev/null 2>&1 || true
    for _ in $(seq 1 30); do pgrep -x slurmctld >/dev/null || pgrep -x slurmd >/dev/null || break; sleep 1; done
  else
    log "wrote $conf"
  fi
fi

chown munge:munge /run/munge
pgrep -x munged >/dev/null || service munge start >/dev/null 2>&1 || munged --force
pgrep -x slurmctld >/dev/null || (setsid slurmctld -D >/var/log/slurm/slurmctld.out 2>&1 </dev/null &)

# A node's slurmd runs if the pid in its pid file is a slurmd.
slurmd_runs() {
  local pid
  pid=$(cat "$state/slurmd-$1.pid" 2>/dev/null) || return 1
  [ "$(cat "/proc/$pid/comm" 2>/dev/null)" = slurmd ]
}
slurmd_runs localhost || (setsid slurmd -D -N localhost >/var/log/slurm/slurmd.out 2>&1 </dev/null &)
if [ "$twonode" = 1 ] && grep -q "^PartitionName=twonode " "$conf"; then
  for n in "${twonode_nodes[@]}"; do
    slurmd_runs "$n" && continue
    (setsid unshare --uts bash -c "hostname $n && exec slurmd -D -N $n" \
      >"/var/log/slurm/slurmd-$n.out" 2>&1 </dev/null &)
  done
fi

deadline=$((SECONDS + 30))
while [ $SECONDS -lt $deadline ]; do
  if ready && { [ "$twonode" = 0 ] || twonode_ready; }; then
    log "SLURM is up: $(sinfo -h -o '%P %a %D %t %N' | tr '\n' ' ')"
    [ "$twonode" = 1 ] || log "no two-node cluster (the twonode cases will be skipped): $(cat "$state/twonode.unavailable")"
    exit 0
  fi
  sleep 1
done
if ready; then
  log "SLURM is up, but the two nodes of partition twonode did not answer in 30 s (see" \
    "/var/log/slurm/slurmd-n1.out, slurmd-n2.out): $(sinfo -h -N -o '%N %P %t' | tr '\n' ' ')"
  exit 0
fi
log "SLURM did not come up in 30 s; see /var/log/slurm/slurmctld.out and slurmd.out"
exit 1
