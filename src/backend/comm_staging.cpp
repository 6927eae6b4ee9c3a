#include "shardbench/backend/comm_staging.h"

#include <mpi.h>
#if __has_include(<mpi-ext.h>)
#include <mpi-ext.h>  // Open MPI: MPIX_CUDA_AWARE_SUPPORT, MPIX_Query_cuda_support()
#endif

#include <algorithm>
#include <climits>
#include <cstdlib>

#include "shardbench/core/check.h"
#include "shardbench/core/cli.h"  // parse_size

namespace sb {

const char* comm_library_name(CommLibrary c) {
  static const char* names[] = {"nccl", "mpi", "mpi-staged", "mpi-direct"};
  return int(c) >= 0 && c < CommLibrary::kCount ? names[int(c)] : "?";
}

CommLibrary parse_comm_library(const std::string& s, const std::string& flag) {
  for (int c = 0; c < int(CommLibrary::kCount); ++c)
    if (s == comm_library_name(CommLibrary(c))) return CommLibrary(c);
  throw UsageError(flag + " '" + s + "' is not allowed (allowed: nccl, mpi, mpi-staged, mpi-direct)");
}

bool uses_mpi(CommLibrary c) { return c != CommLibrary::Nccl; }

const char* cuda_awareness_name(CudaAwareness a) {
  switch (a) {
    case CudaAwareness::Yes: return "yes";
    case CudaAwareness::No: return "no";
    default: return "unknown";
  }
}

CudaAwareness cuda_awareness(int compile_time, int run_time) {
  if (compile_time < 0) return CudaAwareness::Unknown;
  return compile_time == 1 && run_time == 1 ? CudaAwareness::Yes : CudaAwareness::No;
}

CudaAwareness query_mpi_cuda_awareness() {
#if defined(MPIX_CUDA_AWARE_SUPPORT)
  const int compile_time = MPIX_CUDA_AWARE_SUPPORT ? 1 : 0;
  return cuda_awareness(compile_time, compile_time ? MPIX_Query_cuda_support() : 0);
#else
  return cuda_awareness(-1, 0);
#endif
}

std::string refuse_comm(CommLibrary c, CudaAwareness a) {
  if (c == CommLibrary::MpiDirect && a == CudaAwareness::No)
    return "--comm mpi-direct: this MPI library says it cannot take device pointers (CUDA-aware support: "
           "no); use --comm mpi or mpi-staged (staged through pinned host memory)";
  return "";
}

const char* transfer_name(Transfer t) { return t == Transfer::DevicePointers ? "device-pointers" : "staged"; }

Transfer choose_transfer(CommLibrary c, CudaAwareness a, Collective op, DType t, ReduceOp r, int64_t block) {
  const bool device = c == CommLibrary::MpiDirect || (c == CommLibrary::Mpi && a == CudaAwareness::Yes);
  if (!device) return Transfer::Staged;
  const bool reduces = collective_info(op).reduces;
  const bool host_arithmetic = reduces && (t == DType::BF16 || t == DType::F16 || r == ReduceOp::Avg);
  if (host_arithmetic || block > INT_MAX) return Transfer::Staged;
  return Transfer::DevicePointers;
}

StagingConfig parse_staging_config(const char* slot_bytes, const char* slots) {
  StagingConfig c;
  if (slot_bytes) {
    c.slot_bytes = parse_size("SB_MPI_STAGING_CHUNK", slot_bytes);
    if (c.slot_bytes < kMinSlotBytes)
      throw UsageError(std::string("SB_MPI_STAGING_CHUNK '") + slot_bytes + "' is not allowed (at least 64K)");
  }
  if (slots) {
    char* end = nullptr;
    const long v = std::strtol(slots, &end, 10);
    if (end == slots || *end || v < 1 || v > 1024)
      throw UsageError(std::string("SB_MPI_STAGING_SLOTS '") + slots + "' is not allowed (an integer 1..1024)");
    c.slots = int(v);
  }
  return c;
}

StagingConfig staging_config_from_env() {
  return parse_staging_config(std::getenv("SB_MPI_STAGING_CHUNK"), std::getenv("SB_MPI_STAGING_SLOTS"));
}

int64_t block_elements(const CollectiveArgs& a, int ranks) {
  return a.op == Collective::AllToAll ? a.count / ranks : a.count;
}

int64_t slot_elements_per_block_element(Collective op, int ranks) {
  switch (op) {
    case Collective::AllGather:
    case Collective::ReduceScatter: return ranks;
    case Collective::AllToAll: return 2 * int64_t(ranks);
    case Collective::SendRecv: return 2;
    default: return 1;
  }
}

std::vector<Chunk> plan_chunks(Collective op, int64_t block, int ranks, int elem_size, int64_t slot_bytes) {
  SB_ASSERT(block >= 0 && ranks >= 1 && elem_size >= 1, "plan_chunks: bad arguments");
  const int64_t per = slot_elements_per_block_element(op, ranks) * elem_size;
  SB_ASSERT(slot_bytes >= per, "a staging slot of " + std::to_string(slot_bytes) + " bytes cannot hold one element of " +
                                   collective_name(op) + " on " + std::to_string(ranks) + " ranks");
  const int64_t step = std::min<int64_t>(slot_bytes / per, INT_MAX);
  std::vector<Chunk> chunks;
  for (int64_t first = 0; first < block; first += step) chunks.push_back({first, std::min(step, block - first)});
  return chunks;
}

}  // namespace sb
