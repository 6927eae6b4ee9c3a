#!/usr/bin/python3
"""Which node, which link: the verdict of a pair sweep (collective_perf --pattern pairs).

    analysis/diagnose.py SWEEP.h5 [--baseline DIR] [--retest RETEST.h5] [--json F] [--report-dir DIR]

Every node pair's exchange was timed on its own link, iteration by iteration. For each pair
and size the pair's iteration takes as long as its slowest rank; its figure is the median
over iterations. Two references judge it:
  - the fleet: the healthy level at that size is the median over nodes of each node's median
    pair (so up to half the nodes can be bad and the level stays healthy); a pair is slow when
    its median is more than --threshold slower than that level, beyond the spread between
    healthy pairs (their median absolute deviation, z at alpha / points: Bonferroni over all
    pairs and sizes), and its iterations are slower than the healthy pairs' by a one-sided
    Mann-Whitney rank-sum test at the same level;
  - its own baseline (--baseline: a folder of at least 3 earlier sweeps of the same nodes,
    recorded back to back): as analysis/regress.py judges a point, a t test of the median
    run's log time against the run-to-run spread of the baseline (pooled over pairs), plus
    the rank-sum test of the iterations, and a slowdown beyond --threshold.
Then the blame: the node with the most slow pairs is a suspect when more than half of its
(remaining) pairs, and at least two, are slow; its pairs are set aside and the next node is
tried. A slow pair whose nodes are not suspects is a suspect link. With two nodes only the
pair is known: its link or either node.

A second pass tells a node from a link: the answer prints a collective_perf --pairs command
that re-tests each suspect against known-good nodes (and a suspect link again); give its
result as --retest and only what the re-test confirms is named: a node whose pairs with good
nodes are slow again, a link that is slow again while both its nodes are fine with good
nodes (else the node that is not).

Exit status: 0 healthy; 1 suspects (each named with its evidence pairs and the drop); 2
unusable input (not a pair sweep, a baseline of other nodes or sizes, fewer than 3 baseline
sweeps, an output that cannot be written): one line, nothing written; 3 inconclusive: nothing
found, but the spread lets it see only drops larger than --threshold (the figure is named).
--json writes the verdict for scripts; the `scontrol update ... state=drain` lines are printed,
never run. --report-dir writes report.html with the pair matrix as a heat map.
"""
import base64
import io
import json
import math
import os
import sys

import h5py
import numpy as np

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import cli  # noqa: E402
import regress  # noqa: E402
import shardbench_h5  # noqa: E402
import stats  # noqa: E402
from stats import mad_sd, z_isf  # noqa: E402

KIND_EXCHANGE, KIND_LATENCY = 0, 1


def read_sweep(fname):
    """{'nodes': [...], 'points': {(a, b, kind, size): per-iteration times}, 'facts'} of one sweep."""
    try:
        f = h5py.File(fname, "r")
    except OSError as e:
        raise cli.BadInput(f"{fname}: not a readable HDF5 file ({e})")
    with f:
        if shardbench_h5.attr(f, "program") != "collective_perf" or "pattern" not in f.attrs \
                or shardbench_h5.attr(f, "pattern") != "pairs":
            raise cli.BadInput(f"{fname}: not a pair sweep (collective_perf --pattern pairs)")
        if shardbench_h5.attr(f, "status") != "ok":
            raise cli.BadInput(f"{fname}: its data check found wrong bytes (status {shardbench_h5.attr(f, 'status')})")
        if "samples" not in f or len(f["samples"]) == 0:
            raise cli.BadInput(f"{fname}: no samples")
        nodes = shardbench_h5.attr(f, "node_names").split(",")
        s = f["samples"][()]
        facts = {k: shardbench_h5.attr(f, k) for k in ("iters", "warmup", "latency_bytes", "sizes", "pair_ranks",
                                                         "start_time", "backend")}
    if not np.all(np.isfinite(s["time"])) or np.any(s["time"][s["kind"] != 2] <= 0):
        raise cli.BadInput(f"{fname}: non-finite or non-positive times")
    points = {}
    for kind in (KIND_EXCHANGE, KIND_LATENCY):
        sel = s[s["kind"] == kind]
        lo, hi = np.minimum(sel["node"], sel["peer_node"]), np.maximum(sel["node"], sel["peer_node"])
        for a, b, size in sorted(set(zip(lo.tolist(), hi.tolist(), sel["size"].tolist()))):
            m = (lo == a) & (hi == b) & (sel["size"] == size)
            # an iteration ends with the pair's slowest rank
            points[(nodes[a], nodes[b], kind, int(size))] = stats.slowest_rank(sel["iteration"][m], sel["time"][m])
    return {"file": fname, "nodes": nodes, "points": points, "facts": facts}


def _files(path):
    if os.path.isdir(path):
        files = sorted(os.path.join(path, f) for f in os.listdir(path) if f.endswith(".h5"))
        if not files:
            raise cli.BadInput(f"{path}: no .h5 results in this folder")
        return files
    if not os.path.exists(path):
        raise cli.BadInput(f"{path}: no such file or folder")
    return [path]


def label(kind, size):
    return "latency" if kind == KIND_LATENCY else f"{size} B"


def threshold_of(kind, args):
    """Latency has its own threshold: a few microseconds move with the host's load. None: not judged."""
    return args.latency_threshold if kind == KIND_LATENCY else args.threshold


def fraction_or_off(text):
    if text == "off":
        return None
    return float(text)


def is_slow(t, ref, level):
    """A pair's iterations `t` against the fleet's reference at its size: slower than the healthy
    level by more than the threshold and than the spread lets pass, and by the rank-sum test."""
    slowdown = float(np.median(t)) / ref["healthy_t"] - 1
    if ref["limit"] is None:
        return slowdown, 1.0, False
    p = stats.rank_sum_p(t, ref["pooled"]) if len(ref["pooled"]) else 1.0
    return slowdown, p, slowdown > max(ref["limit"], ref["detectable"]) and p < level


def judge(sweep, args, baseline=None):
    """Per (pair, kind, size): the slowdown against the fleet's healthy level (and the baseline),
    whether it is slow, and per (kind, size) the drop the spread lets it detect."""
    pts = sweep["points"]
    groups = sorted({(k[2], k[3]) for k in pts})
    level = args.alpha / max(1, len(pts))  # Bonferroni over every pair and size
    z = z_isf(level)
    rows, refs = [], {}
    for kind, size in groups:
        keys = [k for k in pts if k[2] == kind and k[3] == size]
        med = {k: float(np.median(pts[k])) for k in keys}
        per_node = {}
        for k in keys:
            for n in k[:2]:
                per_node.setdefault(n, []).append(med[k])
        healthy_t = float(np.median([np.median(v) for v in per_node.values()]))
        limit = threshold_of(kind, args)
        ok = [k for k in keys if med[k] <= healthy_t * (1 + (args.threshold if limit is None else limit))]
        if len(ok) >= 3:  # the spread between healthy links
            sd = mad_sd([math.log(med[k]) for k in ok])
        else:  # too few healthy pairs: the iterations' spread of a pair's median
            sd = float(np.median([mad_sd(np.log(pts[k])) for k in keys])) * math.sqrt(math.pi / 2 / len(pts[keys[0]]))
        ref = refs[(kind, size)] = dict(healthy_t=healthy_t, detectable=math.exp(z * sd) - 1, limit=limit,
                                        pooled=np.concatenate([pts[k] for k in ok]) if ok else np.array([]))
        for k in keys:
            slowdown, p, fleet_slow = is_slow(pts[k], ref, level)
            row = dict(pair=f"{k[0]}:{k[1]}", a=k[0], b=k[1], kind=kind, size=size, what=label(kind, size),
                       time_us=med[k] * 1e6, fleet_us=healthy_t * 1e6, slowdown=slowdown, p_fleet=p,
                       fleet_slow=fleet_slow, base_slowdown=None, base_slow=False)
            if baseline is not None:
                row.update(baseline_verdict(k, pts[k], baseline, args, level))
            row["slow"] = row["fleet_slow"] or row["base_slow"]
            rows.append(row)
    return rows, refs


def baseline_verdict(key, cur, base, args, level):
    """regress.py's test of one point: the current sweep against the baseline sweeps' spread."""
    runs = base["runs"].get(key)
    if runs is None:
        raise cli.BadInput(f"the baseline has no {key[0]}:{key[1]} at {label(key[2], key[3])}: other nodes or sizes")
    b_logs = np.log([np.median(r) for r in runs])
    diff = math.log(float(np.median(cur))) - float(np.median(b_logs))
    sd = max(base["pooled_sd"], float(b_logs.std(ddof=1)))
    se = sd * math.sqrt(math.pi / 2 * (1 / len(runs) + 1))
    p = stats.t_sf(diff / se, base["dof"]) if se > 0 else float(diff <= 0)
    it_slow = stats.rank_sum_p(cur, np.concatenate(runs)) < level
    slowdown = math.exp(diff) - 1
    detectable = math.exp(stats.t_isf(level, base["dof"]) * se) - 1 if se > 0 else 0.0
    limit = threshold_of(key[2], args)
    slow = limit is not None and slowdown > limit and p < level and it_slow and float(np.median(cur)) > max(
        np.median(r) for r in runs) * (1 + limit)
    return dict(base_slowdown=slowdown, p_base=p, base_detectable=detectable, base_slow=slow)


def load_baseline(path, sweep):
    files = _files(path)
    runs = [read_sweep(f) for f in files]
    if len(runs) < regress.MIN_BASELINE_RUNS:
        raise cli.BadInput(f"the baseline has {len(runs)} sweep(s); it needs at least {regress.MIN_BASELINE_RUNS}, "
                           "recorded back to back, to know the run-to-run spread")
    out = {}
    for r in runs:
        for k, t in r["points"].items():
            out.setdefault(k, []).append(t)
    if set(out) != set(sweep["points"]):
        missing = sorted(set(sweep["points"]) - set(out))[:3]
        raise cli.BadInput(f"the baseline and the sweep cover other pairs or sizes (e.g. "
                           f"{', '.join(f'{k[0]}:{k[1]} {label(k[2], k[3])}' for k in missing) or 'extra in baseline'})")
    logs = [np.log([np.median(t) for t in v]) for v in out.values()]
    ss = sum(float(((x - x.mean()) ** 2).sum()) for x in logs)
    dof = sum(len(x) - 1 for x in logs)
    return {"runs": out, "pooled_sd": math.sqrt(ss / dof), "dof": dof, "files": files}


def blame(rows, nodes):
    """Suspect nodes (greedy: most slow pairs first) and links, each with its evidence."""
    slow_pairs = {(r["a"], r["b"]) for r in rows if r["slow"]}
    all_pairs = {(r["a"], r["b"]) for r in rows}
    suspects, left = [], set(all_pairs)
    while True:
        best = None
        for n in nodes:
            mine = [p for p in left if n in p]
            bad = [p for p in mine if p in slow_pairs]
            if len(bad) >= 2 and len(bad) * 2 > len(mine) and (best is None or len(bad) > best[1]):
                best = (n, len(bad))
        if best is None:
            break
        n = best[0]
        suspects.append({"kind": "node", "name": n, "pairs": sorted(f"{a}:{b}" for a, b in slow_pairs if n in (a, b))})
        left = {p for p in left if n not in p}
    blamed = {s["name"] for s in suspects}
    for a, b in sorted(slow_pairs):
        if a not in blamed and b not in blamed:
            kind = "link" if len(nodes) > 2 else "link or node"
            suspects.append({"kind": kind, "name": f"{a}:{b}", "pairs": [f"{a}:{b}"]})
    for s in suspects:
        ev = [r for r in rows if r["slow"] and r["pair"] in s["pairs"]]
        s["evidence"] = [dict(pair=r["pair"], at=r["what"], slowdown_fleet=round(r["slowdown"], 4),
                              slowdown_baseline=None if r["base_slowdown"] is None else round(r["base_slowdown"], 4))
                         for r in ev]
        s["worst_slowdown"] = max(max(r["slowdown"], r["base_slowdown"] or -1) for r in ev)
    return suspects


def retest_pairs(suspects, rows, nodes):
    """The pairs of the second pass: each suspect node with two known-good nodes, each suspect
    link again and each of its nodes with a good node. Good: no suspect node, in no slow pair
    if there are such, fastest first."""
    in_slow = {n for r in rows if r["slow"] for n in (r["a"], r["b"])}
    suspect_nodes = {s["name"] for s in suspects if s["kind"] == "node"}
    speed = {n: np.median([r["time_us"] for r in rows if n in (r["a"], r["b"]) and r["kind"] == KIND_EXCHANGE])
             for n in nodes}
    order = sorted((n for n in nodes if n not in suspect_nodes), key=lambda n: (n in in_slow, speed[n]))
    pairs = []
    for s in suspects:
        ends = [s["name"]] if s["kind"] == "node" else s["name"].split(":")
        if s["kind"] != "node":
            pairs.append(s["name"])
        for i, n in enumerate(ends):
            partners = [g for g in order if g not in ends]
            pairs += [f"{n}:{g}" for g in (partners[:2] if s["kind"] == "node" else partners[i:i + 1] or partners[:1])]
    seen = []
    for p in pairs:
        if p not in seen and f"{p.split(':')[1]}:{p.split(':')[0]}" not in seen:
            seen.append(p)
    return seen, [g for g in order if g not in in_slow]


def confirm(suspects, refs, retest, args):
    """Each suspect against the re-test, judged as the sweep's pairs were: against the first
    sweep's healthy level, spread and iterations at each size."""
    level = args.alpha / max(1, len(retest["points"]))
    slow = {}
    for (a, b, kind, size), t in retest["points"].items():
        if (kind, size) not in refs:
            raise cli.BadInput(f"{retest['file']}: {label(kind, size)} is not a size of the sweep")
        slow[f"{a}:{b}"] = slow.get(f"{a}:{b}", False) or is_slow(t, refs[(kind, size)], level)[2]
    out = []
    for s in suspects:
        if s["kind"] == "node":
            mine = [p for p in slow if s["name"] in p.split(":")]
            if mine and all(slow[p] for p in mine):
                out.append(dict(s, retest="confirmed", retest_pairs=mine))
            elif mine:
                out.append(dict(s, retest="not reproduced" if not any(slow[p] for p in mine) else "unclear",
                                retest_pairs=mine))
        else:
            a, b = s["name"].split(":")
            link = slow.get(s["name"], slow.get(f"{b}:{a}"))
            ends = {n: [p for p in slow if n in p.split(":") and set(p.split(":")) != {a, b}] for n in (a, b)}
            bad_ends = [n for n in (a, b) if ends[n] and all(slow[p] for p in ends[n])]
            if link is None:
                out.append(dict(s, retest="not re-tested"))
            elif bad_ends:
                for n in bad_ends:
                    out.append(dict(s, kind="node", name=n, retest="confirmed (a node, not the link)",
                                    retest_pairs=ends[n], pairs=[s["name"]] + ends[n]))
            elif link:
                out.append(dict(s, kind="link", retest="confirmed", retest_pairs=[s["name"]] + ends[a] + ends[b]))
            else:
                out.append(dict(s, retest="not reproduced", retest_pairs=[s["name"]]))
    return out


def drain_line(s):
    names = s["name"] if s["kind"] == "node" else s["name"].replace(":", ",")
    return (f"scontrol update nodename={names} state=drain reason=\"shardbench diagnose: {s['kind']} "
            f"{s['name']} {s['worst_slowdown']:+.0%} time on {len(s['evidence'])} point(s)\"")


def heat_map_png(sweep, rows, kind, size):
    import matplotlib
    matplotlib.use("Agg")
    import matplotlib.pyplot as plt
    nodes = sweep["nodes"]
    n = len(nodes)
    m = np.full((n, n), np.nan)
    for r in rows:
        if r["kind"] == kind and r["size"] == size:
            i, j = nodes.index(r["a"]), nodes.index(r["b"])
            m[i, j] = m[j, i] = -r["slowdown"] / (1 + r["slowdown"])  # bandwidth change against the fleet
    fig, ax = plt.subplots(figsize=(1.2 + 0.55 * n, 1.0 + 0.5 * n))
    im = ax.imshow(m * 100, cmap="RdYlGn", vmin=-100, vmax=20)
    ax.set_xticks(range(n), nodes, rotation=60, fontsize=7)
    ax.set_yticks(range(n), nodes, fontsize=7)
    for i in range(n):
        for j in range(n):
            if not np.isnan(m[i, j]):
                ax.text(j, i, f"{m[i, j] * 100:+.0f}", ha="center", va="center", fontsize=6)
    fig.colorbar(im, ax=ax, label="bandwidth vs fleet (%)")
    ax.set_title(f"pair bandwidth, {label(kind, size)}", fontsize=8)
    fig.tight_layout()
    buf = io.BytesIO()
    fig.savefig(buf, format="png", dpi=90)
    plt.close(fig)
    return buf.getvalue()


def write_report(path, sweep, rows, verdict, suspects, detect):
    import html
    biggest = max(s for k, s in detect if k == KIND_EXCHANGE)
    png = heat_map_png(sweep, rows, KIND_EXCHANGE, biggest)
    os.makedirs(path, exist_ok=True)
    with open(os.path.join(path, "heatmap.png"), "wb") as f:
        f.write(png)
    items = "".join(f"<li><b>{html.escape(s['kind'])} {html.escape(s['name'])}</b> {s['worst_slowdown']:+.0%}: "
                    f"{html.escape(', '.join(e['pair'] + ' at ' + e['at'] for e in s['evidence']))}"
                    f"{' — re-test: ' + html.escape(s['retest']) if 'retest' in s else ''}</li>" for s in suspects)
    table = "".join(f"<tr><td>{html.escape(r['pair'])}</td><td>{html.escape(r['what'])}</td><td>{r['time_us']:.1f}</td>"
                    f"<td>{r['fleet_us']:.1f}</td><td>{r['slowdown']:+.1%}</td><td>{'slow' if r['slow'] else ''}</td></tr>"
                    for r in rows)
    with open(os.path.join(path, "report.html"), "w") as f:
        f.write(f"<!doctype html><meta charset=utf-8><title>pair sweep diagnosis</title><h1>Pair sweep: "
                f"{html.escape(verdict)}</h1><p>{html.escape(sweep['file'])} ({len(sweep['nodes'])} nodes, "
                f"{html.escape(str(sweep['facts']['start_time']))})</p><ul>{items or '<li>no suspect</li>'}</ul>"
                f"<img alt='pair matrix' src='data:image/png;base64,{base64.b64encode(png).decode()}'>"
                "<table border=1><tr><th>pair</th><th>at</th><th>median (us)</th><th>fleet (us)</th><th>time vs "
                f"fleet</th><th></th></tr>{table}</table>")


def main(argv=None):
    ap = cli.parser(__doc__, __file__)
    ap.add_argument("sweep", metavar="SWEEP", help="collective_perf --pattern pairs result (HDF5)")
    ap.add_argument("--baseline", metavar="DIR", help="earlier sweeps of the same nodes (a folder of at least 3; default: none, the fleet alone)")
    ap.add_argument("--retest", metavar="FILE", help="the second pass: collective_perf --pairs result of the printed pairs (default: none)")
    ap.add_argument("--threshold", type=float, default=0.10, metavar="FRACTION",
                    help="relative slowdown of a pair's median that counts (default: 0.10)")
    ap.add_argument("--latency-threshold", type=fraction_or_off, default=0.5, metavar="FRACTION",
                    help="the same for the latency exchange, or off: not judged (default: 0.5: a few microseconds "
                         "move with the host's load)")
    ap.add_argument("--alpha", type=float, default=0.01, help="chance of a false alarm in the whole sweep (default: 0.01)")
    ap.add_argument("--json", metavar="FILE", help="write the verdict as JSON (default: none)")
    ap.add_argument("--report-dir", metavar="DIR", help="write DIR/report.html with the pair matrix as a heat map (default: none)")
    a = ap.parse_args(argv)
    if not 0 < a.alpha < 1 or not 0 <= a.threshold < math.inf or not 0 <= (a.latency_threshold or 0) < math.inf:
        print(f"diagnose: --alpha {a.alpha} must be in (0, 1), --threshold {a.threshold} and --latency-threshold "
              f"{a.latency_threshold} finite numbers >= 0", file=sys.stderr)
        return 2
    try:
        if a.json:
            cli.check_output_file(a.json, "--json")
        if a.report_dir:
            cli.check_output_dir(a.report_dir, "--report-dir")
    except cli.BadInput as e:
        print(f"diagnose: error: {e}", file=sys.stderr)
        return 2
    try:
        sweep = read_sweep(a.sweep)
        base = load_baseline(a.baseline, sweep) if a.baseline else None
        rows, refs = judge(sweep, a, base)
        # what it can see at a size: the fleet's figure, or with a baseline the better of that
        # and the least powerful pair's own history
        detect = {k: r["detectable"] if base is None else min(r["detectable"], max(
                  x["base_detectable"] for x in rows if (x["kind"], x["size"]) == k))
                  for k, r in refs.items() if r["limit"] is not None}
        suspects = blame(rows, sweep["nodes"])
        retest = read_sweep(a.retest) if a.retest else None
        if retest is not None:
            if not set(retest["nodes"]) <= set(sweep["nodes"]):
                raise cli.BadInput(f"{a.retest}: nodes {', '.join(sorted(set(retest['nodes']) - set(sweep['nodes'])))} "
                                   "are not in the sweep")
            suspects = [s for s in confirm(suspects, refs, retest, a) if s["retest"].startswith("confirmed")]
    except cli.BadInput as e:
        print(f"diagnose: cannot diagnose: {e}", file=sys.stderr)
        return 2
    nodes = sweep["nodes"]
    worst = max(detect.values())
    blind = {k: v for k, v in detect.items() if v > threshold_of(k[0], a)}
    lat = "off" if a.latency_threshold is None else f"{a.latency_threshold:.0%}"
    if suspects:
        verdict, rc = f"{len(suspects)} suspect(s): " + ", ".join(f"{s['kind']} {s['name']}" for s in suspects), 1
    elif blind:
        verdict, rc = (f"inconclusive: the spread between healthy pairs lets it see only drops of "
                       f"{min(blind.values()):+.0%} to {max(blind.values()):+.0%} at {len(blind)} of {len(detect)} "
                       f"sizes (threshold {a.threshold:.0%}, latency {lat})"), 3
    else:
        verdict, rc = f"healthy: no slow node or link among {len(nodes)} nodes", 0
    print(f"{'pair':<24} {'at':>12} {'median us':>11} {'fleet us':>10} {'vs fleet':>9} "
          f"{'vs baseline':>11}  slow")
    for r in rows:
        base = "" if r["base_slowdown"] is None else f"{r['base_slowdown']:+.1%}"
        print(f"{r['pair']:<24} {r['what']:>12} {r['time_us']:>11.1f} {r['fleet_us']:>10.1f} {r['slowdown']:>+9.1%} "
              f"{base:>11}  {'SLOW' if r['slow'] else ''}")
    for s in suspects:
        ev = ", ".join(f"{e['pair']} {e['slowdown_fleet']:+.0%} at {e['at']}" for e in s["evidence"])
        print(f"suspect {s['kind']} {s['name']}: {ev}" + (f" (re-test: {s['retest']})" if "retest" in s else ""))
    print(f"\ndiagnose: {verdict} (threshold {a.threshold:.0%}, alpha {a.alpha} over {len(rows)} points; "
          f"drops it can see: from {min(detect.values()):+.0%} to {worst:+.0%})")
    out = dict(verdict=verdict, exit=rc, sweep=a.sweep, nodes=nodes, threshold=a.threshold, alpha=a.alpha,
               suspects=suspects, detectable={label(k, s): v for (k, s), v in detect.items()},
               pairs=[{k: v for k, v in r.items() if k not in ("a", "b")} for r in rows],
               drain=[drain_line(s) for s in suspects])
    try:
        if a.json:
            with open(a.json + ".tmp", "w") as f:
                json.dump(out, f, indent=1, default=float)
            os.replace(a.json + ".tmp", a.json)
        if a.report_dir:
            write_report(a.report_dir, sweep, rows, verdict, suspects, detect)
    except OSError as e:
        print(f"diagnose: cannot write: {e}", file=sys.stderr)
        return 2
    for line in out["drain"]:
        print(f"  (to drain, not run) {line}")
    if suspects and retest is None:
        pairs, good = retest_pairs(suspects, rows, nodes)
        sizes = [int(x) for x in sweep["facts"]["sizes"].split(",")]
        step = f" -f {sizes[1] / sizes[0]:g}" if len(sizes) > 1 else ""
        if len(pairs) > len(suspects):
            print(f"next: tell a node from a link, re-test against {', '.join(good[:3]) or 'the fastest other nodes'}: "
                  f"collective_perf --pattern pairs --pairs {','.join(pairs)} -b {sizes[0]} -e {sizes[-1]}{step} "
                  f"-n {sweep['facts']['iters']} -w {sweep['facts']['warmup']} --out RETEST.h5 (launched over the same nodes), then "
                  f"analysis/diagnose.py {a.sweep} --retest RETEST.h5")
        else:
            print("next: no known-good node to re-test against; re-run the sweep with more nodes")
    elif rc == 3:
        print(f"next: more iterations (collective_perf -n), a quieter allocation, or --baseline with sweeps of "
              f"these nodes; then analysis/diagnose.py {a.sweep}")
    elif rc == 0:
        print("next: keep it as a baseline sweep of these nodes (a folder of 3 or more for --baseline)")
    return rc


if __name__ == "__main__":
    try:
        sys.exit(cli.run(__file__, main))
    except Exception as e:  # noqa: BLE001: exit 1 means "suspects"; anything unforeseen is unusable input
        print(f"diagnose: cannot diagnose: {type(e).__name__}: {e}", file=sys.stderr)
        sys.exit(2)
