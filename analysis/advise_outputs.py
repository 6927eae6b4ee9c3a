"""The layout advisor's outputs (analysis/advise.py): the printed table, advise.csv, the
figure of throughput against memory per GPU (Pareto front), the run matrices for slurm/sweep
(--emit-matrix), and --explain's account of one layout's step (the fast estimate beside the
full replay).
"""
import csv
import math
import os
import re

import cli
import model_shapes
import runner
import shardbench_h5
import strategy_labels
from advise_estimate import digest, estimate, figures
from projection_model import ROOT, collective_time, group_tiers, simulate

VALIDATION = "docs/projection.md#validation"


def print_table(ranked, top):
    """The ranking by the fast estimate, printed before the replay (each replay is its own line
    as it ends, print_replay): every figure here is the estimate's, none missing."""
    print(f"\n{'#':>3} {'layout':<46} {'est ms':>8} {'TFLOPS/GPU':>10} {'tokens/s':>9} "
          f"{'GiB/GPU':>7} {'bubble%':>7} {'dp ms':>7} {'tp ms':>7} {'pp ms':>6}")
    for i, (lay, d, est) in enumerate(ranked[:top]):
        tf, tok = figures(d, est["time"])
        e = est["exposed"]
        print(f"{i + 1:>3} {lay.name + (' *' if lay.unverified else ''):<46} {est['time'] * 1e3:>8.1f} {tf:>10.1f} "
              f"{tok:>9.0f} {d['memory']['peak_total'] / 2**30:>7.2f} {est['bubble'] * 100:>7.1f} "
              f"{e['dp'] * 1e3:>7.1f} {e['tp'] * 1e3:>7.1f} {e['pp'] * 1e3:>6.1f}")
    print("(the fast estimate, which ranks; the full replay of the top layouts follows, one line each; bubble: "
          "the estimate's idle share; exposed communication by axis (dp, tp, pipeline messages); *: not yet run "
          "on the CUDA backend)")


def print_replay(k, n, lay, d, est, sim):
    """One replayed layout as its replay ends (k of n): the replay's step beside the estimate's."""
    tf, tok = figures(d, sim["time"])
    print(f"  replay {k}/{n} {lay.name + (' *' if lay.unverified else ''):<46} {sim['time'] * 1e3:>9.1f} ms "
          f"(est {est['time'] * 1e3:.1f}, {(est['time'] / sim['time'] - 1) * 100:+.1f} %) {tf:>6.1f} TFLOPS/GPU "
          f"{tok:>8.0f} tokens/s" + (f", bubble {sim['idle_share'] * 100:.1f} %" if lay.pp > 1 else ""), flush=True)


def run_command(a, cluster, lay):
    """The command that runs layout `lay` on the question's GPUs under Slurm: one rank per GPU,
    the program's flags as the plan had them (the world is the job's)."""
    program, flags = lay.request(a, cluster, a.gpus)
    i = flags.index("--world-size")
    flags = flags[:i] + flags[i + 2:]
    gpn = cluster["gpus_per_node"]
    nodes = max(1, -(-a.gpus // gpn))
    return (f"srun -N {nodes} --ntasks-per-node {min(gpn, a.gpus)} --gpus-per-node {min(gpn, a.gpus)} "
            f"build/bin/{program} {' '.join(flags)} --backend cuda")


def recommend(a, cluster, ranked, replayed, capped=()):
    """(the recommended layout, its lines): the fastest of the top layouts, the replayed ones by
    the full replay and those `capped` (above the replay's bound) by the estimate (the
    estimate's first where none was replayed), in ZeRO / PyTorch / Megatron-LM words, its
    memory against the limits, and the fastest layout whose code paths have all run on a GPU
    (the GPU ledger) with the gap to it."""
    timed = {lay.name: (replayed[lay.name]["time"], "replay") if lay.name in replayed else (est["time"], "estimate")
             for lay, _, est in ranked}
    names = {x.name for x in capped}
    if replayed:
        lay, d, est = min((x for x in ranked if x[0].name in replayed or x[0].name in names),
                          key=lambda x: timed[x[0].name][0])
        how = f"the fastest of the top {len(replayed)} by the full replay"
        if capped:
            how = (f"the fastest of the top {len(replayed) + len(capped)}: {len(replayed)} by the full replay, "
                   f"{len(capped)} above the replay's bound by the estimate")
    else:
        lay, d, est = ranked[0]
        how = ("the fastest by the estimate (the top layouts' pipelines are above the replay's bound)" if capped else
               "the fastest by the estimate (--replay 0: nothing replayed)")
    t, _ = timed[lay.name]
    tf, tok = figures(d, t)
    m = d["memory"]
    lines = [f"recommended: {lay.name}{' *' if lay.unverified else ''} ({how})",
             f"  in other words: {strategy_labels.words(lay.label)}, data parallel {lay.dp}"
             + (f", {lay.mb} micro-batches ({lay.schedule})" if lay.pp > 1 else "")
             + (", activation checkpointing" if lay.ckpt else ""),
             f"  step {t * 1e3:.1f} ms, {tf:.1f} TFLOPS per GPU, {tok:.0f} tokens/s; memory per GPU "
             f"{m['peak_total'] / 2**30:.2f} of {cluster['gpu_memory_gib']:g} GiB (the plan)"
             + (f", host {m['host_peak_total'] / 2**30:.2f} of {cluster['host']['memory_gib']:g} GiB"
                if lay.offload != "none" and "host_peak_total" in m else "")]
    if lay.unverified:
        ran = next(((x, y) for x, y, _ in ranked if not x.unverified), None)
        if ran is None:
            lines.append("  every layout that fits uses a part not yet run on a GPU (*): none to fall back on")
        else:
            r, (rt, rhow) = ran[0], timed[ran[0].name]
            same = rhow == timed[lay.name][1]
            gap = (rt / t - 1) * 100 if same else (rt / est["time"] - 1) * 100
            lines.append(f"  * {', '.join(lay.unrun)} not yet run on a GPU; the fastest layout that has: {r.name}, "
                         f"{gap:+.1f} % step time (by the {rhow if same else 'estimate'})")
    return lay, lines


def write_csv(path, ranked, oom, replayed):
    """Every layout, one row each. source says where model_tflops_per_gpu and tokens_per_s come
    from: "replay" (the full replay) or "estimate" (the fast estimate); empty for a layout
    that does not fit (its plan's peak alone)."""
    with open(path, "w", newline="") as f:
        w = csv.writer(f)
        w.writerow(["layout", "label", "tp", "pp", "dp", "micro_batches", "pp_schedule", "activation_checkpointing",
                    "cpu_offload", "fits", "est_step_s", "replay_step_s", "model_tflops_per_gpu", "tokens_per_s",
                    "source", "peak_gib", "exposed_dp_s", "exposed_tp_s", "exposed_pp_s"])
        for lay, d, est in ranked:
            sim = replayed.get(lay.name)
            tf, tok = figures(d, sim["time"] if sim else est["time"])
            w.writerow([lay.name, lay.label, lay.tp, lay.pp, lay.dp, lay.mb, lay.schedule if lay.pp > 1 else "",
                        int(lay.ckpt), lay.offload, 1, f"{est['time']:.6g}", f"{sim['time']:.6g}" if sim else "",
                        f"{tf:.4g}", f"{tok:.6g}", "replay" if sim else "estimate",
                        f"{d['memory']['peak_total'] / 2**30:.4f}",
                        f"{est['exposed']['dp']:.4g}", f"{est['exposed']['tp']:.4g}", f"{est['exposed']['pp']:.4g}"])
        for lay, d in oom:
            w.writerow([lay.name, lay.label, lay.tp, lay.pp, lay.dp, lay.mb, lay.schedule if lay.pp > 1 else "",
                        int(lay.ckpt), lay.offload, 0, "", "", "", "", "", f"{d['memory']['peak_total'] / 2**30:.4f}",
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


def draw(ranked, replayed, png, svg, title):
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
        # the fastest end of the front numbered, the names in the legend: long names beside
        # points close together overlapped one another
        for k, i in enumerate(front[-4:][::-1], 1):
            ax.annotate(str(k), pts[i], fontsize=7, xytext=(3, 3), textcoords="offset points")
            ax.plot([], [], " ", label=f"{k}: {ranked[i][0].name}")
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
    fig.savefig(png, dpi=120)
    fig.savefig(svg)
    plt.close(fig)
    return png


def emit_matrix(a, cluster, layouts):
    """[(path, text)]: run matrices of `layouts` for slurm/sweep, one per setting a matrix
    holds once (micro-batches and schedule of its -ppS labels, checkpointing, batch per
    rank); --gpus a multiple of gpus_per_node (advise.check_question, before the work)."""
    gpn = cluster["gpus_per_node"]
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
        paths.append((path, text))
    return paths


def explain(a, cluster, bin_dir, lay):
    """Where one layout's step goes: compute, exposed communication per axis, the bubble,
    memory by category; the fast estimate beside the full replay."""
    code, sched = runner.plan(*lay.request(a, cluster, a.gpus), bin_dir)
    if code == 2:
        raise cli.BadInput(f"{lay.name}: refused by the program: {sched}")
    if code == 1:
        raise cli.BadInput(sched)
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
          f"{'fits' if runner.fits(d) else 'DOES NOT FIT'}")
    for k in ("parameters", "gradients", "optimizer_state", "activations", "comm_buffers", "workspace"):
        if k in m:
            print(f"  {k:<16} {m[k] / 2**30:9.2f} GiB")
    if m.get("host_peak_total"):
        print(f"  host (per GPU)   {m['host_peak_total'] / 2**30:9.2f} GiB of {cluster['host']['memory_gib']} GiB")
    if lay.pp > 1:
        for i, st in enumerate(sched.get("stages", [])):
            print(f"  stage {i} (rank {st['rank']}): peak {st.get('peak_total', 0) / 2**30:.2f} GiB")
    if not runner.fits(d):
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
            meta = shardbench_h5.read_meta(os.path.join(ROOT, r))
            dates.add(str(meta["start_time"])[:10])
            backends.add(str(meta["backend"]))
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
