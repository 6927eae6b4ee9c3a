#!/usr/bin/env python3
"""The layering test: no #include in src/ or include/ points up the layers.

Layers, bottom first (docs/architecture.md draws them); a folder may include its own
headers and those of any lower layer, never a higher one nor a neighbour on its own layer:

  0 core       errors, formatting, fp16/bf16, counter-based RNG, CLI helpers, test faults
  1 backend    compute, memory, collectives (CPU, counting, CUDA), the collective table,
               the parallel layout and its mesh
  2 model      T5 shapes and the training step        trace   recorder, HDF5 files
  3 strategy   configuration, the step loop, DDP,     run     environment, provenance,
               FSDP, the pipeline                              watchdog, the MPI main
  4 train      ddp_perf/fsdp_perf protocol            bench   collective_perf
  5 programs   the mains

A file's folder is the first folder under src/ or include/shardbench/; an include names
its folder as "shardbench/<folder>/...". Includes of other forms (system headers, files
beside the includer such as the CUDA .cuh files, the generated version.h) are not layered.

Usage: check_layers.py [ROOT]     exit 1 listing every upward include
       check_layers.py --self-test  shows the check fails on a planted upward include
"""
import pathlib
import re
import sys
import tempfile

LAYERS = [("core",), ("backend",), ("model", "trace"), ("strategy", "run"), ("train", "bench"), ("programs",)]
LEVEL = {folder: level for level, folders in enumerate(LAYERS) for folder in folders}
INCLUDE = re.compile(r'^\s*#\s*include\s*"shardbench/([^"]+)"', re.M)
SOURCES = {".h", ".hpp", ".cpp", ".cu", ".cuh"}


def folder_of(path: pathlib.Path, root: pathlib.Path):
    rel = path.relative_to(root).parts
    if rel[0] == "src":
        return rel[1]
    if rel[:2] == ("include", "shardbench"):
        return rel[2] if len(rel) > 3 else None  # a header directly in include/shardbench
    return None


def violations(root: pathlib.Path):
    found = []
    files = [p for d in ("src", "include") for p in sorted((root / d).rglob("*")) if p.suffix in SOURCES]
    for path in files:
        rel = path.relative_to(root)
        mine = folder_of(path, root)
        if mine not in LEVEL:
            found.append(f"{rel}: folder '{mine}' is in no layer (allowed: {', '.join(LEVEL)})")
            continue
        text = path.read_text(errors="replace")
        for m in INCLUDE.finditer(text):
            target = m.group(1)
            line = text.count("\n", 0, m.start()) + 1
            theirs = target.split("/")[0] if "/" in target else None
            if theirs not in LEVEL:
                found.append(f"{rel}:{line}: includes shardbench/{target}, which is in no layer folder")
            elif theirs != mine and LEVEL[theirs] >= LEVEL[mine]:
                where = "the same layer as" if LEVEL[theirs] == LEVEL[mine] else "above"
                found.append(f"{rel}:{line}: {mine} (layer {LEVEL[mine]}) includes shardbench/{target}: "
                             f"{theirs} (layer {LEVEL[theirs]}) is {where} it")
    return found, len(files)


def self_test() -> int:
    """A tree with one upward include must fail, and the same tree without it must pass."""
    with tempfile.TemporaryDirectory() as tmp:
        root = pathlib.Path(tmp)
        (root / "include/shardbench/core").mkdir(parents=True)
        (root / "include/shardbench/train").mkdir(parents=True)
        (root / "src/backend").mkdir(parents=True)
        (root / "include/shardbench/core/check.h").write_text("#pragma once\n")
        (root / "include/shardbench/train/train.h").write_text('#include "shardbench/core/check.h"\n')
        good = '#include "shardbench/core/check.h"\n#include <vector>\n'
        (root / "src/backend/backend.cpp").write_text(good)
        ok, _ = violations(root)
        (root / "src/backend/backend.cpp").write_text(good + '#include "shardbench/train/train.h"\n')
        bad, _ = violations(root)
    if ok or len(bad) != 1 or "src/backend/backend.cpp:3" not in bad[0]:
        print(f"check_layers self-test: FAILED (clean tree: {ok}; planted upward include: {bad})")
        return 1
    print(f"check_layers self-test: ok (the planted upward include is reported: {bad[0]})")
    return 0


def main() -> int:
    if sys.argv[1:] == ["--self-test"]:
        return self_test()
    root = pathlib.Path(sys.argv[1] if len(sys.argv) > 1 else pathlib.Path(__file__).resolve().parent.parent)
    found, n = violations(root)
    for v in found:
        print(v)
    if found:
        print(f"check_layers: {len(found)} include(s) against the layers "
              "(core <- backend <- model, trace <- strategy, run <- train, bench <- programs)")
        return 1
    print(f"check_layers: ok ({n} files; every include points down the layers)")
    return 0


if __name__ == "__main__":
    sys.exit(main())
