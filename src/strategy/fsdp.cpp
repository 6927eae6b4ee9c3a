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
// Where the parameters live (gathered, whole, ZeRO-1's, offloaded: strategy/residence.h)
// is chosen once, in the constructor; the schedule below is the same for every kind.
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
// refreshed after each optimizer step (the residence's).
#include <algorithm>
#include <memory>
#include <utility>

#include "shardbench/core/fault.h"
#include "shardbench/strategy/residence.h"
#include "shardbench/strategy/training_schedule.h"

namespace sb {
namespace {

constexpr int kMaxAllGathersInFlight = 2;  // PyTorch limit_all_gathers

class FSDP final : public TrainingSchedule {
 public:
  FSDP(const Setup& setup, Backend& b, Mesh& mesh)
      : TrainingSchedule(setup, b, mesh),
        residence_(Residence::make(cfg_, b_, mesh_, units_, stage_sums())),
        gathered_(units_.size()),
        gather_req_(units_.size(), kNoRequest),
        full_grad_(units_.size()) {}
  ~FSDP() override {
    finish_gradients();  // no reduction may still write into buffers freed below
    for (size_t u = 0; u < units_.size(); ++u) {
      free_gathered(int(u));
      b_.release(full_grad_[u].ptr);
    }
  }

  std::vector<float> gather_unit(int u) override { return residence_->gather_master(u); }
  std::vector<float> gather_unit_grad(int u) override { return residence_->gather_gradient(u); }

 private:
  // The gradients are reduce-scattered inside a shard group (every mode but none, or a
  // shard group of one).
  bool sharded() const { return mesh_.layout.shard > 1; }
  bool reduce_every_micro() const { return cfg_.reduces_every_micro_batch(); }
  bool keep_after_forward(int u) const { return !is_block(units_[u].kind) || cfg_.sharding == Sharding::GradOp; }
  const ShardInfo& shard(int u) const { return residence_->shard(u); }
  // Per unit: its reduced gradient is summed over pipeline stages afterwards (not final yet).
  std::vector<bool> stage_sums() const {
    std::vector<bool> summed(units_.size());
    for (size_t u = 0; u < units_.size(); ++u) summed[u] = summed_across_stages(int(u));
    return summed;
  }

  // ---- parameters ----
  CBuf params_for(int u) override { return residence_->gathers() ? CBuf(gathered_[u]) : residence_->params(u); }

  void issue_gather(int u) {
    gathered_[u] = b_.alloc_buf(shard(u).padded, cfg_.param_dtype, MemCategory::CommBuffers);
    ScopedContext target(b_, b_.phase(), u);
    gather_req_[u] = residence_->start_gather(u, gathered_[u]);
    ++gathers_in_flight_;
  }
  void prefetch(int u) {
    if (residence_->gathers() && !gathered_[u] && gathers_in_flight_ < kMaxAllGathersInFlight) issue_gather(u);
  }
  // Issue the all-gathers of a piece's units that nobody did, then the prefetch (so it
  // overlaps the piece's compute), then wait for them.
  void unshard(const std::vector<int>& units, int prefetch_unit) {
    if (!residence_->gathers()) return;
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
  void after_forward(int pos) override {  // nothing gathered: nothing freed
    for (int u : forward_units(pos))
      if (unit_pieces_[u].last_forward == pos && !keep_after_forward(u)) free_gathered(u);
  }

  // ---- gradients ----
  // Backward writes into the residence's accumulator where it has one, else into a separate
  // unsharded gradient (allocated per reduction, freed after it).
  Buf grads_for(int u) override {
    const Buf kept = residence_->accumulator(u);
    return kept ? kept : full_grad_[u];
  }

  // Gradients accumulate over a step's micro-batches: the unsharded gradient is allocated and
  // zeroed before the first one's backward and reduced after the last one's (or, sharded,
  // before and after each one's).
  void before_backward(int pos) override {
    for (int u : backward_units(pos))
      if (unit_pieces_[u].first_backward == pos && (first_micro() || reduce_every_micro())) {
        if (previous_scatter_.first == u) complete_previous_scatter();  // FSDP2: its input is this buffer
        if (!residence_->accumulator(u))
          full_grad_[u] = b_.alloc_buf(shard(u).padded, cfg_.param_dtype, MemCategory::CommBuffers);
        b_.fill(grads_for(u), 0.f, shard(u).padded);
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
    if (residence_->keeps_whole_gradient()) return reduce_whole_gradient(u);
    if (cfg_.fsdp_version == 2) complete_previous_scatter();
    complete_partial();
    const ShardInfo& s = shard(u);
    // The first micro-batch's reduction writes the shard; a later one's a partial shard that
    // complete_partial adds in.
    const bool into_shard = !reduce_every_micro() || first_micro();
    const Buf out = into_shard ? residence_->gradient_shard(u) : b_.alloc_buf(s.size, cfg_.reduce_dtype, MemCategory::CommBuffers);
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
    } else if (full_grad_[u]) {  // unsharded, P → R
      b_.cast(out, full_grad_[u], s.size);
      b_.release(full_grad_[u].ptr);
      full_grad_[u] = Buf();
    }
    const Request done = reduce_across_replicas(out, s.size, scatter);
    if (!into_shard) partial_ = {u, out, done};
    residence_->reduced(u, done);
  }
  // ZeRO-1: the whole gradient (kept: it is the next step's accumulator) reduce-scattered
  // into the gradient shard, through a reduce-dtype copy when the types differ (released
  // stream-ordered after the reduce-scatter); across replicas as hybrid's.
  void reduce_whole_gradient(int u) {
    const ShardInfo& s = shard(u);
    const Buf out = residence_->gradient_shard(u);
    Buf in = residence_->accumulator(u);
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
    residence_->reduced(u, reduce_across_replicas(out, s.size, scatter));
  }
  // Hybrid groups: the shard all-reduced across replicas, stream-ordered after `scatter`.
  // Returns the shard's last reduction.
  Request reduce_across_replicas(Buf shard, int64_t n, Request scatter) {
    if (mesh_.layout.replicate == 1) return scatter;
    const Request across = b_.all_reduce_after(scatter, shard, n, mesh_.comm(Axis::Replicate));
    reductions_.push_back(across);
    return across;
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
    b_.add(residence_->gradient_shard(u), buf, shard(u).size);
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

  CBuf reduced_gradients(int64_t& n) const override { return residence_->gradient_shards(n); }
  Buf reduced_gradient(int u, int64_t& n) override {
    n = shard(u).size;
    return residence_->gradient_shard(u);
  }

  void optimizer_step(int step) override { residence_->update(step); }

  std::unique_ptr<Residence> residence_;  // first: the buffers below go before it does
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
