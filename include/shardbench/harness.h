// The shared harness of ddp_perf and fsdp_perf: options, the memory plan, the timing
// protocol (warm-up, steps, cross-rank reduction), rank-0 output, --check, exit codes.
#pragma once
#include <mpi.h>

#include <condition_variable>
#include <chrono>
#include <functional>
#include <memory>
#include <mutex>
#include <thread>
#include <string>
#include <vector>

#include "shardbench/backend.h"
#include "shardbench/comm_staging.h"
#include "shardbench/model.h"
#include "shardbench/strategy.h"

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
  int plan_world = 0;        // --world-size for --plan (0: the MPI world)
  std::string schedule_json;  // --schedule-json: with --plan, the step's schedule for the projection
  bool plan_only = false;
  bool check = false;
  std::string out_path;      // --out; empty: a name under results/ made from the run
  bool overwrite = false;
  double timeout_s = 600;      // --timeout-s: the watchdog (0: off)
  double check_tolerance = 1;  // --check: allowed error as a multiple of its rounding bound
  StrategyConfig strategy;
};

// Parses argv for `kind`. Returns false when --help was printed. Throws UsageError.
bool parse_options(int argc, char** argv, StrategyKind kind, RunConfig& cfg);

struct MemoryPlan {
  int world = 1, shard = 1;
  MemBytes peak{};              // per category, each at its own peak
  MemBytes at_peak{};           // per category at the moment of the total peak
  int64_t peak_total = 0;
  int64_t limit = 0;            // bytes
  double counted_flops = 0;     // GEMM FLOPs of one step, as the schedule issues them
  std::vector<OpEvent> schedule;  // GEMMs, collectives, waits, optimizer of one step, in order
  bool fits() const { return peak_total <= limit; }
};

// Runs one step of the configured strategy on the counting backend for rank 0 of a world
// of `world` ranks: nothing is allocated or computed.
MemoryPlan plan_memory(const RunConfig& cfg, int world);
// The plan and the step's schedule as JSON (analysis/project.py replays it).
void write_schedule_json(const std::string& path, const RunConfig& cfg, const MemoryPlan& plan);
// The plan as a table (rank 0 prints it).
std::string format_plan(const RunConfig& cfg, const MemoryPlan& plan);

// --check (src/harness/reference_check.cpp): each step of `run` against a single-rank
// reference on rank 0, with tolerances from an error analysis. Every method is collective
// over MPI_COMM_WORLD.
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

// The watchdog (src/harness/watchdog.cpp): ends the job when this rank has made no progress
// for timeout_s (0: off), after one line naming the rank, step and pending operation and a
// call of on_timeout (from the watchdog's thread; rank 0 records the failure there).
class Watchdog {
 public:
  Watchdog(double timeout_s, int rank, std::function<void(const std::string&)> on_timeout);
  ~Watchdog();
  void progress(int step, const char* pending);  // `pending`: a string literal

 private:
  void watch();
  double timeout_s_;
  int rank_;
  std::function<void(const std::string&)> on_timeout_;
  std::mutex mutex_;
  std::condition_variable wake_;
  std::thread thread_;
  bool stop_ = false;
  int step_ = 0;
  const char* pending_ = "";
  std::chrono::steady_clock::time_point last_;
};

struct Attr;
// Command line, versions of shardbench, compiler, MPI, HDF5 (and CUDA/NCCL where built),
// and rank 0's SLURM_* environment. Collective over MPI_COMM_WORLD.
std::vector<Attr> collect_provenance(const std::vector<std::string>& argv);
std::string hostname();
int local_ranks();  // ranks sharing this node (collective)
// Memory one rank may plan for: the device's free memory where known (device_free > 0),
// else host memory / ranks on the node (collective).
int64_t default_memory_limit(int64_t device_free);
int count_nodes();  // distinct nodes of MPI_COMM_WORLD (collective)
// Decides a result path (default under results/ from `stem`) and checks it on rank 0
// before any work; throws UsageError on every rank for an existing file (without
// overwrite), a missing or unwritable directory.
std::string resolve_output(const std::string& out, bool overwrite, const std::string& stem, int rank);
std::string iso_time(double epoch_seconds);
double wall_clock_rank0();

// Every program's main: MPI up with errors returned to MPI_CHECK, `body(rank, world)`,
// a UsageError printed once as "<program>: error: ..." with exit code 2 on every rank
// (all ranks parsed the same argv, so none hangs), any other exception fatal.
int mpi_main(int argc, char** argv, int (*body)(int argc, char** argv, int rank, int world));

// The whole program: MPI init, parse, plan, run, report, exit code.
int run_program(int argc, char** argv, StrategyKind kind);

}  // namespace sb
