// The T5 training step (Hugging Face T5 semantics) as forward/backward pieces, every
// tensor touched through Backend calls only (the counting backend hands out fake pointers).
//
// Data flow between pieces (N_e = B*T_e encoder tokens, N_d = B*T_d decoder tokens):
//   forward:  enc_h[0] → encoder blocks → enc_h[L] → Bridge → enc_out (cross-attn K/V)
//             dec_h[0] → decoder blocks → dec_h[L] → Head → losses, dlogits
//   backward: d_dec [N_d,d] and d_enc [N_e,d] hold d(loss)/d(hidden) and are updated in
//             place piece by piece; d_enc_out [N_e,d] sums every decoder block's cross-attn
//             K/V input gradient and is consumed by the Bridge backward.
// Attention runs unfused (batched GEMMs around a softmax over a held [B, H, tq, tk]
// tensor, the reference) or fused (Backend::attention_forward/backward, which read the
// rel_bias table directly and save only each row's logsumexp); AttentionImpl picks.
// Each piece owns what it allocates in forward (its output included) and frees it in its
// backward; the output of piece s is read by piece s+1 in both directions, and s+1's
// backward runs before s's, so the ownership is safe.
#include <algorithm>
#include <cmath>
#include <string>
#include <vector>

#include "shardbench/core/check.h"
#include "shardbench/core/fault.h"
#include "shardbench/model/t5.h"

namespace sb {

const char* attention_impl_name(AttentionImpl a) { return a == AttentionImpl::Fused ? "fused" : "unfused"; }

AttentionImpl parse_attention_impl(const std::string& s) {
  for (AttentionImpl a : {AttentionImpl::Unfused, AttentionImpl::Fused})
    if (s == attention_impl_name(a)) return a;
  throw UsageError("--attention '" + s + "' is not allowed (allowed: fused, unfused)");
}

std::vector<Piece> model_pieces(const ModelSpec& spec) {
  // Piece k's own unit is unit k (model_units): embedding, encoder blocks, bridge, decoder
  // blocks, head.
  const int L = int(spec.layers), embedding = 0;
  std::vector<Piece> p;
  p.push_back({Piece::EncoderEmbed, embedding, 0});
  for (int l = 0; l < L; ++l) p.push_back({Piece::EncoderBlock, 1 + l, l});
  p.push_back({Piece::Bridge, 1 + L, 0, embedding});
  for (int l = 0; l < L; ++l) p.push_back({Piece::DecoderBlock, 2 + L + l, l});
  p.push_back({Piece::Head, 2 + 2 * L, 0, spec.tie_embeddings ? embedding : -1});
  return p;
}

bool pieces_use_unit(const std::vector<Piece>& pieces, int first, int last, int unit) {
  for (int k = first; k < last; ++k)
    if (pieces[size_t(k)].unit == unit || pieces[size_t(k)].embedding == unit) return true;
  return false;
}

const char* piece_kind_name(Piece::Kind k) {
  switch (k) {
    case Piece::EncoderEmbed: return "encoder_embed";
    case Piece::EncoderBlock: return "encoder_block";
    case Piece::Bridge: return "bridge";
    case Piece::DecoderBlock: return "decoder_block";
    case Piece::Head: return "head";
  }
  return "?";
}

std::string piece_name(const Piece& p) {
  switch (p.kind) {
    case Piece::EncoderEmbed: return "encoder embedding";
    case Piece::EncoderBlock: return "encoder block " + std::to_string(p.layer);
    case Piece::Bridge: return "bridge";
    case Piece::DecoderBlock: return "decoder block " + std::to_string(p.layer);
    case Piece::Head: return "head";
  }
  return "?";
}

namespace {

constexpr float kNormEps = 1e-6f;  // T5LayerNorm variance_epsilon

// Hugging Face T5Attention._relative_position_bucket; relative_position = key - query.
// The log branch is evaluated in float32 like the PyTorch original (its divisor
// math.log(max_distance / max_exact) is a Python double), then truncated toward zero.
int relative_position_bucket(int relative_position, bool bidirectional, int num_buckets,
                             int max_distance) {
  int bucket = 0;
  int n = num_buckets;
  int rp = relative_position;
  if (bidirectional) {
    n /= 2;
    if (rp > 0) bucket += n;
    rp = std::abs(rp);
  } else {
    rp = rp < 0 ? -rp : 0;  // -min(rp, 0): only keys at or before the query
  }
  const int max_exact = n / 2;
  if (rp < max_exact) return bucket + rp;
  const float log_range = float(std::log(double(max_distance) / double(max_exact)));
  const float scaled = std::log(float(rp) / float(max_exact)) / log_range * float(n - max_exact);
  int large = max_exact + int(scaled);
  if (large > n - 1) large = n - 1;
  return bucket + large;
}

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
  AttnState self, cross;   // cross only in the decoder
  Buf x1;                  // [N, d] after self-attention residual
  Buf x2;                  // [N, d] after cross-attention residual (decoder)
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

}  // namespace

struct T5Step::Impl {
  Backend& b;
  DType dtype;  // of every tensor below but rstd and losses
  ModelSpec spec;
  StepShape shape;  // of one micro-batch
  bool checkpointing;
  float grad_scale;
  AttentionImpl attention;
  TensorGroup tp;
  PipelinePart part;  // [part.first, part.last) of pieces, part.micro_batches
  T5Step::GradReadyHook grad_ready;
  T5Step::GroupSumHook* sum_hook = nullptr;  // --check's lockstep only
  std::shared_ptr<const std::vector<UnitSpec>> shared_units;  // the model's, built once (shared_model_units)
  const std::vector<UnitSpec>& units;
  std::vector<Piece> pieces;

  // This rank's part under tensor parallelism: H heads, ff of d_ff, V vocabulary rows from
  // vocab_begin (the whole model for a group of one).
  int B, Te, Td, d, ff, H, dkv, inner, V, L, Ne, Nd;
  int vocab_begin = 0;

  // Live across the step (Workspace, constructor to destructor), only where a local piece
  // uses them. The gradient accumulators are shared by the micro-batches: a backward action
  // runs a micro-batch's local pieces through before the next action starts.
  int* buckets[2] = {};        // per stack (0 encoder, 1 decoder): [T*T], fused [2T-1] by j-i
  Buf d_hidden[2];             // d_enc [Ne,d], d_dec [Nd,d]
  Buf d_enc_out;               // [Ne, d]
  Buf dbias[2];                // [H, T, T] per stack, summed over the stack's blocks
                               // (fused: [num_buckets, H], the table's gradient)
  // Unfused, where a pipeline cut divides the stack: the table's gradient [num_buckets, H]
  // that crosses the cut (received from the later stage, this stage's blocks' d(bias) folded
  // in, sent to the earlier one), not the [H, T, T] d(bias): the same sum, exact, at the
  // table's size (32 MiB -> a few KiB per micro-batch for t5-11.3b).
  Buf dtable[2];
  std::vector<Micro> micro;

  Impl(const ModelSpec& s, Backend& be, DType dt, const StepShape& x, bool ckpt, float gs, AttentionImpl at,
       TensorGroup g, PipelinePart pp)
      : b(be), dtype(dt), spec(s), shape(x), checkpointing(ckpt), grad_scale(gs), attention(at), tp(g), part(pp),
        shared_units((validate(s), shared_model_units(s, {g.size, g.rank}))), units(*shared_units) {
    SB_ASSERT(tp.size == 1 || (tp.comm && tp.comm->size() == tp.size), "a tensor-parallel group needs its communicator");
    SB_ASSERT(x.batch > 0 && x.enc_len > 0 && x.dec_len > 0, "step shape must be positive");
    SB_ASSERT(s.num_buckets >= 4 && s.max_distance > s.num_buckets / 2,
              "relative attention needs num_buckets >= 4 and max_distance > num_buckets / 2");
    B = int(x.batch), Te = int(x.enc_len), Td = int(x.dec_len);
    d = int(s.d_model), ff = int(s.d_ff / tp.size), H = int(s.heads / tp.size), dkv = int(s.d_kv);
    inner = H * dkv, V = int(s.vocab / tp.size), L = int(s.layers);
    vocab_begin = V * tp.rank;
    if (g.size > 1 && injected_fault(Fault::TpWrongVocabOffset)) vocab_begin += 1;  // tests only: off by one token
    Ne = B * Te, Nd = B * Td;

    pieces = model_pieces(s);
    SB_ASSERT(pieces.size() == units.size(), "one unit per piece");
    if (part.last < 0) part.last = int(pieces.size());
    SB_ASSERT(0 <= part.first && part.first < part.last && part.last <= int(pieces.size()) &&
                  part.micro_batches >= 1, "bad pipeline part");

    const MemCategory ws = MemCategory::Workspace;
    micro.resize(size_t(part.micro_batches));
    for (Micro& m : micro) {
      m.saved.resize(pieces.size());
      m.block_state.resize(size_t(part.last - part.first));
      m.forwarded.assign(pieces.size(), false);
      m.hidden[0].assign(L + 1, Buf());
      m.hidden[1].assign(L + 1, Buf());
      if (runs(Piece::EncoderEmbed)) m.enc_ids = b.alloc_ints(Ne, ws);
      if (runs(Piece::Bridge)) m.dec_ids = b.alloc_ints(Nd, ws);
      if (runs(Piece::Head)) m.labels = b.alloc_ints(Nd, ws);
    }
    for (int st = 0; st < 2; ++st) {
      if (!runs(st == 0 ? Piece::EncoderBlock : Piece::DecoderBlock)) continue;
      const int T = seq(st);
      if (fused()) {  // the bucket of j - i, for j - i = -(T-1) .. T-1
        std::vector<int> rel(b.holds_data() ? size_t(2 * T - 1) : 0);
        for (int r = 1 - T; r < T && b.holds_data(); ++r)
          rel[size_t(r + T - 1)] = relative_position_bucket(r, /*bidirectional=*/st == 0, int(s.num_buckets),
                                                            int(s.max_distance));
        buckets[st] = b.alloc_ints(2 * T - 1, ws);
        if (b.holds_data()) b.upload(buckets[st], rel.data(), rel.size() * sizeof(int));
        dbias[st] = b.alloc_buf(table_numel(), dtype, ws);
        continue;
      }
      buckets[st] = b.alloc_ints(int64_t(T) * T, ws);
      // One row at a time (host memory O(T), not O(T²)); nothing at all for the plan.
      std::vector<int> row(b.holds_data() ? T : 0);
      for (int i = 0; i < T && b.holds_data(); ++i) {
        for (int j = 0; j < T; ++j)
          row[j] = relative_position_bucket(j - i, /*bidirectional=*/st == 0, int(s.num_buckets), int(s.max_distance));
        b.upload(buckets[st] + int64_t(i) * T, row.data(), row.size() * sizeof(int));
      }
      dbias[st] = b.alloc_buf(int64_t(H) * T * T, dtype, ws);
      if (stack_divided(st)) dtable[st] = b.alloc_buf(table_numel(), dtype, ws);
    }
    if (runs(Piece::Head))
      for (Micro& m : micro) m.losses = b.alloc_floats(Nd, ws);
    if (runs(Piece::EncoderEmbed) || runs(Piece::EncoderBlock) || runs(Piece::Bridge))
      d_hidden[0] = b.alloc_buf(int64_t(Ne) * d, dtype, ws);
    if (runs(Piece::Bridge) || runs(Piece::DecoderBlock) || runs(Piece::Head))
      d_hidden[1] = b.alloc_buf(int64_t(Nd) * d, dtype, ws);
    if (runs(Piece::Bridge) || runs(Piece::DecoderBlock)) d_enc_out = b.alloc_buf(int64_t(Ne) * d, dtype, ws);
  }

  ~Impl() {
    for (Micro& m : micro) {
      for (size_t i = 0; i < pieces.size(); ++i) release_saved(m, int(i));
      release_all(m.received);
      for (void* p : {(void*)m.enc_ids, (void*)m.dec_ids, (void*)m.labels, (void*)m.losses}) b.release(p);
    }
    void* bufs[] = {buckets[0], buckets[1], dbias[0].ptr, dbias[1].ptr, dtable[0].ptr, dtable[1].ptr,
                    d_hidden[0].ptr, d_hidden[1].ptr, d_enc_out.ptr};
    for (void* p : bufs) b.release(p);
  }

  // Whether this pipeline stage runs a piece of kind k.
  bool runs(Piece::Kind k) const {
    for (int pi = part.first; pi < part.last; ++pi)
      if (pieces[size_t(pi)].kind == k) return true;
    return false;
  }
  bool local(int pi) const { return pi >= part.first && pi < part.last; }
  // A pipeline stage starts at piece pi (part.stage_starts: also in --check's reference).
  bool starts_stage(int pi) const {
    return std::find(part.stage_starts.begin(), part.stage_starts.end(), pi) != part.stage_starts.end();
  }
  // A stage starts inside stack st's blocks (pieces 1 .. L, or L + 2 .. 2L + 1), after its first.
  bool stack_divided(int st) const {
    const int first = st == 0 ? 1 : L + 2;
    for (int pi = first + 1; pi < first + L; ++pi)
      if (starts_stage(pi)) return true;
    return false;
  }
  // Micro-batch m's tensors: every call that runs or feeds one takes it from here.
  Micro& micro_batch(int m) {
    SB_ASSERT(m >= 0 && m < part.micro_batches, "micro-batch " + std::to_string(m) + " out of range");
    return micro[size_t(m)];
  }

  int seq(int stack) const { return stack == 0 ? Te : Td; }
  bool fused() const { return attention == AttentionImpl::Fused; }
  bool gated() const { return spec.ffn == FfnKind::GatedGelu; }
  // The LM head's input scale: d_model^-0.5 before `shared` (tied), none before `lm_head`.
  float head_rescale() const { return spec.tie_embeddings ? 1.f / std::sqrt(float(d)) : 1.f; }
  int64_t table_numel() const { return spec.num_buckets * H; }
  int64_t dbias_numel(int stack) const { return fused() ? table_numel() : int64_t(H) * seq(stack) * seq(stack); }
  // The table's gradient a pipeline cut carries: dbias when fused (table-sized), else dtable.
  Buf table_gradient(int stack) const { return fused() ? dbias[stack] : dtable[stack]; }
  AttentionShape attn_shape(int tq, int tk, bool causal) const {
    return AttentionShape{B, H, tq, tk, dkv, int(spec.num_buckets), causal};
  }
  static int stack_of(const Piece& s) { return s.kind == Piece::DecoderBlock ? 1 : 0; }

  // Tensor `name` of s's own unit, in its parameter W or gradient G.
  CBuf param(CBuf W, const Piece& s, const std::string& name) const {
    return W + units[s.unit].tensor(name).offset;
  }
  Buf grad(Buf G, const Piece& s, const std::string& name) const {
    return G + units[s.unit].tensor(name).offset;
  }
  // The shared embedding in its unit's parameter E or gradient GE.
  int64_t shared_offset() const { return units[size_t(pieces[0].unit)].tensor("shared").offset; }
  // Tensor `name` of unit u has its final gradient of this step (the last write to it was
  // just issued): the strategy's hook, as autograd's post-accumulate-grad hook.
  void ready(int u, const std::string& name) const {
    if (!grad_ready) return;
    const std::vector<TensorSpec>& t = units[size_t(u)].tensors;
    for (size_t i = 0; i < t.size(); ++i)
      if (t[i].name == name) return grad_ready(u, int(i));
    SB_FATAL("unit " + units[size_t(u)].name + " has no tensor " + name);
  }
  void ready(const Piece& s, const std::string& name) const { ready(s.unit, name); }
  // After piece pi's backward added its part of d(shared): the embedding's gradient is
  // complete when pi is the first local piece that uses it (the last in backward).
  void shared_ready(int pi) const {
    const int e = pieces[0].unit;
    if (!pieces_use_unit(pieces, part.first, pi, e)) ready(e, "shared");
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
  Buf act(Micro& mb, int pi, int64_t n) { return alloc(mb.saved[pi], n, MemCategory::Activations); }
  void release_all(std::vector<void*>& owner) {
    for (void* p : owner) b.release(p);
    owner.clear();
  }
  void release_saved(Micro& mb, int pi) {
    release_all(mb.saved[pi]);
    mb.forwarded[pi] = false;
  }

  // ---------------------------------------------------------------- tensor parallelism
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
  // `what` names it for the lockstep. Injected faults (tests only): `skipped` removes this
  // all-reduce; tp-bf16-gradient-all-reduce sums an fp32 run's input gradients in bf16, as a
  // 16-bit wire format would.
  void tp_all_reduce(Buf x, int64_t n, Flow flow, const std::string& what, bool skipped = false,
                     ReduceOp op = ReduceOp::Sum) {
    auto reduce = [&] {
      if (!tensor_parallel() || skipped) return;
      if (flow == Flow::Backward && x.dtype == DType::F32 && injected_fault(Fault::TpBf16GradientAllReduce)) {
        const Buf h = b.alloc_buf(n, DType::BF16, MemCategory::Workspace);
        b.cast(h, x, n);
        b.wait(b.all_reduce(h, n, *tp.comm));
        b.cast(x, h, n);
        b.release(h.ptr);
        return;
      }
      b.wait(op == ReduceOp::Sum ? b.all_reduce(x, n, *tp.comm)
                                 : b.collective({Collective::AllReduce, x.ptr, x.ptr, n, x.dtype, op}, *tp.comm));
    };
    if (sum_hook) return sum_hook->sum(x, n, op, what, reduce);
    reduce();
  }
  // out [n] += the group's sum of `product` (a row-parallel GEMM that writes its result
  // into dst with the given beta): one rank adds into out directly. `skipped`: see above.
  template <class Product>
  void add_row_parallel(Buf out, int64_t n, const std::string& what, Product&& product, bool skipped = false) {
    if (!group_sums()) return product(out, 1.f);
    std::vector<void*> tmp;
    const Buf part = alloc(tmp, n, MemCategory::Workspace);
    product(part, 0.f);
    rounded(part, n);
    tp_all_reduce(part, n, Flow::Forward, what, skipped);
    b.add(out, part, n);
    release_all(tmp);
  }

  // ---------------------------------------------------------------- attention
  AttnState alloc_attn(std::vector<void*>& o, MemCategory c, int tq, int tk) {
    AttnState a;
    a.rstd = alloc_f32(o, int64_t(B) * tq, c);
    a.xn = alloc(o, int64_t(B) * tq * d, c);
    a.q = alloc(o, int64_t(B) * tq * inner, c);
    a.k = alloc(o, int64_t(B) * tk * inner, c);
    a.v = alloc(o, int64_t(B) * tk * inner, c);
    if (fused())
      a.lse = alloc_f32(o, int64_t(B) * H * tq, c);
    else
      a.probs = alloc(o, int64_t(B) * H * tq * tk, c);
    a.ctx = alloc(o, int64_t(B) * tq * inner, c);
    return a;
  }

  // out += Attn(q from a.xn, k/v from xkv). T5 does not scale scores by 1/sqrt(d_kv).
  // xkv [B*tk, d]; bias_stack: the stack whose position bias applies, -1 for none; out [B*tq, d].
  void attention_forward(const Micro& mb, CBuf W, const Piece& s, const std::string& p, AttnState& a,
                         CBuf xkv, int tq, int tk, int bias_stack, bool causal,
                         Buf out) {
    const CBuf wq = param(W, s, p + ".q"), wk = param(W, s, p + ".k");
    const CBuf wv = param(W, s, p + ".v"), wo = param(W, s, p + ".o");
    b.gemm(false, true, B * tq, inner, d, 1.f, a.xn, d, wq, d, 0.f, a.q, inner);  // q = xn Wq^T
    b.gemm(false, true, B * tk, inner, d, 1.f, xkv, d, wk, d, 0.f, a.k, inner);   // k [B*tk, inner]
    b.gemm(false, true, B * tk, inner, d, 1.f, xkv, d, wv, d, 0.f, a.v, inner);   // v [B*tk, inner]
    if (fused()) {
      b.attention_forward(a.ctx, a.lse, a.q, a.k, a.v, bias_stack >= 0 ? CBuf(mb.bias[bias_stack]) : CBuf(),
                          bias_stack >= 0 ? buckets[bias_stack] : nullptr, attn_shape(tq, tk, causal));
    } else {
      const int64_t sq = int64_t(tq) * inner, sk = int64_t(tk) * inner, ss = int64_t(H) * tq * tk;
      // per sequence bi: scores_bh [tq, tk] = q_bh k_bh^T, heads at column offset dkv
      b.gemm_batched_each(B, sq, sk, ss, false, true, tq, tk, dkv, 1.f, a.q, inner, dkv, a.k, inner, dkv, 0.f,
                          a.probs, tk, int64_t(tq) * tk, H);
      b.softmax_forward(a.probs, bias_stack >= 0 ? CBuf(mb.bias[bias_stack]) : CBuf(), causal, B, H, tq, tk);
      // per sequence: ctx_bh [tq, dkv] = P_bh v_bh
      b.gemm_batched_each(B, ss, sk, sq, false, false, tq, dkv, tk, 1.f, a.probs, tk, int64_t(tq) * tk, a.v, inner,
                          dkv, 0.f, a.ctx, inner, dkv, H);
    }
    add_row_parallel(out, int64_t(B) * tq * d, p + "-attention output", [&](Buf dst, float beta) {  // out += ctx Wo^T
      b.gemm(false, true, B * tq, d, inner, 1.f, a.ctx, inner, wo, inner, beta, dst, d);
    });
  }

  // dout [B*tq, d] is d(loss)/d(attention output). Writes dxn [B*tq, d] = d/d(a.xn) and
  // adds d/d(xkv) into dxkv [B*tk, d] (which may be dxn itself for self-attention, since
  // dxn is written first). With bias_stack >= 0, dbias[bias_stack] += d/d(bias).
  // Tensor-parallel: dxn is summed over the group here; a separate dxkv holds this rank's
  // part of its sum (d_enc_out, summed once in the Bridge backward).
  void attention_backward(const Micro& mb, CBuf W, Buf G, const Piece& s, const std::string& p,
                          const AttnState& a, CBuf xkv, int tq, int tk, CBuf dout,
                          Buf dxn, Buf dxkv, int bias_stack, bool causal) {
    const CBuf wq = param(W, s, p + ".q"), wk = param(W, s, p + ".k");
    const CBuf wv = param(W, s, p + ".v"), wo = param(W, s, p + ".o");
    const Buf gq = grad(G, s, p + ".q"), gk = grad(G, s, p + ".k");
    const Buf gv = grad(G, s, p + ".v"), go = grad(G, s, p + ".o");
    std::vector<void*> tmp;
    const MemCategory ws = MemCategory::Workspace;
    const Buf dctx = alloc(tmp, int64_t(B) * tq * inner, ws);    // [B*tq, inner]
    const Buf ds = fused() ? Buf() : alloc(tmp, int64_t(B) * H * tq * tk, ws);  // [B, H, tq, tk]
    const Buf dq = alloc(tmp, int64_t(B) * tq * inner, ws);      // [B*tq, inner]
    const Buf dk = alloc(tmp, int64_t(B) * tk * inner, ws);      // [B*tk, inner]
    const Buf dv = alloc(tmp, int64_t(B) * tk * inner, ws);      // [B*tk, inner]

    b.gemm(true, false, d, inner, B * tq, 1.f, dout, d, a.ctx, inner, 1.f, go, inner);  // dWo += dout^T ctx
    ready(s, p + ".o");
    b.gemm(false, false, B * tq, inner, d, 1.f, dout, d, wo, inner, 0.f, dctx, inner);  // dctx = dout Wo
    const bool with_bias = bias_stack >= 0;
    if (fused()) {
      const AttentionShape shape = attn_shape(tq, tk, causal);
      float* work = alloc_f32(tmp, attention_workspace_floats(shape, with_bias), ws);
      b.attention_backward(dq, dk, dv, with_bias ? dbias[bias_stack] : Buf(), dctx, a.q, a.k, a.v, a.ctx, a.lse,
                           with_bias ? CBuf(mb.bias[bias_stack]) : CBuf(), with_bias ? buckets[bias_stack] : nullptr,
                           work, shape);
    } else {
      const int64_t sq = int64_t(tq) * inner, sk = int64_t(tk) * inner, ss = int64_t(H) * tq * tk;
      const int64_t sp = int64_t(tq) * tk;
      // per sequence (each call writes its own outputs, so the order of the calls is free):
      // dP_bh [tq, tk] = dctx_bh v_bh^T, dv_bh [tk, dkv] = P_bh^T dctx_bh
      b.gemm_batched_each(B, sq, sk, ss, false, true, tq, tk, dkv, 1.f, dctx, inner, dkv, a.v, inner, dkv, 0.f, ds,
                          tk, sp, H);
      b.gemm_batched_each(B, ss, sq, sk, true, false, tk, dkv, tq, 1.f, a.probs, tk, sp, dctx, inner, dkv, 0.f, dv,
                          inner, dkv, H);
      b.softmax_backward(ds, a.probs, with_bias ? dbias[bias_stack] : Buf(), B, H, tq, tk);  // ds = dS
      // dq_bh [tq, dkv] = dS_bh k_bh, dk_bh [tk, dkv] = dS_bh^T q_bh
      b.gemm_batched_each(B, ss, sk, sq, false, false, tq, dkv, tk, 1.f, ds, tk, sp, a.k, inner, dkv, 0.f, dq, inner,
                          dkv, H);
      b.gemm_batched_each(B, ss, sq, sk, true, false, tk, dkv, tq, 1.f, ds, tk, sp, a.q, inner, dkv, 0.f, dk, inner,
                          dkv, H);
    }
    b.gemm(true, false, inner, d, B * tq, 1.f, dq, inner, a.xn, d, 1.f, gq, d);  // dWq += dq^T xn
    ready(s, p + ".q");
    b.gemm(true, false, inner, d, B * tk, 1.f, dk, inner, xkv, d, 1.f, gk, d);   // dWk += dk^T xkv
    ready(s, p + ".k");
    b.gemm(true, false, inner, d, B * tk, 1.f, dv, inner, xkv, d, 1.f, gv, d);   // dWv += dv^T xkv
    ready(s, p + ".v");
    b.gemm(false, false, B * tq, d, inner, 1.f, dq, inner, wq, d, 0.f, dxn, d);  // dxn = dq Wq
    rounded(dxn, int64_t(B) * tq * d);
    b.gemm(false, false, B * tk, d, inner, 1.f, dk, inner, wk, d, 1.f, dxkv, d); // dxkv += dk Wk
    rounded(dxkv, int64_t(B) * tk * d);
    b.gemm(false, false, B * tk, d, inner, 1.f, dv, inner, wv, d, 1.f, dxkv, d); // dxkv += dv Wv
    rounded(dxkv, int64_t(B) * tk * d);
    tp_all_reduce(dxn, int64_t(B) * tq * d, Flow::Backward, p + "-attention input gradient",
                  bool(injected_fault(Fault::TpSkipAttentionAllReduce)));
    release_all(tmp);
  }

  // ---------------------------------------------------------------- blocks
  BlockState alloc_block(std::vector<void*>& o, MemCategory c, int stack) {
    const int T = seq(stack);
    const int64_t N = int64_t(B) * T;
    BlockState st;
    st.self = alloc_attn(o, c, T, T);
    st.x1 = alloc(o, N * d, c);
    if (stack == 1) {
      st.cross = alloc_attn(o, c, Td, Te);
      st.x2 = alloc(o, N * d, c);
    }
    st.rstd_ff = alloc_f32(o, N, c);
    st.xn_ff = alloc(o, N * d, c);
    if (gated()) {  // the gate's two inputs, read again by its backward
      st.u = alloc(o, N * ff, c);
      st.v = alloc(o, N * ff, c);
    }
    st.h = alloc(o, N * ff, c);
    return st;
  }

  // The block's forward from hidden[stack][layer] into out [N, d], saving into st.
  // Pre-norm residual sub-layers: x1 = x + SelfAttn(ln1 x); [x2 = x1 + CrossAttn(ln2 x1,
  // enc_out)]; out = r + wo relu(wi ln_ff r), r the last residual stream (gated GELU:
  // out = r + wo (gelu_tanh(wi_0 ln_ff r) * wi_1 ln_ff r)).
  void block_compute(const Micro& mb, int pi, CBuf W, BlockState& st, Buf out) {
    const Piece& s = pieces[pi];
    const int stack = stack_of(s), T = seq(stack), N = B * T;
    const CBuf x = mb.hidden[stack][s.layer];
    b.rmsnorm_forward_residual(st.self.xn, st.self.rstd, st.x1, x, param(W, s, "ln1"), N, d, kNormEps);
    attention_forward(mb, W, s, "self", st.self, st.self.xn, T, T, stack, /*causal=*/stack == 1, st.x1);
    CBuf r = st.x1;
    std::string ln_ff = "ln2";
    if (stack == 1) {
      b.rmsnorm_forward_residual(st.cross.xn, st.cross.rstd, st.x2, st.x1, param(W, s, "ln2"), N, d, kNormEps);
      attention_forward(mb, W, s, "cross", st.cross, mb.enc_out, Td, Te, /*bias_stack=*/-1, false, st.x2);
      r = st.x2;
      ln_ff = "ln3";
    }
    b.rmsnorm_forward_residual(st.xn_ff, st.rstd_ff, out, r, param(W, s, ln_ff), N, d, kNormEps);  // out = r
    if (gated()) {
      b.gemm(false, true, N, ff, d, 1.f, st.xn_ff, d, param(W, s, "wi_0"), d, 0.f, st.u, ff);  // u [N, ff]
      b.gemm(false, true, N, ff, d, 1.f, st.xn_ff, d, param(W, s, "wi_1"), d, 0.f, st.v, ff);  // v [N, ff]
      b.gated_gelu_forward(st.h, st.u, st.v, int64_t(N) * ff);
    } else {
      b.gemm_relu(false, true, N, ff, d, 1.f, st.xn_ff, d, param(W, s, "wi"), d, 0.f, st.h, ff);  // h [N, ff]
    }
    add_row_parallel(out, int64_t(N) * d, "feed-forward output", [&](Buf dst, float beta) {  // out += h Wo^T
      b.gemm(false, true, N, d, ff, 1.f, st.h, ff, param(W, s, "wo"), ff, beta, dst, d);
    }, bool(injected_fault(Fault::TpSkipFeedForwardAllReduce)));
  }

  // d_hidden[stack] holds d(out) on entry and d(x) on exit. The stack's accumulators
  // (dbias[stack], and d_enc_out in the decoder) start at zero in its last block's backward,
  // the first to add to them; a pipeline stage without that block receives them instead
  // (unfused: the table's gradient in dtable, while dbias starts at zero in the stage's
  // last block of the stack, and its first folds dbias into dtable).
  void block_backward(const Micro& mb, int pi, CBuf W, Buf G, const BlockState& st) {
    const Piece& s = pieces[pi];
    const int stack = stack_of(s), T = seq(stack), N = B * T;
    const CBuf x = mb.hidden[stack][s.layer];
    const Buf dy = d_hidden[stack];  // [N, d], the residual stream's gradient
    if (s.layer == L - 1) {
      b.fill(dbias[stack], 0.f, dbias_numel(stack));
      if (dtable[stack]) b.fill(dtable[stack], 0.f, table_numel());
      if (stack == 1) b.fill(d_enc_out, 0.f, int64_t(Ne) * d);
    } else if (dtable[stack] && starts_stage(pi + 1)) {  // the later stages' sum is in dtable
      b.fill(dbias[stack], 0.f, dbias_numel(stack));
    }
    std::vector<void*> tmp;
    const Buf dxn = alloc(tmp, int64_t(N) * d, MemCategory::Workspace);  // [N, d] d(normed input)

    // FFN: out = r + h Wo^T, h = relu(xn_ff Wi^T) or gelu_tanh(xn_ff Wi_0^T) * xn_ff Wi_1^T
    {
      const CBuf r = stack == 1 ? st.x2 : st.x1;
      const std::string ln_ff = stack == 1 ? "ln3" : "ln2";
      std::vector<void*> tff;
      const Buf dh = alloc(tff, int64_t(N) * ff, MemCategory::Workspace);  // [N, ff]
      b.gemm(true, false, d, ff, N, 1.f, dy, d, st.h, ff, 1.f, grad(G, s, "wo"), ff);  // dWo += dy^T h
      ready(s, "wo");
      b.gemm(false, false, N, ff, d, 1.f, dy, d, param(W, s, "wo"), ff, 0.f, dh, ff);  // dh = dy Wo
      if (gated()) {  // du (in dh's place) and dv; wi_1's gradient first, as the flat buffer reversed
        const Buf du = dh, dv = alloc(tff, int64_t(N) * ff, MemCategory::Workspace);
        b.gated_gelu_backward(du, dv, dh, st.u, st.v, int64_t(N) * ff);
        b.gemm(true, false, ff, d, N, 1.f, dv, ff, st.xn_ff, d, 1.f, grad(G, s, "wi_1"), d);  // dWi_1 += dv^T xn
        ready(s, "wi_1");
        b.gemm(true, false, ff, d, N, 1.f, du, ff, st.xn_ff, d, 1.f, grad(G, s, "wi_0"), d);  // dWi_0 += du^T xn
        ready(s, "wi_0");
        b.gemm(false, false, N, d, ff, 1.f, du, ff, param(W, s, "wi_0"), d, 0.f, dxn, d);     // dxn = du Wi_0
        rounded(dxn, int64_t(N) * d);
        b.gemm(false, false, N, d, ff, 1.f, dv, ff, param(W, s, "wi_1"), d, 1.f, dxn, d);     // dxn += dv Wi_1
        rounded(dxn, int64_t(N) * d);
      } else {
        b.relu_backward(dh, st.h, int64_t(N) * ff);
        b.gemm(true, false, ff, d, N, 1.f, dh, ff, st.xn_ff, d, 1.f, grad(G, s, "wi"), d);  // dWi += dh^T xn
        ready(s, "wi");
        b.gemm(false, false, N, d, ff, 1.f, dh, ff, param(W, s, "wi"), d, 0.f, dxn, d);     // dxn = dh Wi
        rounded(dxn, int64_t(N) * d);
      }
      tp_all_reduce(dxn, int64_t(N) * d, Flow::Backward, "feed-forward input gradient");
      b.rmsnorm_backward(dy, grad(G, s, ln_ff), dxn, r, param(W, s, ln_ff), st.rstd_ff, N, d);
      ready(s, ln_ff);
      release_all(tff);
    }
    if (stack == 1) {  // cross-attention: K/V gradients flow to the encoder output
      attention_backward(mb, W, G, s, "cross", st.cross, mb.enc_out, Td, Te, dy, dxn, d_enc_out, -1, false);
      b.rmsnorm_backward(dy, grad(G, s, "ln2"), dxn, st.x1, param(W, s, "ln2"), st.cross.rstd, N, d);
      ready(s, "ln2");
    }
    attention_backward(mb, W, G, s, "self", st.self, st.self.xn, T, T, dy, dxn, dxn, stack, stack == 1);
    b.rmsnorm_backward(dy, grad(G, s, "ln1"), dxn, x, param(W, s, "ln1"), st.self.rstd, N, d);
    ready(s, "ln1");
    if (s.layer == 0 && fused()) {  // every block of the stack has added its d(table) by now
      b.add(grad(G, s, "rel_bias"), dbias[stack], table_numel());
      ready(s, "rel_bias");
    } else if (dtable[stack] && (s.layer == 0 || starts_stage(pi))) {  // a stage's first block of the stack
      b.position_bias_backward(dtable[stack], dbias[stack], buckets[stack], H, T, T);
      if (s.layer == 0) {  // the whole stack's sum: into the table's gradient
        b.add(grad(G, s, "rel_bias"), dtable[stack], table_numel());
        ready(s, "rel_bias");
      }  // else dtable crosses the cut before this block
    } else if (s.layer == 0) {  // every block of the stack has added its d(bias) by now
      b.position_bias_backward(grad(G, s, "rel_bias"), dbias[stack], buckets[stack], H, T, T);
      ready(s, "rel_bias");
    }
    release_all(tmp);
  }

  // The stack's last block is on a later pipeline stage: its blocks there need the table.
  bool stack_continues(int stack) const { return (stack == 0 ? L : 2 * L + 1) >= part.last; }

  void block_forward(Micro& mb, int pi, CBuf W) {
    const Piece& s = pieces[pi];
    const int stack = stack_of(s), T = seq(stack);
    const Buf out = act(mb, pi, int64_t(B) * T * d);  // [N, d], the next block's input
    if (s.layer == 0 && fused()) {  // the stack's table, read by every block of the stack
      mb.bias[stack] = act(mb, pi, table_numel());
      b.copy(mb.bias[stack], param(W, s, "rel_bias"), table_numel());
      if (stack_continues(stack)) mb.table[stack] = mb.bias[stack];
    } else if (s.layer == 0) {  // the stack's position bias, reused by every block of the stack
      mb.bias[stack] = act(mb, pi, int64_t(H) * T * T);
      b.position_bias_forward(mb.bias[stack], param(W, s, "rel_bias"), buckets[stack], H, T, T);
      if (stack_continues(stack)) {
        mb.table[stack] = act(mb, pi, table_numel());
        b.copy(mb.table[stack], param(W, s, "rel_bias"), table_numel());
      }
    } else if (!local(pi - 1)) {  // a pipeline stage's first block: the table it was sent
      if (fused()) {
        mb.bias[stack] = mb.table[stack];
      } else {
        mb.bias[stack] = act(mb, pi, int64_t(H) * T * T);
        b.position_bias_forward(mb.bias[stack], mb.table[stack], buckets[stack], H, T, T);
      }
    }
    if (checkpointing) {  // keep only the input (owned by the previous piece) and the output
      std::vector<void*> tmp;
      BlockState st = alloc_block(tmp, MemCategory::Workspace, stack);
      block_compute(mb, pi, W, st, out);
      release_all(tmp);
    } else {
      BlockState& st = mb.block_state[size_t(pi - part.first)];
      st = alloc_block(mb.saved[pi], MemCategory::Activations, stack);
      block_compute(mb, pi, W, st, out);
    }
    mb.hidden[stack][s.layer + 1] = out;
  }

  void block_backward_piece(Micro& mb, int pi, CBuf W, Buf G) {
    const Piece& s = pieces[pi];
    const int stack = stack_of(s);
    BlockState& st = mb.block_state[size_t(pi - part.first)];
    if (checkpointing) {  // recompute into the (identical) output still held by this piece
      st = alloc_block(mb.saved[pi], MemCategory::Activations, stack);
      block_compute(mb, pi, W, st, mb.hidden[stack][s.layer + 1]);
    }
    block_backward(mb, pi, W, G, st);
  }

  // ---------------------------------------------------------------- embedding, bridge, head
  // E and GE: the embedding unit's parameter and gradient (the bridge and a tied head read it
  // besides their own unit, W and G).
  void embed_forward(Micro& mb, int pi, CBuf E) {
    mb.hidden[0][0] = act(mb, pi, int64_t(Ne) * d);  // [Ne, d] = shared[enc_ids]
    b.embedding_forward(mb.hidden[0][0], E + shared_offset(), mb.enc_ids, Ne, d);
    tp_all_reduce(mb.hidden[0][0], int64_t(Ne) * d, Flow::Forward, "encoder embedding");  // vocabulary-parallel: one rank holds each row
  }
  void embed_backward(Micro& mb, int pi, Buf GE) {
    b.embedding_backward(GE + shared_offset(), d_hidden[0], mb.enc_ids, Ne, d);
    shared_ready(pi);  // after the Head's and the Bridge's contributions, where this part runs them
  }

  void bridge_forward(Micro& mb, int pi, CBuf W, CBuf E) {
    const Piece& s = pieces[pi];
    mb.enc_out = act(mb, pi, int64_t(Ne) * d);  // [Ne, d] encoder final norm
    mb.bridge_rstd = alloc_f32(mb.saved[pi], Ne, MemCategory::Activations);
    b.rmsnorm_forward(mb.enc_out, mb.bridge_rstd, mb.hidden[0][L], param(W, s, "encoder.final_norm"), Ne, d,
                      kNormEps);
    mb.hidden[1][0] = act(mb, pi, int64_t(Nd) * d);  // [Nd, d] = shared[dec_ids]
    b.embedding_forward(mb.hidden[1][0], E + shared_offset(), mb.dec_ids, Nd, d);
    tp_all_reduce(mb.hidden[1][0], int64_t(Nd) * d, Flow::Forward, "decoder embedding");
  }
  void bridge_backward(Micro& mb, int pi, CBuf W, Buf G, Buf GE) {
    const Piece& s = pieces[pi];
    b.embedding_backward(GE + shared_offset(), d_hidden[1], mb.dec_ids, Nd, d);
    shared_ready(pi);
    b.fill(d_hidden[0], 0.f, int64_t(Ne) * d);
    tp_all_reduce(d_enc_out, int64_t(Ne) * d, Flow::Backward, "encoder output gradient (the cross-attention K/V's)");  // every decoder block's cross K/V part, summed once
    b.rmsnorm_backward(d_hidden[0], grad(G, s, "encoder.final_norm"), d_enc_out, mb.hidden[0][L],
                       param(W, s, "encoder.final_norm"), mb.bridge_rstd, Ne, d);
    ready(s, "encoder.final_norm");
  }

  // The LM head's weight [V, d]: shared (tied, in the embedding unit) or lm_head (untied, in
  // the head's own unit).
  CBuf head_weight(const Piece& s, CBuf W, CBuf E) const {
    return spec.tie_embeddings ? E + shared_offset() : param(W, s, "lm_head");
  }
  // logits = (hn · d^-0.5) shared^T (HF's rescale before a tied LM head), folded into alpha;
  // untied: logits = hn lm_head^T (T5ForConditionalGeneration rescales only a tied head).
  void head_forward(Micro& mb, int pi, CBuf W, CBuf E) {
    const Piece& s = pieces[pi];
    const float rescale = head_rescale();
    mb.head_hn = act(mb, pi, int64_t(Nd) * d);  // [Nd, d]
    mb.head_rstd = alloc_f32(mb.saved[pi], Nd, MemCategory::Activations);
    mb.logits = act(mb, pi, int64_t(Nd) * V);   // [Nd, V]
    b.rmsnorm_forward(mb.head_hn, mb.head_rstd, mb.hidden[1][L], param(W, s, "decoder.final_norm"), Nd, d,
                      kNormEps);
    b.gemm(false, true, Nd, V, d, rescale, mb.head_hn, d, head_weight(s, W, E), d, 0.f, mb.logits, V);
    if (!group_sums()) return b.cross_entropy(mb.logits, mb.losses, mb.labels, Nd, V, grad_scale);  // logits := dlogits
    // Megatron-LM's parallel cross-entropy: the rows' max and Σexp (with the label's logit)
    // all-reduced over the group; nobody gathers the logits.
    std::vector<void*> tmp;
    float* row_max = alloc_f32(tmp, Nd, MemCategory::Workspace);
    float* sums = alloc_f32(tmp, 2 * int64_t(Nd), MemCategory::Workspace);
    b.cross_entropy_max(mb.logits, row_max, Nd, V);
    tp_all_reduce(row_max, Nd, Flow::Forward, "cross-entropy row maxima", false, ReduceOp::Max);
    b.cross_entropy_sums(mb.logits, row_max, mb.labels, sums, Nd, V);
    rounded(sums, 2 * int64_t(Nd));
    tp_all_reduce(sums, 2 * int64_t(Nd), Flow::Forward, "cross-entropy sums (Σexp; the label's logit)");
    b.cross_entropy_finish(mb.logits, mb.losses, row_max, sums, mb.labels, Nd, V, grad_scale);  // logits := dlogits
    release_all(tmp);
  }
  void head_backward(Micro& mb, int pi, CBuf W, Buf G, CBuf E, Buf GE) {
    const Piece& s = pieces[pi];
    const float rescale = head_rescale();
    std::vector<void*> tmp;
    const Buf dhn = alloc(tmp, int64_t(Nd) * d, MemCategory::Workspace);  // [Nd, d]
    // dhead += r · dlogits^T hn [V, d];  dhn = r · dlogits head [Nd, d]  (head: shared or lm_head)
    const Buf dhead = spec.tie_embeddings ? GE + shared_offset() : grad(G, s, "lm_head");
    b.gemm(true, false, V, d, Nd, rescale, mb.logits, V, mb.head_hn, d, 1.f, dhead, d);
    if (spec.tie_embeddings) shared_ready(pi);  // here only on a stage without the other embedding pieces
    else ready(s, "lm_head");
    b.gemm(false, false, Nd, d, V, rescale, mb.logits, V, head_weight(s, W, E), d, 0.f, dhn, d);
    rounded(dhn, int64_t(Nd) * d);
    tp_all_reduce(dhn, int64_t(Nd) * d, Flow::Backward, "LM head input gradient");
    b.fill(d_hidden[1], 0.f, int64_t(Nd) * d);
    b.rmsnorm_backward(d_hidden[1], grad(G, s, "decoder.final_norm"), dhn, mb.hidden[1][L],
                       param(W, s, "decoder.final_norm"), mb.head_rstd, Nd, d);
    ready(s, "decoder.final_norm");
    release_all(tmp);
  }

  // ---------------------------------------------------------------- dispatch
  void forward(int pi, const T5Step::Params& P, int m) {
    check_piece(pi);
    Micro& mb = micro_batch(m);
    release_saved(mb, pi);  // a repeated forward replaces the earlier one
    const Piece& s = pieces[pi];
    const CBuf W = P(s.unit), E = s.embedding >= 0 ? P(s.embedding) : CBuf();
    switch (s.kind) {
      case Piece::EncoderEmbed: embed_forward(mb, pi, W); break;
      case Piece::EncoderBlock:
      case Piece::DecoderBlock: block_forward(mb, pi, W); break;
      case Piece::Bridge: bridge_forward(mb, pi, W, E); break;
      case Piece::Head: head_forward(mb, pi, W, E); break;
    }
    mb.forwarded[pi] = true;
  }

  void backward(int pi, const T5Step::Params& P, const T5Step::Grads& Gs, int m) {
    check_piece(pi);
    Micro& mb = micro_batch(m);
    SB_ASSERT(mb.forwarded[pi], std::string("backward of piece ") + std::to_string(pi) +
                                 " without its forward");
    const Piece& s = pieces[pi];
    const CBuf W = P(s.unit), E = s.embedding >= 0 ? P(s.embedding) : CBuf();
    const Buf G = Gs(s.unit), GE = s.embedding >= 0 ? Gs(s.embedding) : Buf();
    switch (s.kind) {
      case Piece::EncoderEmbed: embed_backward(mb, pi, G); break;
      case Piece::EncoderBlock:
      case Piece::DecoderBlock: block_backward_piece(mb, pi, W, G); break;
      case Piece::Bridge: bridge_backward(mb, pi, W, G, GE); break;
      case Piece::Head: head_backward(mb, pi, W, G, E, GE); break;
    }
    release_saved(mb, pi);
    if (pi == part.first) release_all(mb.received);  // its inputs from the previous pipeline stage
  }

  void check_piece(int pi) const {
    SB_ASSERT(local(pi), "piece " + std::to_string(pi) + " is not run here (pieces " + std::to_string(part.first) +
                             " to " + std::to_string(part.last - 1) + ")");
  }

  // ---------------------------------------------------------------- pipeline cuts
  // The cut before piece k: encoder region k = 1 .. L + 1 (before encoder block k - 1, or
  // the bridge), decoder region k = L + 2 .. 2L + 2 (before decoder block k - L - 2, or the
  // head). Each tensor: its buffer in the micro-batch's state, and its gradient.
  enum class CutKind { EncoderHidden, EncoderTable, DecoderHidden, EncoderOutput, DecoderTable };
  std::vector<std::pair<CutKind, T5Step::CutTensor>> cut(int k) const {
    SB_ASSERT(k >= 1 && k < int(pieces.size()), "no cut before piece " + std::to_string(k));
    std::vector<std::pair<CutKind, T5Step::CutTensor>> c;
    const int64_t enc = int64_t(Ne) * d, dec = int64_t(Nd) * d;
    if (k <= L + 1) {
      const int l = k - 1;  // the first encoder block after the cut (L: the bridge)
      c.push_back({CutKind::EncoderHidden, {"encoder hidden state", enc, enc}});
      if (l >= 1 && l < L) c.push_back({CutKind::EncoderTable, {"encoder position bias", table_numel(), table_numel()}});
    } else {
      const int l = k - L - 2;  // the first decoder block after the cut (L: the head)
      c.push_back({CutKind::DecoderHidden, {"decoder hidden state", dec, dec}});
      if (l < L) c.push_back({CutKind::EncoderOutput, {"encoder output", enc, enc}});
      if (l >= 1 && l < L) c.push_back({CutKind::DecoderTable, {"decoder position bias", table_numel(), table_numel()}});
    }
    return c;
  }
  Buf& cut_buffer(Micro& mb, int k, CutKind kind) const {
    switch (kind) {
      case CutKind::EncoderHidden: return mb.hidden[0][size_t(k - 1)];
      case CutKind::EncoderTable: return mb.table[0];
      case CutKind::DecoderHidden: return mb.hidden[1][size_t(k - L - 2)];
      case CutKind::EncoderOutput: return mb.enc_out;
      case CutKind::DecoderTable: return mb.table[1];
    }
    SB_FATAL("unknown cut tensor");
  }
  Buf cut_gradient(CutKind kind) const {
    switch (kind) {
      case CutKind::EncoderHidden: return d_hidden[0];
      case CutKind::EncoderTable: return table_gradient(0);
      case CutKind::DecoderHidden: return d_hidden[1];
      case CutKind::EncoderOutput: return d_enc_out;
      case CutKind::DecoderTable: return table_gradient(1);
    }
    SB_FATAL("unknown cut tensor");
  }
};

T5Step::T5Step(const ModelSpec& spec, Backend& backend, DType dtype, const StepShape& shape,
               bool checkpointing, float grad_scale, AttentionImpl attention, TensorGroup tp, PipelinePart part)
    : impl_(new Impl(spec, backend, dtype, shape, checkpointing, grad_scale, attention, tp, part)) {}

T5Step::~T5Step() { delete impl_; }

const ModelSpec& T5Step::spec() const { return impl_->spec; }
const std::vector<UnitSpec>& T5Step::units() const { return impl_->units; }
const TensorGroup& T5Step::tensor_group() const { return impl_->tp; }
const PipelinePart& T5Step::part() const { return impl_->part; }
bool T5Step::holds_unit(int unit) const {
  return pieces_use_unit(impl_->pieces, impl_->part.first, impl_->part.last, unit);
}
const std::vector<Piece>& T5Step::pieces() const { return impl_->pieces; }
DType T5Step::dtype() const { return impl_->dtype; }
AttentionImpl T5Step::attention() const { return impl_->attention; }
void T5Step::set_grad_scale(float grad_scale) { impl_->grad_scale = grad_scale; }
void T5Step::set_grad_ready_hook(GradReadyHook hook) { impl_->grad_ready = std::move(hook); }
void T5Step::set_group_sum_hook(GroupSumHook* hook) { impl_->sum_hook = hook; }

void T5Step::set_tokens(const Tokens& t, int micro) {
  Impl& m = *impl_;
  if (!m.b.holds_data()) return;  // the plan: no tokens are built for it
  Micro& mb = m.micro_batch(micro);
  SB_ASSERT(int64_t(t.enc_ids.size()) == m.Ne, "enc_ids size does not match the step shape");
  SB_ASSERT(int64_t(t.dec_ids.size()) == m.Nd, "dec_ids size does not match the step shape");
  SB_ASSERT(int64_t(t.labels.size()) == m.Nd, "labels size does not match the step shape");
  for (const auto* ids : {&t.enc_ids, &t.dec_ids, &t.labels})
    for (int id : *ids)
      SB_ASSERT(id >= 0 && id < m.spec.vocab, "token id " + std::to_string(id) + " out of vocabulary");
  // Tensor-parallel: ids as rows of this rank's vocabulary slice, -1 where another rank's.
  // Each piece takes the ids it uses: the encoder's, the decoder's, the labels.
  auto upload = [&](int* dst, const std::vector<int>& ids) {
    if (!dst) return;
    std::vector<int> out(ids);
    for (int& id : out) id = id >= m.vocab_begin && id < m.vocab_begin + m.V ? id - m.vocab_begin : -1;
    m.b.upload(dst, out.data(), out.size() * sizeof(int));
  };
  upload(mb.enc_ids, t.enc_ids);
  upload(mb.dec_ids, t.dec_ids);
  upload(mb.labels, t.labels);
}

void T5Step::forward(int piece, const Params& params, int micro) { impl_->forward(piece, params, micro); }
void T5Step::backward(int piece, const Params& params, const Grads& grads, int micro) {
  impl_->backward(piece, params, grads, micro);
}

double T5Step::loss_sum() {
  Impl& m = *impl_;
  if (!m.b.holds_data() || !m.runs(Piece::Head)) return 0;  // the plan; a piece without the head
  double sum = 0;
  std::vector<float> host(m.Nd);
  for (const Micro& mb : m.micro) {
    m.b.download(host.data(), mb.losses, host.size() * sizeof(float));
    for (float l : host) sum += l;
  }
  return sum;
}

std::vector<T5Step::CutTensor> T5Step::cut(int k) const {
  std::vector<CutTensor> out;
  for (const auto& [kind, t] : impl_->cut(k)) out.push_back(t);
  return out;
}

Buf T5Step::cut_input(int k, int micro, int i) {
  Impl& m = *impl_;
  Micro& mb = m.micro_batch(micro);
  const auto c = m.cut(k);
  const Buf x = m.alloc(mb.received, c[size_t(i)].second.numel, MemCategory::Activations);
  m.cut_buffer(mb, k, c[size_t(i)].first) = x;
  return x;
}

CBuf T5Step::cut_output(int k, int micro, int i) {
  Impl& m = *impl_;
  return m.cut_buffer(m.micro_batch(micro), k, m.cut(k)[size_t(i)].first);
}

Buf T5Step::cut_grad_input(int k, int i) { return impl_->cut_gradient(impl_->cut(k)[size_t(i)].first); }
CBuf T5Step::cut_grad_output(int k, int i) const { return impl_->cut_gradient(impl_->cut(k)[size_t(i)].first); }

}  // namespace sb
