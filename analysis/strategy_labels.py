"""Strategy labels, as the programs print them (StrategyConfig::label()), and the program and
flags each one stands for. Run matrices (slurm/sweep) and analysis/project.py both use this
one vocabulary:

    ddp              ddp_perf
    fsdp-full        fsdp_perf --sharding full
    fsdp-hybrid<G>   fsdp_perf --sharding hybrid --shard-size G   (shard groups of G ranks)
    fsdp-hybrid      the same with G = GPUs per node (one node per shard group)
    fsdp-none        fsdp_perf --sharding none (full replication)
    fsdp-grad-op     fsdp_perf --sharding grad-op
    fsdp-optimizer-state
                     fsdp_perf --sharding optimizer-state (ZeRO-1: master weights and optimizer
                     state sharded over the data-parallel ranks)
    fsdp-optimizer-state<G>
                     the same in shard groups of G ranks (--shard-size G), all-reduced across them
    <any>-tp<N>      the same with --tp N: tensor-parallel groups of N consecutive ranks, the
                     strategy over the world / N data-parallel ranks (fsdp-hybrid-tpN: G = the
                     data-parallel ranks of one node, GPUs per node / N)
    <any>-pp<S>      the same with --pp S: S pipeline stages (after -tp<N> when both:
                     fsdp-full-tp2-pp4); the strategy over world / (N S) data-parallel ranks
    <fsdp>-offload-params
                     the same with --cpu-offload params (parameter, gradient and optimizer
                     shards on the host, the update on the CPU: fsdp-full, fsdp-hybrid<G>,
                     fsdp-grad-op), last in the label: fsdp-full-tp2-offload-params
    <fsdp>-offload-optimizer
                     the same with --cpu-offload optimizer (master weights and optimizer state
                     on the host: fsdp-optimizer-state, fsdp-grad-op, fsdp-full, fsdp-hybrid<G>)

Standard library only: slurm/sweep imports it from this folder (also in an installed tree).
"""
import re

import cli

ALLOWED = ("ddp, fsdp-full, fsdp-hybrid, fsdp-hybrid<G>, fsdp-none, fsdp-grad-op, fsdp-optimizer-state, "
           "fsdp-optimizer-state<G>, each optionally with -tp<N>, -pp<S>, then -offload-params (full, hybrid, "
           "grad-op) or -offload-optimizer (any but fsdp-none)")
# DeepSpeed's ZeRO stages as the labels the programs take (docs/usage.md, "Strategies")
ZERO_LABELS = {"1": "fsdp-optimizer-state", "2": "fsdp-grad-op", "3": "fsdp-full"}
SHARDINGS = ("full", "none", "grad-op", "optimizer-state")  # the fsdp_perf --sharding values with no shard size
OPTIMIZER_STATE_RE = re.compile(r"^fsdp-optimizer-state([1-9][0-9]*)$")  # ZeRO-1 in groups of G
HYBRID_RE = re.compile(r"^fsdp-hybrid([1-9][0-9]*)?$")  # G as the program prints it: no leading zeros
SUFFIX_RE = re.compile(r"^(.*?)(-tp([1-9][0-9]*))?(-pp([1-9][0-9]*))?$")  # N, S > 1 as the program prints them
OFFLOADS = ("params", "optimizer")  # fsdp_perf --cpu-offload values a label names (none: no suffix)
OFFLOAD_RE = re.compile(r"^(.*)-offload-(" + "|".join(OFFLOADS) + r")$")


class StrategyError(cli.BadInput, ValueError):
    """A label outside the vocabulary: its message is one line naming it and what is allowed
    (the tools' one-line error, cli.BadInput; a ValueError for slurm/sweep's checks)."""


def split_offload(label):
    """(label without its -offload-X suffix, X or "none")."""
    m = OFFLOAD_RE.match(label) if isinstance(label, str) else None
    return (m.group(1), m.group(2)) if m else (label, "none")


def split_layout(label):
    """(the data-parallel label, N, S) of label-tpN-ppS[-offload-X]; 1 for a part the label lacks."""
    label = split_offload(label)[0]
    m = SUFFIX_RE.match(label) if isinstance(label, str) else None
    if not m:
        return label, 1, 1
    tp, pp = int(m.group(3) or 1), int(m.group(5) or 1)
    if (m.group(2) and tp == 1) or (m.group(4) and pp == 1):  # the programs print no -tp1 or -pp1
        return label, 1, 1
    return m.group(1), tp, pp



def words(label):
    """The layout of `label` in the words of DeepSpeed ZeRO, PyTorch and Megatron-LM, for a
    reader who knows those and not these labels: "ZeRO-3 (PyTorch FSDP FULL_SHARD), tensor
    parallel 2 (Megatron-LM)"."""
    rest, offload = split_offload(label)
    base, tp, pp = split_layout(rest)
    hybrid, zero1 = HYBRID_RE.match(base), OPTIMIZER_STATE_RE.match(base)
    if base == "ddp":
        out = "DDP (PyTorch DistributedDataParallel; ZeRO-0)"
    elif base == "fsdp-full":
        out = "ZeRO-3 (PyTorch FSDP FULL_SHARD)"
    elif hybrid:
        out = (f"ZeRO-3 within groups of {hybrid.group(1)}" if hybrid.group(1) else "ZeRO-3 within each node") + \
              ", replicated across them (PyTorch FSDP HYBRID_SHARD)"
    elif base == "fsdp-grad-op":
        out = "ZeRO-2 (PyTorch FSDP SHARD_GRAD_OP)"
    elif base == "fsdp-none":
        out = "no sharding (PyTorch FSDP NO_SHARD; ZeRO-0)"
    elif base == "fsdp-optimizer-state" or zero1:
        group = f" in groups of {zero1.group(1)}" if zero1 else ""
        out = f"ZeRO-1{group} (DeepSpeed stage 1, Megatron-LM's distributed optimizer)"
    else:
        out = base
    if tp > 1:
        out += f", tensor parallel {tp} (Megatron-LM)"
    if pp > 1:
        out += f", pipeline of {pp} stages"
    if offload == "params":
        out += ", parameters, gradients and optimizer on the host (ZeRO-Offload; PyTorch CPUOffload(offload_params=True))"
    elif offload == "optimizer":
        out += ", optimizer state and its update on the host (ZeRO-Offload's offload_optimizer)"
    return out


def sharding(base):
    """fsdp_perf's --sharding of a data-parallel label (split_layout's first part); None for ddp."""
    if base == "ddp":
        return None
    if HYBRID_RE.match(base):
        return "hybrid"
    return "optimizer-state" if OPTIMIZER_STATE_RE.match(base) else base[len("fsdp-"):]


_PROGRAMS_RULE = []  # the default rule, read once


def programs_offload_rule():
    """The offload rule of this checkout's programs (runner.offload_rule: fsdp_perf --describe,
    the table fsdp_perf refuses by), or None where they cannot say (not built, or built before
    --describe): then a label's offload is left to the program's own refusal."""
    if not _PROGRAMS_RULE:
        import runner  # here, not above: runner imports this module
        try:
            _PROGRAMS_RULE.append(runner.offload_rule())
        except cli.BadInput:
            _PROGRAMS_RULE.append(None)
    return _PROGRAMS_RULE[0]


def check(label, offload_rule=None):
    """label, or StrategyError when it is not one of the programs' strategy labels. Its
    -offload-X is held to `offload_rule` ({--cpu-offload value: the --sharding values it
    serves}, runner.offload_rule of the programs that will run it; default: this checkout's,
    programs_offload_rule)."""
    base, _, _ = split_layout(label)
    known = isinstance(base, str) and (base == "ddp" or HYBRID_RE.match(base) or OPTIMIZER_STATE_RE.match(base) or
                                       (base.startswith("fsdp-") and base[len("fsdp-"):] in SHARDINGS))
    if not known:
        zero = re.fullmatch(r"zero-?([123])", base, re.IGNORECASE) if isinstance(base, str) else None
        if zero:  # DeepSpeed's name for a sharding: say the label it is here
            n = zero.group(1)
            raise StrategyError(f"unknown strategy {label!r}: ZeRO-{n} is {ZERO_LABELS[n]} here (ZeRO-1 "
                                f"{ZERO_LABELS['1']}, ZeRO-2 {ZERO_LABELS['2']}, ZeRO-3 {ZERO_LABELS['3']})")
        raise StrategyError(f"unknown strategy {label!r} (allowed: {ALLOWED})")
    off = split_offload(label)[1]
    rule = offload_rule if offload_rule is not None else programs_offload_rule() if off != "none" else None
    if off != "none" and rule is not None and sharding(base) not in rule.get(off, ()):
        allowed = ", ".join("fsdp-" + s for s in rule.get(off, ())) or "none: fsdp_perf has no --cpu-offload " + off
        raise StrategyError(f"strategy {label!r}: -offload-{off} needs one of {allowed} (fsdp_perf --describe)")
    return label


def offloads(label, offload_rule=None):
    """The -offload-X suffixes `label` (without one) takes: those of OFFLOADS that check()
    allows after it under `offload_rule`, in that order."""
    out = []
    for off in OFFLOADS:
        try:
            check(f"{label}-offload-{off}", offload_rule)
        except StrategyError:
            continue
        out.append(off)
    return out


def cpu_offload(label):
    """fsdp_perf's --cpu-offload of label: none, params or optimizer."""
    return split_offload(check(label))[1]


def program(label):
    """The program that runs label: ddp_perf or fsdp_perf."""
    return "ddp_perf" if split_layout(check(label))[0] == "ddp" else "fsdp_perf"


def tensor_parallel(label):
    """N of a label-tpN (1 without)."""
    return split_layout(check(label))[1]


def pipeline_stages(label):
    """S of a label-ppS (1 without)."""
    return split_layout(check(label))[2]


def batch_per_rank(label, batch, per):
    """The programs' --batch (sequences per data-parallel rank) of `batch` sequences per
    "rank" (itself) or per "gpu": batch x N x S under -tpN-ppS, whose N x S GPUs share one
    data-parallel rank's batch, so that every layout of a GPU count trains the same global
    batch (batch x GPUs)."""
    if per not in ("rank", "gpu"):
        raise StrategyError(f"batch per {per!r}: allowed rank, gpu")
    _, tp, pp = split_layout(check(label))
    return batch * tp * pp if per == "gpu" else batch


def shard_size(label, gpus_per_node, world):
    """G of a hybrid label (fsdp-hybrid: one node's data-parallel ranks, GPUs per node / N
    under -tpN, at most the data-parallel ranks); None otherwise."""
    base, tp, pp = split_layout(check(label))
    m = HYBRID_RE.match(base)
    if not m:
        return None
    return int(m.group(1)) if m.group(1) else max(1, min(gpus_per_node // tp, world // (tp * pp)))


def resolve(label, gpus_per_node, world):
    """(program, its flags, the label the program will print) of label at this world size."""
    base, tp, pp = split_layout(check(label))
    off = cpu_offload(label)
    suffix = (f"-tp{tp}" if tp > 1 else "") + (f"-pp{pp}" if pp > 1 else "") + (f"-offload-{off}" if off != "none"
                                                                                 else "")
    layout_flags = ((["--tp", str(tp)] if tp > 1 else []) + (["--pp", str(pp)] if pp > 1 else []) +
                    (["--cpu-offload", off] if off != "none" else []))
    if program(label) == "ddp_perf":
        return "ddp_perf", layout_flags, "ddp" + suffix
    z = OPTIMIZER_STATE_RE.match(base)
    if z:
        return ("fsdp_perf", ["--sharding", "optimizer-state", "--shard-size", z.group(1)] + layout_flags,
                base + suffix)
    g = shard_size(label, gpus_per_node, world)
    if g is not None:
        return "fsdp_perf", ["--sharding", "hybrid", "--shard-size", str(g)] + layout_flags, f"fsdp-hybrid{g}{suffix}"
    return "fsdp_perf", ["--sharding", base[len("fsdp-"):]] + layout_flags, base + suffix
