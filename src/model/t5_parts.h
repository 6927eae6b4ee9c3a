// The T5 step's parts, private to model/ (Hugging Face T5 semantics; every tensor touched
// through Backend calls only: the counting backend hands out fake pointers):
//   t5.cpp            the step: its context, micro-batches, dispatch and pipeline cuts
//   t5_attention.cpp  attention and the relative position bias
//   t5_block.cpp      the encoder and decoder blocks (attention sub-layers, feed-forward)
//   t5_ends.cpp       the embedding, the bridge and the head
//
// Data flow between pieces (N_e = B*T_e encoder tokens, N_d = B*T_d decoder tokens):
//   forward:  enc_h[0] → encoder blocks → enc_h[L] → Bridge → enc_out (cross-attn K/V)
//             dec_h[0] → decoder blocks → dec_h[L] → Head → losses, dlogits
//   backward: d_dec [N_d,d] and d_enc [N_e,d] hold d(loss)/d(hidden) and are updated in
//             place piece by piece; d_enc_out [N_e,d] sums every decoder block's cross-attn
//             K/V input gradient and is consumed by the Bridge backward.
// Each piece owns what it allocates in forward (its output included) and frees it in its
// backward; the output of piece s is read by piece s+1 in both directions, and s+1's
// backward runs before s's, so the ownership is safe.
//
// Every tensor of the model is named once, with its shape, in the structs below
// (BlockTensors, AttentionTensors, EmbeddingTensors, BridgeTensors, HeadTensors): each
// piece's views are resolved from the units when the step is built (the *_tensors
// functions beside the code that uses them), and a piece reaches a tensor by field, never
// by name. Shapes are this rank's: under tensor parallelism H heads, inner = H·d_kv, ff of
// d_ff and V vocabulary rows; a Linear weight is [out, in] (y = x W^T).
#pragma once
#include <cstdint>
#include <functional>
#include <memory>
#include <string>
#include <vector>

#include "shardbench/backend/backend.h"
#include "shardbench/model/model.h"
#include "shardbench/model/t5.h"

namespace sb {
namespace t5 {

constexpr float kNormEps = 1e-6f;  // T5LayerNorm variance_epsilon

// ---------------------------------------------------------------- the tensors, named
// One tensor of one unit: its place in the unit's flat parameter and gradient, and its index
// among the unit's tensors (what the grad-ready hook is called with).
struct TensorRef {
  int unit = -1, index = -1;
  int64_t offset = 0;                           // elements from the start of the unit's flat buffer
  CBuf in(CBuf W) const { return W + offset; }  // in the unit's parameter W
  Buf in(Buf G) const { return G + offset; }    // in the unit's gradient G
};
// Unit u's tensor `name`: the one look-up by name, when the step is built (fatal if absent).
TensorRef tensor_ref(const std::vector<UnitSpec>& units, int u, const std::string& name);

// One attention sub-layer (T5Attention): "self.*", or the decoder's "cross.*".
struct AttentionTensors {
  TensorRef q, k, v;  // [inner, d] each (column-parallel: this rank's heads)
  TensorRef o;        // [d, inner] (row-parallel)
  // What the sums over the tensor-parallel group are called (the lockstep's messages).
  const char* output_sum = nullptr;          // "self-attention output"
  const char* input_gradient_sum = nullptr;  // "self-attention input gradient"
};

// One encoder or decoder block, unit "encoder.l" / "decoder.l" (model_units' order).
struct BlockTensors {
  TensorRef rel_bias;      // [num_buckets, H] the stack's position-bias table: block 0 only
  TensorRef ln_sa;         // [1, d] "ln1", before the self-attention
  AttentionTensors self;   // "self.q", "self.k", "self.v", "self.o"
  TensorRef ln_ca;         // [1, d] "ln2", before the cross-attention (decoder)
  AttentionTensors cross;  // "cross.q", ... (decoder)
  TensorRef ln_ff;         // [1, d] before the feed-forward: "ln2" (encoder), "ln3" (decoder)
  TensorRef wi;            // [ff, d] ReLU: wo(relu(wi x))
  TensorRef wi_0, wi_1;    // [ff, d] each, gated GELU: wo(gelu_tanh(wi_0 x) * wi_1 x)
  TensorRef wo;            // [d, ff] (row-parallel)
};

struct EmbeddingTensors {  // unit "embedding"
  TensorRef shared;        // [V, d] (vocabulary-parallel rows); the LM head when tied
};
struct BridgeTensors {     // unit "bridge"
  TensorRef final_norm;    // [1, d] "encoder.final_norm"
};
struct HeadTensors {       // unit "head"
  TensorRef final_norm;    // [1, d] "decoder.final_norm"
  TensorRef lm_head;       // [V, d] untied only (vocabulary-parallel rows)
};

// ---------------------------------------------------------------- saved state
// One attention sub-layer's saved tensors.
struct AttnState {
  float* rstd = nullptr;  // [B*tq] of the pre-norm (fp32)
  Buf xn;                 // [B*tq, d] normed query input (also the K/V input for self)
  Buf q;                  // [B*tq, inner]
  Buf k;                  // [B*tk, inner]
  Buf v;                  // [B*tk, inner]
  Buf probs;              // [B, H, tq, tk] (unfused)
  float* lse = nullptr;   // [B, H, tq] rows' logsumexp (fused, fp32)
  Buf ctx;                // [B*tq, inner]
};

// One block's saved tensors (its output is owned separately: it outlives a recompute).
struct BlockState {
  AttnState self, cross;     // cross only in the decoder
  Buf x1;                    // [N, d] after self-attention residual
  Buf x2;                    // [N, d] after cross-attention residual (decoder)
  float* rstd_ff = nullptr;  // [N] (fp32)
  Buf xn_ff;                 // [N, d]
  Buf u, v;                  // [N, d_ff] gated GELU: wi_0 and wi_1 outputs
  Buf h;                     // [N, d_ff] after ReLU, or gelu_tanh(u) * v
};

// One micro-batch's tensors: its tokens and losses, and what its forward pieces produce and
// save (owned by the producing piece's saved list, freed by its backward).
struct Micro {
  int* enc_ids = nullptr;         // [Ne] (EncoderEmbed); tensor-parallel: this rank's rows, -1 elsewhere
  int* dec_ids = nullptr;         // [Nd] (Bridge)
  int* labels = nullptr;          // [Nd] (Head)
  float* losses = nullptr;        // [Nd] (fp32, Head)
  std::vector<Buf> hidden[2];     // [L+1] each: hidden[s][l] is block l's input
  Buf enc_out;                    // [Ne, d] encoder output after its final norm
  Buf bias[2];                    // [H, T, T] position bias, computed by block 0
                                  // (fused: [num_buckets, H], block 0's table, kept)
  Buf table[2];                   // [num_buckets, H] the table a later pipeline stage gets
  float* bridge_rstd = nullptr;   // [Ne] (fp32)
  Buf head_hn;                    // [Nd, d] decoder output after its final norm
  float* head_rstd = nullptr;     // [Nd] (fp32)
  Buf logits;                     // [Nd, V]; holds dlogits after the Head forward
  std::vector<std::vector<void*>> saved;  // per piece: what its forward allocated
  std::vector<BlockState> block_state;    // per piece this stage runs (blocks only), from part.first
  std::vector<bool> forwarded;            // per piece: saved state is live
  std::vector<void*> received;            // what the previous pipeline stage sent (its first
                                          // local piece's inputs), freed by that piece's backward
};

// ---------------------------------------------------------------- the context
// What every part of the step shares: its configuration, this rank's sizes, the units and
// pieces, the hooks, the residual streams' gradients, allocation, and the sums over the
// tensor-parallel group.
struct Context {
  Backend& b;
  DType dtype;  // of every tensor but rstd and losses
  ModelSpec spec;
  StepShape shape;  // of one micro-batch
  bool checkpointing;
  float grad_scale;
  AttentionImpl attention;
  TensorGroup tp;
  PipelinePart part;  // [part.first, part.last) of pieces, part.micro_batches
  T5Step::GradReadyHook grad_ready;
  T5Step::GroupSumHook* sum_hook = nullptr;  // --check's lockstep only
  std::shared_ptr<const std::vector<UnitSpec>> shared_units;  // the model's (T5StepConfig::units, else its own)
  const std::vector<UnitSpec>& units;
  std::vector<Piece> pieces;
  // This rank's part under tensor parallelism: H heads, ff of d_ff, V vocabulary rows from
  // vocab_begin (the whole model for a group of one).
  int B, Te, Td, d, ff, H, dkv, inner, V, L, Ne, Nd;
  int vocab_begin = 0;
  EmbeddingTensors embedding;  // every piece that reads the embedding unit
  // The residual streams' gradients, live across the step (Workspace) where a local piece
  // uses them, shared by the micro-batches.
  Buf d_hidden[2];  // d_enc [Ne,d], d_dec [Nd,d]
  Buf d_enc_out;    // [Ne, d]

  Context(Backend& backend, const T5StepConfig& c);

  // Whether this pipeline stage runs a piece of kind k.
  bool runs(Piece::Kind k) const {
    for (int pi = part.first; pi < part.last; ++pi)
      if (pieces[size_t(pi)].kind == k) return true;
    return false;
  }
  bool local(int pi) const { return pi >= part.first && pi < part.last; }
  // A pipeline stage starts at piece pi (part.stage_starts: also in --check's reference).
  bool starts_stage(int pi) const;
  // A stage starts inside stack st's blocks (pieces 1 .. L, or L + 2 .. 2L + 1), after its first.
  bool stack_divided(int st) const;
  int seq(int stack) const { return stack == 0 ? Te : Td; }
  bool fused() const { return attention == AttentionImpl::Fused; }
  bool gated() const { return spec.ffn == FfnKind::GatedGelu; }
  int64_t table_numel() const { return spec.num_buckets * H; }
  static int stack_of(const Piece& s) { return s.kind == Piece::DecoderBlock ? 1 : 0; }

  // Tensor t has its final gradient of this step (the last write to it was just issued):
  // the strategy's hook, as autograd's post-accumulate-grad hook.
  void ready(const TensorRef& t) const {
    if (grad_ready) grad_ready(t.unit, t.index);
  }
  // After piece pi's backward added its part of d(shared): the embedding's gradient is
  // complete when pi is the first local piece that uses it (the last in backward).
  void shared_ready(int pi) const {
    if (!pieces_use_unit(pieces, part.first, pi, embedding.shared.unit)) ready(embedding.shared);
  }

  Buf alloc(std::vector<void*>& owner, int64_t n, MemCategory cat) {
    const Buf p = b.alloc_buf(n, dtype, cat);
    owner.push_back(p.ptr);
    return p;
  }
  float* alloc_f32(std::vector<void*>& owner, int64_t n, MemCategory cat) {
    float* p = b.alloc_floats(n, cat);
    owner.push_back(p);
    return p;
  }
  Buf act(Micro& mb, int pi, int64_t n) { return alloc(mb.saved[size_t(pi)], n, MemCategory::Activations); }
  void release_all(std::vector<void*>& owner) {
    for (void* p : owner) b.release(p);
    owner.clear();
  }

  // ---- tensor parallelism
  bool tensor_parallel() const { return tp.size > 1; }
  // The sums over the group are made one by one: tensor-parallel, or the full model in
  // --check's lockstep (T5Step::GroupSumHook).
  bool group_sums() const { return tensor_parallel() || sum_hook; }
  // `acc` just took one more term rounded once (for the lockstep's rounding budget).
  void rounded(CBuf acc, int64_t n) {
    if (sum_hook) sum_hook->rounded(acc, n);
  }
  // What a sum over the group carries: an activation (forward) or an input gradient (backward).
  enum class Flow { Forward, Backward };
  // Sums (or maxes) x [n] over the tensor-parallel group, in place, on the critical path;
  // `what` names it for the lockstep (a literal: nothing is built unless a hook is set).
  // Injected faults (tests only): `skipped` removes this all-reduce; tp-bf16-gradient-all-
  // reduce sums an fp32 run's input gradients in bf16, as a 16-bit wire format would.
  void tp_all_reduce(Buf x, int64_t n, Flow flow, const char* what, bool skipped = false,
                     ReduceOp op = ReduceOp::Sum) {
    if (sum_hook) return sum_hook->sum(x, n, op, what, [&] { reduce(x, n, flow, skipped, op); });
    reduce(x, n, flow, skipped, op);
  }
  // out [n] += the group's sum of `product` (a row-parallel GEMM that writes its result
  // into dst with the given beta): one rank adds into out directly. `skipped`: see above.
  template <class Product>
  void add_row_parallel(Buf out, int64_t n, const char* what, Product&& product, bool skipped = false) {
    if (!group_sums()) return product(out, 1.f);
    std::vector<void*> tmp;
    const Buf part_sum = alloc(tmp, n, MemCategory::Workspace);
    product(part_sum, 0.f);
    rounded(part_sum, n);
    tp_all_reduce(part_sum, n, Flow::Forward, what, skipped);
    b.add(out, part_sum, n);
    release_all(tmp);
  }

 private:
  void reduce(Buf x, int64_t n, Flow flow, bool skipped, ReduceOp op);  // the all-reduce itself
};

// ---------------------------------------------------------------- attention (t5_attention.cpp)
// The attention sub-layers and each stack's relative position bias: the bucket tables and
// the bias gradients' accumulators, live across the step where a local block uses them.
class Attention {
 public:
  explicit Attention(Context& c) : c_(c) {}
  void allocate();  // the stacks' buckets and accumulators (Workspace), the step's constructor
  void release();

  AttnState alloc_state(std::vector<void*>& owner, MemCategory cat, int tq, int tk);
  // out += Attn(q from a.xn, k/v from xkv). xkv [B*tk, d]; bias_stack: the stack whose
  // position bias applies, -1 for none; out [B*tq, d].
  void forward(const Micro& mb, CBuf W, const AttentionTensors& t, AttnState& a, CBuf xkv, int tq, int tk,
               int bias_stack, bool causal, Buf out);
  // dout [B*tq, d] is d(loss)/d(attention output). Writes dxn [B*tq, d] = d/d(a.xn) and
  // adds d/d(xkv) into dxkv [B*tk, d] (which may be dxn itself for self-attention, since
  // dxn is written first). With bias_stack >= 0, the stack's d(bias) += d/d(bias).
  // Tensor-parallel: dxn is summed over the group here; a separate dxkv holds this rank's
  // part of its sum (d_enc_out, summed once in the Bridge backward).
  void backward(const Micro& mb, CBuf W, Buf G, const AttentionTensors& t, const AttnState& a, CBuf xkv, int tq,
                int tk, CBuf dout, Buf dxn, Buf dxkv, int bias_stack, bool causal);

  // Block pi's forward, before its sub-layers: the stack's position bias in mb.bias (block
  // 0 computes it from its table, a pipeline stage's first block from the table it was sent).
  void bias_forward(Micro& mb, int pi, CBuf W, const BlockTensors& t);
  // Block pi's backward, first: the stack's accumulators start at zero where it is the first
  // to add to them.
  void begin_bias_backward(int pi);
  // Block pi's backward, last: the stack's d(bias) into the table's gradient where pi is
  // the stack's first block, or folded for the cut before pi.
  void bias_backward(int pi, Buf G, const BlockTensors& t);
  // The table's gradient a pipeline cut carries: dbias when fused (table-sized), else dtable.
  Buf table_gradient(int stack) const { return c_.fused() ? dbias_[stack] : dtable_[stack]; }

 private:
  int64_t dbias_numel(int stack) const;
  AttentionShape shape(int tq, int tk, bool causal) const;
  // The stack's last block is on a later pipeline stage: its blocks there need the table.
  bool stack_continues(int stack) const;

  Context& c_;
  int* buckets_[2] = {};  // per stack (0 encoder, 1 decoder): [T*T], fused [2T-1] by j-i
  Buf dbias_[2];          // [H, T, T] per stack, summed over the stack's blocks
                          // (fused: [num_buckets, H], the table's gradient)
  // Unfused, where a pipeline cut divides the stack: the table's gradient [num_buckets, H]
  // that crosses the cut (received from the later stage, this stage's blocks' d(bias) folded
  // in, sent to the earlier one), not the [H, T, T] d(bias): the same sum, exact, at the
  // table's size (32 MiB -> a few KiB per micro-batch for t5-11.3b).
  Buf dtable_[2];
};

// ---------------------------------------------------------------- blocks (t5_block.cpp)
// Unit u's tensors as block `layer` of stack `stack` holds them.
BlockTensors block_tensors(const std::vector<UnitSpec>& units, int u, int layer, int stack, const ModelSpec& spec);

class Blocks {
 public:
  Blocks(Context& c, Attention& attention) : c_(c), attention_(attention) {}
  void resolve();  // the views of the local blocks (the step's constructor)
  void forward(Micro& mb, int pi, CBuf W);
  void backward(Micro& mb, int pi, CBuf W, Buf G);

 private:
  BlockState alloc_state(std::vector<void*>& owner, MemCategory cat, int stack);
  void compute(const Micro& mb, int pi, CBuf W, BlockState& st, Buf out);
  void backward_from(const Micro& mb, int pi, CBuf W, Buf G, const BlockState& st);

  Context& c_;
  Attention& attention_;
  std::vector<BlockTensors> tensors_;  // per piece (the local blocks')
};

// ---------------------------------------------------------------- ends (t5_ends.cpp)
// The embedding unit's tensors (u = 0), and the bridge's and the head's.
EmbeddingTensors embedding_tensors(const std::vector<UnitSpec>& units, int u);
BridgeTensors bridge_tensors(const std::vector<UnitSpec>& units, int u);
HeadTensors head_tensors(const std::vector<UnitSpec>& units, int u, const ModelSpec& spec);

// The pieces around the stacks. E and GE: the embedding unit's parameter and gradient (the
// bridge and a tied head read it besides their own unit, W and G).
class Ends {
 public:
  explicit Ends(Context& c) : c_(c) {}
  void resolve();  // the bridge's and the head's views (the step's constructor)
  void embed_forward(Micro& mb, int pi, CBuf E);
  void embed_backward(Micro& mb, int pi, Buf GE);
  void bridge_forward(Micro& mb, int pi, CBuf W, CBuf E);
  void bridge_backward(Micro& mb, int pi, CBuf W, Buf G, Buf GE);
  void head_forward(Micro& mb, int pi, CBuf W, CBuf E);
  void head_backward(Micro& mb, int pi, CBuf W, Buf G, CBuf E, Buf GE);

 private:
  // The LM head's weight [V, d]: shared (tied, in the embedding unit) or lm_head (untied).
  CBuf head_weight(CBuf W, CBuf E) const {
    return c_.spec.tie_embeddings ? c_.embedding.shared.in(E) : head_.lm_head.in(W);
  }
  // The LM head's input scale: d_model^-0.5 before `shared` (tied), none before `lm_head`.
  float head_rescale() const;

  Context& c_;
  BridgeTensors bridge_;
  HeadTensors head_;
};

}  // namespace t5
}  // namespace sb
