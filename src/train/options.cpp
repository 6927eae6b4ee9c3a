// Command-line options of ddp_perf and fsdp_perf (CLI11). Every bad value becomes one
// UsageError line naming the value and what is allowed.
#include <CLI/CLI.hpp>

#include <algorithm>
#include <cmath>
#include <cstdio>
#include <cstdlib>
#include <tuple>

#include "shardbench/core/check.h"
#include "shardbench/core/cli.h"
#include "shardbench/train/options.h"

namespace sb {

bool parse_options(int argc, char** argv, StrategyKind kind, RunConfig& cfg) {
  const bool ddp = kind == StrategyKind::DDP;
  cfg.program = ddp ? "ddp_perf" : "fsdp_perf";
  cfg.argv.assign(argv, argv + argc);
  CLI::App app{ddp ? "ddp_perf: DDP training steps of a synthetic T5 (bucketed all-reduce "
                     "overlapped with backward)"
                   : "fsdp_perf: FSDP training steps of a synthetic T5 (full, hybrid, "
                     "grad-op, optimizer-state or no sharding: ZeRO stages 3, 2, 1, 0)",
               cfg.program};
  // A flag given twice takes its last value, so scripts can append overrides.
  app.option_defaults()->multi_option_policy(CLI::MultiOptionPolicy::TakeLast);
  std::string model = "t5-small", sharding = "full", prefetch = "backward-pre", dtype = "fp32", reduce_dtype;
  std::string grad_accumulation = "unsharded", cpu_offload = "none";
  int64_t d_model = 0, d_ff = 0, layers = 0, heads = 0, d_kv = 0, vocab = 0;
  int64_t batch = 2, seq_len = 64, dec_len = 0, steps = 5, warmup = 1, world = 0, shard = 0, tp = 1, pp = 1;
  int64_t micro_batches = 0, pp_split = 0, zero = 0;
  CLI::Option *o_sharding = nullptr, *o_zero = nullptr;
  std::string pp_schedule = "1f1b";
  int64_t fsdp_version = cfg.strategy.fsdp_version;
  double lr = cfg.strategy.optimizer.lr, weight_decay = cfg.strategy.optimizer.weight_decay,
         momentum = cfg.strategy.optimizer.momentum;
  std::string optimizer = optimizer_name(cfg.strategy.optimizer.kind);
  uint64_t seed = 1234;

  std::string names;
  for (const auto& n : model_preset_names()) names += (names.empty() ? "" : ", ") + n;
  app.add_option("--model", model, "model preset: " + names)->capture_default_str();
  bool list_models = false;
  app.add_flag("--list-models", list_models, "print the model presets, one per line, and exit");
  bool describe = false;  // answered before MPI starts (src/programs/describe.h); here for --help
  app.add_flag("--describe", describe, "alone: print one JSON line of what the program offers the analysis tools "
               "(analysis/runner.py: plan batch, shardings, CPU offload and its rule, optimizers) and exit");
  NumericFlags num(app);
  auto* o_dm = num.integer("--d-model", d_model, 1, kIntMax, "override d_model");
  auto* o_ff = num.integer("--d-ff", d_ff, 1, kIntMax, "override d_ff");
  auto* o_l = num.integer("--layers", layers, 1, kMaxLayers, "override layers per stack");
  auto* o_h = num.integer("--heads", heads, 1, kIntMax, "override attention heads");
  auto* o_kv = num.integer("--d-kv", d_kv, 1, kIntMax, "override d_kv (head width)");
  auto* o_v = num.integer("--vocab", vocab, 1, kIntMax, "override vocabulary size");
  num.integer("--pp", pp, 1, kIntMax,
              "pipeline stages: the model's blocks split over this many consecutive groups of ranks "
              "(pp x dp x tp = world; at most one stage per block)");
  num.integer("--micro-batches", micro_batches, 1, kMaxMicroBatches,
              "micro-batches per step of a data-parallel rank; must divide --batch (default: --pp, or the largest count below it that divides --batch)");
  auto* o_pp_schedule = app.add_option("--pp-schedule", pp_schedule, "pipeline schedule: gpipe | 1f1b")->capture_default_str();
  num.integer("--pp-split", pp_split, 1, kIntMax,
              "the pipeline stage where the decoder starts (default: stages balanced by FLOPs)");
  num.integer("--tp", tp, 1, kIntMax,
              "tensor-parallel group size: Megatron-LM splits of every layer over groups of this many "
              "consecutive ranks; the strategy's data parallelism runs over world / tp ranks (heads, d_ff "
              "and vocab must divide by it)");
  std::string ffn, tie;
  app.add_option("--ffn", ffn,
                 "feed-forward block: relu (T5: wo(relu(wi x))) | gated-gelu (T5 v1.1, Flan-T5: "
                 "wo(gelu_tanh(wi_0 x) * wi_1 x)) (default: the preset's)");
  app.add_option("--tie-embeddings", tie,
                 "yes (the LM head is the shared embedding, output scaled by d_model^-0.5) | no (an lm_head of "
                 "its own, no rescale) (default: the preset's)");
  num.integer("--batch", batch, 1, kIntMax, "sequences per data-parallel rank (a tensor-parallel group shares them)");
  num.integer("--seq-len", seq_len, 1, kIntMax, "encoder tokens per sequence");
  num.integer("--dec-seq-len", dec_len, 1, kIntMax, "decoder tokens per sequence (default: --seq-len)");
  num.integer("--steps", steps, 1, kIntMax, "timed steps");
  num.integer("--warmup", warmup, 0, kIntMax, "untimed steps first (they train too)");
  num.integer("--seed", seed, 0, std::numeric_limits<int64_t>::max(), "seed of data and initial weights");
  app.add_option("--optimizer", optimizer,
                 "adamw (torch.optim.AdamW) | adamw-8bit (bitsandbytes' blockwise 8-bit AdamW) | sgd "
                 "(torch.optim.SGD with momentum)")
      ->capture_default_str();
  num.real("--lr", lr, 0, 1e6, true, "learning rate");
  num.real("--weight-decay", weight_decay, 0, 1e6, false,
                        "weight decay: decoupled for adamw and adamw-8bit (as AdamW), L2 for sgd");
  auto* o_mom = num.real("--momentum", momentum, 0, 1, false, "with --optimizer sgd: momentum (0: none)");
  app.add_option("--backend", cfg.backend, "cpu, or cuda where built (one rank per GPU)")->capture_default_str();
  std::string comm = "nccl";
  auto* o_comm = app.add_option("--comm", comm,
                                "collectives of --backend cuda: nccl (one rank per GPU) | mpi (device pointers where "
                                "the MPI library is CUDA-aware, else staged through pinned host memory; ranks may "
                                "share a GPU) | mpi-staged | mpi-direct (force one way)")
                     ->capture_default_str();
  num.real("--mem-limit-gib", cfg.mem_limit_gib, 0, 1 << 20, true,
           "memory per rank in GiB (default: the GPU's free memory; CPU: host memory / ranks on the node)");
  auto* o_host = num.real("--host-mem-limit-gib", cfg.host_mem_limit_gib, 0, 1 << 20, true,
           "host memory per rank in GiB for what CPU offload keeps on the host (default: the node's memory / "
           "ranks on the node)");
  app.add_flag("--plan", cfg.plan_only, "print the memory and FLOP plan and exit, allocating nothing");
  app.add_option("--schedule-json", cfg.schedule_json,
                 "with --plan: write the plan and one step's schedule as JSON (for analysis/project.py)");
  auto* o_batch = app.add_option("--plan-batch", cfg.plan_batch,
                                 "FILE (- for stdin): one configuration per line (this program's flags, with "
                                 "--world-size; --plan implied; no --out or --schedule-json), one JSON line per "
                                 "configuration on stdout: {\"line\", \"exit\", \"schedule\"} or {\"line\", \"exit\": 2, "
                                 "\"error\"}; no other flags beside it");
  std::string batch_ops = "all";
  auto* o_batch_ops = app.add_option("--plan-batch-ops", batch_ops,
                                     "with --plan-batch: all | none (the schedules without their per-operation rows)")
                          ->capture_default_str();
  num.integer("--world-size", world, 1, 1 << 24, "world size to plan for with --plan (default: the MPI world)");
  num.real("--timeout-s", cfg.timeout_s, 0, 1e9, false,
           "watchdog: end the job when a rank makes no progress for this long (0: off)");
  app.add_flag("--check", cfg.check, "compare final weights with a single-rank reference computed in the run");
  auto* o_tolerance = num.real("--check-tolerance", cfg.check_tolerance, 0, 1e30, true,
           "--check: allowed error of each reduced gradient as a multiple of its rounding bound "
           "(docs/reliability.md)");
  app.add_option("--out", cfg.out_path,
                 "HDF5 result file (default: results/<program>-<strategy>-<model>-w<ranks>-<time>.h5); a symbolic "
                 "link, even a dangling one, is written through to its target, as cp does");
  app.add_flag("--overwrite", cfg.overwrite, "replace an existing --out file");
  app.add_option("--dtype", dtype,
                 "fp32 | bf16 | fp16: parameters as computed (gathered), activations, gradients; "
                 "master weights and optimizer state stay fp32")
      ->capture_default_str();
  app.add_option("--reduce-dtype", reduce_dtype, "fp32 | bf16 | fp16: gradient reduction (default: --dtype)");
  std::string loss_scale = "1";
  auto* o_ls = app.add_option("--loss-scale", loss_scale,
                              "X (static) or 'dynamic' (start at 65536, halve and skip the step on inf/NaN "
                              "gradients, double after --loss-scale-growth-interval good steps), divided out "
                              "before the optimizer; default: dynamic when --dtype or --reduce-dtype is fp16, else 1");
  double init_scale = 65536;  // torch.amp.GradScaler's init_scale
  auto* o_init = num.real("--loss-scale-init", init_scale, 0, 3.4e38, true, "dynamic loss scale: the first scale");
  auto* o_growth = num.integer("--loss-scale-growth-interval", cfg.strategy.loss_scale_growth_interval, 1, kIntMax,
              "dynamic loss scale: good steps before it doubles");
  std::string attention;
  app.add_option("--attention", attention,
                 "fused | unfused: flash-attention style fused op, or GEMMs around a held softmax "
                 "(default: unfused; fused is opt-in, docs/gpu.md)");
  std::string attention_kernel = attention_kernel_name(cfg.compute.attention_kernel);
  auto* o_ak = app.add_option("--attention-kernel", attention_kernel,
                              "with --attention fused on cuda: auto (tensor cores for bf16/fp16, FMA for fp32) | "
                              "fma | mma")
                   ->capture_default_str();
  app.add_flag("--fused-epilogues", cfg.compute.fused_epilogues,
               "GEMM and ReLU in one call, RMSNorm writing the residual copy in its pass (opt-in, docs/gpu.md)");
  app.add_flag("--cuda-graphs", cfg.compute.graphs,
               "with --backend cuda: the compute between collectives as CUDA Graphs (opt-in, docs/gpu.md)");
  app.add_flag("--activation-checkpointing", cfg.strategy.checkpointing,
               "recompute each block's forward in backward");
  if (ddp) {
    num.real("--bucket-mb", cfg.strategy.bucket_mb, 0, 1 << 20, true, "gradient bucket cap in MiB (first bucket: 1 MiB)");
  } else {
    o_sharding = app.add_option("--sharding", sharding,
                                "full (ZeRO-3) | hybrid (full inside each node, or --shard-size groups) | none (ZeRO-0) | grad-op "
                                "(ZeRO-2) | optimizer-state (ZeRO-1: master weights and optimizer state sharded)")
                     ->capture_default_str();
    o_zero = num.integer("--zero-stage", zero, 0, 3,
                         "DeepSpeed's name for --sharding: 0 none, 1 optimizer-state, 2 grad-op, 3 full");
    num.integer("--shard-size", shard, 1, kIntMax,
                "shard group size for --sharding hybrid (default: the data-parallel ranks of one node) or optimizer-state "
                "(default: all data-parallel ranks)");
    app.add_option("--prefetch", prefetch, "backward prefetch: none | backward-pre | backward-post")
        ->capture_default_str();
    app.add_flag("--forward-prefetch", cfg.strategy.forward_prefetch,
                 "issue the next unit's all-gather during the current forward");
    num.integer("--fsdp-version", fsdp_version, 1, 2,
                "gradient reduction schedule: 1 (reduce-scatters waited on at the end of backward) | "
                "2 (each waits for the previous one)");
    app.add_option("--grad-accumulation", grad_accumulation,
                   "over --micro-batches: unsharded (hold each unit's unsharded gradient, reduce after the last, "
                   "as PyTorch's no_sync) | sharded (reduce-scatter after every micro-batch into the shard)")
        ->capture_default_str();
    app.add_option("--cpu-offload", cpu_offload,
                   "none | params (parameter, gradient and optimizer shards on the host, the update on the CPU: "
                   "PyTorch FSDP CPUOffload; full, hybrid, grad-op) | optimizer (master weights and optimizer state "
                   "on the host, the update on the CPU: DeepSpeed ZeRO-Offload; optimizer-state, grad-op, full, hybrid)")
        ->capture_default_str();
  }
  if (!parse_command_line(app, argc, argv)) return false;
  // --plan-batch: each line of FILE is a command line of its own; only --plan-batch-ops beside it.
  if (o_batch_ops->count() && !o_batch->count())
    throw UsageError("--plan-batch-ops is only allowed with --plan-batch");
  if (o_batch->count()) {
    for (const CLI::Option* o : app.get_options())
      if (o != o_batch && o != o_batch_ops && o->count())
        throw UsageError("--plan-batch takes no other flags on the command line (got " + o->get_name() +
                         "): each line of its FILE is one configuration's flags");
    if (batch_ops != "all" && batch_ops != "none")
      throw UsageError("--plan-batch-ops '" + batch_ops + "' is not allowed (allowed: all, none)");
    cfg.plan_batch_ops = batch_ops == "all";
  }
  if (list_models) {  // what slurm/sweep checks a matrix's models against
    for (const auto& n : model_preset_names()) std::printf("%s\n", n.c_str());
    return false;
  }
  num.apply();

  cfg.model = model_preset(model);
  const ModelSpec preset = cfg.model;
  const std::pair<CLI::Option*, int64_t*> overrides[] = {
      {o_dm, &cfg.model.d_model}, {o_ff, &cfg.model.d_ff}, {o_l, &cfg.model.layers},
      {o_h, &cfg.model.heads},    {o_kv, &cfg.model.d_kv}, {o_v, &cfg.model.vocab}};
  const int64_t values[] = {d_model, d_ff, layers, heads, d_kv, vocab};
  for (size_t i = 0; i < 6; ++i)
    if (overrides[i].first->count()) *overrides[i].second = values[i];
  if (!ffn.empty()) cfg.model.ffn = parse_ffn_kind(ffn);
  if (!tie.empty()) {
    if (tie != "yes" && tie != "no")
      throw UsageError("--tie-embeddings '" + tie + "' is not allowed (allowed: yes, no)");
    cfg.model.tie_embeddings = tie == "yes";
  }
  const ModelSpec& m = cfg.model;  // a preset with another shape is another model: its name says so
  if (std::make_tuple(m.d_model, m.d_ff, m.layers, m.heads, m.d_kv, m.vocab, m.ffn, m.tie_embeddings) !=
      std::make_tuple(preset.d_model, preset.d_ff, preset.layers, preset.heads, preset.d_kv, preset.vocab, preset.ffn,
                      preset.tie_embeddings))
    cfg.model.name = model + "*";
  if (dec_len == 0) dec_len = seq_len;
  cfg.shape = StepShape{batch, seq_len, dec_len};
  cfg.strategy.tp = int(tp);
  cfg.strategy.pp = int(pp);
  cfg.strategy.first_decoder_stage = pp_split ? int(pp_split) : -1;
  // Every size (the micro-batch count as typed: --micro-batches, or its default --pp). A
  // --pp beyond the blocks is the root cause there: Setup::make refuses it as the pipeline's
  // own limit, so it is not counted here as micro-batches. The pipeline, --tp against the
  // model and the layout against the world are Setup::make's.
  const bool pp_beyond_blocks = pp > 2 * cfg.model.layers;
  validate(cfg.model, cfg.shape, micro_batches ? micro_batches : pp_beyond_blocks ? 1 : pp,
           micro_batches ? "--micro-batches" : "--pp");
  if (cfg.backend != "cpu" && cfg.backend != "cuda")
    throw UsageError("--backend '" + cfg.backend + "' is not allowed (allowed: cpu, cuda)");
  cfg.comm = parse_comm_library(comm, "--comm");

  // Unfused on both backends: a path becomes a backend's default only when measured faster
  // (docs/performance.md §9; on the H100 the fused FMA kernels were 2.3-5.1x slower).
  cfg.strategy.attention = !attention.empty() ? parse_attention_impl(attention) : AttentionImpl::Unfused;
  cfg.compute.attention_kernel = parse_attention_kernel(attention_kernel, "--attention-kernel");
  cfg.steps = int(steps);
  cfg.warmup = int(warmup);
  cfg.plan_world = int(world);
  cfg.strategy.kind = kind;
  cfg.strategy.pp_schedule = parse_pipe_schedule(pp_schedule);
  // As typed; 0 (no --micro-batches): Setup::make takes default_micro_batches, which divides --batch.
  cfg.strategy.micro_batches = int(micro_batches);
  if (micro_batches && batch % micro_batches != 0)
    throw UsageError("--micro-batches " + std::to_string(micro_batches) + " is not allowed with --batch " +
                     std::to_string(batch) + " (must divide it)");
  cfg.strategy.seed = seed;
  cfg.strategy.optimizer.kind = parse_optimizer(optimizer, "--optimizer");
  cfg.strategy.optimizer.lr = float(lr);
  cfg.strategy.optimizer.weight_decay = float(weight_decay);
  cfg.strategy.optimizer.momentum = float(momentum);
  // Each tensor-parallel rank quantises its own part of a unit in blocks of its own, so the
  // tensors the group replicates (the norms) share blocks with different partitioned
  // elements on each rank and drift apart: --check's replicas-identical test cannot hold.
  if (cfg.check && tp > 1 && cfg.strategy.optimizer.kind == OptimizerKind::AdamW8bit)
    throw UsageError("--check with --tp > 1 is not allowed with --optimizer adamw-8bit (each tensor-parallel rank "
                     "quantises its own part, so the replicated norms drift apart; docs/reliability.md)");
  cfg.strategy.param_dtype = parse_precision(dtype, "--dtype");
  cfg.strategy.reduce_dtype = reduce_dtype.empty() ? cfg.strategy.param_dtype
                                                   : parse_precision(reduce_dtype, "--reduce-dtype");
  const bool fp16 = cfg.strategy.param_dtype == DType::F16 || cfg.strategy.reduce_dtype == DType::F16;
  if (!o_ls->count() && fp16) loss_scale = "dynamic";
  cfg.strategy.dynamic_loss_scale = loss_scale == "dynamic";
  if (cfg.strategy.dynamic_loss_scale) {
    cfg.strategy.loss_scale = float(init_scale);
  } else {
    double v = 0;
    try {
      v = parse_real("--loss-scale", loss_scale, 0, 3.4e38, true);
    } catch (const UsageError&) {
      throw UsageError("--loss-scale '" + loss_scale + "' is not allowed (" + real_range(0, 3.4e38, true) + ", or dynamic)");
    }
    cfg.strategy.loss_scale = float(v);
  }
  if (!ddp) {
    if (o_zero->count() && o_sharding->count())
      throw UsageError("--zero-stage and --sharding name the same choice: give one of them");
    cfg.strategy.sharding = o_zero->count() ? sharding_of_zero_level(int(zero)) : parse_sharding(sharding);
    cfg.strategy.prefetch = parse_prefetch(prefetch);
    cfg.strategy.grad_accumulation = parse_grad_accumulation(grad_accumulation);
    cfg.strategy.fsdp_version = int(fsdp_version);
    const bool zero1 = cfg.strategy.sharding == Sharding::OptimizerState;
    if (zero1 && cfg.strategy.grad_accumulation == GradAccumulation::Sharded)
      throw UsageError("--grad-accumulation sharded is not allowed with --sharding optimizer-state (ZeRO-1 keeps "
                       "the whole gradient and reduces it after the last micro-batch)");
    if (zero1) cfg.strategy.shard_size = int(shard);
    cfg.strategy.cpu_offload = parse_cpu_offload(cpu_offload);
    const Sharding sh = cfg.strategy.sharding;
    if (!cpu_offload_allows(cfg.strategy.cpu_offload, sh))  // the rule --describe prints
      throw UsageError(std::string("--cpu-offload ") + cpu_offload_name(cfg.strategy.cpu_offload) +
                       " is not allowed with --sharding " + sharding_name(sh) +
                       (cfg.strategy.cpu_offload == CpuOffload::Params
                            ? " (allowed: full, hybrid, grad-op: the parameters must be sharded to live on the host)"
                            : " (allowed: optimizer-state, grad-op, full, hybrid: the optimizer state must be sharded, "
                              "as ZeRO-Offload's)"));
    if (cfg.strategy.sharding == Sharding::Hybrid) cfg.strategy.shard_size = int(shard);  // 0: one node's (train.cpp)
  }
  // Flags whose effect depends on another, in this one place: each one the rest of the
  // command line leaves nothing to act on is refused (one line naming it and what it needs,
  // exit 2 on every rank: every rank parses the same argv), never accepted silently.
  const bool offload = !ddp && cfg.strategy.cpu_offload != CpuOffload::None;
  const bool fused_cuda = cfg.backend == "cuda" && cfg.strategy.attention == AttentionImpl::Fused;
  const bool shard_groups = !ddp && (cfg.strategy.sharding == Sharding::Hybrid ||
                                     cfg.strategy.sharding == Sharding::OptimizerState);
  const struct {
    const char* flag;
    bool given, acts;
    const char* needs;
  } dependent[] = {
      {"--world-size", world > 0, cfg.plan_only, "--plan"},
      {"--schedule-json", !cfg.schedule_json.empty(), cfg.plan_only, "--plan"},
      {"--overwrite", cfg.overwrite, !cfg.out_path.empty() || !cfg.schedule_json.empty(),
       "--out or --schedule-json (a default result name is always a new file)"},
      {"--pp-split", pp_split != 0, pp > 1, "--pp > 1"},
      {"--pp-schedule", o_pp_schedule->count() > 0, pp > 1, "--pp > 1"},
      {"--comm", o_comm->count() > 0, cfg.backend == "cuda",
       "--backend cuda (the CPU backend's collectives are MPI)"},
      {"--attention-kernel", o_ak->count() > 0, fused_cuda, "--backend cuda --attention fused"},
      {"--cuda-graphs", cfg.compute.graphs, cfg.backend == "cuda", "--backend cuda"},
      {"--momentum", o_mom->count() > 0, cfg.strategy.optimizer.kind == OptimizerKind::Sgd, "--optimizer sgd"},
      {"--loss-scale-init", o_init->count() > 0, cfg.strategy.dynamic_loss_scale, "--loss-scale dynamic"},
      {"--loss-scale-growth-interval", o_growth->count() > 0, cfg.strategy.dynamic_loss_scale,
       "--loss-scale dynamic (the default with --dtype or --reduce-dtype fp16)"},
      {"--check-tolerance", o_tolerance->count() > 0, cfg.check, "--check"},
      {"--host-mem-limit-gib", o_host->count() > 0, offload,
       ddp ? "CPU offload (fsdp_perf --cpu-offload; ddp_perf has none)" : "--cpu-offload params or optimizer"},
      {"--shard-size", shard != 0, shard_groups, "--sharding hybrid or optimizer-state"},
  };
  for (const auto& d : dependent)
    if (d.given && !d.acts) throw UsageError(std::string(d.flag) + " is only allowed with " + d.needs);
  if (cfg.compute.attention_kernel == AttentionKernel::Mma && cfg.strategy.param_dtype == DType::F32)
    throw UsageError("--attention-kernel mma is not allowed with --dtype fp32 (tensor cores take bf16 or fp16; "
                     "fp32 runs the FMA kernels)");
  return true;
}

}  // namespace sb
