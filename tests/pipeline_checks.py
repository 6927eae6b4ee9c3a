#!/usr/bin/python3
"""Pipeline assertions on shardbench results, each with its evidence on one line per file
(tests/pp_tests.sh; the checks themselves are tests/check_trace.py's, which runs them on
every pipeline trace):

    tests/pipeline_checks.py activations --one-micro-batch REF.h5 FILE...
        each stage's peak activations (/memory_peaks) = the micro-batches it holds x one
        micro-batch's, read from REF: the same pipeline run with a single micro-batch of
        FILE's micro-batch size (--batch batch/M --micro-batches 1). Held: M on every stage
        under GPipe, min(S - s, M) on stage s under 1F1B. Exact (the accounting is bytes).
    tests/pipeline_checks.py transfers FILE...
        every rank's sends and receives, in issue order, name the neighbouring stage's rank
        (s + 1 forward, s - 1 backward) and carry the cut's tensors' bytes.
    tests/pipeline_checks.py pairs FILE...
        every send pairs with one receive (per step, k-th with k-th, same bytes), which
        completes after the send starts.
    tests/pipeline_checks.py order FILE...
        each stage's forwards and backwards in the schedule's order.

Prints "ok FILE: ..." or "FAIL FILE" and the reasons; exit 1 on any failure.
"""
import argparse
import os
import sys

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, HERE)
sys.path.insert(0, os.path.join(HERE, "..", "analysis"))
import check_trace as ct  # noqa: E402
from shardbench_h5 import load  # noqa: E402

SAME = ("pp_size", "dtype", "d_model", "d_ff", "layers", "heads", "d_kv", "vocab", "enc_seq_len", "dec_seq_len",
        "tp_size", "attention", "activation_checkpointing", "ffn", "tie_embeddings")


def stage_ranks(run):
    _, coords = ct.mesh_rank(run)
    out = {}
    for rank, c in sorted(coords.items()):
        out.setdefault(c[0], []).append(rank)
    return out


def activations(c, run, ref):
    m, r = run.meta, ref.meta
    S, M, sched = m["pp_size"], m["micro_batches"], m["pp_schedule"]
    for k in SAME:
        c.expect(m.get(k) == r.get(k), f"reference {k} {r.get(k)} != {m.get(k)}")
    c.expect(r["micro_batches"] == 1, f"reference has {r['micro_batches']} micro-batches, not 1")
    c.expect(r["batch_per_rank"] * M == m["batch_per_rank"],
             f"reference batch {r['batch_per_rank']} is not this run's micro-batch ({m['batch_per_rank']} / {M})")
    c.expect(ref.plan.get("stage_first") == run.plan.get("stage_first"), "reference split differs")
    if c.errors:
        return ""
    peak = {int(p["rank"]): int(p["activations"]) for _, p in run.peaks.iterrows()}
    ref_peak = {int(p["rank"]): int(p["activations"]) for _, p in ref.peaks.iterrows()}
    one = {}
    for s, ranks in stage_ranks(ref).items():
        v = {ref_peak[x] for x in ranks}
        c.expect(len(v) == 1 and min(v) > 0, f"reference stage {s}: activations {sorted(v)}")
        one[s] = max(v)
    held = {s: M if sched == "gpipe" else min(S - s, M) for s in range(S)}
    got = {}
    for s, ranks in stage_ranks(run).items():
        for x in ranks:
            c.expect(peak[x] == held[s] * one[s], f"rank {x} (stage {s}): peak activations {peak[x]} B, "
                                                  f"{sched} holds {held[s]} x {one[s]} B = {held[s] * one[s]} B"
                                                  f" (ratio {peak[x] / one[s]:.3f})")
        got[s] = peak[ranks[0]]
    return (f"{sched} S {S} M {M}: peak activations per stage {[got[s] for s in range(S)]} = held "
            f"{[held[s] for s in range(S)]} x one micro-batch's {[one[s] for s in range(S)]}")


def transfers(c, run):
    ct.check_transfers(c, run)
    m, e = run.meta, run.events
    S, M = m["pp_size"], m["micro_batches"]
    step = int(max(run.steps["step"]))
    sends = e[(e["op_name"] == "send") & (e["step"] == step)]
    parts = []
    for s, ranks in stage_ranks(run).items():
        want = ct.expected_transfers(run, ranks[0])
        for phase in ("forward", "backward"):
            w = want[("send", phase)]
            if w:
                per = [b for _, b in w[:len(w) // M]]
                parts.append(f"{ranks[0]}->{w[0][0]} {phase} {M} x {per}")
    extra = len(sends) // (m["world_size"] // S) - 2 * M * (S - 1)
    return (f"step {step}: sends {len(sends)} ({m['world_size'] // S} pipeline(s) x (2 M (S - 1) = {2 * M * (S - 1)}"
            f" + {extra} of the split's extra tensors)); first pipeline: " + "; ".join(parts))


def pairs(c, run):
    fits = ct.check_pairs(c, run)
    e = run.events
    n = int((e["op_name"] == "send").sum())
    steps = sorted(set(e[e["op_name"] == "send"]["step"]))
    slack = max((hi - lo for lo, hi in fits.values()), default=0.0)
    return (f"{n} sends paired with {int((e['op_name'] == 'recv').sum())} receives (steps {steps}, "
            f"{len(fits)} rank pairs: k-th with k-th, same bytes, received after sent under one clock "
            f"offset per pair, which the messages pin to within {slack * 1e6:.1f} us)")


def order(c, run):
    seen = ct.check_order(c, run)
    m = run.meta
    S, M = m["pp_size"], m["micro_batches"]
    warm = [min(S - s - 1, M) if m["pp_schedule"] == "1f1b" else M for s in range(S)]
    lead = [len(a) - len(a.lstrip("F")) if a else None for a in seen.values()]
    return (f"{m['pp_schedule']} S {S} M {M}: " + ", ".join(f"stage {s} {a}" for s, a in seen.items()) +
            f"; warm-up forwards {warm}, forwards before the first backward {lead}")


def main():
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("what", choices=["activations", "transfers", "pairs", "order"])
    ap.add_argument("files", nargs="+")
    ap.add_argument("--one-micro-batch", help="activations: the reference run (one micro-batch)")
    a = ap.parse_args()
    if a.what == "activations" and not a.one_micro_batch:
        ap.error("activations needs --one-micro-batch")
    ref = load(a.one_micro_batch) if a.one_micro_batch else None
    failed = 0
    for path in a.files:
        c = ct.Checker(path)
        run = load(path)
        c.expect(run.meta["status"] == "ok" and run.meta.get("pp_size", 1) > 1, "not a completed pipeline run")
        text = ""
        if not c.errors:
            text = {"activations": lambda: activations(c, run, ref), "transfers": lambda: transfers(c, run),
                    "pairs": lambda: pairs(c, run), "order": lambda: order(c, run)}[a.what]()
        if c.errors:
            print(f"FAIL {path}" + "".join(f"\n     {e}" for e in c.errors[:10]))
        else:
            print(f"ok {path}: {text}")
        failed += bool(c.errors)
    return 1 if failed else 0


if __name__ == "__main__":
    sys.exit(main())
