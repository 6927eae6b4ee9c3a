#!/usr/bin/python3
"""Checks analysis/to_perfetto.py against the HDF5 results it converts: the JSON parses;
per rank and lane there are as many slices as events in the file; slices start in order
and never overlap within a thread; one memory counter sample per /memory row; warm-up
steps are marked as in /steps; --steps keeps exactly the events of those steps; a
projected result (analysis/project.py) converts as its replayed step, named projected.
Prints the conversion time of each file (a figure, not a pass/fail threshold).

Usage: tests/check_perfetto.py RESULT.h5...   (exit 1 on the first failed check)
"""
import collections
import json
import os
import re
import subprocess
import sys
import tempfile
import time

HERE = os.path.dirname(os.path.abspath(__file__))
SCRIPT = os.path.join(HERE, "..", "analysis", "to_perfetto.py")
sys.path.insert(0, os.path.join(HERE, "..", "analysis"))
from shardbench_h5 import load  # noqa: E402
from to_perfetto import STEPS_TID, pid_of, tid_of  # noqa: E402


def convert(path, out, *extra):
    t0 = time.perf_counter()
    p = subprocess.run([sys.executable, SCRIPT, path, "-o", out, *extra], capture_output=True, text=True)
    if p.returncode != 0:
        raise AssertionError(f"to_perfetto exited {p.returncode}: {p.stderr.strip()}")
    wall = time.perf_counter() - t0
    with open(out) as f:
        trace = json.load(f)
    inner = re.search(r"operations, ([0-9.]+) s\)", p.stdout)
    assert inner, f"no conversion time in {p.stdout!r}"
    return trace, (float(inner.group(1)), wall)


def slices(trace):
    return [e for e in trace["traceEvents"] if e["ph"] == "X" and e["tid"] != STEPS_TID]


def check_counts(run, trace, events):
    want = collections.Counter((pid_of(r), tid_of(lane)) for r, lane in zip(events["rank"].tolist(),
                                                                             events["lane"].tolist()))
    got = collections.Counter((e["pid"], e["tid"]) for e in slices(trace))
    assert got == want, f"slices per (rank, lane) {dict(got)} != HDF5 events {dict(want)}"


def check_monotonic(trace):
    by_thread = collections.defaultdict(list)
    for e in trace["traceEvents"]:
        if e["ph"] == "X":
            by_thread[(e["pid"], e["tid"])].append(e)
    for key, evs in by_thread.items():
        for a, b in zip(evs, evs[1:]):
            assert b["ts"] >= a["ts"], f"thread {key}: ts goes back from {a['ts']} to {b['ts']}"
            assert b["ts"] >= a["ts"] + a["dur"] - 1e-3, f"thread {key}: '{a['name']}' overlaps '{b['name']}'"
        assert all(e["dur"] >= 0 for e in evs), f"thread {key}: negative duration"


def check_run(path, tmp):
    run = load(path)
    trace, seconds = convert(path, os.path.join(tmp, "all.json"))
    check_counts(run, trace, run.events)
    check_monotonic(trace)
    counters = [e for e in trace["traceEvents"] if e["ph"] == "C"]
    assert len(counters) == len(run.memory), f"{len(counters)} memory samples != {len(run.memory)} /memory rows"
    meta = [e for e in trace["traceEvents"] if e["ph"] == "M"]
    procs = {e["pid"]: e["args"]["name"] for e in meta if e["name"] == "process_name"}
    assert all(p > 0 and n.startswith(f"rank {p - pid_of(0)}") for p, n in procs.items()), f"processes {procs}"
    names = {e["args"]["name"] for e in trace["traceEvents"] if e["ph"] == "M" and e["name"] == "thread_name"}
    assert "compute" in names and "steps" in names, f"thread names {sorted(names)}"
    marked = {(e["pid"] - pid_of(0), e["args"]["step"]) for e in trace["traceEvents"]
              if e["ph"] == "X" and e["tid"] == STEPS_TID and "(warm-up)" in e["name"]}
    warm = run.steps[run.steps["warmup"] == 1] if len(run.steps) else None  # a projection has no /steps
    want = set(zip(warm["rank"].tolist(), warm["step"].tolist())) if warm is not None else set()
    assert marked == want, f"warm-up slices {sorted(marked)} != /steps warm-up rows {sorted(want)}"
    ops = {e["cat"] for e in slices(trace)}
    assert "gemm" in ops and ops & {"all-reduce", "all-gather", "reduce-scatter"}, f"operations {sorted(ops)}"
    gemm = next(e for e in slices(trace) if e["cat"] == "gemm")
    assert "×" in gemm["args"]["shape"], gemm
    coll = [e for e in slices(trace) if "busbw_GBps" in e["args"]]
    assert coll and all(e["args"]["busbw_GBps"] >= 0 for e in coll), "collectives without bus bandwidth"
    # A step range keeps exactly the events of those steps.
    last = int(run.events["step"].max())
    part, _ = convert(path, os.path.join(tmp, "part.json"), "--steps", f"{last}:{last}")
    check_counts(run, part, run.events[run.events["step"] == last])
    check_monotonic(part)
    if run.meta.get("projected"):
        procs = [e["args"]["name"] for e in trace["traceEvents"] if e["ph"] == "M" and e["name"] == "process_name"]
        assert procs and all("projected" in p for p in procs), f"projected result's processes: {procs}"
    ranks = len({e["pid"] for e in slices(trace)})
    print(f"ok    {os.path.basename(path)}: {ranks} rank(s), {len(run.events)} events, "
          f"{len(counters)} memory samples; converted in {seconds[0]:.2f} s "
          f"({seconds[1]:.2f} s with the interpreter's start-up)")


def check_bad_input(path, tmp):
    out = os.path.join(tmp, "bad.json")
    for args, words in (([path, "--steps", "3:1"], "first ≤ last"), ([path, "--steps", "x"], "expected A:B"),
                        ([path, "--steps", "999:"], "no events in --steps"),
                        ([os.path.join(tmp, "missing.h5")], "not a readable shardbench result")):
        p = subprocess.run([sys.executable, SCRIPT, *args, "-o", out], capture_output=True, text=True)
        assert p.returncode == 2, f"{args}: exit {p.returncode}, expected 2"
        assert words in p.stderr and len(p.stderr.strip().splitlines()) == 1, f"{args}: stderr {p.stderr!r}"
        assert not os.path.exists(out), f"{args}: wrote {out}"
    print("ok    bad --steps and a missing file: exit 2, one line, no file")


def main(paths):
    with tempfile.TemporaryDirectory() as tmp:
        for p in paths:
            check_run(p, tmp)
        check_bad_input(paths[0], tmp)
    return 0


if __name__ == "__main__":
    if len(sys.argv) < 2:
        sys.exit(__doc__)
    try:
        sys.exit(main(sys.argv[1:]))
    except AssertionError as e:
        print(f"FAIL  {e}")
        sys.exit(1)
