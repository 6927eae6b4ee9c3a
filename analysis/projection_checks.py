#!/usr/bin/python3
"""The projection checked against what was measured: the published study's findings on the
A100 cluster (findings), the one-GPU step against the committed H100 calibration runs
(one-gpu), the GPU count where hybrid sharding overtakes full sharding (crossover), the
effect of each change of the communication model on the T5-11B 8→512 drop (ablation), and
the bound on what pipeline sends sharing the NICs with data-parallel traffic could cost
(nic-sharing), and the layout advisor's fast estimate against the full replay on a sample
of layouts across models and scales (advisor).
docs/projection.md records their output; tests/test_projection.py asserts the findings and
the one-GPU agreement.
"""
import copy
import os
import sys

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import cli  # noqa: E402
import shardbench_h5  # noqa: E402
from projection_model import REPLAY_LANES, ROOT, TRANSFER_LANES, group_tiers, load_cluster, simulate  # noqa: E402
from project import plan_schedule, point_schedule, strategy_args  # noqa: E402

A100 = os.path.join(ROOT, "runs", "clusters", "a100-80gb.toml")
H100 = os.path.join(ROOT, "runs", "clusters", "h100-80gb.toml")
# The study's configuration (FSDP paper §5): bf16, activation checkpointing, seq 512.
SEQ, CKPT = 512, True
PUBLISHED_DROP = -0.07  # T5-11B full sharding, per-GPU TFLOPS, 8 → 512 GPUs (§5.4)
CALIBRATION = os.path.join(ROOT, "runs", "calibration", "h100-2026-11-23")
ONE_GPU_RUNS = [("t5-611m", None, "ddp_perf-bf16-t5-611m.h5"), ("t5-2.28b", None, "ddp_perf-bf16-t5-2.28b.h5"),
                ("t5-11.3b", 4, "ddp_perf-bf16-t5-11.3b-4layers.h5")]


def point(cluster, model, label, batch, n, binary_dir=None, fsdp1=True, layers=None, seq=SEQ, ckpt=CKPT):
    """{tflops, time, fits, peak_gib} of one projected point."""
    s = point_schedule(cluster, model, label, batch, n, seq, ckpt, binary_dir, layers)
    sim = simulate(s, cluster, fsdp1_gathers=fsdp1 and label != "ddp")
    return {"tflops": s["model_flops_per_step"] / sim["time"] / 1e12, "time": sim["time"],
            "fits": bool(s["memory"]["fits"]), "peak_gib": s["memory"]["peak_total"] / 2**30,
            "exposed": sim["exposed"]}


def findings(cluster_path=A100, binary_dir=None):
    """The study's three findings in numbers (batch 8 unless stated)."""
    c = load_cluster(cluster_path)
    out = {}
    for model in ("t5-611m", "t5-2.28b"):
        ddp, full = (point(c, model, s, 8, 8, binary_dir) for s in ("ddp", "fsdp-full"))
        out[model] = {"ddp": ddp["tflops"], "fsdp-full": full["tflops"], "ratio": full["tflops"] / ddp["tflops"] - 1}
    ddp, full = (point(c, "t5-11.3b", s, 8, 8, binary_dir) for s in ("ddp", "fsdp-full"))
    out["t5-11.3b"] = {"ddp_fits": ddp["fits"], "ddp_peak_gib": ddp["peak_gib"], "full_fits": full["fits"],
                       "full_peak_gib": full["peak_gib"]}
    for batch in (8, 16):
        a, b = (point(c, "t5-11.3b", "fsdp-full", batch, n, binary_dir) for n in (8, 512))
        out[f"drop_b{batch}"] = {"8": a["tflops"], "512": b["tflops"], "drop": b["tflops"] / a["tflops"] - 1}
    return out


def measured_step(name):
    return float(shardbench_h5.read_meta(os.path.join(CALIBRATION, name))["median_step_time_s"])


def as_calibrated_code(sched):
    """The schedule as the code of the calibration runs (d66ed0d) issued it, to compare like
    with like: there a DDP bf16 step ended with Adam (24 + 2 bytes per parameter) and a
    separate cast of every parameter into the bf16 compute copy (4 + 2 bytes); Adam now
    writes the copy itself (24 + 2 + 2 bytes, no cast). Other schedules are unchanged."""
    if sched["program"] != "ddp_perf" or sched["dtype"] != "bf16":
        return sched
    cols, names = sched["columns"], sched["op_names"]
    i_op, i_bytes, i_flops = cols.index("op"), cols.index("bytes"), cols.index("flops")
    n = sched["param_count"]
    ops = []
    for row in sched["ops"]:
        ops.append(row)
        if names[row[i_op]] == "optimizer" and row[i_bytes] == 28 * n:
            row = list(row)
            row[i_bytes] = 26 * n
            cast = list(row)
            cast[i_op], cast[i_bytes], cast[i_flops] = names.index("copy"), 6 * n, 0.0
            ops[-1:] = [row, cast]
    return dict(sched, ops=ops)


def one_gpu(binary_dir=None):
    """Projected against measured one-GPU steps: calibrated on all three runs (the model
    reproduces its calibration), and on the two other runs only (leave one out)."""
    rows = []
    for model, layers, name in ONE_GPU_RUNS:
        c = load_cluster(H100, calibrate=False)
        sched = as_calibrated_code(point_schedule(c, model, "ddp", 8, 1, SEQ, False, binary_dir, layers))
        row = {"model": model + (f" ({layers}+{layers} layers)" if layers else ""), "measured": measured_step(name)}
        for mode in ("all", "others"):
            c = load_cluster(H100, calibrate=False)
            for _, _, other in ONE_GPU_RUNS:
                if mode == "all" or other != name:
                    c["compute_model"].add_run(os.path.join(CALIBRATION, other), c)
            row[mode] = simulate(sched, c)["time"]
        rows.append(row)
    return rows


def crossover(cluster_path=A100, gpus=(8, 16, 32, 64, 128, 256, 512), batch=8, binary_dir=None):
    """Per model: TFLOPS of full and hybrid (G = 8) sharding per GPU count, and the first
    count where hybrid is faster (None: never within `gpus`)."""
    c = load_cluster(cluster_path)
    out = {}
    for model in ("t5-611m", "t5-2.28b", "t5-11.3b"):
        full = {n: point(c, model, "fsdp-full", batch, n, binary_dir) for n in gpus}
        hyb = {n: point(c, model, "fsdp-hybrid8", batch, n, binary_dir) for n in gpus if n >= 8}
        first = next((n for n in gpus if n > 8 and hyb[n]["fits"] and
                      (not full[n]["fits"] or hyb[n]["time"] < full[n]["time"] * 0.999)), None)
        out[model] = {"full": {n: p["tflops"] if p["fits"] else None for n, p in full.items()},
                      "hybrid": {n: p["tflops"] if p["fits"] else None for n, p in hyb.items()}, "first": first}
    return out


def ablation(binary_dir=None):
    """T5-11B full sharding, TFLOPS at 8 and 512 GPUs (batch 8, 16) as the communication model
    gains each change, over the calibrated compute model."""
    full = load_cluster(A100)
    base = copy.deepcopy(full)  # the communication model alone: no contention, no stragglers
    for key in ("overlap_slowdown", "gpu_speed_spread"):
        base["compute"].pop(key, None)
    contended = copy.deepcopy(base)
    contended["compute"]["overlap_slowdown"] = full["compute"]["overlap_slowdown"]
    old = copy.deepcopy(base)  # the previous model: one NIC's bandwidth for a whole ring, its latencies
    old["collectives"] = "ring"
    old["intra"] = {"bandwidth_gbps": 230.0, "latency_us": 8.0}
    old["inter"] = {"nic_bandwidth_gbps": 24.0, "nics_per_node": 1, "latency_us": 20.0}
    nics = copy.deepcopy(old)
    nics["inter"].update(nics_per_node=base["inter"]["nics_per_node"],
                         nic_bandwidth_gbps=base["inter"]["nic_bandwidth_gbps"])
    steps = [("previous network model (one NIC per ring, 8/20 us per step), program's all-gathers", old, False),
             ("+ one ring channel per NIC: node busbw = min(NVLink, 8 NICs)", nics, False),
             ("+ NCCL's latencies (3.4/9.6 us per step, 8.4 us base) and tree all-reduce", base, False),
             ("+ FSDP1 all-gathers: implicit forward prefetch under the rate limiter", base, True),
             ("+ compute slowed while collectives run beside it (Lee et al. 2025: +18.9 %)", contended, True),
             ("+ the slowest of N GPUs sets the pace (Sinha et al. SC22: 8 % spread)", full, True)]
    rows = []
    for text, c, fsdp1 in steps:
        row = {"model": text}
        for batch in (8, 16):
            a, b = (point(c, "t5-11.3b", "fsdp-full", batch, n, binary_dir, fsdp1=fsdp1) for n in (8, 512))
            row[batch] = (a["tflops"], b["tflops"], b["tflops"] / a["tflops"] - 1)
        rows.append(row)
    return rows


def _union(intervals):
    out = []
    for a, b in sorted(intervals):
        if out and a <= out[-1][1]:
            out[-1][1] = max(out[-1][1], b)
        else:
            out.append([a, b])
    return out


def _overlap(xs, ys):
    """Seconds where an interval of xs and one of ys run at once."""
    xs, ys, i, j, total = _union(xs), _union(ys), 0, 0, 0.0
    while i < len(xs) and j < len(ys):
        total += max(0.0, min(xs[i][1], ys[j][1]) - max(xs[i][0], ys[j][0]))
        if xs[i][1] < ys[j][1]:
            i += 1
        else:
            j += 1
    return total


def nic_sharing(binary_dir=None, layouts=(("ddp-tp2-pp4", 64), ("ddp-tp2-pp2", 32), ("ddp-tp4-pp2", 64)),
                gpus=(64, 512), micro_batches=16):
    """The replay costs a pipeline send alone on its NIC. Where a stage's sends cross nodes
    while its data-parallel collectives cross them too, they share NICs: at worst each
    slows the other only while both run, so the step can grow by at most the time they
    overlap on the stage where that is longest. Per layout (t5-11.3b, runs/pp_tp_fsdp.toml's
    setting): that overlap beside the step, the sends and the cross-node collectives."""
    c = load_cluster(A100)
    rows = []
    for label, batch in layouts:
        for n in gpus:
            args = strategy_args(label, c, n) + ["--model", "t5-11.3b", "--batch", str(batch), "--seq-len", str(SEQ),
                                                 "--micro-batches", str(micro_batches), "--activation-checkpointing",
                                                 "--dtype", c["dtype"], "--reduce-dtype", c["dtype"]]
            sched = plan_schedule(args, n, c["gpu_memory_gib"], binary_dir or os.path.join(ROOT, "build", "bin"))
            sim, tiers = simulate(sched, c), group_tiers(sched, c)
            crosses = n // sched["pp_size"] >= c["gpus_per_node"]  # stages of whole nodes: every send leaves one
            worst = (0.0, 0.0, 0.0)
            for _, events in sim["stages"]:
                sends = [(e[4], e[5]) for e in events if e[3] in TRANSFER_LANES]
                dp = [(e[4], e[5]) for e in events if e[3] in (REPLAY_LANES["gather"], REPLAY_LANES["reduce"]) and
                      tiers[e[8]][1] > 1]
                both = _overlap(sends, dp) if crosses else 0.0
                worst = max(worst, (both, sum(b - a for a, b in _union(sends)), sum(b - a for a, b in _union(dp))))
            rows.append({"label": label, "gpus": n, "step": sim["time"], "overlap": worst[0], "sends": worst[1],
                         "dp": worst[2]})
    return rows


# (model, GPUs, global batch, layouts sampled): the sample of docs/projection.md ("The layout advisor")
ADVISOR_SCENARIOS = (("t5-small", 8, 64, 24), ("t5-611m", 8, 64, 24), ("t5-small", 64, 64, 18),
                     ("t5-611m", 64, 128, 18), ("t5-2.28b", 64, 128, 18), ("t5-11.3b", 512, 1024, 18))


def advisor(binary_dir=None, seed=0, scenarios=ADVISOR_SCENARIOS):
    """The advisor's fast estimate (analysis/advise.py) against the full replay: for each
    scenario (model, GPUs, global batch; A100 description, seq 512) a seeded sample of its
    layouts that fit, each planned once and costed both ways. Prints every layout and the
    relative error's median and maximum, and whether both name the same fastest layout."""
    import random
    import advise
    import runner
    cluster = load_cluster(A100)
    bin_dir = binary_dir or os.path.join(ROOT, "build", "bin")
    errors, agree, picks = [], 0, 0
    for model, n, gb, per_scenario in scenarios:
        class A:  # the command line Layout.request reads
            pass
        a = A()
        a.model, a.seq_len, a.dec_seq_len = model, SEQ, None
        for key in advise.model_shapes.KEYS:
            setattr(a, key, None)
        blocks = advise.model_blocks(a, cluster, bin_dir)
        tp_ok = advise.probe_tp_simple(a, cluster, bin_dir, n)
        layouts, _ = advise.enumerate_layouts(n, gb, blocks, cluster["gpus_per_node"], lambda t: tp_ok[t])
        random.Random(seed).shuffle(layouts)
        rows = []
        for lay in layouts:
            if len(rows) >= per_scenario:
                break
            code, sched = runner.plan(*lay.request(a, cluster, n), bin_dir)
            if code != 0 or not runner.fits(sched):
                continue
            est = advise.estimate(advise.digest(sched), cluster)["time"]
            full = simulate(sched, cluster)["time"]
            rows.append((lay.name, est, full))
            print(f"{model:<9} {n:>4} {lay.name:<48} est {est * 1e3:9.1f} ms  replay {full * 1e3:9.1f} ms  "
                  f"{(est - full) / full * 100:+6.1f} %", flush=True)
        errs = sorted(abs(e - f) / f for _, e, f in rows)
        errors += errs
        w_est, w_full = min(rows, key=lambda r: r[1])[0], min(rows, key=lambda r: r[2])[0]
        agree += w_est == w_full
        full_of = {name: f for name, _, f in rows}
        loss = full_of[w_est] / full_of[w_full] - 1  # the estimate's pick, replayed, against the replay's best
        # The advisor's recommendation: the replay's fastest of the estimate's top 10.
        pick = min(sorted(rows, key=lambda r: r[1])[:10], key=lambda r: r[2])[0]
        picks += full_of[pick] == full_of[w_full]
        print(f"== {model} on {n} GPUs, global batch {gb}: {len(rows)} layouts, error median "
              f"{errs[len(errs) // 2] * 100:.1f} %, max {errs[-1] * 100:.1f} %; fastest: estimate {w_est}, replay "
              f"{w_full}{' (agree)' if w_est == w_full else f' (the estimate pick replays {loss * 100:.1f} % slower)'}; "
              f"the advisor's pick (the replay's fastest of the estimate's top 10) {pick}: "
              f"{'the fastest' if full_of[pick] == full_of[w_full] else 'NOT the fastest'}", flush=True)
    errors.sort()
    print(f"== all: {len(errors)} layouts, error median {errors[len(errors) // 2] * 100:.1f} %, max "
          f"{errors[-1] * 100:.1f} %; the fastest agrees in {agree} of {len(scenarios)} scenarios, the advisor's "
          f"pick is the fastest in {picks}")


def print_findings(f):
    print("| finding | projected (A100 description) | holds |")
    print("|---|---|---|")
    for model in ("t5-611m", "t5-2.28b"):
        r = f[model]
        print(f"| FSDP within ±5 % of DDP, {model}, 8 GPUs | DDP {r['ddp']:.1f}, FSDP full {r['fsdp-full']:.1f} "
              f"TFLOPS/GPU ({r['ratio']:+.1%}) | {'yes' if abs(r['ratio']) <= 0.05 else 'NO'} |")
    r = f["t5-11.3b"]
    ok = not r["ddp_fits"] and r["full_fits"]
    print(f"| DDP out of memory at 11.3B, full sharding fits (8 GPUs, 80 GiB) | DDP {r['ddp_peak_gib']:.1f} GiB, "
          f"FSDP full {r['full_peak_gib']:.1f} GiB | {'yes' if ok else 'NO'} |")
    for batch in (8, 16):
        r = f[f"drop_b{batch}"]
        ok = abs(r["drop"] - PUBLISHED_DROP) <= 0.04
        print(f"| T5-11B full sharding 8→512 GPUs, batch {batch}: {PUBLISHED_DROP:+.0%} ± 4 points | "
              f"{r['8']:.1f} → {r['512']:.1f} TFLOPS/GPU ({r['drop']:+.1%}) | {'yes' if ok else 'NO'} |")


def main(argv=None):
    ap = cli.parser(__doc__, __file__)
    ap.add_argument("checks", nargs="+", choices=("findings", "one-gpu", "crossover", "ablation", "nic-sharing",
                                                       "advisor"),
                    help="which tables to print (markdown, as docs/projection.md shows them)")
    ap.add_argument("--bin", default=None, help="folder of ddp_perf and fsdp_perf (default: build/bin)")
    a = ap.parse_args(argv)
    for check in a.checks:
        if check == "findings":
            print_findings(findings(binary_dir=a.bin))
        elif check == "one-gpu":
            print("| model (H100, bf16, batch 8, seq 512) | measured | projected, calibrated on all three runs | "
                  "projected, calibrated on the two others |")
            print("|---|---|---|---|")
            for r in one_gpu(a.bin):
                m = r["measured"]
                print(f"| {r['model']} | {m * 1e3:.1f} ms | {r['all'] * 1e3:.1f} ms ({r['all'] / m - 1:+.1%}) | "
                      f"{r['others'] * 1e3:.1f} ms ({r['others'] / m - 1:+.1%}) |")
        elif check == "crossover":
            res = crossover(binary_dir=a.bin)
            gpus = list(next(iter(res.values()))["full"])
            print("| model | strategy | " + " | ".join(str(n) for n in gpus) + " | hybrid faster from |")
            print("|---|---|" + "---|" * len(gpus) + "---|")
            for model, r in res.items():
                for s in ("full", "hybrid"):
                    cells = [("OOM" if r[s].get(n) is None else f"{r[s][n]:.1f}") if n in r[s] else "" for n in gpus]
                    first = (str(r["first"]) if r["first"] else "never (≤ 512)") if s == "hybrid" else ""
                    print(f"| {model} | fsdp-{s}{'8' if s == 'hybrid' else ''} | " + " | ".join(cells) +
                          f" | {first} |")
        elif check == "advisor":
            advisor(binary_dir=a.bin)
        elif check == "nic-sharing":
            print("| layout (t5-11.3b, 16 micro-batches) | GPUs | step | sends (worst stage) | cross-node "
                  "data-parallel collectives | both at once: the bound |")
            print("|---|---|---|---|---|---|")
            for r in nic_sharing(a.bin):
                print(f"| {r['label']} | {r['gpus']} | {r['step'] * 1e3:.0f} ms | {r['sends'] * 1e3:.1f} ms | "
                      f"{r['dp'] * 1e3:.1f} ms | {r['overlap'] * 1e3:.2f} ms ({r['overlap'] / r['step']:.2%}) |")
        else:
            print("| communication model | batch 8: 8 → 512 GPUs | batch 16: 8 → 512 GPUs |")
            print("|---|---|---|")
            for r in ablation(a.bin):
                cells = [f"{r[b][0]:.1f} → {r[b][1]:.1f} ({r[b][2]:+.1%})" for b in (8, 16)]
                print(f"| {r['model']} | {cells[0]} | {cells[1]} |")
        print()
    return 0


if __name__ == "__main__":
    sys.exit(cli.run(__file__, main))
