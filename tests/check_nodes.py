#!/usr/bin/python3
"""Checks a training result from an emulated cluster against where its ranks ran: each rank's
recorded host is the node the launcher put it on (--map-by slot, Open MPI's default: R ranks
per node, rank r on node{r // R + 1}; --map-by node: round robin, rank r on node{r % N + 1}), the root attributes count N nodes of R ranks, and no hybrid
shard group (when the shard group fits a node) and no tensor-parallel group lies on two hosts.
Usage: check_nodes.py --nodes N --ranks-per-node R [--map-by slot|node] FILE...; exit 0 all hold, 1 otherwise
(each broken claim on a line of its own).
"""
import argparse
import os
import sys

sys.path.insert(0, os.path.join(os.path.dirname(os.path.dirname(os.path.abspath(__file__))), "analysis"))
import shardbench_h5  # noqa: E402


def problems(path, nodes, per_node, map_by="slot"):
    run = shardbench_h5.load(path)
    m, out = run.meta, []
    hosts = {int(r): h.decode() if isinstance(h, bytes) else str(h) for r, h in zip(run.ranks["rank"], run.ranks["host"])}
    world = int(m["world_size"])
    if sorted(hosts) != list(range(world)):
        out.append(f"/provenance/ranks holds ranks {sorted(hosts)}, not 0..{world - 1}")
    for r, h in sorted(hosts.items()):
        launched = f"node{(r // per_node if map_by == 'slot' else r % nodes) + 1}"
        if h != launched:
            out.append(f"rank {r} recorded on host {h!r}, launched on {launched}")
    if int(m["nodes"]) != nodes or int(m["ranks_per_node"]) != per_node:
        out.append(f"nodes = {m['nodes']}, ranks_per_node = {m['ranks_per_node']}: ran on {nodes} nodes of {per_node}")
    groups = []
    if m.get("sharding") == "hybrid" and int(m["shard_size"]) * int(m["tp_size"]) <= per_node:
        groups.append(("hybrid shard group", "dp_shard"))
    if int(m["tp_size"]) > 1:
        groups.append(("tensor-parallel group", "tp"))
    for what, axis in groups:
        for r in range(world):
            members = run.group(r, axis)
            on = sorted({hosts.get(q, "?") for q in members})
            if len(on) > 1 and r == min(members):
                out.append(f"{what} of ranks {members} spans {', '.join(on)}")
    return out


def main():
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    p.add_argument("--nodes", type=int, required=True)
    p.add_argument("--ranks-per-node", type=int, required=True)
    p.add_argument("--map-by", choices=("slot", "node"), default="slot")
    p.add_argument("files", nargs="+")
    a = p.parse_args()
    bad = 0
    for path in a.files:
        for line in problems(path, a.nodes, a.ranks_per_node, a.map_by):
            print(f"{path}: {line}")
            bad += 1
    if not bad:
        print(f"check_nodes: {len(a.files)} file(s): hosts, node count and groups as launched")
    return 1 if bad else 0


if __name__ == "__main__":
    sys.exit(main())
