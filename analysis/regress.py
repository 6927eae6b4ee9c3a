#!/usr/bin/python3
"""Interconnect regression check: compare collective_perf results, per operation, size and
placement, using every iteration's time.

    analysis/regress.py runs/baselines/CLUSTER/ results/collectives-today.h5 --report-dir regress-report

BASELINE and CURRENT are collective_perf HDF5 files or directories of them. For each
(operation, in/out-of-place, size) the time of an iteration is the slowest rank's (a
collective ends when its last rank does). A point is a regression when it is slower by
more than --threshold (relative, on the median) AND the slowdown is significant: a
one-sided Mann-Whitney rank-sum test at --alpha, or with --method bootstrap, the lower
bound of a (1 − alpha) bootstrap confidence interval of the median slowdown is above 0.
Prints a table, writes DIR/report.md and DIR/report.png, and exits 1 on any regression,
0 otherwise, 2 when the inputs cannot be compared (nothing is written then).
"""
import math
import os
import sys

import h5py
import numpy as np

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import cli  # noqa: E402


class InputError(Exception):
    pass


def _attr(f, name):
    v = f.attrs[name]
    return v.decode() if isinstance(v, bytes) else (v.item() if hasattr(v, "item") else v)


def load(path):
    """{(op, in_place, size): per-iteration times} and run facts, from files or a directory."""
    files = [path]
    if os.path.isdir(path):
        files = sorted(os.path.join(path, f) for f in os.listdir(path) if f.endswith(".h5"))
        if not files:
            raise InputError(f"{path}: no .h5 results in this directory")
    points, facts = {}, None
    for fname in files:
        try:
            f = h5py.File(fname, "r")
        except OSError as e:
            raise InputError(f"{fname}: not an HDF5 file ({e})")
        with f:
            if _attr(f, "program") != "collective_perf" if "program" in f.attrs else True:
                raise InputError(f"{fname}: not a collective_perf result")
            this = {k: _attr(f, k) for k in ("world_size", "dtype", "redop", "backend", "nodes", "status")}
            this["comm"] = _attr(f, "comm") if "comm" in f.attrs else "nccl" if this["backend"] == "cuda" else "mpi"
            if "," in this["comm"]:
                raise InputError(f"{fname}: compares several communication libraries (--comm {this['comm']}): "
                                 "a baseline and a check use one")
            if this["status"] == "failed":
                raise InputError(f"{fname}: its data check found wrong elements (status failed): not comparable")
            names = [n.decode() if isinstance(n, bytes) else n for n in f["samples"].attrs["op_names"]]
            s = f["samples"][()]
        if facts is None:
            facts = dict(this, files=[fname])
        else:
            for k in ("world_size", "dtype", "redop", "comm"):
                if this[k] != facts[k]:
                    raise InputError(f"{fname}: {k} {this[k]} differs from {facts['files'][0]}'s {facts[k]}")
            facts["files"].append(fname)
        for key in {(int(r["op"]), int(r["in_place"]), int(r["size"])) for r in s}:
            op, place, size = key
            sel = s[(s["op"] == op) & (s["in_place"] == place) & (s["size"] == size)]
            iters = np.unique(sel["iteration"])
            per_iter = np.array([sel["time"][sel["iteration"] == i].max() for i in iters])
            k = (names[op], place, size)
            if k in points:
                raise InputError(f"{fname}: {names[op]} {size} B appears in more than one file of {path}")
            points[k] = per_iter
    return points, facts


def rank_sum_p(slower, faster):
    """One-sided Mann-Whitney U p-value that `slower` is stochastically larger (normal
    approximation with tie correction)."""
    x, y = np.asarray(slower, float), np.asarray(faster, float)
    n1, n2 = len(x), len(y)
    allv = np.concatenate([x, y])
    order = allv.argsort(kind="mergesort")
    ranks = np.empty(len(allv))
    sorted_v = allv[order]
    i = 0
    while i < len(allv):  # average ranks of ties
        j = i
        while j + 1 < len(allv) and sorted_v[j + 1] == sorted_v[i]:
            j += 1
        ranks[order[i:j + 1]] = 0.5 * (i + j) + 1
        i = j + 1
    u = ranks[:n1].sum() - n1 * (n1 + 1) / 2
    _, counts = np.unique(allv, return_counts=True)
    n = n1 + n2
    var = n1 * n2 / 12.0 * ((n + 1) - (counts ** 3 - counts).sum() / (n * (n - 1)))
    if var <= 0:
        return 1.0
    z = (u - n1 * n2 / 2.0 - 0.5) / math.sqrt(var)  # continuity correction
    return 0.5 * math.erfc(z / math.sqrt(2))


def bootstrap_lower(base, cur, alpha, rng):
    """Lower bound of the (1 − alpha) two-sided bootstrap CI of median(cur)/median(base) − 1."""
    b = rng.choice(base, size=(2000, len(base)))
    c = rng.choice(cur, size=(2000, len(cur)))
    ratios = np.median(c, axis=1) / np.median(b, axis=1) - 1
    return float(np.quantile(ratios, alpha / 2)), float(np.quantile(ratios, 1 - alpha / 2))


def compare(base, cur, args):
    rng = np.random.default_rng(12345)
    rows = []
    for key in sorted(base, key=lambda k: (k[0], k[1], k[2])):
        b, c = base[key], cur[key]
        slowdown = float(np.median(c) / np.median(b) - 1)  # time: > 0 is slower
        if args.method == "rank-sum":
            p_slow, p_fast = rank_sum_p(c, b), rank_sum_p(b, c)
            slow_sig, fast_sig = p_slow < args.alpha, p_fast < args.alpha
            stat = f"p={min(p_slow, p_fast):.2g}"
        else:
            lo, hi = bootstrap_lower(b, c, args.alpha, rng)
            slow_sig, fast_sig = lo > 0, hi < 0
            stat = f"CI=[{lo:+.1%},{hi:+.1%}]"
        verdict = "same"
        if slow_sig and slowdown > args.threshold:
            verdict = "REGRESSION"
        elif fast_sig and -slowdown / (1 + slowdown) > args.threshold:
            verdict = "improvement"
        op, place, size = key
        rows.append(dict(op=op, placement="in" if place else "out", size=size, base_us=np.median(b) * 1e6,
                         cur_us=np.median(c) * 1e6, bw_change=1 / (1 + slowdown) - 1, stat=stat, verdict=verdict))
    return rows


def main(argv=None):
    ap = cli.parser(__doc__, __file__)
    ap.add_argument("baseline", metavar="BASELINE", help="collective_perf result (HDF5), or a folder of them")
    ap.add_argument("current", metavar="CURRENT", help="collective_perf result (HDF5), or a folder of them")
    ap.add_argument("--threshold", type=float, default=0.05, metavar="FRACTION",
                    help="relative slowdown of the median that counts (default: 0.05)")
    ap.add_argument("--alpha", type=float, default=0.01, help="significance level (default: 0.01)")
    ap.add_argument("--method", choices=["rank-sum", "bootstrap"], default="rank-sum",
                    help="significance test: one-sided Mann-Whitney rank-sum, or a bootstrap confidence "
                         "interval of the median slowdown (default: rank-sum)")
    ap.add_argument("--report-dir", default="regress-report", metavar="DIR",
                    help="where report.md and report.png go (default: regress-report)")
    a = ap.parse_args(argv)
    if not 0 < a.alpha < 1 or a.threshold < 0:
        print("regress: --alpha must be in (0, 1) and --threshold >= 0", file=sys.stderr)
        return 2
    try:
        base, bf = load(a.baseline)
        cur, cf = load(a.current)
        if bf["world_size"] != cf["world_size"]:
            raise InputError(f"rank counts differ: baseline {bf['world_size']}, current {cf['world_size']}")
        for k in ("dtype", "redop", "comm"):
            if bf[k] != cf[k]:
                raise InputError(f"{k} differs: baseline {bf[k]}, current {cf[k]}")
        if set(base) != set(cur):
            def names(keys):
                shown = [f"{o} {'in' if p else 'out'}-of-place {s} B" for o, p, s in keys[:4]]
                return ", ".join(shown) + (" ..." if len(keys) > 4 else "") or "none"
            only_b, only_c = sorted(set(base) - set(cur)), sorted(set(cur) - set(base))
            raise InputError(f"operations or sizes differ: only in baseline: {names(only_b)}; "
                             f"only in current: {names(only_c)}")
    except InputError as e:
        print(f"regress: cannot compare: {e}", file=sys.stderr)
        return 2
    rows = compare(base, cur, a)
    hdr = f"{'operation':<15} {'place':<5} {'size (B)':>12} {'baseline us':>12} {'current us':>12} {'busbw change':>13} {'test':>22}  verdict"
    lines = [hdr, "-" * len(hdr)]
    for r in rows:
        lines.append(f"{r['op']:<15} {r['placement']:<5} {r['size']:>12} {r['base_us']:>12.2f} {r['cur_us']:>12.2f} "
                     f"{r['bw_change']:>+12.1%} {r['stat']:>22}  {r['verdict']}")
    print("\n".join(lines))
    regressions = [r for r in rows if r["verdict"] == "REGRESSION"]
    summary = (f"{len(regressions)} regression(s) in {len(rows)} points" if regressions
               else f"no regression in {len(rows)} points")
    print(f"\nregress: {summary} (threshold {a.threshold:.0%}, {a.method}, alpha {a.alpha}); "
          f"{bf['world_size']} ranks, {bf['dtype']} {bf['redop']}")
    write_report(a, rows, summary, bf, cf)
    print(f"regress: wrote {os.path.join(a.report_dir, 'report.md')} and report.png")
    return 1 if regressions else 0


def write_report(a, rows, summary, bf, cf):
    import matplotlib
    matplotlib.use("Agg")
    import matplotlib.pyplot as plt
    os.makedirs(a.report_dir, exist_ok=True)
    with open(os.path.join(a.report_dir, "report.md"), "w") as f:
        f.write(f"# Interconnect regression report\n\n**{summary}** — threshold {a.threshold:.0%}, "
                f"{a.method} test at alpha {a.alpha}; {bf['world_size']} ranks, {bf['dtype']}, {bf['redop']}.\n\n"
                f"- baseline: {', '.join(bf['files'])}\n- current: {', '.join(cf['files'])}\n\n"
                "| operation | placement | size (B) | baseline (us) | current (us) | busbw change | test | verdict |\n"
                "|---|---|---:|---:|---:|---:|---|---|\n")
        for r in rows:
            f.write(f"| {r['op']} | {r['placement']} | {r['size']} | {r['base_us']:.2f} | {r['cur_us']:.2f} | "
                    f"{r['bw_change']:+.1%} | {r['stat']} | {r['verdict']} |\n")
        f.write("\n![bandwidth against size](report.png)\n")
    ops = sorted({r["op"] for r in rows})
    fig, axes = plt.subplots(1, len(ops), figsize=(4.2 * len(ops), 3.6), squeeze=False)
    for ax, op in zip(axes[0], ops):
        for place, style in (("out", "-"), ("in", "--")):
            pts = [r for r in rows if r["op"] == op and r["placement"] == place]
            if not pts:
                continue
            size = [r["size"] for r in pts]
            ax.plot(size, [r["size"] / r["base_us"] / 1e3 for r in pts], "o" + style, color="tab:blue",
                    label=f"baseline ({place})")
            ax.plot(size, [r["size"] / r["cur_us"] / 1e3 for r in pts], "s" + style, color="tab:red",
                    label=f"current ({place})")
            for r in pts:
                if r["verdict"] == "REGRESSION":
                    ax.annotate("!", (r["size"], r["size"] / r["cur_us"] / 1e3), color="red", fontsize=14)
        ax.set_xscale("log", base=2)
        ax.set_xlabel("size (bytes)")
        ax.set_ylabel("algorithm bandwidth (GB/s), median")
        ax.set_title(op)
        ax.legend(fontsize=7)
    fig.tight_layout()
    fig.savefig(os.path.join(a.report_dir, "report.png"), dpi=100)


if __name__ == "__main__":
    sys.exit(main())
