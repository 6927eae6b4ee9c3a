#!/usr/bin/env bash
# scripts/local-cluster.sh: nodes that are hosts of their own (name, address, /tmp, no way
# out of 198.18.0.0/24), rates shaped as asked (measured with a TCP stream), Open MPI across
# the nodes, one-line refusals of bad input, and a host left as it was after up/down, after
# `run`, after a `run` or `up` stopped by SIGTERM. Needs root: without, it says "skipped".
source "$(dirname "$0")/lib.sh"
C=$ROOT/scripts/local-cluster.sh
unset SB_CLUSTER_STATE    # the default state: the test must see a cluster someone else has up
trap '"$C" down >/dev/null 2>&1; rm -rf "$tmp"' EXIT
trap 'exit 130' INT TERM

skip() { echo "local_cluster_test: skipped: $1"; exit 0; }
if "$C" status >/dev/null 2>&1; then trap 'rm -rf "$tmp"' EXIT; skip "a cluster is up; not touching it"; fi
"$C" down >/dev/null 2>&1   # a stale one

# What the cluster may touch on the host; equal before and after.
snapshot() {
  { ip -o link; ip -o addr; ip route; ip netns list; pgrep -a -f '^sbc-holder-'; ls -d /run/shardbench-cluster; } 2>&1
}
snapshot >"$tmp/before"
ref=$tmp/before   # what refusals must leave as it was: the host, or the host with the cluster up
same_host() {   # same_host NAME: the host looks as before
  snapshot >"$tmp/after"
  if diff "$tmp/before" "$tmp/after" >"$tmp/out"; then ok "$1"; else bad "$1"; fi
}

"$C" up --nodes 1 >"$tmp/out" 2>&1
case $? in
  0) "$C" down >>"$tmp/out" 2>&1 && ok "up --nodes 1, down" || bad "up --nodes 1, down" ;;
  3) skip "$(tail -n1 "$tmp/out")" ;;
  *) bad "up --nodes 1 works"; summary; exit 1 ;;
esac
same_host "  the host as before"
# refused NAME PATTERN -- command...: exit 2, one line on stderr matching PATTERN, host unchanged.
refused() {
  local name=$1 pattern=$2
  shift 3
  "$@" >"$tmp/stdout" 2>"$tmp/stderr"
  local rc=$? lines
  lines=$(wc -l <"$tmp/stderr")
  cat "$tmp/stdout" "$tmp/stderr" >"$tmp/out"
  snapshot | diff "$ref" - >>"$tmp/out"
  local changed=$?
  if [ $rc -ne 2 ] || [ "$lines" -ne 1 ] || ! grep -qE -- "$pattern" "$tmp/stderr" || [ -s "$tmp/stdout" ] || [ $changed -ne 0 ]; then
    echo "      exit $rc, $lines line(s) on stderr, expected exit 2, one line /$pattern/, the host unchanged" >>"$tmp/out"
    bad "$name"
  else
    ok "$name"
  fi
}

# status NAME CODE -- command...: exit code CODE, whatever the output.
status() {
  local name=$1 code=$2
  shift 3
  "$@" >"$tmp/out" 2>&1
  local rc=$?
  if [ $rc -eq "$code" ]; then ok "$name"; else echo "      exit $rc, expected $code" >>"$tmp/out"; bad "$name"; fi
}

# A TCP stream of MB MiB from node A to node B; prints Mbit/s as the receiver saw it.
XFER='
import socket, sys, time
if sys.argv[1] == "recv":
    s = socket.socket(); s.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
    s.bind(("0.0.0.0", 5001)); s.listen(1); s.settimeout(20)
    c, _ = s.accept(); c.settimeout(20); n = 0; t0 = None
    while True:
        b = c.recv(1 << 20)
        if not b: break
        if t0 is None: t0 = time.monotonic()
        n += len(b)
    print("%.0f" % (n * 8 / (time.monotonic() - t0) / 1e6))
else:
    for i in range(100):
        try: s = socket.create_connection((sys.argv[2], 5001), timeout=5); break
        except OSError: time.sleep(0.05)
    data = b"x" * (1 << 20)
    for i in range(int(sys.argv[3])): s.sendall(data)
    s.close()
'
rate() {
  "$C" exec "$2" $PY -c "$XFER" recv >"$tmp/rate" 2>&1 &
  "$C" exec "$1" $PY -c "$XFER" send "$2" "$3" >>"$tmp/out" 2>&1
  wait $!
  cat "$tmp/rate"
}
# within NAME VALUE LO HI: LO <= VALUE <= HI
within() {
  echo "      measured $2" >"$tmp/out"
  if awk -v v="$2" -v lo="$3" -v hi="$4" 'BEGIN{exit !(v+0 == v && v >= lo && v <= hi)}'; then ok "$1"; else bad "$1"; fi
}

# 1. Three nodes: hosts of their own.
status "up --nodes 3" 0 -- "$C" up --nodes 3
for i in 1 2 3; do
  expect "  node$i: host name node$i" 0 "^node$i\$" -- "$C" exec node$i hostname
  expect "  node$i: address 198.18.0.$((10 + i))/24 on eth0" 0 "inet 198.18.0.$((10 + i))/24 " -- "$C" exec node$i ip -o -4 addr show eth0
done
"$C" exec node1 ip route >"$tmp/out" 2>&1
if grep -q default "$tmp/out" || [ "$(wc -l <"$tmp/out")" -ne 1 ]; then bad "  node1: one route, to 198.18.0.0/24, no default"; else ok "  node1: one route, to 198.18.0.0/24, no default"; fi
expect "  node1 -> anything outside 198.18.0.0/24: no route (no packet sent)" 2 'unreachable' -- "$C" exec node1 ip route get 8.8.8.8
# A refused connection is an answer from node2's kernel: node2 is reachable, by name.
expect "  node1 reaches node2 by name" 0 'refused' -- "$C" exec node1 $PY -c '
import socket
try: socket.create_connection(("node2", 5999), timeout=3)
except ConnectionRefusedError: print("refused")'
"$C" exec node1 sh -c 'echo x >/tmp/sbc-probe' >"$tmp/out" 2>&1
check "  node1 sees its /tmp/sbc-probe" "$C" exec node1 test -e /tmp/sbc-probe
check "  node2 and this host do not" sh -c "! '$C' exec node2 test -e /tmp/sbc-probe && ! test -e /tmp/sbc-probe"
expect "  status: one line per node" 0 '^node2 198.18.0.12 up none$' -- "$C" status
unshaped=$(rate node1 node2 40)
echo "      unshaped node1 -> node2: $unshaped Mbit/s"

# 5. Open MPI from this namespace across the nodes (mpi-env.sh's btl_tcp_if_include=lo loses).
env -u SB_CLUSTER_EAGER "$C" mpirun-args --ranks-per-node 2 >"$tmp/args" 2>"$tmp/mpi"
check "mpirun-args: Open MPI's rendezvous by default (no eager limit among its flags)" sh -c "! grep -q eager_limit '$tmp/args'"
SB_CLUSTER_EAGER=1 "$C" mpirun-args --ranks-per-node 2 >"$tmp/args-eager" 2>/dev/null
check "  with SB_CLUSTER_EAGER=1: messages up to 4 MiB eager (link measurements both ways)" \
  grep -q -- '--mca btl_tcp_eager_limit 4194432' "$tmp/args-eager"
timeout 60 mpirun $(cat "$tmp/args") -np 4 hostname >"$tmp/hosts" 2>>"$tmp/mpi"
sort "$tmp/hosts" | paste -sd' ' >>"$tmp/mpi"
expect "mpirun: 2 ranks on node1, 2 on node2" 0 '^node1 node1 node2 node2$' -- cat "$tmp/mpi"
expect "  the ranks' TCP is pinned to the bridge's network" 0 '^198.18.0.0/24$' -- \
  timeout 60 mpirun $(cat "$tmp/args") -np 1 sh -c 'echo $OMPI_MCA_btl_tcp_if_include' 

# 6 (while up). Refusals leave the cluster as it was.
snapshot >"$tmp/up"
ref=$tmp/up
refused "a second up is refused" 'a cluster is up \(3 nodes\).*down' -- "$C" up --nodes 2
expect "  the first cluster still works" 0 '^node3$' -- "$C" exec node3 hostname
if snapshot | diff "$tmp/up" - >"$tmp/out"; then ok "  and is untouched"; else bad "  and is untouched"; fi
refused "exec on an unknown node" "node7.*node1..node3" -- "$C" exec node7 true
"$C" down
ref=$tmp/before
same_host "down: the host as before"
status "down again: nothing to do, exit 0" 0 -- "$C" down
expect "status without a cluster: exit 1" 1 'no cluster is up' -- "$C" status

# 6. Bad input: one line, exit 2, nothing made.
refused "unknown subcommand" "unknown command 'frob'" -- "$C" frob
refused "--slow on an unknown node" "node9.*node1..node2" -- "$C" up --nodes 2 --slow node9=10
refused "--link-mbit 0" "'0'.*positive number" -- "$C" up --nodes 2 --link-mbit 0
refused "--link-mbit abc" "'abc'.*positive number" -- "$C" up --nodes 2 --link-mbit abc
refused "--nodes 1000" "'1000'.*1 to 16" -- "$C" up --nodes 1000
refused "--nodes 0" "'0'.*1 to 16" -- "$C" up --nodes 0
refused "--slow-path node1-node1=10" "node1-node1=10.*two different nodes" -- "$C" up --nodes 2 --slow-path node1-node1=10
same_host "  the host as before"

# 4. Shaping, measured.
status "up --nodes 2 --link-mbit 100" 0 -- "$C" up --nodes 2 --link-mbit 100
r12=$(rate node1 node2 5)
within "  node1 -> node2 at 80..105 Mbit/s" "$r12" 80 105
r21=$(rate node2 node1 5)
within "  node2 -> node1 at 80..105 Mbit/s" "$r21" 80 105
within "  unshaped is over 3x faster" "$unshaped" $((3 * 100)) 1e9
expect "  status says so" 0 '^node1 198.18.0.11 up tbf 100mbit$' -- "$C" status
"$C" down
# --slow shapes one node's link: out of it at its eth0, into it at this host's end of the veth.
status "up --nodes 2 --slow node2=60" 0 -- "$C" up --nodes 2 --slow node2=60
s12=$(rate node1 node2 3)
within "  node1 -> node2 (into node2) at 48..63 Mbit/s" "$s12" 48 63
s21=$(rate node2 node1 3)
within "  node2 -> node1 (out of node2) at 48..63 Mbit/s" "$s21" 48 63
expect "  status says so" 0 '^node2 198.18.0.12 up tbf 60mbit$' -- "$C" status
"$C" down
status "up --nodes 3 --slow-path node1-node2=50" 0 -- "$C" up --nodes 3 --slow-path node1-node2=50
p12=$(rate node1 node2 4)
within "  node1 -> node2 at 40..52.5 Mbit/s" "$p12" 40 52.5
p21=$(rate node2 node1 4)
within "  node2 -> node1 at 40..52.5 Mbit/s" "$p21" 40 52.5
p13=$(rate node1 node3 20)
within "  node1 -> node3 is over 3x faster" "$p13" 150 1e9
echo "      measured Mbit/s: link 100: $r12, $r21; node2 at 60: $s12, $s21; path 50: $p12, $p21; node1 -> node3 $p13; unshaped $unshaped"
"$C" down

# 1 (cont.). A stale cluster, run, and interrupted runs leave nothing behind.
"$C" up --nodes 2 >/dev/null 2>&1
while read -r name addr pid rest; do kill -KILL "$pid"; done </run/shardbench-cluster/nodes
expect "holders gone: status says down, exit 1" 1 '^node1 198.18.0.11 down' -- "$C" status
expect "up over a stale cluster removes it first" 0 'stale' -- "$C" up --nodes 2
expect "  and makes a working one" 0 '^node2$' -- "$C" exec node2 hostname
"$C" down
expect "run: CMD sees the cluster, runs mpirun, and its status is run's" 3 '^2 node1,node2 node1 node2$' -- \
  "$C" run --nodes 2 -- sh -c 'echo $SB_CLUSTER_NODES $SB_CLUSTER_HOSTS $(mpirun $SB_CLUSTER_MPIRUN_ARGS -np 2 hostname | sort); exit 3'
same_host "  the host as before"
status "run -- false: exit 1" 1 -- "$C" run --nodes 2 -- false
same_host "  the host as before"
"$C" run --nodes 2 -- sleep 61.5 >/dev/null 2>&1 &
runpid=$!
for i in $(seq 100); do "$C" status >/dev/null 2>&1 && break; sleep 0.1; done
kill -TERM $runpid
wait $runpid
rc=$?
echo "      exit $rc" >"$tmp/out"
if [ $rc -eq 143 ]; then ok "run stopped by SIGTERM: exit 143"; else bad "run stopped by SIGTERM: exit 143"; fi
same_host "  the host as before"
check "  its command was stopped too" sh -c "! pgrep -f '^sleep 61.5\$'"
"$C" up --nodes 16 >/dev/null 2>&1 &
uppid=$!
for i in $(seq 100); do ip netns list | grep -q sbc-node3 && break; sleep 0.05; done
kill -TERM $uppid
wait $uppid
rc=$?
echo "      exit $rc" >"$tmp/out"
if [ $rc -eq 143 ]; then ok "up stopped by SIGTERM midway: exit 143"; else bad "up stopped by SIGTERM midway: exit 143"; fi
same_host "  the host as before"
summary
