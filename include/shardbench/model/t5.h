// The T5 training step as a sequence of pieces (the model's own division of the step; a
// pipeline *stage* is a group of ranks that runs consecutive pieces), each with an FSDP unit
// of its own and run forward or backward through Backend calls only. A strategy drives the
// pieces and decides where each unit's parameters come from (a gathered buffer, a replica)
// and where its gradients go; the model never knows which.
//
// Forward order (pieces()):          its unit (model_units)   also reads
//   EncoderEmbed   shared[enc_ids]          0 embedding
//   EncoderBlock × L                         1..L encoder.l
//   Bridge         encoder final norm;       L+1 bridge                embedding
//                  shared[dec_ids]
//   DecoderBlock × L (cross-attends to       L+2..2L+1 decoder.l
//                  the encoder output)
//   Head           decoder final norm,       2L+2 head                 embedding (tied)
//                  LM head (tied: shared after × d_model^-0.5;
//                  untied: lm_head), softmax cross-entropy
// Backward runs the same pieces in reverse. Three pieces use the embedding (two untied); its
// gradient is complete after the backward of the first of them a part runs.
#pragma once
#include <cstdint>
#include <functional>
#include <string>
#include <vector>

#include "shardbench/backend/backend.h"
#include "shardbench/model/model.h"

namespace sb {

// How attention runs: the reference path (batched GEMMs around a softmax over a held
// [B, H, tq, tk] tensor) or the fused op (Backend::attention_forward/backward: online
// softmax over tiles, the position bias read from the table inside, nothing tq×tk held).
enum class AttentionImpl { Unfused, Fused };
const char* attention_impl_name(AttentionImpl a);          // "unfused", "fused"
AttentionImpl parse_attention_impl(const std::string& s);  // throws UsageError

struct Piece {
  enum Kind { EncoderEmbed, EncoderBlock, Bridge, DecoderBlock, Head } kind;
  int unit;             // its own unit, an index into model_units(): piece k's is unit k
  int layer;            // block index within its stack, 0 for the other pieces
  int embedding = -1;   // the embedding unit where a piece other than EncoderEmbed also reads
                        // it (the bridge's decoder tokens, a tied head), else -1
  // The units the piece uses: its own, then the embedding where it reads it.
  std::vector<int> units() const { return embedding >= 0 ? std::vector<int>{unit, embedding} : std::vector<int>{unit}; }
};
const char* piece_kind_name(Piece::Kind k);
// "encoder embedding", "encoder block 3", "bridge", "decoder block 0", "head": messages, the plan.
std::string piece_name(const Piece& p);

// The model's pieces in forward order (T5Step::pieces()): what every layout splits.
std::vector<Piece> model_pieces(const ModelSpec& spec);
// Whether pieces [first, last) use unit u: what a pipeline stage running them holds.
bool pieces_use_unit(const std::vector<Piece>& pieces, int first, int last, int unit);

// One rank's tokens for one step: [batch * len] each, row-major by sequence.
struct Tokens {
  std::vector<int> enc_ids, dec_ids, labels;
};
// Deterministic synthetic data: sequence s (global index) of step `step` depends on
// (seed, step, s) only, so rank r with `batch` sequences takes s = r*batch .. r*batch+batch-1
// and a single rank with the global batch sees exactly the same sequences.
// Decoder input = labels shifted right with 0 as the start token.
Tokens make_tokens(uint64_t seed, int step, int64_t first_sequence, const StepShape& shape,
                   int64_t vocab);

// Initialises elements [first, first+count) of unit u's flat parameter (padding past numel
// is zero). Each element depends on (seed, its tensor's random stream, its index in the full
// tensor) only (TensorSpec::stream_block), whatever the unit, sharding or partition.
void init_unit_params(Backend& b, const UnitSpec& u, uint64_t seed, float* dst, int64_t first, int64_t count);

// The tensor-parallel group a step runs in (Megatron-LM, docs/architecture.md): its size,
// this rank's place in it and its communicator (null for a group of one). The step then
// holds model_units(spec, {size, rank}) and runs the conjugate collectives itself: an
// all-reduce after each row-parallel product in forward (attention o, feed-forward wo, the
// vocabulary-parallel embedding) and of each column-parallel input's gradient in backward,
// plus the parallel cross-entropy's two small ones. They sit on the critical path.
struct TensorGroup {
  int size = 1, rank = 0;
  Comm* comm = nullptr;
};

// The part of the step a pipeline stage runs (docs/architecture.md, "The pipeline axis"):
// pieces [first, last) in forward order (last -1: to the end), for each of `micro_batches`
// micro-batches of the step shape. Each micro-batch has its own tokens, losses and saved
// activations; the gradients of every micro-batch accumulate into the same buffers.
struct PipelinePart {
  int first = 0, last = -1;
  int micro_batches = 1;
  // The first piece of every pipeline stage (the split's): where a stack's position-bias
  // gradient crosses a cut, folded into the table's gradient (unfused attention). --check's
  // reference runs every piece but folds at the same places, so its sums are the run's.
  std::vector<int> stage_starts;
};

// Buffers held per unit (index = unit) as a T5Step::Params or ::Grads: for callers that hold
// every unit whole (the tests, --check's reference).
inline std::function<Buf(int)> by_unit(const std::vector<Buf>& bufs) {
  return [&bufs](int u) { return bufs[size_t(u)]; };
}

// What a step is: the model, its precision and micro-batch shape, and how it runs. Set the
// fields by name; the defaults are a single rank running the whole model in fp32.
struct T5StepConfig {
  ModelSpec spec;
  // Activations, parameters and gradients of the step are in `dtype` (fp32, bf16, fp16):
  // mixed precision as FSDP's param_dtype runs it; norms' rstd and the losses stay fp32.
  DType dtype = DType::F32;
  StepShape shape;  // one micro-batch's
  bool checkpointing = false;  // a block saves only its input and recomputes the rest in backward
  // Multiplies d(loss_sum)/d(logits): 1 / (global tokens) gives the mean over the global
  // batch, so summing gradients across data-parallel ranks yields the global mean.
  float grad_scale = 1.f;
  AttentionImpl attention = AttentionImpl::Unfused;
  TensorGroup tp;     // a group of one: the whole model
  PipelinePart part;  // every piece
  UnitCache* units = nullptr;  // where the model's units come from (--plan-batch's); null: built here
};

class T5Step {
 public:
  T5Step(Backend& backend, const T5StepConfig& config);
  ~T5Step();
  T5Step(const T5Step&) = delete;
  T5Step& operator=(const T5Step&) = delete;

  const ModelSpec& spec() const;
  const std::vector<UnitSpec>& units() const;  // this rank's part of each unit
  const TensorGroup& tensor_group() const;
  const PipelinePart& part() const;
  bool holds_unit(int unit) const;  // a piece of this part uses the unit
  const std::vector<Piece>& pieces() const;  // forward order
  DType dtype() const;
  AttentionImpl attention() const;

  // Uploads a micro-batch's tokens (sizes must match the shape): the ones this part uses.
  void set_tokens(const Tokens& t, int micro = 0);

  // Where the units a piece uses (Piece::units()) are: `params(u)` is unit u's full flat
  // parameter (layout: units()[u].tensors), `grads(u)` its full flat gradient. The piece
  // asks for those units only, during the call.
  using Params = std::function<CBuf(int unit)>;
  using Grads = std::function<Buf(int unit)>;
  // Saves what backward needs (category Activations); with checkpointing a block saves
  // only its input and recomputes the rest in backward.
  void forward(int piece, const Params& params, int micro = 0);
  // Accumulates (+=) into the gradients of the piece's units, which the caller zeroes
  // before each unit's first backward piece. Frees the piece's saved activations.
  void backward(int piece, const Params& params, const Grads& grads, int micro = 0);

  // The loss gradient's scale from the next Head forward on (dynamic loss scaling).
  void set_grad_scale(float grad_scale);

  // Called during backward with (unit, index into units()[unit].tensors) right after the
  // operation that completes that tensor's gradient of the step is issued, once per tensor
  // per step: per-parameter readiness, as autograd's post-accumulate-grad hooks give DDP.
  // The embedding's tensor is ready after this part's last backward piece that uses it.
  using GradReadyHook = std::function<void(int unit, int tensor)>;
  void set_grad_ready_hook(GradReadyHook hook);

  // --check only: what the step sums over its tensor-parallel group, as it makes each sum
  // (the tensor-parallel lockstep, train/tp_lockstep.h). With a hook, a step of a group of
  // one (the full model) makes the same sums at the same places, with nothing to sum: each
  // row-parallel product into a buffer of its own, the cross-entropy in the parallel's three
  // kernels. The step does not own the hook.
  class GroupSumHook {
   public:
    virtual ~GroupSumHook() = default;
    // acc [n], which a coming sum reads, was just written with one more term rounded once
    // (a GEMM's product, a kernel's sum).
    virtual void rounded(CBuf acc, int64_t n) = 0;
    // x [n] holds this rank's part of a sum over the group (`op`: sum or max), which `what`
    // names. The hook calls `reduce` once, which sums x in place (nothing in a group of one,
    // or where an injected fault removes the all-reduce), and may then set x's values.
    // `what` is a literal of the step's (no string is built for a sum when no hook is set).
    virtual void sum(Buf x, int64_t n, ReduceOp op, const char* what, const std::function<void()>& reduce) = 0;
  };
  void set_group_sum_hook(GroupSumHook* hook);

  // Sum over this rank's tokens (every micro-batch) of the cross-entropy, valid after the
  // Head forwards (every rank of a tensor-parallel group has the same); 0 on a pipeline stage
  // without the Head.
  double loss_sum();

  // ---- pipeline cuts: what crosses from piece k - 1 to piece k (0 < k < pieces) ----
  // The tensors the earlier side sends forward after its last piece's forward, each with
  // the size of the gradient the later side sends back after its first piece's backward:
  // the hidden state; after the bridge also the encoder output (the cross-attention's keys
  // and values of every later decoder block); inside a stack the stack's position-bias
  // table (its gradient: what the later blocks added to the stack's accumulated d(bias)).
  struct CutTensor {
    const char* name;
    int64_t numel, grad_numel;
  };
  std::vector<CutTensor> cut(int k) const;
  Buf cut_input(int k, int micro, int i);    // later side, before piece k's forward: receive tensor i here
  CBuf cut_output(int k, int micro, int i);  // earlier side, after piece k - 1's forward: send this
  Buf cut_grad_input(int k, int i);          // earlier side, before piece k - 1's backward: receive its gradient here
  CBuf cut_grad_output(int k, int i) const;  // later side, after piece k's backward: send this gradient

 private:
  struct Impl;
  Impl* impl_;
};

}  // namespace sb
