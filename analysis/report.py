#!/usr/bin/python3
"""HTML report of a results folder: the study's figures (analysis/plots.py), a summary
table of every run (measured and projected), and each run's provenance.

Usage: analysis/report.py RESULTS_DIR [--out RESULTS_DIR/report]  → report/index.html
"""
import argparse
import html
import os
import sys

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import plots  # noqa: E402


def fmt(v, spec):
    try:
        return format(v, spec)
    except (TypeError, ValueError):
        return "–"


def main(argv=None):
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("results")
    ap.add_argument("--out")
    a = ap.parse_args(argv)
    out = a.out or os.path.join(a.results, "report")
    if not os.path.isdir(a.results):
        print(f"report: error: {a.results} is not a directory", file=sys.stderr)
        return 2
    inputs = plots.Inputs("report")
    try:
        runs, figs = plots.make_all([a.results], out, inputs)
    except plots.PlotError as e:
        print(f"report: error: {e}", file=sys.stderr)
        return 2
    rows = []
    for r in sorted(runs, key=lambda r: (r.meta["model"], r.meta["label"], r.meta["world_size"],
                                         bool(r.meta.get("projected")))):
        m = r.meta
        rows.append("<tr>" + "".join(f"<td>{html.escape(str(c))}</td>" for c in [
            os.path.relpath(r.path, a.results), m["label"], m["model"], m["world_size"], m["batch_per_rank"],
            m["enc_seq_len"], fmt(m.get("median_step_time_s", float("nan")) * 1e3, ".2f"),
            fmt(m.get("median_model_tflops_per_rank"), ".4g"),
            fmt((m.get("max_peak_memory_bytes") or r.plan.get("peak_total", 0)) / 2**20, ".1f"),
            "projected" if m.get("projected") else "measured", m["status"]]) + "</tr>")
    prov = []
    for r in runs:
        if r.meta.get("projected"):
            continue
        p = r.provenance
        hosts = sorted(set(r.ranks["host"])) if len(r.ranks) else []
        prov.append(f"<li><b>{html.escape(os.path.basename(r.path))}</b>: <code>{html.escape(p.get('command_line', ''))}"
                    f"</code><br>shardbench {html.escape(str(p.get('shardbench_version')))}, "
                    f"{html.escape(str(p.get('compiler')))}, {html.escape(str(p.get('mpi_library')))}, HDF5 "
                    f"{html.escape(str(p.get('hdf5_version')))}; hosts {html.escape(', '.join(hosts))}; "
                    f"{html.escape(str(r.meta.get('start_time')))}</li>")
    fig_html = "".join(
        f'<figure><img src="{os.path.basename(path)}" alt="{name}"><figcaption>{name} '
        f'(<a href="{os.path.basename(path)[:-4]}.svg">SVG</a>)</figcaption></figure>' for name, path in figs.items())
    page = f"""<!doctype html><html><head><meta charset="utf-8"><title>shardbench report</title>
<style>body{{font-family:sans-serif;margin:2em}} table{{border-collapse:collapse;font-size:90%}}
td,th{{border:1px solid #ccc;padding:3px 6px}} figure{{display:inline-block;margin:1em}} img{{max-width:640px}}</style>
</head><body><h1>shardbench report: {html.escape(os.path.abspath(a.results))}</h1>
<p>{len(runs)} results ({sum(1 for r in runs if r.meta.get('projected'))} projected).
TFLOPS are model FLOPs per GPU (3 × forward matmul FLOPs).</p>
<h2>Figures</h2>{fig_html}
<h2>Runs</h2><table><tr><th>file</th><th>strategy</th><th>model</th><th>ranks</th><th>batch</th><th>seq</th>
<th>step ms</th><th>TFLOPS/GPU</th><th>peak MiB</th><th>source</th><th>status</th></tr>{''.join(rows)}</table>
<h2>Provenance</h2><ul>{''.join(prov)}</ul></body></html>"""
    index = os.path.join(out, "index.html")
    with open(index, "w") as f:
        f.write(page)
    print(f"report: {index} ({len(figs)} figures, {len(runs)} runs)")
    return inputs.exit_code(0)


if __name__ == "__main__":
    sys.exit(main())
