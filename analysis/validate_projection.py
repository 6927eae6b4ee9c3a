#!/usr/bin/python3
"""Projection against measurement: pairs measured and projected results of the same
configuration (strategy, model, ranks, batch, sequence length) and prints the error of
the projected step time against the measured one: the median of the runs of that
configuration (each run's own median step), with the runs' range.

    analysis/validate_projection.py --measured val/measured --projected val/projected --max-error 0.35
    analysis/validate_projection.py --measured m/ --projected p/ --max-error 0.15 --same-order

--same-order also requires, among the strategies of each model, rank count, batch and sequence
length, the projected order of step times to be the measured one.
scripts/validate-projection.sh (one machine) and scripts/validate-emulated.sh (emulated nodes)
measure, calibrate and project, then run this.
Exit codes: 0 compared; 1 a pair's |error| exceeds --max-error, or an order differs under
--same-order; 2 bad input (a path that does not exist, a --max-error that is not a finite
number >= 0) or no pair; 3 (EXIT_SKIPPED) unreadable files were skipped, one line each, and
the rest compared.
"""
import glob
import math
import os
import statistics
import sys

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import cli  # noqa: E402
import shardbench_h5  # noqa: E402


def files(items, flag):
    out = []
    for x in items:
        if not os.path.exists(x):
            raise cli.BadInput(f"{flag} {x}: no such file or folder")
        out += sorted(glob.glob(os.path.join(x, "*.h5"))) if os.path.isdir(x) else [x]
    return out


def key(m):
    return (m["label"], m["model"], m["world_size"], m["batch_per_rank"], m["enc_seq_len"])


def main(argv=None):
    ap = cli.parser(__doc__, __file__)
    ap.add_argument("--measured", nargs="+", required=True, metavar="DIR|RESULT.h5",
                    help="measured results, or folders of them (required)")
    ap.add_argument("--projected", nargs="+", required=True, metavar="DIR|RESULT.h5",
                    help="projected results (analysis/project.py), or folders of them (required)")
    ap.add_argument("--max-error", type=float, default=None, metavar="FRACTION",
                    help="fail (exit 1) when a pair's |projected/measured − 1| exceeds this (default: report only)")
    ap.add_argument("--same-order", action="store_true",
                    help="fail (exit 1) unless the projection orders the strategies of each setting as measured")
    a = ap.parse_args(argv)
    try:
        if a.max_error is not None and not (math.isfinite(a.max_error) and a.max_error >= 0):
            raise cli.BadInput(f"--max-error {a.max_error} is not allowed (a finite number >= 0)")
        paths = files(a.measured, "--measured"), files(a.projected, "--projected")
    except cli.BadInput as e:
        print(f"validate: error: {e}", file=sys.stderr)
        return 2
    inputs = shardbench_h5.Inputs("validate")  # attributes only: a file whose tables were dropped still counts
    metas = [[m for m in (inputs.read_one(p, shardbench_h5.read_meta) for p in group) if m is not None] for group in paths]
    runs = {}  # every measured run of a configuration
    for m in metas[0]:
        if m.get("status") == "ok" and not m.get("projected"):
            runs.setdefault(key(m), []).append(m["median_step_time_s"])
    projected = {key(m): m["median_step_time_s"] for m in metas[1] if m.get("projected")}
    pairs = sorted(set(runs) & set(projected))
    if not pairs:
        print("validate: no configuration was both measured and projected", file=sys.stderr)
        return 2
    print(f"{'strategy':<16} {'model':<9} {'ranks':>5} {'batch':>5} {'seq':>4} {'runs':>4} {'measured ms':>12} "
          f"{'range ms':>19} {'projected ms':>13} {'error':>8}")
    worst, measured = 0.0, {}
    for k in pairs:
        m, p = statistics.median(runs[k]), projected[k]
        measured[k] = m
        err = p / m - 1
        worst = max(worst, abs(err))
        span = f"{min(runs[k]) * 1e3:.1f}-{max(runs[k]) * 1e3:.1f}"
        print(f"{k[0]:<16} {k[1]:<9} {k[2]:>5} {k[3]:>5} {k[4]:>4} {len(runs[k]):>4} {m * 1e3:>12.2f} {span:>19} "
              f"{p * 1e3:>13.2f} {err:>+8.1%}")
    print(f"validate: {len(pairs)} configurations, worst |error| {worst:.1%}")
    failed = a.max_error is not None and worst > a.max_error
    if failed:
        print(f"validate: FAIL: worst error above {a.max_error:.0%}")
    settings = {}
    for k in pairs:
        settings.setdefault(k[1:], []).append(k)
    for setting, ks in sorted(settings.items()):
        if len(ks) < 2:
            continue
        by_measured = [k[0] for k in sorted(ks, key=lambda k: measured[k])]
        by_projected = [k[0] for k in sorted(ks, key=lambda k: projected[k])]
        same = by_measured == by_projected
        # the pairs the projection swapped, and whether their measured runs' ranges overlap (the
        # runs themselves do not order them): said, never excused
        swapped = [(x, y) for i, x in enumerate(by_measured) for y in by_measured[i + 1:]
                   if by_projected.index(x) > by_projected.index(y)]
        ties = "".join(f"; {x} and {y}: measured {measured[(x,) + setting] / measured[(y,) + setting] - 1:+.1%}"
                       + (", their runs' ranges overlap" if max(runs[(x,) + setting]) >= min(runs[(y,) + setting])
                          else "") for x, y in swapped)
        print(f"validate: {setting[0]} on {setting[1]} ranks: measured {' < '.join(by_measured)}; projected "
              f"{' < '.join(by_projected)}: {'same order' if same else 'ORDER DIFFERS'}{ties}")
        if a.same_order and not same:
            failed = True
    if failed:
        return 1
    return inputs.exit_code(0)


if __name__ == "__main__":
    sys.exit(cli.run(__file__, main))
