// --check's reference models, made in one place for both of its users: the single-rank
// reference (check_weights.cpp) and the tensor-parallel lockstep (tp_lockstep.cpp).
#pragma once
#include <memory>
#include <vector>

#include "shardbench/backend/backend.h"
#include "shardbench/model/t5.h"
#include "shardbench/strategy/setup.h"

namespace sb {

// The run's model, micro-batch shape (a data-parallel rank's batch / --micro-batches),
// attention path and activation checkpointing, in `dtype` with the loss gradient's
// `grad_scale`, in the tensor-parallel group `tp` (the full model by default). It runs every
// piece, but folds the position-bias table's gradient where the run's pipeline stages
// start, so its sums are the run's.
std::unique_ptr<T5Step> make_reference_step(const Setup& setup, Backend& b, DType dtype, float grad_scale,
                                            TensorGroup tp = {});

// A reference step with every unit held whole: a parameter and a gradient buffer per unit
// (index = unit), in the step's dtype, for T5Step's by_unit.
struct ReferenceModel {
  std::unique_ptr<T5Step> step;
  std::vector<Buf> params, grads;
  void make(const Setup& setup, Backend& b, DType dtype, float grad_scale, TensorGroup tp = {});
  void release(Backend& b);  // the step, then the buffers
};

}  // namespace sb
