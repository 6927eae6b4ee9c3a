// The configuration of a strategy, in one place: the names of its choices and their
// parsers, StrategyConfig and its label. Every program reads its flags into a
// StrategyConfig; the layout and the pipeline's split are derived from it once, with the
// model and the step's shape, by Setup::make (strategy/setup.h).
#pragma once
#include <string>

#include "shardbench/backend/backend.h"
#include "shardbench/backend/layout.h"
#include "shardbench/core/nodes.h"
#include "shardbench/model/model.h"
#include "shardbench/model/t5.h"
#include "shardbench/strategy/pipeline.h"

namespace sb {

enum class StrategyKind { DDP, FSDP };
// ZeRO levels (DeepSpeed calls them stages, its flag --zero-stage): None 0, OptimizerState 1, GradOp 2, Full 3;
// Hybrid is Full inside groups of --shard-size (docs/usage.md, "Strategies", maps every name).
enum class Sharding { Full, Hybrid, None, GradOp, OptimizerState };
enum class Prefetch { None, BackwardPre, BackwardPost };
// How FSDP accumulates a unit's gradient over a step's micro-batches (--grad-accumulation):
// unsharded (PyTorch's no_sync()): the unsharded gradient is held over every micro-batch and
// reduced once, after the last; sharded: reduced after every micro-batch and added into the
// gradient shard (M times the reduce traffic, one unit's unsharded gradient at a time).
enum class GradAccumulation { Unsharded, Sharded };
// CPU offload (--cpu-offload): state kept in host memory and updated there by the CPU.
//   params     the fp32 parameter shards (and their param-dtype rounding), the gradient
//              shards and the optimizer state on the host, as PyTorch FSDP's
//              CPUOffload(offload_params=True): each all-gather starts from a host-to-device
//              copy of the shard, each reduced gradient shard is copied to the host, the
//              update runs on the CPU (full, hybrid, grad-op)
//   optimizer  the fp32 master parameters and the optimizer state on the host, as DeepSpeed's
//              ZeRO-Offload (offload_optimizer): the reduced gradient shards copied to the
//              host, the CPU update, the updated parameters (param dtype) copied back
//              (optimizer-state, grad-op, full, hybrid)
enum class CpuOffload { None, Params, Optimizer };

const char* sharding_name(Sharding s);
const char* prefetch_name(Prefetch p);
Sharding parse_sharding(const std::string& s);  // throws UsageError
Sharding sharding_of_zero_level(int level);     // 0-3 (the flag --zero-stage, DeepSpeed's name)
int zero_level(Sharding s);                      // DeepSpeed's ZeRO stage number; hybrid: 3
Prefetch parse_prefetch(const std::string& s);  // throws UsageError
const char* grad_accumulation_name(GradAccumulation g);
GradAccumulation parse_grad_accumulation(const std::string& s);  // throws UsageError
const char* cpu_offload_name(CpuOffload o);  // none, params, optimizer
CpuOffload parse_cpu_offload(const std::string& s);  // throws UsageError
// The one home of which shardings each --cpu-offload value serves (the options refuse the
// others; --describe prints the table for the analysis tools): params needs sharded
// parameters (full, hybrid, grad-op), optimizer a sharded optimizer state (any but none).
bool cpu_offload_allows(CpuOffload o, Sharding s);

struct StrategyConfig {
  StrategyKind kind = StrategyKind::FSDP;
  Sharding sharding = Sharding::Full;
  int shard_size = 0;          // hybrid (0: one node's, resolved by Setup::make), optimizer-state (0: the data-parallel ranks)
  int tp = 1;                  // tensor-parallel group size (--tp): Megatron-LM inside each layer
  int pp = 1;                  // pipeline stages (--pp)
  int micro_batches = 1;       // per step of a data-parallel rank (--micro-batches; 0: the default, Setup::make's)
  PipeSchedule pp_schedule = PipeSchedule::OneFOneB;  // --pp-schedule
  int first_decoder_stage = -1;  // --pp-split: where the decoder starts, -1 balanced by FLOPs
  double bucket_mb = 25.0;     // DDP bucket cap (the first bucket is 1 MiB, as PyTorch's)
  Prefetch prefetch = Prefetch::BackwardPre;
  bool forward_prefetch = false;
  // FSDP's gradient reduction schedule. 1 (FullyShardedDataParallel, as the FSDP paper ran
  // it): reduce-scatters run on their own stream and compute waits for them only at the end
  // of backward. 2 (fully_shard): before issuing a unit's reduce-scatter, compute waits for
  // the previous one (post_backward), which bounds the unsharded gradients alive to two.
  int fsdp_version = 1;
  GradAccumulation grad_accumulation = GradAccumulation::Unsharded;  // FSDP, with micro-batches
  CpuOffload cpu_offload = CpuOffload::None;  // FSDP (--cpu-offload)
  int host_threads = 1;  // threads of the CPU update under offload (the node's cores / its ranks)
  bool checkpointing = false;
  AttentionImpl attention = AttentionImpl::Unfused;  // --attention (default per backend)
  // Mixed precision as FSDP's MixedPrecision(param_dtype, reduce_dtype): fp32 master
  // parameters and optimizer state (adamw-8bit: its 8-bit codes); parameters gathered and computed in param_dtype (so are
  // activations and gradients); gradients reduced in reduce_dtype.
  DType param_dtype = DType::F32;
  DType reduce_dtype = DType::F32;
  // Loss scaling (fp16 gradients underflow without it): the loss gradient is multiplied by
  // the scale and the optimizer divides it out. Dynamic, as PyTorch's (Sharded)GradScaler: a step
  // whose reduced gradients hold an inf or NaN on any rank is skipped and the scale halved;
  // after `loss_scale_growth_interval` good steps in a row it doubles.
  float loss_scale = 1.f;  // static scale, or the initial one when dynamic
  bool dynamic_loss_scale = false;
  int loss_scale_growth_interval = 2000;
  uint64_t seed = 0;
  OptimizerConfig optimizer;  // --optimizer, --lr, --weight-decay, --momentum
  UnitCache* unit_cache = nullptr;  // the models' units, where a planner keeps them (T5StepConfig::units)

  std::string label() const;
  // FSDP with --grad-accumulation sharded over several micro-batches: each micro-batch's
  // gradient is reduced on its own (what the strategy does and --check bounds).
  bool reduces_every_micro_batch() const {
    return kind == StrategyKind::FSDP && sharding != Sharding::OptimizerState &&
           grad_accumulation == GradAccumulation::Sharded && micro_batches > 1;
  }  // "ddp", "fsdp-full", "fsdp-hybrid2", ...
};

// Hybrid's shard group without --shard-size: the data-parallel ranks of one node, so the
// parameter all-gathers and gradient reduce-scatters stay on a node's own links and only the
// replicas' all-reduce crosses nodes (PyTorch's HYBRID_SHARD; the FSDP paper's hybrid). A
// node holding several pipeline stages shards over one stage's data-parallel ranks. Throws
// UsageError (telling to give --shard-size) where nodes cannot hold whole groups: ranks not
// placed node by node, nodes of different rank counts, a node's ranks not whole --tp groups
// or not a whole number of pipeline stages or a divisor of one.
int node_shard_size(const StrategyConfig& c, const NodeMap& nodes);
// What of the layout crosses nodes that should not: a tensor-parallel group, or a hybrid
// shard group no larger than a node's data-parallel ranks, on ranks of several nodes. ""
// when nothing does; else one line naming the first such group (the run says it and keeps it
// with the result).
std::string placement_warning(const ParallelLayout& layout, const NodeMap& nodes, const StrategyConfig& c);

}  // namespace sb
