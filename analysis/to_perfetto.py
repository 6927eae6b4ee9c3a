#!/usr/bin/python3
"""Convert a shardbench result (HDF5) into a Chrome Trace Event JSON timeline that
Perfetto (ui.perfetto.dev, "Open trace file") and chrome://tracing ("Load") open.

    analysis/to_perfetto.py results/demo/fsdp-full.h5                 # -> results/demo/fsdp-full.json
    analysis/to_perfetto.py run.h5 -o run.json --steps 2:3            # two steps only

Layout: one process per rank, named "rank R" (pid R + 1: Perfetto keeps 0 for the idle
task); in it a "steps" track (one slice per step, warm-up steps named "step N (warm-up)"),
the compute lane, and one thread per communication lane. Each
operation is a slice named "<phase> · <unit> · <operation>" (for example
"backward · decoder 2 · reduce-scatter") with its step, bytes and FLOPs as args, GEMMs
with their shape (m×n×k, batch, transposes), collectives with their algorithm and bus
bandwidth (the bytes each rank sent over the time, as the file records them: nccl-tests'
convention), its mesh axis and the ranks of its group (from the file's /mesh table). The six memory categories are one
stacked counter track per rank (MiB). Times are microseconds from the run's common origin.

A projected result (analysis/project.py) converts the same way when it carries the
replayed step's events; one without events is refused. Operation and phase names are
read from the file. Exit codes: 0 written; 2 bad input (unreadable file, no events,
bad --steps, an output path that cannot be written), nothing written.
"""
import json
import os
import sys
import time

import numpy as np

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import cli  # noqa: E402
from shardbench_h5 import CATEGORIES, lane_name, load  # noqa: E402

# Process and thread ids: Perfetto reserves pid/tid 0 (the idle task) and reads ids as
# unsigned, so rank r is pid r + 1, its "steps" track tid 1 and lane l tid l + 2.
STEPS_TID = 1


def pid_of(rank):
    return rank + 1


def tid_of(lane):
    return lane + 2



def parse_steps(text):
    """'A:B' (inclusive; either end may be left out) or 'N' -> (first, last); None = open."""
    parts = text.split(":")
    try:
        if len(parts) == 1:
            a = b = int(parts[0])
        elif len(parts) == 2:
            a = int(parts[0]) if parts[0] else None
            b = int(parts[1]) if parts[1] else None
        else:
            raise ValueError
    except ValueError:
        raise cli.BadInput(f"--steps '{text}': expected A:B, A:, :B or N (step numbers, 0 = set-up)")
    if (a is not None and a < 0) or (b is not None and b < 0) or (a is not None and b is not None and a > b):
        raise cli.BadInput(f"--steps '{text}': steps are 0 (set-up) … warm-up + timed steps, first ≤ last")
    return a, b


def in_steps(frame, steps):
    a, b = steps
    keep = frame["step"] >= (a if a is not None else 0)
    if b is not None:
        keep &= frame["step"] <= b
    return frame[keep]


COLLECTIVES = {"all-reduce", "all-gather", "reduce-scatter", "broadcast", "reduce", "all-to-all", "send-recv", "send",
               "recv"}


def us(seconds):
    """Seconds (a number or a column) to microseconds rounded to the nanosecond: rounding
    is monotone, so slices that touch still touch and none starts before its predecessor."""
    return np.round(np.asarray(seconds, dtype=np.float64) * 1e6, 3)


def metadata_events(run, ranks, lanes_of, projected):
    events = []
    hosts = {}
    if len(run.ranks):
        hosts = {int(r): f"{h}, {d}" for r, h, d in zip(run.ranks["rank"], run.ranks["host"], run.ranks["device"])}
    suffix = f" (projected: {run.meta.get('cluster', '?')})" if projected else ""
    for rank in ranks:
        where = f" · {hosts[rank]}" if rank in hosts else ""
        pid = pid_of(rank)
        events.append({"ph": "M", "name": "process_name", "pid": pid,
                       "args": {"name": f"rank {rank}{where}{suffix}"}})
        events.append({"ph": "M", "name": "process_sort_index", "pid": pid, "args": {"sort_index": rank}})
        events.append({"ph": "M", "name": "thread_name", "pid": pid, "tid": STEPS_TID, "args": {"name": "steps"}})
        events.append({"ph": "M", "name": "thread_sort_index", "pid": pid, "tid": STEPS_TID,
                       "args": {"sort_index": STEPS_TID}})
        for lane in lanes_of[rank]:
            events.append({"ph": "M", "name": "thread_name", "pid": pid, "tid": tid_of(lane),
                           "args": {"name": lane_name(lane)}})
            events.append({"ph": "M", "name": "thread_sort_index", "pid": pid, "tid": tid_of(lane),
                           "args": {"sort_index": tid_of(lane)}})
    return events


def operation_events(run, e):
    """One complete ('X') slice per operation, sorted by start within each rank and lane."""
    e = e.sort_values(["rank", "lane", "start"], kind="stable")
    # What the file says of each collective (schema 2: its ranks and the bytes this rank sent,
    # nccl-tests' bus factor applied by the program; schema 3: its mesh axis, whose group the
    # /mesh table gives). Older files show the bytes alone.
    ranks_col = e["ranks"].tolist() if "ranks" in e else [None] * len(e)
    sent_col = e["sent_bytes"].tolist() if "sent_bytes" in e else [None] * len(e)
    axis_col = e["axis_name"].tolist() if "axis_name" in e else [""] * len(e)
    peer_col = e["peer"].tolist() if "peer" in e else [-1] * len(e)
    groups = {}
    out = []
    units = {}
    cols = [e[c].tolist() for c in ("rank", "lane", "step", "unit", "start", "end", "bytes", "flops", "m", "n", "k",
                                    "batch", "trans")]
    ts_col, end_col = us(e["start"]), us(e["end"])
    cols += [ts_col.tolist(), np.round(end_col - ts_col, 3).tolist()]
    ops = e["op_name"].astype(str).tolist()
    phases = e["phase_name"].astype(str).tolist()
    for (rank, lane, step, unit, start, end, nbytes, flops, m, n, k, batch, trans, ts, dur), op, phase, nranks, \
            sent, axis, peer in zip(zip(*cols), ops, phases, ranks_col, sent_col, axis_col, peer_col):
        uname = units.get(unit) or units.setdefault(unit, run.unit_name(unit))
        args = {"step": step, "phase": phase, "unit": uname, "operation": op, "bytes": nbytes}
        if op == "gemm":
            args["shape"] = f"{m}×{n}×{k}"
            args["batch"] = batch
            args["transposed"] = ("A" if trans & 1 else "") + ("B" if trans & 2 else "") or "none"
            args["flops"] = flops
        elif op in COLLECTIVES and end > start:
            args["algbw_GBps"] = round(nbytes / (end - start) / 1e9, 4)
            if nranks is not None:
                args["ranks"] = int(nranks)
            if sent is not None:
                args["busbw_GBps"] = round(sent / (end - start) / 1e9, 4)
            if peer >= 0:  # a pipeline stage's send or receive: the other rank
                args["peer"] = int(peer)
            if axis:
                args["axis"] = axis
                key = (rank, axis)
                if key not in groups:
                    groups[key] = run.group(rank, axis)
                if groups[key] is not None:
                    args["group"] = groups[key]
        out.append({"ph": "X", "name": f"{phase} · {uname} · {op}", "cat": op, "pid": pid_of(rank),
                    "tid": tid_of(lane), "ts": ts, "dur": dur, "args": args})
    return out


def step_events(run, e, steps_table):
    """One slice per rank and step on the 'steps' track, from its first start to its last end."""
    info = {}
    if len(steps_table):
        for row in steps_table.itertuples(index=False):
            info[(int(row.rank), int(row.step))] = row
    out = []
    spans = e.groupby(["rank", "step"])[["start", "end"]].agg({"start": "min", "end": "max"})
    for (rank, step), (start, end) in zip(spans.index, spans.itertuples(index=False, name=None)):
        row = info.get((rank, step))
        warm = bool(row.warmup) if row is not None else False
        name = "set-up" if step == 0 else f"step {step}" + (" (warm-up)" if warm else "")
        args = {"step": int(step), "warm-up": warm}
        if row is not None:
            args.update({"time_ms": round(row.time * 1e3, 4), "loss": row.loss,
                         "exposed_comm_ms": round(row.exposed_comm * 1e3, 4),
                         "model_tflops": row.model_tflops, "loss_scale": row.loss_scale,
                         "skipped": int(row.skipped)})
        ts = float(us(start))
        out.append({"ph": "X", "name": name, "cat": "warm-up" if warm else "step", "pid": pid_of(int(rank)),
                    "tid": STEPS_TID, "ts": ts, "dur": round(float(us(end)) - ts, 3), "args": args})
    return out


def memory_events(mem):
    """The categories as one stacked counter per rank, in MiB."""
    if not len(mem):
        return []
    mem = mem.sort_values(["rank", "time"], kind="stable")
    cols = [np.round(mem[c].to_numpy() / 2**20, 4).tolist() for c in CATEGORIES]
    return [{"ph": "C", "name": "memory (MiB)", "pid": pid_of(rank), "ts": t, "args": dict(zip(CATEGORIES, vals))}
            for rank, t, *vals in zip(mem["rank"].tolist(), us(mem["time"]).tolist(), *cols)]


def convert(path, steps=(None, None)):
    """The trace as a dict ready for json.dump."""
    try:
        run = load(path)
    except (OSError, KeyError, ValueError) as e:
        raise cli.BadInput(f"{path}: not a readable shardbench result ({e})")
    projected = bool(run.meta.get("projected"))
    if not len(run.events):
        what = "a projected result without the replayed step's events" if projected else \
            f"a result without events (status {run.meta.get('status')})"
        raise cli.BadInput(f"{path}: {what}: nothing to draw")
    e = in_steps(run.events, steps)
    if not len(e):
        last = int(run.events["step"].max())
        raise cli.BadInput(f"{path}: no events in --steps (this run has steps 0 … {last})")
    mem = in_steps(run.memory, steps) if len(run.memory) else run.memory
    ranks = sorted(int(r) for r in e["rank"].unique())
    lanes_of = {r: sorted(int(x) for x in e.loc[e["rank"] == r, "lane"].unique()) for r in ranks}
    trace = metadata_events(run, ranks, lanes_of, projected)
    trace += step_events(run, e, run.steps)
    trace += operation_events(run, e)
    trace += memory_events(mem)
    m = run.meta
    other = {k: m.get(k) for k in ("program", "label", "model", "world_size", "backend", "dtype", "batch_per_rank",
                                   "enc_seq_len", "status", "start_time", "median_step_time_s") if k in m}
    other["source"] = os.path.basename(path)
    other["projected"] = projected
    other["command_line"] = run.provenance.get("command_line", "")
    other["shardbench_version"] = run.provenance.get("shardbench_version", "")
    return {"traceEvents": trace, "displayTimeUnit": "ms", "otherData": other}


def main(argv=None):
    ap = cli.parser(__doc__, __file__)
    ap.add_argument("result", metavar="RESULT.h5",
                    help="a shardbench result (HDF5) from ddp_perf, fsdp_perf or analysis/project.py")
    ap.add_argument("-o", "--out", metavar="OUT.json",
                    help="the JSON file to write (default: RESULT with .json in place of .h5)")
    ap.add_argument("--steps", default=":", metavar="A:B", help="steps to include, A:B inclusive, A:, :B or N; "
                    "0 is the set-up, warm-up steps come first (default: all, ':')")
    a = ap.parse_args(argv)
    out = a.out or (a.result[:-3] if a.result.endswith(".h5") else a.result) + ".json"
    t0 = time.perf_counter()
    try:
        cli.check_output_file(out, "--out" if a.out else "the trace (RESULT.json)")  # before the conversion
        trace = convert(a.result, parse_steps(a.steps))
        # Written beside the target and renamed: a failed write leaves no partial file.
        with open(out + ".tmp", "w") as f:
            json.dump(trace, f, separators=(",", ":"))
        os.replace(out + ".tmp", out)
    except cli.BadInput as e:
        print(f"to_perfetto: error: {e}", file=sys.stderr)
        return 2
    except OSError as e:
        print(f"to_perfetto: error: cannot write {out}: {e.strerror}", file=sys.stderr)
        if os.path.exists(out + ".tmp"):
            os.remove(out + ".tmp")
        return 2
    n = sum(1 for x in trace["traceEvents"] if x["ph"] == "X" and x["tid"] != STEPS_TID)
    print(f"to_perfetto: {out} ({n} operations, {time.perf_counter() - t0:.2f} s); "
          "open it in ui.perfetto.dev or chrome://tracing")
    return 0


if __name__ == "__main__":
    sys.exit(cli.run(__file__, main))
