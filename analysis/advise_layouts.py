"""The layout advisor's enumeration (analysis/advise.py): every layout of a model on N GPUs at
one global batch by the rules of docs/projection.md ("The layout advisor"), and a layout's
name LABEL[:mbM:SCHEDULE][:ckpt]: the strategy label as the programs print it and
slurm/sweep reads it (analysis/strategy_labels.py, the one home of which offload each
strategy takes), the micro-batches and pipeline schedule of a -ppS label, and activation
checkpointing.
"""
import math
import re

import cli
import runner
import strategy_labels

# The data-parallel strategies (strategy_labels' vocabulary), without a shard size: hybrid is
# enumerated at every group size.
BASES = ("ddp", "fsdp-optimizer-state", "fsdp-full", "fsdp-hybrid", "fsdp-grad-op", "fsdp-none")
SCHEDULES = ("1f1b", "gpipe")
MAX_MICRO_BATCHES = 1024  # the programs' --micro-batches range
MAX_GPUS = 1 << 24  # the programs' --world-size range
NAME_RE = re.compile(r"^(?P<label>[a-z0-9-]+?)(?::mb(?P<mb>[1-9][0-9]*):(?P<sched>gpipe|1f1b))?(?P<ckpt>:ckpt)?$")


class Layout:
    __slots__ = ("label", "tp", "pp", "dp", "mb", "schedule", "ckpt", "batch", "offload")

    def __init__(self, label, tp, pp, dp, mb, schedule, ckpt, batch):
        self.label, self.tp, self.pp, self.dp, self.mb = label, tp, pp, dp, mb
        self.schedule, self.ckpt, self.batch = schedule, ckpt, batch
        self.offload = strategy_labels.cpu_offload(label)

    @property
    def name(self):
        return self.label + (f":mb{self.mb}:{self.schedule}" if self.pp > 1 else "") + (":ckpt" if self.ckpt else "")

    def flags(self, gpus_per_node, world):
        """The program and its layout flags (the label's, then micro-batches and checkpointing)."""
        return runner.strategy_flags(self.label, world, gpus_per_node, self.batch, self.mb if self.pp > 1 else None,
                                     self.schedule if self.pp > 1 else None, self.ckpt)

    def request(self, a, cluster, world):
        """(program, flags) of this layout's plan at `world` GPUs: the model and sequence of
        the command line `a`, the description's precision and memory (runner)."""
        program, flags = runner.layout_flags(
            self.label, world, cluster["gpus_per_node"], self.batch, runner.model_entry(a, a.model), a.seq_len,
            cluster["dtype"], a.dec_seq_len, micro_batches=self.mb if self.pp > 1 else None,
            pp_schedule=self.schedule if self.pp > 1 else None, checkpointing=self.ckpt)
        host = cluster["host"]["memory_gib"] if self.offload != "none" else None
        return program, flags + runner.limit_flags(world, cluster["gpu_memory_gib"], host)

    @property
    def unrun(self):
        """What of this layout has not yet run on the CUDA backend across GPUs, as the GPU
        ledger (docs/gpu.md, "Not yet run on a GPU") lists it: tensor and pipeline parallelism
        and CPU offload over NCCL, and ZeRO-1, whose checks ran on one GPU only. Empty: every
        code path of the layout has run on a GPU."""
        return [part for part, unrun in (("tensor parallelism", self.tp > 1), ("pipeline parallelism", self.pp > 1),
                                         ("CPU offload", self.offload != "none"),
                                         ("ZeRO-1", self.label.startswith("fsdp-optimizer-state"))) if unrun]

    @property
    def unverified(self):
        return bool(self.unrun)


def divisors(n):
    """The divisors of n, ascending, in O(sqrt n) steps."""
    small, large = [], []
    d = 1
    while d * d <= n:
        if n % d == 0:
            small.append(d)
            if d != n // d:
                large.append(n // d)
        d += 1
    return small + large[::-1]


def micro_batch_choices(pp, per_rank):
    """A few micro-batch counts of a pipeline: S, 2S, 4S and every sequence its own
    micro-batch, those dividing the batch per data-parallel rank, at most the programs' 1024."""
    return sorted({m for m in (pp, 2 * pp, 4 * pp, per_rank) if per_rank % m == 0 and m <= MAX_MICRO_BATCHES})


def enumerate_layouts(world, global_batch, blocks, gpus_per_node, tp_ok=lambda tp: True, bases=BASES,
                      offload=True, checkpointing=(False, True), tps=None, pps=None, offload_rule=None):
    """(layouts, excluded): every layout of `world` GPUs by the rules of docs/projection.md
    ("The layout advisor"), the offloads those `offload_rule` serves (runner.offload_rule of
    the programs that plan them; default: this checkout's), and [(what, why)] for the tensor x pipeline degrees excluded
    before any plan runs (a degree the program refuses: tp_ok False; a global batch that does
    not divide over the data-parallel ranks; no micro-batch count dividing it)."""
    layouts, excluded = [], []
    for tp in divisors(world):
        if tp > gpus_per_node or (tps and tp not in tps):
            continue
        ok = tp_ok(tp)
        if ok is not True:
            excluded.append((f"tp{tp}", ok))
            continue
        for pp in divisors(world // tp):
            if pp > blocks or (pps and pp not in pps):
                continue
            dp = world // (tp * pp)
            if global_batch % dp:
                excluded.append((f"tp{tp} pp{pp}", f"global batch {global_batch} does not divide over {dp} "
                                 "data-parallel ranks"))
                continue
            per_rank = global_batch // dp
            mbs = micro_batch_choices(pp, per_rank) if pp > 1 else [1]
            if not mbs:
                excluded.append((f"tp{tp} pp{pp}", f"no micro-batch count of {pp}, {2 * pp}, {4 * pp}, {per_rank} "
                                 f"divides the batch {per_rank} per data-parallel rank"))
                continue
            suffix = (f"-tp{tp}" if tp > 1 else "") + (f"-pp{pp}" if pp > 1 else "")
            labels = []
            for base in bases:
                groups = [f"fsdp-hybrid{g}" for g in divisors(dp) if 1 < g < dp] if base == "fsdp-hybrid" else [base]
                for b in groups:
                    labels.append(b + suffix)
                    if offload:  # the offloads fsdp_perf serves with this strategy (its --describe)
                        labels += [f"{b}{suffix}-offload-{off}"
                                   for off in strategy_labels.offloads(b + suffix, offload_rule)]
            for label in labels:
                for ckpt in checkpointing:
                    if pp == 1:
                        layouts.append(Layout(label, tp, pp, dp, 1, "1f1b", ckpt, per_rank))
                        continue
                    for mb in mbs:
                        for sched in SCHEDULES:
                            layouts.append(Layout(label, tp, pp, dp, mb, sched, ckpt, per_rank))
    return layouts, excluded


def batch_openings(world, global_batch, blocks, gpus_per_node, tp_ok=lambda tp: True, tps=None, pps=None):
    """(excluded, below, above): the data-parallel degrees the global batch does not divide
    (of the tensor x pipeline degrees enumerate_layouts considers), and the nearest global
    batches below and above that every one of them divides (below: None where there is none);
    ([], None, None) where it excludes none."""
    dps = {world // (tp * pp) for tp in divisors(world) if tp <= gpus_per_node and (not tps or tp in tps)
           and tp_ok(tp) is True for pp in divisors(world // tp) if pp <= blocks and (not pps or pp in pps)}
    excluded = sorted((dp for dp in dps if global_batch % dp), reverse=True)
    if not excluded:
        return [], None, None
    step = math.lcm(*excluded)
    below = global_batch // step * step
    return excluded, below or None, below + step


def parse_name(name, world, global_batch, offload_rule=None):
    """The Layout of a name LABEL[:mbM:SCHEDULE][:ckpt] (--explain), its offload held to
    `offload_rule` (strategy_labels.check)."""
    m = NAME_RE.match(name)
    if not m:
        raise cli.BadInput(f"--explain '{name}': not a layout name (LABEL[:mbM:gpipe|1f1b][:ckpt], e.g. "
                           "fsdp-full-tp2-pp4:mb16:1f1b:ckpt)")
    label = m.group("label")
    try:
        _, tp, pp = strategy_labels.split_layout(strategy_labels.check(label, offload_rule))
    except cli.BadInput as e:
        raise cli.BadInput(f"--explain: {e}")
    if world % (tp * pp):
        raise cli.BadInput(f"--explain '{name}': tp x pp = {tp * pp} does not divide --gpus {world}")
    dp = world // (tp * pp)
    if global_batch % dp:
        raise cli.BadInput(f"--explain '{name}': --global-batch {global_batch} does not divide over {dp} "
                           "data-parallel ranks")
    if pp > 1 and not m.group("mb"):
        raise cli.BadInput(f"--explain '{name}': a -pp{pp} layout names its micro-batches and schedule "
                           f"({label}:mb{pp}:1f1b)")
    if pp == 1 and m.group("mb"):
        raise cli.BadInput(f"--explain '{name}': micro-batches and a schedule belong to a -ppS label")
    return Layout(label, tp, pp, dp, int(m.group("mb") or 1), m.group("sched") or "1f1b", bool(m.group("ckpt")),
                  global_batch // dp)
