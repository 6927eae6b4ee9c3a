// Pipeline parallelism: the action lists of GPipe and 1F1B (every micro-batch forward once,
// then backward once; at most S − s in flight under 1F1B), and the split of the model's
// pieces over pipeline stages (balanced by cost, the first decoder stage when given, the
// embedding, bridge and head with their blocks, the limits refused in one line), and which
// stages hold which unit.
#include <gtest/gtest.h>

#include <string>
#include <vector>

#include "shardbench/core/check.h"
#include "shardbench/strategy/pipeline.h"

namespace sb {
namespace {

std::string text(const std::vector<PipeAction>& a) {
  std::string s;
  for (const PipeAction& x : a) s += (s.empty() ? "" : " ") + std::string(x.kind == PipeAction::Forward ? "F" : "B") +
                                     std::to_string(x.micro);
  return s;
}

TEST(Pipeline, GPipeRunsEveryForwardThenEveryBackward) {
  EXPECT_EQ(text(pipeline_actions(PipeSchedule::GPipe, 4, 2, 3)), "F0 F1 F2 B0 B1 B2");
  EXPECT_EQ(micro_batches_in_flight(PipeSchedule::GPipe, 4, 0, 8), 8);
  EXPECT_EQ(text(pipeline_actions(PipeSchedule::GPipe, 1, 0, 1)), "F0 B0");  // one pass
}

TEST(Pipeline, OneFOneBWarmsUpThenAlternates) {
  EXPECT_EQ(text(pipeline_actions(PipeSchedule::OneFOneB, 4, 0, 6)), "F0 F1 F2 F3 B0 F4 B1 F5 B2 B3 B4 B5");
  EXPECT_EQ(text(pipeline_actions(PipeSchedule::OneFOneB, 4, 3, 6)), "F0 B0 F1 B1 F2 B2 F3 B3 F4 B4 F5 B5");
  EXPECT_EQ(text(pipeline_actions(PipeSchedule::OneFOneB, 4, 1, 2)), "F0 F1 B0 B1");  // fewer micro-batches than warm-up
  for (int S : {1, 2, 4, 8})
    for (int M : {1, 2, 3, 8, 16})
      for (int s = 0; s < S; ++s) {
        const auto a = pipeline_actions(PipeSchedule::OneFOneB, S, s, M);
        std::vector<int> f(M, -1), b(M, -1);
        for (size_t i = 0; i < a.size(); ++i) (a[i].kind == PipeAction::Forward ? f : b)[a[i].micro] = int(i);
        ASSERT_EQ(a.size(), size_t(2 * M));
        for (int m = 0; m < M; ++m) {
          ASSERT_GE(f[m], 0);
          ASSERT_GT(b[m], f[m]) << "S " << S << " s " << s << " M " << M << " micro " << m;
          if (m) {
            ASSERT_GT(f[m], f[m - 1]);
            ASSERT_GT(b[m], b[m - 1]);
          }
        }
        EXPECT_EQ(micro_batches_in_flight(PipeSchedule::OneFOneB, S, s, M), std::min(S - s, M));
      }
}

TEST(Pipeline, SplitBalancesBlocksAndPlacesEmbeddingBridgeAndHead) {
  // 4 + 4 blocks of equal cost on 4 stages: 2 blocks each; pieces: 0 embedding,
  // 1-4 encoder blocks, 5 bridge, 6-9 decoder blocks, 10 head.
  const std::vector<double> equal(8, 1.0);
  EXPECT_EQ(split_pipeline(equal, 4, 4).first, (std::vector<int>{0, 3, 5, 8, 11}));
  EXPECT_EQ(split_pipeline(equal, 4, 1).first, (std::vector<int>{0, 11}));
  EXPECT_EQ(split_pipeline(equal, 4, 8).first, (std::vector<int>{0, 2, 3, 4, 5, 7, 8, 9, 11}));
  // Decoder blocks twice as costly: the 2-stage cut moves into the encoder.
  std::vector<double> dec2(8, 1.0);
  for (int i = 4; i < 8; ++i) dec2[i] = 2.0;
  EXPECT_EQ(split_pipeline(dec2, 4, 2).first, (std::vector<int>{0, 7, 11}));  // 4 + 2 | 3 × 2: 6 and 6
  // The first decoder stage given: 1 encoder stage, 3 decoder stages.
  EXPECT_EQ(split_pipeline(equal, 4, 4, 1).first, (std::vector<int>{0, 5, 7, 8, 11}));
  const PipelineSplit p = split_pipeline(equal, 4, 4);
  EXPECT_EQ(p.stage_of(0), 0);
  EXPECT_EQ(p.stage_of(5), 2);   // the bridge with decoder block 0
  EXPECT_EQ(p.stage_of(10), 3);  // the head with the last block
}

// Each stage holds the units its pieces use (stages_holding): every unit on exactly one
// stage but the embedding, which the stages that look tokens up hold (the first; the
// bridge's, where the decoder starts) and, tied, the last (its LM head is the embedding).
// 4 + 4 layers: pieces and units 0 embedding, 1-4 encoder blocks, 5 bridge, 6-9 decoder
// blocks, 10 head (decoder.final_norm, untied lm_head).
TEST(Pipeline, StagesHoldTheUnitsTheirPiecesUse) {
  ModelSpec tied = model_preset("t5-tiny");
  tied.layers = 4;
  ModelSpec untied = tied;
  untied.tie_embeddings = false;
  const std::vector<double> equal(8, 1.0);
  std::vector<double> dec2(8, 1.0);  // decoder blocks twice as costly: the bridge on stage 0 of 2
  for (int i = 4; i < 8; ++i) dec2[i] = 2.0;
  const int embedding = 0, bridge = 5, head = 10;
  struct Case {
    const char* what;
    PipelineSplit split;
    std::vector<int> untied, tied;  // the stages holding the embedding
  } cases[] = {
      {"one stage", split_pipeline(equal, 4, 1), {0}, {0}},
      {"pp 4 balanced: the decoder starts on stage 2", split_pipeline(equal, 4, 4), {0, 2}, {0, 2, 3}},
      {"pp 4 --pp-split 1", split_pipeline(equal, 4, 4, 1), {0, 1}, {0, 1, 3}},
      {"pp 4 --pp-split 3: the decoder starts on the last stage", split_pipeline(equal, 4, 4, 3), {0, 3}, {0, 3}},
      {"pp 2: the bridge on the first stage", split_pipeline(dec2, 4, 2), {0}, {0, 1}},
      {"pp 8: a stage per block", split_pipeline(equal, 4, 8), {0, 4}, {0, 4, 7}},
  };
  for (const Case& c : cases) {
    SCOPED_TRACE(c.what);
    const int S = int(c.split.first.size()) - 1;
    for (const ModelSpec* spec : {&untied, &tied}) {
      const std::vector<Piece> pieces = model_pieces(*spec);
      ASSERT_EQ(pieces.size(), model_units(*spec).size());
      EXPECT_EQ(stages_holding(pieces, c.split, embedding), spec->tie_embeddings ? c.tied : c.untied);
      EXPECT_EQ(stages_holding(pieces, c.split, head), std::vector<int>{S - 1});  // lm_head, the decoder's final norm
      EXPECT_EQ(stages_holding(pieces, c.split, bridge), std::vector<int>{c.split.stage_of(bridge)});
      for (int u = 1; u < int(pieces.size()); ++u)  // every other unit: its piece's stage alone
        EXPECT_EQ(stages_holding(pieces, c.split, u), std::vector<int>{c.split.stage_of(u)}) << "unit " << u;
    }
  }
  // The bridge's stage is the decoder's first: it looks the decoder's tokens up.
  const PipelineSplit p = split_pipeline(equal, 4, 4, 3);
  EXPECT_EQ(p.stage_of(bridge), p.stage_of(bridge + 1));
}

TEST(Pipeline, SplitRefusesMoreStagesThanBlocks) {
  const std::vector<double> c(4, 1.0);
  try {
    split_pipeline(c, 2, 5);
    FAIL();
  } catch (const UsageError& e) {
    EXPECT_EQ(std::string(e.what()),
              "--pp 5 is not allowed with 4 blocks (2 encoder + 2 decoder; at most one stage per block)");
  }
  EXPECT_THROW(split_pipeline(c, 2, 4, 3), UsageError);  // 3 encoder stages for 2 encoder blocks
  EXPECT_THROW(split_pipeline(c, 2, 2, 0), UsageError);
  EXPECT_THROW(split_pipeline(c, 2, 2, 2), UsageError);
  EXPECT_THROW(parse_pipe_schedule("interleaved"), UsageError);
}

}  // namespace
}  // namespace sb
