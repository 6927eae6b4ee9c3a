#!/usr/bin/python3
"""The study's memory picture from the memory plan alone: model states per GPU of DDP and
ZeRO stages 0-3 (with CPU offload where fsdp_perf has it) against GPU count, beside the ZeRO
paper's formulas, and the largest T5 preset that fits a node of GPUs under each strategy,
with and without activation checkpointing. Nothing is allocated: each point is the
program's own plan (--plan --world-size N), all of them through --plan-batch in one process
per program (the default question: 63 curve and 252 search plans in 4 s).

Model states (ZeRO paper §3.1, docs/references.md §7) are what a rank holds for the
parameters, gradients and optimizer: the plan's parameters + gradients + optimizer_state +
comm_buffers peaks (in these strategies comm_buffers holds only gathered parameters and
unsharded gradients). Activations and workspace are not model states. Mixed precision is
the study's, --dtype bf16: 16-bit parameters and gradients, fp32 master and Adam (K = 12).

  strategy              program flags              ZeRO formula per GPU  how the plan holds it
  ddp                   ddp_perf                   (4 + K)Ψ              parameters: fp32 master 4Ψ + bf16 copy
  fsdp-none             fsdp_perf --zero-stage 0   (4 + K)Ψ              2Ψ; gradients 2Ψ; optimizer_state 8Ψ
  fsdp-optimizer-state  fsdp_perf --zero-stage 1   4Ψ + KΨ/N             bf16 parameters and gradients whole;
                                                                         master 4Ψ/N, Adam 8Ψ/N
  fsdp-grad-op          fsdp_perf --zero-stage 2   2Ψ + (2 + K)Ψ/N       the bf16 units gathered in forward and
                                                                         kept to backward (comm_buffers): the 2Ψ
  fsdp-full             fsdp_perf --zero-stage 3   (4 + K)Ψ/N            shards only; units gathered in turn

The curve's plans run --batch and --seq-len (the study's 8 and 512, runs/fsdp_vs_ddp.toml)
with --activation-checkpointing, at --gpu-memory-gib as --mem-limit-gib; the model states
do not depend on them. On one GPU nothing is sharded or gathered.

The plan equals the formula plus these named extras, each computed from the plan's own unit
sizes (Ψ_pad: every unit padded to a multiple of N) except the last, which is bounded:
  padding           the formula's terms at Ψ_pad instead of Ψ (sharded and ZeRO-1 whole buffers)
  reduced-shard     ZeRO-1: the reduced gradient shard, 2Ψ_pad/N (the update reads it)
  no-16bit-shard    ZeRO-3: −2Ψ/N: no persistent bf16 shard (the fp32 shard is cast into
                    the gather buffer)
  offload-shard     CPU offload: what stays on the GPU beyond the remaining terms: under
                    optimizer ZeRO-2's bf16 shard its all-gathers start from, under params
                    the reduced gradient shard (downloaded from there), 2Ψ_pad/N each
  in-flight         ZeRO-2: unsharded bf16 gradients of the units being differentiated (the
                    embedding's held across backward), in [0, 2 × (root units + largest
                    block)]; ZeRO-3: gathered units and unsharded gradients, in
                    [2 × (embedding + largest block), 2 × (2 × root units + 4 × largest block)]
                    (root units: embedding, bridge, head, kept from forward to backward; at
                    most two all-gathers in flight); 0 for the others
A difference beyond them stops the script (exit 1, one line); nothing is written then.

CPU offload: when fsdp_perf --describe lists --cpu-offload values, each entry of OFFLOAD below
that its offload rule serves is one more strategy (its offloaded terms leave the GPU's
formula and, where the plan's JSON has host memory, are checked on the host); otherwise one
line says so and no offload row is made.

Usage: analysis/model_states.py --out DIR [--overwrite] [--bin build/bin] [--model t5-11.3b]
         [--gpus 8,16,...,512] [--gpu-memory-gib 80] [--fit-gpus 8] [--fit-models LIST]
         [--batch 8] [--seq-len 512]
Writes DIR/model_states.csv (every strategy and GPU count: bytes per GPU and per parameter,
plan and formula, each extra), DIR/model_states.txt (the printed table), DIR/largest_fit.csv
and DIR/model_states.png. Exit codes: 0 written; 1 a plan differs from its formula beyond
the named extras (one line naming it, nothing written); 2 bad input (one line, nothing
written).
"""
import csv
import io
import math
import os
import sys

import matplotlib
matplotlib.use("Agg")
import matplotlib.pyplot as plt  # noqa: E402
import matplotlib.ticker  # noqa: E402

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import cli  # noqa: E402
import runner  # noqa: E402

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
GIB = 2.0 ** 30
K = 12  # bytes of optimizer state per parameter, mixed-precision Adam: fp32 master 4 + momentum 4 + variance 4
DEFAULT_GPUS = "8,16,32,64,128,256,512"
HOST_LIMIT_GIB = [128.0]  # --host-memory-gib: host memory per GPU for offload's plans
LEFT_OUT = []  # offload variants the program refuses, one line each (printed with the table)
STATE_CATEGORIES = ("parameters", "gradients", "optimizer_state", "comm_buffers")


class Mismatch(Exception):
    """A plan differs from its ZeRO formula beyond the named extras."""


# ---- strategies: one entry each (offload variants are entries too) -------------------------
# level: the ZeRO level whose formula applies (DDP: 0; DeepSpeed calls it a stage, --zero-stage); args: the program and its flags;
# offload: the formula terms that leave the GPU ("p16" 16-bit parameters, "g16" 16-bit
# gradients, "opt" fp32 master and Adam, K bytes).
STRATEGIES = [
    dict(name="ddp", level=0, args=["ddp_perf"], offload=()),
    dict(name="fsdp-none", level=0, args=["fsdp_perf", "--zero-stage", "0"], offload=()),
    dict(name="fsdp-optimizer-state", level=1, args=["fsdp_perf", "--zero-stage", "1"], offload=()),
    dict(name="fsdp-grad-op", level=2, args=["fsdp_perf", "--zero-stage", "2"], offload=()),
    dict(name="fsdp-full", level=3, args=["fsdp_perf", "--zero-stage", "3"], offload=()),
]
# Added when fsdp_perf has --cpu-offload: DeepSpeed's offload_optimizer (fp32 master and Adam
# on the host) for levels 1-3, and offload_param (PyTorch FSDP's CPUOffload: the shards of
# parameters and gradients too, the update on the host) for level 3.
OFFLOAD = [
    dict(name="fsdp-optimizer-state+offload-optimizer", level=1,
         args=["fsdp_perf", "--zero-stage", "1", "--cpu-offload", "optimizer"], offload=("opt",)),
    dict(name="fsdp-grad-op+offload-optimizer", level=2,
         args=["fsdp_perf", "--zero-stage", "2", "--cpu-offload", "optimizer"], offload=("opt",)),
    dict(name="fsdp-full+offload-optimizer", level=3,
         args=["fsdp_perf", "--zero-stage", "3", "--cpu-offload", "optimizer"], offload=("opt",)),
    dict(name="fsdp-full+offload-params", level=3,
         args=["fsdp_perf", "--zero-stage", "3", "--cpu-offload", "params"], offload=("p16", "g16", "opt")),
]
COLORS = {0: "tab:blue", 1: "tab:brown", 2: "tab:purple", 3: "tab:orange"}
STYLE = {"ddp": ("tab:blue", "o"), "fsdp-none": ("tab:green", "s"), "fsdp-optimizer-state": ("tab:brown", "^"),
         "fsdp-grad-op": ("tab:purple", "D"), "fsdp-full": ("tab:orange", "v")}


def formula_terms(level, psi, n):
    """The ZeRO paper's model states per GPU by term (bytes): 2Ψ 16-bit parameters, 2Ψ
    16-bit gradients, KΨ optimizer state; level 1 shards the last, 2 the last two, 3 all."""
    return {"p16": 2 * psi / (n if level >= 3 else 1), "g16": 2 * psi / (n if level >= 2 else 1),
            "opt": K * psi / (n if level >= 1 else 1)}


def unit_sizes(plan, n):
    """(Ψ, Ψ_pad, root units padded, embedding padded, largest block padded) from the plan's
    units: root units are the embedding, bridge and head (PyTorch's root, split in three);
    the others are the T5 blocks."""
    pad = [-(-u // n) * n for u in plan["unit_params"]]
    names = plan["unit_names"]
    blocks = [p for p, name in zip(pad, names) if name.startswith(("encoder.", "decoder."))]
    root = [p for p, name in zip(pad, names) if not name.startswith(("encoder.", "decoder."))]
    emb = [p for p, name in zip(pad, names) if name == "embedding"]
    return sum(plan["unit_params"]), sum(pad), sum(root), sum(emb), max(blocks or [0])


def exact_terms(s, psi, psi_pad, n):
    """The plan's model states by formula term, from the code (src/strategy/ddp.cpp,
    fsdp.cpp) without the in-flight buffers, and the named extras each holds: {term: (bytes,
    {extra: bytes})}. Bytes of the shard buffers: every unit padded to a multiple of N."""
    level = s["level"]
    f = formula_terms(level, psi, n)
    fp = formula_terms(level, psi_pad, n)
    extra = {t: {} for t in f}
    if level > 0:  # replicas (DDP, level 0: a shard group of one) hold 4Ψ master + 2Ψ bf16 copy, 2Ψ
        # gradients, 8Ψ Adam, unpadded; ZeRO-1's whole bf16 buffers and every shard are padded
        for t in f:
            if level == 3 and t == "p16" and n > 1 and "opt" not in s["offload"]:
                extra[t]["no-16bit-shard"] = -f[t]  # no bf16 shard at all: the fp32 shard is cast into the gather buffer
            elif fp[t] != f[t]:
                extra[t]["padding"] = fp[t] - f[t]
        if level == 1:
            extra["g16"]["reduced-shard"] = 2 * psi_pad / n
    return {t: (f[t] + sum(extra[t].values()), extra[t]) for t in f}


def offload_extras(s, psi_pad, n):
    """What CPU offload leaves on the GPU beyond the formula's remaining terms (src/strategy/
    fsdp.cpp, offload.h): under optimizer offload ZeRO-2 keeps the bf16 shard its all-gathers
    start from ("offload-16bit-shard"; ZeRO-3's is the formula's own 2Ψ/N); under params
    offload the reduced gradient shard stays on the GPU, downloaded from there
    ("offload-gradient-shard")."""
    extras = {}
    if "opt" in s["offload"] and s["level"] == 2 and n > 1:
        extras["offload-16bit-shard"] = 2 * psi_pad / n
    if "g16" in s["offload"]:
        extras["offload-gradient-shard"] = 2 * psi_pad / n
    return extras


def in_flight_bounds(level, n, root, emb, block):
    """The allowed range of the in-flight buffers (bytes of bf16: 2 per element). On one GPU
    nothing is gathered: ZeRO-2 and -3 hold a bf16 copy of the parameters as level 0 does."""
    if n == 1:
        return 0.0, 0.0
    if level == 2:
        return 0.0, 2.0 * (root + block)
    if level == 3:
        return 2.0 * (emb + block), 2.0 * (2 * root + 4 * block)
    return 0.0, 0.0


def host_bytes(plan):
    """Host memory of the rank in the plan's JSON, or None where the program writes none
    (a "host_memory" object: its peak_total, else the sum of its byte counts)."""
    mem = plan.get("memory", {})
    if isinstance(mem.get("host_peak_total"), (int, float)) and mem["host_peak_total"] > 0:
        return float(mem["host_peak_total"])  # the plan's JSON: memory.host_peak_total
    h = plan.get("host_memory", mem.get("host_memory"))
    if not isinstance(h, dict):
        return None
    if isinstance(h.get("peak_total"), (int, float)):
        return float(h["peak_total"])
    return float(sum(v for k, v in h.items() if isinstance(v, (int, float)) and not isinstance(v, bool)
                     and k not in ("limit", "fits")))


def compare(s, plan, n):
    """One row: the plan's model states beside the formula's, the difference explained by the
    named extras; Mismatch when the rest lies outside the in-flight bounds."""
    psi, psi_pad, root, emb, block = unit_sizes(plan, n)
    mem = plan["memory"]
    states = float(sum(mem[c] for c in STATE_CATEGORIES))
    terms = exact_terms(s, psi, psi_pad, n)
    f = formula_terms(s["level"], psi, n)
    on_gpu = [t for t in f if t not in s["offload"]]
    formula = sum(f[t] for t in on_gpu)
    extras = {}
    for t in on_gpu:
        for name, v in terms[t][1].items():
            extras[name] = extras.get(name, 0.0) + v
    extras.update(offload_extras(s, psi_pad, n))
    # whole bytes: the formula's and the extras' fractions of a byte (Ψ/N) cancel
    in_flight = float(round(states - formula - sum(extras.values())))
    lo, hi = in_flight_bounds(s["level"], n, root, emb, block)
    where = f"{s['name']} at {n} GPUs ({plan['model']})"
    if not lo <= in_flight <= hi:
        raise Mismatch(f"{where}: model states {states:.0f} B, the ZeRO formula {formula:.0f} B + named extras "
                       f"{sum(extras.values()):.0f} B leave {in_flight:.0f} B, outside the in-flight bounds "
                       f"[{lo:.0f}, {hi:.0f}] B")
    row = dict(strategy=s["name"], zero_level=s["level"], offload="+".join(s["offload"]) or "-", gpus=n,
               params=psi, params_padded=psi_pad, **{c: mem[c] for c in STATE_CATEGORIES},
               model_states=states, formula=formula, padding=extras.get("padding", 0.0),
               reduced_shard=extras.get("reduced-shard", 0.0), no_16bit_shard=extras.get("no-16bit-shard", 0.0),
               offload_shard=extras.get("offload-16bit-shard", 0.0) + extras.get("offload-gradient-shard", 0.0),
               in_flight=in_flight, in_flight_min=lo, in_flight_max=hi,
               peak_total=mem["peak_total"], fits=mem["fits"])
    host = host_bytes(plan)
    if host is not None:
        moved = sum(terms[t][0] for t in s["offload"])
        if host < moved:
            raise Mismatch(f"{where}: host memory {host:.0f} B is less than the offloaded model states "
                           f"{moved:.0f} B ({', '.join(s['offload'])})")
        row["host"], row["host_model_states"] = host, moved
    return row


# ---- running the plans --------------------------------------------------------------------

LEVEL_SHARDING = {0: "none", 1: "optimizer-state", 2: "grad-op", 3: "full"}  # fsdp_perf --zero-stage N


def offload_variants(rule):
    """The entries of OFFLOAD that `rule` (runner.offload_rule: {--cpu-offload value: the
    --sharding values it serves}) serves; each other one goes to LEFT_OUT. None (a build that
    cannot say): all of them, the program's plan refusing what it does not serve."""
    served = []
    for s in OFFLOAD:
        off, sharding = s["args"][s["args"].index("--cpu-offload") + 1], LEVEL_SHARDING[s["level"]]
        if rule is None or sharding in rule.get(off, ()):
            served.append(s)
        else:
            LEFT_OUT.append(f"{s['name']} left out: fsdp_perf --describe: --cpu-offload {off} does not serve "
                            f"--sharding {sharding}")
    return served


def plan_request(s, model, n, limit_gib, batch, seq, checkpointing):
    """(program, flags) of one plan: the layout `s` of `model` on n GPUs."""
    flags = s["args"][1:] + ["--model", model, "--dtype", "bf16", "--batch", str(batch), "--seq-len", str(seq),
                             "--world-size", str(n), "--mem-limit-gib", f"{limit_gib:g}"]
    if s["offload"]:  # the host's share per GPU, as a node's (not this machine's)
        flags += ["--host-mem-limit-gib", f"{HOST_LIMIT_GIB[0]:g}"]
    if checkpointing:
        flags.append("--activation-checkpointing")
    return s["args"][0], flags


def run_plans(a, jobs):
    """{(strategy name, model, n, checkpointing): (exit, plan JSON or the program's line)} of
    jobs [(s, model, n, checkpointing)], all at once: each program's --plan-batch without the
    per-operation rows (analysis/runner.py), where one process start per plan took longer
    than the plan."""
    try:
        got = runner.plans([plan_request(s, m, n, a.gpu_memory_gib, a.batch, a.seq_len, ck) for s, m, n, ck in jobs],
                           a.bin, full=False)
    except cli.BadInput as e:
        raise cli.BadInput(f"--bin '{a.bin}': {e}")
    return {(s["name"], m, n, ck): r for (s, m, n, ck), r in zip(jobs, got)}


def accepted(s, model, n, answer):
    """The plan of one answer of run_plans, or None when the program refuses the combination
    (exit 2; offload entries only: their line goes to LEFT_OUT); any other refusal or a
    failed plan is bad input."""
    code, plan = answer
    if code == 2:
        if s["offload"]:
            LEFT_OUT.append(f"{s['name']} left out: fsdp_perf refuses it: {plan}")
            return None
        raise cli.BadInput(f"{' '.join(s['args'])} refuses {model} at {n} GPUs: {plan}")
    if code == 1:
        raise cli.BadInput(plan)
    return plan


def t5_family(names):
    """The T5 presets (the study's, T5 v1.1, Flan-T5; t5-tiny is the tests' toy)."""
    return [m for m in names if m.startswith(("t5-", "flan-t5-")) and m != "t5-tiny"]


# ---- the table and the figure -------------------------------------------------------------

def text_table(rows):
    out = io.StringIO()
    head = (f"{'strategy':<40} {'GPUs':>5} {'plan GiB':>9} {'ZeRO GiB':>9} {'plan B/p':>9} {'ZeRO B/p':>9} "
            f"{'diff B/p':>9}  explained by")
    has_host = any("host" in r for r in rows)
    if has_host:
        head += "  (host GiB)"
    print(head, file=out)
    print("-" * len(head), file=out)
    for r in rows:
        why = [f"{k.replace('_', '-')} {r[k] / r['params']:+.4f}" for k in ("padding", "reduced_shard",
                                                                           "no_16bit_shard", "offload_shard",
                                                                           "in_flight") if r[k]]
        line = (f"{r['strategy']:<40} {r['gpus']:>5} {r['model_states'] / GIB:>9.2f} {r['formula'] / GIB:>9.2f} "
                f"{r['model_states'] / r['params']:>9.4f} {r['formula'] / r['params']:>9.4f} "
                f"{(r['model_states'] - r['formula']) / r['params']:>+9.4f}  {', '.join(why) or 'exact'}")
        if "host" in r:
            line += f"  ({r['host'] / GIB:.2f})"
        print(line, file=out)
    return out.getvalue()


def fit_table(fits, fit_gpus, limit_gib, batch, seq):
    out = io.StringIO()
    print(f"largest T5 preset that fits {fit_gpus} GPUs of {limit_gib:g} GiB (batch {batch} per GPU, seq {seq}, "
          "bf16; the plan's peak per GPU):", file=out)
    for f in fits:
        ck = "checkpointing" if f["activation_checkpointing"] else "no checkpointing"
        got = f"{f['largest']} ({f['largest_params'] / 1e9:.2f}B, {f['largest_peak'] / GIB:.2f} GiB)" \
            if f["largest"] else "none"
        nxt = f"; next: {f['next']} needs {f['next_peak'] / GIB:.2f} GiB" if f["next"] else ""
        print(f"  {f['strategy']:<40} {ck:<17} {got}{nxt}", file=out)
    return out.getvalue()


def draw(rows, model, limit_gib, path):
    fig, (ax, dx) = plt.subplots(1, 2, figsize=(12.5, 5.0))
    names = list(dict.fromkeys(r["strategy"] for r in rows))
    for name in names:
        g = sorted((r for r in rows if r["strategy"] == name), key=lambda r: r["gpus"])
        color, marker = STYLE.get(name, (COLORS[g[0]["zero_level"]], "x"))
        ls = ":" if g[0]["offload"] != "-" else "-"
        x = [r["gpus"] for r in g]
        big = dict(ms=9, mfc="none", lw=3, alpha=0.6) if name == "ddp" else dict(ms=4)  # under fsdp-none's line
        ax.plot(x, [r["model_states"] / GIB for r in g], color=color, marker=marker, ls=ls, label=name, **big)
        dx.plot(x, [(r["model_states"] - r["formula"]) / r["params"] for r in g], color=color, marker=marker,
                ls=ls, label=name, **big)
    done = set()
    for name in names:  # the formulas, dashed: one per level (DDP and level 0 share theirs)
        g = sorted((r for r in rows if r["strategy"] == name), key=lambda r: r["gpus"])
        key = (g[0]["zero_level"], g[0]["offload"])
        if key in done:
            continue
        done.add(key)
        label = {0: "(4+K)Ψ", 1: "4Ψ + KΨ/N", 2: "2Ψ + (2+K)Ψ/N", 3: "(4+K)Ψ/N"}[key[0]]
        ax.plot([r["gpus"] for r in g], [r["formula"] / GIB for r in g], color=COLORS[key[0]], ls="--", lw=1,
                label=f"ZeRO {label}" + (f" − offloaded {key[1]}" if key[1] != "-" else ""))
    ax.axhline(limit_gib, color="black", lw=0.8, ls="-.")
    ax.text(min(r["gpus"] for r in rows), limit_gib * 1.08, f"{limit_gib:g} GiB GPU", fontsize=7)
    for a in (ax, dx):
        a.set_xscale("log", base=2)
        a.xaxis.set_major_formatter(matplotlib.ticker.FuncFormatter(lambda v, _: f"{v:g}"))
        a.set_xlabel("GPUs (N, data-parallel ranks)")
        a.grid(True, which="both", alpha=0.3)
    ax.set_yscale("log")
    ax.set_ylabel("model states per GPU (GiB)")
    ax.set_title(f"{model}: plan (solid) and ZeRO formula (dashed), bf16 + fp32 Adam, K = {K}", fontsize=9)
    ax.legend(fontsize=7, loc="lower left")
    dx.set_ylabel("plan − formula (bytes per parameter)")
    dx.set_title("the difference: padding, ZeRO-1's reduced shard, ZeRO-3's absent bf16 shard,\n"
                 "gathered units and unsharded gradients in flight", fontsize=9)
    dx.axhline(0, color="black", lw=0.8)
    dx.legend(fontsize=7)
    fig.tight_layout()
    fig.savefig(path, dpi=110)
    plt.close(fig)


# ---- arguments ----------------------------------------------------------------------------

def gpu_list(text):
    try:
        values = [int(x) for x in text.split(",")]
    except ValueError:
        values = []
    if not values or any(not 1 <= v <= 16777216 for v in values) or len(set(values)) != len(values):
        raise cli.BadInput(f"--gpus '{text}' is not allowed (a comma-separated list of distinct integers from 1 "
                           "to 16777216)")
    return sorted(values)


def parse_args(argv):
    ap = cli.parser(__doc__, __file__)
    ap.add_argument("--out", required=True, metavar="DIR",
                    help="folder for model_states.csv, .txt, .png and largest_fit.csv (required)")
    ap.add_argument("--overwrite", action="store_true", help="replace the files of a non-empty --out")
    ap.add_argument("--bin", default=os.path.join(ROOT, "build", "bin"),
                    help="folder of ddp_perf and fsdp_perf (default: build/bin of this checkout)")
    ap.add_argument("--model", default="t5-11.3b", help="the preset of the curve (default: t5-11.3b)")
    ap.add_argument("--gpus", default=DEFAULT_GPUS, help=f"GPU counts of the curve (default: {DEFAULT_GPUS})")
    ap.add_argument("--gpu-memory-gib", default="80",
                    help="memory per GPU, the plans' --mem-limit-gib (default: 80, the study's A100 80GB)")
    ap.add_argument("--host-memory-gib", default="128",
                    help="host memory per GPU for the offload plans' --host-mem-limit-gib (default: 128, a DGX A100's "
                         "1 TB over its 8 GPUs)")
    ap.add_argument("--fit-gpus", default="8", help="GPU count of the largest-model search (default: 8, a node)")
    ap.add_argument("--fit-models", default=None,
                    help="comma-separated presets searched for the largest that fits (default: the T5 family "
                         "of fsdp_perf --list-models, t5-tiny excepted)")
    ap.add_argument("--batch", default="8", help="sequences per GPU (default: 8, runs/fsdp_vs_ddp.toml's first)")
    ap.add_argument("--seq-len", default="512", help="tokens per sequence (default: 512, the study's)")
    return ap.parse_args(argv)


def positive_int(text, flag):
    try:
        v = int(text)
    except ValueError:
        v = 0
    top = 16777216 if flag == "--fit-gpus" else 2147483647
    if not 1 <= v <= top:
        raise cli.BadInput(f"{flag} '{text}' is not allowed (an integer from 1 to {top})")
    return v


def check_args(a):
    if not os.path.isdir(a.bin) or not all(os.access(os.path.join(a.bin, p), os.X_OK) for p in ("ddp_perf",
                                                                                                   "fsdp_perf")):
        raise cli.BadInput(f"--bin '{a.bin}' is not allowed (a folder holding ddp_perf and fsdp_perf; build them "
                           "with make)")
    a.gpus = gpu_list(a.gpus)
    text = a.gpu_memory_gib
    try:
        a.gpu_memory_gib = float(text)
    except ValueError:
        a.gpu_memory_gib = float("nan")
    if not (math.isfinite(a.gpu_memory_gib) and 0 < a.gpu_memory_gib <= 1048576):
        raise cli.BadInput(f"--gpu-memory-gib '{text}' is not allowed (a finite number > 0 and <= 1048576)")
    text = a.host_memory_gib
    try:
        HOST_LIMIT_GIB[0] = float(text)
    except ValueError:
        HOST_LIMIT_GIB[0] = float("nan")
    if not (math.isfinite(HOST_LIMIT_GIB[0]) and 0 < HOST_LIMIT_GIB[0] <= 1048576):
        raise cli.BadInput(f"--host-memory-gib '{text}' is not allowed (a finite number > 0 and <= 1048576)")
    a.fit_gpus = positive_int(a.fit_gpus, "--fit-gpus")
    a.batch = positive_int(a.batch, "--batch")
    a.seq_len = positive_int(a.seq_len, "--seq-len")
    known = runner.presets(a.bin)
    if a.model not in known:
        raise cli.BadInput(f"--model '{a.model}' is not allowed (allowed: {', '.join(known)})")
    if a.fit_models is None:
        a.fit_models = t5_family(known)
    else:
        models = a.fit_models.split(",")
        wrong = [m for m in models if m not in known]
        if wrong or not models:
            raise cli.BadInput(f"--fit-models '{a.fit_models}' is not allowed (a comma-separated list of: "
                               f"{', '.join(known)})")
        a.fit_models = models
    cli.check_output_dir(a.out, "--out")
    if os.path.isdir(a.out) and os.listdir(a.out) and not a.overwrite:
        raise cli.BadInput(f"--out '{a.out}' is not empty (pass --overwrite to replace its files)")


def progress(line):
    """One finished row, as it finishes, on a terminal only (stderr, as advise's and project's
    rows come while they run): it prints its table at the end; a pipe or a log gets the table
    alone."""
    if sys.stderr.isatty():
        print(f"model_states: {line}", file=sys.stderr, flush=True)


def largest_fits(a, strategies, planned):
    """Per strategy and checkpointing: the largest --fit-models preset whose plan fits, and the
    next larger one, which does not. The first strategy's plans (without checkpointing) give
    every preset's parameter count; the others walk the presets from the largest down.
    planned: run_plans' answers for every strategy, checkpointing and preset."""
    params, out = {}, []
    for s in strategies:
        for ck in (False, True):
            order = sorted(a.fit_models, key=lambda m: -params[m]) if params else a.fit_models
            tried = []
            for m in order:
                plan = accepted(s, m, a.fit_gpus, planned[(s["name"], m, a.fit_gpus, ck)])
                if plan is None:
                    break
                params[m] = plan["param_count"]
                tried.append((m, plan))
                if len(params) == len(a.fit_models) and plan["memory"]["fits"] and order is not a.fit_models:
                    break  # from the largest down: the first that fits is the answer
            tried.sort(key=lambda mp: -mp[1]["param_count"])
            best = next(((m, p) for m, p in tried if p["memory"]["fits"]), None)
            bigger = [(m, p) for m, p in tried if not p["memory"]["fits"] and
                      (best is None or p["param_count"] > best[1]["param_count"])]
            nxt = bigger[-1] if bigger else None
            alias = lambda mp: " / ".join(sorted((m for m in params if params[m] == mp[1]["param_count"]),  # noqa: E731
                                                 key=lambda m: (m != mp[0], m)))  # flan-t5-xl / t5-v1_1-xl: one shape
            best = (alias(best), best[1]) if best else None
            nxt = (alias(nxt), nxt[1]) if nxt else None
            out.append(dict(strategy=s["name"], activation_checkpointing=int(ck), gpus=a.fit_gpus,
                            gpu_memory_gib=a.gpu_memory_gib, batch=a.batch, seq_len=a.seq_len,
                            largest=best[0] if best else "", largest_params=best[1]["param_count"] if best else 0,
                            largest_peak=best[1]["memory"]["peak_total"] if best else 0,
                            next=nxt[0] if nxt else "", next_params=nxt[1]["param_count"] if nxt else 0,
                            next_peak=nxt[1]["memory"]["peak_total"] if nxt else 0))
            progress(f"largest fit on {a.fit_gpus} GPUs, {s['name']}{' with checkpointing' if ck else ''}: "
                     f"{best[0] if best else 'none'}")
    return out


def write_csv(path, rows):
    keys = list(dict.fromkeys(k for r in rows for k in r))
    with open(path, "w", newline="") as f:
        w = csv.DictWriter(f, fieldnames=keys)
        w.writeheader()
        for r in rows:
            w.writerow({k: (f"{v:.0f}" if isinstance(v, float) and v == int(v) else v) for k, v in r.items()})


def main(argv=None):
    a = parse_args(argv)
    try:
        check_args(a)
        strategies = list(STRATEGIES)
        if len(runner.capabilities(a.bin)["cpu_offload"]) > 1:  # more than "none"
            served = offload_variants(runner.offload_rule(a.bin))
            strategies += served
            notice = f"fsdp_perf has --cpu-offload: {len(served)} offload variants included"
        else:
            notice = "offload is not in this build (fsdp_perf --describe lists no --cpu-offload): no offload rows"
        jobs = [(s, a.model, n, True) for s in strategies for n in a.gpus]
        jobs += [(s, m, a.fit_gpus, ck) for s in strategies for ck in (False, True) for m in a.fit_models]
        progress(f"planning {len(jobs)} layouts (the curve's {len(strategies) * len(a.gpus)}, the largest-fit "
                 f"search's {len(jobs) - len(strategies) * len(a.gpus)})")
        planned = run_plans(a, jobs)
        rows = []
        for s in strategies:
            for n in a.gpus:
                plan = accepted(s, a.model, n, planned[(s["name"], a.model, n, True)])
                if plan is None:
                    break
                rows.append(compare(s, plan, n))
                progress(f"{len(rows)}/{len(strategies) * len(a.gpus)} {s['name']} at {n} GPUs: model states "
                         f"{rows[-1]['model_states'] / GIB:.2f} GiB per GPU (ZeRO formula {rows[-1]['formula'] / GIB:.2f})")
        fits = largest_fits(a, [s for s in strategies if any(r["strategy"] == s["name"] for r in rows)], planned)
    except cli.BadInput as e:
        print(f"model_states: error: {e}", file=sys.stderr)
        return 2
    except Mismatch as e:
        print(f"model_states: mismatch: {e}", file=sys.stderr)
        return 1
    table = (f"{notice}\n" f"model states per GPU of {a.model} (parameters + gradients + optimizer_state + comm_buffers "
             f"peaks of the plan; bf16, fp32 master and Adam, K = {K}; batch {a.batch}, seq {a.seq_len}, "
             "activation checkpointing; B/p: bytes per parameter of the model)\n" + text_table(rows) + "\n"
             + fit_table(fits, a.fit_gpus, a.gpu_memory_gib, a.batch, a.seq_len)
             + "".join(f"{x}\n" for x in dict.fromkeys(LEFT_OUT)))
    try:  # all four files or none (cli.Outputs)
        with cli.Outputs(a.overwrite) as out:
            out.makedirs(a.out)
            write_csv(out.temp(os.path.join(a.out, "model_states.csv")), rows)
            write_csv(out.temp(os.path.join(a.out, "largest_fit.csv")), fits)
            with out.open(os.path.join(a.out, "model_states.txt")) as f:
                f.write(table)
            draw(rows, a.model, a.gpu_memory_gib, out.temp(os.path.join(a.out, "model_states.png")))
            out.publish()
    except cli.BadInput as e:
        print(f"model_states: error: {e}", file=sys.stderr)
        return 2
    print(table, end="")
    print(f"model_states: wrote model_states.csv, model_states.txt, largest_fit.csv, model_states.png in {a.out}/")
    return 0


if __name__ == "__main__":
    sys.exit(cli.run(__file__, main))
