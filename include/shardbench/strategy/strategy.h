// Strategies: schedules of one training step over the backend. The loop over model stages
// is written once (TrainingSchedule::step); DDP and FSDP differ only in their hooks: where a
// unit's parameters come from before its stage runs, and what happens to its gradients
// once its last backward stage has run.
#pragma once
#include <memory>
#include <string>
#include <vector>

#include "shardbench/backend/backend.h"
#include "shardbench/core/half.h"
#include "shardbench/backend/layout.h"
#include "shardbench/model/model.h"
#include "shardbench/model/t5.h"
#include "shardbench/strategy/pipeline.h"

namespace sb {

enum class StrategyKind { DDP, FSDP };
enum class Sharding { Full, Hybrid, None, GradOp };
enum class Prefetch { None, BackwardPre, BackwardPost };

const char* sharding_name(Sharding s);
const char* prefetch_name(Prefetch p);
Sharding parse_sharding(const std::string& s);  // throws UsageError
Prefetch parse_prefetch(const std::string& s);  // throws UsageError

struct StrategyConfig {
  StrategyKind kind = StrategyKind::FSDP;
  Sharding sharding = Sharding::Full;
  int shard_size = 0;          // hybrid only; full = the data-parallel ranks, none = 1
  int tp = 1;                  // tensor-parallel group size (--tp): Megatron-LM inside each layer
  int pp = 1;                  // pipeline stages (--pp)
  int micro_batches = 1;       // micro-batches per step of a data-parallel rank (--micro-batches)
  PipeSchedule pp_schedule = PipeSchedule::OneFOneB;  // --pp-schedule
  int pp_split = -1;           // --pp-split: the first decoder stage, -1 balanced by FLOPs
  double bucket_mb = 25.0;     // DDP bucket cap (the first bucket is 1 MiB, as PyTorch's)
  Prefetch prefetch = Prefetch::BackwardPre;
  bool forward_prefetch = false;
  // FSDP's gradient reduction schedule. 1 (FullyShardedDataParallel, as the FSDP paper ran
  // it): reduce-scatters run on their own stream and compute waits for them only at the end
  // of backward. 2 (fully_shard): before issuing a unit's reduce-scatter, compute waits for
  // the previous one (post_backward), which bounds the unsharded gradients alive to two.
  int fsdp_version = 1;
  bool checkpointing = false;
  AttentionImpl attention = AttentionImpl::Unfused;  // --attention (default per backend)
  // Mixed precision as FSDP's MixedPrecision(param_dtype, reduce_dtype): fp32 master
  // parameters and Adam state; parameters gathered and computed in param_dtype (so are
  // activations and gradients); gradients reduced in reduce_dtype.
  DType param_dtype = DType::F32;
  DType reduce_dtype = DType::F32;
  // Loss scaling (fp16 gradients underflow without it): the loss gradient is multiplied by
  // the scale and Adam divides it out. Dynamic, as PyTorch's (Sharded)GradScaler: a step
  // whose reduced gradients hold an inf or NaN on any rank is skipped and the scale halved;
  // after `loss_scale_growth_interval` good steps in a row it doubles.
  float loss_scale = 1.f;  // static scale, or the initial one when dynamic
  bool dynamic_loss_scale = false;
  int loss_scale_growth_interval = 2000;
  uint64_t seed = 0;
  AdamConfig adam;

  std::string label() const;  // "ddp", "fsdp-full", "fsdp-hybrid2", ...
};

// The layout a configuration runs on `world` ranks, seen from `rank`: --pp pipeline stages
// of consecutive groups of ranks, in each tensor-parallel groups of --tp consecutive ranks,
// and over the world / (pp × tp) data-parallel ranks shard groups of all of them (full,
// grad-op), of one rank (DDP, none) or of --shard-size (hybrid). Throws UsageError for sizes
// the world does not allow.
ParallelLayout layout_for(const StrategyConfig& c, int world, int rank);

// The model stages each pipeline stage runs (split_pipeline over the blocks' forward FLOPs,
// the head's counted with the last decoder block), for a configuration and shape.
PipelineSplit pipeline_split(const StrategyConfig& c, const ModelSpec& spec, const StepShape& shape);

class Strategy {
 public:
  virtual ~Strategy() = default;
  // Runs forward, backward, gradient reduction and the Adam update; returns this rank's
  // loss summed over its tokens. `step` counts from 1.
  virtual double step(int step, const Tokens& tokens) = 0;
  // Full flat parameter of unit `u` (unpadded) on the host of every rank: collective over
  // the shard group, for checks.
  virtual std::vector<float> gather_unit(int u) = 0;
  // Unit `u`'s reduced gradient as the last optimizer step read it (still scaled by the
  // loss scale), as fp32, on every rank: collective over the shard group, for --check.
  virtual std::vector<float> gather_unit_grad(int u) = 0;
  virtual const T5Step& model() const = 0;
  virtual float loss_scale() const = 0;         // the scale the next step will use
  virtual bool skipped_last_step() const = 0;   // dynamic scaling found inf/NaN gradients
};

// Host copy of raw elements in `t` (fp32, bf16 or fp16) as fp32; allocates no backend memory
// (the checks between steps must not change the run's memory peaks).
inline std::vector<float> host_as_f32(const std::vector<char>& raw, DType t, int64_t n) {
  std::vector<float> out(n);
  for (int64_t i = 0; i < n; ++i)
    if (t == DType::F32) out[i] = reinterpret_cast<const float*>(raw.data())[i];
    else {
      const uint16_t h = reinterpret_cast<const uint16_t*>(raw.data())[i];
      out[i] = t == DType::BF16 ? bf16_bits_to_float(h) : f16_bits_to_float(h);
    }
  return out;
}

std::unique_ptr<Strategy> make_strategy(const StrategyConfig& cfg, const ModelSpec& spec,
                                        Backend& backend, Mesh& mesh, const StepShape& shape);

// Base for DDP and FSDP: owns the model step and runs the stage loop with hooks. Under
// pipeline parallelism the step is the schedule's list of actions (pipeline_actions): a
// forward action receives the stage's inputs from the previous stage, runs the forward of
// its model stages and sends their outputs on; a backward action receives the outputs'
// gradients, runs the backward and sends the inputs' gradients back. Hooks fire for each
// micro-batch; gradients accumulate over the micro-batches, and the strategies reduce them
// only in the last one's backward (first_micro(), last_micro()). The root unit's tensors
// (embedding, final norms, LM head) used on several stages are summed over those stages
// after the strategy's reductions (Megatron-LM's embedding group).
class TrainingSchedule : public Strategy {
 public:
  TrainingSchedule(const StrategyConfig& cfg, const ModelSpec& spec, Backend& b, Mesh& mesh,
                   const StepShape& shape);
  ~TrainingSchedule() override;
  double step(int step, const Tokens& tokens) override;
  const T5Step& model() const override { return model_; }
  float loss_scale() const override { return scale_; }
  bool skipped_last_step() const override { return skipped_; }

 protected:
  // Stage indices in backward order, and for each unit its first/last stage in each pass.
  struct UnitStages {
    int first_forward = -1, last_forward = -1;
    int first_backward = -1, last_backward = -1;  // positions in backward order
  };
  virtual CBuf params_for(int unit) = 0;             // before forward or backward of a stage
  virtual Buf grads_for(int unit) = 0;               // before backward of a stage
  virtual void before_forward(int pos) {}            // pos: position in forward order
  virtual void after_forward(int pos) {}
  virtual void before_backward(int pos) {}           // pos: position in backward order
  virtual void after_backward(int pos) {}
  virtual void finish_gradients() = 0;               // all reductions complete
  virtual void optimizer_step(int step) = 0;
  // What Adam reads (this rank's reduced gradients) and the group whose ranks hold
  // different parts of it (the shard group): for the dynamic loss scale's inf/NaN check.
  virtual CBuf reduced_gradients(int64_t& n) const = 0;

  // This rank's reduced gradient of unit u (reduce dtype; what Adam reads of it): for the
  // sum over the pipeline stages that share the root unit.
  virtual Buf reduced_gradient(int unit, int64_t& n) = 0;

  int forward_unit(int pos) const { return model_.stages()[pos].unit; }
  int backward_stage(int pos) const { return int(model_.stages().size()) - 1 - pos; }
  int backward_unit(int pos) const { return model_.stages()[backward_stage(pos)].unit; }
  int num_stages() const { return int(model_.stages().size()); }
  // This pipeline stage's positions: [forward_begin, forward_end) in forward order,
  // [backward_begin, backward_end) in backward order (every position without --pp).
  int forward_begin() const { return part_.first; }
  int forward_end() const { return part_.last; }
  int backward_begin() const { return num_stages() - part_.last; }
  int backward_end() const { return num_stages() - part_.first; }
  // The backward being run is of the step's first / last micro-batch.
  bool first_micro() const { return backward_count_ == 0; }
  bool last_micro() const { return backward_count_ == cfg_.micro_batches - 1; }

  StrategyConfig cfg_;
  Backend& b_;
  Mesh& mesh_;
  PipelinePart part_;  // this pipeline stage's model stages
  T5Step model_;
  std::vector<UnitSpec> units_;  // every unit; the ones this stage does not hold are empty
  std::vector<UnitStages> unit_stages_;

 private:
  void forward_micro(int micro);
  void backward_micro(int micro);
  void sum_tied_root();
  bool gradients_finite();
  int stage_ = 0, stages_ = 1;                 // this pipeline stage, of
  int backward_count_ = 0;                     // backward actions run in this step
  MPI_Comm pp_grads_mpi_ = MPI_COMM_NULL;      // the pipeline's gradients (a second communicator)
  std::unique_ptr<Comm> pp_grads_;
  MPI_Comm root_mpi_ = MPI_COMM_NULL;          // the stages holding the root unit
  std::unique_ptr<Comm> root_comm_;
  std::vector<std::vector<Request>> sent_;     // per micro-batch: its forward sends, waited on in its backward
  std::vector<Request> grad_sends_;            // backward sends, waited on at the end of the step
  float base_grad_scale_;  // 1 / global tokens
  float scale_;            // current loss scale
  int good_steps_ = 0;     // in a row, since the scale last changed
  bool skipped_ = false;
};

}  // namespace sb
