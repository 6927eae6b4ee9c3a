#!/usr/bin/python3
"""Comparison table (and optional bar plot) of shardbench runs from their RESULT lines.

Usage: analysis/compare_logs.py LOG... [--plot OUT.png]
"""
import argparse
import re
import sys


def parse(path):
    with open(path) as f:
        for line in f:
            if line.startswith("RESULT "):
                return dict(kv.split("=", 1) for kv in line.split()[1:])
    raise SystemExit(f"compare_logs: {path}: no RESULT line (did the run fail?)")


def main():
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("logs", nargs="+")
    ap.add_argument("--plot", help="write a PNG bar chart of step time and peak memory")
    a = ap.parse_args()
    runs = [parse(p) for p in a.logs]
    base = float(next((r["step_ms"] for r in runs if r["strategy"] == "ddp"), runs[0]["step_ms"]))
    hdr = f"{'strategy':<14} {'model':<10} {'ranks':>5} {'step ms':>9} {'vs ddp':>7} {'TFLOPS/rank':>12} {'tokens/s':>10} {'exposed ms':>11} {'peak MiB':>9} {'plan MiB':>9} {'loss':>9}"
    print(hdr)
    print("-" * len(hdr))
    for r in runs:
        print(f"{r['strategy']:<14} {r['model']:<10} {r['world']:>5} {float(r['step_ms']):>9.2f} "
              f"{float(r['step_ms']) / base:>7.2f} {float(r['tflops_per_rank']):>12.4f} "
              f"{float(r['tokens_per_s']):>10.0f} {float(r['exposed_ms']):>11.2f} "
              f"{int(r['peak_bytes']) / 2**20:>9.1f} {int(r['plan_bytes']) / 2**20:>9.1f} {float(r['loss']):>9.5f}")
    if a.plot:
        import matplotlib
        matplotlib.use("Agg")
        import matplotlib.pyplot as plt
        names = [r["strategy"] for r in runs]
        fig, ax = plt.subplots(1, 2, figsize=(10, 3.8))
        ax[0].bar(names, [float(r["step_ms"]) for r in runs], color="tab:blue")
        ax[0].set_ylabel("step time (ms), median")
        ax[1].bar(names, [int(r["peak_bytes"]) / 2**20 for r in runs], color="tab:orange", label="measured")
        ax[1].plot(names, [int(r["plan_bytes"]) / 2**20 for r in runs], "kx", label="plan")
        ax[1].set_ylabel("peak memory per rank (MiB)")
        ax[1].legend()
        fig.suptitle(f"{runs[0]['model']} on {runs[0]['world']} ranks: DDP vs FSDP")
        for x in ax:
            x.tick_params(axis="x", rotation=20)
        fig.tight_layout()
        fig.savefig(a.plot, dpi=110)
        print(f"plot: {a.plot}")


if __name__ == "__main__":
    sys.exit(main())
