// Loads and stores of the element types the kernels are templated over (float,
// __nv_bfloat16, __half): every kernel computes in fp32 and rounds once, to nearest even,
// when it stores. One place for both kernels.cu and attention.cu.
#pragma once

#include <cuda_bf16.h>
#include <cuda_fp16.h>

namespace sb {
namespace cuda {

__device__ __forceinline__ float ld(float x) { return x; }
__device__ __forceinline__ float ld(__nv_bfloat16 x) { return __bfloat162float(x); }
__device__ __forceinline__ float ld(__half x) { return __half2float(x); }
template <class T> __device__ __forceinline__ T st(float x);
template <> __device__ __forceinline__ float st<float>(float x) { return x; }
template <> __device__ __forceinline__ __nv_bfloat16 st<__nv_bfloat16>(float x) { return __float2bfloat16_rn(x); }
template <> __device__ __forceinline__ __half st<__half>(float x) { return __float2half_rn(x); }

}  // namespace cuda
}  // namespace sb
