#!/usr/bin/python3
"""The study's figures from shardbench results (measured and projected), as PNG and SVG.

  tflops_vs_model   TFLOPS per GPU against model size, one series per strategy,
                    out-of-memory points marked (the paper's figure: DDP stops after 2.28B)
  tflops_vs_gpus    TFLOPS per GPU against GPU count, per strategy and batch size
  memory            memory per rank by category, measured beside planned, per strategy
  timeline          one step of each rank: compute and communication lanes, showing overlap

Usage: analysis/plots.py RESULT.h5|DIR... --out DIR
Both TFLOPS figures are small multiples: measured and projected results (analysis/project.py)
never share a panel (each panel names its source), projected points are hollow, and an
out-of-memory point is an x on the panel's bottom edge, not a result at y = 0.
Axes start at zero; error bars run from the slowest to the fastest timed step. Exit codes: 0
drawn; 2 bad input (no results, no training results, an --out folder that cannot be
written); 3 some files were unreadable and skipped (one line each).
"""
import glob
import os
import sys
import textwrap

import matplotlib
matplotlib.use("Agg")
import matplotlib.lines  # noqa: E402
import matplotlib.pyplot as plt  # noqa: E402
import matplotlib.ticker  # noqa: E402
import matplotlib.transforms  # noqa: E402
import numpy as np  # noqa: E402

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import cli  # noqa: E402
from shardbench_h5 import CATEGORIES, Inputs, lane_name, load_training, model_label  # noqa: E402

COLORS = {"ddp": "tab:blue", "fsdp-full": "tab:orange", "fsdp-none": "tab:green", "fsdp-grad-op": "tab:purple",
          "fsdp-optimizer-state": "tab:brown",
          # CPU offload (-offload-optimizer, -offload-params): lighter or darker shades of the stage's colour
          "fsdp-optimizer-state-offload-optimizer": "peru", "fsdp-grad-op-offload-optimizer": "orchid",
          "fsdp-full-offload-optimizer": "gold", "fsdp-grad-op-offload-params": "indigo",
          "fsdp-full-offload-params": "saddlebrown"}



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
        raise cli.BadInput(f"no .h5 results in {', '.join(paths)}")
    runs = inputs.read(files, load_training)
    if not runs:
        raise cli.BadInput(f"no readable result in {', '.join(paths)} ({len(files)} unreadable)")
    # Every version the reader knows (READABLE_SCHEMA_VERSIONS) carries what the figures use,
    # so results of several versions are drawn together (old calibration runs beside new).
    training = [r for r in runs if r.meta.get("program") in ("ddp_perf", "fsdp_perf")]
    if not training:
        raise cli.BadInput("no training results (ddp_perf, fsdp_perf) among the files")
    return training


def wrap(text, width_in, fontsize):
    """text broken into lines that fit width_in inches at fontsize points (about 0.55 em per
    character in DejaVu Sans, 0.62 to be safe), each existing line on its own."""
    per_line = max(10, int(width_in * 72 / (0.62 * fontsize)))
    return "\n".join(textwrap.fill(line, per_line) for line in text.split("\n"))


def cut_texts(fig):
    """The titles, axis labels and legends of fig that reach past the figure's edge, as 'kind:
    text' strings (empty when nothing is cut): what tests/analysis_tests.sh checks."""
    fig.canvas.draw()
    renderer = fig.canvas.get_renderer()
    box = fig.bbox
    items = [("suptitle", fig._suptitle)] if fig._suptitle is not None else []
    items += [("legend", leg) for leg in fig.legends]
    for ax in fig.axes:
        if not ax.get_visible():
            continue
        items += [("title", ax.title), ("xlabel", ax.xaxis.label), ("ylabel", ax.yaxis.label)]
        if ax.get_legend() is not None:
            items.append(("legend", ax.get_legend()))
    cut = []
    for kind, artist in items:
        if not artist.get_visible() or (hasattr(artist, "get_text") and not artist.get_text()):
            continue
        e = artist.get_window_extent(renderer)
        if e.x0 < box.x0 - 0.5 or e.x1 > box.x1 + 0.5 or e.y0 < box.y0 - 0.5 or e.y1 > box.y1 + 0.5:
            text = artist.get_text() if hasattr(artist, "get_text") else kind
            cut.append(f"{kind}: {text!r}")
    return cut


CUT = {}  # figure name -> its texts cut at the image's edge (cut_texts), as last saved


def save(fig, out, name):
    CUT[name] = cut_texts(fig)
    paths = [os.path.join(out, f"{name}.{ext}") for ext in ("png", "svg")]
    for p in paths:
        fig.savefig(p, dpi=110)
    plt.close(fig)
    return paths[0]


def tflops(r):
    return r.meta.get("median_model_tflops_per_rank", float("nan"))


def device_word(runs):
    """What one rank ran on, for labels: GPU (CUDA, or a projection over a GPU cluster),
    CPU rank, or just rank when the runs mix them."""
    def one(r):
        b = r.meta.get("backend")
        if b == "projection":
            return "CPU rank" if "cpu" in str(r.meta.get("cluster", "")) else "GPU"
        return "GPU" if b == "cuda" else "CPU rank"
    kinds = {one(r) for r in runs}
    return kinds.pop() if len(kinds) == 1 else "rank"


def slowest_step_times(r):
    """Timed steps' times of the slowest rank (what the medians are of); empty if projected."""
    s = r.timed_steps
    return s.groupby("step")["time"].max().to_numpy() if len(s) else np.array([])


def tflops_yerr(rs):
    """Error bars of the TFLOPS points: from the slowest to the fastest timed step."""
    lo, hi = [], []
    for r in rs:
        t = slowest_step_times(r)
        v = tflops(r)
        f = r.meta.get("model_flops_per_step", 0) / 1e12
        lo.append(max(0.0, v - f / t.max()) if len(t) else 0.0)
        hi.append(max(0.0, f / t.min() - v) if len(t) else 0.0)
    return [lo, hi]


def series(runs, key):
    groups = {}
    for r in runs:
        groups.setdefault(key(r), []).append(r)
    return groups


BATCH_STYLES = ["-", "--", ":", "-."]  # by batch size, smallest first
GPU_STYLES = ["-", "--", ":", "-."]    # by GPU count, smallest first


def source(r):
    """Where a result's numbers come from; results of different sources never share a panel."""
    m = r.meta
    if m.get("projected"):
        return f"projected: {m.get('cluster', '?')} description"
    if m.get("backend") == "cpu":
        return "measured: CPU ranks (this machine)"
    devices = list(r.ranks["device"]) if len(r.ranks) and "device" in r.ranks else []
    name = devices[0].split(" ", 1)[-1].split(" (")[0] if devices else (m.get("backend") or "?").upper()
    return f"measured: {name}"


def mark_oom(ax, x, col):
    """An out-of-memory point: an x on the bottom edge of the axes (not a y = 0 result)."""
    tr = matplotlib.transforms.blended_transform_factory(ax.transData, ax.transAxes)
    ax.plot([x], [0.03], transform=tr, marker="x", color=col, ms=8, mew=2, clip_on=False, ls="none")
    ax.annotate("OOM", (x, 0.03), xycoords=tr, textcoords="offset points", xytext=(3, 4), fontsize=6, color=col)


def dodge(xs, k, n):
    """Series k of n drawn a little aside of its x (4 % a step, on these log x axes): series that
    share an x (one GPU count, one model) keep their whiskers apart."""
    return [x * 1.04 ** (k - (n - 1) / 2) for x in xs]


def span_one_x(ax, xs):
    """A panel whose series all sit at one x spans a factor 2 either side of it, so the dodge
    reads as a few per cent of the axis and the ticks do not suggest distinct x values."""
    if len(set(xs)) == 1:
        ax.set_xlim(xs[0] / 2, xs[0] * 2)


def small_multiples(panels, width=3.6, height=2.9, cols=3):
    n = len(panels)
    cols = min(cols, n)
    rows = (n + cols - 1) // cols
    fig, axes = plt.subplots(rows, cols, figsize=(width * cols, height * rows + 0.9), squeeze=False)
    for ax in axes.flat[n:]:
        ax.set_visible(False)
    return fig, list(axes.flat[:n])


def finish_panels(fig, axes, out, name, xlabel, handles, title, devices):
    """devices: per panel, what one rank ran on (device_word), for its y label."""
    for ax, device in zip(axes, devices):
        ax.set_xlabel(xlabel, fontsize=8)
        ax.set_ylabel(f"TFLOPS per {device}", fontsize=8)
        ax.tick_params(which="both", labelsize=7)
        top = max((max(line.get_ydata(), default=0) for line in ax.get_lines() if line.get_transform() == ax.transData),
                  default=0)
        ax.set_ylim(0, top * 1.15 if top > 0 else 1)
        ax.grid(alpha=0.3)
    width, height = fig.get_size_inches()
    fig.suptitle(wrap(title, width - 0.2, 10), fontsize=10)
    # As many legend columns as fit the figure's width (the longest entry sets the column).
    longest = max((len(h.get_label()) for h in handles), default=1)
    per_col = (longest * 0.55 * 7 + 40) / 72  # inches: text at 7 pt plus the handle and padding
    ncol = max(1, min(6, len(handles), int((width - 0.2) / per_col)))
    rows = (len(handles) + ncol - 1) // ncol
    # The legend's rows get room of their own below the panels: the figure grows by their
    # height, so a long legend (eight strategies of one panel) never squeezes the panels to a strip.
    legend_h = 0.15 + 0.16 * rows
    fig.set_size_inches(width, height + legend_h)
    fig.legend(handles=handles, loc="lower center", ncol=ncol, fontsize=7, frameon=False)
    fig.tight_layout(rect=(0, legend_h / (height + legend_h), 1, 1))  # tight_layout keeps the suptitle clear itself
    return save(fig, out, name)


def legend_handles(labels, styles, style_name, projected_any, measured_any):
    """Strategy colours, then line styles (batch or GPU count), then measured/projected markers."""
    h = [matplotlib.lines.Line2D([], [], color=color(lab), lw=2, label=lab) for lab in labels]
    h += [matplotlib.lines.Line2D([], [], color="black", ls=st, label=f"{style_name} {v}") for v, st in styles.items()]
    if measured_any:
        h.append(matplotlib.lines.Line2D([], [], color="black", marker="o", ls="none", label="measured"))
    if projected_any:
        h.append(matplotlib.lines.Line2D([], [], color="black", marker="o", mfc="none", ls="none", label="projected"))
    return h


def styles_for(values, styles):
    return {v: styles[i % len(styles)] for i, v in enumerate(sorted(values))}


def plot_vs_model(runs, out):
    """Small multiples, one panel per source and batch: TFLOPS per GPU against model size,
    colour = strategy, line style = GPU count (at most four: the two smallest, the middle
    one and the largest, the same in every panel)."""
    panels = sorted({(source(r), r.meta["batch_per_rank"]) for r in runs},
                    key=lambda p: (p[0].startswith("measured"), p))
    fig, axes = small_multiples(panels, width=4.2, cols=2)
    worlds = sorted({r.meta["world_size"] for r in runs})
    shown = worlds if len(worlds) <= 4 else [worlds[0], worlds[1], worlds[len(worlds) // 2], worlds[-1]]
    gpu_styles = styles_for(shown, GPU_STYLES)
    labels = set()
    for ax, (src, batch) in zip(axes, panels):
        rs = [r for r in runs if source(r) == src and r.meta["batch_per_rank"] == batch]
        here = {r.meta["world_size"] for r in rs}
        proj = src.startswith("projected")
        each = sorted(series([r for r in rs if r.meta["world_size"] in shown],
                             lambda r: (r.meta["label"], r.meta["world_size"])).items())
        for k, ((label, world), g) in enumerate(each):
            g = sorted(g, key=lambda r: r.meta["param_count"])
            ok = [r for r in g if r.meta["status"] == "ok"]
            ax.errorbar(dodge([r.meta["param_count"] for r in ok], k, len(each)), [tflops(r) for r in ok],
                        yerr=tflops_yerr(ok), capsize=2, color=color(label), ls=gpu_styles[world], marker="o", ms=4,
                        mfc="none" if proj else color(label))
            for r in g:
                if r.meta["status"] == "out-of-memory":
                    mark_oom(ax, r.meta["param_count"], color(label))
            labels.add(label)
        ax.set_xscale("log")
        span_one_x(ax, [r.meta["param_count"] for r in rs if r.meta["world_size"] in shown])
        more = f" (GPU counts {', '.join(str(w) for w in sorted(here & set(shown)))} of {len(here)})" \
            if not here <= set(shown) else ""
        ax.set_title(wrap(f"{src}\nbatch {batch}{more}", ax.get_position().width * fig.get_figwidth(), 8), fontsize=8)
    handles = legend_handles(sorted(labels), gpu_styles, "GPUs", any(r.meta.get("projected") for r in runs),
                             any(not r.meta.get("projected") for r in runs))
    devices = [device_word([r for r in runs if source(r) == src and r.meta["batch_per_rank"] == b]) for src, b in panels]
    return finish_panels(fig, axes, out, "tflops_vs_model", "model parameters", handles,
                         "Throughput against model size (x on the axis: out of memory)", devices)


def plot_vs_gpus(runs, out):
    """Small multiples, one panel per model and source: TFLOPS per GPU against GPU count,
    colour = strategy, line style = batch; measured and projected never share a panel."""
    size = {model_label(r.meta): r.meta["param_count"] for r in runs}
    panels = sorted({(model_label(r.meta), source(r)) for r in runs},
                    key=lambda p: (p[1].startswith("measured"), p[1], size[p[0]]))
    fig, axes = small_multiples(panels)
    batch_styles = styles_for({r.meta["batch_per_rank"] for r in runs}, BATCH_STYLES)
    labels = set()
    for ax, (model, src) in zip(axes, panels):
        rs = [r for r in runs if model_label(r.meta) == model and source(r) == src]
        proj = src.startswith("projected")
        each = sorted(series(rs, lambda r: (r.meta["label"], r.meta["batch_per_rank"])).items())
        for k, ((label, batch), g) in enumerate(each):
            g = sorted(g, key=lambda r: r.meta["world_size"])
            ok = [r for r in g if r.meta["status"] == "ok"]
            ax.errorbar(dodge([r.meta["world_size"] for r in ok], k, len(each)), [tflops(r) for r in ok],
                        yerr=tflops_yerr(ok), capsize=2, color=color(label), ls=batch_styles[batch], marker="o", ms=4,
                        mfc="none" if proj else color(label))
            for r in g:
                if r.meta["status"] == "out-of-memory":
                    mark_oom(ax, r.meta["world_size"], color(label))
            labels.add(label)
        ax.set_xscale("log", base=2)
        span_one_x(ax, [r.meta["world_size"] for r in rs])
        ax.xaxis.set_major_formatter(matplotlib.ticker.FuncFormatter(lambda v, _: f"{v:g}"))
        ax.set_title(wrap(f"{model}\n{src}", ax.get_position().width * fig.get_figwidth(), 8), fontsize=8)
    handles = legend_handles(sorted(labels), batch_styles, "batch", any(r.meta.get("projected") for r in runs),
                             any(not r.meta.get("projected") for r in runs))
    devices = [device_word([r for r in runs if model_label(r.meta) == m and source(r) == src]) for m, src in panels]
    return finish_panels(fig, axes, out, "tflops_vs_gpus", "GPUs (ranks)", handles,
                         "Scaling: TFLOPS per rank against GPU count (x on the axis: out of memory)", devices)


def measured_at_peak(r):
    """Bytes per category at the moment of rank 0's highest total."""
    m = r.memory[r.memory["rank"] == 0]
    row = m.loc[m["total"].idxmax()]
    return [row[c] for c in CATEGORIES]


def plot_memory(runs, out):
    measured = [r for r in runs if r.meta["status"] == "ok" and not r.meta.get("projected") and len(r.memory)]
    if not measured:
        return None
    measured = sorted(measured, key=lambda r: (model_label(r.meta), r.meta["world_size"], r.meta["label"]))[:12]
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
    per_bar = fig.get_figwidth() * 0.85 / len(measured)  # inches of axis per bar pair
    ax.set_xticks(x, [wrap(f"{r.meta['label']}\n{model_label(r.meta)} w{r.meta['world_size']}", per_bar, 7)
                      for r in measured], fontsize=7)
    ax.set_ylabel("MiB per rank at the peak")
    ax.set_title(wrap("Memory by category: measured (left) beside planned (right, hatched)", fig.get_figwidth() - 1.2,
                      12))
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
    lanes = e[e["rank"].isin(ranks)].groupby("rank")["lane"].nunique().sum()
    # A readable row per lane (labels at 8 pt), drawn at full size in the report.
    fig, ax = plt.subplots(figsize=(13, 1.6 + 0.28 * lanes))
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
            ylabels.append(f"rank {rank} " + lane_name(lane).replace("communication", "comm"))
            y += 1
    handles, labels = ax.get_legend_handles_labels()
    uniq = dict(zip(labels, handles))
    ax.legend(uniq.values(), uniq.keys(), fontsize=8, ncol=len(uniq), loc="lower left", bbox_to_anchor=(0, 1.0),
              frameon=False)
    ax.set_yticks(yticks, ylabels, fontsize=8)
    ax.set_ylim(-0.2, y)
    ax.set_xlabel("ms since the step began")
    ax.set_title(f"{run.meta['label']} {model_label(run.meta)} on {run.meta['world_size']} ranks: step {step}", pad=22)
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
    ap = cli.parser(__doc__, __file__)
    ap.add_argument("results", nargs="+", metavar="RESULT.h5|DIR",
                    help="results (HDF5), or folders searched recursively for them")
    ap.add_argument("--out", required=True, metavar="DIR", help="folder for the PNG and SVG files (required)")
    a = ap.parse_args(argv)
    inputs = Inputs("plots")
    try:
        cli.check_output_dir(a.out, "--out")  # before anything is read or drawn
        _, figs = make_all(a.results, a.out, inputs)
    except cli.BadInput as e:
        print(f"plots: error: {e}", file=sys.stderr)
        return 2
    for name, path in figs.items():
        print(f"plots: {name}: {path} (+ .svg)")
    return inputs.exit_code(0)


if __name__ == "__main__":
    sys.exit(cli.run(__file__, main))
