#!/usr/bin/python3
"""The docs say only what the code does, as far as a machine can tell:
  - every relative link of README.md and docs/*.md names a file that exists, and every
    #anchor a heading of the page it points into;
  - docs/usage.md's flag table lists only flags of ddp_perf or fsdp_perf;
  - every command in their code blocks that runs one of the project's programs or scripts
    (build/bin/*, analysis/*.py, slurm/sweep, scripts/*.sh) uses only flags that the
    program's own --help lists;
  - README.md stays a front page: at most README_MAX_LINES lines (detail goes to docs/).

Usage: tests/check_docs.py [--self-test]   (exit 1 on a problem, one line each)
"""
import glob
import os
import re
import subprocess
import sys

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
PAGES = ["README.md"] + sorted(os.path.relpath(p, ROOT) for p in glob.glob(os.path.join(ROOT, "docs", "*.md")))
PROGRAM = re.compile(r"^(?:\./)?((?:build/bin|\$BIN|\$SHARDBENCH_HOME/bin)/[a-z_]+|analysis/[a-z_]+\.py|slurm/sweep|scripts/[a-z-]+\.sh)$")
FLAG = re.compile(r"^(--[a-z][a-z0-9-]*)(?:=.*)?$")


def slug(heading):
    """GitHub's anchor for a heading: lower case, punctuation dropped, spaces to hyphens."""
    s = re.sub(r"[^\w\- ]", "", heading.strip().lower())
    return s.replace(" ", "-")


def anchors(path):
    text = open(path, encoding="utf-8").read()
    text = re.sub(r"```.*?```", "", text, flags=re.S)
    return {slug(m.group(1)) for m in re.finditer(r"^#+\s+(.*)$", text, flags=re.M)}


def link_problems(page):
    out = []
    text = open(os.path.join(ROOT, page), encoding="utf-8").read()
    text = re.sub(r"```.*?```", "", text, flags=re.S)
    for m in re.finditer(r"\]\(([^)\s]+)\)", text):
        target = m.group(1)
        if re.match(r"^[a-z]+:", target):
            continue
        path, _, anchor = target.partition("#")
        full = os.path.normpath(os.path.join(ROOT, os.path.dirname(page), path)) if path else os.path.join(ROOT, page)
        if not os.path.exists(full):
            out.append(f"{page}: link {target!r}: {os.path.relpath(full, ROOT)} does not exist")
        elif anchor and full.endswith(".md") and anchor not in anchors(full):
            out.append(f"{page}: link {target!r}: no heading #{anchor} in {os.path.relpath(full, ROOT)}")
    return out


def commands(page):
    """(program, [flags]) of every command line in the page's code blocks."""
    text = open(os.path.join(ROOT, page), encoding="utf-8").read()
    for block in re.findall(r"```(?:sh|bash|console)?\n(.*?)```", text, flags=re.S):
        block = re.sub(r"\\\n", " ", block)
        for line in block.splitlines():
            line = re.sub(r"(^|\s)#.*$", "", line.lstrip("$ "))
            for part in re.split(r"\||;|&&|\|\||\$\(|\)|`", line):
                words = part.split()
                for i, w in enumerate(words):
                    m = PROGRAM.match(w)
                    if m and (i == 0 or words[i - 1] not in ("source", ".")):  # run, not sourced
                        flags = [FLAG.match(x).group(1) for x in words[i + 1:] if FLAG.match(x)]
                        yield m.group(1), flags
                        break


HELP = {}


def help_of(program):
    if program not in HELP:
        name = program.replace("$BIN", "build/bin").replace("$SHARDBENCH_HOME/bin", "build/bin")
        cmd = [os.path.join(ROOT, name), "--help"]
        if name.endswith(".py") or name == "slurm/sweep":
            cmd = ["/usr/bin/python3"] + cmd
        try:
            p = subprocess.run(cmd, capture_output=True, text=True, timeout=60, cwd=ROOT)
            HELP[program] = p.stdout + p.stderr
        except OSError as e:
            HELP[program] = None
    return HELP[program]


def flag_problems(page):
    out = []
    for program, flags in commands(page):
        flags = [f for f in flags if f != "--help"]
        name = program.replace("$BIN", "build/bin").replace("$SHARDBENCH_HOME/bin", "build/bin")
        if not flags:  # only its name to check: not every script takes --help (demo.sh runs)
            if not os.path.exists(os.path.join(ROOT, name)):
                out.append(f"{page}: {program} does not exist")
            continue
        h = help_of(program)
        if h is None:
            out.append(f"{page}: {program} does not exist")
            continue
        for f in flags:
            if not re.search(re.escape(f) + r"(?![a-z0-9-])", h):
                out.append(f"{page}: {program} {f}: not in its --help")
    return out


def table_problems(page):
    """docs/usage.md's flag table: every flag it lists, ddp_perf's or fsdp_perf's."""
    if page != "docs/usage.md":
        return []
    known = (help_of("build/bin/ddp_perf") or "") + (help_of("build/bin/fsdp_perf") or "")
    out = []
    for row in re.findall(r"^\| (`--.*?) \|", open(os.path.join(ROOT, page), encoding="utf-8").read(), flags=re.M):
        for f in re.findall(r"(--[a-z][a-z0-9-]*)", row):
            if not re.search(re.escape(f) + r"(?![a-z0-9-])", known):
                out.append(f"{page}: flag table: {f} is neither ddp_perf's nor fsdp_perf's")
    return out


README_MAX_LINES = 200


def length_problems(page, limit=README_MAX_LINES):
    """README.md is the front page: new detail goes to docs/, not into it."""
    if page != "README.md":
        return []
    n = len(open(os.path.join(ROOT, page), encoding="utf-8").read().splitlines())
    return [f"{page}: {n} lines, more than the front page's {limit} (move detail to docs/)"] if n > limit else []


def self_test():
    assert slug("Analysis: figures, a report, and a projection to 512 GPUs") == \
        "analysis-figures-a-report-and-a-projection-to-512-gpus"
    assert slug("Programs: ddp_perf and fsdp_perf") == "programs-ddp_perf-and-fsdp_perf"
    page = "docs/.check_docs_selftest.md"
    with open(os.path.join(ROOT, page), "w") as f:
        f.write("[a](nowhere.md) [b](usage.md#no-such-heading) [c](usage.md)\n"
                "```sh\nbuild/bin/fsdp_perf --model t5-tiny --no-such-flag \\\n  --plan\n"
                "analysis/summarize.py --no-such-option x.h5  # --comment-flag\n```\n")
    try:
        links, flags = link_problems(page), flag_problems(page)
    finally:
        os.remove(os.path.join(ROOT, page))
    assert len(links) == 2 and "nowhere.md" in links[0] and "no-such-heading" in links[1], links
    assert [x.split(": ", 1)[1] for x in flags] == ["build/bin/fsdp_perf --no-such-flag: not in its --help",
                                                   "analysis/summarize.py --no-such-option: not in its --help"], flags
    assert length_problems("README.md", limit=10) and not length_problems("docs/usage.md", limit=10)
    print("check_docs self-test: ok (a missing file, a missing heading, two unknown flags, a long README caught)")


def main():
    if "--self-test" in sys.argv:
        self_test()
        return 0
    problems = []
    n = 0
    for page in PAGES:
        problems += link_problems(page) + flag_problems(page) + table_problems(page) + length_problems(page)
        n += sum(1 for _ in commands(page))
    for p in problems:
        print(p)
    print(f"check_docs: {len(PAGES)} pages, {n} commands, {len(problems)} problem(s)")
    return 1 if problems else 0


if __name__ == "__main__":
    sys.exit(main())
