#!/usr/bin/python3
"""End-to-end checks of shardbench result files, from Python (h5py + pandas).

    tests/check_trace.py --ranks 4 --steps 3 FILE...        completed runs
    tests/check_trace.py --ranks 4 --oom FILE...            out-of-memory runs

Checks: every field documented in docs/trace-format.md is present (as its `required`
column says), one row per rank and step, events ordered and non-overlapping within a lane,
memory peaks equal to the maxima of the memory trace and to the steps' peaks, the bytes
each collective sent, the schedules (FSDP1 waits for reduce-scatters only at the end of
backward, hybrid's all-reduce follows its reduce-scatter, every unit reduced once, DDP's
buckets), the pipelines (each rank's sends and receives of the peers and bytes of the cut's
tensors, every send paired with its receive, each stage's actions in its schedule's order),
and the out-of-memory case recorded with its status and plan. Prints one line per file;
exit 1 on any failure.
"""
import argparse
import os
import re
import sys

import h5py
import numpy as np

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, os.path.join(HERE, "..", "analysis"))
from shardbench_h5 import CATEGORIES, COPY_LANES, HOST_LANE, load  # noqa: E402

COPY_LANES_BY_NAME = {name: lane for lane, name in COPY_LANES.items()}


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
    if run.meta.get("schema_version", 0) >= 5:
        check_host_memory(c, run, ranks)
    if run.meta.get("schema_version", 0) >= 4:  # the events' unit codes, named
        c.expect(run.unit_names == unit_names(run.meta["layers"]), f"/events unit_names {run.unit_names}")
    check_bytes(c, run)
    if run.meta.get("pp_size", 1) > 1:
        check_pipeline(c, run)
    check_schedule(c, run)


def check_host_memory(c, run, ranks):
    """The host ledger (CPU offload) as the device's: one peak row per rank equal to the
    maxima of /host_memory, the max over ranks the result's and each rank's its stage's plan;
    the offload lanes hold copies (copy lanes) and host updates and their waits (host lane)."""
    hm, hp = run.host_memory, run.host_peaks
    c.expect(len(hp) == ranks, "/host_memory_peaks: one row per rank expected")
    for rank in range(ranks):
        mr, pr = hm[hm["rank"] == rank], hp[hp["rank"] == rank]
        if len(pr) != 1:
            continue
        pr = pr.iloc[0]
        for cat in CATEGORIES + ["total"]:
            got = int(mr[cat].max()) if len(mr) else 0
            c.expect(got == int(pr[cat]), f"rank {rank}: host peak {cat} {pr[cat]} != max of /host_memory {got}")
    c.expect(int(hp["total"].max()) == run.meta["max_host_peak_memory_bytes"], "max_host_peak_memory_bytes != max of host peaks")
    c.expect(run.meta["plan_host_peak_memory_bytes"] == run.plan["host_peak_total"], "plan host peak attrs disagree")
    stage_peak = plan_list(run, "stage_host_peak_total", run.plan["host_peak_total"])
    for _, pr in hp.iterrows():
        c.expect(int(pr["total"]) == int(stage_peak[stage_of(run, int(pr["rank"]))]),
                 f"rank {int(pr['rank'])}: measured host peak {int(pr['total'])} != its stage's plan")
    c.expect(bool(run.plan["host_fits"]) and run.plan["host_peak_total"] <= run.plan["host_limit"], "host plan does not fit")
    e = run.events
    copies, host = e[e["lane"].isin(list(COPY_LANES))], e[e["lane"] == HOST_LANE]
    c.expect(bool((copies["op_name"] == "copy").all()), "a copy lane holds something other than copies")
    c.expect(bool(host["op_name"].isin(["optimizer", "wait"]).all()), "the host lane holds something other than "
             "host updates and their waits")


def plan_list(run, key, default):
    """A /plan attribute that lists one value per pipeline stage ([default] when absent)."""
    v = run.plan.get(key)
    return [float(x) for x in str(v).split(",")] if v not in (None, "") else [default]


def stage_of(run, rank):
    """The rank's pipeline stage, from /mesh (0 without it)."""
    m = run.mesh
    return int(m[m["rank"] == rank]["pp"].iloc[0]) if len(m) and "pp" in m else 0


def held_units(m, first, last):
    """The units of model pieces [first, last): piece k's own unit k (0 the embedding,
    encoder blocks 1..L, L+1 the bridge, decoder blocks L+2..2L+1, 2L+2 the head), and the
    embedding where the bridge (its decoder tokens) or a tied head (its LM head) runs."""
    L, held = m["layers"], set(range(first, last))
    if first <= L + 1 < last or (int(m.get("tie_embeddings", 1)) and last == 2 * L + 3):
        held.add(0)
    return held


def unit_names(layers):
    """The units' names in order (model_units in src/model/spec.cpp)."""
    return (["embedding"] + [f"encoder.{l}" for l in range(layers)] + ["bridge"] +
            [f"decoder.{l}" for l in range(layers)] + ["head"])


def cut_messages(m, k):
    """The tensors that cross the pipeline cut before piece k, per micro-batch, in the
    order they are sent: [(name, bytes forward, bytes of the gradient sent back)]. The hidden
    state (batch / M x seq x d_model); after the bridge, before a decoder block, the encoder
    output (batch / M x encoder seq x d_model); inside a stack, its position-bias table
    (num_buckets x heads / tp; its gradient the table's size too: a stage folds its blocks'
    d(bias) into the table's gradient before the cut). Every tensor in the run's dtype."""
    es, L, M = DTYPE_BYTES[m["dtype"]], m["layers"], m.get("micro_batches", 1)
    b, d = m["batch_per_rank"] // M, m["d_model"]
    te, td, h = m["enc_seq_len"], m["dec_seq_len"], m["heads"] // m.get("tp_size", 1)
    table = m["num_buckets"] * h
    dbias = lambda t: table  # noqa: E731  (either attention path: the table's gradient)
    if k <= L + 1:
        l, out = k - 1, [("encoder hidden state", b * te * d, b * te * d)]
        if 1 <= l < L:
            out.append(("encoder position bias", table, dbias(te)))
    else:
        l, out = k - L - 2, [("decoder hidden state", b * td * d, b * td * d)]
        if l < L:
            out.append(("encoder output", b * te * d, b * te * d))
        if 1 <= l < L:
            out.append(("decoder position bias", table, dbias(td)))
    return [(n, f * es, g * es) for n, f, g in out]


def cut_tensors(L, k):
    """What crosses the pipeline cut before piece k: the hidden state; after the bridge,
    before a decoder block, the encoder output; inside a stack, its position-bias table."""
    if k <= L + 1:
        return 1 + (1 <= k - 1 < L)
    l = k - L - 2
    return 1 + (l < L) + (1 <= l < L)


def mesh_rank(run):
    """{(pp, dp_replicate, dp_shard, tp): rank} and {rank: those coordinates}, from /mesh."""
    coords = {int(r["rank"]): tuple(int(r[a]) for a in ("pp", "dp_replicate", "dp_shard", "tp"))
              for _, r in run.mesh.iterrows()}
    return {v: k for k, v in coords.items()}, coords


def issue_order(g):
    """Events in the order they were issued: by start, the request id breaking ties."""
    return g.sort_values(["start", "request"], kind="stable")


def expected_transfers(run, rank):
    """{(op, phase): [(peer, bytes)]}: what a rank sends and receives in one step, in issue
    order: for each micro-batch, the tensors of the cut after its stage to the next stage's
    rank (forward) and their gradients from it (backward); those of the cut before its stage
    from the previous stage's rank (forward) and their gradients to it (backward). The peer
    is the rank of the neighbouring stage with the same data- and tensor-parallel
    coordinates."""
    m = run.meta
    first = [int(x) for x in plan_list(run, "stage_first", 0)]
    S, M = m["pp_size"], m["micro_batches"]
    by_coords, coords = mesh_rank(run)
    s, rest = coords[rank][0], coords[rank][1:]
    want = {(op, ph): [] for op in ("send", "recv") for ph in ("forward", "backward")}
    if s + 1 < S:
        nxt, cut = by_coords[(s + 1,) + rest], cut_messages(m, first[s + 1])
        want[("send", "forward")] = [(nxt, f) for _ in range(M) for _, f, _ in cut]
        want[("recv", "backward")] = [(nxt, g) for _ in range(M) for _, _, g in cut]
    if s > 0:
        prv, cut = by_coords[(s - 1,) + rest], cut_messages(m, first[s])
        want[("recv", "forward")] = [(prv, f) for _ in range(M) for _, f, _ in cut]
        want[("send", "backward")] = [(prv, g) for _ in range(M) for _, _, g in cut]
    return want


def check_transfers(c, run):
    """Every rank's sends and receives of every step, in issue order, against
    expected_transfers: the peer and the bytes of each message, forward and backward."""
    e = run.events
    p2p = e[e["op_name"].isin(["send", "recv"]) & (e["step"] > 0)]
    for rank in sorted(set(run.mesh["rank"])):
        want = expected_transfers(run, int(rank))
        mine = p2p[p2p["rank"] == rank]
        for step in sorted(set(run.steps["step"])):
            g = mine[mine["step"] == step]
            for (op, phase), w in want.items():
                x = issue_order(g[(g["op_name"] == op) & (g["phase_name"] == phase)])
                got = list(zip(x["peer"].astype(int), x["bytes"].astype(int)))
                if got != w:
                    c.expect(False, f"rank {rank} step {step}: {phase} {op}s (peer, bytes) {got[:6]}"
                                    f"{' ...' if len(got) > 6 else ''} ({len(got)}), expected {w[:6]}"
                                    f"{' ...' if len(w) > 6 else ''} ({len(w)})")
            other = g[~g["phase_name"].isin(["forward", "backward"])]
            c.expect(len(other) == 0,
                     f"rank {rank} step {step}: {len(other)} sends or receives outside forward and backward")


def check_pairs(c, run):
    """Every send pairs with one receive: per step, the k-th send of rank a to rank b (in issue
    order) with the k-th receive of rank b from rank a, of the same bytes, and the receive
    completes after the send started. Each rank's times are from its own origin (read after a
    barrier), so two ranks' clocks differ by an unknown offset o_b - o_a: the check asks that
    one offset fits every pair of the two ranks, both directions, over all steps -
    max(send.start - recv.end) over a -> b <= min(recv.end - send.start) over b -> a. Returns
    {(a, b): (lo, hi)}: the offsets that fit."""
    e = run.events
    sends = e[e["op_name"] == "send"]
    recvs = e[e["op_name"] == "recv"]
    lag = {}  # (a, b): [send.start - recv.end] of messages a -> b
    for (a, b), g in sends.groupby(["rank", "peer"]):
        a, b = int(a), int(b)
        r = recvs[(recvs["rank"] == b) & (recvs["peer"] == a)]
        for step in sorted(set(g["step"]) | set(r["step"])):
            x, y = issue_order(g[g["step"] == step]), issue_order(r[r["step"] == step])
            if len(x) != len(y):
                c.expect(False, f"step {step}: {len(x)} sends {a} -> {b}, {len(y)} receives on {b} from {a}")
                continue
            sent, got = x["bytes"].to_numpy(), y["bytes"].to_numpy()
            bad = np.flatnonzero(sent != got)
            c.expect(len(bad) == 0, f"step {step}: send {a} -> {b} #{bad[0] if len(bad) else 0} of "
                                    f"{sent[bad[:1]]} B received as {got[bad[:1]]} B")
            lag.setdefault((a, b), []).extend(x["start"].to_numpy() - y["end"].to_numpy())
    for (b, a), r in recvs.groupby(["rank", "peer"]):  # receives without any send
        if (int(a), int(b)) not in lag and not len(sends[(sends["rank"] == a) & (sends["peer"] == b)]):
            c.expect(False, f"{len(r)} receives on {int(b)} from {int(a)}, which sends it nothing")
    fits = {}
    for (a, b) in sorted(lag):
        if a > b and (b, a) in lag:
            continue  # the pair's offset was fitted from (b, a)
        lo = max(lag[(a, b)])  # o_b - o_a >= send_a.start - recv_b.end
        hi = -max(lag[(b, a)]) if (b, a) in lag else np.inf  # o_b - o_a <= recv_a.end - send_b.start
        fits[(a, b)] = (lo, hi)
        c.expect(lo <= hi, f"ranks {a} and {b}: a receive completes before its send starts (no clock offset "
                           f"fits: {a} -> {b} needs >= {lo * 1e6:.1f} us, {b} -> {a} <= {hi * 1e6:.1f} us)")
    return fits


def pipeline_actions(schedule, S, s, M):
    """The actions of stage s, as src/strategy/pipeline.cpp's schedules: 'F' a micro-batch's
    forward, 'B' its backward. GPipe: M forwards, M backwards; 1F1B: min(S - s - 1, M)
    forwards, then one forward and one backward until the forwards are done, then the
    remaining backwards."""
    if schedule == "gpipe":
        return "F" * M + "B" * M
    warmup = min(S - s - 1, M)
    return "F" * warmup + "FB" * (M - warmup) + "B" * warmup


def stage_actions(g, M):
    """A rank's actions in one step, read from its compute lane: the forward and backward
    GEMMs in order of start, each run of forward (backward) GEMMs a whole number of
    micro-batches' forwards (backwards), every micro-batch issuing the same count. None when
    the counts do not divide."""
    gemm = g[(g["op_name"] == "gemm") & (g["lane"] == 0) & g["phase_name"].isin(["forward", "backward"])]
    phases = list(gemm.sort_values("start", kind="stable")["phase_name"])
    per = {p: phases.count(p) // M for p in ("forward", "backward")}
    if any(phases.count(p) != n * M or n == 0 for p, n in per.items()):
        return None
    out, i = "", 0
    while i < len(phases):
        j = i
        while j < len(phases) and phases[j] == phases[i]:
            j += 1
        if (j - i) % per[phases[i]]:
            return None
        out += ("F" if phases[i] == "forward" else "B") * ((j - i) // per[phases[i]])
        i = j
    return out


def check_order(c, run):
    """Each stage's forwards and backwards of every step in its schedule's order. Returns
    {stage: actions} of each stage's first rank in its first step."""
    m, e = run.meta, run.events
    S, M, sched = m["pp_size"], m["micro_batches"], m["pp_schedule"]
    _, coords = mesh_rank(run)
    seen = {}
    for (rank, step), g in e[e["step"] > 0].groupby(["rank", "step"]):
        s = coords[int(rank)][0]
        got, want = stage_actions(g, M), pipeline_actions(sched, S, s, M)
        c.expect(got == want, f"rank {rank} step {step} (stage {s}): actions {got}, {sched} runs {want}")
        seen.setdefault(s, got)
    return dict(sorted(seen.items()))


def check_pipeline(c, run):
    """Every send names its neighbour stage; per step, each cut carries its tensors forward
    and their gradients back for each micro-batch: 2 M (S - 1) sends, plus the encoder
    output's and the position-bias tables' where the split needs them; each rank's messages
    of the peers and bytes the cut's tensors make (check_transfers); every send paired with
    its receive (check_pairs); each stage's actions in the schedule's order (check_order)."""
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
    # Each stage holds the units its pieces use: the stages' parameters add up to the model's
    # plus one embedding (a tensor-parallel rank's rows) per further stage that holds it.
    holders = [s for s in range(S) if 0 in held_units(m, first[s], first[s + 1])]
    embedding = m["vocab"] * m["d_model"] // m.get("tp_size", 1)
    stage_params = [int(x) for x in plan_list(run, "stage_params", 0)]
    c.expect(sum(stage_params) == m.get("param_count_per_rank", m["param_count"]) + (len(holders) - 1) * embedding,
             f"stages' parameters {stage_params}: not the model's plus {len(holders) - 1} embedding copies")
    check_transfers(c, run)
    check_pairs(c, run)
    check_order(c, run)


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
        if m["strategy"] == "fsdp" and m["sharding"] == "optimizer-state":
            # ZeRO-1: no gathers in forward or backward; after the update each held unit
            # all-gathered once (over a shard group of more than one rank)
            ag = g[g["op_name"] == "all-gather"]
            want = sorted(held) if m["shard_size"] > 1 else []
            c.expect(sorted(ag["unit"]) == want and bool((ag["phase_name"] == "optimizer").all()),
                     f"{at}: ZeRO-1 all-gathers are not each unit once, after the update")
        offload = m.get("cpu_offload", "none")
        if isinstance(offload, bytes):
            offload = offload.decode()
        if offload != "none":
            # CPU offload: each held unit's gradient shard downloaded once and updated once on
            # the host lane; uploads: each all-gather's shard (params) or each unit's update
            # (optimizer); no optimizer event left on the compute lane
            full = run.events[(run.events["rank"] == rank) & (run.events["step"] == step)]
            down = full[(full["lane"] == COPY_LANES_BY_NAME["device-to-host"]) & (full["op_name"] == "copy")]
            up = full[(full["lane"] == COPY_LANES_BY_NAME["host-to-device"]) & (full["op_name"] == "copy")]
            upd = full[(full["lane"] == HOST_LANE) & (full["op_name"] == "optimizer")]
            c.expect(sorted(down["unit"]) == sorted(held), f"{at}: offload: gradient downloads are not each unit once")
            c.expect(sorted(upd["unit"]) == sorted(held), f"{at}: offload: host updates are not each unit once")
            c.expect(not ((full["lane"] == 0) & (full["op_name"] == "optimizer")).any(),
                     f"{at}: offload: an optimizer update on the compute lane")
            c.expect(bool((up["bytes"] > 0).all() and (down["bytes"] > 0).all()), f"{at}: offload: an empty copy")
            gathers = full[full["op_name"] == "all-gather"]
            want_up = len(gathers) if offload == "params" else len(held)
            if offload != "params" or m["shard_size"] > 1:  # one rank: the uploads are the gathers
                c.expect(len(up) == want_up, f"{at}: offload {offload}: {len(up)} uploads, expected {want_up}")
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
    d_model elements; per decoder block 3 and 3 (with cross-attention); the vocabulary-parallel
    embeddings (encoder: the embedding's piece; decoder: the bridge's; forward), the parallel
    cross-entropy's row max and sums (fp32) and the head's input gradient (the head's), the
    encoder output's summed cross-attention gradient (the bridge's, backward). Each is recorded
    under the unit of the piece running (piece k's unit is k). Activation checkpointing repeats each block's forward
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
            add(k, "forward", [nd * d * es])
            add(k, "backward", [ne * d * es])
        elif k <= 2 * L + 1:
            add(k, "forward", [nd * d * es] * 3)
            add(k, "backward", [nd * d * es] * 3 * (2 if ckpt else 1))
        else:
            add(k, "forward", [nd * 4, 2 * nd * 4])
            add(k, "backward", [nd * d * es])
    return {k: sorted(v) for k, v in want.items()}


def check_tensor_parallel(c, m, g, at, stages):
    """The tensor-parallel all-reduces of one rank's step, by unit and phase, against the
    formula for the pieces it runs; each over the rank's tensor-parallel group."""
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
    short = run.plan["peak_total"] > run.plan["limit"] or \
        run.plan.get("host_peak_total", 0) > run.plan.get("host_limit", run.plan.get("host_peak_total", 0))
    c.expect(run.plan["fits"] == 0 and short, "plan says it fits")
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
