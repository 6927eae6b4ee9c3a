#!/usr/bin/env python3
"""Same figures before and after a change that must not change behaviour.

  /usr/bin/python3 scripts/same_figures.py OLD_BIN NEW_BIN [--quick] [--projections] [--keep DIR]

OLD_BIN and NEW_BIN are two builds' bin folders (e.g. a worktree of main's build/bin and
this checkout's). Three comparisons, each with both builds on the same input:
  plans        every configuration of tests/test_plan_batch.py (with every op) and the 200
               layouts of runs/plan_batch_t5-11.3b_w512.txt (without ops), through
               --plan-batch: each line's JSON equal;
  projections  (with --projections: 5 to 30 min on 2 cores) analysis/project.py --matrix on
               each runs/*.toml the projection takes, on runs/clusters/a100-80gb.toml: the
               results it writes equal (metadata, plan, steps, events; not the command line);
  --check      4 ranks of t5-tiny with --check for each strategy family (DDP, the five
               shardings, both offloads, --tp 2, --pp 2): the verdict line equal, and in the
               HDF5 result every step's loss, the plan and each rank's measured peak equal.
Prints one line per comparison and "same figures: N equal, M differ"; exit 0 when all are
equal, 1 when any differs, 2 on bad input. --quick skips the 200 layouts.
"""
import argparse
import json
import os
import shutil
import subprocess
import sys
import tempfile

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
sys.path.insert(0, os.path.join(ROOT, "tests"))
sys.path.insert(0, os.path.join(ROOT, "analysis"))
import test_plan_batch  # noqa: E402  (its CONFIGS: the configurations every plan change is held to)

PY = "/usr/bin/python3"
TINY = "--model t5-tiny --batch 2 --seq-len 12 --dec-seq-len 8 --steps 2 --warmup 1 --check"
CHECKS = [  # (program, flags) run on 4 ranks with TINY
    ("ddp_perf", ""),
    ("fsdp_perf", "--sharding full"),
    ("fsdp_perf", "--sharding hybrid --shard-size 2 --dtype bf16 --reduce-dtype fp32"),
    ("fsdp_perf", "--sharding grad-op --micro-batches 2 --grad-accumulation sharded"),
    ("fsdp_perf", "--sharding none --optimizer sgd --momentum 0.9"),
    ("fsdp_perf", "--sharding optimizer-state --optimizer adamw-8bit"),
    ("fsdp_perf", "--cpu-offload params --activation-checkpointing"),
    ("fsdp_perf", "--zero-stage 2 --cpu-offload optimizer"),
    ("fsdp_perf", "--tp 2 --sharding full"),
    ("ddp_perf", "--pp 2 --micro-batches 2 --pp-schedule 1f1b"),
    ("fsdp_perf", "--pp 2 --micro-batches 2 --pp-schedule gpipe --sharding full"),
]
equal = differ = 0


def report(name, same, detail=""):
    global equal, differ
    if same:
        equal += 1
        print(f"same  {name}")
    else:
        differ += 1
        print(f"DIFF  {name}" + (f"\n      | {str(detail)[:1500]}" if detail else ""))
    sys.stdout.flush()


def first_difference(a, b, path=""):
    """Where two parsed JSON values first differ, as a path and the two values."""
    if type(a) is not type(b):
        return f"{path}: {a!r} vs {b!r}"
    if isinstance(a, dict):
        for k in sorted(set(a) | set(b)):
            if k not in a or k not in b:
                return f"{path}/{k}: only in {'new' if k in b else 'old'}"
            d = first_difference(a[k], b[k], f"{path}/{k}")
            if d:
                return d
        return None
    if isinstance(a, list):
        if len(a) != len(b):
            return f"{path}: {len(a)} vs {len(b)} items"
        for i, (x, y) in enumerate(zip(a, b)):
            d = first_difference(x, y, f"{path}[{i}]")
            if d:
                return d
        return None
    return None if a == b else f"{path}: {a!r} vs {b!r}"


def plan_batch(bins, program, lines, ops, tmp, name):
    path = os.path.join(tmp, f"{program}-{name}.txt")
    with open(path, "w") as f:
        f.write("\n".join(lines) + "\n")
    out = []
    for b in bins:
        r = subprocess.run([os.path.join(b, program), "--plan-batch", path, "--plan-batch-ops", ops],
                           capture_output=True, text=True)
        out.append((r.returncode, r.stderr, [json.loads(l) for l in r.stdout.splitlines()]))
    (rc_a, err_a, rows_a), (rc_b, err_b, rows_b) = out
    report(f"plans {program} {name} ({len(lines)} lines, ops {ops}): exit and stderr", rc_a == rc_b and err_a == err_b,
           (rc_a, rc_b, err_a[-300:], err_b[-300:]))
    diffs = [(i, first_difference(x, y)) for i, (x, y) in enumerate(zip(rows_a, rows_b)) if x != y]
    report(f"plans {program} {name}: {len(rows_b)} JSON lines, {len(rows_b) - len(diffs)} equal",
           len(rows_a) == len(rows_b) and not diffs,
           f"{len(rows_a)} vs {len(rows_b)} lines; first: line {diffs[0][0]}: {diffs[0][1]}" if diffs else
           f"{len(rows_a)} vs {len(rows_b)} lines")


def compare_plans(bins, tmp, quick):
    for program in ("fsdp_perf", "ddp_perf"):
        lines = [line for p, line in test_plan_batch.CONFIGS if p == program]
        plan_batch(bins, program, lines, "all", tmp, "test_plan_batch")
    if not quick:
        with open(os.path.join(ROOT, "runs", "plan_batch_t5-11.3b_w512.txt")) as f:
            lines = [l.rstrip("\n") for l in f if l.strip() and not l.startswith("#")]
        plan_batch(bins, "fsdp_perf", lines, "none", tmp, "t5-11.3b-w512")


def compare_projections(bins, tmp):
    cluster = os.path.join(ROOT, "runs", "clusters", "a100-80gb.toml")
    for matrix in sorted(f for f in os.listdir(os.path.join(ROOT, "runs")) if f.endswith(".toml")):
        outs, rcs, errs = [], [], []
        for i, b in enumerate(bins):
            out = os.path.join(tmp, f"project-{matrix}-{i}")
            r = subprocess.run([PY, os.path.join(ROOT, "analysis", "project.py"), "--cluster", cluster, "--matrix",
                                os.path.join(ROOT, "runs", matrix), "--bin", b, "--out", out],
                               capture_output=True, text=True)
            outs.append(out)
            rcs.append(r.returncode)
            errs.append(r.stderr.strip().splitlines()[-1:] if r.returncode else [])
        if rcs[0] == rcs[1] == 2 and errs[0] == errs[1]:
            print(f"skip  projection of runs/{matrix}: refused by both ({errs[0][0] if errs[0] else 'exit 2'})")
            continue
        names = [sorted(os.listdir(o)) if os.path.isdir(o) else [] for o in outs]
        bad = [f for f in names[1] if f in names[0] and
               projected_figures(os.path.join(outs[0], f)) != projected_figures(os.path.join(outs[1], f))]
        report(f"projection of runs/{matrix}: exit {rcs[1]}, {len(names[1])} files, {len(names[1]) - len(bad)} equal",
               rcs[0] == rcs[1] and names[0] == names[1] and names[1] and not bad,
               (rcs, errs, len(names[0]), len(names[1]), bad[:3],
                first_difference(projected_figures(os.path.join(outs[0], bad[0])),
                                 projected_figures(os.path.join(outs[1], bad[0]))) if bad else None))


def projected_figures(path):
    """A projected result's figures: its metadata, plan, steps and events (not its provenance,
    which names the command line), or a CSV's text."""
    if not path.endswith(".h5"):
        with open(path, "rb") as f:
            return f.read()
    import shardbench_h5
    run = shardbench_h5.load(path)
    table = lambda t: json.loads(t.to_json(orient="split", double_precision=15)) if len(t) else None  # noqa: E731
    return {"meta": {k: str(v) for k, v in run.meta.items()}, "plan": {k: str(v) for k, v in run.plan.items()},
            "steps": table(run.steps), "events": table(run.events), "peaks": table(run.peaks)}


def run_check(b, program, flags, out):
    cmd = ["timeout", "300", "mpirun", "-np", "4", "--oversubscribe", "--bind-to", "none",
           os.path.join(b, program)] + TINY.split() + flags.split() + ["--out", out]
    r = subprocess.run(cmd, capture_output=True, text=True, stdin=subprocess.DEVNULL)
    verdict = [l.split("check: ", 1)[1] for l in r.stdout.splitlines() if "check: " in l]
    return r.returncode, verdict


def figures(path):
    import shardbench_h5
    run = shardbench_h5.load(path)
    steps = run.steps.sort_values(["rank", "step"]) if "rank" in run.steps else run.steps
    loss = [round(float(x), 12) for x in steps["loss"]] if "loss" in steps else None
    peaks = run.peaks.to_dict("list") if len(run.peaks) else {}
    peaks = {k: v for k, v in peaks.items() if "time" not in k}
    return {"loss": loss, "plan": {k: str(v) for k, v in run.plan.items()}, "peaks": peaks}


def compare_checks(bins, tmp):
    for n, (program, flags) in enumerate(CHECKS):
        got = []
        for i, b in enumerate(bins):
            out = os.path.join(tmp, f"check-{n}-{i}.h5")  # one name per configuration and build
            rc, verdict = run_check(b, program, flags, out)
            got.append((rc, verdict, figures(out) if rc == 0 and os.path.exists(out) else None))
        (rc_a, v_a, f_a), (rc_b, v_b, f_b) = got
        ok = rc_a == rc_b == 0 and v_a == v_b and f_a == f_b and f_b["loss"]
        report(f"--check {program} {flags or '(default)'}: exit {rc_b}, {' '.join(v_b)[:80]}",
               ok, (rc_a, rc_b, v_a, v_b, first_difference(f_a, f_b) if f_a and f_b else None))


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("old_bin")
    ap.add_argument("new_bin")
    ap.add_argument("--quick", action="store_true", help="without the 200 layouts of runs/plan_batch_*.txt")
    ap.add_argument("--projections", action="store_true", help="also project runs/*.toml with both builds")
    ap.add_argument("--keep", help="keep the outputs in this folder (default: a temporary one, removed)")
    a = ap.parse_args()
    bins = [os.path.abspath(a.old_bin), os.path.abspath(a.new_bin)]
    for b in bins:
        for p in ("ddp_perf", "fsdp_perf"):
            if not os.access(os.path.join(b, p), os.X_OK):
                print(f"same_figures.py: error: no program {p} in {b} (give a build's bin folder)", file=sys.stderr)
                return 2
    tmp = a.keep or tempfile.mkdtemp(prefix="same-figures-")
    os.makedirs(tmp, exist_ok=True)
    try:
        compare_plans(bins, tmp, a.quick)
        if a.projections:
            compare_projections(bins, tmp)
        compare_checks(bins, tmp)
    finally:
        if not a.keep:
            shutil.rmtree(tmp, ignore_errors=True)
    print(f"same figures: {equal} equal, {differ} differ ({bins[0]} -> {bins[1]})")
    return 1 if differ else 0


if __name__ == "__main__":
    sys.exit(main())
