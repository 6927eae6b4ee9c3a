#!/usr/bin/python3
"""Tests of the layout advisor (analysis/advise.py): the enumeration's counts for t5-tiny on
4 and 8 GPUs (hand-counted below), the exclusions (a global batch that does not divide, a
tensor degree the program refuses, a layout that does not fit), the study's cases (DDP
excluded for t5-11.3b on 8 A100 80GB; on 512, only checkpointing fits without a pipeline and
hybrid sharding (G = 8) replays ahead of full sharding), --emit-matrix accepted by `slurm/sweep FILE --dry-run`, --explain, the fast
estimate beside the full replay, and bad input (one line, exit 2).

Run from anywhere: /usr/bin/python3 tests/test_advise.py   (in tests/run_tests.sh; about half
a minute on 2 cores)
"""
import os
import subprocess
import sys
import tempfile
import unittest

REPO = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
sys.path.insert(0, os.path.join(REPO, "analysis"))
import advise  # noqa: E402

PY = "/usr/bin/python3"
ADVISE = os.path.join(REPO, "analysis", "advise.py")
A100 = os.path.join(REPO, "runs", "clusters", "a100-80gb.toml")


def run(*args):
    return subprocess.run([PY, ADVISE, "--cluster", A100] + list(args), capture_output=True, text=True, cwd=REPO)


def tiny_tp(tp):  # t5-tiny: heads 2, so the program refuses tp 4 and 8
    return True if tp <= 2 else "refused"


class Enumeration(unittest.TestCase):
    def count(self, layouts):
        return len(layouts), len({x.name for x in layouts})

    def test_tiny_on_4(self):
        # 4 GPUs, global batch 16, t5-tiny (4 blocks), every strategy with offload. Labels at dp
        # ranks: ddp, none 1 each; optimizer-state 2 (+offload-optimizer); full, grad-op 3 each
        # (+params, +optimizer); hybrid<G> 3 for each G dividing dp, 1 < G < dp: 10 + 3h.
        # tp1 pp1 dp4 (h 1: G 2): 13 labels x 2 checkpointing                        = 26
        # tp1 pp2 dp2: 10 x 2 x 2 schedules x micro-batches {2, 4, 8} of batch 8     = 120
        # tp1 pp4 dp1: 10 x 2 x 2 x {4, 8, 16} of batch 16                           = 120
        # tp2 pp1 dp2: 10 x 2                                                        = 20
        # tp2 pp2 dp1: 10 x 2 x 2 x {2, 4, 8, 16}                                    = 160
        # tp4: refused by the program (heads 2)                                      total 446
        layouts, excluded = advise.enumerate_layouts(4, 16, 4, 8, tiny_tp)
        self.assertEqual(self.count(layouts), (446, 446))
        self.assertEqual([w for w, _ in excluded], ["tp4"])

    def test_tiny_on_8_without_offload(self):
        # 8 GPUs, global batch 16, no offload: labels 5 + h.
        # tp1 pp1 dp8 (G 2, 4): 7 x 2                           = 14
        # tp1 pp2 dp4 (G 2): 6 x 2 x 2 x {2, 4} of batch 4       = 48
        # tp1 pp4 dp2: 5 x 2 x 2 x {4, 8} of batch 8             = 40
        # tp2 pp1 dp4: 6 x 2                                     = 12
        # tp2 pp2 dp2: 5 x 2 x 2 x {2, 4, 8}                     = 60
        # tp2 pp4 dp1: 5 x 2 x 2 x {4, 8, 16}                    = 60
        # pp8 > 4 blocks: not enumerated; tp4, tp8 refused       total 234
        layouts, excluded = advise.enumerate_layouts(8, 16, 4, 8, tiny_tp, offload=False)
        self.assertEqual(self.count(layouts), (234, 234))
        self.assertEqual(sorted(w for w, _ in excluded), ["tp4", "tp8"])

    def test_does_not_divide(self):
        # global batch 12 over 8 GPUs: dp 8 (tp1 pp1) does not divide it; dp 4, 2, 1 do
        layouts, excluded = advise.enumerate_layouts(8, 12, 4, 8, tiny_tp, offload=False)
        self.assertIn(("tp1 pp1", "global batch 12 does not divide over 8 data-parallel ranks"), excluded)
        self.assertFalse([x for x in layouts if x.dp == 8])

    def test_names_are_sweep_labels(self):
        layouts, _ = advise.enumerate_layouts(4, 16, 4, 8, tiny_tp)
        import strategy_labels
        for lay in layouts:
            strategy_labels.check(lay.label)
            self.assertEqual(advise.parse_name(lay.name, 4, 16).name, lay.name)


    def test_unrun_marker_follows_the_gpu_ledger(self):
        # docs/gpu.md's "Not yet run on a GPU": tensor and pipeline parallelism and CPU offload
        # over NCCL, ZeRO-1 across GPUs; DDP and FSDP full/hybrid/grad-op have run.
        want = {"ddp": [], "fsdp-full": [], "fsdp-hybrid2": [], "fsdp-grad-op": [],
                "fsdp-optimizer-state": ["ZeRO-1"], "fsdp-full-offload-params": ["CPU offload"],
                "fsdp-grad-op-offload-optimizer": ["CPU offload"],
                "fsdp-full-tp2-pp2:mb4:1f1b": ["tensor parallelism", "pipeline parallelism"]}
        for name, parts in want.items():
            lay = advise.parse_name(name, 8, 16)
            self.assertEqual(lay.unrun, parts, name)
            self.assertEqual(lay.unverified, bool(parts), name)


class Runs(unittest.TestCase):
    def test_ddp_does_not_fit_11b_on_8(self):
        with tempfile.TemporaryDirectory() as out:
            p = run("--model", "t5-11.3b", "--gpus", "8", "--global-batch", "64", "--seq-len", "512", "--strategies",
                    "ddp,fsdp-full", "--tp", "1", "--pp", "1", "--no-offload", "--replay", "2", "--out", out,
                    "--overwrite", "--emit-matrix", os.path.join(out, "top.toml"))
            self.assertEqual(p.returncode, 0, p.stderr)
            # DDP out of memory with and without checkpointing; FSDP full only with it (batch 8 per GPU)
            self.assertIn("excluded: 3 layouts do not fit", p.stdout)
            self.assertIn("do not fit, by strategy: ddp 2, fsdp-full 1", p.stdout)
            self.assertIn("calibration: 3 runs in runs/calibration/h100-2026-11-23", p.stdout)
            self.assertIn("docs/projection.md#validation", p.stdout)
            rows = [x for x in p.stdout.splitlines() if x[:3].strip().isdigit()]
            self.assertEqual([r.split()[1] for r in rows], ["fsdp-full:ckpt"])
            self.assertTrue(os.path.exists(os.path.join(out, "advise.png")))
            self.assertTrue(os.path.exists(os.path.join(out, "advise.csv")))
            s = subprocess.run([PY, os.path.join(REPO, "slurm", "sweep"), os.path.join(out, "top.toml"), "--dry-run"],
                               capture_output=True, text=True, cwd=REPO)
            self.assertEqual(s.returncode, 0, s.stderr)
            self.assertIn("t5-11.3b-fsdp-full-g8-b8-s512", s.stdout)

    def test_matrices_per_setting(self):
        """Layouts differing in a setting a matrix holds once: one matrix each (a layout
        without a pipeline joins one of its batch and checkpointing), each accepted by
        slurm/sweep --dry-run with the layouts' own flags."""
        from projection_model import load_cluster

        class A:
            model, gpus, global_batch, seq_len, dec_seq_len = "t5-11.3b", 16, 128, 512, 256
        for key in advise.model_shapes.KEYS:
            setattr(A, key, None)
        A.layers = 4
        names = ["ddp-tp2-pp2:mb8:1f1b:ckpt", "fsdp-full-tp4:ckpt", "fsdp-full-pp4:mb8:gpipe",
                 "fsdp-hybrid2-tp2-pp2:mb16:1f1b:ckpt"]
        lays = [advise.parse_name(x, 16, 128) for x in names]
        with tempfile.TemporaryDirectory() as out:
            A.emit_matrix = os.path.join(out, "m.toml")
            paths = []
            for path, text in advise.emit_matrix(A, load_cluster(A100), lays):
                with open(path, "w") as f:
                    f.write(text)
                paths.append(path)
            self.assertEqual([os.path.basename(x) for x in paths], ["m.toml", "m-2.toml", "m-3.toml"])
            seen = []
            for path in paths:
                s = subprocess.run([PY, os.path.join(REPO, "slurm", "sweep"), path, "--dry-run"], capture_output=True,
                                   text=True, cwd=REPO)
                self.assertEqual(s.returncode, 0, s.stderr)
                seen.append(s.stdout)
            self.assertIn("--micro-batches 8", seen[0])
            self.assertIn("--activation-checkpointing", seen[0])
            self.assertIn("fsdp-full-tp4-g16-b32-s512", seen[0])  # joined the first: batch 32, checkpointing
            self.assertIn("--pp-schedule gpipe", seen[1])
            self.assertIn("--micro-batches 16", seen[2])
            self.assertIn("--dec-seq-len 256", seen[0])
            self.assertIn("--layers 4", seen[0])

    def test_study_512_gpus_full_against_hybrid(self):
        """The study's 512-GPU case (t5-11.3b, A100 description, global batch 4096 x 512): without a
        pipeline only checkpointing fits, and the replay puts hybrid sharding (G = 8) ahead of full
        sharding at the figures of docs/projection.md's crossover table (108.8 and 108.4 TFLOPS/GPU)."""
        import csv
        with tempfile.TemporaryDirectory() as out:
            p = run("--model", "t5-11.3b", "--gpus", "512", "--global-batch", "4096", "--seq-len", "512",
                    "--strategies", "fsdp-full,fsdp-hybrid", "--tp", "1", "--pp", "1", "--no-offload", "--replay", "18",
                    "--out", out, "--overwrite")
            self.assertEqual(p.returncode, 0, p.stderr)
            self.assertIn("18 layouts", p.stdout)
            with open(os.path.join(out, "advise.csv")) as f:
                rows = {r["layout"]: r for r in csv.DictReader(f)}
        self.assertEqual(len(rows), 18)
        self.assertEqual({n for n, r in rows.items() if r["fits"] == "1"}, {n for n in rows if n.endswith(":ckpt")})
        full, hybrid = rows["fsdp-full:ckpt"], rows["fsdp-hybrid8:ckpt"]
        self.assertLess(float(hybrid["replay_step_s"]), float(full["replay_step_s"]))
        self.assertAlmostEqual(float(hybrid["model_tflops_per_gpu"]), 108.8, delta=0.15)
        self.assertAlmostEqual(float(full["model_tflops_per_gpu"]), 108.4, delta=0.15)
        # every fitting row says whose figures it carries: the 9 replayed (--replay 18 of 9 fitting) the replay's
        self.assertEqual({r["source"] for r in rows.values() if r["fits"] == "1"}, {"replay"})
        self.assertEqual({r["source"] for r in rows.values() if r["fits"] == "0"}, {""})

    def test_tiny_ranked_with_exclusions(self):
        with tempfile.TemporaryDirectory() as out:
            p = run("--model", "t5-tiny", "--gpus", "8", "--global-batch", "16", "--seq-len", "32", "--strategies",
                    "ddp,fsdp-full", "--no-offload", "--pp", "1,2", "--replay", "3", "--out", out, "--overwrite")
            self.assertEqual(p.returncode, 0, p.stderr)
            # tp1 pp1: 2 x 2 = 4; tp1 pp2: 2 x 2 x 2 x {2, 4} = 16; tp2 pp1: 4; tp2 pp2: 2 x 2 x 2 x {2, 4, 8} = 24
            self.assertIn("48 layouts", p.stdout)
            self.assertIn("tp4: refused by the program: --tp 4 is not allowed with heads 2", p.stdout)
            self.assertIn("by the full replay of the top 3", p.stdout)

    def test_batch_mode_against_single_plans(self):
        """--plan-batch (the programs' batch mode) against one --plan per layout (the same
        programs behind a wrapper whose --describe line hides --plan-batch): the same layouts, verdicts
        and peaks, the estimate from the totals within 10 % of the one from every op."""
        import csv
        rows = {}
        real = os.path.join(REPO, "build", "bin")
        with tempfile.TemporaryDirectory() as tmp:
            slow = os.path.join(tmp, "bin")
            os.mkdir(slow)
            for prog in ("fsdp_perf", "ddp_perf"):
                path = os.path.join(slow, prog)
                with open(path, "w") as f:
                    f.write(f"#!{PY}\nimport subprocess, sys\n"
                            f"p = subprocess.run([{os.path.join(real, prog)!r}] + sys.argv[1:], capture_output=True, text=True)\n"
                            "out = p.stdout if '--describe' not in sys.argv else p.stdout.replace('\"plan_batch\":true', '\"plan_batch\":false')\n"
                            "sys.stdout.write(out); sys.stderr.write(p.stderr); sys.exit(p.returncode)\n")
                os.chmod(path, 0o755)
            args = ["--model", "t5-tiny", "--gpus", "8", "--global-batch", "16", "--seq-len", "32", "--strategies",
                    "fsdp-full", "--tp", "1", "--pp", "1,2", "--replay", "1"]  # with offload: the totals' host lanes
            for mode, extra in (("batch", ["--bin", real]), ("slow", ["--bin", slow])):
                out = os.path.join(tmp, mode)
                p = subprocess.run([PY, ADVISE, "--cluster", A100] + args + extra + ["--out", out], capture_output=True,
                                   text=True, cwd=REPO)
                self.assertEqual(p.returncode, 0, p.stderr)
                self.assertIn("(--plan-batch)" if mode == "batch" else "(one --plan per layout)", p.stdout)
                with open(os.path.join(out, "advise.csv")) as f:
                    rows[mode] = {r["layout"]: r for r in csv.DictReader(f)}
        self.assertEqual(set(rows["batch"]), set(rows["slow"]))
        for name, r in rows["slow"].items():
            b = rows["batch"][name]
            self.assertEqual(b["fits"], r["fits"])
            self.assertEqual(b["peak_gib"], r["peak_gib"])
            if r["fits"] == "1":
                self.assertLess(abs(float(b["est_step_s"]) / float(r["est_step_s"]) - 1), 0.10, name)
                # the source column: the one replayed layout's figures are the replay's, the others the estimate's
                self.assertEqual(r["source"], "replay" if r["replay_step_s"] else "estimate", name)
        self.assertEqual(sum(r["source"] == "replay" for r in rows["slow"].values()), 1)

    def test_figure_labels_numbered(self):
        """advise.png names the fastest end of the Pareto front by number at the point and by
        name in the legend (names beside close points overlapped)."""
        import matplotlib
        matplotlib.use("Agg")
        from matplotlib.axes import Axes
        layouts, _ = advise.enumerate_layouts(8, 16, 4, 8, tiny_tp, offload=False)
        lays = [x for x in layouts if x.pp == 1][:5]
        ranked = []
        for k, lay in enumerate(lays):  # a front of 5: more memory, more tokens/s
            d = {"memory": {"peak_total": (k + 1) * 2**30}, "batch_per_rank": 2, "dp_size": 4, "enc_seq_len": 32,
                 "dec_seq_len": 32, "model_flops_per_step": 1e12}
            ranked.append((lay, d, {"time": 1.0 / (k + 1)}))
        notes, legend = [], []
        annotate, leg = Axes.annotate, Axes.legend
        Axes.annotate = lambda ax, text, *x, **k: notes.append(text) or annotate(ax, text, *x, **k)
        Axes.legend = lambda ax, *x, **k: legend.extend(ax.get_legend_handles_labels()[1]) or leg(ax, *x, **k)
        try:
            with tempfile.TemporaryDirectory() as out:
                advise.draw(ranked, {}, os.path.join(out, "a.png"), os.path.join(out, "a.svg"), "t")
        finally:
            Axes.annotate, Axes.legend = annotate, leg
        self.assertEqual(notes, ["1", "2", "3", "4"])
        self.assertEqual([x for x in legend if x[0].isdigit() and x[1] == ":"],
                         [f"{k}: {ranked[i][0].name}" for k, i in ((1, 4), (2, 3), (3, 2), (4, 1))])

    def test_explain(self):
        p = run("--model", "t5-11.3b", "--gpus", "8", "--global-batch", "64", "--seq-len", "512", "--explain",
                "fsdp-full-tp2-pp2:mb4:1f1b:ckpt")
        self.assertEqual(p.returncode, 0, p.stderr)
        for s in ("memory per GPU (the program's plan)", "optimizer_state", "stage 1 (rank", "step (fast estimate)",
                  "step (full replay)", "communication per axis", "tp ", "throughput (full replay)"):
            self.assertIn(s, p.stdout)
        p = run("--model", "t5-11.3b", "--gpus", "8", "--global-batch", "64", "--seq-len", "512", "--explain", "ddp")
        self.assertEqual(p.returncode, 0, p.stderr)
        self.assertIn("DOES NOT FIT", p.stdout)

    def test_answers_in_the_terminal(self):
        # Without --out: the ranking, one recommended block in ZeRO / PyTorch words, the command
        # to run it and nothing written (the working folder stays empty).
        with tempfile.TemporaryDirectory() as here:
            p = subprocess.run([sys.executable, os.path.join(REPO, "analysis", "advise.py"), "--cluster",
                                os.path.join(REPO, "runs", "clusters", "a100-80gb.toml"), "--model", "t5-tiny",
                                "--gpus", "8", "--global-batch", "16", "--seq-len", "32", "--strategies",
                                "ddp,fsdp-full,fsdp-optimizer-state", "--no-offload", "--tp", "1", "--pp", "1",
                                "--replay", "2"], capture_output=True, text=True, cwd=here)
            self.assertEqual(p.returncode, 0, p.stderr)
            self.assertEqual(os.listdir(here), [])
        lines = p.stdout.splitlines()
        rec = next(i for i, x in enumerate(lines) if x.startswith("recommended: "))
        pick = lines[rec].split()[1]
        self.assertIn("(the fastest of the top 2 by the full replay)", lines[rec])
        words = {"ddp": "DDP (PyTorch DistributedDataParallel", "fsdp-full": "ZeRO-3 (PyTorch FSDP FULL_SHARD)",
                 "fsdp-optimizer-state": "ZeRO-1"}
        self.assertIn(words[pick.split(":")[0]], lines[rec + 1])
        self.assertRegex(lines[rec + 2], r"memory per GPU [0-9.]+ of 80 GiB \(the plan\)")
        self.assertRegex(lines[-1], r"^next: srun -N 1 --ntasks-per-node 8 --gpus-per-node 8 build/bin/(ddp|fsdp)_perf "
                                    r".*--batch 2 .*--backend cuda$")
        self.assertNotIn("--world-size", lines[-1])
        if pick.startswith("fsdp-optimizer-state"):  # ZeRO-1 has not run across GPUs: the fallback is named
            self.assertRegex(lines[rec + 3], r"^  \* ZeRO-1 not yet run on a GPU; the fastest layout that has: ")
        # --emit-matrix: one matrix of the recommended layout by default (--emit-top N: the top N)
        with tempfile.TemporaryDirectory() as here:
            m = os.path.join(here, "pick.toml")
            p = run("--model", "t5-tiny", "--gpus", "8", "--global-batch", "16", "--seq-len", "32", "--strategies",
                    "ddp,fsdp-full,fsdp-optimizer-state", "--no-offload", "--tp", "1", "--pp", "1", "--replay", "2",
                    "--emit-matrix", m)
            self.assertEqual(p.returncode, 0, p.stderr)
            self.assertEqual(sorted(os.listdir(here)), ["pick.toml"])
            with open(m) as f:
                text = f.read()
            self.assertIn(f'strategies = ["{pick.split(":")[0]}"]', text)
            self.assertIn(f"      slurm/sweep {m} --dry-run", p.stdout)

    def test_bad_input(self):
        with tempfile.TemporaryDirectory() as out:
            open(os.path.join(out, "x"), "w").close()
            for args, msg in (
                    (["--model", "t5-tiny", "--gpus", "8", "--global-batch", "16", "--out", out], "is not empty"),
                    (["--model", "t5-tiny", "--gpus", "8", "--global-batch", "16", "--explain", "ddp-pp2"],
                     "names its micro-batches"),
                    (["--model", "t5-tiny", "--gpus", "8", "--global-batch", "12", "--explain", "ddp"],
                     "does not divide over 8"),
                    (["--model", "t5-tiny", "--gpus", "8", "--global-batch", "16", "--explain", "zero3"],
                     "unknown strategy 'zero3': ZeRO-3 is fsdp-full here"),
                    (["--model", "t5-tiny", "--gpus", "8", "--global-batch", "16", "--explain", "ddp:mb2"],
                     "not a layout name"),
                    (["--model", "t5-tiny", "--gpus", "8", "--global-batch", "16", "--strategies", "zero", "--out",
                      out + "/new"], "unknown strategy 'zero'"),
                    (["--model", "t5-tiny", "--gpus", "8", "--global-batch", "16", "--tp", "1,x", "--out",
                      out + "/new"], "--tp '1,x' is not a comma-separated list of integers"),
                    (["--model", "t5-tiny", "--gpus", "8", "--global-batch", "16", "--pp", "2,0", "--out",
                      out + "/new"], "--pp '2,0': every value must be positive"),
                    (["--model", "t5-nope", "--gpus", "8", "--global-batch", "16", "--out", out + "/new"], "t5-nope")):
                p = run(*args)
                self.assertEqual(p.returncode, 2, (args, p.stdout, p.stderr))
                self.assertEqual(len(p.stderr.strip().splitlines()), 1, p.stderr)
                self.assertIn(msg, p.stderr)
                self.assertTrue(p.stderr.startswith("advise: error: "), p.stderr)
            self.assertFalse(os.path.exists(out + "/new"))


class LongWork(unittest.TestCase):
    """A question with long pipelines answers in bounded time and says where it stands: the
    replay's cost linear in a pipeline's ops, a bound on which layouts are replayed (said),
    the ranking printed before the replay, and early, the data-parallel degrees the global
    batch excludes with the nearest batches that open them."""

    def tiny(self, *extra):
        return run("--model", "t5-tiny", "--gpus", "8", "--global-batch", "12", "--seq-len", "32", "--strategies",
                   "ddp,fsdp-full", "--no-offload", "--pp", "1,2", *extra)

    def test_replay_linear_in_ops(self):
        # the union of the intervals that slow compute is rebuilt per launch, not per compute op
        # (per op, 64 micro-batches of 2 stages rebuilt it 13,026 times: ops x transfers)
        import projection_model as pm
        import runner
        cl = pm.calibrated_from(A100)

        class A:
            model, gpus, global_batch, seq_len, dec_seq_len = "t5-tiny", 2, 64, 32, None
        for key in advise.model_shapes.KEYS:
            setattr(A, key, None)
        lay = advise.parse_name("fsdp-full-pp2:mb64:1f1b", 2, 64)
        sched = runner.schedule(*lay.request(A, cl, 2), os.path.join(REPO, "build", "bin"))
        calls, merged = [], pm._merged
        pm._merged = lambda x: calls.append(1) or merged(x)
        try:
            sim = pm.simulate(sched, cl)
        finally:
            pm._merged = merged
        ops = [op for s in sched["stages"] for op in pm.schedule_ops(sched, s["ops"])]
        launches = sum(1 for op in ops if op[0] in pm.COLLECTIVES)
        self.assertGreater(len(ops), 10000)
        self.assertLessEqual(len(calls), sim["passes"] * (launches + len(sched["stages"])))

    def test_batch_openings(self):
        # 64 GPUs, t5-11.3b (48 blocks): 500 = 4 x 125 shuts dp 64, 32, 16, 8; 448 and 512 open them
        self.assertEqual(advise.batch_openings(64, 500, 48, 8), ([64, 32, 16, 8], 448, 512))
        self.assertEqual(advise.batch_openings(64, 512, 48, 8), ([], None, None))
        self.assertEqual(advise.batch_openings(64, 12, 48, 8), ([64, 32, 16, 8], None, 64))

    def test_ranking_before_replay_and_batch_said_first(self):
        p = self.tiny("--replay", "2")
        self.assertEqual(p.returncode, 0, p.stderr)
        lines = p.stdout.splitlines()
        said = next(i for i, x in enumerate(lines) if "does not divide over 8 data-parallel ranks" in x)
        self.assertIn("global batch 8 (32 layouts) or 16 (48 layouts) opens every one", lines[said])
        first_row = next(i for i, x in enumerate(lines) if x.startswith("  1 "))
        replay = next(i for i, x in enumerate(lines) if x.startswith("full replay of the top 2"))
        self.assertLess(said, first_row)
        self.assertLess(first_row, replay)
        self.assertRegex(lines[replay + 1], r"^  replay 1/2 \S+ .* ms \(est ")
        self.assertRegex(lines[replay + 2], r"^  replay 2/2 ")
        self.assertNotRegex(p.stdout, r"\bnan\b")  # the table is the estimate's: no column waits for the replay

    def test_replay_bound_said(self):
        # above the bound (here 2 micro-batches x stages) a pipeline is ranked by the estimate alone
        import contextlib
        import io
        bound = advise.REPLAY_MAX_MB_STAGES
        advise.REPLAY_MAX_MB_STAGES = 2
        out = io.StringIO()
        try:
            with contextlib.redirect_stdout(out):
                code = advise.main(["--cluster", A100, "--model", "t5-tiny", "--gpus", "8", "--global-batch", "12",
                                    "--seq-len", "32", "--strategies", "ddp", "--no-offload", "--tp", "1",
                                    "--pp", "2", "--replay", "2"])
        finally:
            advise.REPLAY_MAX_MB_STAGES = bound
        text = out.getvalue()
        self.assertEqual(code, 0, text)
        self.assertIn("not replayed (2 of the top 2: micro-batches x stages above 2, ranked by the estimate alone)", text)
        self.assertIn("(the fastest by the estimate (the top layouts' pipelines are above the replay's bound))", text)
        self.assertNotIn("  replay 1/", text)


TINY = ["--model", "t5-tiny", "--gpus", "8", "--global-batch", "16", "--seq-len", "32", "--strategies", "ddp,fsdp-full",
        "--tp", "1", "--pp", "1", "--no-offload", "--replay", "1"]


def cluster_file(folder, name, edit):
    """A copy of the A100 description with `edit` (text -> text) applied."""
    with open(A100) as f:
        text = edit(f.read())
    path = os.path.join(folder, name)
    with open(path, "w") as f:
        f.write(text)
    return path


class Faults(unittest.TestCase):
    """Bad input, faults and interruption end the tool in one line, with a documented
    exit, nothing half written, no process left behind."""

    def one_line(self, p, code, msg):
        self.assertEqual(p.returncode, code, (p.stdout[-500:], p.stderr))
        self.assertEqual(len(p.stderr.strip().splitlines()), 1, p.stderr)
        self.assertIn(msg, p.stderr)
        self.assertNotIn("Traceback", p.stderr)

    def test_jobs_bounded_by_cpus(self):  # kind 6
        with tempfile.TemporaryDirectory() as tmp:
            p = run(*TINY, "--jobs", "10000", "--out", os.path.join(tmp, "o"))
            self.one_line(p, 2, f"--jobs 10000 is not allowed (allowed: 1 to {os.cpu_count()}")
            self.assertFalse(os.path.exists(os.path.join(tmp, "o")))

    def interrupted(self, sig, code):  # kind 7
        import signal
        import time
        with tempfile.TemporaryDirectory() as tmp:
            p = subprocess.Popen([PY, ADVISE, "--cluster", A100, "--model", "t5-11.3b", "--gpus", "512",
                                  "--global-batch", "4096", "--seq-len", "512", "--strategies", "fsdp-full,fsdp-hybrid",
                                  "--tp", "1", "--pp", "1", "--no-offload", "--replay", "18", "--jobs", "2", "--out",
                                  os.path.join(tmp, "o")], stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
                                 cwd=REPO, start_new_session=True)
            for line in p.stdout:  # the ranking has begun: plan processes and, later, replay workers run
                if "layouts (" in line:
                    break
            time.sleep(1)  # the whole answer takes about 3 s here
            p.send_signal(sig)
            try:
                err = p.communicate(timeout=30)[1]
            except subprocess.TimeoutExpired:
                os.killpg(p.pid, signal.SIGKILL)
                self.fail(f"{signal.Signals(sig).name}: still running 30 s later")
            time.sleep(1)
            left = "\n".join(x for x in subprocess.run(["ps", "-o", "pid=,stat=,args=", "-g", str(p.pid)],
                                                          capture_output=True, text=True).stdout.splitlines()
                             if x.split()[1][0] != "Z")  # what of the tool's session still runs (a worker, a plan;
            # an ended one not yet reaped by init, Z, is not running)
            if left:
                subprocess.run(["pkill", "-KILL", "-s", str(p.pid)])
            self.assertEqual(p.returncode, code, err)
            self.assertEqual(len(err.strip().splitlines()), 1, err)
            self.assertNotIn("Traceback", err)
            self.assertEqual(left, "", "processes of the tool left running")
            self.assertFalse(os.path.exists(os.path.join(tmp, "o")))

    def test_sigterm(self):
        import signal
        self.interrupted(signal.SIGTERM, 143)

    def test_sigint(self):
        import signal
        self.interrupted(signal.SIGINT, 130)

    def test_signal_while_writing_leaves_nothing(self):
        """A signal while a tool's files are written (cli.Outputs) or published: exit 143 and
        neither the files nor the folders the run made are left (the advisor left an empty
        --out folder when SIGINT came as it wrote)."""
        script = """
import os, signal, sys, time
sys.path.insert(0, sys.argv[1])
import cli
tmp, when = sys.argv[2], sys.argv[3]
real_link = os.link
def link_then_signal(a, b):
    real_link(a, b)
    os.kill(os.getpid(), signal.SIGTERM)
    time.sleep(5)
def main():
    with cli.Outputs() as out:
        out.makedirs(os.path.join(tmp, "new", "o"))
        for name in ("a.csv", "b.csv"):
            with out.open(os.path.join(tmp, "new", "o", name)) as f:
                f.write("x\\n")
        if when == "writing":
            os.kill(os.getpid(), signal.SIGTERM)
            time.sleep(5)
        os.link = link_then_signal  # the first file published, then the signal
        out.publish()
    return 0
sys.exit(cli.run("tool.py", main))
"""
        for when in ("writing", "publishing"):
            with tempfile.TemporaryDirectory() as tmp:
                p = subprocess.run([PY, "-c", script, os.path.join(REPO, "analysis"), tmp, when], capture_output=True,
                                   text=True, timeout=60)
                self.assertEqual(p.returncode, 143, (when, p.stderr))
                self.assertEqual(os.listdir(tmp), [], (when, p.stderr))

    def test_gpus_bounded(self):  # kind 8
        p = subprocess.run([PY, ADVISE, "--cluster", A100, "--model", "t5-tiny", "--gpus", "1000000000000",
                            "--global-batch", "16", "--explain", "ddp"], capture_output=True, text=True, cwd=REPO,
                           timeout=60)
        self.one_line(p, 2, "--gpus 1000000000000 is not allowed (allowed: 1 to 16777216")
        self.assertEqual(advise.divisors(10 ** 12)[:4], [1, 2, 4, 5])
        self.assertEqual(len(advise.divisors(10 ** 12)), 169)

    def test_no_valid_layout(self):  # kind 9
        with tempfile.TemporaryDirectory() as tmp:
            p = run("--model", "t5-11.3b", "--gpus", "1", "--global-batch", "8", "--strategies", "ddp", "--no-offload",
                    "--out", os.path.join(tmp, "o"))
            self.one_line(p, 3, "no layout fits")
            self.assertFalse(os.path.exists(os.path.join(tmp, "o")))

    def test_emit_matrix_checked_first(self):  # kind 10
        with tempfile.TemporaryDirectory() as tmp:
            p = run(*TINY[:2], "--gpus", "4", *TINY[4:], "--out", os.path.join(tmp, "o"), "--emit-matrix",
                    os.path.join(tmp, "m.toml"))
            self.one_line(p, 2, "--emit-matrix: --gpus 4 is not a multiple of the description's gpus_per_node 8")
            self.assertEqual(p.stdout, "")  # refused before any plan
            self.assertFalse(os.path.exists(os.path.join(tmp, "o")))

    def test_no_silent_replacement(self):  # kind 11
        sys.path.insert(0, os.path.join(REPO, "analysis"))
        import cli
        with tempfile.TemporaryDirectory() as tmp:
            m = os.path.join(tmp, "m.toml")
            with open(m, "w") as f:
                f.write("# mine\n")
            p = run(*TINY, "--out", os.path.join(tmp, "o"), "--emit-matrix", m)
            self.one_line(p, 2, f"--emit-matrix '{m}' exists (pass --overwrite")
            with open(m) as f:
                self.assertEqual(f.read(), "# mine\n")
            # two runs on one name: the one that publishes second is refused, the first's file kept whole
            taken = os.path.join(tmp, "r.csv")
            with self.assertRaises(cli.BadInput) as e:
                with cli.Outputs() as out:
                    with out.open(taken) as f:
                        f.write("second\n")
                    with open(taken, "w") as f:  # the other run, meanwhile
                        f.write("first\n")
                    out.publish()
            self.assertIn("written by another run", str(e.exception))
            with open(taken) as f:
                self.assertEqual(f.read(), "first\n")
            self.assertEqual(sorted(os.listdir(tmp)), ["m.toml", "r.csv"])

    def test_explain_bad_input_first(self):  # kind 12
        with tempfile.TemporaryDirectory() as tmp:
            nohost = cluster_file(tmp, "nohost.toml", lambda t: t[:t.index("[host]")])
            p = subprocess.run([PY, ADVISE, "--cluster", nohost, *TINY[:6], "--explain", "fsdp-full-offload-params"],
                               capture_output=True, text=True, cwd=REPO)
            self.one_line(p, 2, "CPU offload needs the description's [host] table")
            p = run(*TINY, "--explain", "")
            self.one_line(p, 2, "--explain '': not a layout name")
            self.assertEqual(p.stdout, "")

    def test_usage_errors_one_line(self):  # kind 13
        p = run("--model", "t5-tiny", "--gpus", "x")
        self.one_line(p, 2, "advise: error: argument --gpus: invalid int value: 'x'")
        p = subprocess.run([PY, os.path.join(REPO, "analysis", "regress.py"), "--alpha"], capture_output=True,
                           text=True)
        self.one_line(p, 2, "regress: error: ")

    @unittest.skipUnless(os.geteuid() == 0, "mounts a tiny tmpfs (root)")
    def test_full_disk(self):  # kind 14
        with tempfile.TemporaryDirectory() as tmp:
            disk = os.path.join(tmp, "disk")
            os.mkdir(disk)
            try:  # a minimal machine may lack mount(8) itself, as one without the right to mount
                mounted = subprocess.run(["mount", "-t", "tmpfs", "-o", "size=64k", "tmpfs", disk]).returncode == 0
            except OSError:
                mounted = False
            if not mounted:
                self.skipTest("cannot mount a tmpfs")
            try:
                with open(os.path.join(disk, "filler"), "wb") as f:  # leave a few KiB: the checks' probes pass
                    f.write(b"x" * 52 * 1024)
                p = run(*TINY, "--out", os.path.join(disk, "o"))
                self.one_line(p, 2, "No space left on device")
                self.assertIn(os.path.join(disk, "o"), p.stderr)
                ms = subprocess.run([PY, os.path.join(REPO, "analysis", "model_states.py"), "--model", "t5-tiny",
                                     "--gpus", "8", "--fit-models", "t5-tiny", "--out", os.path.join(disk, "ms")],
                                    capture_output=True, text=True)
                self.one_line(ms, 2, "No space left on device")
                rg = subprocess.run([PY, os.path.join(REPO, "analysis", "regress.py"),
                                     os.path.join(REPO, "tests", "data", "regress"),
                                     os.path.join(REPO, "tests", "data", "regress", "run00.h5"), "--report-dir",
                                     os.path.join(disk, "rep")], capture_output=True, text=True)
                self.one_line(rg, 2, "No space left on device")
                self.assertEqual(os.listdir(disk), ["filler"])  # no partial file, no empty folder
            finally:
                subprocess.run(["umount", disk])

    def test_description_values_bounded(self):  # kind 15
        with tempfile.TemporaryDirectory() as tmp:
            for key, edit in (("host.memory_gib", lambda t: t.replace("\nmemory_gib = 128.0", "\nmemory_gib = 1e300")),
                              ("gpu_memory_gib", lambda t: t.replace("gpu_memory_gib = 80 ", "gpu_memory_gib = 1e300 "))):
                path = cluster_file(tmp, key + ".toml", edit)
                p = subprocess.run([PY, ADVISE, "--cluster", path, *TINY, "--out", os.path.join(tmp, "o")],
                                   capture_output=True, text=True, cwd=REPO)
                self.one_line(p, 2, f"{path}: field '{key}' = 1e+300 is not allowed (must be")
                self.assertIn("1048576", p.stderr)


if __name__ == "__main__":
    unittest.main(verbosity=2)
