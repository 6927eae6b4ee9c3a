"""Reader for shardbench HDF5 results (docs/trace-format.md).

    from shardbench_h5 import load
    run = load("results/fsdp_perf-fsdp-full-t5-small-w4-20261122-193800.h5")
    run.meta["status"], run.steps, run.events, run.memory, run.peaks

Needs Debian's python3-h5py, python3-numpy, python3-pandas (use /usr/bin/python3).

Tools that read many results skip the unreadable ones through `Inputs` (one line each) and
exit with EXIT_SKIPPED when they did. As a command, it says whether results are finished:

    analysis/shardbench_h5.py --status FILE...   # "FILE: ok" per file; exit 0 when every
                                                 # file reads whole and carries a final
                                                 # status, EXIT_SKIPPED otherwise (slurm/sweep)
"""
import os
import subprocess
import sys

import h5py
import numpy as np

SCHEMA_VERSION = 5  # what the programs write now
# 5 added the host ledger (CPU offload: /host_memory, /host_memory_peaks, the plan's host_*
# attributes) and the offload lanes of /events (HOST_LANE, COPY_LANES); 4 split the root
# unit into embedding, bridge and head (unit k is piece k's) and names the units (/events unit_names); 3 added each collective's mesh axis and the /mesh table; 2
# target units and bytes sent; older files read without them.
READABLE_SCHEMA_VERSIONS = (1, 2, 3, 4, 5)
# The offload lanes of /events (include/shardbench/backend/backend.h: kHostLane,
# kCopyH2DLane, kCopyD2HLane): fixed above every communication lane a backend assigns.
HOST_LANE = 100
COPY_LANES = {101: "host-to-device", 102: "device-to-host"}


def lane_name(lane):
    """What a trace lane is: 'compute' (0), 'communication N', 'host' or a copy direction."""
    lane = int(lane)
    if lane == 0:
        return "compute"
    if lane == HOST_LANE:
        return "host"
    if lane in COPY_LANES:
        return f"copy {COPY_LANES[lane]}"
    return f"communication {lane}"
AXES = ("pp", "dp_replicate", "dp_shard", "tp")  # the /mesh columns, outermost first
# Exit status of an analysis tool that skipped unreadable inputs and worked on the rest
# (0 all read, 1 the tool's own verdict, 2 bad input or nothing readable).
EXIT_SKIPPED = 3
# What a damaged, truncated or foreign file raises somewhere in h5py, pandas or our checks.
READ_ERRORS = (OSError, KeyError, ValueError, TypeError, IndexError, AttributeError, RuntimeError)
# Statuses a program writes when it finishes (docs/trace-format.md); a file is written under
# a temporary name and renamed, so any other value, or none, is not a finished result.
FINAL_STATUSES = ("ok", "out-of-memory", "failed", "below-floor")
# What every ddp_perf/fsdp_perf result carries (the tables and figures use them).
TRAINING_KEYS = ("program", "label", "strategy", "model", "world_size", "batch_per_rank", "enc_seq_len", "status")
CATEGORIES = ["parameters", "gradients", "optimizer_state", "activations", "comm_buffers", "workspace"]


def model_label(meta):
    """How figures and reports name a run's model: its preset (t5-611m, t5-v1_1-xl), or its
    shape when the shape was overridden (the programs then append '*' to the preset's name,
    docs/trace-format.md), never a bare 't5-11.3b*': 'T5 4+4 layers, d_model 1024, d_ff 65536,
    128x128 heads, vocab 32128', plus ', gated-GELU' and ', untied head' where they apply."""
    name = str(meta.get("model", "?"))
    keys = ("layers", "d_model", "d_ff", "heads", "d_kv", "vocab")
    if not name.endswith("*") or any(k not in meta for k in keys):
        return name
    m = {k: meta[k] for k in keys}
    text = (f"T5 {m['layers']}+{m['layers']} layers, d_model {m['d_model']}, d_ff {m['d_ff']}, "
            f"{m['heads']}x{m['d_kv']} heads, vocab {m['vocab']}")
    if meta.get("ffn", "relu") != "relu":
        text += ", gated-GELU"
    if not int(meta.get("tie_embeddings", 1)):
        text += ", untied head"
    return text


def names(dataset, key="op_names"):
    """The names a table's codes stand for (op_names, phase_names, dtype_names, ...), as the
    file gives them: the one decoding of those attributes for every reader."""
    return [str(x) for x in _value(dataset.attrs[key])]


def attr(obj, key):
    """One attribute of a file, group or dataset as a Python value (str, int, float, list)."""
    return _value(obj.attrs[key])


def _value(v):
    if isinstance(v, bytes):
        return v.decode()
    if isinstance(v, np.ndarray):
        return [_value(x) for x in v.tolist()]
    if isinstance(v, np.generic):
        return v.item()
    return v


def attrs(obj):
    """Every attribute of a file, group or dataset, as attr() gives it."""
    return {k: _value(v) for k, v in obj.attrs.items()}


def _table(ds):
    import pandas as pd  # here: the interconnect readers below need none of it (0.4 s a process)
    frame = pd.DataFrame(ds[()]) if ds.shape[0] else pd.DataFrame(np.zeros(0, dtype=ds.dtype))
    for col in frame.columns:
        if frame[col].dtype == object:
            frame[col] = frame[col].map(_value)
    return frame


class Run:
    """One result file: metadata, provenance, plan, and pandas tables."""

    def __init__(self, path):
        import pandas as pd  # as in _table
        self.path = str(path)
        with h5py.File(self.path, "r") as f:
            self.meta = attrs(f)
            version = self.meta.get("schema_version")
            if version not in READABLE_SCHEMA_VERSIONS:
                raise ValueError(f"{self.path}: schema_version {version!r}, this reader knows "
                                 f"{', '.join(map(str, READABLE_SCHEMA_VERSIONS))}")
            # A projected result (analysis/project.py) has metadata, the plan and at most /events;
            # the record of a run the watchdog ended, metadata and provenance only (status failed).
            projected = bool(self.meta.get("projected"))
            partial = projected or self.meta.get("status") == "failed"
            table = lambda name: _table(f[name]) if name in f or not partial else pd.DataFrame()  # noqa: E731
            self.provenance = attrs(f["provenance"])
            self.ranks = table("provenance/ranks")
            self.plan = attrs(f["plan"]) if "plan" in f or not partial else {}
            self.steps = table("steps")
            self.events = table("events")
            op_names = names(f["events"]) if "events" in f else []
            phase_names = names(f["events"], "phase_names") if "events" in f else []
            axis_names = names(f["events"], "axis_names") if "events" in f and "axis_names" in f["events"].attrs else []
            self.unit_names = (names(f["events"], "unit_names")
                               if "events" in f and "unit_names" in f["events"].attrs else [])
            self.mesh = _table(f["mesh"]) if "mesh" in f else pd.DataFrame()
            self.memory = table("memory")
            self.peaks = table("memory_peaks")
            # The host ledger (schema 5; empty tables in older files).
            self.host_memory = _table(f["host_memory"]) if "host_memory" in f else pd.DataFrame()
            self.host_peaks = _table(f["host_memory_peaks"]) if "host_memory_peaks" in f else pd.DataFrame()
        if len(self.events):
            self.events["op_name"] = pd.Categorical.from_codes(self.events["op"], op_names)
            self.events["phase_name"] = pd.Categorical.from_codes(self.events["phase"], phase_names)
            self.events["duration"] = self.events["end"] - self.events["start"]
            if "axis" in self.events and axis_names:
                self.events["axis_name"] = [axis_names[a] if 0 <= a < len(axis_names) else "" for a in self.events["axis"]]

    def unit_name(self, unit):
        """What an event's unit code names: /events unit_names (schema 4: 'embedding',
        'encoder.0', ..., 'bridge', 'decoder.0', ..., 'head'), or in older files their
        numbering: 0 the root (embedding, final norms, LM head), 1…L the encoder blocks,
        L+1…2L the decoder blocks. 'no unit' for -1."""
        if unit < 0:
            return "no unit"
        if self.unit_names:
            return self.unit_names[unit] if unit < len(self.unit_names) else f"unit {unit}"
        layers = int(self.meta.get("layers", 0))
        if unit == 0:
            return "root"
        return f"encoder.{unit - 1}" if unit <= layers else f"decoder.{unit - layers - 1}"

    def group(self, rank, axis):
        """The ranks of `rank`'s group along `axis` (a name of AXES), read from /mesh: those
        with every other coordinate equal. None when the file has no /mesh (schema < 3)."""
        if not len(self.mesh):
            return None
        m = self.mesh.set_index("rank")
        mine = m.loc[rank]
        same = np.ones(len(m), bool)
        for other in AXES:
            if other != axis:
                same &= (m[other] == mine[other]).to_numpy()
        return sorted(int(r) for r in m.index[same])

    @property
    def timed_steps(self):
        """Steps after the warm-up."""
        return self.steps[self.steps["warmup"] == 0] if len(self.steps) else self.steps

    def __repr__(self):
        m = self.meta
        return f"<Run {m.get('program')} {m.get('label')} {m.get('model')} w{m.get('world_size')} {m.get('status')}>"


def load(path):
    return Run(path)


def read_meta(path):
    """A result's root attributes (its metadata), as attrs() gives them, without its tables:
    what a tool needs to tell a projected result from a measured one, or a run's date."""
    with h5py.File(str(path), "r") as f:
        return attrs(f)


class TrainingArrays:
    """A completed training result's metadata, /steps and /events as NumPy record arrays and
    the events' op names (`op_names`, indexed by an event's op): what a calibration fits from,
    without Run's pandas tables. Raises ValueError naming what a completed result lacks."""

    def __init__(self, path):
        with h5py.File(str(path), "r") as f:
            self.meta = attrs(f)
            if self.meta.get("status") != "ok" or "steps" not in f or "events" not in f:
                raise ValueError("not a completed training result")
            self.steps, self.events = f["steps"][()], f["events"][()]
            self.op_names = np.array(names(f["events"]))


def require(run, keys):
    """run, or KeyError naming the attributes it lacks (a foreign or damaged file)."""
    missing = [k for k in keys if k not in run.meta]
    if missing:
        raise KeyError(f"no attribute {', '.join(missing)}")
    return run


def load_training(path):
    """load(path), checked to carry what a training result has when it is one."""
    run = load(path)
    return require(run, TRAINING_KEYS) if run.meta.get("program") in ("ddp_perf", "fsdp_perf") else run


def _finished(path):
    """The status of a finished, fully readable result; an exception says why it is not one."""
    status = load(path).meta.get("status")
    if status not in FINAL_STATUSES:
        raise ValueError(f"status {status!r} is not a final status ({', '.join(FINAL_STATUSES)})")
    return status


def _why(e):
    """One line (no tab: the probe's field separator) naming the exception."""
    return f"{type(e).__name__}: {str(e).splitlines()[0] if str(e) else ''}".replace("\t", " ")


def probe(paths):
    """{path: (status, None) or (None, why not)}: each file fully read in a child process,
    because a damaged file can make the HDF5 library crash the process that reads it (seen:
    SIGSEGV on a zeroed object header). After a crash the next children go on after it."""
    todo, out = [str(p) for p in paths], {}
    while todo:
        r = subprocess.run([sys.executable, os.path.abspath(__file__), "--probe", *todo],
                           capture_output=True, text=True, stdin=subprocess.DEVNULL)
        lines = [x.split("\t", 2) for x in r.stdout.splitlines() if x.count("\t") >= 2]
        for verdict, what, path in lines:
            out[path] = (what, None) if verdict == "OK" else (None, what)
        todo = todo[len(lines):]
        if todo:  # the child died reading todo[0]
            how = f"signal {-r.returncode}" if r.returncode < 0 else f"exit {r.returncode}"
            out[todo[0]] = (None, f"reading it crashed the HDF5 library ({how})")
            todo = todo[1:]
    return out


class Inputs:
    """Reads a tool's inputs, skipping the unreadable ones with one line each.

        inputs = Inputs("summarize")
        rows = inputs.read(paths, lambda p: row(load(p)))   # what could be read
        return inputs.exit_code(0)                           # EXIT_SKIPPED if any was skipped
    """

    def __init__(self, tool):
        self.tool = tool
        self.skipped = []

    def read_one(self, path, reader=load):
        """reader(path), or None after saying why the file is skipped."""
        try:
            return reader(path)
        except READ_ERRORS as e:
            print(f"{self.tool}: skipped {path}: not a readable shardbench result ({_why(e)})", file=sys.stderr)
            self.skipped.append(str(path))
            return None

    def read(self, paths, reader=load):
        """reader(path) of every file that probe() finds finished and readable, in order."""
        verdicts = probe(paths)
        good = []
        for p in paths:
            status, why = verdicts[str(p)]
            if status is None:
                print(f"{self.tool}: skipped {p}: not a readable shardbench result ({why})", file=sys.stderr)
                self.skipped.append(str(p))
            else:
                good.append(p)
        return [x for x in (self.read_one(p, reader) for p in good) if x is not None]

    def exit_code(self, code=0):
        """The tool's own code, or EXIT_SKIPPED where it would be 0 but inputs were skipped."""
        if self.skipped:
            print(f"{self.tool}: {len(self.skipped)} unreadable file(s) skipped (exit {EXIT_SKIPPED})", file=sys.stderr)
            if code == 0:
                return EXIT_SKIPPED
        return code


def main(argv=None):
    args = sys.argv[1:] if argv is None else argv
    if len(args) >= 2 and args[0] == "--probe":  # the child of probe(): one line per file, at once
        for path in args[1:]:
            try:
                line = f"OK\t{_finished(path)}\t{path}"
            except READ_ERRORS as e:
                line = f"BAD\t{_why(e)}\t{path}"
            print(line, flush=True)
        return 0
    import cli  # the analysis scripts' --help convention (this folder)
    ap = cli.parser(__doc__, __file__)
    ap.add_argument("--status", nargs="+", required=True, metavar="FILE",
                    help="results to check: one line each, \"FILE: STATUS\" or \"FILE: unreadable (why)\"")
    files = ap.parse_args(args).status
    verdicts = probe(files)
    for path in files:
        status, why = verdicts[path]
        print(f"{path}: {status}" if status else f"{path}: unreadable ({why})")
    return EXIT_SKIPPED if any(s is None for s, _ in verdicts.values()) else 0



# ---- collective results (collective_perf) -------------------------------------------------------
# The one reader of collective_perf's result files (analysis/regress.py, history_db.py): the
# checks every reader makes (cli.BadInput, one line naming the file) and the figures they
# share. A point is (operation, in-place, size, library, type, reduction); an iteration is one
# (point, root, cycle, iteration) across ranks and its time the slowest rank's
# (stats.slowest_rank's rule), the point's figure the median over its iterations.

COLLECTIVE_SAMPLE_FIELDS = ("rank", "op", "in_place", "iteration", "size", "time")
COLLECTIVE_RESULT_FIELDS = ("op", "in_place", "size", "busbw", "algbw")
COLLECTIVE_STATUSES = ("ok", "failed", "below-floor")  # what collective_perf writes when it finishes


class CollectivePoint:
    """One point of a run: `iterations` (per iteration, the slowest rank's time, s), `time`
    (their median), `busbw` and `algbw` (GB/s: the results table's, median over roots and
    cycles; None where it has no row), `table` (the results table's rows of the point, as
    collective_perf printed them: dicts of its fields among RESULT_FIGURES)."""

    def __init__(self, iterations):
        self.iterations = iterations
        self.time = float(np.median(iterations))
        self.busbw = self.algbw = None
        self.table = []


# The results table's figures a row of CollectivePoint.table carries where the file has them:
# time, p50, p90 (s; collective_perf's time across ranks and the slowest rank's percentiles),
# busbw, algbw (GB/s).
RESULT_FIGURES = ("time", "p50", "p90", "busbw", "algbw")


class CollectiveResult:
    """A collective_perf result: `path`, `sha256` (its content: the identity by which a byte
    copy is the same run), `facts` (start time, commit, hosts, world size, nodes, backend,
    comm, collectives, dtype, redop, status, Slurm job, command line) and `points`
    ({(op, in_place, size, comm, dtype, redop): CollectivePoint})."""

    def __init__(self, path, sha256, facts, points):
        self.path, self.sha256, self.facts, self.points = path, sha256, facts, points


def file_sha256(path):
    import hashlib
    h = hashlib.sha256()
    with open(path, "rb") as f:
        for block in iter(lambda: f.read(1 << 20), b""):
            h.update(block)
    return h.hexdigest()


def parse_utc(text, what):
    """A datetime (UTC) from an ISO 8601 date or time ('2026-11-23', '2026-11-23T06:01:54Z'),
    or cli.BadInput naming `what`."""
    import datetime
    from cli import BadInput
    try:
        t = datetime.datetime.fromisoformat(str(text).strip().replace("Z", "+00:00"))
    except ValueError:
        raise BadInput(f"{what} '{text}' is not an ISO 8601 date or time (e.g. 2026-11-23 or 2026-11-23T06:01:54Z)")
    return t.replace(tzinfo=datetime.timezone.utc) if t.tzinfo is None else t.astimezone(datetime.timezone.utc)


def _one_line(e):
    return " ".join(str(e).split())


def _cvalue(v):  # attr()'s decoding, tolerant of bytes that are not UTF-8 (a damaged file)
    if isinstance(v, bytes):
        return v.decode(errors="replace")
    if isinstance(v, np.ndarray):
        return [_cvalue(x) for x in v.tolist()]
    return v.item() if isinstance(v, np.generic) else v


def _cnames(ds, key):
    return [str(x) for x in _cvalue(ds.attrs[key])] if key in ds.attrs else None


def _decode_column(rows, ds, field, names_key, fallback, fname, table):
    """Per row of `rows` (read from dataset `ds`), the name its `field` code stands for;
    `fallback` (the file's single value) where the column or its names attribute is missing."""
    from cli import BadInput
    if rows.dtype.names is None or field not in rows.dtype.names:
        return np.array([fallback] * len(rows), dtype=object)
    names_ = _cnames(ds, names_key)
    if names_ is None:
        return np.array([fallback] * len(rows), dtype=object)
    codes = rows[field].astype(np.int64)
    bad = codes[(codes < 0) | (codes >= len(names_))]
    if len(bad):
        raise BadInput(f"{fname}: corrupt {table} table: {field} code {int(bad[0])} is not one of the "
                       f"{len(names_)} {names_key}")
    return np.array(names_, dtype=object)[codes]


def read_collective(fname):
    """The CollectiveResult of one collective_perf result file, or cli.BadInput naming the
    file and what is wrong (not HDF5, another program, unfinished, no or a corrupt samples or
    results table, non-finite times)."""
    from cli import BadInput
    if os.path.isdir(fname):
        raise BadInput(f"{fname}: is a directory")
    try:
        facts, points = _read_collective(fname)
        digest = file_sha256(fname)
    except BadInput:
        raise
    except Exception as e:  # noqa: BLE001: a damaged file fails in many places; name it
        raise BadInput(f"{fname}: corrupt collective_perf result ({type(e).__name__}: {_one_line(e)})")
    return CollectiveResult(os.path.abspath(fname), digest, facts, points)


def _read_collective(fname):
    from cli import BadInput
    try:
        f = h5py.File(fname, "r")
    except OSError as e:
        raise BadInput(f"{fname}: not a readable HDF5 file ({_one_line(e)})")
    with f:
        a = {k: _cvalue(v) for k, v in f.attrs.items()}
        if a.get("program") != "collective_perf":
            raise BadInput(f"{fname}: not a collective_perf result (program {a.get('program', 'not recorded')!r})")
        for k in ("start_time", "world_size", "status"):
            if k not in a:
                raise BadInput(f"{fname}: corrupt collective_perf result: no {k} attribute")
        if a["status"] not in COLLECTIVE_STATUSES:
            raise BadInput(f"{fname}: not a finished result (status {a['status']!r}; finished: "
                           f"{', '.join(COLLECTIVE_STATUSES)})")
        start = parse_utc(a["start_time"], f"{fname}: start_time")
        for k in ("samples", "results"):
            if k not in f or not isinstance(f[k], h5py.Dataset):
                raise BadInput(f"{fname}: no {k} table")
        sds, rds = f["samples"], f["results"]
        s, r = sds[()], rds[()]
        op_names = _cnames(sds, "op_names")
        if op_names is None:
            raise BadInput(f"{fname}: corrupt samples table: no op_names attribute")
        prov = {k: _cvalue(v) for k, v in f["provenance"].attrs.items()} if "provenance" in f else {}
        hosts = []
        if "provenance/ranks" in f:
            ranks = f["provenance/ranks"][()]
            if ranks.dtype.names and "host" in ranks.dtype.names:
                order = np.argsort(ranks["rank"], kind="stable") if "rank" in ranks.dtype.names else range(len(ranks))
                for h in (_cvalue(ranks["host"][i]) for i in order):
                    if h not in hosts:
                        hosts.append(h)
        if not hosts and prov.get("env.SLURM_JOB_NODELIST"):
            hosts = [prov["env.SLURM_JOB_NODELIST"]]
        comm_default = a.get("comm") or ("nccl" if a.get("backend") == "cuda" else "mpi")
        fallback = {"comm": str(comm_default), "dtype": str(a.get("dtype", "?")), "redop": str(a.get("redop", "?"))}
        # Where a file measured several libraries, types or reductions without a column to
        # tell them apart, its single value is unknown.
        for k in ("comm", "dtype", "redop"):
            if "," in fallback[k] and (s.dtype.names is None or k not in s.dtype.names):
                raise BadInput(f"{fname}: {k} is {fallback[k]!r} but the samples table has no {k} column")
        sample_keys = {k: _decode_column(s, sds, k, k + "_names", fallback[k], fname, "samples")
                       for k in ("comm", "dtype", "redop")} if len(s) else {}
        result_keys = {k: _decode_column(r, rds, k, k + "_names", fallback[k], fname, "results")
                       for k in ("comm", "dtype", "redop")} if len(r) else {}
        r_ops = _cnames(rds, "op_names") or op_names

    missing = [k for k in COLLECTIVE_SAMPLE_FIELDS if s.dtype.names is None or k not in s.dtype.names]
    if missing:
        raise BadInput(f"{fname}: corrupt samples table: no field {', '.join(missing)}")
    if len(s) == 0:
        raise BadInput(f"{fname}: no measurements (empty samples table)")
    rmissing = [k for k in COLLECTIVE_RESULT_FIELDS if r.dtype.names is None or k not in r.dtype.names]
    if rmissing:
        raise BadInput(f"{fname}: corrupt results table: no field {', '.join(rmissing)}")
    ops = s["op"].astype(np.int64)
    bad_op = ops[(ops < 0) | (ops >= len(op_names))]
    if len(bad_op):
        raise BadInput(f"{fname}: corrupt samples table: op code {int(bad_op[0])} is not one of the "
                       f"{len(op_names)} op_names")
    t = s["time"].astype(float)
    ok = np.isfinite(t) & (t > 0)
    if not ok.all():
        raise BadInput(f"{fname}: {int((~ok).sum())} of {len(t)} times are not finite positive numbers "
                       f"(first: {t[~ok][0]!r}): unusable")
    if np.any(s["size"] <= 0):
        raise BadInput(f"{fname}: corrupt samples table: a size of {int(s['size'][s['size'] <= 0][0])} bytes")

    def column(name):
        return s[name].astype(np.int64) if name in s.dtype.names else np.zeros(len(s), np.int64)
    codes = {k: np.unique(sample_keys[k], return_inverse=True) for k in ("comm", "dtype", "redop")}
    grid = np.stack([ops, column("in_place"), column("size")] + [codes[k][1].ravel() for k in ("comm", "dtype", "redop")]
                    + [column("root"), column("cycle"), column("iteration")], axis=1)
    iters, inv = np.unique(grid, axis=0, return_inverse=True)
    slowest = np.full(len(iters), -np.inf)  # stats.slowest_rank over the full iteration key
    np.maximum.at(slowest, inv.ravel(), t)
    pts, pinv = np.unique(iters[:, :6], axis=0, return_inverse=True)
    pinv = pinv.ravel()
    points = {}
    for j, p in enumerate(pts):
        key = (op_names[p[0]], int(p[1]), int(p[2]), str(codes["comm"][0][p[3]]), str(codes["dtype"][0][p[4]]),
               str(codes["redop"][0][p[5]]))
        points[key] = CollectivePoint(slowest[pinv == j])
    bw = {}
    for i in range(len(r)):
        code = int(r["op"][i])
        if not 0 <= code < len(r_ops):
            raise BadInput(f"{fname}: corrupt results table: op code {code} is not one of the {len(r_ops)} op_names")
        key = (r_ops[code], int(r["in_place"][i]), int(r["size"][i]), str(result_keys["comm"][i]),
               str(result_keys["dtype"][i]), str(result_keys["redop"][i]))
        bw.setdefault(key, []).append((float(r["busbw"][i]), float(r["algbw"][i])))
        if key in points:
            points[key].table.append({k: float(r[k][i]) for k in RESULT_FIGURES if k in r.dtype.names})
    for key, rows in bw.items():
        if key in points:
            points[key].busbw = float(np.median([x[0] for x in rows]))
            points[key].algbw = float(np.median([x[1] for x in rows]))
    facts = dict(start_time=str(a["start_time"]), end_time=str(a.get("end_time", "")), start_unix=start.timestamp(),
                 commit_id=str(prov.get("shardbench_version", "unknown")), hosts=",".join(hosts),
                 world_size=int(a["world_size"]), nodes=a.get("nodes"), ranks_per_node=a.get("ranks_per_node"),
                 # --groups: every group of that axis ran the operations at once; the rows are
                 # one group's (group_size ranks on group_nodes nodes); "world": one group of all
                 groups=str(a.get("groups", "world")), group_size=int(a.get("group_size", a["world_size"])),
                 group_nodes=int(a.get("group_nodes", a.get("nodes") or 1)),
                 backend=str(a.get("backend", "")), comm=str(comm_default),
                 collectives=str(a.get("collectives", "unrecorded")),  # schema 1 did not say
                 dtype=fallback["dtype"], redop=fallback["redop"], status=str(a["status"]),
                 slurm_job=str(prov.get("env.SLURM_JOB_ID", "")) or None, command_line=prov.get("command_line"),
                 # how much of its cores the run had (process CPU / wall, the least of its ranks):
                 # None before these were recorded
                 cpu_share=float(a["cpu_share_min"]) if "cpu_share_min" in a else None,
                 load_start=a.get("load_start"), load_end=a.get("load_end"), cpus_online=a.get("cpus_online"))
    return facts, points


def collective_files(path, recursive=False):
    """The .h5 files of `path`: the file itself, or a folder's *.h5 (every one below it with
    `recursive`), sorted; cli.BadInput when there is none."""
    from cli import BadInput
    if os.path.isdir(path):
        out = []
        for d, subdirs, files in os.walk(path):
            subdirs.sort()
            out += [os.path.join(d, f) for f in sorted(files) if f.endswith(".h5")]
            if not recursive:
                break
        if not out:
            raise BadInput(f"{path}: no .h5 results in this directory" + (" or below it" if recursive else ""))
        return out
    if not os.path.exists(path):
        raise BadInput(f"{path}: no such file or directory")
    return [path]


if __name__ == "__main__":
    import cli  # this folder: sys.path[0] of a script
    sys.exit(cli.run(__file__, main))


# ---- pair sweeps (collective_perf --pattern pairs) ----------------------------------------
# The one reader of pair-sweep files (docs/trace-format.md, "The pair sweep"); diagnose.py
# judges what it returns.
PAIR_SCHEMA_VERSIONS = (1, 2)  # 2 added the repetition column (1: one repetition)
PAIR_KIND_EXCHANGE, PAIR_KIND_LATENCY, PAIR_KIND_INTRA = 0, 1, 2


class NotAPairSweep(ValueError):
    """A file that is not a usable pair sweep; the message names the file and why."""


def read_pair_sweep(fname):
    """One pair sweep: {'file', 'nodes', 'schema_version', 'repetitions', 'facts', 'figures'}.
    `figures` is a DataFrame with a row per (kind, size, repetition, node pair): a, b (host
    names, in node order), kind (0 exchange, 1 latency), size, repetition, round, time: the
    pair's figure in that repetition, stats' rule (an iteration ends with the pair's slowest
    rank; the median over the repetition's iterations). Raises NotAPairSweep."""
    import pandas as pd  # as in _table
    import stats  # this folder
    try:
        f = h5py.File(fname, "r")
    except OSError as e:
        raise NotAPairSweep(f"{fname}: not a readable HDF5 file ({e})")
    with f:
        if f.attrs.get("program") is None or attr(f, "program") != "collective_perf" or "pattern" not in f.attrs \
                or attr(f, "pattern") != "pairs":
            raise NotAPairSweep(f"{fname}: not a pair sweep (collective_perf --pattern pairs)")
        version = int(attr(f, "schema_version")) if "schema_version" in f.attrs else 1
        if version not in PAIR_SCHEMA_VERSIONS:
            raise NotAPairSweep(f"{fname}: pair-sweep schema_version {version}; this reader knows "
                                f"{', '.join(map(str, PAIR_SCHEMA_VERSIONS))}")
        if attr(f, "status") != "ok":
            raise NotAPairSweep(f"{fname}: its data check found wrong bytes (status {attr(f, 'status')})")
        if "samples" not in f or len(f["samples"]) == 0:
            raise NotAPairSweep(f"{fname}: no samples")
        nodes = attr(f, "node_names").split(",")
        s = _table(f["samples"])
        facts = {k: attr(f, k) for k in ("iters", "warmup", "latency_bytes", "sizes", "pair_ranks", "start_time",
                                         "backend", "pairs")}
        facts["repetitions"] = int(attr(f, "repetitions")) if "repetitions" in f.attrs else 1
    if "repetition" not in s.columns:  # version 1: the sweep ran once
        s["repetition"] = 0
    s = s[s["kind"] != PAIR_KIND_INTRA]
    if not np.all(np.isfinite(s["time"])) or np.any(s["time"] <= 0):
        raise NotAPairSweep(f"{fname}: non-finite or non-positive times")
    s = s.assign(a=np.minimum(s["node"], s["peer_node"]), b=np.maximum(s["node"], s["peer_node"]))
    rows = []
    for (kind, size, rep, rnd, a, b), g in s.groupby(["kind", "size", "repetition", "round", "a", "b"], sort=True):
        rows.append((nodes[a], nodes[b], int(kind), int(size), int(rep), int(rnd),
                     stats.run_figure(stats.slowest_rank(g["iteration"], g["time"]))))
    figures = pd.DataFrame(rows, columns=["a", "b", "kind", "size", "repetition", "round", "time"])
    return {"file": fname, "nodes": nodes, "schema_version": version,
            "repetitions": int(figures["repetition"].nunique()), "facts": facts, "figures": figures}
