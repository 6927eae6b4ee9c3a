// Launchers of the fused T5 attention kernels (attention.cu: FMA; attention_mma.cu: tensor
// cores): the Backend's attention_forward / attention_backward with the CPU backend's
// semantics (cpu_backend.cpp is the reference; backend.h states the layouts and the
// bias-gradient reduction order).
#pragma once
#include <cuda_bf16.h>     // __nv_bfloat16
#include <cuda_fp16.h>     // __half
#include <cuda_runtime.h>  // cudaStream_t

#include "shardbench/backend/backend.h"  // AttentionShape, kAttentionKeyChunk

namespace sb {
namespace cuda {

// The largest d_kv the kernels hold in registers.
constexpr int kAttentionMaxHeadDim = 128;

// T is float, __nv_bfloat16 or __half; math in fp32. table/rel null: no bias.
template <class T>
void attention_forward(cudaStream_t s, T* o, float* lse, const T* q, const T* k, const T* v, const T* table,
                       const int* rel, const AttentionShape& shape);
// dq, dk, dv written; dtable += d/d(table) when table is set; workspace as
// attention_workspace_floats(shape, table != nullptr).
template <class T>
void attention_backward(cudaStream_t s, T* dq, T* dk, T* dv, T* dtable, const T* dout, const T* q, const T* k,
                        const T* v, const T* o, const float* lse, const T* table, const int* rel, float* workspace,
                        const AttentionShape& shape);

// The same operation on tensor cores (attention_mma.h; mma.sync, sm_80 and later), T
// __nv_bfloat16 or __half. Same arguments, layouts, workspace and reduction order.
template <class T>
void attention_forward_mma(cudaStream_t s, T* o, float* lse, const T* q, const T* k, const T* v, const T* table,
                           const int* rel, const AttentionShape& shape);
template <class T>
void attention_backward_mma(cudaStream_t s, T* dq, T* dk, T* dv, T* dtable, const T* dout, const T* q, const T* k,
                            const T* v, const T* o, const float* lse, const T* table, const int* rel,
                            float* workspace, const AttentionShape& shape);

}  // namespace cuda
}  // namespace sb
