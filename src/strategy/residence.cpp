// The kinds of Residence (strategy/residence.h). Each constructor allocates in the order the
// memory plan counts: the kind's own buffers, then the gradient shards, then the initial
// parameters (seeded, and where the device keeps a copy, written or gathered into it).
#include "shardbench/strategy/residence.h"

#include <cstring>
#include <functional>
#include <utility>

#include "shardbench/core/check.h"
#include "shardbench/core/fault.h"
#include "shardbench/model/t5.h"
#include "shardbench/strategy/offload.h"
#include "shardbench/strategy/strategy.h"

namespace sb {

Residence::Residence(const StrategyConfig& cfg, Backend& b, const Mesh& mesh, const std::vector<UnitSpec>& units)
    : cfg_(cfg), b_(b), mesh_(mesh), units_(units), shards_(units.size()), offset_(units.size()) {
  for (size_t u = 0; u < units_.size(); ++u) {
    shards_[u] = shard_of(units_[u].numel, mesh_.layout.shard, mesh_.layout.shard_rank(),
                          optimizer_region_alignment(cfg_.optimizer));
    offset_[u] = total_;
    total_ += shards_[u].size;
  }
}

Residence::~Residence() { b_.release(grads_.ptr); }

// Backward writes into the shard itself only where nothing is reduced into it from elsewhere
// (unsharded), its type is backward's and each step reduces it once (so its sum is the step's).
Buf Residence::accumulator(int u) const {
  const bool direct = !sharded() && cfg_.param_dtype == cfg_.reduce_dtype && !cfg_.reduces_every_micro_batch();
  return direct ? gradient_shard(u) : Buf();
}

std::vector<int64_t> Residence::lengths() const {
  std::vector<int64_t> n;
  for (const ShardInfo& s : shards_) n.push_back(s.size);
  return n;
}

void Residence::allocate_gradient_shards() { grads_ = b_.alloc_buf(total_, cfg_.reduce_dtype, MemCategory::Gradients); }

void Residence::init_master(int u, float* dst) {
  init_unit_params(b_, units_[size_t(u)], cfg_.seed, dst, shards_[size_t(u)].offset, shards_[size_t(u)].size);
}

std::vector<float> Residence::gather_on_host(CBuf shard, int u, bool in_host_memory) const {
  const ShardInfo& s = shards_[size_t(u)];
  const int bytes = int(s.size * dtype_size(shard.dtype));
  std::vector<char> mine(bytes), full(size_t(bytes) * mesh_.layout.shard);
  if (in_host_memory) {
    if (bytes > 0) std::memcpy(mine.data(), shard.ptr, size_t(bytes));
  } else {
    b_.download(mine.data(), shard.ptr, bytes);
  }
  if (sharded())
    MPI_CHECK(MPI_Allgather(mine.data(), bytes, MPI_BYTE, full.data(), bytes, MPI_BYTE, mesh_.mpi(Axis::Shard)));
  else
    full = mine;
  return host_as_f32(full, shard.dtype, s.numel);
}

namespace {

// fp32 master shards and the optimizer state of their regions, on the device.
class DeviceMaster {
 public:
  // `own_params`: false where the master is elsewhere (ZeRO-1 in fp32: slices of the whole
  // parameters); the state is allocated after the parameters.
  DeviceMaster(Backend& b, int64_t total, bool own_params, OptimizerRegions r) : regions(std::move(r)), b_(b) {
    if (own_params) params = b_.alloc_floats(total, MemCategory::Parameters);
    if (regions.state.bytes > 0) state_ = static_cast<char*>(b_.alloc(size_t(regions.state.bytes), MemCategory::OptimizerState));
  }
  ~DeviceMaster() {
    b_.release(params);
    b_.release(state_);
  }
  void init_state(const OptimizerConfig& opt) {
    for (size_t r = 0; r < regions.first.size() && state_; ++r)
      b_.optimizer_init_state(opt, state(r), regions.length[r]);
  }
  void* state(size_t r) const { return state_ ? state_ + regions.state.offset[r] : nullptr; }
  // Every region's update (the shards flat in `params` and `grads`), writing `copy` too.
  void update(const OptimizerConfig& opt, int step, Buf grads, Buf copy) {
    for (size_t r = 0; r < regions.first.size(); ++r) {
      const int64_t i = regions.first[r];
      b_.optimizer_update(opt, step, params + i, grads + i, state(r), regions.length[r], copy ? copy + i : Buf());
    }
  }

  float* params = nullptr;
  OptimizerRegions regions;

 private:
  Backend& b_;
  char* state_ = nullptr;
};

// ZeRO-1's whole parameters and gradients (param dtype) on every rank, unit u's padded to
// the shard group at offset_[u] (the padding stays zero).
class WholeParams {
 public:
  WholeParams(Backend& b, DType t, const std::vector<ShardInfo>& shards) : b_(b), shards_(shards), offset_(shards.size()) {
    int64_t total = 0;
    for (size_t u = 0; u < shards_.size(); ++u) offset_[u] = total, total += shards_[u].padded;
    params_ = b_.alloc_buf(total, t, MemCategory::Parameters);
    grads_ = b_.alloc_buf(total, t, MemCategory::Gradients);
    b_.fill(params_, 0.f, total);
  }
  ~WholeParams() {
    b_.release(params_.ptr);
    b_.release(grads_.ptr);
  }
  Buf params(int u) const { return params_ + offset_[size_t(u)]; }
  Buf grad(int u) const { return grads_ + offset_[size_t(u)]; }
  Buf slice(int u) const { return params(u) + shards_[size_t(u)].offset; }  // this rank's shard
  // Every rank's slice all-gathered in place, unit by unit (the gathers overlap; returns once
  // all are done). `write_slice(u)` first writes this rank's slice where it is not yet;
  // `after[u]` the request its gather waits for (offload: the slice's upload). `step`: the
  // update just run, 0 for the initial parameters.
  void gather(const Mesh& mesh, int step, const std::function<void(int)>& write_slice,
              const std::vector<Request>& after = {}) {
    const bool skip = injected_fault(Fault::Zero1SkipParamGather) && step > 0;
    std::vector<Request> gathers;
    for (size_t u = 0; u < shards_.size(); ++u) {
      const ShardInfo& s = shards_[u];
      if (s.padded == 0) continue;
      if (write_slice) write_slice(int(u));
      ScopedContext target(b_, b_.phase(), int(u));
      const Request upload = after.empty() ? kNoRequest : after[u];
      if (mesh.layout.shard > 1 && !skip)
        gathers.push_back(b_.all_gather(slice(int(u)), params(int(u)), s.size, mesh.comm(Axis::Shard), upload));
      else if (upload != kNoRequest)
        gathers.push_back(upload);
    }
    for (Request r : gathers) b_.wait(r);
  }

 private:
  Backend& b_;
  const std::vector<ShardInfo>& shards_;
  std::vector<int64_t> offset_;
  Buf params_, grads_;
};

// Sharded parameters, all-gathered before each use from the fp32 master shards.
class Gathered final : public Residence {
 public:
  Gathered(const StrategyConfig& cfg, Backend& b, const Mesh& mesh, const std::vector<UnitSpec>& units)
      : Residence(cfg, b, mesh, units),
        master_(b, total_, true, optimizer_regions(cfg.optimizer, offset_, lengths())) {
    allocate_gradient_shards();
    for (size_t u = 0; u < units_.size(); ++u) init_master(int(u), master_.params + offset_[u]);
    master_.init_state(cfg_.optimizer);
  }
  bool gathers() const override { return true; }
  // Low precision: cast into this rank's slice, gathered in place.
  Request start_gather(int u, Buf full) override {
    const ShardInfo& s = shard(u);
    CBuf send = master_.params + offset_[size_t(u)];
    if (low_precision()) {
      const Buf slice = full + int64_t(mesh_.layout.shard_rank()) * s.size;
      b_.cast(slice, send, s.size);
      send = slice;
    }
    return b_.all_gather(send, full, s.size, mesh_.comm(Axis::Shard));
  }
  void update(int step) override { master_.update(cfg_.optimizer, step, grads_, Buf()); }

 private:
  const float* master(int u) const override { return master_.params + offset_[size_t(u)]; }
  DeviceMaster master_;
};

// Unsharded: the fp32 parameters serve every unit, through a param-dtype copy in low
// precision (refreshed by the update, in the same pass).
class Whole final : public Residence {
 public:
  Whole(const StrategyConfig& cfg, Backend& b, const Mesh& mesh, const std::vector<UnitSpec>& units)
      : Residence(cfg, b, mesh, units),
        master_(b, total_, true, optimizer_regions(cfg.optimizer, offset_, lengths())) {
    allocate_gradient_shards();
    for (size_t u = 0; u < units_.size(); ++u) init_master(int(u), master_.params + offset_[u]);
    master_.init_state(cfg_.optimizer);
    if (low_precision()) {
      compute_ = b_.alloc_buf(total_, cfg_.param_dtype, MemCategory::Parameters);
      b_.cast(compute_, master_.params, total_);
    }
  }
  ~Whole() override { b_.release(compute_.ptr); }
  CBuf params(int u) const override {
    return compute_ ? CBuf(compute_ + offset_[size_t(u)]) : CBuf(master_.params + offset_[size_t(u)]);
  }
  void update(int step) override { master_.update(cfg_.optimizer, step, grads_, compute_); }

 private:
  const float* master(int u) const override { return master_.params + offset_[size_t(u)]; }
  DeviceMaster master_;
  Buf compute_;  // low precision: the parameters in param dtype
};

// ZeRO-1: whole parameters and gradients; each unit's master shard (in fp32, this rank's
// slice of the whole parameters: no second copy) and state are updated on their own, the
// update rounded into the slice, then every slice all-gathered.
class ShardedOptimizer final : public Residence {
 public:
  ShardedOptimizer(const StrategyConfig& cfg, Backend& b, const Mesh& mesh, const std::vector<UnitSpec>& units)
      : Residence(cfg, b, mesh, units),
        whole_(b, cfg.param_dtype, shards_),
        master_(b, total_, low_precision(), unit_regions()) {
    allocate_gradient_shards();
    for (size_t u = 0; u < units_.size(); ++u) init_master(int(u), master_shard(int(u)));
    master_.init_state(cfg_.optimizer);
    whole_.gather(mesh_, 0, [this](int u) {
      if (low_precision()) b_.cast(whole_.slice(u), master(u), shard(u).size);
    });
  }
  CBuf params(int u) const override { return whole_.params(u); }
  Buf accumulator(int u) const override { return whole_.grad(u); }
  bool keeps_whole_gradient() const override { return true; }
  void update(int step) override {
    for (size_t u = 0; u < units_.size(); ++u)
      if (shards_[u].size > 0)
        b_.optimizer_update(cfg_.optimizer, step, master_shard(int(u)), gradient_shard(int(u)), master_.state(u), shards_[u].size,
                            low_precision() ? whole_.slice(int(u)) : Buf());
    whole_.gather(mesh_, step, nullptr);
  }

 private:
  const float* master(int u) const override { return master_shard(u); }
  float* master_shard(int u) const {
    return master_.params ? master_.params + offset_[size_t(u)] : static_cast<float*>(whole_.slice(u).ptr);
  }
  // One region per unit: the update runs unit by unit.
  OptimizerRegions unit_regions() const {
    const std::vector<int64_t> n = lengths();
    return OptimizerRegions{offset_, n, optimizer_state_layout(cfg_.optimizer, n)};
  }
  WholeParams whole_;
  DeviceMaster master_;
};

// CPU offload (strategy/offload.h): master shards, state and gradient copies on the host,
// the update on the CPU. The reduced gradient shard stays on the device too (the loss
// scale's check, the pipeline's embedding sum and --check read it there); it is downloaded
// as soon as its reduction is done, unless a later add (sharded accumulation) or sum (the
// embedding over stages) still changes it: then before the update.
class Offloaded : public Residence {
 public:
  void reduced(int u, Request done) override {
    if (final_once_reduced_[size_t(u)]) offload_->download_gradient(u, gradient_shard(u), done);
  }
  void update(int step) override {
    for (size_t u = 0; u < units_.size(); ++u)
      if (shards_[u].size > 0 && !final_once_reduced_[u])
        offload_->download_gradient(int(u), gradient_shard(int(u)), kNoRequest);
    finish_uploads(offload_->update(cfg_.optimizer, step, [this](int u) { return upload_destination(u); }), step);
  }

 protected:
  // Final once reduced: unless a later micro-batch's reduction is added in (sharded
  // accumulation) or it is summed over pipeline stages afterwards.
  Offloaded(const StrategyConfig& cfg, Backend& b, const Mesh& mesh, const std::vector<UnitSpec>& units,
            const std::vector<bool>& summed_across_stages)
      : Residence(cfg, b, mesh, units), final_once_reduced_(units.size()) {
    for (size_t u = 0; u < units.size(); ++u)
      final_once_reduced_[u] = !cfg_.reduces_every_micro_batch() && !summed_across_stages[u];
  }
  void allocate_host() {
    offload_ = std::make_unique<HostOffload>(b_, cfg_.optimizer, lengths(), cfg_.reduce_dtype, cfg_.param_dtype,
                                             cfg_.host_threads);
  }
  // After the kind's device buffers: the gradient shards, the host's initial masters and the
  // device's first parameters, as after an update.
  void initialize() {
    allocate_gradient_shards();
    for (size_t u = 0; u < units_.size(); ++u) offload_->initialize(int(u), [&](float* dst) { init_master(int(u), dst); });
    std::vector<Request> uploads(units_.size(), kNoRequest);
    for (size_t u = 0; u < units_.size(); ++u)
      if (const Buf dst = upload_destination(int(u)); dst && shards_[u].size > 0) uploads[u] = offload_->upload(int(u), dst);
    finish_uploads(uploads, 0);
  }
  // Where an update's rounding goes on the device (none: the next gathers upload it), and
  // what follows the uploads (`step`: the update's, 0 for the initial parameters).
  virtual Buf upload_destination(int u) const { return Buf(); }
  virtual void finish_uploads(const std::vector<Request>& uploads, int step) {
    for (Request r : uploads)
      if (r != kNoRequest) b_.wait(r);
  }

  const float* master(int u) const override { return offload_->master(u); }
  bool master_on_host() const override { return true; }

  std::unique_ptr<HostOffload> offload_;

 private:
  std::vector<bool> final_once_reduced_;
};

// --cpu-offload params: no parameters kept on the device between uses; each gather starts
// from the shard's upload into this rank's slice, gathered in place after it.
class OffloadedParams final : public Offloaded {
 public:
  OffloadedParams(const StrategyConfig& cfg, Backend& b, const Mesh& mesh, const std::vector<UnitSpec>& units,
                  const std::vector<bool>& summed_across_stages)
      : Offloaded(cfg, b, mesh, units, summed_across_stages) {
    allocate_host();
    initialize();
  }
  bool gathers() const override { return true; }
  Request start_gather(int u, Buf full) override {
    const ShardInfo& s = shard(u);
    const Buf slice = full + int64_t(mesh_.layout.shard_rank()) * s.size;
    const Request upload = offload_->upload(u, slice);
    return sharded() ? b_.all_gather(slice, full, s.size, mesh_.comm(Axis::Shard), upload) : upload;
  }
};

// --cpu-offload optimizer (ZeRO-Offload): the device keeps the param-dtype shards, which the
// gathers start from (ZeRO-1: the whole parameters, gathered after each update's uploads).
class OffloadedOptimizer final : public Offloaded {
 public:
  OffloadedOptimizer(const StrategyConfig& cfg, Backend& b, const Mesh& mesh, const std::vector<UnitSpec>& units,
                     const std::vector<bool>& summed_across_stages)
      : Offloaded(cfg, b, mesh, units, summed_across_stages) {
    if (cfg_.sharding == Sharding::OptimizerState) whole_ = std::make_unique<WholeParams>(b_, cfg_.param_dtype, shards_);
    allocate_host();
    if (!whole_) device_shard_ = b_.alloc_buf(total_, cfg_.param_dtype, MemCategory::Parameters);
    initialize();
  }
  ~OffloadedOptimizer() override { b_.release(device_shard_.ptr); }
  bool gathers() const override { return !whole_ && sharded(); }
  CBuf params(int u) const override { return whole_ ? whole_->params(u) : device_shard_ + offset_[size_t(u)]; }
  Request start_gather(int u, Buf full) override {
    return b_.all_gather(device_shard_ + offset_[size_t(u)], full, shard(u).size, mesh_.comm(Axis::Shard));
  }
  Buf accumulator(int u) const override { return whole_ ? whole_->grad(u) : Offloaded::accumulator(u); }
  bool keeps_whole_gradient() const override { return bool(whole_); }

 private:
  Buf upload_destination(int u) const override {
    return whole_ ? whole_->slice(u) : device_shard_ + offset_[size_t(u)];
  }
  void finish_uploads(const std::vector<Request>& uploads, int step) override {
    if (whole_) return whole_->gather(mesh_, step, nullptr, uploads);
    Offloaded::finish_uploads(uploads, step);
  }
  std::unique_ptr<WholeParams> whole_;
  Buf device_shard_;  // not ZeRO-1: the param-dtype shards
};

}  // namespace

std::unique_ptr<Residence> Residence::make(const StrategyConfig& cfg, Backend& b, const Mesh& mesh,
                                           const std::vector<UnitSpec>& units,
                                           const std::vector<bool>& summed_across_stages) {
  switch (cfg.cpu_offload) {
    case CpuOffload::Params: return std::make_unique<OffloadedParams>(cfg, b, mesh, units, summed_across_stages);
    case CpuOffload::Optimizer: return std::make_unique<OffloadedOptimizer>(cfg, b, mesh, units, summed_across_stages);
    case CpuOffload::None: break;
  }
  if (cfg.sharding == Sharding::OptimizerState) return std::make_unique<ShardedOptimizer>(cfg, b, mesh, units);
  if (mesh.layout.shard > 1) return std::make_unique<Gathered>(cfg, b, mesh, units);
  return std::make_unique<Whole>(cfg, b, mesh, units);
}

}  // namespace sb
