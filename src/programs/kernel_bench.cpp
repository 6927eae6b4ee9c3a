// kernel_bench: Google Benchmark micro-benchmarks of the compute the strategies run, on the
// CPU backend or (--backend cuda) the CUDA one: the GEMM shapes of each T5 preset's units
// (taken from one step of the real model on the counting backend, so they are exactly the
// shapes a step issues), the copy of a unit's flat parameter (pack/unpack), the Adam update
// of a unit (adam/: adamw as before --optimizer), each optimizer's update of a unit
// (optimizer/<model>/encoder_block/<optimizer>/threads<N>: the host implementation with N
// threads on the CPU), and one attention forward + backward per path at the study models' head
// shapes (attention/<model>/<path>/<dtype>: unfused, fused, and on cuda fused-fma and
// fused-mma, the FMA and the tensor-core kernels; src/programs/attention_bench.h).
// Counters: FLOP/s and bytes/s; attention lines: ms and TFLOPS (its matmul FLOPs, 12·B·H·T²·d_kv,
// over the time of forward and backward, the device synchronised after each).
// JSON: --benchmark_format=json (or --benchmark_out=F).
// Tokens per step: SB_BENCH_BATCH sequences × SB_BENCH_SEQ tokens (default 2 × 128 on the
// CPU, 8 × 512 on cuda: the study's shapes).
#include <benchmark/benchmark.h>
#include <mpi.h>

#include <chrono>
#include <cstdlib>
#include <cstring>
#include <map>
#include <memory>
#include <set>
#include <string>
#include <tuple>

#include "shardbench/backend/backend.h"
#include "shardbench/backend/host_optimizer.h"
#include <vector>
#include "shardbench/model/model.h"
#include "shardbench/model/t5.h"
#include "attention_bench.h"

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
    const std::string unit = e.unit < 0 ? "none" : sb::unit_kind_name(units_[e.unit].kind);
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
  sb::T5StepConfig config;
  config.spec = spec;
  config.shape = shape;  // fp32, no checkpointing, grad_scale 1
  sb::T5Step step(*counting, config);
  Collect rec(step.units());
  const int n = int(step.pieces().size());
  float* params = counting->alloc_floats(1, sb::MemCategory::Parameters);  // never read
  const auto every_unit = [params](int) { return sb::Buf(params); };        // one buffer for all
  step.set_tokens(sb::make_tokens(1, 1, 0, shape, spec.vocab));
  for (int s = 0; s < n; ++s) {
    counting->set_context(sb::Phase::Forward, step.pieces()[s].unit);
    counting->set_recorder(&rec);
    step.forward(s, every_unit);
  }
  for (int s = n - 1; s >= 0; --s) {
    counting->set_context(sb::Phase::Backward, step.pieces()[s].unit);
    step.backward(s, every_unit, every_unit);
  }
  counting->set_recorder(nullptr);
  return rec.shapes;
}

std::unique_ptr<Backend>& the_backend() {
  static std::unique_ptr<Backend> b;
  return b;
}
Backend& cpu() { return *the_backend(); }  // the chosen backend (--backend), cpu by default

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
  for (auto _ : st) {  // synchronised: on a GPU the work, not its launch (a no-op on the CPU)
    b.gemm_batched(ta, tb, s.m, s.n, s.k, 1.f, A, ta ? s.m : s.k, int64_t(s.m) * s.k, B, tb ? s.k : s.n,
                   int64_t(s.k) * s.n, 1.f, C, s.n, int64_t(s.m) * s.n, s.batch);
    b.synchronize();
  }
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
  for (auto _ : st) {
    b.copy(dst, src, numel);
    b.synchronize();
  }
  st.counters["bytes/s"] = benchmark::Counter(8.0 * numel, benchmark::Counter::kIsIterationInvariantRate);
  b.release(src);
  b.release(dst);
}

void bench_adam(benchmark::State& st, int64_t numel) {
  Backend& b = cpu();
  float* p[2];  // parameters, gradient
  for (auto& x : p) b.fill(x = b.alloc_floats(numel, sb::MemCategory::Workspace), 0.5f, numel);
  sb::OptimizerConfig cfg;  // adamw without weight decay: the Adam update, its state m then v
  float* state = b.alloc_floats(2 * numel, sb::MemCategory::Workspace);
  b.optimizer_init_state(cfg, state, numel);
  int step = 0;
  for (auto _ : st) {
    b.optimizer_update(cfg, ++step, p[0], p[1], state, numel);
    b.synchronize();
  }
  // Per element: read p, g, m, v, write p, m, v; about 12 floating-point operations.
  st.counters["bytes/s"] = benchmark::Counter(28.0 * numel, benchmark::Counter::kIsIterationInvariantRate);
  st.counters["FLOP/s"] = benchmark::Counter(12.0 * numel, benchmark::Counter::kIsIterationInvariantRate);
  b.release(state);
  for (float* x : p) b.release(x);
}

// Each optimizer's update of a unit (--optimizer): on the CPU the host implementation with
// `threads` threads (backend/host_optimizer.h), on cuda the backend's kernels (threads 1).
void bench_optimizer(benchmark::State& st, int64_t numel, sb::OptimizerKind kind, int threads) {
  Backend& b = cpu();
  sb::OptimizerConfig cfg;
  cfg.kind = kind;
  float* p = b.alloc_floats(numel, sb::MemCategory::Workspace);
  float* g = b.alloc_floats(numel, sb::MemCategory::Workspace);
  b.init_uniform(p, numel, 1, 0, 0.5f);
  b.init_uniform(g, numel, 2, 0, 1e-3f);
  void* state = b.alloc(size_t(sb::optimizer_state_bytes(cfg, numel)), sb::MemCategory::Workspace);
  b.optimizer_init_state(cfg, state, numel);
  const bool host = b.name() == "cpu";
  int step = 0;
  for (auto _ : st) {
    if (host) sb::host_optimizer_update(cfg, ++step, p, g, state, numel, {}, threads);
    else b.optimizer_update(cfg, ++step, p, g, state, numel);
    b.synchronize();
  }
  st.counters["bytes/s"] = benchmark::Counter(double(sb::optimizer_bytes_touched(cfg, numel, sb::DType::F32, {})),
                                              benchmark::Counter::kIsIterationInvariantRate);
  for (void* x : {(void*)p, (void*)g, state}) b.release(x);
}

// One attention forward + backward (attention_bench.h), timed per iteration with the
// device synchronised; `kernel` picks the fused op's kernels on cuda.
void bench_attention(benchmark::State& st, sb::AttentionShape s, sb::DType t, sb::AttentionImpl impl,
                     sb::AttentionKernel kernel) {
  Backend& b = cpu();
  sb::ComputeOptions o;
  o.attention_kernel = kernel;
  b.set_compute_options(o);
  sb::attention_bench::Tensors x = sb::attention_bench::make(b, s, t, impl);
  sb::attention_bench::forward_backward(b, x);  // warm-up (kernel loading, cuBLAS heuristics)
  b.synchronize();
  double total = 0;
  for (auto _ : st) {
    const auto t0 = std::chrono::steady_clock::now();
    sb::attention_bench::forward_backward(b, x);
    b.synchronize();
    const double dt = std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
    st.SetIterationTime(dt);
    total += dt;
  }
  const double flops = sb::attention_flops(s, false) + sb::attention_flops(s, true);
  const double n = double(st.iterations());
  st.counters["ms"] = n > 0 ? 1e3 * total / n : 0.0;
  st.counters["TFLOPS"] = total > 0 ? flops * n / total * 1e-12 : 0.0;
  sb::attention_bench::release(b, x);
  b.set_compute_options(sb::ComputeOptions{});
}

std::string shape_name(const Shape& s) {
  return "m" + std::to_string(s.m) + "_n" + std::to_string(s.n) + "_k" + std::to_string(s.k) + "_b" +
         std::to_string(s.batch) + "_" + (s.trans & 1 ? "T" : "N") + (s.trans & 2 ? "T" : "N");
}

// The paths a backend can time: unfused and fused everywhere; on cuda the fused op's two
// kernels by name too (bf16/fp16: FMA and tensor cores; fp32 has FMA only).
std::vector<std::pair<std::string, std::pair<sb::AttentionImpl, sb::AttentionKernel>>> attention_paths(
    const std::string& backend, sb::DType t) {
  using sb::AttentionImpl;
  using sb::AttentionKernel;
  std::vector<std::pair<std::string, std::pair<AttentionImpl, AttentionKernel>>> p = {
      {"unfused", {AttentionImpl::Unfused, AttentionKernel::Auto}}, {"fused", {AttentionImpl::Fused, AttentionKernel::Auto}}};
  if (backend == "cuda") {
    p.push_back({"fused-fma", {AttentionImpl::Fused, AttentionKernel::Fma}});
    if (t != sb::DType::F32) p.push_back({"fused-mma", {AttentionImpl::Fused, AttentionKernel::Mma}});
  }
  return p;
}

}  // namespace

int main(int argc, char** argv) {
  // --backend cpu|cuda, taken out before Google Benchmark reads the rest.
  std::string backend = "cpu";
  int kept = 1;
  for (int i = 1; i < argc; ++i) {
    if (std::strcmp(argv[i], "--backend") == 0 && i + 1 < argc) {
      backend = argv[++i];
    } else if (std::strncmp(argv[i], "--backend=", 10) == 0) {
      backend = argv[i] + 10;
    } else {
      argv[kept++] = argv[i];
    }
  }
  argc = kept;
  if (backend != "cpu" && backend != "cuda") {
    std::fprintf(stderr, "kernel_bench: error: --backend '%s' is not allowed (allowed: cpu, cuda)\n", backend.c_str());
    return 2;
  }
  const bool cuda = backend == "cuda";
  if (cuda) MPI_Init(&argc, &argv);  // the CUDA backend picks its GPU by local rank
  int rc = 0;
  try {
    the_backend() = sb::make_backend(backend);
    const int batch = env_int("SB_BENCH_BATCH", cuda ? 8 : 2), seq = env_int("SB_BENCH_SEQ", cuda ? 512 : 128);
    const sb::StepShape shape{batch, seq, seq};
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
          for (sb::OptimizerKind k : {sb::OptimizerKind::AdamW, sb::OptimizerKind::AdamW8bit, sb::OptimizerKind::Sgd})
            for (int threads : cuda ? std::vector<int>{1} : std::vector<int>{1, 2})
              benchmark::RegisterBenchmark(("optimizer/" + preset + "/encoder_block/" + sb::optimizer_name(k) +
                                            "/threads" + std::to_string(threads)).c_str(),
                                           bench_optimizer, u.numel, k, threads)
                  ->Unit(benchmark::kMicrosecond);
        }
      }
    }
    // Attention: the study models' head shapes (and t5-tiny's, small enough for a smoke
    // test), encoder self-attention with its bias table, bf16 and fp32.
    for (const std::string preset : {"t5-tiny", "t5-611m", "t5-2.28b", "t5-11.3b"}) {
      const sb::ModelSpec spec = sb::model_preset(preset);
      const sb::AttentionShape s{batch, int(spec.heads), seq, seq, int(spec.d_kv), int(spec.num_buckets), false};
      for (sb::DType t : {sb::DType::BF16, sb::DType::F32})
        for (const auto& [path, how] : attention_paths(backend, t))
          benchmark::RegisterBenchmark(("attention/" + preset + "/" + path + "/" + sb::precision_name(t)).c_str(),
                                       bench_attention, s, t, how.first, how.second)
              ->UseManualTime()
              ->Unit(benchmark::kMillisecond);
    }
    benchmark::Initialize(&argc, argv);
    if (benchmark::ReportUnrecognizedArguments(argc, argv)) {
      rc = 2;
    } else {
      benchmark::RunSpecifiedBenchmarks();
      benchmark::Shutdown();
    }
    the_backend().reset();
  } catch (const std::exception& e) {
    std::fprintf(stderr, "kernel_bench: error: %s\n", e.what());
    rc = 1;
  }
  if (cuda) MPI_Finalize();
  return rc;
}
