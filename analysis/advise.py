#!/usr/bin/python3
"""The layout advisor: every valid layout of a model on N GPUs at one global batch (the
data-parallel strategy, tensor and pipeline degrees, schedule and micro-batches, activation
checkpointing, CPU offload), ranked by projected throughput on a cluster description, with the
layouts excluded and why, and a figure of throughput against memory per GPU (Pareto front).

Example: T5-11B on 512 A100 80GB GPUs, 4096 sequences of 512 tokens per step:

    analysis/advise.py --cluster runs/clusters/a100-80gb.toml --model t5-11.3b --gpus 512 \\
        --global-batch 4096 --seq-len 512 --out results/advise-11b-512 --emit-matrix results/top.toml
    analysis/advise.py --cluster runs/clusters/a100-80gb.toml --model t5-11.3b --gpus 8 \\
        --global-batch 64 --seq-len 512 --explain fsdp-full-tp2:ckpt

Every memory verdict is the program's own plan (ddp_perf/fsdp_perf --plan, through their
--plan-batch mode where the programs have it, else one --plan --schedule-json per layout).
Each layout is ranked by a fast estimate from its plan's totals (GEMM FLOPs, bytes, the
collectives' bytes per mesh axis, stages, micro-batches) at the calibration's rates
(analysis/projection_model.py: the compute model, collective_time); the top --replay layouts
are then replayed in full (projection_model.simulate, as analysis/project.py) and both are
printed. docs/projection.md ("The layout advisor") gives the estimate's error against the
full replay, and the projection's own validation.

A layout is named LABEL[:mbM:SCHEDULE][:ckpt]: the strategy label as the programs print it
and slurm/sweep reads it (analysis/strategy_labels.py: fsdp-full-tp2-pp4-offload-optimizer),
the micro-batches and pipeline schedule of a -ppS label, and activation checkpointing.

Exit status: 0 done; 2 bad input (one line), nothing written.
"""
import concurrent.futures
import csv
import json
import math
import os
import random
import re
import subprocess
import sys
import tempfile
import threading
import time

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import cli  # noqa: E402
import model_shapes  # noqa: E402
import shardbench_h5  # noqa: E402
import strategy_labels  # noqa: E402
from projection_model import (ROOT, ProjectionError, add_calibration_arguments, calibrated,  # noqa: E402
                              calibrated_from, collective_time, group_tiers,
                              oversubscription, p2p_time, simulate, straggler_factor)


# The data-parallel strategies (strategy_labels' vocabulary), without a shard size: hybrid is
# enumerated at every group size.
BASES = ("ddp", "fsdp-optimizer-state", "fsdp-full", "fsdp-hybrid", "fsdp-grad-op", "fsdp-none")
# The offloads fsdp_perf serves (its --cpu-offload check; strategy_labels.check says the same)
OFFLOAD = {"params": ("fsdp-full", "fsdp-hybrid", "fsdp-grad-op"),
           "optimizer": ("fsdp-optimizer-state", "fsdp-grad-op", "fsdp-full", "fsdp-hybrid")}
SCHEDULES = ("1f1b", "gpipe")
MAX_MICRO_BATCHES = 1024  # the programs' --micro-batches range
DP_AXES = ("dp_shard", "dp_replicate")
VALIDATION = "docs/projection.md#validation"
NAME_RE = re.compile(r"^(?P<label>[a-z0-9-]+?)(?::mb(?P<mb>[1-9][0-9]*):(?P<sched>gpipe|1f1b))?(?P<ckpt>:ckpt)?$")


class AdviseError(Exception):
    pass


# ---------------------------------------------------------------- layouts

class Layout:
    __slots__ = ("label", "tp", "pp", "dp", "mb", "schedule", "ckpt", "batch", "offload")

    def __init__(self, label, tp, pp, dp, mb, schedule, ckpt, batch):
        self.label, self.tp, self.pp, self.dp, self.mb = label, tp, pp, dp, mb
        self.schedule, self.ckpt, self.batch = schedule, ckpt, batch
        self.offload = strategy_labels.cpu_offload(label)

    @property
    def name(self):
        return self.label + (f":mb{self.mb}:{self.schedule}" if self.pp > 1 else "") + (":ckpt" if self.ckpt else "")

    def flags(self, gpus_per_node, world):
        """The program and its layout flags (the label's, then micro-batches and checkpointing)."""
        program, flags, _ = strategy_labels.resolve(self.label, gpus_per_node, world)
        flags = flags + ["--batch", str(self.batch)]
        if self.pp > 1:
            flags += ["--micro-batches", str(self.mb), "--pp-schedule", self.schedule]
        if self.ckpt:
            flags.append("--activation-checkpointing")
        return program, flags

    @property
    def unverified(self):
        """Tensor and pipeline parallelism on the CUDA backend are compiled and tested on the
        CPU but have not run on a GPU yet (README, docs/gpu.md)."""
        return self.tp > 1 or self.pp > 1


def divisors(n):
    return [d for d in range(1, n + 1) if n % d == 0]


def micro_batch_choices(pp, per_rank):
    """A few micro-batch counts of a pipeline: S, 2S, 4S and every sequence its own
    micro-batch, those dividing the batch per data-parallel rank, at most the programs' 1024."""
    return sorted({m for m in (pp, 2 * pp, 4 * pp, per_rank) if per_rank % m == 0 and m <= MAX_MICRO_BATCHES})


def enumerate_layouts(world, global_batch, blocks, gpus_per_node, tp_ok=lambda tp: True, bases=BASES,
                      offload=True, checkpointing=(False, True), tps=None, pps=None):
    """(layouts, excluded): every layout of `world` GPUs by the rules of docs/projection.md
    ("The layout advisor"), and [(what, why)] for the tensor x pipeline degrees excluded
    before any plan runs (a degree the program refuses: tp_ok False; a global batch that does
    not divide over the data-parallel ranks; no micro-batch count dividing it)."""
    layouts, excluded = [], []
    for tp in divisors(world):
        if tp > gpus_per_node or (tps and tp not in tps):
            continue
        ok = tp_ok(tp)
        if ok is not True:
            excluded.append((f"tp{tp}", ok))
            continue
        for pp in divisors(world // tp):
            if pp > blocks or (pps and pp not in pps):
                continue
            dp = world // (tp * pp)
            if global_batch % dp:
                excluded.append((f"tp{tp} pp{pp}", f"global batch {global_batch} does not divide over {dp} "
                                 "data-parallel ranks"))
                continue
            per_rank = global_batch // dp
            mbs = micro_batch_choices(pp, per_rank) if pp > 1 else [1]
            if not mbs:
                excluded.append((f"tp{tp} pp{pp}", f"no micro-batch count of {pp}, {2 * pp}, {4 * pp}, {per_rank} "
                                 f"divides the batch {per_rank} per data-parallel rank"))
                continue
            suffix = (f"-tp{tp}" if tp > 1 else "") + (f"-pp{pp}" if pp > 1 else "")
            labels = []
            for base in bases:
                groups = [f"fsdp-hybrid{g}" for g in divisors(dp) if 1 < g < dp] if base == "fsdp-hybrid" else [base]
                for b in groups:
                    labels.append(b + suffix)
                    if offload:
                        for off, allowed in OFFLOAD.items():
                            if base in allowed:
                                labels.append(f"{b}{suffix}-offload-{off}")
            for label in labels:
                for ckpt in checkpointing:
                    if pp == 1:
                        layouts.append(Layout(label, tp, pp, dp, 1, "1f1b", ckpt, per_rank))
                        continue
                    for mb in mbs:
                        for sched in SCHEDULES:
                            layouts.append(Layout(label, tp, pp, dp, mb, sched, ckpt, per_rank))
    return layouts, excluded


def parse_name(name, world, global_batch):
    """The Layout of a name LABEL[:mbM:SCHEDULE][:ckpt] (--explain)."""
    m = NAME_RE.match(name)
    if not m:
        raise AdviseError(f"--explain '{name}': not a layout name (LABEL[:mbM:gpipe|1f1b][:ckpt], e.g. "
                          "fsdp-full-tp2-pp4:mb16:1f1b:ckpt)")
    label = m.group("label")
    try:
        _, tp, pp = strategy_labels.split_layout(strategy_labels.check(label))
    except strategy_labels.StrategyError as e:
        raise AdviseError(f"--explain: {e}")
    if world % (tp * pp):
        raise AdviseError(f"--explain '{name}': tp x pp = {tp * pp} does not divide --gpus {world}")
    dp = world // (tp * pp)
    if global_batch % dp:
        raise AdviseError(f"--explain '{name}': --global-batch {global_batch} does not divide over {dp} data-parallel "
                          "ranks")
    if pp > 1 and not m.group("mb"):
        raise AdviseError(f"--explain '{name}': a -pp{pp} layout names its micro-batches and schedule "
                          f"({label}:mb{pp}:1f1b)")
    if pp == 1 and m.group("mb"):
        raise AdviseError(f"--explain '{name}': micro-batches and a schedule belong to a -ppS label")
    return Layout(label, tp, pp, dp, int(m.group("mb") or 1), m.group("sched") or "1f1b", bool(m.group("ckpt")),
                  global_batch // dp)


# ---------------------------------------------------------------- the programs' plans

def batch_mode(bin_dir):
    """True when the programs have --plan-batch (one process plans many layouts)."""
    try:
        p = subprocess.run([os.path.join(bin_dir, "fsdp_perf"), "--help"], capture_output=True, text=True)
    except OSError as e:
        raise AdviseError(f"cannot run {os.path.join(bin_dir, 'fsdp_perf')}: {e} (build it with make)")
    return "--plan-batch" in p.stdout


def _one_plan(argv):
    """(exit, schedule or error line) of one --plan --schedule-json process."""
    with tempfile.TemporaryDirectory() as tmp:
        path = os.path.join(tmp, "s.json")
        p = subprocess.run(argv + ["--schedule-json", path], capture_output=True, text=True)
        if p.returncode == 2:
            line = next((x for x in reversed(p.stderr.splitlines()) if ": error: " in x), p.stderr.strip())
            return 2, line.split(": error: ", 1)[-1]
        if p.returncode not in (0, 3) or not os.path.exists(path):
            return 1, f"plan failed ({' '.join(argv)}): {p.stderr.strip()[-300:]}"
        with open(path) as f:
            return p.returncode, json.load(f)


def _digest_job(argv):
    """A worker's job (slow path): the plan of one layout, reduced to its digest."""
    code, sched = _one_plan(argv)
    return code, (digest(sched) if isinstance(sched, dict) else sched)


def run_plans(requests, bin_dir, full=False, jobs=2, use_batch=None):
    """The one place the programs' plans are called. requests: [(program, [flags])], each with
    --world-size and the memory limits; returns [(exit, result)] in order: exit 0 fits, 3
    does not fit (GPU or host memory), 2 refused (result: the program's one line), 1 failed.
    result: the digest of the schedule (the fast estimate's), or the whole schedule with
    `full` (the replay). Batch mode (--plan-batch -, `jobs` processes per program, the lines
    dealt out at random) where the programs have it, else one --plan --schedule-json process
    per layout on `jobs` workers."""
    if use_batch is None:
        use_batch = batch_mode(bin_dir)
    out = [None] * len(requests)
    if use_batch:
        for program in ("ddp_perf", "fsdp_perf"):
            idx = [i for i, (p, _) in enumerate(requests) if p == program]
            if not idx:
                continue
            order = list(idx)
            random.Random(0).shuffle(order)  # costs vary by layout (micro-batches, schedule): dealt at random
            parts = [order[j::jobs] for j in range(min(jobs, len(order)))]
            with concurrent.futures.ThreadPoolExecutor(len(parts)) as pool:  # the work is in the processes
                got = list(pool.map(lambda part: _batch(program, [requests[i][1] for i in part], bin_dir, full), parts))
            for part, res in zip(parts, got):
                for i, r in zip(part, res):
                    out[i] = r
        return out
    argvs = [[os.path.join(bin_dir, p)] + flags + ["--plan"] for p, flags in requests]
    if full:
        return [_one_plan(a) for a in argvs]
    if jobs <= 1 or len(argvs) < 4:
        return [_digest_job(a) for a in argvs]
    with concurrent.futures.ProcessPoolExecutor(jobs) as pool:
        return list(pool.map(_digest_job, argvs, chunksize=4))


def _batch(program, lines, bin_dir, full):
    """[(exit, digest or schedule)] of `program --plan-batch -`: the totals alone for the
    digest (--plan-batch-ops none), every op for the replay (`full`). Each line is read and
    digested as the program writes it, while it plans the next."""
    if not lines:
        return []
    cmd = [os.path.join(bin_dir, program), "--plan-batch", "-", "--plan-batch-ops", "all" if full else "none"]
    p = subprocess.Popen(cmd, stdin=subprocess.PIPE, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    err = []
    feeders = [threading.Thread(target=lambda: (p.stdin.write("".join(" ".join(f) + "\n" for f in lines)),
                                                p.stdin.close())),
               threading.Thread(target=lambda: err.append(p.stderr.read()))]
    for t in feeders:
        t.start()
    out = []
    for text in p.stdout:
        if not text.strip():
            continue
        row = json.loads(text)
        code = row["exit"]
        if code == 2:
            out.append((2, row.get("error", "refused")))
        elif code in (0, 3):
            out.append((code, row["schedule"] if full else digest(row["schedule"])))
        else:
            out.append((1, row.get("error", f"exit {code}")))
    p.wait()
    for t in feeders:
        t.join()
    if len(out) != len(lines):
        raise AdviseError(f"{program} --plan-batch answered {len(out)} of {len(lines)} lines: "
                          f"{''.join(err).strip()[-300:]}")
    return out


# ---------------------------------------------------------------- the fast estimate

def _empty_stage():
    return {"gemm": [0, 0.0], "elementwise": [0, 0.0], "copy": [0, 0.0], "optimizer": [0, 0.0], "coll": {},
            "send": [0, 0.0], "h2d": 0.0, "d2h": 0.0, "host_update": 0.0, "peak": 0}


def digest(sched):
    """What the fast estimate needs of a schedule, per pipeline stage, from its "totals" (the
    programs' schedule writer: --plan-batch and --schedule-json alike): compute operations'
    counts, GEMM FLOPs, the distinct GEMM shapes and elementwise sizes with their counts,
    bytes, each collective's count, bytes and sent bytes per mesh axis, the sends, CPU
    offload's host copies and update; and the plan's memory."""
    d = {k: sched.get(k) for k in ("label", "program", "world_size", "dp_size", "tp_size", "pp_size", "batch_per_rank",
                                   "enc_seq_len", "dec_seq_len", "model_flops_per_step", "hardware_flops_per_step",
                                   "memory", "axes", "axis_names", "cpu_offload", "pipeline_bubble_theory",
                                   "micro_batches", "pp_schedule", "unit_names", "activation_checkpointing")}
    d["micro_batches"] = d["micro_batches"] or 1
    totals = sched.get("totals")
    if not isinstance(totals, list) or not totals or "gemm_shapes" not in totals[0]:
        raise AdviseError(f"the schedule of {sched.get('label')} has no per-stage totals with GEMM shapes: the "
                          "programs are older than this script (rebuild them with make)")
    offload = sched.get("cpu_offload", "none") != "none"
    peaks = [st["peak_total"] for st in sched["stages"]] if sched.get("stages") else [sched["memory"]["peak_total"]]
    d["stages"] = []
    for st, peak in zip(totals, peaks):
        s = _empty_stage()
        s["peak"] = peak
        s["gemm"][1] = float(st["gemm_flops"])
        s["gemm_shapes"] = [((m, n, k, b), c, f / c) for m, n, k, b, c, f in st["gemm_shapes"]]
        s["elem_sizes"] = [(b, c) for b, c in st["elementwise_sizes"]]
        for op, per_axis in st["ops"].items():
            for axis, v in per_axis.items():
                n, b, sent = int(v["count"]), float(v["bytes"]), float(v.get("sent_bytes", 0))
                if op in ("gemm", "elementwise", "copy", "optimizer"):
                    s[op][0] += n
                    if op != "gemm":
                        s[op][1] += b
                elif op in ("all-reduce", "all-gather", "reduce-scatter"):
                    c = s["coll"].setdefault((op, axis), [0, 0.0, 0.0])
                    c[0] += n
                    c[1] += b
                    c[2] += sent
                elif op == "send":
                    s["send"][0] += n
                    s["send"][1] += b
        h = st.get("host")
        if offload and h:  # CPU offload's host lanes, apart from the compute lane's copies and update
            s["h2d"], s["d2h"] = float(h["h2d_bytes"]), float(h["d2h_bytes"])
            s["host_update"] = float(h["update_bytes"])
            s["copy"][0] -= int(h["copy_count"])
            s["copy"][1] -= s["h2d"] + s["d2h"]
            s["optimizer"][0] -= int(h["update_count"])
            s["optimizer"][1] -= s["host_update"]
        d["stages"].append(s)
    return d


def estimate(d, cluster):
    """The fast estimate of one step from a digest: seconds, with its parts (docs/projection.md,
    "The layout advisor")."""
    cm = cluster["compute_model"]
    w, gpn = d["world_size"], cluster["gpus_per_node"]
    slow = oversubscription(cluster, min(w, gpn), w) * straggler_factor(cluster, w)
    tiers = group_tiers(d, cluster)
    axis_code = {name: i for i, name in enumerate(d["axis_names"])}
    overlap = cluster["compute"].get("overlap_slowdown", 0.0)
    M, S = max(1, d["micro_batches"]), max(1, d["pp_size"])
    units = max(1, len(d.get("unit_names") or [1]) // S)
    per = []
    for s in d["stages"]:
        n_g, n_e = s["gemm"][0], s["elementwise"][0]
        # each distinct shape at its calibrated time, as the replay
        t = sum(c * cm.gemm_time(*sh, f) for sh, c, f in s["gemm_shapes"])
        t += sum(c * cm.elementwise_time(b) for b, c in s["elem_sizes"])
        t += s["copy"][1] / cm.bandwidth("copy") / cm.memory_scale + s["optimizer"][1] / cm.bandwidth("optimizer") / \
            cm.memory_scale
        t += cm.launch * (n_g + n_e + s["copy"][0] + s["optimizer"][0])
        comp = t * slow
        by_axis, gathers, reductions = {}, 0.0, 0.0
        for (op, axis), (n, b, sent) in s["coll"].items():
            ranks, nodes = tiers[axis_code[axis]]
            x = n * collective_time(cluster, op, b / n, ranks, nodes, sent / n) if n else 0.0
            by_axis[axis] = by_axis.get(axis, 0.0) + x
            if axis in DP_AXES:
                if op == "all-gather":
                    gathers += x
                else:
                    reductions += x
        tp_t = by_axis.get("tp", 0.0)
        dp_t = gathers + reductions
        if S == 1:
            hidden = min(dp_t, comp)
            exposed_dp = max(0.0, dp_t - comp) + dp_t / units
        else:  # gathers under every micro-batch's compute; reductions after the last one's
            hidden = min(gathers, comp) + min(reductions, comp / M)
            exposed_dp = max(0.0, gathers - comp) + max(0.0, reductions - comp / M) + dp_t / units / M
        comp_eff = comp + overlap * hidden
        pp_ranks = d["axes"]["pp"]["ranks"]
        cross = len({r // gpn for r in pp_ranks}) > 1
        msg = p2p_time(cluster, s["send"][1] / s["send"][0], not cross) if s["send"][0] else 0.0
        link, upd = ((cluster["host"]["link_bandwidth_gbps"] * 1e9, cluster["host"]["update_bandwidth_gbps"] * 1e9)
                     if d.get("cpu_offload", "none") != "none" else (1.0, 1.0))
        host = {"copy": max(s["h2d"], s["d2h"]) / link, "update": s["host_update"] / upd}
        per.append({"compute": comp_eff, "tp": tp_t, "dp": exposed_dp, "msg": msg, "host": host,
                    "dp_total": dp_t, "comm": by_axis})
    busy = [p["compute"] + p["tp"] for p in per]
    if S == 1:
        p = per[0]
        core = busy[0] + p["dp"]
        step = max(core, p["host"]["copy"]) + p["host"]["update"]
        pp_t, pipe = 0.0, busy[0]
    else:  # fill and drain: (M - 1) max c_s / M + sum c_s / M, plus the messages on the critical path
        pipe = (M - 1) * max(busy) / M + sum(busy) / M
        pp_t = 2 * (S - 1) * max(p["msg"] for p in per)
        tail = max(p["dp"] + p["host"]["update"] for p in per)
        step = pipe + pp_t + tail
    compute = sum(p["compute"] for p in per) / len(per)
    exposed = {"dp": max(p["dp"] for p in per), "tp": sum(p["tp"] for p in per) / len(per), "pp": pp_t,
               "host": max(p["host"]["update"] for p in per)}
    return {"time": step, "compute": compute, "exposed": exposed, "pipe": pipe, "bubble": max(0.0, 1 - (compute + exposed["tp"]) /
                                                                                step) if S > 1 else 0.0}


def figures(d, t):
    """Throughput of a step of t seconds: (model TFLOPS per GPU, tokens per second)."""
    tokens = d["batch_per_rank"] * d["dp_size"] * (d["enc_seq_len"] + d["dec_seq_len"])
    return d["model_flops_per_step"] / t / 1e12, tokens / t


def fits(d):
    m = d["memory"]
    return bool(m["fits"]) and bool(m.get("host_fits", True))


# ---------------------------------------------------------------- command line

def parse_args(argv):
    ap = cli.parser(__doc__, __file__)
    ap.add_argument("--cluster", required=True, help="cluster description (TOML), e.g. runs/clusters/a100-80gb.toml")
    ap.add_argument("--model", required=True, help="model preset as the programs name it (fsdp_perf --list-models)")
    ap.add_argument("--layers", default=None, help="override the preset's layers per stack (default: the preset's)")
    for key, flag, _ in model_shapes.SHAPE_KEYS:
        if key != "layers":
            ap.add_argument(flag, dest=key, default=None, help=f"as the programs' {flag} (default: the preset's)")
    ap.add_argument("--gpus", type=int, required=True, help="GPUs (world size)")
    ap.add_argument("--global-batch", type=int, required=True,
                    help="sequences per step over all GPUs (each layout: global batch / data-parallel ranks per rank)")
    ap.add_argument("--seq-len", type=int, default=512, help="encoder tokens per sequence (default: %(default)s)")
    ap.add_argument("--dec-seq-len", type=int, default=None, help="decoder tokens per sequence (default: --seq-len)")
    ap.add_argument("--strategies", default=",".join(BASES),
                    help="the data-parallel strategies to enumerate (hybrid: every group size) "
                         "(default: %(default)s)")
    ap.add_argument("--tp", default=None, help="only these tensor degrees, comma-separated (default: every one)")
    ap.add_argument("--pp", default=None, help="only these pipeline degrees, comma-separated (default: every one)")
    ap.add_argument("--no-offload", action="store_true", help="leave out the CPU offload layouts (default: included "
                    "where the program serves them and the description has [host])")
    ap.add_argument("--replay", type=int, default=10, help="replay the top N in full (default: %(default)s)")
    ap.add_argument("--top", type=int, default=20, help="rows of the printed table (default: %(default)s)")
    ap.add_argument("--jobs", type=int, default=2, help="plan processes at once without --plan-batch (default: "
                    "%(default)s)")
    ap.add_argument("--explain", metavar="LAYOUT", default=None,
                    help="print where one layout's step goes (LABEL[:mbM:SCHEDULE][:ckpt]) instead of ranking "
                         "(default: rank every layout)")
    ap.add_argument("--emit-matrix", metavar="FILE.toml", default=None,
                    help="write a run matrix of the top --replay layouts for slurm/sweep (one file per setting of "
                         "micro-batches, schedule, checkpointing and batch a matrix holds once: FILE-2.toml ...) "
                         "(default: none)")
    add_calibration_arguments(ap)
    ap.add_argument("--bin", default=None, help="folder of ddp_perf and fsdp_perf (default: build/bin of this "
                    "checkout)")
    ap.add_argument("--out", default=None, help="folder for advise.png/.svg and advise.csv (required unless "
                    "--explain; default: none)")
    ap.add_argument("--overwrite", action="store_true", help="write into a non-empty --out")
    return ap.parse_args(argv)


def check_args(a):
    for name in ("gpus", "global_batch", "seq_len"):
        if getattr(a, name) <= 0:
            raise AdviseError(f"--{name.replace('_', '-')} must be positive")
    if a.dec_seq_len is not None and a.dec_seq_len <= 0:
        raise AdviseError("--dec-seq-len must be positive")
    if a.replay < 0 or a.top <= 0 or a.jobs <= 0:
        raise AdviseError("--replay must be >= 0, --top and --jobs positive")
    bases = a.strategies.split(",")
    for b in bases:
        if b not in BASES:
            raise AdviseError(f"--strategies: unknown strategy '{b}' (allowed: {', '.join(BASES)})")
    for flag in ("tp", "pp"):
        v = getattr(a, flag)
        if v is not None:
            setattr(a, flag, cli.positive_list(v, f"--{flag}"))
    if a.explain is None:
        if not a.out:
            raise AdviseError("give --out DIR (the figure and the table), or --explain LAYOUT")
        try:
            cli.check_output_dir(a.out, "--out")
        except cli.BadInput as e:
            raise AdviseError(str(e))
        if os.path.isdir(a.out) and os.listdir(a.out) and not a.overwrite:
            raise AdviseError(f"--out '{a.out}' is not empty (pass --overwrite, or choose another --out)")
    if a.emit_matrix:
        try:
            cli.check_output_file(a.emit_matrix, "--emit-matrix", ("toml",))
        except cli.BadInput as e:
            raise AdviseError(str(e))
    return bases


def common_flags(a, cluster, world, layout):
    program, flags = layout.flags(cluster["gpus_per_node"], world)
    entry = {"model": a.model}
    for key in model_shapes.KEYS:
        if getattr(a, key, None) is not None:
            entry[key] = getattr(a, key)
    flags = flags + model_shapes.flags(entry) + ["--seq-len", str(a.seq_len)]
    if a.dec_seq_len is not None:
        flags += ["--dec-seq-len", str(a.dec_seq_len)]
    flags += ["--dtype", cluster["dtype"], "--reduce-dtype", cluster["dtype"], "--world-size", str(world),
              "--mem-limit-gib", str(cluster["gpu_memory_gib"])]
    if layout.offload != "none":
        flags += ["--host-mem-limit-gib", str(cluster["host"]["memory_gib"])]
    return program, flags


def calibration_line(cluster, flags=None):
    """The calibration the projection stands on: its runs, the GPU they ran on, their date;
    or, where --calibrate-run / --calibrate-collectives gave it (flags), what each set."""
    if flags and (flags.calibrate_run or flags.calibrate_collectives):
        return "calibration: " + "; ".join(cluster["calibration"])
    runs = cluster["compute"].get("calibration_runs", [])
    if not runs:
        return f"calibration: none (the {cluster['name']} description's nominal rates)"
    dates, backends = set(), set()
    for r in runs:
        try:
            import h5py
            with h5py.File(os.path.join(ROOT, r), "r") as f:
                dates.add(str(shardbench_h5.attr(f, "start_time"))[:10])
                backends.add(str(shardbench_h5.attr(f, "backend")))
        except (OSError, KeyError):
            pass
    folder = sorted({os.path.dirname(r) for r in runs})
    gpu = re.match(r"([a-z0-9]+)-", os.path.basename(folder[0]))
    scale = cluster["compute"]
    transfer = (f", transferred to {cluster['name']} at x{scale.get('gemm_scale', 1):.4f} GEMM, "
                f"x{scale.get('memory_scale', 1):.4f} memory" if scale.get("gemm_scale", 1) != 1 or
                scale.get("memory_scale", 1) != 1 else "")
    return (f"calibration: {len(runs)} runs in {', '.join(folder)} ({gpu.group(1).upper() if gpu else '?'} GPU, "
            f"backend {', '.join(sorted(backends)) or '?'}, {', '.join(sorted(dates)) or '?'}){transfer}; "
            f"the projection's validation: {VALIDATION}")


def main(argv=None):
    a = parse_args(argv)
    try:
        bases = check_args(a)
        cluster = calibrated(a)
        bin_dir = a.bin or os.path.join(ROOT, "build", "bin")
        use_batch = batch_mode(bin_dir)
        offload = not a.no_offload and isinstance(cluster.get("host"), dict)
        if a.explain:
            return explain(a, cluster, bin_dir, parse_name(a.explain, a.gpus, a.global_batch))
        return rank(a, cluster, bin_dir, use_batch, bases, offload)
    except (AdviseError, ProjectionError, cli.BadInput) as e:
        print(f"advise: error: {e}", file=sys.stderr)
        return 2


def model_blocks(a, cluster, bin_dir):
    """2 x layers of the model (its plan's shape)."""
    lay = Layout("fsdp-full", 1, 1, 1, 1, "1f1b", False, 1)
    program, flags = common_flags(a, cluster, 1, lay)
    code, sched = _one_plan([os.path.join(bin_dir, program)] + flags + ["--plan"])
    if code not in (0, 3):
        raise AdviseError(sched)
    return 2 * int(sched["layers"])


def plan_all(a, cluster, bin_dir, use_batch, layouts):
    reqs = [common_flags(a, cluster, a.gpus, lay) for lay in layouts]
    return run_plans(reqs, bin_dir, jobs=a.jobs, use_batch=use_batch)


def rank(a, cluster, bin_dir, use_batch, bases, offload):
    t0 = time.time()
    blocks = model_blocks(a, cluster, bin_dir)
    tp_res = probe_tp_simple(a, cluster, bin_dir, a.gpus)
    layouts, excluded = enumerate_layouts(a.gpus, a.global_batch, blocks, cluster["gpus_per_node"],
                                          lambda tp: tp_res[tp], bases, offload, tps=a.tp, pps=a.pp)
    print(f"advise: {a.model} on {a.gpus} GPUs of {cluster['name']}, global batch {a.global_batch} x "
          f"{a.seq_len}{'+' + str(a.dec_seq_len) if a.dec_seq_len else ''} tokens: {len(layouts)} layouts "
          f"({'--plan-batch' if use_batch else 'one --plan per layout'})")
    print(calibration_line(cluster, a))
    results = plan_all(a, cluster, bin_dir, use_batch, layouts)
    t_plan = time.time() - t0
    ranked, oom, refused = [], [], []
    for lay, (code, d) in zip(layouts, results):
        if code == 1:
            raise AdviseError(d)
        if code == 2:
            refused.append((lay, d))
            continue
        if not fits(d):
            oom.append((lay, d))
            continue
        est = estimate(d, cluster)
        ranked.append((lay, d, est))
    ranked.sort(key=lambda x: x[2]["time"])
    t_est = time.time() - t0
    # the full replay of the top layouts
    top = ranked[:a.replay]
    replayed = dict(zip([lay.name for lay, _, _ in top],
                        replay_all((a.cluster, tuple(a.calibrate_run), tuple(a.calibrate_collectives)),
                                   [common_flags(a, cluster, a.gpus, lay) for lay, _, _ in top], bin_dir,
                                   use_batch, a.jobs)))
    t_all = time.time() - t0
    print_table(ranked, replayed, a.top)
    print(f"\nexcluded: {len(oom)} layouts do not fit (the plan: device or host memory), {len(refused)} refused by "
          f"the program, {len(excluded)} tensor x pipeline degrees before any plan:")
    for what, why in excluded:
        print(f"  {what}: {why}")
    reasons = {}
    for lay, msg in refused:
        reasons.setdefault(msg, []).append(lay.name)
    for msg, names in sorted(reasons.items(), key=lambda kv: -len(kv[1]))[:8]:
        print(f"  {len(names)} refused ({names[0]}{', ...' if len(names) > 1 else ''}): {msg}")
    if oom:
        worst = {}
        for lay, d in oom:
            worst.setdefault(lay.label.split("-tp")[0].split("-pp")[0].split("-offload")[0], []).append(lay)
        print("  do not fit, by strategy: " + ", ".join(f"{k} {len(v)}" for k, v in sorted(worst.items())))
    if any(lay.unverified for lay, _, _ in ranked[:a.top]):
        print("  * tensor or pipeline parallelism: compiled and tested on the CPU backend, not yet run on the CUDA "
              "backend (README, docs/gpu.md)")
    if top:
        winner_est = top[0][0].name
        winner_full = min(replayed, key=lambda n: replayed[n]["time"])
        print(f"\nfastest by the estimate: {winner_est}; by the full replay of the top {len(top)}: {winner_full}")
    n = len(layouts)
    print(f"time: {n} layouts planned and estimated in {t_est:.1f} s ({n / t_est:.0f} layouts/s; plans {t_plan:.1f} s), "
          f"top {len(top)} replayed in full, {t_all:.1f} s in all")
    os.makedirs(a.out, exist_ok=True)
    write_csv(os.path.join(a.out, "advise.csv"), ranked, oom, replayed)
    png = draw(ranked, replayed, os.path.join(a.out, "advise"), f"{a.model} on {a.gpus} GPUs of {cluster['name']}, "
               f"global batch {a.global_batch}")
    print(f"advise: wrote {png} (+ .svg), {os.path.join(a.out, 'advise.csv')}")
    if a.emit_matrix:
        paths = emit_matrix(a, cluster, [lay for lay, _, _ in top])
        if len(paths) > 1:
            print(f"advise: the top layouts differ in a setting one matrix holds once (micro-batches, schedule, "
                  f"checkpointing, batch): {len(paths)} matrices")
        for path in paths:
            print(f"advise: wrote {path} (slurm/sweep {path} --dry-run)")
    return 0


def probe_tp_simple(a, cluster, bin_dir, world):
    """{tp: True or why not}: one tiny plan per tensor degree (the program checks heads, d_ff
    and vocab; its exit 2 is trusted)."""
    out = {}
    for tp in [t for t in divisors(world) if t <= cluster["gpus_per_node"] and (not getattr(a, "tp", None) or
                                                                           t in a.tp)]:
        lay = Layout("fsdp-full" + (f"-tp{tp}" if tp > 1 else ""), tp, 1, 1, 1, "1f1b", False, 1)
        program, flags = common_flags(a, cluster, tp, lay)
        code, r = _one_plan([os.path.join(bin_dir, program)] + flags + ["--plan"])
        if code == 1:
            raise AdviseError(r)
        out[tp] = True if code in (0, 3) else f"refused by the program: {r}"
    return out


_CLUSTERS = {}


def _replay_job(job):
    """A worker's full replay of one layout (its plan with every op, then simulate): the
    replay's figures, without its timeline."""
    cluster_args, request, bin_dir, use_batch = job  # (path, calibration runs, collective results)
    if cluster_args not in _CLUSTERS:
        _CLUSTERS[cluster_args] = calibrated_from(*cluster_args)
    code, sched = run_plans([request], bin_dir, full=True, use_batch=use_batch)[0]
    if code not in (0, 3):
        raise AdviseError(sched)
    sim = simulate(sched, _CLUSTERS[cluster_args])
    return {k: sim[k] for k in ("time", "compute", "communication", "exposed", "idle_share", "host_copy",
                                "host_update", "passes", "converged")}


def replay_all(cluster_args, requests, bin_dir, use_batch, jobs):
    """The full replays of the top layouts, `jobs` at once (each re-plans its layout with
    every op: the ranking kept only digests); cluster_args: calibrated_from's."""
    work = [(cluster_args, r, bin_dir, use_batch) for r in requests]
    if jobs <= 1 or len(work) < 2:
        return [_replay_job(w) for w in work]
    with concurrent.futures.ProcessPoolExecutor(jobs) as pool:
        return list(pool.map(_replay_job, work))


def print_table(ranked, replayed, top):
    print(f"\n{'#':>3} {'layout':<46} {'est ms':>8} {'TFLOPS/GPU':>10} {'tokens/s':>9} {'replay ms':>9} "
          f"{'TFLOPS':>7} {'GiB/GPU':>7} {'bubble%':>7} {'dp ms':>7} {'tp ms':>7} {'pp ms':>6}")
    for i, (lay, d, est) in enumerate(ranked[:top]):
        sim = replayed.get(lay.name)
        tf, tok = figures(d, est["time"])
        bubble = sim["idle_share"] if sim and lay.pp > 1 else est["bubble"]
        e = est["exposed"]
        print(f"{i + 1:>3} {lay.name + (' *' if lay.unverified else ''):<46} {est['time'] * 1e3:>8.1f} {tf:>10.1f} "
              f"{tok:>9.0f} {sim['time'] * 1e3 if sim else float('nan'):>9.1f} "
              f"{figures(d, sim['time'])[0] if sim else float('nan'):>7.1f} "
              f"{d['memory']['peak_total'] / 2**30:>7.2f} {bubble * 100:>7.1f} {e['dp'] * 1e3:>7.1f} "
              f"{e['tp'] * 1e3:>7.1f} {e['pp'] * 1e3:>6.1f}")
    print("(est: the fast estimate, which ranks; replay: the full replay of the top layouts; bubble: the replay's idle "
          "share where replayed, else the estimate's; exposed communication by axis (dp, tp, pipeline messages): "
          "the estimate's; *: not yet run on the CUDA backend)")


def write_csv(path, ranked, oom, replayed):
    with open(path, "w", newline="") as f:
        w = csv.writer(f)
        w.writerow(["layout", "label", "tp", "pp", "dp", "micro_batches", "pp_schedule", "activation_checkpointing",
                    "cpu_offload", "fits", "est_step_s", "replay_step_s", "model_tflops_per_gpu", "tokens_per_s",
                    "peak_gib", "exposed_dp_s", "exposed_tp_s", "exposed_pp_s"])
        for lay, d, est in ranked:
            sim = replayed.get(lay.name)
            tf, tok = figures(d, sim["time"] if sim else est["time"])
            w.writerow([lay.name, lay.label, lay.tp, lay.pp, lay.dp, lay.mb, lay.schedule if lay.pp > 1 else "",
                        int(lay.ckpt), lay.offload, 1, f"{est['time']:.6g}", f"{sim['time']:.6g}" if sim else "",
                        f"{tf:.4g}", f"{tok:.6g}", f"{d['memory']['peak_total'] / 2**30:.4f}",
                        f"{est['exposed']['dp']:.4g}", f"{est['exposed']['tp']:.4g}", f"{est['exposed']['pp']:.4g}"])
        for lay, d in oom:
            w.writerow([lay.name, lay.label, lay.tp, lay.pp, lay.dp, lay.mb, lay.schedule if lay.pp > 1 else "",
                        int(lay.ckpt), lay.offload, 0, "", "", "", "", f"{d['memory']['peak_total'] / 2**30:.4f}",
                        "", "", ""])


def pareto(points):
    """Indices of the points (memory, throughput) no other point beats on both."""
    order = sorted(range(len(points)), key=lambda i: (points[i][0], -points[i][1]))
    front, best = [], -math.inf
    for i in order:
        if points[i][1] > best:
            front.append(i)
            best = points[i][1]
    return front


def draw(ranked, replayed, stem, title):
    import matplotlib
    matplotlib.use("Agg")
    import matplotlib.pyplot as plt
    pts = []
    for lay, d, est in ranked:  # every layout at its estimate (which ranks); the replayed ones again below
        pts.append((d["memory"]["peak_total"] / 2**30, figures(d, est["time"])[1]))
    fig, ax = plt.subplots(figsize=(7.5, 5))
    if pts:
        ax.scatter([p[0] for p in pts], [p[1] for p in pts], s=8, c="#9aa9b8", label=f"{len(pts)} layouts that fit "
                   "(fast estimate)")
        front = pareto(pts)
        ax.plot([pts[i][0] for i in front], [pts[i][1] for i in front], "-o", color="#c0392b", ms=4,
                label="Pareto front (throughput vs memory)")
        for i in front[-4:]:
            ax.annotate(ranked[i][0].name, pts[i], fontsize=6, xytext=(3, 3), textcoords="offset points")
        top = [i for i, (lay, _, _) in enumerate(ranked) if lay.name in replayed]
        ax.scatter([pts[i][0] for i in top], [figures(ranked[i][1], replayed[ranked[i][0].name]["time"])[1]
                                              for i in top], s=30, facecolors="none", edgecolors="black",
                   label=f"top {len(top)}, replayed in full")
    ax.set_xlabel("peak memory per GPU (GiB, the program's plan)")
    ax.set_ylabel("tokens per second (whole job)")
    ax.set_title(title, fontsize=9)
    ax.grid(alpha=0.3)
    ax.legend(fontsize=7)
    fig.tight_layout()
    fig.savefig(stem + ".png", dpi=120)
    fig.savefig(stem + ".svg")
    plt.close(fig)
    return stem + ".png"


def emit_matrix(a, cluster, layouts):
    """Run matrices of `layouts` for slurm/sweep: one per setting a matrix holds once
    (micro-batches and schedule of its -ppS labels, checkpointing, batch per rank)."""
    gpn = cluster["gpus_per_node"]
    if a.gpus % gpn:
        raise AdviseError(f"--emit-matrix: --gpus {a.gpus} is not a multiple of the description's gpus_per_node {gpn} "
                          "(slurm/sweep runs whole nodes)")
    groups = {}
    for lay in layouts:
        key = (lay.mb if lay.pp > 1 else 0, lay.schedule if lay.pp > 1 else "", lay.ckpt, lay.batch)
        groups.setdefault(key, []).append(lay)
    # non-pipeline layouts fit any group of their batch and checkpointing: put them with the first
    merged = {}
    for key, lays in groups.items():
        if key[0] == 0:
            host = next((k for k in groups if k[0] and k[2:] == key[2:]), None)
            if host is not None:
                merged.setdefault(host, []).extend(lays)
                continue
        merged.setdefault(key, []).extend(lays)
    stem = a.emit_matrix[:-len(".toml")]
    paths = []
    for k, ((mb, sched, ckpt, batch), lays) in enumerate(sorted(merged.items(), key=lambda kv: layouts.index(
            kv[1][0]) if kv[1][0] in layouts else 0)):
        path = a.emit_matrix if k == 0 else f"{stem}-{k + 1}.toml"
        name = re.sub(r"[^A-Za-z0-9._-]", "-", os.path.basename(stem)) + ("" if k == 0 else f"-{k + 1}")
        labels = []
        for lay in lays:
            if lay.label not in labels:
                labels.append(lay.label)
        models = f'["{a.model}"]'
        shape = {key: getattr(a, key) for key in model_shapes.KEYS if getattr(a, key, None) is not None}
        if shape:
            parts = [f'model = "{a.model}"'] + [f"{key} = {shape[key]}" if key not in ("ffn", "tie_embeddings") else
                                               (f'{key} = "{shape[key]}"' if key == "ffn" else
                                                f"{key} = {str(shape[key] in ('yes', 'true', '1')).lower()}")
                                               for key in shape]
            models = "[{" + ", ".join(parts) + "}]"
        extra = f'["--dec-seq-len", "{a.dec_seq_len}"]' if a.dec_seq_len else "[]"
        text = f"""# Written by analysis/advise.py: the top layouts of {a.model} on {a.gpus} GPUs of {cluster['name']},
# global batch {a.global_batch} (batch {batch} per data-parallel rank){', micro-batches ' + str(mb) + ', ' + sched if mb else ''}{', activation checkpointing' if ckpt else ''}.
# Edit [cluster] for your site. Keys and types: docs/slurm.md.
#   slurm/sweep {path} --dry-run

[sweep]
name = "{name}"
description = "analysis/advise.py: top layouts ({', '.join(l.name for l in lays)})"

[cluster]
name = "{cluster['name']}"
gpus_per_node = {gpn}
gpu_memory_gib = {cluster['gpu_memory_gib']}
partition = "gpu"
account = ""
time_limit = "02:00:00"

[matrix]
models = {models}
strategies = [{', '.join(f'"{x}"' for x in labels)}]
gpus = [{a.gpus}]
batch = [{batch}]
batch_per = "rank"
micro_batches = {mb}
pp_schedule = "{sched or '1f1b'}"
seq_len = [{a.seq_len}]
backend = "cuda"
activation_checkpointing = {'true' if ckpt else 'false'}
dtype = "{cluster['dtype']}"
extra_args = {extra}
"""
        with open(path, "w") as f:
            f.write(text)
        paths.append(path)
    return paths


def explain(a, cluster, bin_dir, lay):
    """Where one layout's step goes: compute, exposed communication per axis, the bubble,
    memory by category; the fast estimate beside the full replay."""
    program, flags = common_flags(a, cluster, a.gpus, lay)
    code, sched = _one_plan([os.path.join(bin_dir, program)] + flags + ["--plan"])
    if code == 2:
        raise AdviseError(f"{lay.name}: refused by the program: {sched}")
    if code == 1:
        raise AdviseError(sched)
    d = digest(sched)
    est = estimate(d, cluster)
    m = sched["memory"]
    print(f"advise: {lay.name}{' *' if lay.unverified else ''}: {a.model} on {a.gpus} GPUs of {cluster['name']}, "
          f"{lay.dp} data-parallel ranks x batch {lay.batch}, tp {lay.tp}, pp {lay.pp}"
          + (f", {lay.mb} micro-batches ({lay.schedule})" if lay.pp > 1 else "")
          + (", activation checkpointing" if lay.ckpt else "") + (f", CPU offload {lay.offload}"
                                                                  if lay.offload != "none" else ""))
    print(calibration_line(cluster, a))
    print(f"memory per GPU (the program's plan): {m['peak_total'] / 2**30:.2f} GiB of {cluster['gpu_memory_gib']} GiB: "
          f"{'fits' if fits(d) else 'DOES NOT FIT'}")
    for k in ("parameters", "gradients", "optimizer_state", "activations", "comm_buffers", "workspace"):
        if k in m:
            print(f"  {k:<16} {m[k] / 2**30:9.2f} GiB")
    if m.get("host_peak_total"):
        print(f"  host (per GPU)   {m['host_peak_total'] / 2**30:9.2f} GiB of {cluster['host']['memory_gib']} GiB")
    if lay.pp > 1:
        for i, st in enumerate(sched.get("stages", [])):
            print(f"  stage {i} (rank {st['rank']}): peak {st.get('peak_total', 0) / 2**30:.2f} GiB")
    if not fits(d):
        print("the step is not projected: the layout does not fit")
        return 0
    sim = simulate(sched, cluster)
    e = est["exposed"]
    if lay.pp > 1:
        print(f"step (fast estimate): {est['time'] * 1e3:.1f} ms = the stages' compute and tensor-parallel "
              f"collectives through the pipeline's fill and drain {est['pipe'] * 1e3:.1f} ms (compute {est['compute'] * 1e3:.1f} "
              f"ms per stage on average, tensor-parallel {e['tp'] * 1e3:.1f} ms; bubble {est['bubble'] * 100:.1f} %)"
              f" + pipeline messages {e['pp'] * 1e3:.1f} ms + the worst stage's exposed data-parallel tail and host "
              f"update {(est['time'] - est['pipe'] - e['pp']) * 1e3:.1f} ms")
    else:
        print(f"step (fast estimate): {est['time'] * 1e3:.1f} ms = compute {est['compute'] * 1e3:.1f} ms"
              f" + tensor-parallel {e['tp'] * 1e3:.1f} ms + exposed data-parallel {e['dp'] * 1e3:.1f} ms"
              + (f", host link and update {(est['time'] - est['pipe'] - e['dp']) * 1e3:.1f} ms"
                 if lay.offload != "none" else ""))
    exposed_full = sim["exposed"]
    print(f"step (full replay):   {sim['time'] * 1e3:.1f} ms = compute {sim['compute'] * 1e3:.1f} ms, waits on "
          f"collectives {exposed_full * 1e3:.1f} ms, idle {sim['idle_share'] * 100:.1f} %"
          + (f" (bubble in theory {sched.get('pipeline_bubble_theory', 0) * 100:.1f} %)" if lay.pp > 1 else "")
          + (f", host copies {sim['host_copy'] * 1e3:.1f} ms, update {sim['host_update'] * 1e3:.1f} ms"
             if lay.offload != "none" else ""))
    print("communication per axis (all of it, hidden or not; fast estimate):")
    for s_i, s in enumerate(d["stages"]):
        comm = {}
        tiers = group_tiers(d, cluster)
        code_of = {n: i for i, n in enumerate(d["axis_names"])}
        for (op, axis), (n, b, sent) in s["coll"].items():
            ranks, nodes = tiers[code_of[axis]]
            comm.setdefault(axis, [0.0, 0.0])
            comm[axis][0] += n * collective_time(cluster, op, b / n, ranks, nodes, sent / n) if n else 0.0
            comm[axis][1] += b
        where = f"stage {s_i}: " if len(d["stages"]) > 1 else ""
        print("  " + where + (", ".join(f"{ax} {v[0] * 1e3:.1f} ms ({v[1] / 2**30:.2f} GiB, {tiers[code_of[ax]][0]} "
                                        f"ranks on {tiers[code_of[ax]][1]} node(s))" for ax, v in sorted(comm.items()))
                              or "none"))
    tf, tok = figures(d, sim["time"])
    print(f"throughput (full replay): {tf:.1f} model TFLOPS per GPU, {tok:.0f} tokens/s")
    return 0


if __name__ == "__main__":
    sys.exit(main())
