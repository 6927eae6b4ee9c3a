// Model description: parameter counts agree with Hugging Face's T5, FLOP formulas, unit
// layouts, shard arithmetic and the parallel layout's validation.
#include <gtest/gtest.h>

#include <map>
#include <string>
#include <vector>

#include "shardbench/core/check.h"
#include "shardbench/core/format.h"
#include "shardbench/backend/layout.h"
#include "shardbench/model/model.h"

using namespace sb;

TEST(Model, ParameterCountsMatchHuggingFace) {
  // Hugging Face T5ForConditionalGeneration(config).num_parameters() for these configs.
  EXPECT_EQ(param_count(model_preset("t5-611m")), 611838976);
  EXPECT_EQ(param_count(model_preset("t5-2.28b")), 2280642560);
  EXPECT_EQ(param_count(model_preset("t5-11.3b")), 11307321344);
  ModelSpec large = model_preset("t5-611m");
  large.d_ff = 4096;  // t5-large
  EXPECT_EQ(param_count(large), 737668096);
  EXPECT_EQ(with_commas(param_count(model_preset("t5-611m"))), "611,838,976");
}

TEST(Model, UnknownPresetNamesAllowedOnes) {
  try {
    model_preset("t5-huge");
    FAIL() << "expected UsageError";
  } catch (const UsageError& e) {
    EXPECT_NE(std::string(e.what()).find("t5-huge"), std::string::npos);
    EXPECT_NE(std::string(e.what()).find("t5-611m"), std::string::npos);
  }
  ModelSpec s = model_preset("t5-tiny");
  s.heads = 0;
  EXPECT_THROW(validate(s), UsageError);
}

TEST(Model, UnitsTileTheirFlatParameter) {
  const ModelSpec s = model_preset("t5-small");
  const auto units = model_units(s);
  ASSERT_EQ(units.size(), size_t(1 + 2 * s.layers));
  EXPECT_EQ(units[0].kind, UnitKind::Root);
  EXPECT_EQ(units[1].kind, UnitKind::EncoderBlock);
  EXPECT_EQ(units[1 + s.layers].kind, UnitKind::DecoderBlock);
  for (const auto& u : units) {
    int64_t next = 0;
    for (const auto& t : u.tensors) {
      EXPECT_EQ(t.offset, next) << u.name << "." << t.name;
      next += t.numel();
    }
    EXPECT_EQ(next, u.numel);
  }
  // The relative attention bias lives in the first block of each stack only.
  EXPECT_NO_THROW(units[1].tensor("rel_bias"));
  EXPECT_NO_THROW(units[1 + s.layers].tensor("rel_bias"));
  EXPECT_EQ(units[2].numel + s.num_buckets * s.heads, units[1].numel);
}

TEST(Model, FlopsFormula) {
  ModelSpec s = model_preset("t5-tiny");
  StepShape x{3, 7, 5};
  const double d = s.d_model, f = s.d_ff, in = s.inner(), h = s.heads, k = s.d_kv;
  const double N = 21, Nd = 15;
  const double enc = 2 * N * in * d * 4 + 2 * 2 * 3 * h * 7 * 7 * k + 2 * 2 * N * d * f;
  const double dec = 2 * Nd * in * d * 4 + 2 * 2 * 3 * h * 5 * 5 * k        // self
                     + 2 * Nd * in * d * 2 + 2 * N * in * d * 2 + 2 * 2 * 3 * h * 5 * 7 * k  // cross
                     + 2 * 2 * Nd * d * f;
  EXPECT_DOUBLE_EQ(forward_flops_encoder_block(s, x), enc);
  EXPECT_DOUBLE_EQ(forward_flops_decoder_block(s, x), dec);
  EXPECT_DOUBLE_EQ(forward_flops(s, x), s.layers * (enc + dec) + 2 * Nd * d * s.vocab);
  EXPECT_DOUBLE_EQ(model_flops_per_step(s, x), 3 * forward_flops(s, x));
  EXPECT_DOUBLE_EQ(hardware_flops_per_step(s, x, true), 3 * forward_flops(s, x) + s.layers * (enc + dec));
}

TEST(Layout, ShardArithmetic) {
  ShardInfo a = shard_of(10, 4, 3);
  EXPECT_EQ(a.size, 3);
  EXPECT_EQ(a.padded, 12);
  EXPECT_EQ(a.offset, 9);
  ShardInfo b = shard_of(12, 4, 1);
  EXPECT_EQ(b.padded, 12);
  EXPECT_EQ(b.offset, 3);
  ShardInfo c = shard_of(5, 1, 0);
  EXPECT_EQ(c.size, 5);
  EXPECT_EQ(c.padded, 5);
}

TEST(Layout, ValidatesAndGroupsConsecutiveRanks) {
  ParallelLayout l = ParallelLayout::make(8, 5, 4);
  EXPECT_EQ(l.replicate, 2);
  EXPECT_EQ(l.shard_rank(), 1);      // ranks 4..7 form the second shard group
  EXPECT_EQ(l.replicate_rank(), 1);
  EXPECT_THROW(ParallelLayout::make(8, 0, 3), UsageError);
  EXPECT_THROW(ParallelLayout::make(8, 0, 0), UsageError);
  EXPECT_THROW(ParallelLayout::make(4, 0, 8), UsageError);
  try {
    ParallelLayout::make(6, 0, 4);
  } catch (const UsageError& e) {
    EXPECT_NE(std::string(e.what()).find("shard size 4"), std::string::npos);
    EXPECT_NE(std::string(e.what()).find("world size 6"), std::string::npos);
  }
}

namespace sb {
namespace {

// The rank order: tensor innermost, then shard, replicate, pipeline; every rank in exactly
// one group per axis, groups of the axis's size, members differing in that coordinate only.
TEST(Layout, RankOrderAndGroupsPerAxis) {
  const ParallelLayout l0 = ParallelLayout::make(16, 0, /*shard=*/2, /*tp=*/2, /*pp=*/2);
  EXPECT_EQ(l0.replicate, 2);
  EXPECT_EQ(l0.dp(), 4);
  const ParallelLayout l5 = l0.at_rank(5);  // pp 0, replicate 1, shard 0, tp 1
  EXPECT_EQ(l5.pp_rank(), 0);
  EXPECT_EQ(l5.replicate_rank(), 1);
  EXPECT_EQ(l5.shard_rank(), 0);
  EXPECT_EQ(l5.tp_rank(), 1);
  EXPECT_EQ(l5.dp_rank(), 2);
  EXPECT_EQ(l5.group(Axis::Tensor), (std::vector<int>{4, 5}));      // consecutive
  EXPECT_EQ(l5.group(Axis::Shard), (std::vector<int>{5, 7}));       // strided by tp
  EXPECT_EQ(l5.group(Axis::Replicate), (std::vector<int>{1, 5}));   // strided by shard × tp
  EXPECT_EQ(l5.group(Axis::Pipeline), (std::vector<int>{5, 13}));   // stages outermost
  for (int a = 0; a < kAxes; ++a) {
    std::map<int, std::vector<int>> by_index;
    for (int r = 0; r < 16; ++r) {
      const ParallelLayout l = l0.at_rank(r);
      EXPECT_EQ(l.rank_at(l.coords()), r);
      by_index[l.group_index(Axis(a))].push_back(r);
      const std::vector<int> g = l.group(Axis(a));
      EXPECT_EQ(int(g.size()), l.size(Axis(a)));
      EXPECT_EQ(g[size_t(l.coord(Axis(a)))], r);
    }
    EXPECT_EQ(int(by_index.size()), 16 / l0.size(Axis(a))) << axis_name(Axis(a));
    for (const auto& [index, ranks] : by_index) EXPECT_EQ(ranks, l0.at_rank(ranks[0]).group(Axis(a)));
  }
}

TEST(Layout, TensorParallelSizesMustDivide) {
  EXPECT_NO_THROW(ParallelLayout::make(8, 0, 4, 2));
  EXPECT_THROW(ParallelLayout::make(8, 0, 1, 3), UsageError);  // tp does not divide the world
  EXPECT_THROW(ParallelLayout::make(8, 0, 8, 2), UsageError);  // shard > data-parallel ranks
  try {
    ParallelLayout::make(8, 0, 3, 2);
    FAIL();
  } catch (const UsageError& e) {
    EXPECT_NE(std::string(e.what()).find("shard size 3"), std::string::npos) << e.what();
    EXPECT_NE(std::string(e.what()).find("4 data-parallel ranks"), std::string::npos) << e.what();
  }
}

// The parts of a tensor-parallel group tile every split tensor exactly once and hold the
// replicated ones whole; the parameters per rank are the split tensors / tp plus the norms.
TEST(Model, TensorParallelPartsTileTheFullModel) {
  const ModelSpec s = model_preset("t5-small");
  const auto full = model_units(s);
  for (int tp : {2, 4}) {
    std::vector<std::vector<float>> covered;
    for (const UnitSpec& u : full) covered.emplace_back(u.numel, 0.f);
    int64_t replicated = 0, split = 0;
    for (int r = 0; r < tp; ++r) {
      const auto part = model_units(s, {tp, r});
      ASSERT_EQ(part.size(), full.size());
      for (size_t k = 0; k < full.size(); ++k) {
        std::vector<float> ones(part[k].numel, 1.f), placed(full[k].numel, 0.f);
        place_in_full_unit(part[k], full[k], ones.data(), placed.data());
        for (const TensorSpec& t : part[k].tensors)
          for (int64_t i = 0; i < full[k].tensor(t.name).numel(); ++i)
            covered[k][full[k].tensor(t.name).offset + i] += t.split() ? placed[full[k].tensor(t.name).offset + i]
                                                                       : (r == 0 ? 1.f : 0.f);
        if (r == 0)
          for (const TensorSpec& t : part[k].tensors) (t.split() ? split : replicated) += t.numel();
      }
    }
    for (size_t k = 0; k < full.size(); ++k)
      for (float c : covered[k]) ASSERT_EQ(c, 1.f) << "tp " << tp << " unit " << full[k].name;
    EXPECT_EQ(param_count_per_rank(s, tp), split + replicated);
    EXPECT_EQ(param_count(s), split * tp + replicated);
  }
}

TEST(Model, TensorParallelNamesTheDimensionThatDoesNotDivide) {
  const ModelSpec s = model_preset("t5-611m");  // 16 heads
  try {
    check_tensor_parallel(s, 3);
    FAIL();
  } catch (const UsageError& e) {
    EXPECT_EQ(std::string(e.what()),
              "--tp 3 is not allowed with heads 16 (the heads, d_ff and vocab must divide by --tp; heads 16 divides "
              "by 1, 2, 4, 8, 16)");
  }
  EXPECT_NO_THROW(check_tensor_parallel(s, 8));
  ModelSpec odd = s;
  odd.d_ff = 2817;
  EXPECT_THROW(check_tensor_parallel(odd, 2), UsageError);
}

// A rank's FLOPs are the model's / tp: every matmul is split.
TEST(Model, TensorParallelFlopsAreTheModelsShare) {
  const ModelSpec s = model_preset("t5-small");
  const StepShape x{3, 7, 5};
  for (int tp : {2, 4}) {
    EXPECT_DOUBLE_EQ(forward_flops(s, x, tp) * tp, forward_flops(s, x));
    EXPECT_DOUBLE_EQ(hardware_flops_per_step(s, x, true, tp) * tp, hardware_flops_per_step(s, x, true));
  }
}

}  // namespace
}  // namespace sb
