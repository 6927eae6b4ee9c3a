#!/usr/bin/python3
"""Tests of slurm/sweep without Slurm: matrix validation, result names, dry-run output,
skipping of existing results, out-of-memory records written by the real programs' --plan,
and the submission sequence against a fake Slurm (stub sbatch, scontrol, squeue, sinfo,
scancel on PATH). The real cluster is slurm/test/slurm-test.sh (make slurm-test).

Run from anywhere: /usr/bin/python3 tests/test_sweep.py  (make sweep-test)
"""
import importlib.machinery
import importlib.util
import os
import re
import shutil
import subprocess
import sys
import tempfile
import unittest
from pathlib import Path

REPO = Path(__file__).resolve().parent.parent
SWEEP = REPO / "slurm" / "sweep"
BIN = REPO / "build" / "bin"
sys.path.insert(0, str(REPO / "analysis"))


def load_sweep():
    loader = importlib.machinery.SourceFileLoader("sweep", str(SWEEP))
    spec = importlib.util.spec_from_loader("sweep", loader)
    mod = importlib.util.module_from_spec(spec)
    loader.exec_module(mod)
    return mod


sweep = load_sweep()

# A small valid matrix; tests replace lines of it.
BASE = """\
[sweep]
name = "t"

[cluster]
name = "test"
gpus_per_node = 4
gpu_memory_gib = 1
partition = "debug"
time_limit = "00:10:00"
launcher = "srun"
setup = ["source scripts/mpi-env.sh"]

[matrix]
models = ["t5-tiny", "t5-611m"]
strategies = ["ddp", "fsdp-full", "fsdp-hybrid2"]
gpus = [4]
batch = [2]
seq_len = [32]
backend = "cpu"
steps = 2
warmup = 1
dtype = "fp32"
"""

# One program stands for every Slurm command; what it answers is set through FAKE_* variables.
FAKE = r'''#!/usr/bin/python3
import os, sys
cmd, args = os.path.basename(sys.argv[0]), sys.argv[1:]
d = os.path.dirname(os.path.abspath(sys.argv[0]))
with open(os.path.join(d, "calls.log"), "a") as f:
    f.write(" ".join([cmd] + args) + "\n")
env = os.environ.get
if cmd == "scontrol" and args[:1] == ["ping"]:
    state = env("FAKE_PING", "UP")
    print(f"Slurmctld(primary) at fakehost is {state}")
    sys.exit(0 if state == "UP" else 1)
if cmd == "scontrol" and args[:2] == ["show", "partition"]:
    if args[2] != env("FAKE_PARTITION", "debug"):
        print(f"Partition {args[2]} not found", file=sys.stderr)
        sys.exit(1)
    print(f"PartitionName={args[2]} State={env('FAKE_PART_STATE', 'UP')} TotalNodes={env('FAKE_NODES', '4')} TotalCPUs=16")
    sys.exit(0)
if cmd == "sinfo":
    print(env("FAKE_PARTITION", "debug"))
    sys.exit(0)
if cmd == "squeue":
    out = env("FAKE_SQUEUE", "")
    if out:
        print(out)
    sys.exit(0)
if cmd == "sbatch":
    if "--test-only" in args:
        if env("FAKE_TESTONLY_FAIL"):
            print("sbatch: error: Invalid account or account/partition combination specified", file=sys.stderr)
            sys.exit(1)
        print("sbatch: Job 99 to start at now using 4 processors on nodes fakehost in partition debug", file=sys.stderr)
        sys.exit(0)
    counter = os.path.join(d, "next_id")
    n = int(open(counter).read()) if os.path.exists(counter) else 100
    if env("FAKE_SBATCH_FAIL_AT") and n - 100 == int(env("FAKE_SBATCH_FAIL_AT")):
        print("sbatch: error: Batch job submission failed: Socket timed out", file=sys.stderr)
        sys.exit(1)
    open(counter, "w").write(str(n + 1))
    print(f"{n};fakecluster" if n % 2 else n)
    sys.exit(0)
if cmd == "scancel":
    sys.exit(0)
print(f"fake slurm: unexpected {cmd} {args}", file=sys.stderr)
sys.exit(9)
'''


_FINISHED = []


def finished_result(path):
    """A finished result at path: an out-of-memory record written by the real ddp_perf --plan
    (made once, then copied). The sweep only asks that a file reads whole with a final status."""
    if not _FINISHED:
        src = Path(tempfile.mkdtemp(prefix="test_sweep.rec.")) / "oom.h5"
        code, line = sweep.runner.plan("ddp_perf", ["--model", "t5-611m", "--batch", "2", "--seq-len", "32",
                                                    "--world-size", "4", "--mem-limit-gib", "1"], str(BIN),
                                       own_session=True, env=sweep.PLAN_ENV, record=src, schedule=False)
        assert code == 3 and src.exists(), line
        _FINISHED.append(src)
    shutil.copy(_FINISHED[0], path)
    return path


def truncated_result(path):
    """A finished result cut in half: what a node crash during the write can leave."""
    data = finished_result(path).read_bytes()
    path.write_bytes(data[:len(data) // 2])
    return path


class SweepCase(unittest.TestCase):
    def setUp(self):
        self.tmp = Path(tempfile.mkdtemp(prefix="test_sweep."))
        self.results = self.tmp / "results"
        self.fake = self.tmp / "fakebin"
        self.fake.mkdir()
        (self.fake / "fake").write_text(FAKE)
        (self.fake / "fake").chmod(0o755)
        for name in ("sbatch", "scontrol", "squeue", "sinfo", "scancel"):
            (self.fake / name).symlink_to("fake")

    def tearDown(self):
        shutil.rmtree(self.tmp, ignore_errors=True)

    def matrix(self, text=BASE, **replace):
        """BASE with `key = value` lines replaced (value None: line removed), as a file."""
        for key, value in replace.items():
            pattern = re.compile(rf"^{key} = .*$", re.M)
            self.assertRegex(text, pattern, f"no line for {key}")
            text = pattern.sub("" if value is None else f"{key} = {value}", text)
        path = self.tmp / "m.toml"
        path.write_text(text)
        return path

    def run_sweep(self, matrix, *args, fake=True, env=None):
        e = dict(os.environ)
        if fake:
            e["PATH"] = f"{self.fake}:{e['PATH']}"
        e.update(env or {})
        r = subprocess.run([str(SWEEP), str(matrix), "--results", str(self.results), *args],
                           capture_output=True, text=True, env=e, cwd=self.tmp)
        return r

    def calls(self):
        log = self.fake / "calls.log"
        return log.read_text().splitlines() if log.exists() else []

    def sbatch_calls(self):
        return [c for c in self.calls() if c.startswith("sbatch")]


class Validation(SweepCase):
    """Bad input: one clear line, exit 2, no Slurm command, nothing written."""

    def assert_refused(self, matrix, fragment, *args):
        r = self.run_sweep(matrix, *args)
        self.assertEqual(r.returncode, 2, r.stdout + r.stderr)
        first = r.stderr.splitlines()[0]
        self.assertTrue(first.startswith("sweep: error: "), first)
        self.assertIn(fragment, first)
        self.assertIn("nothing submitted", r.stderr)
        self.assertEqual(self.sbatch_calls(), [])
        self.assertFalse(self.results.exists(), "something was written")

    def test_unknown_key(self):
        self.assert_refused(self.matrix(BASE.replace("steps = 2", "steps = 2\ngpu_count = 8")),
                            "[matrix] unknown key 'gpu_count'")

    def test_unknown_section(self):
        self.assert_refused(self.matrix(BASE + "\n[extra]\nx = 1\n"), "unknown section [extra]")

    def test_missing_key(self):
        self.assert_refused(self.matrix(partition=None), "[cluster] missing required key 'partition'")

    def test_wrong_types(self):
        cases = {
            "gpus": ('"4"', "[matrix] gpus must be a non-empty list of distinct integers in [1, 2147483647]"),
            "batch": ('[2, "4"]', "[matrix] batch must be"),
            "steps": ("1.5", "[matrix] steps must be an integer in [1, 2147483647], got 1.5 (float)"),
            "gpus_per_node": ("true", "[cluster] gpus_per_node must be an integer in [1, 2147483647], got True (boolean)"),
            "gpu_memory_gib": ('"80"', "[cluster] gpu_memory_gib must be a finite number in (0, 1048576]"),
            "backend": ('"tpu"', '[matrix] backend must be one of "cpu", "cuda"'),
            "launcher": ('"mpiexec"', '[cluster] launcher must be one of "srun", "mpirun"'),
            "time_limit": ('"2 hours"', "[cluster] time_limit must be a Slurm time limit"),
            "setup": ('"source x"', "[cluster] setup must be a list of strings"),
            "dtype": ('"fp8"', '[matrix] dtype must be one of "fp32", "bf16", "fp16"'),
        }
        for key, (value, fragment) in cases.items():
            with self.subTest(key=key):
                self.assert_refused(self.matrix(**{key: value}), fragment)

    def test_non_finite_and_out_of_range_numbers(self):
        """inf would record every point as out of memory; a wrapped count would run another sweep."""
        gib = "[cluster] gpu_memory_gib must be a finite number in (0, 1048576], got "
        cases = [
            ("gpu_memory_gib", "inf", gib + "inf (float)"), ("gpu_memory_gib", "-inf", gib + "-inf (float)"),
            ("gpu_memory_gib", "nan", gib + "nan (float)"), ("gpu_memory_gib", "1e10", gib + "10000000000.0 (float)"),
            ("gpu_memory_gib", "0", gib + "0 (integer)"),
            ("steps", "4294967298", "[matrix] steps must be an integer in [1, 2147483647], got 4294967298 (integer)"),
            ("warmup", "-1", "[matrix] warmup must be an integer in [0, 2147483647], got -1 (integer)"),
            ("gpus", "[4, 4294967296]", "[matrix] gpus must be a non-empty list of distinct integers in [1, 2147483647], "
                                        "got [4, 4294967296] (list)"),
            ("batch", "[0]", "[matrix] batch must be a non-empty list of distinct integers in [1, 2147483647], got [0]"),
        ]
        for key, value, fragment in cases:
            with self.subTest(key=key, value=value):
                self.assert_refused(self.matrix(**{key: value}), fragment)
        text = BASE.replace('setup = ["source scripts/mpi-env.sh"]', 'setup = []\n\n[cluster.env]\nX = inf')
        self.assert_refused(self.matrix(text), "[cluster] env must be a table of NAME = \"value\" (string, integer or "
                                               "finite float values), got {'X': inf}")

    def test_duplicates_and_empty_lists(self):
        self.assert_refused(self.matrix(gpus="[4, 4]"), "[matrix] gpus must be a non-empty list of distinct")
        self.assert_refused(self.matrix(batch="[]"), "[matrix] batch must be a non-empty list")

    def test_unknown_model_and_strategy(self):
        presets = ", ".join(list_models("ddp_perf"))
        self.assert_refused(self.matrix(models='["t5-tiny", "t5-3b"]'),
                            f"[matrix] models: 't5-3b' is not a model preset of ddp_perf (allowed: {presets})")
        self.assert_refused(self.matrix(models='["t5-tiny", ""]'), "[matrix] models must be a non-empty list")
        allowed = "(ddp, fsdp-full, fsdp-hybrid, fsdp-hybrid<G>, fsdp-none, fsdp-grad-op, fsdp-optimizer-state, " \
                  "fsdp-optimizer-state<G>, each optionally with -tp<N>, -pp<S>, then -offload-params (full, hybrid, " \
                  "grad-op) or -offload-optimizer (any but fsdp-none))"
        for bad in ("zero3", "hybrid", "fsdp-hybrid0", "fsdp-hybrid08", "fsdp-hybrid-2", "fsdp-", "fsdp-tp2",
                    "fsdp-optimizer-state0", "fsdp-optimizer", "fsdp-optimizer-state-2",
                    "ddp-tp1", "fsdp-full-tp0", "fsdp-full-pp2-tp2",
                    "fsdp-full-offload", "fsdp-full-offload-none", "fsdp-full-offload-params-tp2",
                    "ddp-offload-params", "fsdp-none-offload-params", "fsdp-optimizer-state-offload-params",
                    "fsdp-none-offload-optimizer", "ddp-offload-optimizer"):
            with self.subTest(strategy=bad):
                self.assert_refused(self.matrix(strategies=f'["ddp", "{bad}"]'),
                                    f"[matrix] strategies must be a non-empty list of distinct strategies {allowed}")

    def test_model_entries_take_the_programs_shape_flags(self):
        """A models entry is a preset or a table of a preset and the programs' shape flags;
        its runs carry the flags and a name that says the shape (analysis/model_shapes.py)."""
        models = '["t5-tiny", {model = "t5-tiny", layers = 1, ffn = "gated-gelu", tie_embeddings = false}]'
        r = self.run_sweep(self.matrix(models=models, strategies='["ddp"]'), "--dry-run")
        self.assertEqual(r.returncode, 0, r.stderr)
        runs = re.findall(r"^run_point (\S+) \S+ (.*)$", r.stdout, re.M)
        self.assertEqual([n for n, _ in runs], ["t5-tiny-ddp-g4-b2-s32", "t5-tiny-layers1-ffn-gated-gelu-tie-no-ddp-g4-b2-s32"])
        self.assertTrue(runs[1][1].startswith("--model t5-tiny --layers 1 --ffn gated-gelu --tie-embeddings no --batch 2"),
                        runs[1][1])
        self.assertNotIn("--layers", runs[0][1])
        # The plan ran with those flags: it fits (t5-tiny), so both are runs, none a record.
        self.assertIn("dry run: 1 jobs + 1 summary job, 2 runs, 0 out-of-memory records", r.stdout)

    def test_bad_model_entries(self):
        keys = "model, d_model, d_ff, layers, heads, d_kv, vocab, ffn, tie_embeddings"
        cases = [
            ('[{model = "t5-tiny", depth = 3}]', f"[matrix] models[0]: unknown key 'depth' (allowed: {keys})"),
            ('[{model = "t5-tiny", layers = 0}]', "[matrix] models[0]: layers must be an integer in [1, 2147483647], got 0"),
            ('["t5-tiny", {model = "t5-tiny", ffn = "swiglu"}]',
             "[matrix] models[1]: ffn must be one of \"relu\", \"gated-gelu\", got 'swiglu'"),
            ('[{model = "t5-tiny", tie_embeddings = "no"}]',
             "[matrix] models[0]: tie_embeddings must be true or false, got 'no'"),
            ('[{layers = 2}]', "[matrix] models[0]: {'layers': 2} has no model = \"PRESET\""),
            ('["t5-tiny", {model = "t5-tiny"}]', "[matrix] models: two entries are the same model (t5-tiny): keep one"),
            ('[{model = "t5-3b", layers = 2}]', "[matrix] models: 't5-3b' is not a model preset of ddp_perf"),
        ]
        for models, fragment in cases:
            with self.subTest(models=models):
                self.assert_refused(self.matrix(models=models), fragment)

    def test_count_not_multiple_of_gpus_per_node(self):
        self.assert_refused(self.matrix(gpus="[4, 6]"), "gpus: 6 is not a multiple of [cluster] gpus_per_node = 4")

    def test_hybrid_shard_size_must_divide(self):
        self.assert_refused(self.matrix(strategies='["fsdp-hybrid8"]'),
                            "[matrix] strategies: fsdp-hybrid8: shard size 8 does not divide the GPU count 4")
        self.assert_refused(self.matrix(strategies='["fsdp-hybrid3"]', gpus="[4, 12]"),
                            "[matrix] strategies: fsdp-hybrid3: shard size 3 does not divide the GPU count 4")

    def test_two_names_for_one_run(self):
        """fsdp-hybrid is fsdp-hybrid<gpus_per_node>: both would write the same results."""
        self.assert_refused(self.matrix(strategies='["fsdp-hybrid", "fsdp-hybrid4"]'),
                            '[matrix] strategies: "fsdp-hybrid" and "fsdp-hybrid4" are the same runs (fsdp-hybrid4 at 4 GPUs)')

    def test_micro_batches_must_divide_the_pipelines_batch(self):
        text = BASE + "micro_batches = 4\n"
        self.assert_refused(self.matrix(text, strategies='["ddp-pp2"]', models='["t5-tiny"]', batch="[2]"),
                            "[matrix] micro_batches 4 does not divide ddp-pp2's batch 2 per data-parallel rank (batch 2)")
        text = BASE + 'micro_batches = 3\nbatch_per = "gpu"\n'
        self.assert_refused(self.matrix(text, strategies='["ddp-tp2-pp2"]', models='["t5-tiny"]', batch="[2]"),
                            "[matrix] micro_batches 3 does not divide ddp-tp2-pp2's batch 8 per data-parallel rank "
                            '(batch 2, batch_per = "gpu": 2 x tp 2 x pp 2)')
        self.assert_refused(self.matrix(BASE + 'batch_per = "node"\n'), '[matrix] batch_per must be one of "rank", "gpu"')

    def test_retired_hybrid_shard_size_key(self):
        """An older matrix's separate shard size is refused with its replacement, never ignored."""
        old = BASE.replace('"fsdp-hybrid2"]', '"fsdp-hybrid"]') + "hybrid_shard_size = 2\n"
        self.assert_refused(self.matrix(old), '[matrix] hybrid_shard_size is no longer read: name the shard size in '
                                          'the strategy instead, e.g. strategies = [..., "fsdp-hybrid2"]')
        self.assert_refused(self.matrix(old.replace("hybrid_shard_size = 2", "hybrid_shard_size = 0")),
                            'e.g. strategies = [..., "fsdp-hybrid<G>"] ("fsdp-hybrid": one node per shard group)')

    def test_programs_not_built(self):
        empty = self.tmp / "nobin"
        empty.mkdir()
        text = BASE.replace('partition = "debug"', f'partition = "debug"\nbin_dir = "{empty}"')
        self.assert_refused(self.matrix(text), f"{empty}/ddp_perf: not built (run `make` first, or set [cluster] bin_dir)")

    def test_env_table(self):
        text = BASE.replace('setup = ["source scripts/mpi-env.sh"]',
                            'setup = []\n\n[cluster.env]\n"NCCL-DEBUG" = "WARN"')
        self.assert_refused(self.matrix(text), "[cluster] env must be a table of NAME")

    def test_not_toml(self):
        self.assert_refused(self.matrix(BASE + "\nthis is not toml\n"), "not valid TOML")

    def test_no_such_matrix(self):
        self.assert_refused(self.tmp / "missing.toml", "no such run matrix")

    def test_matrix_not_utf8(self):
        path = self.matrix()
        path.write_bytes(path.read_bytes().replace(b'name = "t"', b'name = "t\xe9"'))
        self.assert_refused(path, f"{path}: not UTF-8 text (byte 0xe9 on line 2): a run matrix must be UTF-8 TOML")

    def test_matrix_is_a_directory(self):
        self.assert_refused(self.tmp, f"{self.tmp}: is a directory, not a run matrix")

    def test_results_folder_that_cannot_be_made(self):
        (self.tmp / "afile").write_text("")
        self.results = self.tmp / "afile" / "results"  # below a file: no folder can be made there
        for args in ((), ("--dry-run",)):
            with self.subTest(args=args):
                self.assert_refused(self.matrix(), f"results folder '{self.results}': '{self.tmp / 'afile'}' is not a "
                                    "directory", *args)

    def test_shipped_matrices_are_valid(self):
        for name in sorted(p.name for p in (REPO / "runs").glob("*.toml")):
            with self.subTest(matrix=name):
                cfg = sweep.load_matrix(REPO / "runs" / name, {})
                self.assertTrue(sweep.points(cfg))


def list_models(program, bin_dir=BIN):
    return sweep.runner.presets(str(bin_dir), program, env=sweep.PLAN_ENV, own_session=True)  # BadInput unless exit 0


class Models(SweepCase):
    """The matrix's models are checked against the programs' own presets (--list-models)."""

    def test_programs_list_their_presets(self):
        for program in ("ddp_perf", "fsdp_perf"):
            with self.subTest(program=program):
                names = list_models(program)
                self.assertIn("t5-tiny", names)
                self.assertIn("t5-11.3b", names)
                self.assertEqual(len(set(names)), len(names))

    def test_sweep_accepts_exactly_the_programs_presets(self):
        """Every preset the program lists is accepted; a program listing others changes what is."""
        presets = list_models("fsdp_perf")
        self.assertEqual(presets, list_models("ddp_perf"))
        cfg = sweep.load_matrix(self.matrix(models="[" + ", ".join(f'"{m}"' for m in presets) + "]"), {})
        self.assertEqual(sorted({p.model for p in sweep.points(cfg)}), sorted(presets))
        # Programs with another preset table: the sweep takes theirs.
        fake = self.tmp / "fakeprograms"
        fake.mkdir()
        for program in ("ddp_perf", "fsdp_perf"):
            (fake / program).write_text('#!/bin/sh\n[ "$1" = --list-models ] && printf "t5-new\\nt5-tiny\\n"\n')
            (fake / program).chmod(0o755)
        text = BASE.replace('partition = "debug"', f'partition = "debug"\nbin_dir = "{fake}"')
        cfg = sweep.load_matrix(self.matrix(text, models='["t5-new"]'), {})
        self.assertEqual({p.model for p in sweep.points(cfg)}, {"t5-new"})
        with self.assertRaisesRegex(sweep.InputError, r"'t5-611m' is not a model preset of ddp_perf "
                                                      r"\(allowed: t5-new, t5-tiny\)"):
            sweep.load_matrix(self.matrix(text, models='["t5-611m"]'), {})


class Names(SweepCase):
    def test_deterministic_and_unique(self):
        cfg = sweep.load_matrix(REPO / "runs" / "fsdp_vs_ddp.toml", {})
        names = [p.name for p in sweep.points(cfg)]
        self.assertEqual(len(names), 3 * 4 * 7 * 2)
        self.assertEqual(len(set(names)), len(names))
        self.assertEqual(names, [p.name for p in sweep.points(sweep.load_matrix(REPO / "runs" / "fsdp_vs_ddp.toml", {}))])
        for n in ("t5-611m-ddp-g8-b8-s512", "t5-2.28b-fsdp-full-g512-b16-s512",
                  "t5-11.3b-fsdp-hybrid8-g64-b8-s512", "t5-11.3b-fsdp-none-g16-b16-s512"):
            self.assertIn(n, names)

    def test_study_jobs(self):
        """One job per GPU count: nodes = GPUs / 8, one task per GPU, GPUs requested."""
        cfg = sweep.load_matrix(REPO / "runs" / "fsdp_vs_ddp.toml", {})
        pts = sweep.points(cfg)
        binaries = {"ddp_perf": BIN / "ddp_perf", "fsdp_perf": BIN / "fsdp_perf"}
        for n in (8, 64, 512):
            text = sweep.job_script(cfg, n, [p for p in pts if p.gpus == n], Path("/r"), "m.toml", binaries)
            self.assertIn(f"#SBATCH --nodes={n // 8}\n", text)
            self.assertIn("#SBATCH --ntasks-per-node=8\n", text)
            self.assertIn("#SBATCH --gpus-per-node=8\n", text)
            self.assertIn(f"LAUNCH=(srun --mpi=pmix --nodes={n // 8} --ntasks={n} --ntasks-per-node=8)", text)
            self.assertEqual(text.count("\nrun_point "), 24)
            self.assertNotRegex(text, r"@[A-Z_]+@")

    def test_study_memory_verdicts(self):
        """At 80 GiB per GPU DDP cannot hold T5-11.3B (the paper's finding); FSDP full can."""
        cfg = sweep.load_matrix(REPO / "runs" / "fsdp_vs_ddp.toml", {})
        pts = {p.name: p for p in sweep.points(cfg)}
        binaries = {"ddp_perf": BIN / "ddp_perf", "fsdp_perf": BIN / "fsdp_perf"}
        verdict = lambda name: sweep.plan(binaries[pts[name].program], pts[name])  # noqa: E731
        self.assertFalse(verdict("t5-11.3b-ddp-g8-b8-s512"))
        self.assertTrue(verdict("t5-11.3b-fsdp-full-g8-b8-s512"))
        self.assertTrue(verdict("t5-2.28b-ddp-g8-b8-s512"))
        self.assertIn("--dtype", pts["t5-11.3b-fsdp-full-g8-b8-s512"].args)  # the study's bf16
        self.assertEqual(pts["t5-11.3b-fsdp-full-g8-b8-s512"].args[pts["t5-11.3b-fsdp-full-g8-b8-s512"].args.index("--dtype") + 1], "bf16")


class DryRun(SweepCase):
    def test_prints_jobs_writes_nothing(self):
        r = self.run_sweep(self.matrix(), "--dry-run")
        self.assertEqual(r.returncode, 0, r.stderr)
        out = r.stdout
        self.assertIn("#!/bin/bash\n#SBATCH --job-name=sb-t-g4\n#SBATCH --nodes=1\n#SBATCH --ntasks-per-node=4\n", out)
        self.assertNotIn("--gpus-per-node", out)  # backend cpu
        self.assertIn("#SBATCH --partition=debug", out)
        self.assertIn("LAUNCH=(srun --mpi=pmix --nodes=1 --ntasks=4 --ntasks-per-node=4)", out)
        self.assertIn("source scripts/mpi-env.sh", out)
        self.assertIn("--dependency=afterany:", out)
        runs = re.findall(r"^run_point (\S+) ", out, re.M)
        self.assertEqual(runs, ["t5-tiny-ddp-g4-b2-s32", "t5-tiny-fsdp-full-g4-b2-s32", "t5-tiny-fsdp-hybrid2-g4-b2-s32"])
        self.assertEqual(len(re.findall(r"^# record: .*--plan --world-size 4 --out ", out, re.M)), 3)  # t5-611m
        self.assertIn("dry run: 1 jobs + 1 summary job, 3 runs, 3 out-of-memory records, 0 done", out)
        self.assertFalse(self.results.exists())
        self.assertEqual(self.calls(), [])  # no Slurm needed
        again = self.run_sweep(self.matrix(), "--dry-run")
        self.assertEqual(again.stdout, out, "dry-run output is not deterministic")

    def test_hybrid_without_a_size_is_one_node_per_group(self):
        r = self.run_sweep(self.matrix(strategies='["fsdp-hybrid"]', models='["t5-tiny"]', gpus="[4, 8]"), "--dry-run")
        self.assertEqual(r.returncode, 0, r.stderr)
        self.assertEqual(re.findall(r"^run_point (\S+) .* --sharding hybrid --shard-size 4 ", r.stdout, re.M),
                         ["t5-tiny-fsdp-hybrid4-g4-b2-s32", "t5-tiny-fsdp-hybrid4-g8-b2-s32"])

    def test_same_flags_as_the_projection(self):
        """slurm/sweep and analysis/project.py run a label with the same program and flags."""
        import project
        for label in ("ddp", "fsdp-full", "fsdp-hybrid", "fsdp-hybrid2", "fsdp-none", "fsdp-grad-op",
                      "fsdp-optimizer-state", "fsdp-optimizer-state2", "fsdp-optimizer-state-tp2",
                      "fsdp-full-offload-params", "fsdp-grad-op-offload-params", "fsdp-hybrid2-offload-params",
                      "fsdp-optimizer-state-offload-optimizer", "fsdp-grad-op-offload-optimizer",
                      "fsdp-full-offload-optimizer", "fsdp-full-tp2-offload-optimizer"):
            with self.subTest(label=label):
                cfg = sweep.load_matrix(self.matrix(strategies=f'["{label}"]', models='["t5-tiny"]'), {})
                (p,) = sweep.points(cfg)
                flags = list(p.args[p.args.index("fp32") + 1:])
                flags = flags[:flags.index("--prefetch")] if "--prefetch" in flags else flags
                self.assertEqual([p.program] + flags, project.strategy_args(label, {"gpus_per_node": 4}, 4))

    def test_offload_labels_are_the_programs_own(self):
        """-offload-params / -offload-optimizer: --cpu-offload, and the label the program prints."""
        import project
        for label, offload in (("fsdp-full-offload-params", "params"), ("fsdp-hybrid2-offload-params", "params"),
                               ("fsdp-optimizer-state-offload-optimizer", "optimizer"),
                               ("fsdp-grad-op-offload-optimizer", "optimizer")):
            with self.subTest(label=label):
                cfg = sweep.load_matrix(self.matrix(strategies=f'["{label}"]', models='["t5-tiny"]'), {})
                (p,) = sweep.points(cfg)
                self.assertEqual(p.label, label)
                self.assertEqual(p.args[p.args.index("--cpu-offload") + 1], offload)
                self.assertIn(f"-{label}-g4-", p.name)
                sched = project.plan_schedule(["fsdp_perf", "--model", "t5-tiny", "--batch", "2", "--seq-len", "16"] +
                                              project.strategy_args(label, {"gpus_per_node": 4}, 4)[1:], 4, 1, BIN, 1)
                self.assertEqual(sched["label"], label)
                self.assertEqual(sched["cpu_offload"], offload)

    def test_pipelines_and_batch_per_gpu(self):
        """batch_per = "gpu": every layout of a GPU count trains batch x GPUs sequences; the
        pipelines get the matrix's micro-batches and schedule; results are named by the
        programs' --batch."""
        text = BASE + 'batch_per = "gpu"\nmicro_batches = 2\npp_schedule = "gpipe"\n'
        cfg = sweep.load_matrix(self.matrix(text, strategies='["fsdp-full", "ddp-tp2", "ddp-pp2", "fsdp-full-tp2-pp2"]',
                                            models='["t5-tiny"]', gpus="[4]", batch="[2]"), {})
        got = {p.name: p.args for p in sweep.points(cfg)}
        self.assertEqual(sorted(got), ["t5-tiny-ddp-pp2-g4-b4-s32", "t5-tiny-ddp-tp2-g4-b4-s32",
                                       "t5-tiny-fsdp-full-g4-b2-s32", "t5-tiny-fsdp-full-tp2-pp2-g4-b8-s32"])
        for name, args in got.items():
            pipelined = "-pp2-" in name
            self.assertEqual("--micro-batches" in args, pipelined, name)
            self.assertEqual("--pp-schedule" in args, pipelined, name)
            if pipelined:
                self.assertEqual(args[args.index("--micro-batches") + 1], "2")
                self.assertEqual(args[args.index("--pp-schedule") + 1], "gpipe")

    def test_one_job_per_count(self):
        r = self.run_sweep(self.matrix(gpus="[4, 8, 16]", models='["t5-tiny"]'), "--dry-run")
        self.assertEqual(r.returncode, 0, r.stderr)
        for n in (4, 8, 16):
            self.assertIn(f"#SBATCH --job-name=sb-t-g{n}\n#SBATCH --nodes={n // 4}\n", r.stdout)
            self.assertIn(f"--ntasks={n} --ntasks-per-node=4)", r.stdout)
        self.assertIn("3 jobs + 1 summary job, 9 runs", r.stdout)

    def test_mpirun_launcher_and_cluster_settings(self):
        text = BASE.replace('launcher = "srun"', 'launcher = "mpirun"\nlauncher_args = ["--bind-to", "none"]\n'
                            'account = "proj1"\ncpus_per_task = 2\nsbatch_args = ["--exclusive"]\n'
                            'modules = ["cuda/12.4"]').replace(
            'setup = ["source scripts/mpi-env.sh"]', 'setup = ["echo ready"]\n\n[cluster.env]\nNCCL_DEBUG = "WARN"\nNCCL_IB_HCA = "mlx5_0 mlx5_1"')
        r = self.run_sweep(self.matrix(text), "--dry-run")
        self.assertEqual(r.returncode, 0, r.stderr)
        for s in ("LAUNCH=(mpirun -np 4 --map-by ppr:4:node --bind-to none)", "#SBATCH --account=proj1",
                  "#SBATCH --cpus-per-task=2", "#SBATCH --exclusive", "module load cuda/12.4",
                  "export NCCL_DEBUG=WARN", "export NCCL_IB_HCA='mlx5_0 mlx5_1'", "echo ready"):
            self.assertIn(s, r.stdout)

    def test_skips_existing_results(self):
        self.results.mkdir()
        done = finished_result(self.results / "t5-tiny-fsdp-full-g4-b2-s32.h5")
        data = done.read_bytes()
        r = self.run_sweep(self.matrix(), "--dry-run")
        self.assertEqual(r.returncode, 0, r.stderr)
        self.assertIn("already done:   1", r.stdout)
        self.assertIn("unreadable:     0", r.stdout)
        self.assertNotIn("run_point t5-tiny-fsdp-full-g4-b2-s32 ", r.stdout)
        self.assertIn("run_point t5-tiny-ddp-g4-b2-s32 ", r.stdout)
        self.assertEqual(done.read_bytes(), data)
        self.assertEqual(sorted(os.listdir(self.results)), [done.name])

    def test_unreadable_results_are_not_done(self):
        """A truncated file, a foreign file and an empty one under a point's name: run again."""
        self.results.mkdir()
        bad = {"t5-tiny-fsdp-full-g4-b2-s32": "truncated file", "t5-tiny-ddp-g4-b2-s32": "file signature not found",
               "t5-tiny-fsdp-hybrid2-g4-b2-s32": "file signature not found"}
        truncated_result(self.results / "t5-tiny-fsdp-full-g4-b2-s32.h5")
        (self.results / "t5-tiny-ddp-g4-b2-s32.h5").write_bytes(b"a result")
        (self.results / "t5-tiny-fsdp-hybrid2-g4-b2-s32.h5").write_bytes(b"")
        before = {p.name: p.read_bytes() for p in self.results.iterdir()}
        r = self.run_sweep(self.matrix(), "--dry-run")
        self.assertEqual(r.returncode, 0, r.stderr)
        self.assertIn("already done:   0", r.stdout)
        self.assertIn("unreadable:     3", r.stdout)
        for name, why in bad.items():
            self.assertRegex(r.stdout, rf"\n    {name}\.h5: unreadable \(.*{why}")
            self.assertIn(f"run_point {name} ", r.stdout)
        self.assertEqual({p.name: p.read_bytes() for p in self.results.iterdir()}, before, "dry run changed a file")


class Submit(SweepCase):
    """The submission sequence against the fake Slurm; out-of-memory records by the real programs."""

    def test_submit_then_rerun(self):
        from shardbench_h5 import load
        m = self.matrix()
        r = self.run_sweep(m)
        self.assertEqual(r.returncode, 0, r.stdout + r.stderr)
        sb = self.sbatch_calls()
        # every script checked with --test-only before the first submission
        self.assertEqual([c.split()[1] for c in sb], ["--test-only", "--test-only", "--parsable", "--parsable"])
        self.assertTrue(sb[2].endswith("/jobs/g4.sbatch"))
        self.assertRegex(sb[3], r"^sbatch --parsable --dependency=afterany:100 .*/jobs/summary\.sbatch$")
        self.assertIn("submitted job 100: 4 GPUs, 3 runs", r.stdout)
        self.assertIn("submitted job 101: summary (after 100)", r.stdout)
        job = (self.results / "jobs" / "g4.sbatch").read_text()
        self.assertEqual(len(re.findall(r"^run_point ", job, re.M)), 3)
        self.assertTrue((self.results / "logs").is_dir())
        # the three t5-611m points do not fit 1 GiB: recorded by --plan, not run
        oom = sorted(p.name for p in self.results.glob("*.h5"))
        self.assertEqual(oom, ["t5-611m-ddp-g4-b2-s32.h5", "t5-611m-fsdp-full-g4-b2-s32.h5",
                               "t5-611m-fsdp-hybrid2-g4-b2-s32.h5"])
        for name in oom:
            run = load(self.results / name)
            self.assertEqual(run.meta["status"], "out-of-memory")
            self.assertEqual(run.meta["planned_only"], 1)
            self.assertEqual(run.meta["world_size"], 4)
            self.assertEqual(run.plan["fits"], 0)
            self.assertNotIn(name[:-3], job)
        # re-run with the runs' results present: nothing submitted, nothing rewritten
        for name in ("t5-tiny-ddp-g4-b2-s32", "t5-tiny-fsdp-full-g4-b2-s32", "t5-tiny-fsdp-hybrid2-g4-b2-s32"):
            finished_result(self.results / f"{name}.h5")
        before = {p: (p.stat().st_mtime_ns, p.read_bytes()) for p in self.results.rglob("*") if p.is_file()}
        (self.fake / "calls.log").unlink()
        r = self.run_sweep(m)
        self.assertEqual(r.returncode, 0, r.stderr)
        self.assertIn("submitted 0 jobs", r.stdout)
        self.assertEqual(self.sbatch_calls(), [])
        after = {p: (p.stat().st_mtime_ns, p.read_bytes()) for p in self.results.rglob("*") if p.is_file()}
        self.assertEqual(before, after)

    def test_partial_rerun_submits_only_missing(self):
        self.results.mkdir()
        done = finished_result(self.results / "t5-tiny-ddp-g4-b2-s32.h5").read_bytes()
        r = self.run_sweep(self.matrix(models='["t5-tiny"]'))
        self.assertEqual(r.returncode, 0, r.stderr)
        job = (self.results / "jobs" / "g4.sbatch").read_text()
        self.assertEqual(re.findall(r"^run_point (\S+)", job, re.M),
                         ["t5-tiny-fsdp-full-g4-b2-s32", "t5-tiny-fsdp-hybrid2-g4-b2-s32"])
        self.assertEqual((self.results / "t5-tiny-ddp-g4-b2-s32.h5").read_bytes(), done)

    def test_truncated_result_is_kept_aside_and_rerun(self):
        self.results.mkdir()
        cut = truncated_result(self.results / "t5-tiny-ddp-g4-b2-s32.h5")
        data = cut.read_bytes()
        r = self.run_sweep(self.matrix(models='["t5-tiny"]'))
        self.assertEqual(r.returncode, 0, r.stdout + r.stderr)
        job = (self.results / "jobs" / "g4.sbatch").read_text()
        self.assertIn("run_point t5-tiny-ddp-g4-b2-s32 ", job)
        self.assertFalse(cut.exists(), "the unreadable file is still in the way of its rerun")
        aside = list(self.results.glob("t5-tiny-ddp-g4-b2-s32.h5.unreadable-*"))
        self.assertEqual(len(aside), 1)
        self.assertEqual(aside[0].read_bytes(), data, "the unreadable file was not kept as it was")

    def assert_refused_before_submitting(self, fragment, env=None, args=(), fake=True):
        r = self.run_sweep(self.matrix(), *args, env=env, fake=fake)
        self.assertEqual(r.returncode, 2, r.stdout + r.stderr)
        self.assertIn(fragment, r.stderr.splitlines()[0])
        self.assertEqual([c for c in self.sbatch_calls() if "--test-only" not in c], [])
        return r

    def test_unknown_partition(self):
        self.assert_refused_before_submitting("partition 'gpu' does not exist (this cluster has: debug)",
                                              args=("--partition", "gpu"))
        self.assertFalse(self.results.exists())

    def test_slurm_down(self):
        self.assert_refused_before_submitting("Slurm not reachable: `scontrol ping`", env={"FAKE_PING": "DOWN"})
        self.assertFalse(self.results.exists())

    def test_slurm_missing(self):
        empty = self.tmp / "empty"
        empty.mkdir()
        self.assert_refused_before_submitting("Slurm not reachable: `scontrol` not found",
                                              env={"PATH": str(empty)}, fake=False)

    def test_jobs_of_the_sweep_still_queued(self):
        tag = f"shardbench-sweep:{self.results}"
        self.assert_refused_before_submitting("are still queued or running: 42", env={"FAKE_SQUEUE": f"42|{tag}\n43|other"})

    def test_rejected_by_test_only(self):
        r = self.assert_refused_before_submitting("Slurm would reject", env={"FAKE_TESTONLY_FAIL": "1"})
        self.assertIn("Invalid account", r.stderr)
        self.assertEqual(list(self.results.glob("*.h5")), [], "out-of-memory records written before the check")

    def test_failed_submission_cancels_the_rest(self):
        r = self.run_sweep(self.matrix(gpus="[4, 8]", models='["t5-tiny"]'), env={"FAKE_SBATCH_FAIL_AT": "1"})
        self.assertEqual(r.returncode, 1, r.stdout + r.stderr)
        self.assertIn("Socket timed out", r.stderr)
        self.assertIn("scancel 100", self.calls())


class Partition(SweepCase):
    def test_partition_too_small(self):
        r = self.run_sweep(self.matrix(gpus="[4, 8]", models='["t5-tiny"]'), env={"FAKE_NODES": "1"})
        self.assertEqual(r.returncode, 2, r.stderr)
        self.assertIn("partition 'debug' has 1 node(s); the largest job needs 2", r.stderr)
        self.assertEqual(self.sbatch_calls(), [])


class JobScript(SweepCase):
    """A generated job script runs its points and skips existing results (mpirun, no Slurm)."""

    def test_runs_and_skips(self):
        from shardbench_h5 import load
        text = BASE.replace('launcher = "srun"', 'launcher = "mpirun"\nlauncher_args = ["--bind-to", "none"]')
        m = self.matrix(text, models='["t5-tiny"]', strategies='["ddp", "fsdp-full"]')
        self.assertEqual(self.run_sweep(m).returncode, 0)
        script = self.results / "jobs" / "g4.sbatch"
        self.assertEqual(subprocess.run(["bash", "-n", str(script)]).returncode, 0)
        r = subprocess.run(["bash", str(script)], capture_output=True, text=True, cwd=self.tmp, timeout=300)
        self.assertEqual(r.returncode, 0, r.stdout[-3000:] + r.stderr[-3000:])
        self.assertIn("2 ok, 0 out of memory, 0 skipped, 0 failed", r.stdout)
        files = sorted(self.results.glob("*.h5"))
        self.assertEqual([p.name for p in files], ["t5-tiny-ddp-g4-b2-s32.h5", "t5-tiny-fsdp-full-g4-b2-s32.h5"])
        for p in files:
            self.assertEqual(load(p).meta["status"], "ok")
        mtimes = [p.stat().st_mtime_ns for p in files]
        r = subprocess.run(["bash", str(script)], capture_output=True, text=True, cwd=self.tmp, timeout=300)
        self.assertEqual(r.returncode, 0, r.stderr)
        self.assertIn("0 ok, 0 out of memory, 2 skipped, 0 failed", r.stdout)
        self.assertEqual([p.stat().st_mtime_ns for p in files], mtimes)
        # a result truncated after the job wrote it (node crash): the job runs the point again
        data = files[0].read_bytes()
        files[0].write_bytes(data[:len(data) // 3])
        r = subprocess.run(["bash", str(script)], capture_output=True, text=True, cwd=self.tmp, timeout=300)
        self.assertEqual(r.returncode, 0, r.stdout[-3000:] + r.stderr[-3000:])
        self.assertIn("1 ok, 0 out of memory, 1 skipped, 0 failed", r.stdout)
        self.assertIn("is not a finished result: kept as", r.stdout)
        self.assertEqual(load(files[0]).meta["status"], "ok")
        aside = list(self.results.glob(files[0].name + ".unreadable-*"))
        self.assertEqual([p.read_bytes() for p in aside], [data[:len(data) // 3]])
        for p in aside:
            p.unlink()
        # the summary job's work: summary.csv and the plots
        r = subprocess.run(["bash", str(REPO / "slurm" / "summarize.sbatch"), str(self.results)],
                           capture_output=True, text=True, cwd=self.tmp, timeout=300)
        self.assertEqual(r.returncode, 0, r.stdout + r.stderr)
        self.assertEqual(len((self.results / "summary.csv").read_text().splitlines()), 1 + 2)
        for png in ("compare-t5-tiny-g4-b2-s32.png", "scaling.png"):
            self.assertEqual((self.results / png).read_bytes()[:8], b"\x89PNG\r\n\x1a\n")
        # an unreadable file in the folder: skipped with a line, the rest summarized, exit 3
        (self.results / "t5-tiny-broken-g4-b2-s32.h5").write_bytes(data[:1000])
        (self.results / "summary.csv").unlink()
        r = subprocess.run(["bash", str(REPO / "slurm" / "summarize.sbatch"), str(self.results)],
                           capture_output=True, text=True, cwd=self.tmp, timeout=300)
        self.assertEqual(r.returncode, 3, r.stdout + r.stderr)
        self.assertIn("summarize: skipped " + str(self.results / "t5-tiny-broken-g4-b2-s32.h5"), r.stderr)
        self.assertEqual(len((self.results / "summary.csv").read_text().splitlines()), 1 + 2)


if __name__ == "__main__":
    for p in ("ddp_perf", "fsdp_perf"):
        if not os.access(BIN / p, os.X_OK):
            sys.exit(f"test_sweep: {BIN / p} is not built (run make)")
    unittest.main(verbosity=2)
