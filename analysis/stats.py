"""The statistics the interconnect verdicts share (regress.py, diagnose.py, history.py): one
home for each test and for the rule that makes a figure of a run.

The rule: an iteration of a collective ends when its slowest rank does, so an iteration's
time is the maximum over ranks; a run's (or a pair's) figure is the median over its
iterations (robust to the odd slow iteration of a shared machine).
"""
import functools
import math

import numpy as np


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
