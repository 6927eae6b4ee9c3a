"""The history of the interconnect checks, its database half (analysis/history.py is its
command line; analysis/regress.py --history reads it): an SQLite index of collective_perf
results (schema below; the HDF5 files stay the record), the series it holds per
configuration, operation, placement and size, and their change points (E-Divisive means,
stats.e_divisive: the method is docs/interconnect.md's, "History and change points").

A configuration is what makes runs comparable: backend, library, blocking or not, world
size, nodes, ranks per node, type and reduction (configuration_of()); runs of different
configurations are never one series.
"""
import datetime
import math
import os
import sqlite3
import zlib

import numpy as np

import cli
from stats import e_divisive, prune, robust_scale, steps_at

DB_FORMAT = "shardbench-history 1"  # meta('format'): what this reader understands
# --alpha's share for the joint searches (the rest for the series alone): most, because a change
# of the interconnect moves many series, and a short history leaves a permutation test little
# resolution (16 runs split 3 + 13: no p-value below 2 / C(16, 3) = 0.0036).
JOINT_SHARE = 0.75
# history.py show's defaults, which regress.py --history uses too
DEFAULT_ALPHA, DEFAULT_MIN_SEGMENT, DEFAULT_MIN_STEP, DEFAULT_LAST = 0.01, 3, 0.05, 200

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
    added TEXT NOT NULL,
    cpu_share REAL                      -- the least rank's CPU over wall time (NULL: not recorded)
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
        if create and "cpu_share" not in {c[1] for c in con.execute("PRAGMA table_info(runs)")}:
            con.execute("ALTER TABLE runs ADD COLUMN cpu_share REAL")  # a history from before the share was kept
        return con, False
    except sqlite3.DatabaseError as e:
        from shardbench_h5 import _one_line
        raise cli.BadInput(f"{path}: not a history database ({_one_line(e)})")


def add_results(db, paths):
    """Indexes the collective_perf results of `paths` (files, or folders searched below) in the
    database `db` (created if missing), all or nothing: every file is read first, one
    transaction adds them, and a bad file (cli.BadInput naming it) leaves `db` as it was (not
    even created). Keyed on each file's content: a byte copy adds nothing. Returns (added,
    already indexed, moved, total, first start time, last)."""
    import shardbench_h5  # here: its h5py and pandas cost show a second
    files = []
    for p in paths:
        files += shardbench_h5.collective_files(p, recursive=True)
    new = []
    seen = set()
    for fname in files:
        res = shardbench_h5.read_collective(fname)
        if res.sha256 in seen:
            continue
        seen.add(res.sha256)
        facts = dict(res.facts, sha256=res.sha256, path=res.path)
        points = {k: (p.time, len(p.iterations), p.busbw, p.algbw) for k, p in res.points.items()}
        new.append((facts, points))
    existed = os.path.exists(db)
    con, _ = open_db(db, create=True)
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
                    "slurm_job", "command_line", "cpu_share"]
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
                os.remove(db)
            except OSError:
                pass
        if isinstance(e, sqlite3.Error):
            raise cli.BadInput(f"{db}: cannot add to the database ({shardbench_h5._one_line(e)}): it is unchanged") from e
        raise
    total, first, last = con.execute("SELECT count(*), min(start_time), max(start_time) FROM runs").fetchone()
    con.close()
    return added, known, moved, total, first, last


def configuration_of(run, comm, dtype, redop):
    """The configuration of a run (a runs row, or a result's facts) at a point's library, type
    and reduction."""
    return (run["backend"], comm, run["collectives"], run["world_size"], run["nodes"], run["ranks_per_node"],
            dtype, redop)


def load_series(con, db, op=None, size=None, since=None, since_text=None, last=DEFAULT_LAST):
    """{series key: [run rows with the point's figures], by start time}, the runs and the ids
    of those left out for a failed data check: the series of `db` (open as `con`), only
    operation `op`, `size` bytes, runs started at or after `since` (Unix time; as typed:
    `since_text`), the latest `last` runs of each configuration (0: all). A series key is
    (configuration, operation, in-place, size); configuration_of() makes the first."""
    runs = {r[0]: dict(zip([c[0] for c in con.execute("SELECT * FROM runs LIMIT 0").description], r))
            for r in con.execute("SELECT * FROM runs")}
    if not runs:
        raise cli.BadInput(f"{db}: holds no runs (add some with: analysis/history.py add {db} RESULT...)")
    ops = sorted({r[0] for r in con.execute("SELECT DISTINCT op FROM points")})
    if op is not None and op not in ops:
        raise cli.BadInput(f"--op '{op}': no runs of it in {db} (it holds: {', '.join(ops)})")
    rows = con.execute("SELECT run, op, in_place, size, comm, dtype, redop, time_s, iterations, busbw_gbps, algbw_gbps "
                       "FROM points").fetchall()
    series = {}
    skipped = set()
    for run, pop, place, sz, comm, dtype, redop, time_s, iters, busbw, algbw in rows:
        r = runs[run]
        if r["status"] == "failed":
            skipped.add(run)
            continue
        if (op is not None and pop != op) or (size is not None and sz != size):
            continue
        if since is not None and r["start_unix"] < since:
            continue
        config = configuration_of(r, comm, dtype, redop)
        series.setdefault((config, pop, place, sz), []).append(
            dict(run=r, size=sz, time=time_s, iterations=iters, busbw=busbw, algbw=algbw))
    if not series:
        sizes = sorted({r[3] for r in rows if op is None or r[1] == op})
        what = " ".join(x for x in (op and f"of {op}", size and f"at {size} B",
                                     since_text and f"since {since_text}") if x)
        raise cli.BadInput(f"{db}: no runs {what or 'with a passing data check'} (sizes held"
                           f"{' for ' + op if op else ''}: {', '.join(map(str, sizes)) or 'none'})")
    for v in series.values():
        v.sort(key=lambda p: run_order(p["run"]))
    if last:  # the latest runs of each configuration
        latest = {}
        for (config, *_), v in series.items():
            latest.setdefault(config, set()).update(p["run"]["id"] for p in v)
        for config, ids in latest.items():
            latest[config] = set(sorted(ids, key=lambda i: run_order(runs[i]))[-last:])
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


def detect(series, alpha=DEFAULT_ALPHA, min_segment=DEFAULT_MIN_SEGMENT, min_step=DEFAULT_MIN_STEP, seed=0):
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
    tested = [k for k, v in series.items() if len(v) >= 2 * min_segment]
    joint = {}
    for config, keys in keys_of.items():
        runs = sorted({p["run"]["id"]: p["run"] for k in keys for p in series[k]}.values(), key=run_order)
        if len(keys) > 1 and len(runs) >= 2 * min_segment:
            joint[config] = (runs, sorted(keys, key=lambda k: (k[1], k[2], k[3])))
    share = JOINT_SHARE if joint and tested else 1.0 if joint else 0.0
    level_joint = alpha * share / max(1, len(joint))
    level_series = alpha * (1 - share) / max(1, len(tested))
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
        seed = (zlib.crc32(repr(config).encode()) ^ seed) & 0xFFFFFFFF
        times = {k: np.array([p["time"] for p in series[k]]) for k in keys}

        def per_series(cps):
            return {k: steps_at(times[k], [int(np.searchsorted(where[k], t)) for t in cps]) for k in keys}

        def largest(cps):  # a joint change point stands for its largest step in any series
            st = per_series(cps)
            return [math.exp(max((abs(math.log(st[k][i][0])) for k in keys if st[k][i]), default=0.0))
                    for i in range(len(cps))]
        found = prune(e_divisive(z, level_joint, min_segment, 1.0, seed), largest, min_step)
        st = per_series([t for t, _ in found])
        for k in keys:
            for (t, p), step in zip(found, st[k]):
                if step and abs(math.log(step[0])) >= math.log1p(min_step) * (1 - 1e-9):
                    out[k]["changes"].append(dict(t=int(np.searchsorted(where[k], t)), p=p, source="joint",
                                                  width=len(keys)))
    for k in tested:  # what changed in one series alone: searched from the joint change points on
        times = np.array([p["time"] for p in series[k]])
        seed = (zlib.crc32(repr(k).encode()) ^ seed) & 0xFFFFFFFF
        given = [c["t"] for c in out[k]["changes"]]
        found = prune(e_divisive(np.log(times), level_series, min_segment, 1.0, seed, given=given),
                      lambda cps: [st[0] for st in steps_at(times, cps)], min_step, given)
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


# ---- the spread between checks: regress.py's noise model --------------------------------------------

# earlier checks a point's spread needs: their MIN_CHECKS - 1 degrees of freedom, pooled within
# the segments between the series' change points (a level change leaves the spread as it was)
MIN_CHECKS = 6


def check_of(run):
    """What makes runs one check: its Slurm job where recorded, else its folder
    (slurm/interconnect.sbatch writes each check's runs to a folder of their own)."""
    return run["slurm_job"] or os.path.dirname(run["path"])


def between_checks(db, config_of_point, keys, exclude=(), before=None, min_share=None, after=None):
    """The history's spread at each point of `keys`: {key: dict(sd, dof, checks, first, last,
    left_out, changes, starved)} for the points whose series (configuration config_of_point(key),
    the latest DEFAULT_LAST runs before `before` (Unix time), none of the files `exclude`
    (SHA-256)) holds checks enough for MIN_CHECKS - 1 degrees of freedom within the segments
    between its change points (each check's deviation from its own segment's mean, pooled: a
    change of level leaves the spread between nights as it was); for the others
    {key: dict(checks=..., reason=..., starved=..., few=..., first=...)} saying why not (`few`: the
    log figures of those too few checks that began after `after` (Unix time: the baseline's
    last run), `first` the earliest's start). A check's figure is the
    median of its runs' figures; the spread is the pooled standard deviation of their logs,
    outliers among a segment's checks left out (stats.spread_outliers_out: up to a tenth of
    them); `segments` the log figures it rests on (oldest first), `logs` the last segment's.
    Checks whose runs had less than `min_share` of a core (median over the check's runs) are
    left out before anything else, change points included: they measured the host's other
    work, not the fabric (`starved` counts them)."""
    from stats import spread_outliers_out
    con, _ = open_db(db, create=False)
    try:
        series, runs, _ = load_series(con, db, last=0)
    finally:
        con.close()
    exclude = set(exclude)
    wanted = {}
    for key in keys:
        skey = (config_of_point(key),) + tuple(key[:3])
        pts = [p for p in series.get(skey, []) if p["run"]["sha256"] not in exclude
               and (before is None or p["run"]["start_unix"] < before)]
        pts = pts[-DEFAULT_LAST:]
        starved = _starved_checks(pts, min_share)
        wanted[key] = (skey, [p for p in pts if check_of(p["run"]) not in starved], len(starved))
    found, _ = detect({skey: pts for skey, pts, _ in wanted.values() if pts})
    out = {}
    for key, (skey, pts, n_starved) in wanted.items():
        changes = found[skey]["changes"] if pts else []
        bounds = [0] + [c["t"] for c in changes] + [len(pts)]
        segments = [_checks(pts[lo:hi]) for lo, hi in zip(bounds, bounds[1:])]
        segments = [s for s in segments if s]
        checks = segments[-1] if segments else []  # since the last change point
        kept = []  # per segment: (its checks' log figures, outliers left out; the ones left out)
        for seg in segments:
            logs = np.log([float(np.median([p["time"] for p in g])) for g in seg])
            left = spread_outliers_out(logs)[2] if len(logs) >= 3 else []
            kept.append((np.delete(logs, left), left))
        dof = sum(len(logs) - 1 for logs, _ in kept)
        if dof < MIN_CHECKS - 1:
            total = sum(len(s) for s in segments)
            reason = (f"{len(checks)} earlier check(s) of this configuration since its last change point "
                      f"(of {total} in all, {dof} degree(s) of freedom between the change points)"
                      if changes else f"{total} earlier check(s) of this configuration")
            if n_starved:
                reason += f", {n_starved} more left out as starved of CPU"
            # too few for a spread, but what they read since the baseline says whether tonight's is new
            since_base = [g for g in checks if after is None or g[0]["run"]["start_unix"] > after]
            out[key] = dict(checks=len(checks), reason=reason, starved=n_starved,
                            few=np.log([float(np.median([p["time"] for p in g])) for g in since_base]),
                            first=since_base[0][0]["run"]["start_time"] if since_base else None)
            continue
        ss = sum(float(((logs - logs.mean()) ** 2).sum()) for logs, _ in kept)
        out[key] = dict(sd=math.sqrt(ss / dof) if dof else 0.0, dof=dof, logs=kept[-1][0],
                        segments=[logs for logs, _ in kept],
                        checks=sum(len(s) for s in segments), starved=n_starved,
                        first=segments[0][0][0]["run"]["start_time"],
                        last=checks[-1][-1]["run"]["start_time"], changes=len(changes),
                        left_out=sum(len(left) for _, left in kept))
    return out


def _checks(pts):
    """The points `pts` grouped by check, in the order the checks ran."""
    groups = {}
    for p in pts:
        groups.setdefault(check_of(p["run"]), []).append(p)
    return sorted(groups.values(), key=lambda g: run_order(g[0]["run"]))


def _starved_checks(pts, min_share):
    """The checks among `pts` whose runs' median CPU share is under `min_share` (runs that did
    not record one never count as starved)."""
    if min_share is None:
        return set()
    shares = {}  # a point's series holds each run once
    for p in pts:
        if p["run"].get("cpu_share") is not None:
            shares.setdefault(check_of(p["run"]), []).append(p["run"]["cpu_share"])
    return {c for c, v in shares.items() if float(np.median(v)) < min_share}
