#!/usr/bin/python3
"""Projection of a training step to scales not run: step time, TFLOPS per GPU and peak
memory for each strategy and GPU count, from a cluster description calibrated by
measurements.

Example: the published study's T5-11B scaling on the A100 cluster:

    analysis/project.py --cluster runs/clusters/a100-80gb.toml --model t5-11.3b \\
        --strategies fsdp-full,fsdp-hybrid --gpus 8,16,32,64,128,256,512 --batch 8,16 \\
        --seq-len 512 --activation-checkpointing --out results/projection

Layouts at equal global batch (tensor and pipeline parallelism; --batch per GPU):

    analysis/project.py --cluster runs/clusters/a100-80gb.toml --model t5-11.3b \\
        --strategies fsdp-full,fsdp-full-tp2,ddp-tp2-pp4 --gpus 8,64 --batch 8 --batch-per gpu \\
        --micro-batches 16 --activation-checkpointing --out results/layouts

A run matrix's points, or a shape no preset has:

    analysis/project.py --cluster runs/clusters/a100-80gb.toml --matrix runs/t5_v1_1.toml \\
        --out results/figures-t5-v1_1
    analysis/project.py --cluster runs/clusters/a100-80gb.toml --model t5-v1_1-xxl --layers 12 \\
        --d-ff 16384 --strategies fsdp-full --gpus 64 --batch 16 --out results/mine

For every point the program's own memory plan is run (ddp_perf/fsdp_perf --plan
--world-size N --schedule-json, nothing allocated): it gives the memory verdict and one
step's GEMMs (with shapes), elementwise kernels and copies (with bytes), collectives, waits
and the optimizer update in the order the strategy issues them. The schedule is replayed on
a compute lane and two communication lanes: each compute operation costed by its shape from
the GEMM rates and bandwidths measured on the target GPU (the calibration runs the cluster
description names), each collective by NCCL's cost model over the cluster's NVLink and NIC
tiers; a pipeline's stages (-ppS labels) side by side, each receive waiting for its send.
Each point is written as an HDF5 result in the programs' schema with projected = 1.
docs/projection.md describes the model, its calibration and its validation.

Results are named as slurm/sweep names its measurements, so --out may be a sweep's folder.
An existing result is never replaced without --overwrite (as the programs' --overwrite), and
a measured one (any file but a result of this program, projected = 1: a run, a program's
out-of-memory record, an unreadable file) never, even with it. Every point is projected
before any is published: exit 2 leaves --out as it was. Exit status: 0 written; 2 bad
input (one line), nothing written.
"""
import math
import os
import sys

import h5py
import numpy as np

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import cli  # noqa: E402
import model_shapes  # noqa: E402
import runner  # noqa: E402
import shardbench_h5  # noqa: E402
import strategy_labels  # noqa: E402
from projection_model import (COLLECTIVES, PRECISIONS, ROOT, add_calibration_arguments,  # noqa: E402
                              calibrated, calibration_quality, describe_extrapolation, describe_quality,
                              extrapolations, group_tiers, host_rates, load_cluster, schedule_ops,
                              simulate)

def plan_schedule(program_args, world, limit_gib, binary_dir, host_limit_gib=None):
    """The program's plan and schedule JSON (analysis/runner.py: --plan --schedule-json at
    --world-size world, --mem-limit-gib limit_gib); host_limit_gib: its --host-mem-limit-gib
    (CPU offload: the host memory per GPU of the cluster, [host] memory_gib). A value the
    program refuses is its one line (cli.BadInput)."""
    return runner.schedule(program_args[0], list(program_args[1:]) + runner.limit_flags(world, limit_gib,
                                                                                         host_limit_gib),
                           binary_dir)


def host_limit(cluster, args):
    """--host-mem-limit-gib of a point whose flags offload to the host (the description's
    [host] memory_gib; cli.BadInput, one line, when it has no [host]); None otherwise."""
    if "--cpu-offload" not in args:
        return None
    host_rates(cluster)  # the one-line error naming [host]
    return cluster["host"]["memory_gib"]


def strategy_args(label, cluster, world):
    """The program and flags of a strategy label (analysis/strategy_labels.py)."""
    program, flags, _ = strategy_labels.resolve(label, cluster["gpus_per_node"], world)
    return [program] + flags


def write_events(f, sched, stages):
    """The replayed step as /events (docs/trace-format.md): step 1 of rank 0 (under --pp of
    each stage's first rank), each event on its lane: the schedule row's (0 compute, the
    offload lanes), or the replay's stream of a collective or message
    (projection_model.REPLAY_LANES); and those ranks' /mesh rows; analysis/to_perfetto.py
    draws it."""
    dtype = [("rank", "<i4"), ("step", "<i4"), ("phase", "<i4"), ("op", "<i4"), ("unit", "<i4"), ("lane", "<i4"),
             ("start", "<f8"), ("end", "<f8"), ("bytes", "<i8"), ("flops", "<f8"), ("m", "<i4"), ("n", "<i4"),
             ("k", "<i4"), ("batch", "<i4"), ("trans", "<i4"), ("ranks", "<i4"), ("sent_bytes", "<i8"),
             ("request", "<i8"), ("axis", "<i4")]
    code = {name: i for i, name in enumerate(sched["op_names"])}  # the replay names ops; the file codes them
    rows = np.zeros(sum(len(events) for _, events in stages), dtype=dtype)
    i = 0
    for rank, events in stages:
        for op, phase, unit, lane, start, end, nbytes, flops, axis, ranks, sent in events:
            rows[i] = (rank, 1, phase, code[op], unit, lane, start, end, nbytes, flops, 0, 0, 0, 0, 0, ranks, sent, -1,
                       axis)
            i += 1
    ds = f.create_dataset("events", data=rows)
    ds.attrs["op_names"] = sched["op_names"]
    ds.attrs["phase_names"] = sched["phase_names"]
    ds.attrs["axis_names"] = sched["axis_names"]
    if "unit_names" in sched:
        ds.attrs["unit_names"] = sched["unit_names"]
    mesh = np.zeros(len(stages), dtype=[("rank", "<i4")] + [(a, "<i4") for a in sched["axis_names"]])
    for stage, (rank, _) in enumerate(stages):  # the first rank of each stage: index 0 on every other axis
        mesh[stage]["rank"] = rank
        mesh[stage]["pp"] = stage
    f.create_dataset("mesh", data=mesh)


def spread_range(sched, cluster, sim, fsdp1_gathers):
    """(low, high) step seconds: the replay with every operation one of its calibration's
    spreads faster and slower (simulate's z); the step itself where nothing measured spreads."""
    if not cluster["calibration"]:  # a description as written: nothing measured, nothing spreads
        return sim["time"], sim["time"]
    low, high = (simulate(sched, cluster, fsdp1_gathers=fsdp1_gathers, z=z)["time"] for z in (-1.0, 1.0))
    return min(low, sim["time"]), max(high, sim["time"])


def write_result(path, sched, sim, cluster, args, label):
    """The programs' HDF5 schema (docs/trace-format.md), flagged projected: metadata, the plan
    and, when it fits, the replayed step's /events (no /steps or /memory)."""
    mem = sched["memory"]
    fit = runner.fits(sched)
    with h5py.File(path, "w") as f:
        a = f.attrs
        a["schema_version"] = 4 if "unit_names" in sched else 3  # a schedule from before the units had names
        a["projected"] = 1
        a["program"] = strategy_labels.program(label)
        a["strategy"] = "ddp" if a["program"] == "ddp_perf" else "fsdp"
        a["label"] = sched["label"]
        a["model"] = sched["model"]
        for key in model_shapes.KEYS:  # the shape, so that a run of a shape no preset has is labelled by it
            a[key] = sched[key]
        a["param_count"] = sched["param_count"]
        a["world_size"] = sched["world_size"]
        a["shard_size"] = sched["shard_size"]
        a["tp_size"] = sched["tp_size"]
        a["pp_size"] = sched["pp_size"]
        a["dp_size"] = sched["dp_size"]
        a["micro_batches"] = sched.get("micro_batches", 1)
        a["pp_schedule"] = sched.get("pp_schedule", "1f1b")
        a["grad_accumulation"] = sched.get("grad_accumulation", "unsharded")
        a["pipeline_bubble_theory"] = sched.get("pipeline_bubble_theory", 0.0)
        a["replicas"] = sched["replicas"]
        a["ranks_per_node"] = min(sched["world_size"], cluster["gpus_per_node"])
        a["nodes"] = max(1, math.ceil(sched["world_size"] / cluster["gpus_per_node"]))
        a["batch_per_rank"] = sched["batch_per_rank"]
        a["enc_seq_len"] = sched["enc_seq_len"]
        a["dec_seq_len"] = sched["dec_seq_len"]
        a["activation_checkpointing"] = sched["activation_checkpointing"]
        a["dtype"] = sched["dtype"]
        a["reduce_dtype"] = sched["reduce_dtype"]
        a["backend"] = "projection"
        a["cluster"] = cluster["name"]
        a["calibration"] = "; ".join(cluster["calibration"]) or "none (cluster description as written)"
        quality = calibration_quality(cluster)  # every figure of spread, and which say "disturbed"
        a["calibration_spread"] = "; ".join(describe_quality(q) for q in quality) or "none measured"
        a["calibration_disturbed"] = "; ".join(describe_quality(q) for q in quality if q["disturbed"])
        extra = extrapolations(sched, cluster)  # collectives costed beyond their calibrated sizes or shape
        a["extrapolated_collectives"] = "; ".join(describe_extrapolation(e) for e in extra)
        a["extrapolation_factor"] = max((e["factor"] for e in extra), default=1.0)
        a["compute_model"] = cluster["compute_model"].describe()
        a["status"] = "ok" if fit else "out-of-memory"
        a["cpu_offload"] = sched.get("cpu_offload", "none")
        a["model_flops_per_step"] = sched["model_flops_per_step"]
        a["hardware_flops_per_step"] = sched["hardware_flops_per_step"]
        if fit:
            a["median_step_time_s"] = sim["time"]
            a["median_model_tflops_per_rank"] = sched["model_flops_per_step"] / sim["time"] / 1e12
            a["median_hardware_tflops_per_rank"] = sched["hardware_flops_per_step"] / sim["time"] / 1e12
            a["median_tokens_per_s"] = (sched["batch_per_rank"] * sched["dp_size"] *
                                        (sched["enc_seq_len"] + sched["dec_seq_len"]) / sim["time"])
            a["median_exposed_comm_s"] = sim["exposed"]
            # the range of the step from the calibration's own spread (spread_range)
            a["step_time_low_s"], a["step_time_high_s"] = sim["low"], sim["high"]
            a["step_time_spread"] = (sim["high"] - sim["low"]) / 2 / sim["time"]
            a["idle_share"] = sim["idle_share"]
            a["replay_passes"] = sim["passes"]  # the replay's passes to its tolerance (projection_model)
            a["replay_converged"] = int(sim["converged"])
            a["max_peak_memory_bytes"] = mem["peak_total"]
            a["plan_peak_memory_bytes"] = mem["peak_total"]
            if a["cpu_offload"] != "none":  # the replay's seconds on the host link and the host's update
                a["projected_host_copy_s"] = sim["host_copy"]
                a["projected_host_update_s"] = sim["host_update"]
            write_events(f, sched, sim["stages"])
        g = f.create_group("plan")
        g.attrs["peak_total"] = mem["peak_total"]
        g.attrs["limit"] = mem["limit"]
        g.attrs["fits"] = int(fit)
        for k, v in mem.items():
            if k not in ("peak_total", "limit", "fits"):
                g.attrs["peak_" + k] = v
        p = f.create_group("provenance")
        p.attrs["command_line"] = " ".join([sys.argv[0]] + sys.argv[1:])
        p.attrs["projection"] = f"analysis/project.py over the {cluster['name']} description"


def parse_args(argv):
    ap = cli.parser(__doc__, __file__)
    ap.add_argument("--cluster", required=True,
                    help="cluster description (TOML), e.g. runs/clusters/a100-80gb.toml (docs/projection.md)")
    ap.add_argument("--matrix", metavar="RUNS.toml",
                    help="a run matrix as slurm/sweep reads it (e.g. runs/t5_v1_1.toml): project its points (models "
                         "with their shapes, strategies, GPU counts, batches, sequence lengths, checkpointing, "
                         "dtype), named as the sweep names its results, instead of --model and the flags of the sweep "
                         "below; memory per GPU is the cluster description's (default: none)")
    ap.add_argument("--model", action="append",
                    help="model preset as the programs name it (t5-611m, t5-2.28b, t5-11.3b, t5-small, t5-tiny, "
                         "t5-v1_1-small ... t5-v1_1-xxl, flan-t5-small ... flan-t5-xxl; `fsdp_perf --list-models`); "
                         "repeat for several (default: none; required without --matrix)")
    ap.add_argument("--strategies", default="ddp,fsdp-full,fsdp-hybrid,fsdp-none",
                    help="comma-separated strategy labels as the programs print them: ddp, fsdp-full, "
                         "fsdp-hybridG (shard groups of G ranks; fsdp-hybrid: G = GPUs per node), fsdp-none, "
                         "fsdp-grad-op, fsdp-optimizer-state (ZeRO-1; fsdp-optimizer-stateG: in groups of G), each "
                         "optionally with -tp<N> and -pp<S> (tensor parallelism, pipeline stages: "
                         "fsdp-full-tp2, ddp-tp2-pp4) (default: %(default)s)")
    ap.add_argument("--gpus", default="8,16,32,64,128,256,512", help="comma-separated GPU counts (world sizes) (default: %(default)s)")
    # The programs' shape flags, passed to every --model's plan as they are (the program checks
    # them: a bad value is its one line, exit 2).
    ap.add_argument("--layers", default=None,
                    help="override the preset's layers per stack (as the programs' --layers), e.g. 4 for the "
                         "t5-11.3b 4+4 calibration run (default: the preset's)")
    for key, flag, kind in model_shapes.SHAPE_KEYS:
        if key == "layers":
            continue
        what = {"ffn": "feed-forward block: relu | gated-gelu", "tie_embeddings": "yes | no: the LM head is the "
                "shared embedding, or a matrix of its own"}.get(key, f"override the preset's {key} (an integer)")
        ap.add_argument(flag, dest=key, default=None, help=f"{what}, as the programs' {flag} (default: the preset's)")
    ap.add_argument("--batch", default="8", help="comma-separated per-GPU batch sizes (sequences per rank) (default: %(default)s)")
    ap.add_argument("--batch-per", choices=("rank", "gpu"), default="rank",
                    help="--batch is per data-parallel rank (the programs' --batch), or per GPU: batch x N x S per "
                         "data-parallel rank of a -tpN-ppS label, every layout of a GPU count training the same "
                         "global batch (default: %(default)s)")
    ap.add_argument("--seq-len", type=int, default=512, help="encoder tokens per sequence (default: %(default)s)")
    ap.add_argument("--dec-seq-len", type=int, default=None, help="decoder tokens per sequence (default: --seq-len)")
    ap.add_argument("--activation-checkpointing", action="store_true",
                    help="recompute each block's forward in backward")
    ap.add_argument("--micro-batches", type=int, default=None,
                    help="micro-batches per step of a data-parallel rank for the -pp<S> labels, as the programs' "
                         "--micro-batches (must divide --batch) (default: the programs', S)")
    ap.add_argument("--grad-accumulation", choices=("unsharded", "sharded"), default=None,
                    help="how the fsdp labels accumulate gradients over --micro-batches, as fsdp_perf's "
                         "--grad-accumulation: unsharded (held to the last micro-batch) or sharded (reduce-scattered "
                         "after each) (default: fsdp_perf's, unsharded)")
    ap.add_argument("--pp-schedule", choices=("gpipe", "1f1b"), default=None,
                    help="pipeline schedule of the -pp<S> labels, as the programs' --pp-schedule (default: theirs, 1f1b)")
    ap.add_argument("--reduce-dtype", choices=PRECISIONS, default=None,
                    help="gradient reductions (default: the cluster description's dtype, which the steps compute in)")
    ap.add_argument("--all-gathers", choices=("fsdp1", "program"), default="fsdp1",
                    help="FSDP all-gather timing: fsdp1 = as PyTorch FSDP1 (the published study) runs them, "
                         "overlapping the compute issued before them, at most two gathered units in flight "
                         "(rate limiter); program = as the schedule's program issues them, after that compute "
                         "(default: %(default)s)")
    add_calibration_arguments(ap)
    ap.add_argument("--collective-sizes", action="store_true",
                    help="print the sizes (bytes, smallest and largest) of the collectives each point issues, by "
                         "operation, and the smallest and largest of all (the last line: 'sizes MIN MAX'), as a "
                         "calibration must measure them (docs/projection.md); writes nothing")
    ap.add_argument("--bin", default=None, help="folder of ddp_perf and fsdp_perf (default: build/bin of this checkout)")
    ap.add_argument("--out", help="directory for one projected HDF5 result per point (required unless "
                                  "--collective-sizes) (default: none)")
    ap.add_argument("--overwrite", action="store_true",
                    help="replace existing projected results in --out (measured results are never replaced)")
    return ap.parse_args(argv)


def setup(a):
    """The cluster with its calibration applied, and the GPU counts and batches."""
    if bool(a.matrix) == bool(a.model):
        raise cli.BadInput("give --model (one or more) or --matrix, not both" if a.matrix else
                              "give --model (one or more), or --matrix RUNS.toml")
    if not a.out and not a.collective_sizes:
        raise cli.BadInput("--out is required (a folder for the results), unless --collective-sizes")
    cluster = calibrated(a)
    if a.seq_len <= 0 or (a.dec_seq_len is not None and a.dec_seq_len <= 0):
        raise cli.BadInput("--seq-len and --dec-seq-len must be positive")
    for label in a.strategies.split(","):
        try:
            strategy_labels.check(label, runner.offload_rule(a.bin))
        except cli.BadInput as e:
            raise cli.BadInput(f"--strategies: {e}")
    gpus, batches = cli.positive_list(a.gpus, "--gpus"), cli.positive_list(a.batch, "--batch")
    for model in a.model or []:  # the program judges the model and its shape flags before anything is printed
        plan_schedule(["fsdp_perf"] + model_shapes.flags(runner.model_entry(a, model)) + ["--batch", "1", "--seq-len",
                                                                                        "1"], 1,
                      cluster["gpu_memory_gib"], runner.bin_dir(a.bin))
    return cluster, gpus, batches


def point_schedule(cluster, model, label, batch, n, seq_len, checkpointing=False, binary_dir=None, layers=None,
                   dec_seq_len=None, reduce_dtype=None):
    """The program's plan and schedule of one point (its --plan --schedule-json). model: a
    preset name or a model entry {"model": preset, shape key: value, ...} (model_shapes)."""
    entry = dict(model) if isinstance(model, dict) else {"model": model}
    if layers is not None:
        entry["layers"] = layers
    program, flags = runner.layout_flags(label, n, cluster["gpus_per_node"], batch, entry, seq_len, cluster["dtype"],
                                         dec_seq_len, reduce_dtype, checkpointing=checkpointing)
    return plan_schedule([program] + flags, n, cluster["gpu_memory_gib"], runner.bin_dir(binary_dir),
                         host_limit(cluster, flags))


def load_matrix(path):
    """A run matrix as slurm/sweep reads and checks it (its loader, one schema for both)."""
    import importlib.machinery
    import importlib.util
    loader = importlib.machinery.SourceFileLoader("sweep", os.path.join(ROOT, "slurm", "sweep"))
    sweep = importlib.util.module_from_spec(importlib.util.spec_from_loader("sweep", loader))
    loader.exec_module(sweep)
    try:
        return sweep, sweep.load_matrix(path, {})
    except (sweep.InputError, sweep.CommandError) as e:
        raise cli.BadInput(str(e))


def points_to_project(a, cluster, gpus, batches):
    """[(model tag, result name, strategy label, the label the program prints, batch, GPUs,
    program and flags)] of the command line's sweep, or of the run matrix's points (--matrix:
    named as slurm/sweep names their results). Names hold the label the program prints."""
    if a.matrix:
        sweep, cfg = load_matrix(a.matrix)
        m = cfg["matrix"]
        if m["dtype"] != cluster["dtype"]:
            raise cli.BadInput(f"{a.matrix}: [matrix] dtype {m['dtype']} is not the cluster description's "
                                  f"{cluster['dtype']} (its rates are for {cluster['dtype']})")
        return [(p.model, p.name, p.strategy, p.label, p.batch, p.gpus, [p.program] + list(p.args))
                for p in sweep.points(cfg)]
    out = []
    for model in a.model:
        entry = runner.model_entry(a, model)
        for label in a.strategies.split(","):
            pipeline = strategy_labels.pipeline_stages(label) > 1
            fsdp = strategy_labels.program(label) == "fsdp_perf"
            for batch in batches:
                for n in gpus:
                    per_rank = strategy_labels.batch_per_rank(label, batch, a.batch_per)
                    program, flags = runner.layout_flags(
                        label, n, cluster["gpus_per_node"], per_rank, entry, a.seq_len, cluster["dtype"],
                        a.dec_seq_len, a.reduce_dtype, micro_batches=a.micro_batches if pipeline else None,
                        pp_schedule=a.pp_schedule if pipeline else None, checkpointing=a.activation_checkpointing,
                        grad_accumulation=a.grad_accumulation if fsdp else None)
                    args = [program] + flags
                    # the preset, or the preset and its overrides, then the label the program prints
                    tag = model_shapes.tag(entry)
                    printed = strategy_labels.resolve(label, cluster["gpus_per_node"], n)[2]
                    out.append((tag, f"{tag}-{printed}-g{n}-b{per_rank}-s{a.seq_len}", label, printed, per_rank, n,
                                args))
    return out


def check_out(a, todo):
    """cli.BadInput unless every point can be written to --out: a folder this program
    can make or fill, one result name per point, and no result there to keep (any without
    --overwrite; a measured one, or one that cannot be read, ever). Creates nothing."""
    cli.check_output_dir(a.out, "--out")
    names = [name for _, name, *_ in todo]
    twice = sorted({x for x in names if names.count(x) > 1})
    if twice:
        raise cli.BadInput(f"two points would write the same result {twice[0]}.h5 (a value given twice, or two "
                              "strategy labels of one layout): give each once")
    paths = [os.path.join(a.out, name + ".h5") for name in names]
    there = [p for p in paths if os.path.lexists(p)]
    if not there:
        return
    mine = projected_results(there)
    kept = [p for p in there if p not in mine]
    if kept:
        more = f" (and {len(kept) - 1} more)" if len(kept) > 1 else ""
        raise cli.BadInput(f"--out '{a.out}': {os.path.basename(kept[0])}{more} is not a projected result (a "
                              "measurement, a program's record, or unreadable): never replaced, even with "
                              "--overwrite; choose another --out")
    if not a.overwrite:
        more = f" (and {len(there) - 1} more of the {len(paths)} results)" if len(there) > 1 else ""
        raise cli.BadInput(f"--out '{a.out}': {os.path.basename(there[0])}{more} exists (pass --overwrite to "
                              "replace projected results, or choose another --out)")


def projected_results(paths):
    """The paths that are readable results of this program (projected = 1). Each is read in
    a child process first (shardbench_h5.probe): a damaged file can crash the HDF5 library."""
    files = [p for p in paths if os.path.isfile(p)]
    readable = [p for p, (status, _) in shardbench_h5.probe(files).items() if status is not None] if files else []
    out = set()
    for p in readable:
        try:
            if shardbench_h5.read_meta(p).get("projected", 0):
                out.add(p)
        except shardbench_h5.READ_ERRORS:
            pass
    return out


def publish(staged, overwrite):
    """Gives each staged result (temporary, final path) its name. Without --overwrite a
    name is taken only if still free (os.link fails on an existing one, as the programs'
    no-clobber publish); with it, only a projected result is replaced, checked again here:
    a sweep's job may have written its measurement meanwhile."""
    replaceable = projected_results([path for _, path in staged]) if overwrite else set()
    for tmp, path in staged:
        if overwrite and os.path.lexists(path):
            if path not in replaceable:
                raise cli.BadInput(f"{path} is now a measured result (written while this ran): not replaced")
            os.replace(tmp, path)
            continue
        try:
            os.link(tmp, path)
        except FileExistsError:
            raise cli.BadInput(f"{path} was written by another program while this ran: not replaced")
        os.remove(tmp)


def main(argv=None):
    a = parse_args(argv)
    try:
        cluster, gpus, batches = setup(a)
        todo = points_to_project(a, cluster, gpus, batches)
        if a.collective_sizes:
            return print_sizes(cluster, todo, runner.bin_dir(a.bin))
        check_out(a, todo)
    except (cli.BadInput, OSError, KeyError) as e:
        print(f"project: error: {e}", file=sys.stderr)
        return 2
    made = []  # the folders this run created: removed again when it writes nothing
    folder = os.path.abspath(a.out)
    while not os.path.isdir(folder):
        made.append(folder)
        folder = os.path.dirname(folder)
    staged = []  # (temporary, final path): every point is projected before any is published
    try:
        if not project_all(a, cluster, todo, staged):
            return 2
        publish(staged, a.overwrite)
    except (cli.BadInput, OSError) as e:
        print(f"project: error: {e}", file=sys.stderr)
        return 2
    finally:
        for tmp, _ in staged:
            if os.path.lexists(tmp):
                os.remove(tmp)
        for d in made:  # innermost first; only if still empty (nothing published)
            if os.path.isdir(d) and not os.listdir(d):
                os.rmdir(d)
    print(f"project: wrote {len(staged)} result(s) in {a.out}/")
    return 0


def print_sizes(cluster, todo, bin_dir):
    """--collective-sizes: each point's collectives by operation (the smallest and largest
    buffer of each, nccl-tests' size), then 'sizes MIN MAX' over every point."""
    lo, hi = math.inf, 0
    for _, name, _, _, _, n, args in todo:
        sched = plan_schedule(args, n, cluster["gpu_memory_gib"], bin_dir, host_limit(cluster, args))
        stages = [st["ops"] for st in sched["stages"]] if sched.get("pp_size", 1) > 1 else [sched["ops"]]
        sizes, tiers = {}, group_tiers(sched, cluster)
        for rows in stages:
            for op, _, _, nbytes, _, _, _, axis, *_ in schedule_ops(sched, rows):
                if op in COLLECTIVES and nbytes > 0 and tiers[axis][0] > 1:  # a group of one rank sends nothing
                    sizes.setdefault(op, []).append(nbytes)
        each = ", ".join(f"{op} {min(v)}-{max(v)}" for op, v in sorted(sizes.items()))
        print(f"{name}: {each or 'no collectives'}")
        for v in sizes.values():
            lo, hi = min(lo, min(v)), max(hi, max(v))
    if hi == 0:
        raise cli.BadInput("no point issues a collective (one rank?): nothing to calibrate")
    print(f"sizes {lo} {hi}")
    return 0


def project_all(a, cluster, todo, staged):
    """Projects every point of todo into a temporary file beside its result (staged);
    False after printing the error of a point that cannot be projected."""
    print(f"cluster {cluster['name']}: compute {cluster['compute_model'].describe()}")
    for q in calibration_quality(cluster):  # each figure of spread; a disturbed one says so
        print(("calibration DISTURBED: " if q["disturbed"] else "calibration spread: ") + describe_quality(q))
    width = max(10, *(len(tag) for tag, *_ in todo))
    lwidth = max(13, *(len(printed) for _, _, _, printed, *_ in todo))
    print(f"{'model':<{width}} {'strategy':<{lwidth}} {'GPUs':>5} {'batch':>5} {'step ms':>10} {'TFLOPS/GPU':>11} "
          f"{'± %':>6} {'exposed ms':>10} {'idle %':>6} {'peak GiB':>9}  status")
    bin_dir = runner.bin_dir(a.bin)
    for model, name, label, printed, batch, n, args in todo:
        try:
            sched = plan_schedule(args, n, cluster["gpu_memory_gib"], bin_dir, host_limit(cluster, args))
            fit = runner.fits(sched)  # a point that does not fit (GPU or host memory) is recorded, not replayed
            fsdp = strategy_labels.program(label) == "fsdp_perf"
            gathers = a.all_gathers == "fsdp1" and fsdp
            sim = simulate(sched, cluster, fsdp1_gathers=gathers) if fit else None
            if fit:
                sim["low"], sim["high"] = spread_range(sched, cluster, sim, gathers)
        except cli.BadInput as e:
            print(f"project: error: {e}", file=sys.stderr)
            return False
        if sched["label"] != printed:  # the name was made before the plan ran (strategy_labels.resolve)
            print(f"project: error: {name}: the program labels this point {sched['label']}, not {printed}",
                  file=sys.stderr)
            return False
        os.makedirs(a.out, exist_ok=True)  # now that there is something to write
        path = os.path.join(a.out, name + ".h5")
        tmp = f"{path}.tmp-{os.getpid()}"
        staged.append((tmp, path))
        write_result(tmp, sched, sim, cluster, a, label)
        nan = float("nan")
        print(f"{model:<{width}} {sched['label']:<{lwidth}} {n:>5} {batch:>5} "
              f"{sim['time'] * 1e3 if fit else nan:>10.2f} "
              f"{sched['model_flops_per_step'] / sim['time'] / 1e12 if fit else nan:>11.2f} "
              f"{(sim['high'] - sim['low']) / 2 / sim['time'] * 100 if fit else nan:>6.1f} "
              f"{sim['exposed'] * 1e3 if fit else nan:>10.2f} "
              f"{sim['idle_share'] * 100 if fit else nan:>6.1f} "
              f"{sched['memory']['peak_total'] / 2**30:>9.2f}  {'ok' if fit else 'out-of-memory'}"
              + (f"  host copies {sim['host_copy'] * 1e3:.1f} ms, update {sim['host_update'] * 1e3:.1f} ms"
                 if fit and sched.get("cpu_offload", "none") != "none" else "")
              + (f"  (host {sched['memory']['host_peak_total'] / 2**30:.1f} GiB)"
                 if not sched["memory"].get("host_fits", True) else ""))
        for e in extrapolations(sched, cluster):
            print(f"  extrapolated: {describe_extrapolation(e)}")
    return True


if __name__ == "__main__":
    sys.exit(cli.run(__file__, main))
