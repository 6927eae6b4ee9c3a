#!/usr/bin/python3
"""Strategy comparison of shardbench results: a table (step time relative to DDP, TFLOPS
per rank, exposed communication, peak memory against the plan, final loss) and,
optionally, a bar plot.

    analysis/compare.py results/demo/ddp.h5 results/demo/fsdp-*.h5 --plot comparison.png

Each run is compared with the DDP run of the same model, ranks, batch and sequence length
("vs ddp" is its step time over DDP's). Projected results (analysis/project.py) compare as
measured ones do, marked "projected" in the source column, with "-" for the loss they do not
have; compare measured with measured and projected with projected.
Exit status: 0; 1 some runs did not complete (status not ok); 2 no readable training
result, or a --plot path that cannot be written; 3 (EXIT_SKIPPED) unreadable or foreign
files were skipped, one line each.
"""
import os
import sys

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import cli  # noqa: E402
from shardbench_h5 import TRAINING_KEYS, Inputs, load, require  # noqa: E402

MEASURED = ("median_step_time_s", "median_model_tflops_per_rank", "median_tokens_per_s", "median_exposed_comm_s",
            "max_peak_memory_bytes", "plan_peak_memory_bytes", "final_loss")


def read(path):
    """A training result with what the table needs, or KeyError."""
    run = load(path)
    measured = MEASURED if not run.meta.get("projected") else MEASURED[:-1]  # a replay has no loss
    return require(run, TRAINING_KEYS + (measured if run.meta.get("status") == "ok" else ()))


def main(argv=None):
    ap = cli.parser(__doc__, __file__)
    ap.add_argument("files", nargs="+", metavar="RESULT.h5", help="completed training results (ddp_perf, fsdp_perf)")
    ap.add_argument("--plot", metavar="OUT.png",
                    help="also write a bar chart of step time and peak memory (default: no plot)")
    a = ap.parse_args(argv)
    try:  # before anything is read: a path it cannot write is one line, not a traceback at the end
        if a.plot:
            from matplotlib.backend_bases import FigureCanvasBase
            cli.check_output_file(a.plot, "--plot", formats=sorted(FigureCanvasBase.get_supported_filetypes()))
    except cli.BadInput as e:
        print(f"compare: error: {e}", file=sys.stderr)
        return 2
    inputs = Inputs("compare")
    runs = inputs.read(a.files, read)
    if not runs:
        print("compare: no readable training result: nothing to compare", file=sys.stderr)
        return 2
    bad = [f"{r.path} ({r.meta['status']})" for r in runs if r.meta["status"] != "ok"]
    if bad:
        print(f"compare: not completed runs: {', '.join(bad)}", file=sys.stderr)
        return inputs.exit_code(1)
    m = [r.meta for r in runs]
    # Each run is compared with the DDP run of the same model, ranks, batch and sequence.
    same = lambda x, y: all(x[k] == y[k] for k in ("model", "world_size", "batch_per_rank", "enc_seq_len"))  # noqa: E731
    base_of = lambda x: next((y["median_step_time_s"] for y in m if y["strategy"] == "ddp" and same(x, y)),  # noqa: E731
                             float("nan"))
    hdr = (f"{'strategy':<14} {'model':<10} {'ranks':>5} {'step ms':>9} {'vs ddp':>7} {'TFLOPS/rank':>12} "
           f"{'tokens/s':>10} {'exposed ms':>11} {'peak MiB':>9} {'plan MiB':>9} {'loss':>9}  source")
    print(hdr)
    print("-" * len(hdr))
    for x in m:
        print(f"{x['label']:<14} {x['model']:<10} {x['world_size']:>5} {x['median_step_time_s'] * 1e3:>9.2f} "
              f"{x['median_step_time_s'] / base_of(x):>7.2f} {x['median_model_tflops_per_rank']:>12.4f} "
              f"{x['median_tokens_per_s']:>10.0f} {x['median_exposed_comm_s'] * 1e3:>11.2f} "
              f"{x['max_peak_memory_bytes'] / 2**20:>9.1f} {x['plan_peak_memory_bytes'] / 2**20:>9.1f} "
              f"{format(x['final_loss'], '.5f') if 'final_loss' in x else '-':>9}  "
              f"{'projected' if x.get('projected') else 'run'}")
    if a.plot:
        import matplotlib
        matplotlib.use("Agg")
        import matplotlib.pyplot as plt
        several = len({(x["model"], x["world_size"]) for x in m}) > 1
        names = [x["label"] + (f"\n{x['model']} w{x['world_size']}" if several else "") for x in m]
        fig, ax = plt.subplots(1, 2, figsize=(10, 3.8))
        # Whiskers from the fastest to the slowest timed step (slowest rank): the noise.
        steps = [r.timed_steps.groupby("step")["time"].max() * 1e3 if len(r.timed_steps) else [] for r in runs]
        med = [x["median_step_time_s"] * 1e3 for x in m]
        spread = lambda v, s, f: abs(v - f(s)) if len(s) else 0.0  # noqa: E731  (a replay has no steps)
        ax[0].bar(names, med, color="tab:blue", capsize=5,
                  yerr=[[spread(v, s, min) for v, s in zip(med, steps)], [spread(v, s, max) for v, s in zip(med, steps)]])
        ax[0].set_ylabel("step time (ms): median, fastest–slowest step")
        ax[1].bar(names, [x["max_peak_memory_bytes"] / 2**20 for x in m], color="tab:orange", label="measured")
        ax[1].plot(names, [x["plan_peak_memory_bytes"] / 2**20 for x in m], "kx", label="plan")
        ax[1].set_ylabel("peak memory per rank (MiB)")
        ax[1].legend()
        fig.suptitle(f"{m[0]['model']} on {m[0]['world_size']} ranks: DDP vs FSDP")
        for x in ax:
            x.tick_params(axis="x", rotation=20)
        fig.tight_layout()
        fig.savefig(a.plot, dpi=110)
        print(f"plot: {a.plot}")
    return inputs.exit_code(0)


if __name__ == "__main__":
    sys.exit(cli.run(__file__, main))
