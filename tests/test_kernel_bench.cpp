// kernel_bench's attention lines time what a training step runs: the unfused sequence of
// src/programs/attention_bench.h issues the operations (kinds, GEMM shapes, bytes) of a T5
// step's encoder self-attention core, in the same order, forward and backward; the fused
// path is the backend's two operations with the FLOPs of the unfused GEMMs.
#include <gtest/gtest.h>

#include <array>
#include <vector>

#include "../src/programs/attention_bench.h"
#include "shardbench/backend/backend.h"
#include "shardbench/model/model.h"
#include "shardbench/model/t5.h"
#include "t5_model.h"

namespace sb {
namespace {

struct Rec : Recorder {
  std::vector<OpEvent> ops;
  void on_op(const OpEvent& e) override { ops.push_back(e); }
  void on_memory(double, const MemBytes&) override {}
};

using Key = std::array<int64_t, 7>;  // kind, GEMM shape (5), bytes
Key key(const OpEvent& e) { return {int64_t(e.kind), e.gemm[0], e.gemm[1], e.gemm[2], e.gemm[3], e.gemm[4], e.bytes}; }

// The attention core's operations: GEMMs batched over the heads, and the softmax forward
// and backward (their bytes: 2 and 3 passes over the [B, H, T, T] scores).
std::vector<Key> core(const std::vector<OpEvent>& ops, const AttentionShape& s, DType t, int unit) {
  const int64_t scores = int64_t(s.batch) * s.heads * s.tq * s.tk * dtype_size(t);
  std::vector<Key> out;
  for (const OpEvent& e : ops) {
    if (unit >= 0 && e.unit != unit) continue;
    const bool batched = e.kind == OpKind::Gemm && e.gemm[3] == s.heads;
    const bool softmax = e.kind == OpKind::Elementwise && (e.bytes == 2 * scores || e.bytes == 3 * scores);
    if (batched || softmax) out.push_back(key(e));
  }
  return out;
}

TEST(KernelBench, UnfusedAttentionIsTheStepsSequence) {
  ModelSpec spec = model_preset("t5-tiny");
  spec.layers = 1;
  const StepShape shape{3, 11, 7};
  for (DType t : {DType::F32, DType::BF16}) {
    auto b = make_backend("cpu");
    Rec step_ops;
    {
      T5Model m(*b, spec, shape, false, t);
      b->set_recorder(&step_ops);
      const auto& st = m.step->pieces();
      for (size_t i = 0; i < st.size(); ++i) {
        b->set_context(Phase::Forward, st[i].unit);
        m.step->forward(int(i), by_unit(m.params));
      }
      for (int i = int(st.size()) - 1; i >= 0; --i) {
        b->set_context(Phase::Backward, st[i].unit);
        m.step->backward(i, by_unit(m.params), by_unit(m.grads));
      }
      b->set_recorder(nullptr);
    }
    const AttentionShape s{3, int(spec.heads), 11, 11, int(spec.d_kv), int(spec.num_buckets), false};
    const int encoder_block = 1;  // unit 1: the encoder's block (its self-attention, non-causal, with bias)
    const std::vector<Key> want = core(step_ops.ops, s, t, encoder_block);
    ASSERT_EQ(want.size(), size_t(2 * 3 + 4 * 3 + 2)) << "3 sequences: 2 GEMMs forward, 4 backward each, 2 softmaxes";

    Rec bench_ops;
    attention_bench::Tensors x = attention_bench::make(*b, s, t, AttentionImpl::Unfused);
    b->set_recorder(&bench_ops);
    attention_bench::forward_backward(*b, x);
    b->set_recorder(nullptr);
    attention_bench::release(*b, x);
    EXPECT_EQ(core(bench_ops.ops, s, t, -1), want) << dtype_name(t);
    EXPECT_EQ(core(bench_ops.ops, s, t, -1).size(), bench_ops.ops.size()) << "nothing else is timed";

    Rec fused_ops;
    x = attention_bench::make(*b, s, t, AttentionImpl::Fused);
    b->set_recorder(&fused_ops);
    attention_bench::forward_backward(*b, x);
    b->set_recorder(nullptr);
    attention_bench::release(*b, x);
    ASSERT_EQ(fused_ops.ops.size(), 2u);
    double unfused_flops = 0, fused_flops = 0;
    for (const OpEvent& e : bench_ops.ops) unfused_flops += e.flops;
    for (const OpEvent& e : fused_ops.ops) fused_flops += e.flops;
    EXPECT_EQ(fused_flops, unfused_flops);
    EXPECT_EQ(fused_flops, attention_flops(s, false) + attention_flops(s, true));
  }
}

}  // namespace
}  // namespace sb
