#!/usr/bin/env bash
# An emulated multi-node cluster on this one machine, for multi-host Open MPI runs.
#
# Each node is a Linux host of its own to Open MPI: a network namespace (sbc-nodeI), a UTS
# namespace (host name nodeI) and a mount namespace with its own /tmp (PMIx session files of
# two nodes must not collide) and an /etc/hosts naming every node. One veth per node joins
# the bridge sbc-br0 (198.18.0.1/24); node I is 198.18.0.(10+I)/24. Addresses come only from
# 198.18.0.0/15 (RFC 2544); no default route, no NAT: traffic stays on the bridge.
# One cluster per machine; needs root (CAP_NET_ADMIN, CAP_SYS_ADMIN).
#
#   scripts/local-cluster.sh up --nodes 4 --link-mbit 1000 --slow node3=200
#   scripts/local-cluster.sh up --nodes 3 --slow-path node1-node2=50
#   scripts/local-cluster.sh status
#   scripts/local-cluster.sh exec node2 hostname
#   scripts/local-cluster.sh shape node2=80          # a running cluster: node2's link to 80 Mbit/s
#   source scripts/mpi-env.sh
#   mpirun $(scripts/local-cluster.sh mpirun-args --ranks-per-node 2) -np 8 build/bin/collective_perf
#   scripts/local-cluster.sh down
#   scripts/local-cluster.sh run --nodes 2 --link-mbit 100 -- sh -c 'mpirun $SB_CLUSTER_MPIRUN_ARGS -np 2 hostname'
#
# Exit codes: 0 ok, 1 failure (or `status` with no cluster), 2 bad input or a cluster already
# up, 3 namespaces cannot be made here (no root / CAP_NET_ADMIN: tests count it as skipped).
set -uo pipefail

declare -A PID=()   # holder pids started by this process, by node index
MADE=0              # 1 once this process has started making a cluster
SELF=$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)/$(basename "${BASH_SOURCE[0]}")
STATE=${SB_CLUSTER_STATE:-/run/shardbench-cluster}
MARK=.shardbench-cluster        # only a folder holding this file is ever removed by `down`
NET=198.18.0 BR=sbc-br0 MAXN=16 MAXR=100000

usage() {
  cat <<'EOF'
usage: scripts/local-cluster.sh COMMAND ...
  up --nodes N [--link-mbit R] [--slow NODE=R]... [--slow-path A-B=R]...
                         make nodes node1..nodeN (N 1..16); R in Mbit/s: --link-mbit shapes
                         every node's link, --slow one node's link (both directions),
                         --slow-path only the traffic between nodes A and B
  down                   remove every node, link and the state (idempotent)
  exec NODE CMD...       run CMD inside NODE (cwd and environment kept)
  shape NODE=R|NODE=off...
                         on a running cluster: shape NODE's link to R Mbit/s (both
                         directions), or remove its shaping; not for a node with --slow-path
  status                 one line per node; exit 1 when no cluster is up
  mpirun-args [--ranks-per-node R]
                         the Open MPI flags to launch across the nodes from this namespace
                         (with SB_CLUSTER_EAGER=1 set: messages up to 4 MiB eager, for
                         link measurements with exchanges both ways at once)
  run --nodes N [shaping flags] -- CMD...
                         up, run CMD here with SB_CLUSTER_NODES, SB_CLUSTER_HOSTS and
                         SB_CLUSTER_MPIRUN_ARGS exported, then down; CMD's exit status
State folder: $SB_CLUSTER_STATE (default /run/shardbench-cluster).
EOF
}

die() { echo "local-cluster: $2" >&2; exit "$1"; }
is_rate() { [[ $1 =~ ^([0-9]+([.][0-9]*)?|[.][0-9]+)$ ]] && awk -v r="$1" -v m=$MAXR 'BEGIN{exit !(r > 0 && r <= m)}'; }
# A bucket of 4 ms at the rate, at least 32 KiB: smaller ones keep TCP well under the rate.
burst() { awk -v r="$1" 'BEGIN{b = int(r * 500); print (b < 32768 ? 32768 : b)}'; }
node_index() { [[ $1 =~ ^node([1-9][0-9]*)$ ]] && ((BASH_REMATCH[1] <= $2)) && echo "${BASH_REMATCH[1]}"; }
# A holder's argv[0] is sbc-holder-NODE@STATE: it says which node of which cluster it keeps.
holder_tag() { tr '\0' '\n' 2>/dev/null <"/proc/$1/cmdline" | head -n1 | grep '^sbc-holder-'; }
holder_alive() { [[ $(holder_tag "$1") == "sbc-holder-$2@$STATE" ]]; }

# A cluster is up when the state lists nodes and every holder still runs.
cluster_up() {
  [[ -s $STATE/nodes ]] || return 1
  local name addr pid rest
  while read -r name addr pid rest; do holder_alive "$pid" "$name" || return 1; done <"$STATE/nodes"
}
# What is left of a cluster: namespaces, links, the state folder; one line.
leftover_list() {
  { ip netns list 2>/dev/null | awk '$1 ~ /^sbc-/ {print $1}'
    ip -o link show 2>/dev/null | awk -F': ' '$2 ~ /^sbc-/ {sub(/@.*/, "", $2); print $2}'
    [[ -e $STATE/$MARK ]] && echo "$STATE"; } | paste -sd' '
}
leftovers() { [[ -n $(leftover_list) ]]; }

# Remove everything with the prefix: processes in the nodes (holders, orteds), namespaces,
# links, the state. Waits until the links are gone, so the host looks as before on return.
teardown() {
  local ns pids name addr pid rest i
  # Holders this process started, even one not yet in its namespace (up interrupted).
  ((${#PID[@]})) && kill -KILL "${PID[@]}" 2>/dev/null
  [[ -s $STATE/nodes ]] && while read -r name addr pid rest; do
    holder_alive "$pid" "$name" && kill -KILL "$pid" 2>/dev/null
  done <"$STATE/nodes"
  for ns in $(ip netns list 2>/dev/null | awk '$1 ~ /^sbc-/ {print $1}'); do
    pids=$(ip netns pids "$ns" 2>/dev/null)
    [[ -n $pids ]] && kill -KILL $pids 2>/dev/null
    ip netns del "$ns" 2>/dev/null
  done
  for i in $(seq 50); do   # namespaces are freed asynchronously, their veths with them
    for ns in $(ip -o link show 2>/dev/null | awk -F': ' '$2 ~ /^sbc-/ {sub(/@.*/, "", $2); print $2}'); do
      ip link del "$ns" 2>/dev/null
    done
    ip -o link show 2>/dev/null | grep -q ': sbc-' || break
    sleep 0.1
  done
  [[ -e $STATE/$MARK ]] && rm -rf "$STATE"
  [[ -d $STATE ]] && rmdir "$STATE" 2>/dev/null
  return 0
}

# Shapes node I's link: tbf (or htb, when it has slow paths) on its eth0, tbf on the root side.
shape_node() {
  local i=$1 n=node$1 link=${RATE[$1]:-} desc="none" b p r cls
  local peers=() k
  for k in "${!PATHR[@]}"; do
    [[ ${k%-*} == "$i" ]] && peers+=("${k#*-}:${PATHR[$k]}")
    [[ ${k#*-} == "$i" ]] && peers+=("${k%-*}:${PATHR[$k]}")
  done
  if [[ -n $link ]]; then
    b=$(burst "$link")
    tc qdisc add dev "sbc-v$i" root tbf rate "${link}mbit" burst "$b" latency 50ms || return 1
    desc="tbf ${link}mbit"
  fi
  if ((${#peers[@]})); then
    r=${link:-10000}; b=$(burst "$r")    # 10 Gbit/s stands for unlimited
    tc -n "sbc-$n" qdisc add dev eth0 root handle 1: htb default 2 || return 1
    tc -n "sbc-$n" class add dev eth0 parent 1: classid 1:1 htb rate "${r}mbit" burst "$b" cburst "$b" quantum 60000 || return 1
    tc -n "sbc-$n" class add dev eth0 parent 1:1 classid 1:2 htb rate "${r}mbit" burst "$b" cburst "$b" quantum 60000 || return 1
    desc="htb ${link:-unlimited}${link:+mbit}"
    for p in "${peers[@]}"; do
      cls=$(printf '1:%x' $((16 + ${p%%:*}))); b=$(burst "${p#*:}")
      tc -n "sbc-$n" class add dev eth0 parent 1:1 classid "$cls" htb rate "${p#*:}mbit" ceil "${p#*:}mbit" \
        burst "$b" cburst "$b" quantum 60000 || return 1
      tc -n "sbc-$n" filter add dev eth0 parent 1: protocol ip prio 1 u32 \
        match ip dst "$NET.$((10 + ${p%%:*}))/32" flowid "$cls" || return 1
      desc+=", to node${p%%:*} ${p#*:}mbit"
    done
  elif [[ -n $link ]]; then
    tc -n "sbc-$n" qdisc add dev eth0 root tbf rate "${link}mbit" burst "$b" latency 50ms || return 1
  fi
  SHAPE[$i]=$desc
}

# Starts node I: namespace, veth to the bridge, the holder process that keeps its UTS and
# mount namespaces (not `ip netns exec`: it remounts /sys, which slurmd cannot live with).
# mount -n: /run is shared with this host, so no entry in its /run/mount/utab.
make_node() {
  local i=$1 n=node$1 pid
  mkdir -p "$STATE/$n/tmp" && chmod 1777 "$STATE/$n/tmp" || return 1
  ip link add "sbc-v$i" type veth peer name "sbc-e$i" || return 1
  ip link set "sbc-e$i" netns "sbc-$n" || return 1
  ip -n "sbc-$n" link set "sbc-e$i" name eth0 || return 1
  ip -n "sbc-$n" addr add "$NET.$((10 + i))/24" dev eth0 || return 1
  ip -n "sbc-$n" link set lo up && ip -n "sbc-$n" link set eth0 up || return 1
  ip link set "sbc-v$i" master "$BR" && ip link set "sbc-v$i" up || return 1
  setsid nsenter --net="/run/netns/sbc-$n" unshare --uts --mount --propagation private \
    bash -c 'hostname "$1" && mount -n --bind "$2/tmp" /tmp && mount -n --bind "$3" /etc/hosts &&
             exec -a "sbc-holder-$1@$4" sleep infinity' bash "$n" "$STATE/$n" "$STATE/hosts" "$STATE" \
    </dev/null >>"$STATE/$n/holder.log" 2>&1 &
  pid=$! PID[$i]=$!
  disown "$pid"     # no "Killed" report from this shell when `down` ends it
  for _ in $(seq 100); do holder_alive "$pid" "$n" && break; kill -0 "$pid" 2>/dev/null || break; sleep 0.05; done
  holder_alive "$pid" "$n" || { echo "local-cluster: $n did not start: $(tail -n1 "$STATE/$n/holder.log")" >&2; return 1; }
}

cmd_up() {
  local nodes="" i a b k v
  declare -gA RATE=() PATHR=() SHAPE=()
  local link="" slows=() paths=()
  while (($#)); do
    case $1 in
      --nodes|--link-mbit|--slow|--slow-path)
        (($# >= 2)) || die 2 "$1 needs a value (--nodes N: 1..$MAXN; --link-mbit R; --slow NODE=R; --slow-path A-B=R)"
        case $1 in --nodes) nodes=$2 ;; --link-mbit) link=$2 ;; --slow) slows+=("$2") ;; *) paths+=("$2") ;; esac
        shift 2 ;;
      -h|--help) usage; exit 0 ;;
      *) die 2 "up: unknown argument '$1' (allowed: --nodes N, --link-mbit R, --slow NODE=R, --slow-path A-B=R)" ;;
    esac
  done
  [[ -n $nodes ]] || die 2 "up: --nodes N is required (N from 1 to $MAXN)"
  [[ $nodes =~ ^[0-9]+$ ]] && ((10#$nodes >= 1 && 10#$nodes <= MAXN)) || die 2 "--nodes '$nodes': N must be from 1 to $MAXN"
  nodes=$((10#$nodes))
  if [[ -n $link ]]; then
    is_rate "$link" || die 2 "--link-mbit '$link': must be a positive number of Mbit/s up to $MAXR"
    for ((i = 1; i <= nodes; i++)); do RATE[$i]=$link; done
  fi
  for v in ${slows[@]+"${slows[@]}"}; do
    [[ $v == *=* ]] || die 2 "--slow '$v': must be NODE=R (NODE node1..node$nodes, R Mbit/s)"
    i=$(node_index "${v%%=*}" "$nodes") || die 2 "--slow '$v': unknown node '${v%%=*}' (allowed: node1..node$nodes)"
    is_rate "${v#*=}" || die 2 "--slow '$v': rate '${v#*=}' must be a positive number of Mbit/s up to $MAXR"
    RATE[$i]=${v#*=}
  done
  for v in ${paths[@]+"${paths[@]}"}; do
    [[ $v =~ ^([^-=]+)-([^-=]+)=(.*)$ ]] || die 2 "--slow-path '$v': must be A-B=R (two of node1..node$nodes, R Mbit/s)"
    k=${BASH_REMATCH[3]}
    a=$(node_index "${BASH_REMATCH[1]}" "$nodes") || die 2 "--slow-path '$v': unknown node '${BASH_REMATCH[1]}' (allowed: node1..node$nodes)"
    b=$(node_index "${BASH_REMATCH[2]}" "$nodes") || die 2 "--slow-path '$v': unknown node '${BASH_REMATCH[2]}' (allowed: node1..node$nodes)"
    ((a != b)) || die 2 "--slow-path '$v': A and B must be two different nodes"
    is_rate "$k" || die 2 "--slow-path '$v': rate '$k' must be a positive number of Mbit/s up to $MAXR"
    if ((a < b)); then PATHR[$a-$b]=$k; else PATHR[$b-$a]=$k; fi
  done
  # The nodes see every path but /tmp (their own): the rsh agent and state must be outside it.
  [[ $STATE == /* && $STATE != *[[:space:]]* && $STATE != /tmp && $STATE != /tmp/* ]] ||
    die 2 "SB_CLUSTER_STATE '$STATE': must be an absolute path without spaces, not under /tmp"
  if [[ -d $STATE && ! -e $STATE/$MARK ]] && [[ -n $(ls -A "$STATE") ]]; then
    die 2 "SB_CLUSTER_STATE '$STATE': exists and is not a cluster state folder; pick another"
  fi
  if cluster_up; then
    die 2 "a cluster is up ($(wc -l <"$STATE/nodes") nodes); run 'scripts/local-cluster.sh down' first"
  fi
  local ns pid other
  for ns in $(ip netns list 2>/dev/null | awk '$1 ~ /^sbc-/ {print $1}'); do
    for pid in $(ip netns pids "$ns" 2>/dev/null); do
      other=$(holder_tag "$pid") && other=${other#*@} && [[ $other != "$STATE" && -s $other/nodes ]] &&
        die 2 "a cluster is up with SB_CLUSTER_STATE=$other; run 'SB_CLUSTER_STATE=$other scripts/local-cluster.sh down' first"
    done
  done
  if leftovers; then echo "local-cluster: removing a stale cluster" >&2; teardown; fi

  # From here on, whatever fails or interrupts us removes what was made.
  local old_traps
  old_traps=$(trap -p INT TERM)
  # shellcheck disable=SC2034  # read by run's EXIT trap
  MADE=1
  trap 'teardown; exit 130' INT
  trap 'teardown; exit 143' TERM
  local err
  if ! err=$(ip netns add sbc-node1 2>&1) || ! err=$(ip link add "$BR" type bridge 2>&1); then
    teardown; die 3 "cannot make network namespaces and links here (needs root / CAP_NET_ADMIN): $err"
  fi
  mkdir -p "$STATE" && touch "$STATE/$MARK" || { teardown; die 1 "cannot write the state folder $STATE"; }
  { echo "127.0.0.1 localhost"; echo "$NET.1 sbc-root"
    for ((i = 1; i <= nodes; i++)); do echo "$NET.$((10 + i)) node$i"; done; } >"$STATE/hosts"
  printf '#!/bin/sh\n# Open MPI rsh agent for this cluster: [options] HOST CMD...\nSB_CLUSTER_STATE=%s exec %s rsh "$@"\n' \
    "$STATE" "$SELF" >"$STATE/rsh-agent" && chmod +x "$STATE/rsh-agent"
  if ! { ip addr add "$NET.1/24" dev "$BR" && ip link set "$BR" up; }; then
    teardown; die 1 "cannot make the bridge $BR"
  fi
  for ((i = 1; i <= nodes; i++)); do
    { ((i == 1)) || ip netns add "sbc-node$i"; } && make_node "$i" && shape_node "$i" ||
      { teardown; die 1 "up: could not make node$i (see the lines above); nothing was left behind"; }
  done
  # Written last and at once: a `nodes` file means a complete cluster.
  for ((i = 1; i <= nodes; i++)); do echo "node$i $NET.$((10 + i)) ${PID[$i]} ${SHAPE[$i]}"; done >"$STATE/nodes.new"
  mv "$STATE/nodes.new" "$STATE/nodes"
  trap - INT TERM
  eval "$old_traps"
}

cmd_down() {
  teardown
  local left
  left=$(leftover_list)
  [[ -z $left ]] || die 1 "down: could not remove $left (needs root)"
}

need_up() { cluster_up || die 1 "no cluster is up (scripts/local-cluster.sh up --nodes N)"; }

# Prints the holder pid of NODE (a name or an address), or fails.
holder_of() {
  local name addr pid rest
  while read -r name addr pid rest; do
    [[ $1 == "$name" || $1 == "$addr" ]] && { echo "$pid"; return 0; }
  done <"$STATE/nodes"
  return 1
}

cmd_exec() {
  (($# >= 2)) || die 2 "exec: usage: exec NODE CMD..."
  need_up
  local pid n
  n=$(wc -l <"$STATE/nodes")
  pid=$(holder_of "$1") || die 2 "exec: unknown node '$1' (allowed: node1..node$n)"
  shift
  exec nsenter -t "$pid" --net --uts --mount --wd="$PWD" -- "$@"
}

# Open MPI's rsh launcher calls its agent as `AGENT [options] HOST CMD...`, CMD being words of
# a shell command line (as ssh would take them): skip the options, run CMD in HOST's shell.
cmd_rsh() {
  while [[ ${1:-} == -* ]]; do shift; done
  (($# >= 2)) || die 2 "rsh: usage: rsh [options] HOST CMD..."
  local pid host=$1
  shift
  pid=$(holder_of "$host") || die 2 "rsh: unknown host '$host'"
  exec nsenter -t "$pid" --net --uts --mount --wd="$PWD" -- "${SHELL:-/bin/sh}" -c "$*"
}

mpirun_args() {
  local per=$1 hosts="" name rest
  # Ranks start in mpirun's folder by its path: under /tmp that is each node's own (or, where
  # missing, $HOME), so collective writes (results/*.h5 via MPI-IO) hang or split.
  [[ $PWD == /tmp || $PWD == /tmp/* ]] &&
    echo "local-cluster: warning: $PWD is under /tmp, which each node has its own of; run mpirun from elsewhere" >&2
  while read -r name rest; do hosts+=${hosts:+,}$name:$per; done <"$STATE/nodes"
  # Open MPI's settings for the bridge, and why each: scripts/mpi-env-cluster.sh, the one home
  # of them (jobs that source it and jobs launched with these flags run alike); as flags,
  # what it sets beyond scripts/mpi-env.sh (SB_CLUSTER_EAGER=1 in the caller's environment:
  # the eager limit of the jobs that measure links with exchanges both ways).
  local mca
  mca=$(comm -13 <(env -i bash -c '. "$1" && env' _ "$(dirname "$SELF")/mpi-env.sh" | sort) \
                 <(env -i SB_CLUSTER_EAGER="${SB_CLUSTER_EAGER:-0}" bash -c '. "$1" && env' _ "$(dirname "$SELF")/mpi-env-cluster.sh" | sort) |
        sed -n 's/^OMPI_MCA_\([^=]*\)=\(.*\)$/--mca \1 \2/p' | tr '\n' ' ')
  echo "--host $hosts --mca plm_rsh_agent $STATE/rsh-agent ${mca% }"
}

cmd_mpirun_args() {
  local per=1
  while (($#)); do
    case $1 in
      --ranks-per-node) [[ ${2:-} =~ ^[1-9][0-9]*$ ]] || die 2 "--ranks-per-node '${2:-}': must be a positive integer"
        per=$2; shift 2 ;;
      *) die 2 "mpirun-args: unknown argument '$1' (allowed: --ranks-per-node R)" ;;
    esac
  done
  need_up
  mpirun_args "$per"
}

# Reshapes node links of a running cluster: tbf on both ends, replaced in place (open
# connections and running jobs go on at the new rate). All arguments checked first.
cmd_shape() {
  (($#)) || die 2 "shape: usage: shape NODE=R|NODE=off... (R in Mbit/s)"
  need_up
  local n v i r b name addr pid rest
  n=$(wc -l <"$STATE/nodes")
  local -A NEW=()
  for v in "$@"; do
    [[ $v == *=* ]] || die 2 "shape: '$v': must be NODE=R or NODE=off (NODE node1..node$n, R Mbit/s)"
    i=$(node_index "${v%%=*}" "$n") || die 2 "shape: '$v': unknown node '${v%%=*}' (allowed: node1..node$n)"
    r=${v#*=}
    [[ $r == off ]] || is_rate "$r" || die 2 "shape: '$v': rate '$r' must be a positive number of Mbit/s up to $MAXR, or off"
    tc -n "sbc-node$i" qdisc show dev eth0 2>/dev/null | grep -q '^qdisc htb' &&
      die 2 "shape: node$i has per-path shaping (--slow-path): bring the cluster up again to change it"
    NEW[$i]=$r
  done
  for i in "${!NEW[@]}"; do
    r=${NEW[$i]}
    if [[ $r == off ]]; then
      tc qdisc del dev "sbc-v$i" root 2>/dev/null
      tc -n "sbc-node$i" qdisc del dev eth0 root 2>/dev/null
    else
      b=$(burst "$r")
      tc qdisc replace dev "sbc-v$i" root tbf rate "${r}mbit" burst "$b" latency 50ms &&
        tc -n "sbc-node$i" qdisc replace dev eth0 root tbf rate "${r}mbit" burst "$b" latency 50ms ||
        die 1 "shape: could not shape node$i's link"
    fi
  done
  while read -r name addr pid rest; do
    i=${name#node}
    if [[ -n ${NEW[$i]:-} ]]; then
      if [[ ${NEW[$i]} == off ]]; then rest=none; else rest="tbf ${NEW[$i]}mbit"; fi
    fi
    echo "$name $addr $pid $rest"
  done <"$STATE/nodes" >"$STATE/nodes.new" && mv "$STATE/nodes.new" "$STATE/nodes"
  cmd_status
}

cmd_status() {
  [[ -s $STATE/nodes ]] || die 1 "no cluster is up"
  local name addr pid shape state=0
  while read -r name addr pid shape; do
    if holder_alive "$pid" "$name"; then echo "$name $addr up $shape"; else echo "$name $addr down $shape"; state=1; fi
  done <"$STATE/nodes"
  return $state
}

# Ends run's CMD and its children (say, the mpirun of a `sh -c`), by pid.
stop_child() {
  [[ -n ${child:-} ]] && kill -0 "$child" 2>/dev/null || return 0
  local kids p
  kids=$(pgrep -P "$child")   # before the child ends and they move to another parent
  kill -TERM "$child" $kids 2>/dev/null
  for _ in $(seq 30); do     # 3 s to end cleanly (mpirun stops its ranks), then KILL
    for p in "$child" $kids; do kill -0 "$p" 2>/dev/null && break; p=""; done
    [[ -z $p ]] && break
    sleep 0.1
  done
  kill -KILL "$child" $kids 2>/dev/null; wait "$child" 2>/dev/null
}

# up, CMD here with the cluster's description exported, down on every exit.
cmd_run() {
  local up=() child rc
  while (($#)) && [[ $1 != -- ]]; do up+=("$1"); shift; done
  (($# >= 2)) || die 2 "run: usage: run --nodes N [shaping flags] -- CMD..."
  shift
  # Set before up, so no signal falls between up and these; a refused up made nothing.
  trap '((MADE)) && { stop_child; teardown; }' EXIT
  trap 'exit 130' INT
  trap 'exit 143' TERM
  cmd_up ${up[@]+"${up[@]}"}
  SB_CLUSTER_NODES=$(wc -l <"$STATE/nodes")
  SB_CLUSTER_HOSTS=$(awk '{print $1}' "$STATE/nodes" | paste -sd, -)
  SB_CLUSTER_MPIRUN_ARGS=$(mpirun_args 1)
  export SB_CLUSTER_NODES SB_CLUSTER_HOSTS SB_CLUSTER_MPIRUN_ARGS
  # In the background so that a signal reaches our trap at once (bash defers traps until a
  # foreground child ends); stdin passed on explicitly, as `&` would give it /dev/null.
  exec 3<&0 || exec 3</dev/null
  "$@" <&3 3<&- &
  child=$!
  wait "$child"; rc=$?
  child=""
  return $rc
}

case ${1:-} in
  up) shift; cmd_up "$@" ;;
  down) cmd_down ;;
  exec) shift; cmd_exec "$@" ;;
  rsh) shift; cmd_rsh "$@" ;;
  status) cmd_status ;;
  shape) shift; cmd_shape "$@" ;;
  mpirun-args) shift; cmd_mpirun_args "$@" ;;
  run) shift; cmd_run "$@" ;;
  -h|--help|help) usage ;;
  "") die 2 "no command given (allowed: up, down, exec, status, shape, mpirun-args, run; -h for help)" ;;
  *) die 2 "unknown command '$1' (allowed: up, down, exec, status, shape, mpirun-args, run)" ;;
esac
