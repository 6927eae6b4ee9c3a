#!/usr/bin/python3
"""The projection against what was measured (docs/projection.md, "Validation"):
(a) the published study's findings on the A100 description, over the programs' own --plan
schedules; (b) the one-GPU step against the committed H100 calibration runs (commit d66ed0d);
and the pieces of the model those rest on. Pure Python over the plans: about a minute.
Run: /usr/bin/python3 tests/test_projection.py (make test runs it)."""
import collections
import math
import os
import pathlib
import re
import shutil
import subprocess
import sys
import tempfile
import unittest

import h5py

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
sys.path.insert(0, os.path.join(ROOT, "analysis"))
import project  # noqa: E402
import projection_checks as pc  # noqa: E402
import projection_model as pm  # noqa: E402
import shardbench_h5  # noqa: E402

_findings = None


def findings():
    global _findings
    if _findings is None:
        _findings = pc.findings()
    return _findings


class StudyFindings(unittest.TestCase):
    """(a): the FSDP paper's findings must keep holding as the model changes."""

    def test_fsdp_alike_ddp_at_611m(self):
        self.assertLessEqual(abs(findings()["t5-611m"]["ratio"]), 0.05, findings()["t5-611m"])

    def test_fsdp_alike_ddp_at_2_28b(self):
        self.assertLessEqual(abs(findings()["t5-2.28b"]["ratio"]), 0.05, findings()["t5-2.28b"])

    def test_ddp_out_of_memory_at_11b_while_full_sharding_fits(self):
        r = findings()["t5-11.3b"]
        self.assertFalse(r["ddp_fits"], r)
        self.assertTrue(r["full_fits"], r)

    def test_t5_11b_drop_8_to_512_batch_8(self):
        self.assertLessEqual(abs(findings()["drop_b8"]["drop"] - pc.PUBLISHED_DROP), 0.04, findings()["drop_b8"])

    def test_t5_11b_drop_8_to_512_batch_16(self):
        self.assertLessEqual(abs(findings()["drop_b16"]["drop"] - pc.PUBLISHED_DROP), 0.04, findings()["drop_b16"])


class ComputeBeyondOneGpu(unittest.TestCase):
    """The two effects that slow compute at scale: stragglers and collectives beside it."""

    def test_expected_slowest_of_n_normal_variables(self):
        self.assertEqual(pm.expected_max_normal(1), 0.0)
        self.assertAlmostEqual(pm.expected_max_normal(2), 1 / math.sqrt(math.pi), places=6)
        self.assertAlmostEqual(pm.expected_max_normal(8), 1.42360, places=4)  # order-statistics tables

    def test_straggler_factor_grows_with_the_world_and_is_one_on_one_gpu(self):
        c = {"compute": {"gpu_speed_spread": 0.08}}
        self.assertEqual(pm.straggler_factor(c, 1), 1.0)
        sigma = 0.08 / pm.WHISKER_SPAN_SIGMAS
        self.assertAlmostEqual(pm.straggler_factor(c, 8), 1 + sigma * pm.expected_max_normal(8), places=12)
        self.assertGreater(pm.straggler_factor(c, 512), pm.straggler_factor(c, 8))
        self.assertEqual(pm.straggler_factor({"compute": {}}, 512), 1.0)

    def test_compute_runs_slower_only_while_a_collective_runs(self):
        busy = [[0.5, 1.0], [2.0, 3.0]]
        ends = [b for _, b in busy]
        self.assertAlmostEqual(pm._stretched(0.0, 0.4, busy, ends, 0.2), 0.4)        # before any collective
        self.assertAlmostEqual(pm._stretched(2.0, 0.5, busy, ends, 0.2), 0.6)        # inside one
        # 0.5 s free, 0.5 s inside (0.5/1.2 of work done), the rest free again
        self.assertAlmostEqual(pm._stretched(0.0, 1.0, busy, ends, 0.2), 1.0 + (0.5 - 0.5 / 1.2))
        self.assertAlmostEqual(pm._stretched(0.7, 0.1, busy, ends, 0.0), 0.1)


class OneGpu(unittest.TestCase):
    """(b): projected against measured one-GPU steps (H100, bf16, batch 8, seq 512, d66ed0d)."""

    @classmethod
    def setUpClass(cls):
        cls.rows = pc.one_gpu()

    def test_reproduces_its_calibration_within_two_percent(self):
        # Criterion (b) is 10 %; the model, calibrated on these runs, must do far better.
        for r in self.rows:
            self.assertLessEqual(abs(r["all"] / r["measured"] - 1), 0.02, r)


class ScheduleMatchesTrace(unittest.TestCase):
    """The plan's schedule is the measured step, operation for operation (the counting
    backend records the bytes the CUDA backend records), so per-operation costs apply."""

    def test_one_gpu_plan_equals_the_calibration_trace(self):
        c = pm.load_cluster(pc.H100, calibrate=False)
        sched = pc.as_calibrated_code(pc.point_schedule(c, "t5-611m", "ddp", 8, 1, pc.SEQ, False))
        planned = collections.Counter()
        for op, _ph, _u, nbytes, flops, _r, shape, _axis, _sent, _peer in pm.schedule_ops(sched):
            if op in pm.COMPUTE_OPS:
                planned[(op, nbytes, shape if op == "gemm" else None)] += 1
        with h5py.File(os.path.join(pc.CALIBRATION, "ddp_perf-bf16-t5-611m.h5"), "r") as f:
            e, names = f["events"][()], shardbench_h5.names(f["events"])  # the run's own op names
        e = e[e["step"] == e["step"].max()]
        measured = collections.Counter(
            (names[r["op"]], 0 if names[r["op"]] == "gemm" else int(r["bytes"]),
             (int(r["m"]), int(r["n"]), int(r["k"]), int(r["batch"])) if names[r["op"]] == "gemm" else None)
            for r in e if names[r["op"]] in pm.COMPUTE_OPS)
        self.assertEqual(planned, measured)


class Collectives(unittest.TestCase):
    """NCCL's costs over the cluster's tiers."""

    def setUp(self):
        self.c = pm.load_cluster(pc.A100, calibrate=False)

    def test_ring_across_nodes_is_carried_by_all_nics_of_the_node(self):
        intra, nic = self.c["intra"]["bandwidth_gbps"], self.c["inter"]["nic_bandwidth_gbps"]
        self.assertEqual(pm.bus_bandwidth(self.c, 64, 8), min(intra, 8 * nic) * 1e9)
        self.assertEqual(pm.bus_bandwidth(self.c, 64, 1), nic * 1e9)  # one rank per node: its own NIC
        self.assertEqual(pm.bus_bandwidth(self.c, 1, 8), intra * 1e9)

    def test_ring_latency_grows_with_ranks(self):
        t8 = pm.collective_time(self.c, "all-gather", 1 << 20, 8, 1, (1 << 20) * 7 / 8)
        t512 = pm.collective_time(self.c, "all-gather", 1 << 20, 512, 64, (1 << 20) * 511 / 512)
        intra, inter = self.c["intra"]["latency_us"], self.c["inter"]["latency_us"]
        latency = pm.NCCL_RING_BASE_US + (511 - 63) * intra + 63 * inter  # 63 of 511 steps cross nodes
        expected = latency * 1e-6 + (511 / 512) * (1 << 20) / pm.bus_bandwidth(self.c, 64, 8)
        self.assertAlmostEqual(t512, expected, places=9)
        self.assertGreater(t512, 10 * t8)

    def test_tree_all_reduce_beats_ring_for_a_bucket_on_many_nodes(self):
        size, n, nodes = 25 << 20, 512, 64
        intra, inter = self.c["intra"]["latency_us"], self.c["inter"]["latency_us"]
        ring_lat = (pm.NCCL_RING_BASE_US + (2 * 511 - 126) * intra + 126 * inter) * pm.NCCL_RING_ALLREDUCE_PLATEAU
        ring = ring_lat * 1e-6 + 2 * 511 / 512 * size / pm.bus_bandwidth(self.c, nodes, 8)
        self.assertLess(pm.collective_time(self.c, "all-reduce", size, n, nodes, 2 * 511 / 512 * size), ring)


class ComputeModel(unittest.TestCase):
    """Calibration from a measured run."""

    def test_a_calibrated_gemm_costs_its_measured_mean(self):
        c = pm.load_cluster(pc.H100, calibrate=False)
        cm = c["compute_model"]
        cm.add_run(os.path.join(pc.CALIBRATION, "ddp_perf-bf16-t5-611m.h5"), c)
        shape, t = next(iter(cm.gemm.items()))
        flops = 2.0 * shape[0] * shape[1] * shape[2] * shape[3]
        self.assertAlmostEqual(cm.time("gemm", 0, flops, shape), t + cm.launch, places=12)
        # An unmeasured shape of the same class gets the class's rate at its FLOPs.
        other = (shape[0] * 2, shape[1], shape[2], shape[3])
        self.assertGreater(cm.gemm_time(*other, 2 * flops), 0)

    def test_a_run_in_another_precision_is_refused(self):
        c = pm.load_cluster(os.path.join(ROOT, "runs", "clusters", "local-cpu.toml"), calibrate=False)
        with self.assertRaisesRegex(pm.ProjectionError, "cannot calibrate"):
            c["compute_model"].add_run(os.path.join(pc.CALIBRATION, "ddp_perf-bf16-t5-611m.h5"), c)


class Pipeline(unittest.TestCase):
    """Pipelines replayed stage by stage (docs/projection.md, "Pipelines"): the step of stages
    that only compute is the textbook one, sends cross the tier between the two stages' ranks,
    and a schedule whose sends do not pair up is refused."""

    A100 = os.path.join(ROOT, "runs", "clusters", "a100-80gb.toml")

    @staticmethod
    def plan(world, *flags):
        return project.plan_schedule(["ddp_perf", "--model", "t5-2.28b", "--layers", "8", "--seq-len", "512",
                                      "--dtype", "bf16", "--reduce-dtype", "bf16"] + list(flags), world, 80,
                                     os.path.join(ROOT, "build", "bin"))

    @classmethod
    def compute_only(cls):
        """The A100 description with GEMMs costing their FLOPs at 1 PFLOP/s and nothing else
        costing anything: what is left is the pipeline's own shape."""
        class Flops:
            def time(self, op, nbytes, flops, shape):
                return flops * 1e-15 if op == "gemm" else 0.0
        c = pm.load_cluster(cls.A100, calibrate=False)
        c.update(compute_model=Flops(), compute={}, collectives="ring",
                 intra={"bandwidth_gbps": 1e9, "latency_us": 0.0},
                 inter={"nic_bandwidth_gbps": 1e9, "nics_per_node": 8, "latency_us": 0.0})
        return c

    def stage_compute(self, sim):
        return [sum(e[5] - e[4] for e in events if e[3] == 0 and e[0] != "wait") for _, events in sim["stages"]]

    def test_gpipe_step_is_fill_drain_of_the_slowest_stage(self):
        # S stages of per-micro-batch time c_s / M: T = (M − 1) max c_s / M + sum c_s / M
        c = self.compute_only()
        for world, m in ((2, 8), (4, 8), (8, 16)):
            with self.subTest(stages=world, micro_batches=m):
                sim = pm.simulate(self.plan(world, "--pp", str(world), "--micro-batches", str(m), "--batch", str(m),
                                            "--pp-schedule", "gpipe"), c)
                comp = self.stage_compute(sim)
                expected = (m - 1) * max(comp) / m + sum(comp) / m
                self.assertAlmostEqual(sim["time"] / expected, 1.0, places=6)
                one_f_one_b = pm.simulate(self.plan(world, "--pp", str(world), "--micro-batches", str(m), "--batch",
                                                    str(m)), c)
                self.assertLessEqual(one_f_one_b["time"], sim["time"] * (1 + 1e-9))
                self.assertGreaterEqual(one_f_one_b["time"], expected * 0.95)

    def test_two_stage_bubble_is_the_formula(self):
        c = self.compute_only()
        for m in (4, 8):
            for schedule in ("gpipe", "1f1b"):
                with self.subTest(micro_batches=m, schedule=schedule):
                    sim = pm.simulate(self.plan(2, "--pp", "2", "--micro-batches", str(m), "--batch", str(m),
                                                "--pp-schedule", schedule), c)
                    self.assertLessEqual(abs(sim["idle_share"] - 1 / (m + 1)), 0.05, sim["idle_share"])

    def test_sends_cross_the_tier_between_the_stages(self):
        c = pm.load_cluster(self.A100)
        for world, same_node in ((8, True), (16, False)):  # stages of 4 ranks on one node; of 8 on two nodes
            with self.subTest(world=world):
                sched = self.plan(world, "--pp", "2", "--micro-batches", "2", "--batch", "2")
                sim = pm.simulate(sched, c)
                sends = [e for _, events in sim["stages"] for e in events if e[0] == "send"]
                planned = sum(row[0] == sched["op_names"].index("send") for st in sched["stages"] for row in st["ops"])
                self.assertEqual(len(sends), planned)
                self.assertGreaterEqual(len(sends), 2 * 2 * (2 - 1))  # 2 M (S − 1) and the cut's other tensors
                for e in sends:
                    self.assertAlmostEqual(e[5] - e[4], pm.p2p_time(c, e[6], same_node), places=12)
        self.assertGreater(pm.p2p_time(c, 2**21, False), 2 * pm.p2p_time(c, 2**21, True))

    def test_unpaired_sends_are_refused(self):
        sched = self.plan(2, "--pp", "2", "--micro-batches", "2", "--batch", "2")
        send = sched["op_names"].index("send")
        ops = sched["stages"][0]["ops"]
        del ops[next(i for i, row in enumerate(ops) if row[0] == send)]
        with self.assertRaisesRegex(pm.ProjectionError, "do not pair up"):
            pm.simulate(sched, self.compute_only())


    def test_sharded_accumulation_reduce_scatters_every_micro_batch(self):
        plans = {ga: project.plan_schedule(["fsdp_perf", "--sharding", "full", "--model", "t5-2.28b", "--layers", "4",
                                            "--seq-len", "512", "--dtype", "bf16", "--pp", "2", "--micro-batches", "4",
                                            "--batch", "8", "--grad-accumulation", ga], 16, 80,
                                           os.path.join(ROOT, "build", "bin")) for ga in ("unsharded", "sharded")}
        scatters = {ga: sum(row[0] == p["op_names"].index("reduce-scatter") for st in p["stages"] for row in st["ops"])
                    for ga, p in plans.items()}
        self.assertEqual(scatters["sharded"], 4 * scatters["unsharded"])
        self.assertEqual(plans["sharded"]["grad_accumulation"], "sharded")
        self.assertLess(plans["sharded"]["memory"]["peak_total"], plans["unsharded"]["memory"]["peak_total"])
        c = pm.load_cluster(self.A100)
        held, sharded = (pm.simulate(plans[ga], c) for ga in ("unsharded", "sharded"))
        self.assertGreater(sharded["communication"], held["communication"])

    def test_the_nic_sharing_bound_is_the_time_sends_and_cross_node_reductions_overlap(self):
        import projection_checks as checks
        (one_node, two_nodes) = checks.nic_sharing(layouts=(("ddp-tp2-pp2", 32),), gpus=(8, 32), micro_batches=8)
        self.assertEqual(one_node["overlap"], 0.0)  # 4 ranks a stage: the sends stay on the node
        # 8 micro-batches: the last sends still run when the data-parallel all-reduce starts
        # (at 4 they end first since the position-bias gradient crosses at table size)
        self.assertGreater(two_nodes["overlap"], 0.0)
        self.assertLessEqual(two_nodes["overlap"], min(two_nodes["sends"], two_nodes["dp"]))
        self.assertLess(two_nodes["overlap"], 0.01 * two_nodes["step"])

class ReplayConverges(unittest.TestCase):
    """The replay's fixed point (projection_model.simulate): a compute operation is slowed by
    the collectives beside it, whose timing depends on that compute. Without a pipeline one
    pass is self-consistent (replaying it once more with its own intervals changes nothing);
    a pipeline settles to REPLAY_TOLERANCE within a few passes, near its fixed point."""

    A100 = Pipeline.A100

    @staticmethod
    def plan(program, world, *flags):
        return project.plan_schedule([program, "--model", "t5-2.28b", "--seq-len", "512", "--dtype", "bf16",
                                      "--activation-checkpointing"] + list(flags), world, 80,
                                     os.path.join(ROOT, "build", "bin"))

    def test_tensor_parallel_and_fsdp_steps_are_one_self_consistent_pass(self):
        c = pm.load_cluster(self.A100)
        self.assertGreater(c["compute"]["overlap_slowdown"], 0)  # else there is nothing to converge
        for program, flags in (("fsdp_perf", ("--sharding", "full", "--tp", "8", "--batch", "64")),
                               ("fsdp_perf", ("--sharding", "full", "--batch", "8")),
                               ("ddp_perf", ("--tp", "2", "--batch", "16"))):
            with self.subTest(program=program, flags=flags):
                sched = self.plan(program, 32, *flags)
                sim = pm.simulate(sched, c, fsdp1_gathers=program == "fsdp_perf")
                own = {rank: [(e[4], e[5]) for e in events if e[3] != 0] for rank, events in sim["stages"]}
                again = pm._replay(sched, pm._stage_lists(sched, c), c, program == "fsdp_perf", own,
                                   c["compute"]["overlap_slowdown"])
                self.assertEqual(again["time"], sim["time"])
                self.assertEqual((sim["passes"], sim["converged"]), (1, True))

    def test_a_pipeline_settles_near_its_fixed_point(self):
        c = pm.load_cluster(self.A100)
        sched = self.plan("ddp_perf", 64, "--tp", "2", "--pp", "4", "--micro-batches", "8", "--batch", "32")
        sim = pm.simulate(sched, c)
        self.assertTrue(sim["converged"])
        self.assertLessEqual(sim["passes"], 10)
        transfers, slowdown = {}, c["compute"]["overlap_slowdown"]
        for _ in range(15):  # far past the tolerance
            far = pm._replay(sched, pm._stage_lists(sched, c), c, False, transfers, slowdown)
            transfers = {rank: [(e[4], e[5]) for e in events if e[3] in (4, 5)] for rank, events in far["stages"]}
        self.assertLess(abs(sim["time"] / far["time"] - 1), 4 * pm.REPLAY_TOLERANCE)

class CpuOffload(unittest.TestCase):
    """CPU offload (docs/projection.md, "CPU offload"): copies on the host link's two lanes,
    the CPU update on the host lane, at the rates of the description's [host]."""

    LOCAL = os.path.join(ROOT, "runs", "clusters", "local-cpu.toml")
    CLUSTER = """name = "hand"
gpus_per_node = 8
gpu_memory_gib = 80
dtype = "bf16"
[compute]
gemm_tflops = 1.0
memory_bandwidth_gbps = 10.0
[intra]
bandwidth_gbps = 100.0
latency_us = 1.0
[inter]
nic_bandwidth_gbps = 10.0
nics_per_node = 8
latency_us = 1.0
"""

    def setUp(self):
        self.tmp = tempfile.mkdtemp(prefix="test_projection.")
        self.addCleanup(shutil.rmtree, self.tmp, True)

    def cluster(self, link=None, update=40.0, path="hand.toml"):
        text = self.CLUSTER
        if link is not None:
            text += f"[host]\nlink_bandwidth_gbps = {link}\nupdate_bandwidth_gbps = {update}\nmemory_gib = 64\n"
        path = os.path.join(self.tmp, path)
        with open(path, "w") as f:
            f.write(text)
        return path

    @staticmethod
    def schedule():
        """One GEMM of 1e12 FLOPs, its gradient's download (2 GB), the host's wait for it, the
        CPU update (4 GB touched), the upload of its result (1 GB), and compute's wait for it."""
        names = ["gemm", "elementwise", "optimizer", "copy", "all-reduce", "all-gather", "reduce-scatter", "wait"]
        cols = ["op", "phase", "unit", "bytes", "flops", "request", "m", "n", "k", "batch", "axis", "ranks",
                "sent_bytes", "peer", "lane", "after"]
        code = {n: i for i, n in enumerate(names)}

        def row(op, phase, nbytes=0, flops=0, req=-1, lane=0, after=-1, shape=(0, 0, 0, 0)):
            return [code[op], phase, 0, nbytes, flops, req, *shape, -1, 0, 0, -1, lane, after]
        ops = [row("gemm", 1, flops=1e12, shape=(10000, 10000, 5000, 1)),
               row("copy", 1, nbytes=2e9, req=1, lane=102),
               row("wait", 2, req=1, lane=100),
               row("optimizer", 2, nbytes=4e9, lane=100),
               row("copy", 2, nbytes=1e9, req=2, lane=101),
               row("wait", 2, req=2)]
        axes = ["pp", "dp_replicate", "dp_shard", "tp"]
        return {"program": "fsdp_perf", "world_size": 1, "pp_size": 1, "cpu_offload": "optimizer",
                "columns": cols, "op_names": names, "phase_names": ["forward", "backward", "optimizer"],
                "axis_names": axes, "axes": {a: {"ranks": [0]} for a in axes}, "ops": ops}

    def test_the_host_link_sets_the_step_as_a_hand_computation_says(self):
        for link in (10.0, 5.0, 2.5):
            with self.subTest(link=link):
                sim = pm.simulate(self.schedule(), pm.load_cluster(self.cluster(link), calibrate=False))
                # 1 s of GEMM, then the download (2 GB), the update (4 GB at 40 GB/s), the upload (1 GB)
                self.assertAlmostEqual(sim["time"], 1.0 + 2 / link + 4 / 40.0 + 1 / link, places=12)
                self.assertAlmostEqual(sim["host_copy"], 3 / link, places=12)
                self.assertAlmostEqual(sim["host_update"], 0.1, places=12)
                spans = {(e[0], e[3]): (e[4], e[5]) for e in sim["events"]}
                self.assertEqual(spans[("copy", 102)], (1.0, 1.0 + 2 / link))
                self.assertAlmostEqual(spans[("optimizer", 100)][0], 1.0 + 2 / link, places=12)
                self.assertAlmostEqual(spans[("copy", 101)][0], spans[("optimizer", 100)][1], places=12)
                self.assertAlmostEqual(sim["exposed"], 2 / link + 0.1 + 1 / link, places=12)  # compute waited

    def test_offload_schedules_replay_with_their_copies_and_updates_on_their_lanes(self):
        c = pm.load_cluster(self.LOCAL, calibrate=False)
        for stage, offload, label in (("1", "optimizer", "fsdp-optimizer-state-offload-optimizer"),
                                      ("3", "params", "fsdp-full-offload-params")):
            with self.subTest(offload=offload):
                sched = project.plan_schedule(["fsdp_perf", "--model", "t5-tiny", "--zero-stage", stage, "--cpu-offload",
                                               offload, "--batch", "2", "--seq-len", "16"], 4, 1,
                                              os.path.join(ROOT, "build", "bin"), 1)
                self.assertEqual(sched["label"], label)
                lane = sched["columns"].index("lane")
                planned = collections.Counter(r[lane] for r in sched["ops"] if r[lane] >= 100)
                sim = pm.simulate(sched, c)
                replayed = collections.Counter(e[3] for e in sim["events"] if e[3] >= 100 and e[0] != "wait")
                updates = sum(1 for r in sched["ops"] if r[lane] == 100 and sched["op_names"][r[0]] == "optimizer")
                self.assertEqual(replayed[100], updates)
                self.assertEqual(replayed[101], planned[101])
                self.assertEqual(replayed[102], planned[102])
                self.assertGreater(sim["host_copy"], 0)
                self.assertGreater(sim["host_update"], 0)
                self.assertGreaterEqual(sim["time"], max(e[5] for e in sim["events"]))

    def test_a_projected_offload_result_carries_the_host_lanes(self):
        out = os.path.join(self.tmp, "out")
        r = subprocess.run([sys.executable, os.path.join(ROOT, "analysis", "project.py"), "--cluster", self.LOCAL,
                            "--model", "t5-tiny", "--gpus", "4", "--batch", "2", "--seq-len", "16", "--strategies",
                            "fsdp-full-offload-params", "--out", out], capture_output=True, text=True)
        self.assertEqual(r.returncode, 0, r.stdout + r.stderr)
        with h5py.File(os.path.join(out, "t5-tiny-fsdp-full-offload-params-g4-b2-s16.h5"), "r") as f:
            self.assertEqual(f.attrs["cpu_offload"], "params")
            self.assertGreater(f.attrs["projected_host_update_s"], 0)
            lanes = set(int(x) for x in f["events"]["lane"])
        self.assertTrue({100, 101, 102} <= lanes, lanes)

    def test_an_offload_schedule_without_host_in_the_description_is_one_line(self):
        path = self.cluster(None)
        with self.assertRaisesRegex(pm.ProjectionError, rf"^cluster description {re.escape(path)}: missing table "
                                    r"\[host\]"):
            pm.simulate(self.schedule(), pm.load_cluster(path, calibrate=False))
        with open(self.LOCAL) as f:
            text = f.read()
        nohost = os.path.join(self.tmp, "nohost.toml")
        with open(nohost, "w") as f:
            f.write(text[:text.index("[host]")])
        out = os.path.join(self.tmp, "out")
        r = subprocess.run([sys.executable, os.path.join(ROOT, "analysis", "project.py"), "--cluster", nohost,
                            "--model", "t5-tiny", "--gpus", "4", "--batch", "2", "--seq-len", "16", "--strategies",
                            "fsdp-optimizer-state-offload-optimizer", "--out", out], capture_output=True, text=True)
        self.assertEqual(r.returncode, 2, r.stdout + r.stderr)
        self.assertEqual(len(r.stderr.splitlines()), 1, r.stderr)
        self.assertRegex(r.stderr, rf"^project: error: cluster description {re.escape(nohost)}: missing table \[host\]")
        self.assertFalse(os.path.exists(out))
        # without offload the same description projects as before
        r = subprocess.run([sys.executable, os.path.join(ROOT, "analysis", "project.py"), "--cluster", nohost,
                            "--model", "t5-tiny", "--gpus", "4", "--batch", "2", "--seq-len", "16", "--strategies",
                            "fsdp-optimizer-state", "--out", out], capture_output=True, text=True)
        self.assertEqual(r.returncode, 0, r.stdout + r.stderr)

    def test_bad_host_fields_are_refused_by_name(self):
        path = self.cluster(0.0)
        with self.assertRaisesRegex(pm.ProjectionError, r"field 'host.link_bandwidth_gbps' = 0.0 is not allowed"):
            pm.load_cluster(path, calibrate=False)
        path = self.cluster(10.0, path="extra.toml")
        with open(path, "a") as f:
            f.write("pcie = 5\n")
        with self.assertRaisesRegex(pm.ProjectionError, r"unknown field\(s\) \['host.pcie'\]"):
            pm.load_cluster(path, calibrate=False)


class BadInput(unittest.TestCase):
    """Bad input is one line naming the file or value and what is allowed, exit 2, and
    nothing written or replaced (docs/projection.md): cluster descriptions that are not
    UTF-8 or hold nan/inf, and an --out folder that holds results already."""

    LOCAL = os.path.join(ROOT, "runs", "clusters", "local-cpu.toml")
    MEASURED = os.path.join(pc.CALIBRATION, "fsdp_perf-bf16-t5-11.3b-4layers.h5")  # a real measured result
    NAME = "t5-tiny-ddp-g2-b2-s16.h5"  # the point below, as slurm/sweep would name its measurement

    def setUp(self):
        self.tmp = tempfile.mkdtemp(prefix="test_projection.")
        self.addCleanup(shutil.rmtree, self.tmp, True)

    def description(self, text=None, data=None):
        path = os.path.join(self.tmp, "cluster.toml")
        with open(path, "wb") as f:
            f.write(data if data is not None else text.encode())
        return path

    def project(self, out, *extra, cluster=None, strategies="ddp"):
        return subprocess.run([sys.executable, os.path.join(ROOT, "analysis", "project.py"), "--cluster",
                               cluster or self.LOCAL, "--model", "t5-tiny", "--gpus", "2", "--batch", "2", "--seq-len",
                               "16", "--strategies", strategies, "--out", out, *extra],
                              capture_output=True, text=True)

    def assert_refused(self, r, pattern):
        self.assertEqual(r.returncode, 2, r.stdout + r.stderr)
        self.assertNotIn("Traceback", r.stderr)
        self.assertEqual(len(r.stderr.splitlines()), 1, r.stderr)
        self.assertRegex(r.stderr, "^project: error: " + pattern)

    def test_nan_and_inf_in_a_cluster_description_are_refused_by_field(self):
        with open(self.LOCAL) as f:
            text = f.read()
        for field, line, value in (("compute.gemm_tflops", "gemm_tflops = 0.1", "nan"),
                                   ("gpu_memory_gib", "gpu_memory_gib = 20", "inf"),
                                   ("intra.bandwidth_gbps", "bandwidth_gbps = 2.0", "+inf"),
                                   ("inter.latency_us", "latency_us = 100.0", "-nan")):
            with self.subTest(field=field, value=value):
                self.assertIn(line, text)
                path = self.description(text.replace(line, line.split("=")[0] + "= " + value))
                with self.assertRaisesRegex(pm.ProjectionError, rf"{path}: field '{re.escape(field)}' = "
                                            r"(nan|inf) is not allowed \(must be a finite positive number\)$"):
                    pm.load_cluster(path, calibrate=False)

    def test_a_cluster_description_that_is_not_utf8_is_one_line(self):
        path = self.description(data=b'# cluster\nname = "caf\xe9"\n')
        with self.assertRaisesRegex(pm.ProjectionError, rf"^{re.escape(path)}: not UTF-8 text \(byte 0xe9 on line 2\)"):
            pm.load_cluster(path, calibrate=False)
        out = os.path.join(self.tmp, "out")
        self.assert_refused(self.project(out, cluster=path), f"{re.escape(path)}: not UTF-8 text")
        self.assertFalse(os.path.exists(out))

    def test_a_result_in_out_is_replaced_only_with_overwrite(self):
        out = os.path.join(self.tmp, "out")
        r = self.project(out)
        self.assertEqual(r.returncode, 0, r.stdout + r.stderr)
        path = os.path.join(out, self.NAME)
        before = pathlib.Path(path).read_bytes()
        self.assert_refused(self.project(out), rf"--out '{re.escape(out)}': {self.NAME} exists \(pass --overwrite")
        self.assertEqual(pathlib.Path(path).read_bytes(), before)
        self.assertEqual(sorted(os.listdir(out)), [self.NAME])  # no temporary left behind
        r = self.project(out, "--overwrite")
        self.assertEqual(r.returncode, 0, r.stdout + r.stderr)
        self.assertEqual(sorted(os.listdir(out)), [self.NAME])
        with h5py.File(path, "r") as f:
            self.assertEqual(f.attrs["projected"], 1)

    def test_a_measured_result_is_never_replaced(self):
        out = os.path.join(self.tmp, "sweep")  # a sweep's folder: its measurement under the same name
        os.makedirs(out)
        path = os.path.join(out, self.NAME)
        shutil.copy(self.MEASURED, path)
        before = pathlib.Path(path).read_bytes()
        for extra in ((), ("--overwrite",)):
            with self.subTest(args=extra):
                self.assert_refused(self.project(out, *extra), rf"--out '{re.escape(out)}': {self.NAME} is not a "
                                    r"projected result .*never replaced, even with --overwrite")
                self.assertEqual(pathlib.Path(path).read_bytes(), before)
                self.assertEqual(os.listdir(out), [self.NAME])

    def test_exit_2_leaves_no_folder_and_no_result(self):
        # the second point is refused by its program (3 micro-batches do not divide 2) after
        # the first was projected: neither the folder nor the first result may stay
        out = os.path.join(self.tmp, "new", "out")
        r = self.project(out, "--micro-batches", "3", strategies="ddp,ddp-pp2")
        self.assert_refused(r, r"--micro-batches 3 is not allowed with --batch 2")
        self.assertFalse(os.path.exists(os.path.join(self.tmp, "new")))
        os.makedirs(out)
        self.assert_refused(self.project(out, "--micro-batches", "3", strategies="ddp,ddp-pp2"), "--micro-batches 3")
        self.assertEqual(os.listdir(out), [])


def synthetic_run(path, compute_steps, ranks=2):
    """A measured training run as ComputeModel.add_run reads it (fp32, DDP, t5-tiny): each
    step of each rank one GEMM and one elementwise kernel, lasting compute_steps[i] seconds in
    all, so that its step-to-step compute spread is that of compute_steps."""
    import numpy as np
    steps = [(r, i + 1, int(i == 0), c, 1e-4) for r in range(ranks) for i, c in enumerate(compute_steps)]
    sd = np.array(steps, dtype=[("rank", "<i4"), ("step", "<i4"), ("warmup", "<i4"), ("compute", "<f8"),
                               ("overhead", "<f8")])
    ev = np.zeros(2 * len(steps), dtype=[("rank", "<i4"), ("step", "<i4"), ("op", "<i4"), ("start", "<f8"),
                                         ("end", "<f8"), ("m", "<i4"), ("n", "<i4"), ("k", "<i4"), ("batch", "<i4"),
                                         ("bytes", "<i8")])
    for j, (r, step, _, c, _) in enumerate(steps):
        ev[2 * j] = (r, step, 0, 0.0, 0.8 * c, 64, 64, 64, 1, 0)
        ev[2 * j + 1] = (r, step, 1, 0.8 * c, c, 0, 0, 0, 0, 1 << 16)
    with h5py.File(path, "w") as f:
        for k, v in {"status": "ok", "dtype": "fp32", "ranks_per_node": ranks, "world_size": ranks,
                     "program": "ddp_perf", "model": "t5-tiny", "backend": "cpu", "batch_per_rank": 2}.items():
            f.attrs[k] = v
        f.create_dataset("steps", data=sd)
        f.create_dataset("events", data=ev).attrs["op_names"] = ["gemm", "elementwise"]
    return path


def synthetic_collectives(path, jitter, n=4, nodes=2, mode="nonblocking", sizes=(1 << 10, 1 << 12, 1 << 14),
                          slow=None, groups=None):
    """A collective_perf result as calibrate_collectives reads it: the three operations at
    `sizes` on a ring of 100 µs a step and 0.01 GB/s, each point's p90 `jitter` above its p50;
    `slow`: {(op index, size): factor} times slower than that line; `groups`: (axis, world):
    the rows are one of world / n groups of n ranks on `nodes` nodes that ran at once."""
    import numpy as np
    rows = []
    for op, factor in ((0, 2 * (n - 1) / n), (1, (n - 1) / n), (2, (n - 1) / n)):
        for size in sizes:
            steps = 2 * (n - 1) if op == 0 else n - 1
            t = (steps * 100e-6 + size * factor / 0.01e9) * (slow or {}).get((op, size), 1.0)
            algbw = size / t / 1e9
            rows.append((op, 0, size, t, algbw, algbw * factor, t, t * (1 + jitter)))
    r = np.array(rows, dtype=[("op", "<i4"), ("in_place", "<i4"), ("size", "<i8"), ("time", "<f8"), ("algbw", "<f8"),
                              ("busbw", "<f8"), ("p50", "<f8"), ("p90", "<f8")])
    # one iteration of rank 0 a point: the samples table a result has beside its results
    s = np.array([(0, op, 0, 0, size, t) for op, _, size, t, *_ in rows],
                 dtype=[("rank", "<i4"), ("op", "<i4"), ("in_place", "<i4"), ("iteration", "<i4"), ("size", "<i8"),
                        ("time", "<f8")])
    names = ["all-reduce", "all-gather", "reduce-scatter"]
    with h5py.File(path, "w") as f:
        for k, v in {"program": "collective_perf", "world_size": n, "nodes": nodes, "collectives": mode,
                     "start_time": "2026-12-01T00:00:00Z", "status": "ok"}.items():
            f.attrs[k] = v
        if groups:
            f.attrs.update(groups=groups[0], world_size=groups[1], group_size=n, group_nodes=nodes)
        f.create_dataset("results", data=r).attrs["op_names"] = names
        f.create_dataset("samples", data=s).attrs["op_names"] = names
    return path


class CalibrationQuality(unittest.TestCase):
    """The projection knows how good its calibration is (docs/projection.md, "What the
    calibration's spread says"): the spread of its runs gives each point a range, a disturbed
    one is named (and refused under --require-calibration), and a collective costed beyond
    the sizes its fit measured is named with the factor. project.main in this process: the
    plans, not the interpreter, are what a point costs."""

    EMULATED = os.path.join(ROOT, "runs", "clusters", "emulated-4node.toml")
    POINT = ["--model", "t5-tiny", "--seq-len", "16", "--batch", "2", "--gpus", "4", "--strategies", "ddp"]
    QUIET = [0.100, 0.100, 0.101, 0.099, 0.100, 0.1005]   # the first is the warm-up
    NOISY = [0.100, 0.100, 0.150, 0.070, 0.130, 0.080]

    @classmethod
    def setUpClass(cls):
        cls.tmp = tempfile.mkdtemp(prefix="test_projection.")
        cls.quiet = synthetic_run(os.path.join(cls.tmp, "quiet.h5"), cls.QUIET)
        cls.noisy = synthetic_run(os.path.join(cls.tmp, "noisy.h5"), cls.NOISY)
        cls.runs = {kind: cls.project(os.path.join(cls.tmp, kind), run, *extra) for kind, run, extra in
                    (("quiet", cls.quiet, ["--require-calibration"]), ("noisy", cls.noisy, []))}

    @classmethod
    def tearDownClass(cls):
        shutil.rmtree(cls.tmp, True)

    @classmethod
    def project(cls, out, run, *extra, jitter=0.02, sizes=(1 << 10, 1 << 12, 1 << 14)):
        """(exit code, stdout, stderr, the result's attributes or None) of project.main."""
        import contextlib
        import io
        coll = [synthetic_collectives(os.path.join(cls.tmp, f"coll-{m}.h5"), jitter, mode=m, sizes=sizes)
                for m in ("blocking", "nonblocking")]
        args = ["--cluster", cls.EMULATED, *cls.POINT, "--calibrate-run", run,
                *sum((["--calibrate-collectives", c] for c in coll), []), *extra] + (["--out", out] if out else [])
        o, e = io.StringIO(), io.StringIO()
        with contextlib.redirect_stdout(o), contextlib.redirect_stderr(e):
            try:
                rc = project.main(args)
            except SystemExit as x:  # argparse
                rc = x.code
        attrs = None
        if out and os.path.isdir(out) and os.listdir(out):
            (name,) = os.listdir(out)
            with h5py.File(os.path.join(out, name), "r") as f:
                attrs = shardbench_h5.attrs(f)
        return rc, o.getvalue(), e.getvalue(), attrs

    def test_the_range_is_there_and_wider_for_a_noisier_calibration(self):
        for kind in ("quiet", "noisy"):
            rc, out, err, a = self.runs[kind]
            self.assertEqual(rc, 0, out + err)
            self.assertLess(a["step_time_low_s"], a["median_step_time_s"])
            self.assertGreater(a["step_time_high_s"], a["median_step_time_s"])
            self.assertRegex(out, rf"ddp +4 +2 +[0-9.]+ +[0-9.]+ +{a['step_time_spread'] * 100:.1f} ")
        # the noisy run's steps spread 0.32 against the quiet one's 0.007: its range is wider
        quiet, noisy = (self.runs[k][3]["step_time_spread"] for k in ("quiet", "noisy"))
        self.assertGreater(noisy, 3 * quiet)
        self.assertLess(quiet, 0.05)

    def test_a_disturbed_calibration_is_named_and_refused_under_require_calibration(self):
        rc, out, err, a = self.runs["noisy"]
        self.assertRegex(out, r"calibration DISTURBED: calibration run noisy.h5: step-to-step compute spread "
                              r"3[0-9.]+% .*above the 27% of a quiet calibration")
        self.assertIn("noisy.h5: step-to-step compute spread", a["calibration_disturbed"])
        self.assertNotIn("DISTURBED", self.runs["quiet"][1])  # the quiet one passed --require-calibration
        self.assertEqual(self.runs["quiet"][3]["calibration_disturbed"], "")
        refused = os.path.join(self.tmp, "refused")
        for run, jitter, pattern in ((self.noisy, 0.02, r"calibration run noisy.h5: step-to-step compute spread"),
                                     # a collective fit whose iterations spread: named by its file and operation
                                     (self.quiet, 2.0, r"--calibrate-collectives coll-blocking.h5: all-gather "
                                                       r"iteration-to-iteration spread 156.1%")):
            rc, out, err, _ = self.project(refused, run, "--require-calibration", jitter=jitter)
            self.assertEqual(rc, 2, out + err)
            self.assertEqual(len(err.splitlines()), 1, err)
            self.assertRegex(err, rf"^project: error: {pattern} .*disturbed.*--require-calibration refuses it")
            self.assertFalse(os.path.exists(refused))

    def test_a_collective_beyond_its_calibrated_sizes_is_named_with_the_factor(self):
        rc, out, err, _ = self.project(None, self.quiet, "--collective-sizes")
        self.assertEqual(rc, 0, out + err)
        largest = int(out.splitlines()[-1].split()[2])  # DDP's bucket
        factor = largest / (1 << 14)  # the fits measured up to 16 KiB
        self.assertGreater(factor, 4)
        rc, out, err, a = self.runs["quiet"]
        self.assertRegex(out, rf"extrapolated: all-reduce on 4 ranks/2 node\(s\) (non)?blocking: .* issued = "
                              rf"{factor:.2f}x the largest calibrated \(16 KiB\)")
        self.assertAlmostEqual(a["extrapolation_factor"], factor, places=6)
        self.assertIn(f"{factor:.2f}x the largest calibrated", a["extrapolated_collectives"])
        # calibrated at the sizes the plan issues, nothing is named
        rc, out, err, a = self.project(os.path.join(self.tmp, "wide"), self.quiet, sizes=(1 << 10, 1 << 14, largest))
        self.assertEqual(rc, 0, out + err)
        self.assertNotIn("extrapolated: all-reduce", out)
        self.assertEqual(a["extrapolation_factor"], 1.0)

    def test_bad_input_of_the_new_flags(self):
        rc, out, err, _ = self.project(None, self.quiet)  # no --out and no --collective-sizes
        self.assertEqual(rc, 2, out + err)
        self.assertEqual(err.splitlines(), ["project: error: --out is required (a folder for the results), unless "
                                            "--collective-sizes"])
        r = subprocess.run([sys.executable, os.path.join(ROOT, "analysis", "project.py"), "--cluster", self.EMULATED,
                            "--model", "t5-tiny", "--gpus", "1", "--batch", "2", "--strategies", "ddp",
                            "--collective-sizes"], capture_output=True, text=True)
        self.assertEqual(r.returncode, 2, r.stdout + r.stderr)
        self.assertEqual(r.stderr.splitlines(), ["project: error: no point issues a collective (one rank?): nothing "
                                                 "to calibrate"])

class CollectiveResidual(unittest.TestCase):
    """A collective's time where it is not linear in the bytes (docs/projection.md, "What the
    calibration's spread says"): at its own group shape and mode, collective_time gives each
    measured size its measured time, between them the fit's miss interpolated in log bytes;
    one line through all of them put the largest size's slowness on every size."""

    def test_measured_sizes_keep_their_times_and_other_shapes_the_line(self):
        tmp = tempfile.mkdtemp(prefix="test_projection.")
        self.addCleanup(shutil.rmtree, tmp, True)
        sizes = (1 << 18, 1 << 20, 1 << 22, 1 << 24)
        slow = {(1, 1 << 24): 1.6}  # the all-gather of 16 MiB 1.6x the line (TCP, as measured)
        path = synthetic_collectives(os.path.join(tmp, "c.h5"), 0.0, mode="blocking", sizes=sizes, slow=slow)
        cluster = pm.load_cluster(CalibrationQuality.EMULATED)
        pm.calibrate_collectives(cluster, path)
        n, nodes = 4, 2
        for size in sizes:
            sent = size * (n - 1) / n
            want = ((n - 1) * 100e-6 + sent / 0.01e9) * slow.get((1, size), 1.0)
            got = pm.collective_time(cluster, "all-gather", size, n, nodes, sent, blocking=True)
            self.assertAlmostEqual(got / want, 1.0, places=9, msg=size)
        # the line alone (the residual taken off) misses the sizes below by the 16 MiB's pull
        (lat, bw, info), = cluster["inter"]["ops"]["all-gather"].values()
        sent = (1 << 22) * (n - 1) / n
        line = (n - 1) * lat * 1e-6 + sent / (pm.nic_share(cluster, 2) * bw * 1e9)
        self.assertGreater(line / ((n - 1) * 100e-6 + sent / 0.01e9), 1.1)
        # halfway (in log bytes) between 4 and 16 MiB: between the two measured ratios
        size = 1 << 23
        sent = size * (n - 1) / n
        ratio = pm.collective_time(cluster, "all-gather", size, n, nodes, sent, blocking=True) / (
            (n - 1) * 100e-6 + sent / 0.01e9)
        self.assertGreater(ratio, 1.0 + 1e-3)
        self.assertLess(ratio, 1.6 - 1e-3)
        # another group shape (8 ranks on 4 nodes) gets the fit's line, not this shape's misses
        sent = (1 << 20) * 7 / 8
        t8 = pm.collective_time(cluster, "all-gather", 1 << 20, 8, 4, sent, blocking=True)
        self.assertAlmostEqual(t8, 7 * lat * 1e-6 + sent / (pm.nic_share(cluster, 2) * bw * 1e9), places=12)


class CollectiveGroupsAtOnce(unittest.TestCase):
    """A fit of groups measured side by side (collective_perf --groups): what each group got
    while the node's other groups ran theirs is the time collective_time gives that group
    shape, not that figure shared again among the node's groups (the emulated cluster: one
    link a node, 2 ranks a node: two replicate groups' flows on each link)."""

    def test_measured_beside_the_other_groups_is_not_shared_again(self):
        tmp = tempfile.mkdtemp(prefix="test_projection.")
        self.addCleanup(shutil.rmtree, tmp, True)
        sizes = (1 << 18, 1 << 20, 1 << 22)
        alone = synthetic_collectives(os.path.join(tmp, "alone.h5"), 0.0, n=2, nodes=2, mode="blocking", sizes=sizes)
        together = synthetic_collectives(os.path.join(tmp, "together.h5"), 0.0, n=2, nodes=2, mode="blocking",
                                         sizes=sizes, groups=("replicate", 4))
        for path, share in ((together, 1.0), (alone, 0.5)):
            cluster = pm.load_cluster(CalibrationQuality.EMULATED)
            self.assertEqual(pm.nic_share(cluster, 1), 0.5)  # one of the node's 2 ranks
            pm.calibrate_collectives(cluster, path)
            for size in sizes:
                sent = size  # all-reduce on 2 ranks: 2 (n - 1) / n
                want = 2 * 100e-6 + sent / (share * 0.01e9)
                got = pm.collective_time(cluster, "all-reduce", size, 2, 2, sent, blocking=True)
                self.assertAlmostEqual(got / want, 1.0, places=9, msg=(path, size))
            self.assertEqual("groups at once" in cluster["calibration"][-1], path == together)


if __name__ == "__main__":
    unittest.main(verbosity=2)
