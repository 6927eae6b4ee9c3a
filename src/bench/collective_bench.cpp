// collective_perf: the interconnect benchmark (nccl-tests conventions, over the backend).
// For every operation and size: a data check against computed expectations, warm-up, then
// timed iterations, each issued and completed on its own so every iteration's time is kept
// per rank; the cross-rank reduction (-a), percentiles and stragglers come from those
// samples. Output: the nccl-tests table on rank 0 and an HDF5 result with every sample.
#include <CLI/CLI.hpp>

#include <algorithm>
#include <cmath>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <csignal>
#include <ctime>
#include <numeric>
#include <set>

#include <sys/stat.h>
#include <unistd.h>

#include "shardbench/backend/comm_staging.h"
#include "shardbench/bench/collective_bench.h"
#include "shardbench/bench/collectives.h"
#include "shardbench/bench/pair_sweep.h"
#include "shardbench/core/check.h"
#include "shardbench/core/cli.h"
#include "shardbench/core/format.h"
#include "shardbench/core/half.h"
#include "shardbench/core/nodes.h"
#include "shardbench/run/environment.h"
#include "shardbench/run/mpi_main.h"
#include "shardbench/run/provenance.h"
#include "shardbench/backend/layout.h"
#include "shardbench/strategy/config.h"
#include "shardbench/trace/h5.h"
#include "shardbench/trace/trace.h"

namespace sb {
namespace {

constexpr int kSchemaVersion = 2;

struct Options {
  std::vector<std::string> argv;
  std::vector<BenchOp> ops;
  std::vector<DType> dtypes{DType::F32};       // -d (all: every type the backend reduces)
  std::vector<ReduceOp> redops{ReduceOp::Sum};  // -o (all: sum, prod, max, min, avg)
  std::vector<int> roots{0};                   // -r (all: every rank)
  int64_t min_bytes = 32 * 1024 * 1024, max_bytes = 32 * 1024 * 1024;
  int64_t step_bytes = 0;  // -i: a fixed increment, used when -f is not given
  double factor = 2;
  int iters = 20, warmup = 5, agg = 1, cycles = 1, check = 1, average = 1;
  ParallelLayout layout;  // --shard-size: the shard groups of the hybrid operation (1 rank without it)
  // --groups: the operations in every group along this axis of the layout at once, as a
  // hybrid run's replicate (or shard) groups run theirs; empty: across all ranks.
  std::string groups;
  int blocking = 0;      // -z, nccl-tests' blocking mode (which barriers run; never timed)
  bool barrier = false;  // --barrier: one before every timed iteration
  int timeout_s = 0, cputime = 0, timestamps = 0, memory = 0, unalign = 0, per_iter = 0, per_iter_skip = 0;
  std::string backend = "cpu", out, json;
  std::vector<CommLibrary> comms;  // --backend cuda: the libraries compared (rows of one table)
  bool overwrite = false;
  bool nonblocking = false;  // the non-blocking path (issue, then wait) instead of the blocking call
  double min_busbw = 0;
  int inject_error = -1;  // self-test of the data check: corrupt one element on this rank
  std::string pattern = "collectives";  // or pairs: pair_sweep.h
  PairSweepOptions pairs;               // --pattern pairs: its own options, filled here
};

const char* kAverageNames[] = {"rank0", "avg", "min", "max"};

// nccl-tests' CUDA-only flags: accepted at the value that means "off"; any other value
// names what this benchmark does not do.
struct NotApplicable {
  const char* flag;
  int value, off;
  const char* why;
};

void require_applicable(const std::vector<NotApplicable>& flags) {
  for (const NotApplicable& f : flags)
    if (f.value != f.off)
      throw UsageError(std::string(f.flag) + " " + std::to_string(f.value) + " does not apply: " + f.why);
}

std::vector<DType> parse_dtypes(const std::string& text) {
  if (text != "all") return {parse_dtype(text)};
  std::vector<DType> all;
  for (int i = 0; i < int(DType::kCount); ++i) all.push_back(DType(i));
  return all;
}

std::vector<ReduceOp> parse_redops(const std::string& text) {
  if (text == "mulsum") throw UsageError("-o mulsum is not allowed (NCCL's pre-multiplied sum has no MPI equivalent; "
                                         "allowed: sum, prod, min, max, avg, all)");
  if (text != "all") return {parse_reduce_op(text)};
  return {ReduceOp::Sum, ReduceOp::Prod, ReduceOp::Max, ReduceOp::Min, ReduceOp::Avg};  // nccl-tests' order
}

std::vector<int> parse_roots(const std::string& text, int world) {
  if (text == "all") {
    std::vector<int> all(world);
    std::iota(all.begin(), all.end(), 0);
    return all;
  }
  char* end = nullptr;
  const long r = std::strtol(text.c_str(), &end, 10);
  if (text.empty() || *end || r < 0 || r >= world)
    throw UsageError("-r " + text + " is not allowed (a rank below " + std::to_string(world) + ", or all)");
  return {int(r)};
}

// A file the run will write: its directory exists and it is not a directory.
void check_writable(const char* flag, const std::string& path) {
  const size_t slash = path.rfind('/');
  const std::string dir = slash == std::string::npos ? "." : slash == 0 ? "/" : path.substr(0, slash);
  struct stat st{};
  if (stat(dir.c_str(), &st) != 0 || !S_ISDIR(st.st_mode))
    throw UsageError(std::string(flag) + " '" + path + "': directory '" + dir + "' does not exist");
  if (stat(path.c_str(), &st) == 0 && S_ISDIR(st.st_mode))
    throw UsageError(std::string(flag) + " '" + path + "' is a directory");
}

// --ops' help, from the collective table: each operation with the nccl-tests program it matches.
std::string ops_help() {
  std::string text = "operations (comma-separated), or all:";
  for (BenchOp op : bench_ops())
    text += std::string(" ") + bench_op_name(op) +
            (op.hybrid ? " (reduce-scatter in shard groups, all-reduce across them)"
                       : std::string(" (") + collective_info(op.collective).nccl_tests + ")") +
            (op.hybrid ? "" : ",");
  return text;
}

bool parse(int argc, char** argv, Options& o, int rank, int world) {
  o.argv.assign(argv, argv + argc);
  CLI::App app{"collective_perf: collective bandwidth (nccl-tests conventions and flags) over the shardbench backend",
               "collective_perf"};
  app.option_defaults()->multi_option_policy(CLI::MultiOptionPolicy::TakeLast);
  std::string ops = "all-reduce", minb = "32M", maxb = "32M", stepb, dtype = "float", redop = "sum", root = "0";
  int shard = 0, threads = 1, gpus = 1, parallel_init = 0, stream_null = 0, graphs = 0, reg = 0, cta_policy = -1,
      device_impl = 0, device_ctas = 16;
  const char* floor_env = std::getenv("SHARDBENCH_MIN_BUSBW");
  app.add_option("--ops", ops, ops_help())->capture_default_str();
  NumericFlags num(app);  // every numeric flag: range-checked, no wrapping, no inf/nan
  // nccl-tests' flags, with their meanings. Those that cannot apply here still take any
  // integer nccl-tests takes, then say why their value does not apply (require_applicable).
  num.integer("-t,--nthreads", threads, 1, kIntMax, "threads per process: 1 (one rank per device; start more ranks "
                                                    "with mpirun)");
  num.integer("-g,--ngpus", gpus, 1, kIntMax, "devices per thread: 1 (one rank per device)");
  app.add_option("-b,--minbytes", minb, "smallest size (64, 1K, 16M, 1G)")->capture_default_str();
  app.add_option("-e,--maxbytes", maxb, "largest size")->capture_default_str();
  app.add_option("-i,--stepbytes", stepb, "add this many bytes between sizes (used when -f is not given)");
  auto* factor = num.real("-f,--stepfactor", o.factor, 1, 1e6, true, "multiply the size by this between sizes");
  num.integer("-n,--iters", o.iters, 1, kIntMax, "timed iterations per size");
  num.integer("-m,--agg_iters", o.agg, 1, kIntMax, "operations per iteration, issued together; the time is per "
                                                   "operation");
  num.integer("-w,--warmup_iters", o.warmup, 0, kIntMax, "warm-up iterations per size");
  num.integer("-N,--run_cycles", o.cycles, 0, kIntMax, "run the whole sweep this many times, printing each "
                                                       "(0: until stopped, no result file)");
  num.integer("-p,--parallel_init", parallel_init, 0, 1, "every rank initialises its own communicator already, "
                                                        "so this changes nothing");
  num.integer("-c,--check", o.check, 0, kIntMax, "iterations whose results are checked against expected values "
                                                 "(0: no check)");
  app.add_option("-o,--op", redop, "reduction: sum, prod, min, max, avg, or all")->capture_default_str();
  app.add_option("-d,--datatype", dtype, "float, double, int32, int64, uint8, bfloat16, half, or all")
      ->capture_default_str();
  app.add_option("-r,--root", root, "root rank of broadcast and reduce, or all")->capture_default_str();
  num.integer("-z,--blocking", o.blocking, 0, 3, "barriers between iterations, never timed: 0 none, 1 after each "
                                                 "operation (of -m), 2 none, 3 after each iteration (of -n)");
  num.integer("-y,--stream_null", stream_null, 0, 1, "0 (CUDA's null stream is not used)");
  num.integer("-T,--timeout", o.timeout_s, 0, kIntMax, "fail (exit 1) when one size of one test runs longer than "
                                                        "this many seconds (0: no limit)");
  num.integer("-G,--cudagraph", graphs, 0, kIntMax, "0 (no CUDA graphs)");
  num.integer("-C,--report_cputime", o.cputime, 0, 1, "1: report the host time until each call returns instead "
                                                      "of its completion (the same for blocking MPI)");
  num.integer("-S,--report_timestamps", o.timestamps, 0, 1, "1: end every table row with the time it was printed");
  app.add_option("-J,--output_file", o.json, "also write the table as JSON to this file");
  num.integer("-a,--average", o.average, 0, 3, "time reported across ranks: 0 rank 0, 1 avg, 2 min, 3 max");
  num.integer("-R,--local_register", reg, 0, 2, "0 (no NCCL buffer registration)");
  num.integer("-x,--cta_policy", cta_policy, -1, kIntMax, "-1: unset (no NCCL CTA policy)");
  num.integer("-D,--device_implementation", device_impl, 0, kIntMax, "0 (NCCL's own implementation)");
  num.integer("-V,--device_cta_count", device_ctas, 1, kIntMax, "16 (only with -D > 0)");
  num.integer("-M,--memory", o.memory, 0, 1, "1: report the memory of every rank at the end");
  num.integer("-u,--unalign", o.unalign, 0, 1 << 20, "misalign the buffers by this many elements");
  num.integer("-I,--per_iter_timing", o.per_iter, 0, 1, "1: add the min, median, p99 and max of the iterations "
                                                        "to every row");
  num.integer("-K,--per_iter_skip", o.per_iter_skip, 0, kIntMax, "leave this many leading iterations out of -I's "
                                                                 "figures");
  // shardbench's own.
  app.add_flag("--nonblocking", o.nonblocking,
               "measure the non-blocking collectives (MPI_I* then wait) the training programs overlap "
               "with compute, instead of the blocking ones (MPI_Allreduce, ...)");
  app.add_flag("--barrier", o.barrier, "a barrier before every timed iteration, so all ranks start it together");
  num.integer("--shard-size", shard, 1, kIntMax, "shard group size G of the hybrid operation and of --groups (divides the world; default: one node's ranks)");
  app.add_option("--groups", o.groups, "replicate or shard: the operations of --ops in every group of that axis of "
                                       "the --shard-size layout at once (replicate: the ranks at one position of "
                                       "every shard group, one a node by default; shard: each shard group), as a "
                                       "hybrid run's groups run theirs side by side; rows are a group's (its ranks' "
                                       "sizes and bus factor), times over every rank of every group")
      ->check(CLI::IsMember({"replicate", "shard"}));
  app.add_option("--backend", o.backend, "cpu (MPI); cuda (NCCL) where built")->capture_default_str();
  std::string comm;
  app.add_option("--comm", comm, "--backend cuda: nccl (default), mpi, mpi-staged, mpi-direct, or a list "
                                 "(nccl,mpi: the libraries' rows side by side in one table)");
  app.add_option("--out", o.out, "HDF5 result (default: results/collective_perf-w<ranks>-<time>.h5); a symbolic link, "
                                 "even a dangling one, is written through to its target, as cp does");
  app.add_flag("--overwrite", o.overwrite, "replace an existing --out file");
  num.real("--min-busbw", o.min_busbw, 0, 1e9, false,
           "fail (exit 5) when the average bus bandwidth is under this many GB/s (default: $SHARDBENCH_MIN_BUSBW)");
  num.integer("--inject-error", o.inject_error, 0, world - 1, "self-test: corrupt one result element on this rank");
  app.add_option("--pattern", o.pattern, "collectives: the operations of --ops across all ranks; pairs: every pair of "
                                         "nodes on its own (round robin, both directions at once), then each node's "
                                         "all-reduce inside it (analysis/diagnose.py reads the result)")
      ->check(CLI::IsMember({"collectives", "pairs"}))->capture_default_str();
  app.add_option("--pairs", o.pairs.pairs, "--pattern pairs: only these node pairs, host names A:B separated by commas "
                                          "(a re-test: diagnose.py prints the list); default every pair");
  std::string pair_ranks = "one";
  app.add_option("--pair-ranks", pair_ranks, "--pattern pairs: one rank per node, or matched: local rank i of one node "
                                            "with local rank i of the other, all at once (one NIC per GPU)")
      ->check(CLI::IsMember({"one", "matched"}))->capture_default_str();
  num.integer("--rounds", o.pairs.rounds, 1, kIntMax, "--pattern pairs: only the first K rounds of the schedule "
                                                     "(each pairs every node once: K pairs a node, the quick pass "
                                                     "of a large allocation; default all N-1)");
  num.integer("--repeat", o.pairs.repeat, 1, 1000, "--pattern pairs: the whole schedule this many times, nodes "
                                                  "relabelled each time so other pairs share a round; each "
                                                  "repetition is one sample of a pair for analysis/diagnose.py "
                                                  "(default 5: enough for its alpha of 0.01)");
  if (!parse_command_line(app, argc, argv)) return false;
  if (o.pattern != "pairs") {
    for (const char* flag : {"--pairs", "--pair-ranks", "--rounds", "--repeat"})
      if (app.count(flag)) throw UsageError(std::string(flag) + " is only allowed with --pattern pairs");
  } else {
    // The pair sweep takes nccl-tests' size and iteration flags; the others mean nothing to it.
    for (const char* flag : {"--ops", "-d", "-o", "-r", "-m", "-N", "-z", "-C", "-I", "-K", "-J", "-a", "-u", "-M", "-S",
                             "-T", "--shard-size", "--nonblocking", "--barrier", "--min-busbw", "--comm", "--groups"})
      if (app.count(flag))
        throw UsageError(std::string(flag) + " is not allowed with --pattern pairs (it takes -b -e -f -i -n -w -c, "
                                             "--pairs, --pair-ranks, --rounds, --repeat, --backend, --out, --overwrite)");
    o.pairs.matched = pair_ranks == "matched";
  }
  num.apply();
  const std::string one_rank = "collective_perf runs one rank per device (start more ranks with mpirun -np)";
  require_applicable({{"-t", threads, 1, one_rank.c_str()},
                      {"-g", gpus, 1, one_rank.c_str()},
                      {"-y", stream_null, 0, "the backend runs collectives on its own stream"},
                      {"-G", graphs, 0, "collectives are not captured in CUDA graphs"},
                      {"-R", reg, 0, "buffers are not registered with NCCL"},
                      {"-x", cta_policy, -1, "NCCL's CTA policy is not set"},
                      {"-D", device_impl, 0, "NCCL's device implementations are not used"},
                      {"-V", device_ctas, 16, "only with -D > 0"}});
  if (o.min_busbw == 0 && floor_env) o.min_busbw = parse_real("SHARDBENCH_MIN_BUSBW", floor_env, 0, 1e9, false);
  o.ops = parse_bench_ops(ops);
  if (!comm.empty() && o.backend != "cuda")
    throw UsageError("--comm is only allowed with --backend cuda (the CPU backend's collectives are MPI)");
  for (size_t at = 0; o.backend == "cuda";) {  // "nccl,mpi" → both, in that order
    const size_t end = std::min(comm.find(',', at), comm.size());
    const CommLibrary c = comm.empty() ? CommLibrary::Nccl : parse_comm_library(comm.substr(at, end - at), "--comm");
    if (std::count(o.comms.begin(), o.comms.end(), c))
      throw UsageError("--comm '" + comm + "' names " + comm_library_name(c) + " twice");
    o.comms.push_back(c);
    if (end >= comm.size()) break;
    at = end + 1;
  }
  o.min_bytes = parse_size("-b", minb);
  o.max_bytes = parse_size("-e", maxb);
  if (!stepb.empty() && factor->count() == 0) o.step_bytes = parse_size("-i", stepb), o.factor = 1;
  if (o.min_bytes > o.max_bytes)
    throw UsageError("-b " + minb + " is larger than -e " + maxb + " (the smallest size must not exceed the largest)");
  o.dtypes = parse_dtypes(dtype);
  o.redops = parse_redops(redop);
  o.roots = parse_roots(root, world);
  if (o.per_iter_skip >= o.iters)
    throw UsageError("-K " + std::to_string(o.per_iter_skip) + " is not allowed (must be below -n " +
                     std::to_string(o.iters) + ")");
  if (!o.json.empty()) check_writable("-J", o.json);
  const bool hybrid = std::any_of(o.ops.begin(), o.ops.end(), [](BenchOp op) { return op.hybrid; });
  if (hybrid && !o.groups.empty())
    throw UsageError("--groups is not allowed with the hybrid operation (it runs in both groups itself)");
  if ((hybrid || !o.groups.empty()) && shard == 0) {  // one node's ranks, as fsdp_perf's hybrid (the same rule)
    StrategyConfig node_groups;
    node_groups.sharding = Sharding::Hybrid;
    shard = node_shard_size(node_groups, node_map());
  }
  o.layout = ParallelLayout::make(world, rank, shard ? shard : 1);
  if (!o.groups.empty()) {
    const int g = o.layout.size(o.groups == "shard" ? Axis::Shard : Axis::Replicate);
    for (int r : o.roots)
      if (r >= g)
        throw UsageError("-r " + std::to_string(r) + " is not allowed with --groups " + o.groups + " (a group has " +
                         std::to_string(g) + " ranks: roots 0.." + std::to_string(g - 1) + ")");
  }
  return true;
}

// ---- deterministic inputs and expected results, per element type ----
template <class T>
constexpr bool is_half() { return std::is_same<T, bf16>::value || std::is_same<T, f16>::value; }

template <class T>
T input(int rank, int64_t i, ReduceOp redop) {
  if (redop == ReduceOp::Prod) return (rank + i) % 3 == 0 ? T(-1) : T(1);  // products stay small
  // Sums stay exact: 16-bit floats hold every integer up to 256 (bfloat16) or 2048 (half).
  if (is_half<T>()) return T(((rank + 1) * 3 + i * 7) % 3 - 1);
  return T(((rank + 1) * 3 + i * 7) % 11 - 5);
}

// Exact, except averages of 16-bit floats: NCCL may scale before summing, so the rounding
// of x/n is allowed (half an ulp of each term, a few ulps in all).
template <class T>
bool matches(T got, T want, ReduceOp redop) {
  if (!is_half<T>() || redop != ReduceOp::Avg) return got == want;
  const float ulp = std::is_same<T, bf16>::value ? 1.f / 128 : 1.f / 1024;
  return std::fabs(float(got) - float(want)) <= 4 * ulp * std::max(1.f, std::fabs(float(want)));
}

template <class T>
T combine(T a, T b, ReduceOp op) {
  switch (op) {
    case ReduceOp::Prod: return T(a * b);
    case ReduceOp::Min: return std::min(a, b);
    case ReduceOp::Max: return std::max(a, b);
    default: return T(a + b);  // sum; avg divides afterwards
  }
}

// Reduction over the ranks `first, first+stride, ...` (count of them) of element i.
template <class T>
T reduce_over(int first, int stride, int count, int64_t i, ReduceOp op) {
  T acc = input<T>(first, i, op);
  for (int k = 1; k < count; ++k) acc = combine(acc, input<T>(first + k * stride, i, op), op);
  return op == ReduceOp::Avg ? T(acc / count) : acc;
}

// One table's worth of measurements: an operation with one type, reduction and root.
struct Case {
  BenchOp op;
  DType dtype;
  ReduceOp redop;
  int root;
};

struct Bench {
  const Options& o;
  Backend& b;
  Mesh& mesh;  // shard and replicate groups for hybrid; world = shard × replicate
  Comm& world_comm;
  int rank, n;
  Case c{};
  void* send = nullptr;  // -u: misaligned by that many elements
  void* recv = nullptr;

  // Issues one operation; in place, results land in `send` (the NCCL layout).
  Request issue(const BenchSizes& s, bool in_place) {
    const int es = dtype_size(c.dtype);
    char* sbuf = static_cast<char*>(send);
    char* rbuf = static_cast<char*>(recv);
    CollectiveArgs a{c.op.collective, sbuf, rbuf, s.arg, c.dtype, c.redop, c.root};
    if (in_place) {
      if (c.op.is(Collective::AllGather)) a.send = sbuf + int64_t(rank) * s.arg * es, a.recv = sbuf;
      else if (c.op.is(Collective::ReduceScatter)) a.recv = sbuf + int64_t(rank) * s.arg * es;
      else a.recv = sbuf;
    }
    return b.collective(a, world_comm);
  }

  // Runs one operation to completion (a collective waited on at once: the blocking path
  // unless --nonblocking).
  void run_once(const BenchSizes& s, bool in_place) {
    if (!c.op.hybrid) return b.wait(issue(s, in_place));
    char* sbuf = static_cast<char*>(send);
    char* shard = in_place ? sbuf + int64_t(mesh.layout.shard_rank()) * s.arg * dtype_size(c.dtype)
                           : static_cast<char*>(recv);
    b.wait(b.collective({Collective::ReduceScatter, sbuf, shard, s.arg, c.dtype, c.redop, 0}, mesh.comm(Axis::Shard)));
    if (mesh.layout.replicate > 1)
      b.wait(b.collective({Collective::AllReduce, shard, shard, s.arg, c.dtype, c.redop, 0}, mesh.comm(Axis::Replicate)));
  }

  // One iteration: -m operations. Non-blocking, they are all issued, then waited on (as
  // nccl-tests groups them); blocking, each is one call. -z 1: a barrier after each.
  // Returns the time of the operations alone, barriers left out; -C: until the host had
  // issued them (the same as completion where the calls block).
  double iteration(const BenchSizes& s, bool in_place) {
    double t = 0;
    const bool together = o.nonblocking && !c.op.hybrid && o.blocking != 1;
    if (together) {
      std::vector<Request> reqs(o.agg);
      const double t0 = b.now();
      for (Request& r : reqs) r = issue(s, in_place);
      for (Request r : reqs) b.wait(r);
      const double t_host = b.now();
      b.synchronize();
      return (o.cputime ? t_host : b.now()) - t0;
    }
    for (int k = 0; k < o.agg; ++k) {
      const double t0 = b.now();
      run_once(s, in_place);
      const double t_host = b.now();
      b.synchronize();
      t += (o.cputime ? t_host : b.now()) - t0;
      if (o.blocking == 1) MPI_CHECK(MPI_Barrier(MPI_COMM_WORLD));
    }
    return t;
  }

  // Fills the inputs, runs once, and counts wrong elements of this rank's result.
  template <class T>
  int64_t check(const BenchSizes& s, bool in_place) {
    const BenchOp op = c.op;
    const ReduceOp r = c.redop;
    const int64_t m = s.arg;
    std::vector<T> in(std::max(s.send, s.recv));
    const bool gather_in_place = in_place && op.is(Collective::AllGather);
    for (int64_t i = 0; i < s.send; ++i) in[gather_in_place ? rank * m + i : i] = input<T>(rank, i, r);
    b.upload(send, in.data(), size_t(gather_in_place ? s.recv : s.send) * sizeof(T));
    run_once(s, in_place);
    // Where this rank's result is, and how long.
    const int64_t out_n = op.is(Collective::Reduce) && rank != c.root ? 0 : s.recv;
    int64_t offset = 0;
    if (in_place && op.is(Collective::ReduceScatter)) offset = int64_t(rank) * m;
    if (in_place && op.hybrid) offset = int64_t(mesh.layout.shard_rank()) * m;
    std::vector<T> got(std::max<int64_t>(out_n, 1));
    const char* src = static_cast<const char*>(in_place ? send : recv) + offset * sizeof(T);
    if (out_n) b.download(got.data(), src, size_t(out_n) * sizeof(T));
    if (o.inject_error == node_map().rank && out_n) got[out_n / 2] = T(got[out_n / 2] + T(1));  // a world rank
    int64_t wrong = 0;
    for (int64_t j = 0; j < out_n; ++j) wrong += !matches(got[j], expected<T>(s, j), r);
    return wrong;
  }

  template <class T>
  T expected(const BenchSizes& s, int64_t j) const {
    const ReduceOp r = c.redop;
    const int64_t m = s.arg;
    if (c.op.hybrid) {
      // Reduce-scatter inside each group of G consecutive ranks, then across groups.
      const int G = mesh.layout.shard, R = mesh.layout.replicate;
      const int64_t i = int64_t(mesh.layout.shard_rank()) * m + j;
      T acc = reduce_over<T>(0, 1, G, i, r);
      for (int g = 1; g < R; ++g) acc = combine(acc, reduce_over<T>(g * G, 1, G, i, r), r);
      return r == ReduceOp::Avg ? T(acc / R) : acc;
    }
    switch (c.op.collective) {
      case Collective::AllReduce:
      case Collective::Reduce: return reduce_over<T>(0, 1, n, j, r);
      case Collective::AllGather: return input<T>(int(j / m), j % m, r);
      case Collective::ReduceScatter: return reduce_over<T>(0, 1, n, int64_t(rank) * m + j, r);
      case Collective::Broadcast: return input<T>(c.root, j, r);
      case Collective::AllToAll: {
        const int64_t per = s.count / n;
        return input<T>(int(j / per), int64_t(rank) * per + j % per, r);
      }
      case Collective::SendRecv: return input<T>((rank - 1 + n) % n, j, r);
      default: return T(0);
    }
  }

  int64_t check_any(const BenchSizes& s, bool in_place) {
    switch (c.dtype) {
      case DType::F32: return check<float>(s, in_place);
      case DType::F64: return check<double>(s, in_place);
      case DType::I32: return check<int32_t>(s, in_place);
      case DType::I64: return check<int64_t>(s, in_place);
      case DType::U8: return check<uint8_t>(s, in_place);
      case DType::BF16: return check<bf16>(s, in_place);
      case DType::F16: return check<f16>(s, in_place);
      default: SB_FATAL("unknown dtype");
    }
  }

  // -c: this many checked iterations; the wrong elements of all of them.
  int64_t checked(const BenchSizes& s, bool in_place) {
    int64_t wrong = 0;
    for (int i = 0; i < o.check; ++i) wrong += check_any(s, in_place);
    return wrong;
  }

  // Timed iterations, each completed before the next, so each has its own time (per
  // operation of -m).
  std::vector<double> time_iterations(const BenchSizes& s, bool in_place) {
    for (int i = 0; i < o.warmup; ++i) run_once(s, in_place);
    b.synchronize();
    MPI_CHECK(MPI_Barrier(MPI_COMM_WORLD));
    std::vector<double> t(o.iters);
    for (int i = 0; i < o.iters; ++i) {
      if (o.barrier) MPI_CHECK(MPI_Barrier(MPI_COMM_WORLD));
      t[i] = iteration(s, in_place) / o.agg;
      if (o.blocking == 3) MPI_CHECK(MPI_Barrier(MPI_COMM_WORLD));
    }
    return t;
  }
};

// ---- -T: a watchdog per size ----
char g_timeout_msg[256];
extern "C" void on_timeout(int) {
  const ssize_t w = write(STDERR_FILENO, g_timeout_msg, std::strlen(g_timeout_msg));
  (void)w;
  _exit(kExitFailure);
}
void arm_timeout(const Options& o, const Case& c, int64_t size, int rank) {
  if (!o.timeout_s) return;
  std::snprintf(g_timeout_msg, sizeof g_timeout_msg,
                "collective_perf: rank %d: %s of %lld bytes ran longer than -T %d s; aborting\n", rank,
                bench_op_name(c.op), (long long)size, o.timeout_s);
  std::signal(SIGALRM, on_timeout);
  alarm(unsigned(o.timeout_s));
}
void disarm_timeout(const Options& o) {
  if (o.timeout_s) alarm(0);
}

// ---- results ----
struct SampleRow {
  int32_t rank, op, in_place, iteration;
  int64_t size;
  double time;
  int32_t dtype, redop, root, cycle, comm;
};
struct ResultRow {
  int32_t op, in_place;
  int64_t size, count;
  double time, algbw, busbw;
  int64_t wrong;
  double p50, p90, p99, rank_min, rank_max;
  int32_t slowest_rank;
  int32_t dtype, redop, root, cycle, comm;
  double i_min, i_p50, i_p99, i_max;  // -I: over iterations after -K, slowest rank's time (not in HDF5)
};

double percentile(std::vector<double> v, double q) {
  std::sort(v.begin(), v.end());
  const double pos = q * (v.size() - 1);
  const size_t lo = size_t(pos), hi = std::min(lo + 1, v.size() - 1);
  return v[lo] + (pos - lo) * (v[hi] - v[lo]);
}

// Cross-rank figures of one (case, size, placement): over every rank (of every group with
// --groups); n: the ranks of the operation, for its bus factor.
ResultRow summarize(const Options& o, const Case& c, bool in_place, const BenchSizes& s,
                    const std::vector<double>& t, int64_t wrong, int n, int cycle) {
  const double mean = std::accumulate(t.begin(), t.end(), 0.0) / t.size();
  double sum = 0, mn = 0, mx = 0, r0 = mean;
  MPI_CHECK(MPI_Allreduce(&mean, &sum, 1, MPI_DOUBLE, MPI_SUM, MPI_COMM_WORLD));
  MPI_CHECK(MPI_Allreduce(&mean, &mn, 1, MPI_DOUBLE, MPI_MIN, MPI_COMM_WORLD));
  MPI_CHECK(MPI_Bcast(&r0, 1, MPI_DOUBLE, 0, MPI_COMM_WORLD));
  struct {
    double v;
    int rank;
  } local{mean, 0}, slowest{};
  MPI_CHECK(MPI_Comm_rank(MPI_COMM_WORLD, &local.rank));
  MPI_CHECK(MPI_Allreduce(&local, &slowest, 1, MPI_DOUBLE_INT, MPI_MAXLOC, MPI_COMM_WORLD));
  mx = slowest.v;
  // An iteration of a collective takes as long as its slowest rank.
  std::vector<double> per_iter(t.size());
  MPI_CHECK(MPI_Allreduce(t.data(), per_iter.data(), int(t.size()), MPI_DOUBLE, MPI_MAX, MPI_COMM_WORLD));
  int64_t wrong_all = 0;
  MPI_CHECK(MPI_Allreduce(&wrong, &wrong_all, 1, MPI_INT64_T, MPI_SUM, MPI_COMM_WORLD));
  int world = 1;
  MPI_CHECK(MPI_Comm_size(MPI_COMM_WORLD, &world));
  const double time = o.average == 0 ? r0 : o.average == 1 ? sum / world : o.average == 2 ? mn : mx;
  ResultRow r{};
  r.op = bench_op_code(c.op);
  r.in_place = in_place;
  r.size = s.size_bytes;
  r.count = s.count;
  r.time = time;
  r.algbw = double(s.size_bytes) / time / 1e9;
  r.busbw = r.algbw * bus_factor(c.op, n, o.layout.shard);
  r.wrong = wrong_all;
  r.p50 = percentile(per_iter, 0.5);
  r.p90 = percentile(per_iter, 0.9);
  r.p99 = percentile(per_iter, 0.99);
  r.rank_min = mn;
  r.rank_max = mx;
  r.slowest_rank = slowest.rank;
  r.dtype = int(c.dtype);
  r.redop = int(c.redop);
  r.root = c.root;
  r.cycle = cycle;
  const std::vector<double> kept(per_iter.begin() + o.per_iter_skip, per_iter.end());
  r.i_min = *std::min_element(kept.begin(), kept.end());
  r.i_p50 = percentile(kept, 0.5);
  r.i_p99 = percentile(kept, 0.99);
  r.i_max = *std::max_element(kept.begin(), kept.end());
  return r;
}

const char* path_name(const Options& o) { return o.nonblocking ? "nonblocking" : "blocking"; }
const char* path_description(const Options& o) {
  return o.nonblocking ? "nonblocking (issued, then waited on: the path the training programs overlap)"
                       : "blocking (one blocking call each, as applications call them)";
}

// `comms`: the libraries, one row of each size each, named in a last column when several.
void print_header(const Options& o, BenchOp op, int n, int nodes, int rpn, const std::string& device,
                  const std::vector<std::string>& comms, int group_size, int group_nodes) {
  std::string libs;
  for (const std::string& c : comms) libs += (libs.empty() ? "" : " vs ") + c;
  std::printf("#\n# collective_perf: %s on %d ranks (%d node%s, %d per node), backend %s (%s), device %s\n",
              bench_op_name(op), n, nodes, nodes == 1 ? "" : "s", rpn, o.backend.c_str(), libs.c_str(), device.c_str());
  if (op.hybrid) std::printf("# hybrid: reduce-scatter in shard groups of %d, all-reduce across %d groups\n", o.layout.shard, o.layout.replicate);
  if (!o.groups.empty())
    std::printf("# groups: %s, %d groups of %d ranks (%d node%s each) at once; rows are a group's\n", o.groups.c_str(),
                n / group_size, group_size, group_nodes, group_nodes == 1 ? "" : "s");
  std::printf("# collectives: %s\n", path_description(o));
  std::printf("# iterations %d (x%d operations), warm-up %d, check %d, blocking %d%s, time across ranks: %s%s\n#\n",
              o.iters, o.agg, o.warmup, o.check, o.blocking, o.barrier ? " + barrier before each" : "",
              kAverageNames[o.average], o.cputime ? ", host time until issued (-C 1)" : "");
  const char* extra = o.per_iter ? "   i_min   i_p50   i_p99   i_max" : "";
  std::printf("#%75s%34s\n", "out-of-place", "in-place");
  std::printf("#%11s %12s %9s %7s %6s %9s %7s %7s %6s%s %9s %7s %7s %6s%s%s\n", "size", "count", "type", "redop", "root",
              "time", "algbw", "busbw", "#wrong", extra, "time", "algbw", "busbw", "#wrong", extra,
              comms.size() > 1 ? "  comm" : "");
  std::printf("#%11s %12s %9s %7s %6s %9s %7s %7s %6s%s %9s %7s %7s %6s%s\n", "(B)", "(elements)", "", "", "", "(us)",
              "(GB/s)", "(GB/s)", "", o.per_iter ? "    (us)    (us)    (us)    (us)" : "", "(us)", "(GB/s)",
              "(GB/s)", "", o.per_iter ? "    (us)    (us)    (us)    (us)" : "");
}

std::string cell(const Options& o, const ResultRow* r) {
  char buf[128];
  if (!r) return std::string("      n/a     n/a     n/a    n/a") + (o.per_iter ? "     n/a     n/a     n/a     n/a" : "");
  int k = std::snprintf(buf, sizeof buf, " %9.2f %7.3f %7.3f %6lld", r->time * 1e6, r->algbw, r->busbw,
                        (long long)r->wrong);
  if (o.per_iter)
    std::snprintf(buf + k, sizeof buf - k, " %7.1f %7.1f %7.1f %7.1f", r->i_min * 1e6, r->i_p50 * 1e6, r->i_p99 * 1e6,
                  r->i_max * 1e6);
  return buf;
}

std::string now_stamp() {
  char buf[32];
  const std::time_t t = std::time(nullptr);
  std::strftime(buf, sizeof buf, "%Y-%m-%d %H:%M:%S", std::localtime(&t));
  return buf;
}

// The cases of one operation: every type, reduction (reductions only) and root (rooted
// operations only) asked for that the backend supports; a named combination it does not
// support is a usage error, one that "all" brought in is left out.
std::vector<Case> cases_of(const Options& o, BenchOp op, const Backend& b) {
  std::vector<Case> out;
  const bool rooted = is_rooted(op);
  const std::vector<ReduceOp> redops = is_reduction(op) ? o.redops : std::vector<ReduceOp>{o.redops.front()};
  const std::vector<int> roots = rooted ? o.roots : std::vector<int>{0};
  for (DType t : o.dtypes)
    for (ReduceOp r : redops) {
      const bool ok = op.hybrid ? b.supports(Collective::ReduceScatter, t, r) &&
                                                  b.supports(Collective::AllReduce, t, r)
                                            : b.supports(op.collective, t, r);
      if (!ok && o.dtypes.size() == 1 && o.redops.size() == 1)
        throw UsageError(std::string(bench_op_name(op)) + " of " + dtype_name(t) + " with " + reduce_op_name(r) +
                         " is not supported by the " + o.backend + " backend");
      if (ok)
        for (int root : roots) out.push_back({op, t, r, root});
    }
  return out;
}

// The sizes of the sweep: -f multiplies, -i adds.
int64_t next_size(const Options& o, int64_t size) {
  if (o.step_bytes) return size + o.step_bytes;
  return std::max(size + 1, int64_t(std::llround(double(size) * o.factor)));
}

void write_json(const Options& o, const std::vector<ResultRow>& results, int n, double avg_busbw,
                int64_t wrong_total, const std::string& status) {
  const std::string tmp = o.json + ".tmp";
  FILE* f = std::fopen(tmp.c_str(), "w");
  if (!f) SB_FATAL("cannot write -J " + o.json);
  std::fprintf(f, "{\n  \"program\": \"collective_perf\",\n  \"world_size\": %d,\n  \"backend\": \"%s\",\n"
                  "  \"collectives\": \"%s\",\n  \"iters\": %d,\n  \"agg_iters\": %d,\n  \"warmup\": %d,\n"
                  "  \"average\": \"%s\",\n  \"status\": \"%s\",\n  \"avg_busbw\": %.9g,\n  \"wrong_total\": %lld,\n"
                  "  \"results\": [",
               n, o.backend.c_str(), path_name(o), o.iters, o.agg, o.warmup, kAverageNames[o.average], status.c_str(),
               avg_busbw, (long long)wrong_total);
  for (size_t i = 0; i < results.size(); ++i) {
    const ResultRow& r = results[i];
    const BenchOp op = bench_ops()[r.op];
    std::fprintf(f, "%s\n    {\"cycle\": %d, \"op\": \"%s\", \"in_place\": %s, \"size\": %lld, \"count\": %lld, "
                    "\"type\": \"%s\", \"redop\": \"%s\", \"root\": %d, \"time_us\": %.9g, \"algbw\": %.9g, "
                    "\"busbw\": %.9g, \"wrong\": %lld}",
                 i ? "," : "", r.cycle, bench_op_name(op), r.in_place ? "true" : "false", (long long)r.size,
                 (long long)r.count, dtype_name(DType(r.dtype)), is_reduction(op) ? reduce_op_name(ReduceOp(r.redop)) : "none",
                 is_rooted(op) ? r.root : -1, r.time * 1e6,
                 r.algbw, r.busbw, (long long)r.wrong);
  }
  std::fprintf(f, "\n  ]\n}\n");
  if (std::fclose(f) != 0 || std::rename(tmp.c_str(), o.json.c_str()) != 0) SB_FATAL("cannot write -J " + o.json);
}

// One communication library under test: its backend, communicators and buffers.
struct Side {
  std::string comm;
  std::unique_ptr<Backend> backend;
  Mesh mesh;
  std::unique_ptr<Comm> world;
  std::unique_ptr<Bench> bench;
  void* send_base = nullptr;
  void* recv_base = nullptr;
};

std::unique_ptr<Side> make_side(const Options& o, const CommLibrary* comm) {
  auto side = std::make_unique<Side>();
  side->comm = comm ? comm_library_name(*comm) : "mpi";
  side->backend = comm ? make_backend(o.backend, *comm) : make_backend(o.backend);
  side->backend->set_blocking_when_waited(!o.nonblocking);
  side->mesh = Mesh::from_world(*side->backend, MPI_COMM_WORLD, o.layout);
  side->world = side->backend->make_comm(MPI_COMM_WORLD);
  return side;
}

// The HDF5 result: the run's attributes and provenance, every sample, rank 0's rows.
struct Outcome {
  const std::vector<SampleRow>& samples;
  const std::vector<ResultRow>& results;
  const std::vector<std::string>& comm_names;
  const std::string& status;
  std::string device;
  double start, avg_busbw;
  int64_t wrong_total;
  HostShareSummary host;
  int group_size, group_nodes;  // the ranks of one operation and the nodes they span
};

void write_result(const Options& o, const std::string& path, const Outcome& r, int n) {
  const int nodes = node_map().nodes(), rpn = node_map().max_ranks_per_node();
  std::vector<std::string> op_names, dtype_names, redop_names;
  for (BenchOp op : bench_ops()) op_names.push_back(bench_op_name(op));
  for (int i = 0; i < int(DType::kCount); ++i) dtype_names.push_back(dtype_name(DType(i)));
  for (int i = 0; i < int(ReduceOp::kCount); ++i) redop_names.push_back(reduce_op_name(ReduceOp(i)));
  auto join = [](const auto& items, auto name) {
    std::string out;
    for (const auto& x : items) out += (out.empty() ? "" : ",") + std::string(name(x));
    return out;
  };
  ResultFile f(path, MPI_COMM_WORLD, o.overwrite, int64_t(r.samples.size() * sizeof(SampleRow)));
  f.attributes("/", {
      Attr::integer("schema_version", kSchemaVersion), Attr::str("program", "collective_perf"),
      Attr::str("ops", join(o.ops, bench_op_name)), Attr::str("dtype", join(o.dtypes, dtype_name)),
      Attr::str("redop", join(o.redops, reduce_op_name)), Attr::str("root", join(o.roots, [](int r) { return std::to_string(r); })),
      Attr::integer("min_bytes", o.min_bytes), Attr::integer("max_bytes", o.max_bytes),
      Attr::num("step_factor", o.factor), Attr::integer("step_bytes", o.step_bytes), Attr::integer("iters", o.iters),
      Attr::integer("agg_iters", o.agg), Attr::integer("warmup", o.warmup), Attr::integer("run_cycles", o.cycles),
      Attr::integer("check", o.check), Attr::integer("blocking", o.blocking), Attr::integer("barrier", o.barrier),
      Attr::str("collectives", path_name(o)), Attr::integer("report_cputime", o.cputime),
      Attr::integer("unalign", o.unalign), Attr::str("average", kAverageNames[o.average]),
      Attr::integer("world_size", n), Attr::integer("ranks_per_node", rpn), Attr::integer("nodes", nodes),
      Attr::str("groups", o.groups.empty() ? "world" : o.groups), Attr::integer("group_size", r.group_size),
      Attr::integer("group_nodes", r.group_nodes),
      Attr::integer("shard_size", o.layout.shard), Attr::str("backend", o.backend),
      Attr::str("comm", join(r.comm_names, [](const std::string& c) { return c; })), Attr::str("status", r.status),
      Attr::num("avg_busbw", r.avg_busbw), Attr::num("min_busbw", o.min_busbw), Attr::integer("wrong_total", r.wrong_total),
      Attr::str("start_time", iso_time(r.start)), Attr::str("end_time", iso_time(wall_clock_rank0())),
      Attr::num("cpu_share_min", r.host.cpu_share_min), Attr::num("cpu_share_median", r.host.cpu_share_median),
      Attr::num("load_start", r.host.load_start), Attr::num("load_end", r.host.load_end),
      Attr::integer("cpus_online", r.host.cpus_online),
  });
  write_provenance(f, collect_provenance(o.argv), hostname(), r.device, MPI_COMM_WORLD);
  f.table("samples",
          {SB_COLUMN(SampleRow, rank, I32), SB_COLUMN(SampleRow, op, I32), SB_COLUMN(SampleRow, in_place, I32),
           SB_COLUMN(SampleRow, iteration, I32), SB_COLUMN(SampleRow, size, I64), SB_COLUMN(SampleRow, time, F64),
           SB_COLUMN(SampleRow, dtype, I32), SB_COLUMN(SampleRow, redop, I32), SB_COLUMN(SampleRow, root, I32),
           SB_COLUMN(SampleRow, cycle, I32), SB_COLUMN(SampleRow, comm, I32)},
          r.samples);
  f.table("results",
          {SB_COLUMN(ResultRow, op, I32), SB_COLUMN(ResultRow, in_place, I32), SB_COLUMN(ResultRow, size, I64),
           SB_COLUMN(ResultRow, count, I64), SB_COLUMN(ResultRow, time, F64), SB_COLUMN(ResultRow, algbw, F64),
           SB_COLUMN(ResultRow, busbw, F64), SB_COLUMN(ResultRow, wrong, I64), SB_COLUMN(ResultRow, p50, F64),
           SB_COLUMN(ResultRow, p90, F64), SB_COLUMN(ResultRow, p99, F64), SB_COLUMN(ResultRow, rank_min, F64),
           SB_COLUMN(ResultRow, rank_max, F64), SB_COLUMN(ResultRow, slowest_rank, I32),
           SB_COLUMN(ResultRow, dtype, I32), SB_COLUMN(ResultRow, redop, I32), SB_COLUMN(ResultRow, root, I32),
           SB_COLUMN(ResultRow, cycle, I32), SB_COLUMN(ResultRow, comm, I32)},
          r.results);
  for (const char* table : {"samples", "results"}) {
    f.names_attribute(table, "op_names", op_names);
    f.names_attribute(table, "dtype_names", dtype_names);
    f.names_attribute(table, "redop_names", redop_names);
    f.names_attribute(table, "comm_names", r.comm_names);
  }
  f.commit();
}

int run(const Options& o, int rank, int world) {
  // The ranks of one operation: every rank, or (--groups) this rank's group along the axis,
  // every group running the same operations at the same time.
  const bool grouped = !o.groups.empty();
  const Axis axis = o.groups == "shard" ? Axis::Shard : Axis::Replicate;
  const int n = grouped ? o.layout.size(axis) : world;
  int group_nodes = node_map().nodes();
  if (grouped) {
    std::set<int> on;
    for (int r : o.layout.group(axis)) on.insert(node_map().node_of[size_t(r)]);
    group_nodes = int(on.size());
  }
  std::vector<std::unique_ptr<Side>> sides;  // the CPU backend: MPI; CUDA: each --comm
  if (o.comms.empty()) sides.push_back(make_side(o, nullptr));
  for (const CommLibrary& c : o.comms) sides.push_back(make_side(o, &c));
  std::vector<std::string> comm_names;
  for (const auto& side : sides) comm_names.push_back(side->comm);
  Backend* backend = sides.front()->backend.get();  // the device, for the header and provenance
  std::vector<std::vector<Case>> cases;
  for (BenchOp op : o.ops) cases.push_back(cases_of(o, op, *backend));
  for (size_t i = 1; i < sides.size(); ++i)
    for (BenchOp op : o.ops) cases_of(o, op, *sides[i]->backend);  // the same cases, or a usage error
  const bool forever = o.cycles == 0;
  // A sweep whose sizes all round down to nothing would measure nothing and look fine.
  for (size_t k = 0; k < o.ops.size(); ++k)
    for (const Case& c : cases[k]) {
      bool any = false;
      for (int64_t size = o.min_bytes; size <= o.max_bytes && !any; size = next_size(o, size))
        any = bench_sizes(c.op, size, c.dtype, n, o.layout.shard).count > 0;
      int64_t smallest = 1;
      while (!any && bench_sizes(c.op, smallest, c.dtype, n, o.layout.shard).count == 0) ++smallest;
      if (!any)
        throw UsageError("-b " + std::to_string(o.min_bytes) + " -e " + std::to_string(o.max_bytes) +
                         ": no size in the sweep is large enough for " + bench_op_name(c.op) + " of " +
                         dtype_name(c.dtype) + " on " + std::to_string(n) + " ranks (the smallest is " +
                         std::to_string(smallest) + " B); nothing was measured");
    }
  const std::string stem = "collective_perf-w" + std::to_string(world);
  const std::string path = forever ? "" : resolve_output(o.out, o.overwrite, stem, rank);
  const double start = wall_clock_rank0();
  const HostShare host_start = HostShare::now();
  const int nodes = node_map().nodes(), rpn = node_map().max_ranks_per_node();

  // Buffers for the largest size of every case, -u elements more.
  size_t max_bytes = 64;
  for (const auto& op_cases : cases)
    for (const Case& c : op_cases) {
      const BenchSizes s = bench_sizes(c.op, o.max_bytes, c.dtype, n, o.layout.shard);
      max_bytes = std::max(max_bytes, size_t(std::max(s.send, s.recv) + o.unalign) * dtype_size(c.dtype));
    }
  // Plan, then refuse: the buffers must fit before anything is allocated (a size the
  // kernel's overcommit lets through would be killed when touched).
  const int64_t need = 2 * int64_t(max_bytes) * int64_t(sides.size());
  const int64_t limit = default_memory_limit(backend->memory_capacity());
  if (need > limit) {
    if (rank == 0)
      std::printf("status: out-of-memory: -e %lld needs %s per rank (send and receive buffers), the limit is %s; "
                  "nothing was allocated\n",
                  (long long)o.max_bytes, human_bytes(double(need)).c_str(), human_bytes(double(limit)).c_str());
    return kExitOutOfMemory;
  }
  for (auto& side : sides) {
    Backend& b = *side->backend;
    side->bench.reset(new Bench{o, b, side->mesh, grouped ? side->mesh.comm(axis) : *side->world,
                                grouped ? o.layout.coord(axis) : rank, n});
    side->send_base = b.alloc(max_bytes, MemCategory::CommBuffers);
    side->recv_base = b.alloc(max_bytes, MemCategory::CommBuffers);
  }

  std::vector<SampleRow> samples;
  std::vector<ResultRow> results;
  double busbw_sum = 0;
  int busbw_n = 0;
  int64_t wrong_total = 0;
  for (int cycle = 0; forever || cycle < o.cycles; ++cycle) {
    for (size_t k = 0; k < o.ops.size(); ++k) {
      if (rank == 0) print_header(o, o.ops[k], world, nodes, rpn, backend->device_name(), comm_names, n, group_nodes);
      for (const Case& c : cases[k]) {
        const size_t shift = size_t(o.unalign) * dtype_size(c.dtype);
        for (auto& side : sides) {
          side->bench->c = c;
          side->bench->send = static_cast<char*>(side->send_base) + shift;
          side->bench->recv = static_cast<char*>(side->recv_base) + shift;
        }
        int64_t last = -1;
        for (int64_t size = o.min_bytes; size <= o.max_bytes; size = next_size(o, size)) {
          const BenchSizes s = bench_sizes(c.op, size, c.dtype, n, o.layout.shard);
          if (s.count == 0 || s.size_bytes == last) continue;  // too small for this many ranks
          last = s.size_bytes;
          for (size_t side = 0; side < sides.size(); ++side) {  // one row per library
            Bench& bench = *sides[side]->bench;
            ResultRow rows[2];
            bool have[2] = {false, false};
            arm_timeout(o, c, s.size_bytes, rank);
            for (int place = 0; place < 2; ++place) {
              if (place == 1 && !has_in_place(c.op)) continue;
              const int64_t wrong = bench.checked(s, place);
              const std::vector<double> t = bench.time_iterations(s, place);
              if (!forever)
                for (int i = 0; i < o.iters; ++i)
                  samples.push_back({rank, bench_op_code(c.op), place, i, s.size_bytes, t[i], int(c.dtype), int(c.redop), c.root,
                                     cycle, int(side)});
              rows[place] = summarize(o, c, place, s, t, wrong, n, cycle);
              rows[place].comm = int(side);
              have[place] = true;
              busbw_sum += rows[place].busbw;
              ++busbw_n;
              wrong_total += rows[place].wrong;
              if (rank == 0 && !forever) results.push_back(rows[place]);
            }
            disarm_timeout(o);
            if (rank == 0) {
              const std::string lib = sides.size() > 1 ? "  " + sides[side]->comm : "";
              std::printf(" %11lld %12lld %9s %7s %6d%s%s%s%s\n", (long long)s.size_bytes, (long long)s.count,
                          dtype_name(c.dtype), is_reduction(c.op) ? reduce_op_name(c.redop) : "none",
                          is_rooted(c.op) ? c.root : -1,
                          cell(o, &rows[0]).c_str(), cell(o, have[1] ? &rows[1] : nullptr).c_str(), lib.c_str(),
                          o.timestamps ? ("  " + now_stamp()).c_str() : "");
              std::fflush(stdout);
            }
          }
        }
      }
    }
  }
  const int64_t comm_bytes = backend->mem_peak_total();
  const int64_t resident = backend->device_memory_used();
  for (auto& side : sides) {
    side->backend->release(side->send_base);
    side->backend->release(side->recv_base);
  }
  const double avg_busbw = busbw_n ? busbw_sum / busbw_n : 0;
  const bool below = o.min_busbw > 0 && avg_busbw < o.min_busbw;
  if (o.memory) {  // -M: the largest over ranks
    int64_t mine[2] = {comm_bytes, resident}, most[2] = {0, 0};
    MPI_CHECK(MPI_Reduce(mine, most, 2, MPI_INT64_T, MPI_MAX, 0, MPI_COMM_WORLD));
    if (rank == 0)
      std::printf("# Memory (max over ranks): buffers %s, %s %s\n", human_bytes(double(most[0])).c_str(),
                  o.backend == "cpu" ? "resident" : "device in use", human_bytes(double(most[1])).c_str());
  }
  if (rank == 0) {
    std::printf("# Out of bounds values : %lld %s\n", (long long)wrong_total, wrong_total ? "FAILED" : "OK");
    std::printf("# Avg bus bandwidth    : %.6g GB/s\n", avg_busbw);
    if (o.min_busbw > 0)
      std::printf("# Bus bandwidth floor  : %.6g GB/s -> %s\n", o.min_busbw, below ? "FAILED (below the floor)" : "OK");
    std::printf("#\n");
  }

  // ---- HDF5 and -J ----
  const std::string status = wrong_total ? "failed" : below ? "below-floor" : "ok";
  if (rank == 0 && !o.json.empty()) write_json(o, results, world, avg_busbw, wrong_total, status);
  const HostShareSummary host = host_share_since(host_start);
  write_result(o, path, {samples, results, comm_names, status, backend->device_name(), start, avg_busbw, wrong_total, host,
                         n, group_nodes}, world);
  if (rank == 0) std::printf("wrote %s (status %s)\n", path.c_str(), status.c_str());
  return wrong_total ? kExitCheckFailed : below ? kExitBelowFloor : kExitOk;
}

}  // namespace

int run_collective_perf(int argc, char** argv) {
  return mpi_main(argc, argv, [](int argc, char** argv, int rank, int world) {
    Options o;
    if (!parse(argc, argv, o, rank, world)) return int(kExitOk);
    if (o.pattern == "collectives") return run(o, rank, world);
    PairSweepOptions& p = o.pairs;
    if (o.min_bytes < 4) throw UsageError("-b " + std::to_string(o.min_bytes) + " is not allowed with --pattern pairs "
                                          "(at least 4 bytes: pairs exchange 4-byte words)");
    for (int64_t size = o.min_bytes; size <= o.max_bytes; size = next_size(o, size)) p.sizes.push_back(size);
    p.argv = o.argv, p.backend = o.backend, p.out = o.out, p.overwrite = o.overwrite;
    p.iters = o.iters, p.warmup = o.warmup, p.check = o.check, p.inject_error = o.inject_error;
    return run_pair_sweep(p, rank, world);
  });
}

}  // namespace sb
