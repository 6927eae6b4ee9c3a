// Where FSDP's parameters live, chosen once: Residence::make picks a kind in FSDP's
// constructor from the configuration, and the kind answers every "where" question after that.
//   gathered            sharded parameters (full, grad-op, hybrid): fp32 master shards on the
//                       device, each unit all-gathered (in param dtype) before its use
//   whole               no sharding (none, or a shard group of one): the fp32 parameters on
//                       the device, plus a param-dtype copy refreshed by each update
//   sharded-optimizer   ZeRO-1: whole parameters and gradients on every rank, the fp32 master
//                       shards and optimizer state sharded; the update is all-gathered after
//   offloaded-params    --cpu-offload params: master shards and state on the host; each
//                       gather starts from the shard's upload into this rank's slice
//   offloaded-optimizer --cpu-offload optimizer: master shards and state on the host; the
//                       device keeps the param-dtype shards (or ZeRO-1's whole parameters),
//                       and each update's rounding is uploaded into them
// A kind owns the master, state and gradient shards, the buffer serving a unit, what starts a
// gather, where the reduced gradient goes, the update and what follows it (upload, gather of
// the whole parameters, the low-precision copy). FSDP keeps the schedule: when units are
// gathered and freed, and the gradients' reductions and accumulation.
#pragma once
#include <memory>
#include <vector>

#include "shardbench/backend/backend.h"
#include "shardbench/backend/layout.h"
#include "shardbench/model/model.h"
#include "shardbench/strategy/config.h"

namespace sb {

class Residence {
 public:
  // `cfg` is read live (the schedule sets the loss scale's unscale before each update);
  // `summed_across_stages[u]`: unit u's reduced gradient is still summed over pipeline stages
  // after FSDP's reductions (so not final once they are done).
  static std::unique_ptr<Residence> make(const StrategyConfig& cfg, Backend& b, const Mesh& mesh,
                                         const std::vector<UnitSpec>& units,
                                         const std::vector<bool>& summed_across_stages);
  virtual ~Residence();
  Residence(const Residence&) = delete;
  Residence& operator=(const Residence&) = delete;

  // Unit u's padded flat parameter and this rank's shard of it.
  const ShardInfo& shard(int u) const { return shards_[size_t(u)]; }

  // ---- parameters ----
  // Whether a unit is all-gathered (into a buffer FSDP holds) before each use; else params().
  virtual bool gathers() const { return false; }
  virtual CBuf params(int u) const { return CBuf(); }
  // Starts unit u's gather into `full` (padded, param dtype; this rank's slice is written
  // first where the gather is in place). Returns the request after which `full` holds it.
  virtual Request start_gather(int u, Buf full) { return kNoRequest; }

  // ---- gradients ----
  // Where backward accumulates unit u's gradient over the micro-batches when no separate
  // unsharded buffer of FSDP's is needed: ZeRO-1's whole gradient (kept over steps), or the
  // shard itself (unsharded, one reduction a step, no cast); else Buf().
  virtual Buf accumulator(int u) const;
  // ZeRO-1: the accumulator is the whole gradient, reduce-scattered and kept.
  virtual bool keeps_whole_gradient() const { return false; }
  Buf gradient_shard(int u) const { return grads_ + offset_[size_t(u)]; }  // reduce dtype
  CBuf gradient_shards(int64_t& n) const {
    n = total_;
    return grads_;
  }
  // A reduction into unit u's gradient shard was issued, `done` its last request.
  virtual void reduced(int u, Request done) {}

  // ---- the update ----
  // The optimizer step (counting from 1) on the master shards, and what follows it before the
  // next forward: the upload, the gather of the whole parameters, the low-precision copy.
  virtual void update(int step) = 0;

  // Unit u's master parameters / reduced gradient as fp32, gathered over the shard group on
  // the host (for --check: no backend memory, so the run's peaks stay as they were).
  std::vector<float> gather_master(int u) const { return gather_on_host(master(u), u, master_on_host()); }
  std::vector<float> gather_gradient(int u) const { return gather_on_host(gradient_shard(u), u); }

 protected:
  Residence(const StrategyConfig& cfg, Backend& b, const Mesh& mesh, const std::vector<UnitSpec>& units);
  virtual const float* master(int u) const = 0;  // unit u's fp32 master shard
  virtual bool master_on_host() const { return false; }
  bool sharded() const { return mesh_.layout.shard > 1; }
  bool low_precision() const { return cfg_.param_dtype != DType::F32; }
  std::vector<int64_t> lengths() const;  // each unit's shard
  // After the kind's own buffers (the ledger's peak depends on the order): the gradient shards.
  void allocate_gradient_shards();
  void init_master(int u, float* dst);  // the seeded initialisation of unit u's shard
  std::vector<float> gather_on_host(CBuf shard, int u, bool in_host_memory = false) const;

  const StrategyConfig& cfg_;
  Backend& b_;
  const Mesh& mesh_;
  const std::vector<UnitSpec>& units_;
  std::vector<ShardInfo> shards_;
  std::vector<int64_t> offset_;  // of each unit's shard in the flat shard buffers
  int64_t total_ = 0;
  Buf grads_;  // gradient shards, reduce dtype
};

}  // namespace sb
