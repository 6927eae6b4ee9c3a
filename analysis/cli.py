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
"""
import argparse
import os


def parser(doc, file):
    """An ArgumentParser for the script `file` whose module docstring is `doc`."""
    head, _, rest = doc.strip().partition("\n\n")
    return argparse.ArgumentParser(prog="analysis/" + os.path.basename(file), description=head,
                                   epilog=rest or None, formatter_class=argparse.RawDescriptionHelpFormatter)
