// The GPU backend's communication library (--comm) and, over MPI, how device buffers reach
// the library: as device pointers (CUDA-aware MPI) or staged through a bounded ring of pinned
// host slots, chunk by chunk (D2H, MPI, H2D pipelined). The decisions live here, free of
// CUDA, so that they are unit-tested on machines without a GPU (tests/test_comm_staging.cpp).
#pragma once
#include <cstdint>
#include <string>
#include <vector>

#include "shardbench/backend/backend.h"

namespace sb {

// --comm: nccl (default); mpi (device pointers where the MPI library says it takes them,
// staged otherwise); mpi-staged and mpi-direct force one way.
enum class CommLibrary : int { Nccl, Mpi, MpiStaged, MpiDirect, kCount };
const char* comm_library_name(CommLibrary c);
CommLibrary parse_comm_library(const std::string& s, const std::string& flag);  // throws UsageError
bool uses_mpi(CommLibrary c);

// What the MPI library says about device pointers. Open MPI answers at compile time
// (MPIX_CUDA_AWARE_SUPPORT in <mpi-ext.h>) and at run time (MPIX_Query_cuda_support());
// other libraries cannot be asked.
enum class CudaAwareness : int { Yes, No, Unknown };
const char* cuda_awareness_name(CudaAwareness a);  // yes, no, unknown
// compile_time: -1 when the library has no such macro, else its value; run_time: the
// query's answer (read only when compile_time is 1). Yes needs both, as Open MPI documents.
CudaAwareness cuda_awareness(int compile_time, int run_time);
// This process's MPI library (MPI must be initialised).
CudaAwareness query_mpi_cuda_awareness();

// "" when `c` can run with this library; else why not (mpi-direct on a library that says no).
std::string refuse_comm(CommLibrary c, CudaAwareness a);

enum class Transfer : int { DevicePointers, Staged };
const char* transfer_name(Transfer t);  // device-pointers, staged
// How one MPI collective's device buffers travel. Device pointers only when the library
// takes them (or the user forces it) AND the collective needs no host arithmetic: 16-bit
// reductions (user-defined MPI operations, which dereference their buffers on the host)
// and averages (divided on the host) are staged; so is a block beyond MPI's int count.
Transfer choose_transfer(CommLibrary c, CudaAwareness a, Collective op, DType t, ReduceOp r, int64_t block);

// The pinned staging ring: `slots` slots of `slot_bytes` each. Environment:
// SB_MPI_STAGING_CHUNK (bytes per slot: 4M, 512K; at least 64K) and SB_MPI_STAGING_SLOTS (>= 1).
struct StagingConfig {
  int64_t slot_bytes = 4 << 20;
  int slots = 4;
  int64_t total_bytes() const { return slot_bytes * slots; }
};
constexpr int64_t kMinSlotBytes = 64 << 10;  // one element of a 4096-rank all-to-all in fp64
// nullptr: the default. Throws UsageError naming the variable and the allowed values.
StagingConfig parse_staging_config(const char* slot_bytes, const char* slots);
StagingConfig staging_config_from_env();

// Elements of one rank's block: the send count of all-gather, the receive count of
// reduce-scatter, count/ranks of all-to-all, the whole count otherwise. Chunks divide blocks.
int64_t block_elements(const CollectiveArgs& a, int ranks);
// Host elements a chunk of one block element occupies in a slot (send and receive parts):
// ranks for all-gather and reduce-scatter (in place on the host), 2·ranks for all-to-all,
// 2 for send-recv, 1 otherwise.
int64_t slot_elements_per_block_element(Collective op, int ranks);

struct Chunk {
  int64_t first = 0, count = 0;  // elements of the block
};
// Divides a block of `block` elements into chunks whose slot footprint fits `slot_bytes`
// (and whose count fits MPI's int), in order and without gaps; none when block is 0.
std::vector<Chunk> plan_chunks(Collective op, int64_t block, int ranks, int elem_size, int64_t slot_bytes);

}  // namespace sb
