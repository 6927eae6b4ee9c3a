#!/usr/bin/python3
"""HTML report of a results folder: the runs' warnings, a strategy comparison with its
noise, the study's figures (analysis/plots.py), full-size timelines with their Perfetto
traces, a table of every run (measured and projected) and each run's provenance.

    analysis/report.py results/demo                   # -> results/demo/report/index.html
    analysis/report.py results/sweep --out /tmp/r --timelines 2

Nothing is ranked on noise: every axis starts at zero; each strategy's step time is the
median over timed steps of the slowest rank, pooled over repeated runs of the same
configuration, drawn with the fastest and slowest step as error bars and each run's
median as a dot. Labels say what a rank ran on (CPU rank, GPU). Warnings come from the
results (what the programs printed, e.g. more ranks than cores) and from the report's
own checks (failed or skipped steps, few or widely spread steps).

Exit codes: 0 written; 2 bad input (not a folder, no results, an output folder that
cannot be written); 3 some files were unreadable and skipped (one line each), the report
holds the rest.
"""
import html
import json
import os
import sys

import matplotlib
matplotlib.use("Agg")
import matplotlib.pyplot as plt  # noqa: E402
import numpy as np  # noqa: E402

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import cli  # noqa: E402
import plots  # noqa: E402
import to_perfetto  # noqa: E402
from shardbench_h5 import model_label  # noqa: E402

SPREAD_WARN = 0.10  # step-to-step spread (max − min over median) worth a warning
FEW_STEPS = 3


def fmt(v, spec):
    try:
        return format(v, spec)
    except (TypeError, ValueError):
        return "–"


def esc(x):
    return html.escape(str(x))


def measured(runs):
    return [r for r in runs if not r.meta.get("projected") and r.meta["status"] == "ok" and len(r.steps)]


def config_key(r):
    m = r.meta
    return (model_label(m), m["world_size"], m["batch_per_rank"], m["enc_seq_len"], m.get("backend"), m.get("dtype"))


def warnings_of(r, folder):
    """What the program recorded, then what this report finds in the result."""
    m, name = r.meta, os.path.relpath(r.path, folder)
    out = [w for w in str(m.get("warnings") or "").splitlines() if w.strip()]
    if m["status"] not in ("ok", "out-of-memory"):
        out.append(f"status {m['status']}" + (f" (check {m['check_result']})" if m.get("check_result") else ""))
    if m.get("skipped_steps"):
        out.append(f"{m['skipped_steps']} step(s) skipped by dynamic loss scaling")
    if not m.get("projected") and m["status"] == "ok":
        t = plots.slowest_step_times(r)
        if len(t) < FEW_STEPS:
            out.append(f"only {len(t)} timed step(s): the median and its spread say little")
        elif (t.max() - t.min()) / np.median(t) > SPREAD_WARN:
            out.append(f"step times spread {100 * (t.max() - t.min()) / np.median(t):.0f}% "
                       f"({t.min() * 1e3:.2f}–{t.max() * 1e3:.2f} ms): differences smaller than that are noise")
    return [(name, w) for w in out]


def plot_comparison(runs, out):
    """Step time and TFLOPS per strategy for each measured configuration, with their spread."""
    groups = {}
    for r in measured(runs):
        groups.setdefault(config_key(r), {}).setdefault(r.meta["label"], []).append(r)
    # A configuration is compared when it has several strategies or repeated runs.
    groups = {k: v for k, v in sorted(groups.items()) if len(v) > 1 or any(len(rs) > 1 for rs in v.values())}
    if not groups:
        return None, []
    device = plots.device_word([r for g in groups.values() for rs in g.values() for r in rs])
    fig, axes = plt.subplots(len(groups), 2, figsize=(11, 3.6 * len(groups)), squeeze=False)
    notes = []
    for (ax_t, ax_f), (key, by_label) in zip(axes, groups.items()):
        labels = sorted(by_label, key=lambda x: (x != "ddp", x))
        for i, label in enumerate(labels):
            rs = by_label[label]
            steps = np.concatenate([plots.slowest_step_times(r) for r in rs]) * 1e3
            flops = rs[0].meta["model_flops_per_step"] / 1e12
            med = float(np.median(steps))
            for ax, val, lo, hi, each in (
                    (ax_t, med, steps.min(), steps.max(), [np.median(plots.slowest_step_times(r)) * 1e3 for r in rs]),
                    (ax_f, flops / med * 1e3, flops / steps.max() * 1e3, flops / steps.min() * 1e3,
                     [plots.tflops(r) for r in rs])):
                ax.bar(i, val, 0.6, color=plots.color(label), alpha=0.8,
                       yerr=[[val - lo], [hi - val]], capsize=6, ecolor="black")
                ax.plot([i] * len(each), each, "o", color="black", ms=4)
            notes.append(f"{label} ({key[0]}, {key[1]} ranks): {len(rs)} run(s), {len(steps)} timed steps, "
                         f"{steps.min():.2f}–{steps.max():.2f} ms, median {med:.2f} ms")
        for ax in (ax_t, ax_f):
            ax.set_xticks(range(len(labels)), labels)
            ax.set_ylim(bottom=0)
        model, world, batch, seq, backend, dtype = key
        ax_t.set_ylabel("step time (ms), slowest rank")
        ax_f.set_ylabel(f"TFLOPS per {device} (model FLOPs)")
        ax_t.set_title(plots.wrap(f"{model}, {world} ranks, batch {batch}, seq {seq}, {backend} {dtype}", 4.8, 9),
                       fontsize=9)
        ax_f.set_title("bars: median; whiskers: fastest–slowest step; dots: each run", fontsize=9)
    fig.tight_layout()
    return plots.save(fig, out, "comparison"), notes


def timelines(runs, out, limit):
    """Full-size timeline PNGs and Perfetto traces of up to `limit` measured runs."""
    picked = [r for r in measured(runs) if len(r.events)]
    picked = sorted(picked, key=lambda r: (-r.meta["world_size"], r.meta["label"]))[:limit]
    made = []
    for r in picked:
        stem = os.path.splitext(os.path.basename(r.path))[0]
        png = plots.plot_timeline(r, out, f"timeline-{stem}")
        trace = f"{stem}.trace.json"
        with open(os.path.join(out, trace), "w") as f:
            json.dump(to_perfetto.convert(r.path), f, separators=(",", ":"))
        made.append((r, png, trace))
    return made, len([r for r in measured(runs) if len(r.events)])


def run_rows(runs, folder):
    rows = []
    for r in sorted(runs, key=lambda r: (model_label(r.meta), r.meta["label"], r.meta["world_size"],
                                         bool(r.meta.get("projected")))):
        m = r.meta
        t = plots.slowest_step_times(r) * 1e3
        spread = f"{t.min():.2f}–{t.max():.2f}" if len(t) else "–"
        rows.append("<tr>" + "".join(f"<td>{esc(c)}</td>" for c in [
            os.path.relpath(r.path, folder), m["label"], model_label(m), m["world_size"], m["batch_per_rank"],
            m["enc_seq_len"], plots.device_word([r]), fmt(m.get("median_step_time_s", float("nan")) * 1e3, ".2f"),
            spread, fmt(m.get("median_model_tflops_per_rank"), ".4g"),
            fmt((m.get("max_peak_memory_bytes") or r.plan.get("peak_total", 0)) / 2**20, ".1f"), idle_cell(m), bubble_cell(m),
            "projected" if m.get("projected") else "measured", m["status"]]) + "</tr>")
    return rows


def idle_cell(m):
    """The share of the step the ranks did not compute (communication they wait for, and under
    --pp the pipeline bubble)."""
    idle = m.get("idle_share")
    return "–" if idle is None else f"{idle * 100:.1f} %"


def bubble_cell(m):
    """A pipeline's bubble in theory, (S − 1) / (M + S − 1); '–' for a run without one."""
    if m.get("pp_size", 1) <= 1 or m.get("pipeline_bubble_theory") is None:
        return "–"
    return f"{m['pipeline_bubble_theory'] * 100:.1f} %"


def pipelines(runs):
    """One line per pipelined run: its measured bubble beside the theory."""
    items = []
    for r in sorted(runs, key=lambda r: (model_label(r.meta), r.meta["label"], r.meta["world_size"])):
        m = r.meta
        if m.get("pp_size", 1) <= 1 or m.get("status") != "ok" or m.get("idle_share") is None:
            continue
        items.append(f"<li>{esc(m['label'])} {esc(model_label(m))} on {m['world_size']} ranks, {m['pp_size']} stages, "
                     f"{m.get('micro_batches')} micro-batches, {esc(m.get('pp_schedule'))}: bubble "
                     f"{m['idle_share'] * 100:.1f} % {'projected' if m.get('projected') else 'measured'}, "
                     f"{m['pipeline_bubble_theory'] * 100:.1f} % in theory</li>")
    return items


def provenance(runs):
    items = []
    for r in runs:
        if r.meta.get("projected"):
            continue
        p = r.provenance
        hosts = sorted(set(r.ranks["host"])) if len(r.ranks) else []
        devices = sorted(set(r.ranks["device"])) if len(r.ranks) else []
        items.append(f"<li><b>{esc(os.path.basename(r.path))}</b>: <code>{esc(p.get('command_line', ''))}</code><br>"
                     f"shardbench {esc(p.get('shardbench_version'))}, {esc(p.get('compiler'))}, "
                     f"{esc(p.get('mpi_library'))}, HDF5 {esc(p.get('hdf5_version'))}; hosts {esc(', '.join(hosts))}; "
                     f"devices {esc(', '.join(devices))}; {esc(r.meta.get('start_time'))}</li>")
    return items


def figure(path, name, cls="fig"):
    base = os.path.basename(path)
    return (f'<figure class="{cls}"><img src="{base}" alt="{esc(name)}"><figcaption>{esc(name)} '
            f'(<a href="{base[:-4]}.svg">SVG</a>)</figcaption></figure>')


def main(argv=None):
    ap = cli.parser(__doc__, __file__)
    ap.add_argument("results", help="folder of results (HDF5, searched recursively), measured and projected")
    ap.add_argument("--out", help="folder for index.html, the figures and traces (default: RESULTS/report)")
    ap.add_argument("--timelines", type=int, default=8, metavar="N",
                    help="timelines (PNG and Perfetto JSON) of at most N measured runs, largest first; "
                         "0 for none (default: 8)")
    a = ap.parse_args(argv)
    out = a.out or os.path.join(a.results, "report")
    if not os.path.isdir(a.results):
        print(f"report: error: {a.results} is not a directory", file=sys.stderr)
        return 2
    if a.timelines < 0:
        print(f"report: error: --timelines {a.timelines}: must be 0 or more", file=sys.stderr)
        return 2
    inputs = plots.Inputs("report")
    try:
        cli.check_output_dir(out, "--out" if a.out else "the report folder (RESULTS/report)")  # before any work
        runs, figs = plots.make_all([a.results], out, inputs)
        comparison, notes = plot_comparison(runs, out)
        traces, with_events = timelines(runs, out, a.timelines)
    except cli.BadInput as e:
        print(f"report: error: {e}", file=sys.stderr)
        return 2
    device = plots.device_word(runs)
    warns = [w for r in runs for w in warnings_of(r, a.results)]
    warn_html = ("<ul class='warn'>" + "".join(f"<li><b>{esc(n)}</b>: {esc(w)}</li>" for n, w in warns) + "</ul>"
                 if warns else "<p>None.</p>")
    comp_html = (figure(comparison, "strategy comparison", "wide") +
                 "<ul>" + "".join(f"<li>{esc(n)}</li>" for n in notes) + "</ul>" +
                 "<p>Strategies whose whiskers overlap are not ranked by these runs: rerun with more steps "
                 "(and several runs) before reading an order into them.</p>") if comparison else \
        "<p>No configuration was measured with more than one strategy.</p>"
    grid = "".join(figure(p, n) for n, p in figs.items() if n != "timeline")
    tl_html = "".join(
        f'<figure class="wide"><img src="{os.path.basename(png)}" alt="timeline"><figcaption>{esc(r.meta["label"])} '
        f'{esc(model_label(r.meta))} on {r.meta["world_size"]} ranks: the last step (<a href="{os.path.basename(png)[:-4]}'
        f'.svg">SVG</a>); every step of every rank and lane: <a href="{esc(trace)}">{esc(trace)}</a> '
        f'(open in ui.perfetto.dev or chrome://tracing)</figcaption></figure>' for r, png, trace in traces)
    if with_events > len(traces):
        tl_html += f"<p>{len(traces)} of {with_events} measured runs shown (--timelines).</p>"
    pipe = pipelines(runs)
    pipe_html = ("<h2>Pipeline bubbles</h2><p>The share of a step the ranks do not compute (1 − mean compute / "
                 "the slowest rank's step time) beside the bubble of S stages and M micro-batches in theory, "
                 "(S − 1) / (M + S − 1); the excess is communication the stages wait for and imbalance between "
                 "them.</p><ul>" + "".join(pipe) + "</ul>") if pipe else ""
    page = f"""<!doctype html><html><head><meta charset="utf-8"><title>shardbench report</title>
<style>body{{font-family:sans-serif;margin:2em}} table{{border-collapse:collapse;font-size:90%}}
td,th{{border:1px solid #ccc;padding:3px 6px}} figure.fig{{display:inline-block;margin:1em;vertical-align:top}}
figure.fig img{{max-width:100%}} figure.wide{{display:block;margin:1em 0}} figure.wide img{{max-width:none}}
ul.warn li{{color:#8a4b00}}</style>
</head><body><h1>shardbench report: {esc(os.path.normpath(a.results))}</h1>
<p>{len(runs)} results ({sum(1 for r in runs if r.meta.get('projected'))} projected).
TFLOPS are model FLOPs (3 × forward matmul FLOPs) per {esc(device)}; step times are the slowest rank's.</p>
<h2>Warnings</h2>{warn_html}
<h2>Strategy comparison</h2>{comp_html}
<h2>Figures</h2>{grid}
<h2>Timelines</h2>{tl_html or '<p>No measured run with events.</p>'}
{pipe_html}
<h2>Runs</h2><table><tr><th>file</th><th>strategy</th><th>model</th><th>ranks</th><th>batch</th><th>seq</th>
<th>device</th><th>step ms (median)</th><th>step ms (fastest–slowest)</th><th>TFLOPS per rank</th><th>peak MiB</th>
<th>not computing</th><th>pipeline bubble (theory)</th><th>source</th><th>status</th></tr>{''.join(run_rows(runs, a.results))}</table>
<h2>Provenance</h2><ul>{''.join(provenance(runs))}</ul></body></html>"""
    index = os.path.join(out, "index.html")
    with open(index, "w") as f:
        f.write(page)
    print(f"report: {index} ({len(figs)} figures, {len(traces)} timelines, {len(warns)} warnings, {len(runs)} runs)")
    return inputs.exit_code(0)


if __name__ == "__main__":
    sys.exit(cli.run(__file__, main))
