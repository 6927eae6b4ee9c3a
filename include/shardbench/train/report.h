// What a training run reports: the configuration table, the summary and the RESULT line on
// rank 0, and the HDF5 root and plan attributes (docs/trace-format.md lists every one).
#pragma once
#include <cstdint>
#include <cstdio>
#include <string>
#include <vector>

#include "shardbench/backend/layout.h"
#include "shardbench/trace/h5.h"
#include "shardbench/train/options.h"
#include "shardbench/train/plan.h"

namespace sb {

// Rank-0 printing goes through one helper.
struct Out {
  int rank = 0;
  template <class... A>
  void operator()(const char* fmt, A... a) const {
    if (rank != 0) return;
    std::printf(fmt, a...);
    std::fflush(stdout);
  }
};

// The strategy, model and step as they run: the setup's (what the flags left open resolved).
void print_config(const Out& out, const RunConfig& cfg, const Setup& setup);

// The figures of the timed steps (medians; times: slowest rank; breakdown: mean over ranks).
struct Summary {
  int steps = 0;                 // timed steps
  double step_time = 0;          // s
  double model_flops = 0, hardware_flops = 0, tokens = 0;  // per step
  double compute = 0, gemm = 0, gemm_rate = 0;  // s, s, FLOP/s
  double communication = 0, exposed = 0, overhead = 0;  // s
  double gemm_vs_replay = 0;     // the worst rank's in-step GEMM rate over its replay
  int ranks_on_node = 0, cores = 0;
  std::string placement;         // placement_warning: a group that should stay in a node does not
  int64_t peak = 0, plan_peak = 0, rss_growth = 0;  // bytes
  int64_t host_peak = 0, plan_host_peak = 0;  // the host ledger's (CPU offload), bytes
  double final_loss = 0;
  int first_nonfinite = 0;       // the first step whose global loss was inf or NaN (0: none)
  int skipped_steps = 0;         // dynamic loss scaling: updates skipped
  double final_loss_scale = 0;
  // The share of the step a rank does not compute (1 − mean compute / slowest rank's step
  // time, median over the timed steps): under pipeline parallelism the bubble, beside the
  // schedule's theoretical (S − 1) / (M + S − 1).
  double idle_share = 0, bubble_theory = 0;
  int pp = 1;
  bool oversubscribed() const { return ranks_on_node > cores; }
};
// The summary block and the RESULT line.
void print_summary(const Out& out, const RunConfig& cfg, const Setup& setup, int world, const Summary& s);
std::vector<Attr> summary_attrs(const Summary& s);

// Root attributes: what ran.
std::vector<Attr> run_attrs(const RunConfig& cfg, const Setup& setup, const char* status, double start, double end);
std::vector<Attr> plan_attrs(const RunConfig& cfg, const Setup& setup, const MemoryPlan& plan);

}  // namespace sb
