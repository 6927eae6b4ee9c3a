// Strategy schedules, read from the counting backend: which collectives each strategy
// issues per step, of what size, in which phase, and what memory each keeps.
#include <gtest/gtest.h>

#include <map>

#include "shardbench/backend.h"
#include "shardbench/layout.h"
#include "shardbench/strategy.h"

using namespace sb;

namespace {

struct Collected : Recorder {
  std::vector<OpEvent> comm;
  void on_op(const OpEvent& e) override {
    if (is_communication(e.kind)) comm.push_back(e);
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
  Mesh mesh = Mesh::planned(ParallelLayout::make(world, 0, shard_group_size(cfg, world)));
  auto strategy = make_strategy(cfg, spec, *b, mesh, shape);
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

TEST(Schedule, FullShardingGathersTwiceExceptRoot) {
  const ModelSpec spec = model_preset("t5-small");
  Schedule s = run_schedule(fsdp(Sharding::Full), 4);
  const int blocks = s.units - 1;
  EXPECT_EQ(s.rec.count(OpKind::AllGather, Phase::Forward), s.units);
  EXPECT_EQ(s.rec.count(OpKind::AllGather, Phase::Backward), blocks);  // root kept from forward
  EXPECT_EQ(s.rec.count(OpKind::ReduceScatter, Phase::Backward), s.units);
  EXPECT_EQ(s.rec.bytes(OpKind::AllReduce), 0);
  EXPECT_EQ(s.rec.bytes(OpKind::ReduceScatter), padded_bytes(spec, 4));
  // ZeRO-3 traffic: all-gathers move about 2M, reduce-scatters M (docs/references.md §2: 3M(W−1)/W).
  const double M = padded_bytes(spec, 4);
  const double root = shard_of(model_units(spec)[0].numel, 4, 0).padded * 4.0;
  EXPECT_DOUBLE_EQ(double(s.rec.bytes(OpKind::AllGather)), 2 * M - root);
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
  // Buckets launch during backward, before the step's last stage (overlap), except the
  // one holding the root unit, which completes last.
  int during = 0;
  for (const auto& e : s.rec.comm) during += e.unit > 0;
  EXPECT_GE(during, 1);
}

TEST(Schedule, PrefetchIssuesNextGatherBeforeCurrentCompute) {
  // With backward-pre, the all-gather of the next unit is issued while the current unit
  // is in backward: some backward all-gather carries the unit of the stage issuing it,
  // which differs from the unit gathered.
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
