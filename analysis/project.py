#!/usr/bin/python3
"""Projection of a training step to scales not run: step time, TFLOPS per GPU and peak
memory for each strategy and GPU count, from a cluster description, calibrated by
measurements.

    analysis/project.py --cluster runs/clusters/a100-80gb.toml --model t5-11.3b \\
        --strategies ddp,fsdp-full,fsdp-hybrid,fsdp-none --gpus 8,16,32,64,128,256,512 \\
        --batch 8 --seq 512 --activation-checkpointing --out results/projection

How: for every point the program's own memory plan is run (`--plan --world-size N
--schedule-json`, nothing allocated): it gives the memory verdict and the exact sequence of
one step's GEMMs, collectives, waits and optimizer update as the strategy issues them
(prefetches, buckets, reduce-scatters). That schedule is replayed on three lanes — compute,
all-gathers, reductions — with compute times from the GEMM rate and collective times from
NCCL-style ring/tree costs over the cluster's tiers (intra-node and inter-node bandwidth
and latency). Overlap is whatever the schedule allows: a collective starts when issued and
its lane is free; compute waits only where the schedule waits.

Calibration: --calibrate-run RESULT.h5 (a measured training run) sets the GEMM rate, the
non-GEMM fraction and the optimizer bandwidth; --calibrate-collectives RESULT.h5 (a
collective_perf run) fits the latency and bandwidth of the tier it ran on. Each point is
written as an HDF5 result in the programs' schema with `projected = 1`.
"""
import argparse
import json
import math
import os
import subprocess
import sys
import tempfile
import tomllib

import h5py
import numpy as np

HERE = os.path.dirname(os.path.abspath(__file__))
ROOT = os.path.dirname(HERE)
CLUSTER_FIELDS = {"name": str, "gpus_per_node": int, "gpu_memory_gib": (int, float), "gemm_tflops": (int, float),
                  "nongemm_fraction": (int, float), "memory_bandwidth_gbps": (int, float), "dtype": str}
PRECISIONS = ("fp32", "bf16", "fp16")
TIER_FIELDS = {"bandwidth_gbps": (int, float), "latency_us": (int, float)}
OP = {"gemm": 0, "optimizer": 2, "copy": 3, "all-reduce": 4, "all-gather": 5, "reduce-scatter": 6, "wait": 7}


class ProjectionError(Exception):
    pass


def load_cluster(path):
    try:
        with open(path, "rb") as f:
            c = tomllib.load(f)
    except (OSError, tomllib.TOMLDecodeError) as e:
        raise ProjectionError(f"cluster description {path}: {e}")
    for key, typ in CLUSTER_FIELDS.items():
        if key not in c:
            raise ProjectionError(f"cluster description {path}: missing field '{key}'")
        if not isinstance(c[key], typ) or isinstance(c[key], bool):
            raise ProjectionError(f"cluster description {path}: field '{key}' = {c[key]!r} has the wrong type")
    for tier in ("intra", "inter"):
        if tier not in c or not isinstance(c[tier], dict):
            raise ProjectionError(f"cluster description {path}: missing table [{tier}]")
        for key, typ in TIER_FIELDS.items():
            if key not in c[tier]:
                raise ProjectionError(f"cluster description {path}: missing field '{tier}.{key}'")
            if not isinstance(c[tier][key], typ) or c[tier][key] <= 0:
                raise ProjectionError(f"cluster description {path}: '{tier}.{key}' must be a positive number")
    if c["dtype"] not in PRECISIONS:
        raise ProjectionError(f"cluster description {path}: dtype '{c['dtype']}' is not one of {', '.join(PRECISIONS)}")
    known = set(CLUSTER_FIELDS) | {"intra", "inter", "cpu_cores_per_node"}
    unknown = set(c) - known
    if unknown:
        raise ProjectionError(f"cluster description {path}: unknown field(s) {sorted(unknown)}")
    c["calibration"] = []
    return c


def _attr(f, k):
    v = f.attrs[k]
    return v.decode() if isinstance(v, bytes) else (v.item() if hasattr(v, "item") else v)


def calibrate_run(cluster, path):
    """GEMM rate, non-GEMM fraction and optimizer bandwidth from a measured training run."""
    with h5py.File(path, "r") as f:
        if _attr(f, "status") != "ok" or "steps" not in f:
            raise ProjectionError(f"--calibrate-run {path}: not a completed training result")
        s = f["steps"][()]
        s = s[s["warmup"] == 0]
        e = f["events"][()]
        ranks_per_node = _attr(f, "ranks_per_node")
        dtype = _attr(f, "dtype")
    if dtype != cluster["dtype"]:
        raise ProjectionError(f"--calibrate-run {path}: a {dtype} run cannot calibrate the {cluster['dtype']} "
                              "rates of this cluster description (its field 'dtype')")
    rate = s["gemm_flops"].sum() / s["gemm_time"].sum()
    slow = _oversubscription(cluster, ranks_per_node)  # the measured rate already suffered it
    cluster["gemm_tflops"] = rate * slow / 1e12
    cluster["nongemm_fraction"] = float(max(0.0, (s["compute"] - s["gemm_time"]).sum() / s["gemm_time"].sum()))
    opt = e[(e["op"] == OP["optimizer"]) & (e["step"] > 0)]
    if len(opt):
        cluster["memory_bandwidth_gbps"] = opt["bytes"].sum() / (opt["end"] - opt["start"]).sum() * slow / 1e9
    cluster["calibration"].append(f"run {os.path.basename(path)}: GEMM {cluster['gemm_tflops'] * 1e3:.1f} GFLOP/s, "
                                  f"non-GEMM {cluster['nongemm_fraction']:.2f}, optimizer "
                                  f"{cluster['memory_bandwidth_gbps']:.1f} GB/s")


def calibrate_collectives(cluster, path):
    """Fits t = steps·α + factor·S/B (ring) to a collective_perf result's out-of-place
    all-reduce, all-gather and reduce-scatter; sets the tier it ran on."""
    with h5py.File(path, "r") as f:
        if _attr(f, "program") != "collective_perf":
            raise ProjectionError(f"--calibrate-collectives {path}: not a collective_perf result")
        n, nodes = _attr(f, "world_size"), _attr(f, "nodes")
        names = [x.decode() if isinstance(x, bytes) else x for x in f["results"].attrs["op_names"]]
        r = f["results"][()]
    rows, times = [], []
    for row in r[r["in_place"] == 0]:
        op = names[row["op"]]
        if op not in ("all-reduce", "all-gather", "reduce-scatter"):
            continue
        steps, factor = ring_steps_factor(op, n)
        rows.append([steps, factor * row["size"]])
        times.append(row["time"])
    if len(rows) < 2:
        raise ProjectionError(f"--calibrate-collectives {path}: needs all-reduce, all-gather or reduce-scatter sizes")
    x, y = np.array(rows, float), np.array(times)
    coef, *_ = np.linalg.lstsq(x, y, rcond=None)
    alpha, inv_bw = coef
    if alpha < 0 or inv_bw <= 0:  # latency cannot be negative: refit bandwidth alone
        alpha, inv_bw = 0.0, float((x[:, 1] @ y) / (x[:, 1] @ x[:, 1]))
    tier = "intra" if nodes == 1 else "inter"
    cluster[tier] = {"bandwidth_gbps": 1 / inv_bw / 1e9, "latency_us": alpha * 1e6}
    cluster["calibration"].append(f"collectives {os.path.basename(path)} ({n} ranks, {nodes} node(s)): {tier} "
                                  f"{cluster[tier]['bandwidth_gbps']:.2f} GB/s, {cluster[tier]['latency_us']:.1f} us")


def ring_steps_factor(op, n):
    """NCCL ring: all-reduce 2(n−1) steps moving 2(n−1)/n of the buffer; all-gather and
    reduce-scatter n−1 steps moving (n−1)/n of the full (gathered or scattered) buffer."""
    if n <= 1:
        return 0, 0.0
    if op == "all-reduce":
        return 2 * (n - 1), 2 * (n - 1) / n
    return n - 1, (n - 1) / n


def collective_time(cluster, op, size, n, nodes):
    """Time of one collective of `size` bytes over n ranks spanning `nodes` nodes: the
    cheaper of ring and (all-reduce, multi-node) tree, as NCCL's tuner picks."""
    if n <= 1:
        return 0.0
    intra, inter = cluster["intra"], cluster["inter"]
    steps, factor = ring_steps_factor(op, n)
    if nodes <= 1:
        return steps * intra["latency_us"] * 1e-6 + factor * size / (intra["bandwidth_gbps"] * 1e9)
    # Ring across nodes: the inter-node link is the bottleneck; 2(nodes−1) of the steps of an
    # all-reduce (nodes−1 of an all-gather/reduce-scatter) cross nodes.
    cross = (2 if op == "all-reduce" else 1) * (nodes - 1)
    bw = min(intra["bandwidth_gbps"], inter["bandwidth_gbps"]) * 1e9
    ring = cross * inter["latency_us"] * 1e-6 + (steps - cross) * intra["latency_us"] * 1e-6 + factor * size / bw
    if op != "all-reduce":
        return ring
    # Tree: reduce up and broadcast down a binary tree of nodes, log2(nodes) hops each way,
    # the inter-node link carrying the buffer once per direction.
    tree = 2 * math.ceil(math.log2(nodes)) * inter["latency_us"] * 1e-6 + 2 * size / (inter["bandwidth_gbps"] * 1e9)
    tree += 2 * ((n // nodes) - 1) * intra["latency_us"] * 1e-6 + 2 * size / (intra["bandwidth_gbps"] * 1e9)
    return min(ring, tree)


def _oversubscription(cluster, ranks_per_node):
    cores = cluster.get("cpu_cores_per_node")
    return max(1.0, ranks_per_node / cores) if cores else 1.0


def groups(sched, cluster):
    """(size, nodes) of the shard group (all-gather, reduce-scatter) and of the replicate
    group (all-reduce): shard groups are consecutive ranks, replicate groups strided."""
    w, g, per = sched["world_size"], sched["shard_size"], cluster["gpus_per_node"]
    nodes = max(1, math.ceil(w / per))
    shard_nodes = max(1, math.ceil(g / per))
    r = w // g
    rep_nodes = min(r, nodes) if g < per else r
    return (g, shard_nodes), (r, max(1, rep_nodes if nodes > 1 else 1))


def simulate(sched, cluster):
    """Replays one step's schedule on a compute lane and two communication lanes."""
    w = sched["world_size"]
    per_node = min(w, cluster["gpus_per_node"])
    slow = _oversubscription(cluster, per_node)
    rate = cluster["gemm_tflops"] * 1e12 / slow
    mem_bw = cluster["memory_bandwidth_gbps"] * 1e9 / slow
    (g, g_nodes), (r, r_nodes) = groups(sched, cluster)
    t, lanes, done = 0.0, {"gather": 0.0, "reduce": 0.0}, {}
    compute = comm = exposed = 0.0
    for op, _phase, _unit, nbytes, flops, req in sched["ops"]:
        if op == OP["gemm"]:
            d = flops / rate * (1 + cluster["nongemm_fraction"])
            t += d
            compute += d
        elif op in (OP["optimizer"], OP["copy"]):  # Adam; casts between precisions
            d = nbytes / mem_bw
            t += d
            compute += d
        elif op in (OP["all-gather"], OP["reduce-scatter"], OP["all-reduce"]):
            name = {OP["all-gather"]: "all-gather", OP["reduce-scatter"]: "reduce-scatter"}.get(op, "all-reduce")
            n, nodes = (r, r_nodes) if name == "all-reduce" else (g, g_nodes)
            lane = "gather" if name == "all-gather" else "reduce"
            start = max(t, lanes[lane])
            d = collective_time(cluster, name, nbytes, n, nodes)
            lanes[lane] = start + d
            done[req] = start + d
            comm += d
        elif op == OP["wait"]:
            end = done.get(req, t)
            if end > t:
                exposed += end - t
                t = end
    return {"time": t, "compute": compute, "communication": comm, "exposed": exposed}


def plan_schedule(program_args, world, limit_gib, binary_dir):
    with tempfile.TemporaryDirectory() as tmp:
        path = os.path.join(tmp, "s.json")
        cmd = [os.path.join(binary_dir, program_args[0])] + program_args[1:] + [
            "--plan", "--world-size", str(world), "--mem-limit-gib", str(limit_gib), "--schedule-json", path]
        try:
            p = subprocess.run(cmd, capture_output=True, text=True)
        except OSError as e:
            raise ProjectionError(f"cannot run {cmd[0]}: {e} (build it with make)")
        if p.returncode not in (0, 3) or not os.path.exists(path):
            raise ProjectionError(f"plan failed ({' '.join(cmd)}): {p.stderr.strip() or p.stdout[-300:]}")
        with open(path) as f:
            return json.load(f)


def strategy_args(label, cluster, world):
    if label == "ddp":
        return ["ddp_perf"]
    if label.startswith("fsdp-hybrid"):  # fsdp-hybrid: one node per shard group; fsdp-hybridG: G ranks
        g = int(label[11:]) if label[11:] else min(cluster["gpus_per_node"], world)
        return ["fsdp_perf", "--sharding", "hybrid", "--shard-size", str(g)]
    if label.startswith("fsdp-"):
        return ["fsdp_perf", "--sharding", label[5:]]
    raise ProjectionError(f"unknown strategy '{label}' (allowed: ddp, fsdp-full, fsdp-hybrid[G], fsdp-none, "
                          "fsdp-grad-op)")


def write_result(path, sched, sim, cluster, args, label):
    """The programs' HDF5 schema (docs/trace-format.md), flagged projected, without tables."""
    mem = sched["memory"]
    fits = mem["fits"]
    with h5py.File(path + ".tmp", "w") as f:
        a = f.attrs
        a["schema_version"] = 2
        a["projected"] = 1
        a["program"] = "ddp_perf" if label == "ddp" else "fsdp_perf"
        a["strategy"] = "ddp" if label == "ddp" else "fsdp"
        a["label"] = sched["label"]
        a["model"] = sched["model"]
        a["param_count"] = sched["param_count"]
        a["world_size"] = sched["world_size"]
        a["shard_size"] = sched["shard_size"]
        a["ranks_per_node"] = min(sched["world_size"], cluster["gpus_per_node"])
        a["nodes"] = max(1, math.ceil(sched["world_size"] / cluster["gpus_per_node"]))
        a["batch_per_rank"] = sched["batch_per_rank"]
        a["enc_seq_len"] = sched["enc_seq_len"]
        a["dec_seq_len"] = sched["dec_seq_len"]
        a["activation_checkpointing"] = sched["activation_checkpointing"]
        a["dtype"] = sched["dtype"]
        a["reduce_dtype"] = sched["reduce_dtype"]
        a["backend"] = "projection"
        a["cluster"] = cluster["name"]
        a["calibration"] = "; ".join(cluster["calibration"]) or "none (cluster description as written)"
        a["status"] = "ok" if fits else "out-of-memory"
        a["model_flops_per_step"] = sched["model_flops_per_step"]
        a["hardware_flops_per_step"] = sched["hardware_flops_per_step"]
        if fits:
            a["median_step_time_s"] = sim["time"]
            a["median_model_tflops_per_rank"] = sched["model_flops_per_step"] / sim["time"] / 1e12
            a["median_hardware_tflops_per_rank"] = sched["hardware_flops_per_step"] / sim["time"] / 1e12
            a["median_tokens_per_s"] = (sched["batch_per_rank"] * sched["world_size"] *
                                        (sched["enc_seq_len"] + sched["dec_seq_len"]) / sim["time"])
            a["median_exposed_comm_s"] = sim["exposed"]
            a["max_peak_memory_bytes"] = mem["peak_total"]
            a["plan_peak_memory_bytes"] = mem["peak_total"]
        g = f.create_group("plan")
        g.attrs["peak_total"] = mem["peak_total"]
        g.attrs["limit"] = mem["limit"]
        g.attrs["fits"] = int(fits)
        for k, v in mem.items():
            if k not in ("peak_total", "limit", "fits"):
                g.attrs["peak_" + k] = v
        p = f.create_group("provenance")
        p.attrs["command_line"] = " ".join([sys.argv[0]] + sys.argv[1:])
        p.attrs["projection"] = f"analysis/project.py over the {cluster['name']} description"
    os.replace(path + ".tmp", path)


def main(argv=None):
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--cluster", required=True, help="cluster description (TOML), e.g. runs/clusters/a100-80gb.toml")
    ap.add_argument("--model", action="append", required=True, help="preset; repeat for several")
    ap.add_argument("--strategies", default="ddp,fsdp-full,fsdp-hybrid,fsdp-none")
    ap.add_argument("--gpus", default="8,16,32,64,128,256,512")
    ap.add_argument("--batch", default="8", help="per-GPU batch sizes, comma-separated")
    ap.add_argument("--seq", type=int, default=512)
    ap.add_argument("--activation-checkpointing", action="store_true")
    ap.add_argument("--reduce-dtype", choices=PRECISIONS,
                    help="gradient reductions (default: the cluster description's dtype, which the steps compute in)")
    ap.add_argument("--calibrate-run", action="append", default=[])
    ap.add_argument("--calibrate-collectives", action="append", default=[])
    ap.add_argument("--require-calibration", action="store_true", help="refuse to project without calibration data")
    ap.add_argument("--bin", default=os.path.join(ROOT, "build", "bin"))
    ap.add_argument("--out", required=True, help="directory for one projected HDF5 result per point")
    a = ap.parse_args(argv)
    try:
        cluster = load_cluster(a.cluster)
        if a.require_calibration and not (a.calibrate_run or a.calibrate_collectives):
            raise ProjectionError("no calibration data: give --calibrate-run and/or --calibrate-collectives")
        for p in a.calibrate_run:
            calibrate_run(cluster, p)
        for p in a.calibrate_collectives:
            calibrate_collectives(cluster, p)
        gpus = [int(x) for x in a.gpus.split(",")]
        batches = [int(x) for x in a.batch.split(",")]
        if any(x <= 0 for x in gpus + batches) or a.seq <= 0:
            raise ProjectionError("--gpus, --batch and --seq must be positive")
    except (ProjectionError, ValueError, OSError, KeyError) as e:
        print(f"project: error: {e}", file=sys.stderr)
        return 2
    os.makedirs(a.out, exist_ok=True)
    print(f"cluster {cluster['name']}: " + ("; ".join(cluster["calibration"]) or "uncalibrated"))
    print(f"{'model':<10} {'strategy':<13} {'GPUs':>5} {'batch':>5} {'step ms':>10} {'TFLOPS/GPU':>11} "
          f"{'exposed ms':>10} {'peak GiB':>9}  status")
    for model in a.model:
        for label in a.strategies.split(","):
            for batch in batches:
                for n in gpus:
                    try:
                        args = strategy_args(label, cluster, n) + [
                            "--model", model, "--batch", str(batch), "--seq-len", str(a.seq)]
                        if a.activation_checkpointing:
                            args.append("--activation-checkpointing")
                        args += ["--dtype", cluster["dtype"], "--reduce-dtype", a.reduce_dtype or cluster["dtype"]]
                        sched = plan_schedule(args, n, cluster["gpu_memory_gib"], a.bin)
                    except ProjectionError as e:
                        print(f"project: error: {e}", file=sys.stderr)
                        return 2
                    sim = simulate(sched, cluster)
                    fits = sched["memory"]["fits"]
                    name = f"{model}-{sched['label']}-g{n}-b{batch}-s{a.seq}.h5"
                    write_result(os.path.join(a.out, name), sched, sim, cluster, a, label)
                    tf = sched["model_flops_per_step"] / sim["time"] / 1e12
                    print(f"{model:<10} {sched['label']:<13} {n:>5} {batch:>5} "
                          f"{sim['time'] * 1e3 if fits else float('nan'):>10.2f} {tf if fits else float('nan'):>11.2f} "
                          f"{sim['exposed'] * 1e3 if fits else float('nan'):>10.2f} "
                          f"{sched['memory']['peak_total'] / 2**30:>9.2f}  {'ok' if fits else 'out-of-memory'}")
    print(f"project: wrote {a.out}/")
    return 0


if __name__ == "__main__":
    sys.exit(main())
