#!/usr/bin/python3
"""A stand-in for the programs' --plan-batch mode (tests/test_advise.py): installed as
BIN/fsdp_perf and BIN/ddp_perf beside a REAL_BIN folder of the real programs, it answers
--help with the real help plus --plan-batch, and `--plan-batch FILE|- [--plan-batch-ops
all|none]` with one JSON object per line, {"line", "exit", "schedule"} or {"line", "exit": 2,
"error"}, each schedule the real --plan --schedule-json's with a "totals" object (per stage:
per op and mesh axis count, bytes, sent_bytes; gemm_flops; peak_total), as the batch mode's
interface says; its "ops" dropped under --plan-batch-ops none. Everything else runs the real
program."""
import json
import os
import subprocess
import sys
import tempfile

REAL = os.path.join(os.environ["REAL_BIN"], os.path.basename(sys.argv[0]))


def totals(s):
    cols, names, axes = s["columns"], s["op_names"], s["axis_names"]
    ix = {c: i for i, c in enumerate(cols)}
    lists = ([st["ops"] for st in s["stages"]] if s.get("pp_size", 1) > 1 else [s["ops"]])
    peaks = ([st["peak_total"] for st in s["stages"]] if s.get("pp_size", 1) > 1 else [s["memory"]["peak_total"]])
    out = []
    for rows, peak in zip(lists, peaks):
        ops, flops = {}, 0
        for r in rows:
            op = names[r[ix["op"]]]
            axis = axes[r[ix["axis"]]] if r[ix["axis"]] >= 0 else "none"
            v = ops.setdefault(op, {}).setdefault(axis, {"count": 0, "bytes": 0, "sent_bytes": 0})
            v["count"] += 1
            v["bytes"] += r[ix["bytes"]]
            v["sent_bytes"] += r[ix["sent_bytes"]]
            if op == "gemm":
                flops += r[ix["flops"]]
        st = {"ops": ops, "gemm_flops": flops, "peak_total": peak}
        if s.get("cpu_offload", "none") != "none":  # the host lanes (100 update, 101/102 copies)
            h = {"h2d_bytes": 0, "d2h_bytes": 0, "update_bytes": 0, "copy_count": 0, "update_count": 0}
            for r in rows:
                lane, op = r[ix["lane"]], names[r[ix["op"]]]
                if lane in (101, 102):
                    h["h2d_bytes" if lane == 101 else "d2h_bytes"] += r[ix["bytes"]]
                    h["copy_count"] += op == "copy"
                elif lane == 100 and op == "optimizer":
                    h["update_bytes"] += r[ix["bytes"]]
                    h["update_count"] += 1
            st["host"] = h
        out.append(st)
    return {"stages": out}


def main(argv):
    if "--help" in argv:
        p = subprocess.run([REAL, "--help"], capture_output=True, text=True)
        print(p.stdout + "  --plan-batch TEXT           (stand-in) plan one configuration per line\n")
        return 0
    if "--plan-batch" not in argv:
        return subprocess.run([REAL] + argv).returncode
    src = argv[argv.index("--plan-batch") + 1]
    keep_ops = "none" not in argv
    lines = (sys.stdin if src == "-" else open(src)).read().splitlines()
    for n, line in enumerate(lines, 1):
        with tempfile.TemporaryDirectory() as tmp:
            path = os.path.join(tmp, "s.json")
            p = subprocess.run([REAL] + line.split() + ["--plan", "--schedule-json", path], capture_output=True,
                               text=True)
            if p.returncode == 2:
                print(json.dumps({"line": n, "exit": 2, "error": p.stderr.strip().splitlines()[-1]}))
                continue
            with open(path) as f:
                s = json.load(f)
            s["totals"] = totals(s)
            if not keep_ops:
                s.pop("ops", None)
                for st in s.get("stages", []):
                    st.pop("ops", None)
            print(json.dumps({"line": n, "exit": p.returncode, "schedule": s}), flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
