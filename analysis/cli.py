"""The analysis scripts' one command-line convention (slurm/sweep's):

- `prog` is the path users type (analysis/NAME.py);
- the description is the docstring's whole first paragraph, the rest of it (usage
  examples, method, exit codes) is the epilog, both as written;
- every positional and option has a help text, and each one with a default says
  "(default: …)";
- option names are the programs' own (--seq-len, --activation-checkpointing, --out) and
  strategies are named as the programs label them (ddp, fsdp-full, fsdp-hybrid<G>,
  fsdp-none, fsdp-grad-op; strategy_labels.py maps them to program flags).

tests/check_cli.py holds every analysis script to it.

Bad input is checked here too, once for every tool (and slurm/sweep: this module is standard
library only): BadInput, load_toml() for the TOML files they read, check_output_file() and
check_output_dir() for the paths they write, positive_list() for their lists of counts.
BadInput is the tools' one error of one line: each raises it and prints it as
"<tool>: error: <message>" (strategy_labels' and model_shapes' errors are kinds of it).
"""
import argparse
import os


def parser(doc, file):
    """An ArgumentParser for the script `file` whose module docstring is `doc`."""
    head, _, rest = doc.strip().partition("\n\n")
    return argparse.ArgumentParser(prog="analysis/" + os.path.basename(file), description=head,
                                   epilog=rest or None, formatter_class=argparse.RawDescriptionHelpFormatter)


# ---- bad input: one line naming the value and what is allowed, never a traceback ----------------
# The one home of the checks every tool makes of the files it reads and the paths it writes;
# the tools (and slurm/sweep: standard library only, as this module) print the message as
# "<tool>: error: <message>" and exit 2, before anything is written.

class BadInput(Exception):
    """Input a tool cannot use (a file, a path, a value, a program's refusal): its message is
    one line naming it and why."""


def load_toml(path, what):
    """The TOML document at `path` (a run matrix, a cluster description: `what`), or BadInput
    naming the file: missing, a folder, unreadable, not UTF-8 (TOML is UTF-8 text; tomllib
    would raise a bare UnicodeDecodeError), not valid TOML."""
    import tomllib
    try:
        with open(path, "rb") as f:
            data = f.read()
    except FileNotFoundError:
        raise BadInput(f"{path}: no such {what}")
    except IsADirectoryError:
        raise BadInput(f"{path}: is a directory, not a {what} (a TOML file)")
    except OSError as e:
        raise BadInput(f"{path}: cannot read the {what}: {e.strerror}")
    try:
        text = data.decode("utf-8")
    except UnicodeDecodeError as e:
        line = data.count(b"\n", 0, e.start) + 1
        raise BadInput(f"{path}: not UTF-8 text (byte 0x{data[e.start]:02x} on line {line}): a {what} must be "
                       "UTF-8 TOML")
    try:
        return tomllib.loads(text)
    except tomllib.TOMLDecodeError as e:
        raise BadInput(f"{path}: not valid TOML: {e}")


def _unwritable(folder):
    """Why nothing can be created in the existing folder `folder`, or None. A file is
    created and removed there: os.access() says yes to root on /sys and /proc, and on a
    folder whose mode forbids writing, where only trying tells."""
    import tempfile
    try:
        fd, probe = tempfile.mkstemp(dir=folder, prefix=".shardbench-write-check-")
    except OSError as e:
        return e.strerror or str(e)
    os.close(fd)
    os.remove(probe)
    return None


def check_output_file(path, flag, formats=None):
    """Refuses (BadInput) an output file the tool could not write, before it does any work:
    `path` must name a file (not a folder) in an existing, writable folder; with `formats`
    (extensions without the dot), its extension must be one of them. Mirrors the programs'
    --out checks (src/run/environment.cpp)."""
    if not path or path.endswith(os.sep):
        raise BadInput(f"{flag} '{path}' is not allowed (must name a file)")
    if os.path.isdir(path):
        raise BadInput(f"{flag} '{path}' is a directory (must name a file)")
    if formats is not None:
        ext = os.path.splitext(path)[1][1:].lower()
        if ext not in formats:
            raise BadInput(f"{flag} '{path}': the file name must end in one of "
                           f"{', '.join('.' + x for x in formats)} (the format it is written in)")
    folder = os.path.dirname(path) or "."
    if not os.path.isdir(folder):
        raise BadInput(f"{flag} '{path}': " + (f"'{folder}' is not a directory" if os.path.lexists(folder) else
                                               f"directory '{folder}' does not exist (create it first)"))
    why = _unwritable(folder)
    if why:
        raise BadInput(f"{flag} '{path}': directory '{folder}' is not writable ({why})")


def check_output_dir(path, flag):
    """Refuses (BadInput) an output folder the tool could not fill, before it does any work:
    `path` is a writable folder, or one that os.makedirs can create (its nearest existing
    ancestor is a writable folder). Creates nothing: a tool makes the folder when it has
    something to put in it."""
    if not path:
        raise BadInput(f"{flag} '' is not allowed (must name a directory)")
    if os.path.lexists(path) and not os.path.isdir(path):
        raise BadInput(f"{flag} '{path}' exists and is not a directory")
    folder = os.path.normpath(path)  # the nearest existing ancestor, as the user spelled it
    while not os.path.lexists(folder) and (os.path.dirname(folder) or ".") != folder:
        folder = os.path.dirname(folder) or "."
    if not os.path.isdir(folder):
        raise BadInput(f"{flag} '{path}': '{folder}' is not a directory")
    why = _unwritable(folder)
    if why:
        raise BadInput(f"{flag} '{path}': directory '{folder}' is not writable ({why})")


def positive_list(text, flag):
    """The integers of `text`, a comma-separated list given as `flag`, or BadInput unless
    each is a positive integer."""
    try:
        values = [int(x) for x in text.split(",")]
    except ValueError:
        raise BadInput(f"{flag} '{text}' is not a comma-separated list of integers")
    if any(x <= 0 for x in values):
        raise BadInput(f"{flag} '{text}': every value must be positive")
    return values
