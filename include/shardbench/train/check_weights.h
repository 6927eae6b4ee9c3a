// --check: each step of a run against a single-rank reference on rank 0 (and, under tensor
// parallelism, a tensor-parallel reference on the first tensor-parallel group, and that
// group's tensor-parallel model against the full model in lockstep: train/tp_lockstep.h),
// with tolerances from an error analysis (docs/reliability.md). Every method is collective
// over MPI_COMM_WORLD.
#pragma once
#include <memory>
#include <string>
#include <vector>

#include "shardbench/strategy/strategy.h"
#include "shardbench/train/options.h"

namespace sb {

class TpLockstep;

class StepCheck {
 public:
  StepCheck(const RunConfig& cfg, const Setup& setup, Strategy& run, const Mesh& mesh);
  ~StepCheck();
  void before_step(int step);
  void after_step(int step, bool skipped);
  // Prints the verdict (rank 0); the worst error as a multiple of its rounding bound.
  bool finish(double& worst_ratio);

 private:
  struct Reference;
  struct MicroBatchSums {  // rank 0: Σ g_r and Σ |g_r| over the data-parallel ranks' micro-batches
    std::vector<std::vector<double>> sum, abs_sum;
    bool micro_nonfinite = false;
  };
  std::vector<float> assemble(int unit, const std::vector<float>& mine, bool& replicas_differ);
  std::vector<float> whole_unit(int unit, bool gradient, bool& replicas_differ, bool& tp_copies_differ);
  std::vector<std::vector<float>> gather_weights();
  MicroBatchSums reference_gradients(int step);
  void check_gradients(int step, const std::vector<std::vector<float>>& grads, const MicroBatchSums& ref,
                       bool skipped);
  void check_update(int step, const std::vector<std::vector<float>>& grads,
                    const std::vector<std::vector<float>>& next, bool skipped);
  void fail(int step, const std::string& what);
  const RunConfig& cfg_;  // the run's flags: --check-tolerance, the backend
  const Setup& setup_;    // the run's strategy, model, shape and split
  Strategy& run_;
  ParallelLayout layout_;
  int rank_, world_, steps_ = 0;
  std::vector<UnitSpec> full_units_;                 // the full model's units
  std::vector<std::vector<UnitSpec>> tp_units_;      // per tensor-parallel rank, its part
  MPI_Comm tp_mpi_ = MPI_COMM_NULL;                  // the run's tensor-parallel group
  MPI_Comm pp_mpi_ = MPI_COMM_NULL;                  // the run's pipeline
  double gamma_ = 0, eta_ = 0;  // of n = the data-parallel ranks' terms
  double u_ = 0, eta1_ = 0;     // R's unit roundoff, half its smallest subnormal
  int embedding_ = 0;                // the embedding unit
  std::vector<int> embedding_part_;  // per piece that uses it: its pipeline stage's part, else -1
  int embedding_parts_ = 0;          // pipeline stages that hold it
  float scale_ = 1;
  std::vector<std::vector<float>> weights_;  // the run's weights before the next step
  std::unique_ptr<Reference> ref_;           // rank 0
  std::unique_ptr<TpLockstep> lockstep_;     // the first tensor-parallel group (tp_lockstep.h)
  std::string failure_;                      // rank 0: the first failure
  std::string tp_failure_;                   // rank 0: the lockstep's first difference
  double worst_ratio_ = 0, max_update_diff_ = 0;
  long long undetermined_ = 0, checked_ = 0;
};

}  // namespace sb
