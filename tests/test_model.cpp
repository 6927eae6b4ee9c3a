// Model description: parameter counts agree with Hugging Face's T5, FLOP formulas, unit
// layouts, shard arithmetic and the parallel layout's validation.
#include <gtest/gtest.h>

#include <map>
#include <set>
#include <string>
#include <tuple>
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

// Hugging Face's T5ForConditionalGeneration, module by module (modeling_t5.py), written
// independently of model_units: shared Embedding(vocab, d_model); each stack a list of
// T5Block, block i holding T5LayerSelfAttention (T5Attention q, k, v [inner, d], o [d, inner],
// no biases; relative_attention_bias Embedding(32, heads) in block 0 only; a T5LayerNorm
// [d]), in the decoder T5LayerCrossAttention (q, k, v, o, norm), then T5LayerFF
// (T5DenseActDense wi, wo or T5DenseGatedActDense wi_0, wi_1, wo; a norm); each stack's
// final_layer_norm; lm_head Linear(d, vocab, bias=False), its own matrix only when untied.
// Each stack's embed_tokens is `shared` (the checkpoints' layout), so counted once.
int64_t hf_t5_parameters(const ModelSpec& s) {
  const int64_t d = s.d_model, inner = s.heads * s.d_kv;
  auto linear = [](int64_t in, int64_t out) { return in * out; };
  auto layer_norm = [&] { return d; };
  auto attention = [&](bool relative_bias) {
    return linear(d, inner) * 3 + linear(inner, d) + (relative_bias ? s.num_buckets * s.heads : 0);
  };
  auto dense = [&] {
    return s.ffn == FfnKind::GatedGelu ? linear(d, s.d_ff) * 2 + linear(s.d_ff, d)
                                       : linear(d, s.d_ff) + linear(s.d_ff, d);
  };
  auto block = [&](int i, bool decoder) {
    int64_t n = attention(i == 0) + layer_norm();     // layer[0]: self-attention
    if (decoder) n += attention(false) + layer_norm();  // layer[1]: cross-attention
    return n + dense() + layer_norm();                  // the feed-forward layer
  };
  int64_t n = s.vocab * d;  // shared
  for (bool decoder : {false, true}) {
    for (int i = 0; i < s.layers; ++i) n += block(i, decoder);
    n += layer_norm();  // final_layer_norm
  }
  if (!s.tie_embeddings) n += linear(d, s.vocab);  // lm_head
  return n;
}

TEST(Model, EveryPresetCountsAsHuggingFaceModules) {
  for (const std::string& name : model_preset_names())
    EXPECT_EQ(param_count(model_preset(name)), hf_t5_parameters(model_preset(name))) << name;
  // The same formula fails a model it was not written for (it can tell them apart).
  ModelSpec s = model_preset("t5-v1_1-small");
  s.tie_embeddings = true;
  EXPECT_EQ(param_count(s), hf_t5_parameters(model_preset("t5-v1_1-small")) - s.vocab * s.d_model);
}

// T5 v1.1 and Flan-T5: Hugging Face's configurations (d_model, d_ff, layers, heads; d_kv 64,
// vocab 32128, gated GELU, untied head), and the released checkpoints' counts: two vocab x
// d_model matrices (shared, lm_head), e.g. t5-v1_1-xl 2,849,757,184 and flan-t5-xxl
// 11,135,332,352. With the head tied they are the counts transformers 5.17 gives
// T5Config(..., tie_word_embeddings=False), which comes back tied (measured on a GPU host,
// small 60,511,616 ... xxl 11,003,736,064); untying the input embeddings too gives four
// matrices (xxl 11,398,524,928). Neither is the checkpoint.
TEST(Model, T5V11AndFlanT5PresetsAreTheReleasedCheckpoints) {
  struct P { const char* size; int64_t d, ff, layers, heads, params, tied_hf; };
  const P want[] = {{"small", 512, 1024, 8, 6, 76961152, 60511616},
                    {"base", 768, 2048, 12, 12, 247577856, 222903552},
                    {"large", 1024, 2816, 24, 16, 783150080, 750251008},
                    {"xl", 2048, 5120, 24, 32, 2849757184, 2783959040},
                    {"xxl", 4096, 10240, 24, 64, 11135332352, 11003736064}};
  for (const char* family : {"t5-v1_1-", "flan-t5-"})
    for (const P& p : want) {
      const std::string name = std::string(family) + p.size;
      const ModelSpec s = model_preset(name);
      EXPECT_EQ(s.name, name);
      EXPECT_EQ(std::make_tuple(s.d_model, s.d_ff, s.layers, s.heads, s.d_kv, s.vocab),
                std::make_tuple(p.d, p.ff, p.layers, p.heads, int64_t(64), int64_t(32128)))
          << name;
      EXPECT_EQ(s.ffn, FfnKind::GatedGelu) << name;
      EXPECT_FALSE(s.tie_embeddings) << name;
      EXPECT_EQ(param_count(s), p.params) << name;
      EXPECT_EQ(param_count(s) - s.vocab * s.d_model, p.tied_hf) << name;
    }
  EXPECT_EQ(param_count(model_preset("flan-t5-xxl")) + 2 * 32128 * 4096, 11398524928);
  EXPECT_EQ(with_commas(param_count(model_preset("t5-v1_1-xl"))), "2,849,757,184");
  // The study's models keep the original block.
  EXPECT_EQ(model_preset("t5-11.3b").ffn, FfnKind::Relu);
  EXPECT_TRUE(model_preset("t5-11.3b").tie_embeddings);
}

TEST(Model, GatedUnitsHoldWi0Wi1AndTheUntiedHeadSitsInTheHeadUnit) {
  const ModelSpec s = model_preset("t5-v1_1-small");
  const auto units = model_units(s);
  auto names = [](const UnitSpec& u) {
    std::vector<std::string> n;
    for (const auto& t : u.tensors) n.push_back(t.name);
    return n;
  };
  const size_t bridge = size_t(1 + s.layers);
  EXPECT_EQ(names(units[0]), std::vector<std::string>{"shared"});
  EXPECT_EQ(names(units[bridge]), std::vector<std::string>{"encoder.final_norm"});
  EXPECT_EQ(names(units.back()), (std::vector<std::string>{"decoder.final_norm", "lm_head"}));
  EXPECT_EQ(units.back().tensor("lm_head").numel(), s.vocab * s.d_model);
  EXPECT_EQ(names(model_units(model_preset("t5-small")).back()), std::vector<std::string>{"decoder.final_norm"});
  for (size_t u = 1; u + 1 < units.size(); ++u) {
    if (u == bridge) continue;
    const auto& t = units[u].tensors;
    ASSERT_GE(t.size(), 3u);
    EXPECT_EQ(t[t.size() - 3].name, "wi_0");
    EXPECT_EQ(t[t.size() - 2].name, "wi_1");
    EXPECT_EQ(t.back().name, "wo");
    EXPECT_EQ(t[t.size() - 3].rows, s.d_ff);
    EXPECT_EQ(t[t.size() - 3].cols, s.d_model);
  }
  EXPECT_EQ(ffn_kind_name(parse_ffn_kind("gated-gelu")), std::string("gated-gelu"));
  try {
    parse_ffn_kind("swiglu");
    FAIL() << "expected UsageError";
  } catch (const UsageError& e) {
    EXPECT_STREQ(e.what(), "--ffn 'swiglu' is not allowed (allowed: relu, gated-gelu)");
  }
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

// THE size check names the flags whose product cannot be counted, and passes every preset
// at the study's shapes.
TEST(Model, SizesBeyondWhatIsCountedAreRefusedNamingTheFlags) {
  ModelSpec s = model_preset("t5-tiny");
  s.heads = s.d_kv = 2147483647;
  try {
    validate(s);
    FAIL() << "expected UsageError";
  } catch (const UsageError& e) {
    EXPECT_NE(std::string(e.what()).find("--heads 2147483647 x --d-kv 2147483647 = "), std::string::npos) << e.what();
  }
  s = model_preset("t5-tiny");
  s.d_ff = s.d_model = 2147483647;
  EXPECT_THROW(validate(s), UsageError);
  s = model_preset("t5-tiny");
  s.layers = kMaxLayers + 1;
  EXPECT_THROW(validate(s), UsageError);
  s = model_preset("t5-tiny");
  EXPECT_THROW(validate(s, StepShape{2147483647, 1, 1}), UsageError);  // sequence passes
  EXPECT_THROW(validate(s, StepShape{8, 8, 8}, kMaxMicroBatches + 1), UsageError);
  for (const std::string& name : model_preset_names())
    EXPECT_NO_THROW(validate(model_preset(name), StepShape{16, 512, 512}, 16)) << name;
}

TEST(Model, UnitsTileTheirFlatParameter) {
  const ModelSpec s = model_preset("t5-small");
  const auto units = model_units(s);
  const int64_t L = s.layers;
  ASSERT_EQ(units.size(), size_t(3 + 2 * L));  // one per piece
  EXPECT_EQ(units[0].kind, UnitKind::Embedding);
  EXPECT_EQ(units[1].kind, UnitKind::EncoderBlock);
  EXPECT_EQ(units[1 + L].kind, UnitKind::Bridge);
  EXPECT_EQ(units[2 + L].kind, UnitKind::DecoderBlock);
  EXPECT_EQ(units[2 + L].name, "decoder.0");
  EXPECT_EQ(units.back().kind, UnitKind::Head);
  EXPECT_EQ(units.back().name, "head");
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
  EXPECT_NO_THROW(units[2 + L].tensor("rel_bias"));
  EXPECT_EQ(units[2].numel + s.num_buckets * s.heads, units[1].numel);
}

// A tensor's random stream does not depend on the unit holding it: the blocks number 1..2L,
// the tensors outside them 0 in the order shared, encoder.final_norm, decoder.final_norm,
// lm_head (the single root unit the model first had), so splitting that root left the
// initial weights as they were.
TEST(Model, RandomStreamsNameTheTensorNotItsUnit) {
  const ModelSpec s = model_preset("flan-t5-small");
  const int L = int(s.layers);
  std::map<std::string, std::pair<int, int>> outside;
  std::set<std::pair<int, int>> seen;
  for (const UnitSpec& u : model_units(s))
    for (size_t i = 0; i < u.tensors.size(); ++i) {
      const TensorSpec& t = u.tensors[i];
      EXPECT_TRUE(seen.insert({t.stream_block, t.stream_index}).second) << u.name << "." << t.name;
      if (!is_block(u.kind)) {
        outside[t.name] = {t.stream_block, t.stream_index};
        continue;
      }
      const int block = (u.kind == UnitKind::EncoderBlock ? 1 : 1 + L) + u.layer;
      EXPECT_EQ(std::make_pair(t.stream_block, t.stream_index), std::make_pair(block, int(i))) << u.name << "." << t.name;
    }
  EXPECT_EQ(outside, (std::map<std::string, std::pair<int, int>>{
                         {"shared", {0, 0}}, {"encoder.final_norm", {0, 1}}, {"decoder.final_norm", {0, 2}}, {"lm_head", {0, 3}}}));
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

// The gated feed-forward has three GEMMs of d_model x d_ff per token where ReLU's has two;
// the head is the same GEMM tied or untied.
TEST(Model, GatedFlopsHaveThreeFeedForwardGemms) {
  ModelSpec relu = model_preset("t5-tiny"), gated = relu;
  gated.ffn = FfnKind::GatedGelu;
  gated.tie_embeddings = false;
  const StepShape x{3, 7, 5};
  const double ff = 2.0 * relu.d_model * relu.d_ff;  // one GEMM's FLOPs per token
  EXPECT_DOUBLE_EQ(forward_flops_encoder_block(gated, x) - forward_flops_encoder_block(relu, x), ff * 21);
  EXPECT_DOUBLE_EQ(forward_flops_decoder_block(gated, x) - forward_flops_decoder_block(relu, x), ff * 15);
  EXPECT_DOUBLE_EQ(forward_flops_head(gated, x), forward_flops_head(relu, x));
  EXPECT_DOUBLE_EQ(hardware_flops_per_step(gated, x, true) - model_flops_per_step(gated, x),
                   gated.layers * (forward_flops_encoder_block(gated, x) + forward_flops_decoder_block(gated, x)));
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
    EXPECT_NE(std::string(e.what()).find("--shard-size 4"), std::string::npos);
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
    EXPECT_NE(std::string(e.what()).find("--shard-size 3"), std::string::npos) << e.what();
    EXPECT_NE(std::string(e.what()).find("4 data-parallel ranks"), std::string::npos) << e.what();
  }
}

// The parts of a tensor-parallel group tile every partitioned tensor exactly once and hold the
// replicated ones whole; the parameters per rank are the partitioned tensors / tp plus the norms.
TEST(Model, TensorParallelPartsTileTheFullModel) {
  const ModelSpec s = model_preset("t5-small");
  const auto full = model_units(s);
  for (int tp : {2, 4}) {
    std::vector<std::vector<float>> covered;
    for (const UnitSpec& u : full) covered.emplace_back(u.numel, 0.f);
    int64_t replicated = 0, partitioned = 0;
    for (int r = 0; r < tp; ++r) {
      const auto part = model_units(s, {tp, r});
      ASSERT_EQ(part.size(), full.size());
      for (size_t k = 0; k < full.size(); ++k) {
        std::vector<float> ones(part[k].numel, 1.f), placed(full[k].numel, 0.f);
        place_in_full_unit(part[k], full[k], ones.data(), placed.data());
        for (const TensorSpec& t : part[k].tensors)
          for (int64_t i = 0; i < full[k].tensor(t.name).numel(); ++i)
            covered[k][full[k].tensor(t.name).offset + i] += t.partitioned() ? placed[full[k].tensor(t.name).offset + i]
                                                                       : (r == 0 ? 1.f : 0.f);
        if (r == 0)
          for (const TensorSpec& t : part[k].tensors) (t.partitioned() ? partitioned : replicated) += t.numel();
      }
    }
    for (size_t k = 0; k < full.size(); ++k)
      for (float c : covered[k]) ASSERT_EQ(c, 1.f) << "tp " << tp << " unit " << full[k].name;
    EXPECT_EQ(param_count_per_rank(s, tp), partitioned + replicated);
    EXPECT_EQ(param_count(s), partitioned * tp + replicated);
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

// A rank's FLOPs are the model's / tp: every matmul is partitioned.
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
