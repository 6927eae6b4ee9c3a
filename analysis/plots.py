#!/usr/bin/python3
"""The study's figures from shardbench results (measured and projected), as PNG and SVG:

  tflops_vs_model   TFLOPS per GPU against model size, one series per strategy,
                    out-of-memory points marked (the paper's figure: DDP stops after 2.28B)
  tflops_vs_gpus    TFLOPS per GPU against GPU count, per strategy and batch size
  memory            memory per rank by category, measured beside planned, per strategy
  timeline          one step of each rank: compute and communication lanes, showing overlap

Usage: analysis/plots.py RESULT.h5|DIR... --out DIR
Projected results (analysis/project.py) are drawn dashed with hollow markers.
"""
import argparse
import glob
import os
import sys

import matplotlib
matplotlib.use("Agg")
import matplotlib.pyplot as plt  # noqa: E402
import numpy as np  # noqa: E402

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from shardbench_h5 import CATEGORIES, Inputs, load_training  # noqa: E402

COLORS = {"ddp": "tab:blue", "fsdp-full": "tab:orange", "fsdp-none": "tab:green", "fsdp-grad-op": "tab:purple"}


class PlotError(Exception):
    pass


def color(label):
    return COLORS.get(label, "tab:red" if label.startswith("fsdp-hybrid") else "tab:gray")


def expand(paths):
    out = []
    for p in paths:
        if os.path.isdir(p):
            found = sorted(glob.glob(os.path.join(p, "**", "*.h5"), recursive=True))
            out += found
        else:
            out.append(p)
    return out


def load_results(paths, inputs):
    """The training results among paths; unreadable files are skipped through inputs."""
    files = expand(paths)
    if not files:
        raise PlotError(f"no .h5 results in {', '.join(paths)}")
    runs = inputs.read(files, load_training)
    if not runs:
        raise PlotError(f"no readable result in {', '.join(paths)} ({len(files)} unreadable)")
    versions = {r.meta.get("schema_version") for r in runs}
    if len(versions) != 1:
        raise PlotError(f"mixed schema versions {sorted(versions)} in {', '.join(paths)}")
    training = [r for r in runs if r.meta.get("program") in ("ddp_perf", "fsdp_perf")]
    if not training:
        raise PlotError("no training results (ddp_perf, fsdp_perf) among the files")
    return training


def save(fig, out, name):
    paths = [os.path.join(out, f"{name}.{ext}") for ext in ("png", "svg")]
    for p in paths:
        fig.savefig(p, dpi=110)
    plt.close(fig)
    return paths[0]


def tflops(r):
    return r.meta.get("median_model_tflops_per_rank", float("nan"))


def series(runs, key):
    groups = {}
    for r in runs:
        groups.setdefault(key(r), []).append(r)
    return groups


def finish_tflops(fig, ax, out, name, xlabel, title, legend_size):
    """Labels, legend and files of a TFLOPS-per-GPU figure."""
    ax.set_xlabel(xlabel)
    ax.set_ylabel("TFLOPS per GPU (model FLOPs)")
    ax.set_title(title)
    ax.legend(fontsize=legend_size)
    fig.tight_layout()
    return save(fig, out, name)


def plot_vs_model(runs, out):
    fig, ax = plt.subplots(figsize=(6.4, 4.2))
    key = lambda r: (r.meta["label"], r.meta["world_size"], bool(r.meta.get("projected")))  # noqa: E731
    for (label, world, proj), rs in sorted(series(runs, key).items()):
        rs = sorted(rs, key=lambda r: r.meta["param_count"])
        ok = [r for r in rs if r.meta["status"] == "ok"]
        oom = [r for r in rs if r.meta["status"] == "out-of-memory"]
        style = dict(color=color(label), ls="--" if proj else "-", marker="o", mfc="none" if proj else color(label))
        ax.plot([r.meta["param_count"] for r in ok], [tflops(r) for r in ok],
                label=f"{label} on {world}{' (projected)' if proj else ''}", **style)
        for r in oom:
            ax.plot(r.meta["param_count"], 0, marker="x", color=color(label), ms=10, mew=2)
            ax.annotate("OOM", (r.meta["param_count"], 0), textcoords="offset points", xytext=(4, 6), fontsize=7,
                        color=color(label))
    ax.set_xscale("log")
    return finish_tflops(fig, ax, out, "tflops_vs_model", "model parameters",
                         "Throughput against model size (x: out of memory)", 7)


def plot_vs_gpus(runs, out):
    fig, ax = plt.subplots(figsize=(6.4, 4.2))
    key = lambda r: (r.meta["model"], r.meta["label"], r.meta["batch_per_rank"], bool(r.meta.get("projected")))  # noqa: E731
    for (model, label, batch, proj), rs in sorted(series(runs, key).items()):
        rs = sorted([r for r in rs if r.meta["status"] == "ok"], key=lambda r: r.meta["world_size"])
        if not rs:
            continue
        ax.plot([r.meta["world_size"] for r in rs], [tflops(r) for r in rs], color=color(label),
                ls="--" if proj else "-", marker="s" if batch > 8 else "o", mfc="none" if proj else color(label),
                label=f"{model} {label} b{batch}{' (projected)' if proj else ''}")
    ax.set_xscale("log", base=2)
    return finish_tflops(fig, ax, out, "tflops_vs_gpus", "GPUs (ranks)", "Scaling", 6)


def measured_at_peak(r):
    """Bytes per category at the moment of rank 0's highest total."""
    m = r.memory[r.memory["rank"] == 0]
    row = m.loc[m["total"].idxmax()]
    return [row[c] for c in CATEGORIES]


def plot_memory(runs, out):
    measured = [r for r in runs if r.meta["status"] == "ok" and not r.meta.get("projected") and len(r.memory)]
    if not measured:
        return None
    measured = sorted(measured, key=lambda r: (r.meta["model"], r.meta["world_size"], r.meta["label"]))[:12]
    fig, ax = plt.subplots(figsize=(max(6.4, 1.1 * len(measured)), 4.4))
    x = np.arange(len(measured))
    cmap = plt.get_cmap("tab10")
    for side, dx in (("measured", -0.2), ("planned", 0.2)):
        bottom = np.zeros(len(measured))
        for i, cat in enumerate(CATEGORIES):
            vals = np.array([(measured_at_peak(r)[i] if side == "measured" else r.plan.get(f"at_peak_{cat}", 0))
                             for r in measured]) / 2**20
            ax.bar(x + dx, vals, 0.38, bottom=bottom, color=cmap(i), hatch="" if side == "measured" else "//",
                   edgecolor="white", label=cat if side == "measured" else None)
            bottom += vals
    ax.set_xticks(x, [f"{r.meta['label']}\n{r.meta['model']} w{r.meta['world_size']}" for r in measured], fontsize=7)
    ax.set_ylabel("MiB per rank at the peak")
    ax.set_title("Memory by category: measured (left) beside planned (right, hatched)")
    ax.legend(fontsize=7)
    fig.tight_layout()
    return save(fig, out, "memory")


def plot_timeline(run, out, name="timeline"):
    e = run.events
    if not len(e):
        return None
    step = int(e["step"].max())
    e = e[e["step"] == step]
    ranks = sorted(e["rank"].unique())[:4]
    fig, ax = plt.subplots(figsize=(10, 0.9 + 0.9 * len(ranks)))
    kinds = {"gemm": "tab:blue", "elementwise": "tab:cyan", "optimizer": "tab:purple", "copy": "tab:gray",
             "wait": "tab:red", "progress": "salmon", "all-gather": "tab:orange", "reduce-scatter": "tab:green",
             "all-reduce": "tab:olive"}
    yticks, ylabels, y = [], [], 0
    t0 = e["start"].min()
    for rank in ranks:
        er = e[e["rank"] == rank]
        for lane in sorted(er["lane"].unique()):
            el = er[er["lane"] == lane]
            for kind, g in el.groupby("op_name", observed=True):
                ax.broken_barh(list(zip((g["start"] - t0) * 1e3, (g["end"] - g["start"]) * 1e3)), (y, 0.8),
                               facecolors=kinds.get(kind, "black"), label=kind)
            yticks.append(y + 0.4)
            ylabels.append(f"rank {rank} " + ("compute" if lane == 0 else f"comm {lane}"))
            y += 1
    handles, labels = ax.get_legend_handles_labels()
    uniq = dict(zip(labels, handles))
    ax.legend(uniq.values(), uniq.keys(), fontsize=7, ncol=5, loc="upper right")
    ax.set_yticks(yticks, ylabels, fontsize=7)
    ax.set_xlabel("ms since the step began")
    ax.set_title(f"{run.meta['label']} {run.meta['model']} on {run.meta['world_size']} ranks: step {step}")
    fig.tight_layout()
    return save(fig, out, name)


def make_all(paths, out, inputs=None):
    runs = load_results(paths, inputs or Inputs("plots"))
    os.makedirs(out, exist_ok=True)
    figs = {"tflops_vs_model": plot_vs_model(runs, out), "tflops_vs_gpus": plot_vs_gpus(runs, out),
            "memory": plot_memory(runs, out)}
    measured = [r for r in runs if r.meta["status"] == "ok" and not r.meta.get("projected") and len(r.events)]
    if measured:
        pick = max(measured, key=lambda r: (r.meta["world_size"], r.meta["label"].startswith("fsdp")))
        figs["timeline"] = plot_timeline(pick, out)
    return runs, {k: v for k, v in figs.items() if v}


def main(argv=None):
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("results", nargs="+")
    ap.add_argument("--out", required=True)
    a = ap.parse_args(argv)
    inputs = Inputs("plots")
    try:
        _, figs = make_all(a.results, a.out, inputs)
    except PlotError as e:
        print(f"plots: error: {e}", file=sys.stderr)
        return 2
    for name, path in figs.items():
        print(f"plots: {name}: {path} (+ .svg)")
    return inputs.exit_code(0)


if __name__ == "__main__":
    sys.exit(main())
