// Fused T5 attention: flash-attention-2 style kernels with the relative position bias read
// from the bias table inside, fp32 accumulation, no [tq, tk] tensor in global memory.
//
// Work split (every kernel: blockIdx.z = batch, blockIdx.y = head). Four threads (a "quad",
// adjacent lanes) share one query row or one key: lane g of the quad holds the head
// elements c = g, g+4, g+8, ... in registers, a dot product is four partial sums joined by
// two shuffles. Padding to D (32, 64 or 128 ≥ d_kv) is zeros.
//   forward      one block per 64 query rows; keys in shared-memory tiles of 32; online
//                softmax (running max m, sum l, rescaled accumulator); writes o and
//                lse = m + log l.
//   backward     1. row_dot: Σ dO⊙O per query row (one warp per row).
//                2. kv:  one block per key chunk of kAttentionKeyChunk (64) keys; query
//                   rows in shared-memory tiles of 16, ascending; recomputes
//                   P = exp(S + bias − lse), accumulates dV += P^T dO and dK += dS^T Q in
//                   registers; with a bias table it stores the tile's dS in shared memory
//                   and one thread per diagonal adds the diagonal's sum (rows ascending)
//                   to the block's own slot of the partial buffer.
//                3. q:   one block per 64 query rows; key tiles of 32, ascending;
//                   dQ += dS K in registers. A pass of its own instead of FA2's atomicAdd
//                   into dQ: every gradient is deterministic.
//                4. bias: sums the slots per (head, j − i) over batch then chunk, then
//                   each bucket's row over j − i ascending (one thread per output: no
//                   atomics anywhere).
// The masked keys (j > i when causal) and the padding rows/keys contribute exact zeros.
#include <algorithm>
#include <cstdint>
#include <type_traits>

#include "attention.cuh"
#include "cuda_check.cuh"  // CUDA_LAUNCH
#include "elem_io.cuh"     // ld, st

namespace sb {
namespace cuda {
namespace {

constexpr int kQuad = 4;             // threads per query row or key
constexpr int kBlockRows = 64;       // forward and dQ: query rows per block
constexpr int kThreadsPerBlock = kBlockRows * kQuad;
constexpr int kKeyTile = 32;         // forward and dQ: keys per shared-memory tile
constexpr int kChunk = kAttentionKeyChunk;  // kv pass: keys per block
constexpr int kRowTile = 16;         // kv pass: query rows per shared-memory tile
static_assert(kChunk * kQuad == kThreadsPerBlock, "the kv pass has one quad per key of the chunk");
static_assert(kRowTile + kChunk - 1 <= kThreadsPerBlock, "one thread per diagonal of a dS tile");
constexpr unsigned kFull = 0xffffffffu;


// Elements between rows of q, k, v, o (AttentionShape::ld() is host-only).
__host__ __device__ __forceinline__ int64_t row_stride(const AttentionShape& s) { return int64_t(s.heads) * s.d_kv; }

// Sum over the four lanes of a quad (all 32 lanes of the warp must call it).
__device__ __forceinline__ float quad_sum(float x) {
  x += __shfl_xor_sync(kFull, x, 1);
  return x + __shfl_xor_sync(kFull, x, 2);
}

// Element (row, c) of head h of a [batch*rows, heads*d_kv] tensor, as fp32; 0 outside.
template <class T>
__device__ __forceinline__ float load(const T* x, const AttentionShape& s, int b, int rows, int row, int h, int c) {
  if (row >= rows || c >= s.d_kv) return 0.f;
  return ld(x[(int64_t(b) * rows + row) * row_stride(s) + int64_t(h) * s.d_kv + c]);
}

// Position bias of (h, i, j), both in range; 0 without a table.
template <class T>
__device__ __forceinline__ float bias_at(const T* table, const int* rel, const AttentionShape& s, int h, int i, int j) {
  return table ? ld(table[int64_t(rel[j - i + s.tq - 1]) * s.heads + h]) : 0.f;
}

__device__ __forceinline__ bool visible(const AttentionShape& s, int i, int j) {
  return i < s.tq && j < s.tk && !(s.causal && j > i);
}

// Loads keys [j0, j0 + kKeyTile) of K and V (head h) into shared memory as fp32.
template <class T, int D>
__device__ void load_key_tile(float (*ks)[D], float (*vs)[D], const T* k, const T* v, const AttentionShape& s, int b,
                              int h, int j0) {
  for (int x = threadIdx.x; x < kKeyTile * D; x += blockDim.x) {
    const int jj = x / D, c = x % D;
    ks[jj][c] = load(k, s, b, s.tk, j0 + jj, h, c);
    vs[jj][c] = load(v, s, b, s.tk, j0 + jj, h, c);
  }
}

// grid (ceil(tq/64), heads, batch), block 256.
template <class T, int D>
__global__ void __launch_bounds__(kThreadsPerBlock)
    forward_kernel(T* o, float* lse, const T* q, const T* k, const T* v, const T* table, const int* rel,
                   AttentionShape s) {
  constexpr int E = D / kQuad;
  __shared__ float ks[kKeyTile][D], vs[kKeyTile][D];
  const int b = blockIdx.z, h = blockIdx.y, i0 = blockIdx.x * kBlockRows;
  const int g = threadIdx.x % kQuad, i = i0 + threadIdx.x / kQuad;
  float qr[E], acc[E];
#pragma unroll
  for (int t = 0; t < E; ++t) qr[t] = load(q, s, b, s.tq, i, h, g + kQuad * t), acc[t] = 0.f;
  float m = -INFINITY, l = 0.f;
  const int last_row = min(i0 + kBlockRows, s.tq) - 1;
  for (int j0 = 0; j0 < s.tk; j0 += kKeyTile) {
    if (s.causal && j0 > last_row) break;  // the whole tile is masked for this block
    __syncthreads();                        // the previous tile is consumed
    load_key_tile<T, D>(ks, vs, k, v, s, b, h, j0);
    __syncthreads();
    float sc[kKeyTile];
    float mx = m;
#pragma unroll
    for (int jj = 0; jj < kKeyTile; ++jj) {
      float part = 0.f;
#pragma unroll
      for (int t = 0; t < E; ++t) part += qr[t] * ks[jj][g + kQuad * t];
      const float dot = quad_sum(part);
      const int j = j0 + jj;
      sc[jj] = visible(s, i, j) ? dot + bias_at(table, rel, s, h, i, j) : -INFINITY;
      mx = fmaxf(mx, sc[jj]);
    }
    if (mx == -INFINITY) continue;  // no visible key yet (the quad agrees: no shuffles below)
    const float corr = expf(m - mx);  // 0 on the first visible tile
    l *= corr;
#pragma unroll
    for (int t = 0; t < E; ++t) acc[t] *= corr;
    m = mx;
#pragma unroll
    for (int jj = 0; jj < kKeyTile; ++jj) {
      const float p = expf(sc[jj] - mx);
      l += p;
#pragma unroll
      for (int t = 0; t < E; ++t) acc[t] += p * vs[jj][g + kQuad * t];
    }
  }
  if (i >= s.tq) return;
  const float inv = 1.f / l;
  T* orow = o + (int64_t(b) * s.tq + i) * row_stride(s) + int64_t(h) * s.d_kv;
#pragma unroll
  for (int t = 0; t < E; ++t)
    if (g + kQuad * t < s.d_kv) orow[g + kQuad * t] = st<T>(acc[t] * inv);
  if (g == 0) lse[(int64_t(b) * s.heads + h) * s.tq + i] = m + logf(l);
}

// drow[b,h,i] = Σ_c dO⊙O. grid (ceil(tq/8), heads, batch), block 256: one warp per row.
template <class T>
__global__ void row_dot_kernel(float* drow, const T* dout, const T* o, AttentionShape s) {
  const int b = blockIdx.z, h = blockIdx.y, i = blockIdx.x * 8 + threadIdx.x / 32, lane = threadIdx.x % 32;
  float t = 0.f;
  for (int c = lane; c < s.d_kv; c += 32) t += load(dout, s, b, s.tq, i, h, c) * load(o, s, b, s.tq, i, h, c);
#pragma unroll
  for (int w = 16; w > 0; w /= 2) t += __shfl_xor_sync(kFull, t, w);
  if (lane == 0 && i < s.tq) drow[(int64_t(b) * s.heads + h) * s.tq + i] = t;
}

// dK, dV and the bias partial sums of one key chunk. grid (chunks, heads, batch), block
// 256. partial: this block's slot [tq + kChunk - 1] at ((b*heads + h)*chunks + chunk), or
// null without a table.
template <class T, int D>
__global__ void __launch_bounds__(kThreadsPerBlock)
    kv_kernel(T* dk, T* dv, float* partial, const T* dout, const T* q, const T* k, const T* v, const float* lse,
              const float* drow, const T* table, const int* rel, AttentionShape s) {
  constexpr int E = D / kQuad;
  __shared__ float qs[kRowTile][D], dos[kRowTile][D];
  __shared__ float ls[kRowTile], ds_row[kRowTile];
  __shared__ float dss[kRowTile][kChunk + 1];
  const int b = blockIdx.z, h = blockIdx.y, j0 = blockIdx.x * kChunk;
  const int g = threadIdx.x % kQuad, jj = threadIdx.x / kQuad, j = j0 + jj;
  const int64_t bh = int64_t(b) * s.heads + h;
  const int W = s.tq + kChunk - 1;
  float* slot = partial ? partial + (bh * gridDim.x + blockIdx.x) * W : nullptr;
  if (slot)
    for (int x = threadIdx.x; x < W; x += blockDim.x) slot[x] = 0.f;
  float kr[E], vr[E], dka[E], dva[E];
#pragma unroll
  for (int t = 0; t < E; ++t) {
    kr[t] = load(k, s, b, s.tk, j, h, g + kQuad * t);
    vr[t] = load(v, s, b, s.tk, j, h, g + kQuad * t);
    dka[t] = dva[t] = 0.f;
  }
  const int first = s.causal ? j0 / kRowTile * kRowTile : 0;  // earlier rows see none of these keys
  for (int i0 = first; i0 < s.tq; i0 += kRowTile) {
    __syncthreads();  // the previous tile (and the slot's zeroing or diagonals) is done
    for (int x = threadIdx.x; x < kRowTile * D; x += blockDim.x) {
      const int r = x / D, c = x % D;
      qs[r][c] = load(q, s, b, s.tq, i0 + r, h, c);
      dos[r][c] = load(dout, s, b, s.tq, i0 + r, h, c);
    }
    if (threadIdx.x < kRowTile) {
      const int i = i0 + threadIdx.x;
      ls[threadIdx.x] = i < s.tq ? lse[bh * s.tq + i] : 0.f;
      ds_row[threadIdx.x] = i < s.tq ? drow[bh * s.tq + i] : 0.f;
    }
    __syncthreads();
#pragma unroll 1
    for (int r = 0; r < kRowTile; ++r) {
      const int i = i0 + r;
      float part = 0.f, dpart = 0.f;
#pragma unroll
      for (int t = 0; t < E; ++t) {
        part += kr[t] * qs[r][g + kQuad * t];
        dpart += vr[t] * dos[r][g + kQuad * t];
      }
      const float dot = quad_sum(part), dp = quad_sum(dpart);
      const float p = visible(s, i, j) ? expf(dot + bias_at(table, rel, s, h, i, j) - ls[r]) : 0.f;
      const float dsv = p * (dp - ds_row[r]);
#pragma unroll
      for (int t = 0; t < E; ++t) {
        dva[t] += p * dos[r][g + kQuad * t];
        dka[t] += dsv * qs[r][g + kQuad * t];
      }
      if (g == 0) dss[r][jj] = dsv;
    }
    if (slot) {
      __syncthreads();
      // One thread per diagonal delta = key − row within the tile; its slot index is
      // tq − 1 − i0 + delta; negative indices hold padding rows only.
      const int delta = int(threadIdx.x) - (kRowTile - 1);
      const int x = s.tq - 1 - i0 + delta;
      if (delta < kChunk && x >= 0) {
        float t = 0.f;
        for (int r = max(0, -delta); r < kRowTile && r + delta < kChunk; ++r) t += dss[r][r + delta];
        slot[x] += t;
      }
    }
  }
  if (j >= s.tk) return;
  const int64_t off = (int64_t(b) * s.tk + j) * row_stride(s) + int64_t(h) * s.d_kv;
#pragma unroll
  for (int t = 0; t < E; ++t)
    if (g + kQuad * t < s.d_kv) {
      dk[off + g + kQuad * t] = st<T>(dka[t]);
      dv[off + g + kQuad * t] = st<T>(dva[t]);
    }
}

// dQ of 64 query rows. grid (ceil(tq/64), heads, batch), block 256.
template <class T, int D>
__global__ void __launch_bounds__(kThreadsPerBlock)
    q_kernel(T* dq, const T* dout, const T* q, const T* k, const T* v, const float* lse, const float* drow,
             const T* table, const int* rel, AttentionShape s) {
  constexpr int E = D / kQuad;
  __shared__ float ks[kKeyTile][D], vs[kKeyTile][D];
  const int b = blockIdx.z, h = blockIdx.y, i0 = blockIdx.x * kBlockRows;
  const int g = threadIdx.x % kQuad, i = i0 + threadIdx.x / kQuad;
  const int64_t bh = int64_t(b) * s.heads + h;
  float qr[E], dor[E], dqa[E];
#pragma unroll
  for (int t = 0; t < E; ++t) {
    qr[t] = load(q, s, b, s.tq, i, h, g + kQuad * t);
    dor[t] = load(dout, s, b, s.tq, i, h, g + kQuad * t);
    dqa[t] = 0.f;
  }
  const float L = i < s.tq ? lse[bh * s.tq + i] : 0.f, Dr = i < s.tq ? drow[bh * s.tq + i] : 0.f;
  const int last_row = min(i0 + kBlockRows, s.tq) - 1;
  for (int j0 = 0; j0 < s.tk; j0 += kKeyTile) {
    if (s.causal && j0 > last_row) break;
    __syncthreads();
    load_key_tile<T, D>(ks, vs, k, v, s, b, h, j0);
    __syncthreads();
#pragma unroll 4
    for (int jj = 0; jj < kKeyTile; ++jj) {
      float part = 0.f, dpart = 0.f;
#pragma unroll
      for (int t = 0; t < E; ++t) {
        part += qr[t] * ks[jj][g + kQuad * t];
        dpart += dor[t] * vs[jj][g + kQuad * t];
      }
      const float dot = quad_sum(part), dp = quad_sum(dpart);
      const int j = j0 + jj;
      const float p = visible(s, i, j) ? expf(dot + bias_at(table, rel, s, h, i, j) - L) : 0.f;
      const float dsv = p * (dp - Dr);
#pragma unroll
      for (int t = 0; t < E; ++t) dqa[t] += dsv * ks[jj][g + kQuad * t];
    }
  }
  if (i >= s.tq) return;
  T* row = dq + (int64_t(b) * s.tq + i) * row_stride(s) + int64_t(h) * s.d_kv;
#pragma unroll
  for (int t = 0; t < E; ++t)
    if (g + kQuad * t < s.d_kv) row[g + kQuad * t] = st<T>(dqa[t]);
}

// rel[h, x] = Σ_b Σ_chunk partial slot entries of j − i = x − (tq − 1). One thread per (h, x).
__global__ void bias_rel_kernel(float* rel, const float* partial, AttentionShape s, int chunks) {
  const int R = s.tq + s.tk - 1, W = s.tq + kChunk - 1;
  const int64_t id = int64_t(blockIdx.x) * blockDim.x + threadIdx.x;
  if (id >= int64_t(s.heads) * R) return;
  const int h = int(id / R), x = int(id % R);
  float t = 0.f;
  for (int b = 0; b < s.batch; ++b)
    for (int c = 0; c < chunks; ++c) {
      const int u = x - c * kChunk;
      if (u >= 0 && u < W) t += partial[((int64_t(b) * s.heads + h) * chunks + c) * W + u];
    }
  rel[id] = t;
}

// dtable[n, h] += Σ over j − i of bucket n, ascending. One thread per (n, h).
template <class T>
__global__ void bias_table_kernel(T* dtable, const float* rel, const int* rel_buckets, AttentionShape s) {
  const int R = s.tq + s.tk - 1;
  const int id = blockIdx.x * blockDim.x + threadIdx.x;
  if (id >= s.num_buckets * s.heads) return;
  const int n = id / s.heads, h = id % s.heads;
  float t = 0.f;
  bool used = false;
  for (int x = 0; x < R; ++x)
    if (rel_buckets[x] == n) t += rel[int64_t(h) * R + x], used = true;
  if (used) dtable[id] = st<T>(ld(dtable[id]) + t);
}

dim3 row_blocks(const AttentionShape& s) { return dim3(unsigned((s.tq + kBlockRows - 1) / kBlockRows), s.heads, s.batch); }
int chunks_of(const AttentionShape& s) { return (s.tk + kChunk - 1) / kChunk; }
unsigned blocks(int64_t n, int threads) { return unsigned((n + threads - 1) / threads); }

// Calls f(std::integral_constant<int, D>) with the smallest D in {32, 64, 128} ≥ d_kv.
template <class F>
void with_head_dim(int d_kv, F&& f) {
  if (d_kv <= 32)
    f(std::integral_constant<int, 32>{});
  else if (d_kv <= 64)
    f(std::integral_constant<int, 64>{});
  else
    f(std::integral_constant<int, 128>{});
}

}  // namespace

template <class T>
void attention_forward(cudaStream_t st, T* o, float* lse, const T* q, const T* k, const T* v, const T* table,
                       const int* rel, const AttentionShape& s) {
  with_head_dim(s.d_kv, [&](auto dim) {
    constexpr int D = decltype(dim)::value;
    CUDA_LAUNCH(forward_kernel<T, D><<<row_blocks(s), kThreadsPerBlock, 0, st>>>(o, lse, q, k, v, table, rel, s));
  });
}

template <class T>
void attention_backward(cudaStream_t st, T* dq, T* dk, T* dv, T* dtable, const T* dout, const T* q, const T* k,
                        const T* v, const T* o, const float* lse, const T* table, const int* rel, float* workspace,
                        const AttentionShape& s) {
  const int64_t rows = int64_t(s.batch) * s.heads * s.tq;
  const int chunks = chunks_of(s);
  float* drow = workspace;
  float* partial = table ? workspace + rows : nullptr;
  float* rel_sums = table ? partial + int64_t(s.batch) * s.heads * chunks * (s.tq + kChunk - 1) : nullptr;
  CUDA_LAUNCH(row_dot_kernel<T><<<dim3(unsigned((s.tq + 7) / 8), s.heads, s.batch), 256, 0, st>>>(drow, dout, o, s));
  with_head_dim(s.d_kv, [&](auto dim) {
    constexpr int D = decltype(dim)::value;
    CUDA_LAUNCH(kv_kernel<T, D><<<dim3(unsigned(chunks), s.heads, s.batch), kThreadsPerBlock, 0, st>>>(
        dk, dv, partial, dout, q, k, v, lse, drow, table, rel, s));
    CUDA_LAUNCH(q_kernel<T, D><<<row_blocks(s), kThreadsPerBlock, 0, st>>>(dq, dout, q, k, v, lse, drow, table, rel, s));
  });
  if (!table) return;
  CUDA_LAUNCH(bias_rel_kernel<<<blocks(int64_t(s.heads) * (s.tq + s.tk - 1), 256), 256, 0, st>>>(rel_sums, partial, s,
                                                                                                   chunks));
  CUDA_LAUNCH(bias_table_kernel<T><<<blocks(int64_t(s.num_buckets) * s.heads, 256), 256, 0, st>>>(dtable, rel_sums,
                                                                                                   rel, s));
}

#define SB_INSTANTIATE_ATTENTION(T)                                                                              \
  template void attention_forward<T>(cudaStream_t, T*, float*, const T*, const T*, const T*, const T*, const int*, \
                                     const AttentionShape&);                                                     \
  template void attention_backward<T>(cudaStream_t, T*, T*, T*, T*, const T*, const T*, const T*, const T*,        \
                                      const T*, const float*, const T*, const int*, float*, const AttentionShape&);
SB_INSTANTIATE_ATTENTION(float)
SB_INSTANTIATE_ATTENTION(__nv_bfloat16)
SB_INSTANTIATE_ATTENTION(__half)
#undef SB_INSTANTIATE_ATTENTION

}  // namespace cuda
}  // namespace sb
