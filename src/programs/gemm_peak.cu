// gemm_peak: the cuBLAS GEMM rate this GPU reaches in this process, the denominator of
// "MFU vs measured peak" in scripts/gpu-check.sh. Square GEMMs (default 8192³) in
//   bf16  bf16 in/out, fp32 accumulation  (what mixed-precision training runs at)
//   tf32  fp32 in/out on TF32 tensor cores (the CUDA backend with SB_CUDA_TF32=1)
//   fp32  fp32 in/out, fp32 math           (the CUDA backend's default)
// each warmed up, then timed over --iters launches between two CUDA events. A figure is
// printed only after sampled entries of C were checked against a double-precision dot
// product of the same (rounded) inputs. Output for machines, one line per dtype:
//   PEAK dtype=bf16 m=8192 n=8192 k=8192 iters=20 ms=1.2340 tflops=891.02 check=ok max_rel_err=1.1e-03
// Exit 0; 1 when no GPU is visible or a check fails; 2 for a bad flag.
#include <cublas_v2.h>     // cublasGemmEx
#include <cuda_bf16.h>     // __nv_bfloat16 and its host/device conversions
#include <cuda_runtime.h>  // devices, events, memory

#include <algorithm>
#include <cmath>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <string>
#include <vector>

#include "shardbench/core/rng.h"  // uniform_pm1: deterministic inputs, reproducible on the host

namespace {

[[noreturn]] void die(const std::string& msg, int code = 1) {
  std::fprintf(stderr, "gemm_peak: error: %s\n", msg.c_str());
  std::exit(code);
}

void cuda_ok(cudaError_t rc, const char* call) {
  if (rc != cudaSuccess) die(std::string(call) + " failed: " + cudaGetErrorName(rc) + " (" + cudaGetErrorString(rc) + ")");
}
void cublas_ok(cublasStatus_t rc, const char* call) {
  if (rc != CUBLAS_STATUS_SUCCESS) die(std::string(call) + " failed: " + cublasGetStatusName(rc));
}
#define CUDA_OK(call) cuda_ok((call), #call)
#define CUBLAS_OK(call) cublas_ok((call), #call)

struct Options {
  int size = 8192, iters = 20, warmup = 5;
  std::vector<std::string> dtypes = {"bf16", "tf32", "fp32"};
};

Options parse(int argc, char** argv) {
  Options o;
  for (int i = 1; i < argc; ++i) {
    const std::string a = argv[i];
    auto value = [&]() -> std::string {
      if (i + 1 >= argc) die(a + " needs a value", 2);
      return argv[++i];
    };
    if (a == "--size") o.size = std::atoi(value().c_str());
    else if (a == "--iters") o.iters = std::atoi(value().c_str());
    else if (a == "--warmup") o.warmup = std::atoi(value().c_str());
    else if (a == "--dtype") o.dtypes = {value()};
    else if (a == "--help") {
      std::printf("usage: gemm_peak [--size N (8192)] [--iters N (20)] [--warmup N (5)] [--dtype bf16|tf32|fp32]\n");
      std::exit(0);
    } else die("unknown flag '" + a + "' (see --help)", 2);
  }
  if (o.size <= 0 || o.iters <= 0 || o.warmup < 0) die("--size and --iters must be > 0, --warmup >= 0", 2);
  for (const auto& d : o.dtypes)
    if (d != "bf16" && d != "tf32" && d != "fp32") die("--dtype '" + d + "' is not allowed (bf16, tf32, fp32)", 2);
  return o;
}

// Element i of input matrix `key`, as the GPU holds it (rounded to bf16 where it is bf16).
float input_value(uint64_t key, int64_t i, bool bf16) {
  const float v = sb::uniform_pm1(key, uint64_t(i));
  return bf16 ? __bfloat162float(__float2bfloat16(v)) : v;
}

// one thread per element, grid-stride, blockDim 256
__global__ void init_kernel(float* x, int64_t n, uint64_t key) {
  for (int64_t i = int64_t(blockIdx.x) * blockDim.x + threadIdx.x; i < n; i += int64_t(gridDim.x) * blockDim.x)
    x[i] = sb::uniform_pm1(key, uint64_t(i));
}
__global__ void init_kernel(__nv_bfloat16* x, int64_t n, uint64_t key) {
  for (int64_t i = int64_t(blockIdx.x) * blockDim.x + threadIdx.x; i < n; i += int64_t(gridDim.x) * blockDim.x)
    x[i] = __float2bfloat16(sb::uniform_pm1(key, uint64_t(i)));
}

struct Result {
  double ms = 0, tflops = 0, max_err = 0;  // max_err: of the sampled entries, see run()
  bool ok = false;
};

// Times C = A·B (column-major, n×n) in one dtype and checks 16 sampled entries of C.
template <class T>
Result run(cublasHandle_t h, const Options& o, cudaDataType_t type, cublasComputeType_t compute, double tol) {
  const int n = o.size;
  const int64_t nn = int64_t(n) * n;
  const bool bf16 = type == CUDA_R_16BF;
  T *A, *B, *C;
  CUDA_OK(cudaMalloc(&A, nn * sizeof(T)));
  CUDA_OK(cudaMalloc(&B, nn * sizeof(T)));
  CUDA_OK(cudaMalloc(&C, nn * sizeof(T)));
  init_kernel<<<4096, 256>>>(A, nn, 1);
  init_kernel<<<4096, 256>>>(B, nn, 2);
  CUDA_OK(cudaGetLastError());
  const float alpha = 1.f, beta = 0.f;
  auto gemm = [&] {
    CUBLAS_OK(cublasGemmEx(h, CUBLAS_OP_N, CUBLAS_OP_N, n, n, n, &alpha, A, type, n, B, type, n, &beta, C, type, n,
                           compute, CUBLAS_GEMM_DEFAULT));
  };
  for (int i = 0; i < o.warmup; ++i) gemm();
  cudaEvent_t t0, t1;
  CUDA_OK(cudaEventCreate(&t0));
  CUDA_OK(cudaEventCreate(&t1));
  CUDA_OK(cudaEventRecord(t0));
  for (int i = 0; i < o.iters; ++i) gemm();
  CUDA_OK(cudaEventRecord(t1));
  CUDA_OK(cudaEventSynchronize(t1));
  float ms = 0;
  CUDA_OK(cudaEventElapsedTime(&ms, t0, t1));
  Result r;
  r.ms = ms / o.iters;
  r.tflops = 2.0 * n * double(n) * n / (r.ms * 1e-3) / 1e12;

  // Check 16 entries spread over C against a double-precision sum of the same inputs.
  // Error scale: |C_ij| plus the typical size of a sum of n random terms, sqrt(Σ_k p_k²),
  // so a wrong (e.g. zero) result scores about 0.5 whatever its size.
  r.ok = true;
  for (int s = 0; s < 16; ++s) {
    const int i = int(sb::hash_index(7, 2 * s) % n), j = int(sb::hash_index(7, 2 * s + 1) % n);
    T got_raw;
    CUDA_OK(cudaMemcpy(&got_raw, C + i + int64_t(j) * n, sizeof(T), cudaMemcpyDeviceToHost));
    double ref = 0, sq = 0;
    for (int k = 0; k < n; ++k) {
      const double p = double(input_value(1, i + int64_t(k) * n, bf16)) * input_value(2, k + int64_t(j) * n, bf16);
      ref += p;
      sq += p * p;
    }
    double got;
    if constexpr (sizeof(T) == 2) got = __bfloat162float(got_raw);
    else got = got_raw;
    const double err = std::fabs(got - ref) / (std::fabs(ref) + std::sqrt(sq));
    r.max_err = std::max(r.max_err, err);
    r.ok = r.ok && err <= tol;  // a NaN fails too
  }
  CUDA_OK(cudaEventDestroy(t0));
  CUDA_OK(cudaEventDestroy(t1));
  for (T* p : {A, B, C}) CUDA_OK(cudaFree(p));
  return r;
}

}  // namespace

int main(int argc, char** argv) {
  const Options o = parse(argc, argv);
  int count = 0;
  const cudaError_t rc = cudaGetDeviceCount(&count);
  if (rc != cudaSuccess)
    die(std::string("no CUDA device visible: cudaGetDeviceCount() failed: ") + cudaGetErrorName(rc) + " (" +
        cudaGetErrorString(rc) + "); check nvidia-smi and CUDA_VISIBLE_DEVICES");
  if (count == 0) die("no CUDA device visible (cudaGetDeviceCount() = 0; check CUDA_VISIBLE_DEVICES)");
  cudaDeviceProp p{};
  CUDA_OK(cudaGetDeviceProperties(&p, 0));
  int driver = 0, runtime = 0;
  CUDA_OK(cudaDriverGetVersion(&driver));
  CUDA_OK(cudaRuntimeGetVersion(&runtime));
  std::printf("DEVICE index=0 name=\"%s\" sm=%d%d memory_gib=%.1f sms=%d driver=%d runtime=%d\n", p.name, p.major,
              p.minor, double(p.totalGlobalMem) / (1 << 30), p.multiProcessorCount, driver, runtime);
  cublasHandle_t h;
  CUBLAS_OK(cublasCreate(&h));
  bool all_ok = true;
  for (const std::string& d : o.dtypes) {
    // Tolerances (see run()): bf16 output rounding (2^-9 relative) dominates; TF32 rounds
    // each input to 10 mantissa bits (about 1e-3 per product); fp32 only accumulates.
    Result r;
    if (d == "bf16") r = run<__nv_bfloat16>(h, o, CUDA_R_16BF, CUBLAS_COMPUTE_32F, 1e-2);
    if (d == "tf32") r = run<float>(h, o, CUDA_R_32F, CUBLAS_COMPUTE_32F_FAST_TF32, 2e-2);
    if (d == "fp32") r = run<float>(h, o, CUDA_R_32F, CUBLAS_COMPUTE_32F, 1e-4);
    std::printf("PEAK dtype=%s m=%d n=%d k=%d iters=%d ms=%.4f tflops=%.2f check=%s max_rel_err=%.2e\n", d.c_str(),
                o.size, o.size, o.size, o.iters, r.ms, r.tflops, r.ok ? "ok" : "FAILED", r.max_err);
    std::fflush(stdout);
    all_ok = all_ok && r.ok;
  }
  CUBLAS_OK(cublasDestroy(h));
  if (!all_ok) die("a GEMM result differs from the double-precision reference (see check=FAILED)");
  return 0;
}
