// kernel_bench: Google Benchmark micro-benchmarks of the compute the strategies run, on the
// CPU backend: the GEMM shapes of each T5 preset's units (taken from one step of the real
// model on the counting backend, so they are exactly the shapes a step issues), the copy
// of a unit's flat parameter (pack/unpack), and the Adam update of a unit.
// Counters: FLOP/s and bytes/s. JSON: --benchmark_format=json (or --benchmark_out=F).
// Tokens per step: SB_BENCH_BATCH sequences × SB_BENCH_SEQ tokens (default 2 × 128).
#include <benchmark/benchmark.h>

#include <cstdlib>
#include <map>
#include <memory>
#include <set>
#include <string>
#include <tuple>

#include "shardbench/backend/backend.h"
#include "shardbench/model/model.h"
#include "shardbench/model/t5.h"

namespace {

using sb::Backend;

int env_int(const char* name, int fallback) {
  const char* v = std::getenv(name);
  return v ? std::atoi(v) : fallback;
}

struct Shape {
  int m, n, k, batch, trans;
  std::string unit;
  bool operator<(const Shape& o) const {
    return std::tie(unit, m, n, k, batch, trans) < std::tie(o.unit, o.m, o.n, o.k, o.batch, o.trans);
  }
};

class Collect : public sb::Recorder {
 public:
  explicit Collect(const std::vector<sb::UnitSpec>& units) : units_(units) {}
  void on_op(const sb::OpEvent& e) override {
    if (e.kind != sb::OpKind::Gemm) return;
    const std::string unit = e.unit < 0 ? "root" : sb::unit_kind_name(units_[e.unit].kind);
    shapes.insert({e.gemm[0], e.gemm[1], e.gemm[2], e.gemm[3], e.gemm[4], unit});
  }
  void on_memory(double, const sb::MemBytes&) override {}
  std::set<Shape> shapes;

 private:
  const std::vector<sb::UnitSpec>& units_;
};

// The distinct GEMMs of one training step of a one-block-per-stack version of the preset.
std::set<Shape> step_gemms(sb::ModelSpec spec, const sb::StepShape& shape) {
  spec.layers = 1;
  auto counting = sb::make_counting_backend();
  sb::T5Step step(spec, *counting, sb::DType::F32, shape, false, 1.0f);
  Collect rec(step.units());
  const int n = int(step.stages().size());
  float* params = counting->alloc_floats(1, sb::MemCategory::Parameters);  // never read
  step.set_tokens(sb::make_tokens(1, 1, 0, shape, spec.vocab));
  for (int s = 0; s < n; ++s) {
    counting->set_context(sb::Phase::Forward, step.stages()[s].unit);
    counting->set_recorder(&rec);
    step.forward(s, params);
  }
  for (int s = n - 1; s >= 0; --s) {
    counting->set_context(sb::Phase::Backward, step.stages()[s].unit);
    step.backward(s, params, params);
  }
  counting->set_recorder(nullptr);
  return rec.shapes;
}

Backend& cpu() {
  static std::unique_ptr<Backend> b = sb::make_backend("cpu");
  return *b;
}

void bench_gemm(benchmark::State& st, Shape s) {
  Backend& b = cpu();
  const bool ta = s.trans & 1, tb = s.trans & 2;
  const int64_t a_n = int64_t(s.m) * s.k * s.batch, b_n = int64_t(s.k) * s.n * s.batch, c_n = int64_t(s.m) * s.n * s.batch;
  float* A = b.alloc_floats(a_n, sb::MemCategory::Workspace);
  float* B = b.alloc_floats(b_n, sb::MemCategory::Workspace);
  float* C = b.alloc_floats(c_n, sb::MemCategory::Workspace);
  b.init_uniform(A, a_n, 1, 0, 1.f);
  b.init_uniform(B, b_n, 2, 0, 1.f);
  b.fill(C, 0.f, c_n);
  for (auto _ : st)
    b.gemm_batched(ta, tb, s.m, s.n, s.k, 1.f, A, ta ? s.m : s.k, int64_t(s.m) * s.k, B, tb ? s.k : s.n,
                   int64_t(s.k) * s.n, 1.f, C, s.n, int64_t(s.m) * s.n, s.batch);
  const double flops = 2.0 * s.m * s.n * s.k * s.batch;
  st.counters["FLOP/s"] = benchmark::Counter(flops, benchmark::Counter::kIsIterationInvariantRate);
  st.counters["bytes/s"] = benchmark::Counter(4.0 * (a_n + b_n + 2 * c_n), benchmark::Counter::kIsIterationInvariantRate);
  for (float* p : {A, B, C}) b.release(p);
}

// Packing a unit's tensors into its flat parameter (or unpacking): one contiguous copy.
void bench_pack(benchmark::State& st, int64_t numel) {
  Backend& b = cpu();
  float* src = b.alloc_floats(numel, sb::MemCategory::Workspace);
  float* dst = b.alloc_floats(numel, sb::MemCategory::Workspace);
  b.fill(src, 1.f, numel);
  for (auto _ : st) b.copy(dst, src, numel);
  st.counters["bytes/s"] = benchmark::Counter(8.0 * numel, benchmark::Counter::kIsIterationInvariantRate);
  b.release(src);
  b.release(dst);
}

void bench_adam(benchmark::State& st, int64_t numel) {
  Backend& b = cpu();
  float* p[4];
  for (auto& x : p) b.fill(x = b.alloc_floats(numel, sb::MemCategory::Workspace), 0.5f, numel);
  sb::AdamConfig cfg;
  int step = 0;
  for (auto _ : st) b.adam(p[0], p[1], p[2], p[3], numel, cfg, ++step);
  // Per element: read p, g, m, v, write p, m, v; about 12 floating-point operations.
  st.counters["bytes/s"] = benchmark::Counter(28.0 * numel, benchmark::Counter::kIsIterationInvariantRate);
  st.counters["FLOP/s"] = benchmark::Counter(12.0 * numel, benchmark::Counter::kIsIterationInvariantRate);
  for (float* x : p) b.release(x);
}

std::string shape_name(const Shape& s) {
  return "m" + std::to_string(s.m) + "_n" + std::to_string(s.n) + "_k" + std::to_string(s.k) + "_b" +
         std::to_string(s.batch) + "_" + (s.trans & 1 ? "T" : "N") + (s.trans & 2 ? "T" : "N");
}

}  // namespace

int main(int argc, char** argv) {
  const sb::StepShape shape{env_int("SB_BENCH_BATCH", 2), env_int("SB_BENCH_SEQ", 128), env_int("SB_BENCH_SEQ", 128)};
  for (const std::string& preset : sb::model_preset_names()) {
    const sb::ModelSpec spec = sb::model_preset(preset);
    for (const Shape& s : step_gemms(spec, shape))
      benchmark::RegisterBenchmark(("gemm/" + preset + "/" + s.unit + "/" + shape_name(s)).c_str(), bench_gemm, s)
          ->Unit(benchmark::kMicrosecond);
    for (const sb::UnitSpec& u : sb::model_units(spec)) {
      if (u.kind == sb::UnitKind::EncoderBlock && u.layer == 1) {  // a block without the bias table
        benchmark::RegisterBenchmark(("pack/" + preset + "/encoder_block").c_str(), bench_pack, u.numel)
            ->Unit(benchmark::kMicrosecond);
        benchmark::RegisterBenchmark(("adam/" + preset + "/encoder_block").c_str(), bench_adam, u.numel)
            ->Unit(benchmark::kMicrosecond);
      }
    }
  }
  benchmark::Initialize(&argc, argv);
  if (benchmark::ReportUnrecognizedArguments(argc, argv)) return 2;
  benchmark::RunSpecifiedBenchmarks();
  benchmark::Shutdown();
  return 0;
}
