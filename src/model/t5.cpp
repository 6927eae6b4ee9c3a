// The T5 training step (Hugging Face T5 semantics) as forward/backward pieces: the step's
// context, its micro-batches, the dispatch to the pieces' code and the pipeline cuts. The
// pieces' code, the data flow between them and where every tensor is named: t5_parts.h.
#include <algorithm>
#include <string>
#include <vector>

#include "shardbench/core/check.h"
#include "shardbench/core/fault.h"
#include "shardbench/model/t5.h"
#include "t5_parts.h"

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

namespace t5 {

TensorRef tensor_ref(const std::vector<UnitSpec>& units, int u, const std::string& name) {
  const std::vector<TensorSpec>& t = units[size_t(u)].tensors;
  for (size_t i = 0; i < t.size(); ++i)
    if (t[i].name == name) return TensorRef{u, int(i), t[i].offset};
  SB_FATAL("unit " + units[size_t(u)].name + " has no tensor " + name);
}

// The model's units: the planner's, where it keeps them, else built for this model alone.
static std::shared_ptr<const std::vector<UnitSpec>> step_units(const T5StepConfig& c) {
  const TensorPartition tp{c.tp.size, c.tp.rank};
  return c.units ? c.units->units(c.spec, tp) : std::make_shared<const std::vector<UnitSpec>>(model_units(c.spec, tp));
}

Context::Context(Backend& be, const T5StepConfig& c)
    : b(be), dtype(c.dtype), spec(c.spec), shape(c.shape), checkpointing(c.checkpointing), grad_scale(c.grad_scale),
      attention(c.attention), tp(c.tp), part(c.part),
      shared_units((validate(c.spec), step_units(c))), units(*shared_units) {
  const ModelSpec& s = spec;
  const StepShape& x = shape;
  SB_ASSERT(tp.size == 1 || (tp.comm && tp.comm->size() == tp.size), "a tensor-parallel group needs its communicator");
  SB_ASSERT(x.batch > 0 && x.enc_len > 0 && x.dec_len > 0, "step shape must be positive");
  SB_ASSERT(s.num_buckets >= 4 && s.max_distance > s.num_buckets / 2,
            "relative attention needs num_buckets >= 4 and max_distance > num_buckets / 2");
  B = int(x.batch), Te = int(x.enc_len), Td = int(x.dec_len);
  d = int(s.d_model), ff = int(s.d_ff / tp.size), H = int(s.heads / tp.size), dkv = int(s.d_kv);
  inner = H * dkv, V = int(s.vocab / tp.size), L = int(s.layers);
  vocab_begin = V * tp.rank;
  if (tp.size > 1 && injected_fault(Fault::TpWrongVocabOffset)) vocab_begin += 1;  // tests only: off by one token
  Ne = B * Te, Nd = B * Td;

  pieces = model_pieces(s);
  SB_ASSERT(pieces.size() == units.size(), "one unit per piece");
  if (part.last < 0) part.last = int(pieces.size());
  SB_ASSERT(0 <= part.first && part.first < part.last && part.last <= int(pieces.size()) &&
                part.micro_batches >= 1, "bad pipeline part");
  embedding = embedding_tensors(units, pieces[0].unit);
}

bool Context::starts_stage(int pi) const {
  return std::find(part.stage_starts.begin(), part.stage_starts.end(), pi) != part.stage_starts.end();
}

bool Context::stack_divided(int st) const {
  const int first = st == 0 ? 1 : L + 2;
  for (int pi = first + 1; pi < first + L; ++pi)
    if (starts_stage(pi)) return true;
  return false;
}

void Context::reduce(Buf x, int64_t n, Flow flow, bool skipped, ReduceOp op) {
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
}

}  // namespace t5

using t5::Micro;

struct T5Step::Impl {
  t5::Context c;
  t5::Attention attention;
  t5::Blocks blocks;
  t5::Ends ends;
  std::vector<Micro> micro;

  Impl(Backend& be, const T5StepConfig& config) : c(be, config), attention(c), blocks(c, attention), ends(c) {
    blocks.resolve();
    ends.resolve();
    Backend& b = c.b;
    const MemCategory ws = MemCategory::Workspace;
    micro.resize(size_t(c.part.micro_batches));
    for (Micro& m : micro) {
      m.saved.resize(c.pieces.size());
      m.block_state.resize(size_t(c.part.last - c.part.first));
      m.forwarded.assign(c.pieces.size(), false);
      m.hidden[0].assign(size_t(c.L + 1), Buf());
      m.hidden[1].assign(size_t(c.L + 1), Buf());
      if (c.runs(Piece::EncoderEmbed)) m.enc_ids = b.alloc_ints(c.Ne, ws);
      if (c.runs(Piece::Bridge)) m.dec_ids = b.alloc_ints(c.Nd, ws);
      if (c.runs(Piece::Head)) m.labels = b.alloc_ints(c.Nd, ws);
    }
    attention.allocate();
    if (c.runs(Piece::Head))
      for (Micro& m : micro) m.losses = b.alloc_floats(c.Nd, ws);
    const int64_t enc = int64_t(c.Ne) * c.d, dec = int64_t(c.Nd) * c.d;
    if (c.runs(Piece::EncoderEmbed) || c.runs(Piece::EncoderBlock) || c.runs(Piece::Bridge))
      c.d_hidden[0] = b.alloc_buf(enc, c.dtype, ws);
    if (c.runs(Piece::Bridge) || c.runs(Piece::DecoderBlock) || c.runs(Piece::Head))
      c.d_hidden[1] = b.alloc_buf(dec, c.dtype, ws);
    if (c.runs(Piece::Bridge) || c.runs(Piece::DecoderBlock)) c.d_enc_out = b.alloc_buf(enc, c.dtype, ws);
  }

  ~Impl() {
    for (Micro& m : micro) {
      for (size_t i = 0; i < c.pieces.size(); ++i) release_saved(m, int(i));
      c.release_all(m.received);
      for (void* p : {(void*)m.enc_ids, (void*)m.dec_ids, (void*)m.labels, (void*)m.losses}) c.b.release(p);
    }
    attention.release();
    for (void* p : {c.d_hidden[0].ptr, c.d_hidden[1].ptr, c.d_enc_out.ptr}) c.b.release(p);
  }

  // Micro-batch m's tensors: every call that runs or feeds one takes it from here.
  Micro& micro_batch(int m) {
    SB_ASSERT(m >= 0 && m < c.part.micro_batches, "micro-batch " + std::to_string(m) + " out of range");
    return micro[size_t(m)];
  }
  void release_saved(Micro& mb, int pi) {
    c.release_all(mb.saved[size_t(pi)]);
    mb.forwarded[size_t(pi)] = false;
  }

  // ---------------------------------------------------------------- dispatch
  void forward(int pi, const T5Step::Params& P, int m) {
    check_piece(pi);
    Micro& mb = micro_batch(m);
    release_saved(mb, pi);  // a repeated forward replaces the earlier one
    const Piece& s = c.pieces[size_t(pi)];
    const CBuf W = P(s.unit), E = s.embedding >= 0 ? P(s.embedding) : CBuf();
    switch (s.kind) {
      case Piece::EncoderEmbed: ends.embed_forward(mb, pi, W); break;
      case Piece::EncoderBlock:
      case Piece::DecoderBlock: blocks.forward(mb, pi, W); break;
      case Piece::Bridge: ends.bridge_forward(mb, pi, W, E); break;
      case Piece::Head: ends.head_forward(mb, pi, W, E); break;
    }
    mb.forwarded[size_t(pi)] = true;
  }

  void backward(int pi, const T5Step::Params& P, const T5Step::Grads& Gs, int m) {
    check_piece(pi);
    Micro& mb = micro_batch(m);
    SB_ASSERT(mb.forwarded[size_t(pi)], std::string("backward of piece ") + std::to_string(pi) +
                                            " without its forward");
    const Piece& s = c.pieces[size_t(pi)];
    const CBuf W = P(s.unit), E = s.embedding >= 0 ? P(s.embedding) : CBuf();
    const Buf G = Gs(s.unit), GE = s.embedding >= 0 ? Gs(s.embedding) : Buf();
    switch (s.kind) {
      case Piece::EncoderEmbed: ends.embed_backward(mb, pi, G); break;
      case Piece::EncoderBlock:
      case Piece::DecoderBlock: blocks.backward(mb, pi, W, G); break;
      case Piece::Bridge: ends.bridge_backward(mb, pi, W, G, GE); break;
      case Piece::Head: ends.head_backward(mb, pi, W, G, E, GE); break;
    }
    release_saved(mb, pi);
    if (pi == c.part.first) c.release_all(mb.received);  // its inputs from the previous pipeline stage
  }

  void check_piece(int pi) const {
    SB_ASSERT(c.local(pi), "piece " + std::to_string(pi) + " is not run here (pieces " +
                               std::to_string(c.part.first) + " to " + std::to_string(c.part.last - 1) + ")");
  }

  // ---------------------------------------------------------------- pipeline cuts
  // The cut before piece k: encoder region k = 1 .. L + 1 (before encoder block k - 1, or
  // the bridge), decoder region k = L + 2 .. 2L + 2 (before decoder block k - L - 2, or the
  // head). Each tensor: its buffer in the micro-batch's state, and its gradient.
  enum class CutKind { EncoderHidden, EncoderTable, DecoderHidden, EncoderOutput, DecoderTable };
  std::vector<std::pair<CutKind, T5Step::CutTensor>> cut(int k) const {
    SB_ASSERT(k >= 1 && k < int(c.pieces.size()), "no cut before piece " + std::to_string(k));
    std::vector<std::pair<CutKind, T5Step::CutTensor>> out;
    const int L = c.L;
    const int64_t enc = int64_t(c.Ne) * c.d, dec = int64_t(c.Nd) * c.d, table = c.table_numel();
    if (k <= L + 1) {
      const int l = k - 1;  // the first encoder block after the cut (L: the bridge)
      out.push_back({CutKind::EncoderHidden, {"encoder hidden state", enc, enc}});
      if (l >= 1 && l < L) out.push_back({CutKind::EncoderTable, {"encoder position bias", table, table}});
    } else {
      const int l = k - L - 2;  // the first decoder block after the cut (L: the head)
      out.push_back({CutKind::DecoderHidden, {"decoder hidden state", dec, dec}});
      if (l < L) out.push_back({CutKind::EncoderOutput, {"encoder output", enc, enc}});
      if (l >= 1 && l < L) out.push_back({CutKind::DecoderTable, {"decoder position bias", table, table}});
    }
    return out;
  }
  Buf& cut_buffer(Micro& mb, int k, CutKind kind) const {
    switch (kind) {
      case CutKind::EncoderHidden: return mb.hidden[0][size_t(k - 1)];
      case CutKind::EncoderTable: return mb.table[0];
      case CutKind::DecoderHidden: return mb.hidden[1][size_t(k - c.L - 2)];
      case CutKind::EncoderOutput: return mb.enc_out;
      case CutKind::DecoderTable: return mb.table[1];
    }
    SB_FATAL("unknown cut tensor");
  }
  Buf cut_gradient(CutKind kind) const {
    switch (kind) {
      case CutKind::EncoderHidden: return c.d_hidden[0];
      case CutKind::EncoderTable: return attention.table_gradient(0);
      case CutKind::DecoderHidden: return c.d_hidden[1];
      case CutKind::EncoderOutput: return c.d_enc_out;
      case CutKind::DecoderTable: return attention.table_gradient(1);
    }
    SB_FATAL("unknown cut tensor");
  }
};

T5Step::T5Step(Backend& backend, const T5StepConfig& config) : impl_(new Impl(backend, config)) {}

T5Step::~T5Step() { delete impl_; }

const ModelSpec& T5Step::spec() const { return impl_->c.spec; }
const std::vector<UnitSpec>& T5Step::units() const { return impl_->c.units; }
const TensorGroup& T5Step::tensor_group() const { return impl_->c.tp; }
const PipelinePart& T5Step::part() const { return impl_->c.part; }
bool T5Step::holds_unit(int unit) const {
  return pieces_use_unit(impl_->c.pieces, impl_->c.part.first, impl_->c.part.last, unit);
}
const std::vector<Piece>& T5Step::pieces() const { return impl_->c.pieces; }
DType T5Step::dtype() const { return impl_->c.dtype; }
AttentionImpl T5Step::attention() const { return impl_->c.attention; }
void T5Step::set_grad_scale(float grad_scale) { impl_->c.grad_scale = grad_scale; }
void T5Step::set_grad_ready_hook(GradReadyHook hook) { impl_->c.grad_ready = std::move(hook); }
void T5Step::set_group_sum_hook(GroupSumHook* hook) { impl_->c.sum_hook = hook; }

void T5Step::set_tokens(const Tokens& t, int micro) {
  const t5::Context& m = impl_->c;
  if (!m.b.holds_data()) return;  // the plan: no tokens are built for it
  Micro& mb = impl_->micro_batch(micro);
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
  const t5::Context& m = impl_->c;
  if (!m.b.holds_data() || !m.runs(Piece::Head)) return 0;  // the plan; a piece without the head
  double sum = 0;
  std::vector<float> host(size_t(m.Nd));
  for (const Micro& mb : impl_->micro) {
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
  const Buf x = m.c.alloc(mb.received, c[size_t(i)].second.numel, MemCategory::Activations);
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
