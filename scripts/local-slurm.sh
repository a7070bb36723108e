#!/usr/bin/env bash
# A real single-node SLURM on this machine, for the `slurm` test label (docs/DESIGN.md, "Tests and
# benchmarks").
#   scripts/local-slurm.sh          install (Debian packages), configure and start it; idempotent
#   scripts/local-slurm.sh --check  exit 0 if a usable SLURM answers, 1 otherwise (changes nothing)
# It needs root (packages, daemons). It leaves an existing /etc/slurm/slurm.conf alone unless that
# file was written by this script. Recipe and pitfalls: docs/reference.md, "A local SLURM".
set -euo pipefail

log() { echo "[local-slurm] $*"; }

ready() {
  command -v sinfo >/dev/null 2>&1 || return 1
  # One idle (or mixed/allocated) node in a partition that is up.
  timeout 10 sinfo -h -o '%a %t' 2>/dev/null | grep -qE '^up (idle|mix|alloc)'
}

if [ "${1:-}" = --check ]; then
  ready
  exit
fi

conf=/etc/slurm/slurm.conf
marker="# written by trainer scripts/local-slurm.sh"
# proctrack/cgroup fails in containers; config_overrides lets CPUs=8 stand on a 2-core machine
# (the tests run 3 ranks); OverSubscribe lets several test jobs share it. A requeued job waits
# cred_expire + 1 s before it may start again (default 120 s), and the scheduler looks at pending
# jobs every sched_interval (default 60 s): short ones keep the requeue test quick.
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
StateSaveLocation=/var/lib/slurm/slurmctld
SlurmdSpoolDir=/var/lib/slurm/slurmd
JobAcctGatherType=jobacct_gather/none
AccountingStorageType=accounting_storage/none
SlurmUser=root
KillWait=10
AuthInfo=cred_expire=15
SchedulerParameters=sched_interval=5,bf_interval=5
NodeName=localhost CPUs=8 State=UNKNOWN
PartitionName=debug Nodes=ALL Default=YES MaxTime=INFINITE State=UP OverSubscribe=YES
EOF
}
ours() { [ ! -f "$conf" ] || head -1 "$conf" | grep -qF "$marker"; }

if ready; then
  # A configuration this script wrote before is brought up to date, and the daemons reread it
  # (running daemons are not restarted: jobs may be running; AuthInfo waits for a restart).
  if [ "$(id -u)" = 0 ] && ours && [ "$(conf_text)" != "$(cat "$conf")" ]; then
    conf_text >"$conf"
    scontrol reconfigure && log "updated $conf (scontrol reconfigure; AuthInfo applies once slurmctld restarts)"
  fi
  log "SLURM is up: $(sinfo -h -o '%P %a %D %t' | head -1)"
  exit 0
fi
if [ "$(id -u)" != 0 ]; then
  log "not root: cannot install or start SLURM; the slurm tests will be skipped"
  exit 1
fi

source "$(dirname "$0")/env.sh"
install_debian_packages slurm-wlm munge libpmix-dev

mkdir -p /etc/slurm /var/lib/slurm/slurmctld /var/lib/slurm/slurmd /var/log/slurm /run/munge
if ours; then
  conf_text >"$conf"
else
  log "$conf exists and was not written by this script: using it as it is"
fi

chown munge:munge /run/munge
pgrep -x munged >/dev/null || service munge start >/dev/null 2>&1 || munged --force
pgrep -x slurmctld >/dev/null || (setsid slurmctld -D >/var/log/slurm/slurmctld.out 2>&1 &)
pgrep -x slurmd >/dev/null || (setsid slurmd -D >/var/log/slurm/slurmd.out 2>&1 &)

for _ in $(seq 1 30); do
  if ready; then
    log "SLURM is up: $(sinfo -h -o '%P %a %D %t' | head -1)"
    exit 0
  fi
  sleep 1
done
log "SLURM did not come up in 30 s; see /var/log/slurm/slurmctld.out and slurmd.out"
exit 1
