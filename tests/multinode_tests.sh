#!/usr/bin/env bash
# The multi-node suite: shardbench across hosts of its own on this machine
# (scripts/local-cluster.sh: a network, UTS and mount namespace per node, a bridge between).
#   1. the emulated cluster itself (tests/local_cluster_test.sh);
#   2. on 2 and on 4 nodes of 2 ranks: DDP, FSDP full, hybrid (no --shard-size: one group per
#      node), grad-op, ZeRO-1, CPU offload, tensor parallelism inside a node, a pipeline across
#      nodes, each --check PASS; each result's hosts, node count and groups as launched
#      (tests/check_nodes.py);
#   3. the checker fails when hybrid groups ignore the nodes (round-robin placement), and
#      hybrid without --shard-size refuses such a placement in one line, writing nothing;
#   4. a shaped link is the bottleneck: collective_perf's all-gather across 2 nodes does not
#      beat the link's rate (the bytes cross it), reaches most of it, and runs several times
#      slower than unshaped.
# Needs root (CAP_NET_ADMIN). Where namespaces cannot be made it says "skipped" in one line
# and exits 77, which tests/run_tests.sh counts as skipped, never as passed.
source "$(dirname "$0")/lib.sh"
C=$ROOT/scripts/local-cluster.sh
# Not under /tmp: each node has a /tmp of its own, and the ranks start in mpirun's folder.
work=$ROOT/build/multinode-test
rm -rf "$work" && mkdir -p "$work" && cd "$work" || exit 1
trap '"$C" down >/dev/null 2>&1; rm -rf "$tmp" "$work"' EXIT
trap 'exit 130' INT TERM
T0=$SECONDS

echo "--- the emulated cluster (tests/local_cluster_test.sh)"
bash "$ROOT/tests/local_cluster_test.sh" >"$tmp/cluster" 2>&1
rc=$?
if grep -q "^local_cluster_test: skipped" "$tmp/cluster"; then
  echo "multinode: skipped: $(sed -n 's/^local_cluster_test: skipped: //p' "$tmp/cluster")"
  exit 77
fi
grep -E "^(FAIL|      \|)" "$tmp/cluster"
if [ "$rc" -eq 0 ]; then ok "local_cluster_test: $(tail -n 1 "$tmp/cluster")"; else cp "$tmp/cluster" "$tmp/out"; bad "local_cluster_test"; fi

TINY=(--model t5-tiny --batch 2 --seq-len 12 --dec-seq-len 8 --steps 2 --warmup 1)
# name program flags: the strategies and layouts every cluster size runs, --check on each.
MATRIX=("ddp ddp_perf --bucket-mb 0.002"
        "full fsdp_perf --sharding full"
        "hybrid fsdp_perf --sharding hybrid"
        "grad-op fsdp_perf --sharding grad-op"
        "zero1 fsdp_perf --sharding optimizer-state"
        "offload fsdp_perf --sharding full --cpu-offload params"
        "tp2 fsdp_perf --sharding full --tp 2"
        "pp2 ddp_perf --pp 2 --micro-batches 2")
for nodes in 2 4; do
  echo "--- $nodes nodes x 2 ranks [$((SECONDS - T0)) s]"
  "$C" up --nodes "$nodes" >"$tmp/out" 2>&1 || { bad "up --nodes $nodes"; continue; }
  read -ra MPI <<<"timeout 120 mpirun $("$C" mpirun-args --ranks-per-node 2 2>/dev/null)"
  files=()
  for entry in "${MATRIX[@]}"; do
    read -r name prog flags <<<"$entry"
    # shellcheck disable=SC2086  # flags are words
    expect "$nodes nodes: $name --check" 0 '-> PASS' -- "${MPI[@]}" -np $((2 * nodes)) "$BIN/$prog" "${TINY[@]}" $flags \
      --check --out "$work/$name-$nodes.h5"
    files+=("$work/$name-$nodes.h5")
  done
  expect "$nodes nodes: hybrid without --shard-size is one node's group" 0 "^label fsdp-hybrid2$" -- \
    "$PY" -c "import h5py; print('label', h5py.File('$work/hybrid-$nodes.h5').attrs['label'])"
  expect "$nodes nodes: every rank's host, the node count, no group across nodes" 0 "check_nodes: ${#MATRIX[@]} file" -- \
    "$PY" "$ROOT/tests/check_nodes.py" --nodes "$nodes" --ranks-per-node 2 "${files[@]}"
  if [ "$nodes" = 4 ]; then
    # Round robin (--map-by node): rank r on node r % 4 + 1, so groups of consecutive ranks span nodes.
    expect "round robin: hybrid without --shard-size refused in one line" 2 \
      "^[^ ]*fsdp_perf: error: hybrid sharding without --shard-size .* not placed node by node \(rank 4 is on node1 after rank 3 on node4" -- \
      "${MPI[@]}" --map-by node -np 8 "$BIN/fsdp_perf" "${TINY[@]}" --sharding hybrid --out "$work/refused.h5"
    if [ -e "$work/refused.h5" ]; then bad "round robin: no result written"; else ok "round robin: no result written"; fi
    expect "round robin: hybrid --shard-size 2 warns that a group crosses nodes" 0 \
      "warning: a hybrid shard group crosses nodes: ranks 0,1 on node1 and node2" -- \
      "${MPI[@]}" --map-by node -np 8 "$BIN/fsdp_perf" "${TINY[@]}" --sharding hybrid --shard-size 2 --check \
      --out "$work/spread.h5"
    expect "round robin: the checker fails a result whose groups ignore the nodes" 1 \
      "hybrid shard group of ranks \[0, 1\] spans node1, node2" -- \
      "$PY" "$ROOT/tests/check_nodes.py" --nodes 4 --ranks-per-node 2 --map-by node "$work/spread.h5"
    if ! grep -q "recorded on host" "$tmp/out"; then ok "round robin: every rank's host recorded where it ran"
    else bad "round robin: every rank's host recorded where it ran"; fi
  fi
  "$C" down >/dev/null 2>&1
done

# The shaped link is the bottleneck: 2 nodes of 1 rank, an all-gather of 4 MiB a rank. Each
# rank receives the other's 4 MiB through its link, so busbw (nccl-tests: algbw × (n-1)/n)
# is the bytes a link carries per second: at most the shaped rate (plus a little for the
# token bucket's burst), and far below it unshaped.
echo "--- the shaped link is the bottleneck [$((SECONDS - T0)) s]"
busbw() { # busbw FILE: the largest size's out-of-place busbw in GB/s
  "$PY" -c "
import h5py
f = h5py.File('$1'); r = f['results'][()]; r = r[r['in_place'] == 0]
print(r[r['size'] == r['size'].max()]['busbw'][0])"
}
AG=(-b 4M -e 4M -n 3 -w 1 --ops all-gather)
for rate in 0 200; do
  shaping=()
  [ "$rate" = 0 ] || shaping=(--link-mbit "$rate")
  "$C" up --nodes 2 "${shaping[@]}" >"$tmp/out" 2>&1 || { bad "up --nodes 2 ${shaping[*]}"; continue; }
  read -ra MPI <<<"timeout 120 mpirun $("$C" mpirun-args --ranks-per-node 1 2>/dev/null)"
  expect "all-gather across 2 nodes, link ${rate/#0/unshaped} Mbit/s" 0 "Out of bounds values : 0 OK" -- \
    "${MPI[@]}" -np 2 "$BIN/collective_perf" "${AG[@]}" --out "$work/ag-$rate.h5"
  "$C" down >/dev/null 2>&1
done
if [ -e "$work/ag-0.h5" ] && [ -e "$work/ag-200.h5" ]; then
  fast=$(busbw "$work/ag-0.h5") slow=$(busbw "$work/ag-200.h5")
  echo "      busbw: unshaped $fast GB/s, shaped to 200 Mbit/s (0.025 GB/s) $slow GB/s"
  if awk -v s="$slow" 'BEGIN { exit !(s <= 0.025 * 1.05) }'; then ok "shaped busbw at most the link's rate (the bytes cross the link)"
  else echo "      $slow GB/s > 1.05 x 0.025" >"$tmp/out"; bad "shaped busbw at most the link's rate"; fi
  # and close to it: the benchmark measures the link, not itself (one TCP connection a pair
  # of ranks gave half the rate each way: local-cluster.sh's mpirun-args).
  if awk -v s="$slow" 'BEGIN { exit !(s >= 0.025 * 0.75) }'; then ok "shaped busbw at least 75 % of the link's rate"
  else echo "      $slow GB/s < 0.75 x 0.025" >"$tmp/out"; bad "shaped busbw at least 75 % of the link's rate"; fi
  if awk -v s="$slow" -v f="$fast" 'BEGIN { exit !(f > 3 * s) }'; then ok "unshaped at least 3x faster (the link is the bottleneck)"
  else echo "      unshaped $fast GB/s, shaped $slow GB/s" >"$tmp/out"; bad "unshaped at least 3x faster"; fi
fi
echo "multinode: $((SECONDS - T0)) s"
summary
