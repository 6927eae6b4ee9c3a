// T5 model description: shapes, the one parameter-count formula, FLOPs per step, and the
// layout of every FSDP unit (which tensors, at which offset of the unit's flat parameter).
// Shapes follow Hugging Face T5Config: RMS norm without bias, relative attention bias (one
// table per stack, held by the stack's first block), one input embedding `shared` for both
// stacks; the feed-forward is the original T5's ReLU (wi, wo) or T5 v1.1's gated GELU
// (wi_0, wi_1, wo), and the LM head is `shared` itself (tied) or a matrix of its own.
#pragma once
#include <cstdint>
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
  // `lm_head` [vocab, d_model] in the root unit, no rescale (T5 v1.1, Flan-T5).
  bool tie_embeddings = true;

  int64_t inner() const { return heads * d_kv; }  // width of Q, K, V
};

// Presets: t5-611m, t5-2.28b, t5-11.3b (the published study), t5-tiny, t5-small (tests,
// demos), and Hugging Face's T5 v1.1 and Flan-T5 configurations (t5-v1_1-small ... -xxl,
// flan-t5-small ... -xxl: gated GELU, untied head). Throws UsageError naming the allowed
// presets for an unknown name.
ModelSpec model_preset(const std::string& name);
std::vector<std::string> model_preset_names();
// Throws UsageError for a non-positive field.
void validate(const ModelSpec& spec);

enum class UnitKind { Root, EncoderBlock, DecoderBlock };
const char* unit_kind_name(UnitKind k);

enum class InitKind { Ones, Uniform };

struct TensorSpec {
  std::string name;
  int64_t rows = 0, cols = 0;  // a Linear weight is [out, in]: y = x W^T
  int64_t offset = 0;          // elements from the start of the unit's flat parameter
  InitKind init = InitKind::Uniform;
  float init_scale = 0.f;      // half-width of the uniform init
  int64_t numel() const { return rows * cols; }
};

// One FSDP unit: one flat parameter. Unit 0 is the root (shared embedding, both final
// norms, the LM head when untied: PyTorch's T5 FSDP wrapping), units 1..L the encoder
// blocks, L+1..2L the decoder blocks.
struct UnitSpec {
  UnitKind kind = UnitKind::Root;
  int layer = 0;  // index within its stack
  std::string name;
  std::vector<TensorSpec> tensors;
  int64_t numel = 0;
  const TensorSpec& tensor(const std::string& name) const;
};

std::vector<UnitSpec> model_units(const ModelSpec& spec);

// THE parameter count: sum of every unit's numel (agrees with Hugging Face's T5).
int64_t param_count(const ModelSpec& spec);

// Shapes of one training step on one rank.
struct StepShape {
  int64_t batch = 0;    // sequences per rank
  int64_t enc_len = 0;  // encoder tokens per sequence
  int64_t dec_len = 0;  // decoder tokens per sequence
};

// Matmul FLOPs (2·m·n·k each) of one forward pass, attention scores/context and LM head
// included (the gated feed-forward has three GEMMs, ReLU's two). Per stage kind so the
// schedule and the tests can check each stage.
double forward_flops_encoder_block(const ModelSpec& s, const StepShape& x);
double forward_flops_decoder_block(const ModelSpec& s, const StepShape& x);
double forward_flops_head(const ModelSpec& s, const StepShape& x);
double forward_flops(const ModelSpec& s, const StepShape& x);
// Model FLOPs of a training step = 3 × forward. Hardware FLOPs add the recomputed block
// forwards when activation checkpointing is on.
double model_flops_per_step(const ModelSpec& s, const StepShape& x);
double hardware_flops_per_step(const ModelSpec& s, const StepShape& x, bool checkpointing);

}  // namespace sb
