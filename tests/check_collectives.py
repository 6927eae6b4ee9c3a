#!/usr/bin/python3
"""Checks a collective_perf result against the nccl-tests definitions, recomputed here
from the raw samples: algbw = size/time, busbw = algbw × factor (factors written out
independently of the C++), the cross-rank time (-a), percentiles, stragglers, sample
counts, topology and provenance. Usage: check_collectives.py --ranks N FILE...
"""
import argparse
import os
import sys

import h5py
import numpy as np

sys.path.insert(0, os.path.join(os.path.dirname(os.path.dirname(os.path.abspath(__file__))), "analysis"))
from shardbench_h5 import attr, names as names_of  # noqa: E402  (the files' attributes, decoded once)


def factor(op, n, g):
    r = n // g
    return {"all-reduce": 2 * (n - 1) / n, "all-gather": (n - 1) / n, "reduce-scatter": (n - 1) / n,
            "all-to-all": (n - 1) / n, "broadcast": 1.0, "reduce": 1.0, "send-recv": 1.0,
            "hybrid": (g - 1) / g + 2 * (r - 1) / (r * g)}[op]


def check(path, ranks):
    errors = []
    expect = lambda cond, msg: cond or errors.append(msg)  # noqa: E731
    with h5py.File(path, "r") as f:
        for k in ("schema_version", "program", "ops", "dtype", "redop", "iters", "warmup", "world_size",
                  "ranks_per_node", "nodes", "shard_size", "average", "status", "avg_busbw", "start_time",
                  "end_time", "min_bytes", "max_bytes", "step_factor", "blocking", "check", "backend", "collectives",
                  "agg_iters", "run_cycles", "barrier"):
            expect(k in f.attrs, f"attribute {k} missing")
        for k in ("command_line", "shardbench_version", "mpi_library", "hdf5_version", "compiler"):
            expect(k in f["provenance"].attrs, f"provenance {k} missing")
        n, g, iters = attr(f, "world_size"), attr(f, "shard_size"), attr(f, "iters")
        expect(n == ranks, f"world_size {n} != {ranks}")
        hosts = f["provenance/ranks"][()]
        expect(len(hosts) == n and all(len(h) > 0 for h in hosts["host"]), "provenance/ranks: one host per rank")
        names = names_of(f["results"])
        res, smp = f["results"][()], f["samples"][()]
        expect(attr(f, "collectives") in ("blocking", "nonblocking"), "collectives attribute")
        dtypes = names_of(f["results"], "dtype_names")
        sizes = {"float": 4, "double": 8, "int32": 4, "int64": 8, "uint8": 1, "bfloat16": 2, "half": 2}
        expect(set(dtypes[r["dtype"]] for r in res) == set(attr(f, "dtype").split(",")), "dtype attribute vs rows")
        mode = attr(f, "average")
        expect(len(res) > 0, "no results")
        for r in res:
            op = names[r["op"]]
            dsize = sizes[dtypes[r["dtype"]]]
            key = ("op", "in_place", "size", "dtype", "redop", "root", "cycle")
            sel = smp[np.logical_and.reduce([smp[k] == r[k] for k in key])]
            expect(len(sel) == n * iters, f"{op} {r['size']}: {len(sel)} samples, expected {n}x{iters}")
            per_rank = np.array([sel["time"][sel["rank"] == q].mean() for q in range(n)])
            per_iter = np.array([sel["time"][sel["iteration"] == i].max() for i in range(iters)])
            t = {"rank0": per_rank[0], "avg": per_rank.mean(), "min": per_rank.min(), "max": per_rank.max()}[mode]
            close = lambda a, b: abs(a - b) <= 1e-9 * max(abs(a), abs(b), 1e-30)  # noqa: E731
            expect(close(r["time"], t), f"{op} {r['size']}: time {r['time']} != {mode} of samples {t}")
            expect(r["count"] * dsize == r["size"], f"{op}: count × type size != size")
            algbw = r["size"] / r["time"] / 1e9
            expect(close(r["algbw"], algbw), f"{op} {r['size']}: algbw {r['algbw']} != size/time {algbw}")
            expect(close(r["busbw"], algbw * factor(op, n, g)),
                   f"{op} {r['size']}: busbw {r['busbw']} != algbw x {factor(op, n, g):.4f}")
            expect(close(r["p50"], np.percentile(per_iter, 50)), f"{op} {r['size']}: p50")
            expect(close(r["p99"], np.percentile(per_iter, 99)), f"{op} {r['size']}: p99")
            expect(r["slowest_rank"] == int(per_rank.argmax()), f"{op} {r['size']}: slowest rank")
            expect(close(r["rank_max"], per_rank.max()) and close(r["rank_min"], per_rank.min()), f"{op}: rank min/max")
        expect(abs(attr(f, "avg_busbw") - res["busbw"].mean()) <= 1e-9 * res["busbw"].mean(), "avg_busbw != mean busbw")
        expect(attr(f, "status") == ("ok" if res["wrong"].sum() == 0 else "failed"), "status vs #wrong")
    print(("ok   " if not errors else "FAIL ") + path + "".join("\n     " + e for e in errors[:10]))
    return not errors


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("files", nargs="+")
    ap.add_argument("--ranks", type=int, required=True)
    a = ap.parse_args()
    ok = all([check(p, a.ranks) for p in a.files])
    return 0 if ok else 1


if __name__ == "__main__":
    sys.exit(main())
