#!/usr/bin/python3
"""History of the interconnect checks: collective_perf results indexed in an SQLite database,
and per operation, placement and size the trend of every run with the change points in it
(E-Divisive means).

    analysis/history.py add history.db results/interconnect/CLUSTER/
    analysis/history.py show history.db
    analysis/history.py show history.db --op all-reduce --size 64M --since 2026-11-01 \\
        --plot history.png --openmetrics /var/lib/node_exporter/textfile/shardbench.prom

history.py finds WHEN a point's performance changed, over the whole series of runs;
analysis/regress.py is a separate verdict: it judges NOW, the latest runs against a recorded
baseline. Run both: regress for the pass/fail of tonight's check, history for the date,
commit and nodes of the first run after a change.

add DB RESULT...: index each collective_perf result (a file, or a folder searched for *.h5
below it) in DB (created if missing): its start time, git commit (provenance
shardbench_version, git describe), host names in rank order (provenance/ranks), world
size, nodes, backend, comm, dtype, redop, status, path, and per (operation, in-place, size)
the run's figure: an iteration's time is the slowest rank's (a collective ends when its
last rank does), the run's time the median over iterations (as regress.py), with the bus
bandwidth of the results table. The HDF5 files stay the record; the DB is an index keyed on
each file's content (SHA-256), so adding a file again, or a byte copy of it (a recorded
baseline), adds nothing. All or nothing: one bad file (not HDF5, not a collective_perf
result, no samples, non-finite times) is one line naming it, exit 2, and the DB unchanged.
Runs whose data check failed (status failed) are indexed but left out of the trends.

show DB [--op OP] [--size SIZE] [--since DATE] [--last N] [--plot FILE.png] [--openmetrics FILE]
[--alpha A] [--min-segment N] [--min-step F] [--seed S]: one row per series (configuration,
operation, placement, size): first and last run, runs, the latest bus bandwidth and time,
the change points; then each change point with the first run after it (date, commit,
nodes, file) and its step (median of the segment after against the one before, in
percent), and the runs where series changed. --plot draws each series with its change
points; --openmetrics writes the latest figures in the Prometheus text format for
node_exporter's textfile collector (name it *.prom). What show writes is written whole or
not at all: under temporary names that do not end in .png or .prom, renamed together at the
end; a failure, or a signal, leaves the files as they were.

Method: E-Divisive means (Matteson & James 2014, "A nonparametric approach for multiple
change point analysis of multivariate data", JASA 109:334), as MongoDB's
signal-processing-algorithms, Apache Otava (Hunter) and Chromium's perf dashboard use it,
on the log of each run's time: the split maximising the energy statistic (alpha = 1, a
minimum segment of --min-segment runs) is kept when a permutation test (observations
shuffled within the current segments, a fixed seed) finds it significant, then each part
is searched again. A single outlier run lands as often in a small segment when shuffled as
where it is, so it is not a change point. Two searches share --alpha: a joint one over
all series of a configuration (each run a point with one coordinate per series, its log
time centred and scaled by the series' run-to-run noise: a slower link moves every size
a little and is found where no series alone would be), with 3/4 of it, and one per
series, from the joint change points on, with the rest divided over the series
(Bonferroni); a change point whose step is below --min-step is dropped (its neighbours
merged). With 16 runs a change needs 3 runs on each side: no permutation p-value is
below 2 / C(16, 3) = 0.0036.

Exit status: 0 no change point; 1 change point(s) found (show); 2 unusable input (a bad
result file, a DB that is missing or not a history database, an unknown --op, a bad
--size or --since, nothing to show, an output path that cannot be written): one line,
nothing written. The answer ends with the command to run next.
"""
import datetime
import math
import os
import sys

import numpy as np

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import cli  # noqa: E402
import history_db  # noqa: E402
from history_db import config_label, run_order  # noqa: E402

TOOL = "history"


def parse_size(text):
    """Bytes from '65536', '64K', '1M', '1G' (powers of 1024, as collective_perf's -b/-e)."""
    t = text.strip().upper().removesuffix("B").removesuffix("I")
    mult = {"K": 1 << 10, "M": 1 << 20, "G": 1 << 30}.get(t[-1:], 1)
    digits = t[:-1] if t[-1:] in "KMG" and t else t
    if not digits.isdigit() or int(digits) * mult <= 0:
        raise cli.BadInput(f"--size '{text}' is not a size in bytes (e.g. 65536, 64K, 1M)")
    return int(digits) * mult


def human(size):
    for unit, b in (("GiB", 1 << 30), ("MiB", 1 << 20), ("KiB", 1 << 10)):
        if size >= b and size % b == 0:
            return f"{size // b} {unit}"
    return f"{size} B"


def median_busbw(point, size):
    """The bus bandwidth (GB/s) of a run's median iteration: size / time, times the operation's
    bus factor (the results table's busbw / algbw; 1 where it has none)."""
    factor = point["busbw"] / point["algbw"] if point["busbw"] and point["algbw"] else 1.0
    return factor * size / point["time"] / 1e9


def openmetrics_text(series, found):
    def esc(v):
        return str(v).replace("\\", "\\\\").replace("\"", "\\\"").replace("\n", "\\n")
    metrics = [
        ("busbw_gbps", "Bus bandwidth of the latest collective_perf run (GB/s, its results table: "
         "nccl-tests' busbw).", lambda pts, f: pts[-1]["busbw"]),
        ("time_seconds", "Time of the latest run: median over iterations of the slowest rank's time (s).",
         lambda pts, f: pts[-1]["time"]),
        ("median_busbw_gbps", "Bus bandwidth of the latest run's median iteration (GB/s, from time_seconds: "
         "steadier than the mean of a noisy run).", lambda pts, f: median_busbw(pts[-1], pts[-1]["size"])),
        ("run_timestamp_seconds", "Start of the latest run (Unix time, s).",
         lambda pts, f: pts[-1]["run"]["start_unix"]),
        ("runs", "Runs in the history of the point.", lambda pts, f: len(pts)),
        ("change_points", "Change points in the history of the point (E-Divisive means, analysis/history.py).",
         lambda pts, f: len(f["changes"])),
    ]
    lines = []
    for name, help_text, value in metrics:
        full = "shardbench_interconnect_" + name
        lines += [f"# HELP {full} {help_text}", f"# TYPE {full} gauge"]
        for key in sorted(series, key=lambda k: (str(k[0]), k[1], k[2], k[3])):
            (backend, comm, coll, world, nodes, rpn, dtype, redop), op, place, size = key
            v = value(series[key], found[key])
            if v is None or not math.isfinite(v):
                continue
            labels = dict(op=op, size=size, placement="in" if place else "out", world_size=world, nodes=nodes,
                          backend=backend, comm=comm, collectives=coll, dtype=dtype, redop=redop)
            lab = ",".join(f'{k}="{esc(x)}"' for k, x in labels.items())
            lines.append(f"{full}{{{lab}}} {float(v):.10g}" if isinstance(v, float) else f"{full}{{{lab}}} {v}")
    return "\n".join(lines) + "\n"


def plot(path, series, found):
    """Draws each series with its change points into the PNG file `path`."""
    import matplotlib
    matplotlib.use("Agg")
    import matplotlib.dates as mdates
    import matplotlib.ticker
    import matplotlib.pyplot as plt
    panels = sorted({(k[0], k[1], k[2]) for k in series}, key=lambda k: (str(k[0]), k[1], k[2]))
    configs = {k[0] for k in series}
    cols = min(3, len(panels))
    rows = math.ceil(len(panels) / cols)
    fig, axes = plt.subplots(rows, cols, figsize=(5.2 * cols, 3.8 * rows), squeeze=False)
    for ax in axes.ravel()[len(panels):]:
        ax.set_visible(False)
    for ax, (config, op, place) in zip(axes.ravel(), panels):
        keys = sorted((k for k in series if k[:3] == (config, op, place)), key=lambda k: k[3])
        for i, key in enumerate(keys):
            pts = series[key]
            when = [datetime.datetime.fromtimestamp(p["run"]["start_unix"], datetime.timezone.utc) for p in pts]
            # the figure the change points are found in, as a bus bandwidth (factor from the results table)
            bw = np.array([median_busbw(p, key[3]) for p in pts])
            color = f"C{i % 10}"
            ax.plot(when, bw, "o-", ms=3, lw=1, color=color, label=human(key[3]))
            for c in found[key]["changes"]:
                t, ratio = c["t"], c["ratio"]
                ax.axvline(when[t], color=color, ls=":", lw=1.2)
                ax.plot([when[t]], [bw[t]], "v", ms=10, color="red", mec="black")
                ax.annotate(f"{1 / ratio - 1:+.0%}", (when[t], bw[t]), textcoords="offset points", xytext=(4, 6),
                            fontsize=7, color="red")
        ax.set_yscale("log")
        label = matplotlib.ticker.FuncFormatter(lambda v, _: f"{v:.3g}")
        lo, hi = ax.get_ylim()
        ax.yaxis.set_major_formatter(label)  # plain numbers; the minor ticks too within a decade
        ax.yaxis.set_minor_formatter(label if hi / lo < 10 else matplotlib.ticker.NullFormatter())
        ax.set_title(f"{op}, {'in-place' if place else 'out-of-place'}"
                     + (f"\n{config_label(config)}" if len(configs) > 1 else ""), fontsize=9)
        ax.set_ylabel("busbw of the median iteration (GB/s)", fontsize=8)
        ax.xaxis.set_major_formatter(mdates.ConciseDateFormatter(ax.xaxis.get_major_locator()))
        ax.tick_params(which="both", labelsize=7)
        ax.legend(fontsize=6, title="size (v: change point)", title_fontsize=6)
    if len(configs) == 1:
        fig.suptitle(f"Interconnect history: {config_label(next(iter(configs)))}", fontsize=10)
    fig.tight_layout()
    fig.savefig(path, dpi=100)
    plt.close(fig)


def add(a):
    added, known, moved, total, first, last = history_db.add_results(a.db, a.results)
    print(f"{TOOL}: {a.db}: added {added} run(s), {known} already indexed"
          + (f" ({moved} moved: path updated)" if moved else "")
          + f"; it holds {total} run(s), {first} to {last}")
    print(f"next: analysis/history.py show {a.db}")
    return 0


def show(a):
    for path, flag, formats in ((a.plot, "--plot", ["png"]), (a.openmetrics, "--openmetrics", None)):
        if path:
            cli.check_output_file(path, flag, formats=formats)
    if not 0 < a.alpha < 1:
        raise cli.BadInput(f"--alpha {a.alpha} must be in (0, 1)")
    if a.last < 0:
        raise cli.BadInput(f"--last {a.last} must be 0 (all runs) or a positive number of runs")
    if a.min_segment < 2:
        raise cli.BadInput(f"--min-segment {a.min_segment} must be at least 2")
    if not 0 <= a.min_step < math.inf:
        raise cli.BadInput(f"--min-step {a.min_step} must be a finite number >= 0")
    if a.since:
        from shardbench_h5 import parse_utc  # here: its h5py and pandas cost show a second
        since = parse_utc(a.since, "--since").timestamp()
    else:
        since = None
    size = parse_size(a.size) if a.size is not None else None
    con, _ = history_db.open_db(a.db, create=False)
    try:
        series, runs, skipped = history_db.load_series(con, a.db, op=a.op, size=size, since=since, since_text=a.since,
                                                       last=a.last)
    finally:
        con.close()
    found, levels = history_db.detect(series, a.alpha, a.min_segment, a.min_step, a.seed)

    def when(r):
        return r["start_time"].replace("T", " ").replace("Z", "")[:16]

    def point(key):
        return f"{key[1]} {'in-place' if key[2] else 'out-of-place'} {key[3]} B"
    configs = sorted({k[0] for k in series}, key=str)
    hdr = (f"{'operation':<15} {'place':<5} {'size (B)':>11} {'first run':<16} {'last run':<16} {'runs':>5} "
           f"{'busbw GB/s':>10} {'time us':>9}  change points (first run after: step of the time)")
    for config in configs:
        print(f"{config_label(config)}:")
        print(hdr)
        print("-" * len(hdr))
        for key in sorted((k for k in series if k[0] == config), key=lambda k: (k[1], k[2], k[3])):
            _, op, place, size = key
            pts, f = series[key], found[key]
            last = pts[-1]
            cps = ", ".join(f"#{c['t'] + 1} {when(pts[c['t']]['run'])} {c['ratio'] - 1:+.0%}" for c in f["changes"])
            if not f["tested"] and not cps:
                cps = f"- (too few runs: {2 * a.min_segment} needed)"
            bw = f"{last['busbw']:.3g}" if last["busbw"] is not None else "-"
            print(f"{op:<15} {'in' if place else 'out':<5} {size:>11} {when(pts[0]['run']):<16} {when(last['run']):<16} "
                  f"{len(pts):>5} {bw:>10} {last['time'] * 1e6:>9.2f}  {cps or 'none'}")
        print()
    changed = [(k, c) for k in series for c in found[k]["changes"]]
    by_run = {}
    for key, c in changed:
        by_run.setdefault(series[key][c["t"]]["run"]["id"], []).append((key, c))
    if changed:
        print("change points, by the first run after the change (step: median time of the runs after it against "
              "those before, up to the next change point)")
        for rid in sorted(by_run, key=lambda i: run_order(runs[i])):
            r, items = runs[rid], sorted(by_run[rid], key=lambda kc: (str(kc[0][0]), kc[0][1:]))
            print(f"  first run after a change: {r['start_time']}, commit {r['commit_id']}, nodes {r['hosts'] or '?'}: "
                  f"{r['path']} ({len(items)} of {len(series)} series, median step of the time "
                  f"{float(np.median([c['ratio'] for _, c in items])) - 1:+.1%})")
            for key, c in items:
                how = (f"found by the joint search of {c['width']} series, p {c['p']:.2g}" if c["source"] == "joint"
                       else f"found in this series alone, p {c['p']:.2g}")
                print(f"    {point(key)}: run {c['t'] + 1} of {len(series[key])}: time {c['ratio'] - 1:+.1%}, busbw "
                      f"{1 / c['ratio'] - 1:+.1%} (median {c['before'] * 1e6:.4g} -> {c['after'] * 1e6:.4g} us; {how})")
        print()
    # Both files or neither, each replacing the last whole; the temporary names end in .tmp (not
    # .prom: node_exporter's textfile collector reads every *.prom of its folder).
    with cli.Outputs(overwrite=True) as out:
        if a.plot:
            plot(out.temp(a.plot), series, found)
        if a.openmetrics:
            with out.open(a.openmetrics, suffix=".tmp") as f:
                f.write(openmetrics_text(series, found))
                f.flush()
                os.fsync(f.fileno())
        out.publish()
    nruns = len({p["run"]["id"] for v in series.values() for p in v})
    summary = (f"{len(changed)} change point(s) in {len({k for k, _ in changed})} of {len(series)} series"
               if changed else f"no change point in {len(series)} series")
    tests = []
    if levels["joint"]:
        tests.append(f"{levels['joint']} joint test(s) at {levels['level_joint']:.2g}")
    if levels["tested"]:
        tests.append(f"{levels['tested']} series at {levels['level_series']:.2g} each")
    print(f"{TOOL}: {summary} over {nruns} run(s) (E-Divisive means on log times, alpha {a.alpha} in all: "
          f"{' and '.join(tests) or 'no series long enough to test'}; minimum segment {a.min_segment} runs, "
          f"minimum step {a.min_step:.0%})"
          + (f"; {len(skipped)} run(s) with a failed data check left out" if skipped else ""))
    print(f"{TOOL}: this finds when a change happened; analysis/regress.py judges the latest runs against "
          "a baseline (a separate verdict)")
    for path, what in ((a.plot, "the trend"), (a.openmetrics, "the latest figures, for node_exporter's textfile collector")):
        if path:
            print(f"{TOOL}: wrote {path} ({what})")
    latest = max((p["run"] for v in series.values() for p in v), key=lambda r: r["start_unix"])
    if changed:
        (config, op, place, size), _ = max(changed, key=lambda kc: abs(math.log(kc[1]["ratio"])))
        if a.plot:
            nxt = f"analysis/regress.py runs/baselines/<cluster>/ {latest['path']}"
        else:
            nxt = f"analysis/history.py show {a.db} --op {op} --size {size} --plot history.png"
    else:
        nxt = f"analysis/regress.py runs/baselines/<cluster>/ {latest['path']}"
    print(f"next: {nxt}")
    return 1 if changed else 0


def main(argv=None):
    ap = cli.parser(__doc__, __file__)
    sub = ap.add_subparsers(dest="command", metavar="COMMAND", required=True,
                            help="add: index results in the database; show: trends and change points")
    p = sub.add_parser("add", help="index collective_perf results (files or folders) in DB",
                       description="Index collective_perf results in the history database (all or nothing).")
    p.add_argument("db", metavar="DB", help="the SQLite history database (created if missing)")
    p.add_argument("results", nargs="+", metavar="RESULT",
                   help="collective_perf result (HDF5), or a folder searched for *.h5 below it")
    p = sub.add_parser("show", help="trends and change points per operation, placement and size",
                       description="Trends and change points (E-Divisive means) per operation, placement and size.")
    p.add_argument("db", metavar="DB", help="the SQLite history database")
    p.add_argument("--op", help="only this operation (default: all)")
    p.add_argument("--size", help="only this size, in bytes or with K/M/G (powers of 1024) (default: all)")
    p.add_argument("--since", metavar="DATE", help="only runs started at or after DATE, ISO 8601 (default: all)")
    p.add_argument("--last", type=int, default=history_db.DEFAULT_LAST, metavar="N",
                   help="only the latest N runs of each configuration; 0: all (default: 200)")
    p.add_argument("--plot", metavar="FILE.png", help="draw each series with its change points (default: no plot)")
    p.add_argument("--openmetrics", metavar="FILE",
                   help="write the latest figures in the Prometheus text format, for node_exporter's textfile "
                        "collector (name it *.prom) (default: not written)")
    p.add_argument("--alpha", type=float, default=history_db.DEFAULT_ALPHA,
                   help="chance of a false alarm over all series shown, divided among them (default: 0.01)")
    p.add_argument("--min-segment", type=int, default=history_db.DEFAULT_MIN_SEGMENT, metavar="N",
                   help="fewest runs between change points (default: 3)")
    p.add_argument("--min-step", type=float, default=history_db.DEFAULT_MIN_STEP, metavar="FRACTION",
                   help="smallest step of the median time that counts (default: 0.05)")
    p.add_argument("--seed", type=int, default=0, help="seed of the permutation test (default: 0)")
    a = ap.parse_args(argv)
    try:
        return add(a) if a.command == "add" else show(a)
    except cli.BadInput as e:
        print(f"{TOOL}: error: {e}", file=sys.stderr)
        return 2


if __name__ == "__main__":
    try:
        sys.exit(cli.run(__file__, main))
    except Exception as e:  # noqa: BLE001: exit 1 means "change point"; anything unforeseen is unusable input
        print(f"{TOOL}: error: {type(e).__name__}: {' '.join(str(e).split())}", file=sys.stderr)
        sys.exit(2)
