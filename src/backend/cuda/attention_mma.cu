// The tensor-core attention kernels (attention_mma.h) compiled for the GPU: each launch of
// the shared launch sequence becomes a checked kernel launch on the caller's stream, with
// the kernel's dynamic shared memory raised above the 48 KiB default where it needs more.
#include <unordered_set>

#include "attention.cuh"
#include "attention_mma.h"
#include "cuda_check.cuh"  // CUDA_CHECK, CUDA_LAUNCH

namespace sb {
namespace cuda {
namespace {

namespace ma = mma_attention;

struct DeviceLaunch {
  cudaStream_t stream;
  template <class... Params, class... Args>
  void operator()(simt::Dim grid, int smem, void (*kernel)(Params...), Args... args) const {
    static std::unordered_set<const void*> raised;  // kernels whose limit is already raised
    if (smem > 48 * 1024 && raised.insert(reinterpret_cast<const void*>(kernel)).second)
      CUDA_CHECK(cudaFuncSetAttribute(kernel, cudaFuncAttributeMaxDynamicSharedMemorySize, smem));
    CUDA_LAUNCH(kernel<<<dim3(unsigned(grid.x), unsigned(grid.y), unsigned(grid.z)), ma::kThreads, size_t(smem),
                         stream>>>(args...));
  }
};

// The 16-bit element type's mma tag and its bit patterns.
template <class T> struct Tag;
template <> struct Tag<__nv_bfloat16> { using type = simt::Bf16; };
template <> struct Tag<__half> { using type = simt::F16; };
template <class T> uint16_t* bits(T* p) { return reinterpret_cast<uint16_t*>(p); }
template <class T> const uint16_t* bits(const T* p) { return reinterpret_cast<const uint16_t*>(p); }

}  // namespace

template <class T>
void attention_forward_mma(cudaStream_t st, T* o, float* lse, const T* q, const T* k, const T* v, const T* table,
                           const int* rel, const AttentionShape& s) {
  ma::forward<typename Tag<T>::type>(DeviceLaunch{st}, bits(o), lse, bits(q), bits(k), bits(v), bits(table), rel, s);
}

template <class T>
void attention_backward_mma(cudaStream_t st, T* dq, T* dk, T* dv, T* dtable, const T* dout, const T* q, const T* k,
                            const T* v, const T* o, const float* lse, const T* table, const int* rel, float* workspace,
                            const AttentionShape& s) {
  ma::backward<typename Tag<T>::type>(DeviceLaunch{st}, bits(dq), bits(dk), bits(dv), bits(dtable), bits(dout),
                                      bits(q), bits(k), bits(v), bits(o), lse, bits(table), rel, workspace, s);
}

#define SB_INSTANTIATE_ATTENTION_MMA(T)                                                                        \
  template void attention_forward_mma<T>(cudaStream_t, T*, float*, const T*, const T*, const T*, const T*,     \
                                         const int*, const AttentionShape&);                                  \
  template void attention_backward_mma<T>(cudaStream_t, T*, T*, T*, T*, const T*, const T*, const T*, const T*, \
                                          const T*, const float*, const T*, const int*, float*,                \
                                          const AttentionShape&);
SB_INSTANTIATE_ATTENTION_MMA(__nv_bfloat16)
SB_INSTANTIATE_ATTENTION_MMA(__half)
#undef SB_INSTANTIATE_ATTENTION_MMA

}  // namespace cuda
}  // namespace sb
