// The few CUDA primitives that the tensor-core attention kernels (attention_mma.h) use,
// behind one set of names, so the same kernel source compiles two ways:
//   nvcc (__CUDACC__): the CUDA primitives themselves — threadIdx/blockIdx, __syncthreads,
//     __shfl_xor_sync, dynamic shared memory, and mma.sync.aligned.m16n8k16 as inline PTX;
//   a host C++ compiler: the emulation in simt_host.h (every thread of a block a fiber,
//     the collectives emulated from the PTX ISA's definitions), which is how the kernels
//     run in the CPU tests (tests/test_attention_mma.cpp).
// 16-bit elements are their bit patterns (uint16_t) in both: bf16 or fp16 by a tag type.
#pragma once
#include <cstdint>

// The two builds must not share symbols: nvcc emits a host-side launch stub for every
// __global__ kernel, with the mangled name the emulation's plain function would have, and a
// program linking both (the GPU tests) would call one for the other. So everything here
// and in the kernels lives in an inline namespace named after the build.
#ifdef __CUDACC__
#define SB_SIMT_ABI gpu
#else
#define SB_SIMT_ABI host_emulation
#endif

#ifdef __CUDACC__
#include <cuda_bf16.h>
#include <cuda_fp16.h>
#define SB_SIMT_GLOBAL __global__ __launch_bounds__(128)
#define SB_SIMT_INLINE __device__ __forceinline__
#define SB_SIMT_UNROLL _Pragma("unroll")
#else
#include <cmath>

#include "shardbench/core/half.h"
#define SB_SIMT_GLOBAL inline
#define SB_SIMT_INLINE inline
#define SB_SIMT_UNROLL
#endif

namespace sb {
namespace simt {
inline namespace SB_SIMT_ABI {
// A launch's grid or block extent.
struct Dim {
  int x = 1, y = 1, z = 1;
  int count() const { return x * y * z; }
};
}  // namespace SB_SIMT_ABI
}  // namespace simt
}  // namespace sb

#ifndef __CUDACC__
#include "simt_host.h"  // the emulation, on Dim
#endif

namespace sb {
namespace simt {
inline namespace SB_SIMT_ABI {

struct Bf16 {};  // element tags: mma.sync's .bf16 and .f16 operand types
struct F16 {};

#ifdef __CUDACC__
SB_SIMT_INLINE int tid() { return int(threadIdx.x); }
SB_SIMT_INLINE int block_x() { return int(blockIdx.x); }
SB_SIMT_INLINE int block_y() { return int(blockIdx.y); }
SB_SIMT_INLINE int block_z() { return int(blockIdx.z); }
SB_SIMT_INLINE void sync() { __syncthreads(); }
SB_SIMT_INLINE float shfl_xor(float v, int lane_mask) { return __shfl_xor_sync(0xffffffffu, v, lane_mask); }
SB_SIMT_INLINE unsigned char* smem() {
  extern __shared__ __align__(16) unsigned char sb_simt_dynamic_smem[];
  return sb_simt_dynamic_smem;
}
SB_SIMT_INLINE float exp(float x) { return __expf(x); }
SB_SIMT_INLINE float log(float x) { return __logf(x); }

SB_SIMT_INLINE float to_f32(Bf16, uint16_t h) { return __uint_as_float(uint32_t(h) << 16); }
SB_SIMT_INLINE float to_f32(F16, uint16_t h) { return __half2float(__ushort_as_half(h)); }
SB_SIMT_INLINE uint16_t from_f32(Bf16, float f) { return __bfloat16_as_ushort(__float2bfloat16_rn(f)); }
SB_SIMT_INLINE uint16_t from_f32(F16, float f) { return __half_as_ushort(__float2half_rn(f)); }

// d += a · b over one warp: A 16×16 (row), B 16×8 (col), C/D 16×8 fp32, the fragments of
// this lane as the PTX ISA lays them out ("Matrix Fragments for mma.m16n8k16").
SB_SIMT_INLINE void mma(Bf16, float d[4], const uint32_t a[4], const uint32_t b[2]) {
#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 800
  asm volatile(
      "mma.sync.aligned.m16n8k16.row.col.f32.bf16.bf16.f32 {%0,%1,%2,%3}, {%4,%5,%6,%7}, {%8,%9}, "
      "{%0,%1,%2,%3};\n"
      : "+f"(d[0]), "+f"(d[1]), "+f"(d[2]), "+f"(d[3])
      : "r"(a[0]), "r"(a[1]), "r"(a[2]), "r"(a[3]), "r"(b[0]), "r"(b[1]));
#elif defined(__CUDA_ARCH__)
  __trap();  // mma.sync m16n8k16 .bf16 needs sm_80; the launcher refuses older GPUs first
#endif
}
SB_SIMT_INLINE void mma(F16, float d[4], const uint32_t a[4], const uint32_t b[2]) {
#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 800
  asm volatile(
      "mma.sync.aligned.m16n8k16.row.col.f32.f16.f16.f32 {%0,%1,%2,%3}, {%4,%5,%6,%7}, {%8,%9}, "
      "{%0,%1,%2,%3};\n"
      : "+f"(d[0]), "+f"(d[1]), "+f"(d[2]), "+f"(d[3])
      : "r"(a[0]), "r"(a[1]), "r"(a[2]), "r"(a[3]), "r"(b[0]), "r"(b[1]));
#elif defined(__CUDA_ARCH__)
  __trap();
#endif
}
#else
inline int tid() { return host::current().thread; }
inline int block_x() { return host::current().block.x; }
inline int block_y() { return host::current().block.y; }
inline int block_z() { return host::current().block.z; }
inline void sync() { host::syncthreads(); }
inline float shfl_xor(float v, int lane_mask) { return host::shfl_xor(v, lane_mask); }
inline unsigned char* smem() { return host::current().smem; }
inline float exp(float x) { return std::exp(x); }
inline float log(float x) { return std::log(x); }

inline float to_f32(Bf16, uint16_t h) { return bf16_bits_to_float(h); }
inline float to_f32(F16, uint16_t h) { return f16_bits_to_float(h); }
inline uint16_t from_f32(Bf16, float f) { return float_to_bf16_bits(f); }
inline uint16_t from_f32(F16, float f) { return float_to_f16_bits(f); }

inline void mma(Bf16, float d[4], const uint32_t a[4], const uint32_t b[2]) { host::mma(false, d, a, b); }
inline void mma(F16, float d[4], const uint32_t a[4], const uint32_t b[2]) { host::mma(true, d, a, b); }
#endif

// Two 16-bit elements in one 32-bit register, the first in the low half (the order of a
// fragment's elements in the PTX ISA: "elements (low to high)").
SB_SIMT_INLINE uint32_t pair(uint16_t lo, uint16_t hi) { return uint32_t(lo) | uint32_t(hi) << 16; }
template <class K>
SB_SIMT_INLINE uint32_t pack(K k, float lo, float hi) {
  return pair(from_f32(k, lo), from_f32(k, hi));
}

}  // namespace SB_SIMT_ABI
}  // namespace simt
}  // namespace sb
