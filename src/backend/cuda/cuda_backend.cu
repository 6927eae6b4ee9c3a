// CUDA backend: cuBLAS GEMMs and one kernel per elementwise operation (kernels.cu) on one
// compute stream, collectives on a communication stream (NCCL; or MPI with --comm mpi, whose
// host side is mpi_stager.h: device pointers or pinned staging copies on that stream), NCCL
// collectives stream-ordered after another on a second one, stream-ordered memory, and every
// operation timed with CUDA events on the GPU's own timeline. Tensors in fp32, bf16 or fp16
// (Buf's dtype), math in fp32; fp32 GEMMs optionally on TF32 tensor cores (SB_CUDA_TF32=1).
//
// Why there is no host synchronisation inside a step (only synchronize() and download()):
//   compute stream:  op  op [record ready]  op  op  op  [wait done]  op ...
//   comm stream:               wait ready → NCCL call → [record done]
// A collective starts when everything issued on the compute stream before it has finished
// (its input is ready); wait() makes the compute stream, not the host, wait for `done`, and
// the stall is timed on the compute stream (exposed communication). Memory is allocated and
// freed in compute-stream order (cudaMallocAsync / cudaFreeAsync), so a buffer released after
// wait() cannot be handed out again before the collective reading it has finished; plain
// cudaFree would synchronise the whole device and serialise communication with compute.
#include <mpi.h>
#include <unistd.h>

#include <algorithm>
#include <chrono>
#include <cstdio>
#include <map>
#include <tuple>
#include <climits>
#include <cmath>
#include <cstdlib>
#include <cstring>
#include <memory>
#include <string>
#include <type_traits>
#include <unordered_map>
#include <vector>

#include <cublasLt.h>             // the ReLU epilogue (--fused-epilogues)
#include <nvtx3/nvToolsExt.h>    // profiler ranges (header-only NVTX 3)

#include "cuda_check.cuh"         // CUDA_CHECK, CUBLAS_CHECK, NCCL_CHECK
#include "attention.cuh"          // the fused attention kernels
#include "shardbench/backend/host_optimizer.h"  // the step constants and 8-bit maps the kernels share
#include "kernels.cuh"            // the elementwise and row-wise kernels
#include "shardbench/backend/backend.h"
#include "shardbench/backend/cuda_plugin.h"  // the entry points this library offers
#include "shardbench/core/check.h"     // SB_FATAL, MPI_CHECK
#include "shardbench/core/nodes.h"     // node_comm: the ranks of this host
#include "shardbench/backend/comm_staging.h"  // --comm, device pointers vs staging, chunks
#include "shardbench/backend/graph_segments.h"  // --cuda-graphs: segments between boundaries
#include "shardbench/core/format.h"    // human_bytes
#include "shardbench/backend/mpi_stager.h" // the host side of collectives over MPI

#ifndef SB_CUDA_ARCHS
#define SB_CUDA_ARCHS "unknown"  // mk/cuda.mk passes the compute capabilities compiled in
#endif

namespace sb {
namespace {

// ------------------------------------------------------------------ device selection

int world_rank() {
  int rank = 0;
  MPI_CHECK(MPI_Comm_rank(MPI_COMM_WORLD, &rank));
  return rank;
}

// Every rank selects its device at the same time; when some cannot, the lowest failing rank
// reports (one line instead of one per rank) and the others wait for its abort.
void fail_together(const std::string& problem) {
  const int mine = problem.empty() ? INT_MAX : world_rank();
  int first = INT_MAX, failing = 0, one = problem.empty() ? 0 : 1, world = 1;
  MPI_CHECK(MPI_Allreduce(&mine, &first, 1, MPI_INT, MPI_MIN, MPI_COMM_WORLD));
  if (first == INT_MAX) return;
  MPI_CHECK(MPI_Allreduce(&one, &failing, 1, MPI_INT, MPI_SUM, MPI_COMM_WORLD));
  MPI_CHECK(MPI_Comm_size(MPI_COMM_WORLD, &world));
  if (mine == first)
    SB_FATAL(problem + " [" + std::to_string(failing) + " of " + std::to_string(world) +
             " ranks cannot use a GPU]");
  MPI_Barrier(MPI_COMM_WORLD);  // never completes: rank `first` aborts the job
  std::exit(kExitFailure);
}

// Which device this rank takes among `count` visible ones, or why it cannot take one.
// `exclusive` (NCCL): one rank per GPU; otherwise (MPI) local ranks share them round-robin.
std::string pick_device(int local_rank, int local_size, bool exclusive, int& device) {
  int count = 0;
  const cudaError_t rc = cudaGetDeviceCount(&count);
  if (rc != cudaSuccess)
    return std::string("no CUDA device visible: cudaGetDeviceCount() failed: ") + cudaGetErrorName(rc) +
           " (" + cudaGetErrorString(rc) +
           "); this host needs an NVIDIA GPU and driver (check nvidia-smi and CUDA_VISIBLE_DEVICES)";
  if (count == 0) return "no CUDA device visible (cudaGetDeviceCount() = 0; check CUDA_VISIBLE_DEVICES)";
  if (local_rank < count || !exclusive) {
    device = local_rank % count;
    return "";
  }
  if (count == 1) {  // a launcher that shows each rank only its own GPU (srun --gpus-per-task=1)
    device = 0;
    return "";
  }
  return std::to_string(local_size) + " ranks on this node but only " + std::to_string(count) +
         " GPUs visible: run one rank per GPU (e.g. mpirun -np <GPUs per node × nodes> "
         "--map-by ppr:<GPUs per node>:node), or --comm mpi, whose ranks may share a GPU";
}

// Makes `device` current and checks this build has kernels for it.
std::string use_device(int device) {
  cudaError_t rc = cudaSetDevice(device);
  if (rc != cudaSuccess)
    return "cudaSetDevice(" + std::to_string(device) + ") failed: " + cudaGetErrorName(rc) + " (" +
           cudaGetErrorString(rc) + ")";
  cudaDeviceProp p{};
  CUDA_CHECK(cudaGetDeviceProperties(&p, device));
  rc = cuda::probe_kernel_image(0);
  if (rc == cudaErrorNoKernelImageForDevice || rc == cudaErrorInvalidDeviceFunction ||
      rc == cudaErrorUnsupportedPtxVersion) {
    cudaGetLastError();  // reset the (non-sticky) launch error before reporting it
    return "GPU " + std::to_string(device) + " (" + p.name + ") is sm_" + std::to_string(p.major) +
           std::to_string(p.minor) + " but this build has kernels for compute capabilities " +
           SB_CUDA_ARCHS + " only (" + cudaGetErrorName(rc) +
           "): rebuild with make CUDA_ARCHS=\"" + std::to_string(p.major) + std::to_string(p.minor) + "\"";
  }
  if (rc != cudaSuccess)
    return std::string("a first kernel launch on GPU ") + std::to_string(device) + " failed: " +
           cudaGetErrorName(rc) + " (" + cudaGetErrorString(rc) + ")";
  return "";
}

// Two ranks of a node on one GPU make NCCL fail later with "duplicate GPU"; say it now
// (`exclusive`). Sets `sharing` to the local ranks on this rank's GPU, itself included.
std::string check_not_shared(MPI_Comm node, int local_rank, bool have_device, int device, bool exclusive,
                             int& sharing) {
  int local_size = 1;
  MPI_CHECK(MPI_Comm_size(node, &local_size));
  cudaUUID_t mine{};
  if (have_device) {
    cudaDeviceProp p{};
    CUDA_CHECK(cudaGetDeviceProperties(&p, device));
    mine = p.uuid;
  }
  std::vector<cudaUUID_t> all(local_size);
  MPI_CHECK(MPI_Allgather(&mine, sizeof mine, MPI_BYTE, all.data(), sizeof mine, MPI_BYTE, node));
  sharing = 1;
  if (!have_device) return "";
  for (int r = 0; r < local_size; ++r) {
    if (r == local_rank || std::memcmp(&all[r], &mine, sizeof mine) != 0) continue;
    ++sharing;
    if (exclusive)
      return "local ranks " + std::to_string(std::min(r, local_rank)) + " and " +
             std::to_string(std::max(r, local_rank)) +
             " would share one GPU: NCCL needs one rank per GPU (each rank sees GPU " + std::to_string(device) +
             "); --comm mpi lets ranks share it";
  }
  return "";
}

// The device of this process, chosen once: local rank on the node → device. The first call
// is collective over MPI_COMM_WORLD (the harness builds its backend on every rank at once);
// later backends of the process (the --check reference) reuse the choice. `sharing`: the
// local ranks on this GPU (1 with NCCL).
int select_device(bool exclusive, int& sharing) {
  static int chosen = -1, sharers = 1;
  static bool chosen_exclusive = false;
  if (chosen >= 0) {
    // An NCCL backend after an MPI one (collective_perf --comm mpi,nccl): every rank makes
    // it at once, so the check may be collective like the first choice.
    if (exclusive && !chosen_exclusive) {
      fail_together(sharers > 1 ? std::to_string(sharers) + " local ranks share GPU " + std::to_string(chosen) +
                                      ": NCCL needs one rank per GPU (--comm mpi lets ranks share it)"
                                : "");
      chosen_exclusive = true;
    }
    CUDA_CHECK(cudaSetDevice(chosen));
    sharing = sharers;
    return chosen;
  }
  int mpi_up = 0;
  MPI_CHECK(MPI_Initialized(&mpi_up));
  SB_ASSERT(mpi_up, "the CUDA backend needs MPI to be initialised (it picks a GPU per local rank)");
  MPI_Comm node = node_comm();  // the ranks of this host (core/nodes.h)
  int local_rank = 0, local_size = 1, device = -1;
  MPI_CHECK(MPI_Comm_rank(node, &local_rank));
  MPI_CHECK(MPI_Comm_size(node, &local_size));
  std::string problem = pick_device(local_rank, local_size, exclusive, device);
  if (problem.empty()) problem = use_device(device);
  const std::string shared = check_not_shared(node, local_rank, problem.empty(), device, exclusive, sharers);
  if (problem.empty()) problem = shared;
  MPI_CHECK(MPI_Comm_free(&node));
  fail_together(problem);
  chosen = device;
  chosen_exclusive = exclusive;
  sharing = sharers;
  return chosen;
}

// ------------------------------------------------------------------ communicators

class NcclComm final : public Comm {
 public:
  // Collective over `c`: rank 0 makes the unique id, MPI broadcasts it.
  explicit NcclComm(MPI_Comm c) {
    MPI_CHECK(MPI_Comm_size(c, &size_));
    MPI_CHECK(MPI_Comm_rank(c, &rank_));
    ncclUniqueId id{};
    if (rank_ == 0) NCCL_CHECK(ncclGetUniqueId(&id));
    MPI_CHECK(MPI_Bcast(&id, sizeof id, MPI_BYTE, 0, c));
    const ncclResult_t rc = ncclCommInitRank(&comm, size_, id, rank_);
    if (rc != ncclSuccess)
      nccl_check(rc,
                 ("NCCL initialisation (ncclCommInitRank, rank " + std::to_string(rank_) + " of " +
                  std::to_string(size_) + ")").c_str(),
                 __FILE__, __LINE__);
  }
  ~NcclComm() override { ncclCommDestroy(comm); }  // teardown: nothing to do on failure
  int size() const override { return size_; }
  int rank() const override { return rank_; }
  ncclComm_t comm = nullptr;

 private:
  int size_ = 0, rank_ = 0;
};

// A communicator of the MPI path: a duplicate of the caller's, so that the collectives this
// backend starts at its own pace never interleave with the caller's own calls on it.
class CudaMpiComm final : public Comm {
 public:
  explicit CudaMpiComm(MPI_Comm c) {
    MPI_CHECK(MPI_Comm_dup(c, &comm));
    MPI_CHECK(MPI_Comm_size(comm, &size_));
    MPI_CHECK(MPI_Comm_rank(comm, &rank_));
  }
  ~CudaMpiComm() override {  // teardown: after MPI_Finalize there is nothing left to free
    int finalized = 0;
    MPI_Finalized(&finalized);
    if (!finalized) MPI_Comm_free(&comm);
  }
  int size() const override { return size_; }
  int rank() const override { return rank_; }
  MPI_Comm comm = MPI_COMM_NULL;

 private:
  int size_ = 0, rank_ = 0;
};

// ------------------------------------------------------------------ the backend

// An operation whose start and end events are read in synchronize(); an MPI call (timed
// on the host) has no events and its backend-clock times instead.
struct TimedOp {
  OpKind kind;
  Phase phase;
  int unit, lane;
  cudaEvent_t start, end;
  int64_t bytes;
  double flops;
  bool has_shape;
  int32_t gemm[5];
  int64_t request;  // collectives and their waits; -1 otherwise
  int ranks = 0;    // collectives: ranks of the communicator
  double host_start = 0, host_end = 0;  // when start and end are null
  bool pooled = true;  // start and end return to the event pool (false: a graph segment's own)
};

// Communication lanes, their operations never overlapping within one: NCCL collectives (or
// the staging copies of MPI) on kCommLane; NCCL collectives stream-ordered after another
// (CollectiveArgs::after, as FSDP's all-reduce stream) on kOrderedLane, so they overlap the
// next collectives of kCommLane; tensor-parallel NCCL collectives on the compute stream itself
// (on the critical path, as Megatron-LM issues them) on kTensorLane; pipeline sends and
// receives of activations and of gradients on their own streams (kActivationLane,
// kGradientLane); MPI calls (timed on the host) from kMpiLane up, first free.
constexpr int kCommLane = 1;
constexpr int kOrderedLane = 2;
constexpr int kTensorLane = 3;
constexpr int kActivationLane = 4;
constexpr int kGradientLane = 5;
constexpr int kMpiLane = 6;

cublasOperation_t op(bool transposed) { return transposed ? CUBLAS_OP_T : CUBLAS_OP_N; }

ncclDataType_t nccl_type(DType t) {
  switch (t) {
    case DType::F32: return ncclFloat32;
    case DType::F64: return ncclFloat64;
    case DType::I32: return ncclInt32;
    case DType::I64: return ncclInt64;
    case DType::U8: return ncclUint8;
    case DType::BF16: return ncclBfloat16;
    case DType::F16: return ncclFloat16;
    default: SB_FATAL("unknown dtype " + std::to_string(int(t)));
  }
}

ncclRedOp_t nccl_op(ReduceOp o) {
  switch (o) {
    case ReduceOp::Sum: return ncclSum;
    case ReduceOp::Prod: return ncclProd;
    case ReduceOp::Min: return ncclMin;
    case ReduceOp::Max: return ncclMax;
    case ReduceOp::Avg: return ncclAvg;
    default: SB_FATAL("unknown reduction " + std::to_string(int(o)));
  }
}

cudaDataType_t cuda_type(DType t) {
  switch (t) {
    case DType::F32: return CUDA_R_32F;
    case DType::BF16: return CUDA_R_16BF;
    case DType::F16: return CUDA_R_16F;
    default: SB_FATAL(std::string("no CUDA compute on ") + dtype_name(t));
  }
}

// Calls f with a value of the element type of t (float, __nv_bfloat16, __half).
template <class F>
void with_type(DType t, F&& f) {
  switch (t) {
    case DType::F32: f(float{}); break;
    case DType::BF16: f(__nv_bfloat16{}); break;
    case DType::F16: f(__half{}); break;
    default: SB_FATAL(std::string("no CUDA compute on ") + dtype_name(t));
  }
}
// A tensor's address as element type E (E chosen by with_type, so it matches the dtype).
template <class E> E* as(E, Buf b) { return static_cast<E*>(b.ptr); }
template <class E> const E* as(E, CBuf b) { return static_cast<const E*>(b.ptr); }

bool env_is_one(const char* name) {
  const char* v = std::getenv(name);
  return v && std::strcmp(v, "1") == 0;
}

class CudaBackend final : public Backend, private StagingDevice {
 public:
  explicit CudaBackend(CommLibrary comm) : epoch_(std::chrono::steady_clock::now()), comm_library_(comm) {
    if (uses_mpi(comm)) {  // before any device work: every rank gets the same answer
      awareness_ = query_mpi_cuda_awareness();
      const std::string refused = refuse_comm(comm, awareness_);
      if (!refused.empty()) throw UsageError(refused);
      staging_ = staging_config_from_env();
    }
    device_ = select_device(comm == CommLibrary::Nccl, sharing_);
    CUDA_CHECK(cudaGetDeviceProperties(&prop_, device_));
    make_streams();
    make_cublas();
    keep_pool_memory();
    CUDA_CHECK(cudaEventCreateWithFlags(&ready_, cudaEventDisableTiming));
    CUDA_CHECK(cudaEventCreate(&anchor_event_));
    if (uses_mpi(comm)) make_mpi_path();
    anchor();
  }

  ~CudaBackend() override {  // teardown: errors here cannot be acted on, so they are ignored
    int finalized = 0;
    MPI_Finalized(&finalized);
    if (!finalized) drain_mpi();  // MPI may still write into the pinned slots
    if (graphs_) graphs_->boundary();  // a segment still capturing runs
    cudaStreamSynchronize(compute_);
    cudaStreamSynchronize(comm_);
    cudaStreamSynchronize(ordered_);
    for (cudaStream_t p2p : p2p_) cudaStreamSynchronize(p2p);
    for (cudaStream_t c : copy_) cudaStreamSynchronize(c);
    for (void* p : tracked()) cudaFreeAsync(p, compute_);
    for (void* p : tracked_host()) cudaFreeHost(p);
    cudaStreamSynchronize(compute_);
    stager_.reset();  // hands its events back to the pool
    flush_pending_frees();
    if (host_slots_) cudaFreeHost(host_slots_);
    graphs_.reset();  // its executable graphs
    for (const TimedOp& t : timed_)
      if (t.start && t.pooled) free_events_.insert(free_events_.end(), {t.start, t.end});
    for (const auto& segment : segment_events_)
      for (const auto& [a, b] : segment) free_events_.insert(free_events_.end(), {a, b});
    for (auto& [r, o] : requests_) free_done_.push_back(o.done);
    for (cudaEvent_t e : free_events_) cudaEventDestroy(e);
    for (cudaEvent_t e : free_done_) cudaEventDestroy(e);
    cudaEventDestroy(ready_);
    cudaEventDestroy(anchor_event_);
    if (nonfinite_flag_) cudaFree(nonfinite_flag_);
    for (auto& [key, plan] : lt_plans_) plan.destroy();
    if (lt_) cublasLtDestroy(lt_);
    cublasDestroy(cublas_);
    if (library_workspace_) cudaFree(library_workspace_);
    cudaStreamDestroy(comm_);
    cudaStreamDestroy(ordered_);
    for (cudaStream_t p2p : p2p_) cudaStreamDestroy(p2p);
    for (cudaStream_t c : copy_) cudaStreamDestroy(c);
    cudaStreamDestroy(compute_);
  }

  std::string name() const override { return "cuda"; }
  // "nccl", or "mpi (CUDA-aware: no; staged through 4 x 4.00 MiB pinned host slots)".
  std::string comm_name() const override {
    if (!uses_mpi(comm_library_)) return "nccl";
    const std::string aware = std::string("CUDA-aware: ") + cuda_awareness_name(awareness_);
    const std::string staging = std::to_string(staging_.slots) + " x " + human_bytes(double(staging_.slot_bytes)) +
                                " pinned host slots";
    switch (comm_library_) {
      case CommLibrary::MpiStaged: return "mpi-staged (" + aware + "; every collective through " + staging + ")";
      case CommLibrary::MpiDirect:
        return "mpi-direct (" + aware + "; device pointers, 16-bit reductions and averages through " + staging + ")";
      default:
        return "mpi (" + aware + (awareness_ == CudaAwareness::Yes
                                      ? "; device pointers, 16-bit reductions and averages through "
                                      : "; staged through ") +
               staging + ")";
    }
  }
  // "cuda:0 NVIDIA H100 80GB HBM3 (sm_90, fp32 GEMMs in fp32)": the math of fp32 GEMMs is part of
  // the device (bf16/fp16 GEMMs always accumulate in fp32; the run's dtype is an attribute).
  std::string device_name() const override {
    return "cuda:" + std::to_string(device_) + " " + prop_.name + " (sm_" + std::to_string(prop_.major) +
           std::to_string(prop_.minor) + ", fp32 GEMMs in " + (tf32_ ? "tf32" : "fp32") + ")";
  }

  // ---- memory ----
  void* alloc(size_t bytes, MemCategory cat) override {
    boundary();  // not captured: an allocation inside a graph would be the graph's own
    void* p = nullptr;
    cudaError_t rc = cudaMallocAsync(&p, std::max<size_t>(bytes, 1), compute_);
    if (rc == cudaErrorMemoryAllocation) {
      // The pool may hold free memory in pieces too small for this request: once the
      // pending frees have completed, give it back to the driver and try once more. (A host
      // synchronisation, but only on the way to an out-of-memory failure.)
      cudaGetLastError();
      CUDA_CHECK(cudaStreamSynchronize(compute_));
      CUDA_CHECK(cudaMemPoolTrimTo(pool_, 0));
      rc = cudaMallocAsync(&p, std::max<size_t>(bytes, 1), compute_);
    }
    if (rc == cudaErrorMemoryAllocation) {
      cudaGetLastError();
      SB_FATAL(out_of_memory_message(bytes, cat));
    }
    cuda_check(rc, "cudaMallocAsync(&p, bytes, compute_)", __FILE__, __LINE__);
    track(p, bytes, cat);
    return p;
  }
  void release(void* p) override {
    if (!p) return;
    untrack(p);
    if (graphs_) return graphs_->release(p);  // after the segment being captured, if one is
    CUDA_CHECK(cudaFreeAsync(p, compute_));
  }
  // Freed in the order of r's stream, after r; at once (compute order) when r is complete.
  // Over MPI a request still being staged has not enqueued all its copies yet: the free
  // waits (accounted as released now) until the stager has handed the request over.
  void release_after(void* p, Request r) override {
    if (!p) return;
    boundary();
    untrack(p);
    if (mpi_pending(r)) return pending_frees_.push_back({p, r});
    free_after(p, r);
  }
  // Host memory for offload: pinned, so copy_async is a DMA of a copy engine that overlaps
  // compute (from pageable memory cudaMemcpyAsync would stage through a pinned buffer on the
  // host thread). cudaHostAlloc and cudaFreeHost may synchronise the device: allocate host
  // buffers outside the step (shards, optimizer states live for the run).
  void* alloc_host(size_t bytes, MemCategory cat) override {
    boundary();
    void* p = nullptr;
    const cudaError_t rc = cudaHostAlloc(&p, std::max<size_t>(bytes, 1), cudaHostAllocDefault);
    if (rc == cudaErrorMemoryAllocation) {
      cudaGetLastError();
      SB_FATAL("out-of-memory: cudaHostAlloc of " + human_bytes(double(bytes)) + " (" + std::to_string(bytes) +
               " bytes) of pinned host memory for " + mem_category_name(cat) + " failed: shardbench holds " +
               human_bytes(double(host_mem_total_current())) + " of host memory; plan with --plan --host-mem-limit-gib");
    }
    cuda_check(rc, "cudaHostAlloc(&p, bytes, cudaHostAllocDefault)", __FILE__, __LINE__);
    track_host(p, bytes, cat);
    return p;
  }
  void release_host(void* p) override {
    if (!p) return;
    untrack_host(p);
    CUDA_CHECK(cudaFreeHost(p));
  }
  // On the copy stream of its direction (two copy engines: uploads and downloads overlap
  // each other and compute), after the compute issued so far and `after`, as a collective
  // (issue()); its request maps to its `done` event like a collective's.
  Request copy_async(void* dst, const void* src, size_t bytes, CopyDirection dir, Request after) override {
    while (after != kNoRequest && mpi_pending(after)) progress_mpi();  // its last copy enqueued: orderable
    const cudaStream_t s = copy_[int(dir)];
    const cudaMemcpyKind kind = dir == CopyDirection::HostToDevice ? cudaMemcpyHostToDevice : cudaMemcpyDeviceToHost;
    return issue(OpKind::Copy, int64_t(bytes), 0, s, after,
                 [&] { CUDA_CHECK(cudaMemcpyAsync(dst, src, bytes, kind, s)); });
  }
  // The host waits for each input's `done` (cudaEventSynchronize: the GPU keeps running what
  // was issued), timed on the host as a wait on kHostLane, then runs fn, timed the same way.
  void host_compute(const std::function<void()>& fn, int64_t bytes, const std::vector<Request>& inputs,
                    OpKind kind) override {
    boundary();
    for (Request r : inputs) {
      while (mpi_pending(r)) progress_mpi();
      auto it = requests_.find(r);
      if (it == requests_.end()) continue;  // completed earlier
      const double t0 = now();
      CUDA_CHECK(cudaEventSynchronize(it->second.done));
      host_timed(OpKind::Wait, t0, now(), 0, r);
      free_done_.push_back(it->second.done);  // complete: as test() found it
      requests_.erase(it);
    }
    const double t0 = now();
    fn();
    host_timed(kind, t0, now(), bytes, kNoRequest);
    progress_mpi();
  }
  // From pageable host memory the runtime stages the data before returning, so the caller
  // may free its buffer at once; the copy itself is ordered on the compute stream.
  void upload(void* dst, const void* src, size_t bytes) override {
    boundary();  // a copy from pageable host memory cannot be captured
    CUDA_CHECK(cudaMemcpyAsync(dst, src, bytes, cudaMemcpyHostToDevice, compute_));
  }
  // The caller reads the host data next: wait for the compute stream (and only for it).
  void download(void* dst, const void* src, size_t bytes) override {
    boundary();
    CUDA_CHECK(cudaMemcpyAsync(dst, src, bytes, cudaMemcpyDeviceToHost, compute_));
    CUDA_CHECK(cudaStreamSynchronize(compute_));
  }
  int64_t device_memory_used() const override {
    size_t free_bytes = 0, total = 0;
    CUDA_CHECK(cudaMemGetInfo(&free_bytes, &total));
    return int64_t(total) - int64_t(free_bytes);
  }
  // Free device memory plus what the stream-ordered pool holds but no allocation uses.
  // Ranks sharing the GPU (--comm mpi) share its free memory equally.
  int64_t memory_capacity() const override {
    size_t free_bytes = 0, total = 0;
    CUDA_CHECK(cudaMemGetInfo(&free_bytes, &total));
    uint64_t reserved = 0, used = 0;
    CUDA_CHECK(cudaMemPoolGetAttribute(pool_, cudaMemPoolAttrReservedMemCurrent, &reserved));
    CUDA_CHECK(cudaMemPoolGetAttribute(pool_, cudaMemPoolAttrUsedMemCurrent, &used));
    return int64_t(free_bytes) / sharing_ + int64_t(reserved - used);
  }

  // ---- compute ----
  // Row-major C = op(A) op(B) is column-major C^T = op(B)^T op(A)^T: cuBLAS gets the
  // operands swapped (B first), M and N swapped, and the same leading dimensions. fp32
  // accumulation for every type; fp32 inputs on TF32 tensor cores when SB_CUDA_TF32=1.
  void gemm(bool ta, bool tb, int M, int N, int K, float alpha, CBuf A, int lda, CBuf B, int ldb, float beta,
            Buf C, int ldc) override {
    const DType t = common_dtype("gemm", {A, B, C});
    const int32_t shape[5] = {M, N, K, 1, int(ta) | int(tb) << 1};
    timed(OpKind::Gemm, kComputeLane, compute_,
          dtype_size(t) * (int64_t(M) * K + int64_t(K) * N + 2 * int64_t(M) * N),
          [&] {
            CUBLAS_CHECK(cublasGemmEx(cublas_, op(tb), op(ta), N, M, K, &alpha, B.ptr, cuda_type(t), ldb, A.ptr,
                                      cuda_type(t), lda, &beta, C.ptr, cuda_type(t), ldc, compute_type(t),
                                      CUBLAS_GEMM_DEFAULT));
          },
          2.0 * M * N * K, shape);
  }
  void gemm_batched(bool ta, bool tb, int M, int N, int K, float alpha, CBuf A, int lda, int64_t sa, CBuf B,
                    int ldb, int64_t sb, float beta, Buf C, int ldc, int64_t sc, int batch) override {
    const DType t = common_dtype("gemm_batched", {A, B, C});
    const int32_t shape[5] = {M, N, K, batch, int(ta) | int(tb) << 1};
    timed(OpKind::Gemm, kComputeLane, compute_,
          dtype_size(t) * int64_t(batch) * (int64_t(M) * K + int64_t(K) * N + 2 * int64_t(M) * N),
          [&] {
            CUBLAS_CHECK(cublasGemmStridedBatchedEx(cublas_, op(tb), op(ta), N, M, K, &alpha, B.ptr, cuda_type(t),
                                                    ldb, sb, A.ptr, cuda_type(t), lda, sa, &beta, C.ptr,
                                                    cuda_type(t), ldc, sc, batch, compute_type(t),
                                                    CUBLAS_GEMM_DEFAULT));
          },
          2.0 * M * N * K * batch, shape);
  }
  void embedding_forward(Buf out, CBuf table, const int* ids, int n, int d) override {
    const DType t = common_dtype("embedding_forward", {out, table});
    elementwise(2 * dtype_size(t) * int64_t(n) * d, t, [&](auto e) {
      cuda::embedding_forward(compute_, as(e, out), as(e, table), ids, n, d);
    });
  }
  void embedding_backward(Buf dtable, CBuf dout, const int* ids, int n, int d) override {
    const DType t = common_dtype("embedding_backward", {dtable, dout});
    elementwise(3 * dtype_size(t) * int64_t(n) * d, t, [&](auto e) {
      cuda::embedding_backward(compute_, as(e, dtable), as(e, dout), ids, n, d);
    });
  }
  void rmsnorm_forward(Buf out, float* rstd, CBuf x, CBuf w, int n, int d, float eps) override {
    const DType t = common_dtype("rmsnorm_forward", {out, x, w});
    elementwise(2 * dtype_size(t) * int64_t(n) * d, t, [&](auto e) {
      cuda::rmsnorm_forward(compute_, as(e, out), rstd, as(e, x), as(e, w), n, d, eps);
    });
  }
  void rmsnorm_backward(Buf dx, Buf dw, CBuf dout, CBuf x, CBuf w, const float* rstd, int n, int d) override {
    const DType t = common_dtype("rmsnorm_backward", {dx, dw, dout, x, w});
    elementwise(4 * dtype_size(t) * int64_t(n) * d, t, [&](auto e) {
      cuda::rmsnorm_backward(compute_, as(e, dx), as(e, dw), as(e, dout), as(e, x), as(e, w), rstd, n, d);
    });
  }
  void relu_forward(Buf x, int64_t n) override {
    elementwise(2 * dtype_size(x.dtype) * n, x.dtype, [&](auto e) { cuda::relu_forward(compute_, as(e, x), n); });
  }
  void relu_backward(Buf dy, CBuf y, int64_t n) override {
    const DType t = common_dtype("relu_backward", {dy, y});
    elementwise(3 * dtype_size(t) * n, t, [&](auto e) { cuda::relu_backward(compute_, as(e, dy), as(e, y), n); });
  }
  void gated_gelu_forward(Buf h, CBuf u, CBuf v, int64_t n) override {
    const DType t = common_dtype("gated_gelu_forward", {h, u, v});
    elementwise(3 * dtype_size(t) * n, t,
                [&](auto e) { cuda::gated_gelu_forward(compute_, as(e, h), as(e, u), as(e, v), n); });
  }
  void gated_gelu_backward(Buf du, Buf dv, CBuf dh, CBuf u, CBuf v, int64_t n) override {
    const DType t = common_dtype("gated_gelu_backward", {du, dv, dh, u, v});
    elementwise(5 * dtype_size(t) * n, t, [&](auto e) {
      cuda::gated_gelu_backward(compute_, as(e, du), as(e, dv), as(e, dh), as(e, u), as(e, v), n);
    });
  }
  // --fused-epilogues: the ReLU in the epilogue of one cuBLASLt matmul (where cuBLASLt has
  // an algorithm for the shape; else, and without the option, GEMM then ReLU).
  void gemm_relu(bool ta, bool tb, int M, int N, int K, float alpha, CBuf A, int lda, CBuf B, int ldb, float beta,
                 Buf C, int ldc) override {
    const DType t = common_dtype("gemm_relu", {A, B, C});
    const LtPlan* plan = options_.fused_epilogues ? lt_plan(ta, tb, M, N, K, lda, ldb, ldc, t) : nullptr;
    if (!plan) return Backend::gemm_relu(ta, tb, M, N, K, alpha, A, lda, B, ldb, beta, C, ldc);
    const int32_t shape[5] = {M, N, K, 1, int(ta) | int(tb) << 1};
    timed(OpKind::Gemm, kComputeLane, compute_,
          dtype_size(t) * (int64_t(M) * K + int64_t(K) * N + 2 * int64_t(M) * N),
          [&] {
            CUBLAS_CHECK(cublasLtMatmul(lt_, plan->desc, &alpha, B.ptr, plan->a, A.ptr, plan->b, &beta, C.ptr, plan->c,
                                        C.ptr, plan->c, &plan->algo, library_workspace_, kLibraryWorkspace, compute_));
          },
          2.0 * M * N * K, shape);
  }
  // --fused-epilogues: the residual copy written by the norm's own pass over x.
  void rmsnorm_forward_residual(Buf out, float* rstd, Buf residual, CBuf x, CBuf w, int n, int d,
                                float eps) override {
    if (!options_.fused_epilogues) return Backend::rmsnorm_forward_residual(out, rstd, residual, x, w, n, d, eps);
    const DType t = common_dtype("rmsnorm_forward_residual", {out, residual, x, w});
    elementwise(3 * dtype_size(t) * int64_t(n) * d, t, [&](auto e) {
      cuda::rmsnorm_forward_residual(compute_, as(e, out), rstd, as(e, residual), as(e, x), as(e, w), n, d, eps);
    });
  }
  void add(Buf y, CBuf x, int64_t n) override {
    const DType t = common_dtype("add", {y, x});
    elementwise(3 * dtype_size(t) * n, t, [&](auto e) { cuda::add(compute_, as(e, y), as(e, x), n); });
  }
  void scale(Buf x, float a, int64_t n) override {
    elementwise(2 * dtype_size(x.dtype) * n, x.dtype, [&](auto e) { cuda::scale(compute_, as(e, x), a, n); });
  }
  void copy(Buf dst, CBuf src, int64_t n) override {
    const int es = dtype_size(common_dtype("copy", {dst, src}));
    timed(OpKind::Copy, kComputeLane, compute_, 2 * es * n, [&] {
      CUDA_CHECK(cudaMemcpyAsync(dst.ptr, src.ptr, size_t(n) * es, cudaMemcpyDeviceToDevice, compute_));
    });
  }
  void cast(Buf dst, CBuf src, int64_t n) override {
    if (dst.dtype == src.dtype) return copy(dst, src, n);
    timed(OpKind::Copy, kComputeLane, compute_, (dtype_size(dst.dtype) + dtype_size(src.dtype)) * n, [&] {
      with_type(dst.dtype, [&](auto d) {
        with_type(src.dtype, [&](auto s) { cuda::cast(compute_, as(d, dst), as(s, src), n); });
      });
    });
  }
  void fill(Buf x, float value, int64_t n) override {
    elementwise(dtype_size(x.dtype) * n, x.dtype, [&](auto e) { cuda::fill(compute_, as(e, x), value, n); });
  }
  void init_uniform(float* x, int64_t n, uint64_t key, int64_t first, float scale) override {
    timed(OpKind::Elementwise, kComputeLane, compute_, 4 * n,
          [&] { cuda::init_uniform(compute_, x, n, key, first, scale); });
  }
  void position_bias_forward(Buf bias, CBuf table, const int* buckets, int heads, int tq, int tk) override {
    const DType t = common_dtype("position_bias_forward", {bias, table});
    elementwise(2 * dtype_size(t) * int64_t(heads) * tq * tk, t, [&](auto e) {
      cuda::position_bias_forward(compute_, as(e, bias), as(e, table), buckets, heads, tq, tk);
    });
  }
  void position_bias_backward(Buf dtable, CBuf dbias, const int* buckets, int heads, int tq, int tk) override {
    const DType t = common_dtype("position_bias_backward", {dtable, dbias});
    elementwise(2 * dtype_size(t) * int64_t(heads) * tq * tk, t, [&](auto e) {
      cuda::position_bias_backward(compute_, as(e, dtable), as(e, dbias), buckets, heads, tq, tk);
    });
  }
  void softmax_forward(Buf s, CBuf bias, bool causal, int batch, int heads, int tq, int tk) override {
    const DType t = common_dtype("softmax_forward", {s, bias});
    elementwise(2 * dtype_size(t) * int64_t(batch) * heads * tq * tk, t, [&](auto e) {
      cuda::softmax_forward(compute_, as(e, s), as(e, bias), causal, batch, heads, tq, tk);
    });
  }
  void softmax_backward(Buf ds, CBuf p, Buf dbias, int batch, int heads, int tq, int tk) override {
    const DType t = common_dtype("softmax_backward", {ds, p, dbias});
    elementwise(3 * dtype_size(t) * int64_t(batch) * heads * tq * tk, t, [&](auto e) {
      cuda::softmax_backward(compute_, as(e, ds), as(e, p), as(e, dbias), batch, heads, tq, tk);
    });
  }
  void attention_forward(Buf o, float* lse, CBuf q, CBuf k, CBuf v, CBuf table, const int* rel,
                         const AttentionShape& s) override {
    const DType t = common_dtype("attention_forward", {o, q, k, v, table});
    require_attention_head_dim(s);
    const int64_t nq = int64_t(s.batch) * s.tq * s.ld(), nk = int64_t(s.batch) * s.tk * s.ld();
    const auto shape = attention_gemm_shape(s, false);
    const bool mma = tensor_core_attention(t);
    timed(OpKind::Gemm, kComputeLane, compute_, dtype_size(t) * (2 * nq + 2 * nk), [&] {
      with_type(t, [&](auto e) {
        if constexpr (!std::is_same_v<decltype(e), float>)
          if (mma)
            return cuda::attention_forward_mma(compute_, as(e, o), lse, as(e, q), as(e, k), as(e, v), as(e, table),
                                               rel, s);
        cuda::attention_forward(compute_, as(e, o), lse, as(e, q), as(e, k), as(e, v), as(e, table), rel, s);
      });
    }, attention_flops(s, false), shape.data());
  }
  void attention_backward(Buf dq, Buf dk, Buf dv, Buf dtable, CBuf dout, CBuf q, CBuf k, CBuf v, CBuf o,
                          const float* lse, CBuf table, const int* rel, float* workspace,
                          const AttentionShape& s) override {
    const DType t = common_dtype("attention_backward", {dq, dk, dv, dtable, dout, q, k, v, o, table});
    SB_ASSERT(!table || dtable, "attention_backward with a bias table needs its gradient");
    require_attention_head_dim(s);
    const int64_t nq = int64_t(s.batch) * s.tq * s.ld(), nk = int64_t(s.batch) * s.tk * s.ld();
    const auto shape = attention_gemm_shape(s, true);
    const bool mma = tensor_core_attention(t);
    timed(OpKind::Gemm, kComputeLane, compute_, dtype_size(t) * (4 * nq + 4 * nk), [&] {
      with_type(t, [&](auto e) {
        if constexpr (!std::is_same_v<decltype(e), float>)
          if (mma)
            return cuda::attention_backward_mma(compute_, as(e, dq), as(e, dk), as(e, dv), as(e, dtable),
                                                as(e, dout), as(e, q), as(e, k), as(e, v), as(e, o), lse,
                                                as(e, table), rel, workspace, s);
        cuda::attention_backward(compute_, as(e, dq), as(e, dk), as(e, dv), as(e, dtable), as(e, dout), as(e, q),
                                 as(e, k), as(e, v), as(e, o), lse, as(e, table), rel, workspace, s);
      });
    }, attention_flops(s, true), shape.data());
  }
  static void require_attention_head_dim(const AttentionShape& s) {
    if (s.d_kv > cuda::kAttentionMaxHeadDim)
      throw UsageError("--attention fused on cuda supports d_kv up to " +
                       std::to_string(cuda::kAttentionMaxHeadDim) + " (got " + std::to_string(s.d_kv) +
                       "); use --attention unfused");
  }
  // Whether the fused op runs on tensor cores (ComputeOptions::attention_kernel): auto and
  // mma for bf16/fp16 on sm_80 and later; fp32 always runs the FMA kernels.
  bool tensor_core_attention(DType t) const {
    const AttentionKernel k = options_.attention_kernel;
    if (k == AttentionKernel::Fma) return false;
    const bool can = t != DType::F32 && prop_.major >= 8;
    if (!can && k == AttentionKernel::Mma)
      throw UsageError(std::string("--attention-kernel mma needs bf16 or fp16 tensors on sm_80 or later (got ") +
                       precision_name(t) + " on sm_" + std::to_string(prop_.major) + std::to_string(prop_.minor) +
                       "); use --attention-kernel fma or auto");
    return can;
  }
  void cross_entropy(Buf logits, float* losses, const int* labels, int n, int vocab, float grad_scale) override {
    elementwise(2 * dtype_size(logits.dtype) * int64_t(n) * vocab, logits.dtype, [&](auto e) {
      cuda::cross_entropy(compute_, as(e, logits), losses, labels, n, vocab, grad_scale);
    });
  }
  void cross_entropy_max(CBuf logits, float* row_max, int n, int vocab) override {
    elementwise(dtype_size(logits.dtype) * int64_t(n) * vocab, logits.dtype, [&](auto e) {
      cuda::cross_entropy_max(compute_, as(e, logits), row_max, n, vocab);
    });
  }
  void cross_entropy_sums(CBuf logits, const float* row_max, const int* labels, float* sums, int n,
                          int vocab) override {
    elementwise(dtype_size(logits.dtype) * int64_t(n) * vocab, logits.dtype, [&](auto e) {
      cuda::cross_entropy_sums(compute_, as(e, logits), row_max, labels, sums, n, vocab);
    });
  }
  void cross_entropy_finish(Buf logits, float* losses, const float* row_max, const float* sums, const int* labels,
                            int n, int vocab, float grad_scale) override {
    elementwise(2 * dtype_size(logits.dtype) * int64_t(n) * vocab, logits.dtype, [&](auto e) {
      cuda::cross_entropy_finish(compute_, as(e, logits), losses, row_max, sums, labels, n, vocab, grad_scale);
    });
  }
  // A 4-byte flag outside the ledger (the plan has no device-side flag), zeroed, set by the
  // kernel, read back: one host synchronisation.
  bool all_finite(CBuf x, int64_t n) override {
    boundary();  // it reads the answer back on the host
    const NoCapture not_captured(*this);
    if (!nonfinite_flag_) CUDA_CHECK(cudaMalloc(&nonfinite_flag_, sizeof(int)));
    timed(OpKind::Elementwise, kComputeLane, compute_, dtype_size(x.dtype) * n, [&] {
      CUDA_CHECK(cudaMemsetAsync(nonfinite_flag_, 0, sizeof(int), compute_));
      with_type(x.dtype, [&](auto e) { cuda::flag_nonfinite(compute_, as(e, x), n, nonfinite_flag_); });
    });
    int flag = 0;
    CUDA_CHECK(cudaMemcpyAsync(&flag, nonfinite_flag_, sizeof(int), cudaMemcpyDeviceToHost, compute_));
    CUDA_CHECK(cudaStreamSynchronize(compute_));
    return flag == 0;
  }
  void optimizer_update(const OptimizerConfig& c, int step, float* p, CBuf g, void* state, int64_t n,
                        Buf copy) override {
    // The step's scalars on the host, exactly as the host optimizer derives them.
    const OptimizerStepConstants k = optimizer_step_constants(c, step);
    const cuda::OptimizerKernelArgs args{c.beta1, c.beta2, k.eps, k.step_size, k.inv_bc2, k.decay, c.grad_unscale,
                                         c.lr, c.weight_decay, c.momentum, k.decays};
    static const cuda::DynamicMaps maps = [] {
      cuda::DynamicMaps d;
      std::copy(dynamic_map(true).begin(), dynamic_map(true).end(), d.signed_map);
      std::copy(dynamic_map(false).begin(), dynamic_map(false).end(), d.unsigned_map);
      return d;
    }();
    (void)maps;  // used in the launch below (nvcc's host pass warns otherwise)
    if (c.kind == OptimizerKind::Sgd && c.momentum == 0.f) state = nullptr;
    const DType out_type = copy.ptr ? copy.dtype : DType::F32;  // a null fp32 copy: none
    timed(OpKind::Optimizer, kComputeLane, compute_, optimizer_bytes_touched(c, n, g.dtype, copy), [&] {
      with_type(g.dtype, [&](auto e) {
        with_type(out_type, [&](auto o) {
          cuda::optimizer_update(compute_, int(c.kind), args, p, as(e, g), state, n, maps, as(o, copy));
        });
      });
    });
  }
  // Zero bytes, and for adamw-8bit each moment's codes the code of 0 (a byte each: memsets).
  void optimizer_init_state(const OptimizerConfig& c, void* state, int64_t n) override {
    const int64_t bytes = optimizer_state_bytes(c, n);
    timed(OpKind::Elementwise, kComputeLane, compute_, bytes, [&] {
      if (c.kind != OptimizerKind::AdamW8bit) {
        if (bytes > 0) CUDA_CHECK(cudaMemsetAsync(state, 0, size_t(bytes), compute_));
        return;
      }
      const int64_t blocks = (n + kOptimizerBlock - 1) / kOptimizerBlock;
      char* base = static_cast<char*>(state);
      CUDA_CHECK(cudaMemsetAsync(base, 0, size_t(8 * blocks), compute_));
      CUDA_CHECK(cudaMemsetAsync(base + 8 * blocks, zero_code(true), size_t(n), compute_));
      CUDA_CHECK(cudaMemsetAsync(base + 8 * blocks + n, zero_code(false), size_t(n), compute_));
    });
  }

  // ---- collectives ----
  void range_push(Phase phase, int unit) override {  // "forward unit 3", as the trace names the scope
    char name[64];
    if (unit >= 0) std::snprintf(name, sizeof name, "%s unit %d", phase_name(phase), unit);
    else std::snprintf(name, sizeof name, "%s", phase_name(phase));
    nvtxRangePushA(name);
  }
  void range_pop() override { nvtxRangePop(); }

  std::unique_ptr<Comm> make_comm(MPI_Comm c) override {
    if (uses_mpi(comm_library_)) return std::make_unique<CudaMpiComm>(c);
    CUDA_CHECK(cudaSetDevice(device_));  // NCCL binds the communicator to the current device
    return std::make_unique<NcclComm>(c);
  }
  // NCCL has every type, reduction (ncclAvg included) and collective of CollectiveArgs.
  // CollectiveArgs follow NCCL's buffer conventions (in place included), so each maps to one
  // NCCL call; all-to-all and send-recv are grouped point-to-point calls. Bytes as the CPU
  // backend records them: the full buffer.
  // Over MPI as well: staging divides averages and runs the 16-bit reductions on the host.
  Request collective(const CollectiveArgs& a, Comm& c) override {
    require_supported(a);
    if (recorder_) axis_of_[next_request_] = {c.axis(), a.peer};  // recorded with the collective
    if (uses_mpi(comm_library_)) return issue_mpi(a, c);
    const ncclComm_t n = nccl(c);
    const int size = c.size(), rank = c.rank(), es = dtype_size(a.dtype);
    const ncclDataType_t t = nccl_type(a.dtype);
    const ncclRedOp_t op = nccl_op(a.redop);
    const size_t count = size_t(a.count);
    // A tensor-parallel collective runs in the compute stream's order: the next layer needs
    // its result, and it must not queue behind the data-parallel collectives of comm_.
    // A point-to-point send or receive runs on the stream of its direction (the pipeline's
    // activations or gradients), so a blocked send of one direction never holds up the other
    // (one NCCL communicator per direction: docs/architecture.md).
    const cudaStream_t s = collective_info(a.op).point_to_point ? p2p_[int(a.direction)]
                           : c.axis() == int(Axis::Tensor)      ? compute_
                           : a.after == kNoRequest              ? comm_
                                                                : ordered_;
    return issue(collective_kind(a.op), collective_bytes(a, size), size, s, a.after, [&] {
      switch (a.op) {
        case Collective::AllReduce: NCCL_CHECK(ncclAllReduce(a.send, a.recv, count, t, op, n, s)); break;
        case Collective::AllGather: NCCL_CHECK(ncclAllGather(a.send, a.recv, count, t, n, s)); break;
        case Collective::ReduceScatter:
          NCCL_CHECK(ncclReduceScatter(a.send, a.recv, count, t, op, n, s));
          break;
        case Collective::Broadcast: NCCL_CHECK(ncclBroadcast(a.send, a.recv, count, t, a.root, n, s)); break;
        case Collective::Reduce: NCCL_CHECK(ncclReduce(a.send, a.recv, count, t, op, a.root, n, s)); break;
        case Collective::AllToAll: all_to_all(a, t, n, size, es, s); break;
        case Collective::SendRecv: {  // send to rank+1, receive from rank−1
          NCCL_CHECK(ncclGroupStart());
          NCCL_CHECK(ncclSend(a.send, count, t, (rank + 1) % size, n, s));
          NCCL_CHECK(ncclRecv(a.recv, count, t, (rank - 1 + size) % size, n, s));
          NCCL_CHECK(ncclGroupEnd());
          break;
        }
        case Collective::Send: NCCL_CHECK(ncclSend(a.send, count, t, a.peer, n, s)); break;
        case Collective::Recv: NCCL_CHECK(ncclRecv(a.recv, count, t, a.peer, n, s)); break;
        default: SB_FATAL("unknown collective");
      }
    });
  }
  // The compute stream (not the host) waits for the collective; the stall it causes is
  // timed on the compute stream as exposed communication.
  // Over MPI the host first drives the collective until its last H2D copy is enqueued.
  void wait(Request r) override {
    boundary();  // the compute stream waits at this point, outside any graph
    while (mpi_pending(r)) progress_mpi();
    auto it = requests_.find(r);
    if (it == requests_.end()) return;  // completed earlier (test() or synchronize())
    const cudaEvent_t done = it->second.done;
    timed(OpKind::Wait, kComputeLane, compute_, 0, [&] { CUDA_CHECK(cudaStreamWaitEvent(compute_, done, 0)); },
          0.0, nullptr, r);
    // cudaStreamWaitEvent has captured the event: it may be recorded again at once.
    free_done_.push_back(done);
    requests_.erase(it);
  }
  bool test(Request r) override {
    progress_mpi();
    if (mpi_pending(r)) return false;
    auto it = requests_.find(r);
    if (it == requests_.end()) return true;
    const cudaError_t rc = cudaEventQuery(it->second.done);
    if (rc == cudaErrorNotReady) return false;
    CUDA_CHECK(rc);
    free_done_.push_back(it->second.done);  // finished on the GPU: its writes are visible to later work
    requests_.erase(it);
    return true;
  }
  // Waits for both streams, then hands every operation issued since the last call to the
  // recorder with its GPU times, in completion order.
  void synchronize() override {
    boundary();
    if (graphs_) graphs_->restart();  // the next segment is the first of a step
    drain_mpi();
    CUDA_CHECK(cudaStreamSynchronize(compute_));
    CUDA_CHECK(cudaStreamSynchronize(comm_));
    CUDA_CHECK(cudaStreamSynchronize(ordered_));
    for (cudaStream_t p2p : p2p_) CUDA_CHECK(cudaStreamSynchronize(p2p));
    for (cudaStream_t c : copy_) CUDA_CHECK(cudaStreamSynchronize(c));
    for (auto& [r, o] : requests_) free_done_.push_back(o.done);  // all complete now
    requests_.clear();
    resolve_timed_ops();
    anchor();
  }

  double now() const override {
    return std::chrono::duration<double>(std::chrono::steady_clock::now() - epoch_).count();
  }

  // --fused-epilogues needs cuBLASLt and a workspace; --cuda-graphs a workspace for cuBLAS
  // (so it allocates none inside a capture) and the segments. The workspace (32 MiB, as
  // cuBLAS's own default on Hopper) is library memory outside the ledger, like cuBLAS's.
  void set_compute_options(const ComputeOptions& o) override {
    if (o.exact_sums) throw UsageError("exact sums (--check's tensor-parallel lockstep) run on the CPU backend only");
    boundary();
    if (graphs_ && !o.graphs) {  // its executable graphs may still run: wait, then destroy them
      CUDA_CHECK(cudaStreamSynchronize(compute_));
      graphs_.reset();
    }
    Backend::set_compute_options(o);
    if ((o.fused_epilogues || o.graphs) && !library_workspace_) {
      CUDA_CHECK(cudaMalloc(&library_workspace_, kLibraryWorkspace));
      CUBLAS_CHECK(cublasSetWorkspace(cublas_, library_workspace_, kLibraryWorkspace));
    }
    if (o.fused_epilogues && !lt_) CUBLAS_CHECK(cublasLtCreate(&lt_));
    if (o.graphs && !graphs_) graphs_ = std::make_unique<GraphSegments>(graph_stream_);
  }

 private:
  static constexpr int kComputeLane = 0;

  void make_streams() {
    // The communication stream gets the highest priority so NCCL kernels are scheduled as
    // soon as their inputs are ready, between the compute kernels that would delay them.
    int least = 0, greatest = 0;
    CUDA_CHECK(cudaDeviceGetStreamPriorityRange(&least, &greatest));
    CUDA_CHECK(cudaStreamCreateWithPriority(&compute_, cudaStreamNonBlocking, least));
    CUDA_CHECK(cudaStreamCreateWithPriority(&comm_, cudaStreamNonBlocking, greatest));
    CUDA_CHECK(cudaStreamCreateWithPriority(&ordered_, cudaStreamNonBlocking, greatest));
    for (cudaStream_t& p2p : p2p_) CUDA_CHECK(cudaStreamCreateWithPriority(&p2p, cudaStreamNonBlocking, greatest));
    for (cudaStream_t& c : copy_) CUDA_CHECK(cudaStreamCreateWithPriority(&c, cudaStreamNonBlocking, greatest));
  }
  // An operation of the host thread (host_compute and its waits), timed by the backend clock.
  void host_timed(OpKind kind, double start, double end, int64_t bytes, Request request) {
    if (recorder_)
      timed_.push_back(TimedOp{kind, phase(), unit(), kHostLane, nullptr, nullptr, bytes, 0.0, false, {}, request, 0,
                               start, end});
  }

  void make_cublas() {
    CUBLAS_CHECK(cublasCreate(&cublas_));
    CUBLAS_CHECK(cublasSetStream(cublas_, compute_));
    tf32_ = env_is_one("SB_CUDA_TF32");
    CUBLAS_CHECK(cublasSetMathMode(cublas_, CUBLAS_DEFAULT_MATH));  // the compute type of each call decides
  }

  // The default pool gives freed memory back to the driver at every synchronisation unless
  // told to keep it; a training step frees and reallocates the same sizes every step.
  void keep_pool_memory() {
    CUDA_CHECK(cudaDeviceGetDefaultMemPool(&pool_, device_));
    uint64_t keep = UINT64_MAX;
    CUDA_CHECK(cudaMemPoolSetAttribute(pool_, cudaMemPoolAttrReleaseThreshold, &keep));
  }

  std::string out_of_memory_message(size_t bytes, MemCategory cat) const {
    size_t free_bytes = 0, total = 0;
    cudaMemGetInfo(&free_bytes, &total);
    std::string held;
    for (int c = 0; c < kMemCategories; ++c)
      if (mem_current()[c] > 0)
        held += std::string(held.empty() ? "" : ", ") + mem_category_name(MemCategory(c)) + " " +
                human_bytes(double(mem_current()[c]));
    return "out-of-memory: cudaMallocAsync of " + human_bytes(double(bytes)) + " (" + std::to_string(bytes) +
           " bytes) for " + mem_category_name(cat) + " failed on " + device_name() + ": shardbench holds " +
           human_bytes(double(mem_total_current())) + (held.empty() ? "" : " (" + held + ")") + ", the device has " +
           human_bytes(double(free_bytes)) + " free of " + human_bytes(double(total)) +
           "; plan with --plan --mem-limit-gib <GPU GiB>, or lower --batch, or add "
           "--activation-checkpointing or ranks";
  }

  // Pairs GPU time with the backend clock: an event recorded on an idle stream completes
  // between the two host readings around it. Re-anchored at every synchronize() so the
  // elapsed times stay short (cudaEventElapsedTime is a float in milliseconds).
  void anchor() {
    const double t0 = now();
    CUDA_CHECK(cudaEventRecord(anchor_event_, compute_));
    CUDA_CHECK(cudaEventSynchronize(anchor_event_));
    anchor_time_ = 0.5 * (t0 + now());
  }
  double host_time(cudaEvent_t e) const {
    float ms = 0.f;
    CUDA_CHECK(cudaEventElapsedTime(&ms, anchor_event_, e));
    return anchor_time_ + 1e-3 * double(ms);
  }

  cudaEvent_t timing_event() {
    if (free_events_.empty()) {
      cudaEvent_t e;
      CUDA_CHECK(cudaEventCreate(&e));
      return e;
    }
    const cudaEvent_t e = free_events_.back();
    free_events_.pop_back();
    return e;
  }
  cudaEvent_t done_event() {
    if (free_done_.empty()) {
      cudaEvent_t e;
      CUDA_CHECK(cudaEventCreateWithFlags(&e, cudaEventDisableTiming));
      return e;
    }
    const cudaEvent_t e = free_done_.back();
    free_done_.pop_back();
    return e;
  }

  // Enqueues `launch` on stream `s` between two timing events (when a recorder listens),
  // tagged with the phase and unit current at issue.
  template <class Launch>
  void timed(OpKind kind, int lane, cudaStream_t s, int64_t bytes, Launch&& launch, double flops = 0.0,
             const int32_t* gemm_shape = nullptr, Request request = kNoRequest, int ranks = 0) {
    const bool captured = graphs_ && s == compute_ && kind != OpKind::Wait && !no_capture_;
    if (captured) graphs_->compute();  // starts the segment's capture unless it runs
    if (!recorder_) {
      launch();
    } else if (captured) {  // the segment's own events, recorded as nodes of its graph
      const auto [e0, e1] = segment_events(graphs_->segment(), graphs_->op_in_segment());
      TimedOp t{kind, phase(), unit(), lane, e0, e1, bytes, flops, gemm_shape != nullptr, {}, request, ranks};
      t.pooled = false;
      if (gemm_shape) std::copy(gemm_shape, gemm_shape + 5, t.gemm);
      CUDA_CHECK(cudaEventRecordWithFlags(t.start, s, cudaEventRecordExternal));
      launch();
      CUDA_CHECK(cudaEventRecordWithFlags(t.end, s, cudaEventRecordExternal));
      timed_.push_back(t);
    } else {
      TimedOp t{kind, phase(), unit(), lane, timing_event(), timing_event(), bytes, flops,
                gemm_shape != nullptr, {}, request, ranks};
      if (gemm_shape) std::copy(gemm_shape, gemm_shape + 5, t.gemm);
      CUDA_CHECK(cudaEventRecord(t.start, s));
      launch();
      CUDA_CHECK(cudaEventRecord(t.end, s));
      timed_.push_back(t);
    }
    // MPI advances only when called: every compute launch moves outstanding collectives on.
    if (lane == kComputeLane) progress_mpi();
  }
  // An elementwise kernel on element type t: launch(e) with e a value of that type.
  template <class Launch>
  void elementwise(int64_t bytes, DType t, Launch&& launch) {
    timed(OpKind::Elementwise, kComputeLane, compute_, bytes, [&] { with_type(t, launch); });
  }
  cublasComputeType_t compute_type(DType t) const {
    return t == DType::F32 && tf32_ ? CUBLAS_COMPUTE_32F_FAST_TF32 : CUBLAS_COMPUTE_32F;
  }

  // A collective on stream s: s waits for the compute stream's work issued so far (and for
  // `after` when it is outstanding), runs the NCCL call, and records `done`, which the
  // request maps to.
  template <class Launch>
  Request issue(OpKind kind, int64_t bytes, int ranks, cudaStream_t s, Request after, Launch&& nccl_call) {
    boundary();  // the collective's input is what the compute stream has run up to here
    char range[96];  // "all-gather unit 3, 48.0 MiB": the collective on Nsight's timeline
    std::snprintf(range, sizeof range, "%s unit %d, %s", op_kind_name(kind), unit(), human_bytes(bytes).c_str());
    nvtxRangePushA(range);
    struct Pop {
      ~Pop() { nvtxRangePop(); }
    } pop;
    CUDA_CHECK(cudaEventRecord(ready_, compute_));
    CUDA_CHECK(cudaStreamWaitEvent(s, ready_, 0));  // captured: ready_ is reusable at once
    auto prev = requests_.find(after);
    if (prev != requests_.end()) CUDA_CHECK(cudaStreamWaitEvent(s, prev->second.done, 0));
    const Request id = next_request_++;
    const int lane = s == comm_ ? kCommLane : s == ordered_ ? kOrderedLane : s == compute_ ? kTensorLane
                     : s == copy_[int(CopyDirection::HostToDevice)] ? kCopyH2DLane
                     : s == copy_[int(CopyDirection::DeviceToHost)] ? kCopyD2HLane
                     : s == p2p_[int(P2PDirection::Activations)] ? kActivationLane : kGradientLane;
    timed(kind, lane, s, bytes, nccl_call, 0.0, nullptr, id, ranks);
    const cudaEvent_t done = done_event();
    CUDA_CHECK(cudaEventRecord(done, s));
    requests_[id] = {done, s};
    return id;
  }

  // count/size elements to and from every peer, as one NCCL group.
  void all_to_all(const CollectiveArgs& a, ncclDataType_t t, ncclComm_t n, int size, int es, cudaStream_t s) {
    SB_ASSERT(a.count % size == 0 && a.send != a.recv, "all-to-all needs count divisible by ranks, out of place");
    const size_t each = size_t(a.count / size), stride = each * size_t(es);
    NCCL_CHECK(ncclGroupStart());
    for (int peer = 0; peer < size; ++peer) {
      NCCL_CHECK(ncclSend(static_cast<const char*>(a.send) + peer * stride, each, t, peer, n, s));
      NCCL_CHECK(ncclRecv(static_cast<char*>(a.recv) + peer * stride, each, t, peer, n, s));
    }
    NCCL_CHECK(ncclGroupEnd());
  }

  // ---- StagingDevice: the communication stream, as the MPI path (mpi_stager.h) uses it ----
  static cudaEvent_t event(Mark m) { return static_cast<cudaEvent_t>(m); }
  void stage_copy(void* dst, size_t dpitch, const void* src, size_t spitch, size_t width, size_t height,
                  Phase phase, int unit) override {
    const ScopedContext ctx(*this, phase, unit);
    timed(OpKind::Copy, kCommLane, comm_, int64_t(width * height), [&] {
      if (height == 1)
        CUDA_CHECK(cudaMemcpyAsync(dst, src, width, cudaMemcpyDefault, comm_));
      else
        CUDA_CHECK(cudaMemcpy2DAsync(dst, dpitch, src, spitch, width, height, cudaMemcpyDefault, comm_));
    });
  }
  void comm_after(Mark m) override {
    CUDA_CHECK(cudaStreamWaitEvent(comm_, event(m), 0));
    free_done_.push_back(event(m));  // captured: reusable at once
  }
  Mark comm_mark() override {
    const cudaEvent_t e = done_event();
    CUDA_CHECK(cudaEventRecord(e, comm_));
    return e;
  }
  bool mark_passed(Mark m) override {
    const cudaError_t rc = cudaEventQuery(event(m));
    if (rc == cudaErrorNotReady) return false;
    CUDA_CHECK(rc);
    return true;
  }
  void release_mark(Mark m) override { free_done_.push_back(event(m)); }
  void comm_sync() override { CUDA_CHECK(cudaStreamSynchronize(comm_)); }
  char* host_alloc(size_t bytes) override {  // host memory: outside the device ledger, as the slots
    char* p = nullptr;
    CUDA_CHECK(cudaHostAlloc(reinterpret_cast<void**>(&p), bytes, cudaHostAllocDefault));
    return p;
  }
  void host_free(char* p) override { cudaFreeHost(p); }  // at teardown: errors cannot be acted on
  double comm_clock() override { return now(); }
  void collective_done(Request id, Mark done, OpKind kind, Phase phase, int unit, int64_t bytes, double start,
                       double end) override {
    requests_[id] = {event(done), comm_};
    auto ranks = mpi_ranks_.find(id);
    const int n = ranks == mpi_ranks_.end() ? 0 : ranks->second;
    if (ranks != mpi_ranks_.end()) mpi_ranks_.erase(ranks);
    if (recorder_)
      timed_.push_back(TimedOp{kind, phase, unit, mpi_lane(start, end), nullptr, nullptr, bytes, 0.0, false, {}, id,
                               n, start, end});
  }

  void make_mpi_path() {
    CUDA_CHECK(cudaHostAlloc(reinterpret_cast<void**>(&host_slots_), size_t(staging_.total_bytes()),
                             cudaHostAllocDefault));
    StagingDevice& stream = *this;  // a private base: converted here, where it is accessible
    stager_ = std::make_unique<MpiStager>(stream, comm_library_, awareness_, staging_, host_slots_);
  }
  // A collective, send or receive over MPI: its inputs are complete (a receive's buffer is
  // free) at this point of the compute stream. One ordered after another (CollectiveArgs::after) starts once that one has enqueued its last
  // copy on the communication stream, which then orders the two.
  Request issue_mpi(const CollectiveArgs& a, Comm& c) {
    boundary();
    auto* m = dynamic_cast<CudaMpiComm*>(&c);
    SB_ASSERT(m, "a collective on a communicator that the CUDA backend did not make");
    while (a.after != kNoRequest && mpi_pending(a.after)) progress_mpi();
    mpi_ranks_[next_request_] = c.size();
    const cudaEvent_t ready = done_event();
    // After an outstanding copy_async: `ready` is recorded on its copy stream once that has
    // also reached this point of the compute stream (later copies wait for that anyway), so
    // the stager's one mark orders the collective after both.
    auto copy = requests_.find(a.after);
    if (copy != requests_.end() && (copy->second.stream == copy_[0] || copy->second.stream == copy_[1])) {
      CUDA_CHECK(cudaEventRecord(ready_, compute_));
      CUDA_CHECK(cudaStreamWaitEvent(copy->second.stream, ready_, 0));
      CUDA_CHECK(cudaEventRecord(ready, copy->second.stream));
    } else {
      CUDA_CHECK(cudaEventRecord(ready, compute_));
    }
    const Request id = next_request_++;
    stager_->issue(id, a, m->comm, phase(), unit(), ready);
    return id;
  }
  void progress_mpi() {
    if (!stager_) return;
    stager_->progress();
    flush_pending_frees();
  }
  void drain_mpi() {
    if (!stager_) return;
    stager_->drain();
    flush_pending_frees();
  }
  void free_after(void* p, Request r) {
    auto it = requests_.find(r);
    CUDA_CHECK(cudaFreeAsync(p, it == requests_.end() ? compute_ : it->second.stream));
  }
  // release_after's frees whose MPI request has left the stager (all of them at teardown).
  void flush_pending_frees() {
    for (size_t i = 0; i < pending_frees_.size();) {
      auto [p, r] = pending_frees_[i];
      if (stager_ && mpi_pending(r)) {
        ++i;
        continue;
      }
      free_after(p, r);
      pending_frees_[i] = pending_frees_.back();
      pending_frees_.pop_back();
    }
  }
  bool mpi_pending(Request r) const { return stager_ && stager_->pending(r); }

  // MPI calls of different collectives may overlap in time: the first lane free at `start`.
  int mpi_lane(double start, double end) {
    for (size_t i = 0; i < mpi_lane_end_.size(); ++i)
      if (mpi_lane_end_[i] <= start) {
        mpi_lane_end_[i] = end;
        return kMpiLane + int(i);
      }
    mpi_lane_end_.push_back(end);
    return kMpiLane + int(mpi_lane_end_.size()) - 1;
  }

  static ncclComm_t nccl(Comm& c) {
    auto* n = dynamic_cast<NcclComm*>(&c);
    SB_ASSERT(n, "a collective on a communicator that the CUDA backend did not make");
    return n->comm;
  }

  // Reports the finished operations to the recorder (with the phase and unit of their
  // issue) and returns their events to the pool.
  void resolve_timed_ops() {
    struct Resolved {
      double start, end;
      size_t index;
    };
    std::vector<Resolved> done;
    done.reserve(timed_.size());
    for (size_t i = 0; i < timed_.size(); ++i) {
      const TimedOp& t = timed_[i];
      done.push_back(t.start ? Resolved{host_time(t.start), host_time(t.end), i} : Resolved{t.host_start, t.host_end, i});
    }
    std::stable_sort(done.begin(), done.end(), [](const Resolved& a, const Resolved& b) { return a.end < b.end; });
    const Phase phase0 = phase();
    const int unit0 = unit();
    for (const Resolved& r : done) {
      const TimedOp& t = timed_[r.index];
      set_context(t.phase, t.unit);
      std::pair<int, int> axis_peer{-1, -1};
      if (t.ranks > 0) {  // a collective: its communicator's axis (and a send's or receive's peer)
        auto it = axis_of_.find(t.request);
        if (it != axis_of_.end()) axis_peer = it->second, axis_of_.erase(it);
      }
      record(t.kind, t.lane, r.start, r.end, t.bytes, t.flops, t.has_shape ? t.gemm : nullptr, t.request, t.ranks,
             -1, axis_peer.first, axis_peer.second);
    }
    set_context(phase0, unit0);
    for (const TimedOp& t : timed_)
      if (t.start && t.pooled) free_events_.insert(free_events_.end(), {t.start, t.end});
    timed_.clear();
  }

  // ---- --fused-epilogues: cuBLASLt matmuls with the ReLU epilogue, one plan per GEMM shape ----
  struct LtPlan {
    cublasLtMatmulDesc_t desc = nullptr;
    cublasLtMatrixLayout_t a = nullptr, b = nullptr, c = nullptr;
    cublasLtMatmulAlgo_t algo{};
    bool ok = false;  // cuBLASLt returned an algorithm
    void destroy() {
      if (desc) cublasLtMatmulDescDestroy(desc);
      for (cublasLtMatrixLayout_t l : {a, b, c})
        if (l) cublasLtMatrixLayoutDestroy(l);
    }
  };
  // The plan of C = relu(op(A) op(B)) in the row-major convention of gemm(): cuBLASLt's
  // column-major A is our B (op(tb), stored N×K or K×N), its B our A, C is N×M. Null when
  // cuBLASLt has no algorithm with the epilogue for it (said once on stderr).
  const LtPlan* lt_plan(bool ta, bool tb, int M, int N, int K, int lda, int ldb, int ldc, DType t) {
    const auto key = std::make_tuple(int(ta), int(tb), M, N, K, lda, ldb, ldc, int(t));
    auto it = lt_plans_.find(key);
    if (it == lt_plans_.end()) {
      LtPlan p;
      const cudaDataType_t ct = cuda_type(t);
      CUBLAS_CHECK(cublasLtMatmulDescCreate(&p.desc, compute_type(t), CUDA_R_32F));
      const cublasOperation_t opa = op(tb), opb = op(ta);
      const cublasLtEpilogue_t relu = CUBLASLT_EPILOGUE_RELU;
      CUBLAS_CHECK(cublasLtMatmulDescSetAttribute(p.desc, CUBLASLT_MATMUL_DESC_TRANSA, &opa, sizeof opa));
      CUBLAS_CHECK(cublasLtMatmulDescSetAttribute(p.desc, CUBLASLT_MATMUL_DESC_TRANSB, &opb, sizeof opb));
      CUBLAS_CHECK(cublasLtMatmulDescSetAttribute(p.desc, CUBLASLT_MATMUL_DESC_EPILOGUE, &relu, sizeof relu));
      CUBLAS_CHECK(cublasLtMatrixLayoutCreate(&p.a, ct, tb ? K : N, tb ? N : K, ldb));
      CUBLAS_CHECK(cublasLtMatrixLayoutCreate(&p.b, ct, ta ? M : K, ta ? K : M, lda));
      CUBLAS_CHECK(cublasLtMatrixLayoutCreate(&p.c, ct, N, M, ldc));
      cublasLtMatmulPreference_t pref = nullptr;
      CUBLAS_CHECK(cublasLtMatmulPreferenceCreate(&pref));
      const size_t ws = kLibraryWorkspace;
      CUBLAS_CHECK(cublasLtMatmulPreferenceSetAttribute(pref, CUBLASLT_MATMUL_PREF_MAX_WORKSPACE_BYTES, &ws, sizeof ws));
      cublasLtMatmulHeuristicResult_t found{};
      int count = 0;
      const cublasStatus_t rc =
          cublasLtMatmulAlgoGetHeuristic(lt_, p.desc, p.a, p.b, p.c, p.c, pref, 1, &found, &count);
      CUBLAS_CHECK(cublasLtMatmulPreferenceDestroy(pref));
      if (rc != CUBLAS_STATUS_NOT_SUPPORTED) cublas_check(rc, "cublasLtMatmulAlgoGetHeuristic", __FILE__, __LINE__);
      p.ok = rc == CUBLAS_STATUS_SUCCESS && count > 0;
      if (p.ok) p.algo = found.algo;
      else
        std::fprintf(stderr, "shardbench: note: cuBLASLt has no ReLU-epilogue algorithm for a %d x %d x %d %s GEMM; "
                             "it runs as GEMM then ReLU\n", M, N, K, precision_name(t));
      it = lt_plans_.emplace(key, p).first;
    }
    return it->second.ok ? &it->second : nullptr;
  }

  // ---- --cuda-graphs: GraphSegments over the compute stream ----
  struct GraphStream final : GraphDevice {
    explicit GraphStream(CudaBackend& backend) : b(backend) {}
    CudaBackend& b;
    // Relaxed: other threads' and this thread's non-stream calls (event queries of the
    // communication side, cudaFuncSetAttribute) stay legal while the compute stream captures.
    void begin_capture() override { CUDA_CHECK(cudaStreamBeginCapture(b.compute_, cudaStreamCaptureModeRelaxed)); }
    Graph end_capture() override {
      cudaGraph_t g = nullptr;
      CUDA_CHECK(cudaStreamEndCapture(b.compute_, &g));
      return g;
    }
    bool update(Exec e, Graph g) override {
      cudaGraphExecUpdateResultInfo info{};
      const cudaError_t rc = cudaGraphExecUpdate(static_cast<cudaGraphExec_t>(e), static_cast<cudaGraph_t>(g), &info);
      if (rc == cudaErrorGraphExecUpdateFailure) {  // another topology: the caller instantiates anew
        cudaGetLastError();
        return false;
      }
      CUDA_CHECK(rc);
      return true;
    }
    Exec instantiate(Graph g) override {
      cudaGraphExec_t e = nullptr;
      CUDA_CHECK(cudaGraphInstantiate(&e, static_cast<cudaGraph_t>(g), 0));
      return e;
    }
    void launch(Exec e) override { CUDA_CHECK(cudaGraphLaunch(static_cast<cudaGraphExec_t>(e), b.compute_)); }
    void destroy_graph(Graph g) override { CUDA_CHECK(cudaGraphDestroy(static_cast<cudaGraph_t>(g))); }
    void destroy_exec(Exec e) override { cudaGraphExecDestroy(static_cast<cudaGraphExec_t>(e)); }  // teardown
    void free_ordered(void* p) override { CUDA_CHECK(cudaFreeAsync(p, b.compute_)); }
  };
  // Ends the segment being captured (if any) and launches it: before whatever cannot be
  // captured (GraphSegments).
  void boundary() {
    if (graphs_) graphs_->boundary();
  }
  // Operations that must not start a capture (all_finite's readback).
  struct NoCapture {
    explicit NoCapture(CudaBackend& backend) : b(backend) { b.no_capture_ = true; }
    ~NoCapture() { b.no_capture_ = false; }
    CudaBackend& b;
  };
  // The timing events of operation `op` of segment `segment`: the same two events every
  // step, so the graph's event nodes keep their events and the update takes.
  std::pair<cudaEvent_t, cudaEvent_t> segment_events(int segment, int op) {
    if (segment_events_.size() <= size_t(segment)) segment_events_.resize(size_t(segment) + 1);
    auto& events = segment_events_[size_t(segment)];
    while (events.size() <= size_t(op)) {
      cudaEvent_t a = nullptr, b = nullptr;
      CUDA_CHECK(cudaEventCreate(&a));
      CUDA_CHECK(cudaEventCreate(&b));
      events.push_back({a, b});
    }
    return events[size_t(op)];
  }

  static constexpr size_t kLibraryWorkspace = size_t(32) << 20;
  cublasLtHandle_t lt_ = nullptr;
  void* library_workspace_ = nullptr;  // cuBLAS's and cuBLASLt's (set once an option needs it)
  std::map<std::tuple<int, int, int, int, int, int, int, int, int>, LtPlan> lt_plans_;
  GraphStream graph_stream_{*this};
  std::unique_ptr<GraphSegments> graphs_;  // with --cuda-graphs
  std::vector<std::vector<std::pair<cudaEvent_t, cudaEvent_t>>> segment_events_;
  bool no_capture_ = false;

  std::chrono::steady_clock::time_point epoch_;
  int device_ = -1;
  cudaDeviceProp prop_{};
  bool tf32_ = false;
  cudaStream_t compute_ = nullptr, comm_ = nullptr, ordered_ = nullptr;
  cudaStream_t p2p_[2] = {nullptr, nullptr};  // pipeline sends and receives, by P2PDirection
  cudaStream_t copy_[2] = {nullptr, nullptr};  // copy_async, by CopyDirection (kCopyH2DLane, kCopyD2HLane)
  cublasHandle_t cublas_ = nullptr;
  cudaMemPool_t pool_ = nullptr;        // the device's default pool, which alloc() draws from
  cudaEvent_t ready_ = nullptr;         // compute-stream point a collective starts after
  cudaEvent_t anchor_event_ = nullptr;  // GPU time origin of the pending timed operations
  double anchor_time_ = 0.0;            // its backend-clock time
  std::vector<TimedOp> timed_;          // issued since the last synchronize()
  std::vector<cudaEvent_t> free_events_, free_done_;
  struct Outstanding {
    cudaEvent_t done;
    cudaStream_t stream;
  };
  std::unordered_map<Request, Outstanding> requests_;  // outstanding collective → its done event
  Request next_request_ = 0;
  int* nonfinite_flag_ = nullptr;  // all_finite(): device flag, made on first use
  // ---- the MPI path (--comm mpi*) ----
  CommLibrary comm_library_;
  CudaAwareness awareness_ = CudaAwareness::Unknown;
  int sharing_ = 1;               // local ranks on this GPU
  StagingConfig staging_;
  char* host_slots_ = nullptr;    // pinned: staging_.slots × slot_bytes, outside the ledger (host memory)
  std::unique_ptr<MpiStager> stager_;
  std::vector<double> mpi_lane_end_;  // end of the last MPI call on each lane from kMpiLane
  std::unordered_map<Request, int> mpi_ranks_;  // MPI collectives in the stager: their ranks
  std::unordered_map<Request, std::pair<int, int>> axis_of_;  // collectives not yet recorded: axis, peer
  std::vector<std::pair<void*, Request>> pending_frees_;  // release_after on a request still staged
};

}  // namespace

}  // namespace sb

// The plugin's entry points (shardbench/backend/cuda_plugin.h): found by dlsym in
// libshardbench_cuda.so, or linked directly into the GPU tests.
extern "C" sb::Backend* sb_cuda_backend_new(int comm) { return new sb::CudaBackend(sb::CommLibrary(comm)); }

extern "C" void sb_cuda_library_versions(int* cudart, int* nccl) {
  *cudart = 0, *nccl = 0;
  if (cudaRuntimeGetVersion(cudart) != cudaSuccess) *cudart = 0;
  if (ncclGetVersion(nccl) != ncclSuccess) *nccl = 0;
}
