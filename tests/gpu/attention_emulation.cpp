// The SIMT emulation of the tensor-core attention kernels, built by the host compiler and
// linked into test_cuda_backend (nvcc compiles simt.h's CUDA side there, so the emulation
// cannot live in the .cu): a GPU run compares the hardware's results with the emulation's.
#include "../attention_emulation.h"

namespace sb {

AttnResult emulated_attention_on_host(const AttnProblem& p, DType t) { return emulated_attention(p, t); }

}  // namespace sb
