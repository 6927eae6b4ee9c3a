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
#include <numeric>

#include "shardbench/check.h"
#include "shardbench/half.h"
#include "shardbench/cli.h"
#include "shardbench/collectives.h"
#include "shardbench/h5.h"
#include "shardbench/harness.h"
#include "shardbench/layout.h"
#include "shardbench/trace.h"

namespace sb {
namespace {

constexpr int kSchemaVersion = 1;

struct Options {
  std::vector<std::string> argv;
  std::vector<BenchOp> ops;
  int64_t min_bytes = 32 * 1024 * 1024, max_bytes = 32 * 1024 * 1024;
  double factor = 2;
  int iters = 20, warmup = 5, check = 1, blocking = 0, average = 1, root = 0, shard = 0;
  DType dtype = DType::F32;
  ReduceOp redop = ReduceOp::Sum;
  std::string backend = "cpu", out;
  bool overwrite = false;
  double min_busbw = 0;
  int inject_error = -1;  // self-test of the data check: corrupt one element on this rank
};

const char* kAverageNames[] = {"rank0", "avg", "min", "max"};

bool parse(int argc, char** argv, Options& o, int world) {
  o.argv.assign(argv, argv + argc);
  CLI::App app{"collective_perf: collective bandwidth (nccl-tests conventions) over the shardbench backend",
               "collective_perf"};
  app.option_defaults()->multi_option_policy(CLI::MultiOptionPolicy::TakeLast);
  std::string ops = "all-reduce", minb = "32M", maxb = "32M", dtype = "float", redop = "sum";
  const char* floor_env = std::getenv("SHARDBENCH_MIN_BUSBW");
  app.add_option("--ops", ops, "operations: all-reduce, all-gather, reduce-scatter, broadcast, reduce, "
                               "all-to-all, send-recv, hybrid (comma-separated), or all")->capture_default_str();
  app.add_option("-b,--minbytes", minb, "smallest size (64, 1K, 16M, 1G)")->capture_default_str();
  app.add_option("-e,--maxbytes", maxb, "largest size")->capture_default_str();
  NumericFlags num(app);  // every numeric flag: range-checked, no wrapping, no inf/nan
  num.real("-f,--stepfactor", o.factor, 0, 1e6, true, "multiply the size by this between sizes");
  num.integer("-n,--iters", o.iters, 1, kIntMax, "timed iterations per size");
  num.integer("-w,--warmup_iters", o.warmup, 0, kIntMax, "warm-up iterations per size");
  num.integer("-c,--check", o.check, 0, 1, "check results against expected values (0/1)");
  app.add_option("-d,--datatype", dtype, "float, double, int32, int64, uint8, bfloat16, half")->capture_default_str();
  app.add_option("-o,--op", redop, "reduction: sum, prod, min, max, avg")->capture_default_str();
  num.integer("-r,--root", o.root, 0, world - 1, "root rank of broadcast and reduce");
  num.integer("-z,--blocking", o.blocking, 0, 1, "1: barrier before every iteration (ranks start aligned)");
  num.integer("-a,--average", o.average, 0, 3, "time reported across ranks: 0 rank 0, 1 avg, 2 min, 3 max");
  num.integer("--shard-size", o.shard, 1, kIntMax, "shard group size G of the hybrid operation (divides the world)");
  app.add_option("--backend", o.backend, "cpu (MPI); cuda (NCCL) where built")->capture_default_str();
  app.add_option("--out", o.out, "HDF5 result (default: results/collective_perf-w<ranks>-<time>.h5)");
  app.add_flag("--overwrite", o.overwrite, "replace an existing --out file");
  num.real("--min-busbw", o.min_busbw, 0, 1e9, false,
           "fail (exit 5) when the average bus bandwidth is under this many GB/s (default: $SHARDBENCH_MIN_BUSBW)");
  num.integer("--inject-error", o.inject_error, 0, world - 1, "self-test: corrupt one result element on this rank");
  if (!parse_command_line(app, argc, argv)) return false;
  num.apply();
  if (o.min_busbw == 0 && floor_env) o.min_busbw = parse_real("SHARDBENCH_MIN_BUSBW", floor_env, 0, 1e9, false);
  o.ops = parse_bench_ops(ops);
  o.min_bytes = parse_size("-b", minb);
  o.max_bytes = parse_size("-e", maxb);
  if (o.min_bytes > o.max_bytes)
    throw UsageError("-b " + minb + " is larger than -e " + maxb + " (the smallest size must not exceed the largest)");
  if (!(o.factor > 1) && o.min_bytes != o.max_bytes)
    throw UsageError("-f " + std::to_string(o.factor) + " is not allowed (must be > 1)");
  o.dtype = parse_dtype(dtype);
  o.redop = parse_reduce_op(redop);
  if (o.iters < 1) throw UsageError("-n " + std::to_string(o.iters) + " is not allowed (must be >= 1)");
  if (o.warmup < 0) throw UsageError("-w " + std::to_string(o.warmup) + " is not allowed (must be >= 0)");
  if (o.check != 0 && o.check != 1) throw UsageError("-c " + std::to_string(o.check) + " is not allowed (0 or 1)");
  if (o.blocking != 0 && o.blocking != 1) throw UsageError("-z " + std::to_string(o.blocking) + " is not allowed (0 or 1)");
  if (o.average < 0 || o.average > 3)
    throw UsageError("-a " + std::to_string(o.average) + " is not allowed (0 rank 0, 1 avg, 2 min, 3 max)");
  if (o.root < 0 || o.root >= world)
    throw UsageError("-r " + std::to_string(o.root) + " is not allowed (a rank below " + std::to_string(world) + ")");
  if (o.min_busbw < 0) throw UsageError("--min-busbw is not allowed to be negative");
  const bool hybrid = std::count(o.ops.begin(), o.ops.end(), BenchOp::Hybrid) > 0;
  if (hybrid && o.shard == 0) throw UsageError("--ops hybrid needs --shard-size G (G divides the world size)");
  if (o.shard != 0) ParallelLayout::make(world, 0, o.shard);  // divides the world, or a usage error
  if (o.shard == 0) o.shard = 1;
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

struct Bench {
  Options o;
  Backend& b;
  Mesh& mesh;  // shard/replicate split for hybrid; world = shard × replicate
  Comm& world_comm;
  int rank, n;
  void* send = nullptr;
  void* recv = nullptr;

  // Runs one iteration to completion. In place, results land in `send` (the NCCL layout).
  void run_once(BenchOp op, const BenchSizes& s, bool in_place) {
    const int es = dtype_size(o.dtype);
    char* sbuf = static_cast<char*>(send);
    char* rbuf = static_cast<char*>(recv);
    if (op == BenchOp::Hybrid) {
      const int g = mesh.layout.shard_rank();
      char* shard = in_place ? sbuf + int64_t(g) * s.arg * es : rbuf;
      b.wait(b.collective({Collective::ReduceScatter, sbuf, shard, s.arg, o.dtype, o.redop, 0}, *mesh.shard_comm));
      if (mesh.layout.replicate > 1)
        b.wait(b.collective({Collective::AllReduce, shard, shard, s.arg, o.dtype, o.redop, 0}, *mesh.replicate_comm));
      return;
    }
    CollectiveArgs a{as_collective(op), sbuf, rbuf, s.arg, o.dtype, o.redop, o.root};
    if (in_place) {
      if (op == BenchOp::AllGather) a.send = sbuf + int64_t(rank) * s.arg * es, a.recv = sbuf;
      else if (op == BenchOp::ReduceScatter) a.recv = sbuf + int64_t(rank) * s.arg * es;
      else a.recv = sbuf;
    }
    b.wait(b.collective(a, world_comm));
  }

  // Fills the inputs, runs once, and counts wrong elements of this rank's result.
  template <class T>
  int64_t check(BenchOp op, const BenchSizes& s, bool in_place) {
    const ReduceOp r = o.redop;
    const int64_t m = s.arg;
    std::vector<T> in(std::max(s.send, s.recv));
    const bool gather_in_place = in_place && op == BenchOp::AllGather;
    for (int64_t i = 0; i < s.send; ++i) in[gather_in_place ? rank * m + i : i] = input<T>(rank, i, r);
    b.upload(send, in.data(), size_t(in_place && op == BenchOp::AllGather ? s.recv : s.send) * sizeof(T));
    run_once(op, s, in_place);
    // Where this rank's result is, and how long.
    const int64_t out_n = op == BenchOp::Reduce && rank != o.root ? 0 : s.recv;
    int64_t offset = 0;
    if (in_place && (op == BenchOp::ReduceScatter)) offset = int64_t(rank) * m;
    if (in_place && op == BenchOp::Hybrid) offset = int64_t(mesh.layout.shard_rank()) * m;
    std::vector<T> got(std::max<int64_t>(out_n, 1));
    const char* src = static_cast<const char*>(in_place ? send : recv) + offset * sizeof(T);
    if (out_n) b.download(got.data(), src, size_t(out_n) * sizeof(T));
    if (o.inject_error == rank && out_n) got[out_n / 2] = T(got[out_n / 2] + T(1));
    int64_t wrong = 0;
    for (int64_t j = 0; j < out_n; ++j) wrong += !matches(got[j], expected<T>(op, s, j), r);
    return wrong;
  }

  template <class T>
  T expected(BenchOp op, const BenchSizes& s, int64_t j) const {
    const ReduceOp r = o.redop;
    const int64_t m = s.arg;
    switch (op) {
      case BenchOp::AllReduce:
      case BenchOp::Reduce: return reduce_over<T>(0, 1, n, j, r);
      case BenchOp::AllGather: return input<T>(int(j / m), j % m, r);
      case BenchOp::ReduceScatter: return reduce_over<T>(0, 1, n, int64_t(rank) * m + j, r);
      case BenchOp::Broadcast: return input<T>(o.root, j, r);
      case BenchOp::AllToAll: {
        const int64_t per = s.count / n;
        return input<T>(int(j / per), int64_t(rank) * per + j % per, r);
      }
      case BenchOp::SendRecv: return input<T>((rank - 1 + n) % n, j, r);
      case BenchOp::Hybrid: {
        // Reduce-scatter inside each group of G consecutive ranks, then across groups.
        const int G = mesh.layout.shard, R = mesh.layout.replicate;
        const int64_t i = int64_t(mesh.layout.shard_rank()) * m + j;
        T acc = reduce_over<T>(0, 1, G, i, r);
        for (int g = 1; g < R; ++g) acc = combine(acc, reduce_over<T>(g * G, 1, G, i, r), r);
        return r == ReduceOp::Avg ? T(acc / R) : acc;
      }
      default: return T(0);
    }
  }

  int64_t check_any(BenchOp op, const BenchSizes& s, bool in_place) {
    switch (o.dtype) {
      case DType::F32: return check<float>(op, s, in_place);
      case DType::F64: return check<double>(op, s, in_place);
      case DType::I32: return check<int32_t>(op, s, in_place);
      case DType::I64: return check<int64_t>(op, s, in_place);
      case DType::U8: return check<uint8_t>(op, s, in_place);
      case DType::BF16: return check<bf16>(op, s, in_place);
      case DType::F16: return check<f16>(op, s, in_place);
      default: SB_FATAL("unknown dtype");
    }
  }

  // Timed iterations: each one issued and completed alone, so each has its own time.
  std::vector<double> time_iterations(BenchOp op, const BenchSizes& s, bool in_place) {
    for (int i = 0; i < o.warmup; ++i) run_once(op, s, in_place);
    b.synchronize();
    MPI_CHECK(MPI_Barrier(MPI_COMM_WORLD));
    std::vector<double> t(o.iters);
    for (int i = 0; i < o.iters; ++i) {
      if (o.blocking) MPI_CHECK(MPI_Barrier(MPI_COMM_WORLD));
      const double t0 = b.now();
      run_once(op, s, in_place);
      b.synchronize();
      t[i] = b.now() - t0;
    }
    return t;
  }
};

// ---- results ----
struct SampleRow {
  int32_t rank, op, in_place, iteration;
  int64_t size;
  double time;
};
struct ResultRow {
  int32_t op, in_place;
  int64_t size, count;
  double time, algbw, busbw;
  int64_t wrong;
  double p50, p90, p99, rank_min, rank_max;
  int32_t slowest_rank;
};

double percentile(std::vector<double> v, double q) {
  std::sort(v.begin(), v.end());
  const double pos = q * (v.size() - 1);
  const size_t lo = size_t(pos), hi = std::min(lo + 1, v.size() - 1);
  return v[lo] + (pos - lo) * (v[hi] - v[lo]);
}

// Cross-rank figures of one (operation, size, placement).
ResultRow summarize(const Options& o, BenchOp op, bool in_place, const BenchSizes& s,
                    const std::vector<double>& t, int64_t wrong, int n, int shard) {
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
  const double time = o.average == 0 ? r0 : o.average == 1 ? sum / n : o.average == 2 ? mn : mx;
  ResultRow r{};
  r.op = int(op);
  r.in_place = in_place;
  r.size = s.size_bytes;
  r.count = s.count;
  r.time = time;
  r.algbw = double(s.size_bytes) / time / 1e9;
  r.busbw = r.algbw * bus_factor(op, n, shard);
  r.wrong = wrong_all;
  r.p50 = percentile(per_iter, 0.5);
  r.p90 = percentile(per_iter, 0.9);
  r.p99 = percentile(per_iter, 0.99);
  r.rank_min = mn;
  r.rank_max = mx;
  r.slowest_rank = slowest.rank;
  return r;
}

void print_header(const Options& o, BenchOp op, int n, int nodes, int rpn, const std::string& device) {
  std::printf("#\n# collective_perf: %s on %d ranks (%d node%s, %d per node), backend %s, device %s\n", bench_op_name(op),
              n, nodes, nodes == 1 ? "" : "s", rpn, o.backend.c_str(), device.c_str());
  if (op == BenchOp::Hybrid) std::printf("# hybrid: reduce-scatter in shard groups of %d, all-reduce across %d groups\n", o.shard, n / o.shard);
  std::printf("# iterations %d, warm-up %d, check %d, blocking %d, time across ranks: %s\n#\n", o.iters, o.warmup,
              o.check, o.blocking, kAverageNames[o.average]);
  std::printf("#%75s%34s\n", "out-of-place", "in-place");
  std::printf("#%11s %12s %9s %7s %6s %9s %7s %7s %6s %9s %7s %7s %6s\n", "size", "count", "type", "redop", "root",
              "time", "algbw", "busbw", "#wrong", "time", "algbw", "busbw", "#wrong");
  std::printf("#%11s %12s %9s %7s %6s %9s %7s %7s %6s %9s %7s %7s %6s\n", "(B)", "(elements)", "", "", "", "(us)",
              "(GB/s)", "(GB/s)", "", "(us)", "(GB/s)", "(GB/s)", "");
}

std::string cell(const ResultRow* r) {
  char buf[64];
  if (!r) return "      n/a     n/a     n/a    n/a";
  std::snprintf(buf, sizeof buf, " %9.2f %7.3f %7.3f %6lld", r->time * 1e6, r->algbw, r->busbw, (long long)r->wrong);
  return buf;
}

int run(const Options& o, int rank, int n) {
  auto backend = make_backend(o.backend);
  Mesh mesh = Mesh::split(*backend, MPI_COMM_WORLD, o.shard);
  auto world_comm = backend->make_comm(MPI_COMM_WORLD);
  for (BenchOp op : o.ops) {
    const bool ok = op == BenchOp::Hybrid
                        ? backend->supports(Collective::ReduceScatter, o.dtype, o.redop) &&
                              backend->supports(Collective::AllReduce, o.dtype, o.redop)
                        : backend->supports(as_collective(op), o.dtype, o.redop);
    if (!ok)
      throw UsageError(std::string(bench_op_name(op)) + " of " + dtype_name(o.dtype) + " with " +
                       reduce_op_name(o.redop) + " is not supported by the " + o.backend + " backend");
  }
  // A sweep whose sizes all round down to nothing would measure nothing and look fine.
  for (BenchOp op : o.ops) {
    bool any = false;
    for (int64_t size = o.min_bytes; size <= o.max_bytes && !any;
         size = std::max(size + 1, int64_t(std::llround(double(size) * o.factor))))
      any = bench_sizes(op, size, o.dtype, n, o.shard).count > 0;
    int64_t smallest = 1;
    while (!any && bench_sizes(op, smallest, o.dtype, n, o.shard).count == 0) ++smallest;
    if (!any)
      throw UsageError("-b " + std::to_string(o.min_bytes) + " -e " + std::to_string(o.max_bytes) + ": no size in the sweep is large enough for " +
                       bench_op_name(op) + " of " + dtype_name(o.dtype) + " on " + std::to_string(n) +
                       " ranks (the smallest is " + std::to_string(smallest) + " B); nothing was measured");
  }
  const std::string stem = "collective_perf-w" + std::to_string(n);
  const std::string path = resolve_output(o.out, o.overwrite, stem, rank);
  const double start = wall_clock_rank0();
  const int nodes = count_nodes(), rpn = local_ranks();

  // Buffers for the largest size of every operation.
  int64_t max_send = 1, max_recv = 1;
  for (BenchOp op : o.ops) {
    const BenchSizes s = bench_sizes(op, o.max_bytes, o.dtype, n, o.shard);
    max_send = std::max({max_send, s.send, s.recv}), max_recv = std::max(max_recv, s.recv);
  }
  const int es = dtype_size(o.dtype);
  // Plan, then refuse: the two buffers must fit before anything is allocated (a size the
  // kernel's overcommit lets through would be killed when touched).
  const int64_t need = (max_send + max_recv) * es, limit = default_memory_limit(backend->memory_capacity());
  if (need > limit) {
    if (rank == 0)
      std::printf("status: out-of-memory: -e %lld needs %s per rank (send and receive buffers), the limit is %s; "
                  "nothing was allocated\n",
                  (long long)o.max_bytes, human_bytes(double(need)).c_str(), human_bytes(double(limit)).c_str());
    return kExitOutOfMemory;
  }
  Bench bench{o, *backend, mesh, *world_comm, rank, n};
  bench.send = backend->alloc(size_t(max_send) * es, MemCategory::CommBuffers);
  bench.recv = backend->alloc(size_t(max_recv) * es, MemCategory::CommBuffers);

  std::vector<SampleRow> samples;
  std::vector<ResultRow> results;
  double busbw_sum = 0;
  int busbw_n = 0;
  int64_t wrong_total = 0;
  for (BenchOp op : o.ops) {
    if (rank == 0) print_header(o, op, n, nodes, rpn, backend->device_name());
    int64_t last = -1;
    for (int64_t size = o.min_bytes; size <= o.max_bytes;
         size = std::max(size + 1, int64_t(std::llround(double(size) * o.factor)))) {
      const BenchSizes s = bench_sizes(op, size, o.dtype, n, o.shard);
      if (s.count == 0 || s.size_bytes == last) continue;  // too small for this many ranks
      last = s.size_bytes;
      ResultRow rows[2];
      bool have[2] = {false, false};
      for (int place = 0; place < 2; ++place) {
        if (place == 1 && !has_in_place(op)) continue;
        const int64_t wrong = o.check ? bench.check_any(op, s, place) : 0;
        const std::vector<double> t = bench.time_iterations(op, s, place);
        for (int i = 0; i < o.iters; ++i) samples.push_back({rank, int(op), place, i, s.size_bytes, t[i]});
        rows[place] = summarize(o, op, place, s, t, wrong, n, o.shard);
        have[place] = true;
        busbw_sum += rows[place].busbw;
        ++busbw_n;
        wrong_total += rows[place].wrong;
        if (rank == 0) results.push_back(rows[place]);
      }
      if (rank == 0)
        std::printf(" %11lld %12lld %9s %7s %6d%s%s\n", (long long)s.size_bytes, (long long)s.count, dtype_name(o.dtype),
                    is_reduction(op) ? reduce_op_name(o.redop) : "none",
                    op == BenchOp::Broadcast || op == BenchOp::Reduce ? o.root : -1, cell(&rows[0]).c_str(),
                    cell(have[1] ? &rows[1] : nullptr).c_str());
    }
  }
  backend->release(bench.send);
  backend->release(bench.recv);
  const double avg_busbw = busbw_n ? busbw_sum / busbw_n : 0;
  const bool below = o.min_busbw > 0 && avg_busbw < o.min_busbw;
  if (rank == 0) {
    std::printf("# Out of bounds values : %lld %s\n", (long long)wrong_total, wrong_total ? "FAILED" : "OK");
    std::printf("# Avg bus bandwidth    : %.6g GB/s\n", avg_busbw);
    if (o.min_busbw > 0)
      std::printf("# Bus bandwidth floor  : %.6g GB/s -> %s\n", o.min_busbw, below ? "FAILED (below the floor)" : "OK");
    std::printf("#\n");
  }

  // ---- HDF5 ----
  const std::string status = wrong_total ? "failed" : below ? "below-floor" : "ok";
  std::vector<std::string> op_names;
  for (int i = 0; i < int(BenchOp::kCount); ++i) op_names.push_back(bench_op_name(BenchOp(i)));
  std::string ops;
  for (BenchOp op : o.ops) ops += (ops.empty() ? "" : ",") + std::string(bench_op_name(op));
  ResultFile f(path, MPI_COMM_WORLD, o.overwrite, int64_t(samples.size() * sizeof(SampleRow)));
  f.attributes("/", {
      Attr::integer("schema_version", kSchemaVersion), Attr::str("program", "collective_perf"),
      Attr::str("ops", ops), Attr::str("dtype", dtype_name(o.dtype)), Attr::str("redop", reduce_op_name(o.redop)),
      Attr::integer("root", o.root), Attr::integer("min_bytes", o.min_bytes), Attr::integer("max_bytes", o.max_bytes),
      Attr::num("step_factor", o.factor), Attr::integer("iters", o.iters), Attr::integer("warmup", o.warmup),
      Attr::integer("check", o.check), Attr::integer("blocking", o.blocking),
      Attr::str("average", kAverageNames[o.average]), Attr::integer("world_size", n),
      Attr::integer("ranks_per_node", rpn), Attr::integer("nodes", nodes), Attr::integer("shard_size", o.shard),
      Attr::str("backend", o.backend), Attr::str("status", status), Attr::num("avg_busbw", avg_busbw),
      Attr::num("min_busbw", o.min_busbw), Attr::integer("wrong_total", wrong_total),
      Attr::str("start_time", iso_time(start)), Attr::str("end_time", iso_time(wall_clock_rank0())),
  });
  write_provenance(f, collect_provenance(o.argv), hostname(), backend->device_name(), MPI_COMM_WORLD);
  f.table("samples",
          {SB_COLUMN(SampleRow, rank, I32), SB_COLUMN(SampleRow, op, I32), SB_COLUMN(SampleRow, in_place, I32),
           SB_COLUMN(SampleRow, iteration, I32), SB_COLUMN(SampleRow, size, I64), SB_COLUMN(SampleRow, time, F64)},
          samples);
  f.names_attribute("samples", "op_names", op_names);
  f.table("results",
          {SB_COLUMN(ResultRow, op, I32), SB_COLUMN(ResultRow, in_place, I32), SB_COLUMN(ResultRow, size, I64),
           SB_COLUMN(ResultRow, count, I64), SB_COLUMN(ResultRow, time, F64), SB_COLUMN(ResultRow, algbw, F64),
           SB_COLUMN(ResultRow, busbw, F64), SB_COLUMN(ResultRow, wrong, I64), SB_COLUMN(ResultRow, p50, F64),
           SB_COLUMN(ResultRow, p90, F64), SB_COLUMN(ResultRow, p99, F64), SB_COLUMN(ResultRow, rank_min, F64),
           SB_COLUMN(ResultRow, rank_max, F64), SB_COLUMN(ResultRow, slowest_rank, I32)},
          results);
  f.names_attribute("results", "op_names", op_names);
  f.commit();
  if (rank == 0) std::printf("wrote %s (status %s)\n", path.c_str(), status.c_str());
  return wrong_total ? kExitCheckFailed : below ? kExitBelowFloor : kExitOk;
}

}  // namespace

int run_collective_perf(int argc, char** argv) {
  return mpi_main(argc, argv, [](int argc, char** argv, int rank, int world) {
    Options o;
    return parse(argc, argv, o, world) ? run(o, rank, world) : int(kExitOk);
  });
}

}  // namespace sb
