// The parts of the backend every implementation shares: names, memory accounting, and
// forwarding of operations to the recorder.
#include "shardbench/backend/backend.h"

#include <algorithm>
#include <numeric>

#include "shardbench/core/check.h"
#include "shardbench/core/fault.h"
#include "shardbench/backend/comm_staging.h"
#include "shardbench/backend/cuda_plugin.h"  // make_cuda_backend: the plugin, loaded here
#include "pointer_map.h"

namespace sb {

const char* mem_category_name(MemCategory c) {
  switch (c) {
    case MemCategory::Parameters: return "parameters";
    case MemCategory::Gradients: return "gradients";
    case MemCategory::OptimizerState: return "optimizer_state";
    case MemCategory::Activations: return "activations";
    case MemCategory::CommBuffers: return "comm_buffers";
    case MemCategory::Workspace: return "workspace";
    default: return "?";
  }
}

const char* op_kind_name(OpKind k) {
  if (const CollectiveInfo* c = collective_info(k)) return c->name;
  switch (k) {
    case OpKind::Gemm: return "gemm";
    case OpKind::Elementwise: return "elementwise";
    case OpKind::Optimizer: return "optimizer";
    case OpKind::Copy: return "copy";
    case OpKind::Wait: return "wait";
    case OpKind::Progress: return "progress";
    default: return "?";
  }
}

bool is_communication(OpKind k) { return collective_info(k) != nullptr; }

const char* copy_direction_name(CopyDirection d) {
  return d == CopyDirection::HostToDevice ? "host-to-device" : "device-to-host";
}

const char* phase_name(Phase p) {
  switch (p) {
    case Phase::Forward: return "forward";
    case Phase::Backward: return "backward";
    case Phase::Optimizer: return "optimizer";
    case Phase::Other: return "other";
    default: return "?";
  }
}

const char* axis_name(Axis a) {
  switch (a) {
    case Axis::Pipeline: return "pp";
    case Axis::Replicate: return "dp_replicate";
    case Axis::Shard: return "dp_shard";
    case Axis::Tensor: return "tp";
    default: return "?";
  }
}

const char* dtype_name(DType t) {
  static const char* names[] = {"float", "double", "int32", "int64", "uint8", "bfloat16", "half"};
  return int(t) >= 0 && t < DType::kCount ? names[int(t)] : "?";
}

const char* reduce_op_name(ReduceOp o) {
  static const char* names[] = {"sum", "prod", "min", "max", "avg"};
  return int(o) >= 0 && o < ReduceOp::kCount ? names[int(o)] : "?";
}

const char* precision_name(DType t) {
  switch (t) {
    case DType::F32: return "fp32";
    case DType::BF16: return "bf16";
    case DType::F16: return "fp16";
    default: return "?";
  }
}

DType parse_precision(const std::string& s, const std::string& flag) {
  for (DType t : {DType::F32, DType::BF16, DType::F16})
    if (s == precision_name(t)) return t;
  throw UsageError(flag + " '" + s + "' is not allowed (allowed: fp32, bf16, fp16)");
}

const char* optimizer_name(OptimizerKind k) {
  switch (k) {
    case OptimizerKind::AdamW: return "adamw";
    case OptimizerKind::AdamW8bit: return "adamw-8bit";
    case OptimizerKind::Sgd: return "sgd";
    default: return "?";
  }
}
OptimizerKind parse_optimizer(const std::string& s, const std::string& flag) {
  for (OptimizerKind k : {OptimizerKind::AdamW, OptimizerKind::AdamW8bit, OptimizerKind::Sgd})
    if (s == optimizer_name(k)) return k;
  throw UsageError(flag + " '" + s + "' is not allowed (allowed: adamw, adamw-8bit, sgd)");
}
int64_t optimizer_state_bytes(const OptimizerConfig& cfg, int64_t n) {
  switch (cfg.kind) {
    case OptimizerKind::AdamW: return 8 * n;
    case OptimizerKind::AdamW8bit: return 2 * n + 8 * ((n + kOptimizerBlock - 1) / kOptimizerBlock);
    case OptimizerKind::Sgd: return cfg.momentum != 0.f ? 4 * n : 0;
    default: return 0;
  }
}
OptimizerRegions optimizer_regions(const OptimizerConfig& cfg, const std::vector<int64_t>& first,
                                   const std::vector<int64_t>& length) {
  OptimizerRegions r;
  if (optimizer_region_alignment(cfg) > 1) {
    r.first = first, r.length = length;
  } else if (!first.empty()) {
    r.first = {first.front()};
    r.length = {first.back() + length.back() - first.front()};
  }
  r.state = optimizer_state_layout(cfg, r.length);
  return r;
}
int64_t optimizer_bytes_touched(const OptimizerConfig& cfg, int64_t n, DType grad, const Buf& copy) {
  return 8 * n + 2 * optimizer_state_bytes(cfg, n) + dtype_size(grad) * n + (copy.ptr ? dtype_size(copy.dtype) * n : 0);
}
int64_t optimizer_region_alignment(const OptimizerConfig& cfg) {
  return cfg.kind == OptimizerKind::AdamW8bit ? kOptimizerBlock : 1;
}
OptimizerStateLayout optimizer_state_layout(const OptimizerConfig& cfg, const std::vector<int64_t>& lengths) {
  const int64_t align = optimizer_region_alignment(cfg);
  OptimizerStateLayout l;
  int64_t first = 0;  // the region's aligned element offset
  for (int64_t n : lengths) {
    l.offset.push_back(optimizer_state_bytes(cfg, first));
    first += (n + align - 1) / align * align;
  }
  l.bytes = optimizer_state_bytes(cfg, first);
  return l;
}

const char* attention_kernel_name(AttentionKernel k) {
  switch (k) {
    case AttentionKernel::Auto: return "auto";
    case AttentionKernel::Fma: return "fma";
    case AttentionKernel::Mma: return "mma";
    default: return "?";
  }
}

AttentionKernel parse_attention_kernel(const std::string& s, const std::string& flag) {
  for (AttentionKernel k : {AttentionKernel::Auto, AttentionKernel::Fma, AttentionKernel::Mma})
    if (s == attention_kernel_name(k)) return k;
  throw UsageError(flag + " '" + s + "' is not allowed (allowed: auto, fma, mma)");
}

// The fused operations' default: the operations they stand for, in order.
void Backend::gemm_relu(bool ta, bool tb, int M, int N, int K, float alpha, CBuf A, int lda, CBuf B, int ldb,
                        float beta, Buf C, int ldc) {
  SB_ASSERT(ldc == N, "gemm_relu needs a dense C (ldc == N)");
  gemm(ta, tb, M, N, K, alpha, A, lda, B, ldb, beta, C, ldc);
  relu_forward(C, int64_t(M) * N);
}

void Backend::rmsnorm_forward_residual(Buf out, float* rstd, Buf residual, CBuf x, CBuf w, int n, int d,
                                       float eps) {
  rmsnorm_forward(out, rstd, x, w, n, d, eps);
  copy(residual, x, int64_t(n) * d);
}

DType common_dtype(const char* op, std::initializer_list<CBuf> tensors) {
  DType t = DType::kCount;
  for (const CBuf& b : tensors) {
    if (!b) continue;
    if (t == DType::kCount) t = b.dtype;
    if (b.dtype != t)
      SB_FATAL(std::string(op) + " mixes element types " + dtype_name(t) + " and " + dtype_name(b.dtype));
  }
  return t == DType::kCount ? DType::F32 : t;
}

bool Backend::supports(Collective op, DType dtype, ReduceOp redop) const {
  return int(op) >= 0 && op < Collective::kCount && int(dtype) >= 0 && dtype < DType::kCount &&
         int(redop) >= 0 && redop < ReduceOp::kCount;
}

void Backend::require_supported(const CollectiveArgs& a) const {
  if (!supports(a.op, a.dtype, a.redop))
    throw UsageError(std::string(collective_name(a.op)) + " of " + dtype_name(a.dtype) + " with " +
                     reduce_op_name(a.redop) + " is not supported by the " + name() + " backend");
}

Request Backend::collective(const CollectiveArgs& a, Comm&) {
  throw UsageError(std::string(collective_name(a.op)) + " is not supported by the " + name() + " backend");
}

// The training strategies' gradient reductions sum (a test-only fault averages instead).
static ReduceOp gradient_op() { return injected_fault(Fault::WrongReductionScale) ? ReduceOp::Avg : ReduceOp::Sum; }

Request Backend::all_reduce(Buf buf, int64_t count, Comm& comm) {
  return collective({Collective::AllReduce, buf.ptr, buf.ptr, count, buf.dtype, gradient_op(), 0}, comm);
}

Request Backend::all_reduce_after(Request after, Buf buf, int64_t count, Comm& comm) {
  CollectiveArgs a{Collective::AllReduce, buf.ptr, buf.ptr, count, buf.dtype, ReduceOp::Sum, 0};
  a.after = after;
  return collective(a, comm);
}

Request Backend::send(CBuf buf, int64_t count, int peer, int tag, P2PDirection direction, Comm& comm) {
  CollectiveArgs a{Collective::Send, buf.ptr, nullptr, count, buf.dtype};
  a.peer = peer, a.tag = tag, a.direction = direction;
  return collective(a, comm);
}

Request Backend::recv(Buf buf, int64_t count, int peer, int tag, P2PDirection direction, Comm& comm) {
  CollectiveArgs a{Collective::Recv, nullptr, buf.ptr, count, buf.dtype};
  a.peer = peer, a.tag = tag, a.direction = direction;
  return collective(a, comm);
}

Request Backend::all_gather(CBuf send, Buf recv, int64_t count, Comm& comm, Request after) {
  SB_ASSERT(send.dtype == recv.dtype, "all-gather between different element types");
  CollectiveArgs a{Collective::AllGather, send.ptr, recv.ptr, count, recv.dtype, ReduceOp::Sum, 0};
  a.after = after;
  return collective(a, comm);
}

Request Backend::reduce_scatter(CBuf send, Buf recv, int64_t count, Comm& comm) {
  SB_ASSERT(send.dtype == recv.dtype, "reduce-scatter between different element types");
  return collective({Collective::ReduceScatter, send.ptr, recv.ptr, count, recv.dtype, gradient_op(), 0}, comm);
}

struct Backend::Allocations : PointerMap<Allocation> {};

Backend::Backend() = default;
Backend::~Backend() = default;
Backend::Ledger::Ledger() : allocations(std::make_unique<Allocations>()) {}
Backend::Ledger::~Ledger() = default;

int64_t Backend::Ledger::total() const { return std::accumulate(current.begin(), current.end(), int64_t{0}); }

void Backend::reset_peaks() {
  for (Ledger* l : {&device_, &host_}) {
    l->peak = l->current;
    l->peak_total = l->total();
  }
}

void Backend::track(void* p, size_t bytes, MemCategory cat) { track(device_, p, bytes, cat); }
void Backend::untrack(void* p) { untrack(device_, p); }
void Backend::track_host(void* p, size_t bytes, MemCategory cat) { track(host_, p, bytes, cat); }
void Backend::untrack_host(void* p) { untrack(host_, p); }

std::vector<void*> Backend::tracked() const {
  std::vector<void*> v;
  device_.allocations->for_each([&](const void* p, const Allocation&) { v.push_back(const_cast<void*>(p)); });
  return v;
}

std::vector<void*> Backend::tracked_host() const {
  std::vector<void*> v;
  host_.allocations->for_each([&](const void* p, const Allocation&) { v.push_back(const_cast<void*>(p)); });
  return v;
}

void Backend::track(Ledger& l, void* p, size_t bytes, MemCategory cat) {
  const bool fresh = l.allocations->insert(p, Allocation{bytes, cat});
  SB_ASSERT(fresh, "an address allocated twice");
  const int c = int(cat);
  l.current[c] += int64_t(bytes);
  l.peak[c] = std::max(l.peak[c], l.current[c]);
  l.peak_total = std::max(l.peak_total, l.total());
  notify(l);
}

void Backend::untrack(Ledger& l, void* p) {
  Allocation a;
  const bool ours = l.allocations->take(p, &a);  // one look-up
  SB_ASSERT(ours, &l == &host_ ? "release_host of a pointer the backend did not allocate"
                               : "release of a pointer the backend did not allocate");
  const int c = int(a.cat);
  l.current[c] -= int64_t(a.bytes);
  SB_ASSERT(l.current[c] >= 0, "memory accounting went negative");
  notify(l);
}

void Backend::notify(const Ledger& l) {
  if (!recorder_) return;
  if (&l == &host_) recorder_->on_host_memory(now(), l.current);
  else recorder_->on_memory(now(), l.current);
}

void Backend::record(const OpEvent& e) {
  if (recorder_) recorder_->on_op(e);
}

void Backend::record(OpKind kind, int lane, double start, double end, int64_t bytes, double flops,
                     const int32_t* gemm_shape, int64_t request, int ranks, int64_t after, int axis, int peer) {
  if (!recorder_) return;
  OpEvent e{kind, phase_, unit_, lane, start, end, bytes, flops, {0, 0, 0, 0, 0}, request, ranks, after, axis, peer};
  if (gemm_shape) std::copy(gemm_shape, gemm_shape + 5, e.gemm);
  record(e);
}

std::unique_ptr<Backend> make_cpu_backend();

std::unique_ptr<Backend> make_backend(const std::string& name) { return make_backend(name, CommLibrary::Nccl); }

std::unique_ptr<Backend> make_backend(const std::string& name, CommLibrary comm) {
  if (name == "cpu") return make_cpu_backend();
#ifdef SB_HAVE_CUDA
  if (name == "cuda") return make_cuda_backend(comm);
  throw UsageError("--backend '" + name + "' is not allowed (allowed: cpu, cuda)");
#else
  if (name == "cuda")
    throw UsageError("--backend cuda: this build has no CUDA backend (it needs nvcc, cuBLAS and NCCL; "
                     "see make probe); allowed: cpu");
  throw UsageError("--backend '" + name + "' is not allowed (allowed: cpu)");
#endif
}

}  // namespace sb
