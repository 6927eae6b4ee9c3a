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
--plan-batch mode where the programs have it, else one --plan --schedule-json per layout;
analysis/runner.py runs them).
Each layout is ranked by a fast estimate from its plan's totals (GEMM FLOPs, bytes, the
collectives' bytes per mesh axis, stages, micro-batches) at the calibration's rates
(analysis/projection_model.py: the compute model, collective_time); the top --replay layouts
are then replayed in full (projection_model.simulate, as analysis/project.py) and both are
printed. docs/projection.md ("The layout advisor") gives the estimate's error against the
full replay, and the projection's own validation.

A layout is named LABEL[:mbM:SCHEDULE][:ckpt]: the strategy label as the programs print it
and slurm/sweep reads it (analysis/strategy_labels.py: fsdp-full-tp2-pp4-offload-optimizer),
the micro-batches and pipeline schedule of a -ppS label, and activation checkpointing.

Exit status: 0 done; 2 bad input (one line), nothing written; 3 no layout of the question fits
(or the program refuses every one: one line saying how many of each), nothing written; 130
interrupted (SIGINT), 143 terminated (SIGTERM), the plan processes and workers ended with it.
The outputs (--out's files, --emit-matrix's) are published together at the end, or none: an
existing one is replaced only with --overwrite.
"""
import concurrent.futures
import os
import sys
import time

EXIT_NO_LAYOUT = 3  # as the programs' exit 3: the question does not fit
# A pipeline's full replay costs in proportion to its ops, micro-batches x stages x units: 16
# stages of 125 micro-batches (t5-11.3b) take ~15 s of a core where 4 x 32 take ~2. Layouts
# above this bound are ranked by the estimate alone, and the advisor says which.
REPLAY_MAX_MB_STAGES = 512

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import cli  # noqa: E402
import model_shapes  # noqa: E402
import runner  # noqa: E402
from advise_estimate import digest, estimate  # noqa: E402
from advise_layouts import (BASES, MAX_GPUS, Layout, batch_openings, divisors, enumerate_layouts,  # noqa: E402,F401
                            parse_name)
from advise_outputs import (calibration_line, draw, emit_matrix, explain, print_replay, print_table, recommend,  # noqa: E402
                            run_command, write_csv)
from projection_model import add_calibration_arguments, calibrated, calibrated_from, simulate  # noqa: E402


# ---------------------------------------------------------------- command line

def parse_args(argv):
    ap = cli.parser(__doc__, __file__)
    ap.add_argument("--cluster", required=True, help="cluster description (TOML), e.g. runs/clusters/a100-80gb.toml")
    ap.add_argument("--model", required=True, help="model preset as the programs name it (fsdp_perf --list-models)")
    ap.add_argument("--layers", default=None, help="override the preset's layers per stack (default: the preset's)")
    for key, flag, _ in model_shapes.SHAPE_KEYS:
        if key != "layers":
            ap.add_argument(flag, dest=key, default=None, help=f"as the programs' {flag} (default: the preset's)")
    ap.add_argument("--gpus", type=int, required=True, help=f"GPUs (world size, 1 to {MAX_GPUS} as the programs' "
                    "--world-size)")
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
    ap.add_argument("--jobs", type=int, default=2, help="plan processes at once without --plan-batch, and full "
                    "replays at once: 1 to this machine's CPUs (default: %(default)s)")
    ap.add_argument("--explain", metavar="LAYOUT", default=None,
                    help="print where one layout's step goes (LABEL[:mbM:SCHEDULE][:ckpt]) instead of ranking "
                         "(default: rank every layout)")
    ap.add_argument("--emit-matrix", metavar="FILE.toml", default=None,
                    help="write a run matrix for slurm/sweep of the recommended layout, or with --emit-top N of "
                         "the top N replayed (one file per setting of micro-batches, schedule, checkpointing and "
                         "batch a matrix holds once: FILE-2.toml ...) (default: none)")
    ap.add_argument("--emit-top", type=int, default=1, metavar="N",
                    help="--emit-matrix: the top N layouts of the full replay, fastest first (default: 1, the "
                         "recommended one)")
    add_calibration_arguments(ap)
    ap.add_argument("--bin", default=None, help="folder of ddp_perf and fsdp_perf (default: build/bin of this "
                    "checkout)")
    ap.add_argument("--out", default=None, help="folder for advise.png/.svg and advise.csv (default: none: the "
                    "ranking, the recommendation and the command to run it are printed only)")
    ap.add_argument("--overwrite", action="store_true", help="write into a non-empty --out, replace an existing "
                    "--emit-matrix file")
    return ap.parse_args(argv)


def check_args(a):
    for name in ("gpus", "global_batch", "seq_len"):
        if getattr(a, name) <= 0:
            raise cli.BadInput(f"--{name.replace('_', '-')} must be positive")
    if a.gpus > MAX_GPUS:
        raise cli.BadInput(f"--gpus {a.gpus} is not allowed (allowed: 1 to {MAX_GPUS}, the programs' --world-size)")
    if a.dec_seq_len is not None and a.dec_seq_len <= 0:
        raise cli.BadInput("--dec-seq-len must be positive")
    if a.emit_top < 1 or a.emit_top > max(1, a.replay):
        raise cli.BadInput(f"--emit-top {a.emit_top} is not allowed (an integer from 1 to --replay {a.replay})")
    if a.replay < 0 or a.top <= 0:
        raise cli.BadInput("--replay must be >= 0, --top positive")
    cpus = os.cpu_count() or 1
    if not 1 <= a.jobs <= cpus:  # each job is a process (and a program's): more than the CPUs only queue
        raise cli.BadInput(f"--jobs {a.jobs} is not allowed (allowed: 1 to {cpus}, this machine's CPUs)")
    bases = a.strategies.split(",")
    for b in bases:
        if b not in BASES:
            raise cli.BadInput(f"--strategies: unknown strategy '{b}' (allowed: {', '.join(BASES)})")
    for flag in ("tp", "pp"):
        v = getattr(a, flag)
        if v is not None:
            setattr(a, flag, cli.positive_list(v, f"--{flag}"))
    if a.explain is None and a.out:
        cli.check_output_dir(a.out, "--out")
        if os.path.isdir(a.out) and os.listdir(a.out) and not a.overwrite:
            raise cli.BadInput(f"--out '{a.out}' is not empty (pass --overwrite, or choose another --out)")
    if a.emit_matrix:
        cli.check_output_file(a.emit_matrix, "--emit-matrix", ("toml",))
        cli.refuse_existing(a.emit_matrix, "--emit-matrix", a.overwrite)
    return bases


def check_question(a, cluster, rule):
    """The checks that need the description (and the programs' offload rule), before any
    plan: --explain's layout (its name, and [host] for an offload one), --emit-matrix's
    whole nodes. The Layout to explain, or None."""
    if a.emit_matrix and a.gpus % cluster["gpus_per_node"]:
        raise cli.BadInput(f"--emit-matrix: --gpus {a.gpus} is not a multiple of the description's gpus_per_node "
                           f"{cluster['gpus_per_node']} (slurm/sweep runs whole nodes)")
    if a.explain is None:
        return None
    lay = parse_name(a.explain, a.gpus, a.global_batch, rule)
    if lay.offload != "none" and not isinstance(cluster.get("host"), dict):
        raise cli.BadInput(f"--explain '{a.explain}': CPU offload needs the description's [host] table (host memory "
                           f"and rates), which {a.cluster} has not")
    return lay


def main(argv=None):
    a = parse_args(argv)
    try:
        bases = check_args(a)
        cluster = calibrated(a)
        bin_dir = a.bin or runner.bin_dir()
        use_batch = runner.capabilities(bin_dir)["plan_batch"]
        offload = not a.no_offload and isinstance(cluster.get("host"), dict)
        lay = check_question(a, cluster, runner.offload_rule(bin_dir))
        if lay is not None:
            return explain(a, cluster, bin_dir, lay)
        return rank(a, cluster, bin_dir, use_batch, bases, offload)
    except cli.BadInput as e:
        print(f"advise: error: {e}", file=sys.stderr)
        return 2
    except NoLayout as e:
        print(f"advise: {e}", file=sys.stderr)
        return EXIT_NO_LAYOUT


# ---------------------------------------------------------------- ranking

class NoLayout(Exception):
    """No layout of the question fits: one line saying why (exit EXIT_NO_LAYOUT)."""


def model_blocks(a, cluster, bin_dir):
    """2 x layers of the model (its plan's shape)."""
    lay = Layout("fsdp-full", 1, 1, 1, 1, "1f1b", False, 1)
    return 2 * int(runner.schedule(*lay.request(a, cluster, 1), bin_dir)["layers"])


def probe_tp_simple(a, cluster, bin_dir, world):
    """{tp: True or why not}: one tiny plan per tensor degree (the program checks heads, d_ff
    and vocab; its exit 2 is trusted)."""
    out = {}
    for tp in [t for t in divisors(world) if t <= cluster["gpus_per_node"] and (not getattr(a, "tp", None) or
                                                                           t in a.tp)]:
        lay = Layout("fsdp-full" + (f"-tp{tp}" if tp > 1 else ""), tp, 1, 1, 1, "1f1b", False, 1)
        code, r = runner.plan(*lay.request(a, cluster, tp), bin_dir)
        if code == 1:
            raise cli.BadInput(r)
        out[tp] = True if code in (0, 3) else f"refused by the program: {r}"
    return out


def plan_all(a, cluster, bin_dir, use_batch, layouts):
    """[(exit, digest or line)] of every layout's plan (runner.plans: the totals alone)."""
    reqs = [lay.request(a, cluster, a.gpus) for lay in layouts]
    return runner.plans(reqs, bin_dir, reduce=digest, full=False, jobs=a.jobs, use_batch=use_batch)


def say_batch(a, cluster, blocks, tp_ok, n_layouts, bases, offload, rule):
    """One line, before any plan: the data-parallel degrees the global batch excludes and the
    nearest global batches that open them, with their layouts' counts."""
    gpn = cluster["gpus_per_node"]
    shut, below, above = batch_openings(a.gpus, a.global_batch, blocks, gpn, tp_ok, a.tp, a.pp)
    if not shut:
        return
    opens = []
    for b in (below, above):
        if b:
            n = len(enumerate_layouts(a.gpus, b, blocks, gpn, tp_ok, bases, offload, tps=a.tp, pps=a.pp,
                                      offload_rule=rule)[0])
            opens.append(f"{b} ({n} layouts)")
    print(f"advise: global batch {a.global_batch} does not divide over {', '.join(map(str, shut))} data-parallel "
          f"ranks: those layouts are excluded ({n_layouts} left); global batch {' or '.join(opens)} opens every "
          "one", flush=True)


def rank(a, cluster, bin_dir, use_batch, bases, offload):
    t0 = time.time()
    blocks = model_blocks(a, cluster, bin_dir)
    tp_res = probe_tp_simple(a, cluster, bin_dir, a.gpus)
    rule = runner.offload_rule(bin_dir)
    layouts, excluded = enumerate_layouts(a.gpus, a.global_batch, blocks, cluster["gpus_per_node"],
                                          lambda tp: tp_res[tp], bases, offload, tps=a.tp, pps=a.pp,
                                          offload_rule=rule)
    print(f"advise: {a.model} on {a.gpus} GPUs of {cluster['name']}, global batch {a.global_batch} x "
          f"{a.seq_len}{'+' + str(a.dec_seq_len) if a.dec_seq_len else ''} tokens: {len(layouts)} layouts "
          f"({'--plan-batch' if use_batch else 'one --plan per layout'})")
    say_batch(a, cluster, blocks, lambda tp: tp_res[tp], len(layouts), bases, offload, rule)
    print(calibration_line(cluster, a), flush=True)
    results = plan_all(a, cluster, bin_dir, use_batch, layouts)
    t_plan = time.time() - t0
    ranked, oom, refused = [], [], []
    for lay, (code, d) in zip(layouts, results):
        if code == 1:
            raise cli.BadInput(d)
        if code == 2:
            refused.append((lay, d))
            continue
        if not runner.fits(d):
            oom.append((lay, d))
            continue
        est = estimate(d, cluster)
        ranked.append((lay, d, est))
    ranked.sort(key=lambda x: x[2]["time"])
    if not ranked:  # nothing to rank, draw or emit: say why, write nothing
        raise NoLayout(f"no layout fits: of {len(layouts)} layouts planned, {len(oom)} do not fit (device or host "
                       f"memory) and {len(refused)} are refused by the program; {len(excluded)} tensor x pipeline "
                       "degrees excluded before any plan (nothing written)")
    t_est = time.time() - t0
    print(f"advise: {len(layouts)} layouts planned and estimated in {t_est:.1f} s: {len(ranked)} fit", flush=True)
    print_table(ranked, a.top)  # the ranking by the estimate, before the replay
    # the full replay of the top layouts, each printed as it ends; a pipeline above the bound is not replayed
    top = [x for x in ranked[:a.replay] if x[0].mb * x[0].pp <= REPLAY_MAX_MB_STAGES]
    capped = [x[0] for x in ranked[:a.replay] if x[0].mb * x[0].pp > REPLAY_MAX_MB_STAGES]
    if capped:
        print(f"\nnot replayed ({len(capped)} of the top {min(a.replay, len(ranked))}: micro-batches x stages above "
              f"{REPLAY_MAX_MB_STAGES}, ranked by the estimate alone): {', '.join(x.name for x in capped)}")
    if top:
        print(f"\nfull replay of the top {len(top)} (as each ends):")
    replayed = {}
    for (lay, d, est), sim in zip(top, replay_all((a.cluster, tuple(a.calibrate_run), tuple(a.calibrate_collectives)),
                                                  [lay.request(a, cluster, a.gpus) for lay, _, _ in top], bin_dir,
                                                  use_batch, a.jobs)):
        replayed[lay.name] = sim
        print_replay(len(replayed), len(top), lay, d, est, sim)
    t_all = time.time() - t0
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
    unrun = list(dict.fromkeys(part for lay, _, _ in ranked[:a.top] for part in lay.unrun))
    if unrun:
        print(f"  * {', '.join(unrun)}: compiled and tested on the CPU backend, not yet run on the CUDA backend across "
              "GPUs (the GPU ledger, docs/gpu.md)")
    if replayed:
        winner_est = ranked[0][0].name
        winner_full = min(replayed, key=lambda n: replayed[n]["time"])
        print(f"\nfastest by the estimate: {winner_est}; by the full replay of the top {len(top)}: {winner_full}")
    pick, lines = recommend(a, cluster, ranked, replayed, capped)
    print("\n" + "\n".join(lines))
    n = len(layouts)
    print(f"time: {n} layouts planned and estimated in {t_est:.1f} s ({n / t_est:.0f} layouts/s; plans {t_plan:.1f} s), "
          f"top {len(top)} replayed in full{f' ({len(capped)} above the bound: not replayed)' if capped else ''}, "
          f"{t_all:.1f} s in all")
    # every output written under a temporary name, then published together (cli.Outputs)
    matrices = []
    if a.out or a.emit_matrix:
        with cli.Outputs(a.overwrite) as out:
            if a.out:
                csv_path, png = os.path.join(a.out, "advise.csv"), os.path.join(a.out, "advise.png")
                out.makedirs(a.out)
                write_csv(out.temp(csv_path), ranked, oom, replayed)
                draw(ranked, replayed, out.temp(png), out.temp(os.path.join(a.out, "advise.svg")),
                     f"{a.model} on {a.gpus} GPUs of {cluster['name']}, global batch {a.global_batch}")
            emitted = [pick] + [lay for lay, _, _ in sorted(top, key=lambda x: replayed[x[0].name]["time"])
                                if lay is not pick][:a.emit_top - 1]
            matrices = emit_matrix(a, cluster, emitted) if a.emit_matrix else []
            for path, text in matrices:
                with out.open(path) as f:
                    f.write(text)
            out.publish()
        if a.out:
            print(f"advise: wrote {png} (+ .svg), {csv_path}")
    if len(matrices) > 1:
        print(f"advise: the top layouts differ in a setting one matrix holds once (micro-batches, schedule, "
              f"checkpointing, batch): {len(matrices)} matrices")
    for path, _ in matrices:
        print(f"advise: wrote {path}")
    print(f"next: {run_command(a, cluster, pick)}")
    for path, _ in matrices:
        print(f"      slurm/sweep {path} --dry-run    # then without --dry-run: the top layouts as Slurm jobs")
    return 0


_CLUSTERS = {}


def _replay_job(job):
    """A worker's full replay of one layout (its plan with every op, then simulate): the
    replay's figures, without its timeline."""
    cluster_args, request, bin_dir, use_batch = job  # (path, calibration runs, collective results)
    if cluster_args not in _CLUSTERS:
        _CLUSTERS[cluster_args] = calibrated_from(*cluster_args)
    code, sched = runner.plans([request], bin_dir, full=True, use_batch=use_batch)[0]
    if code not in (0, 3):
        raise cli.BadInput(sched)
    sim = simulate(sched, _CLUSTERS[cluster_args])
    return {k: sim[k] for k in ("time", "compute", "communication", "exposed", "idle_share", "host_copy",
                                "host_update", "passes", "converged")}


def replay_all(cluster_args, requests, bin_dir, use_batch, jobs):
    """The full replays of the top layouts, `jobs` at once (each re-plans its layout with
    every op: the ranking kept only digests), yielded in order as they end; cluster_args:
    calibrated_from's."""
    work = [(cluster_args, r, bin_dir, use_batch) for r in requests]
    if jobs <= 1 or len(work) < 2:
        yield from map(_replay_job, work)
        return
    with concurrent.futures.ProcessPoolExecutor(min(jobs, len(work))) as pool:  # no idle workers
        yield from pool.map(_replay_job, work)  # in order, each as soon as it and those before it end


if __name__ == "__main__":
    sys.exit(cli.run(__file__, main))
