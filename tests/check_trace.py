#!/usr/bin/python3
"""End-to-end checks of shardbench result files, from Python (h5py + pandas).

    tests/check_trace.py --ranks 4 --steps 3 FILE...        completed runs
    tests/check_trace.py --ranks 4 --oom FILE...            out-of-memory runs

Checks: every field documented in docs/trace-format.md is present (as its `required`
column says), one row per rank and step, events ordered and non-overlapping within a lane,
memory peaks equal to the maxima of the memory trace and to the steps' peaks, the bytes
each collective sent, the schedules (FSDP1 waits for reduce-scatters only at the end of
backward, hybrid's all-reduce follows its reduce-scatter, every unit reduced once, DDP's
buckets), and the out-of-memory case recorded with its status and plan. Prints one line per
file; exit 1 on any failure.
"""
import argparse
import os
import re
import sys

import h5py
import numpy as np

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, os.path.join(HERE, "..", "analysis"))
from shardbench_h5 import CATEGORIES, load  # noqa: E402


def documented_fields(doc):
    """{location: [(field, kind, required)]} from the tables of docs/trace-format.md."""
    fields, loc, kind = {}, None, None
    for line in open(doc):
        h = re.match(r"^## `(/[^`]*)` (attributes|dataset)", line)
        if h:
            loc, kind = h.group(1), h.group(2)
            fields.setdefault((loc, kind), [])
            continue
        r = re.match(r"^\| `([^`]+)` \| [^|]+ \| (\w+) \|", line)
        if r and loc:
            fields[(loc, kind)].append((r.group(1), r.group(2)))
    return fields


def expand(name):
    if "<category>" in name:
        return [name.replace("<category>", c) for c in CATEGORIES]
    return [name]


class Checker:
    def __init__(self, path):
        self.path, self.errors = path, []

    def expect(self, cond, msg):
        if not cond:
            self.errors.append(msg)


def check_fields(c, path, fields, active):
    with h5py.File(path, "r") as f:
        for (loc, kind), rows in fields.items():
            if loc not in f:
                c.expect(False, f"{loc} missing")
                continue
            obj = f[loc]
            present = set(obj.attrs.keys()) if kind == "attributes" else set(obj.dtype.names or ())
            for name, required in rows:
                if required not in active or "*" in name:
                    continue
                for n in expand(name):
                    c.expect(n in present, f"{loc}: documented {kind[:-1] if kind == 'attributes' else 'column'} '{n}' missing")
            if kind == "dataset":
                documented = {n for name, _ in rows for n in expand(name)}
                extra = set(obj.dtype.names or ()) - documented
                c.expect(not extra, f"{loc}: undocumented columns {sorted(extra)}")


def check_completed(c, run, ranks, steps):
    s = run.steps
    c.expect(run.meta["world_size"] == ranks, f"world_size {run.meta['world_size']} != {ranks}")
    c.expect(len(s) == ranks * steps, f"/steps has {len(s)} rows, expected {ranks}x{steps}")
    c.expect(not s.duplicated(["rank", "step"]).any(), "duplicate (rank, step) rows")
    c.expect(set(s["rank"]) == set(range(ranks)), "ranks missing in /steps")
    c.expect(set(s["step"]) == set(range(1, steps + 1)), "steps missing in /steps")
    c.expect(int(s["warmup"].sum()) == ranks * run.meta["warmup"], "warm-up flags wrong")
    c.expect((s["time"] > 0).all() and (s["compute"] > 0).all(), "non-positive step or compute time")
    c.expect(len(run.ranks) == ranks and list(run.ranks["rank"]) == list(range(ranks)), "/provenance/ranks rows")
    e = run.events
    c.expect(len(e) > 0, "no events")
    c.expect(set(e["rank"]) == set(range(ranks)), "events missing for some rank")
    c.expect((e["end"] >= e["start"]).all(), "an event ends before it starts")
    for (rank, lane), g in e.groupby(["rank", "lane"]):
        starts, ends = g["start"].to_numpy(), g["end"].to_numpy()
        if lane == 0:  # the compute lane is recorded in order
            c.expect(bool(np.all(np.diff(starts) >= 0)), f"rank {rank} lane 0: events out of order")
        order = np.argsort(starts, kind="stable")
        gaps = starts[order][1:] - ends[order][:-1]
        c.expect(bool(np.all(gaps >= 0)), f"rank {rank} lane {lane}: {int((gaps < 0).sum())} overlapping events")
    gemm = e[e["op_name"] == "gemm"]
    c.expect(len(gemm) > 0 and (gemm["flops"] == 2.0 * gemm["m"] * gemm["n"] * gemm["k"] * gemm["batch"]).all(),
             "GEMM events' FLOPs disagree with their shapes")
    # The GEMM FLOPs of every timed step equal the plan's count for the schedule (of the
    # rank's pipeline stage).
    per_step = gemm[gemm["step"] > 0].groupby(["rank", "step"])["flops"].sum()
    stage_flops = plan_list(run, "stage_counted_gemm_flops", run.plan["counted_gemm_flops"])
    want = np.array([stage_flops[stage_of(run, r)] for r, _ in per_step.index])
    c.expect(np.allclose(per_step.to_numpy(), want, rtol=1e-9), "GEMM FLOPs per step differ from the plan's counted FLOPs")
    m, p = run.memory, run.peaks
    c.expect(len(p) == ranks, "/memory_peaks: one row per rank expected")
    for rank in range(ranks):
        mr, pr = m[m["rank"] == rank], p[p["rank"] == rank].iloc[0]
        for cat in CATEGORIES + ["total"]:
            c.expect(int(mr[cat].max()) == int(pr[cat]), f"rank {rank}: peak {cat} {pr[cat]} != max of /memory {mr[cat].max()}")
        c.expect(int(s[s["rank"] == rank]["peak_memory"].max()) == int(pr["total"]), f"rank {rank}: steps' peak != peak")
        # The device's own figure (CPU: the resident set) holds at least the persistent state.
        persistent = int(pr["parameters"]) + int(pr["optimizer_state"])
        c.expect(bool((s[s["rank"] == rank]["device_used"] >= persistent).all()),
                 f"rank {rank}: device_used below the parameters and optimizer state ({persistent} B)")
        c.expect((mr[CATEGORIES].sum(axis=1) == mr["total"]).all(), f"rank {rank}: memory total is not the sum")
    c.expect(int(p["total"].max()) == run.meta["max_peak_memory_bytes"], "max_peak_memory_bytes != max of peaks")
    c.expect(run.meta["plan_peak_memory_bytes"] == run.plan["peak_total"], "plan peak attrs disagree")
    c.expect(int(p["total"].max()) == run.plan["peak_total"], "measured peak != plan")
    stage_peak = plan_list(run, "stage_peak_total", run.plan["peak_total"])
    for _, pr in p.iterrows():  # each rank's peak equals its pipeline stage's plan
        c.expect(int(pr["total"]) == int(stage_peak[stage_of(run, int(pr["rank"]))]),
                 f"rank {int(pr['rank'])}: measured peak {int(pr['total'])} != its stage's plan")
    check_bytes(c, run)
    if run.meta.get("pp_size", 1) > 1:
        check_pipeline(c, run)
    check_schedule(c, run)


def plan_list(run, key, default):
    """A /plan attribute that lists one value per pipeline stage ([default] when absent)."""
    v = run.plan.get(key)
    return [float(x) for x in str(v).split(",")] if v not in (None, "") else [default]


def stage_of(run, rank):
    """The rank's pipeline stage, from /mesh (0 without it)."""
    m = run.mesh
    return int(m[m["rank"] == rank]["pp"].iloc[0]) if len(m) and "pp" in m else 0


def held_units(m, first, last):
    """The units of model stages [first, last): 0 the root (embedding, bridge, head), encoder
    blocks 1..L, decoder blocks L+1..2L."""
    L, held = m["layers"], set()
    for k in range(first, last):
        held.add(0 if k in (0, L + 1, 2 * L + 2) else k if k <= L else k - 1)
    return held


def cut_tensors(L, k):
    """What crosses the pipeline cut before model stage k: the hidden state; after the bridge,
    before a decoder block, the encoder output; inside a stack, its position-bias table."""
    if k <= L + 1:
        return 1 + (1 <= k - 1 < L)
    l = k - L - 2
    return 1 + (l < L) + (1 <= l < L)


def check_pipeline(c, run):
    """Every send names its neighbour stage; per step, each cut carries its tensors forward
    and their gradients back for each micro-batch: 2 M (S - 1) sends, plus the encoder
    output's and the position-bias tables' where the split needs them."""
    m, e = run.meta, run.events
    first = [int(x) for x in plan_list(run, "stage_first", 0)]
    S, M, L = m["pp_size"], m["micro_batches"], m["layers"]
    sends = e[(e["op_name"] == "send") & (e["step"] > 0)]
    recvs = e[(e["op_name"] == "recv") & (e["step"] > 0)]
    for _, x in sends.iterrows():
        c.expect(abs(stage_of(run, int(x["peer"])) - stage_of(run, int(x["rank"]))) == 1,
                 f"rank {int(x['rank'])}: a send to rank {int(x['peer'])}, not a neighbouring stage")
    per_pipeline = 2 * M * sum(cut_tensors(L, first[s]) for s in range(1, S))
    pipelines = m["world_size"] // S
    for step, g in sends.groupby("step"):
        c.expect(len(g) == per_pipeline * pipelines,
                 f"step {step}: {len(g)} sends, expected {per_pipeline} per pipeline x {pipelines} "
                 f"(2 M (S - 1) = {2 * M * (S - 1)} and the split's encoder output and tables)")
        c.expect(len(recvs[recvs["step"] == step]) == len(g), f"step {step}: receives and sends differ in number")


BUS_FACTOR = {"all-reduce": lambda n: 2 * (n - 1) / n, "all-gather": lambda n: (n - 1) / n,
              "reduce-scatter": lambda n: (n - 1) / n, "send": lambda n: 1.0, "recv": lambda n: 0.0}
DTYPE_BYTES = {"fp32": 4, "bf16": 2, "fp16": 2}


def check_bytes(c, run):
    """Bytes sent per rank: the buffer times nccl-tests' bus factor; the steps' sums."""
    e, s = run.events, run.steps
    coll = e[e["op_name"].isin(list(BUS_FACTOR))]
    for name, f in BUS_FACTOR.items():
        x = coll[coll["op_name"] == name]
        want = np.floor(x["bytes"] * x["ranks"].map(f) + 0.5).astype(np.int64)  # nearest, halves up
        c.expect(bool((x["sent_bytes"].to_numpy() == want.to_numpy()).all()), f"{name}: sent_bytes != bytes x bus factor")
    sums = coll.groupby(["rank", "step"])[["sent_bytes", "bytes"]].sum()
    for _, row in s.iterrows():
        key = (int(row["rank"]), int(row["step"]))
        sent, buf = (sums.loc[key, "sent_bytes"], sums.loc[key, "bytes"]) if key in sums.index else (0, 0)
        c.expect(row["sent_bytes"] == sent and row["comm_bytes"] == buf,
                 f"rank {key[0]} step {key[1]}: steps' bytes differ from the events' sums")


def check_schedule(c, run):
    """The schedules as PyTorch runs them, per rank and timed step."""
    m, e = run.meta, run.events
    tp = m.get("tp_size", 1)
    starts = [int(x) for x in plan_list(run, "stage_first", 0)] if m.get("pp_size", 1) > 1 else [0, 2 * m["layers"] + 3]
    stage_params = plan_list(run, "stage_params", m.get("param_count_per_rank", m["param_count"]))
    for (rank, step), g in e[e["step"] > 0].groupby(["rank", "step"]):
        at = f"rank {rank} step {step}"
        st = stage_of(run, rank)
        held = held_units(m, starts[st], starts[st + 1])
        if tp > 1:
            check_tensor_parallel(c, m, g, at, range(starts[st], starts[st + 1]))
        if "axis_name" in g:  # below: the data-parallel strategy's own collectives
            g = g[~g["axis_name"].isin(["tp", "pp"])]
        bwd_gemm = g[(g["op_name"] == "gemm") & (g["phase_name"] == "backward")]
        if m["strategy"] == "fsdp" and m["shard_size"] > 1:
            rs = g[g["op_name"] == "reduce-scatter"]
            c.expect(sorted(rs["unit"]) == sorted(held), f"{at}: reduce-scatters do not name each unit once")
            ag = g[(g["op_name"] == "all-gather") & (g["phase_name"] == "backward")]
            c.expect(not (ag["unit"].value_counts() > m.get("micro_batches", 1)).any(),
                     f"{at}: a unit gathered more than once per micro-batch in backward")
            if m["fsdp_version"] == 1:  # no compute waits on a reduce-scatter before backward ends
                w = g[(g["op_name"] == "wait") & g["request"].isin(set(rs["request"]))]
                c.expect(bool((w["start"] >= bwd_gemm["end"].max()).all()),
                         f"{at}: FSDP1 compute waited on a reduce-scatter before backward ended")
            if m["replicas"] > 1:  # all-reduce issued as soon as its reduce-scatter completed
                ar = g[g["op_name"] == "all-reduce"].sort_values("start")
                rs_end = dict(zip(rs["unit"], rs["end"]))
                compute = g[g["lane"] == 0]["start"].to_numpy()
                prev = 0.0
                for _, a in ar.iterrows():
                    if a["unit"] not in rs_end:
                        c.expect(False, f"{at}: unit {a['unit']} all-reduced without a reduce-scatter")
                        continue
                    ready = max(rs_end[a["unit"]], prev)
                    c.expect(a["start"] >= rs_end[a["unit"]], f"{at}: unit {a['unit']} all-reduced before its reduce-scatter ended")
                    c.expect(not ((compute > ready) & (compute < a["start"])).any(),
                             f"{at}: unit {a['unit']}'s all-reduce issued after compute went on")
                    prev = a["start"]
        if m["strategy"] == "ddp":  # buckets: the model once, the first closing at 1 MiB
            ar = g[g["op_name"] == "all-reduce"].sort_values("start")
            params = int(stage_params[st])  # the stage's part (a tensor-parallel rank's)
            total = params * DTYPE_BYTES[m["reduce_dtype"]]
            c.expect(int(ar["bytes"].sum()) == total, f"{at}: buckets do not cover the model once")
            first = int(ar["bytes"].iloc[0]) * DTYPE_BYTES[m["dtype"]] // DTYPE_BYTES[m["reduce_dtype"]]
            c.expect(first >= min(1 << 20, params * DTYPE_BYTES[m["dtype"]]),
                     f"{at}: first bucket {first} B, below 1 MiB")


def tensor_parallel_counts(m, stages):
    """{(unit, phase): [bytes of each tensor-parallel all-reduce]} of one step of the model
    stages `stages`, Megatron-LM's conjugate collectives: per encoder block 2 forward
    (attention o, feed-forward wo) and 2 backward (their inputs' gradients) of batch × seq ×
    d_model elements; per decoder block 3 and 3 (with cross-attention); the root's
    vocabulary-parallel embeddings (encoder, decoder: forward), the parallel cross-entropy's
    row max and sums (fp32), the head's input gradient and the encoder output's summed
    cross-attention gradient (backward). Activation checkpointing repeats each block's forward
    ones in backward; each micro-batch has its own."""
    es, L, M = DTYPE_BYTES[m["dtype"]], m["layers"], m.get("micro_batches", 1)
    b = m["batch_per_rank"] // M
    ne, nd = b * m["enc_seq_len"], b * m["dec_seq_len"]
    d, ckpt = m["d_model"], m["activation_checkpointing"]
    want = {}
    add = lambda unit, phase, sizes: want.setdefault((unit, phase), []).extend(sizes * M)  # noqa: E731
    for k in stages:
        if k == 0:
            add(0, "forward", [ne * d * es])
        elif k <= L:
            add(k, "forward", [ne * d * es] * 2)
            add(k, "backward", [ne * d * es] * 2 * (2 if ckpt else 1))
        elif k == L + 1:
            add(0, "forward", [nd * d * es])
            add(0, "backward", [ne * d * es])
        elif k <= 2 * L + 1:
            add(k - 1, "forward", [nd * d * es] * 3)
            add(k - 1, "backward", [nd * d * es] * 3 * (2 if ckpt else 1))
        else:
            add(0, "forward", [nd * 4, 2 * nd * 4])
            add(0, "backward", [nd * d * es])
    return {k: sorted(v) for k, v in want.items()}


def check_tensor_parallel(c, m, g, at, stages):
    """The tensor-parallel all-reduces of one rank's step, by unit and phase, against the
    formula for the model stages it runs; each over the rank's tensor-parallel group."""
    t = g[g["axis_name"] == "tp"]
    c.expect(bool((t["op_name"] == "all-reduce").all()), f"{at}: a tensor-parallel collective other than all-reduce")
    c.expect(bool((t["ranks"] == m["tp_size"]).all()), f"{at}: a tensor-parallel collective not over tp_size ranks")
    got = {k: sorted(int(b) for b in x["bytes"]) for k, x in t.groupby(["unit", "phase_name"], observed=True)}
    want = tensor_parallel_counts(m, stages)
    for key in sorted(set(got) | set(want), key=str):
        c.expect(got.get(key, []) == sorted(want.get(key, [])),
                 f"{at}: unit {key[0]} {key[1]}: tensor-parallel all-reduces {got.get(key, [])}, "
                 f"expected {sorted(want.get(key, []))}")


def check_oom(c, run):
    c.expect(run.meta["status"] == "out-of-memory", f"status {run.meta['status']!r}, expected out-of-memory")
    c.expect(run.plan["fits"] == 0 and run.plan["peak_total"] > run.plan["limit"], "plan says it fits")
    c.expect("DOES NOT FIT" in run.plan["text"], "plan text lacks the verdict")
    c.expect(len(run.steps) == 0 and len(run.events) == 0, "out-of-memory run has steps or events")


def main():
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("files", nargs="+")
    ap.add_argument("--ranks", type=int, required=True)
    ap.add_argument("--steps", type=int, help="warm-up + timed steps of completed runs")
    ap.add_argument("--oom", action="store_true", help="the files are out-of-memory results")
    ap.add_argument("--doc", default=os.path.join(HERE, "..", "docs", "trace-format.md"))
    a = ap.parse_args()
    fields = documented_fields(a.doc)
    assert sum(len(v) for v in fields.values()) > 100, "could not read the documented fields"
    failed = 0
    for path in a.files:
        c = Checker(path)
        run = load(path)
        active = {"always"} | ({"completed"} if not a.oom else {"oom"})
        if "check_result" in run.meta:
            active.add("check")
        check_fields(c, path, fields, active)
        if a.oom:
            check_oom(c, run)
        else:
            c.expect(run.meta["status"] == "ok", f"status {run.meta['status']!r}")
            check_completed(c, run, a.ranks, a.steps)
        print(f"{'ok  ' if not c.errors else 'FAIL'} {path}" + "".join(f"\n     {e}" for e in c.errors[:10]))
        failed += bool(c.errors)
    return 1 if failed else 0


if __name__ == "__main__":
    sys.exit(main())
