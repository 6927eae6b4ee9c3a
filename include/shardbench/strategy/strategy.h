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

// The layout a configuration runs on `world` ranks, seen from `rank`: tensor-parallel groups
// of --tp consecutive ranks, and over the world / tp data-parallel ranks shard groups of all
// of them (full, grad-op), of one rank (DDP, none) or of --shard-size (hybrid). Throws
// UsageError for sizes the world does not allow.
ParallelLayout layout_for(const StrategyConfig& c, int world, int rank);

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

// Base for DDP and FSDP: owns the model step and runs the stage loop with hooks.
class TrainingSchedule : public Strategy {
 public:
  TrainingSchedule(const StrategyConfig& cfg, const ModelSpec& spec, Backend& b, Mesh& mesh,
                   const StepShape& shape);
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

  int forward_unit(int pos) const { return model_.stages()[pos].unit; }
  int backward_stage(int pos) const { return int(model_.stages().size()) - 1 - pos; }
  int backward_unit(int pos) const { return model_.stages()[backward_stage(pos)].unit; }
  int num_stages() const { return int(model_.stages().size()); }

  StrategyConfig cfg_;
  Backend& b_;
  Mesh& mesh_;
  T5Step model_;
  std::vector<UnitSpec> units_;
  std::vector<UnitStages> unit_stages_;

 private:
  bool gradients_finite();
  float base_grad_scale_;  // 1 / global tokens
  float scale_;            // current loss scale
  int good_steps_ = 0;     // in a row, since the scale last changed
  bool skipped_ = false;
};

}  // namespace sb
