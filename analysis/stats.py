"""The statistics the interconnect verdicts share (regress.py, diagnose.py, history.py): one
home for each test and for the rule that makes a figure of a run.

The rule: an iteration of a collective ends when its slowest rank does, so an iteration's
time is the maximum over ranks; a run's (or a pair's) figure is the median over its
iterations (robust to the odd slow iteration of a shared machine).
"""
import functools
import math

import numpy as np

# A baseline's run-to-run spread needs at least this many runs recorded back to back (regress's
# collective runs, diagnose's pair sweeps).
MIN_BASELINE_RUNS = 3


def slowest_rank(iterations, times):
    """Per iteration (in the order of np.unique(iterations)): the slowest rank's time."""
    it, inv = np.unique(np.asarray(iterations), return_inverse=True)
    out = np.full(len(it), -np.inf)
    np.maximum.at(out, inv.ravel(), np.asarray(times, float))
    return out


def run_figure(per_iteration):
    """A run's figure: the median over its iterations (of the slowest rank's times)."""
    return float(np.median(per_iteration))


def t_sf(t, dof):
    """P(T > t) for Student's t with an integer dof (Abramowitz & Stegun 26.7.3-4)."""
    if t < 0:
        return 1.0 - t_sf(-t, dof)
    if math.isinf(t):
        return 0.0
    theta = math.atan(t / math.sqrt(dof))
    c2, s = math.cos(theta) ** 2, math.sin(theta)
    if dof % 2:  # odd
        term, total = 1.0, 1.0 if dof > 1 else 0.0
        for k in range(1, (dof - 1) // 2):
            term *= c2 * (2 * k) / (2 * k + 1)
            total += term
        a = 2 / math.pi * (theta + (s * math.cos(theta) * total if dof > 1 else 0.0))
    else:
        term, total = 1.0, 1.0
        for k in range(1, dof // 2):
            term *= c2 * (2 * k - 1) / (2 * k)
            total += term
        a = s * total
    return max(0.0, (1.0 - a) / 2)


def t_isf(p, dof):
    """The t with P(T > t) = p (bisection on t_sf)."""
    lo, hi = 0.0, 1.0
    while t_sf(hi, dof) > p:
        hi *= 2
    for _ in range(200):
        mid = (lo + hi) / 2
        lo, hi = (mid, hi) if t_sf(mid, dof) > p else (lo, mid)
    return hi


def z_isf(p):
    """The z with P(Z > z) = p (bisection on erfc)."""
    lo, hi = 0.0, 40.0
    for _ in range(200):
        mid = (lo + hi) / 2
        lo, hi = (mid, hi) if 0.5 * math.erfc(mid / math.sqrt(2)) > p else (lo, mid)
    return hi


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


def mad_sd(x):
    x = np.asarray(x, float)
    return 1.4826 * float(np.median(np.abs(x - np.median(x)))) if len(x) else math.nan


def robust_scale(v):
    """The run-to-run noise of a log series, robust to a step and to single outliers: the
    median absolute difference of successive values, as a standard deviation (floor 1 %)."""
    diffs = np.abs(np.diff(v[np.isfinite(v)]))
    return max(float(np.median(diffs)) / (0.6745 * math.sqrt(2)) if len(diffs) else 0.0, 0.01)


# The exact null distribution of the rank-sum U (no ties) up to this many n1 * n2; beyond it,
# or with ties, the normal approximation of rank_sum_p.
EXACT_RANK_SUM_CELLS = 50000


@functools.lru_cache(maxsize=64)
def _u_tail(n1, n2):
    """P(U >= u) for u = 0 .. n1*n2 under the null, from the number of orderings giving each U
    (the generating function prod_{i=1..n1} (1 - q^(n2+i)) / (1 - q^i))."""
    p = np.zeros(n1 * n2 + 1)
    p[0] = 1.0
    for i in range(1, n1 + 1):
        m = n2 + i
        if m < len(p):
            p[m:] -= p[:-m].copy()
        for r in range(i):  # divide by (1 - q^i): a running sum along each stride-i class
            p[r::i] = np.cumsum(p[r::i])
    p = np.maximum(p, 0) / p.sum()
    return np.cumsum(p[::-1])[::-1]


def rank_sum_p_exact(slower, faster):
    """One-sided Mann-Whitney p-value that `slower` is stochastically larger: exact for small
    samples without ties (few repetitions against a pool: the normal approximation's tail is
    too light there to reach a Bonferroni level), else rank_sum_p."""
    x, y = np.asarray(slower, float), np.asarray(faster, float)
    n1, n2 = len(x), len(y)
    if n1 == 0 or n2 == 0:
        return 1.0
    if n1 * n2 > EXACT_RANK_SUM_CELLS or len(np.unique(np.concatenate([x, y]))) < n1 + n2:
        return rank_sum_p(x, y)
    u = int(np.searchsorted(np.sort(y), x).sum())  # pairs where the slower sample is larger (no ties)
    return float(_u_tail(n1, n2)[u])


def rank_sum_min_p(n1, n2):
    """The smallest p rank_sum_p_exact can give for samples of n1 and n2 (every `slower` value
    above every `faster` one): whether a level is reachable at all."""
    if n1 == 0 or n2 == 0:
        return 1.0
    return rank_sum_p_exact(np.arange(n1) + n2 + 1.0, np.arange(n2, dtype=float))


# ---- change points: E-Divisive means (history.py's trends, regress.py's segment since the last) ----
# Matteson & James 2014 (JASA 109:334); docs/interconnect.md, "History and change points".

MAX_PERMUTATIONS = 200000
WORK_BUDGET = 500_000_000  # permutations x runs^2 a test may spend beyond the least it needs


def distances(x, alpha=1.0):
    """|x_i - x_j|^alpha between the rows of `x` (n values, or n rows of d values: Euclidean)."""
    x = np.asarray(x, float)
    x = x[:, None] if x.ndim == 1 else x
    d = np.sqrt(((x[:, None, :] - x[None, :, :]) ** 2).sum(-1))
    return d if alpha == 1.0 else d ** alpha


def energy(d, min_seg):
    """E-Divisive's statistic Q(tau) for every split of a segment whose distance matrix is `d`
    (..., n, n) into its first tau values and the n - tau others, min_seg <= tau <= n - min_seg:
    tau (n - tau) / n times the energy distance of the two parts, mean distance between them
    twice less the mean within each (Matteson & James 2014, eq. 6, with kappa = n)."""
    n = d.shape[-1]
    rows = d.sum(-1).cumsum(-1)                                       # [tau-1]: sum of d[:tau, :]
    lower = np.einsum("...ij,ij->...i", d, np.tri(n, n, -1)).cumsum(-1)  # [tau-1]: sum over j < i < tau
    tau = np.arange(min_seg, n - min_seg + 1)
    left = 2 * lower[..., tau - 1]                                    # within the left part (twice)
    cross = rows[..., tau - 1] - left                                 # between the parts
    right = rows[..., n - 1][..., None] - 2 * rows[..., tau - 1] + left  # within the right part (twice)
    m = n - tau
    return tau, tau * m / n * (2 * cross / (tau * m) - left / (tau * (tau - 1)) - right / (m * (m - 1)))


def e_divisive(x, level, min_seg=3, alpha=1.0, seed=0, permutations=None, given=()):
    """Change points of the series `x` (n values, or n rows of values: a multivariate series)
    by E-Divisive means: [(index of the first value after the change, permutation p-value)],
    sorted. The best split of any current segment is kept while its p-value is at most
    `level`, then the parts are searched again (recursive bisection). The permutations
    shuffle the values within each current segment, their statistic the largest over the
    segments, as the observed one; `permutations` (default: enough for level/10, within a
    budget of work) are drawn in batches, stopping once the split cannot be significant.
    `given`: change points already known (another search's), where the search starts from;
    they are not returned."""
    d = distances(x, alpha)
    n = len(d)
    if min_seg < 2:
        raise ValueError("min_seg must be at least 2")
    rng = np.random.default_rng(seed)
    total = permutations or min(MAX_PERMUTATIONS, max(math.ceil(2 / level), 199,
                                                      min(math.ceil(10 / level), WORK_BUDGET // max(1, n * n))))
    allowed = math.floor(level * (total + 1)) - 1  # exceedances a significant split may have
    found = []
    while allowed >= 0:
        bounds = [0] + sorted({t for t, _ in found} | set(given)) + [n]
        segs = [(lo, hi) for lo, hi in zip(bounds, bounds[1:]) if hi - lo >= 2 * min_seg]
        if not segs:
            break
        best = None
        for lo, hi in segs:
            tau, q = energy(d[lo:hi, lo:hi], min_seg)
            i = int(np.argmax(q))
            if best is None or q[i] > best[0]:
                best = (float(q[i]), lo + int(tau[i]))
        observed, split = best
        exceed = done = 0
        while done < total and exceed <= allowed:
            batch = min(total - done, max(16, 4_000_000 // sum((hi - lo) ** 2 for lo, hi in segs)))
            stat = np.full(batch, -np.inf)
            for lo, hi in segs:
                idx = rng.permuted(np.broadcast_to(np.arange(hi - lo), (batch, hi - lo)), axis=1)
                seg = d[lo:hi, lo:hi]
                stat = np.maximum(stat, energy(seg[idx[:, :, None], idx[:, None, :]], min_seg)[1].max(-1))
            exceed += int((stat >= observed * (1 - 1e-12)).sum())  # ties count against the split
            done += batch
        p = (exceed + 1) / (done + 1)
        if p > level:
            break
        found.append((split, p))
    return sorted(found)


def segment_medians(values, cps):
    """Medians of the segments of `values` between the change points `cps` (indices)."""
    bounds = [0] + list(cps) + [len(values)]
    return [float(np.median(values[lo:hi])) for lo, hi in zip(bounds, bounds[1:])]


def prune(found, step_of, min_step, given=()):
    """The change points of `found` [(index, p)] left when those whose step (step_of(indices)
    -> one ratio after/before per change point) is under min_step either way are dropped,
    the smallest first, each merging its two segments; the `given` ones stay, and count
    as boundaries."""
    found = list(found)
    while found:
        cps = sorted({t for t, _ in found} | set(given))
        size = dict(zip(cps, (abs(math.log(r)) for r in step_of(cps))))
        j = min(range(len(found)), key=lambda i: size[found[i][0]])
        if size[found[j][0]] >= math.log1p(min_step) * (1 - 1e-9):
            break
        del found[j]
    return found


def steps_at(times, cps):
    """(ratio after/before, median before, median after) of `times` at each boundary of `cps`
    (indices into times, increasing), or None where a boundary leaves a segment empty."""
    out = []
    bounds = [0] + list(cps) + [len(times)]
    for i in range(1, len(bounds) - 1):
        lo, mid, hi = bounds[i - 1], bounds[i], bounds[i + 1]
        if not lo < mid < hi:
            out.append(None)
            continue
        before, after = float(np.median(times[lo:mid])), float(np.median(times[mid:hi]))
        out.append((after / before, before, after))
    return out


# ---- the spread between checks (regress.py's noise model from the history) -----------------------


def spread_outliers_out(x, level=0.001, most=None):
    """(standard deviation, dof, indices left out) of `x`: the sample standard deviation, robust
    to up to `most` outliers (default a tenth of the values, at least one). Rosner's
    generalized ESD: the value farthest from the median is set aside, then the farthest of the
    rest, `most` times; each against the mean and standard deviation of the values still kept
    without it (a leave-one-out t test, Grubbs' idea, at `level` divided over the values).
    The outliers are the first k set aside, k the last step whose test rejected: two alike
    outliers mask each other at the first step, not at the second. Under normality a value
    is left out wrongly in fewer than `level` * `most` of samples, so the t test on the
    spread keeps its level; a rare slow minute (a check of the history 4 % off where the
    others wander 1 %) no longer sets the spread of every night after it. Needs 3 values."""
    x = np.asarray(x, float)
    n = len(x)
    most = max(1, n // 10) if most is None else most
    keep, order, found = list(range(n)), [], 0
    for step in range(1, most + 1):
        if len(keep) < 4:
            break
        v = x[keep]
        i = int(np.argmax(np.abs(v - np.median(v))))
        others = np.delete(v, i)
        so = float(np.std(others, ddof=1))
        z = abs(v[i] - float(others.mean())) / (so * math.sqrt(1 + 1 / len(others))) if so > 0 else math.inf
        if so > 0 and t_sf(z, len(v) - 2) < level / n or so == 0 and v[i] != others[0]:
            found = step
        order.append(keep.pop(i))
    left = sorted(order[:found])
    rest = np.delete(x, left)
    return float(np.std(rest, ddof=1)), len(rest) - 1, left
