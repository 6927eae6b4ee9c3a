"""Strategy labels, as the programs print them (StrategyConfig::label()), and the program and
flags each one stands for. Run matrices (slurm/sweep) and analysis/project.py both use this
one vocabulary:

    ddp              ddp_perf
    fsdp-full        fsdp_perf --sharding full
    fsdp-hybrid<G>   fsdp_perf --sharding hybrid --shard-size G   (shard groups of G ranks)
    fsdp-hybrid      the same with G = GPUs per node (one node per shard group)
    fsdp-none        fsdp_perf --sharding none (full replication)
    fsdp-grad-op     fsdp_perf --sharding grad-op

Standard library only: slurm/sweep imports it from this folder (also in an installed tree).
"""
import re

ALLOWED = "ddp, fsdp-full, fsdp-hybrid, fsdp-hybrid<G>, fsdp-none, fsdp-grad-op"
SHARDINGS = ("full", "none", "grad-op")  # the fsdp_perf --sharding values with no shard size
HYBRID_RE = re.compile(r"^fsdp-hybrid([1-9][0-9]*)?$")  # G as the program prints it: no leading zeros


class StrategyError(ValueError):
    """A label outside the vocabulary: its message is one line naming it and what is allowed."""


def check(label):
    """label, or StrategyError when it is not one of the programs' strategy labels."""
    known = isinstance(label, str) and (label == "ddp" or HYBRID_RE.match(label) or
                                        (label.startswith("fsdp-") and label[len("fsdp-"):] in SHARDINGS))
    if not known:
        raise StrategyError(f"unknown strategy {label!r} (allowed: {ALLOWED})")
    return label


def program(label):
    """The program that runs label: ddp_perf or fsdp_perf."""
    return "ddp_perf" if check(label) == "ddp" else "fsdp_perf"


def shard_size(label, gpus_per_node, world):
    """G of a hybrid label (fsdp-hybrid: one node's GPUs, at most the world); None otherwise."""
    m = HYBRID_RE.match(check(label))
    if not m:
        return None
    return int(m.group(1)) if m.group(1) else min(gpus_per_node, world)


def resolve(label, gpus_per_node, world):
    """(program, its flags, the label the program will print) of label at this world size."""
    if program(label) == "ddp_perf":
        return "ddp_perf", [], "ddp"
    g = shard_size(label, gpus_per_node, world)
    if g is not None:
        return "fsdp_perf", ["--sharding", "hybrid", "--shard-size", str(g)], f"fsdp-hybrid{g}"
    return "fsdp_perf", ["--sharding", label[len("fsdp-"):]], label
