// CPU offload's host side: the buffers, the downloads, the CPU update and the uploads.
#include "shardbench/strategy/offload.h"

#include "shardbench/backend/host_optimizer.h"
#include "shardbench/core/check.h"
#include "shardbench/core/fault.h"

namespace sb {

HostOffload::HostOffload(Backend& b, const OptimizerConfig& opt, const std::vector<int64_t>& lengths, DType grad_dtype,
                         DType param_dtype, int threads)
    : b_(b),
      lengths_(lengths),
      grad_dtype_(grad_dtype),
      param_dtype_(param_dtype),
      threads_(threads),
      master_(lengths.size(), nullptr),
      rounded_(lengths.size(), nullptr),
      grad_(lengths.size(), nullptr),
      state_(lengths.size(), nullptr),
      download_(lengths.size(), kNoRequest) {
  for (size_t u = 0; u < lengths_.size(); ++u) {
    const int64_t n = lengths_[u];
    if (n == 0) continue;
    master_[u] = b_.alloc_host_floats(n, MemCategory::Parameters);
    if (param_dtype_ != DType::F32)
      rounded_[u] = b_.alloc_host(size_t(n) * dtype_size(param_dtype_), MemCategory::Parameters);
    grad_[u] = b_.alloc_host(size_t(n) * dtype_size(grad_dtype_), MemCategory::Gradients);
    const int64_t state_bytes = optimizer_state_bytes(opt, n);
    if (state_bytes > 0) {
      state_[u] = b_.alloc_host(size_t(state_bytes), MemCategory::OptimizerState);
      if (b_.holds_data()) host_optimizer_init_state(opt, state_[u], n);
    }
  }
}

HostOffload::~HostOffload() {
  for (Request& r : download_)
    if (r != kNoRequest) b_.wait(r), r = kNoRequest;  // nothing may still write a buffer freed below
  for (size_t u = 0; u < lengths_.size(); ++u)
    for (void* p : {(void*)master_[u], rounded_[u], grad_[u], state_[u]})
      if (p) b_.release_host(p);
}

CBuf HostOffload::rounded(int u) const {
  if (rounded_[size_t(u)]) return {rounded_[size_t(u)], param_dtype_};
  return CBuf(master_[size_t(u)]);
}

void HostOffload::download_gradient(int u, CBuf g, Request after) {
  SB_ASSERT(g.dtype == grad_dtype_, "offload: a gradient downloaded in another type");
  ScopedContext tag(b_, b_.phase(), u);
  Request& r = download_[size_t(u)];
  if (r != kNoRequest) b_.wait(r);  // a skipped step's download, never read
  r = b_.copy_async(grad_[size_t(u)], g.ptr, size_t(length(u)) * dtype_size(grad_dtype_), CopyDirection::DeviceToHost,
                    after);
}

Request HostOffload::upload(int u, Buf dst) {
  SB_ASSERT(dst.dtype == param_dtype_, "offload: parameters uploaded into another type");
  ScopedContext tag(b_, b_.phase(), u);
  const CBuf src = rounded(u);
  const size_t bytes = injected_fault(Fault::OffloadSkipUpload) ? 0 : size_t(length(u)) * dtype_size(param_dtype_);
  return b_.copy_async(dst.ptr, src.ptr, bytes, CopyDirection::HostToDevice);
}

void HostOffload::update_unit(const OptimizerConfig& opt, int step, int u) {
  ScopedContext tag(b_, b_.phase(), u);
  Request& r = download_[size_t(u)];
  SB_ASSERT(r != kNoRequest, "offload: a unit's gradient was never downloaded before its update");
  const int64_t n = length(u);
  const Buf copy = rounded_[size_t(u)] ? Buf(rounded_[size_t(u)], param_dtype_) : Buf();
  float* p = master_[size_t(u)];
  const CBuf g(grad_[size_t(u)], grad_dtype_);
  void* s = state_[size_t(u)];
  const int threads = threads_;
  b_.host_compute([opt, step, p, g, s, n, copy, threads] { host_optimizer_update(opt, step, p, g, s, n, copy, threads); },
                  optimizer_bytes_touched(opt, n, grad_dtype_, copy), {r});
  r = kNoRequest;  // host_compute waited for it
}

}  // namespace sb
