// The configuration of one ddp_perf or fsdp_perf run and its command line.
#pragma once
#include <string>
#include <vector>

#include "shardbench/backend/comm_staging.h"
#include "shardbench/model/model.h"
#include "shardbench/strategy/strategy.h"

namespace sb {

struct RunConfig {
  std::string program;
  std::vector<std::string> argv;
  ModelSpec model;
  StepShape shape;  // per rank
  int steps = 5;
  int warmup = 1;
  std::string backend = "cpu";
  CommLibrary comm = CommLibrary::Nccl;  // --comm: collectives of the CUDA backend
  double mem_limit_gib = 0;  // 0: the machine's memory / ranks on the node
  double host_mem_limit_gib = 0;  // host memory (CPU offload's alloc_host); 0: the node's memory / ranks on the node
  int plan_world = 0;        // --world-size for --plan (0: the MPI world)
  std::string schedule_json;  // --schedule-json: with --plan, the step's schedule for the projection
  bool plan_only = false;
  std::string plan_batch;          // --plan-batch FILE ("-": stdin): one plan per line of flags
  bool plan_batch_ops = true;      // --plan-batch-ops all (true) | none
  bool check = false;
  std::string out_path;      // --out; empty: a name under results/ made from the run
  bool overwrite = false;
  double timeout_s = 600;      // --timeout-s: the watchdog (0: off)
  double check_tolerance = 1;  // --check: allowed error as a multiple of its rounding bound
  ComputeOptions compute;      // --attention-kernel, --fused-epilogues, --cuda-graphs (opt-in paths)
  StrategyConfig strategy;  // as the flags give it; the layout and split: Setup::make
};

// Parses argv for `kind`. Returns false when --help was printed. Throws UsageError.
bool parse_options(int argc, char** argv, StrategyKind kind, RunConfig& cfg);

}  // namespace sb
