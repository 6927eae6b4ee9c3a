// The T5 training step as a sequence of pieces (the model's own division of the step; a
// pipeline *stage* is a group of ranks that runs consecutive pieces), each belonging to one
// FSDP unit and run forward or backward through Backend calls only. A strategy drives the
// pieces and decides where each unit's parameters come from (a gathered buffer, a replica)
// and where its gradients go; the model never knows which.
//
// Forward order (pieces()):          unit
//   EncoderEmbed   shared[enc_ids]          root
//   EncoderBlock × L                         encoder.l
//   Bridge         encoder final norm;       root
//                  shared[dec_ids]
//   DecoderBlock × L (cross-attends to       decoder.l
//                  the encoder output)
//   Head           decoder final norm,       root
//                  LM head (tied: shared after × d_model^-0.5;
//                  untied: lm_head), softmax cross-entropy
// Backward runs the same pieces in reverse. The root unit appears three times; its
// gradients are complete after the backward of EncoderEmbed (the last one).
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
  int unit;   // index into model_units()
  int layer;  // block index within its stack, 0 for root pieces
};
const char* piece_kind_name(Piece::Kind k);

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

// Initialises elements [first, first+count) of unit `unit`'s flat parameter (padding past
// numel is zero). The values depend on (seed, unit, element) only, whatever the sharding.
void init_unit_params(Backend& b, const UnitSpec& u, int unit_index, uint64_t seed, float* dst,
                      int64_t first, int64_t count);

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

class T5Step {
 public:
  // grad_scale multiplies d(loss_sum)/d(logits): 1 / (global tokens) gives the mean over the
  // global batch, so summing gradients across data-parallel ranks yields the global mean.
  // Activations, parameters and gradients of the step are in `dtype` (fp32, bf16, fp16):
  // mixed precision as FSDP's param_dtype runs it; norms' rstd and the losses stay fp32.
  // `shape` is one micro-batch's.
  T5Step(const ModelSpec& spec, Backend& backend, DType dtype, const StepShape& shape,
         bool checkpointing, float grad_scale, AttentionImpl attention = AttentionImpl::Unfused,
         TensorGroup tp = {}, PipelinePart part = {});
  ~T5Step();
  T5Step(const T5Step&) = delete;
  T5Step& operator=(const T5Step&) = delete;

  const ModelSpec& spec() const;
  const std::vector<UnitSpec>& units() const;  // this rank's part of each unit
  const TensorGroup& tensor_group() const;
  const PipelinePart& part() const;
  bool holds_unit(int unit) const;  // a piece of this part belongs to the unit
  const std::vector<Piece>& pieces() const;  // forward order
  DType dtype() const;
  AttentionImpl attention() const;

  // Uploads a micro-batch's tokens (sizes must match the shape): the ones this part uses.
  void set_tokens(const Tokens& t, int micro = 0);

  // `params` points at the unit's full flat parameter (layout: units()[unit].tensors).
  // Saves what backward needs (category Activations); with checkpointing a block saves
  // only its input and recomputes the rest in backward.
  void forward(int piece, CBuf params, int micro = 0);
  // Accumulates (+=) into `grads`, the unit's full flat gradient, which the caller zeroes
  // before the unit's first backward piece. Frees the piece's saved activations.
  void backward(int piece, CBuf params, Buf grads, int micro = 0);

  // The loss gradient's scale from the next Head forward on (dynamic loss scaling).
  void set_grad_scale(float grad_scale);

  // Called during backward with (unit, index into units()[unit].tensors) right after the
  // operation that completes that tensor's gradient of the step is issued, once per tensor
  // per step: per-parameter readiness, as autograd's post-accumulate-grad hooks give DDP.
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
    virtual void sum(Buf x, int64_t n, ReduceOp op, const std::string& what, const std::function<void()>& reduce) = 0;
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
