// End-to-end check of result files from C++: runs the programs on 4 MPI ranks, reads the
// HDF5 they wrote with the plain HDF5 API, and checks rows per rank and step, lanes without
// overlapping events, memory peaks against the memory trace, and the out-of-memory record.
#include <gtest/gtest.h>
#include <hdf5.h>
#include <sys/stat.h>
#include <unistd.h>

#include <algorithm>
#include <array>
#include <cstdlib>
#include <map>
#include <set>
#include <string>
#include <vector>

#include "shardbench/strategy/config.h"
#include "shardbench/train/options.h"
#include "shardbench/train/plan.h"

namespace {

const std::string kDir = [] {
  char tmpl[] = "/tmp/shardbench-trace-XXXXXX";
  return std::string(mkdtemp(tmpl));
}();

struct RemoveDir {
  ~RemoveDir() { std::system(("rm -rf " + kDir).c_str()); }
} remove_dir;

int run(const std::string& args) {
  const std::string cmd =
      "mpirun -np 4 --oversubscribe --bind-to none " + args + " > " + kDir + "/log 2>&1";
  const int rc = std::system(cmd.c_str());
  return WIFEXITED(rc) ? WEXITSTATUS(rc) : -1;
}

// OpKind and Phase codes as docs/trace-format.md lists them.
constexpr int kGemm = 0, kAllReduce = 4, kAllGather = 5, kReduceScatter = 6, kWait = 7, kBackward = 1;

const char* kTiny = " --model t5-tiny --batch 2 --seq-len 12 --dec-seq-len 8 --steps 2 --warmup 1";

// Reads columns of a compound dataset by name (HDF5 converts to the memory type).
template <class T>
std::vector<T> column(hid_t file, const char* dset, const char* field, hid_t native) {
  hid_t d = H5Dopen2(file, dset, H5P_DEFAULT);
  EXPECT_GE(d, 0) << dset;
  hid_t space = H5Dget_space(d);
  const hssize_t n = H5Sget_simple_extent_npoints(space);
  hid_t mt = H5Tcreate(H5T_COMPOUND, sizeof(T));
  H5Tinsert(mt, field, 0, native);
  std::vector<T> out(n);
  if (n > 0) {
    EXPECT_GE(H5Dread(d, mt, H5S_ALL, H5S_ALL, H5P_DEFAULT, out.data()), 0) << dset << "." << field;
  }
  H5Tclose(mt);
  H5Sclose(space);
  H5Dclose(d);
  return out;
}
std::vector<int> ints(hid_t f, const char* d, const char* c) { return column<int>(f, d, c, H5T_NATIVE_INT); }
std::vector<double> doubles(hid_t f, const char* d, const char* c) {
  return column<double>(f, d, c, H5T_NATIVE_DOUBLE);
}
std::vector<long long> longs(hid_t f, const char* d, const char* c) {
  return column<long long>(f, d, c, H5T_NATIVE_LLONG);
}

std::string str_attr(hid_t loc, const char* name) {
  hid_t a = H5Aopen(loc, name, H5P_DEFAULT);
  EXPECT_GE(a, 0) << name;
  hid_t t = H5Aget_type(a);
  char* s = nullptr;
  H5Aread(a, t, &s);
  std::string v = s ? s : "";
  H5free_memory(s);
  H5Tclose(t);
  H5Aclose(a);
  return v;
}
long long int_attr(hid_t loc, const char* name) {
  long long v = -1;
  hid_t a = H5Aopen(loc, name, H5P_DEFAULT);
  EXPECT_GE(a, 0) << name;
  H5Aread(a, H5T_NATIVE_LLONG, &v);
  H5Aclose(a);
  return v;
}

void check_completed(const std::string& path, int ranks, int steps) {
  SCOPED_TRACE(path);
  ASSERT_EQ(access((path + ".tmp").c_str(), F_OK), -1) << "temporary file left behind";
  hid_t f = H5Fopen(path.c_str(), H5F_ACC_RDONLY, H5P_DEFAULT);
  ASSERT_GE(f, 0);
  EXPECT_EQ(int_attr(f, "schema_version"), 5);
  EXPECT_EQ(str_attr(f, "status"), "ok");
  EXPECT_EQ(int_attr(f, "world_size"), ranks);
  hid_t prov = H5Gopen2(f, "provenance", H5P_DEFAULT);
  EXPECT_NE(str_attr(prov, "command_line").find("--out"), std::string::npos);
  EXPECT_FALSE(str_attr(prov, "hdf5_version").empty());
  H5Gclose(prov);

  // One row per rank and step.
  const auto rank = ints(f, "steps", "rank"), step = ints(f, "steps", "step");
  std::set<std::pair<int, int>> seen;
  for (size_t i = 0; i < rank.size(); ++i) seen.insert({rank[i], step[i]});
  EXPECT_EQ(rank.size(), size_t(ranks * steps));
  EXPECT_EQ(seen.size(), size_t(ranks * steps));

  // Within a rank and lane, events do not overlap.
  const auto er = ints(f, "events", "rank"), lane = ints(f, "events", "lane");
  const auto start = doubles(f, "events", "start"), end = doubles(f, "events", "end");
  ASSERT_FALSE(er.empty());
  std::map<std::pair<int, int>, std::vector<std::pair<double, double>>> lanes;
  for (size_t i = 0; i < er.size(); ++i) lanes[{er[i], lane[i]}].push_back({start[i], end[i]});
  for (auto& [key, v] : lanes) {
    std::sort(v.begin(), v.end());
    for (size_t i = 1; i < v.size(); ++i)
      ASSERT_GE(v[i].first, v[i - 1].second) << "rank " << key.first << " lane " << key.second;
  }

  // Peaks equal the maxima of the memory trace, per rank.
  const auto mr = ints(f, "memory", "rank");
  const auto mt = longs(f, "memory", "total"), ma = longs(f, "memory", "activations");
  const auto pr = ints(f, "memory_peaks", "rank");
  const auto pt = longs(f, "memory_peaks", "total"), pa = longs(f, "memory_peaks", "activations");
  ASSERT_EQ(pr.size(), size_t(ranks));
  for (size_t r = 0; r < pr.size(); ++r) {
    long long max_t = 0, max_a = 0;
    for (size_t i = 0; i < mr.size(); ++i)
      if (mr[i] == pr[r]) max_t = std::max(max_t, mt[i]), max_a = std::max(max_a, ma[i]);
    EXPECT_EQ(pt[r], max_t);
    EXPECT_EQ(pa[r], max_a);
    EXPECT_GT(pa[r], 0);
  }
  hid_t plan = H5Gopen2(f, "plan", H5P_DEFAULT);
  EXPECT_EQ(int_attr(plan, "peak_total"), *std::max_element(pt.begin(), pt.end()));
  // The host ledger (CPU offload) beside the device's, in the same columns: one peak row
  // per rank, equal to the plan's host peak (none allocated without offload).
  const auto hpr = ints(f, "host_memory_peaks", "rank");
  const auto hpt = longs(f, "host_memory_peaks", "total");
  ASSERT_EQ(hpr.size(), size_t(ranks));
  EXPECT_EQ(int_attr(plan, "host_peak_total"), *std::max_element(hpt.begin(), hpt.end()));
  EXPECT_GT(int_attr(plan, "host_limit"), 0);
  EXPECT_EQ(int_attr(plan, "host_fits"), 1);
  EXPECT_EQ(int_attr(f, "max_host_peak_memory_bytes"), *std::max_element(hpt.begin(), hpt.end()));
  EXPECT_EQ(longs(f, "host_memory", "total").size(), ints(f, "host_memory", "rank").size());
  H5Gclose(plan);

  // The mesh: one row per rank, coordinates in the programs' rank order (tensor innermost,
  // then shard, replicate, pipeline); every collective names an axis whose group, read from
  // the mesh, has the event's rank count.
  const auto mrank = ints(f, "mesh", "rank"), mpp = ints(f, "mesh", "pp"), mrep = ints(f, "mesh", "dp_replicate");
  const auto mshard = ints(f, "mesh", "dp_shard"), mtp = ints(f, "mesh", "tp");
  ASSERT_EQ(mrank.size(), size_t(ranks));
  std::map<int, std::array<int, 4>> coord;
  for (size_t i = 0; i < mrank.size(); ++i) coord[mrank[i]] = {mpp[i], mrep[i], mshard[i], mtp[i]};
  std::array<int, 4> extent{};
  for (const auto& [r, c] : coord)
    for (int a = 0; a < 4; ++a) extent[a] = std::max(extent[a], c[a] + 1);
  for (const auto& [r, c] : coord)
    EXPECT_EQ(((c[0] * extent[1] + c[1]) * extent[2] + c[2]) * extent[3] + c[3], r) << "rank order";
  {
    const auto op = ints(f, "events", "op"), axis = ints(f, "events", "axis"), nr = ints(f, "events", "ranks");
    for (size_t i = 0; i < op.size(); ++i) {
      if (op[i] != kAllGather && op[i] != kReduceScatter && op[i] != kAllReduce) continue;
      ASSERT_TRUE(axis[i] >= 0 && axis[i] < 4) << "event " << i << " has no axis";
      EXPECT_EQ(nr[i], extent[axis[i]]) << "event " << i << ": its group along axis " << axis[i];
    }
  }

  // Bytes sent per rank: the full buffer × (n−1)/n for all-gather and reduce-scatter,
  // 2(n−1)/n for all-reduce (nccl-tests' bus bandwidth); the steps' sums agree.
  const auto op = ints(f, "events", "op"), es = ints(f, "events", "step"), nr = ints(f, "events", "ranks");
  const auto bytes = longs(f, "events", "bytes"), sent = longs(f, "events", "sent_bytes");
  std::map<std::pair<int, int>, long long> sent_sum, buf_sum;
  for (size_t i = 0; i < op.size(); ++i) {
    const long long n = nr[i], b = bytes[i];
    long long want = 0;
    if (op[i] == kAllGather || op[i] == kReduceScatter) want = n > 1 ? b * (n - 1) / n : 0;
    else if (op[i] == kAllReduce) want = n > 1 ? (2 * b * (n - 1) + n / 2) / n : 0;
    else continue;
    EXPECT_EQ(sent[i], want) << "event " << i << " op " << op[i] << " ranks " << n;
    sent_sum[{er[i], es[i]}] += sent[i];
    buf_sum[{er[i], es[i]}] += b;
  }
  const auto sr = ints(f, "steps", "rank"), ss = ints(f, "steps", "step");
  const auto s_sent = longs(f, "steps", "sent_bytes"), s_buf = longs(f, "steps", "comm_bytes");
  for (size_t i = 0; i < sr.size(); ++i) {
    const std::pair<int, int> key{sr[i], ss[i]};
    EXPECT_EQ(s_sent[i], sent_sum[key]) << "rank " << sr[i] << " step " << ss[i];
    EXPECT_EQ(s_buf[i], buf_sum[key]) << "rank " << sr[i] << " step " << ss[i];
  }
  H5Fclose(f);
}

// One rank's events of one step.
struct Ev {
  int op, phase, unit, lane;
  double start, end;
  long long bytes, request;
};
std::map<std::pair<int, int>, std::vector<Ev>> events_by_rank_step(const std::string& path) {
  hid_t f = H5Fopen(path.c_str(), H5F_ACC_RDONLY, H5P_DEFAULT);
  EXPECT_GE(f, 0) << path;
  const auto rank = ints(f, "events", "rank"), step = ints(f, "events", "step"), op = ints(f, "events", "op");
  const auto phase = ints(f, "events", "phase"), unit = ints(f, "events", "unit"), lane = ints(f, "events", "lane");
  const auto start = doubles(f, "events", "start"), end = doubles(f, "events", "end");
  const auto bytes = longs(f, "events", "bytes"), request = longs(f, "events", "request");
  H5Fclose(f);
  std::map<std::pair<int, int>, std::vector<Ev>> out;
  for (size_t i = 0; i < rank.size(); ++i)
    if (step[i] > 0)
      out[{rank[i], step[i]}].push_back({op[i], phase[i], unit[i], lane[i], start[i], end[i], bytes[i], request[i]});
  return out;
}
double last_backward_gemm_end(const std::vector<Ev>& v) {
  double t = 0;
  for (const Ev& e : v)
    if (e.op == kGemm && e.phase == kBackward) t = std::max(t, e.end);
  return t;
}
// Whether a compute-lane operation starts strictly between a and b.
bool compute_starts_between(const std::vector<Ev>& v, double a, double b) {
  for (const Ev& e : v)
    if (e.lane == 0 && e.start > a && e.start < b) return true;
  return false;
}

}  // namespace

// The schedules as PyTorch runs them, from real 4-rank traces.
TEST(Trace, SchedulesAsPyTorchFromTheTrace) {
  const std::string full = kDir + "/s-full.h5", hybrid = kDir + "/s-hybrid.h5", ddp = kDir + "/s-ddp.h5";
  ASSERT_EQ(run(std::string("build/bin/fsdp_perf --sharding full") + kTiny + " --out " + full), 0);
  ASSERT_EQ(run(std::string("build/bin/fsdp_perf --sharding hybrid --shard-size 2") + kTiny + " --out " + hybrid), 0);
  // d_ff 4096: a block's wi and wo are 512 KiB each, so buckets of 0.5 MiB split the model.
  ASSERT_EQ(run(std::string("build/bin/ddp_perf --bucket-mb 0.5") + kTiny + " --d-ff 4096 --out " + ddp), 0);
  const int units = 7;  // t5-tiny: embedding, 2 encoder blocks, bridge, 2 decoder blocks, head

  // FSDP1: compute waits on no reduce-scatter before backward's last GEMM; each unit is
  // reduced once per step (the unit column names the unit reduced).
  for (const auto& [key, v] : events_by_rank_step(full)) {
    SCOPED_TRACE("full, rank " + std::to_string(key.first) + " step " + std::to_string(key.second));
    std::map<long long, int> scatter_unit;
    for (const Ev& e : v)
      if (e.op == kReduceScatter) scatter_unit[e.request] = e.unit;
    std::set<int> reduced;
    for (const auto& [r, u] : scatter_unit) reduced.insert(u);
    EXPECT_EQ(int(reduced.size()), units);
    EXPECT_EQ(int(scatter_unit.size()), units);
    const double last = last_backward_gemm_end(v);
    for (const Ev& e : v) {
      if (e.op == kWait && scatter_unit.count(e.request)) {
        EXPECT_GE(e.start, last);
      }
    }
  }

  // Hybrid: each unit's all-reduce starts once its reduce-scatter has ended, in the same
  // poll (no compute-lane operation starts in between), unless the previous all-reduce
  // (stream order on the replicate communicator) started later.
  for (const auto& [key, v] : events_by_rank_step(hybrid)) {
    SCOPED_TRACE("hybrid, rank " + std::to_string(key.first) + " step " + std::to_string(key.second));
    std::map<int, const Ev*> rs, ar;
    for (const Ev& e : v) {
      if (e.op == kReduceScatter) rs[e.unit] = &e;
      if (e.op == kAllReduce) ar[e.unit] = &e;
    }
    ASSERT_EQ(int(rs.size()), units);
    ASSERT_EQ(int(ar.size()), units);
    std::vector<const Ev*> ars;
    for (const auto& [u, e] : ar) ars.push_back(e);
    std::sort(ars.begin(), ars.end(), [](const Ev* a, const Ev* b) { return a->start < b->start; });
    for (size_t k = 0; k < ars.size(); ++k) {
      const Ev& a = *ars[k];
      const Ev& r = *rs.at(a.unit);
      EXPECT_GE(a.start, r.end) << "unit " << a.unit;
      const double ready = std::max(r.end, k ? ars[k - 1]->start : 0.0);
      EXPECT_FALSE(compute_starts_between(v, ready, a.start)) << "unit " << a.unit << ": all-reduce issued late";
    }
  }

  // DDP: the first bucket is issued at 1 MiB (the head's decoder.final_norm, then wo and wi
  // of the last decoder block: the first gradients produced), before that block's backward
  // has finished.
  for (const auto& [key, v] : events_by_rank_step(ddp)) {
    SCOPED_TRACE("ddp, rank " + std::to_string(key.first) + " step " + std::to_string(key.second));
    std::vector<const Ev*> ars;
    for (const Ev& e : v)
      if (e.op == kAllReduce) ars.push_back(&e);
    std::sort(ars.begin(), ars.end(), [](const Ev* a, const Ev* b) { return a->start < b->start; });
    ASSERT_GE(ars.size(), 3u);
    const int last_block = units - 2;  // the head is the last unit
    EXPECT_EQ(ars[0]->bytes, (2 * 32 * 4096 + 32) * 4);
    EXPECT_EQ(ars[0]->unit, last_block);
    bool mid_block = false;
    for (const Ev& e : v)
      mid_block |= e.op == kGemm && e.phase == kBackward && e.unit == last_block && e.start > ars[0]->start;
    EXPECT_TRUE(mid_block) << "the first bucket waited for the end of its block's backward";
  }
}

TEST(Trace, EveryStrategyWritesACompleteTrace) {
  const std::vector<std::pair<std::string, std::string>> runs = {
      {"ddp", "build/bin/ddp_perf"},
      {"full", "build/bin/fsdp_perf --sharding full"},
      {"hybrid", "build/bin/fsdp_perf --sharding hybrid --shard-size 2"},
      {"none", "build/bin/fsdp_perf --sharding none"},
      {"grad-op", "build/bin/fsdp_perf --sharding grad-op"},
      {"tp2-full", "build/bin/fsdp_perf --sharding full --tp 2"},
  };
  for (const auto& [name, cmd] : runs) {
    const std::string out = kDir + "/" + name + ".h5";
    ASSERT_EQ(run(cmd + kTiny + " --out " + out), 0) << name;
    check_completed(out, 4, 3);
  }
}

TEST(Trace, OutOfMemoryIsRecordedWithThePlan) {
  const std::string out = kDir + "/oom.h5";
  ASSERT_EQ(run(std::string("build/bin/fsdp_perf") + kTiny + " --mem-limit-gib 0.00001 --out " + out), 3);
  hid_t f = H5Fopen(out.c_str(), H5F_ACC_RDONLY, H5P_DEFAULT);
  ASSERT_GE(f, 0);
  EXPECT_EQ(str_attr(f, "status"), "out-of-memory");
  hid_t plan = H5Gopen2(f, "plan", H5P_DEFAULT);
  EXPECT_EQ(int_attr(plan, "fits"), 0);
  EXPECT_GT(int_attr(plan, "peak_total"), int_attr(plan, "limit"));
  H5Gclose(plan);
  EXPECT_TRUE(ints(f, "steps", "rank").empty());
  H5Fclose(f);
}

TEST(Trace, ExistingResultIsNeverOverwrittenWithoutFlag) {
  const std::string out = kDir + "/twice.h5";
  ASSERT_EQ(run(std::string("build/bin/ddp_perf") + kTiny + " --out " + out), 0);
  struct stat before;
  ASSERT_EQ(stat(out.c_str(), &before), 0);
  EXPECT_EQ(run(std::string("build/bin/ddp_perf") + kTiny + " --out " + out), 2);
  struct stat after;
  ASSERT_EQ(stat(out.c_str(), &after), 0);
  EXPECT_EQ(before.st_mtim.tv_nsec, after.st_mtim.tv_nsec);
  EXPECT_EQ(run(std::string("build/bin/ddp_perf") + kTiny + " --out " + out + " --overwrite"), 0);
  check_completed(out, 4, 3);
}

// The plan's two sides: device memory against --mem-limit-gib, host memory (CPU offload)
// against --host-mem-limit-gib. Either short is out-of-memory (fits() false: exit 3), and
// the table says which, the host in a block of its own.
TEST(Plan, HostMemoryIsASecondBlockWithItsOwnLimit) {
  // The host limit acts only where something lives on the host: the optimizer offloaded.
  const char* argv[] = {"fsdp_perf", "--model", "t5-tiny", "--plan", "--cpu-offload", "optimizer",
                        "--host-mem-limit-gib", "2"};
  sb::RunConfig cfg;
  ASSERT_TRUE(sb::parse_options(8, const_cast<char**>(argv), sb::StrategyKind::FSDP, cfg));
  EXPECT_EQ(cfg.host_mem_limit_gib, 2.0);
  const sb::Setup setup = sb::Setup::make(cfg.strategy, cfg.model, cfg.shape, 4);
  sb::MemoryPlan plan = sb::plan_memory(setup);
  plan.limit = plan.peak_total;
  plan.host_limit = int64_t(2) << 30;
  EXPECT_GT(plan.host_peak_total, 0);  // the optimizer's state and master shard on the host
  EXPECT_LT(plan.host_peak_total, plan.host_limit);
  EXPECT_TRUE(plan.fits());
  EXPECT_NE(sb::format_plan(cfg, setup, plan).find("host limit             2.00 GiB  -> fits"), std::string::npos)
      << sb::format_plan(cfg, setup, plan);
  plan.host_peak_total = plan.host_limit + 1;  // a host block over its own limit, the device within its own
  plan.host_peak[int(sb::MemCategory::OptimizerState)] = plan.host_peak_total;
  EXPECT_TRUE(plan.device_fits());
  EXPECT_FALSE(plan.host_fits());
  EXPECT_FALSE(plan.fits());
  const std::string text = sb::format_plan(cfg, setup, plan);
  EXPECT_NE(text.find("host limit"), std::string::npos) << text;
  EXPECT_NE(text.find("DOES NOT FIT: short by 1 B"), std::string::npos) << text;
  plan.host_peak_total = 0;
  plan.limit = plan.peak_total - 1;  // the device side alone
  EXPECT_FALSE(plan.fits());
}
