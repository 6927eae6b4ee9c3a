// Strategy schedules, read from the counting backend: which collectives each strategy
// issues per step, of what size, in which phase, and what memory each keeps.
#include <gtest/gtest.h>

#include <algorithm>
#include <functional>
#include <map>

#include "shardbench/backend/backend.h"
#include "shardbench/backend/layout.h"
#include "shardbench/core/check.h"
#include "shardbench/strategy/strategy.h"

using namespace sb;

namespace {

struct Collected : Recorder {
  std::vector<OpEvent> comm;
  std::vector<OpEvent> all;  // every operation, in issue order
  void on_op(const OpEvent& e) override {
    if (is_communication(e.kind)) comm.push_back(e);
    all.push_back(e);
  }
  void on_memory(double, const MemBytes&) override {}
  int count(OpKind k, Phase p) const {
    int n = 0;
    for (const auto& e : comm) n += e.kind == k && e.phase == p;
    return n;
  }
  int64_t bytes(OpKind k) const {
    int64_t n = 0;
    for (const auto& e : comm) n += e.kind == k ? e.bytes : 0;
    return n;
  }
};

struct Schedule {
  Collected rec;
  MemBytes peak{};
  int units = 0;
};

Schedule run_schedule(StrategyConfig cfg, int world, const ModelSpec& spec = model_preset("t5-small")) {
  Schedule s;
  auto b = make_counting_backend();
  const StepShape shape{2, 16, 12};
  const Setup setup = Setup::make(cfg, spec, shape, world);
  Mesh mesh = Mesh::planned(setup.layout);
  auto strategy = make_strategy(setup, *b, mesh);
  b->set_recorder(&s.rec);
  strategy->step(1, make_tokens(1, 1, 0, shape, spec.vocab));
  b->set_recorder(nullptr);
  s.peak = b->mem_peak();
  s.units = int(model_units(spec).size());
  return s;
}

StrategyConfig fsdp(Sharding sh, int shard_size = 0) {
  StrategyConfig c;
  c.kind = StrategyKind::FSDP;
  c.sharding = sh;
  c.shard_size = shard_size;
  return c;
}

int64_t padded_bytes(const ModelSpec& spec, int shards) {
  int64_t n = 0;
  for (const auto& u : model_units(spec)) n += shard_of(u.numel, shards, 0).padded * 4;
  return n;
}

}  // namespace

TEST(Schedule, FullShardingGathersBlocksTwice) {
  const ModelSpec spec = model_preset("t5-small");
  Schedule s = run_schedule(fsdp(Sharding::Full), 4);
  const int blocks = 2 * int(spec.layers);
  EXPECT_EQ(s.rec.count(OpKind::AllGather, Phase::Forward), s.units);
  // Embedding, bridge and head (PyTorch's root unit) kept from forward.
  EXPECT_EQ(s.rec.count(OpKind::AllGather, Phase::Backward), blocks);
  EXPECT_EQ(s.rec.count(OpKind::ReduceScatter, Phase::Backward), s.units);
  EXPECT_EQ(s.rec.bytes(OpKind::AllReduce), 0);
  EXPECT_EQ(s.rec.bytes(OpKind::ReduceScatter), padded_bytes(spec, 4));
  // ZeRO-3 traffic: all-gathers move about 2M, reduce-scatters M (docs/references.md §2: 3M(W−1)/W).
  const double M = padded_bytes(spec, 4);
  double kept = 0;
  for (const UnitSpec& u : model_units(spec))
    if (!is_block(u.kind)) kept += shard_of(u.numel, 4, 0).padded * 4.0;
  EXPECT_DOUBLE_EQ(double(s.rec.bytes(OpKind::AllGather)), 2 * M - kept);
  // Parameters, gradients and optimizer state are sharded four ways.
  EXPECT_EQ(s.peak[int(MemCategory::Parameters)], padded_bytes(spec, 4) / 4);
  EXPECT_EQ(s.peak[int(MemCategory::OptimizerState)], 2 * padded_bytes(spec, 4) / 4);
}

TEST(Schedule, GradOpKeepsUnitsFromForwardToBackward) {
  Schedule s = run_schedule(fsdp(Sharding::GradOp), 4);
  EXPECT_EQ(s.rec.count(OpKind::AllGather, Phase::Forward), s.units);
  EXPECT_EQ(s.rec.count(OpKind::AllGather, Phase::Backward), 0);
  EXPECT_EQ(s.rec.count(OpKind::ReduceScatter, Phase::Backward), s.units);
  Schedule full = run_schedule(fsdp(Sharding::Full), 4);
  EXPECT_GT(s.peak[int(MemCategory::CommBuffers)], full.peak[int(MemCategory::CommBuffers)]);
}

TEST(Schedule, HybridScattersInGroupThenAllReducesShards) {
  const ModelSpec spec = model_preset("t5-small");
  Schedule s = run_schedule(fsdp(Sharding::Hybrid, 2), 8);
  EXPECT_EQ(s.rec.count(OpKind::ReduceScatter, Phase::Backward), s.units);
  EXPECT_EQ(s.rec.count(OpKind::AllReduce, Phase::Backward), s.units);
  EXPECT_EQ(s.rec.bytes(OpKind::AllReduce), padded_bytes(spec, 2) / 2);  // shards only
  EXPECT_EQ(s.peak[int(MemCategory::Parameters)], padded_bytes(spec, 2) / 2);
}

TEST(Schedule, NoShardAllReducesEveryUnit) {
  const ModelSpec spec = model_preset("t5-small");
  Schedule s = run_schedule(fsdp(Sharding::None), 4);
  EXPECT_EQ(s.rec.bytes(OpKind::AllGather), 0);
  EXPECT_EQ(s.rec.bytes(OpKind::ReduceScatter), 0);
  EXPECT_EQ(s.rec.count(OpKind::AllReduce, Phase::Backward), s.units);
  EXPECT_EQ(s.rec.bytes(OpKind::AllReduce), param_count(spec) * 4);
  EXPECT_EQ(s.peak[int(MemCategory::Parameters)], param_count(spec) * 4);
}

TEST(Schedule, DdpBucketsCoverTheModelFirstBucketSmall) {
  const ModelSpec spec = model_preset("t5-small");
  StrategyConfig c;
  c.kind = StrategyKind::DDP;
  c.bucket_mb = 4;
  Schedule s = run_schedule(c, 4);
  EXPECT_EQ(s.rec.bytes(OpKind::AllReduce), param_count(spec) * 4);
  EXPECT_EQ(s.rec.bytes(OpKind::AllGather), 0);
  ASSERT_GE(s.rec.comm.size(), 3u);
  // The first bucket closes at 1 MiB, the others at the 4 MiB cap (whole tensors, so a
  // bucket may overshoot by less than its last tensor).
  const int64_t first = s.rec.comm[0].bytes;
  EXPECT_GE(first, 1 << 20);
  EXPECT_LT(first, 4 << 20);
  for (size_t i = 1; i + 1 < s.rec.comm.size(); ++i) EXPECT_GE(s.rec.comm[i].bytes, 4 << 20);
  // Buckets launch during backward, before the step's last piece (overlap), except the
  // one holding the root unit, which completes last.
  int during = 0;
  for (const auto& e : s.rec.comm) during += e.unit > 0;
  EXPECT_GE(during, 1);
}

TEST(Schedule, PrefetchIssuesNextGatherBeforeCurrentCompute) {
  // With backward-pre, the all-gather of the next unit is issued while the current unit
  // is in backward.
  StrategyConfig pre = fsdp(Sharding::Full);
  pre.prefetch = Prefetch::BackwardPre;
  StrategyConfig none = fsdp(Sharding::Full);
  none.prefetch = Prefetch::None;
  Schedule a = run_schedule(pre, 4), b = run_schedule(none, 4);
  EXPECT_EQ(a.rec.count(OpKind::AllGather, Phase::Backward), b.rec.count(OpKind::AllGather, Phase::Backward));
  // Prefetching holds one more gathered unit at a time.
  EXPECT_GT(a.peak[int(MemCategory::CommBuffers)], b.peak[int(MemCategory::CommBuffers)]);
}

// Mixed precision: the collectives move param-dtype (gathers) and reduce-dtype (reductions)
// bytes; master parameters and Adam state stay fp32; the gathered units shrink.
TEST(Schedule, MixedPrecisionMovesAndKeepsTheRightBytes) {
  const ModelSpec spec = model_preset("t5-small");
  const double M = padded_bytes(spec, 4);  // fp32 bytes of the padded model
  for (DType reduce : {DType::BF16, DType::F32}) {
    StrategyConfig c = fsdp(Sharding::Full);
    c.param_dtype = DType::BF16;
    c.reduce_dtype = reduce;
    Schedule s = run_schedule(c, 4);
    Schedule f32 = run_schedule(fsdp(Sharding::Full), 4);
    EXPECT_EQ(s.rec.bytes(OpKind::AllGather) * 2, f32.rec.bytes(OpKind::AllGather));
    EXPECT_EQ(s.rec.bytes(OpKind::ReduceScatter), M / 4 * dtype_size(reduce));
    EXPECT_EQ(s.peak[int(MemCategory::Parameters)], M / 4);          // fp32 master shards
    EXPECT_EQ(s.peak[int(MemCategory::OptimizerState)], 2 * M / 4);  // fp32 Adam
    EXPECT_EQ(s.peak[int(MemCategory::Gradients)], M / 4 / 4 * dtype_size(reduce));
    EXPECT_LT(s.peak[int(MemCategory::CommBuffers)], f32.peak[int(MemCategory::CommBuffers)]);
    EXPECT_LT(s.peak[int(MemCategory::Activations)], f32.peak[int(MemCategory::Activations)]);
  }
  // DDP: an fp32 master plus a bf16 copy; bf16 gradient buckets, all-reduced in fp32 from a
  // second buffer when the reduce dtype is fp32.
  StrategyConfig d;
  d.kind = StrategyKind::DDP;
  d.param_dtype = DType::BF16;
  d.reduce_dtype = DType::F32;
  Schedule s = run_schedule(d, 4);
  const int64_t P = param_count(spec);
  EXPECT_EQ(s.peak[int(MemCategory::Parameters)], P * (4 + 2));
  EXPECT_EQ(s.peak[int(MemCategory::Gradients)], P * (2 + 4));
  EXPECT_EQ(s.rec.bytes(OpKind::AllReduce), P * 4);
}

// ---- the schedules as PyTorch runs them, read from the issued operations ----

namespace {

// Position in `all` of the collective with this request.
size_t issued_at(const Collected& c, int64_t request) {
  for (size_t i = 0; i < c.all.size(); ++i)
    if (is_communication(c.all[i].kind) && c.all[i].request == request) return i;
  ADD_FAILURE() << "no collective with request " << request;
  return c.all.size();
}
// Position of the last backward GEMM.
size_t last_backward_gemm(const Collected& c) {
  size_t last = 0;
  for (size_t i = 0; i < c.all.size(); ++i)
    if (c.all[i].kind == OpKind::Gemm && c.all[i].phase == Phase::Backward) last = i;
  return last;
}
// Waits on reduce-scatters, as (position of the wait, position of that reduce-scatter).
std::vector<std::pair<size_t, size_t>> scatter_waits(const Collected& c) {
  std::vector<std::pair<size_t, size_t>> out;
  for (size_t i = 0; i < c.all.size(); ++i)
    if (c.all[i].kind == OpKind::Wait) {
      const size_t at = issued_at(c, c.all[i].request);
      if (c.all[at].kind == OpKind::ReduceScatter) out.push_back({i, at});
    }
  return out;
}

}  // namespace

// ZeRO-1 (optimizer-state): the whole parameters and gradients in the param dtype on every
// rank, the fp32 master (apart only in mixed precision), Adam and the reduced gradient
// sharded; one reduce-scatter per unit in backward (waited on at its end), no gathers in
// forward or backward, one all-gather per unit after the update. ZeRO's bytes per
// parameter: 2 + 2 + 12/N mixed precision, plus the gradient shard.
TEST(Schedule, Zero1ShardsOnlyTheOptimizer) {
  const ModelSpec spec = model_preset("t5-small");
  const double M = padded_bytes(spec, 4);  // fp32 bytes of the model padded to 4 shards
  for (DType dtype : {DType::F32, DType::BF16}) {
    SCOPED_TRACE(precision_name(dtype));
    StrategyConfig c = fsdp(Sharding::OptimizerState);
    c.param_dtype = c.reduce_dtype = dtype;
    Schedule s = run_schedule(c, 4);
    const double es = dtype_size(dtype);
    EXPECT_EQ(s.peak[int(MemCategory::Parameters)], M / 4 * es + (dtype == DType::F32 ? 0 : M / 4));
    EXPECT_EQ(s.peak[int(MemCategory::Gradients)], M / 4 * es + M / 4 / 4 * es);
    EXPECT_EQ(s.peak[int(MemCategory::OptimizerState)], 2 * M / 4);
    EXPECT_EQ(s.rec.count(OpKind::AllGather, Phase::Forward) + s.rec.count(OpKind::AllGather, Phase::Backward), 0);
    EXPECT_EQ(s.rec.count(OpKind::AllGather, Phase::Optimizer), s.units);
    EXPECT_EQ(s.rec.count(OpKind::ReduceScatter, Phase::Backward), s.units);
    EXPECT_EQ(s.rec.bytes(OpKind::ReduceScatter), M / 4 * es);
    EXPECT_EQ(s.rec.bytes(OpKind::AllGather), M / 4 * es);
    const auto waits = scatter_waits(s.rec);
    EXPECT_EQ(int(waits.size()), s.units);
    for (const auto& [wait, scatter] : waits) EXPECT_GT(wait, last_backward_gemm(s.rec));
  }
  // --zero-stage's numbers are these strategies
  EXPECT_EQ(sharding_of_zero_level(0), Sharding::None);
  EXPECT_EQ(sharding_of_zero_level(1), Sharding::OptimizerState);
  EXPECT_EQ(sharding_of_zero_level(2), Sharding::GradOp);
  EXPECT_EQ(sharding_of_zero_level(3), Sharding::Full);
  for (int st = 0; st <= 3; ++st) EXPECT_EQ(zero_level(sharding_of_zero_level(st)), st);
  EXPECT_THROW(sharding_of_zero_level(4), UsageError);
}

// FSDP1 (default): no compute waits on a reduce-scatter before backward ends: every
// reduce-scatter is waited on once, after the last backward GEMM and the last
// reduce-scatter. FSDP2: before each unit's reduce-scatter, compute waits for the
// previous unit's.
TEST(Schedule, Fsdp1WaitsForReduceScattersOnlyAtTheEndOfBackward) {
  for (Sharding sh : {Sharding::Full, Sharding::Hybrid, Sharding::GradOp}) {
    SCOPED_TRACE(sharding_name(sh));
    StrategyConfig c = fsdp(sh, sh == Sharding::Hybrid ? 2 : 0);
    Schedule v1 = run_schedule(c, 4);
    const auto w1 = scatter_waits(v1.rec);
    std::vector<size_t> scatters;
    for (size_t i = 0; i < v1.rec.all.size(); ++i)
      if (v1.rec.all[i].kind == OpKind::ReduceScatter) scatters.push_back(i);
    ASSERT_EQ(int(scatters.size()), v1.units);
    EXPECT_EQ(int(w1.size()), v1.units);
    for (const auto& [wait, scatter] : w1) {
      EXPECT_GT(wait, last_backward_gemm(v1.rec));
      EXPECT_GT(wait, scatters.back());
    }
    c.fsdp_version = 2;
    Schedule v2 = run_schedule(c, 4);
    const auto w2 = scatter_waits(v2.rec);
    ASSERT_EQ(int(w2.size()), v2.units);
    for (size_t k = 0; k + 1 < w2.size(); ++k) {  // waited on before the next one is issued
      size_t next = w2[k].second + 1;
      while (v2.rec.all[next].kind != OpKind::ReduceScatter) ++next;
      EXPECT_LT(w2[k].first, next);
    }
    int before_compute = 0;
    for (const auto& [wait, scatter] : w2) before_compute += wait < last_backward_gemm(v2.rec);
    EXPECT_GT(before_compute, 0);
  }
}

// FSDP1 releases each unsharded gradient as its reduce-scatter is issued (stream-ordered);
// FSDP2 keeps the previous one until compute has waited for it, so it holds more.
TEST(Schedule, Fsdp2HoldsThePreviousUnshardedGradient) {
  StrategyConfig c = fsdp(Sharding::Full);
  Schedule v1 = run_schedule(c, 4);
  c.fsdp_version = 2;
  Schedule v2 = run_schedule(c, 4);
  EXPECT_LT(v1.peak[int(MemCategory::CommBuffers)], v2.peak[int(MemCategory::CommBuffers)]);
}

// Hybrid: each all-reduce is stream-ordered after the reduce-scatter of the same unit and
// issued right after it, with nothing on the compute lane in between.
TEST(Schedule, HybridAllReduceIsStreamOrderedAfterItsReduceScatter) {
  for (int version : {1, 2}) {
    StrategyConfig c = fsdp(Sharding::Hybrid, 2);
    c.fsdp_version = version;
    Schedule s = run_schedule(c, 8);
    int checked = 0;
    for (size_t i = 0; i < s.rec.all.size(); ++i) {
      const OpEvent& ar = s.rec.all[i];
      if (ar.kind != OpKind::AllReduce) continue;
      ASSERT_GE(ar.after, 0) << "all-reduce of unit " << ar.unit << " not stream-ordered";
      const OpEvent& rs = s.rec.all[issued_at(s.rec, ar.after)];
      EXPECT_EQ(rs.kind, OpKind::ReduceScatter);
      EXPECT_EQ(rs.unit, ar.unit);
      EXPECT_EQ(issued_at(s.rec, ar.after), i - 1) << "unit " << ar.unit;
      EXPECT_EQ(ar.ranks, 4);
      EXPECT_EQ(rs.ranks, 2);
      ++checked;
    }
    EXPECT_EQ(checked, s.units);
  }
}

// A collective names the unit it gathers or reduces: in backward every block is gathered
// once and every unit reduced once, whatever piece issued the (prefetched) all-gather.
TEST(Schedule, CollectivesNameTheirTargetUnit) {
  for (Prefetch p : {Prefetch::BackwardPre, Prefetch::BackwardPost, Prefetch::None}) {
    SCOPED_TRACE(prefetch_name(p));
    StrategyConfig c = fsdp(Sharding::Full);
    c.prefetch = p;
    c.forward_prefetch = true;
    Schedule s = run_schedule(c, 4);
    std::map<std::pair<int, int>, int> seen;  // (op, phase, unit) counts
    std::vector<int> gathered_fwd, gathered_bwd, reduced;
    for (const OpEvent& e : s.rec.comm) {
      if (e.kind == OpKind::AllGather) (e.phase == Phase::Forward ? gathered_fwd : gathered_bwd).push_back(e.unit);
      if (e.kind == OpKind::ReduceScatter) reduced.push_back(e.unit);
    }
    std::vector<int> all, blocks;  // every unit; the blocks (the others are kept from forward)
    for (int u = 0; u < s.units; ++u) {
      all.push_back(u);
      if (is_block(model_units(model_preset("t5-small"))[size_t(u)].kind)) blocks.push_back(u);
    }
    std::sort(gathered_fwd.begin(), gathered_fwd.end());
    std::sort(gathered_bwd.begin(), gathered_bwd.end());
    std::sort(reduced.begin(), reduced.end());
    EXPECT_EQ(gathered_fwd, all);
    EXPECT_EQ(gathered_bwd, blocks);
    EXPECT_EQ(reduced, all);
  }
  // Prefetched: the all-gather issued during a piece names the next unit, not the piece's.
  Schedule s = run_schedule(fsdp(Sharding::Full), 4);
  int prefetched = 0;
  for (size_t i = 1; i < s.rec.all.size(); ++i) {
    const OpEvent& e = s.rec.all[i];
    if (e.kind != OpKind::AllGather || e.phase != Phase::Backward) continue;
    for (size_t j = i; j-- > 0;)  // the piece issuing it: the unit of the latest compute op
      if (s.rec.all[j].kind == OpKind::Gemm) {
        prefetched += s.rec.all[j].unit != e.unit;
        break;
      }
  }
  EXPECT_GT(prefetched, 0);
}

// DDP as PyTorch's Reducer: each tensor is ready as its gradient is produced, buckets take
// tensors in the order backward produces them, the first closing at 1 MiB. In t5-small (tied)
// the head's decoder.final_norm (d_model) is produced first, then the last decoder block's
// wo (d_model × d_ff fp32 = 4 MiB), by the block's first backward GEMM, so the first bucket
// is those two tensors and its all-reduce is issued right after that GEMM, before the rest
// of the block's backward.
TEST(Schedule, DdpBucketsFollowGradientProduction) {
  const ModelSpec spec = model_preset("t5-small");
  StrategyConfig c;
  c.kind = StrategyKind::DDP;
  Schedule s = run_schedule(c, 4);
  const int last = s.units - 2;  // the last decoder block (the head is the last unit)
  size_t first_ar = 0;
  while (s.rec.all[first_ar].kind != OpKind::AllReduce) ++first_ar;
  const OpEvent& ar = s.rec.all[first_ar];
  EXPECT_EQ(ar.bytes, (spec.d_model * spec.d_ff + spec.d_model) * 4);
  EXPECT_EQ(ar.unit, last);
  int gemms_of_last = 0;  // backward GEMMs of the last block before the all-reduce
  for (size_t i = 0; i < first_ar; ++i)
    gemms_of_last += s.rec.all[i].kind == OpKind::Gemm && s.rec.all[i].phase == Phase::Backward &&
                     s.rec.all[i].unit == last;
  EXPECT_EQ(gemms_of_last, 1);
  // Every later bucket (25 MiB cap, whole tensors) is issued as soon as it is full, during
  // the backward of the unit that completed it, except the last (the shared embedding).
  int during = 0, buckets = 0;
  for (size_t i = first_ar; i < s.rec.all.size(); ++i) {
    if (s.rec.all[i].kind != OpKind::AllReduce) continue;
    ++buckets;
    for (size_t j = i + 1; j < s.rec.all.size(); ++j)
      if (s.rec.all[j].kind == OpKind::Gemm && s.rec.all[j].phase == Phase::Backward) {
        during += s.rec.all[j].unit == s.rec.all[i].unit;
        break;
      }
  }
  EXPECT_GE(buckets, 3);
  EXPECT_GE(during, 1);
  EXPECT_EQ(s.rec.bytes(OpKind::AllReduce), param_count(spec) * 4);
}

// Bytes sent per rank, nccl-tests' bus convention.
TEST(Schedule, BytesSentFollowTheBusBandwidthFactors) {
  auto ev = [](OpKind k, int64_t bytes, int ranks) {
    OpEvent e{k, Phase::Backward, 0, 1, 0.0, 0.0, bytes, 0.0, {0, 0, 0, 0, 0}};
    e.ranks = ranks;
    return bytes_sent(e);
  };
  EXPECT_EQ(ev(OpKind::AllGather, 4000, 4), 3000);
  EXPECT_EQ(ev(OpKind::ReduceScatter, 4000, 4), 3000);
  EXPECT_EQ(ev(OpKind::AllReduce, 4000, 4), 6000);
  EXPECT_EQ(ev(OpKind::AllReduce, 1000, 3), 1333);  // 2·1000·2/3, nearest byte
  EXPECT_EQ(ev(OpKind::AllToAll, 4000, 4), 3000);
  EXPECT_EQ(ev(OpKind::Broadcast, 4000, 4), 4000);
  EXPECT_EQ(ev(OpKind::AllReduce, 4000, 1), 0);
  EXPECT_EQ(ev(OpKind::Gemm, 4000, 4), 0);
  // Hybrid (groups of 2, 2 replicas) sends less than full sharding on 4 ranks, although
  // its buffers add up to more.
  auto sent = [](const Schedule& s) {
    int64_t n = 0, buffers = 0;
    for (const OpEvent& e : s.rec.comm) n += bytes_sent(e), buffers += e.bytes;
    return std::make_pair(n, buffers);
  };
  const auto full = sent(run_schedule(fsdp(Sharding::Full), 4));
  const auto hybrid = sent(run_schedule(fsdp(Sharding::Hybrid, 2), 4));
  EXPECT_LT(hybrid.first, full.first);
  EXPECT_GT(hybrid.second, full.second);
}

// --optimizer: one state buffer of optimizer_state_layout's bytes over the regions the
// strategy updates (adamw-8bit: DDP's units, FSDP's units' shards, padded to whole blocks of
// 256 so a shard's blocks are the unit's; adamw and sgd: all of them as one region, one call).
TEST(Schedule, OptimizerStatePerOptimizer) {
  const ModelSpec spec = model_preset("t5-small");
  for (OptimizerKind k : {OptimizerKind::AdamW, OptimizerKind::AdamW8bit, OptimizerKind::Sgd})
    for (bool ddp : {true, false}) {
      SCOPED_TRACE(std::string(optimizer_name(k)) + (ddp ? " ddp" : " fsdp full"));
      StrategyConfig c = ddp ? StrategyConfig{} : fsdp(Sharding::Full);
      if (ddp) c.kind = StrategyKind::DDP;
      c.optimizer.kind = k;
      const int G = ddp ? 1 : 4;
      std::vector<int64_t> regions;
      int64_t params = 0;
      for (const UnitSpec& u : model_units(spec)) {
        const ShardInfo s = shard_of(u.numel, G, 0, optimizer_region_alignment(c.optimizer));
        if (k == OptimizerKind::AdamW8bit && !ddp) {
          EXPECT_EQ(s.size % 256, 0);
        }
        regions.push_back(ddp ? u.numel : s.size);
        params += regions.back();
      }
      Schedule s = run_schedule(c, 4);
      EXPECT_EQ(s.peak[int(MemCategory::OptimizerState)], optimizer_state_layout(c.optimizer, regions).bytes);
      EXPECT_EQ(s.peak[int(MemCategory::Parameters)], 4 * params);
      int updates = 0;
      for (const OpEvent& e : s.rec.all) updates += e.kind == OpKind::Optimizer;
      EXPECT_EQ(updates, k == OptimizerKind::AdamW8bit ? s.units : 1);  // elementwise: one call, as before
    }
  // The state per parameter: adamw 8 bytes, sgd 4, adamw-8bit about 2.03.
  StrategyConfig c = fsdp(Sharding::Full);
  const double adamw = double(run_schedule(c, 4).peak[int(MemCategory::OptimizerState)]);
  c.optimizer.kind = OptimizerKind::Sgd;
  EXPECT_NEAR(double(run_schedule(c, 4).peak[int(MemCategory::OptimizerState)]) / adamw, 0.5, 1e-3);
  c.optimizer.kind = OptimizerKind::AdamW8bit;
  EXPECT_NEAR(double(run_schedule(c, 4).peak[int(MemCategory::OptimizerState)]) / adamw, (2 + 8.0 / 256) / 8, 2e-3);
}

// ---------------------------------------------------------------- nodes (core/nodes.h)
namespace {
NodeMap hosts_of(std::initializer_list<const char*> per_rank) {
  return NodeMap::from_hosts(std::vector<std::string>(per_rank.begin(), per_rank.end()), 0);
}
StrategyConfig hybrid(int tp = 1, int pp = 1) {
  StrategyConfig c = fsdp(Sharding::Hybrid);
  c.tp = tp, c.pp = pp;
  return c;
}
// The layout Setup::make gives `c` on `world` ranks (of a model any layout here fits).
ParallelLayout layout_of(const StrategyConfig& c, int world) {
  return Setup::make(c, model_preset("t5-small"), StepShape{2, 16, 12}, world).layout;
}
std::string usage_error(const std::function<void()>& f) {
  try {
    f();
  } catch (const UsageError& e) {
    return e.what();
  }
  return "";
}
}  // namespace

TEST(Nodes, HostNamesMakeTheNodes) {
  const NodeMap m = hosts_of({"node1", "node1", "node2", "node2", "node3", "node3", "node4", "node4"});
  EXPECT_EQ(m.nodes(), 4);
  EXPECT_EQ(m.node_of, (std::vector<int>{0, 0, 1, 1, 2, 2, 3, 3}));
  EXPECT_EQ(m.hosts, (std::vector<std::string>{"node1", "node2", "node3", "node4"}));
  EXPECT_TRUE(m.uniform());
  EXPECT_TRUE(m.node_major());
  EXPECT_EQ(m.max_ranks_per_node(), 2);
  EXPECT_EQ(m.spans({2, 3}), "");
  EXPECT_EQ(m.spans({1, 2}), "ranks 1,2 on node1 and node2");
  NodeMap r = NodeMap::from_hosts({"b", "a", "b", "a", "b"}, 3);  // round robin, 3 + 2
  EXPECT_EQ(r.node(), 1);
  EXPECT_EQ(r.local_rank(), 1);
  EXPECT_EQ(r.local_ranks(), 2);
  EXPECT_FALSE(r.node_major());
  EXPECT_FALSE(r.uniform());
  EXPECT_EQ(r.max_ranks_per_node(), 3);
}

// Hybrid without --shard-size: one node's data-parallel ranks, whatever else the layout holds.
TEST(Nodes, HybridShardsOverOneNodesDataParallelRanks) {
  const NodeMap four_by_two = hosts_of({"n1", "n1", "n2", "n2", "n3", "n3", "n4", "n4"});
  EXPECT_EQ(node_shard_size(hybrid(), four_by_two), 2);
  EXPECT_EQ(node_shard_size(hybrid(2), four_by_two), 1);     // a node is one tensor-parallel group
  EXPECT_EQ(node_shard_size(hybrid(1, 2), four_by_two), 2);  // stages of two nodes each
  EXPECT_EQ(node_shard_size(hybrid(1, 8), four_by_two), 1);  // a stage is one rank
  const NodeMap two_by_four = hosts_of({"a", "a", "a", "a", "b", "b", "b", "b"});
  EXPECT_EQ(node_shard_size(hybrid(2), two_by_four), 2);
  EXPECT_EQ(node_shard_size(hybrid(1, 4), two_by_four), 2);  // a node holds two stages of two ranks
  EXPECT_EQ(node_shard_size(hybrid(), hosts_of({"a", "a", "a"})), 3);  // one node: full sharding
  // The groups it gives stay inside a node, and nothing is flagged.
  StrategyConfig c = hybrid();
  c.shard_size = node_shard_size(c, four_by_two);
  const ParallelLayout l = layout_of(c, 8);
  for (int r = 0; r < 8; ++r) EXPECT_EQ(four_by_two.spans(l.at_rank(r).group(Axis::Shard)), "") << r;
  EXPECT_EQ(placement_warning(l, four_by_two, c), "");
}

TEST(Nodes, HybridWithoutASizeRefusesNodesThatCannotHoldItsGroups) {
  const auto refused = [](const StrategyConfig& c, const NodeMap& m) {
    return usage_error([&] { node_shard_size(c, m); });
  };
  const std::string round_robin = refused(hybrid(), hosts_of({"n1", "n2", "n1", "n2"}));
  EXPECT_NE(round_robin.find("not placed node by node (rank 2 is on n1 after rank 1 on n2"), std::string::npos)
      << round_robin;
  EXPECT_NE(round_robin.find("give --shard-size G"), std::string::npos);
  EXPECT_NE(refused(hybrid(), hosts_of({"a", "a", "a", "b"})).find("different numbers of ranks"), std::string::npos);
  EXPECT_NE(refused(hybrid(4), hosts_of({"a", "a", "b", "b", "c", "c", "d", "d"})).find("whole --tp 4 groups"),
            std::string::npos);
  // 3 ranks a node, stages of 2: a node holds a stage and a half.
  EXPECT_NE(refused(hybrid(1, 3), hosts_of({"a", "a", "a", "b", "b", "b"})).find("pipeline stages"),
            std::string::npos);
  // A plan has no nodes.
  EXPECT_NE(usage_error([] { layout_of(hybrid(), 8); }).find("needs --shard-size G"), std::string::npos);
}

TEST(Nodes, PlacementWarningNamesAGroupThatCrossesNodes) {
  const NodeMap round_robin = hosts_of({"n1", "n2", "n1", "n2"});
  StrategyConfig c = hybrid();
  c.shard_size = 2;
  EXPECT_EQ(placement_warning(layout_of(c, 4), round_robin, c),
            "a hybrid shard group crosses nodes: ranks 0,1 on n1 and n2 (its all-gathers leave the node)");
  c.shard_size = 4;  // larger than a node: crossing is the point
  EXPECT_EQ(placement_warning(layout_of(c, 4), round_robin, c), "");
  StrategyConfig t = fsdp(Sharding::Full);
  t.tp = 2;
  EXPECT_NE(placement_warning(layout_of(t, 4), round_robin, t).find("a tensor-parallel group crosses nodes"),
            std::string::npos);
  EXPECT_EQ(placement_warning(layout_of(t, 4), hosts_of({"n1", "n1", "n2", "n2"}), t), "");
}
