// Checked calls for the CUDA runtime, cuBLAS and NCCL: one macro per library, each naming
// the failed call; sb::fatal adds host, rank, file and line and aborts the whole job (a rank
// left behind would hang inside an NCCL collective).
#pragma once
#include <cublas_v2.h>    // cublasStatus_t, cublasGetStatusName/String
#include <cuda_runtime.h> // cudaError_t, cudaGetErrorName/String
#include <nccl.h>         // ncclResult_t, ncclGetErrorString, ncclGetLastError

#include <string>

#include "shardbench/core/check.h"  // sb::fatal

namespace sb {

inline void cuda_check(cudaError_t rc, const char* call, const char* file, int line) {
  if (rc == cudaSuccess) return;
  fatal(std::string(call) + " failed: " + cudaGetErrorName(rc) + " (" + cudaGetErrorString(rc) + ")",
        file, line);
}

inline void cublas_check(cublasStatus_t rc, const char* call, const char* file, int line) {
  if (rc == CUBLAS_STATUS_SUCCESS) return;
  fatal(std::string(call) + " failed: " + cublasGetStatusName(rc) + " (" + cublasGetStatusString(rc) +
            ")",
        file, line);
}

// ncclGetLastError(nullptr) holds NCCL's own explanation (which peer, which transport).
inline void nccl_check(ncclResult_t rc, const char* call, const char* file, int line) {
  if (rc == ncclSuccess) return;
  const char* detail = ncclGetLastError(nullptr);
  fatal(std::string(call) + " failed: " + ncclGetErrorString(rc) +
            (detail && *detail ? std::string(": ") + detail : std::string()) +
            " (set NCCL_DEBUG=INFO for details)",
        file, line);
}

}  // namespace sb

#define CUDA_CHECK(call) ::sb::cuda_check((call), #call, __FILE__, __LINE__)
#define CUBLAS_CHECK(call) ::sb::cublas_check((call), #call, __FILE__, __LINE__)
#define NCCL_CHECK(call) ::sb::nccl_check((call), #call, __FILE__, __LINE__)
// A kernel launch: the launch text names the failure (no kernel image, bad configuration).
// Variadic because the <<<grid, block, smem, stream>>> configuration contains commas.
#define CUDA_LAUNCH(...)                                                          \
  do {                                                                            \
    __VA_ARGS__;                                                                  \
    ::sb::cuda_check(cudaGetLastError(), #__VA_ARGS__, __FILE__, __LINE__);       \
  } while (0)
