#!/usr/bin/python3
"""One row per shardbench result: program, strategy, model, ranks, step time, TFLOPS per
rank, peak memory, status.

    analysis/summarize.py results/*.h5 --csv summary.csv

Rows are sorted by program, strategy, model, then ranks, batch and sequence length as
numbers. The source column says where a row's figures come from: "run" (measured) or
"projected" (analysis/project.py's replay); out-of-memory records show their planned peak
and "-" for the times they do not have. Exit status: 0; 2 no readable
result, or a --csv path that cannot be written; 3 (EXIT_SKIPPED) unreadable files were
skipped, one line each, and the table holds the rest.
"""
import os
import sys

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import cli  # noqa: E402
from shardbench_h5 import Inputs, load  # noqa: E402


def row(run):
    m = run.meta
    ok = m["status"] == "ok" or "median_step_time_s" in m
    return {
        "file": os.path.basename(run.path),
        "program": m["program"],
        "strategy": m["label"],
        "model": m["model"],
        "ranks": m["world_size"],
        "batch": m["batch_per_rank"],
        "seq": m["enc_seq_len"],
        "step_ms": m["median_step_time_s"] * 1e3 if ok else float("nan"),
        "tflops_per_rank": m["median_model_tflops_per_rank"] if ok else float("nan"),
        # A run the watchdog ended has no plan in its record: no peak either.
        "peak_mib": (m["max_peak_memory_bytes"] if ok else run.plan.get("peak_total", float("nan"))) / 2**20,
        "status": m["status"],
        "source": "projected" if m.get("projected") else "run",
    }


def cell(x, spec):
    """A figure, or '-' where the row has none (an out-of-memory or failed record)."""
    return "-" if x != x else format(x, spec)


def sort_key(r):
    return (r["program"], r["strategy"], r["model"], int(r["ranks"]), int(r["batch"]), int(r["seq"]), r["file"])


def main(argv=None):
    ap = cli.parser(__doc__, __file__)
    ap.add_argument("files", nargs="+", metavar="RESULT.h5", help="shardbench results (HDF5), any status")
    ap.add_argument("--csv", metavar="OUT.csv", help="also write the table as CSV (default: print only)")
    a = ap.parse_args(argv)
    try:  # before anything is read: a path it cannot write is one line, not a traceback at the end
        if a.csv:
            cli.check_output_file(a.csv, "--csv")
    except cli.BadInput as e:
        print(f"summarize: error: {e}", file=sys.stderr)
        return 2
    inputs = Inputs("summarize")
    rows = sorted(inputs.read(a.files, lambda p: row(load(p))), key=sort_key)
    if not rows:
        print("summarize: no readable result: nothing to summarize", file=sys.stderr)
        return 2
    hdr = f"{'program':<10} {'strategy':<14} {'model':<10} {'ranks':>5} {'batch':>5} {'seq':>5} {'step ms':>9} {'TFLOPS/rank':>12} {'peak MiB':>9}  {'source':<9}  status"
    print(hdr)
    print("-" * len(hdr))
    for r in rows:
        print(f"{r['program']:<10} {r['strategy']:<14} {r['model']:<10} {r['ranks']:>5} {r['batch']:>5} {r['seq']:>5} "
              f"{cell(r['step_ms'], '.2f'):>9} {cell(r['tflops_per_rank'], '.4f'):>12} {cell(r['peak_mib'], '.1f'):>9}  "
              f"{r['source']:<9}  {r['status']}")
    if a.csv:
        import pandas as pd
        pd.DataFrame(rows).to_csv(a.csv, index=False)
    return inputs.exit_code(0)


if __name__ == "__main__":
    sys.exit(cli.run(__file__, main))
