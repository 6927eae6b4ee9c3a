// DDP (PyTorch DistributedDataParallel semantics): every rank holds the whole model.
// Gradients live in one flat buffer laid out in reverse unit order, which is the order in
// which backward completes them, so each bucket is a contiguous view of it
// (gradient_as_bucket_view). A bucket's all-reduce is issued as soon as its last gradient
// is complete, in bucket order, overlapping the rest of backward.
#include <algorithm>
#include <cstring>

#include "shardbench/check.h"
#include "shardbench/strategy.h"

namespace sb {
namespace {

constexpr double kFirstBucketBytes = 1024.0 * 1024.0;  // PyTorch _DEFAULT_FIRST_BUCKET_BYTES

struct Bucket {
  int64_t offset = 0, numel = 0;  // in the flat gradient buffer
  Request request = kNoRequest;
};

class DDP final : public TrainingSchedule {
 public:
  DDP(const StrategyConfig& cfg, const ModelSpec& spec, Backend& b, Mesh& mesh, const StepShape& shape)
      : TrainingSchedule(cfg, spec, b, mesh, shape), offset_(units_.size()) {
    // Reverse unit order: the last decoder block first, the root last.
    for (int u = int(units_.size()) - 1; u >= 0; --u) {
      offset_[u] = total_;
      total_ += units_[u].numel;
    }
    make_buckets();
    params_ = b_.alloc_floats(total_, MemCategory::Parameters);
    grads_ = b_.alloc_floats(total_, MemCategory::Gradients);
    m_ = b_.alloc_floats(total_, MemCategory::OptimizerState);
    v_ = b_.alloc_floats(total_, MemCategory::OptimizerState);
    for (size_t u = 0; u < units_.size(); ++u)
      init_unit_params(b_, units_[u], int(u), cfg_.seed, params_ + offset_[u], 0, units_[u].numel);
    b_.fill(m_, 0.f, total_);
    b_.fill(v_, 0.f, total_);
  }
  ~DDP() override {
    for (float* p : {params_, grads_, m_, v_}) b_.release(p);
  }

  std::vector<float> gather_unit(int u) override {
    std::vector<float> host(units_[u].numel);
    b_.download(host.data(), params_ + offset_[u], host.size() * 4);
    return host;
  }

 private:
  // PyTorch's compute_bucket_assignment_by_size: whole tensors, in gradient order, a bucket
  // closes once it reaches its cap; the first bucket's cap is 1 MiB.
  void make_buckets() {
    const double cap = cfg_.bucket_mb * 1024.0 * 1024.0;
    Bucket cur;
    for (int u = int(units_.size()) - 1; u >= 0; --u)
      for (const TensorSpec& t : units_[u].tensors) {
        if (cur.numel == 0) cur.offset = offset_[u] + t.offset;
        cur.numel += t.numel();
        if (cur.numel * 4.0 >= (buckets_.empty() ? kFirstBucketBytes : cap)) {
          buckets_.push_back(cur);
          cur = Bucket{};
        }
      }
    if (cur.numel > 0) buckets_.push_back(cur);
  }

  const float* params_for(int u) override { return params_ + offset_[u]; }
  float* grads_for(int u) override { return grads_ + offset_[u]; }

  void before_backward(int pos) override {
    if (pos == 0) {
      b_.fill(grads_, 0.f, total_);
      ready_ = 0;
      next_bucket_ = 0;
    }
  }

  void after_backward(int pos) override {
    const int u = backward_unit(pos);
    if (unit_stages_[u].last_backward != pos) return;
    ready_ = std::max(ready_, offset_[u] + units_[u].numel);  // completed prefix of the buffer
    while (next_bucket_ < buckets_.size()) {
      Bucket& bk = buckets_[next_bucket_];
      if (bk.offset + bk.numel > ready_) break;
      bk.request = b_.all_reduce(grads_ + bk.offset, bk.numel, *mesh_.replicate_comm);
      ++next_bucket_;
    }
  }

  void finish_gradients() override {
    SB_ASSERT(next_bucket_ == buckets_.size(), "a DDP bucket was never launched");
    for (Bucket& bk : buckets_) b_.wait(bk.request);
  }

  void optimizer_step(int step) override { b_.adam(params_, grads_, m_, v_, total_, cfg_.adam, step); }

  std::vector<int64_t> offset_;
  int64_t total_ = 0, ready_ = 0;
  std::vector<Bucket> buckets_;
  size_t next_bucket_ = 0;
  float *params_ = nullptr, *grads_ = nullptr, *m_ = nullptr, *v_ = nullptr;
};

}  // namespace

std::unique_ptr<Strategy> make_ddp(const StrategyConfig& cfg, const ModelSpec& spec, Backend& b,
                                   Mesh& mesh, const StepShape& shape) {
  return std::make_unique<DDP>(cfg, spec, b, mesh, shape);
}

}  // namespace sb
