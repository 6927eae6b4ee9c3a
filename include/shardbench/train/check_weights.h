// --check: each step of a run against a single-rank reference on rank 0, with tolerances
// from an error analysis (docs/reliability.md). Every method is collective over
// MPI_COMM_WORLD.
#pragma once
#include <memory>
#include <string>
#include <vector>

#include "shardbench/strategy/strategy.h"
#include "shardbench/train/options.h"

namespace sb {

class StepCheck {
 public:
  StepCheck(const RunConfig& cfg, Strategy& run, int rank, int world);
  ~StepCheck();
  void before_step(int step);
  void after_step(int step, bool skipped);
  // Prints the verdict (rank 0); the worst error as a multiple of its rounding bound.
  bool finish(double& worst_ratio);

 private:
  struct Reference;
  std::vector<std::vector<float>> gather_weights();
  void check_gradients(int step, const std::vector<std::vector<float>>& grads, bool skipped);
  void check_update(int step, const std::vector<std::vector<float>>& grads,
                    const std::vector<std::vector<float>>& next, bool skipped);
  void fail(int step, const std::string& what);
  const RunConfig& cfg_;
  Strategy& run_;
  int rank_, world_, steps_ = 0;
  double gamma_ = 0, eta_ = 0;
  float scale_ = 1;
  std::vector<std::vector<float>> weights_;  // the run's weights before the next step
  std::unique_ptr<Reference> ref_;           // rank 0
  std::string failure_;                      // rank 0: the first failure
  double worst_ratio_ = 0, max_update_diff_ = 0;
  long long undetermined_ = 0, checked_ = 0;
};

}  // namespace sb
