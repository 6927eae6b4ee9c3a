// The CUDA backend is a plugin: its objects form a shared library of their own
// (build/lib/libshardbench_cuda.so, installed beside the programs as PREFIX/lib/...), loaded at
// the first --backend cuda. Loading cuBLAS costs a process 0.4 s, which a CPU run, a plan or
// --help never needs (docs/performance.md §20). Binaries linked with the CUDA objects
// themselves (test_cuda_backend) use them directly and load nothing.
#pragma once
#include <memory>

#include "shardbench/backend/backend.h"

// The plugin's entry points, by C name for dlsym.
extern "C" {
sb::Backend* sb_cuda_backend_new(int comm);       // a CudaBackend; comm: a CommLibrary
void sb_cuda_library_versions(int* cudart, int* nccl);  // as loaded: cudaRuntimeGetVersion, ncclGetVersion
}

namespace sb {

// The CUDA backend, the plugin loaded at the first call; fatal where it cannot be, naming the
// file and the loader's reason (a missing libcublas, say).
std::unique_ptr<Backend> make_cuda_backend(CommLibrary comm);

// The CUDA runtime's and NCCL's versions as loaded, or false where this process made no CUDA
// backend (nothing of CUDA is loaded then).
bool cuda_library_versions(int& cudart, int& nccl);

}  // namespace sb
