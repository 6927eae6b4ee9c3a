// --check under tensor parallelism: the tensor-parallel model against the full model, in
// lockstep (docs/reliability.md, "Tensor parallelism").
//
// Both models run in fp32 on a CPU backend of their own whose GEMMs, fused attention and
// cross-entropy sums compute every element exactly and round it once
// (ComputeOptions::exact_sums, backend/exact_sum.h). An element then does not depend on the
// shape of the GEMM it is part of, so the tensor-parallel model computes, for its columns,
// heads or vocabulary rows, the very values the full model does, everywhere but at the sums
// over the group: a rank's part of a row-parallel product (or of the cross-entropy's Σexp)
// is rounded on its own, and the all-reduce adds the parts with roundings of its own.
//
// The full model (a group of one: the same sums at the same places, with nothing to sum;
// T5Step::GroupSumHook) runs first and records each sum, with its rounding budget: for each
// element, Σ (u·|acc| + η) over the roundings of the buffer the sum reads (u = 2^-24,
// η = 2^-150 for a subnormal result), which bounds its distance from the exact sum of the
// terms. Then the tensor-parallel model runs, and at each sum the group's result S must
// lie within
//
//     |S − F| <= Σ_r β_r + γ(T−1)·Σ_r |p_r| + (T−1)·η + β_F
//
// of the full model's F: β_r the budget of rank r's part p_r, γ(T−1) = (T−1)u/(1−(T−1)u)
// the all-reduce's own additions in any order, β_F the full model's budget (the exact sums
// of both sides are the same number: the same terms on the same inputs). A maximum is exact
// and must be equal. Then every rank sets the sum to F, so the rest of the step stays in
// lockstep, and at the end each gradient of the tensor-parallel model, placed in the full
// tensors, and the loss must equal the full model's bit for bit: every other operation of
// the two models is the same operation on the same values.
#pragma once
#include <mpi.h>

#include <memory>
#include <string>
#include <vector>

#include "shardbench/model/t5.h"
#include "shardbench/strategy/setup.h"

namespace sb {

class TpLockstep {
 public:
  // Collective over `group`, the first tensor-parallel group (its rank 0, world rank 0,
  // also runs the full model); the lockstep duplicates it. The models take the run's model,
  // micro-batch shape, attention path and activation checkpointing.
  TpLockstep(const Setup& setup, MPI_Comm group);
  ~TpLockstep();
  TpLockstep(const TpLockstep&) = delete;
  TpLockstep& operator=(const TpLockstep&) = delete;

  // One data-parallel rank's step (its micro-batches in order) at the full weights
  // `weights` (one vector per unit, the same on every rank of the group), the loss
  // gradient scaled by grad_scale. Collective over the group. Returns, on group rank 0,
  // the first difference in one line ("" when none).
  std::string check(const std::vector<std::vector<float>>& weights, const Tokens& tokens, float grad_scale);

  // Group rank 0, over every check so far: the worst |S − F| as a multiple of its bound,
  // the sums and elements compared, the gradient elements compared.
  double worst_ratio() const;
  long long sums() const;
  long long sum_elements() const;
  long long gradient_elements() const;

 private:
  struct Impl;
  std::unique_ptr<Impl> impl_;
};

}  // namespace sb
