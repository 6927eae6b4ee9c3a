"""The projection's model: cluster descriptions, the per-operation compute model, NCCL-style
collective costs, and the replay of one step's schedule (docs/projection.md).

    from projection_model import load_cluster, simulate
    cluster = load_cluster("runs/clusters/h100-80gb.toml")   # calibrated from the runs it names
    sim = simulate(schedule, cluster)                          # schedule: --plan --schedule-json

Pure Python over the programs' own schedules; analysis/project.py is the command line.
"""
import bisect
import functools
import math
import os

import numpy as np

import cli  # (this folder) load_toml(): how input files are read and checked
import shardbench_h5  # (this folder) names(), attr(): the files' attributes, decoded once

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
PRECISIONS = ("fp32", "bf16", "fp16")
# Operations by the names the programs give them (a schedule's and a result's op_names):
# their numeric codes are the files' business.
COLLECTIVES = ("all-reduce", "all-gather", "reduce-scatter")
COMPUTE_OPS = ("gemm", "elementwise", "optimizer", "copy")

# Field: (type, required). Numbers must be positive unless noted in the docs.
NUM = (int, float)
CLUSTER_FIELDS = {"name": (str, True), "gpus_per_node": (int, True), "gpu_memory_gib": (NUM, True),
                  "dtype": (str, True), "collectives": (str, False), "cpu_cores_per_node": (int, False),
                  "cpu_cores_shared": (int, False)}
COMPUTE_FIELDS = {"gemm_tflops": (NUM, True), "memory_bandwidth_gbps": (NUM, True), "launch_us": (NUM, False),
                  "calibration_runs": (list, False), "gemm_scale": (NUM, False), "memory_scale": (NUM, False),
                  "overlap_slowdown": (NUM, False), "gpu_speed_spread": (NUM, False)}
INTRA_FIELDS = {"bandwidth_gbps": (NUM, True), "latency_us": (NUM, True), "allreduce_bandwidth_gbps": (NUM, False)}
INTER_FIELDS = {"nic_bandwidth_gbps": (NUM, True), "nics_per_node": (int, True), "latency_us": (NUM, True)}
# [host]: what CPU offload (fsdp_perf --cpu-offload) runs on, per GPU: the host link (GB/s per
# direction), the CPU optimizer update's rate (GB/s of the bytes it touches) and host memory.
HOST_FIELDS = {"link_bandwidth_gbps": (NUM, True), "update_bandwidth_gbps": (NUM, True), "memory_gib": (NUM, True)}
# The trace lanes of CPU offload (docs/trace-format.md): the host's update and waits, the
# host-to-device and device-to-host copies; their numbers are shardbench_h5's (the one
# Python home of backend.h's), and each schedule row carries its own.
HOST_LANE = shardbench_h5.HOST_LANE
_COPY_LANE = {name: lane for lane, name in shardbench_h5.COPY_LANES.items()}
UPLOAD_LANE, DOWNLOAD_LANE = _COPY_LANE["host-to-device"], _COPY_LANE["device-to-host"]
COLLECTIVE_MODELS = ("nccl", "ring")
# The streams the replay places communication on (its trace lanes): all-gathers, the
# reductions, tensor-parallel collectives, and a pipeline's activations and their
# gradients, each direction's sends and receives in order on one stream. The plan's rows
# carry the lane of every other op (0 compute and its waits, the offload lanes), which the
# replay keeps; a collective's or message's row says only "a communication lane" (the
# counting backend's 1), so the replay chooses its stream here.
REPLAY_LANES = {"gather": 1, "reduce": 2, "tensor": 3, "activations": 4, "gradients": 5}
TRANSFER_LANES = (REPLAY_LANES["activations"], REPLAY_LANES["gradients"])

# NCCL's tuning model (src/graph/tuning.cc): the fixed latency of a ring collective with the
# Simple protocol, the tree all-reduce's per-hop latencies (NVLink, network) and its bandwidth
# cap (busBw ≤ 0.9·ring busBw and ≤ 80 GB/s beyond two nodes), and the 1.9× "plateau" on the
# latency of a multi-node ring all-reduce. The per-step ring latencies are the cluster's.
NCCL_RING_BASE_US = 8.4
NCCL_TREE_HOP_US = {"intra": 28.0, "inter": 50.0}
# The replay's fixed point (simulate): a pass that moves the step time by less than this
# (relative) ends it; a figure that moves less matters to no comparison the projection makes.
REPLAY_TOLERANCE = 1e-4
# Upper bounds of the fields the programs take as flags (--mem-limit-gib, --host-mem-limit-gib
# up to 2^20 GiB; --world-size up to 2^24): a value past them is refused here by its name, not
# blamed later on the flag (src/train/options.cpp).
FIELD_MAX = {"gpu_memory_gib": (2 ** 20, "fsdp_perf --mem-limit-gib"), "gpus_per_node": (2 ** 24, "--world-size"),
             "host.memory_gib": (2 ** 20, "fsdp_perf --host-mem-limit-gib")}
REPLAY_MAX_PASSES = 50
NCCL_TREE_MAX_BUSBW = 80.0
NCCL_RING_ALLREDUCE_PLATEAU = 1.9


# The tools' one error of one line (analysis/cli.py); the name kept for this module's callers.
ProjectionError = cli.BadInput


# ---------------------------------------------------------------- cluster descriptions

def _check_table(table, fields, where, path):
    for key, (typ, required) in fields.items():
        if key not in table:
            if required:
                raise cli.BadInput(f"cluster description {path}: missing field '{where}{key}'")
            continue
        v = table[key]
        if not isinstance(v, typ) or isinstance(v, bool):
            raise cli.BadInput(f"cluster description {path}: field '{where}{key}' = {v!r} has the wrong type")
        # nan and inf pass `v <= 0` and would be projected as if measured: refused by name
        if isinstance(v, NUM) and not (math.isfinite(v) and v > 0):
            allowed = "a positive integer" if typ is int else "a finite positive number"
            raise cli.BadInput(f"cluster description {path}: field '{where}{key}' = {v!r} is not allowed "
                               f"(must be {allowed})")
        if where + key in FIELD_MAX and v > FIELD_MAX[where + key][0]:
            top, flag = FIELD_MAX[where + key]
            raise cli.BadInput(f"cluster description {path}: field '{where}{key}' = {v!r} is not allowed (must be "
                               f"from 0 to {top}, as the programs' {flag})")
    unknown = set(table) - set(fields) - {"intra", "inter", "compute", "host"}
    if unknown:
        raise cli.BadInput(f"cluster description {path}: unknown field(s) {sorted(where + u for u in unknown)}")


def host_rates(cluster):
    """(host link bytes/s per direction, host update bytes/s) of one GPU's rank, from the
    description's [host]; cli.BadInput (one line naming the table) when it has none."""
    h = cluster.get("host")
    if not isinstance(h, dict):
        raise cli.BadInput(f"cluster description {cluster.get('source', cluster.get('name'))}: missing table "
                           "[host] (host.link_bandwidth_gbps, host.update_bandwidth_gbps, host.memory_gib), "
                           "needed to project CPU offload (docs/projection.md)")
    return h["link_bandwidth_gbps"] * 1e9, h["update_bandwidth_gbps"] * 1e9


def has_offload(sched):
    """True when the schedule holds CPU offload's host updates or host-device copies."""
    cols = sched["columns"]
    if "lane" not in cols:
        return False
    lane = cols.index("lane")
    rows = [r for s in sched.get("stages", []) for r in s["ops"]] if sched.get("pp_size", 1) > 1 else sched["ops"]
    return any(r[lane] >= HOST_LANE for r in rows)


def load_cluster(path, calibrate=True):
    """Reads and checks a description; builds its compute model from the runs it names."""
    c = cli.load_toml(path, "cluster description")
    _check_table(c, CLUSTER_FIELDS, "", path)
    for tier, fields in (("compute", COMPUTE_FIELDS), ("intra", INTRA_FIELDS), ("inter", INTER_FIELDS)):
        if not isinstance(c.get(tier), dict):
            raise cli.BadInput(f"cluster description {path}: missing table [{tier}]")
        _check_table(c[tier], fields, tier + ".", path)
    if "host" in c:  # optional: only schedules with CPU offload need it (host_rates)
        if not isinstance(c["host"], dict):
            raise cli.BadInput(f"cluster description {path}: 'host' must be a table [host]")
        _check_table(c["host"], HOST_FIELDS, "host.", path)
    c["source"] = path
    if c["dtype"] not in PRECISIONS:
        raise cli.BadInput(f"cluster description {path}: dtype '{c['dtype']}' is not one of {', '.join(PRECISIONS)}")
    c.setdefault("collectives", "ring")
    if c["collectives"] not in COLLECTIVE_MODELS:
        raise cli.BadInput(f"cluster description {path}: collectives '{c['collectives']}' is not one of "
                           f"{', '.join(COLLECTIVE_MODELS)}")
    c["calibration"], c["calibration_quality"] = [], []
    cm = ComputeModel(c)
    c["compute_model"] = cm
    if calibrate:
        for run in c["compute"].get("calibration_runs", []):
            cm.add_run(os.path.join(ROOT, run), c)
    return c


# ---------------------------------------------------------------- compute

def oversubscription(cluster, ranks_per_node, world):
    """CPU clusters: ranks beyond the cores share them, so compute slows by ranks/cores: a
    node's ranks share its cpu_cores_per_node, or, where the nodes are hosts emulated on one
    machine (cpu_cores_shared: that machine's cores), every rank of the world shares them."""
    shared = cluster.get("cpu_cores_shared")
    if shared:
        return max(1.0, world / shared)
    cores = cluster.get("cpu_cores_per_node")
    return max(1.0, ranks_per_node / cores) if cores else 1.0


@functools.lru_cache(maxsize=None)  # the replay asks for it on every pass
def expected_max_normal(n):
    """E[max of n independent standard normal variables] (0 for n = 1), by quadrature."""
    if n <= 1:
        return 0.0
    x = np.linspace(-12.0, 12.0, 48001)
    pdf = np.exp(-0.5 * x * x) / math.sqrt(2 * math.pi)
    cdf = 0.5 * (1.0 + np.vectorize(math.erf)(x / math.sqrt(2)))
    return float(np.trapz(x * n * pdf * cdf ** (n - 1), x))


# A box plot's whiskers (Q1 − 1.5·IQR to Q3 + 1.5·IQR) span 5.396 σ of a normal distribution.
WHISKER_SPAN_SIGMAS = 2 * (0.6745 + 1.5 * 2 * 0.6745)


def straggler_factor(cluster, world):
    """Compute time of the slowest of `world` GPUs over that of the one measured GPU.
    Every collective synchronises the ranks, so the step runs at the slowest GPU's pace;
    [compute] gpu_speed_spread is the spread of per-GPU speed between the whiskers, as
    measured across the GPUs of a cluster, read as a normal distribution."""
    spread = cluster["compute"].get("gpu_speed_spread", 0.0)
    return 1.0 + spread / WHISKER_SPAN_SIGMAS * expected_max_normal(world)


def _interp_log(x, xs, ys):
    """ys interpolated at x in log(xs), held constant beyond the ends."""
    return float(np.interp(math.log(x), np.log(xs), ys)) if len(xs) > 1 else float(ys[0])


class ComputeModel:
    """Each compute operation costed by its shape, as measured on the target GPU:
    GEMMs by their exact shape (m, n, k, batch) where a calibration run issued it, else at the
    rate measured for GEMMs of the same class (plain or batched) and similar FLOPs;
    elementwise kernels by their bytes at the bandwidth measured for kernels of that size;
    copies/casts and the Adam update by bytes at their measured bandwidth; plus a launch
    overhead per operation (the gaps between kernels). Without calibration runs every GEMM
    runs at the nominal [compute] gemm_tflops and every other operation at its
    memory_bandwidth_gbps, with no launch overhead."""

    def __init__(self, cluster):
        comp = cluster["compute"]
        self.gemm_scale = comp.get("gemm_scale", 1.0)
        self.memory_scale = comp.get("memory_scale", 1.0)
        self.nominal_rate = comp["gemm_tflops"] * 1e12
        self.nominal_bw = comp["memory_bandwidth_gbps"] * 1e9
        self.launch = comp.get("launch_us", 0.0) * 1e-6
        self.cluster = cluster
        self.reset()

    def reset(self):
        self.gemm_samples, self.elem_samples = {}, {}
        self.bytes_time = {"copy": [0.0, 0.0], "optimizer": [0.0, 0.0]}
        self.overhead = self.ops = 0.0
        self.runs = []
        self.quality = []  # calibration_quality() rows of each run: its compute steps' spread
        self.run_means = {}  # (program, model, world, batch) -> [each run's mean compute per step]
        self._fit()

    def add_run(self, path, cluster):
        """Adds a measured training run's timed steps (every rank) to the calibration."""
        try:
            r = shardbench_h5.TrainingArrays(path)
            m = r.meta
            s, e, op_names = r.steps, r.events, r.op_names
            dtype, rpn, world = m["dtype"], m["ranks_per_node"], m["world_size"]
            batch = m.get("batch_per_rank", 0)
            label = f"{m['program']} {m['model']} {m['backend']} {dtype}"
        except KeyError as err:
            raise cli.BadInput(f"calibration run {path}: no attribute {err}")
        except (OSError, ValueError) as err:
            raise cli.BadInput(f"calibration run {path}: {err}")
        if dtype != cluster["dtype"]:
            raise cli.BadInput(f"calibration run {path}: a {dtype} run cannot calibrate the {cluster['dtype']} "
                               "rates of this cluster description (its field 'dtype')")
        timed = s[s["warmup"] == 0]
        e = e[np.isin(e["step"], timed["step"])]
        slow = oversubscription(cluster, rpn, world)  # the measured times already suffered it
        d = (e["end"] - e["start"]) / slow
        ops = op_names[e["op"]]
        for row, op, dur in zip(e, ops, d):
            if op == "gemm":
                key = (int(row["m"]), int(row["n"]), int(row["k"]), int(row["batch"]))
                self.gemm_samples.setdefault(key, []).append(dur)
            elif op == "elementwise":
                self.elem_samples.setdefault(int(row["bytes"]), []).append(dur)
            elif op in self.bytes_time:
                self.bytes_time[op][0] += row["bytes"]
                self.bytes_time[op][1] += dur
        self.overhead += float(timed["overhead"].sum()) / slow
        self.ops += float(np.isin(ops, COMPUTE_OPS).sum())
        self.runs.append(os.path.basename(path))
        spread = step_spread(timed["rank"], timed["compute"])
        self.quality.append(quality_row(f"calibration run {os.path.basename(path)}", "step-to-step compute spread",
                                        spread, DISTURBED_COMPUTE_SPREAD, len(timed)))
        self.run_means.setdefault((label, world, batch), []).append(float(np.mean(timed["compute"])))
        self._fit()
        self.cluster["calibration"].append(f"run {os.path.basename(path)} ({label})")

    def _fit(self):
        # A measured shape or size costs its mean time: the step is the sum of its operations,
        # so a calibration run is reproduced.
        self.gemm = {k: float(np.mean(v)) for k, v in self.gemm_samples.items()}
        self.elem = {k: float(np.mean(v)) for k, v in self.elem_samples.items()}
        # Shape classes: plain and batched GEMMs, rate against FLOPs per call.
        self.gemm_class = {}
        for (m, n, k, b), t in sorted(self.gemm.items(), key=lambda kv: 2.0 * np.prod(kv[0])):
            self.gemm_class.setdefault(b > 1, []).append((2.0 * m * n * k * b, 2.0 * m * n * k * b / t))
        self.elem_curve = sorted((b, b / t) for b, t in self.elem.items() if t > 0)
        if self.ops:
            self.launch = self.overhead / self.ops

    @property
    def spread(self):
        """The relative spread (one standard deviation) of a compute operation's cost as the
        calibration measured it: the runs' step-to-step spread (the largest run's), and where
        two runs or more of one configuration were given, the spread between their means, in
        quadrature. 0 without calibration runs (a description as written: nothing measured)."""
        steps = max((q["value"] for q in self.quality), default=0.0)
        runs = max((float(np.std(v, ddof=1) / np.mean(v)) for v in self.run_means.values() if len(v) > 1),
                   default=0.0)
        return math.hypot(steps, runs)

    def bandwidth(self, op):
        nbytes, t = self.bytes_time.get(op, (0.0, 0.0))
        return nbytes / t if t > 0 else self.nominal_bw / self.memory_scale

    def gemm_time(self, m, n, k, batch, flops):
        t = self.gemm.get((m, n, k, batch))
        if t is None:
            cls = self.gemm_class.get(batch > 1) or self.gemm_class.get(batch <= 1)
            if cls:
                rate = _interp_log(flops, [x for x, _ in cls], [r for _, r in cls])
            else:
                rate = self.nominal_rate / self.gemm_scale  # the target GPU's nominal rate, below
            t = flops / rate
        return t / self.gemm_scale

    def elementwise_time(self, nbytes):
        t = self.elem.get(nbytes)
        if t is None:
            bw = (_interp_log(nbytes, [b for b, _ in self.elem_curve], [r for _, r in self.elem_curve])
                  if self.elem_curve else self.nominal_bw / self.memory_scale)
            t = nbytes / bw
        return t / self.memory_scale

    def time(self, op, nbytes, flops, shape):
        """Seconds of one compute operation (by name) on one uncontended GPU (launch gap included)."""
        if op == "gemm":
            t = self.gemm_time(*shape, flops)
        elif op == "elementwise":
            t = self.elementwise_time(nbytes)
        else:
            t = nbytes / self.bandwidth(op) / self.memory_scale
        return t + self.launch

    def describe(self):
        if not self.runs:
            return (f"nominal: GEMM {self.nominal_rate / 1e12:.1f} TFLOPS, memory "
                    f"{self.nominal_bw / 1e9:.0f} GB/s, launch {self.launch * 1e6:.1f} us")
        scale = ""
        if self.gemm_scale != 1 or self.memory_scale != 1:
            scale = f", scaled x{self.gemm_scale:.3f} (GEMM) x{self.memory_scale:.3f} (memory)"
        return (f"{len(self.gemm)} GEMM shapes, {len(self.elem)} elementwise sizes from {', '.join(self.runs)}; "
                f"copy {self.bandwidth('copy') / 1e9:.0f} GB/s, Adam {self.bandwidth('optimizer') / 1e9:.0f} "
                f"GB/s, launch {self.launch * 1e6:.2f} us/op{scale}")


# ---------------------------------------------------------------- collectives

def ring_steps(op, n):
    """Latency hops of NCCL's ring: all-reduce 2(n−1), all-gather and reduce-scatter n−1. The
    bytes a rank sends come from the files (the programs apply nccl-tests' bus factors)."""
    if n <= 1:
        return 0
    return 2 * (n - 1) if op == "all-reduce" else n - 1


def nic_share(cluster, per_node):
    """The NICs a group with `per_node` ranks on each node has, while the node's other ranks
    run their own groups of the same axis at the same time (data parallelism's groups all
    reduce at once): the node's NICs in proportion to its ranks. One NIC per GPU (rail
    optimised, the GPU clusters): per_node NICs. One NIC for the node (the emulated cluster):
    a hybrid replicate group of one rank per node gets 1 / ranks per node of it."""
    gpn = cluster["gpus_per_node"]
    return cluster["inter"]["nics_per_node"] * min(per_node, gpn) / gpn


def bus_bandwidth(cluster, nodes, per_node):
    """Bytes/s of a ring's busbw. One node: the NVLink/NVSwitch ring. Across nodes NCCL runs
    one channel per NIC (rail-aligned rings, each crossing the node boundary through its own
    NIC), so the node's share of the ring is carried by the group's NICs (nic_share):
    min(intra busbw, NICs × NIC busbw)."""
    intra, inter = cluster["intra"], cluster["inter"]
    if nodes <= 1:
        return intra["bandwidth_gbps"] * 1e9
    return min(intra["bandwidth_gbps"], nic_share(cluster, per_node) * inter["nic_bandwidth_gbps"]) * 1e9


def collective_time(cluster, op, size, n, nodes, sent, blocking=False, z=0.0):
    """Seconds of one collective of `size` bytes over n ranks on `nodes` nodes, of which each
    rank sends `sent` bytes (the schedule's sent_bytes: size × nccl-tests' bus factor): NCCL's
    alpha-beta model (ring; for all-reduce across nodes also the tree, the cheaper taken, as
    NCCL's tuner picks); `collectives = "ring"` clusters (MPI) use the plain ring, or the
    operation's own fit for its group shape and mode (blocking: one blocking call, as the CPU
    backend makes of a collective waited for at once; else non-blocking). z: that many of the
    fit's own relative spreads (fit_info's "spread") as a factor, (1 + spread)^z: the range."""
    if n <= 1:
        return 0.0
    intra, inter = cluster["intra"], cluster["inter"]
    per_node = max(1, n // max(1, nodes))
    steps = ring_steps(op, n)
    cross = 0 if nodes <= 1 else (2 if op == "all-reduce" else 1) * (nodes - 1)
    lat = (steps - cross) * intra["latency_us"] + cross * inter["latency_us"]
    bw = bus_bandwidth(cluster, nodes, per_node)
    fitted = nearest_fit((intra if nodes <= 1 else inter).get("ops", {}).get(op), n, nodes,
                         "blocking" if blocking else "nonblocking")
    if cluster["collectives"] == "ring" and fitted:  # this operation's own fit (calibrate_collectives)
        lat_op, busbw_op, info = fitted  # across nodes: per NIC
        bw = busbw_op if nodes <= 1 else min(intra["bandwidth_gbps"], nic_share(cluster, per_node) * busbw_op)
        t = steps * lat_op * 1e-6 + sent / (bw * 1e9)
        if "residual" in info and info["shape"] == (n, nodes, "blocking" if blocking else "nonblocking") and sent > 0:
            # its own shape and mode: the measured sizes' miss of the fit, interpolated in log
            # bytes between them (the nearest's beyond them: named by extrapolations())
            t *= math.exp(float(np.interp(math.log(sent), *info["residual"])))
        return t * (1 + info["spread"]) ** z
    z = (1 + (intra if nodes <= 1 else inter).get("info", {}).get("spread", 0.0)) ** z  # a tier's own fit, if any
    if op == "all-reduce" and nodes <= 1 and "allreduce_bandwidth_gbps" in intra:
        bw = max(bw, intra["allreduce_bandwidth_gbps"] * 1e9)  # NVLS (NVSwitch reductions) on one node
    if cluster["collectives"] == "ring":
        return (lat * 1e-6 + sent / bw) * z
    lat += NCCL_RING_BASE_US
    if op == "all-reduce" and nodes > 1:
        lat *= NCCL_RING_ALLREDUCE_PLATEAU
    ring = lat * 1e-6 + sent / bw
    if op != "all-reduce" or nodes <= 1:
        return ring * z  # NCCL runs all-gather and reduce-scatter as rings
    tree_lat = 2 * ((per_node - 1) * NCCL_TREE_HOP_US["intra"] + math.log2(nodes) * NCCL_TREE_HOP_US["inter"])
    tree_bw = min(0.9 * bw, NCCL_TREE_MAX_BUSBW * 1e9) if nodes > 2 else 0.9 * bw
    tree = tree_lat * 1e-6 + 2 * size / tree_bw
    return min(ring, tree) * z


def nearest_fit(fits, n, nodes, mode):
    """Of an operation's fits by group shape and mode {(ranks, nodes, mode): fit}, the one of
    this mode (blocking, nonblocking: MPI runs them with different algorithms; the other mode
    where only it was measured) and shape, else of the nearest shape (in log2 of ranks plus
    log2 of nodes; the larger group on a tie): an MPI library's algorithm moves a share of the
    bytes across the node boundary that depends on the shape (recursive doubling, for one: 4
    ranks on 2 nodes send 1.33x a ring's bytes over a node's link, 8 on 4 1.71x), so a fit
    serves its own shape best."""
    if not fits:
        return None
    return fits[min(fits, key=lambda k: (k[2] != mode, abs(math.log2(n / k[0])) + abs(math.log2(nodes / k[1])),
                                         -k[0]))]


def fit_info(cluster, op, n, nodes, blocking):
    """What collective_time costs a collective by, as calibrated: the fit's spread, the sizes
    (bytes, nccl-tests' size) it was measured at, its group shape and mode and its file; None
    where nothing calibrated it (a description's tier as written)."""
    tier = cluster["intra"] if nodes <= 1 else cluster["inter"]
    fitted = nearest_fit(tier.get("ops", {}).get(op), n, nodes, "blocking" if blocking else "nonblocking")
    if cluster["collectives"] == "ring" and fitted:
        return fitted[2]
    return tier.get("info")


# A size within this factor of the calibrated range is not named: the fit is linear in bytes,
# and a collective_perf grid (-f 4) already steps 4x between its sizes; a unit's 4 MiB plus a
# few bytes of padding is the 4 MiB measured.
EXTRAPOLATION_TOLERANCE = 1.1


def blocking_requests(ops):
    """The requests of the collectives waited for right after their issue: the CPU backend
    makes each one blocking call (Backend::set_blocking_when_waited), which MPI runs with
    other algorithms than its non-blocking ones (collective_time's `blocking`)."""
    return {op[5] for op, nxt in zip(ops, ops[1:]) if op[0] in COLLECTIVES and nxt[0] == "wait" and nxt[5] == op[5]}


def extrapolations(sched, cluster):
    """The collectives this schedule issues beyond what calibrated their cost: sizes outside
    the fit's measured range (factor: size issued / largest calibrated, or smallest
    calibrated / size), or a fit of another group shape or mode (nearest_fit's stand-in).
    [{op, ranks, nodes, mode, issued (min, max), calibrated (min, max), factor, shape, source}],
    the largest factor first; one entry per operation and group."""
    tiers, out = group_tiers(sched, cluster), {}
    stages = [s["ops"] for s in sched["stages"]] if sched.get("pp_size", 1) > 1 else [sched["ops"]]
    for rows in stages:
        ops = list(schedule_ops(sched, rows))
        blocking = blocking_requests(ops)
        for op, _, _, nbytes, _, req, _, axis, _, _ in ops:
            if op not in COLLECTIVES:
                continue
            n, nodes = tiers[axis]
            info = fit_info(cluster, op, n, nodes, req in blocking) if n > 1 else None
            if info is None:
                continue
            key = (op, n, nodes, req in blocking)
            lo, hi = out.get(key, {}).get("issued", (nbytes, nbytes))
            out[key] = {"op": op, "ranks": n, "nodes": nodes, "mode": "blocking" if req in blocking else "nonblocking",
                        "issued": (min(lo, nbytes), max(hi, nbytes)), "calibrated": info["sizes"],
                        "shape": info["shape"], "source": info["source"]}
    named = []
    for e in out.values():
        (lo, hi), (clo, chi) = e["issued"], e["calibrated"]
        e["factor"] = max(hi / chi, clo / lo if lo > 0 else 1.0, 1.0)
        other_shape = e["shape"][:2] != (e["ranks"], e["nodes"]) or e["shape"][2] != e["mode"]
        if e["factor"] > EXTRAPOLATION_TOLERANCE or other_shape:
            named.append(e)
    return sorted(named, key=lambda e: -e["factor"])


def describe_extrapolation(e):
    """One line of an extrapolations() entry, as the projection prints and records it."""
    def size(b):
        return f"{b / 2**20:.3g} MiB" if b >= 2**20 else f"{b / 2**10:.3g} KiB" if b >= 2**10 else f"{b} B"
    (lo, hi), (clo, chi) = e["issued"], e["calibrated"]
    where = f"{e['op']} on {e['ranks']} ranks/{e['nodes']} node(s) {e['mode']}"
    parts = []
    if hi > chi * EXTRAPOLATION_TOLERANCE:
        parts.append(f"{size(hi)} issued = {hi / chi:.2f}x the largest calibrated ({size(chi)})")
    if lo * EXTRAPOLATION_TOLERANCE < clo:
        parts.append(f"{size(lo)} issued = 1/{clo / lo:.2f} of the smallest calibrated ({size(clo)})")
    n, nodes, mode = e["shape"]
    if (n, nodes, mode) != (e["ranks"], e["nodes"], e["mode"]):
        parts.append(f"costed from the fit of {n} ranks/{nodes} node(s) {mode}")
    return f"{where}: {'; '.join(parts)} [{e['source']}]"


# ---------------------------------------------------------------- calibration quality

# A calibration is disturbed when its spread exceeds what calibrations without noise beside
# them show on the emulated cluster's machine (2 cores; docs/projection.md, "What the
# calibration's spread says"): DDP on 6 ranks, 5 steps, compute step-to-step 0.16 and 0.21
# (load 5-7 from other work), with with-noise.sh -n 2 beside it 0.33 and 0.35. A collective's
# iteration-to-iteration jitter (p90 over p50, 3 iterations, 2 ranks, 256 KiB-8 MiB) did not
# tell noise apart (quiet 0.00-0.20, with noise 0.00-0.12; tests/analysis_tests.sh's recorded
# 2-rank calibration, quiet, 0.36): its limit, p90 2.3x p50, names only a gross disturbance.
DISTURBED_COMPUTE_SPREAD = 0.27
DISTURBED_COLLECTIVE_SPREAD = 1.0
Z90 = 1.2816  # the 90th percentile of a standard normal: (p90 − p50) / p50 as a sigma


def step_spread(ranks, values):
    """The step-to-step spread of a run's per-rank figures (its timed steps' compute): each
    step over its rank's mean, the coefficient of variation pooled over ranks (plain, not
    robust: the compute model costs an operation by its mean, so a slow step moves the fit
    as much as it moves this)."""
    ranks, values = np.asarray(ranks), np.asarray(values, float)
    rel = np.concatenate([values[ranks == r] / values[ranks == r].mean() - 1 for r in np.unique(ranks)
                          if len(values[ranks == r]) > 1 and values[ranks == r].mean() > 0] or [np.zeros(0)])
    return float(np.sqrt(rel @ rel / max(1, len(rel) - len(np.unique(ranks))))) if len(rel) else 0.0


def quality_row(source, figure, value, limit, points):
    return {"source": source, "figure": figure, "value": value, "limit": limit, "points": points,
            "disturbed": value > limit}


def calibration_quality(cluster):
    """The calibration's figures of spread, each with its limit: the compute runs' and each
    collective fit's (rows of quality_row; "disturbed" where above the limit)."""
    return getattr(cluster["compute_model"], "quality", []) + cluster.get("calibration_quality", [])


def describe_quality(q):
    return (f"{q['source']}: {q['figure']} {q['value']:.1%} over {q['points']} points"
            + (f", above the {q['limit']:.0%} of a quiet calibration: disturbed" if q["disturbed"] else ""))


def group_tiers(sched, cluster):
    """{axis code: (ranks, nodes)} of rank 0's group along each mesh axis, as the schedule
    lists the group's ranks (the programs' rank order; nodes of `gpus_per_node` consecutive
    ranks)."""
    per = cluster["gpus_per_node"]
    out = {}
    for code, name in enumerate(sched["axis_names"]):
        ranks = sched["axes"][name]["ranks"]
        out[code] = (len(ranks), len({r // per for r in ranks}))
    return out


def calibrate_collectives(cluster, path):
    """Fits t = steps·α + factor·S/B (ring) to a collective_perf result's out-of-place
    all-reduce, all-gather and reduce-scatter; sets the tier it ran on. Where an operation ran
    at two sizes or more it also gets a fit of its own for this group shape (ranks, nodes; the
    tier's "ops"), which ring clusters use for it (nearest_fit: results of several shapes build
    a table): MPI libraries run each with an algorithm of its own (Open MPI's non-blocking
    all-gather by recursive doubling), so one busbw for all misses each by its ratio to the
    others (on the emulated 4-node cluster at 100 Mbit/s
    nonblocking all-reduce by a ring 0.011 GB/s, all-gather 0.006, reduce-scatter 0.004)."""
    try:
        res = shardbench_h5.read_collective(path)
    except cli.BadInput as err:
        raise cli.BadInput(f"--calibrate-collectives {err}")
    # the ranks of one operation: the world, or one of the groups that ran at once (--groups)
    n, nodes = res.facts["group_size"], res.facts["group_nodes"]
    together = res.facts["groups"] != "world"
    mode = res.facts["collectives"] if res.facts["collectives"] != "unrecorded" else "blocking"  # older: blocking
    rows, times, ops, sizes, jitter = [], [], [], [], []
    for (op, in_place, size, _, _, _), point in sorted(res.points.items()):
        if in_place or op not in ("all-reduce", "all-gather", "reduce-scatter"):
            continue
        for row in point.table:  # each of its results rows (roots, cycles)
            if row["algbw"] <= 0:
                continue
            # the bytes a rank sends: the size × the bus factor the file's busbw/algbw carries
            rows.append([ring_steps(op, n), size * row["busbw"] / row["algbw"]])
            times.append(row["time"])
            ops.append(op)
            sizes.append(size)
            # iteration to iteration: p90 over p50 of the slowest rank's times, as a normal's sigma
            jitter.append(max(0.0, row["p90"] / row["p50"] - 1) / Z90 if row["p50"] > 0 else 0.0)
    if len(rows) < 2:
        raise cli.BadInput(f"--calibrate-collectives {path}: needs all-reduce, all-gather or reduce-scatter sizes")

    def fit(x, y):  # (latency µs per step, busbw GB/s)
        coef, *_ = np.linalg.lstsq(x, y, rcond=None)
        alpha, inv_bw = coef
        if alpha < 0 or inv_bw <= 0:  # latency cannot be negative: refit bandwidth alone
            alpha, inv_bw = 0.0, float((x[:, 1] @ y) / (x[:, 1] @ x[:, 1]))
        return alpha * 1e6, 1 / inv_bw / 1e9

    x, y, ops = np.array(rows, float), np.array(times), np.array(ops)
    sizes, jitter = np.array(sizes), np.array(jitter)
    base = os.path.basename(path)

    def quality(mask, what):  # the fit's spread over its points, and the sizes it saw (fit_info)
        (l, b), xs, ys = fit(x[mask], y[mask]), x[mask], y[mask]
        # The fit's miss: the share of its points' time it does not reproduce (weighted by time:
        # a step's collectives cost what the large ones cost, and a 4 KiB one the fit puts near
        # 0 s moves it little), with the iteration-to-iteration jitter at its points: the
        # range's spread. The jitter alone says whether the measurement was disturbed; the
        # miss is the model's, there when quiet too.
        miss = float(np.abs(ys - (xs[:, 0] * l * 1e-6 + xs[:, 1] / (b * 1e9))).sum() / ys.sum()) if len(ys) > 2 else 0.0
        wobble = float(np.median(jitter[mask]))
        return {"spread": math.hypot(miss, wobble), "jitter": wobble, "sizes": (int(sizes[mask].min()),
                int(sizes[mask].max())), "shape": (n, nodes, mode), "source": f"{base} {what}", "points": int(mask.sum())}

    lat, bw = fit(x, y)
    per_op = {op: fit(x[ops == op], y[ops == op]) for op in sorted(set(ops)) if len(set(x[ops == op][:, 1])) >= 2}
    tier = "intra" if nodes == 1 else "inter"
    fits = cluster[tier].get("ops", {})  # earlier calibrations of other group shapes stay
    info = quality(np.ones(len(y), bool), "(all operations)")
    if nodes == 1:
        cluster["intra"] = {"bandwidth_gbps": bw, "latency_us": lat, "ops": fits, "info": info}
        nics = 1
    else:  # the fitted busbw is the node's: spread it over the NICs the ranks of a node used
        per_node = max(1, n // nodes)
        # Measured beside the node's other groups (--groups), it is the group's share already:
        # over the share collective_time gives such a group (nic_share), so that it gets back
        # the measured figure, with whatever TCP flows sharing a link lose.
        nics = nic_share(cluster, per_node) if together else min(per_node, cluster["inter"]["nics_per_node"])
        cluster["inter"] = {"nic_bandwidth_gbps": bw / nics, "nics_per_node": cluster["inter"]["nics_per_node"],
                            "latency_us": lat, "ops": fits, "info": info}
    for op, (l, b) in per_op.items():
        q = quality(ops == op, op)
        q["residual"] = residual(x[ops == op], y[ops == op], sizes[ops == op], l, b)
        fits.setdefault(op, {})[(n, nodes, mode)] = (l, b / nics, q)
        cluster["calibration_quality"].append(quality_row(f"--calibrate-collectives {base}",
                                                          f"{op} iteration-to-iteration spread", q["jitter"],
                                                          DISTURBED_COLLECTIVE_SPREAD, q["points"]))
    each = "".join(f"; {op} {b:.3g} GB/s, {l:.1f} us" for op, (l, b) in per_op.items())
    beside = f", {res.facts['world_size'] // n} {res.facts['groups']} groups at once" if together else ""
    cluster["calibration"].append(f"collectives {os.path.basename(path)} ({n} ranks, {nodes} node(s), {mode}{beside}): {tier} "
                                  f"{bw:.3g} GB/s, {lat:.1f} us{each}")


def residual(x, y, sizes, lat_us, busbw):
    """What the fit misses at each measured size, for collective_time to take out: (log bytes
    a rank sends, log of measured over fitted time), one per size (the median of its rows),
    sorted by size. One line through every size misses where the time is not linear in the
    bytes: on an emulated 100 Mbit/s path the 8 MiB all-gather took 1.6x the link's time (TCP
    above 4 MiB a message), which a least-squares line through it put on every size, the
    2 MiB ones 1.5x what they measured."""
    out = []
    for size in sorted(set(sizes.tolist())):
        sel = sizes == size
        model = x[sel][:, 0] * lat_us * 1e-6 + x[sel][:, 1] / (busbw * 1e9)
        out.append((math.log(float(np.median(x[sel][:, 1]))), math.log(float(np.median(y[sel] / model)))))
    return [a for a, _ in out], [b for _, b in out]


def add_calibration_arguments(ap):
    """The calibration flags project.py and advise.py share (calibrated() applies them)."""
    ap.add_argument("--calibrate-run", action="append", default=[], metavar="RESULT.h5",
                    help="measured training run (HDF5) to calibrate the compute model from, in place of the "
                         "description's calibration_runs; repeat for several (default: the description's runs)")
    ap.add_argument("--calibrate-collectives", action="append", default=[], metavar="RESULT.h5",
                    help="collective_perf result (HDF5) whose ring fit replaces the tier it ran on; repeatable "
                         "(default: the description's tiers)")
    ap.add_argument("--require-calibration", action="store_true",
                    help="refuse to project without calibration data (runs or collectives), or from a "
                         "calibration whose spread says it was disturbed (docs/projection.md)")


def calibrated(a):
    """The description of a.cluster with the calibration flags of add_calibration_arguments applied."""
    cluster = calibrated_from(a.cluster, tuple(a.calibrate_run), tuple(a.calibrate_collectives))
    if a.require_calibration and not cluster["calibration"]:
        raise cli.BadInput("no calibration data: give --calibrate-run and/or --calibrate-collectives, or a "
                           "description with calibration_runs")
    bad = [q for q in calibration_quality(cluster) if q["disturbed"]]
    if a.require_calibration and bad:
        more = f" (and {len(bad) - 1} more)" if len(bad) > 1 else ""
        raise cli.BadInput(f"{describe_quality(bad[0])}{more}: --require-calibration refuses it; measure it again "
                           "on a quiet machine")
    return cluster


def calibrated_from(path, runs=(), collectives=()):
    """A description calibrated by measured runs (its own calibration_runs where none are given)
    and collective_perf results: what a worker process rebuilds from the same arguments."""
    cluster = load_cluster(path, calibrate=not runs)
    for p in runs:
        cluster["compute_model"].add_run(p, cluster)
    for p in collectives:
        calibrate_collectives(cluster, p)
    return cluster


# ---------------------------------------------------------------- replay

def p2p_time(cluster, nbytes, same_node):
    """Seconds of one point-to-point transfer of `nbytes` between two ranks: on one node over
    NVLink at the ring's per-GPU bandwidth, across nodes through the sender's own NIC (one NIC
    per GPU, rail-optimised); the tier's latency (and NCCL's fixed cost on NCCL clusters)."""
    tier = cluster["intra"] if same_node else cluster["inter"]
    bw = tier["bandwidth_gbps"] if same_node else min(cluster["intra"]["bandwidth_gbps"], tier["nic_bandwidth_gbps"])
    lat = tier["latency_us"] + (NCCL_RING_BASE_US if cluster["collectives"] != "ring" else 0.0)
    return lat * 1e-6 + nbytes / (bw * 1e9)


class _Pipe:
    """The point-to-point messages between pipeline stages. The k-th send from rank a to rank b
    pairs with b's k-th receive from a (the programs post them in the same order on both
    sides, as NCCL's send/receive requires); the transfer starts once both are posted."""

    def __init__(self, cluster):
        self.cluster, self.posted = cluster, {}  # (src, dst) -> {"send": [(t, bytes)], "recv": [...]}

    def post(self, kind, src, dst, t, nbytes):
        sides = self.posted.setdefault((src, dst), {"send": [], "recv": []})
        sides[kind].append((t, nbytes))
        return (src, dst, len(sides[kind]) - 1)

    def transfer(self, key):
        """(start, end) of message `key`, or None while its other side is not posted."""
        src, dst, k = key
        sides = self.posted[(src, dst)]
        if k >= len(sides["send"]) or k >= len(sides["recv"]):
            return None
        (ts, nbytes), (tr, _) = sides["send"][k], sides["recv"][k]
        per = self.cluster["gpus_per_node"]
        start = max(ts, tr)
        return start, start + p2p_time(self.cluster, nbytes, src // per == dst // per)


def schedule_ops(sched, rows=None, lanes=False):
    """The schedule's rows (default: its "ops", rank 0's; a stage's "ops" under --pp) as tuples
    (op name, phase, unit, bytes, flops, request, (m, n, k, batch), axis, sent bytes, peer); the
    names are the schedule's own op_names; axis is the code of a collective's mesh axis (-1
    for other ops), peer the other rank of a send or receive (-1 for other ops). lanes: two
    more fields, the op's trace lane (0 compute, 1.. communication, 100 host, 101/102 copies)
    and the request it is stream-ordered after (-1: none); 0 and -1 where the schedule
    predates those columns."""
    cols, names = sched["columns"], sched["op_names"]
    idx = {c: cols.index(c) for c in cols}
    lane, after = idx.get("lane"), idx.get("after")
    for row in sched["ops"] if rows is None else rows:
        shape = (row[idx["m"]], row[idx["n"]], row[idx["k"]], row[idx["batch"]])
        op = (names[row[idx["op"]]], row[idx["phase"]], row[idx["unit"]], row[idx["bytes"]], row[idx["flops"]],
              row[idx["request"]], shape, row[idx["axis"]], row[idx["sent_bytes"]], row[idx["peer"]])
        if lanes:
            op += (row[lane] if lane is not None else 0, row[after] if after is not None else -1)
        yield op


def simulate(sched, cluster, fsdp1_gathers=None, z=0.0):
    """Replays one step's schedule on a compute lane and two communication lanes (all-gathers;
    reduce-scatters and all-reduces), the lanes sharing the wire they cross (NVLink within a
    node, the NICs across nodes) first come, first served.

    fsdp1_gathers (default: for fsdp_perf schedules): all-gathers as PyTorch FSDP1 issues
    them. Its unshard stream does not wait for the compute issued before it ("implicit
    forward prefetching", PyTorch's FSDP notes), and the CPU runs ahead until the rate
    limiter holds it at two gathered, not yet freed units: all-gather k starts once the unit
    of all-gather k−2 is freed, i.e. when compute reaches the wait for all-gather k−1. The
    bf16 cast of the shard right before an all-gather runs with it, off the compute lane.

    Two effects slow compute beyond its one-GPU cost (docs/projection.md, "Why"): the step
    runs at the slowest of the world's GPUs (straggler_factor), and a compute kernel that
    shares the GPU with a collective's kernels runs slower by [compute] overlap_slowdown.
    A collective starts no earlier than the compute issued before it (stream order; FSDP1's
    gathers at an earlier wait), so when a compute operation is placed, every collective that
    can overlap it has been launched: it is slowed by exactly those, in one pass. Only a
    pipeline's transfers start when the other stage posts its side, later in the replay, so
    under --pp the replay is repeated with the previous pass's transfer intervals until the
    step time moves less than REPLAY_TOLERANCE between passes (at most REPLAY_MAX_PASSES;
    sim["passes"] says how many ran, sim["converged"] whether it settled).

    Under --pp every stage's first rank is replayed from its own list (the schedule's
    "stages"), side by side: a receive's wait ends when the message, posted on both sides,
    has crossed the tier between the two ranks (p2p_time); the step ends with the slowest
    stage, and idle_share is 1 − mean compute / step time, as the programs measure it.

    z: every compute operation and collective costed (1 + its calibration's own relative
    spread)^z slower (ComputeModel.spread, fit_info's; negative: faster), all at once, as a
    disturbance of the moment slows a whole run: project.py's range is z = −1 and +1."""
    if fsdp1_gathers is None:
        fsdp1_gathers = sched.get("program") == "fsdp_perf"
    slowdown = cluster["compute"].get("overlap_slowdown", 0.0)
    transfers, last = {}, None
    stage_lists = _stage_lists(sched, cluster, z)
    pipelined = len(stage_lists) > 1
    for passes in range(1, REPLAY_MAX_PASSES + 1):
        sim = _replay(sched, stage_lists, cluster, fsdp1_gathers, transfers, slowdown, z)
        converged = not slowdown or not pipelined or (last is not None and
                                                      abs(sim["time"] - last) < REPLAY_TOLERANCE * sim["time"])
        if converged:
            break
        last = sim["time"]
        transfers = {rank: [(e[4], e[5]) for e in events if e[3] in TRANSFER_LANES]
                     for rank, events in sim["stages"]}
    sim["passes"], sim["converged"] = passes, converged
    return sim


def _merged(intervals):
    out = []
    for a, b in sorted(intervals):
        if b <= a:
            continue
        if out and a <= out[-1][1]:
            out[-1][1] = max(out[-1][1], b)
        else:
            out.append([a, b])
    return out


def _stretched(t, work, busy, busy_ends, slowdown):
    """Seconds a compute operation of `work` uncontended seconds takes from t when it runs
    at 1/(1 + slowdown) of its speed inside the busy (collective) intervals (busy_ends: their
    ends, for the search)."""
    end, i = t, bisect.bisect_right(busy_ends, t)
    while work > 1e-15:
        if i >= len(busy) or end < busy[i][0]:  # free until the next busy interval
            free = (busy[i][0] - end) if i < len(busy) else math.inf
            step = min(work, free)
            end, work = end + step, work - step
            continue
        span = busy[i][1] - end  # inside busy[i]
        step = min(work, span / (1 + slowdown))
        end, work = end + step * (1 + slowdown), work - step
        i += 1
    return end - t


class _StageReplay:
    """One rank's replay of its schedule (for a pipeline, the first rank of one stage): a
    compute lane, the collective lanes of the CUDA backend's streams, and the sends and
    receives of its pipeline neighbours. `advance` runs until the rank waits for a message
    whose other side is not posted yet, so that the stages can be replayed side by side."""

    LANES = REPLAY_LANES  # (module level, for the tools that read the replay's timeline)
    # CPU offload: the host's update (one CPU thread's worth per GPU), and the host link's two
    # directions, each serialising its copies as a copy engine does.
    HOST_LANES = {"host": HOST_LANE, "h2d": UPLOAD_LANE, "d2h": DOWNLOAD_LANE}

    def __init__(self, sched, stage, cluster, fsdp1_gathers, transfers, slowdown, z=0.0):
        self.cluster, self.z = cluster, z
        self.rank, self.ops, self.cost = stage
        self.i = 0
        self.tiers = group_tiers(sched, cluster)
        self.tensor = sched["axis_names"].index("tp")
        self.pipeline = sched["axis_names"].index("pp")
        self.fsdp1_gathers, self.slowdown = fsdp1_gathers, slowdown
        # The intervals that slow compute: this pass's collectives as they launch, and the
        # pipeline transfers of the previous pass (simulate); those ending before the
        # compute lane's time are dropped as it advances. Their union (merged) is rebuilt only
        # after a launch, not at every compute op: a union taken at an earlier time differs only
        # before the compute lane's time, which _stretched never reads, so the figures are the
        # same while a pipeline's replay stays linear in its ops (rebuilding it per op cost
        # ops x transfers: minutes a pass for 16 stages of 125 micro-batches).
        self.busy = sorted(transfers)
        self.merged, self.merged_ends = None, []  # None: rebuild before the next compute op
        self.busy_end = max((b for _, b in self.busy), default=-math.inf)
        self.busy_cut, self.launched = -math.inf, bool(self.busy)  # when busy was last cut; launched since
        self.t = self.compute = self.comm = self.exposed = self.waited_for_stages = 0.0
        self.forward = sched["phase_names"].index("forward")
        self.lanes, self.wire, self.done = {name: 0.0 for name in self.LANES}, {}, {}
        # CPU offload (lanes 100-102): their free times, the end of the last host update issued
        # (an upload issued after it starts after it), the copies launched ahead of their
        # place (an FSDP1 all-gather's upload, with it), and their seconds
        self.host = {name: 0.0 for name in self.HOST_LANES}
        self.last_update, self.early = 0.0, set()
        self.copy_time = self.update_time = 0.0
        self.copy_of = {op[5]: j for j, op in enumerate(self.ops) if op[10] in (UPLOAD_LANE, DOWNLOAD_LANE)}
        self.gathers, self.wait_at, self.deferred = [], {}, {}  # all-gather requests in issue order; limiter state
        # FSDP1: all-gather k starts at the wait for all-gather k-1 even when the program
        # issues it later (the CPU runs ahead): it is launched there, so that the compute
        # placed in between sees it (next_gather[i]: the first all-gather at or after op i).
        self.prelaunched = set()
        self.next_gather = [None] * (len(self.ops) + 1)
        for j in range(len(self.ops) - 1, -1, -1):
            self.next_gather[j] = j if self.ops[j][0] == "all-gather" else self.next_gather[j + 1]
        self.messages = {}  # request -> (send|recv, pipe key) of a posted point-to-point
        # Collectives waited for right after their issue: the CPU backend makes each one blocking
        # call (Backend::set_blocking_when_waited), which MPI runs with other algorithms than
        # its non-blocking ones (collective_time's `blocking`).
        self.blocking = blocking_requests(self.ops)
        self.pending_cast = 0.0
        # (op name, phase, unit, lane, start, end, bytes, flops, axis, ranks, sent bytes): the
        # replayed timeline
        self.events = []

    @property
    def finished(self):
        return self.i >= len(self.ops)

    @property
    def end(self):
        """The step's end on this rank: its compute lane, or a host update or copy after it."""
        return max(self.t, *self.host.values())

    def copy(self, j, t):
        """Places copy op j (lane 101 or 102) issued at t: after the compute issued before it,
        its `after` request, the copies before it in its direction, and (an upload) the host
        update issued before it; bytes over the host link."""
        op, phase, unit, nbytes, _, req, _, _, _, _, lane, after = self.ops[j]
        if after >= 0 and after not in self.done:
            self.early_copy(after, t)
        direction = "h2d" if lane == UPLOAD_LANE else "d2h"
        start = max(t, self.host[direction], self.done.get(after, 0.0) if after >= 0 else 0.0)
        if lane == UPLOAD_LANE:
            start = max(start, self.last_update)
        end = start + self.cost[j]
        self.host[direction] = end
        if req >= 0:
            self.done[req] = end
        self.copy_time += end - start
        self.events.append((op, phase, unit, lane, start, end, nbytes, 0.0, -1, 0, 0))

    def early_copy(self, req, t):
        """Launches the copy of request `req` from t before the replay reaches it (the upload an
        FSDP1 all-gather launched ahead of its place is stream-ordered after)."""
        j = self.copy_of.get(req)
        if j is not None and j not in self.early:
            self.early.add(j)
            self.copy(j, t)

    def host_step(self, i):
        """An op of CPU offload's lanes: a copy, the host update, or the host's wait for a copy."""
        op, phase, unit, nbytes, _, req, _, _, _, _, lane, after = self.ops[i]
        if lane in (UPLOAD_LANE, DOWNLOAD_LANE):
            if i not in self.early:
                self.copy(i, self.t)
        elif op == "optimizer":  # on the host, once the inputs its waits named are there
            start = self.host["host"]
            end = start + self.cost[i]
            self.host["host"] = self.last_update = end
            self.update_time += end - start
            self.events.append((op, phase, unit, lane, start, end, nbytes, 0.0, -1, 0, 0))
        elif op == "wait":
            ready = self.done.get(req, 0.0)
            since = max(self.host["host"], self.t)  # drawn from the compute issued before it
            if ready > since:
                self.events.append((op, phase, unit, lane, since, ready, 0, 0.0, -1, 0, 0))
            self.host["host"] = max(self.host["host"], ready)

    def launch(self, name, nbytes, req, earliest, extra, tag, axis, sent, after=-1):
        n, nodes = self.tiers[axis]
        lane = "tensor" if axis == self.tensor else "gather" if name == "all-gather" else "reduce"
        if after >= 0:  # stream-ordered after a copy (an upload of the shard it gathers)
            if after not in self.done:
                self.early_copy(after, earliest)
            earliest = max(earliest, self.done.get(after, 0.0))
        start = max(earliest, self.lanes[lane])
        d = collective_time(self.cluster, name, nbytes, n, nodes, sent, req in self.blocking, self.z)
        res = "net" if nodes > 1 else "nvlink"
        end = max(start + extra, self.wire.get(res, 0.0)) + d
        self.wire[res] = self.lanes[lane] = self.done[req] = end
        self.comm += d
        if self.slowdown:
            bisect.insort(self.busy, (end - d, end))
            self.merged, self.launched, self.busy_end = None, True, max(self.busy_end, end)
        self.events.append((tag[0], tag[1], tag[2], self.LANES[lane], end - d, end, nbytes, 0.0, axis, n, sent))

    def prelaunch(self, i, t):
        """Launches the first all-gather at or after op i from time t, before the replay
        reaches it (with the cast of its shard when a copy precedes it)."""
        j = self.next_gather[i] if i < len(self.ops) else None
        if j is not None and j not in self.prelaunched:
            name, phase, unit, nbytes, _, req, _, axis, sent, _, _, after = self.ops[j]
            cast = self.cost[j - 1] if j > 0 and self.ops[j - 1][0] == "copy" and self.ops[j - 1][10] == 0 else 0.0
            self.launch(name, nbytes, req, t, cast, (name, phase, unit), axis, sent, after)
            self.prelaunched.add(j)

    def advance(self, pipe):
        """Replays ops until the end or a wait on an unmatched message; True if it moved."""
        start = self.i
        while self.i < len(self.ops):
            op, phase, unit, nbytes, flops, req, shape, axis, sent, peer, _, _ = self.ops[self.i]
            if op == "wait" and req in self.messages and not self.complete(req, pipe):
                break
            self.step(self.i, pipe)
            self.i += 1
        return self.i > start

    def complete(self, req, pipe):
        """Sets a point-to-point request's end once both sides are posted."""
        if req in self.done:
            return True
        kind, key, tag = self.messages[req]
        span = pipe.transfer(key)
        if span is None:
            return False
        op, phase, unit, nbytes, sent, peer = tag
        lane = "activations" if phase == self.forward else "gradients"
        start = max(span[0], self.lanes[lane])  # one message at a time per direction, as a stream
        end = start + (span[1] - span[0])
        self.lanes[lane] = self.done[req] = end
        if kind == "send":
            self.comm += end - start
        self.events.append((op, phase, unit, self.LANES[lane], start, end, nbytes, 0.0, self.pipeline, 2, sent))
        return True

    def step(self, i, pipe):
        op, phase, unit, nbytes, flops, req, shape, axis, sent, peer, lane, after = self.ops[i]
        t, tag = self.t, (op, phase, unit)
        if lane >= HOST_LANE:
            self.host_step(i)
        elif op in COMPUTE_OPS:
            d = self.cost[i]
            if self.fsdp1_gathers and op == "copy" and i + 1 < len(self.ops) and self.ops[i + 1][0] == "all-gather":
                self.pending_cast = d  # the shard's cast runs on the gather stream
                return
            if self.launched or self.busy_end > self.busy_cut:  # an interval may still slow it
                if self.merged is None:
                    self.busy = [x for x in self.busy if x[1] > t]  # what ended before t slows nothing from here on
                    self.merged = _merged(self.busy)
                    self.merged_ends = [b for _, b in self.merged]
                d = _stretched(t, d, self.merged, self.merged_ends, self.slowdown)
                self.busy_cut, self.launched = t, False
            self.events.append((op, phase, unit, lane, t, t + d, nbytes, flops, -1, 0, 0))
            self.t += d
            self.compute += d
        elif op in ("send", "recv"):
            key = pipe.post(op, self.rank if op == "send" else peer, peer if op == "send" else self.rank, t, nbytes)
            self.messages[req] = (op, key, (op, phase, unit, nbytes, sent, peer))
        elif op in COLLECTIVES:
            if op == "all-gather" and self.fsdp1_gathers:
                k = len(self.gathers)
                self.gathers.append(req)
                if i in self.prelaunched:  # launched at the wait for the previous one
                    pass
                elif k < 2:
                    self.launch(op, nbytes, req, 0.0, self.pending_cast, tag, axis, sent, after)
                    if k == 0:  # the limiter lets two run from the start: launch the second now too
                        self.prelaunch(i + 1, 0.0)
                elif self.gathers[k - 1] in self.wait_at:
                    self.launch(op, nbytes, req, self.wait_at[self.gathers[k - 1]], self.pending_cast, tag, axis, sent,
                                after)
                else:  # the limiter holds it until compute reaches the wait for the previous one
                    self.deferred[self.gathers[k - 1]] = (op, nbytes, req, self.pending_cast, tag, axis, sent, after)
                self.pending_cast = 0.0
            else:
                self.launch(op, nbytes, req, t, 0.0, tag, axis, sent, after)
        elif op == "wait":
            self.wait_at.setdefault(req, t)
            if req in self.deferred:
                name, nb, rq, cast, held, ax, sn, af = self.deferred.pop(req)
                self.launch(name, nb, rq, t, cast, held, ax, sn, af)
            elif self.fsdp1_gathers and self.gathers and req == self.gathers[-1] and len(self.gathers) >= 2:
                self.prelaunch(i + 1, t)
            end = self.done.get(req, t)
            if end > t:
                self.events.append((op, phase, unit, lane, t, end, 0, 0.0, -1, 0, 0))
                if req in self.messages:
                    self.waited_for_stages += end - t
                else:
                    self.exposed += end - t
                self.t = end


def _stage_lists(sched, cluster, z=0.0):
    """[(rank, ops, cost)]: the schedule's one rank, or under --pp the first rank of every
    stage, with each compute op's seconds on one GPU of the world (0 for other ops)."""
    cm, w = cluster["compute_model"], sched["world_size"]
    slow = oversubscription(cluster, min(w, cluster["gpus_per_node"]), w) * straggler_factor(cluster, w)
    if z:  # the range's ends: z of the calibration's spreads, as factors (1 + spread)^z: never below 0
        slow *= (1 + cm.spread) ** z
    lists = ([(s["rank"], list(schedule_ops(sched, s["ops"], lanes=True))) for s in sched["stages"]]
             if sched.get("pp_size", 1) > 1 else [(0, list(schedule_ops(sched, lanes=True)))])
    # CPU offload: copies over the host link, the update at the host's rate ([host], per GPU)
    link, update = host_rates(cluster) if has_offload(sched) else (None, None)

    @functools.lru_cache(maxsize=None)  # a pipeline repeats each op once per micro-batch
    def cost(op, nbytes, flops, shape, lane):
        if lane in (UPLOAD_LANE, DOWNLOAD_LANE):
            return nbytes / link
        if lane == HOST_LANE:
            return nbytes / update if op == "optimizer" else 0.0
        return cm.time(op, nbytes, flops, shape) * slow if op in COMPUTE_OPS else 0.0
    return [(rank, ops, [cost(op, nbytes, flops, shape, lane) for op, _, _, nbytes, flops, _, shape, _, _, _, lane, _
                         in ops]) for rank, ops in lists]


def _replay(sched, stage_lists, cluster, fsdp1_gathers, transfers, slowdown, z=0.0):
    stages = [_StageReplay(sched, stage, cluster, fsdp1_gathers, transfers.get(stage[0], []), slowdown, z)
              for stage in stage_lists]
    pipe = _Pipe(cluster)
    while not all(s.finished for s in stages):
        if not any([s.advance(pipe) for s in stages]):
            blocked = [f"rank {s.rank} at op {s.i}" for s in stages if not s.finished]
            raise cli.BadInput("the pipeline's sends and receives do not pair up (" + ", ".join(blocked) + ")")
    # The step ends when the slowest stage does; the others idle until then (the bubble). CPU
    # offload: when its last host update or copy ends, if after the compute lane.
    time = max(s.end for s in stages)
    compute = sum(s.compute for s in stages) / len(stages)
    for s in stages:
        s.events.sort(key=lambda e: (e[3], e[4]))
    return {"time": time, "compute": compute, "communication": sum(s.comm for s in stages) / len(stages),
            "exposed": sum(s.exposed for s in stages) / len(stages), "idle_share": 1 - compute / time if time > 0 else 0.0,
            "events": stages[0].events, "stages": [(s.rank, s.events) for s in stages],
            "host_copy": sum(s.copy_time for s in stages) / len(stages),
            "host_update": sum(s.update_time for s in stages) / len(stages)}
