// The backend: compute, memory, collectives and timing behind one interface. It knows
// nothing of models or strategies. Implementations: CPU (BLAS + MPI non-blocking
// collectives), counting (memory and FLOP accounting only, used by the plan), CUDA (cuBLAS + NCCL).
//
// Tensors are row-major and live in the backend's memory: callers never dereference a
// backend pointer on the host (the counting backend hands out addresses that point
// nowhere). Host data moves through upload()/download(). Compute operations take Buf/CBuf
// (address + element type: fp32, bf16 or fp16, all arguments of one call alike, math in
// fp32); master parameters, optimizer state, norms' rstd and losses are always fp32.
#pragma once
#include <mpi.h>

#include <array>
#include <cstddef>
#include <cstdint>
#include <cstdio>
#include <functional>
#include <initializer_list>
#include <memory>
#include <string>
#include <vector>


namespace sb {

enum class DType : int { F32, F64, I32, I64, U8, BF16, F16, kCount };
const char* dtype_name(DType t);    // nccl-tests names: float, double, int32, int64, uint8, bfloat16, half
// Bytes an element takes. Inline: a view's `+ n` calls it, per sequence in attention's loops.
inline int dtype_size(DType t) {
  static constexpr int sizes[] = {4, 8, 4, 8, 1, 2, 2};
  return int(t) >= 0 && t < DType::kCount ? sizes[int(t)] : 0;
}
// Training precisions (--dtype, --reduce-dtype): "fp32", "bf16", "fp16".
const char* precision_name(DType t);
DType parse_precision(const std::string& s, const std::string& flag);  // throws UsageError

// A tensor (or a view into one) in backend memory with its element type. `+ n` moves by n
// elements. A float* converts implicitly, so fp32 callers read as before.
struct Buf {
  void* ptr = nullptr;
  DType dtype = DType::F32;
  Buf() = default;
  Buf(std::nullptr_t) {}
  Buf(float* p) : ptr(p) {}
  Buf(void* p, DType t) : ptr(p), dtype(t) {}
  Buf operator+(int64_t n) const { return {static_cast<char*>(ptr) + n * dtype_size(dtype), dtype}; }
  explicit operator bool() const { return ptr != nullptr; }
};
struct CBuf {
  const void* ptr = nullptr;
  DType dtype = DType::F32;
  CBuf() = default;
  CBuf(std::nullptr_t) {}
  CBuf(const float* p) : ptr(p) {}
  CBuf(const void* p, DType t) : ptr(p), dtype(t) {}
  CBuf(const Buf& b) : ptr(b.ptr), dtype(b.dtype) {}
  CBuf operator+(int64_t n) const { return {static_cast<const char*>(ptr) + n * dtype_size(dtype), dtype}; }
  explicit operator bool() const { return ptr != nullptr; }
};

enum class MemCategory : int {
  Parameters,      // owned parameters (a shard under FSDP, the full model under DDP)
  Gradients,       // owned gradients (a shard under FSDP, the buckets under DDP)
  OptimizerState,  // the optimizer's state (Adam moments, SGD momentum, 8-bit codes)
  Activations,     // saved for backward
  CommBuffers,     // gathered units, unsharded gradients before reduction
  Workspace,       // temporaries of one operation or model piece, inputs
  kCount
};
constexpr int kMemCategories = int(MemCategory::kCount);
const char* mem_category_name(MemCategory c);
using MemBytes = std::array<int64_t, kMemCategories>;

// What a recorded operation is, for traces and the step breakdown.
enum class OpKind : int {
  Gemm, Elementwise, Optimizer, Copy,          // compute lane (Optimizer, Copy: also the offload lanes)
  AllReduce, AllGather, ReduceScatter,         // communication lanes
  Wait,                                        // compute lane blocked on communication
  Progress,                                    // compute lane driving MPI collectives (CPU)
  Broadcast, Reduce, AllToAll, SendRecv,       // communication lanes (collective_perf)
  Send, Recv,                                  // point to point (pipeline stages)
  kCount
};
const char* op_kind_name(OpKind k);  // a collective's kind is named as the collective
bool is_communication(OpKind k);     // the kind of a collective (of the table below)

enum class Phase : int { Forward, Backward, Optimizer, Other, kCount };
const char* phase_name(Phase p);

struct OpEvent {
  OpKind kind;
  Phase phase;
  int unit;      // model unit, -1 when none
  int lane;      // 0 = compute; 1.. = communication lanes; kHostLane, kCopy*Lane: offload
  double start;  // seconds since the backend's epoch
  double end;
  int64_t bytes;  // bytes moved by a collective (the full buffer) or touched by compute
  double flops;   // matmul FLOPs (2·m·n·k) for a GEMM
  int32_t gemm[5];  // GEMM shape: m, n, k, batch, transposes (bit 0: A, bit 1: B); else zeros
  int64_t request = -1;  // collectives, copy_async copies and waits: the request, so a schedule can be replayed
  int32_t ranks = 0;     // collectives: ranks of the communicator
  int64_t after = -1;    // collectives, copies: the request it is stream-ordered after (counting backend)
  int32_t axis = -1;     // collectives: the mesh axis of the communicator (Axis), -1 for none
  int32_t peer = -1;     // send, receive: the other rank, in the communicator's numbering
  int32_t times = 1;     // this op, `times` alike in a row (the counting backend's runs: count_runs)
};

// Trace lanes beside the compute lane (0) and the communication lanes (1.., assigned by each
// backend, far below these): the host-offload lanes, fixed on every backend. Host compute
// (a host function run by host_compute(), the CPU optimizer update) on kHostLane; host ↔
// device copies (copy_async()) on a lane per direction, as a GPU's copy engines run them.
constexpr int kHostLane = 100;
constexpr int kCopyH2DLane = 101;
constexpr int kCopyD2HLane = 102;
inline bool is_offload_lane(int lane) { return lane >= kHostLane && lane <= kCopyD2HLane; }

// Receives every operation and memory change of the backend, in completion order: the
// device ledger's changes through on_memory, the host ledger's (alloc_host) through
// on_host_memory.
class Recorder {
 public:
  virtual ~Recorder() = default;
  virtual void on_op(const OpEvent& e) = 0;
  virtual void on_memory(double t, const MemBytes& current) = 0;
  virtual void on_host_memory(double t, const MemBytes& current) {}
};

// The axes of the parallel layout (backend/layout.h), in rank order from outermost to
// innermost; a communicator made for one of them knows it, and so does every collective
// recorded on it. The numbers are the HDF5 files' codes: append only.
enum class Axis : int { Pipeline, Replicate, Shard, Tensor, kCount };
constexpr int kAxes = int(Axis::kCount);
const char* axis_name(Axis a);  // pp, dp_replicate, dp_shard, tp

// A communicator of the backend (an MPI communicator on CPU, an NCCL one on GPU).
class Comm {
 public:
  virtual ~Comm() = default;
  virtual int size() const = 0;
  virtual int rank() const = 0;
  int axis() const { return axis_; }  // an Axis, or -1 when the communicator is no mesh axis
  void set_axis(Axis a) { axis_ = int(a); }

 private:
  int axis_ = -1;
};

using Request = int64_t;  // handle of an outstanding collective or copy (copy_async)
constexpr Request kNoRequest = -1;

// Which way copy_async moves bytes: from host memory (alloc_host) to the device's
// (alloc), or back.
enum class CopyDirection : int { HostToDevice, DeviceToHost };
const char* copy_direction_name(CopyDirection d);  // "host-to-device", "device-to-host"

// ---- collectives: one vocabulary for the strategies, collective_perf and the traces ----
enum class ReduceOp : int { Sum, Prod, Min, Max, Avg, kCount };
const char* reduce_op_name(ReduceOp o);  // sum, prod, min, max, avg
// The numbers are the HDF5 files' codes (collective_perf's op column): append only.
enum class Collective : int {
  AllReduce, AllGather, ReduceScatter, Broadcast, Reduce, AllToAll, SendRecv, Send, Recv, kCount
};

// Buffers follow NCCL's conventions: `count` is elements per rank's send buffer for
// all-gather, per rank's receive buffer for reduce-scatter, the whole buffer otherwise
// (all-to-all: the whole buffer, count/size to each peer). In place means
// recv == send for all-reduce, broadcast, reduce, and the rank's slice of the larger
// buffer for all-gather (send = recv + rank*count) and reduce-scatter (recv = send +
// rank*count). Send/recv sends `send` to rank+1 and receives `recv` from rank-1.
// Send and Recv are point to point: `count` elements of `send` to rank `peer`, or into
// `recv` from `peer`, matched by `tag` (on NCCL, by issue order per communicator); only the
// two ranks take part, so they start at once, in whatever order the ranks issue them. Each
// goes in a `direction` (P2PDirection), which a backend may keep apart from the other.
// `after`: stream order. The collective starts once collective (or copy_async) `after` has finished,
// without the compute lane waiting for either (a CUDA stream waiting on an event; on CPU
// the backend issues it as soon as it sees `after` complete). Collectives on one
// communicator still start in issue order.
// The two directions of a pipeline's point-to-point traffic: activations to the next stage,
// their gradients back to the previous one. A backend may run them apart (CUDA: a stream
// each, so a blocked send of one direction never holds up the other); MPI matching is by
// communicator and tag, never by direction.
enum class P2PDirection : int { Activations, Gradients };

struct CollectiveArgs {
  Collective op = Collective::AllReduce;
  const void* send = nullptr;
  void* recv = nullptr;
  int64_t count = 0;
  DType dtype = DType::F32;
  ReduceOp redop = ReduceOp::Sum;
  int root = 0;
  Request after = kNoRequest;
  int peer = -1;  // Send, Recv
  int tag = 0;    // Send, Recv
  P2PDirection direction = P2PDirection::Activations;  // Send, Recv
};

// How the `count` of a backend call sizes its buffers (the conventions above).
enum class CountIs : int {
  Whole,        // both buffers (all-reduce, broadcast, reduce, send/recv)
  WholeDivided, // both buffers, count/ranks to each peer: a multiple of the ranks (all-to-all)
  RankSend,     // each rank's send buffer; the receive buffer is ranks × count (all-gather)
  RankRecv,     // each rank's receive buffer; the send buffer is ranks × count (reduce-scatter)
};

// THE collective table (src/backend/collective.cpp): one row per collective, read by the
// backends, the traces and collective_perf. A new collective is a row here plus its library
// call in each backend's collective() (and the MPI staging of device buffers) and its
// expected result in collective_perf's data check.
struct CollectiveInfo {
  Collective op;
  const char* name;        // all-reduce: flags, tables, messages, trace op names
  const char* nccl_tests;  // all_reduce_perf: the nccl-tests program that measures it
  OpKind kind;             // what a backend records when it runs
  CountIs count;           // how the backend call's count sizes its buffers
  bool reduces;            // takes a ReduceOp
  bool rooted;             // takes a root rank
  bool in_place;           // has an in-place form
  bool point_to_point;     // Send, Recv: two ranks, a peer and a tag, started at issue
  // nccl-tests' bus bandwidth = algorithm bandwidth × this factor over `ranks`
  // (docs/references.md, "nccl-tests"): the bytes each rank sends over the buffer's size.
  double (*bus_factor)(int ranks);
};
const CollectiveInfo& collective_info(Collective c);
const CollectiveInfo* collective_info(OpKind k);  // null for compute kinds
inline const char* collective_name(Collective c) { return collective_info(c).name; }
inline OpKind collective_kind(Collective c) { return collective_info(c).kind; }
inline double bus_factor(Collective c, int ranks) { return collective_info(c).bus_factor(ranks); }
// What a collective records as its bytes: the full buffer (count × ranks for all-gather and
// reduce-scatter), as nccl-tests counts them.
int64_t collective_bytes(const CollectiveArgs& a, int comm_size);
// Bytes this rank sent in a recorded collective: its `bytes` × the bus factor over its
// `ranks`, to the nearest byte; 0 for compute and on one rank.
int64_t bytes_sent(const OpEvent& e);

// Fused T5 attention (flash-attention style), per (batch, head). q and o are [batch*tq, ld],
// k and v [batch*tk, ld], ld = heads*d_kv, head h at columns h*d_kv..(h+1)*d_kv-1: the
// projections' own layout, so no transposes. The position bias of query i and key j is
// table[rel_buckets[j - i + tq - 1], h], table [num_buckets, heads] (the rel_bias
// parameter), rel_buckets [tq + tk - 1] (the bucket depends on j - i only); a null table
// means no bias (cross-attention). Causal masks keys j > i. No 1/sqrt(d_kv) scaling (T5).
struct AttentionShape {
  int batch = 0, heads = 0, tq = 0, tk = 0, d_kv = 0;
  int num_buckets = 0;  // rows of the bias table
  bool causal = false;
  int64_t ld() const { return int64_t(heads) * d_kv; }
};
// The bias-table gradient is reduced deterministically (no order-dependent atomics): the
// backward divides the keys into chunks of kAttentionKeyChunk; the pass over chunk c of
// (batch b, head h) sums dS along each diagonal (fixed j - i) over the queries in
// ascending order into its own slot partial[b][h][c][tq + chunk - 1]; a second pass sums
// the slots per (head, j - i) over b then c, and a third adds each j - i into its
// bucket's row in ascending j - i. Every backend reduces in this order.
constexpr int kAttentionKeyChunk = 64;
// fp32 elements of attention_backward's workspace: the rows' Σ dO⊙O [batch*heads*tq], and
// with a bias table the partial slots and the per-(head, j - i) sums.
inline int64_t attention_workspace_floats(const AttentionShape& s, bool with_bias) {
  const int64_t rows = int64_t(s.batch) * s.heads * s.tq;
  if (!with_bias) return rows;
  const int64_t chunks = (s.tk + kAttentionKeyChunk - 1) / kAttentionKeyChunk;
  return rows + int64_t(s.batch) * s.heads * chunks * (s.tq + kAttentionKeyChunk - 1) +
         int64_t(s.heads) * (s.tq + s.tk - 1);
}
// Matmul FLOPs the fused op stands for (the unfused path's GEMMs: Q·K^T and P·V forward,
// twice that backward), so MFU counts the same work whichever path runs.
inline double attention_flops(const AttentionShape& s, bool backward) {
  return (backward ? 8.0 : 4.0) * s.batch * s.heads * double(s.tq) * s.tk * s.d_kv;
}
// The fused op is recorded as a GEMM of this shape (m, n, k, batch, transposes): the
// unfused GEMMs it replaces, batched (2·B·H forward, 4·B·H backward), so the trace's GEMM
// time and FLOPs and the plan's schedule include it.
inline std::array<int32_t, 5> attention_gemm_shape(const AttentionShape& s, bool backward) {
  return {s.tq, s.tk, s.d_kv, (backward ? 4 : 2) * s.batch * s.heads, 0};
}

// Which kernel runs the fused attention op where a backend has several (CUDA: FMA kernels
// in fp32 math for every type; tensor-core kernels, mma.sync on sm_80 and later, for bf16
// and fp16). Auto: tensor cores for bf16/fp16, FMA for fp32. Other backends have one.
enum class AttentionKernel : int { Auto, Fma, Mma };
const char* attention_kernel_name(AttentionKernel k);  // auto, fma, mma
AttentionKernel parse_attention_kernel(const std::string& s, const std::string& flag);  // throws UsageError

// Opt-in compute paths. Each stays off by default until a GPU measurement recorded in
// docs/performance.md shows it faster at the three study shapes (docs/gpu.md, "Opt-in
// paths"). Results are the same either way: the fused forms compute what the composed
// operations compute (tests/test_fusions.cpp).
struct ComputeOptions {
  AttentionKernel attention_kernel = AttentionKernel::Auto;
  // gemm_relu as one GEMM with a ReLU epilogue (cuBLASLt), rmsnorm_forward_residual as one
  // pass; off: each as the operations it stands for.
  bool fused_epilogues = false;
  // CUDA Graphs: the compute between two collectives (or allocations, copies from the host,
  // synchronisations) captured and launched as one graph.
  bool graphs = false;
  // Every GEMM element (fused attention's included) and every cross-entropy sum computed
  // exactly and rounded once (backend/exact_sum.h): the same value whatever the shape.
  // --check's tensor-parallel lockstep only; the CPU backend has it.
  bool exact_sums = false;
};

// ---- optimizers (--optimizer): the update every strategy runs on its fp32 master parameters ----
//   adamw       torch.optim.AdamW: bias-corrected Adam, decoupled weight decay (p *= 1 - lr·wd
//               before the Adam step); fp32 moments m, v. With weight_decay 0 it is Adam, as
//               the suite ran before --optimizer.
//   adamw-8bit  bitsandbytes' blockwise 8-bit AdamW (optim.AdamW8bit, docs/references.md): the
//               moments stored as 8-bit codes of the dynamic (tree) quantisation maps, signed
//               for m, unsigned for v, scaled by one fp32 absmax per block of
//               kOptimizerBlock consecutive elements counted from the region's start;
//               dequantise, update (weight decay after the step, as bitsandbytes), requantise
//               to the nearest code.
//   sgd         torch.optim.SGD (dampening 0, not Nesterov): coupled weight decay g += wd·p,
//               momentum buffer b = momentum·b + g (none when momentum is 0), p -= lr·b.
// The step counts from 1. The state of a region of n parameters is one byte buffer of
// optimizer_state_bytes(cfg, n) bytes (host_optimizer.h gives its layout); a buffer holding
// several regions places each at optimizer_state_layout's offsets.
enum class OptimizerKind : int { AdamW, AdamW8bit, Sgd };
const char* optimizer_name(OptimizerKind k);  // adamw, adamw-8bit, sgd
OptimizerKind parse_optimizer(const std::string& s, const std::string& flag);  // throws UsageError
constexpr int64_t kOptimizerBlock = 256;  // elements per absmax block of adamw-8bit (bitsandbytes')

struct OptimizerConfig {
  OptimizerKind kind = OptimizerKind::AdamW;
  float lr = 1e-3f, beta1 = 0.9f, beta2 = 0.999f, eps = 1e-8f;
  float weight_decay = 0.f;  // adamw, adamw-8bit: decoupled; sgd: coupled (L2), as torch
  float momentum = 0.9f;     // sgd
  float grad_unscale = 1.f;  // gradients are multiplied by this first (1 / the loss scale)
};
// Bytes of optimizer state of a region of n parameters: adamw 8n (fp32 m, v); sgd 4n (the
// momentum buffer; 0 with momentum 0); adamw-8bit 2n (a code per moment) + 8 per block of
// kOptimizerBlock (an fp32 absmax per moment), as bitsandbytes stores them.
int64_t optimizer_state_bytes(const OptimizerConfig& cfg, int64_t n);
// The element alignment a region should start at in a buffer of several: kOptimizerBlock for
// adamw-8bit (so its blocks are the region's own, and its state 8-byte aligned), else 1.
int64_t optimizer_region_alignment(const OptimizerConfig& cfg);
// Several regions (of these lengths, in order) in one state buffer: each region's state
// starts at optimizer_state_bytes of the aligned lengths before it (a multiple of 8 bytes),
// so a region's state depends on its own length only; `bytes` is the buffer's size.
struct OptimizerStateLayout {
  std::vector<int64_t> offset;  // bytes, per region
  int64_t bytes = 0;
};
OptimizerStateLayout optimizer_state_layout(const OptimizerConfig& cfg, const std::vector<int64_t>& lengths);
// The regions a strategy updates a flat buffer of units in (`first` and `length` of each
// unit, contiguous, in order): one region over all of them for adamw and sgd (elementwise:
// one call, the schedule as before --optimizer), each unit's own for adamw-8bit (its blocks
// start at the unit's, or its shard's, first element); with the state's layout over them.
struct OptimizerRegions {
  std::vector<int64_t> first, length;  // elements, per region
  OptimizerStateLayout state;           // bytes, per region
};
OptimizerRegions optimizer_regions(const OptimizerConfig& cfg, const std::vector<int64_t>& first,
                                   const std::vector<int64_t>& length);
// Bytes an update of n parameters reads and writes (what each backend records for it): the
// fp32 parameters twice, the gradient, the state twice (adamw-8bit: its codes and absmaxes),
// the copy.
int64_t optimizer_bytes_touched(const OptimizerConfig& cfg, int64_t n, DType grad, const Buf& copy);

class Backend {
 public:
  Backend();
  virtual ~Backend();
  virtual std::string name() const = 0;
  virtual std::string device_name() const = 0;
  // The library its collectives run on, as the run records it: "mpi" (CPU), "nccl", or
  // "mpi (...)" with how device buffers travel (CUDA --comm mpi).
  virtual std::string comm_name() const { return "mpi"; }

  // ---- memory: every allocation carries a category ----
  virtual void* alloc(size_t bytes, MemCategory cat) = 0;
  virtual void release(void* p) = 0;
  // Stream-ordered release of a buffer that collective `r` still reads, without waiting for
  // it: the ledger counts it free now (as PyTorch's caching allocator counts a tensor freed
  // at `del` while record_stream keeps its block for the communication stream); the memory
  // is reused only after `r` has finished.
  virtual void release_after(void* p, Request r) = 0;
  float* alloc_floats(int64_t n, MemCategory cat) { return static_cast<float*>(alloc(size_t(n) * 4, cat)); }
  Buf alloc_buf(int64_t n, DType t, MemCategory cat) { return {alloc(size_t(n) * dtype_size(t), cat), t}; }
  int* alloc_ints(int64_t n, MemCategory cat) { return static_cast<int*>(alloc(size_t(n) * 4, cat)); }
  virtual void upload(void* dst, const void* host_src, size_t bytes) = 0;
  // False for the counting backend (the plan): uploads go nowhere, so host data that only
  // feeds an upload need not be built.
  virtual bool holds_data() const { return true; }
  virtual void download(void* host_dst, const void* src, size_t bytes) = 0;
  const MemBytes& mem_current() const { return device_.current; }
  const MemBytes& mem_peak() const { return device_.peak; }
  int64_t mem_total_current() const { return device_.total(); }
  int64_t mem_peak_total() const { return device_.peak_total; }
  void reset_peaks();  // both ledgers: the peaks become the current bytes

  // ---- host memory (CPU offload): a second ledger, kept exactly as the device's ----
  // Host buffers that copy_async moves to and from the device and that host_compute reads
  // and writes: pinned on CUDA (cudaHostAlloc, so copies are asynchronous DMA), plain
  // page-aligned memory on CPU, addresses that point nowhere on the counting backend. Every
  // allocation carries a category; current and peak bytes per category and the peak total
  // are kept apart from the device's (mem_*), and each change goes to
  // Recorder::on_host_memory. release_host frees at once: the caller releases a host buffer
  // only when no copy still reads or writes it (wait or test its copy first).
  virtual void* alloc_host(size_t bytes, MemCategory cat) = 0;
  virtual void release_host(void* p) = 0;
  float* alloc_host_floats(int64_t n, MemCategory cat) { return static_cast<float*>(alloc_host(size_t(n) * 4, cat)); }
  const MemBytes& host_mem_current() const { return host_.current; }
  const MemBytes& host_mem_peak() const { return host_.peak; }
  int64_t host_mem_total_current() const { return host_.total(); }
  int64_t host_mem_peak_total() const { return host_.peak_total; }

  // Asynchronous copy of `bytes` between host memory from alloc_host and device memory from
  // alloc (`dir` says which is which), off the compute lane. It starts once everything
  // issued on the compute lane before it has finished (so it reads what compute wrote, and
  // overwrites nothing compute still reads, as a collective's input) and once `after` (a
  // collective's or another copy's request) has finished; copies of one direction run in
  // issue order. The Request is a collective's in every way: wait() makes compute wait for
  // it, test() polls it, CollectiveArgs::after orders a collective after it (an all-gather
  // of a shard just copied to the device), release_after() frees a device buffer it reads,
  // copy_async's own `after` chains copies (device-to-host after a reduce-scatter), and
  // host_compute() waits for it on the host. Recorded as OpKind::Copy with `bytes` on
  // kCopyH2DLane or kCopyD2HLane (its `after` in the counting backend's schedule).
  // CUDA: a copy stream per direction (the two copy engines run concurrently); CPU: a
  // memcpy, at issue or, when `after` is still outstanding, in the poll that sees it
  // complete; counting: recorded only.
  virtual Request copy_async(void* dst, const void* src, size_t bytes, CopyDirection dir,
                             Request after = kNoRequest) = 0;
  // Runs `fn` on the host (the CPU optimizer update over host buffers) once the requests in
  // `inputs` (device-to-host copies of what it reads, or collectives) have completed: the
  // host waits for them (CUDA: cudaEventSynchronize; compute already issued keeps running
  // on the GPU meanwhile), which also completes them as test() does, so a later wait() on
  // one is free. Recorded as an OpEvent of `kind` (OpKind::Optimizer) with `bytes` touched
  // on kHostLane, tagged with the current phase and unit. fn has returned when this does: a
  // host-to-device copy of its results issued afterwards reads them. The counting backend
  // records it without calling fn (its host buffers point nowhere).
  virtual void host_compute(const std::function<void()>& fn, int64_t bytes, const std::vector<Request>& inputs = {},
                            OpKind kind = OpKind::Optimizer) = 0;

  // Bytes this rank can still allocate on its device (a GPU's free memory); -1 when the
  // backend does not know (CPU: the harness uses host memory / ranks on the node).
  virtual int64_t memory_capacity() const { return -1; }
  // Memory in use as the device itself reports it (beside this ledger): a GPU's total minus
  // free memory (every process and the CUDA context included); on CPU this process's
  // resident set. -1 when unknown.
  virtual int64_t device_memory_used() const { return -1; }

  // ---- compute (row-major; a Linear weight W is [out, in] and y = x W^T) ----
  // C[M,N] = alpha * op(A) op(B) + beta * C, op(X) = X^T when the flag is set; fp32
  // accumulation whatever the element type.
  virtual void gemm(bool trans_a, bool trans_b, int M, int N, int K, float alpha, CBuf A, int lda,
                    CBuf B, int ldb, float beta, Buf C, int ldc) = 0;
  // The same for `batch` independent problems at fixed element strides.
  virtual void gemm_batched(bool trans_a, bool trans_b, int M, int N, int K, float alpha, CBuf A,
                            int lda, int64_t stride_a, CBuf B, int ldb, int64_t stride_b, float beta,
                            Buf C, int ldc, int64_t stride_c, int batch) = 0;
  // out[i,:] = table[ids[i],:]                      out [n,d], table [V,d]
  // An id of -1 (a token another tensor-parallel rank's rows hold) gives a zero row.
  virtual void embedding_forward(Buf out, CBuf table, const int* ids, int n, int d) = 0;
  // dtable[ids[i],:] += dout[i,:]; ids of -1 add nothing
  virtual void embedding_backward(Buf dtable, CBuf dout, const int* ids, int n, int d) = 0;
  // out = x * rstd * w, rstd[i] = 1/sqrt(mean(x[i,:]^2) + eps)     x, out [n,d]
  virtual void rmsnorm_forward(Buf out, float* rstd, CBuf x, CBuf w, int n, int d, float eps) = 0;
  // dx += d(out)/dx · dout; dw += sum_i dout * x * rstd
  virtual void rmsnorm_backward(Buf dx, Buf dw, CBuf dout, CBuf x, CBuf w, const float* rstd, int n,
                                int d) = 0;
  virtual void relu_forward(Buf x, int64_t n) = 0;                    // in place
  virtual void relu_backward(Buf dy, CBuf y, int64_t n) = 0;          // dy *= (y > 0)
  // T5 v1.1's gated-GELU feed-forward gate (Hugging Face T5DenseGatedActDense with
  // "gelu_new"): h = gelu_tanh(u) * v, gelu_tanh(x) = 0.5 x (1 + tanh(sqrt(2/pi) (x + 0.044715 x^3))).
  // One pass each way; u and v are the outputs of wi_0 and wi_1.              h, u, v [n]
  virtual void gated_gelu_forward(Buf h, CBuf u, CBuf v, int64_t n) = 0;
  // du = dh * v * gelu_tanh'(u), dv = dh * gelu_tanh(u) (overwritten); du may be dh itself.
  virtual void gated_gelu_backward(Buf du, Buf dv, CBuf dh, CBuf u, CBuf v, int64_t n) = 0;
  // C = relu(alpha op(A) op(B) + beta C), C dense (ldc == N). By default gemm then
  // relu_forward; with ComputeOptions::fused_epilogues a backend may apply the ReLU in the
  // GEMM's epilogue (one pass less over C; the same values: ReLU commutes with rounding).
  virtual void gemm_relu(bool trans_a, bool trans_b, int M, int N, int K, float alpha, CBuf A, int lda, CBuf B,
                         int ldb, float beta, Buf C, int ldc);
  // rmsnorm_forward, and residual = x: the copy of the residual stream that a sub-layer's
  // output GEMM then adds into (x1 = x + attention(norm(x))). By default rmsnorm_forward
  // then copy; with ComputeOptions::fused_epilogues a backend may write both in one pass
  // over x (bit-identical: the copy moves elements unchanged).
  virtual void rmsnorm_forward_residual(Buf out, float* rstd, Buf residual, CBuf x, CBuf w, int n, int d,
                                        float eps);
  virtual void add(Buf y, CBuf x, int64_t n) = 0;                     // y += x
  virtual void scale(Buf x, float a, int64_t n) = 0;                  // x *= a
  virtual void copy(Buf dst, CBuf src, int64_t n) = 0;
  virtual void fill(Buf x, float value, int64_t n) = 0;
  // dst = src rounded to dst's type (round to nearest even); a copy when the types match.
  virtual void cast(Buf dst, CBuf src, int64_t n) = 0;
  // x[i] = scale * u(key, first + i), u uniform in [-1, 1) from a counter-based hash, so
  // any slice of a tensor can be initialised without the rest (see rng.h).
  virtual void init_uniform(float* x, int64_t n, uint64_t key, int64_t first, float scale) = 0;
  // bias[h,i,j] = table[buckets[i*tk+j], h]         table [num_buckets, H]
  virtual void position_bias_forward(Buf bias, CBuf table, const int* buckets, int heads, int tq,
                                     int tk) = 0;
  // dtable[buckets[i*tk+j], h] += dbias[h,i,j]. The bucket of (i, j) depends on j − i only,
  // as T5's relative position buckets do: a backend may sum by diagonal (the CUDA one does,
  // in a fixed order, so the gradient is deterministic).
  virtual void position_bias_backward(Buf dtable, CBuf dbias, const int* buckets, int heads, int tq,
                                      int tk) = 0;
  // In place over scores [B,H,tq,tk]: add bias [H,tq,tk] (may be null), mask j > i when
  // causal, softmax over the last axis.
  virtual void softmax_forward(Buf scores, CBuf bias, bool causal, int batch, int heads, int tq,
                               int tk) = 0;
  // In place: dscores holds dP on entry and dS = P ⊙ (dP − Σ dP⊙P) on exit; dbias
  // (may be null) += Σ_b dS.
  virtual void softmax_backward(Buf dscores, CBuf probs, Buf dbias, int batch, int heads, int tq,
                                int tk) = 0;
  // Fused attention forward: o = softmax(q k^T + bias, mask) v per (batch, head) with an
  // online softmax over key tiles (fp32 accumulation; no tq×tk tensor beyond one tile);
  // lse [batch, heads, tq] (fp32) = each row's logsumexp, saved for the backward.
  virtual void attention_forward(Buf o, float* lse, CBuf q, CBuf k, CBuf v, CBuf table,
                                 const int* rel_buckets, const AttentionShape& s) = 0;
  // Fused attention backward: recomputes P from q, k, the table and lse; writes dq, dk, dv
  // and, with a table, adds d/d(table) into dtable (deterministically, see
  // kAttentionKeyChunk). o is the forward's output; workspace holds
  // attention_workspace_floats(s, table) fp32 elements (contents undefined on entry).
  virtual void attention_backward(Buf dq, Buf dk, Buf dv, Buf dtable, CBuf dout, CBuf q, CBuf k,
                                  CBuf v, CBuf o, const float* lse, CBuf table,
                                  const int* rel_buckets, float* workspace,
                                  const AttentionShape& s) = 0;
  // Fused softmax cross-entropy: losses[i] = -log softmax(logits[i])[labels[i]]; logits are
  // overwritten by their gradient (softmax − onehot) · grad_scale.        logits [n,V]
  virtual void cross_entropy(Buf logits, float* losses, const int* labels, int n, int vocab,
                             float grad_scale) = 0;
  // Vocabulary-parallel softmax cross-entropy (Megatron-LM's), for a tensor-parallel rank
  // whose logits [n, vocab] are its `vocab` consecutive columns of the vocabulary; labels[i]
  // is the label's column among them, or -1 where another rank holds it. Between the calls
  // the group all-reduces row_max (max) and sums (sum), so no rank gathers the logits.
  // row_max[i] = max_j logits[i, j]                                          (fp32)
  virtual void cross_entropy_max(CBuf logits, float* row_max, int n, int vocab) = 0;
  // sums[i] = Σ_j exp(logits[i, j] − row_max[i]); sums[n + i] = logits[i, labels[i]], 0 at -1
  virtual void cross_entropy_sums(CBuf logits, const float* row_max, const int* labels, float* sums, int n,
                                  int vocab) = 0;
  // losses[i] = log(sums[i]) + row_max[i] − sums[n + i]; logits := (exp(logits − row_max) /
  // sums − onehot) · grad_scale
  virtual void cross_entropy_finish(Buf logits, float* losses, const float* row_max, const float* sums,
                                    const int* labels, int n, int vocab, float grad_scale) = 0;
  // Whether every element is finite (no inf, no NaN). Returns to the host: on a GPU a
  // synchronisation, once per step with dynamic loss scaling (as PyTorch's GradScaler).
  virtual bool all_finite(CBuf x, int64_t n) = 0;
  // The optimizer's update (OptimizerConfig) of a region of n fp32 parameters, step counts
  // from 1; the gradient may be of any training precision (read as fp32); `state` is the
  // region's optimizer_state_bytes(cfg, n) bytes, initialised by optimizer_init_state. `copy`
  // (may be null): the updated parameters rounded to its type, written in the same pass, so
  // mixed precision needs no separate cast over the parameters.
  virtual void optimizer_update(const OptimizerConfig& cfg, int step, float* param, CBuf grad, void* state,
                                int64_t n, Buf copy = {}) = 0;
  // A region's state before the first step: zero moments (adamw-8bit: every code the code of 0,
  // every absmax 0).
  virtual void optimizer_init_state(const OptimizerConfig& cfg, void* state, int64_t n) = 0;

  // ---- collectives (non-blocking; issued in the same order on every rank) ----
  virtual std::unique_ptr<Comm> make_comm(MPI_Comm comm) = 0;
  // Any collective of CollectiveArgs; backends without it say so (UsageError).
  virtual Request collective(const CollectiveArgs& args, Comm& comm);
  // Whether `collective` supports this combination here: by default every valid one (the
  // CPU backend reduces bfloat16/half through user-defined MPI operations, NCCL natively).
  virtual bool supports(Collective op, DType dtype, ReduceOp redop) const;
  // The strategies' three, as sums (all through collective()):
  Request all_reduce(Buf buf, int64_t count, Comm& comm);  // in place
  // recv [size*count] gathers every rank's send [count]; in place when send is recv's
  // slice of this rank (send == recv + rank*count)
  // (`after`: stream-ordered after that request, e.g. the upload of this rank's shard)
  Request all_gather(CBuf send, Buf recv, int64_t count, Comm& comm, Request after = kNoRequest);
  // recv [count] = sum over ranks of send[rank*count : (rank+1)*count]
  Request reduce_scatter(CBuf send, Buf recv, int64_t count, Comm& comm);
  // all_reduce stream-ordered after collective `after` (see CollectiveArgs::after).
  Request all_reduce_after(Request after, Buf buf, int64_t count, Comm& comm);
  // Point to point: `count` elements to or from rank `peer` of `comm`, matched by `tag`,
  // going in `direction`.
  Request send(CBuf buf, int64_t count, int peer, int tag, P2PDirection direction, Comm& comm);
  Request recv(Buf buf, int64_t count, int peer, int tag, P2PDirection direction, Comm& comm);
  virtual void wait(Request r) = 0;
  virtual bool test(Request r) = 0;
  // A collective waited on before any other backend call runs as one blocking call where
  // the backend has a faster one (CPU: MPI's tuned blocking collectives). Off: every
  // collective takes the non-blocking path that overlap uses (collective_perf --nonblocking).
  void set_blocking_when_waited(bool on) { blocking_when_waited_ = on; }
  bool blocking_when_waited() const { return blocking_when_waited_; }
  virtual void synchronize() = 0;  // all compute issued so far has finished

  // ---- opt-in compute paths (ComputeOptions); a backend refuses what it cannot do ----
  virtual void set_compute_options(const ComputeOptions& o) { options_ = o; }
  const ComputeOptions& compute_options() const { return options_; }

  // ---- time and trace context ----
  virtual double now() const = 0;  // seconds since the backend's epoch
  void set_recorder(Recorder* r) { recorder_ = r; }
  void set_context(Phase phase, int unit) { phase_ = phase, unit_ = unit; }
  Phase phase() const { return phase_; }
  int unit() const { return unit_; }
  // Named ranges for a profiler's timeline (NVTX on CUDA, so Nsight Systems reads like the
  // trace), one per ScopedContext: the backend names it from the phase and unit ("forward
  // unit 3") where a profiler reads it, so the plan's thousands of scopes build no string.
  // Nothing elsewhere. Pushes and pops nest.
  virtual void range_push(Phase phase, int unit) {}
  virtual void range_pop() {}

 protected:
  // The allocation ledger every backend keeps: track() after allocating p, untrack()
  // before freeing it (it checks p was ours and accounts the bytes).
  void track(void* p, size_t bytes, MemCategory cat);
  // Throws UsageError naming the collective, type and reduction unless supports() them.
  void require_supported(const CollectiveArgs& a) const;
  void untrack(void* p);
  std::vector<void*> tracked() const;  // what is still allocated (for destructors)
  // The host ledger's same three (alloc_host / release_host).
  void track_host(void* p, size_t bytes, MemCategory cat);
  void untrack_host(void* p);
  std::vector<void*> tracked_host() const;
  void record(OpKind kind, int lane, double start, double end, int64_t bytes, double flops,
              const int32_t* gemm_shape = nullptr, int64_t request = -1, int ranks = 0,
              int64_t after = -1, int axis = -1, int peer = -1);
  Recorder* recorder_ = nullptr;
  bool blocking_when_waited_ = true;
  ComputeOptions options_;

  // An event built by the backend (phase and unit as given).
  void record(const OpEvent& e);

 private:
  struct Allocation {
    size_t bytes;
    MemCategory cat;
  };
  // The ledger's map from address to allocation (src/backend/backend.cpp: an open-addressing
  // map, the backend's own), behind a pointer so no caller compiles it.
  struct Allocations;
  // One memory ledger: the device's (alloc) or the host's (alloc_host).
  struct Ledger {
    Ledger();
    ~Ledger();
    std::unique_ptr<Allocations> allocations;
    MemBytes current{}, peak{};
    int64_t peak_total = 0;
    int64_t total() const;
  };
  void track(Ledger& l, void* p, size_t bytes, MemCategory cat);
  void untrack(Ledger& l, void* p);
  void notify(const Ledger& l);
  Ledger device_, host_;
  Phase phase_ = Phase::Other;
  int unit_ = -1;
};

// The one element type of a compute call's non-null tensors; names `op` in the error when
// they differ.
DType common_dtype(const char* op, std::initializer_list<CBuf> tensors);

// RAII: tags the operations issued in a scope with a phase and a unit, and names the scope
// as a profiler range ("forward unit 3").
class ScopedContext {
 public:
  ScopedContext(Backend& b, Phase p, int unit) : b_(b), phase_(b.phase()), unit_(b.unit()) {
    b.set_context(p, unit);
    b.range_push(p, unit);
  }
  ~ScopedContext() {
    b_.range_pop();
    b_.set_context(phase_, unit_);
  }

 private:
  Backend& b_;
  Phase phase_;
  int unit_;
};

// Backends this build can make: "cpu", and "cuda" where compiled in (collectives on NCCL,
// or on MPI: `comm`, see comm_staging.h; the CPU backend always uses MPI).
enum class CommLibrary : int;
std::unique_ptr<Backend> make_backend(const std::string& name);
std::unique_ptr<Backend> make_backend(const std::string& name, CommLibrary comm);
// Accounts memory and FLOPs only: nothing is allocated or computed.
std::unique_ptr<Backend> make_counting_backend();
// A communicator of `size` ranks, seen from `rank`, that never communicates: the counting
// backend's collectives take it (the plan of a world this job is not).
std::unique_ptr<Comm> make_planned_comm(int size, int rank);
double counted_gemm_flops(const Backend& counting);
// On: the counting backend hands its recorder a run of alike GEMMs in a row (unfused
// attention's per-sequence calls, B of them) as one op with OpEvent::times = the run's
// length, when the next other event comes; for a recorder that reads `times` (the plan's).
// Off (the default): one op per call. Turning it off hands on the run held.
void count_runs(Backend& counting, bool on);

}  // namespace sb
