// FSDP (PyTorch FullyShardedDataParallel semantics, docs/references.md §5): one flat
// parameter per unit, padded to a multiple of the shard group and divided into equal
// contiguous shards. Each rank owns fp32 shards of the parameters, gradients and Adam state
// of every unit; Adam runs on the shards only.
//   full    (ZeRO-3)  all-gather before forward, free after; gather again for backward;
//                     reduce-scatter gradients
//   grad-op (ZeRO-2)  keep the gathered unit from forward until its backward
//   hybrid  G         full sharding inside groups of G consecutive ranks, then all-reduce
//                     of the gradient shards across groups
//   none              no sharding (shard group of 1): all-reduce of each unit's gradient
//   optimizer (ZeRO-1) parameters and gradients whole on every rank, as DDP; the fp32 master
//                     parameters and optimizer state sharded. Each unit's whole gradient is
//                     accumulated over the micro-batches and reduce-scattered after the last
//                     one's backward (the unit plays Megatron-LM's bucket); the update runs
//                     on the shard, then the updated parameters are all-gathered in place
//                     (Megatron-LM's distributed optimizer, DeepSpeed ZeRO stage 1). With
//                     fp32 parameters the master shard is this rank's slice of the whole
//                     parameters (no second copy); hybrid groups as hybrid's.
// Gradient reduction as PyTorch schedules it: FSDP1 (default) issues each unit's
// reduce-scatter on the communication stream and releases the unsharded gradient at once,
// stream-ordered (its memory is reused once the reduce-scatter has read it); compute waits
// for the reduce-scatters only at the end of backward. FSDP2 (--fsdp-version 2) makes
// compute wait for the previous unit's reduce-scatter before issuing the next and frees the
// previous unsharded gradient then. Either way, hybrid's all-reduce across replicas is
// issued right after its reduce-scatter, ordered after it on the communication streams.
// CPU offload (--cpu-offload, strategy/offload.h): params keeps no parameters between uses
// on the device: each all-gather starts from an upload of the rank's shard (rounded to the
// param dtype by the CPU update) into its slice, stream-ordered after it; optimizer keeps the
// param-dtype shard (ZeRO-1: the whole parameters) on the device and uploads the update's
// rounding into it. Either way the reduced gradient shard stays on the device (the loss
// scale's check, the pipeline's embedding sum and --check read it there) and is downloaded
// as soon as its reduction is done, unless a later sum (the embedding over stages) or add
// (sharded accumulation) still changes it: then after backward.
// A collective is tagged with the unit it gathers or reduces, not the piece issuing it.
// The units outside the blocks (embedding, bridge, head: PyTorch's root unit, split) are not
// freed after forward, as the root's parameters are not: the head is used again right away
// by the first backward piece, the embedding by up to three pieces.
// Over a step's micro-batches (--grad-accumulation): unsharded (the default, PyTorch's
// no_sync()) holds each unit's unsharded gradient until the last micro-batch's backward and
// reduces it once; sharded reduces after every micro-batch's backward and adds the result
// into the gradient shard (the first micro-batch's reduction writes it). The add waits for
// its reduction, so it is done before the next unit's reduction is issued (or at the end
// of backward): at most one partial shard is alive, as FSDP2's post-backward holds one.
// Mixed precision (param_dtype P, reduce_dtype R), as FSDP2's MixedPrecisionPolicy: each
// rank casts its fp32 shard into its slice of the P gather buffer and all-gathers in place;
// backward writes P gradients, cast to R (when R differs) before the reduce-scatter; Adam
// reads the R gradient shard. Without sharding, a persistent P copy of the parameters is
// refreshed after each optimizer step.
#include <algorithm>
#include <cstring>
#include <memory>
#include <utility>

#include "shardbench/core/check.h"
#include "shardbench/core/fault.h"
#include "shardbench/strategy/offload.h"
#include "shardbench/strategy/training_schedule.h"

namespace sb {
namespace {

constexpr int kMaxAllGathersInFlight = 2;  // PyTorch limit_all_gathers

class FSDP final : public TrainingSchedule {
 public:
  FSDP(const Setup& setup, Backend& b, Mesh& mesh)
      : TrainingSchedule(setup, b, mesh),
        shards_(units_.size()),
        offset_(units_.size()),
        gathered_(units_.size()),
        gather_req_(units_.size(), kNoRequest),
        full_grad_(units_.size()) {
    const int G = mesh_.layout.shard;
    for (size_t u = 0; u < units_.size(); ++u) {
      shards_[u] = shard_of(units_[u].numel, G, mesh_.layout.shard_rank(), optimizer_region_alignment(cfg_.optimizer));
      offset_[u] = total_;
      total_ += shards_[u].size;
    }
    if (zero1()) {  // the whole parameters and gradients, units padded to the shard group
      whole_offset_.resize(units_.size());
      for (size_t u = 0; u < units_.size(); ++u) whole_offset_[u] = whole_total_, whole_total_ += shards_[u].padded;
      whole_params_ = b_.alloc_buf(whole_total_, cfg_.param_dtype, MemCategory::Parameters);
      whole_grads_ = b_.alloc_buf(whole_total_, cfg_.param_dtype, MemCategory::Gradients);
      b_.fill(whole_params_, 0.f, whole_total_);  // the padding stays zero
    }
    std::vector<int64_t> sizes;  // the optimizer's regions: all shards, or each (adamw-8bit)
    for (const ShardInfo& s : shards_) sizes.push_back(s.size);
    if (offloaded()) {
      offload_ = std::make_unique<HostOffload>(b_, cfg_.optimizer, sizes, cfg_.reduce_dtype, cfg_.param_dtype,
                                               cfg_.host_threads);
      if (offload_optimizer() && !zero1()) device_shard_ = b_.alloc_buf(total_, cfg_.param_dtype, MemCategory::Parameters);
    } else {
      if (!zero1() || low_precision()) params_ = b_.alloc_floats(total_, MemCategory::Parameters);
      // ZeRO-1 updates unit by unit (its fp32 master may be slices of the whole parameters)
      regions_ = zero1() ? OptimizerRegions{offset_, sizes, optimizer_state_layout(cfg_.optimizer, sizes)}
                         : optimizer_regions(cfg_.optimizer, offset_, sizes);
      if (regions_.state.bytes > 0)
        state_ = static_cast<char*>(b_.alloc(size_t(regions_.state.bytes), MemCategory::OptimizerState));
    }
    grads_ = b_.alloc_buf(total_, cfg_.reduce_dtype, MemCategory::Gradients);
    for (size_t u = 0; u < units_.size(); ++u) {
      const auto init = [&](float* dst) { init_unit_params(b_, units_[u], cfg_.seed, dst, shards_[u].offset, shards_[u].size); };
      offload_ ? offload_->initialize(int(u), init) : init(master(int(u)));
    }
    for (size_t r = 0; r < regions_.first.size() && state_; ++r)
      b_.optimizer_init_state(cfg_.optimizer, state_ + regions_.state.offset[r], regions_.length[r]);
    if (offload_) {  // the device's first parameters: as after an update
      std::vector<Request> uploads(units_.size(), kNoRequest);
      for (size_t u = 0; u < units_.size(); ++u)
        if (const Buf dst = upload_destination(int(u)); dst && shards_[u].size > 0) uploads[u] = offload_->upload(int(u), dst);
      finish_uploads(uploads);
    } else if (zero1()) {
      gather_whole_params(true);
    }
    if (!sharded() && low_precision() && !zero1() && !offloaded()) {
      compute_ = b_.alloc_buf(total_, cfg_.param_dtype, MemCategory::Parameters);
      b_.cast(compute_, params_, total_);
    }
  }
  ~FSDP() override {
    finish_gradients();  // no reduction may still write into buffers freed below
    for (size_t u = 0; u < units_.size(); ++u) {
      free_gathered(int(u));
      b_.release(full_grad_[u].ptr);
    }
    offload_.reset();
    for (void* p : {(void*)params_, grads_.ptr, (void*)state_, compute_.ptr, whole_params_.ptr, whole_grads_.ptr,
                    device_shard_.ptr})
      b_.release(p);
  }

  std::vector<float> gather_unit(int u) override { return gather_on_host(master(u), u, offloaded()); }
  std::vector<float> gather_unit_grad(int u) override { return gather_on_host(grads_ + offset_[u], u); }

 private:
  // The optimizer state and master parameters are sharded (every mode but none, or a
  // shard group of one); the parameters themselves are, between uses, under full, hybrid
  // and grad-op only.
  bool sharded() const { return mesh_.layout.shard > 1; }
  bool zero1() const { return cfg_.sharding == Sharding::OptimizerState; }
  bool offload_params() const { return cfg_.cpu_offload == CpuOffload::Params; }
  bool offload_optimizer() const { return cfg_.cpu_offload == CpuOffload::Optimizer; }
  bool offloaded() const { return cfg_.cpu_offload != CpuOffload::None; }
  // Gathered before use: sharded parameters, and offloaded ones (uploaded, even unsharded).
  bool params_sharded() const { return (sharded() || offload_params()) && !zero1(); }
  // Unit u's fp32 master shard: its own buffer, or (ZeRO-1 in fp32) this rank's slice of
  // the whole parameters.
  float* master(int u) const {
    if (offload_) return offload_->master(u);
    if (params_) return params_ + offset_[u];
    return static_cast<float*>(whole_params_.ptr) + whole_offset_[u] + shards_[u].offset;
  }
  // Unit u's optimizer state where regions are per unit (ZeRO-1).
  void* unit_state(int u) const { return state_ ? state_ + regions_.state.offset[size_t(u)] : nullptr; }
  bool low_precision() const { return cfg_.param_dtype != DType::F32; }
  bool reduce_every_micro() const { return cfg_.reduces_every_micro_batch(); }
  // Backward writes into a separate unsharded gradient (rather than the shard itself); so it
  // does when each micro-batch is reduced, or the next one's backward would add to a sum.
  bool separate_grad() const {
    return sharded() || cfg_.param_dtype != cfg_.reduce_dtype || reduce_every_micro();
  }
  bool keep_after_forward(int u) const { return !is_block(units_[u].kind) || cfg_.sharding == Sharding::GradOp; }

  // Unit u's shards at `shard` gathered as fp32 on the host: no backend memory, so checks
  // between steps leave the run's memory peaks as they were.
  std::vector<float> gather_on_host(CBuf shard, int u, bool in_host_memory = false) {
    const ShardInfo& s = shards_[u];
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

  // ---- parameters ----
  CBuf params_for(int u) override {
    if (zero1()) return whole_params_ + whole_offset_[u];
    if (params_sharded()) return gathered_[u];
    if (offload_optimizer()) return device_shard_ + offset_[u];
    return low_precision() ? CBuf(compute_ + offset_[u]) : CBuf(params_ + offset_[u]);
  }

  void issue_gather(int u) {
    const ShardInfo& s = shards_[u];
    gathered_[u] = b_.alloc_buf(s.padded, cfg_.param_dtype, MemCategory::CommBuffers);
    const Buf slice = gathered_[u] + int64_t(mesh_.layout.shard_rank()) * s.size;
    ScopedContext target(b_, b_.phase(), u);
    CBuf send = params_ ? CBuf(params_ + offset_[u]) : CBuf();
    Request upload = kNoRequest;
    if (offload_params()) {  // the shard's upload into this rank's slice, gathered in place after it
      upload = offload_->upload(u, slice);
      send = slice;
    } else if (offload_optimizer()) {
      send = device_shard_ + offset_[u];
    } else if (low_precision()) {  // cast into this rank's slice, gather in place
      b_.cast(slice, params_ + offset_[u], s.size);
      send = slice;
    }
    gather_req_[u] = sharded() ? b_.all_gather(send, gathered_[u], s.size, mesh_.comm(Axis::Shard), upload) : upload;
    ++gathers_in_flight_;
  }
  void prefetch(int u) {
    if (params_sharded() && !gathered_[u] && gathers_in_flight_ < kMaxAllGathersInFlight) issue_gather(u);
  }
  // Issue the all-gathers of a piece's units that nobody did, then the prefetch (so it
  // overlaps the piece's compute), then wait for them.
  void unshard(const std::vector<int>& units, int prefetch_unit) {
    if (!params_sharded()) return;
    for (int u : units)
      if (!gathered_[u]) issue_gather(u);
    if (prefetch_unit >= 0) prefetch(prefetch_unit);
    for (int u : units)
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
    b_.release(gathered_[u].ptr);
    gathered_[u] = Buf();
  }

  void before_forward(int pos) override {
    const bool ahead = cfg_.forward_prefetch && pos + 1 < forward_end();
    unshard(forward_units(pos), ahead ? forward_unit(pos + 1) : -1);
  }
  void after_forward(int pos) override {
    for (int u : forward_units(pos))
      if (params_sharded() && unit_pieces_[u].last_forward == pos && !keep_after_forward(u)) free_gathered(u);
  }

  // ---- gradients ----
  Buf grads_for(int u) override {
    if (zero1()) return whole_grads_ + whole_offset_[u];
    return separate_grad() ? full_grad_[u] : grads_ + offset_[u];
  }

  // Gradients accumulate over a step's micro-batches: the unsharded gradient is allocated and
  // zeroed before the first one's backward and reduced after the last one's (or, sharded,
  // before and after each one's).
  void before_backward(int pos) override {
    for (int u : backward_units(pos))
      if (unit_pieces_[u].first_backward == pos && (first_micro() || reduce_every_micro())) {
        if (previous_scatter_.first == u) complete_previous_scatter();  // FSDP2: its input is this buffer
        if (separate_grad() && !zero1())
          full_grad_[u] = b_.alloc_buf(shards_[u].padded, cfg_.param_dtype, MemCategory::CommBuffers);
        b_.fill(grads_for(u), 0.f, shards_[u].padded);
      }
    const bool pre = cfg_.prefetch == Prefetch::BackwardPre && pos + 1 < backward_end();
    unshard(backward_units(pos), pre ? backward_unit(pos + 1) : -1);
  }

  void after_backward(int pos) override {
    if (cfg_.prefetch == Prefetch::BackwardPost && pos + 1 < backward_end()) prefetch(backward_unit(pos + 1));
    for (int u : backward_units(pos))
      if (unit_pieces_[u].last_backward == pos) {
        if (!(u == 1 && injected_fault(Fault::StalePrefetch))) free_gathered(u);  // the fault: never re-gathered
        if (last_micro() || reduce_every_micro()) reduce_gradients(u);
      }
  }

  // Reduce-scatter inside the shard group, then (hybrid, none) all-reduce of the shard
  // across replicas, stream-ordered after the reduce-scatter. The unsharded gradient is
  // released stream-ordered after its reduce-scatter (FSDP1), or once compute has waited
  // for it before the next unit's reduce-scatter (FSDP2: at most two exist at once).
  void reduce_gradients(int u) {
    if (zero1()) return reduce_whole_gradient(u);
    if (cfg_.fsdp_version == 2) complete_previous_scatter();
    complete_partial();
    const ShardInfo& s = shards_[u];
    // The first micro-batch's reduction writes the shard; a later one's a partial shard that
    // complete_partial adds in.
    const bool into_shard = !reduce_every_micro() || first_micro();
    const Buf out = into_shard ? grads_ + offset_[u] : b_.alloc_buf(s.size, cfg_.reduce_dtype, MemCategory::CommBuffers);
    if (cfg_.param_dtype != cfg_.reduce_dtype && sharded()) {  // the reduce-scatter input in R
      const Buf reduced = b_.alloc_buf(s.padded, cfg_.reduce_dtype, MemCategory::CommBuffers);
      b_.cast(reduced, full_grad_[u], s.padded);
      b_.release(full_grad_[u].ptr);
      full_grad_[u] = reduced;
    }
    ScopedContext target(b_, b_.phase(), u);
    Request scatter = kNoRequest;
    if (sharded()) {
      scatter = b_.reduce_scatter(full_grad_[u], out, s.size, mesh_.comm(Axis::Shard));
      if (cfg_.fsdp_version == 2) {
        previous_scatter_ = {u, scatter};
      } else {
        reductions_.push_back(scatter);
        b_.release_after(full_grad_[u].ptr, scatter);
        full_grad_[u] = Buf();
      }
    } else if (separate_grad()) {  // unsharded, P → R
      b_.cast(out, full_grad_[u], s.size);
      b_.release(full_grad_[u].ptr);
      full_grad_[u] = Buf();
    }
    Request across = kNoRequest;
    if (mesh_.layout.replicate > 1) {
      across = b_.all_reduce_after(scatter, out, s.size, mesh_.comm(Axis::Replicate));
      reductions_.push_back(across);
    }
    if (!into_shard) partial_ = {u, out, across != kNoRequest ? across : scatter};
    if (early_download(u)) offload_->download_gradient(u, out, across != kNoRequest ? across : scatter);
  }
  // An offloaded unit's gradient shard is downloaded as soon as its reduction is done, unless
  // something still changes it afterwards: then in the optimizer step.
  bool early_download(int u) const { return offload_ && !reduce_every_micro() && !summed_across_stages(u); }
  // ZeRO-1: the whole gradient (kept: it is the next step's accumulator) reduce-scattered
  // into the gradient shard, through a reduce-dtype copy when the types differ (released
  // stream-ordered after the reduce-scatter); across replicas as hybrid's.
  void reduce_whole_gradient(int u) {
    const ShardInfo& s = shards_[u];
    const Buf out = grads_ + offset_[u];
    Buf in = whole_grads_ + whole_offset_[u];
    Buf cast;
    if (cfg_.param_dtype != cfg_.reduce_dtype) {
      cast = b_.alloc_buf(s.padded, cfg_.reduce_dtype, MemCategory::CommBuffers);
      b_.cast(cast, in, s.padded);
      in = cast;
    }
    ScopedContext target(b_, b_.phase(), u);
    Request scatter = kNoRequest;
    if (sharded()) {
      scatter = b_.reduce_scatter(in, out, s.size, mesh_.comm(Axis::Shard));
      reductions_.push_back(scatter);
    } else {
      b_.copy(out, in, s.size);
    }
    if (cast) scatter != kNoRequest ? b_.release_after(cast.ptr, scatter) : b_.release(cast.ptr);
    Request done = scatter;
    if (mesh_.layout.replicate > 1) {
      done = b_.all_reduce_after(scatter, out, s.size, mesh_.comm(Axis::Replicate));
      reductions_.push_back(done);
    }
    if (early_download(u)) offload_->download_gradient(u, out, done);
  }
  // ZeRO-1: every rank's master shard in its slice of the whole parameters (`cast`: rounded
  // into it here; after an update the optimizer wrote it), all-gathered in place; the
  // all-gathers overlap each other, and the step ends with them.
  void gather_whole_params(bool cast, const std::vector<Request>& uploads = {}) {
    std::vector<Request> gathers;
    for (size_t u = 0; u < units_.size(); ++u) {
      const ShardInfo& s = shards_[u];
      if (s.padded == 0) continue;
      const Buf whole = whole_params_ + whole_offset_[u];
      if (low_precision() && cast) b_.cast(whole + s.offset, master(int(u)), s.size);
      ScopedContext target(b_, b_.phase(), int(u));
      const Request upload = uploads.empty() ? kNoRequest : uploads[u];  // offload: the slice's upload
      if (sharded() && !(injected_fault(Fault::Zero1SkipParamGather) && step_ > 0))
        gathers.push_back(b_.all_gather(whole + s.offset, whole, s.size, mesh_.comm(Axis::Shard), upload));
      else if (upload != kNoRequest)
        gathers.push_back(upload);
    }
    for (Request r : gathers) b_.wait(r);
  }

  // Sharded accumulation: once its reduction is done, add the partial shard into the shard.
  // Each request is waited on once: the plan's schedule lists every wait it issues.
  void complete_partial() {
    if (partial_.unit < 0) return;
    const auto [u, buf, r] = partial_;
    if (r != kNoRequest) {
      b_.wait(r);
      reductions_.erase(std::remove(reductions_.begin(), reductions_.end(), r), reductions_.end());
    }
    b_.add(grads_ + offset_[u], buf, shards_[u].size);
    b_.release(buf.ptr);
    partial_ = Partial{};
  }
  // FSDP2: compute waits for the previous reduce-scatter, then frees its input.
  void complete_previous_scatter() {
    const auto [u, r] = previous_scatter_;
    if (u < 0) return;
    b_.wait(r);
    if (partial_.done == r) partial_.done = kNoRequest;  // its partial shard is ready too
    b_.release(full_grad_[u].ptr);
    full_grad_[u] = Buf();
    previous_scatter_ = {-1, kNoRequest};
  }
  void finish_gradients() override {
    complete_previous_scatter();
    complete_partial();
    for (Request r : reductions_) b_.wait(r);
    reductions_.clear();
  }

  CBuf reduced_gradients(int64_t& n) const override {
    n = total_;
    return grads_;
  }
  Buf reduced_gradient(int u, int64_t& n) override {
    n = shards_[u].size;
    return grads_ + offset_[u];
  }

  // Offload: where an update's rounding goes on the device (none under params: the next
  // all-gathers upload it), and what follows the uploads.
  Buf upload_destination(int u) const {
    if (zero1()) return whole_params_ + whole_offset_[u] + shards_[u].offset;
    if (offload_optimizer()) return device_shard_ + offset_[u];
    return Buf();
  }
  void finish_uploads(const std::vector<Request>& uploads) {
    if (zero1()) return gather_whole_params(false, uploads);
    for (Request r : uploads)
      if (r != kNoRequest) b_.wait(r);
  }

  void optimizer_step(int step) override {
    if (offload_) {  // the gradients still on the device down, then the CPU update, unit by unit
      for (size_t u = 0; u < units_.size(); ++u)
        if (shards_[u].size > 0 && !early_download(int(u))) offload_->download_gradient(int(u), grads_ + offset_[u], kNoRequest);
      step_ = step;
      finish_uploads(offload_->update(cfg_.optimizer, step, [this](int u) { return upload_destination(u); }));
      return;
    }
    if (zero1()) {  // each unit's shard, its rounding written into the whole parameters, then gathered
      for (size_t u = 0; u < units_.size(); ++u)
        if (shards_[u].size > 0)
          b_.optimizer_update(cfg_.optimizer, step, master(int(u)), grads_ + offset_[u], unit_state(int(u)), shards_[u].size,
                              low_precision() ? whole_params_ + whole_offset_[u] + shards_[u].offset : Buf());
      step_ = step;
      gather_whole_params(false);
      return;
    }
    for (size_t r = 0; r < regions_.first.size(); ++r) {  // refreshes the compute copy too
      const int64_t i = regions_.first[r];
      b_.optimizer_update(cfg_.optimizer, step, params_ + i, grads_ + i,
                          state_ ? state_ + regions_.state.offset[r] : nullptr, regions_.length[r],
                          compute_ ? compute_ + i : Buf());
    }
  }

  std::vector<ShardInfo> shards_;
  std::vector<int64_t> offset_;  // of each unit's shard in the flat shard buffers
  int64_t total_ = 0;
  float* params_ = nullptr;  // fp32 shards
  char* state_ = nullptr;    // optimizer state of regions_
  OptimizerRegions regions_;
  Buf grads_;    // gradient shards, reduce dtype
  Buf compute_;  // unsharded, low precision: the parameters in param dtype
  std::unique_ptr<HostOffload> offload_;  // --cpu-offload: the host's buffers and update
  Buf device_shard_;  // --cpu-offload optimizer (not ZeRO-1): the param-dtype shards the all-gathers start from
  // ZeRO-1: the whole parameters and gradients (param dtype), unit u's padded to the shard
  // group at whole_offset_[u].
  Buf whole_params_, whole_grads_;
  std::vector<int64_t> whole_offset_;
  int64_t whole_total_ = 0;
  int step_ = 0;  // the last optimizer step (0: the initial parameters' gather)
  std::vector<Buf> gathered_;
  std::vector<Request> gather_req_;
  std::vector<Buf> full_grad_;
  int gathers_in_flight_ = 0;
  std::pair<int, Request> previous_scatter_{-1, kNoRequest};  // FSDP2: unit, request
  std::vector<Request> reductions_;  // outstanding reduce-scatters and all-reduces
  struct Partial {
    int unit = -1;
    Buf buf;                   // a later micro-batch's reduced shard, reduce dtype
    Request done = kNoRequest;  // its last reduction
  } partial_;
};

}  // namespace

std::unique_ptr<Strategy> make_fsdp(const Setup& setup, Backend& b, Mesh& mesh) {
  return std::make_unique<FSDP>(setup, b, mesh);
}

}  // namespace sb
