// The strategy interface: one training step over the backend, and what the checks read of
// it. DDP and FSDP implement it over the one step loop of TrainingSchedule
// (strategy/training_schedule.h); the programs see only this header.
#pragma once
#include <memory>
#include <vector>

#include "shardbench/backend/backend.h"
#include "shardbench/backend/layout.h"
#include "shardbench/core/half.h"
#include "shardbench/model/model.h"
#include "shardbench/model/t5.h"
#include "shardbench/strategy/config.h"
#include "shardbench/strategy/setup.h"

namespace sb {

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

// DDP or FSDP on `mesh` (made from setup.layout), as `setup` says: made once per
// configuration (a plan makes a strategy for each pipeline stage of the same setup).
std::unique_ptr<Strategy> make_strategy(const Setup& setup, Backend& backend, Mesh& mesh);

}  // namespace sb
