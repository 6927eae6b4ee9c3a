"""Strategy labels, as the programs print them (StrategyConfig::label()), and the program and
flags each one stands for. Run matrices (slurm/sweep) and analysis/project.py both use this
one vocabulary:

    ddp              ddp_perf
    fsdp-full        fsdp_perf --sharding full
    fsdp-hybrid<G>   fsdp_perf --sharding hybrid --shard-size G   (shard groups of G ranks)
    fsdp-hybrid      the same with G = GPUs per node (one node per shard group)
    fsdp-none        fsdp_perf --sharding none (full replication)
    fsdp-grad-op     fsdp_perf --sharding grad-op
    <any>-tp<N>      the same with --tp N: tensor-parallel groups of N consecutive ranks, the
                     strategy over the world / N data-parallel ranks (fsdp-hybrid-tpN: G = the
                     data-parallel ranks of one node, GPUs per node / N)

Standard library only: slurm/sweep imports it from this folder (also in an installed tree).
"""
import re

ALLOWED = "ddp, fsdp-full, fsdp-hybrid, fsdp-hybrid<G>, fsdp-none, fsdp-grad-op, each optionally with -tp<N>"
SHARDINGS = ("full", "none", "grad-op")  # the fsdp_perf --sharding values with no shard size
HYBRID_RE = re.compile(r"^fsdp-hybrid([1-9][0-9]*)?$")  # G as the program prints it: no leading zeros
TP_RE = re.compile(r"^(.*)-tp([1-9][0-9]*)$")  # N > 1 as the program prints it


class StrategyError(ValueError):
    """A label outside the vocabulary: its message is one line naming it and what is allowed."""


def split_tp(label):
    """(the data-parallel label, N) of label-tpN; (label, 1) without a tensor-parallel part."""
    m = TP_RE.match(label) if isinstance(label, str) else None
    if m and int(m.group(2)) > 1:
        return m.group(1), int(m.group(2))
    return label, 1


def check(label):
    """label, or StrategyError when it is not one of the programs' strategy labels."""
    base, _ = split_tp(label)
    known = isinstance(base, str) and (base == "ddp" or HYBRID_RE.match(base) or
                                       (base.startswith("fsdp-") and base[len("fsdp-"):] in SHARDINGS))
    if not known:
        raise StrategyError(f"unknown strategy {label!r} (allowed: {ALLOWED})")
    return label


def program(label):
    """The program that runs label: ddp_perf or fsdp_perf."""
    return "ddp_perf" if split_tp(check(label))[0] == "ddp" else "fsdp_perf"


def tensor_parallel(label):
    """N of a label-tpN (1 without)."""
    return split_tp(check(label))[1]


def shard_size(label, gpus_per_node, world):
    """G of a hybrid label (fsdp-hybrid: one node's data-parallel ranks, GPUs per node / N
    under -tpN, at most the data-parallel ranks); None otherwise."""
    base, tp = split_tp(check(label))
    m = HYBRID_RE.match(base)
    if not m:
        return None
    return int(m.group(1)) if m.group(1) else max(1, min(gpus_per_node // tp, world // tp))


def resolve(label, gpus_per_node, world):
    """(program, its flags, the label the program will print) of label at this world size."""
    base, tp = split_tp(check(label))
    suffix, tp_flags = (f"-tp{tp}", ["--tp", str(tp)]) if tp > 1 else ("", [])
    if program(label) == "ddp_perf":
        return "ddp_perf", tp_flags, "ddp" + suffix
    g = shard_size(label, gpus_per_node, world)
    if g is not None:
        return "fsdp_perf", ["--sharding", "hybrid", "--shard-size", str(g)] + tp_flags, f"fsdp-hybrid{g}{suffix}"
    return "fsdp_perf", ["--sharding", base[len("fsdp-"):]] + tp_flags, label
