#!/usr/bin/python3
"""Interconnect regression check: compare collective_perf results, per operation, size and
placement, against a recorded baseline, judged by the spread between the history's earlier
checks (--history) or, without enough of them, between the baseline's runs.

    analysis/regress.py runs/baselines/CLUSTER/ results/collectives-today.h5 --report-dir regress-report
    analysis/regress.py runs/baselines/CLUSTER/ results/interconnect/CLUSTER/collectives-JOB/ \\
        --history results/interconnect/CLUSTER/history.db

BASELINE is a directory of collective_perf HDF5 results, one file per run, at least
MIN_BASELINE_RUNS runs of the same points recorded back to back (slurm/interconnect.sbatch
SB_RECORD=1 does this); CURRENT is one result or a directory of them. For each (operation,
in-place or out-of-place, size) the time of an iteration is the slowest rank's (a
collective ends when its last rank does), and a run's time is the median over its
iterations.

Byte-identical files are one run (a copy is not another measurement: counted once, named in
the output); a baseline run that is also a current one is left out of the baseline.

The noise model. With --history DB (the history database of earlier checks,
analysis/history.py add; slurm/interconnect.sbatch passes its SB_HISTORY), a point's
spread is the spread between the earlier checks of the same configuration (backend,
library, blocking or not, ranks, nodes, ranks per node, type, reduction) in the history:
nights, not one minute. A check is the runs of one Slurm job (else of one folder), its
figure the median of its runs'; the spread is the standard deviation of their log figures,
robust to outlier checks (up to a tenth of them, each left out when the others' mean and
spread put it beyond 0.001 / checks: stats.spread_outliers_out), pooled within the levels
between the point's change points (history_db.detect: E-Divisive means, as `history.py show`: each check's
deviation from its own level's mean, so that a slowdown found three nights ago leaves the
spread between nights as it was), and only the checks before the current's first run,
without its files. A point needs checks for history_db.MIN_CHECKS - 1 (5) degrees of freedom
(6 checks at one level); with fewer, or without --history, its spread is
the one between the baseline's runs, which knows only the minute it was recorded in. The
summary line and report.md say which spread judged the points ("history: N checks from
DATE to DATE", or "the baseline's N back-to-back runs (they know one minute's spread, not
the nights': ...)"), the table's spread column per point.

A point is a regression when all three hold:
  - its median over the current runs is slower than the median over the baseline runs, and
    (judged by the baseline's spread) than the slowest baseline run, by more than
    --threshold (relative);
  - the slowdown is beyond the run-to-run spread: a one-sided t test of the median current
    run's log time against the median baseline run's, p(slower) below alpha / points
    (Bonferroni: alpha is the chance of one false alarm in the whole comparison). With the
    history: the baseline's minute and tonight's check are each a draw of a check, so the
    spread s is the one of the kept checks and the baseline together, the baseline counted
    at the level nearest it (a baseline unlike the checks widens it, and is named: never a
    regression every night), their difference has the standard error s * sqrt(2), dof the
    pooled one. With the baseline's: the spread between
    baseline runs, pooled over the sizes and placements of the operation, never below the
    point's own;
  - the iterations agree: a one-sided Mann-Whitney rank-sum test (or with --method
    bootstrap, the bootstrap CI of the median slowdown) at the same level.
Improvements are judged the same way, in the other direction.

"No regression" at a point is a claim of its own, judged as one side of an equivalence test:
the point's upper confidence bound on the slowdown (`bound` in the table: the measured
change plus the margin the t test above needs at alpha / points, from the same spread and
numbers of runs) must be at most --threshold, so that the data rule out a slowdown of the
threshold there. A point that is not flagged and whose bound is above --threshold is
inconclusive: the spread is too large, or rests on too few runs or checks, for a slowdown of
--threshold to be told from noise there. The table also gives the smallest slowdown each
point could have detected (`detectable`: the margin alone, what the spread allows whatever
tonight measured). A bound that ignores the measured change (the detectable figure alone
against the threshold) called an unchanged check inconclusive where it had measured the
point faster than the baseline: measured, 4 of 20 unchanged checks on emulated hosts with
10 to 13 checks of history (the bound: 0 of the same 20). The remedy for inconclusive points
is more baseline runs (slurm/interconnect.sbatch SB_BASELINE_RUNS; and check runs, SB_RUNS),
more iterations, or a quieter allocation for the baseline and the checks.

A regression is confirmed before it pages anyone: with --confirm RECHECK (the check run again
right after a flagged one: slurm/interconnect.sbatch does it), a flagged point stays a
regression only where RECHECK, judged the same way, flags it too; a point RECHECK does not
flag again is "not reproduced" (a slow minute of the host: measured, an unchanged check's
three runs 6.8 % slower at one point of eight, once in 20), and with none confirmed the
verdict is inconclusive.

Judged by the baseline's minute with a history too short for its spread (1 to MIN_CHECKS - 1
earlier checks since the point's last change point, and too few before it), a flagged point that is no slower than
the slowest of those recorded after the baseline by --threshold is "not new": the baseline's
minute is unlike the nights since, and the baseline cannot tell that from a change (measured:
an idle loopback history whose checks all read the all-gather 20-45 % slower than the
baseline's minute, each check confirmed by its re-check). With none left flagged, the verdict
is inconclusive.

Prints a table and a summary line, writes DIR/report.md and DIR/report.png (both or
neither). Exit status:
  0  no regression: every point's bound on the slowdown is at most --threshold;
  1  regression: at least one point flagged (even if others are inconclusive), and with
     --confirm flagged by the re-check too;
  2  unusable input (not a collective_perf result, a corrupt or empty samples table,
     non-finite times, a baseline of fewer than MIN_BASELINE_RUNS runs, inputs that cannot
     be compared, a --history that is not a history database, a --report-dir that cannot
     be written): one line, nothing written;
  3  inconclusive: no regression found, but at least one point's bound on the slowdown is
     above --threshold; the summary line names how many and their bounds (best and worst).
     Also where the flagged points were not reproduced by --confirm's re-check or are not
     new, and where points were slower but the current runs' ranks had less than
     STARVED_SHARE (80 %) of the baseline runs' CPU share
     (collective_perf records each rank's process CPU over wall time, cpu_share_min): a check
     beside other work on its cores is slower for the host, not the fabric; it says so.
"""
import math
import os
import sys

import numpy as np

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import cli  # noqa: E402
import history_db  # noqa: E402
import shardbench_h5  # noqa: E402
from stats import MIN_BASELINE_RUNS, bootstrap_lower, rank_sum_p, t_isf, t_sf  # noqa: E402
# A check whose ranks had less than this fraction of the baseline's CPU share (process CPU over
# wall time) ran beside other work on its cores; its slowdown is the host's. Measured on the
# 2-core VM, 2 ranks of collective_perf: 52 % beside a 4-rank pair sweep, 2.7 % with two busy
# loops more (docs/interconnect.md, "Regression check").
STARVED_SHARE = 0.8


def starved(bf, cf):
    """Why the current runs cannot convict the fabric (their ranks starved of CPU against the
    baseline's), or None (not starved, or shares not recorded)."""
    b = [x for x in bf["cpu_shares"] if x is not None]
    c = [x for x in cf["cpu_shares"] if x is not None]
    if not b or not c:
        return None
    ref, cur = float(np.median(b)), float(np.median(c))
    if cur >= STARVED_SHARE * ref:
        return None
    return (f"its ranks had {cur:.0%} of a core (the least of the ranks, median over the current runs) against the "
            f"baseline's {ref:.0%}: other work ran on its cores, and a slowdown then is the host's, not the fabric's")


def read_run(fname):
    """({(op name, in_place, size): per-iteration times}, the file's CollectiveResult) of one
    result file (shardbench_h5.read_collective: the one reader of collective_perf results)."""
    res = shardbench_h5.read_collective(fname)
    this = res.facts
    if "," in this["comm"]:
        raise cli.BadInput(f"{fname}: compares several communication libraries (--comm {this['comm']}): "
                           "a baseline and a check use one")
    if this["status"] == "failed":
        raise cli.BadInput(f"{fname}: its data check found wrong elements (status failed): not comparable")
    points = {}
    for (op, place, size, comm, dtype, redop), pt in res.points.items():
        if (comm, dtype, redop) != (this["comm"], this["dtype"], this["redop"]):
            raise cli.BadInput(f"{fname}: measures {comm} {dtype} {redop} beside {this['comm']} {this['dtype']} "
                               f"{this['redop']}: a baseline and a check measure one library, type and reduction")
        points[(op, place, size)] = pt.iterations
    return points, res


def load(path):
    """{point: [per-iteration times of each run]} and facts, from a file or a directory of runs.
    Byte-identical files are one run (a copy is not a second measurement): the first is kept,
    the others listed in facts['duplicates'] as (copy, the file it repeats)."""
    runs, facts, seen = {}, None, {}
    for fname in shardbench_h5.collective_files(path):
        points, res = read_run(fname)
        this = res.facts
        if res.sha256 in seen:
            facts["duplicates"].append((fname, seen[res.sha256]))
            continue
        seen[res.sha256] = fname
        if facts is None:
            facts = dict(this, files=[fname], sha256=[res.sha256], starts=[this["start_unix"]], duplicates=[],
                         cpu_shares=[this["cpu_share"]])
        else:
            for k in ("world_size", "groups", "dtype", "redop", "comm"):
                if this[k] != facts[k]:
                    raise cli.BadInput(f"{fname}: {k} {this[k]} differs from {facts['files'][0]}'s {facts[k]}")
            facts["files"].append(fname)
            facts["sha256"].append(res.sha256)
            facts["starts"].append(this["start_unix"])
            facts["cpu_shares"].append(this["cpu_share"])
        for k, v in points.items():
            runs.setdefault(k, []).append(v)
    return runs, facts


def drop_runs(runs, facts, other):
    """The runs of `facts` whose content is also one of `other`'s (a baseline run that is also a
    current one) taken out, each listed in facts['duplicates'] as (file, the other's file)."""
    theirs = dict(zip(other["sha256"], other["files"]))
    keep = [i for i, h in enumerate(facts["sha256"]) if h not in theirs]
    if len(keep) == len(facts["sha256"]):
        return runs
    for i, f in enumerate(facts["files"]):
        if i not in keep:
            facts["duplicates"].append((f, theirs[facts["sha256"][i]] + " (a current run)"))
    for k in ("files", "sha256", "starts"):
        facts[k] = [facts[k][i] for i in keep]
    return {p: [v[i] for i in keep] for p, v in runs.items()}


def between_runs(base, cur, history=None):
    """Per point: the log-time difference of the median current run from the median baseline run,
    its standard error, the dof and where its spread came from. From the history (`history`:
    history_db.between_checks' answer) where it knows the point: the spread between the earlier
    checks and the baseline (each a draw of the same kind as tonight's check, so the
    difference of two has sqrt(2) times it). Elsewhere from the baseline's runs, pooled over
    the points of each operation (for power with few runs), but never below a point's own."""
    logs = {k: (np.log([np.median(r) for r in base[k]]), np.log([np.median(r) for r in cur[k]])) for k in base}
    out = {}
    for op in {k[0] for k in base}:
        keys = [k for k in logs if k[0] == op]
        ss = sum(float(((logs[k][0] - logs[k][0].mean()) ** 2).sum()) for k in keys)
        dof = sum(len(logs[k][0]) - 1 for k in keys)
        pooled = math.sqrt(ss / dof)
        for k in keys:
            b, c = logs[k]
            diff = float(np.median(c) - np.median(b))
            h = (history or {}).get(k)
            if h and "sd" in h:
                # The baseline's minute is one more check (the reference the others are held to):
                # a baseline unlike the nights widens the spread, so it makes every night
                # inconclusive (and is named), not a regression.
                # Between change points it joins the level nearest it (its time does not say which:
                # a level can change between the baseline and the first check).
                segs = [np.asarray(x, float) for x in h["segments"]]
                j = int(np.argmin([abs(x.mean() - np.median(b)) for x in segs]))
                segs[j] = np.append(segs[j], np.median(b))
                n = sum(len(x) - 1 for x in segs)
                sd = math.sqrt(sum(float(((x - x.mean()) ** 2).sum()) for x in segs) / n)
                out[k] = (diff, sd * math.sqrt(2), n, "history")
                continue
            sd = max(pooled, float(b.std(ddof=1)))
            # medians: one run several times slower (a shared machine has them) moves neither
            # side; a median of n normal values varies pi/2 times as much as their mean
            out[k] = (diff, sd * math.sqrt(math.pi / 2 * (1 / len(b) + 1 / len(c))), dof, "baseline")
    return out


def _expm1(x):
    """exp(x) - 1, infinite instead of an OverflowError."""
    return math.expm1(x) if x < 700 else math.inf


def pct(x, sign=True):
    """A fraction as a percentage: one decimal below 10 %, none above, powers of ten from
    100000 % (+2.1%, +35%, +1770%, +4.9e+11%)."""
    if not math.isfinite(x):
        return ("+" if sign and x > 0 else "-" if x < 0 else "") + "inf%"
    v = 100 * x
    if abs(v) >= 1e5:  # a baseline whose runs differ a thousandfold: +4.9e+11%
        return f"{v:{'+' if sign else ''}.2g}%"
    return f"{v:{'+' if sign else ''}.{1 if abs(v) < 10 else 0}f}%"


def threshold_pct(x):
    """--threshold as typed, in percent: 5%, 2.5%, 100000%."""
    return f"{100 * x:.4f}".rstrip("0").rstrip(".") + "%"


def span(values):
    """'+35% to +220%' (best to worst), or one figure where they print alike."""
    lo, hi = pct(min(values)), pct(max(values))
    return lo if lo == hi else f"{lo} to {hi}"


def verdict(rows, a, confirmed=""):
    """(exit status, summary line, the settings it rests on) of a comparison's rows;
    `confirmed` follows the count of regressions (what the re-check said of them)."""
    regressions = [r for r in rows if r["verdict"] == "REGRESSION"]
    unsure = [r for r in rows if r["verdict"] == "inconclusive"]
    thr = threshold_pct(a.threshold)
    stats = f"alpha {a.alpha} over all points, {a.method}"
    if regressions:
        summary = f"{len(regressions)} regression(s) in {len(rows)} points{confirmed}"
        if unsure:
            summary += (f"; {len(unsure)} other point(s) inconclusive: may be up to "
                        f"{span([r['bound'] for r in unsure])} slower")
        return 1, summary, f"threshold {thr}, {stats}"
    if unsure:
        rest = len(rows) - len(unsure)
        summary = (f"inconclusive: {len(unsure)} of {len(rows)} points may be up to "
                   f"{span([r['bound'] for r in unsure])} slower (threshold {thr}); "
                   + (f"no regression found in the other {rest}" if rest else "no regression found"))
        return 3, summary, stats
    summary = (f"no regression in {len(rows)} points; each is at most {span([r['bound'] for r in rows])} slower, "
               f"within the threshold (smallest detectable {span([r['detectable'] for r in rows])})")
    return 0, summary, f"threshold {thr}, {stats}"


def compare(base, cur, args, history=None):
    """One row per point: medians, bandwidth change, p-values with their direction, verdict."""
    rng = np.random.default_rng(12345)
    level = args.alpha / len(base)  # Bonferroni: alpha for the whole comparison
    spread = between_runs(base, cur, history)
    rows = []
    for key in sorted(base, key=lambda k: (k[0], k[1], k[2])):
        run_meds = [np.median(r) for r in base[key]]  # a verdict needs beyond every run, not only the centre
        b_med = float(np.median(run_meds))
        c_med = float(np.median([np.median(r) for r in cur[key]]))
        slowdown = c_med / b_med - 1  # time: > 0 is slower
        diff, se, n, source = spread[key]
        p_slow = t_sf(diff / se, n) if se > 0 else float(diff <= 0)
        p_fast = 1.0 - p_slow if se > 0 else float(diff >= 0)
        # the smallest slowdown the t test could flag here: diff must exceed t_isf(level) * se.
        # Not clamped to the threshold: above it, a slowdown of --threshold passes unseen.
        detectable = _expm1(t_isf(level, n) * se) if se > 0 else 0.0
        # the most this point can be slower at that level: the claim "no regression" needs it
        # within the threshold (detectable alone would ignore what tonight measured)
        bound = _expm1(diff + t_isf(level, n) * se) if se > 0 else _expm1(diff)
        b_all, c_all = np.concatenate(base[key]), np.concatenate(cur[key])
        if args.method == "rank-sum":
            it_slow, it_fast = rank_sum_p(c_all, b_all) < level, rank_sum_p(b_all, c_all) < level
        else:
            lo, hi = bootstrap_lower(b_all, c_all, level, rng)
            it_slow, it_fast = lo > 0, hi < 0
        stat = f"p(slower)={p_slow:.2g}" if slowdown >= 0 else f"p(faster)={p_fast:.2g}"
        verdict = "same"
        # Judged by the baseline's runs alone, a verdict needs beyond every one of them too; the
        # history's spread between checks is the noise model itself (a busy minute's slowest
        # baseline run is no bound on a regression).
        beyond_slowest = source == "history" or c_med > max(run_meds) * (1 + args.threshold)
        beyond_fastest = source == "history" or c_med * (1 + args.threshold) < min(run_meds)
        if slowdown > args.threshold and beyond_slowest and p_slow < level and it_slow:
            verdict = "REGRESSION"
            # Judged by the baseline's minute, with too few checks for a spread: where the earlier
            # checks read as slow already, the slowdown is not tonight's; the minute the baseline
            # was recorded in is unlike the nights since, which the baseline cannot tell from a change.
            few = (history or {}).get(key, {}).get("few")
            if source == "baseline" and few is not None and len(few) and c_med <= math.exp(max(few)) * (1 + args.threshold):
                verdict = "not new"
        elif (-slowdown / (1 + slowdown) > args.threshold and beyond_fastest
              and p_fast < level and it_fast):
            verdict = "improvement"
        elif bound > args.threshold:
            verdict = "inconclusive"  # "same" here would claim more than the spread allows
        op, place, size = key
        # where the history judges: how far the baseline lies from its checks' median
        off = None
        if source == "history":
            h = history[key]
            centre = float(np.median(h["logs"]))
            if abs(math.log(b_med) - centre) > t_isf(level, h["dof"]) * h["sd"] * math.sqrt(1 + 1 / len(h["logs"])):
                off = math.exp(centre) / b_med - 1
        rows.append(dict(op=op, placement="in" if place else "out", size=size, base_us=b_med * 1e6, base_off=off,
                         cur_us=c_med * 1e6, bw_change=1 / (1 + slowdown) - 1, detectable=detectable, bound=bound, stat=stat,
                         verdict=verdict, spread=source,
                         spread_label=(f"hist:{history[key]['checks']}" if source == "history"
                                       else f"base:{len(base[key])}")))
    return rows


def check_comparable(base, bf, cur, cf):
    if bf["groups"] != cf["groups"]:
        raise cli.BadInput(f"collective_perf --groups differ: baseline {bf['groups']}, current {cf['groups']}")
    if bf["world_size"] != cf["world_size"]:
        raise cli.BadInput(f"rank counts differ: baseline {bf['world_size']}, current {cf['world_size']}")
    for k in ("dtype", "redop", "comm"):
        if bf.get(k) != cf.get(k):
            raise cli.BadInput(f"{k} differs: baseline {bf[k]}, current {cf[k]}")
    if set(base) != set(cur):
        def names(keys):
            shown = [f"{o} {'in-place' if p else 'out-of-place'} {s} B" for o, p, s in keys[:4]]
            return ", ".join(shown) + (" ..." if len(keys) > 4 else "") or "none"
        only_b, only_c = sorted(set(base) - set(cur)), sorted(set(cur) - set(base))
        raise cli.BadInput(f"operations or sizes differ: only in baseline: {names(only_b)}; "
                           f"only in current: {names(only_c)}")
    few = min(len(v) for v in base.values())
    if few < MIN_BASELINE_RUNS:
        dups = f" ({len(bf['duplicates'])} byte-identical file(s) not counted)" if bf["duplicates"] else ""
        raise cli.BadInput(f"the baseline has {few} run(s) of some points{dups}; it needs at least {MIN_BASELINE_RUNS} "
                           "runs recorded back to back, to know the run-to-run spread (SB_RECORD=1 records them)")


def history_spread(a, base, bf, cf):
    """history_db.between_checks for the points of `base`, the checks of the current's
    configuration before its first run and none of its files, those starved of CPU against the
    baseline (starved()'s rule) left out; {} without --history."""
    if not a.history:
        return {}

    def config_of_point(key):
        return history_db.configuration_of(cf, cf["comm"], cf["dtype"], cf["redop"])
    shares = [x for x in bf["cpu_shares"] if x is not None]
    return history_db.between_checks(a.history, config_of_point, sorted(base), exclude=set(cf["sha256"]),
                                     before=min(cf["starts"]),
                                     min_share=STARVED_SHARE * float(np.median(shares)) if shares else None,
                                     after=max(bf["starts"]))


def when(iso):
    return iso.replace("T", " ").replace("Z", "")[:16]


def spread_text(rows, history, a, nb):
    """Which spread the verdict used, for the summary line and the report: the history's
    (its checks and dates) or the baseline's back-to-back runs (with that fallback's limit)."""
    hist = [history[(r["op"], r["placement"] == "in", r["size"])] for r in rows if r["spread"] == "history"]
    parts = []
    if hist:
        n = sorted({h["checks"] for h in hist})
        first, last = min(h["first"] for h in hist), max(h["last"] for h in hist)
        text = (f"history: {n[0] if len(n) == 1 else f'{n[0]} to {n[-1]}'} checks from {when(first)} to {when(last)}"
                + (f", pooled within the levels between {max(h['changes'] for h in hist)} change point(s)"
                   if any(h["changes"] for h in hist) else ""))
        outliers = sum(1 for h in hist if h["left_out"])
        if outliers:
            most = max(h["left_out"] for h in hist)
            text += f", {'one outlier check' if most == 1 else f'up to {most} outlier checks'} left out at {outliers} point(s)"
        hungry = max(h.get("starved", 0) for h in hist)
        if hungry:
            text += f", {hungry} check(s) starved of CPU left out"
        parts.append(text + (f" at {len(hist)} points" if len(hist) < len(rows) else ""))
    rest = len(rows) - len(hist)
    if rest:
        if not a.history:
            why = "no --history"
        else:
            reasons = sorted({history[(r["op"], r["placement"] == "in", r["size"])]["reason"]
                              for r in rows if r["spread"] != "history"})
            why = f"--history: {'; '.join(reasons)}, {history_db.MIN_CHECKS} needed"
        parts.append(f"the baseline's {nb} back-to-back runs" + (f" at {rest} points" if hist else "")
                     + f" (they know one minute's spread, not the nights': {why})")
    return "spread: " + "; ".join(parts)


def main(argv=None):
    ap = cli.parser(__doc__, __file__)
    ap.add_argument("baseline", metavar="BASELINE", help="collective_perf result (HDF5), or a folder of them")
    ap.add_argument("current", metavar="CURRENT", help="collective_perf result (HDF5), or a folder of them")
    ap.add_argument("--threshold", type=float, default=0.05, metavar="FRACTION",
                    help="relative slowdown of the median that counts (default: 0.05)")
    ap.add_argument("--alpha", type=float, default=0.01, help="chance of a false alarm in the whole comparison (default: 0.01)")
    ap.add_argument("--method", choices=["rank-sum", "bootstrap"], default="rank-sum",
                    help="the test of the iterations: one-sided Mann-Whitney rank-sum, or a bootstrap confidence "
                         "interval of the median slowdown; the runs are always judged against the run-to-run spread "
                         "(default: rank-sum)")
    ap.add_argument("--history", metavar="DB",
                    help="the history database of earlier checks (analysis/history.py add): the spread between "
                         f"them is the noise model wherever a point has {history_db.MIN_CHECKS - 1} degrees of freedom "
                         f"({history_db.MIN_CHECKS} earlier checks of the current's configuration), pooled within the "
                         "levels between its change points (default: none: the "
                         "spread between the baseline's runs)")
    ap.add_argument("--confirm", metavar="RECHECK",
                    help="the check run again (a result or a folder of them): a flagged point is a regression "
                         "only where RECHECK is flagged too (default: none: every flagged point is one)")
    ap.add_argument("--report-dir", default="regress-report", metavar="DIR",
                    help="where report.md and report.png go (default: regress-report)")
    a = ap.parse_args(argv)
    if not 0 < a.alpha < 1 or not 0 <= a.threshold < math.inf:
        print(f"regress: --alpha {a.alpha} must be in (0, 1) and --threshold {a.threshold} a finite number >= 0",
              file=sys.stderr)
        return 2
    try:
        cli.check_output_dir(a.report_dir, "--report-dir")  # before the comparison: 1 and 3 must mean the verdict
    except cli.BadInput as e:
        print(f"regress: error: {e}", file=sys.stderr)
        return 2
    try:
        base, bf = load(a.baseline)
        cur, cf = load(a.current)
        # a baseline run that is also a current one is the current: the baseline is the others
        base = drop_runs(base, bf, cf)
        if not bf["files"]:
            raise cli.BadInput("every baseline run is byte-identical to a current one: nothing to compare with")
        check_comparable(base, bf, cur, cf)
        history = history_spread(a, base, bf, cf)
        recheck, rf = None, None
        if a.confirm:
            recheck, rf = load(a.confirm)
            if set(rf["sha256"]) & set(cf["sha256"]):
                raise cli.BadInput(f"--confirm {a.confirm}: holds runs of the current check itself (a re-check is "
                                   f"other runs, measured after it)")
            check_comparable(base, bf, recheck, rf)
    except cli.BadInput as e:
        print(f"regress: cannot compare: {e}", file=sys.stderr)
        return 2
    for side in (bf, cf):
        for copy, of in side["duplicates"]:
            print(f"regress: {copy}: not counted: byte-identical to {of} (a copy is not another run)")
    rows = compare(base, cur, a, history)
    if recheck is not None and any(r["verdict"] == "REGRESSION" for r in rows):
        again = {(r["op"], r["placement"], r["size"]) for r in compare(base, recheck, a, history)
                 if r["verdict"] == "REGRESSION"}
        for r in rows:
            if r["verdict"] == "REGRESSION" and (r["op"], r["placement"], r["size"]) not in again:
                r["verdict"] = "not reproduced"
    hdr = (f"{'operation':<15} {'place':<5} {'size (B)':>12} {'baseline us':>12} {'current us':>12} "
           f"{'busbw change':>13} {'detectable':>10} {'bound':>8} {'test (runs)':>22} {'spread':>8}  verdict")
    lines = [hdr, "-" * len(hdr)]
    for r in rows:
        lines.append(f"{r['op']:<15} {r['placement']:<5} {r['size']:>12} {r['base_us']:>12.2f} {r['cur_us']:>12.2f} "
                     f"{r['bw_change']:>+12.1%} {pct(r['detectable']):>10} {pct(r['bound']):>8} {r['stat']:>22} {r['spread_label']:>8}  "
                     f"{r['verdict']}")
    print("\n".join(lines))
    gone = [r for r in rows if r["verdict"] == "not reproduced"]
    not_new = [r for r in rows if r["verdict"] == "not new"]
    confirmed = ("" if recheck is None else ", confirmed by the re-check" + (
        f"; {len(gone)} more not reproduced by it" if gone else "")) + (
        f"; {len(not_new)} more as slow in the earlier checks (not new)" if not_new else "")
    code, summary, settings = verdict(rows, a, confirmed)
    if not_new and code != 1:
        h = [history[(r["op"], r["placement"] == "in", r["size"])] for r in not_new]
        checks = sorted({len(x["few"]) for x in h})
        rest = (summary[len("inconclusive: "):] if code == 3 else f"no regression in the other {len(rows) - len(not_new)}")
        summary = (f"inconclusive: {len(not_new)} of {len(rows)} points slower than the baseline's runs but no slower "
                   f"than the {checks[0] if len(checks) == 1 else f'{checks[0]} to {checks[-1]}'} earlier check(s) "
                   f"since {when(min(x['first'] for x in h))} (the baseline's minute is unlike the nights since, "
                   f"not tonight's change; {history_db.MIN_CHECKS} checks give the history's spread); {rest}")
        code = 3
    if gone and code != 1:
        rest = (summary[len("inconclusive: "):] if code == 3 else
                f"no regression in the other {len(rows) - len(gone)}")
        summary = (f"inconclusive: {len(gone)} of {len(rows)} points read as regressions, not reproduced by the "
                   f"re-check {a.confirm} (a slow minute, not the fabric); {rest}")
        code = 3
    why = None
    if code == 1:  # a starved check cannot convict, nor a starved re-check confirm
        why = starved(bf, cf)
        if not why and rf is not None and starved(bf, rf):
            why = "the re-check's: " + starved(bf, rf)
    if why:  # never a regression from a starved check: inconclusive, and why
        slow = sum(r["verdict"] == "REGRESSION" for r in rows)
        summary = f"inconclusive: {slow} of {len(rows)} points read as regressions, not judged: {why}"
        code = 3
    nb, nc = min(len(v) for v in base.values()), min(len(v) for v in cur.values())
    spread = spread_text(rows, history, a, nb)
    print(f"\nregress: {summary} ({settings}; {nb} baseline runs, {nc} current; {spread}); "
          f"{bf['world_size']} ranks, {bf['dtype']} {bf['redop']}")
    if why:
        print("regress: run the check again on a quiet allocation (nothing else on its nodes' cores)")
    elif any(r["verdict"] == "inconclusive" for r in rows):
        print(f"regress: {advice(rows)}")
    unlike = baseline_unlike(rows)
    if unlike:
        print(f"regress: {unlike}")
    try:
        write_report(a, rows, summary, settings, spread, bf, cf)
    except cli.BadInput as e:
        print(f"regress: error: {e}", file=sys.stderr)
        return 2
    print(f"regress: wrote {os.path.join(a.report_dir, 'report.md')} and report.png")
    return code


INCONCLUSIVE_ADVICE = ("at the inconclusive points the baseline runs vary too much, or are too few, to tell a "
                       "slowdown of the threshold from noise: record more baseline runs (SB_BASELINE_RUNS; and "
                       "check runs, SB_RUNS), more iterations (SB_ITERS), or on a quieter allocation")
HISTORY_ADVICE = ("at the inconclusive points judged by the history, its checks vary too much from one to the next "
                  "to tell a slowdown of the threshold from noise: more iterations (SB_ITERS) and check runs "
                  "(SB_RUNS) steady each check, a quieter allocation the checks; or raise the threshold "
                  "(SB_THRESHOLD) to what the bound column shows")


def baseline_unlike(rows):
    """A line naming the points whose baseline lies outside the history's checks (beyond their
    spread at the verdict's level), or ''."""
    off = [r for r in rows if r.get("base_off") is not None]
    if not off:
        return ""
    return (f"at {len(off)} point(s) the baseline lies outside the history's checks (their median is "
            f"{span([r['base_off'] for r in off])} from it): the checks are not at the baseline's level (a change "
            "since it was recorded, or an untypical minute), which widens the spread; see analysis/history.py "
            "show, and record the baseline again if the change is deliberate")


def advice(rows):
    """What to do about the inconclusive points, by the spread that judged them."""
    sources = {r["spread"] for r in rows if r["verdict"] == "inconclusive"}
    return "; ".join(t for s, t in (("baseline", INCONCLUSIVE_ADVICE), ("history", HISTORY_ADVICE)) if s in sources)


def write_report(a, rows, summary, stats, spread, bf, cf):
    import matplotlib
    matplotlib.use("Agg")
    import matplotlib.pyplot as plt
    with cli.Outputs(overwrite=True) as out:  # the report replaces the last one, whole: both files or neither
        out.makedirs(a.report_dir)
        write_report_files(out, a, rows, summary, stats, spread, bf, cf, plt)
        out.publish()


def write_report_files(out, a, rows, summary, stats, spread, bf, cf, plt):
    with out.open(os.path.join(a.report_dir, "report.md")) as f:
        f.write(f"# Interconnect regression report\n\n**{summary}** — {stats}; {bf['world_size']} ranks, "
                f"{bf['dtype']}, {bf['redop']}.\n\n"
                f"- baseline: {', '.join(bf['files'])}\n- current: {', '.join(cf['files'])}\n"
                f"- {spread}\n")
        for copy, of in bf["duplicates"] + cf["duplicates"]:
            f.write(f"- not counted: {copy}, byte-identical to {of}\n")
        f.write("\n| operation | placement | size (B) | baseline (us) | current (us) | busbw change | detectable | "
                "bound | test (runs) | spread | verdict |\n|---|---|---:|---:|---:|---:|---:|---:|---|---|---|\n")
        for r in rows:
            f.write(f"| {r['op']} | {r['placement']} | {r['size']} | {r['base_us']:.2f} | {r['cur_us']:.2f} | "
                    f"{r['bw_change']:+.1%} | {pct(r['detectable'])} | {pct(r['bound'])} | {r['stat']} | {r['spread_label']} | "
                    f"{r['verdict']} |\n")
        f.write(f"\n`bound`: the most the point can be slower, at the verdict's level (the measured change "
                f"plus the margin its spread needs); a point not flagged whose bound is above the threshold "
                f"({threshold_pct(a.threshold)}) is *inconclusive*: the data do not rule out a slowdown of the "
                "threshold there. `detectable`: the smallest slowdown the spread lets the check flag at that "
                "point, whatever it measured. `spread`: `hist:N`, the spread between N "
                "earlier checks of the history (pooled within the levels between its change points); `base:N`, between the baseline's N "
                "back-to-back runs, which know one minute's spread, not the nights'.\n")
        if any(r["verdict"] == "inconclusive" for r in rows):
            f.write(f"\n**Inconclusive points:** {advice(rows)}.\n")
        if baseline_unlike(rows):
            f.write(f"\n**The baseline and the history:** {baseline_unlike(rows)}.\n")
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
                if r["verdict"] in ("REGRESSION", "inconclusive"):
                    mark, color = ("!", "red") if r["verdict"] == "REGRESSION" else ("?", "gray")
                    ax.annotate(mark, (r["size"], r["size"] / r["cur_us"] / 1e3), color=color, fontsize=14)
        ax.set_xscale("log", base=2)
        ax.set_xlabel("size (bytes)")
        ax.set_ylabel("algorithm bandwidth (GB/s), median")
        ax.set_title(op)
        ax.legend(fontsize=7)
    fig.tight_layout()
    fig.savefig(out.temp(os.path.join(a.report_dir, "report.png")), dpi=100)
    plt.close(fig)


if __name__ == "__main__":
    try:
        sys.exit(cli.run(__file__, main))
    except Exception as e:  # noqa: BLE001: 1 means "regression", 3 "inconclusive"; the unforeseen is unusable input
        print(f"regress: cannot compare: {type(e).__name__}: {e}", file=sys.stderr)
        sys.exit(2)
