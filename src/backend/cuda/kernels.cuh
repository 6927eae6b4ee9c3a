// Launchers of the CUDA backend's elementwise and row-wise kernels (kernels.cu). Each one
// enqueues one operation of the Backend interface on `s`, with the CPU backend's exact
// semantics (cpu_backend.cpp is the reference): the same overwrite-or-accumulate behaviour,
// the same masking, the same order of floating-point operations where that is possible.
// Tensors are row-major, in device memory. Launches are checked (CUDA_LAUNCH).
#pragma once
#include <cuda_bf16.h>     // __nv_bfloat16
#include <cuda_fp16.h>     // __half
#include <cuda_runtime.h>  // cudaStream_t

#include <cstdint>

namespace sb {
namespace cuda {

// T is float, __nv_bfloat16 or __half (instantiated in kernels.cu); math is fp32.
// out[i,:] = table[ids[i],:], zeros where ids[i] = -1        out [n,d], table [V,d]
template <class T> void embedding_forward(cudaStream_t s, T* out, const T* table, const int* ids, int n, int d);
// dtable[ids[i],:] += dout[i,:], nothing for ids of -1 (ids repeat: summed in token order)
template <class T> void embedding_backward(cudaStream_t s, T* dtable, const T* dout, const int* ids, int n, int d);
// out = x * rstd * w, rstd[i] = 1/sqrt(mean(x[i,:]^2) + eps)
template <class T>
void rmsnorm_forward(cudaStream_t s, T* out, float* rstd, const T* x, const T* w, int n, int d, float eps);
// rmsnorm_forward and residual = x in the same pass (--fused-epilogues)
template <class T>
void rmsnorm_forward_residual(cudaStream_t s, T* out, float* rstd, T* residual, const T* x, const T* w, int n, int d,
                              float eps);
// dx += d(out)/dx · dout; dw += Σ_i dout * x * rstd
template <class T>
void rmsnorm_backward(cudaStream_t s, T* dx, T* dw, const T* dout, const T* x, const T* w, const float* rstd,
                      int n, int d);
template <class T> void relu_forward(cudaStream_t s, T* x, int64_t n);                  // in place
template <class T> void relu_backward(cudaStream_t s, T* dy, const T* y, int64_t n);    // dy *= (y > 0)
template <class T> void add(cudaStream_t s, T* y, const T* x, int64_t n);               // y += x
template <class T> void scale(cudaStream_t s, T* x, float a, int64_t n);                // x *= a
template <class T> void fill(cudaStream_t s, T* x, float value, int64_t n);
// dst = src rounded to nearest even
template <class D, class S> void cast(cudaStream_t s, D* dst, const S* src, int64_t n);
// x[i] = scale * uniform_pm1(key, first + i): bit-identical to the CPU backend (rng.h)
void init_uniform(cudaStream_t s, float* x, int64_t n, uint64_t key, int64_t first, float scale);
// bias[h,i,j] = table[buckets[i*tk+j], h]
template <class T>
void position_bias_forward(cudaStream_t s, T* bias, const T* table, const int* buckets, int heads, int tq, int tk);
// dtable[buckets[i*tk+j], h] += dbias[h,i,j]
template <class T>
void position_bias_backward(cudaStream_t s, T* dtable, const T* dbias, const int* buckets, int heads, int tq,
                            int tk);
// scores [B,H,tq,tk] in place: += bias [H,tq,tk] (may be null), causal mask (zeros above
// the diagonal), softmax over the last axis
template <class T>
void softmax_forward(cudaStream_t s, T* scores, const T* bias, bool causal, int batch, int heads, int tq, int tk);
// dscores := P ⊙ (dP − Σ dP⊙P) in place; dbias (may be null) += Σ_b dS
template <class T>
void softmax_backward(cudaStream_t s, T* dscores, const T* probs, T* dbias, int batch, int heads, int tq, int tk);
// losses[i] = -log softmax(logits[i])[labels[i]]; logits := (softmax − onehot) · grad_scale
template <class T>
void cross_entropy(cudaStream_t s, T* logits, float* losses, const int* labels, int n, int vocab, float grad_scale);
// Vocabulary-parallel cross-entropy (Backend::cross_entropy_max/_sums/_finish)
template <class T> void cross_entropy_max(cudaStream_t s, const T* logits, float* row_max, int n, int vocab);
template <class T>
void cross_entropy_sums(cudaStream_t s, const T* logits, const float* row_max, const int* labels, float* sums, int n,
                        int vocab);
template <class T>
void cross_entropy_finish(cudaStream_t s, T* logits, float* losses, const float* row_max, const float* sums,
                          const int* labels, int n, int vocab, float grad_scale);
// The optimizers (backend.h OptimizerConfig; the host's arithmetic, backend/host_optimizer.cpp)
// on fp32 parameters with a gradient of type G (times `unscale` first); the scalars come from
// optimizer_step_constants on the host. kind: 0 adamw, 1 adamw-8bit, 2 sgd (OptimizerKind);
// state as host_optimizer.h lays it out (sgd: null without momentum). copy (may be null)
// receives the updated parameters rounded to O in the same pass.
struct OptimizerKernelArgs {
  float beta1, beta2, eps, step_size, inv_bc2, decay, unscale, lr, weight_decay, momentum;
  bool decays;
};
struct DynamicMaps {  // bitsandbytes' maps (host_optimizer.h dynamic_map), by value to the kernel
  float signed_map[256], unsigned_map[256];
};
template <class G, class O>
void optimizer_update(cudaStream_t s, int kind, const OptimizerKernelArgs& a, float* p, const G* g, void* state,
                      int64_t n, const DynamicMaps& maps, O* copy);

// *flag = 1 if any element of x is inf or NaN (the caller zeroes it first)
template <class T> void flag_nonfinite(cudaStream_t s, const T* x, int64_t n, int* flag);

// A one-thread kernel: launching it tells whether this build has code for the device.
cudaError_t probe_kernel_image(cudaStream_t s);

// ---- gated-GELU feed-forward gate (T5 v1.1), one fused kernel each way ----
// h = gelu_tanh(u) * v, gelu_tanh(x) = 0.5 x (1 + tanh(sqrt(2/pi) (x + 0.044715 x^3)))
template <class T> void gated_gelu_forward(cudaStream_t s, T* h, const T* u, const T* v, int64_t n);
// du = dh * v * gelu_tanh'(u), dv = dh * gelu_tanh(u); du may be dh
template <class T>
void gated_gelu_backward(cudaStream_t s, T* du, T* dv, const T* dh, const T* u, const T* v, int64_t n);

}  // namespace cuda
}  // namespace sb
