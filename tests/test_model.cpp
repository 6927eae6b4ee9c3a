// Model description: parameter counts agree with Hugging Face's T5, FLOP formulas, unit
// layouts, shard arithmetic and the parallel layout's validation.
#include <gtest/gtest.h>

#include "shardbench/core/check.h"
#include "shardbench/core/format.h"
#include "shardbench/strategy/layout.h"
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
