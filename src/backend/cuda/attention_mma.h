// Fused T5 attention on tensor cores (mma.sync.aligned.m16n8k16, bf16 or fp16 operands, fp32
// accumulation; sm_80 and later): the same operation, layouts, workspace and bias-gradient
// reduction order as the FMA kernels (attention.cu; backend.h states them), written against
// simt.h so that nvcc compiles it for the GPU (attention_mma.cu) and a host compiler runs
// the very same source in the SIMT emulation (tests/test_attention_mma.cpp).
//
// Every kernel: 128 threads = 4 warps, blockIdx.z = batch, blockIdx.y = head. Tiles are
// 64 query rows × 64 keys (kAttentionKeyChunk), the head padded with zeros to D (32, 64 or
// 128). In shared memory 16-bit tiles are stored as loaded ([row][D + 8]) and, where a
// product needs the other operand order, transposed ([D][64 + 8]); the 8 extra elements
// spread rows over the banks. Fragments follow the PTX ISA's tables (simt_host.h quotes
// them): with g = lane / 4 and t = lane % 4, a lane holds rows g and g + 8 of a 16-row
// operand and elements 2t, 2t + 1 (+ 8) along k; a B operand (k × 8) is 8 rows of a tile
// stored with k contiguous, so each of its registers is one 32-bit shared-memory load.
//   forward   one block per 64 query rows; warp w owns rows 16w..16w+15. Per key tile:
//             S = Q Kᵀ (mma; Q's fragments stay in registers), + bias (from a 127-entry
//             slice of the table for this tile's j − i), the causal mask, the online softmax
//             (row maximum across the lane quad by two shuffles; the running sum kept per
//             lane and summed at the end), P rounded to the operand type and reused in
//             registers as the A operand of O += P V. Writes O and lse.
//   kv        one block per key chunk of 64 keys; warp w owns keys 16w..16w+15; query tiles
//             of 64 rows ascending, each in two halves of 32: Sᵀ = K Qᵀ and dPᵀ = V dOᵀ,
//             Pᵀ = exp(Sᵀ + bias − lse), dSᵀ = Pᵀ ⊙ (dPᵀ − D), dV += Pᵀ dO and dK += dSᵀ Q.
//             With a table, dS (fp32) goes to shared memory and thread x of the block sums
//             diagonal x − 63 of the 64 × 64 tile, rows ascending, into the chunk's slot:
//             the CPU's grouping exactly (cpu_backend.cpp, add_diagonals).
//   q         one block per 64 query rows (as forward); keys ascending in tiles of 64, two
//             halves of 32: S, dP = dO Vᵀ, dS, dQ += dS K. A pass of its own rather than
//             atomics into dQ, so every gradient is deterministic.
//   row_dot, bias_rel, bias_table: as in attention.cu (D = Σ dO⊙O; the slots summed per
//             (head, j − i) over batch then chunk; each bucket's row over j − i ascending).
// P and dS are rounded to the operand type before the products that take them (as every
// flash-attention kernel does); scores, softmax statistics, D and the bias gradient stay in
// fp32. Masked keys and padding rows/keys contribute exact zeros.
#pragma once
#include <cstdint>
#include <cstring>

#include "shardbench/backend/backend.h"  // AttentionShape, kAttentionKeyChunk, attention_workspace_floats
#include "simt.h"

namespace sb {
namespace cuda {
namespace mma_attention {
inline namespace SB_SIMT_ABI {  // simt.h: the GPU build and the emulation share no symbols

constexpr int kThreads = 128;            // 4 warps
constexpr int kRows = 64;                // query rows per block (forward, q) and per tile (kv)
constexpr int kKeys = kAttentionKeyChunk;  // keys per tile, and per kv block (the bias chunk)
constexpr int kPad = 8;                  // extra 16-bit elements per shared row
constexpr int kBiasSlice = kRows + kKeys - 1;  // the j − i of one 64 × 64 tile
static_assert(kRows == 4 * 16 && kKeys == 64, "four warps of 16 rows; the CPU's 64-key chunk");
static_assert(kBiasSlice <= kThreads, "one thread per diagonal of a tile");

SB_SIMT_INLINE int64_t row_stride(const AttentionShape& s) { return int64_t(s.heads) * s.d_kv; }

// Element (row, c) of head h of a [batch*rows, heads*d_kv] tensor as bits; 0 (+0.0) outside.
SB_SIMT_INLINE uint16_t load_bits(const uint16_t* x, const AttentionShape& s, int b, int rows, int row, int h, int c) {
  if (row >= rows || c >= s.d_kv) return 0;
  return x[(int64_t(b) * rows + row) * row_stride(s) + int64_t(h) * s.d_kv + c];
}

SB_SIMT_INLINE bool visible(const AttentionShape& s, int i, int j) {
  return i < s.tq && j < s.tk && !(s.causal && j > i);
}

// slice[x] = the bias of j − i = j0 − i0 − (kRows − 1) + x for head h (0 without a table or
// outside the tables's range). Entry (r, c) of a tile with rows i0 + r, keys j0 + c is
// slice[c − r + kRows − 1].
template <class K>
SB_SIMT_INLINE void load_bias_slice(float* slice, const uint16_t* table, const int* rel, const AttentionShape& s, int h,
                                    int i0, int j0) {
  for (int x = simt::tid(); x < kBiasSlice; x += kThreads) {
    const int idx = j0 - i0 - (kRows - 1) + x + s.tq - 1;  // index into rel: j − i + tq − 1
    slice[x] = table && idx >= 0 && idx < s.tq + s.tk - 1
                   ? simt::to_f32(K{}, table[int64_t(rel[idx]) * s.heads + h])
                   : 0.f;
  }
}

// rows [r0, r0 + 64) of head h as tile[r][c] (ld = D + kPad) and, when t is set, also as
// t[c][r] (ld = 64 + kPad).
template <int D>
SB_SIMT_INLINE void load_tile(uint16_t* tile, uint16_t* t, const uint16_t* x, const AttentionShape& s, int b, int rows,
                              int r0, int h) {
  for (int e = simt::tid(); e < kRows * D; e += kThreads) {
    const int r = e / D, c = e % D;
    const uint16_t v = load_bits(x, s, b, rows, r0 + r, h, c);
    tile[r * (D + kPad) + c] = v;
    if (t) t[c * (kRows + kPad) + r] = v;
  }
}

// A 32-bit shared-memory load of two adjacent 16-bit elements (2-element aligned). On the
// host through memcpy: reading uint16_t storage as uint32_t breaks C++'s aliasing rules,
// which an optimising host compiler exploits (the emulation read stale tiles at -O3).
SB_SIMT_INLINE uint32_t ld32(const uint16_t* p) {
#ifdef __CUDACC__
  return *reinterpret_cast<const uint32_t*>(p);
#else
  uint32_t x;
  std::memcpy(&x, p, sizeof x);
  return x;
#endif
}

// The A fragment of rows [row0, row0 + 16), k-columns [k0, k0 + 16) of a tile with k
// contiguous (leading dimension ld).
SB_SIMT_INLINE void a_fragment(uint32_t a[4], const uint16_t* tile, int ld, int row0, int k0, int lane) {
  const int g = lane / 4, t = lane % 4;
  const uint16_t* p = tile + (row0 + g) * ld + k0 + 2 * t;
  a[0] = ld32(p);
  a[1] = ld32(p + 8 * ld);
  a[2] = ld32(p + 8);
  a[3] = ld32(p + 8 * ld + 8);
}
// The A fragment of query rows [row0, row0 + 16), head elements [k0, k0 + 16) of head h of a
// [batch*tq, heads*d_kv] tensor, from global memory (zeros outside).
SB_SIMT_INLINE void global_a_fragment(uint32_t a[4], const uint16_t* x, const AttentionShape& s, int b, int row0,
                                      int h, int k0, int lane) {
  const int r = row0 + lane / 4, c = k0 + 2 * (lane % 4);
  a[0] = simt::pair(load_bits(x, s, b, s.tq, r, h, c), load_bits(x, s, b, s.tq, r, h, c + 1));
  a[1] = simt::pair(load_bits(x, s, b, s.tq, r + 8, h, c), load_bits(x, s, b, s.tq, r + 8, h, c + 1));
  a[2] = simt::pair(load_bits(x, s, b, s.tq, r, h, c + 8), load_bits(x, s, b, s.tq, r, h, c + 9));
  a[3] = simt::pair(load_bits(x, s, b, s.tq, r + 8, h, c + 8), load_bits(x, s, b, s.tq, r + 8, h, c + 9));
}
// The B fragment of k-rows [k0, k0 + 16) and columns [n0, n0 + 8), from a tile stored
// column by column ([n][k], k contiguous, leading dimension ld).
SB_SIMT_INLINE void b_fragment(uint32_t b[2], const uint16_t* tile, int ld, int n0, int k0, int lane) {
  const uint16_t* p = tile + (n0 + lane / 4) * ld + k0 + 2 * (lane % 4);
  b[0] = ld32(p);
  b[1] = ld32(p + 8);
}
// The A fragment for k-step kk from accumulators of 8-column n-tiles 2kk and 2kk + 1 (the
// C layout of two adjacent n-tiles is the A layout of one k-step), rounded to K.
template <class K>
SB_SIMT_INLINE void a_from_accumulators(uint32_t a[4], const float (*acc)[4], int kk) {
  a[0] = simt::pack(K{}, acc[2 * kk][0], acc[2 * kk][1]);
  a[1] = simt::pack(K{}, acc[2 * kk][2], acc[2 * kk][3]);
  a[2] = simt::pack(K{}, acc[2 * kk + 1][0], acc[2 * kk + 1][1]);
  a[3] = simt::pack(K{}, acc[2 * kk + 1][2], acc[2 * kk + 1][3]);
}

// Writes a warp's 16 × D fp32 accumulators (rows row0 + g, + 8; columns of n-tile dt) to
// rows [b*rows + row] of head h, times scale0 (rows row0 + g) or scale1 (+ 8), rounded to K.
template <class K, int D>
SB_SIMT_INLINE void store_rows(uint16_t* out, const float (*acc)[4], const AttentionShape& s, int b, int rows,
                               int row0, int h, int lane, float scale0, float scale1) {
  const int g = lane / 4, t = lane % 4;
  SB_SIMT_UNROLL
  for (int half = 0; half < 2; ++half) {
    const int row = row0 + g + 8 * half;
    if (row >= rows) continue;
    uint16_t* dst = out + (int64_t(b) * rows + row) * row_stride(s) + int64_t(h) * s.d_kv;
    SB_SIMT_UNROLL
    for (int dt = 0; dt < D / 8; ++dt)
      SB_SIMT_UNROLL
      for (int e = 0; e < 2; ++e) {
        const int c = dt * 8 + 2 * t + e;
        if (c < s.d_kv) dst[c] = simt::from_f32(K{}, acc[dt][2 * half + e] * (half ? scale1 : scale0));
      }
  }
}

// Shared memory of each kernel, in bytes (the launcher passes it as dynamic shared memory).
template <int D> constexpr int tile_bytes() { return kRows * (D + kPad) * 2; }
template <int D> constexpr int transposed_bytes() { return D * (kRows + kPad) * 2; }
template <int D> constexpr int forward_smem() { return tile_bytes<D>() + transposed_bytes<D>() + kBiasSlice * 4; }
template <int D> constexpr int q_smem() { return 2 * tile_bytes<D>() + transposed_bytes<D>() + kBiasSlice * 4; }
template <int D>
constexpr int kv_smem() {
  return 4 * tile_bytes<D>() + 2 * transposed_bytes<D>() + (2 * kRows + kBiasSlice + kRows * (kKeys + 1)) * 4;
}

// ---------------------------------------------------------------- forward
// grid (ceil(tq/64), heads, batch)
template <class K, int D>
SB_SIMT_GLOBAL void forward_kernel(uint16_t* o, float* lse, const uint16_t* q, const uint16_t* k, const uint16_t* v,
                                   const uint16_t* table, const int* rel, AttentionShape s) {
  constexpr int KS = D / 16, DT = D / 8, NT = kKeys / 8, LD = D + kPad, LT = kRows + kPad;
  uint16_t* ks = reinterpret_cast<uint16_t*>(simt::smem());  // [kKeys][LD]
  uint16_t* vt = ks + kKeys * LD;                            // [D][LT]: V transposed
  float* bias = reinterpret_cast<float*>(vt + D * LT);       // [kBiasSlice]
  const int b = simt::block_z(), h = simt::block_y(), i0 = simt::block_x() * kRows;
  const int lane = simt::tid() % 32, warp = simt::tid() / 32, g = lane / 4, t = lane % 4;
  const int w0 = warp * 16;  // this warp's first row in the block

  uint32_t qa[KS][4];  // Q's A fragments, straight from global memory
  SB_SIMT_UNROLL
  for (int kk = 0; kk < KS; ++kk) global_a_fragment(qa[kk], q, s, b, i0 + w0, h, kk * 16, lane);
  float acc[DT][4];
  SB_SIMT_UNROLL
  for (int dt = 0; dt < DT; ++dt) acc[dt][0] = acc[dt][1] = acc[dt][2] = acc[dt][3] = 0.f;
  float m[2] = {-INFINITY, -INFINITY}, l[2] = {0.f, 0.f};  // rows w0 + g and w0 + g + 8
  const int last_row = (i0 + kRows < s.tq ? i0 + kRows : s.tq) - 1;
  for (int j0 = 0; j0 < s.tk; j0 += kKeys) {
    if (s.causal && j0 > last_row) break;  // the whole tile is masked for this block
    simt::sync();                           // the previous tile is consumed
    load_tile<D>(ks, nullptr, k, s, b, s.tk, j0, h);
    for (int e = simt::tid(); e < kKeys * D; e += kThreads) {
      const int jj = e / D, c = e % D;
      vt[c * LT + jj] = load_bits(v, s, b, s.tk, j0 + jj, h, c);
    }
    load_bias_slice<K>(bias, table, rel, s, h, i0, j0);
    simt::sync();
    float sc[NT][4];
    SB_SIMT_UNROLL
    for (int nt = 0; nt < NT; ++nt) sc[nt][0] = sc[nt][1] = sc[nt][2] = sc[nt][3] = 0.f;
    SB_SIMT_UNROLL
    for (int kk = 0; kk < KS; ++kk)
      SB_SIMT_UNROLL
      for (int nt = 0; nt < NT; ++nt) {
        uint32_t bf[2];
        b_fragment(bf, ks, LD, nt * 8, kk * 16, lane);
        simt::mma(K{}, sc[nt], qa[kk], bf);
      }
    float mx[2] = {m[0], m[1]};
    SB_SIMT_UNROLL
    for (int nt = 0; nt < NT; ++nt)
      SB_SIMT_UNROLL
      for (int e = 0; e < 4; ++e) {
        const int r = w0 + g + (e >= 2 ? 8 : 0), c = nt * 8 + 2 * t + (e & 1);
        sc[nt][e] = visible(s, i0 + r, j0 + c) ? sc[nt][e] + bias[c - r + kRows - 1] : -INFINITY;
        mx[e >> 1] = fmaxf(mx[e >> 1], sc[nt][e]);
      }
    float corr[2];
    SB_SIMT_UNROLL
    for (int x = 0; x < 2; ++x) {
      mx[x] = fmaxf(mx[x], simt::shfl_xor(mx[x], 1));
      mx[x] = fmaxf(mx[x], simt::shfl_xor(mx[x], 2));
      corr[x] = mx[x] == -INFINITY ? 1.f : simt::exp(m[x] - mx[x]);  // 0 on the first visible tile
      m[x] = mx[x];
      l[x] *= corr[x];
    }
    SB_SIMT_UNROLL
    for (int dt = 0; dt < DT; ++dt)
      SB_SIMT_UNROLL
      for (int e = 0; e < 4; ++e) acc[dt][e] *= corr[e >> 1];
    SB_SIMT_UNROLL
    for (int nt = 0; nt < NT; ++nt)
      SB_SIMT_UNROLL
      for (int e = 0; e < 4; ++e) {
        const float p = sc[nt][e] == -INFINITY ? 0.f : simt::exp(sc[nt][e] - m[e >> 1]);
        sc[nt][e] = p;
        l[e >> 1] += p;
      }
    SB_SIMT_UNROLL
    for (int kk = 0; kk < kKeys / 16; ++kk) {
      uint32_t pa[4];
      a_from_accumulators<K>(pa, sc, kk);
      SB_SIMT_UNROLL
      for (int dt = 0; dt < DT; ++dt) {
        uint32_t bf[2];
        b_fragment(bf, vt, LT, dt * 8, kk * 16, lane);
        simt::mma(K{}, acc[dt], pa, bf);
      }
    }
  }
  float inv[2];
  SB_SIMT_UNROLL
  for (int x = 0; x < 2; ++x) {
    l[x] += simt::shfl_xor(l[x], 1);
    l[x] += simt::shfl_xor(l[x], 2);
    inv[x] = 1.f / l[x];
    const int i = i0 + w0 + g + 8 * x;
    if (t == 0 && i < s.tq) lse[(int64_t(b) * s.heads + h) * s.tq + i] = m[x] + simt::log(l[x]);
  }
  store_rows<K, D>(o, acc, s, b, s.tq, i0 + w0, h, lane, inv[0], inv[1]);
}

// ---------------------------------------------------------------- backward
// drow[b, h, i] = Σ_c dO⊙O. grid (ceil(tq/4), heads, batch): one warp per row.
template <class K>
SB_SIMT_GLOBAL void row_dot_kernel(float* drow, const uint16_t* dout, const uint16_t* o, AttentionShape s) {
  const int b = simt::block_z(), h = simt::block_y(), i = simt::block_x() * 4 + simt::tid() / 32;
  const int lane = simt::tid() % 32;
  float x = 0.f;
  for (int c = lane; c < s.d_kv; c += 32)
    x += simt::to_f32(K{}, load_bits(dout, s, b, s.tq, i, h, c)) * simt::to_f32(K{}, load_bits(o, s, b, s.tq, i, h, c));
  SB_SIMT_UNROLL
  for (int w = 16; w > 0; w /= 2) x += simt::shfl_xor(x, w);
  if (lane == 0 && i < s.tq) drow[(int64_t(b) * s.heads + h) * s.tq + i] = x;
}

// dK, dV and the bias slots of one key chunk. grid (chunks, heads, batch). partial: the
// slots [tq + kKeys − 1] of ((b·heads + h)·chunks + chunk), or null without a table.
template <class K, int D>
SB_SIMT_GLOBAL void kv_kernel(uint16_t* dk, uint16_t* dv, float* partial, const uint16_t* dout, const uint16_t* q,
                              const uint16_t* k, const uint16_t* v, const float* lse, const float* drow,
                              const uint16_t* table, const int* rel, AttentionShape s) {
  constexpr int KS = D / 16, DT = D / 8, LD = D + kPad, LT = kRows + kPad, LS = kKeys + 1;
  uint16_t* qs = reinterpret_cast<uint16_t*>(simt::smem());  // [kRows][LD]
  uint16_t* dos = qs + kRows * LD;                           // [kRows][LD]
  uint16_t* kc = dos + kRows * LD;                           // [kKeys][LD]: this chunk's keys
  uint16_t* vc = kc + kKeys * LD;                            // [kKeys][LD]
  uint16_t* qt = vc + kKeys * LD;                            // [D][LT]: Q transposed
  uint16_t* dot = qt + D * LT;                               // [D][LT]: dO transposed
  float* ls = reinterpret_cast<float*>(dot + D * LT);        // [kRows] lse
  float* dr = ls + kRows;                                    // [kRows] D
  float* bias = dr + kRows;                                  // [kBiasSlice]
  float* dss = bias + kBiasSlice;                            // [kRows][LS] dS, query-major
  const int b = simt::block_z(), h = simt::block_y(), j0 = simt::block_x() * kKeys;
  const int lane = simt::tid() % 32, warp = simt::tid() / 32, g = lane / 4, t = lane % 4;
  const int w0 = warp * 16;  // this warp's first key in the chunk
  const int64_t bh = int64_t(b) * s.heads + h;
  const int W = s.tq + kKeys - 1;
  float* slot = partial ? partial + (bh * ((s.tk + kKeys - 1) / kKeys) + simt::block_x()) * W : nullptr;
  if (slot)
    for (int x = simt::tid(); x < W; x += kThreads) slot[x] = 0.f;
  load_tile<D>(kc, nullptr, k, s, b, s.tk, j0, h);
  load_tile<D>(vc, nullptr, v, s, b, s.tk, j0, h);
  float dka[DT][4], dva[DT][4];
  SB_SIMT_UNROLL
  for (int dt = 0; dt < DT; ++dt)
    SB_SIMT_UNROLL
    for (int e = 0; e < 4; ++e) dka[dt][e] = dva[dt][e] = 0.f;
  const int first = s.causal ? j0 : 0;  // earlier rows see none of these keys (kRows == kKeys)
  for (int i0 = first; i0 < s.tq; i0 += kRows) {
    simt::sync();  // the previous tile, the slot's zeroing and its diagonals are done
    load_tile<D>(qs, qt, q, s, b, s.tq, i0, h);
    load_tile<D>(dos, dot, dout, s, b, s.tq, i0, h);
    for (int x = simt::tid(); x < kRows; x += kThreads) {
      const int i = i0 + x;
      ls[x] = i < s.tq ? lse[bh * s.tq + i] : 0.f;
      dr[x] = i < s.tq ? drow[bh * s.tq + i] : 0.f;
    }
    load_bias_slice<K>(bias, table, rel, s, h, i0, j0);
    simt::sync();
    SB_SIMT_UNROLL
    for (int half = 0; half < 2; ++half) {
      const int q0 = half * 32;  // this half's first query row in the tile
      float pt[4][4], dst[4][4];  // Pᵀ and dPᵀ → dSᵀ: 16 keys × 32 queries
      SB_SIMT_UNROLL
      for (int nt = 0; nt < 4; ++nt)
        SB_SIMT_UNROLL
        for (int e = 0; e < 4; ++e) pt[nt][e] = dst[nt][e] = 0.f;
      SB_SIMT_UNROLL
      for (int kk = 0; kk < KS; ++kk) {
        uint32_t ka[4], va[4];
        a_fragment(ka, kc, LD, w0, kk * 16, lane);
        a_fragment(va, vc, LD, w0, kk * 16, lane);
        SB_SIMT_UNROLL
        for (int nt = 0; nt < 4; ++nt) {
          uint32_t bq[2], bd[2];
          b_fragment(bq, qs, LD, q0 + nt * 8, kk * 16, lane);
          b_fragment(bd, dos, LD, q0 + nt * 8, kk * 16, lane);
          simt::mma(K{}, pt[nt], ka, bq);
          simt::mma(K{}, dst[nt], va, bd);
        }
      }
      SB_SIMT_UNROLL
      for (int nt = 0; nt < 4; ++nt)
        SB_SIMT_UNROLL
        for (int e = 0; e < 4; ++e) {
          const int kr = w0 + g + (e >= 2 ? 8 : 0), qc = q0 + nt * 8 + 2 * t + (e & 1);
          const float p =
              visible(s, i0 + qc, j0 + kr) ? simt::exp(pt[nt][e] + bias[kr - qc + kRows - 1] - ls[qc]) : 0.f;
          const float ds = p * (dst[nt][e] - dr[qc]);
          pt[nt][e] = p;
          dst[nt][e] = ds;
          if (slot) dss[qc * LS + kr] = ds;
        }
      SB_SIMT_UNROLL
      for (int kk = 0; kk < 2; ++kk) {  // 16 queries per k-step
        uint32_t pa[4], da[4];
        a_from_accumulators<K>(pa, pt, kk);
        a_from_accumulators<K>(da, dst, kk);
        SB_SIMT_UNROLL
        for (int dt = 0; dt < DT; ++dt) {
          uint32_t bo[2], bq[2];
          b_fragment(bo, dot, LT, dt * 8, q0 + kk * 16, lane);
          b_fragment(bq, qt, LT, dt * 8, q0 + kk * 16, lane);
          simt::mma(K{}, dva[dt], pa, bo);
          simt::mma(K{}, dka[dt], da, bq);
        }
      }
    }
    if (slot) {
      simt::sync();
      // Thread x sums diagonal delta = key − row = x − 63 of the tile, rows ascending, into
      // slot index tq − 1 − i0 + delta; negative indices hold padding rows only.
      const int delta = simt::tid() - (kRows - 1), x = s.tq - 1 - i0 + delta;
      if (simt::tid() < kBiasSlice && x >= 0) {
        float sum = 0.f;
        for (int r = delta < 0 ? -delta : 0; r < kRows && r + delta < kKeys; ++r) sum += dss[r * LS + r + delta];
        slot[x] += sum;
      }
    }
  }
  store_rows<K, D>(dk, dka, s, b, s.tk, j0 + w0, h, lane, 1.f, 1.f);
  store_rows<K, D>(dv, dva, s, b, s.tk, j0 + w0, h, lane, 1.f, 1.f);
}

// dQ of 64 query rows. grid (ceil(tq/64), heads, batch).
template <class K, int D>
SB_SIMT_GLOBAL void q_kernel(uint16_t* dq, const uint16_t* dout, const uint16_t* q, const uint16_t* k,
                             const uint16_t* v, const float* lse, const float* drow, const uint16_t* table,
                             const int* rel, AttentionShape s) {
  constexpr int KS = D / 16, DT = D / 8, LD = D + kPad, LT = kKeys + kPad;
  uint16_t* ks = reinterpret_cast<uint16_t*>(simt::smem());  // [kKeys][LD]
  uint16_t* vs = ks + kKeys * LD;                            // [kKeys][LD]
  uint16_t* kt = vs + kKeys * LD;                            // [D][LT]: K transposed
  float* bias = reinterpret_cast<float*>(kt + D * LT);       // [kBiasSlice]
  const int b = simt::block_z(), h = simt::block_y(), i0 = simt::block_x() * kRows;
  const int lane = simt::tid() % 32, warp = simt::tid() / 32, g = lane / 4, t = lane % 4;
  const int w0 = warp * 16;
  const int64_t bh = int64_t(b) * s.heads + h;
  uint32_t qa[KS][4], da[KS][4];  // Q's and dO's A fragments
  SB_SIMT_UNROLL
  for (int kk = 0; kk < KS; ++kk) {
    global_a_fragment(qa[kk], q, s, b, i0 + w0, h, kk * 16, lane);
    global_a_fragment(da[kk], dout, s, b, i0 + w0, h, kk * 16, lane);
  }
  float L[2], Dr[2];
  SB_SIMT_UNROLL
  for (int x = 0; x < 2; ++x) {
    const int i = i0 + w0 + g + 8 * x;
    L[x] = i < s.tq ? lse[bh * s.tq + i] : 0.f;
    Dr[x] = i < s.tq ? drow[bh * s.tq + i] : 0.f;
  }
  float dqa[DT][4];
  SB_SIMT_UNROLL
  for (int dt = 0; dt < DT; ++dt) dqa[dt][0] = dqa[dt][1] = dqa[dt][2] = dqa[dt][3] = 0.f;
  const int last_row = (i0 + kRows < s.tq ? i0 + kRows : s.tq) - 1;
  for (int j0 = 0; j0 < s.tk; j0 += kKeys) {
    if (s.causal && j0 > last_row) break;
    simt::sync();
    load_tile<D>(ks, kt, k, s, b, s.tk, j0, h);
    load_tile<D>(vs, nullptr, v, s, b, s.tk, j0, h);
    load_bias_slice<K>(bias, table, rel, s, h, i0, j0);
    simt::sync();
    SB_SIMT_UNROLL
    for (int half = 0; half < 2; ++half) {
      const int c0 = half * 32;  // this half's first key in the tile
      float sc[4][4], dp[4][4];
      SB_SIMT_UNROLL
      for (int nt = 0; nt < 4; ++nt)
        SB_SIMT_UNROLL
        for (int e = 0; e < 4; ++e) sc[nt][e] = dp[nt][e] = 0.f;
      SB_SIMT_UNROLL
      for (int kk = 0; kk < KS; ++kk)
        SB_SIMT_UNROLL
        for (int nt = 0; nt < 4; ++nt) {
          uint32_t bk[2], bv[2];
          b_fragment(bk, ks, LD, c0 + nt * 8, kk * 16, lane);
          b_fragment(bv, vs, LD, c0 + nt * 8, kk * 16, lane);
          simt::mma(K{}, sc[nt], qa[kk], bk);
          simt::mma(K{}, dp[nt], da[kk], bv);
        }
      SB_SIMT_UNROLL
      for (int nt = 0; nt < 4; ++nt)
        SB_SIMT_UNROLL
        for (int e = 0; e < 4; ++e) {
          const int r = w0 + g + (e >= 2 ? 8 : 0), c = c0 + nt * 8 + 2 * t + (e & 1);
          const float p =
              visible(s, i0 + r, j0 + c) ? simt::exp(sc[nt][e] + bias[c - r + kRows - 1] - L[e >> 1]) : 0.f;
          dp[nt][e] = p * (dp[nt][e] - Dr[e >> 1]);  // dS
        }
      SB_SIMT_UNROLL
      for (int kk = 0; kk < 2; ++kk) {
        uint32_t sa[4];
        a_from_accumulators<K>(sa, dp, kk);
        SB_SIMT_UNROLL
        for (int dt = 0; dt < DT; ++dt) {
          uint32_t bk[2];
          b_fragment(bk, kt, LT, dt * 8, c0 + kk * 16, lane);
          simt::mma(K{}, dqa[dt], sa, bk);
        }
      }
    }
  }
  store_rows<K, D>(dq, dqa, s, b, s.tq, i0 + w0, h, lane, 1.f, 1.f);
}

// rel_sums[h, x] = Σ_b Σ_chunk partial entries of j − i = x − (tq − 1). One thread per (h, x).
SB_SIMT_GLOBAL void bias_rel_kernel(float* rel_sums, const float* partial, AttentionShape s) {
  const int R = s.tq + s.tk - 1, W = s.tq + kKeys - 1, chunks = (s.tk + kKeys - 1) / kKeys;
  const int64_t id = int64_t(simt::block_x()) * kThreads + simt::tid();
  if (id >= int64_t(s.heads) * R) return;
  const int h = int(id / R), x = int(id % R);
  float sum = 0.f;
  for (int b = 0; b < s.batch; ++b)
    for (int c = 0; c < chunks; ++c) {
      const int u = x - c * kKeys;
      if (u >= 0 && u < W) sum += partial[((int64_t(b) * s.heads + h) * chunks + c) * W + u];
    }
  rel_sums[id] = sum;
}

// dtable[n, h] += Σ over j − i of bucket n, ascending. One thread per (n, h).
template <class K>
SB_SIMT_GLOBAL void bias_table_kernel(uint16_t* dtable, const float* rel_sums, const int* rel, AttentionShape s) {
  const int R = s.tq + s.tk - 1;
  const int id = simt::block_x() * kThreads + simt::tid();
  if (id >= s.num_buckets * s.heads) return;
  const int n = id / s.heads, h = id % s.heads;
  float sum = 0.f;
  bool used = false;
  for (int x = 0; x < R; ++x)
    if (rel[x] == n) sum += rel_sums[int64_t(h) * R + x], used = true;
  if (used) dtable[id] = simt::from_f32(K{}, simt::to_f32(K{}, dtable[id]) + sum);
}

// ---------------------------------------------------------------- the launch sequence
// Launch(grid, smem_bytes, kernel, args...) runs kernel over grid × kThreads threads
// (attention_mma.cu: cudaLaunchKernel on the stream; the tests: simt::host::launch).
inline int blocks_for(int64_t n) { return int((n + kThreads - 1) / kThreads); }
inline simt::Dim row_grid(const AttentionShape& s) { return {(s.tq + kRows - 1) / kRows, s.heads, s.batch}; }

// Calls f(std::integral_constant-like D) for the smallest D in {32, 64, 128} ≥ d_kv.
template <int D> struct HeadDim { static constexpr int value = D; };
template <class F>
void with_head_dim(int d_kv, F&& f) {
  if (d_kv <= 32)
    f(HeadDim<32>{});
  else if (d_kv <= 64)
    f(HeadDim<64>{});
  else
    f(HeadDim<128>{});
}

template <class K, class Launch>
void forward(Launch&& launch, uint16_t* o, float* lse, const uint16_t* q, const uint16_t* k, const uint16_t* v,
             const uint16_t* table, const int* rel, const AttentionShape& s) {
  with_head_dim(s.d_kv, [&](auto dim) {
    constexpr int D = decltype(dim)::value;
    launch(row_grid(s), forward_smem<D>(), forward_kernel<K, D>, o, lse, q, k, v, table, rel, s);
  });
}

template <class K, class Launch>
void backward(Launch&& launch, uint16_t* dq, uint16_t* dk, uint16_t* dv, uint16_t* dtable, const uint16_t* dout,
              const uint16_t* q, const uint16_t* k, const uint16_t* v, const uint16_t* o, const float* lse,
              const uint16_t* table, const int* rel, float* workspace, const AttentionShape& s) {
  const int64_t rows = int64_t(s.batch) * s.heads * s.tq;
  const int chunks = (s.tk + kKeys - 1) / kKeys;
  float* drow = workspace;
  float* partial = table ? workspace + rows : nullptr;
  float* rel_sums = table ? partial + int64_t(s.batch) * s.heads * chunks * (s.tq + kKeys - 1) : nullptr;
  launch(simt::Dim{(s.tq + 3) / 4, s.heads, s.batch}, 0, row_dot_kernel<K>, drow, dout, o, s);
  with_head_dim(s.d_kv, [&](auto dim) {
    constexpr int D = decltype(dim)::value;
    launch(simt::Dim{chunks, s.heads, s.batch}, kv_smem<D>(), kv_kernel<K, D>, dk, dv, partial, dout, q, k, v, lse,
           drow, table, rel, s);
    launch(row_grid(s), q_smem<D>(), q_kernel<K, D>, dq, dout, q, k, v, lse, drow, table, rel, s);
  });
  if (!table) return;
  launch(simt::Dim{blocks_for(int64_t(s.heads) * (s.tq + s.tk - 1)), 1, 1}, 0, bias_rel_kernel, rel_sums, partial, s);
  launch(simt::Dim{blocks_for(int64_t(s.num_buckets) * s.heads), 1, 1}, 0, bias_table_kernel<K>, dtable, rel_sums,
         rel, s);
}

}  // namespace SB_SIMT_ABI
}  // namespace mma_attention
}  // namespace cuda
}  // namespace sb
