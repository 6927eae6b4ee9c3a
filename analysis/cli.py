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
import signal
import sys

# Exit codes every tool shares (docs/usage.md): 2 bad input, 130 interrupted (SIGINT, Ctrl-C),
# 143 terminated (SIGTERM): 128 + the signal's number, as a shell reports a process it ended.
EXIT_INPUT = 2
EXIT_SIGNAL = {signal.SIGINT: 130, signal.SIGTERM: 143}


def tool_name(file):
    """The name a tool's lines start with: advise for analysis/advise.py."""
    return os.path.splitext(os.path.basename(file))[0]


class OneLineParser(argparse.ArgumentParser):
    """argparse's parser whose usage errors are one line, "<tool>: error: <message>", exit 2,
    as the tools' own (argparse prints the whole usage first: a dozen lines for advise)."""

    def error(self, message):
        self.exit(EXIT_INPUT, f"{tool_name(self.prog)}: error: {message} (see {self.prog} --help)\n")


def parser(doc, file):
    """An ArgumentParser for the script `file` whose module docstring is `doc`."""
    head, _, rest = doc.strip().partition("\n\n")
    return OneLineParser(prog="analysis/" + os.path.basename(file), description=head,
                         epilog=rest or None, formatter_class=argparse.RawDescriptionHelpFormatter)


# ---- one way to start, stop and end: run() wraps every tool's main ------------------------------

_MAIN_PID = [None]
_PENDING = set()  # temporary files being written (atomic_write): removed when a signal ends the tool
# What an Outputs has put in place and not yet settled, undone by a signal as by its `with`
# block: the names a publish() under way gives its files ({name: temporary}), the folders it made.
_PUBLISHING = {}
_MADE = []  # innermost first


def _descendants(pid):
    """Every process below `pid` (Linux /proc), deepest last."""
    out = []
    try:
        tasks = os.listdir(f"/proc/{pid}/task")
    except OSError:
        return out
    for t in tasks:
        try:
            with open(f"/proc/{pid}/task/{t}/children") as f:
                kids = [int(x) for x in f.read().split()]
        except OSError:
            continue
        for k in kids:
            out.append(k)
            out += _descendants(k)
    return out


def _on_signal(signum, frame):
    """SIGINT or SIGTERM: end every process this one started (pool workers, the programs they
    run), remove the temporary files being written, one line from the tool itself (not from
    its workers, which inherit this handler), exit 128 + the signal."""
    signal.signal(signal.SIGINT, signal.SIG_IGN)
    signal.signal(signal.SIGTERM, signal.SIG_IGN)
    for pid in reversed(_descendants(os.getpid())):  # the deepest first: none is orphaned while it runs
        try:
            os.kill(pid, signal.SIGKILL)
        except OSError:
            pass
    try:  # reap this process's own (their children, already ended, are init's to reap)
        while os.waitpid(-1, 0)[0]:
            pass
    except ChildProcessError:
        pass
    for path, tmp in list(_PUBLISHING.items()):  # a name is ours only while it is our temporary's file
        try:
            if os.path.samefile(path, tmp):
                os.remove(path)
        except OSError:
            pass
    for path in list(_PENDING):
        try:
            os.remove(path)
        except OSError:
            pass
    for d in list(_MADE):  # only if empty: another run may have put files there meanwhile
        try:
            os.rmdir(d)
        except OSError:
            pass
    if os.getpid() == _MAIN_PID[0]:
        what = "interrupted" if signum == signal.SIGINT else "terminated"
        try:
            sys.stderr.write(f"{_MAIN_PID[1]}: {what} ({signal.Signals(signum).name}): stopped, with the "
                             "processes it started\n")
            sys.stderr.flush()
        except OSError:
            pass
    os._exit(EXIT_SIGNAL[signum])


def run(file, main, argv=None):
    """Runs a tool's main(argv) (the tool at path `file`) and returns its exit status: SIGINT
    and SIGTERM end it and everything it started (exit 130, 143; one line, no traceback), a
    BadInput that escapes main is its one line and exit 2."""
    _MAIN_PID[:] = [os.getpid(), tool_name(file)]
    for sig in EXIT_SIGNAL:
        signal.signal(sig, _on_signal)
    try:
        return main(argv) if argv is not None else main()
    except BadInput as e:
        print(f"{tool_name(file)}: error: {e}", file=sys.stderr)
        return EXIT_INPUT


# ---- results written whole or not at all ---------------------------------------------------------

class Outputs:
    """The files one run of a tool writes, published all together or not at all (project.py's
    way): each is written under a temporary name beside its own (temp(), open()), and
    publish() gives every one its name at the end: without `overwrite` only a name still
    free (os.link fails on one another run took meanwhile: BadInput, and what this run had
    published is taken back), with it by os.replace. Leaving the `with` block removes what
    was not published; an OSError there (a full disk) becomes BadInput naming the file and the
    errno's text. A signal (run()) does the same: temporary files, the files of a publish()
    under way and the folders made here are removed, and an interrupted run leaves nothing."""

    def __init__(self, overwrite=False):
        self.overwrite, self.staged, self.made = overwrite, [], []

    def __enter__(self):
        return self

    def makedirs(self, folder):
        """Creates `folder` (and its missing parents), removed again if nothing is published."""
        missing, f = [], os.path.abspath(folder)
        while not os.path.isdir(f):
            missing.append(f)
            f = os.path.dirname(f)
        os.makedirs(folder, exist_ok=True)
        self.made += missing  # innermost first
        _MADE.extend(missing)

    def temp(self, path, suffix=None):
        """A temporary file beside `path` (by default with the same extension: savefig picks
        the format by it; `suffix` instead where a reader of the folder must not take it
        for a result, e.g. node_exporter's *.prom), published as `path`."""
        import tempfile
        folder, base = os.path.split(path)
        self.current = path
        fd, tmp = tempfile.mkstemp(dir=folder or ".", prefix=f".{base}.",
                                   suffix=".part" + os.path.splitext(base)[1] if suffix is None else suffix)
        os.close(fd)
        _PENDING.add(tmp)
        self.staged.append((tmp, path))
        return tmp

    def open(self, path, mode="w", suffix=None, **kw):
        return open(self.temp(path, suffix), mode, **kw)

    def publish(self):
        done = []
        try:
            for tmp, path in self.staged:
                self.current = path
                if self.overwrite:
                    os.replace(tmp, path)
                else:
                    _PUBLISHING[path] = tmp  # before the link: a signal right after it finds it
                    try:
                        os.link(tmp, path)
                    except FileExistsError:
                        raise BadInput(f"{path} was written by another run while this one ran: not replaced "
                                       "(nothing of this run kept)")
                    done.append(path)
        except BaseException:
            for path in done:
                os.remove(path)
            raise
        finally:
            for tmp, path in self.staged:
                _PUBLISHING.pop(path, None)
        self._settle()

    def _settle(self):
        """The folders made are the run's now (published into) or removed: a signal leaves them."""
        for d in self.made:
            if d in _MADE:
                _MADE.remove(d)
        self.made = []

    def __exit__(self, kind, value, tb):
        for tmp, _ in self.staged:
            if os.path.lexists(tmp):
                os.remove(tmp)
            _PENDING.discard(tmp)
        for d in self.made:  # only if still empty
            if os.path.isdir(d) and not os.listdir(d):
                os.rmdir(d)
        self._settle()
        if kind is not None and issubclass(kind, OSError):
            path = getattr(self, "current", None) or value.filename
            raise BadInput(f"cannot write '{path}': {value.strerror or value}") from None
        return False


def refuse_existing(path, flag, overwrite):
    """BadInput when `path` exists and `overwrite` is not given (the tools replace a result
    only when asked, as project.py)."""
    if os.path.lexists(path) and not overwrite:
        raise BadInput(f"{flag} '{path}' exists (pass --overwrite to replace it)")


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
