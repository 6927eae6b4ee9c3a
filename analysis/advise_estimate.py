"""The layout advisor's fast estimate (analysis/advise.py): one step of a layout from its
plan's totals (GEMM FLOPs and shapes, bytes, the collectives' bytes per mesh axis, stages,
micro-batches) at the calibration's rates (analysis/projection_model.py: the compute model,
collective_time), without replaying the schedule. docs/projection.md ("The layout advisor")
gives the model and its error against the full replay.
"""
import cli
from projection_model import collective_time, group_tiers, oversubscription, p2p_time, straggler_factor

DP_AXES = ("dp_shard", "dp_replicate")


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
        raise cli.BadInput(f"the schedule of {sched.get('label')} has no per-stage totals with GEMM shapes: the "
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
        if offload and h:  # CPU offload's host lanes ("ops" counts the device's lanes alone)
            s["h2d"], s["d2h"] = float(h["h2d_bytes"]), float(h["d2h_bytes"])
            s["host_update"] = float(h["update_bytes"])
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
