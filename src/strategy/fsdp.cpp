// FSDP (PyTorch FullyShardedDataParallel semantics, ../shared/reference.md): one flat
// parameter per unit, padded to a multiple of the shard group and split into equal
// contiguous shards. Each rank owns fp32 shards of the parameters, gradients and Adam state
// of every unit; Adam runs on the shards only.
//   full    (ZeRO-3)  all-gather before forward, free after; gather again for backward;
//                     reduce-scatter gradients
//   grad-op (ZeRO-2)  keep the gathered unit from forward until its backward
//   hybrid  G         full sharding inside groups of G consecutive ranks, then all-reduce
//                     of the gradient shards across groups
//   none              no sharding (shard group of 1): all-reduce of each unit's gradient
// The root unit (embeddings, final norms) is not freed after forward: it is used again
// right away by the first backward stage.
#include "shardbench/check.h"
#include "shardbench/strategy.h"

namespace sb {
namespace {

constexpr int kMaxAllGathersInFlight = 2;  // PyTorch limit_all_gathers

class FSDP final : public TrainingSchedule {
 public:
  FSDP(const StrategyConfig& cfg, const ModelSpec& spec, Backend& b, Mesh& mesh, const StepShape& shape)
      : TrainingSchedule(cfg, spec, b, mesh, shape),
        shards_(units_.size()),
        offset_(units_.size()),
        gathered_(units_.size(), nullptr),
        gather_req_(units_.size(), kNoRequest),
        full_grad_(units_.size(), nullptr) {
    const int G = mesh_.layout.shard;
    for (size_t u = 0; u < units_.size(); ++u) {
      shards_[u] = shard_of(units_[u].numel, G, mesh_.layout.shard_rank());
      offset_[u] = total_;
      total_ += shards_[u].size;
    }
    params_ = b_.alloc_floats(total_, MemCategory::Parameters);
    grads_ = b_.alloc_floats(total_, MemCategory::Gradients);
    m_ = b_.alloc_floats(total_, MemCategory::OptimizerState);
    v_ = b_.alloc_floats(total_, MemCategory::OptimizerState);
    for (size_t u = 0; u < units_.size(); ++u)
      init_unit_params(b_, units_[u], int(u), cfg_.seed, params_ + offset_[u], shards_[u].offset,
                       shards_[u].size);
    b_.fill(m_, 0.f, total_);
    b_.fill(v_, 0.f, total_);
  }
  ~FSDP() override {
    finish_gradients();  // no reduction may still write into buffers freed below
    for (size_t u = 0; u < units_.size(); ++u) {
      free_gathered(int(u));
      b_.release(full_grad_[u]);
    }
    for (float* p : {params_, grads_, m_, v_}) b_.release(p);
  }

  std::vector<float> gather_unit(int u) override {
    const ShardInfo& s = shards_[u];
    float* full = b_.alloc_floats(s.padded, MemCategory::CommBuffers);
    b_.wait(b_.all_gather(params_ + offset_[u], full, s.size, *mesh_.shard_comm));
    std::vector<float> host(s.numel);
    b_.download(host.data(), full, host.size() * 4);
    b_.release(full);
    return host;
  }

 private:
  bool sharded() const { return mesh_.layout.shard > 1; }
  bool keep_after_forward(int u) const { return u == 0 || cfg_.sharding == Sharding::GradOp; }

  // ---- parameters ----
  const float* params_for(int u) override { return sharded() ? gathered_[u] : params_ + offset_[u]; }

  void issue_gather(int u) {
    const ShardInfo& s = shards_[u];
    gathered_[u] = b_.alloc_floats(s.padded, MemCategory::CommBuffers);
    gather_req_[u] = b_.all_gather(params_ + offset_[u], gathered_[u], s.size, *mesh_.shard_comm);
    ++gathers_in_flight_;
  }
  void prefetch(int u) {
    if (sharded() && !gathered_[u] && gathers_in_flight_ < kMaxAllGathersInFlight) issue_gather(u);
  }
  // Issue u's all-gather if nobody did, then the prefetch (so it overlaps u's compute),
  // then wait for u.
  void unshard(int u, int prefetch_unit) {
    if (!sharded()) return;
    if (!gathered_[u]) issue_gather(u);
    if (prefetch_unit >= 0) prefetch(prefetch_unit);
    if (gather_req_[u] != kNoRequest) {
      b_.wait(gather_req_[u]);
      gather_req_[u] = kNoRequest;
      --gathers_in_flight_;
    }
  }
  void free_gathered(int u) {
    if (!gathered_[u]) return;
    if (gather_req_[u] != kNoRequest) {
      b_.wait(gather_req_[u]);
      gather_req_[u] = kNoRequest;
      --gathers_in_flight_;
    }
    b_.release(gathered_[u]);
    gathered_[u] = nullptr;
  }

  void before_forward(int pos) override {
    const bool ahead = cfg_.forward_prefetch && pos + 1 < num_stages();
    unshard(forward_unit(pos), ahead ? forward_unit(pos + 1) : -1);
  }
  void after_forward(int pos) override {
    const int u = forward_unit(pos);
    if (sharded() && unit_stages_[u].last_forward == pos && !keep_after_forward(u)) free_gathered(u);
  }

  // ---- gradients ----
  float* grads_for(int u) override { return sharded() ? full_grad_[u] : grads_ + offset_[u]; }

  void before_backward(int pos) override {
    const int u = backward_unit(pos);
    if (unit_stages_[u].first_backward == pos) {
      if (sharded()) full_grad_[u] = b_.alloc_floats(shards_[u].padded, MemCategory::CommBuffers);
      b_.fill(grads_for(u), 0.f, sharded() ? shards_[u].padded : shards_[u].size);
    }
    const bool pre = cfg_.prefetch == Prefetch::BackwardPre && pos + 1 < num_stages();
    unshard(u, pre ? backward_unit(pos + 1) : -1);
  }

  void after_backward(int pos) override {
    const int u = backward_unit(pos);
    if (cfg_.prefetch == Prefetch::BackwardPost && pos + 1 < num_stages()) prefetch(backward_unit(pos + 1));
    if (unit_stages_[u].last_backward == pos) {
      free_gathered(u);
      reduce_gradients(u);
    }
  }

  // Reduce-scatter inside the shard group, then (hybrid, none) all-reduce of the shard
  // across replicas. One reduce-scatter is in flight at a time: the previous unit's is
  // completed before the next is issued, so it overlaps one unit's backward, at most two
  // unsharded gradients exist at once, and memory use is the same on every run (the plan
  // predicts it exactly).
  void reduce_gradients(int u) {
    complete_scatter();
    if (sharded()) {
      scatter_unit_ = u;
      scatter_ = b_.reduce_scatter(full_grad_[u], grads_ + offset_[u], shards_[u].size, *mesh_.shard_comm);
    } else {
      allreduces_.push_back(b_.all_reduce(grads_ + offset_[u], shards_[u].size, *mesh_.replicate_comm));
    }
  }
  void complete_scatter() {
    if (scatter_unit_ < 0) return;
    const int u = scatter_unit_;
    b_.wait(scatter_);
    b_.release(full_grad_[u]);
    full_grad_[u] = nullptr;
    scatter_unit_ = -1;
    if (mesh_.layout.replicate > 1)
      allreduces_.push_back(b_.all_reduce(grads_ + offset_[u], shards_[u].size, *mesh_.replicate_comm));
  }
  void finish_gradients() override {
    complete_scatter();
    for (Request r : allreduces_) b_.wait(r);
    allreduces_.clear();
  }

  void optimizer_step(int step) override { b_.adam(params_, grads_, m_, v_, total_, cfg_.adam, step); }

  std::vector<ShardInfo> shards_;
  std::vector<int64_t> offset_;  // of each unit's shard in the flat shard buffers
  int64_t total_ = 0;
  float *params_ = nullptr, *grads_ = nullptr, *m_ = nullptr, *v_ = nullptr;
  std::vector<float*> gathered_;
  std::vector<Request> gather_req_;
  std::vector<float*> full_grad_;
  int gathers_in_flight_ = 0;
  int scatter_unit_ = -1;
  Request scatter_ = kNoRequest;
  std::vector<Request> allreduces_;
};

}  // namespace

std::unique_ptr<Strategy> make_fsdp(const StrategyConfig& cfg, const ModelSpec& spec, Backend& b,
                                    Mesh& mesh, const StepShape& shape) {
  return std::make_unique<FSDP>(cfg, spec, b, mesh, shape);
}

}  // namespace sb
