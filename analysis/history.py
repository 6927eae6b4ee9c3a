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
node_exporter's textfile collector (FILE.tmp, then renamed; name it *.prom).

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
import hashlib
import math
import os
import sqlite3
import sys
import zlib

import numpy as np

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import cli  # noqa: E402
from stats import robust_scale  # noqa: E402

TOOL = "history"
DB_FORMAT = "shardbench-history 1"  # meta('format'): what this reader understands
SAMPLE_FIELDS = ("rank", "op", "in_place", "iteration", "size", "time")
FINAL_STATUSES = ("ok", "failed", "below-floor")  # what collective_perf writes when it finishes
MAX_PERMUTATIONS = 200000
# --alpha's share for the joint searches (the rest for the series alone): most, because a change
# of the interconnect moves many series, and a short history leaves a permutation test little
# resolution (16 runs split 3 + 13: no p-value below 2 / C(16, 3) = 0.0036).
JOINT_SHARE = 0.75
WORK_BUDGET = 500_000_000  # permutations x runs^2 a test may spend beyond the least it needs

SCHEMA = """
CREATE TABLE meta (key TEXT PRIMARY KEY, value TEXT NOT NULL);
CREATE TABLE runs (
    id INTEGER PRIMARY KEY,
    sha256 TEXT NOT NULL UNIQUE,        -- the file's content: its identity
    path TEXT NOT NULL,                 -- absolute path when added (the HDF5 file is the record)
    start_time TEXT NOT NULL,           -- ISO 8601, UTC, as the file has it
    end_time TEXT,
    start_unix REAL NOT NULL,
    commit_id TEXT NOT NULL,            -- provenance shardbench_version (git describe)
    hosts TEXT NOT NULL,                -- host names, comma-separated, in rank order
    world_size INTEGER NOT NULL,
    nodes INTEGER,
    ranks_per_node INTEGER,
    backend TEXT, comm TEXT, collectives TEXT, dtype TEXT, redop TEXT,
    status TEXT NOT NULL,
    slurm_job TEXT,
    command_line TEXT,
    added TEXT NOT NULL
);
CREATE TABLE points (
    run INTEGER NOT NULL REFERENCES runs(id),
    op TEXT NOT NULL, in_place INTEGER NOT NULL, size INTEGER NOT NULL,
    comm TEXT NOT NULL, dtype TEXT NOT NULL, redop TEXT NOT NULL,
    time_s REAL NOT NULL,               -- median over iterations of the slowest rank's time
    iterations INTEGER NOT NULL,
    busbw_gbps REAL, algbw_gbps REAL,   -- the results table's (median over roots and cycles)
    PRIMARY KEY (run, op, in_place, size, comm, dtype, redop)
);
CREATE INDEX runs_start ON runs(start_time);
"""


# ---- reading a collective_perf result -------------------------------------------------------------

def _value(v):
    if isinstance(v, bytes):
        return v.decode(errors="replace")
    if isinstance(v, np.ndarray):
        return [_value(x) for x in v.tolist()]
    if isinstance(v, np.generic):
        return v.item()
    return v


def _names(ds, key):
    return [str(x) for x in _value(ds.attrs[key])] if key in ds.attrs else None


def parse_time(text, what):
    """A datetime (UTC) from an ISO 8601 date or time ('2026-11-23', '2026-11-23T06:01:54Z')."""
    try:
        t = datetime.datetime.fromisoformat(str(text).strip().replace("Z", "+00:00"))
    except ValueError:
        raise cli.BadInput(f"{what} '{text}' is not an ISO 8601 date or time (e.g. 2026-11-23 or 2026-11-23T06:01:54Z)")
    return t.replace(tzinfo=datetime.timezone.utc) if t.tzinfo is None else t.astimezone(datetime.timezone.utc)


def _one_line(e):
    return " ".join(str(e).split())


def sha256(path):
    h = hashlib.sha256()
    with open(path, "rb") as f:
        for block in iter(lambda: f.read(1 << 20), b""):
            h.update(block)
    return h.hexdigest()


def _decode(rows, ds, field, names_key, fallback, fname, table):
    """Per row of `rows` (a structured array read from dataset `ds`), the name its `field`
    code stands for; `fallback` (the file's single value) where the column or its names
    attribute is missing."""
    if rows.dtype.names is None or field not in rows.dtype.names:
        return np.array([fallback] * len(rows), dtype=object)
    names = _names(ds, names_key)
    if names is None:
        return np.array([fallback] * len(rows), dtype=object)
    codes = rows[field].astype(np.int64)
    bad = codes[(codes < 0) | (codes >= len(names))]
    if len(bad):
        raise cli.BadInput(f"{fname}: corrupt {table} table: {field} code {int(bad[0])} is not one of the "
                           f"{len(names)} {names_key}")
    return np.array(names, dtype=object)[codes]


def read_result(fname):
    """(run facts, {point key: (time_s, iterations, busbw, algbw)}) of one collective_perf
    result, or cli.BadInput naming the file and what is wrong."""
    try:
        return _read_result(fname)
    except cli.BadInput:
        raise
    except Exception as e:  # noqa: BLE001: a damaged file fails in many places; name it
        raise cli.BadInput(f"{fname}: corrupt collective_perf result ({type(e).__name__}: {_one_line(e)})")


def _read_result(fname):
    import h5py  # here: show needs none of it
    if os.path.isdir(fname):
        raise cli.BadInput(f"{fname}: is a directory")
    try:
        f = h5py.File(fname, "r")
    except OSError as e:
        raise cli.BadInput(f"{fname}: not a readable HDF5 file ({_one_line(e)})")
    try:
        with f:
            a = {k: _value(v) for k, v in f.attrs.items()}
            if a.get("program") != "collective_perf":
                raise cli.BadInput(f"{fname}: not a collective_perf result (program "
                                   f"{a.get('program', 'not recorded')!r})")
            for k in ("start_time", "world_size", "status"):
                if k not in a:
                    raise cli.BadInput(f"{fname}: corrupt collective_perf result: no {k} attribute")
            if a["status"] not in FINAL_STATUSES:
                raise cli.BadInput(f"{fname}: not a finished result (status {a['status']!r}; finished: "
                                   f"{', '.join(FINAL_STATUSES)})")
            start = parse_time(a["start_time"], f"{fname}: start_time")
            for k in ("samples", "results"):
                if k not in f or not isinstance(f[k], h5py.Dataset):
                    raise cli.BadInput(f"{fname}: no {k} table")
            sds, rds = f["samples"], f["results"]
            s, r = sds[()], rds[()]
            op_names = _names(sds, "op_names")
            if op_names is None:
                raise cli.BadInput(f"{fname}: corrupt samples table: no op_names attribute")
            prov = {k: _value(v) for k, v in f["provenance"].attrs.items()} if "provenance" in f else {}
            hosts = []
            if "provenance/ranks" in f:
                ranks = f["provenance/ranks"][()]
                if ranks.dtype.names and "host" in ranks.dtype.names:
                    order = np.argsort(ranks["rank"], kind="stable") if "rank" in ranks.dtype.names else range(len(ranks))
                    for h in (_value(ranks["host"][i]) for i in order):
                        if h not in hosts:
                            hosts.append(h)
            if not hosts and prov.get("env.SLURM_JOB_NODELIST"):
                hosts = [prov["env.SLURM_JOB_NODELIST"]]
            comm_default = a.get("comm") or ("nccl" if a.get("backend") == "cuda" else "mpi")
            fallback = {"comm": str(comm_default), "dtype": str(a.get("dtype", "?")), "redop": str(a.get("redop", "?"))}
            # Where a file measured several libraries, types or reductions without a column
            # to tell them apart, its single value is unknown.
            for k in ("comm", "dtype", "redop"):
                if "," in fallback[k] and (s.dtype.names is None or k not in s.dtype.names):
                    raise cli.BadInput(f"{fname}: {k} is {fallback[k]!r} but the samples table has no {k} column")
            sample_keys = {k: _decode(s, sds, k, k + "_names", fallback[k], fname, "samples")
                           for k in ("comm", "dtype", "redop")} if len(s) else {}
            result_keys = {k: _decode(r, rds, k, k + "_names", fallback[k], fname, "results")
                           for k in ("comm", "dtype", "redop")} if len(r) else {}
            r_ops = _names(rds, "op_names") or op_names
    except cli.BadInput:
        raise
    except (OSError, KeyError, ValueError, TypeError, IndexError, AttributeError, RuntimeError) as e:
        raise cli.BadInput(f"{fname}: corrupt collective_perf result ({type(e).__name__}: {_one_line(e)})")

    missing = [k for k in SAMPLE_FIELDS if s.dtype.names is None or k not in s.dtype.names]
    if missing:
        raise cli.BadInput(f"{fname}: corrupt samples table: no field {', '.join(missing)}")
    if len(s) == 0:
        raise cli.BadInput(f"{fname}: no measurements (empty samples table)")
    rmissing = [k for k in ("op", "in_place", "size", "busbw", "algbw") if r.dtype.names is None or k not in r.dtype.names]
    if rmissing:
        raise cli.BadInput(f"{fname}: corrupt results table: no field {', '.join(rmissing)}")
    ops = s["op"].astype(np.int64)
    bad_op = ops[(ops < 0) | (ops >= len(op_names))]
    if len(bad_op):
        raise cli.BadInput(f"{fname}: corrupt samples table: op code {int(bad_op[0])} is not one of the "
                           f"{len(op_names)} op_names")
    t = s["time"].astype(float)
    ok = np.isfinite(t) & (t > 0)
    if not ok.all():
        raise cli.BadInput(f"{fname}: {int((~ok).sum())} of {len(t)} times are not finite positive numbers "
                           f"(first: {t[~ok][0]!r}): unusable")
    if np.any(s["size"] <= 0):
        raise cli.BadInput(f"{fname}: corrupt samples table: a size of {int(s['size'][s['size'] <= 0][0])} bytes")

    # An iteration: one (case, placement, size, root, cycle, iteration) across ranks; its time is
    # the slowest rank's. A point (operation, placement, size, library, type, reduction) is the
    # median of its iterations.
    def column(name):
        return s[name].astype(np.int64) if name in s.dtype.names else np.zeros(len(s), np.int64)
    codes = {k: np.unique(sample_keys[k], return_inverse=True) for k in ("comm", "dtype", "redop")}
    grid = np.stack([ops, column("in_place"), column("size")] + [codes[k][1] for k in ("comm", "dtype", "redop")]
                    + [column("root"), column("cycle"), column("iteration")], axis=1)
    iters, inv = np.unique(grid, axis=0, return_inverse=True)
    slowest = np.full(len(iters), -np.inf)
    np.maximum.at(slowest, inv.ravel(), t)
    pts, pinv = np.unique(iters[:, :6], axis=0, return_inverse=True)
    pinv = pinv.ravel()
    by_point = {}
    for j, p in enumerate(pts):
        key = (op_names[p[0]], int(p[1]), int(p[2]), str(codes["comm"][0][p[3]]), str(codes["dtype"][0][p[4]]),
               str(codes["redop"][0][p[5]]))
        sel = slowest[pinv == j]
        by_point[key] = [float(np.median(sel)), int(len(sel)), None, None]
    # The results table's bus bandwidth (nccl-tests' figure), median over roots and cycles.
    bw = {}
    for i in range(len(r)):
        code = int(r["op"][i])
        if not 0 <= code < len(r_ops):
            raise cli.BadInput(f"{fname}: corrupt results table: op code {code} is not one of the {len(r_ops)} op_names")
        key = (r_ops[code], int(r["in_place"][i]), int(r["size"][i]), str(result_keys["comm"][i]),
               str(result_keys["dtype"][i]), str(result_keys["redop"][i]))
        bw.setdefault(key, []).append((float(r["busbw"][i]), float(r["algbw"][i])))
    for key, rows in bw.items():
        if key in by_point:
            by_point[key][2] = float(np.median([x[0] for x in rows]))
            by_point[key][3] = float(np.median([x[1] for x in rows]))
    facts = dict(path=os.path.abspath(fname), start_time=str(a["start_time"]), end_time=str(a.get("end_time", "")),
                 start_unix=start.timestamp(), commit_id=str(prov.get("shardbench_version", "unknown")),
                 hosts=",".join(hosts), world_size=int(a["world_size"]), nodes=a.get("nodes"),
                 ranks_per_node=a.get("ranks_per_node"), backend=str(a.get("backend", "")), comm=str(comm_default),
                 collectives=str(a.get("collectives", "unrecorded")),  # schema 1 did not say
                 dtype=fallback["dtype"], redop=fallback["redop"],
                 status=str(a["status"]), slurm_job=str(prov.get("env.SLURM_JOB_ID", "")) or None,
                 command_line=prov.get("command_line"))
    return facts, {k: tuple(v) for k, v in by_point.items()}


def result_files(path):
    """The .h5 files of `path`: the file itself, or every *.h5 below a folder (sorted)."""
    if os.path.isdir(path):
        out = []
        for d, subdirs, files in os.walk(path):
            subdirs.sort()
            out += [os.path.join(d, f) for f in sorted(files) if f.endswith(".h5")]
        if not out:
            raise cli.BadInput(f"{path}: no .h5 results in this directory or below it")
        return out
    if not os.path.exists(path):
        raise cli.BadInput(f"{path}: no such file or directory")
    return [path]


# ---- the database ---------------------------------------------------------------------------------

def open_db(path, create):
    """A connection to the history database at `path`; with `create`, one is made where there
    is none (after the checks of an output file)."""
    exists = os.path.exists(path)
    if exists and os.path.isdir(path):
        raise cli.BadInput(f"{path}: is a directory, not a history database")
    if not exists:
        if not create:
            raise cli.BadInput(f"{path}: no such history database (create it with: analysis/history.py add {path} RESULT...)")
        cli.check_output_file(path, "DB")
    try:
        if create:
            con = sqlite3.connect(path, timeout=60, isolation_level=None)
        else:
            from urllib.parse import quote
            con = sqlite3.connect(f"file:{quote(os.path.abspath(path))}?mode=ro", uri=True, timeout=60,
                                  isolation_level=None)
        tables = {r[0] for r in con.execute("SELECT name FROM sqlite_master WHERE type='table'")}
        if not tables:
            if not create:
                raise cli.BadInput(f"{path}: an empty database, not a history (add runs with: analysis/history.py add "
                                   f"{path} RESULT...)")
            return con, True
        fmt = con.execute("SELECT value FROM meta WHERE key='format'").fetchone() if "meta" in tables else None
        if not fmt or fmt[0] != DB_FORMAT:
            raise cli.BadInput(f"{path}: an SQLite database but not a shardbench history ({DB_FORMAT!r} expected, "
                               f"found {fmt[0] if fmt else 'no format record'!r})")
        return con, False
    except sqlite3.DatabaseError as e:
        raise cli.BadInput(f"{path}: not a history database ({_one_line(e)})")


def add(a):
    # Read everything first: a bad file leaves the DB as it was (not even created).
    files = []
    for p in a.results:
        files += result_files(p)
    new = []
    seen = set()
    for fname in files:
        facts, points = read_result(fname)
        try:
            digest = sha256(fname)
        except OSError as e:
            raise cli.BadInput(f"{fname}: cannot read ({e.strerror})")
        if digest in seen:
            continue
        seen.add(digest)
        facts["sha256"] = digest
        new.append((facts, points))
    existed = os.path.exists(a.db)
    con, _ = open_db(a.db, create=True)
    added, known, moved = 0, 0, 0
    try:
        con.execute("BEGIN IMMEDIATE")  # from here on no other add can write (an add at once, by cron)
        fresh = not con.execute("SELECT 1 FROM sqlite_master WHERE name='meta'").fetchone()
        if fresh:
            for stmt in SCHEMA.split(";"):
                if stmt.strip():
                    con.execute(stmt)
            con.execute("INSERT INTO meta VALUES ('format', ?)", (DB_FORMAT,))
        now = datetime.datetime.now(datetime.timezone.utc).strftime("%Y-%m-%dT%H:%M:%SZ")
        for facts, points in new:
            row = con.execute("SELECT id, path FROM runs WHERE sha256=?", (facts["sha256"],)).fetchone()
            if row:
                known += 1
                if row[1] != facts["path"] and not os.path.exists(row[1]):  # the file moved: follow it
                    con.execute("UPDATE runs SET path=? WHERE id=?", (facts["path"], row[0]))
                    moved += 1
                continue
            cols = ["sha256", "path", "start_time", "end_time", "start_unix", "commit_id", "hosts", "world_size",
                    "nodes", "ranks_per_node", "backend", "comm", "collectives", "dtype", "redop", "status",
                    "slurm_job", "command_line"]
            cur = con.execute(f"INSERT INTO runs ({', '.join(cols)}, added) VALUES ({', '.join('?' * len(cols))}, ?)",
                              [facts[c] for c in cols] + [now])
            run_id = cur.lastrowid
            con.executemany("INSERT INTO points VALUES (?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?)",
                            [(run_id,) + k + v for k, v in sorted(points.items())])
            added += 1
        con.execute("COMMIT")
    except BaseException as e:
        if con.in_transaction:
            con.execute("ROLLBACK")
        empty = not con.execute("SELECT count(*) FROM sqlite_master").fetchone()[0]
        con.close()
        if not existed and empty:  # leave no empty database behind
            try:
                os.remove(a.db)
            except OSError:
                pass
        if isinstance(e, sqlite3.Error):
            raise cli.BadInput(f"{a.db}: cannot add to the database ({_one_line(e)}): it is unchanged") from e
        raise
    total, first, last = con.execute("SELECT count(*), min(start_time), max(start_time) FROM runs").fetchone()
    con.close()
    print(f"{TOOL}: {a.db}: added {added} run(s), {known} already indexed"
          + (f" ({moved} moved: path updated)" if moved else "")
          + f"; it holds {total} run(s), {first} to {last}")
    print(f"next: analysis/history.py show {a.db}")
    return 0


# ---- E-Divisive means -----------------------------------------------------------------------------

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


# ---- show -----------------------------------------------------------------------------------------

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


def load_series(con, a):
    """{series key: [run rows with the point's figures], by start time}, and the runs."""
    runs = {r[0]: dict(zip([c[0] for c in con.execute("SELECT * FROM runs LIMIT 0").description], r))
            for r in con.execute("SELECT * FROM runs")}
    if not runs:
        raise cli.BadInput(f"{a.db}: holds no runs (add some with: analysis/history.py add {a.db} RESULT...)")
    since = parse_time(a.since, "--since").timestamp() if a.since else None
    size = parse_size(a.size) if a.size is not None else None
    ops = sorted({r[0] for r in con.execute("SELECT DISTINCT op FROM points")})
    if a.op is not None and a.op not in ops:
        raise cli.BadInput(f"--op '{a.op}': no runs of it in {a.db} (it holds: {', '.join(ops)})")
    rows = con.execute("SELECT run, op, in_place, size, comm, dtype, redop, time_s, iterations, busbw_gbps, algbw_gbps "
                       "FROM points").fetchall()
    series = {}
    skipped = set()
    for run, op, place, sz, comm, dtype, redop, time_s, iters, busbw, algbw in rows:
        r = runs[run]
        if r["status"] == "failed":
            skipped.add(run)
            continue
        if (a.op is not None and op != a.op) or (size is not None and sz != size):
            continue
        if since is not None and r["start_unix"] < since:
            continue
        config = (r["backend"], comm, r["collectives"], r["world_size"], r["nodes"], r["ranks_per_node"], dtype, redop)
        series.setdefault((config, op, place, sz), []).append(
            dict(run=r, size=sz, time=time_s, iterations=iters, busbw=busbw, algbw=algbw))
    if not series:
        sizes = sorted({r[3] for r in rows if a.op is None or r[1] == a.op})
        what = " ".join(x for x in (a.op and f"of {a.op}", size and f"at {size} B",
                                     a.since and f"since {a.since}") if x)
        raise cli.BadInput(f"{a.db}: no runs {what or 'with a passing data check'} (sizes held"
                           f"{' for ' + a.op if a.op else ''}: {', '.join(map(str, sizes)) or 'none'})")
    for v in series.values():
        v.sort(key=lambda p: run_order(p["run"]))
    if a.last:  # the latest runs of each configuration
        latest = {}
        for (config, *_), v in series.items():
            latest.setdefault(config, set()).update(p["run"]["id"] for p in v)
        for config, ids in latest.items():
            latest[config] = set(sorted(ids, key=lambda i: run_order(runs[i]))[-a.last:])
        series = {k: [p for p in v if p["run"]["id"] in latest[k[0]]] for k, v in series.items()}
        series = {k: v for k, v in series.items() if v}
    return series, runs, skipped


def config_label(c):
    backend, comm, coll, world, nodes, rpn, dtype, redop = c
    shape = f" ({nodes} node(s) x {rpn})" if nodes and rpn else ""
    coll = "blocking or not: unrecorded" if coll == "unrecorded" else coll
    return f"{world} ranks{shape}, {backend} {comm}, {coll}, {dtype} {redop}"


def run_order(r):
    return (r["start_unix"], r["start_time"], r["id"])


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


def detect(series, a):
    """The change points of every series, [dict(t: index of the first run after the change,
    p, ratio: median time after / before, before, after, source: 'joint' or 'series',
    width: series of the joint test)], and the levels used. Two searches share --alpha:
    a joint one per configuration (the runs as points in as many dimensions as it has series,
    each series' log time centred on its median and scaled by its run-to-run noise: a link
    that slows the whole sweep is found where every series gives a little evidence) at
    JOINT_SHARE of alpha divided over the configurations, and one per series at the rest
    divided over the series (Bonferroni), for what changes in one series alone."""
    keys_of = {}
    for k in series:
        keys_of.setdefault(k[0], []).append(k)
    tested = [k for k, v in series.items() if len(v) >= 2 * a.min_segment]
    joint = {}
    for config, keys in keys_of.items():
        runs = sorted({p["run"]["id"]: p["run"] for k in keys for p in series[k]}.values(), key=run_order)
        if len(keys) > 1 and len(runs) >= 2 * a.min_segment:
            joint[config] = (runs, sorted(keys, key=lambda k: (k[1], k[2], k[3])))
    share = JOINT_SHARE if joint and tested else 1.0 if joint else 0.0
    level_joint = a.alpha * share / max(1, len(joint))
    level_series = a.alpha * (1 - share) / max(1, len(tested))
    out = {k: dict(changes=[], tested=k in tested) for k in series}
    for config, (runs, keys) in sorted(joint.items(), key=lambda c: str(c[0])):
        pos = {r["id"]: i for i, r in enumerate(runs)}
        x = np.full((len(runs), len(keys)), np.nan)
        where = {}
        for j, k in enumerate(keys):
            where[k] = np.array([pos[p["run"]["id"]] for p in series[k]])
            x[where[k], j] = np.log([p["time"] for p in series[k]])
        z = (x - np.nanmedian(x, axis=0)) / np.array([robust_scale(x[:, j]) for j in range(len(keys))])
        z[np.isnan(z)] = 0.0  # a run without a series: at that series' median
        seed = (zlib.crc32(repr(config).encode()) ^ a.seed) & 0xFFFFFFFF
        times = {k: np.array([p["time"] for p in series[k]]) for k in keys}

        def per_series(cps):
            return {k: steps_at(times[k], [int(np.searchsorted(where[k], t)) for t in cps]) for k in keys}

        def largest(cps):  # a joint change point stands for its largest step in any series
            st = per_series(cps)
            return [math.exp(max((abs(math.log(st[k][i][0])) for k in keys if st[k][i]), default=0.0))
                    for i in range(len(cps))]
        found = prune(e_divisive(z, level_joint, a.min_segment, 1.0, seed), largest, a.min_step)
        st = per_series([t for t, _ in found])
        for k in keys:
            for (t, p), step in zip(found, st[k]):
                if step and abs(math.log(step[0])) >= math.log1p(a.min_step) * (1 - 1e-9):
                    out[k]["changes"].append(dict(t=int(np.searchsorted(where[k], t)), p=p, source="joint",
                                                  width=len(keys)))
    for k in tested:  # what changed in one series alone: searched from the joint change points on
        times = np.array([p["time"] for p in series[k]])
        seed = (zlib.crc32(repr(k).encode()) ^ a.seed) & 0xFFFFFFFF
        given = [c["t"] for c in out[k]["changes"]]
        found = prune(e_divisive(np.log(times), level_series, a.min_segment, 1.0, seed, given=given),
                      lambda cps: [st[0] for st in steps_at(times, cps)], a.min_step, given)
        out[k]["changes"] += [dict(t=t, p=p, source="series", width=1) for t, p in found]
        out[k]["changes"].sort(key=lambda c: c["t"])
    for k, f in out.items():  # the steps between the series' own change points, joint or not
        times = np.array([p["time"] for p in series[k]])
        for c, step in zip(list(f["changes"]), steps_at(times, [c["t"] for c in f["changes"]])):
            if step is None:  # two joint change points between the same runs of this series
                f["changes"].remove(c)
            else:
                c.update(ratio=step[0], before=step[1], after=step[2])
    return out, dict(level_joint=level_joint, level_series=level_series, joint=len(joint), tested=len(tested))


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


def write_atomic(path, text):
    tmp = path + ".tmp"
    with open(tmp, "w") as f:
        f.write(text)
        f.flush()
        os.fsync(f.fileno())
    os.replace(tmp, path)


def plot(path, series, found):
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
    con, _ = open_db(a.db, create=False)
    try:
        series, runs, skipped = load_series(con, a)
    finally:
        con.close()
    found, levels = detect(series, a)

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
    if a.plot:
        plot(a.plot, series, found)
    if a.openmetrics:
        write_atomic(a.openmetrics, openmetrics_text(series, found))
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
    p.add_argument("--last", type=int, default=200, metavar="N",
                   help="only the latest N runs of each configuration; 0: all (default: 200)")
    p.add_argument("--plot", metavar="FILE.png", help="draw each series with its change points (default: no plot)")
    p.add_argument("--openmetrics", metavar="FILE",
                   help="write the latest figures in the Prometheus text format, for node_exporter's textfile "
                        "collector (name it *.prom) (default: not written)")
    p.add_argument("--alpha", type=float, default=0.01,
                   help="chance of a false alarm over all series shown, divided among them (default: 0.01)")
    p.add_argument("--min-segment", type=int, default=3, metavar="N",
                   help="fewest runs between change points (default: 3)")
    p.add_argument("--min-step", type=float, default=0.05, metavar="FRACTION",
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
        print(f"{TOOL}: error: {type(e).__name__}: {_one_line(e)}", file=sys.stderr)
        sys.exit(2)
