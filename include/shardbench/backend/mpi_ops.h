// How shardbench's element types and reductions map onto MPI: one place for the CPU backend
// and the CUDA backend's MPI path. MPI has no 16-bit float arithmetic, so bfloat16 and half
// reduce through user-defined operations that compute in fp32 and round (as NCCL does), and
// no average, so avg is a sum divided on completion.
#pragma once
#include <mpi.h>

#include <cstdint>
#include <unordered_map>

#include "shardbench/backend/backend.h"

namespace sb {

// The MPI type elements of t move as (bfloat16 and half: 16-bit words).
MPI_Datatype mpi_datatype(DType t);

// MPI reductions for every DType: the built-in operations, and user-defined ones for
// bfloat16 and half, created on first use and freed with this object (unless MPI is
// already finalised). Avg maps to sum: divide the result with divide_elements().
class MpiReductions {
 public:
  MpiReductions() = default;
  MpiReductions(const MpiReductions&) = delete;
  MpiReductions& operator=(const MpiReductions&) = delete;
  ~MpiReductions();
  MPI_Op op(ReduceOp o, DType t);

 private:
  std::unordered_map<int, MPI_Op> half_ops_;
};

// Host elements of type t: buf[i] /= by (the second half of an average).
void divide_elements(void* buf, int64_t n, DType t, int by);

// An MPI element count: aborts beyond 2^31 − 1 (the int of the MPI-3 interface).
int mpi_count(int64_t n);

}  // namespace sb
