// DDP (PyTorch DistributedDataParallel semantics): every rank holds the whole model.
// Gradients live in one flat buffer, units in forward order and each unit's tensors in
// definition order; read from its end backwards that is the order in which backward
// produces the gradients (the head's lm_head first, the shared embedding last), so buckets
// are filled walking backwards from the end and each is a contiguous view of the buffer
// (gradient_as_bucket_view). As PyTorch's Reducer, a tensor is marked ready as its gradient
// is produced (the model's per-tensor hook), and a bucket's all-reduce is issued once all of
// its tensors are ready, buckets in order, overlapping the rest of backward.
// Mixed precision (param_dtype P, reduce_dtype R), as DDP's mixed_precision: fp32 master
// parameters and optimizer state, a P copy of the parameters for compute (refreshed after each
// optimizer step), P gradients; when R differs, each bucket is cast into an R buffer and
// all-reduced there, and the optimizer reads that buffer (adamw-8bit: each unit as a region
// of its own, so its blocks start at the unit's start).
#include <algorithm>
#include <cstring>

#include "shardbench/core/check.h"
#include "shardbench/strategy/training_schedule.h"

namespace sb {
namespace {

constexpr double kFirstBucketBytes = 1024.0 * 1024.0;  // PyTorch _DEFAULT_FIRST_BUCKET_BYTES

struct Bucket {
  int64_t offset = 0, numel = 0;  // in the flat gradient buffer
  int tensors = 0;                // how many tensors it holds
  int unit = -1;                  // the unit of its last tensor (trace tag)
  int ready = 0;                  // of its tensors, marked ready this step
  Request request = kNoRequest;
};

class DDP final : public TrainingSchedule {
 public:
  DDP(const Setup& setup, Backend& b, Mesh& mesh)
      : TrainingSchedule(setup, b, mesh), offset_(units_.size()), bucket_of_(units_.size()) {
    for (size_t u = 0; u < units_.size(); ++u) {
      offset_[u] = total_;
      total_ += units_[u].numel;
    }
    make_buckets();
    model_.set_grad_ready_hook([this](int u, int t) { mark_ready(u, t); });
    params_ = b_.alloc_floats(total_, MemCategory::Parameters);
    grads_ = b_.alloc_buf(total_, cfg_.param_dtype, MemCategory::Gradients);
    std::vector<int64_t> numels;  // the optimizer's regions: all units, or each (adamw-8bit)
    for (const UnitSpec& u : units_) numels.push_back(u.numel);
    regions_ = optimizer_regions(cfg_.optimizer, offset_, numels);
    if (regions_.state.bytes > 0) state_ = static_cast<char*>(b_.alloc(size_t(regions_.state.bytes), MemCategory::OptimizerState));
    for (size_t u = 0; u < units_.size(); ++u)
      init_unit_params(b_, units_[u], cfg_.seed, params_ + offset_[u], 0, units_[u].numel);
    for (size_t r = 0; r < regions_.first.size() && state_; ++r)
      b_.optimizer_init_state(cfg_.optimizer, state_ + regions_.state.offset[r], regions_.length[r]);
    if (cfg_.param_dtype != DType::F32) {
      compute_ = b_.alloc_buf(total_, cfg_.param_dtype, MemCategory::Parameters);
      b_.cast(compute_, params_, total_);
    }
    reduced_ = grads_;
    if (cfg_.reduce_dtype != cfg_.param_dtype)
      reduced_ = b_.alloc_buf(total_, cfg_.reduce_dtype, MemCategory::Gradients);
  }
  ~DDP() override {
    finish_gradients();  // no reduction may still write into buffers freed below
    if (reduced_.ptr != grads_.ptr) b_.release(reduced_.ptr);
    for (void* p : {(void*)params_, grads_.ptr, (void*)state_, compute_.ptr}) b_.release(p);
  }

  std::vector<float> gather_unit(int u) override {
    std::vector<float> host(units_[u].numel);
    b_.download(host.data(), params_ + offset_[u], host.size() * 4);
    return host;
  }
  std::vector<float> gather_unit_grad(int u) override {
    std::vector<char> raw(units_[u].numel * dtype_size(reduced_.dtype));
    b_.download(raw.data(), (reduced_ + offset_[u]).ptr, raw.size());
    return host_as_f32(raw, reduced_.dtype, units_[u].numel);
  }

 private:
  // PyTorch's compute_bucket_assignment_by_size: whole tensors, in gradient order (the
  // buffer backwards), a bucket closes once its gradients (param dtype) reach its cap; the
  // first bucket's cap is 1 MiB.
  void make_buckets() {
    const double cap = cfg_.bucket_mb * 1024.0 * 1024.0, es = dtype_size(cfg_.param_dtype);
    Bucket cur;
    for (int u = int(units_.size()) - 1; u >= 0; --u) {
      const std::vector<TensorSpec>& ts = units_[u].tensors;
      bucket_of_[u].resize(ts.size());
      for (int i = int(ts.size()) - 1; i >= 0; --i) {
        cur.offset = offset_[u] + ts[i].offset;  // the bucket grows towards the buffer's start
        cur.numel += ts[i].numel();
        cur.unit = u;
        ++cur.tensors;
        bucket_of_[u][i] = int(buckets_.size());
        if (cur.numel * es >= (buckets_.empty() ? kFirstBucketBytes : cap)) {
          buckets_.push_back(cur);
          cur = Bucket{};
        }
      }
    }
    if (cur.numel > 0) buckets_.push_back(cur);
  }

  CBuf params_for(int u) override {
    return compute_ ? CBuf(compute_ + offset_[u]) : CBuf(params_ + offset_[u]);
  }
  Buf grads_for(int u) override { return grads_ + offset_[u]; }

  // Gradients accumulate over a step's micro-batches (zeroed before the first); only the
  // last one's backward marks tensors ready (PyTorch's no_sync for the others).
  void before_backward(int pos) override {
    if (pos != backward_begin()) return;
    if (first_micro()) b_.fill(grads_, 0.f, total_);
    for (Bucket& bk : buckets_) bk.ready = 0;
    next_bucket_ = 0;
  }

  // The Reducer's mark_variable_ready: tensor t of unit u has its gradient; launch every
  // bucket that is complete, in bucket order.
  void mark_ready(int u, int t) {
    if (!last_micro()) return;
    Bucket& mine = buckets_[bucket_of_[u][t]];
    SB_ASSERT(mine.ready < mine.tensors, "a DDP gradient was marked ready twice in one step");
    ++mine.ready;
    while (next_bucket_ < buckets_.size() && buckets_[next_bucket_].ready == buckets_[next_bucket_].tensors)
      launch(buckets_[next_bucket_++]);
  }
  void launch(Bucket& bk) {
    if (reduced_.ptr != grads_.ptr) b_.cast(reduced_ + bk.offset, grads_ + bk.offset, bk.numel);
    ScopedContext target(b_, b_.phase(), bk.unit);
    bk.request = b_.all_reduce(reduced_ + bk.offset, bk.numel, mesh_.comm(Axis::Replicate));
  }

  // Every tensor a stage holds is used by one of its pieces (a pipeline stage holds the
  // units its pieces use), so the hooks have launched every bucket by the end of backward.
  void finish_gradients() override {
    for (Bucket& bk : buckets_) {
      if (bk.request != kNoRequest) b_.wait(bk.request);
      bk.request = kNoRequest;
    }
  }

  CBuf reduced_gradients(int64_t& n) const override {
    n = total_;
    return reduced_;
  }
  Buf reduced_gradient(int u, int64_t& n) override {
    n = units_[u].numel;
    return reduced_ + offset_[u];
  }

  void optimizer_step(int step) override {
    SB_ASSERT(next_bucket_ == buckets_.size(), "a DDP bucket was never launched");
    for (size_t r = 0; r < regions_.first.size(); ++r) {  // refreshes the compute copy too
      const int64_t i = regions_.first[r];
      b_.optimizer_update(cfg_.optimizer, step, params_ + i, reduced_ + i,
                          state_ ? state_ + regions_.state.offset[r] : nullptr, regions_.length[r],
                          compute_ ? compute_ + i : Buf());
    }
  }

  std::vector<int64_t> offset_;
  int64_t total_ = 0;
  std::vector<std::vector<int>> bucket_of_;  // [unit][tensor] → its bucket
  std::vector<Bucket> buckets_;
  size_t next_bucket_ = 0;
  float* params_ = nullptr;  // fp32 master
  char* state_ = nullptr;    // optimizer state of regions_
  OptimizerRegions regions_;
  Buf compute_;   // param dtype copy of params_ (low precision only)
  Buf grads_;     // param dtype, bucket views
  Buf reduced_;   // reduce dtype: grads_ itself, or a buffer the buckets are cast into
};

}  // namespace

std::unique_ptr<Strategy> make_ddp(const Setup& setup, Backend& b, Mesh& mesh) {
  return std::make_unique<DDP>(setup, b, mesh);
}

}  // namespace sb
