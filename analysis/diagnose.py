#!/usr/bin/python3
"""Which node, which link: the verdict of a pair sweep (collective_perf --pattern pairs).

    analysis/diagnose.py SWEEP.h5 [--retest RETEST.h5] [--baseline DIR] [--json F] [--report-dir DIR]

The sweep ran its whole round robin R times (collective_perf --repeat, the nodes relabelled
each time so a slow moment of the machine falls on other pairs). A pair's sample at a size is
its figure in one repetition: an iteration lasts as long as the pair's slowest rank, the
figure is the median over that repetition's iterations. The tests run over the repetitions
(independent samples), never over the iterations of one burst. Before judging:
  - a round slow as a whole (every pair of it, at least two, more than the threshold slower
    than its own median over the repetitions, in one repetition at one size) is a slow moment
    of the machine, not of a link: its figures are set aside (named in the output), the pairs
    keep their other repetitions (needs 3 or more).
Two references judge a pair:
  - the fleet: a node's figure is the median of its pairs; the nodes within --threshold of
    the median node are presumed good and the healthy level is the median of the pairs between
    them (so two slow nodes of five leave it healthy). A pair is slow when its median over
    the repetitions is more than --threshold slower than that level and than the noise floor
    lets pass, and its repetitions are slower than the healthy pairs' by a one-sided rank-sum
    test (exact for small samples) at alpha / points (Bonferroni over every pair and size).
    The noise floor is z at that level times the larger of the spread between healthy pairs
    (their median absolute deviation) and the spread of a median of R repetitions (the healthy
    pairs' own spread across repetitions). The latency point (8 bytes) gets its own floor and
    its own --latency-threshold; where its floor is above that, latency is not judged (said so)
    and it does not make the verdict inconclusive;
  - its own baseline (--baseline: a folder of at least 3 earlier sweeps of the same nodes):
    as analysis/regress.py judges a point, a t test of the sweep's log figure against the
    run-to-run spread of the baseline (pooled over pairs), plus the rank-sum test of the
    repetitions, and a slowdown beyond --threshold.
Then the blame: the node with the most slow pairs is a candidate when at least two of its
(remaining) pairs are slow and none is fine (a node's own link is on every one of them; with
9 or more pairs a quarter may be fine; a pair as slow but with too few repetitions to test is
not fine); its pairs are set aside and the next node is tried. A slow pair
whose nodes are not candidates is a candidate link. With two nodes only the pair is known:
its link or either node.

Candidates are not suspects. The first pass prints a collective_perf --pairs command that
re-tests each candidate against known-good nodes (a candidate link again, and each of its
nodes with a good node) beside a control pair of two good nodes (its figures against the
sweep's tell whether the re-test ran in a slower minute; the reference is scaled by it).
Given as --retest, only what the re-test confirms is a suspect: a node whose pairs with good
nodes are slow again, a link slow again while both its nodes are fine with good nodes (a node
instead only when at least two of its pairs with good nodes are slow: one slow pair is as
much a second slow path, and the verdict is unclear). Only a confirmed suspect gets its `scontrol ... state=drain` line.

Exit status:
  0  healthy: no candidate, or none the re-test confirmed, and every exchange size could see a
     drop of --threshold;
  1  suspects, confirmed by --retest: each named with its evidence and the drop, and the
     `scontrol update ... state=drain` lines (printed, never run);
  2  unusable input (not a pair sweep, a data check that failed, a re-test of other nodes or
     sizes, a baseline of other nodes or sizes, fewer than 3 baseline sweeps, an output that
     cannot be written): one line, nothing written;
  3  inconclusive: nothing found (or a re-test that was unclear), but the noise floor lets it
     see only drops larger than --threshold at some exchange size, or the repetitions are too
     few for the rank-sum test to reach alpha / points (the figure is named);
  4  unconfirmed candidates: the first pass found candidates and no --retest was given; the
     re-test command is printed, no drain line (slurm/interconnect.sbatch runs it itself).
--json writes the verdict for scripts. --report-dir writes report.html with the pair matrix
as a heat map.
"""
import base64
import io
import json
import math
import os
import sys

import numpy as np

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import cli  # noqa: E402
import shardbench_h5  # noqa: E402
import stats  # noqa: E402
from stats import mad_sd, z_isf  # noqa: E402

KIND_EXCHANGE, KIND_LATENCY = shardbench_h5.PAIR_KIND_EXCHANGE, shardbench_h5.PAIR_KIND_LATENCY
EXIT_HEALTHY, EXIT_SUSPECTS, EXIT_BAD_INPUT, EXIT_INCONCLUSIVE, EXIT_UNCONFIRMED = 0, 1, 2, 3, 4
MIN_REPS_TO_SET_ASIDE = 3  # a pair's own median needs a majority of repetitions to stand on
POOL = 4000  # the healthy pairs' figures a rank-sum test draws on: a fixed random subset beyond it
# (still a sample of the healthy distribution, and the exact test stays cheap and reaches
# any Bonferroni level of a large fleet)


def read_sweep(fname, args):
    """{'nodes', 'points': {(a, b, kind, size): figures over repetitions}, 'set_aside', 'facts'}
    of one sweep, rounds slow as a whole set aside."""
    try:
        sw = shardbench_h5.read_pair_sweep(fname)
    except shardbench_h5.NotAPairSweep as e:
        raise cli.BadInput(str(e))
    fig = sw["figures"]
    set_aside = []
    keep = np.ones(len(fig), bool)
    if sw["repetitions"] >= MIN_REPS_TO_SET_ASIDE:
        own = fig.groupby(["a", "b", "kind", "size"])["time"].transform("median")
        ratio = fig["time"] / own - 1
        for (kind, size, rep, rnd), g in fig.groupby(["kind", "size", "repetition", "round"]):
            limit = threshold_of(kind, args)
            limit = args.threshold if limit is None else limit
            if len(g) >= 2 and (ratio[g.index] > limit).all():
                keep[g.index] = False
                set_aside.append(dict(repetition=int(rep), round=int(rnd), kind=int(kind), size=int(size),
                                      what=label(kind, size), pairs=[f"{a}:{b}" for a, b in zip(g["a"], g["b"])],
                                      slowdown=float(ratio[g.index].min())))
    points = {}
    for (a, b, kind, size), g in fig[keep].groupby(["a", "b", "kind", "size"]):
        points[(a, b, int(kind), int(size))] = g.sort_values("repetition")["time"].to_numpy()
    return {"file": fname, "nodes": sw["nodes"], "points": points, "facts": sw["facts"],
            "repetitions": sw["repetitions"], "set_aside": set_aside}


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
    """A pair's repetitions `t` against the fleet's reference at its size: slower than the
    healthy level by more than the threshold and than the noise floor lets pass, and by the
    rank-sum test of the repetitions against the healthy pairs'."""
    slowdown = float(np.median(t)) / ref["healthy_t"] - 1
    if ref["limit"] is None or not ref["judged"]:
        return slowdown, 1.0, False
    p = stats.rank_sum_p_exact(t, ref["pooled"]) if len(ref["pooled"]) else 1.0
    return slowdown, p, slowdown > max(ref["limit"], ref["detectable"]) and p < level


def reference(pts, keys, kind, args, z, level):
    """The fleet's healthy level at one (kind, size), its noise floor and healthy pool."""
    med = {k: float(np.median(pts[k])) for k in keys}
    per_node = {}
    for k in keys:
        for n in k[:2]:
            per_node.setdefault(n, []).append(med[k])
    node_med = {n: float(np.median(v)) for n, v in per_node.items()}
    level0 = float(np.median(list(node_med.values())))
    limit = threshold_of(kind, args)
    lim = args.threshold if limit is None else limit
    good = {n for n, v in node_med.items() if v <= level0 * (1 + lim)}  # presumed good nodes
    between_good = [med[k] for k in keys if k[0] in good and k[1] in good]
    healthy_t = float(np.median(between_good)) if between_good else level0
    ok = [k for k in keys if med[k] <= healthy_t * (1 + lim)]
    sds = []
    if len(ok) >= 3:  # the spread between healthy pairs
        sds.append(mad_sd([math.log(med[k]) for k in ok]))
    reps = [len(pts[k]) for k in ok]
    if ok and min(reps) >= 2:  # the spread of a median of R repetitions, from the healthy pairs'
        resid = np.concatenate([np.log(pts[k]) - math.log(med[k]) for k in ok])
        sds.append(mad_sd(resid) * math.sqrt(math.pi / 2 / float(np.median(reps))))
    pooled = np.concatenate([pts[k] for k in ok]) if ok else np.array([])
    if len(pooled) > POOL:
        pooled = np.random.default_rng(0).choice(pooled, POOL, replace=False)
    min_p = stats.rank_sum_min_p(int(np.median([len(pts[k]) for k in keys])), len(pooled))
    reach = min_p < level
    detectable = math.exp(z * max(sds)) - 1 if sds and reach else math.inf
    return dict(healthy_t=healthy_t, detectable=detectable, limit=limit, pooled=pooled, min_p=min_p, reach=reach,
                judged=limit is not None and detectable <= limit, ok=ok)


def judge(sweep, args, baseline=None):
    """Per (pair, kind, size): the slowdown against the fleet's healthy level (and the baseline),
    whether it is slow, and per (kind, size) the reference with the drop it can detect."""
    pts = sweep["points"]
    groups = sorted({(k[2], k[3]) for k in pts})
    level = args.alpha / max(1, len(pts))  # Bonferroni over every pair and size
    z = z_isf(level)
    rows, refs = [], {}
    for kind, size in groups:
        keys = [k for k in pts if k[2] == kind and k[3] == size]
        ref = refs[(kind, size)] = reference(pts, keys, kind, args, z, level)
        if kind == KIND_EXCHANGE and ref["limit"] is not None:
            ref["judged"] = True  # an exchange size is always judged; its blindness makes the verdict inconclusive
        for k in keys:
            slowdown, p, fleet_slow = is_slow(pts[k], ref, level)
            row = dict(pair=f"{k[0]}:{k[1]}", a=k[0], b=k[1], kind=kind, size=size, what=label(kind, size),
                       time_us=float(np.median(pts[k])) * 1e6, fleet_us=ref["healthy_t"] * 1e6, slowdown=slowdown,
                       p_fleet=p, repetitions=len(pts[k]), fleet_slow=fleet_slow, base_slowdown=None, base_slow=False,
                       # as slow as a slow pair, but too few repetitions for the test: no evidence
                       # against a node's blame (a node's pair with a set-aside repetition)
                       beyond=ref["limit"] is not None and slowdown > max(ref["limit"], ref["detectable"]))
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
    it_slow = stats.rank_sum_p_exact(cur, np.concatenate(runs)) < level
    slowdown = math.exp(diff) - 1
    detectable = math.exp(stats.t_isf(level, base["dof"]) * se) - 1 if se > 0 else 0.0
    limit = threshold_of(key[2], args)
    slow = limit is not None and slowdown > limit and p < level and it_slow and float(np.median(cur)) > max(
        np.median(r) for r in runs) * (1 + limit)
    return dict(base_slowdown=slowdown, p_base=p, base_detectable=detectable, base_slow=slow)


def load_baseline(path, sweep, args):
    files = _files(path)
    runs = [read_sweep(f, args) for f in files]
    if len(runs) < stats.MIN_BASELINE_RUNS:
        raise cli.BadInput(f"the baseline has {len(runs)} sweep(s); it needs at least {stats.MIN_BASELINE_RUNS}, "
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
    """Candidate nodes (greedy: most slow pairs first) and links, each with its evidence."""
    slow_pairs = {(r["a"], r["b"]) for r in rows if r["slow"]}
    slow_looking = slow_pairs | {(r["a"], r["b"]) for r in rows if r["beyond"]}
    all_pairs = {(r["a"], r["b"]) for r in rows}
    suspects, left = [], set(all_pairs)
    while True:
        best = None
        for n in nodes:
            mine = [p for p in left if n in p]
            bad = [p for p in mine if p in slow_pairs]
            fine = [p for p in mine if p not in slow_looking]
            # a node's NIC is on every one of its pairs: none of them fine (a quarter of a large
            # fleet's may miss by chance); a slow path plus one noisy pair is two links, not a node
            if len(bad) >= 2 and len(fine) <= (len(mine) - 1) // 4 and (best is None or len(bad) > best[1]):
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
        s["slow_at"] = sorted({(int(r["kind"]), int(r["size"])) for r in ev})  # what the re-test must show again
    return suspects


def _ends(s):
    return [s["name"]] if s["kind"] == "node" else s["name"].split(":")


def retest_pairs(suspects, rows, nodes):
    """The pairs of the second pass: each candidate node with two known-good nodes, each
    candidate link again and each of its nodes with a good node, and a control pair of two
    good nodes. Good: no candidate's node, in no slow pair if there are such, fastest first."""
    in_slow = {n for r in rows if r["slow"] for n in (r["a"], r["b"])}
    named = {n for s in suspects for n in _ends(s)}
    speed = {n: np.median([r["time_us"] for r in rows if n in (r["a"], r["b"]) and r["kind"] == KIND_EXCHANGE])
             for n in nodes}
    order = sorted((n for n in nodes if n not in named), key=lambda n: (n in in_slow, speed[n]))
    pairs = []
    for s in suspects:
        ends = _ends(s)
        if s["kind"] != "node":
            pairs.append(s["name"])
        for n in ends:
            partners = [g for g in order if g not in ends]
            pairs += [f"{n}:{g}" for g in partners[:2]]  # two: one slow pair cannot tell a node from a path
    if len(order) >= 2 and pairs:
        pairs.append(f"{order[0]}:{order[1]}")  # the control: is the re-test's minute slower as a whole?
    seen = []
    for p in pairs:
        if p not in seen and f"{p.split(':')[1]}:{p.split(':')[0]}" not in seen:
            seen.append(p)
    return seen, [g for g in order if g not in in_slow]


def _same_pair(points, a, b, kind, size):
    return points.get((a, b, kind, size), points.get((b, a, kind, size)))


def confirm(suspects, refs, sweep, retest, args):
    """Each candidate against the re-test, judged as the sweep's pairs were (against the
    sweep's healthy level, floor and repetitions at each size), the reference scaled by the
    re-test's control pairs (no candidate's node) against their figures in the sweep."""
    named = {n for s in suspects for n in _ends(s)}
    level = args.alpha / max(1, len(retest["points"]))
    scale = {}
    for (a, b, kind, size), t in retest["points"].items():
        if (kind, size) not in refs:
            raise cli.BadInput(f"{retest['file']}: {label(kind, size)} is not a size of the sweep")
    for (kind, size) in {(k[2], k[3]) for k in retest["points"]}:
        ratios = [float(np.median(t)) / float(np.median(_same_pair(sweep["points"], a, b, kind, size)))
                  for (a, b, k2, s2), t in retest["points"].items()
                  if (k2, s2) == (kind, size) and a not in named and b not in named
                  and _same_pair(sweep["points"], a, b, kind, size) is not None]
        # only up: a re-test in a slower minute raises the bar; a control that ran faster (on a
        # shared link one pair's luck: 35 % or 90 % of the rate) must not lower it
        scale[(kind, size)] = max(1.0, float(np.median(ratios))) if ratios else 1.0
    slow_at = {}  # (pair, kind, size): slow again in the re-test
    for (a, b, kind, size), t in retest["points"].items():
        if a in named or b in named:
            ref = dict(refs[(kind, size)])
            ref["healthy_t"] *= scale[(kind, size)]
            ref["pooled"] = ref["pooled"] * scale[(kind, size)]
            slow_at[(f"{a}:{b}", kind, size)] = is_slow(t, ref, level)[2]
    out = []
    for s in suspects:
        # judged where the candidate was slow (an exchange size's candidate is not confirmed,
        # nor its end made a node, by a latency blip of the re-test)
        at = {tuple(x) for x in s["slow_at"]}
        slow = {}
        for (p, kind, size), v in slow_at.items():
            if (kind, size) in at:
                slow[p] = slow.get(p, False) or v
        if s["kind"] == "node":
            mine = [p for p in slow if s["name"] in p.split(":")]
            if mine and all(slow[p] for p in mine):
                out.append(dict(s, retest="confirmed", retest_pairs=mine))
            elif mine:
                out.append(dict(s, retest="not reproduced" if not any(slow[p] for p in mine) else "unclear",
                                retest_pairs=mine))
            else:
                out.append(dict(s, retest="not re-tested"))
        else:
            a, b = s["name"].split(":")
            link = slow.get(s["name"], slow.get(f"{b}:{a}"))
            # each end with good nodes only (another candidate's pair is no evidence of this one)
            ends = {n: [p for p in slow if n in p.split(":") and not set(p.split(":")) - {n} & named]
                    for n in (a, b)}
            bad_ends = [n for n in (a, b) if len(ends[n]) >= 2 and all(slow[p] for p in ends[n])]
            fine = all(ends[n] and not any(slow[p] for p in ends[n]) for n in (a, b))
            if link is None:
                out.append(dict(s, retest="not re-tested"))
            elif bad_ends:
                for n in bad_ends:
                    out.append(dict(s, kind="node", name=n, retest="confirmed (a node, not the link)",
                                    retest_pairs=ends[n], pairs=[s["name"]] + ends[n]))
            elif link and fine:
                out.append(dict(s, kind="link", retest="confirmed", retest_pairs=[s["name"]] + ends[a] + ends[b]))
            elif not link:
                out.append(dict(s, retest="not reproduced", retest_pairs=[s["name"]]))
            else:  # slow again, but an end without two good partners' verdict: link or node?
                out.append(dict(s, retest="unclear", retest_pairs=[s["name"]] + ends[a] + ends[b]))
    once, seen = [], set()  # two candidate links of one bad node confirm that node twice
    for x in out:
        key = (x["kind"], x["name"], x["retest"].startswith("confirmed"))
        if key not in seen:
            seen.add(key)
            once.append(x)
    return once, scale


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


def write_report(out, path, sweep, rows, verdict, suspects, detect):
    import html
    biggest = max(s for k, s in detect if k == KIND_EXCHANGE)
    png = heat_map_png(sweep, rows, KIND_EXCHANGE, biggest)
    out.makedirs(path)
    with out.open(os.path.join(path, "heatmap.png"), "wb") as f:
        f.write(png)
    items = "".join(f"<li><b>{html.escape(s['kind'])} {html.escape(s['name'])}</b> {s['worst_slowdown']:+.0%}: "
                    f"{html.escape(', '.join(e['pair'] + ' at ' + e['at'] for e in s['evidence']))}"
                    f"{' — re-test: ' + html.escape(s['retest']) if 'retest' in s else ''}</li>" for s in suspects)
    table = "".join(f"<tr><td>{html.escape(r['pair'])}</td><td>{html.escape(r['what'])}</td><td>{r['time_us']:.1f}</td>"
                    f"<td>{r['fleet_us']:.1f}</td><td>{r['slowdown']:+.1%}</td><td>{'slow' if r['slow'] else ''}</td></tr>"
                    for r in rows)
    with out.open(os.path.join(path, "report.html")) as f:
        f.write(f"<!doctype html><meta charset=utf-8><title>pair sweep diagnosis</title><h1>Pair sweep: "
                f"{html.escape(verdict)}</h1><p>{html.escape(sweep['file'])} ({len(sweep['nodes'])} nodes, "
                f"{html.escape(str(sweep['facts']['start_time']))})</p><ul>{items or '<li>no suspect</li>'}</ul>"
                f"<img alt='pair matrix' src='data:image/png;base64,{base64.b64encode(png).decode()}'>"
                "<table border=1><tr><th>pair</th><th>at</th><th>median (us)</th><th>fleet (us)</th><th>time vs "
                f"fleet</th><th></th></tr>{table}</table>")


def retest_command(sweep, pairs, path):
    """The collective_perf line of the second pass: the sweep's sizes, iterations and repetitions."""
    f = sweep["facts"]
    sizes = [int(x) for x in f["sizes"].split(",")]
    step = f" -f {sizes[1] / sizes[0]:g}" if len(sizes) > 1 else ""
    return (f"collective_perf --pattern pairs --pairs {','.join(pairs)} -b {sizes[0]} -e {sizes[-1]}{step} "
            f"-n {f['iters']} -w {f['warmup']} --repeat {f['repetitions']} --out RETEST.h5 (launched over the same "
            f"nodes), then analysis/diagnose.py {path} --retest RETEST.h5")


def verdict_of(a, sweep, candidates, confirmed, retest, detect, refs):
    """(verdict, exit status, the line to run next)."""
    nodes = sweep["nodes"]
    blind = {k: v for k, v in detect.items() if k[0] == KIND_EXCHANGE and v > a.threshold}
    n_ex = sum(1 for k in detect if k[0] == KIND_EXCHANGE)
    unreachable = [k for k, r in refs.items() if k[0] == KIND_EXCHANGE and not r["reach"]]
    unclear = [s for s in candidates if s.get("retest") in ("unclear", "not re-tested")]
    gone = [s for s in candidates if s.get("retest") == "not reproduced"]
    note = (f"; {len(gone)} candidate(s) not reproduced by the re-test: " + ", ".join(f"{s['kind']} {s['name']}" for s in gone)
            if gone else "")
    if confirmed:
        return (f"{len(confirmed)} suspect(s): " + ", ".join(f"{s['kind']} {s['name']}" for s in confirmed)
                + " (confirmed by the re-test)" + note), EXIT_SUSPECTS, None
    if candidates and retest is None:
        return (f"{len(candidates)} unconfirmed candidate(s): " + ", ".join(f"{s['kind']} {s['name']}" for s in candidates)
                + " (a first pass names no suspect: re-test them)"), EXIT_UNCONFIRMED, None
    if unreachable:
        reps = sweep["repetitions"]
        return (f"inconclusive: with {reps} repetition(s) the rank-sum test cannot reach alpha / points "
                f"({a.alpha} / {len(sweep['points'])}) at {len(unreachable)} of {n_ex} exchange sizes"
                f"{note}"), EXIT_INCONCLUSIVE, "more repetitions (collective_perf --repeat; 5 or more)"
    if unclear:
        return (f"inconclusive: the re-test was unclear for " + ", ".join(f"{s['kind']} {s['name']}" for s in unclear)
                + note), EXIT_INCONCLUSIVE, "re-test again with more repetitions (--repeat)"
    if blind:
        return (f"inconclusive: the noise floor lets it see only drops of {min(blind.values()):+.0%} to "
                f"{max(blind.values()):+.0%} at {len(blind)} of {n_ex} exchange sizes{note}"), EXIT_INCONCLUSIVE, \
            "more repetitions (collective_perf --repeat), a quieter allocation, or --baseline with sweeps of these nodes"
    return f"healthy: no slow node or link among {len(nodes)} nodes{note}", EXIT_HEALTHY, None


def main(argv=None):
    ap = cli.parser(__doc__, __file__)
    ap.add_argument("sweep", metavar="SWEEP", help="collective_perf --pattern pairs result (HDF5)")
    ap.add_argument("--baseline", metavar="DIR", help="earlier sweeps of the same nodes (a folder of at least 3; default: none, the fleet alone)")
    ap.add_argument("--retest", metavar="FILE", help="the second pass: collective_perf --pairs result of the printed pairs (default: none)")
    ap.add_argument("--threshold", type=float, default=0.10, metavar="FRACTION",
                    help="relative slowdown of a pair's median that counts (default: 0.10)")
    ap.add_argument("--latency-threshold", type=fraction_or_off, default=0.5, metavar="FRACTION",
                    help="the same for the latency exchange, or off: not judged (default: 0.5; judged only where "
                         "its own noise floor lets it see that)")
    ap.add_argument("--alpha", type=float, default=0.01,
                    help="level of the tests over the whole sweep, Bonferroni over its points (default: 0.01; "
                         "docs/interconnect.md gives the false-alarm rate measured on healthy sweeps)")
    ap.add_argument("--json", metavar="FILE", help="write the verdict as JSON (default: none)")
    ap.add_argument("--report-dir", metavar="DIR", help="write DIR/report.html with the pair matrix as a heat map (default: none)")
    a = ap.parse_args(argv)
    if not 0 < a.alpha < 1 or not 0 <= a.threshold < math.inf or not 0 <= (a.latency_threshold or 0) < math.inf:
        print(f"diagnose: --alpha {a.alpha} must be in (0, 1), --threshold {a.threshold} and --latency-threshold "
              f"{a.latency_threshold} finite numbers >= 0", file=sys.stderr)
        return EXIT_BAD_INPUT
    try:
        if a.json:
            cli.check_output_file(a.json, "--json")
        if a.report_dir:
            cli.check_output_dir(a.report_dir, "--report-dir")
    except cli.BadInput as e:
        print(f"diagnose: error: {e}", file=sys.stderr)
        return EXIT_BAD_INPUT
    try:
        sweep = read_sweep(a.sweep, a)
        base = load_baseline(a.baseline, sweep, a) if a.baseline else None
        rows, refs = judge(sweep, a, base)
        # what it can see at a size: the fleet's figure, or with a baseline the better of that
        # and the least powerful pair's own history
        detect = {k: r["detectable"] if base is None else min(r["detectable"], max(
                  x["base_detectable"] for x in rows if (x["kind"], x["size"]) == k))
                  for k, r in refs.items() if r["limit"] is not None}
        candidates = blame(rows, sweep["nodes"])
        retest = read_sweep(a.retest, a) if a.retest else None
        confirmed, scale = [], {}
        if retest is not None:
            if not set(retest["nodes"]) <= set(sweep["nodes"]):
                raise cli.BadInput(f"{a.retest}: nodes {', '.join(sorted(set(retest['nodes']) - set(sweep['nodes'])))} "
                                   "are not in the sweep")
            if candidates:
                candidates, scale = confirm(candidates, refs, sweep, retest, a)
                confirmed = [s for s in candidates if s["retest"].startswith("confirmed")]
    except cli.BadInput as e:
        print(f"diagnose: cannot diagnose: {e}", file=sys.stderr)
        return EXIT_BAD_INPUT
    nodes = sweep["nodes"]
    verdict, rc, todo = verdict_of(a, sweep, candidates, confirmed, retest, detect, refs)
    lat = [r for k, r in refs.items() if k[0] == KIND_LATENCY]
    lat_note = ""
    if a.latency_threshold is None:
        lat_note = "latency off"
    elif lat and not lat[0]["judged"]:
        floor = lat[0]["detectable"]
        lat_note = ("latency not judged: " + (f"its noise floor across repetitions, {floor:+.0%}, is above "
                    f"--latency-threshold {a.latency_threshold:.0%}" if floor < math.inf else "too few repetitions"))
    print(f"{'pair':<24} {'at':>12} {'median us':>11} {'fleet us':>10} {'vs fleet':>9} "
          f"{'vs baseline':>11} {'reps':>4}  slow")
    for r in rows:
        b = "" if r["base_slowdown"] is None else f"{r['base_slowdown']:+.1%}"
        print(f"{r['pair']:<24} {r['what']:>12} {r['time_us']:>11.1f} {r['fleet_us']:>10.1f} {r['slowdown']:>+9.1%} "
              f"{b:>11} {r['repetitions']:>4}  {'SLOW' if r['slow'] else ''}")
    for x in sweep["set_aside"]:
        print(f"set aside: repetition {x['repetition'] + 1}, round {x['round'] + 1} at {x['what']}: every pair of it "
              f"({', '.join(x['pairs'])}) at least {x['slowdown']:+.0%} slower than its own median: a slow moment of "
              "the machine, not a link")
    for s in candidates:
        ev = ", ".join(f"{e['pair']} {e['slowdown_fleet']:+.0%} at {e['at']}" for e in s["evidence"])
        word = "suspect" if s in confirmed else "candidate"
        print(f"{word} {s['kind']} {s['name']}: {ev}" + (f" (re-test: {s['retest']})" if "retest" in s else ""))
    for (kind, size), f in sorted(scale.items()):
        if abs(f - 1) > a.threshold:
            print(f"note: the re-test's control pairs ran {f - 1:+.0%} against the sweep at {label(kind, size)}: "
                  "its reference is scaled by that")
    shown = [v for k, v in detect.items() if k[0] == KIND_EXCHANGE] or list(detect.values())
    sees = (f"drops it can see: from {min(shown):+.0%} to {max(shown):+.0%}" if max(shown) < math.inf else
            "drops it can see: " + (f"from {min(shown):+.0%}, none at some sizes" if min(shown) < math.inf else "none"))
    print(f"\ndiagnose: {verdict} (threshold {a.threshold:.0%}, alpha {a.alpha} over {len(rows)} points, "
          f"{sweep['repetitions']} repetition(s); {sees}{'; ' + lat_note if lat_note else ''})")
    out = dict(verdict=verdict, exit=rc, sweep=a.sweep, nodes=nodes, threshold=a.threshold, alpha=a.alpha,
               repetitions=sweep["repetitions"], candidates=candidates if rc != EXIT_SUSPECTS else [],
               suspects=confirmed, set_aside=sweep["set_aside"], latency=lat_note or "judged",
               detectable={label(k, s): v for (k, s), v in detect.items()},
               pairs=[{k: v for k, v in r.items() if k not in ("a", "b")} for r in rows],
               drain=[drain_line(s) for s in confirmed])
    try:
        with cli.Outputs(overwrite=True) as o:  # a re-test's verdict replaces the first pass's, whole
            if a.json:
                with o.open(a.json) as f:
                    json.dump(out, f, indent=1, default=float)
            if a.report_dir:
                write_report(o, a.report_dir, sweep, rows, verdict, confirmed or candidates, detect)
            o.publish()
    except (OSError, cli.BadInput) as e:
        print(f"diagnose: cannot write: {e}", file=sys.stderr)
        return EXIT_BAD_INPUT
    for line in out["drain"]:
        print(f"  (to drain, not run) {line}")
    if rc == EXIT_UNCONFIRMED:
        pairs, good = retest_pairs(candidates, rows, nodes)
        if len(pairs) > len(candidates):
            print(f"next: confirm or clear them, re-test against {', '.join(good[:3]) or 'the fastest other nodes'}: "
                  + retest_command(sweep, pairs, a.sweep))
        else:
            print("next: no known-good node to re-test against; re-run the sweep with more nodes")
    elif todo:
        print(f"next: {todo}; then analysis/diagnose.py {a.sweep}")
    elif rc == EXIT_HEALTHY:
        print("next: keep it as a baseline sweep of these nodes (a folder of 3 or more for --baseline)")
    return rc


if __name__ == "__main__":
    try:
        sys.exit(cli.run(__file__, main))
    except Exception as e:  # noqa: BLE001: exit 1 means "suspects"; anything unforeseen is unusable input
        print(f"diagnose: cannot diagnose: {type(e).__name__}: {e}", file=sys.stderr)
        sys.exit(2)
