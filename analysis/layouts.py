#!/usr/bin/python3
"""The parallel-layout study's figure: throughput and memory per GPU against GPU count, one
line per layout (FSDP alone, tensor parallelism × FSDP or DDP, ...), from shardbench results,
measured and projected.

  layouts   two rows of panels, one column per model and source: TFLOPS per GPU (model
            FLOPs of a rank's share / step time), then peak memory per GPU (the accounted
            peak of the busiest rank), against GPU count; colour = the data-parallel
            strategy, line style = the tensor-parallel size, marker = the pipeline stages;
            out-of-memory points are an x on the bottom edge, projected points hollow.

Usage: analysis/layouts.py RESULT.h5|DIR... --out DIR   (writes layouts.png and .svg)
Exit codes: 0 drawn; 2 bad input (no training results, an --out folder that cannot be
written); 3 some files were unreadable and skipped (one line each).
"""
import os
import re
import sys

import matplotlib
matplotlib.use("Agg")
import matplotlib.lines  # noqa: E402
import matplotlib.pyplot as plt  # noqa: E402
import matplotlib.ticker  # noqa: E402

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import cli  # noqa: E402
import plots  # noqa: E402
import strategy_labels  # noqa: E402
from shardbench_h5 import Inputs  # noqa: E402

TP_STYLES = {1: "-", 2: "--", 4: "-.", 8: ":"}
PP_MARKERS = {1: "o", 2: "s", 4: "^", 8: "D", 16: "v"}


def layout_of(r):
    """(data-parallel strategy, tensor-parallel size, pipeline stages) of a result, from its
    label; hybrid of any shard size is one strategy (the shard group of a node's
    data-parallel ranks)."""
    base, tp, pp = strategy_labels.split_layout(r.meta["label"])
    return re.sub(r"^fsdp-hybrid[0-9]+$", "fsdp-hybrid", base), int(r.meta.get("tp_size", tp)), \
        int(r.meta.get("pp_size", pp))


def peak_gib(r):
    return r.meta.get("max_peak_memory_bytes", r.plan.get("peak_total", 0)) / 2**30


def draw(runs, out):
    size = {r.meta["model"]: r.meta["param_count"] for r in runs}
    columns = sorted({(r.meta["model"], plots.source(r)) for r in runs},
                     key=lambda p: (p[1].startswith("measured"), p[1], size[p[0]]))
    n = len(columns)
    fig, axes = plt.subplots(2, n, figsize=(max(4.0 * n, 8.0), 6.8), squeeze=False)
    tps, pps, bases = set(), set(), set()
    for col, (model, src) in enumerate(columns):
        rs = [r for r in runs if r.meta["model"] == model and plots.source(r) == src]
        proj = src.startswith("projected")
        for (base, tp, pp), g in sorted(plots.series(rs, layout_of).items()):
            g = sorted(g, key=lambda r: r.meta["world_size"])
            ok = [r for r in g if r.meta["status"] == "ok"]
            style = dict(color=plots.color(base), ls=TP_STYLES.get(tp, "-"), marker=PP_MARKERS.get(pp, "o"), ms=4)
            for row, value in ((0, plots.tflops), (1, peak_gib)):
                ax = axes[row][col]
                ax.plot([r.meta["world_size"] for r in ok], [value(r) for r in ok],
                        mfc="none" if proj else style["color"], **style)
                for r in g:
                    if r.meta["status"] == "out-of-memory":
                        plots.mark_oom(ax, r.meta["world_size"], style["color"])
            tps.add(tp)
            pps.add(pp)
            bases.add(base)
        device = plots.device_word(rs)
        batches = {(layout_of(r)[1], layout_of(r)[2], r.meta["batch_per_rank"]) for r in rs}
        axes[0][col].set_title(f"{model}\n{src}", fontsize=8)
        for row, ylabel in ((0, f"TFLOPS per {device}"), (1, f"peak memory per {device} (GiB)")):
            ax = axes[row][col]
            ax.set_xscale("log", base=2)
            ax.xaxis.set_major_formatter(matplotlib.ticker.FuncFormatter(lambda v, _: f"{v:g}"))
            ax.set_xlabel("GPUs (ranks)" if row else "", fontsize=8)
            ax.set_ylabel(ylabel, fontsize=8)
            ax.tick_params(which="both", labelsize=7)
            top = max((max(line.get_ydata(), default=0) for line in ax.get_lines()
                       if line.get_transform() == ax.transData), default=0)
            ax.set_ylim(0, top * 1.15 if top > 0 else 1)
            ax.grid(alpha=0.3)
        per_layout = ", ".join(f"tp {tp}{f' pp {pp}' if pp > 1 else ''}: {b}" for tp, pp, b in sorted(batches))
        axes[1][col].set_title(f"batch per data-parallel rank ({per_layout})", fontsize=7)
    handles = [matplotlib.lines.Line2D([], [], color=plots.color(b), lw=2, label=b) for b in sorted(bases)]
    handles += [matplotlib.lines.Line2D([], [], color="black", ls=TP_STYLES.get(t, "-"), label=f"tp {t}")
                for t in sorted(tps)]
    if pps != {1}:
        handles += [matplotlib.lines.Line2D([], [], color="black", ls="none", marker=PP_MARKERS.get(p, "o"),
                                            label=f"pp {p}") for p in sorted(pps)]
    if any(r.meta.get("projected") for r in runs):
        handles.append(matplotlib.lines.Line2D([], [], color="black", marker="o", mfc="none", ls="none",
                                               label="projected"))
    if any(not r.meta.get("projected") for r in runs):
        handles.append(matplotlib.lines.Line2D([], [], color="black", marker="o", ls="none", label="measured"))
    fig.suptitle("Parallel layouts: throughput and memory per GPU against GPU count\n"
                 "(x on the axis: out of memory)", fontsize=10)
    fig.legend(handles=handles, loc="lower center", ncol=min(6, len(handles)), fontsize=7, frameon=False)
    fig.tight_layout(rect=(0, 0.08, 1, 0.93))
    return plots.save(fig, out, "layouts")


def main(argv=None):
    ap = cli.parser(__doc__, __file__)
    ap.add_argument("results", nargs="+", metavar="RESULT.h5|DIR",
                    help="results (HDF5), or folders searched recursively for them")
    ap.add_argument("--out", required=True, metavar="DIR", help="folder for layouts.png and .svg (required)")
    a = ap.parse_args(argv)
    inputs = Inputs("layouts")
    try:
        cli.check_output_dir(a.out, "--out")  # before anything is read or drawn
        runs = plots.load_results(a.results, inputs)
    except cli.BadInput as e:
        print(f"layouts: error: {e}", file=sys.stderr)
        return 2
    os.makedirs(a.out, exist_ok=True)
    print(f"layouts: {draw(runs, a.out)} (+ .svg)")
    return inputs.exit_code(0)


if __name__ == "__main__":
    sys.exit(cli.run(__file__, main))
