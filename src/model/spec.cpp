#include <algorithm>
#include <cmath>
#include <cstdio>
#include <limits>
#include <map>

#include "shardbench/core/check.h"
#include "shardbench/core/fault.h"
#include "shardbench/model/model.h"

namespace sb {

namespace {
ModelSpec make(const std::string& name, int64_t d, int64_t ff, int64_t layers, int64_t heads, int64_t dkv,
               int64_t vocab, FfnKind ffn = FfnKind::Relu, bool tie = true) {
  ModelSpec s;
  s.ffn = ffn;
  s.tie_embeddings = tie;
  s.name = name;
  s.d_model = d;
  s.d_ff = ff;
  s.layers = layers;
  s.heads = heads;
  s.d_kv = dkv;
  s.vocab = vocab;
  return s;
}

const std::vector<ModelSpec>& presets() {
  // The three study models: docs/references.md §1 and §3 (FSDP paper, VLDB 2023, section 5).
  static const std::vector<ModelSpec> p = {
      make("t5-611m", 1024, 2816, 24, 16, 64, 32128),
      make("t5-2.28b", 2048, 5120, 24, 32, 64, 32128),
      make("t5-11.3b", 1024, 65536, 24, 128, 128, 32128),
      make("t5-small", 256, 1024, 4, 4, 64, 8192),
      make("t5-tiny", 32, 64, 2, 2, 8, 96),
  };
  // T5 v1.1 and its instruction-tuned twin Flan-T5 (one shape each): Hugging Face's
  // configurations (docs/references.md §11): feed_forward_proj "gated-gelu",
  // tie_word_embeddings false, d_kv 64, vocab 32128, 32 buckets, max distance 128.
  static const std::vector<ModelSpec> all = [] {
    std::vector<ModelSpec> v = p;
    const struct { const char* size; int64_t d, ff, layers, heads; } v11[] = {
        {"small", 512, 1024, 8, 6}, {"base", 768, 2048, 12, 12}, {"large", 1024, 2816, 24, 16},
        {"xl", 2048, 5120, 24, 32}, {"xxl", 4096, 10240, 24, 64}};
    for (const char* family : {"t5-v1_1-", "flan-t5-"})
      for (const auto& m : v11)
        v.push_back(make(std::string(family) + m.size, m.d, m.ff, m.layers, m.heads, 64, 32128, FfnKind::GatedGelu,
                         false));
    return v;
  }();
  return all;
}
}  // namespace

std::vector<std::string> model_preset_names() {
  std::vector<std::string> names;
  for (const auto& p : presets()) names.push_back(p.name);
  return names;
}

ModelSpec model_preset(const std::string& name) {
  for (const auto& p : presets())
    if (p.name == name) return p;
  std::string allowed;
  for (const auto& n : model_preset_names()) allowed += (allowed.empty() ? "" : ", ") + n;
  throw UsageError("--model '" + name + "' is not allowed (allowed: " + allowed + ")");
}

const char* ffn_kind_name(FfnKind f) { return f == FfnKind::GatedGelu ? "gated-gelu" : "relu"; }

FfnKind parse_ffn_kind(const std::string& s) {
  for (FfnKind f : {FfnKind::Relu, FfnKind::GatedGelu})
    if (s == ffn_kind_name(f)) return f;
  throw UsageError("--ffn '" + s + "' is not allowed (allowed: relu, gated-gelu)");
}

namespace {
constexpr int64_t kIntLimit = std::numeric_limits<int32_t>::max();

// "--heads 16"
std::string typed(const char* flag, int64_t v) { return std::string(flag) + " " + std::to_string(v); }

std::string approx(long double v) {
  char text[32];
  std::snprintf(text, sizeof text, "%.2Lg", v);
  return text;
}

// One contribution to a rank's memory: the flags whose product it is, as typed.
struct MemoryTerm {
  std::string flags, what;
  long double bytes;
};
}  // namespace

void validate(const ModelSpec& s, const StepShape& x, int64_t micro_batches, const char* micro_flag) {
  const std::pair<const char*, int64_t> fields[] = {
      {"--d-model", s.d_model}, {"--d-ff", s.d_ff},   {"--layers", s.layers},
      {"--heads", s.heads},     {"--d-kv", s.d_kv},   {"--vocab", s.vocab}};
  for (const auto& [flag, v] : fields)
    if (v <= 0) throw UsageError(typed(flag, v) + " is not allowed (must be > 0)");
  if (s.layers > kMaxLayers)
    throw UsageError(typed("--layers", s.layers) + " is not allowed (an integer from 1 to " +
                     std::to_string(kMaxLayers) + " per stack: the plan replays every block)");
  const std::string L = typed("--layers", s.layers), D = typed("--d-model", s.d_model), H = typed("--heads", s.heads),
                    K = typed("--d-kv", s.d_kv), F = typed("--d-ff", s.d_ff), V = typed("--vocab", s.vocab);
  // Products in long double: each factor may be as large as an int64.
  const long double layers = s.layers, d = s.d_model, inner = (long double)s.heads * s.d_kv, ff = s.d_ff;
  if (inner > kIntLimit)
    throw UsageError(H + " x " + K + " = " + approx(inner) + " is not allowed (the attention width heads x d_kv "
                     "is a GEMM dimension: a product of at most " + std::to_string(kIntLimit) + ")");
  // Parameters with their gradients, fp32 master, Adam moments and gathered copies: at most
  // 32 bytes each (the plan counts fewer; the bound only has to hold).
  const long double per_param = 32;
  std::vector<MemoryTerm> terms = {
      {V + " x " + D, "embedding and LM head", per_param * (s.tie_embeddings ? 1 : 2) * s.vocab * d},
      {H + " x " + K + " x " + D + " x " + L, "attention weights", per_param * 12 * layers * inner * d},
      {F + " x " + D + " x " + L, "feed-forward weights",
       per_param * 2 * layers * (s.ffn == FfnKind::GatedGelu ? 3 : 2) * ff * d},
  };
  if (x.batch > 0) {
    const std::string B = typed("--batch", x.batch);
    // Token counts per rank are GEMM row counts (int).
    for (const auto& [flag, len] : {std::pair<const char*, int64_t>{"--seq-len", x.enc_len}, {"--dec-seq-len", x.dec_len}})
      if ((long double)x.batch * len > kIntLimit)
        throw UsageError(B + " x " + typed(flag, len) + " = " + std::to_string(x.batch * len) +
                         " tokens per rank is not allowed (at most " + std::to_string(kIntLimit) + ")");
    const std::string M = typed(micro_flag, micro_batches);
    if (micro_batches < 1 || micro_batches > kMaxMicroBatches)
      throw UsageError(M + " is not allowed as the micro-batch count (an integer from 1 to " +
                       std::to_string(kMaxMicroBatches) + ")");
    if (micro_batches * s.layers > kMaxBlockPasses)
      throw UsageError(M + " x " + L + " = " + std::to_string(micro_batches * s.layers) +
                       " block passes per step is not allowed (at most " + std::to_string(kMaxBlockPasses) +
                       ": the plan replays each)");
    if (x.batch * s.layers > kMaxSequencePasses)
      throw UsageError(B + " x " + L + " = " + std::to_string(x.batch * s.layers) +
                       " sequence passes per step is not allowed (at most " + std::to_string(kMaxSequencePasses) +
                       ": the plan replays each sequence's attention)");
    // Activations (fp32, generous counts per block): the longer sequence names the flag.
    const bool dec_longer = x.dec_len > x.enc_len;
    const std::string T = dec_longer ? typed("--dec-seq-len", x.dec_len) : typed("--seq-len", x.enc_len);
    const long double tokens = (long double)x.batch * std::max(x.enc_len, x.dec_len), blocks = 2 * layers;
    const long double longest = std::max(x.enc_len, x.dec_len);
    terms.push_back({B + " x " + T + " x " + D + " x " + L, "hidden states", 4 * 16 * blocks * tokens * d});
    terms.push_back({B + " x " + T + " x " + H + " x " + K + " x " + L, "attention activations",
                     4 * 12 * blocks * tokens * inner});
    terms.push_back({B + " x " + T + " x " + F + " x " + L, "feed-forward activations", 4 * 4 * blocks * tokens * ff});
    terms.push_back({B + " x " + H + " x " + T + " x " + T + " x " + L, "attention scores",
                     4 * 8 * blocks * x.batch * (long double)s.heads * longest * longest});
    terms.push_back({B + " x " + typed("--dec-seq-len", x.dec_len) + " x " + V, "logits",
                     4 * 4 * (long double)x.batch * x.dec_len * s.vocab});
  }
  long double total = 0;
  const MemoryTerm* largest = &terms[0];
  for (const MemoryTerm& t : terms) {
    total += t.bytes;
    if (t.bytes > largest->bytes) largest = &t;
  }
  if (total > kMaxBytes)
    throw UsageError(largest->flags + " is not allowed (" + largest->what + " of about " + approx(largest->bytes) +
                     " bytes per rank; allowed: sizes whose memory per rank stays under 2^62 bytes, " +
                     approx(kMaxBytes) + ")");
}

const char* unit_kind_name(UnitKind k) {
  switch (k) {
    case UnitKind::Embedding: return "embedding";
    case UnitKind::EncoderBlock: return "encoder";
    case UnitKind::Bridge: return "bridge";
    case UnitKind::DecoderBlock: return "decoder";
    case UnitKind::Head: return "head";
  }
  return "?";
}

bool is_block(UnitKind k) { return k == UnitKind::EncoderBlock || k == UnitKind::DecoderBlock; }

const TensorSpec& UnitSpec::tensor(const std::string& n) const {
  for (const auto& t : tensors)
    if (t.name == n) return t;
  SB_FATAL("unit " + name + " has no tensor " + n);
}

namespace {
enum class PartitionBy { None, Rows, Cols };  // which dimension a tensor-parallel rank holds a slice of

struct UnitBuilder {
  UnitSpec u;
  TensorPartition tp;
  int stream_block = 0, next_index = 0;  // the random stream of the next tensor added (TensorSpec)
  // `block`: which rank's block of a partitioned tensor this rank holds (its own: -1).
  void add(const std::string& name, int64_t rows, int64_t cols, InitKind init, float scale,
           PartitionBy by = PartitionBy::None, int block = -1) {
    if (block < 0) block = tp.rank;
    TensorSpec t;
    t.name = name;
    t.full_rows = rows;
    t.full_cols = cols;
    t.rows = by == PartitionBy::Rows ? rows / tp.size : rows;
    t.cols = by == PartitionBy::Cols ? cols / tp.size : cols;
    t.row_begin = by == PartitionBy::Rows ? t.rows * block : 0;
    t.col_begin = by == PartitionBy::Cols ? t.cols * block : 0;
    t.offset = u.numel;
    t.init = init;
    t.init_scale = scale;
    t.stream_block = stream_block;
    t.stream_index = next_index++;
    u.numel += t.numel();
    u.tensors.push_back(t);
  }
  // A Linear [out, in]: uniform(±1/sqrt(in)) keeps activations O(1) through the stack.
  // Column-parallel (Megatron's term: the output partitioned, our rows) or row-parallel (the input).
  void linear(const std::string& name, int64_t out, int64_t in, PartitionBy by, int block = -1) {
    add(name, out, in, InitKind::Uniform, 1.0f / std::sqrt(float(in)), by, block);
  }
  void norm(const std::string& name, int64_t d) { add(name, 1, d, InitKind::Ones, 0.f); }
  void attention(const std::string& p, const ModelSpec& s) {
    // Injected fault (tests only): q, k and v hold the next rank's heads, o and the bias this rank's.
    const int heads = injected_fault(Fault::TpWrongHeadShard) ? (tp.rank + 1) % tp.size : tp.rank;
    linear(p + ".q", s.inner(), s.d_model, PartitionBy::Rows, heads);
    linear(p + ".k", s.inner(), s.d_model, PartitionBy::Rows, heads);
    linear(p + ".v", s.inner(), s.d_model, PartitionBy::Rows, heads);
    linear(p + ".o", s.d_model, s.inner(), PartitionBy::Cols);
  }
};
}  // namespace

std::shared_ptr<const std::vector<UnitSpec>> UnitCache::units(const ModelSpec& s, TensorPartition tp) {
  for (const Entry& e : recent_)
    if (e.spec == s && e.tp.size == tp.size && e.tp.rank == tp.rank) return e.units;
  if (recent_.size() == 8) recent_.erase(recent_.begin());
  recent_.push_back({s, tp, std::make_shared<const std::vector<UnitSpec>>(model_units(s, tp))});
  return recent_.back().units;
}

std::vector<UnitSpec> model_units(const ModelSpec& s, TensorPartition tp) {
  SB_ASSERT(tp.size >= 1 && tp.rank >= 0 && tp.rank < tp.size, "bad tensor-parallel rank");
  if (tp.size > 1) check_tensor_parallel(s, tp.size);
  std::vector<UnitSpec> units;
  // The tensors outside the blocks, in their random streams' order (block 0): shared,
  // encoder.final_norm, decoder.final_norm, lm_head.
  auto outside = [&](UnitKind kind, const char* name, int first_index) {
    UnitBuilder b{{}, tp, 0, first_index};
    b.u.kind = kind;
    b.u.name = name;
    return b;
  };
  {
    UnitBuilder b = outside(UnitKind::Embedding, "embedding", 0);
    b.add("shared", s.vocab, s.d_model, InitKind::Uniform, 1.0f, PartitionBy::Rows);  // vocab-parallel
    units.push_back(b.u);
  }
  for (int stack = 0; stack < 2; ++stack) {
    const bool dec = stack == 1;
    if (dec) {
      UnitBuilder b = outside(UnitKind::Bridge, "bridge", 1);
      b.norm("encoder.final_norm", s.d_model);
      units.push_back(b.u);
    }
    for (int l = 0; l < s.layers; ++l) {
      UnitBuilder b{{}, tp, 1 + stack * int(s.layers) + l, 0};
      b.u.kind = dec ? UnitKind::DecoderBlock : UnitKind::EncoderBlock;
      b.u.layer = l;
      b.u.name = std::string(dec ? "decoder." : "encoder.") + std::to_string(l);
      if (l == 0) b.add("rel_bias", s.num_buckets, s.heads, InitKind::Uniform, 0.5f, PartitionBy::Cols);  // by head
      b.norm("ln1", s.d_model);
      b.attention("self", s);
      b.norm("ln2", s.d_model);
      if (dec) {
        b.attention("cross", s);
        b.norm("ln3", s.d_model);
      }
      if (s.ffn == FfnKind::GatedGelu) {
        b.linear("wi_0", s.d_ff, s.d_model, PartitionBy::Rows);
        b.linear("wi_1", s.d_ff, s.d_model, PartitionBy::Rows);
      } else {
        b.linear("wi", s.d_ff, s.d_model, PartitionBy::Rows);
      }
      b.linear("wo", s.d_model, s.d_ff, PartitionBy::Cols);
      units.push_back(b.u);
    }
  }
  {
    UnitBuilder b = outside(UnitKind::Head, "head", 2);
    b.norm("decoder.final_norm", s.d_model);
    if (!s.tie_embeddings) b.linear("lm_head", s.vocab, s.d_model, PartitionBy::Rows);  // vocab-parallel
    units.push_back(b.u);
  }
  return units;
}

void check_tensor_parallel(const ModelSpec& s, int tp) {
  if (tp < 1) throw UsageError("--tp " + std::to_string(tp) + " is not allowed (must be >= 1)");
  const std::pair<const char*, int64_t> dims[] = {{"heads", s.heads}, {"d_ff", s.d_ff}, {"vocab", s.vocab}};
  for (const auto& [what, v] : dims) {
    if (v % tp == 0) continue;
    std::vector<int64_t> low, high;  // divisors up to sqrt(v) and their partners: no loop to v
    for (int64_t k = 1; k * k <= v; ++k)
      if (v % k == 0) {
        low.push_back(k);
        if (k != v / k) high.push_back(v / k);
      }
    low.insert(low.end(), high.rbegin(), high.rend());
    std::string divisors;
    for (size_t i = 0; i < low.size() && divisors.size() < 200; ++i)
      divisors += (divisors.empty() ? "" : ", ") + std::to_string(low[i]);
    throw UsageError("--tp " + std::to_string(tp) + " is not allowed with " + std::string(what) + " " +
                     std::to_string(v) + " (the heads, d_ff and vocab must divide by --tp; " + what + " " +
                     std::to_string(v) + " divides by " + divisors + ")");
  }
}

void place_in_full_unit(const UnitSpec& local, const UnitSpec& full, const float* src, float* dst) {
  SB_ASSERT(local.tensors.size() == full.tensors.size(), "units of different models");
  for (size_t i = 0; i < local.tensors.size(); ++i) {
    const TensorSpec& t = local.tensors[i];
    const TensorSpec& f = full.tensors[i];
    SB_ASSERT(t.name == f.name && t.full_rows == f.rows && t.full_cols == f.cols, "units of different models");
    for (int64_t r = 0; r < t.rows; ++r)
      std::copy(src + t.offset + r * t.cols, src + t.offset + (r + 1) * t.cols, dst + f.offset + t.full_index(r, 0));
  }
}

std::vector<float> take_from_full_unit(const UnitSpec& local, const UnitSpec& full, const std::vector<float>& src) {
  SB_ASSERT(local.tensors.size() == full.tensors.size() && int64_t(src.size()) == full.numel, "units of different models");
  std::vector<float> out(size_t(local.numel));
  for (size_t i = 0; i < local.tensors.size(); ++i) {
    const TensorSpec& t = local.tensors[i];
    const TensorSpec& f = full.tensors[i];
    for (int64_t r = 0; r < t.rows; ++r) {
      const float* row = src.data() + f.offset + t.full_index(r, 0);
      std::copy(row, row + t.cols, out.data() + t.offset + r * t.cols);
    }
  }
  return out;
}

int64_t param_count(const ModelSpec& s) { return param_count_per_rank(s, 1); }

int64_t param_count_per_rank(const ModelSpec& s, int tp) {
  int64_t n = 0;
  for (const auto& u : model_units(s, {tp, 0})) n += u.numel;
  return n;
}

namespace {
double gemm_flops(double m, double n, double k) { return 2.0 * m * n * k; }
// Q, K, V, O projections plus scores (Q K^T) and context (P V) for every (batch, head); a
// tensor-parallel rank holds heads / tp of them.
double attention_flops(const ModelSpec& s, double batch, double tq, double tk, int tp) {
  const double d = s.d_model, heads = double(s.heads / tp), inner = heads * s.d_kv;
  return gemm_flops(batch * tq, inner, d)            // Q
         + 2 * gemm_flops(batch * tk, inner, d)      // K, V
         + gemm_flops(batch * tq, d, inner)          // O
         + 2 * batch * heads * gemm_flops(tq, tk, s.d_kv);  // scores, context
}
// wi (or wi_0 and wi_1) and wo; a tensor-parallel rank holds d_ff / tp of each.
double ffn_flops(const ModelSpec& s, double tokens, int tp) {
  return (s.ffn == FfnKind::GatedGelu ? 3 : 2) * gemm_flops(tokens, double(s.d_ff / tp), s.d_model);
}
}  // namespace

double forward_flops_encoder_block(const ModelSpec& s, const StepShape& x, int tp) {
  return attention_flops(s, x.batch, x.enc_len, x.enc_len, tp) + ffn_flops(s, double(x.batch) * x.enc_len, tp);
}
double forward_flops_decoder_block(const ModelSpec& s, const StepShape& x, int tp) {
  return attention_flops(s, x.batch, x.dec_len, x.dec_len, tp) + attention_flops(s, x.batch, x.dec_len, x.enc_len, tp) +
         ffn_flops(s, double(x.batch) * x.dec_len, tp);
}
double forward_flops_head(const ModelSpec& s, const StepShape& x, int tp) {
  return gemm_flops(double(x.batch) * x.dec_len, double(s.vocab / tp), s.d_model);
}
double forward_flops(const ModelSpec& s, const StepShape& x, int tp) {
  return s.layers * (forward_flops_encoder_block(s, x, tp) + forward_flops_decoder_block(s, x, tp)) +
         forward_flops_head(s, x, tp);
}
double model_flops_per_step(const ModelSpec& s, const StepShape& x, int tp, int pp) {
  return 3 * forward_flops(s, x, tp) / pp;
}
double hardware_flops_per_step(const ModelSpec& s, const StepShape& x, bool checkpointing, int tp, int pp) {
  double recompute = checkpointing ? s.layers * (forward_flops_encoder_block(s, x, tp) +
                                                 forward_flops_decoder_block(s, x, tp))
                                   : 0.0;
  return (3 * forward_flops(s, x, tp) + recompute) / pp;
}

}  // namespace sb
