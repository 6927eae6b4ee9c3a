// T5 model description: shapes, the one parameter-count formula, FLOPs per step, and the
// layout of every FSDP unit (which tensors, at which offset of the unit's flat parameter).
// Shapes follow Hugging Face T5Config: RMS norm without bias, relative attention bias (one
// table per stack, held by the stack's first block), one input embedding `shared` for both
// stacks; the feed-forward is the original T5's ReLU (wi, wo) or T5 v1.1's gated GELU
// (wi_0, wi_1, wo), and the LM head is `shared` itself (tied) or a matrix of its own.
#pragma once
#include <cstdint>
#include <memory>
#include <string>
#include <vector>

namespace sb {

// The feed-forward block: wo(relu(wi x)) (T5, feed_forward_proj = "relu") or
// wo(gelu_tanh(wi_0 x) * wi_1 x) (T5 v1.1 and Flan-T5, "gated-gelu").
enum class FfnKind { Relu, GatedGelu };
const char* ffn_kind_name(FfnKind f);        // "relu", "gated-gelu"
FfnKind parse_ffn_kind(const std::string& s);  // throws UsageError naming --ffn

struct ModelSpec {
  std::string name;
  int64_t d_model = 0;
  int64_t d_ff = 0;
  int64_t layers = 0;  // per stack: encoder and decoder have the same depth
  int64_t heads = 0;
  int64_t d_kv = 0;
  int64_t vocab = 0;
  int64_t num_buckets = 32;    // relative attention buckets
  int64_t max_distance = 128;  // relative attention max distance
  FfnKind ffn = FfnKind::Relu;
  // Tied: the LM head is `shared` and the decoder output is scaled by d_model^-0.5 first
  // (Hugging Face T5ForConditionalGeneration with tie_word_embeddings); untied: a separate
  // `lm_head` [vocab, d_model] in the head unit, no rescale (T5 v1.1, Flan-T5).
  bool tie_embeddings = true;

  int64_t inner() const { return heads * d_kv; }  // width of Q, K, V
};
// Every field (a field added above belongs here too).
inline bool operator==(const ModelSpec& a, const ModelSpec& b) {
  return a.name == b.name && a.d_model == b.d_model && a.d_ff == b.d_ff && a.layers == b.layers &&
         a.heads == b.heads && a.d_kv == b.d_kv && a.vocab == b.vocab && a.num_buckets == b.num_buckets &&
         a.max_distance == b.max_distance && a.ffn == b.ffn && a.tie_embeddings == b.tie_embeddings;
}

// Presets: t5-611m, t5-2.28b, t5-11.3b (the published study), t5-tiny, t5-small (tests,
// demos), and Hugging Face's T5 v1.1 and Flan-T5 configurations (t5-v1_1-small ... -xxl,
// flan-t5-small ... -xxl: gated GELU, untied head). Throws UsageError naming the allowed
// presets for an unknown name.
ModelSpec model_preset(const std::string& name);
std::vector<std::string> model_preset_names();
enum class UnitKind { Embedding, EncoderBlock, Bridge, DecoderBlock, Head };
const char* unit_kind_name(UnitKind k);  // "embedding", "encoder", "bridge", "decoder", "head"
bool is_block(UnitKind k);

enum class InitKind { Ones, Uniform };

// The part of the model one rank of a tensor-parallel group holds (Shoeybi et al. 2019,
// Megatron-LM §3): attention q, k, v partitioned by heads (rows) and o by its input
// (columns); the feed-forward wi by rows and wo by columns; the relative position bias by
// heads; the embedding (and the LM head it is tied to) by vocabulary rows; norms replicated.
struct TensorPartition {
  int size = 1, rank = 0;
};

struct TensorSpec {
  std::string name;
  int64_t rows = 0, cols = 0;  // a Linear weight is [out, in]: y = x W^T (this rank's block)
  int64_t offset = 0;          // elements from the start of the unit's flat parameter
  InitKind init = InitKind::Uniform;
  float init_scale = 0.f;      // half-width of the uniform init
  // Where the block sits in the full tensor [full_rows, full_cols]: rows row_begin.. and
  // columns col_begin.. (the whole tensor when it is replicated).
  int64_t full_rows = 0, full_cols = 0, row_begin = 0, col_begin = 0;
  // The tensor's random stream: its initial values are a function of (seed, stream_block,
  // stream_index) only, not of the unit that holds it. stream_block: the block's number,
  // 1..L encoder and L+1..2L decoder, 0 for the tensors outside the blocks; stream_index: the
  // tensor's index in its block, or among shared, encoder.final_norm, decoder.final_norm,
  // lm_head (the numbering of the model's first layout, one root unit: the weights stay the
  // values they were).
  int stream_block = 0, stream_index = 0;
  int64_t numel() const { return rows * cols; }
  bool partitioned() const { return rows != full_rows || cols != full_cols; }
  // Element (r, c) of the block as an index of the full tensor.
  int64_t full_index(int64_t r, int64_t c) const { return (row_begin + r) * full_cols + col_begin + c; }
};

// One FSDP unit: one flat parameter. Unit k is the one of the model's piece k (T5Step's
// pieces, forward order), so a pipeline stage holds only what its pieces use:
//   0          embedding   shared (looked up by the encoder's and the decoder's tokens; a tied
//                          LM head projects onto it)
//   1..L       encoder.l   the encoder blocks
//   L+1        bridge      encoder.final_norm
//   L+2..2L+1  decoder.l   the decoder blocks
//   2L+2       head        decoder.final_norm, and untied the LM head lm_head
// PyTorch's T5 FSDP wrapping puts embedding, bridge and head in one root unit; split, they
// can live on the pipeline stages that use them (docs/architecture.md, "The pipeline axis").
struct UnitSpec {
  UnitKind kind = UnitKind::Embedding;
  int layer = 0;  // index within its stack
  std::string name;
  std::vector<TensorSpec> tensors;
  int64_t numel = 0;
  const TensorSpec& tensor(const std::string& name) const;
};

// The units as rank `tp.rank` of a tensor-parallel group of `tp.size` holds them (the whole
// model by default). Unit and tensor order do not depend on the partition.
std::vector<UnitSpec> model_units(const ModelSpec& spec, TensorPartition tp = {});
// The units of the last few models and partitions asked, each built once: a memory plan
// builds a model per pipeline stage, thousands of times in a --plan-batch, whose planner
// owns one (T5StepConfig::units). One thread at a time, as any object.
class UnitCache {
 public:
  std::shared_ptr<const std::vector<UnitSpec>> units(const ModelSpec& spec, TensorPartition tp);

 private:
  struct Entry {
    ModelSpec spec;
    TensorPartition tp;
    std::shared_ptr<const std::vector<UnitSpec>> units;
  };
  std::vector<Entry> recent_;  // the last few, newest last
};

// THE parameter count: sum of every unit's numel (agrees with Hugging Face's T5).
int64_t param_count(const ModelSpec& spec);
// Parameters one rank of a tensor-parallel group of `tp` holds (the replicated norms whole).
int64_t param_count_per_rank(const ModelSpec& spec, int tp);

// Throws UsageError unless `tp` >= 1 divides the heads, d_ff and vocab (the partitioned
// dimensions), naming the first that does not and its divisors.
void check_tensor_parallel(const ModelSpec& spec, int tp);

// Copies a rank's unit (`local`, laid out as model_units(spec, {tp, r}) describes it) into
// the full unit's flat layout `full` (model_units(spec)): every element to its place.
void place_in_full_unit(const UnitSpec& local, const UnitSpec& full, const float* local_flat, float* full_flat);
// The inverse: a rank's unit (`local`) taken out of the full unit's flat layout.
std::vector<float> take_from_full_unit(const UnitSpec& local, const UnitSpec& full, const std::vector<float>& full_flat);

// Shapes of one training step on one rank.
struct StepShape {
  int64_t batch = 0;    // sequences per rank
  int64_t enc_len = 0;  // encoder tokens per sequence
  int64_t dec_len = 0;  // decoder tokens per sequence
};

// The sizes the programs can plan and run. The plan replays every block of every
// micro-batch, and the unfused attention of every sequence, on the counting backend, so
// depth, micro-batches and sequences are bounded (the largest plan takes seconds and about
// 1 GiB, not an allocation of the model's size); GEMM dimensions and token counts are ints;
// every byte count is an int64.
constexpr int64_t kMaxLayers = 1024;            // per stack (the deepest published T5: 24)
constexpr int64_t kMaxMicroBatches = 1024;      // a pipeline transfer's MPI tag stays under 32767
constexpr int64_t kMaxBlockPasses = 16384;      // micro-batches x layers
constexpr int64_t kMaxSequencePasses = 65536;   // sequences per rank (--batch) x layers
constexpr long double kMaxBytes = 4611686018427387904.0L;  // 2^62: what a rank may count

// THE size check, for every way a model is made (presets, overrides, tests): throws one
// UsageError line naming the flags as typed and what is allowed, for a field that is not
// positive, a depth or micro-batch count beyond the bounds above, an attention width or
// token count that is not an int, or memory beyond kMaxBytes per rank. With a step shape
// (batch > 0) the activations and the micro-batches (given by `micro_flag`) count too;
// without, the parameters alone.
void validate(const ModelSpec& spec, const StepShape& shape = StepShape{}, int64_t micro_batches = 1,
              const char* micro_flag = "--micro-batches");

// Matmul FLOPs (2·m·n·k each) of one forward pass, attention scores/context and LM head
// included (the gated feed-forward has three GEMMs, ReLU's two). Per piece kind so the
// schedule and the tests can check each piece. With `tp`, one rank's share of a
// tensor-parallel group of tp: every matmul is partitioned (heads, d_ff or vocabulary), so each
// rank runs 1/tp of the FLOPs; nothing replicated is a matmul.
double forward_flops_encoder_block(const ModelSpec& s, const StepShape& x, int tp = 1);
double forward_flops_decoder_block(const ModelSpec& s, const StepShape& x, int tp = 1);
double forward_flops_head(const ModelSpec& s, const StepShape& x, int tp = 1);
double forward_flops(const ModelSpec& s, const StepShape& x, int tp = 1);
// Model FLOPs of a training step = 3 × forward. Hardware FLOPs add the recomputed block
// forwards when activation checkpointing is on. With `pp`, a rank's average over the
// pipeline stages (the stages' own shares differ by the pipeline split).
double model_flops_per_step(const ModelSpec& s, const StepShape& x, int tp = 1, int pp = 1);
double hardware_flops_per_step(const ModelSpec& s, const StepShape& x, bool checkpointing, int tp = 1, int pp = 1);

}  // namespace sb
