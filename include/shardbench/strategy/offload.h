// CPU offload (--cpu-offload, StrategyConfig::cpu_offload): what a rank keeps in host memory
// and the update the CPU runs on it, for the FSDP strategy. Per unit, in host memory (the
// backend's alloc_host: pinned on CUDA): the fp32 master shard, its rounding to the param
// dtype (the bytes uploaded; the master itself in fp32), the reduced gradient shard as
// downloaded (reduce dtype) and the optimizer state. The schedule, as ZeRO-Offload's:
//   backward   each unit's reduced gradient shard downloaded once its reduction is done
//              (a copy stream-ordered after it: backward goes on)
//   optimizer  unit by unit, the CPU waits for the unit's download, updates its master and
//              state (host_optimizer_update, multi-threaded) and writes the rounding; its
//              upload, where the device keeps parameters, is issued at once, so it overlaps
//              the next unit's update
// Copies and updates are the backend's copy_async and host_compute: each an event of the
// trace on its own lane.
#pragma once
#include <vector>

#include "shardbench/backend/backend.h"

namespace sb {

class HostOffload {
 public:
  // `lengths`: each unit's shard (0: a unit this rank does not hold); gradients downloaded in
  // `grad_dtype`, parameters rounded to `param_dtype`; `threads` of the CPU update.
  HostOffload(Backend& b, const OptimizerConfig& opt, const std::vector<int64_t>& lengths, DType grad_dtype,
              DType param_dtype, int threads);
  ~HostOffload();
  HostOffload(const HostOffload&) = delete;
  HostOffload& operator=(const HostOffload&) = delete;

  float* master(int u) const { return master_[size_t(u)]; }
  // What the device is given of unit u's parameters: the master rounded to the param dtype.
  CBuf rounded(int u) const;
  int64_t length(int u) const { return lengths_[size_t(u)]; }
  // Unit u's fp32 master from `init`, which writes it into a device buffer of its length
  // (the seeded initialisation runs as a backend kernel); downloaded, and rounded.
  template <class Init>
  void initialize(int u, Init init);
  // Unit u's reduced gradient shard `g` (device, `grad_dtype`) downloaded once request
  // `after` (its last reduction) has finished; a download still pending from a skipped step
  // is waited for first.
  void download_gradient(int u, CBuf g, Request after);
  bool downloaded(int u) const { return download_[size_t(u)] != kNoRequest; }
  // The CPU update of every unit, step counting from 1; where `destination(u)` is a device
  // buffer, the rounded shard is uploaded into it right after the unit's update. Returns the
  // uploads' requests (kNoRequest where none).
  template <class Destination>
  std::vector<Request> update(const OptimizerConfig& opt, int step, Destination destination);
  // Issues unit u's upload into `dst` (device, the param dtype, its length).
  Request upload(int u, Buf dst);

 private:
  void update_unit(const OptimizerConfig& opt, int step, int u);
  Backend& b_;
  std::vector<int64_t> lengths_;
  DType grad_dtype_, param_dtype_;
  int threads_;
  std::vector<float*> master_;
  std::vector<void*> rounded_, grad_, state_;  // rounded_: null in fp32 (the master is uploaded)
  std::vector<Request> download_;
};

template <class Init>
void HostOffload::initialize(int u, Init init) {
  const int64_t n = length(u);
  if (n == 0) return;
  float* dev = static_cast<float*>(b_.alloc(size_t(n) * 4, MemCategory::Workspace));
  b_.fill(dev, 0.f, n);  // the shard's padding
  init(dev);
  std::vector<Request> copies = {b_.copy_async(master(u), dev, size_t(n) * 4, CopyDirection::DeviceToHost)};
  Buf low;
  if (rounded_[size_t(u)]) {
    low = b_.alloc_buf(n, param_dtype_, MemCategory::Workspace);
    b_.cast(low, dev, n);
    copies.push_back(b_.copy_async(rounded_[size_t(u)], low.ptr, size_t(n) * dtype_size(param_dtype_),
                                   CopyDirection::DeviceToHost));
  }
  for (Request r : copies) b_.wait(r);
  // wait() orders compute only; the host reads master(u) next (--check gathers the initial
  // weights from it before any step), so it waits for the copies itself. CUDA at e2c3c7f:
  // 2 and 4 ranks in bf16 read a unit's master before its copy had landed.
  b_.synchronize();
  b_.release(dev);
  if (low) b_.release(low.ptr);
}

template <class Destination>
std::vector<Request> HostOffload::update(const OptimizerConfig& opt, int step, Destination destination) {
  std::vector<Request> uploads(lengths_.size(), kNoRequest);
  for (size_t u = 0; u < lengths_.size(); ++u) {
    if (lengths_[u] == 0) continue;
    update_unit(opt, step, int(u));
    const Buf dst = destination(int(u));
    if (dst) uploads[u] = upload(int(u), dst);
  }
  return uploads;
}

}  // namespace sb
