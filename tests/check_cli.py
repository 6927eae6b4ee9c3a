#!/usr/bin/python3
"""Holds every analysis script to the one command-line convention (analysis/cli.py): its
--help exits 0 and names the script as users type it; the description is a whole first
paragraph, not a line cut mid-sentence; every positional and option has a help text;
every option with a default (or left optional) says "default"; option names are the
programs' (--seq-len, --activation-checkpointing, never --seq or --checkpointing).

Usage: tests/check_cli.py   (exit 1 when a script breaks the convention)
"""
import argparse
import glob
import os
import runpy
import subprocess
import sys

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
# Names the programs spell otherwise (ddp_perf --help, fsdp_perf --help).
NOT_THE_PROGRAMS_NAMES = {"--seq": "--seq-len", "--checkpointing": "--activation-checkpointing",
                          "--dec-seq": "--dec-seq-len", "--world": "--world-size"}


class Captured(BaseException):  # not an Exception: scripts that catch every error must not swallow it
    def __init__(self, parser):
        super().__init__()
        self.parser = parser


def scripts():
    """Every analysis/*.py that runs as a program."""
    out = []
    for path in sorted(glob.glob(os.path.join(ROOT, "analysis", "*.py"))):
        with open(path) as f:
            if "__main__" in f.read():
                out.append(path)
    return out


def parser_of(path):
    """The script's ArgumentParser, caught as it parses its arguments."""
    real = argparse.ArgumentParser.parse_args

    def catch(self, *args, **kwargs):
        raise Captured(self)
    argparse.ArgumentParser.parse_args = catch
    argv, sys.argv = sys.argv, [path]
    try:
        runpy.run_path(path, run_name="__main__")
    except Captured as c:
        return c.parser
    finally:
        argparse.ArgumentParser.parse_args = real
        sys.argv = argv
    raise AssertionError("never parsed its arguments with argparse")


def problems(path):
    name = "analysis/" + os.path.basename(path)
    out = []
    p = subprocess.run([sys.executable, path, "--help"], capture_output=True, text=True, env={**os.environ,
                                                                                           "COLUMNS": "100"})
    if p.returncode != 0:
        return [f"--help exits {p.returncode}: {p.stderr.strip()[-300:]}"]
    if not p.stdout.startswith(f"usage: {name}"):
        out.append(f"--help does not start with 'usage: {name}'")
    ap = parser_of(path)
    desc = (ap.description or "").strip()
    if not desc or desc[-1] not in ".:)":
        out.append(f"description is not a whole sentence: {desc[-60:]!r}")
    for act in ap._actions:
        if isinstance(act, argparse._HelpAction):
            continue
        what = "/".join(act.option_strings) or act.dest
        for opt in act.option_strings:
            if opt in NOT_THE_PROGRAMS_NAMES:
                out.append(f"{opt}: the programs call it {NOT_THE_PROGRAMS_NAMES[opt]}")
        text = act.help or ""
        if not text.strip() or text == argparse.SUPPRESS:
            out.append(f"{what}: no help text")
            continue
        flag = isinstance(act, (argparse._StoreTrueAction, argparse._StoreFalseAction, argparse._StoreConstAction))
        if act.option_strings and not act.required and not flag and "default" not in text:
            out.append(f"{what}: help does not state its default")
    return out


def main():
    failed = 0
    found = scripts()
    assert found, "no analysis scripts found"
    for path in found:
        try:
            bad = problems(path)
        except AssertionError as e:
            bad = [str(e)]
        rel = os.path.relpath(path, ROOT)
        if bad:
            failed += 1
            print(f"FAIL  {rel}: " + "; ".join(bad))
        else:
            print(f"ok    {rel}: --help documents every argument")
    print(f"{len(found) - failed} of {len(found)} analysis scripts follow the convention")
    return 1 if failed else 0


if __name__ == "__main__":
    sys.exit(main())
