// The CUDA backend's kernels: one kernel per operation (rmsnorm backward has two: the row
// gradient and the column sum of the weight gradient), each followed by its launcher.
// Semantics are the CPU backend's (cpu_backend.cpp); the tests in tests/gpu compare them.
//
// Launch shapes, named in the comment above each kernel:
//   elementwise: grid-stride loop, blockDim 256, at most kMaxBlocks blocks (int64 indices);
//   row-wise (norms, softmax, cross-entropy): one block per row, blockDim row_threads(cols),
//   warp-shuffle reductions combined through shared memory.
// Every kernel is a template over the element type T (float, __nv_bfloat16, __half): it
// loads to fp32 (ld), computes in fp32 and rounds once when it stores (st), like the CPU
// backend's fp32 views. Sums across threads run in a fixed order (no floating-point atomics),
// so a gradient does not depend on scheduling.
#include <algorithm>
#include <cfloat>
#include <cstdint>

#include "cuda_check.cuh"      // CUDA_LAUNCH
#include "elem_io.cuh"          // ld, st
#include "kernels.cuh"
#include "shardbench/core/rng.h"    // uniform_pm1, shared with the CPU backend

namespace sb {
namespace cuda {
namespace {

constexpr int kThreads = 256;           // elementwise block size
constexpr int64_t kMaxBlocks = 65536;   // enough to fill any GPU; the loop covers the rest

unsigned blocks_for(int64_t n) { return unsigned(std::min<int64_t>((n + kThreads - 1) / kThreads, kMaxBlocks)); }

// Threads for one block per row of `cols` elements: about four elements per thread, a
// multiple of the warp size, 32 to 1024.
unsigned row_threads(int64_t cols) {
  const int64_t t = (cols + 3) / 4;
  return unsigned(std::min<int64_t>(1024, std::max<int64_t>(32, (t + 31) / 32 * 32)));
}


#define GRID_STRIDE(i, n) \
  for (int64_t i = int64_t(blockIdx.x) * blockDim.x + threadIdx.x; i < (n); i += int64_t(gridDim.x) * blockDim.x)

struct Sum {
  __device__ float operator()(float a, float b) const { return a + b; }
  static constexpr float identity = 0.f;
};
struct Max {
  __device__ float operator()(float a, float b) const { return fmaxf(a, b); }
  static constexpr float identity = -INFINITY;
};

template <class Op>
__device__ float warp_reduce(float v, Op op) {
  for (int o = 16; o > 0; o >>= 1) v = op(v, __shfl_xor_sync(0xffffffffu, v, o));
  return v;
}

// Reduces one value per thread over the block; every thread gets the result. blockDim.x must
// be a multiple of 32. Safe to call repeatedly in one kernel (the first barrier protects
// the partials of the previous call).
template <class Op>
__device__ float block_reduce(float v, Op op) {
  __shared__ float partial[32];
  const int lane = threadIdx.x & 31, warp = threadIdx.x >> 5, warps = blockDim.x >> 5;
  v = warp_reduce(v, op);
  __syncthreads();
  if (lane == 0) partial[warp] = v;
  __syncthreads();
  return warp_reduce(lane < warps ? partial[lane] : Op::identity, op);
}

// ---------------------------------------------------------------- embedding
// one block per token row, blockDim row_threads(d)
template <class T>
__global__ void embedding_forward_kernel(T* out, const T* table, const int* ids, int d) {
  const int64_t i = blockIdx.x;
  if (ids[i] < 0) {  // a row another tensor-parallel rank holds
    for (int j = threadIdx.x; j < d; j += blockDim.x) out[i * d + j] = st<T>(0.f);
    return;
  }
  const T* src = table + int64_t(ids[i]) * d;
  for (int j = threadIdx.x; j < d; j += blockDim.x) out[i * d + j] = src[j];
}

// one block per token i, kIdThreads threads. Ids repeat, so a table row's gradient is the
// sum of the dout rows of every token with that id. The block of the first token with id v
// owns row v (later ones exit); it finds the tokens of v in token order (a ballot over each
// slice of ids), sums their rows in that order in fp32 and adds once. No atomics, so the
// result does not depend on scheduling, and a 16-bit row is rounded once, as on the CPU.
// Scanning the ids is O(n²) int reads over all blocks: 16 M for n = 4096, from L2.
constexpr int kIdThreads = 256;
template <class T>
__global__ void embedding_backward_kernel(T* dtable, const T* dout, const int* ids, int n, int d) {
  __shared__ int hits[kIdThreads];             // tokens of this slice that carry id v, in order
  __shared__ int warp_base[kIdThreads / 32];   // exclusive scan of the warps' hit counts
  __shared__ int hit_count;
  const int first = blockIdx.x, v = ids[first];
  if (v < 0) return;  // another tensor-parallel rank's row: nothing to add
  const int lane = threadIdx.x & 31, warp = threadIdx.x >> 5;
  for (int base = 0; base < first; base += kIdThreads) {  // an earlier token owns row v?
    const int i = base + threadIdx.x;
    if (__syncthreads_or(i < first && ids[i] == v)) return;
  }
  constexpr int kCols = 8;  // columns per thread held in registers; wider rows loop
  for (int c0 = 0; c0 < d; c0 += kIdThreads * kCols) {
    float acc[kCols];
    for (int k = 0; k < kCols; ++k) acc[k] = 0.f;
    for (int base = first; base < n; base += kIdThreads) {
      const int i = base + threadIdx.x;
      const bool mine = i < n && ids[i] == v;
      const unsigned ballot = __ballot_sync(0xffffffffu, mine);
      if (lane == 0) warp_base[warp] = __popc(ballot);
      __syncthreads();
      if (threadIdx.x == 0) {
        int total = 0;
        for (int w = 0; w < kIdThreads / 32; ++w) {
          const int c = warp_base[w];
          warp_base[w] = total;
          total += c;
        }
        hit_count = total;
      }
      __syncthreads();
      if (mine) hits[warp_base[warp] + __popc(ballot & ((1u << lane) - 1u))] = i;
      __syncthreads();
      for (int h = 0; h < hit_count; ++h) {
        const T* g = dout + int64_t(hits[h]) * d;
        for (int k = 0; k < kCols; ++k) {
          const int j = c0 + k * kIdThreads + threadIdx.x;
          if (j < d) acc[k] += ld(g[j]);
        }
      }
      __syncthreads();  // hits, warp_base and hit_count are rewritten by the next slice
    }
    T* dst = dtable + int64_t(v) * d;
    for (int k = 0; k < kCols; ++k) {
      const int j = c0 + k * kIdThreads + threadIdx.x;
      if (j < d) dst[j] = st<T>(ld(dst[j]) + acc[k]);
    }
  }
}

// ---------------------------------------------------------------- RMS norm
// one block per row, blockDim row_threads(d)
// kResidual (--fused-epilogues): also residual = x, element by element as stored.
template <class T, bool kResidual = false>
__global__ void rmsnorm_forward_kernel(T* out, float* rstd, const T* x, const T* w, int d, float eps,
                                       T* residual = nullptr) {
  const int64_t i = blockIdx.x;
  const T* xi = x + i * d;
  float ss = 0.f;
  for (int j = threadIdx.x; j < d; j += blockDim.x) {
    ss += ld(xi[j]) * ld(xi[j]);
    if (kResidual) residual[i * d + j] = xi[j];
  }
  ss = block_reduce(ss, Sum());
  const float r = 1.f / sqrtf(ss / float(d) + eps);
  if (threadIdx.x == 0) rstd[i] = r;
  for (int j = threadIdx.x; j < d; j += blockDim.x) out[i * d + j] = st<T>(ld(xi[j]) * r * ld(w[j]));
}

// one block per row, blockDim row_threads(d). out_j = x_j r w_j with r = (mean x² + eps)^-1/2
// ⇒ dx_j += r (g_j w_j − x_j r² mean_k(g_k w_k x_k)).
template <class T>
__global__ void rmsnorm_backward_dx_kernel(T* dx, const T* dout, const T* x, const T* w, const float* rstd,
                                           int d) {
  const int64_t i = blockIdx.x;
  const T *xi = x + i * d, *gi = dout + i * d;
  float dot = 0.f;
  for (int j = threadIdx.x; j < d; j += blockDim.x) dot += ld(gi[j]) * ld(w[j]) * ld(xi[j]);
  dot = block_reduce(dot, Sum());
  const float r = rstd[i], c = dot / float(d) * r * r;
  for (int j = threadIdx.x; j < d; j += blockDim.x)
    dx[i * d + j] = st<T>(ld(dx[i * d + j]) + r * (ld(gi[j]) * ld(w[j]) - ld(xi[j]) * c));
}

// grid ceil(d/32), blockDim (32, 32): one 32-column strip per block over all n rows, each of
// the 32 row lanes summing every 32nd row, then the lanes summed in lane order. One writer
// per column and a fixed order: the sum does not depend on scheduling (no atomics).
template <class T>
__global__ void rmsnorm_backward_dw_kernel(T* dw, const T* dout, const T* x, const float* rstd, int n, int d) {
  __shared__ float part[32][33];  // +1 column: no bank conflicts in the final sum
  const int col = blockIdx.x * 32 + threadIdx.x;
  float acc = 0.f;
  if (col < d)
    for (int row = threadIdx.y; row < n; row += blockDim.y)
      acc += ld(dout[int64_t(row) * d + col]) * ld(x[int64_t(row) * d + col]) * rstd[row];
  part[threadIdx.y][threadIdx.x] = acc;
  __syncthreads();
  if (threadIdx.y == 0 && col < d) {
    float sum = 0.f;
    for (int k = 0; k < blockDim.y; ++k) sum += part[k][threadIdx.x];
    dw[col] = st<T>(ld(dw[col]) + sum);
  }
}

// ---------------------------------------------------------------- elementwise
// grid-stride, blockDim 256 (all of this section)
template <class T>
__global__ void relu_forward_kernel(T* x, int64_t n) {
  GRID_STRIDE(i, n) x[i] = ld(x[i]) > 0.f ? x[i] : st<T>(0.f);
}
template <class T>
__global__ void relu_backward_kernel(T* dy, const T* y, int64_t n) {
  GRID_STRIDE(i, n) dy[i] = ld(y[i]) > 0.f ? dy[i] : st<T>(0.f);
}
template <class T>
__global__ void add_kernel(T* y, const T* x, int64_t n) {
  GRID_STRIDE(i, n) y[i] = st<T>(ld(y[i]) + ld(x[i]));
}
template <class T>
__global__ void scale_kernel(T* x, float a, int64_t n) {
  GRID_STRIDE(i, n) x[i] = st<T>(ld(x[i]) * a);
}
template <class T>
__global__ void fill_kernel(T* x, float value, int64_t n) {
  const T v = st<T>(value);
  GRID_STRIDE(i, n) x[i] = v;
}
template <class D, class S>
__global__ void cast_kernel(D* dst, const S* src, int64_t n) {
  GRID_STRIDE(i, n) dst[i] = st<D>(ld(src[i]));
}
__global__ void init_uniform_kernel(float* x, int64_t n, uint64_t key, int64_t first, float scale) {
  GRID_STRIDE(i, n) x[i] = scale * uniform_pm1(key, uint64_t(first + i));
}
// ---------------------------------------------------------------- optimizers
// The host optimizer's arithmetic (backend/host_optimizer.cpp), every product, quotient and
// sum rounded on its own (__fmul_rn etc.: no FMA contraction), so an element's result is the
// host's bit for bit where the inputs are. grid-stride, blockDim 256.
template <class G, class O>
__global__ void adamw_kernel(float* p, const G* g, float* m, float* v, int64_t n, OptimizerKernelArgs a, O* copy) {
  GRID_STRIDE(i, n) {
    float pi = p[i];
    if (a.decays) pi = __fmul_rn(pi, a.decay);
    const float gi = __fmul_rn(ld(g[i]), a.unscale);
    const float mi = __fadd_rn(__fmul_rn(a.beta1, m[i]), __fmul_rn(__fsub_rn(1.f, a.beta1), gi));
    const float vi = __fadd_rn(__fmul_rn(a.beta2, v[i]), __fmul_rn(__fmul_rn(__fsub_rn(1.f, a.beta2), gi), gi));
    m[i] = mi;
    v[i] = vi;
    const float denom = __fadd_rn(__fsqrt_rn(__fmul_rn(vi, a.inv_bc2)), a.eps);
    pi = __fsub_rn(pi, __fdiv_rn(__fmul_rn(a.step_size, mi), denom));
    p[i] = pi;
    if (copy) copy[i] = st<O>(pi);
  }
}
// buf null: SGD without momentum.
template <class G, class O>
__global__ void sgd_kernel(float* p, const G* g, float* buf, int64_t n, OptimizerKernelArgs a, O* copy) {
  GRID_STRIDE(i, n) {
    float pi = p[i];
    float d = __fmul_rn(ld(g[i]), a.unscale);
    if (a.weight_decay != 0.f) d = __fadd_rn(d, __fmul_rn(a.weight_decay, pi));
    if (buf) {
      d = __fadd_rn(__fmul_rn(a.momentum, buf[i]), d);
      buf[i] = d;
    }
    pi = __fsub_rn(pi, __fmul_rn(a.lr, d));
    p[i] = pi;
    if (copy) copy[i] = st<O>(pi);
  }
}
// The last code <= x, then the nearer neighbour (host_optimizer.cpp's quantize_to_map).
__device__ __forceinline__ int quantize_to_map(const float* map, float x) {
  int lo = 0;
#pragma unroll
  for (int step = 128; step > 0; step >>= 1)
    if (map[lo + step] <= x) lo += step;
  if (lo == 0 && !(map[0] <= x)) return 0;
  if (lo < 255 && x > __fmul_rn(__fadd_rn(map[lo], map[lo + 1]), 0.5f)) ++lo;
  return lo;
}
// Blockwise 8-bit AdamW (bitsandbytes'): one CUDA block of 256 threads per block of
// kOptimizerBlock elements (grid-stride over the blocks), one element per thread; the
// absmaxes as a max over the block (exact in any order).
template <class G, class O>
__global__ void __launch_bounds__(256) adamw8bit_kernel(float* p, const G* g, uint8_t* q1, uint8_t* q2, float* absmax1,
                                                        float* absmax2, int64_t n, OptimizerKernelArgs a, DynamicMaps maps,
                                                        O* copy) {
  __shared__ float map1[256], map2[256];
  __shared__ float warp_max1[8], warp_max2[8];
  map1[threadIdx.x] = maps.signed_map[threadIdx.x];
  map2[threadIdx.x] = maps.unsigned_map[threadIdx.x];
  __syncthreads();
  const int64_t blocks = (n + 255) / 256;
  for (int64_t b = blockIdx.x; b < blocks; b += gridDim.x) {
    const int64_t i = b * 256 + threadIdx.x;
    const bool valid = i < n;
    const float a1 = absmax1[b], a2 = absmax2[b];
    float s1 = 0.f, s2 = 0.f;
    if (valid) {
      const float gi = __fmul_rn(ld(g[i]), a.unscale);
      s2 = __fadd_rn(__fmul_rn(__fmul_rn(map2[q2[i]], a2), a.beta2), __fmul_rn(__fmul_rn(__fsub_rn(1.f, a.beta2), gi), gi));
      s1 = __fadd_rn(__fmul_rn(__fmul_rn(map1[q1[i]], a1), a.beta1), __fmul_rn(__fsub_rn(1.f, a.beta1), gi));
    }
    float m1 = fabsf(s1), m2 = fabsf(s2);
#pragma unroll
    for (int o = 16; o > 0; o >>= 1) {
      m1 = fmaxf(m1, __shfl_xor_sync(0xffffffffu, m1, o));
      m2 = fmaxf(m2, __shfl_xor_sync(0xffffffffu, m2, o));
    }
    if (threadIdx.x % 32 == 0) warp_max1[threadIdx.x / 32] = m1, warp_max2[threadIdx.x / 32] = m2;
    __syncthreads();  // every thread has read the old absmaxes, every warp its maximum
    m1 = warp_max1[0], m2 = warp_max2[0];
#pragma unroll
    for (int w = 1; w < 8; ++w) m1 = fmaxf(m1, warp_max1[w]), m2 = fmaxf(m2, warp_max2[w]);
    if (valid) {
      float pi = __fadd_rn(p[i], __fmul_rn(a.step_size, __fdiv_rn(s1, __fadd_rn(__fsqrt_rn(s2), a.eps))));
      if (a.decays) pi = __fmul_rn(pi, a.decay);
      p[i] = pi;
      if (copy) copy[i] = st<O>(pi);
      int c1 = quantize_to_map(map1, __fdiv_rn(s1, m1 > 0.f ? m1 : 1.f));
      if (s1 > 0.f && map1[c1] < 0.f) ++c1;
      else if (s1 < 0.f && map1[c1] >= 0.f) --c1;
      q1[i] = uint8_t(c1);
      q2[i] = uint8_t(quantize_to_map(map2, __fdiv_rn(s2, m2 > 0.f ? m2 : 1.f)));
    }
    if (threadIdx.x == 0) absmax1[b] = m1, absmax2[b] = m2;
    __syncthreads();  // warp_max is reused by the next block
  }
}

// ---------------------------------------------------------------- position bias
// grid-stride over H*tq*tk, blockDim 256
template <class T>
__global__ void position_bias_forward_kernel(T* bias, const T* table, const int* buckets, int heads, int64_t tt) {
  GRID_STRIDE(idx, heads * tt) {
    const int64_t h = idx / tt, ij = idx % tt;
    bias[idx] = table[int64_t(buckets[ij]) * heads + h];
  }
}

// grid (kBucketBlocks, H), blockDim 256. T5's bucket of (i, j) depends on j − i only, so a
// bucket is a set of diagonals: block x owns buckets x, x + kBucketBlocks, ... (T5 has 32,
// one each); thread t sums the diagonals t, t+256, ... of the bucket in row order (a warp
// reads consecutive diagonals of one row: coalesced), then the block sums its threads in a
// fixed tree. One writer per table entry and no atomics: the result is deterministic.
constexpr int kBucketBlocks = 32;
template <class T>
__global__ void position_bias_backward_kernel(T* dtable, const T* dbias, const int* buckets, int heads, int tq,
                                              int tk) {
  const int h = blockIdx.y;
  const T* g = dbias + int64_t(h) * tq * tk;
  auto bucket_of = [&](int diag) {  // diag = j − i, read where the diagonal starts
    const int i0 = diag < 0 ? -diag : 0;
    return buckets[int64_t(i0) * tk + i0 + diag];
  };
  float top = -1.f;
  for (int diag = int(threadIdx.x) - (tq - 1); diag < tk; diag += blockDim.x) top = fmaxf(top, float(bucket_of(diag)));
  const int last = int(block_reduce(top, Max()));
  for (int bucket = blockIdx.x; bucket <= last; bucket += gridDim.x) {
    float acc = 0.f;
    for (int diag = int(threadIdx.x) - (tq - 1); diag < tk; diag += blockDim.x) {
      if (bucket_of(diag) != bucket) continue;
      for (int i = diag < 0 ? -diag : 0; i < tq && i + diag < tk; ++i) acc += ld(g[int64_t(i) * tk + i + diag]);
    }
    acc = block_reduce(acc, Sum());
    if (threadIdx.x == 0) {
      T* dst = dtable + int64_t(bucket) * heads + h;
      *dst = st<T>(ld(*dst) + acc);
    }
  }
}

// ---------------------------------------------------------------- softmax
// one block per row of [B*H*tq, tk], blockDim row_threads(tk). The row is read three times
// (max, sum, result) and written once, so a 16-bit row is rounded once, as on the CPU.
template <class T>
__global__ void softmax_forward_kernel(T* scores, const T* bias, bool causal, int heads, int tq, int tk) {
  const int64_t row = blockIdx.x;
  const int i = int(row % tq), h = int(row / tq % heads);
  T* s = scores + row * tk;
  const T* b = bias ? bias + (int64_t(h) * tq + i) * tk : nullptr;
  const int valid = causal ? min(tk, i + 1) : tk;  // keys j > i are masked
  auto logit = [&](int j) { return b ? ld(s[j]) + ld(b[j]) : ld(s[j]); };
  float mx = -INFINITY;
  for (int j = threadIdx.x; j < valid; j += blockDim.x) mx = fmaxf(mx, logit(j));
  mx = block_reduce(mx, Max());
  float sum = 0.f;
  for (int j = threadIdx.x; j < valid; j += blockDim.x) sum += expf(logit(j) - mx);
  const float inv = 1.f / block_reduce(sum, Sum());
  __syncthreads();  // every thread has read its logits before any is overwritten
  for (int j = threadIdx.x; j < tk; j += blockDim.x) s[j] = st<T>(j < valid ? expf(logit(j) - mx) * inv : 0.f);
}

// one block per (head, query) row, blockDim row_threads(tk), dynamic shared memory `batch`
// floats rounded up to a multiple of four. First the batch's row dots Σ dP⊙P, then each thread owns its columns j of dbias and
// sums the batch in fp32 (no atomics, the CPU backend's order, one rounding).
template <class T>
__global__ void softmax_backward_kernel(T* ds, const T* p, T* dbias, int batch, int heads, int tq, int tk) {
  extern __shared__ float dots[];
  const int64_t hi = blockIdx.x;  // h * tq + i
  const int h = int(hi / tq), i = int(hi % tq);
  auto offset = [&](int bi) { return ((int64_t(bi) * heads + h) * tq + i) * tk; };
  for (int bi = 0; bi < batch; ++bi) {
    const T *g = ds + offset(bi), *pr = p + offset(bi);
    float dot = 0.f;
    for (int j = threadIdx.x; j < tk; j += blockDim.x) dot += ld(g[j]) * ld(pr[j]);
    dot = block_reduce(dot, Sum());
    if (threadIdx.x == 0) dots[bi] = dot;
  }
  __syncthreads();
  T* db = dbias ? dbias + hi * tk : nullptr;
  for (int j = threadIdx.x; j < tk; j += blockDim.x) {
    float acc = db ? ld(db[j]) : 0.f;
    for (int bi = 0; bi < batch; ++bi) {
      const int64_t o = offset(bi) + j;
      const float gj = ld(p[o]) * (ld(ds[o]) - dots[bi]);
      ds[o] = st<T>(gj);
      acc += gj;
    }
    if (db) db[j] = st<T>(acc);
  }
}

// ---------------------------------------------------------------- cross-entropy
// one block per token row of [n, vocab], blockDim row_threads(vocab) (1024 for T5's 32128).
// Read for the max and the sum, written once with the gradient.
template <class T>
__global__ void cross_entropy_kernel(T* logits, float* losses, const int* labels, int vocab, float grad_scale) {
  const int64_t i = blockIdx.x;
  T* row = logits + i * vocab;
  const int label = labels[i];
  float mx = -INFINITY;
  for (int j = threadIdx.x; j < vocab; j += blockDim.x) mx = fmaxf(mx, ld(row[j]));
  mx = block_reduce(mx, Max());
  const float target = ld(row[label]) - mx;
  float sum = 0.f;
  for (int j = threadIdx.x; j < vocab; j += blockDim.x) sum += expf(ld(row[j]) - mx);
  sum = block_reduce(sum, Sum());  // its barriers: every read above precedes the writes below
  if (threadIdx.x == 0) losses[i] = logf(sum) - target;
  const float k = grad_scale / sum;
  for (int j = threadIdx.x; j < vocab; j += blockDim.x) {
    const float gj = expf(ld(row[j]) - mx) * k;
    row[j] = st<T>(j == label ? gj - grad_scale : gj);
  }
}

// Vocabulary-parallel cross-entropy (Megatron-LM): one block per row of this rank's logits
// [n, vocab]; the group all-reduces row_max and sums between the three kernels.
template <class T>
__global__ void cross_entropy_max_kernel(const T* logits, float* row_max, int vocab) {
  const int64_t i = blockIdx.x;
  const T* row = logits + i * vocab;
  float mx = -INFINITY;
  for (int j = threadIdx.x; j < vocab; j += blockDim.x) mx = fmaxf(mx, ld(row[j]));
  mx = block_reduce(mx, Max());
  if (threadIdx.x == 0) row_max[i] = mx;
}
template <class T>
__global__ void cross_entropy_sums_kernel(const T* logits, const float* row_max, const int* labels, float* sums,
                                          int n, int vocab) {
  const int64_t i = blockIdx.x;
  const T* row = logits + i * vocab;
  const float mx = row_max[i];
  float sum = 0.f;
  for (int j = threadIdx.x; j < vocab; j += blockDim.x) sum += expf(ld(row[j]) - mx);
  sum = block_reduce(sum, Sum());
  if (threadIdx.x == 0) {
    sums[i] = sum;
    sums[n + i] = labels[i] >= 0 ? ld(row[labels[i]]) : 0.f;
  }
}
template <class T>
__global__ void cross_entropy_finish_kernel(T* logits, float* losses, const float* row_max, const float* sums,
                                            const int* labels, int n, int vocab, float grad_scale) {
  const int64_t i = blockIdx.x;
  T* row = logits + i * vocab;
  const float mx = row_max[i], sum = sums[i];
  const int label = labels[i];
  if (threadIdx.x == 0) losses[i] = logf(sum) + mx - sums[n + i];
  const float k = grad_scale / sum;
  for (int j = threadIdx.x; j < vocab; j += blockDim.x) {
    const float gj = expf(ld(row[j]) - mx) * k;
    row[j] = st<T>(j == label ? gj - grad_scale : gj);
  }
}

template <class T>
__global__ void flag_nonfinite_kernel(const T* x, int64_t n, int* flag) {
  GRID_STRIDE(i, n) if (!isfinite(ld(x[i]))) *flag = 1;  // benign race: every writer stores 1
}

__global__ void probe_kernel() {}

}  // namespace

template <class T>
void embedding_forward(cudaStream_t s, T* out, const T* table, const int* ids, int n, int d) {
  if (n <= 0 || d <= 0) return;
  CUDA_LAUNCH(embedding_forward_kernel<<<n, row_threads(d), 0, s>>>(out, table, ids, d));
}

template <class T>
void embedding_backward(cudaStream_t s, T* dtable, const T* dout, const int* ids, int n, int d) {
  if (n <= 0 || d <= 0) return;
  CUDA_LAUNCH(embedding_backward_kernel<<<n, kIdThreads, 0, s>>>(dtable, dout, ids, n, d));
}

template <class T>
void rmsnorm_forward(cudaStream_t s, T* out, float* rstd, const T* x, const T* w, int n, int d, float eps) {
  if (n <= 0 || d <= 0) return;
  CUDA_LAUNCH(rmsnorm_forward_kernel<<<n, row_threads(d), 0, s>>>(out, rstd, x, w, d, eps));
}

template <class T>
void rmsnorm_forward_residual(cudaStream_t s, T* out, float* rstd, T* residual, const T* x, const T* w, int n, int d,
                              float eps) {
  if (n <= 0 || d <= 0) return;
  CUDA_LAUNCH(rmsnorm_forward_kernel<T, true><<<n, row_threads(d), 0, s>>>(out, rstd, x, w, d, eps, residual));
}

template <class T>
void rmsnorm_backward(cudaStream_t s, T* dx, T* dw, const T* dout, const T* x, const T* w, const float* rstd,
                      int n, int d) {
  if (n <= 0 || d <= 0) return;
  CUDA_LAUNCH(rmsnorm_backward_dx_kernel<<<n, row_threads(d), 0, s>>>(dx, dout, x, w, rstd, d));
  CUDA_LAUNCH(rmsnorm_backward_dw_kernel<<<unsigned((d + 31) / 32), dim3(32, 32), 0, s>>>(dw, dout, x, rstd, n, d));
}

template <class T>
void relu_forward(cudaStream_t s, T* x, int64_t n) {
  if (n > 0) CUDA_LAUNCH(relu_forward_kernel<<<blocks_for(n), kThreads, 0, s>>>(x, n));
}
template <class T>
void relu_backward(cudaStream_t s, T* dy, const T* y, int64_t n) {
  if (n > 0) CUDA_LAUNCH(relu_backward_kernel<<<blocks_for(n), kThreads, 0, s>>>(dy, y, n));
}
template <class T>
void add(cudaStream_t s, T* y, const T* x, int64_t n) {
  if (n > 0) CUDA_LAUNCH(add_kernel<<<blocks_for(n), kThreads, 0, s>>>(y, x, n));
}
template <class T>
void scale(cudaStream_t s, T* x, float a, int64_t n) {
  if (n > 0) CUDA_LAUNCH(scale_kernel<<<blocks_for(n), kThreads, 0, s>>>(x, a, n));
}
template <class T>
void fill(cudaStream_t s, T* x, float value, int64_t n) {
  if (n > 0) CUDA_LAUNCH(fill_kernel<<<blocks_for(n), kThreads, 0, s>>>(x, value, n));
}
template <class D, class S>
void cast(cudaStream_t s, D* dst, const S* src, int64_t n) {
  if (n > 0) CUDA_LAUNCH(cast_kernel<<<blocks_for(n), kThreads, 0, s>>>(dst, src, n));
}
void init_uniform(cudaStream_t s, float* x, int64_t n, uint64_t key, int64_t first, float scale) {
  if (n > 0) CUDA_LAUNCH(init_uniform_kernel<<<blocks_for(n), kThreads, 0, s>>>(x, n, key, first, scale));
}
template <class G, class O>
void optimizer_update(cudaStream_t s, int kind, const OptimizerKernelArgs& a, float* p, const G* g, void* state,
                      int64_t n, const DynamicMaps& maps, O* copy) {
  if (n <= 0) return;
  if (kind == 0) {  // adamw: m[n], v[n]
    float* m = static_cast<float*>(state);
    CUDA_LAUNCH(adamw_kernel<<<blocks_for(n), kThreads, 0, s>>>(p, g, m, m + n, n, a, copy));
  } else if (kind == 1) {  // adamw-8bit: absmax1[B], absmax2[B], code1[n], code2[n]
    const int64_t blocks = (n + 255) / 256;
    float* absmax1 = static_cast<float*>(state);
    uint8_t* q1 = reinterpret_cast<uint8_t*>(absmax1 + 2 * blocks);
    CUDA_LAUNCH(adamw8bit_kernel<<<unsigned(std::min<int64_t>(blocks, kMaxBlocks)), 256, 0, s>>>(
        p, g, q1, q1 + n, absmax1, absmax1 + blocks, n, a, maps, copy));
  } else {  // sgd: momentum buffer[n], or none
    CUDA_LAUNCH(sgd_kernel<<<blocks_for(n), kThreads, 0, s>>>(p, g, static_cast<float*>(state), n, a, copy));
  }
}

template <class T>
void position_bias_forward(cudaStream_t s, T* bias, const T* table, const int* buckets, int heads, int tq,
                           int tk) {
  const int64_t tt = int64_t(tq) * tk;
  if (heads <= 0 || tt <= 0) return;
  CUDA_LAUNCH(position_bias_forward_kernel<<<blocks_for(heads * tt), kThreads, 0, s>>>(bias, table, buckets,
                                                                                        heads, tt));
}

template <class T>
void position_bias_backward(cudaStream_t s, T* dtable, const T* dbias, const int* buckets, int heads, int tq,
                            int tk) {
  const int64_t tt = int64_t(tq) * tk;
  if (heads <= 0 || tt <= 0) return;
  const dim3 grid{unsigned(kBucketBlocks), unsigned(heads)};
  CUDA_LAUNCH(position_bias_backward_kernel<<<grid, kThreads, 0, s>>>(dtable, dbias, buckets, heads, tq, tk));
}

template <class T>
void softmax_forward(cudaStream_t s, T* scores, const T* bias, bool causal, int batch, int heads, int tq,
                     int tk) {
  const int64_t rows = int64_t(batch) * heads * tq;
  if (rows <= 0 || tk <= 0) return;
  CUDA_LAUNCH(softmax_forward_kernel<<<unsigned(rows), row_threads(tk), 0, s>>>(scores, bias, causal, heads,
                                                                                tq, tk));
}

template <class T>
void softmax_backward(cudaStream_t s, T* dscores, const T* probs, T* dbias, int batch, int heads, int tq,
                      int tk) {
  const int64_t rows = int64_t(heads) * tq;
  if (batch <= 0 || rows <= 0 || tk <= 0) return;
  // The compiler reads dots[] in vectors of up to four (an unrolled loop over the batch, its
  // remainder merged into one wide load): round the array up to whole vectors, or memcheck
  // sees a read past its end when the batch is not a multiple of four.
  const size_t dots_bytes = size_t((batch + 3) / 4 * 4) * sizeof(float);
  CUDA_LAUNCH(softmax_backward_kernel<<<unsigned(rows), row_threads(tk), dots_bytes, s>>>(
      dscores, probs, dbias, batch, heads, tq, tk));
}

template <class T>
void flag_nonfinite(cudaStream_t s, const T* x, int64_t n, int* flag) {
  if (n > 0) CUDA_LAUNCH(flag_nonfinite_kernel<<<blocks_for(n), kThreads, 0, s>>>(x, n, flag));
}

template <class T>
void cross_entropy(cudaStream_t s, T* logits, float* losses, const int* labels, int n, int vocab,
                   float grad_scale) {
  if (n <= 0 || vocab <= 0) return;
  CUDA_LAUNCH(cross_entropy_kernel<<<n, row_threads(vocab), 0, s>>>(logits, losses, labels, vocab, grad_scale));
}

template <class T>
void cross_entropy_max(cudaStream_t s, const T* logits, float* row_max, int n, int vocab) {
  if (n <= 0 || vocab <= 0) return;
  CUDA_LAUNCH(cross_entropy_max_kernel<<<n, row_threads(vocab), 0, s>>>(logits, row_max, vocab));
}
template <class T>
void cross_entropy_sums(cudaStream_t s, const T* logits, const float* row_max, const int* labels, float* sums, int n,
                        int vocab) {
  if (n <= 0 || vocab <= 0) return;
  CUDA_LAUNCH(cross_entropy_sums_kernel<<<n, row_threads(vocab), 0, s>>>(logits, row_max, labels, sums, n, vocab));
}
template <class T>
void cross_entropy_finish(cudaStream_t s, T* logits, float* losses, const float* row_max, const float* sums,
                          const int* labels, int n, int vocab, float grad_scale) {
  if (n <= 0 || vocab <= 0) return;
  CUDA_LAUNCH(cross_entropy_finish_kernel<<<n, row_threads(vocab), 0, s>>>(logits, losses, row_max, sums, labels, n,
                                                                            vocab, grad_scale));
}

// Every launcher for every element type the backend dispatches to.
#define SB_KERNELS_FOR(T)                                                                                  \
  template void embedding_forward<T>(cudaStream_t, T*, const T*, const int*, int, int);                   \
  template void embedding_backward<T>(cudaStream_t, T*, const T*, const int*, int, int);                  \
  template void rmsnorm_forward<T>(cudaStream_t, T*, float*, const T*, const T*, int, int, float);        \
  template void rmsnorm_forward_residual<T>(cudaStream_t, T*, float*, T*, const T*, const T*, int, int, float); \
  template void rmsnorm_backward<T>(cudaStream_t, T*, T*, const T*, const T*, const T*, const float*, int, \
                                    int);                                                                  \
  template void relu_forward<T>(cudaStream_t, T*, int64_t);                                               \
  template void relu_backward<T>(cudaStream_t, T*, const T*, int64_t);                                    \
  template void add<T>(cudaStream_t, T*, const T*, int64_t);                                              \
  template void scale<T>(cudaStream_t, T*, float, int64_t);                                               \
  template void fill<T>(cudaStream_t, T*, float, int64_t);                                                \
  template void cast<T, float>(cudaStream_t, T*, const float*, int64_t);                                  \
  template void cast<T, __nv_bfloat16>(cudaStream_t, T*, const __nv_bfloat16*, int64_t);                  \
  template void cast<T, __half>(cudaStream_t, T*, const __half*, int64_t);                                \
  template void optimizer_update<T, float>(cudaStream_t, int, const OptimizerKernelArgs&, float*, const T*, void*, \
                                          int64_t, const DynamicMaps&, float*);                            \
  template void optimizer_update<T, __nv_bfloat16>(cudaStream_t, int, const OptimizerKernelArgs&, float*, const T*, \
                                                  void*, int64_t, const DynamicMaps&, __nv_bfloat16*);     \
  template void optimizer_update<T, __half>(cudaStream_t, int, const OptimizerKernelArgs&, float*, const T*, void*, \
                                           int64_t, const DynamicMaps&, __half*);                          \
  template void position_bias_forward<T>(cudaStream_t, T*, const T*, const int*, int, int, int);          \
  template void position_bias_backward<T>(cudaStream_t, T*, const T*, const int*, int, int, int);         \
  template void softmax_forward<T>(cudaStream_t, T*, const T*, bool, int, int, int, int);                 \
  template void softmax_backward<T>(cudaStream_t, T*, const T*, T*, int, int, int, int);                  \
  template void cross_entropy<T>(cudaStream_t, T*, float*, const int*, int, int, float);          \
  template void cross_entropy_max<T>(cudaStream_t, const T*, float*, int, int);                         \
  template void cross_entropy_sums<T>(cudaStream_t, const T*, const float*, const int*, float*, int, int); \
  template void cross_entropy_finish<T>(cudaStream_t, T*, float*, const float*, const float*, const int*, int, \
                                        int, float);                                                       \
  template void flag_nonfinite<T>(cudaStream_t, const T*, int64_t, int*);
SB_KERNELS_FOR(float)
SB_KERNELS_FOR(__nv_bfloat16)
SB_KERNELS_FOR(__half)
#undef SB_KERNELS_FOR

cudaError_t probe_kernel_image(cudaStream_t s) {
  probe_kernel<<<1, 1, 0, s>>>();
  const cudaError_t rc = cudaGetLastError();
  return rc == cudaSuccess ? cudaStreamSynchronize(s) : rc;
}

// ---------------------------------------------------------------- gated-GELU gate (T5 v1.1)
// grid-stride, blockDim 256. The CPU backend's arithmetic (cpu_backend.cpp, gelu_tanh): fp32,
// tanhf, the same order of operations; each thread reads its element of every input before
// it writes, so du may alias dh.
namespace {
constexpr float kGeluK = 0.7978845608028654f;  // sqrt(2 / pi)
constexpr float kGeluA = 0.044715f;

__device__ __forceinline__ void gelu_tanh(float x, float& g, float& dg) {
  const float t = tanhf(kGeluK * (x + kGeluA * x * x * x));
  g = 0.5f * x * (1.f + t);
  dg = 0.5f * (1.f + t) + 0.5f * x * (1.f - t * t) * kGeluK * (1.f + 3.f * kGeluA * x * x);
}

template <class T>
__global__ void gated_gelu_forward_kernel(T* h, const T* u, const T* v, int64_t n) {
  GRID_STRIDE(i, n) {
    float g, dg;
    gelu_tanh(ld(u[i]), g, dg);
    h[i] = st<T>(g * ld(v[i]));
  }
}

template <class T>
__global__ void gated_gelu_backward_kernel(T* du, T* dv, const T* dh, const T* u, const T* v, int64_t n) {
  GRID_STRIDE(i, n) {
    float g, dg;
    gelu_tanh(ld(u[i]), g, dg);
    const float d = ld(dh[i]), vi = ld(v[i]);
    dv[i] = st<T>(d * g);
    du[i] = st<T>(d * vi * dg);
  }
}
}  // namespace

template <class T>
void gated_gelu_forward(cudaStream_t s, T* h, const T* u, const T* v, int64_t n) {
  if (n > 0) CUDA_LAUNCH(gated_gelu_forward_kernel<<<blocks_for(n), kThreads, 0, s>>>(h, u, v, n));
}
template <class T>
void gated_gelu_backward(cudaStream_t s, T* du, T* dv, const T* dh, const T* u, const T* v, int64_t n) {
  if (n > 0) CUDA_LAUNCH(gated_gelu_backward_kernel<<<blocks_for(n), kThreads, 0, s>>>(du, dv, dh, u, v, n));
}

#define SB_GATED_GELU_FOR(T)                                                                       \
  template void gated_gelu_forward<T>(cudaStream_t, T*, const T*, const T*, int64_t);            \
  template void gated_gelu_backward<T>(cudaStream_t, T*, T*, const T*, const T*, const T*, int64_t);
SB_GATED_GELU_FOR(float)
SB_GATED_GELU_FOR(__nv_bfloat16)
SB_GATED_GELU_FOR(__half)
#undef SB_GATED_GELU_FOR

}  // namespace cuda
}  // namespace sb
