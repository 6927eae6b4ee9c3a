// Launchers of the CUDA backend's elementwise and row-wise kernels (kernels.cu). Each one
// enqueues one operation of the Backend interface on `s`, with the CPU backend's exact
// semantics (cpu_backend.cpp is the reference): the same overwrite-or-accumulate behaviour,
// the same masking, the same order of floating-point operations where that is possible.
// All tensors are fp32, row-major, in device memory. Launches are checked (CUDA_LAUNCH).
#pragma once
#include <cuda_runtime.h>  // cudaStream_t

#include <cstdint>

namespace sb {
namespace cuda {

// out[i,:] = table[ids[i],:]                                 out [n,d], table [V,d]
void embedding_forward(cudaStream_t s, float* out, const float* table, const int* ids, int n, int d);
// dtable[ids[i],:] += dout[i,:]  (atomics: ids repeat)
void embedding_backward(cudaStream_t s, float* dtable, const float* dout, const int* ids, int n, int d);
// out = x * rstd * w, rstd[i] = 1/sqrt(mean(x[i,:]^2) + eps)
void rmsnorm_forward(cudaStream_t s, float* out, float* rstd, const float* x, const float* w, int n,
                     int d, float eps);
// dx += d(out)/dx · dout; dw += Σ_i dout * x * rstd
void rmsnorm_backward(cudaStream_t s, float* dx, float* dw, const float* dout, const float* x,
                      const float* w, const float* rstd, int n, int d);
void relu_forward(cudaStream_t s, float* x, int64_t n);                    // in place
void relu_backward(cudaStream_t s, float* dy, const float* y, int64_t n);  // dy *= (y > 0)
void add(cudaStream_t s, float* y, const float* x, int64_t n);             // y += x
void scale(cudaStream_t s, float* x, float a, int64_t n);                  // x *= a
void fill(cudaStream_t s, float* x, float value, int64_t n);
// x[i] = scale * uniform_pm1(key, first + i): bit-identical to the CPU backend (rng.h)
void init_uniform(cudaStream_t s, float* x, int64_t n, uint64_t key, int64_t first, float scale);
// bias[h,i,j] = table[buckets[i*tk+j], h]
void position_bias_forward(cudaStream_t s, float* bias, const float* table, const int* buckets,
                           int heads, int tq, int tk);
// dtable[buckets[i*tk+j], h] += dbias[h,i,j]
void position_bias_backward(cudaStream_t s, float* dtable, const float* dbias, const int* buckets,
                            int heads, int tq, int tk);
// scores [B,H,tq,tk] in place: += bias [H,tq,tk] (may be null), causal mask (zeros above
// the diagonal), softmax over the last axis
void softmax_forward(cudaStream_t s, float* scores, const float* bias, bool causal, int batch,
                     int heads, int tq, int tk);
// dscores := P ⊙ (dP − Σ dP⊙P) in place; dbias (may be null) += Σ_b dS
void softmax_backward(cudaStream_t s, float* dscores, const float* probs, float* dbias, int batch,
                      int heads, int tq, int tk);
// losses[i] = -log softmax(logits[i])[labels[i]]; logits := (softmax − onehot) · grad_scale
void cross_entropy(cudaStream_t s, float* logits, float* losses, const int* labels, int n, int vocab,
                   float grad_scale);
// Adam with the bias corrections bc1 = 1 − β1^step, bc2 = 1 − β2^step computed by the caller
// (on the host, exactly as the CPU backend does).
void adam(cudaStream_t s, float* p, const float* g, float* m, float* v, int64_t n, float lr,
          float beta1, float beta2, float eps, float bc1, float bc2);

// A one-thread kernel: launching it tells whether this build has code for the device.
cudaError_t probe_kernel_image(cudaStream_t s);

}  // namespace cuda
}  // namespace sb
