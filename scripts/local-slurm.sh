#!/usr/bin/env bash
# A real multi-node Slurm on this one machine: the emulated nodes of scripts/local-cluster.sh
# (a network, UTS and mount namespace each, node I at 198.18.0.(10+I) on the bridge
# 198.18.0.1/24), one slurmd in each node, slurmctld and munged here in the root namespace.
#
#   scripts/local-slurm.sh up --nodes 4 --link-mbit 1000     # then: eval "$(scripts/local-slurm.sh env)"
#   srun -N 2 -n 4 --ntasks-per-node=2 --mpi=pmix hostname
#   slurm/sweep runs/local-multinode.toml --results build/local-multinode
#   scripts/local-cluster.sh shape node2=100                # slow one node's link, jobs running or not
#   scripts/local-slurm.sh down
#
# slurmctld listens on 198.18.0.1 (SlurmctldHost=<this host>(198.18.0.1)); each slurmd is
# started through `scripts/local-cluster.sh exec nodeI`, so it has the node's host name,
# network and /tmp (PMIx's session files of two nodes must not collide), and so do its jobs.
# munged runs here: its socket is a file, which the nodes reach (they share every path but
# /tmp). Configuration, state, spool, logs and munge's key live in $LOCAL_SLURM_DIR (default
# build/local-slurm; not under /tmp, which each node has its own of). Jobs that run MPI
# across nodes source scripts/mpi-env-cluster.sh (Open MPI's TCP on the bridge).
#
# Exit codes: 0 ok, 1 failure (or `status` with nothing up), 2 bad input or already up,
# 3 cannot run here (no network namespaces, or Slurm/munge not installed: tests skip).
set -uo pipefail

REPO=$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)
CLUSTER=$REPO/scripts/local-cluster.sh
WORK=${LOCAL_SLURM_DIR:-$REPO/build/local-slurm}
CTLD_PORT=${LOCAL_SLURM_PORT:-16827}
MARK=.local-slurm            # only a folder holding this file is ever emptied by up
MUNGE_RUN=/run/shardbench-local-slurm-munge   # munge's folder when $WORK is not reachable by all
NET=198.18.0 MAXN=16 MAXCPUS=1024
# Only this cluster: no Slurm settings of an enclosing job or of the caller's environment.
unset $(compgen -v | grep -E '^(SLURM_|SBATCH_|SRUN_|SALLOC_|SQUEUE_|SINFO_)')
export SLURM_CONF=$WORK/etc/slurm.conf

usage() {
  cat <<'EOF'
usage: scripts/local-slurm.sh COMMAND ...
  up --nodes N [--cpus C] [--link-mbit R] [--slow NODE=R]... [--slow-path A-B=R]...
                 emulated nodes node1..nodeN (scripts/local-cluster.sh up, same shaping
                 flags), munged, slurmctld on 198.18.0.1, a slurmd in every node; partition
                 debug, C CPUs per node (default 8; ranks may outnumber the real cores);
                 waits until every node is idle, then says how to submit
  down           cancel the jobs, stop slurmctld, the slurmds and munged, remove the nodes
                 (idempotent)
  status         the daemons and nodes; exit 1 when no local Slurm is up
  env            the line to give a shell the cluster: eval "$(scripts/local-slurm.sh env)"
Environment: LOCAL_SLURM_DIR (default build/local-slurm), LOCAL_SLURM_PORT (slurmctld's
port, default 16827; slurmd uses the next one). Shape a link later with
scripts/local-cluster.sh shape NODE=R.
EOF
}

die() { echo "local-slurm: $2" >&2; exit "$1"; }
say() { echo "local-slurm: $*" >&2; }

# ---- daemons of this cluster, by pid file ---------------------------------------------------
pid_of() { # pid_of FILE COMM: the pid in $WORK/run/FILE.pid when a process COMM of it is alive
  local f=$WORK/run/$1.pid pid state
  [[ -r $f ]] || return 0
  pid=$({ tr -dc 0-9 <"$f"; } 2>/dev/null)
  [[ -n $pid && -r /proc/$pid/comm && $(cat "/proc/$pid/comm" 2>/dev/null) == "$2" ]] || return 0
  state=$(sed 's/.*) //' "/proc/$pid/stat" 2>/dev/null | cut -d' ' -f1)
  [[ $state == Z ]] || echo "$pid"
}
daemons() { # "FILE COMM" of every daemon this cluster may have, slurmds from their pid files
  echo "slurmctld slurmctld"
  local f
  for f in "$WORK"/run/slurmd-*.pid; do [[ -e $f ]] && echo "$(basename "$f" .pid) slurmd"; done
  echo "munged munged"
}
alive() { # alive [PATTERN]: pids of this cluster's daemons (whose COMM matches PATTERN)
  local f c
  while read -r f c; do [[ $c =~ ${1:-.} ]] && pid_of "$f" "$c"; done < <(daemons)
}
wait_gone() { # wait_gone SECONDS PATTERN: until no such daemon of this cluster is alive
  local deadline=$((SECONDS + $1))
  while [[ -n $(alive "$2") ]]; do ((SECONDS >= deadline)) && return 1; sleep 0.2; done
}
is_up() { [[ -e $WORK/$MARK && -n $(pid_of slurmctld slurmctld) ]]; }

# Stops everything this cluster has running, then its nodes: safe to call at any point.
teardown() {
  local f c pid jobs
  if [[ -n $(pid_of slurmctld slurmctld) ]]; then
    jobs=$(timeout 15 squeue -h -o %i 2>/dev/null | paste -sd' ')
    if [[ -n $jobs ]]; then
      say "cancelling jobs $jobs"
      timeout 15 scancel $jobs 2>/dev/null
      for _ in $(seq 40); do [[ -z $(timeout 5 squeue -h 2>/dev/null) ]] && break; sleep 0.5; done
    fi
    timeout 15 scontrol shutdown >/dev/null 2>&1 && wait_gone 15 '^slurm' # slurmctld tells every slurmd to stop
  fi
  while read -r f c; do
    pid=$(pid_of "$f" "$c")
    [[ -n $pid ]] || continue
    kill -TERM "$pid" 2>/dev/null
    for _ in $(seq 50); do [[ -z $(pid_of "$f" "$c") ]] && break; sleep 0.1; done
    pid=$(pid_of "$f" "$c") && [[ -n $pid ]] && { say "$c ($pid) ignored SIGTERM: SIGKILL"; kill -KILL "$pid" 2>/dev/null; }
  done < <(daemons)
  # The nodes, when this cluster made them: every process left in them (job steps) ends too.
  if [[ -e $WORK/run/cluster ]]; then
    "$CLUSTER" down >&2 || return 1
    rm -f "$WORK/run/cluster"
  fi
  [[ -d $MUNGE_RUN ]] && rm -rf "$MUNGE_RUN"
  [[ -d $WORK/run ]] && rm -f "$WORK"/run/*.pid
  return 0
}

# munged refuses a socket in a folder that not everyone can reach: where $WORK has a parent
# of mode 700 (a home directory), munge gets a folder in /run (which the nodes share).
traversable() {
  local d=$1
  while :; do
    (( 0$(stat -c %a "$d") & 01 )) || return 1
    [[ $d == / ]] && return 0
    d=$(dirname "$d")
  done
}

write_conf() { # write_conf NODES CPUS MUNGE
  local n=$1 cpus=$2 munge=$3 i
  cat <<EOF
# Written by scripts/local-slurm.sh: Slurm over the emulated nodes of scripts/local-cluster.sh.
ClusterName=shardbench-local
# slurmctld in the root namespace on the bridge's address; the name must be this host's
SlurmctldHost=$(hostname)($NET.1)
SlurmctldPort=$CTLD_PORT
SlurmdPort=$((CTLD_PORT + 1))
SlurmUser=root
SlurmdUser=root
AuthType=auth/munge
AuthInfo=socket=$munge/munge.socket
CredType=cred/munge
StateSaveLocation=$WORK/state
# one slurmd per node on one file system: %n keeps their files apart
SlurmdSpoolDir=$WORK/spool/%n
SlurmctldPidFile=$WORK/run/slurmctld.pid
SlurmdPidFile=$WORK/run/slurmd-%n.pid
SlurmctldLogFile=$WORK/log/slurmctld.log
SlurmdLogFile=$WORK/log/slurmd-%n.log
JobCompType=jobcomp/filetxt
JobCompLoc=$WORK/log/jobcomp.txt
AccountingStorageType=accounting_storage/none
JobAcctGatherType=jobacct_gather/none
MinJobAge=900
MailProg=/bin/true
# proctrack/cgroup fails silently here (job COMPLETED, no output, node drained)
ProctrackType=proctrack/linuxproc
TaskPlugin=task/none
SelectType=select/cons_tres
SelectTypeParameters=CR_Core
MpiDefault=none
ReturnToService=2
# nodes may declare more CPUs than the machine has: ranks are oversubscribed
SlurmdParameters=config_overrides
EOF
  for ((i = 1; i <= n; i++)); do
    echo "NodeName=node$i NodeAddr=$NET.$((10 + i)) CPUs=$cpus RealMemory=1000 State=UNKNOWN"
  done
  echo "PartitionName=debug Nodes=node[1-$n] Default=YES MaxTime=INFINITE State=UP OverSubscribe=YES"
}

print_howto() {
  local n=$1
  cat <<EOF

A $n-node Slurm is up (nodes node1..node$n, partition debug; logs in $WORK/log).
Give your shell the cluster, then submit from the repository (not from /tmp: each node has its own):
  export SLURM_CONF=$SLURM_CONF
  sinfo
  srun -N $n --ntasks-per-node=2 --mpi=pmix hostname
  sbatch -N 2 --ntasks-per-node=2 --wrap '. scripts/mpi-env-cluster.sh; srun --mpi=pmix build/bin/collective_perf --out build/cp.h5'
  slurm/sweep runs/local-multinode.toml --results build/local-multinode
Jobs that run MPI across nodes source scripts/mpi-env-cluster.sh (Open MPI's TCP on the bridge).
Shape a link: scripts/local-cluster.sh shape node2=100    Stop: scripts/local-slurm.sh down
EOF
}

cmd_up() {
  local nodes="" cpus=8 pass=() i rc
  while (($#)); do
    case $1 in
      --nodes|--cpus|--link-mbit|--slow|--slow-path)
        (($# >= 2)) || die 2 "$1 needs a value (--nodes N: 1..$MAXN; --cpus C; --link-mbit R; --slow NODE=R; --slow-path A-B=R)"
        case $1 in --nodes) nodes=$2 ;; --cpus) cpus=$2 ;; *) pass+=("$1" "$2") ;; esac
        shift 2 ;;
      -h|--help) usage; exit 0 ;;
      *) die 2 "up: unknown argument '$1' (allowed: --nodes N, --cpus C, --link-mbit R, --slow NODE=R, --slow-path A-B=R)" ;;
    esac
  done
  [[ -n $nodes ]] || die 2 "up: --nodes N is required (N from 1 to $MAXN)"
  [[ $nodes =~ ^[0-9]+$ ]] && ((10#$nodes >= 1 && 10#$nodes <= MAXN)) || die 2 "--nodes '$nodes': N must be from 1 to $MAXN"
  [[ $cpus =~ ^[0-9]+$ ]] && ((10#$cpus >= 1 && 10#$cpus <= MAXCPUS)) || die 2 "--cpus '$cpus': C must be from 1 to $MAXCPUS"
  nodes=$((10#$nodes)) cpus=$((10#$cpus))
  [[ $CTLD_PORT =~ ^[0-9]+$ ]] && ((10#$CTLD_PORT >= 1024 && 10#$CTLD_PORT <= 65534)) ||
    die 2 "LOCAL_SLURM_PORT '$CTLD_PORT': must be a port from 1024 to 65534 (slurmd takes the next one)"
  [[ $WORK == /* && $WORK != *[[:space:]]* && $WORK != /tmp && $WORK != /tmp/* ]] ||
    die 2 "LOCAL_SLURM_DIR '$WORK': must be an absolute path without spaces, not under /tmp (each node has its own /tmp)"
  if [[ -d $WORK && ! -e $WORK/$MARK ]] && [[ -n $(ls -A "$WORK") ]]; then
    die 2 "LOCAL_SLURM_DIR '$WORK': exists and is not a local-slurm folder; pick another"
  fi
  if is_up; then die 2 "a local Slurm is up ($WORK); run 'scripts/local-slurm.sh down' first"; fi
  if command -v ss >/dev/null && [[ -n $(ss -ltnH "sport = :$CTLD_PORT" 2>/dev/null) ]]; then
    die 2 "port $CTLD_PORT is in use here: pick another with LOCAL_SLURM_PORT"
  fi
  local c missing=()
  for c in slurmctld slurmd srun sbatch squeue scontrol sinfo scancel munged munge unmunge; do
    command -v "$c" >/dev/null || missing+=("$c")
  done
  ((${#missing[@]} == 0)) || die 3 "Slurm or munge not installed (missing ${missing[*]}): apt-get install slurm-wlm munge"
  if [[ -e $WORK/$MARK ]] && [[ -n $(alive) || -e $WORK/run/cluster ]]; then
    say "stopping what an earlier local Slurm left running"
    teardown || die 1 "cannot stop the earlier local Slurm (see $WORK/log)"
  fi

  # The nodes first: a refusal of the shaping flags (exit 2) or no namespaces (3) leaves nothing.
  "$CLUSTER" up --nodes "$nodes" ${pass[@]+"${pass[@]}"}
  rc=$?
  ((rc == 0)) || exit "$rc"
  # From here on, whatever fails or interrupts us removes what was made.
  trap 'teardown; exit 130' INT
  trap 'teardown; exit 143' TERM
  fail() { say "$1"; teardown; say "nothing was left running"; exit 1; }
  rm -rf "$WORK" && mkdir -p "$WORK"/{etc,state,spool,log,run} && touch "$WORK/$MARK" && : >"$WORK/run/cluster" ||
    { "$CLUSTER" down; die 1 "cannot write $WORK"; }

  local munge=$WORK/munge
  if ! traversable "$WORK"; then munge=$MUNGE_RUN; rm -rf "$munge"; fi
  install -d -m 0755 "$munge" &&
    dd if=/dev/urandom of="$munge/munge.key" bs=1024 count=1 status=none && chmod 0400 "$munge/munge.key" ||
    fail "cannot make munge's folder $munge"
  write_conf "$nodes" "$cpus" "$munge" >"$SLURM_CONF" || fail "cannot write $SLURM_CONF"
  for ((i = 1; i <= nodes; i++)); do mkdir -p "$WORK/spool/node$i"; done

  /usr/sbin/munged --socket="$munge/munge.socket" --key-file="$munge/munge.key" --pid-file="$WORK/run/munged.pid" \
    --log-file="$WORK/log/munged.log" --seed-file="$munge/munged.seed" ||
    fail "munged did not start: $(tail -n1 "$WORK/log/munged.log" 2>/dev/null)"
  for _ in $(seq 50); do
    munge -S "$munge/munge.socket" -n 2>/dev/null | unmunge -S "$munge/munge.socket" >/dev/null 2>&1 && break
    sleep 0.2
  done
  munge -S "$munge/munge.socket" -n 2>/dev/null | unmunge -S "$munge/munge.socket" >/dev/null 2>&1 ||
    fail "munged does not answer on $munge/munge.socket"
  /usr/sbin/slurmctld -f "$SLURM_CONF" || fail "slurmctld did not start: $(tail -n1 "$WORK/log/slurmctld.log" 2>/dev/null)"

  # Slurm 22.05's slurmd wants a cgroup file system at /sys/fs/cgroup even with
  # proctrack/linuxproc: where there is none (a bare chroot), it gets an empty one in a mount
  # namespace of its own (as in slurm/test/slurm-test.sh), below the node's.
  local wrap=() fs
  fs=$(stat -fc %T /sys/fs/cgroup 2>/dev/null)
  if [[ $fs != cgroup2fs && $fs != tmpfs ]]; then
    wrap=(unshare -m --propagation unchanged sh -c 'mount --make-rprivate /sys &&
          mount -t tmpfs -o mode=755 none /sys/fs/cgroup && mkdir /sys/fs/cgroup/systemd &&
          mount -t cgroup -o none,name=systemd cgroup /sys/fs/cgroup/systemd && exec "$@"' sh)
  fi
  for ((i = 1; i <= nodes; i++)); do
    "$CLUSTER" exec "node$i" ${wrap[@]+"${wrap[@]}"} /usr/sbin/slurmd -f "$SLURM_CONF" -N "node$i" ||
      fail "slurmd of node$i did not start: $(tail -n1 "$WORK/log/slurmd-node$i.log" 2>/dev/null)"
  done
  local idle=0 states="" t0=$SECONDS
  while ((SECONDS - t0 < 30)); do
    states=$(timeout 5 sinfo -h -N -o '%N=%T' 2>/dev/null | sort -V | paste -sd' ')
    idle=$(grep -o '=idle\b' <<<"$states" | wc -l)
    ((idle == nodes)) && break
    [[ -z $(pid_of slurmctld slurmctld) ]] && ((SECONDS - t0 >= 2)) &&
      fail "slurmctld ended: $(grep -m1 -E 'fatal|error' "$WORK/log/slurmctld.log" 2>/dev/null | sed 's/^\[[^]]*\] //')"
    sleep 0.2
  done
  ((idle == nodes)) || fail "not every node is idle 30 s after start: ${states:-sinfo does not answer} (logs: $WORK/log)"
  trap - INT TERM
  print_howto "$nodes"
}

cmd_down() {
  teardown || die 1 "down: could not remove the nodes (scripts/local-cluster.sh down)"
  local left
  left=$(alive | paste -sd' ')
  [[ -z $left ]] || die 1 "down: processes left running: $left"
}

cmd_status() {
  is_up || die 1 "no local Slurm is up ($WORK)"
  echo "slurmctld $(pid_of slurmctld slurmctld) on $NET.1:$CTLD_PORT, munged $(pid_of munged munged); SLURM_CONF=$SLURM_CONF"
  sinfo -N -o '%N %T %c' 2>&1
  "$CLUSTER" status
}

case ${1:-} in
  up) shift; cmd_up "$@" ;;
  down) cmd_down ;;
  status) cmd_status ;;
  env) echo "export SLURM_CONF=$SLURM_CONF" ;;
  -h|--help|help) usage ;;
  "") die 2 "no command given (allowed: up, down, status, env; -h for help)" ;;
  *) die 2 "unknown command '$1' (allowed: up, down, status, env)" ;;
esac
