"""The one place the analysis tools start a program (ddp_perf, fsdp_perf): its plan and
schedule (--plan --schedule-json), many plans streamed through one process (--plan-batch),
the flags of a layout, what a build offers (its --describe line, read here and nowhere else), its
presets (--list-models) and the plan's memory verdict. analysis/advise.py, project.py,
model_states.py, projection_checks.py, torch_t5_step.py, hf_t5_step.py and slurm/sweep run their
plans through this module; none starts a program itself. Standard library only (slurm/sweep
imports it).

Where a caller starts many plans at once (slurm/sweep), `env` adds variables to the
programs' environment and own_session gives each process an MPI singleton session folder of
its own (OMPI_MCA_orte_tmpdir_base): isolated singletons all name the same one, and the first
to finish deletes it under the others' feet.

A plan's answer is (exit, result): exit 0 fits, 3 does not fit (GPU or host memory), with
result the schedule (a dict, the program's JSON); 2 refused, with result the program's one
line (without its path); 1 failed, with result a line saying how. A program that cannot be
started at all is cli.BadInput, one line.
"""
import concurrent.futures
import functools
import json
import os
import random
import subprocess
import tempfile
import threading

import cli
import model_shapes
import strategy_labels

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
# An installed tree (`make install` writes its prefix there) runs the installed programs, as slurm/sweep.
_PREFIX_FILE = os.path.join(ROOT, "prefix")
BIN = (os.path.join(open(_PREFIX_FILE).read().strip(), "bin") if os.path.isfile(_PREFIX_FILE)
       else os.path.join(ROOT, "build", "bin"))
PROGRAMS = ("ddp_perf", "fsdp_perf")


def bin_dir(path=None):
    """The folder of the programs: `path`, or build/bin of this checkout."""
    return path or BIN


def _start_error(path, e):
    return cli.BadInput(f"cannot run {path}: {e.strerror or e} (build it with make)")


def _environment(env=None, session=None):
    """The programs' environment: this one with `env` added and, given a `session` folder, the
    MPI singleton's session folder there; None (inherit) when neither is given."""
    if not env and not session:
        return None
    return {**os.environ, **(env or {}), **({"OMPI_MCA_orte_tmpdir_base": session} if session else {})}


def _last_lines(text, n=3):
    """The last n non-empty lines of a program's output, on one line (the first are banners)."""
    lines = [x.strip() for x in text.strip().splitlines() if x.strip()]
    return " | ".join(lines[-n:]) or "no output"


# ---------------------------------------------------------------- what a build offers

_CAPABILITIES = {}


def capabilities(folder=None):
    """What the programs of `folder` offer: fsdp_perf --describe's one JSON line (read once
    per folder): "plan_batch" (one process plans many layouts), "cpu_offload" (its values,
    none among them), "optimizers", "shardings" and "offload_rule" ({--cpu-offload value:
    the --sharding values it serves}, the table the program refuses by). A build without
    --describe predates --plan-batch and offload: neither."""
    folder = bin_dir(folder)
    if folder not in _CAPABILITIES:
        path = os.path.join(folder, "fsdp_perf")
        try:
            p = subprocess.run([path, "--describe"], capture_output=True, text=True)
        except OSError as e:
            raise _start_error(path, e)
        if p.returncode == 0:
            try:
                got = json.loads(p.stdout)
            except ValueError:
                raise cli.BadInput(f"{path} --describe: not one JSON line: {p.stdout.strip()[:200]!r}")
        else:  # a build from before --describe: plans one by one, its offload rule unknown (its --plan refuses)
            got = {"plan_batch": False, "cpu_offload": [], "offload_rule": None}
        _CAPABILITIES[folder] = got
    return _CAPABILITIES[folder]


def offload_rule(folder=None):
    """{--cpu-offload value: the fsdp_perf --sharding values it serves} of `folder`'s build
    (capabilities'), the one rule strategy_labels checks labels by; None where the build
    cannot say (before --describe)."""
    return capabilities(folder).get("offload_rule")


def presets(folder=None, program="fsdp_perf", env=None, own_session=False):
    """The model presets `program` knows (its --list-models), in its order; cli.BadInput, one
    line, when it lists none."""
    path = os.path.join(bin_dir(folder), program)
    with tempfile.TemporaryDirectory(prefix="shardbench-plan-") as tmp:
        try:
            p = subprocess.run([path, "--list-models"], capture_output=True, text=True, stdin=subprocess.DEVNULL,
                               env=_environment(env, tmp if own_session else None))
        except OSError as e:
            raise _start_error(path, e)
    if p.returncode != 0 or not p.stdout.split():
        raise cli.BadInput(f"{path} --list-models exited {p.returncode}: {_last_lines(p.stderr or p.stdout)}")
    return p.stdout.split()


# ---------------------------------------------------------------- the flags of a layout

def model_entry(a, model):
    """The model entry (model_shapes) of preset `model` with the shape flags of the command
    line `a` (an argparse namespace: its d_model, layers, ... where given)."""
    entry = {"model": model}
    for key in model_shapes.KEYS:
        if getattr(a, key, None) is not None:
            entry[key] = getattr(a, key)
    return entry


def strategy_flags(label, world, gpus_per_node, batch, micro_batches=None, pp_schedule=None, checkpointing=False):
    """(program, flags) of strategy `label` (strategy_labels) at `world` GPUs: the label's
    flags, --batch (sequences per data-parallel rank), micro-batches and schedule where
    given, and checkpointing."""
    program, flags, _ = strategy_labels.resolve(label, gpus_per_node, world)
    flags = flags + ["--batch", str(batch)]
    if micro_batches is not None:
        flags += ["--micro-batches", str(micro_batches)]
    if pp_schedule is not None:
        flags += ["--pp-schedule", pp_schedule]
    if checkpointing:
        flags.append("--activation-checkpointing")
    return program, flags


def layout_flags(label, world, gpus_per_node, batch, model, seq_len, dtype, dec_seq_len=None, reduce_dtype=None,
                 micro_batches=None, pp_schedule=None, checkpointing=False, grad_accumulation=None):
    """(program, flags) of a layout's plan or run: strategy_flags', then the model entry's
    flags (model_shapes), sequence lengths, precisions and gradient accumulation where
    given. The world size and memory limits are limit_flags'."""
    program, flags = strategy_flags(label, world, gpus_per_node, batch, micro_batches, pp_schedule, checkpointing)
    flags += model_shapes.flags(model) + ["--seq-len", str(seq_len)]
    if dec_seq_len is not None:
        flags += ["--dec-seq-len", str(dec_seq_len)]
    flags += ["--dtype", dtype, "--reduce-dtype", reduce_dtype or dtype]
    if grad_accumulation is not None:
        flags += ["--grad-accumulation", grad_accumulation]
    return program, flags


def limit_flags(world, gpu_memory_gib, host_memory_gib=None):
    """--world-size and the memory limits of a plan (the host's: CPU offload)."""
    flags = ["--world-size", str(world), "--mem-limit-gib", str(gpu_memory_gib)]
    if host_memory_gib is not None:
        flags += ["--host-mem-limit-gib", str(host_memory_gib)]
    return flags


def fits(plan):
    """The plan's verdict (a schedule or a digest of one: its "memory"): the GPU's memory
    and, under CPU offload, the host's."""
    m = plan["memory"]
    return bool(m["fits"]) and bool(m.get("host_fits", True))


# ---------------------------------------------------------------- one plan

def plan(program, flags, folder=None, own_session=False, env=None, record=None, schedule=True):
    """(exit, schedule or line) of one `program FLAGS --plan --schedule-json` process;
    own_session: the MPI singleton's session folder in the plan's own temporary folder, not
    the machine's; env: variables added to its environment; record: --out RECORD (the
    program records an out-of-memory verdict there); schedule False: no --schedule-json (the
    verdict alone, result None; a record's command line then is the plan's own)."""
    path = os.path.join(bin_dir(folder), program)
    with tempfile.TemporaryDirectory(prefix="shardbench-plan-") as tmp:
        out = os.path.join(tmp, "s.json")
        cmd = ([path] + list(flags) + ["--plan"] + (["--schedule-json", out] if schedule else []) +
               (["--out", str(record)] if record else []))
        try:
            p = subprocess.run(cmd, capture_output=True, text=True, stdin=subprocess.DEVNULL,
                               env=_environment(env, tmp if own_session else None))
        except OSError as e:
            raise _start_error(path, e)
        if p.returncode == 2:  # a value the program refuses: its one line, without the program's path
            line = next((x for x in reversed(p.stderr.splitlines()) if ": error: " in x), p.stderr.strip())
            return 2, line.split(": error: ", 1)[-1]
        if p.returncode not in (0, 3) or (schedule and not os.path.exists(out)):
            return 1, f"plan failed (exit {p.returncode}: {' '.join(cmd)}): {(p.stderr.strip() or p.stdout)[-300:]}"
        if not schedule:
            return p.returncode, None
        with open(out) as f:
            return p.returncode, json.load(f)


def schedule(program, flags, folder=None):
    """The schedule of one plan that ran (fits or not); cli.BadInput, one line, when the
    program refuses it (its line) or the plan fails."""
    code, result = plan(program, flags, folder)
    if code not in (0, 3):
        raise cli.BadInput(result)
    return result


# ---------------------------------------------------------------- many plans

def _reduced(reduce, program, flags, folder):
    """A worker's job: one plan, its schedule reduced by `reduce`."""
    code, result = plan(program, flags, folder)
    return code, (reduce(result) if reduce and isinstance(result, dict) else result)


def plans(requests, folder=None, reduce=None, full=True, jobs=2, use_batch=None):
    """[(exit, result)] of requests [(program, flags)] in order, each with its world size and
    memory limits. result: the schedule, or reduce(schedule) (a module-level function, read
    as each plan is written). full: every op of the schedule; without it the totals alone
    where --plan-batch serves (--plan-batch-ops none). Through --plan-batch (`jobs`
    processes per program, the lines dealt out at random: costs vary by layout) where the
    programs have it (use_batch None: capabilities()), else one --plan process per request
    on `jobs` workers."""
    folder = bin_dir(folder)
    if use_batch is None:
        use_batch = capabilities(folder)["plan_batch"]
    out = [None] * len(requests)
    if use_batch:
        for program in PROGRAMS:
            idx = [i for i, (p, _) in enumerate(requests) if p == program]
            if not idx:
                continue
            order = list(idx)
            random.Random(0).shuffle(order)
            parts = [order[j::jobs] for j in range(min(jobs, len(order)))]
            with concurrent.futures.ThreadPoolExecutor(len(parts)) as pool:  # the work is in the processes
                got = list(pool.map(lambda part: plan_batch(program, [requests[i][1] for i in part], folder,
                                                            reduce, full), parts))
            for part, res in zip(parts, got):
                for i, r in zip(part, res):
                    out[i] = r
        return out
    job = functools.partial(_reduced, reduce)
    if full or jobs <= 1 or len(requests) < 4:
        return [job(p, f, folder) for p, f in requests]
    with concurrent.futures.ProcessPoolExecutor(min(jobs, len(requests))) as pool:  # no idle workers
        return list(pool.map(job, [p for p, _ in requests], [f for _, f in requests], [folder] * len(requests),
                             chunksize=4))


def plan_batch(program, lines, folder=None, reduce=None, full=True, env=None, own_session=False):
    """[(exit, result)] of `program --plan-batch -` over `lines` (each a list of flags): every
    op of each schedule with `full`, the totals alone without (--plan-batch-ops). Each
    answer is read, and reduced by `reduce`, as the program writes it, while it plans the
    next. env, own_session: as plan()'s."""
    if not lines:
        return []
    with tempfile.TemporaryDirectory(prefix="shardbench-plan-") as tmp:
        return _plan_batch(program, lines, folder, reduce, full, _environment(env, tmp if own_session else None))


def _plan_batch(program, lines, folder, reduce, full, env):
    path = os.path.join(bin_dir(folder), program)
    cmd = [path, "--plan-batch", "-", "--plan-batch-ops", "all" if full else "none"]
    try:
        p = subprocess.Popen(cmd, stdin=subprocess.PIPE, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
                             env=env)
    except OSError as e:
        raise _start_error(path, e)
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
            out.append((code, reduce(row["schedule"]) if reduce else row["schedule"]))
        else:
            out.append((1, row.get("error", f"exit {code}")))
    p.wait()
    for t in feeders:
        t.join()
    if len(out) != len(lines):
        raise cli.BadInput(f"{program} --plan-batch answered {len(out)} of {len(lines)} lines: "
                           f"{''.join(err).strip()[-300:]}")
    return out
