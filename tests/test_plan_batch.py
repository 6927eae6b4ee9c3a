#!/usr/bin/env python3
"""--plan-batch (fsdp_perf, ddp_perf): each configuration's line equals its single run.

For a dozen configurations (DDP, every sharding, --tp, --pp with micro-batches and both
schedules, CPU offload, the optimizers, one the parser refuses, two that do not fit), the
batch's schedule objects equal the files `--plan --schedule-json` writes (both parsed as
JSON), its exit codes equal the single runs' (0, 2, 3), a refused line's error is the
single run's message; --plan-batch-ops none equals all without the per-op rows, also where
it plans a 1F1B pipeline of many micro-batches from three plans of fewer (and says so);
"totals" sums the ops (GEMM shapes and elementwise sizes too); comments, blank lines and
stdin; bad input is one line and exit 2. --describe (both programs): one JSON line, its
offload rule the one fsdp_perf refuses by (every --sharding x --cpu-offload planned).
Run from anywhere (needs build/bin and scripts/mpi-env.sh's environment for MPI as root).
  BIN=/other/build/bin python3 tests/test_plan_batch.py
"""
import json, os, subprocess, sys, tempfile

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
BIN = os.environ.get("BIN", os.path.join(ROOT, "build", "bin"))
passed = failed = 0


def check(name, ok, detail=""):
    global passed, failed
    if ok:
        passed += 1
        print("ok    " + name)
    else:
        failed += 1
        print("FAIL  " + name + ("\n      | " + str(detail)[:2000].replace("\n", "\n      | ") if detail else ""))


def run(args, stdin=None):
    return subprocess.run(args, input=stdin, capture_output=True, text=True, timeout=300)


SMALL = "--model t5-small --batch 4 --seq-len 32 --world-size 8"
CONFIGS = [  # (program, line)
    ("ddp_perf", SMALL),
    ("ddp_perf", SMALL + " --tp 2 --dtype bf16 --bucket-mb 4"),
    ("fsdp_perf", SMALL),
    ("fsdp_perf", SMALL + " --sharding hybrid --shard-size 2 --dtype bf16 --reduce-dtype fp32"),
    ("fsdp_perf", SMALL + " --sharding grad-op --activation-checkpointing"),
    ("fsdp_perf", SMALL + " --sharding none --optimizer sgd --momentum 0.9"),
    ("fsdp_perf", SMALL + " --zero-stage 1 --optimizer adamw-8bit"),
    ("fsdp_perf", SMALL + " --tp 2 --pp 2 --micro-batches 4 --pp-schedule gpipe"),
    ("fsdp_perf", SMALL + " --pp 4 --micro-batches 2 --pp-schedule 1f1b --grad-accumulation sharded"),
    ("fsdp_perf", SMALL + " --cpu-offload params"),
    ("fsdp_perf", SMALL + " --sharding optimizer-state --cpu-offload optimizer --plan"),
    ("fsdp_perf", SMALL + " --tp 3"),                                       # refused: exit 2
    ("fsdp_perf", SMALL + " --pp 3 --world-size 8"),                        # the layout refuses: exit 2
    ("fsdp_perf", "--model t5-11.3b --world-size 8 --mem-limit-gib 1"),    # device: exit 3
    ("fsdp_perf", SMALL + " --cpu-offload params --host-mem-limit-gib 0.0001"),  # host: exit 3
    ("ddp_perf", "--model t5-11.3b --world-size 64 --tp 8 --pp 8 --batch 8 --micro-batches 8 --mem-limit-gib 1"),
    # more than 3 m0 + 3 micro-batches: without ops, planned from m0 .. m0 + 2 (S + 2 under 1F1B, 4 under GPipe)
    ("ddp_perf", SMALL.replace("--batch 4", "--batch 16") + " --pp 2 --micro-batches 16 --bucket-mb 4"),
    ("fsdp_perf", SMALL.replace("--batch 4", "--batch 32") + " --pp 2 --micro-batches 16"),
    ("fsdp_perf", SMALL.replace("--batch 4", "--batch 32") + " --pp 2 --micro-batches 32 --sharding optimizer-state "
     "--cpu-offload optimizer --activation-checkpointing --dtype bf16"),
    ("fsdp_perf", SMALL.replace("--batch 4", "--batch 16") + " --tp 2 --pp 2 --micro-batches 16 --sharding hybrid "
     "--shard-size 2 --grad-accumulation sharded --cpu-offload params"),
    ("fsdp_perf", SMALL.replace("--batch 4", "--batch 24") + " --pp 4 --micro-batches 24 --sharding grad-op "
     "--optimizer adamw-8bit --mem-limit-gib 0.001"),                      # planned from fewer, exit 3
    ("fsdp_perf", SMALL.replace("--batch 4", "--batch 30") + " --pp 2 --micro-batches 15"),  # 15: planned directly
    ("fsdp_perf", SMALL.replace("--batch 4", "--batch 32") + " --pp 2 --micro-batches 32 --pp-schedule gpipe"),
    ("fsdp_perf", SMALL.replace("--batch 4", "--batch 64") + " --pp 4 --micro-batches 64 --pp-schedule gpipe "
     "--activation-checkpointing --cpu-offload optimizer"),
    # GPipe whose peak is not at the end of its forwards at 4 .. 6 micro-batches (the host
    # copies' staging, checkpointing): the steeper line might pass it, so planned directly
    ("fsdp_perf", SMALL.replace("--batch 4", "--batch 32") + " --pp 2 --micro-batches 32 --pp-schedule gpipe "
     "--activation-checkpointing --sharding optimizer-state --cpu-offload optimizer"),
]
DIRECT_GPIPE = {CONFIGS[-1][1]}
LINE = "planned_from_micro_batches"  # only without ops (--plan-batch-ops none)


def from_line(program, line):
    """The micro-batch counts the plan without ops of `line` is extended from (plan.cpp's
    plan_by_micro_batch_line), None where it is planned directly: S stages, m0 = S + 2 (1F1B)
    or 4 (GPipe), more than 3 m0 + 3 micro-batches, and under GPipe a peak that grows with them
    (not the lines of DIRECT_GPIPE)."""
    w = line.split()
    get = lambda flag, default: w[w.index(flag) + 1] if flag in w else default  # noqa: E731
    S, M, gpipe = int(get("--pp", "1")), int(get("--micro-batches", "0")), get("--pp-schedule", "1f1b") == "gpipe"
    m0 = 4 if gpipe else S + 2
    return [m0, m0 + 1, m0 + 2] if S > 1 and M > 3 * m0 + 3 and line not in DIRECT_GPIPE else None


def without_ops(schedule):
    s = dict(schedule)
    s.pop("ops", None)
    if "stages" in s:
        s["stages"] = [{k: v for k, v in st.items() if k != "ops"} for st in s["stages"]]
    return s


def totals_of(ops, names, axes, lane):
    out = {}
    for r in ops:
        if r[lane] >= 100:  # CPU offload's lanes: the totals' "host" object, not "ops"
            continue
        kind, axis = names[r[0]], axes[r[10]] if r[10] >= 0 else "none"
        e = out.setdefault(kind, {}).setdefault(axis, {"count": 0, "bytes": 0})
        e["count"] += 1
        e["bytes"] += r[3]
        if r[10] >= 0:
            e["sent_bytes"] = e.get("sent_bytes", 0) + r[12]
    return out


def main():
    tmp = tempfile.mkdtemp()
    for program in ("fsdp_perf", "ddp_perf"):
        lines = ["# " + program + ": comments and blank lines keep their numbers", ""]
        mine = [(i, line) for i, (p, line) in enumerate(CONFIGS) if p == program]
        lines += [line for _, line in mine]
        path = os.path.join(tmp, program + ".txt")
        with open(path, "w") as f:
            f.write("\n".join(lines) + "\n")
        batch = {}
        for ops in ("all", "none"):
            r = run([os.path.join(BIN, program), "--plan-batch", path, "--plan-batch-ops", ops])
            check(f"{program} --plan-batch-ops {ops}: exit 0, nothing on stderr", r.returncode == 0 and not r.stderr,
                  r.stderr)
            rows = [json.loads(l) for l in r.stdout.splitlines()]
            check(f"{program} --plan-batch-ops {ops}: one JSON line per configuration, in order, numbered as FILE",
                  [d["line"] for d in rows] == list(range(3, 3 + len(mine))), [d.get("line") for d in rows])
            batch[ops] = rows
        r = run([os.path.join(BIN, program), "--plan-batch", "-"], stdin="\n".join(lines) + "\n")
        check(f"{program} --plan-batch - (stdin) = the file's", [json.loads(l) for l in r.stdout.splitlines()] ==
              batch["all"], r.stderr)
        for (index, line), got, got_none in zip(mine, batch["all"], batch["none"]):
            name = f"{program} {line}"
            out = os.path.join(tmp, f"single-{index}.json")
            if os.path.exists(out):
                os.remove(out)
            single = run([os.path.join(BIN, program), "--plan"] + line.split() + ["--schedule-json", out])
            check(f"{name}: exit {single.returncode} as the single run's", got["exit"] == single.returncode, got)
            if single.returncode == 2:
                message = single.stderr.strip().split(": error: ", 1)[-1]
                check(f"{name}: the single run's message", got.get("error") == message and "schedule" not in got,
                      (got, single.stderr))
                continue
            with open(out) as f:
                want = json.load(f)
            check(f"{name}: schedule = --schedule-json's file", got.get("schedule") == want,
                  [k for k in want if want.get(k) != got.get("schedule", {}).get(k)])
            none = dict(got_none.get("schedule", {}))
            line_from = none.pop(LINE, None)
            check(f"{name}: ops none = all without the ops", none == without_ops(want)
                  and got_none["exit"] == got["exit"] and "ops" not in none,
                  [k for k in want if k != "ops" and want.get(k) != none.get(k)])
            expect = from_line(program, line)
            check(f"{name}: ops none {f'extended from {expect} micro-batches' if expect else 'planned directly'}",
                  line_from == expect and LINE not in want, line_from)
            stages = [st["ops"] for st in want["stages"]] if "stages" in want else [want["ops"]]
            totals = want["totals"]
            lane, cols = want["columns"].index("lane"), want["columns"]

            def host_of(ops):  # CPU offload's lanes: 101 uploads, 102 downloads, 100 the update
                c = [r for r in ops if want["op_names"][r[0]] == "copy" and r[lane] in (101, 102)]
                u = [r for r in ops if want["op_names"][r[0]] == "optimizer" and r[lane] == 100]
                if not c and not u:
                    return None
                return {"h2d_bytes": sum(r[3] for r in c if r[lane] == 101),
                        "d2h_bytes": sum(r[3] for r in c if r[lane] == 102),
                        "update_bytes": sum(r[3] for r in u), "copy_count": len(c), "update_count": len(u)}
            check(f"{name}: totals' host object sums the offload lanes, per stage",
                  all(t.get("host") == host_of(ops) for t, ops in zip(totals, stages)), [t.get("host") for t in totals])
            def shapes_of(ops):  # the compute lane's GEMM shapes and elementwise sizes, as the totals give them
                g, e, names, c = {}, {}, want["op_names"], {n: i for i, n in enumerate(cols)}
                for r in ops:
                    if r[lane] >= 100:
                        continue
                    if names[r[0]] == "gemm":
                        key = tuple(r[c[k]] for k in ("m", "n", "k", "batch"))
                        n, f = g.get(key, (0, 0))
                        g[key] = (n + 1, f + r[4])
                    elif names[r[0]] == "elementwise":
                        e[r[3]] = e.get(r[3], 0) + 1
                return [list(k) + [n, f] for k, (n, f) in sorted(g.items())], [[b, n] for b, n in sorted(e.items())]
            check(f"{name}: totals' GEMM shapes and elementwise sizes count the ops, per stage",
                  all([t["gemm_shapes"], t["elementwise_sizes"]] == list(shapes_of(ops)) for t, ops in zip(totals, stages)),
                  [t["gemm_shapes"][:3] for t in totals])
            check(f"{name}: totals sum the device lanes' ops, per stage", len(totals) == len(stages) and all(
                t["ops"] == totals_of(ops, want["op_names"], want["axis_names"], lane) and
                t["gemm_flops"] == sum(r[4] for r in ops if want["op_names"][r[0]] == "gemm")
                for t, ops in zip(totals, stages)), totals)
            if got["exit"] == 3:
                check(f"{name}: exit 3 where memory says it does not fit",
                      not (want["memory"]["fits"] and want["memory"]["host_fits"]))

    # Bad input: one line, exit 2, nothing on stdout.
    fsdp = os.path.join(BIN, "fsdp_perf")
    good = os.path.join(tmp, "fsdp_perf.txt")
    for name, args, pattern in [
        ("a missing FILE", [fsdp, "--plan-batch", os.path.join(tmp, "none.txt")],
         "--plan-batch '" + os.path.join(tmp, "none.txt") + "' cannot be read: No such file or directory"),
        ("--plan-batch with another flag", [fsdp, "--plan-batch", good, "--tp", "2"],
         "--plan-batch takes no other flags on the command line (got --tp)"),
        ("--plan-batch with --plan", [fsdp, "--plan", "--plan-batch", good], "--plan-batch takes no other flags"),
        ("--plan-batch-ops without --plan-batch", [fsdp, "--plan-batch-ops", "none", "--plan"],
         "--plan-batch-ops is only allowed with --plan-batch"),
        ("--plan-batch-ops some", [fsdp, "--plan-batch", good, "--plan-batch-ops", "some"],
         "--plan-batch-ops 'some' is not allowed (allowed: all, none)"),
    ]:
        r = run(args)
        lines = r.stderr.splitlines()
        check(f"bad input: {name}: one line, exit 2", r.returncode == 2 and not r.stdout and len(lines) == 1 and
              pattern in lines[0], (r.returncode, r.stdout[:300], r.stderr))
    r = run([fsdp, "--plan-batch", "-"], stdin="--world-size 8 --out x.h5\n--world-size 8 --schedule-json=x.json\n"
            "--model t5-small\n--world-size 8 --help\n--world-size 8 --plan-batch y\n--world-size 8 --bogus\n"
            "--world-size 8\n")
    rows = [json.loads(l) for l in r.stdout.splitlines()]
    want = [(1, 2, "--out is not allowed in a --plan-batch line"),
            (2, 2, "--schedule-json is not allowed in a --plan-batch line"),
            (3, 2, "a --plan-batch line must give --world-size"),
            (4, 2, "--help is not allowed in a --plan-batch line"),
            (5, 2, "--plan-batch is not allowed in a --plan-batch line"),
            (6, 2, "The following argument was not expected: --bogus (see --help)"),
            (7, 0, None)]
    check("bad lines: exit 2 each with its line, the batch goes on (exit 0)", r.returncode == 0 and
          [(d["line"], d["exit"]) for d in rows] == [(l, e) for l, e, _ in want] and
          all(p is None or d["error"].startswith(p) for d, (_, _, p) in zip(rows, want)) and
          not os.path.exists("x.h5") and not os.path.exists("x.json"), r.stdout[:2000])
    describe_checks()
    print(f"{passed} passed, {failed} failed")
    return 1 if failed else 0


def describe_checks():
    """--describe: one JSON line of what the program offers the tools (analysis/runner.py),
    its offload rule what fsdp_perf refuses by: every --sharding x --cpu-offload it lists
    planned (a tiny model, --plan-batch), exit 2 exactly where the rule says no."""
    info = {}
    for program in ("fsdp_perf", "ddp_perf"):
        r = run([os.path.join(BIN, program), "--describe"])
        lines = r.stdout.splitlines()
        try:
            info[program] = json.loads(lines[0]) if len(lines) == 1 else None
        except ValueError:
            info[program] = None
        check(f"{program} --describe: exit 0, one valid JSON line naming the program",
              r.returncode == 0 and not r.stderr and info[program] is not None and
              info[program].get("program") == program and info[program].get("plan_batch") is True and
              {"version", "optimizers", "shardings", "cpu_offload", "offload_rule"} <= set(info[program]), r.stdout)
        r = run([os.path.join(BIN, program), "--describe", "--plan"])
        check(f"{program} --describe with another flag: one line, exit 2", r.returncode == 2 and not r.stdout and
              len(r.stderr.splitlines()) == 1, r.stderr)
    d = info["fsdp_perf"] or {}
    rule, shardings, offloads = d.get("offload_rule", {}), d.get("shardings", []), d.get("cpu_offload", [])
    check("fsdp_perf --describe: a rule for each --cpu-offload value, in its --sharding values",
          set(rule) == set(offloads) and {"none", "params", "optimizer"} <= set(offloads) and
          all(set(v) <= set(shardings) for v in rule.values()) and set(rule["none"]) == set(shardings), d)
    pairs = [(s, o) for o in offloads for s in shardings]
    tiny = "--model t5-tiny --batch 2 --seq-len 8 --world-size 4"
    stdin = "".join(f"{tiny} --sharding {s}{' --shard-size 2' if s == 'hybrid' else ''} --cpu-offload {o}\n"
                    for s, o in pairs)
    r = run([os.path.join(BIN, "fsdp_perf"), "--plan-batch", "-", "--plan-batch-ops", "none"], stdin=stdin)
    rows = [json.loads(x) for x in r.stdout.splitlines()]
    got = {(s, o): row["exit"] for (s, o), row in zip(pairs, rows)}
    want = {(s, o): 0 if s in rule.get(o, ()) else 2 for s, o in pairs}
    check(f"fsdp_perf: the {len(pairs)} --sharding x --cpu-offload plans refused exactly where --describe's rule "
          "says no", len(rows) == len(pairs) and got == want and
          all("--cpu-offload" in row["error"] for row in rows if row["exit"] == 2),
          {k: (got.get(k), v) for k, v in want.items() if got.get(k) != v} or r.stderr)
    dd = info["ddp_perf"] or {}
    r = run([os.path.join(BIN, "ddp_perf"), *tiny.split(), "--plan", "--cpu-offload", "params"])
    check("ddp_perf --describe: no offload, and ddp_perf refuses --cpu-offload",
          dd.get("cpu_offload") == [] and dd.get("offload_rule") == {} and r.returncode == 2, (dd, r.stderr))


if __name__ == "__main__":
    sys.exit(main())
