// Command-line options of ddp_perf and fsdp_perf (CLI11). Every bad value becomes one
// UsageError line naming the value and what is allowed.
#include <CLI/CLI.hpp>

#include <cmath>
#include <cstdlib>

#include "shardbench/check.h"
#include "shardbench/cli.h"
#include "shardbench/harness.h"

namespace sb {
namespace {

void require_positive(const char* flag, int64_t v) {
  if (v <= 0) throw UsageError(std::string(flag) + " " + std::to_string(v) + " is not allowed (must be > 0)");
}

}  // namespace

bool parse_options(int argc, char** argv, StrategyKind kind, RunConfig& cfg) {
  const bool ddp = kind == StrategyKind::DDP;
  cfg.program = ddp ? "ddp_perf" : "fsdp_perf";
  cfg.argv.assign(argv, argv + argc);
  CLI::App app{ddp ? "ddp_perf: DDP training steps of a synthetic T5 (bucketed all-reduce "
                     "overlapped with backward)"
                   : "fsdp_perf: FSDP training steps of a synthetic T5 (full, hybrid, "
                     "grad-op or no sharding)",
               cfg.program};
  // A flag given twice takes its last value, so scripts can append overrides.
  app.option_defaults()->multi_option_policy(CLI::MultiOptionPolicy::TakeLast);
  std::string model = "t5-small", sharding = "full", prefetch = "backward-pre", dtype = "fp32", reduce_dtype;
  int64_t d_model = 0, d_ff = 0, layers = 0, heads = 0, d_kv = 0, vocab = 0;
  int64_t batch = 2, seq_len = 64, dec_len = 0, steps = 5, warmup = 1, world = 0, shard = 0;
  double lr = cfg.strategy.adam.lr;
  uint64_t seed = 1234;

  std::string names;
  for (const auto& n : model_preset_names()) names += (names.empty() ? "" : ", ") + n;
  app.add_option("--model", model, "model preset: " + names)->capture_default_str();
  auto* o_dm = app.add_option("--d-model", d_model, "override d_model");
  auto* o_ff = app.add_option("--d-ff", d_ff, "override d_ff");
  auto* o_l = app.add_option("--layers", layers, "override layers per stack");
  auto* o_h = app.add_option("--heads", heads, "override attention heads");
  auto* o_kv = app.add_option("--d-kv", d_kv, "override d_kv (head width)");
  auto* o_v = app.add_option("--vocab", vocab, "override vocabulary size");
  app.add_option("--batch", batch, "sequences per rank")->capture_default_str();
  app.add_option("--seq-len", seq_len, "encoder tokens per sequence")->capture_default_str();
  app.add_option("--dec-seq-len", dec_len, "decoder tokens per sequence (default: --seq-len)");
  app.add_option("--steps", steps, "timed steps")->capture_default_str();
  app.add_option("--warmup", warmup, "untimed steps first (they train too)")->capture_default_str();
  app.add_option("--seed", seed, "seed of data and initial weights")->capture_default_str();
  app.add_option("--lr", lr, "Adam learning rate")->capture_default_str();
  app.add_option("--backend", cfg.backend, "cpu, or cuda where built (one rank per GPU)")->capture_default_str();
  app.add_option("--mem-limit-gib", cfg.mem_limit_gib,
                 "memory per rank in GiB (default: the GPU's free memory; CPU: host memory / ranks on the node)");
  app.add_flag("--plan", cfg.plan_only, "print the memory and FLOP plan and exit, allocating nothing");
  app.add_option("--schedule-json", cfg.schedule_json,
                 "with --plan: write the plan and one step's schedule as JSON (for analysis/project.py)");
  app.add_option("--world-size", world, "world size to plan for with --plan (default: the MPI world)");
  app.add_flag("--check", cfg.check, "compare final weights with a single-rank reference computed in the run");
  app.add_option("--check-tolerance", cfg.check_tolerance,
                 "--check: allowed error of each reduced gradient as a multiple of its rounding bound "
                 "(docs/reliability.md)")
      ->capture_default_str();
  app.add_option("--out", cfg.out_path,
                 "HDF5 result file (default: results/<program>-<strategy>-<model>-w<ranks>-<time>.h5)");
  app.add_flag("--overwrite", cfg.overwrite, "replace an existing --out file");
  app.add_option("--dtype", dtype,
                 "fp32 | bf16 | fp16: parameters as computed (gathered), activations, gradients; "
                 "master weights and Adam stay fp32")
      ->capture_default_str();
  app.add_option("--reduce-dtype", reduce_dtype, "fp32 | bf16 | fp16: gradient reduction (default: --dtype)");
  std::string loss_scale = "1";
  auto* o_ls = app.add_option("--loss-scale", loss_scale,
                              "X (static) or 'dynamic' (start at 65536, halve and skip the step on inf/NaN "
                              "gradients, double after --loss-scale-growth-interval good steps), divided out "
                              "before Adam; default: dynamic when --dtype or --reduce-dtype is fp16, else 1");
  double init_scale = 65536;  // torch.amp.GradScaler's init_scale
  auto* o_init = app.add_option("--loss-scale-init", init_scale, "dynamic loss scale: the first scale")
                     ->capture_default_str();
  app.add_option("--loss-scale-growth-interval", cfg.strategy.loss_scale_growth_interval,
                 "dynamic loss scale: good steps before it doubles")
      ->capture_default_str();
  app.add_flag("--activation-checkpointing", cfg.strategy.checkpointing,
               "recompute each block's forward in backward");
  if (ddp) {
    app.add_option("--bucket-mb", cfg.strategy.bucket_mb, "gradient bucket cap in MiB (first bucket: 1 MiB)")
        ->capture_default_str();
  } else {
    app.add_option("--sharding", sharding, "full | hybrid | none | grad-op")->capture_default_str();
    app.add_option("--shard-size", shard, "shard group size for --sharding hybrid");
    app.add_option("--prefetch", prefetch, "backward prefetch: none | backward-pre | backward-post")
        ->capture_default_str();
    app.add_flag("--forward-prefetch", cfg.strategy.forward_prefetch,
                 "issue the next unit's all-gather during the current forward");
  }
  if (!parse_command_line(app, argc, argv)) return false;

  cfg.model = model_preset(model);
  const std::pair<CLI::Option*, int64_t*> overrides[] = {
      {o_dm, &cfg.model.d_model}, {o_ff, &cfg.model.d_ff}, {o_l, &cfg.model.layers},
      {o_h, &cfg.model.heads},    {o_kv, &cfg.model.d_kv}, {o_v, &cfg.model.vocab}};
  const int64_t values[] = {d_model, d_ff, layers, heads, d_kv, vocab};
  for (size_t i = 0; i < 6; ++i)
    if (overrides[i].first->count()) {
      *overrides[i].second = values[i];
      cfg.model.name = model + "*";  // an overridden preset is another model
    }
  validate(cfg.model);

  require_positive("--batch", batch);
  require_positive("--seq-len", seq_len);
  if (dec_len == 0) dec_len = seq_len;
  require_positive("--dec-seq-len", dec_len);
  require_positive("--steps", steps);
  if (warmup < 0) throw UsageError("--warmup " + std::to_string(warmup) + " is not allowed (must be >= 0)");
  if (cfg.mem_limit_gib < 0)
    throw UsageError("--mem-limit-gib " + std::to_string(cfg.mem_limit_gib) + " is not allowed (must be > 0)");
  if (world < 0) throw UsageError("--world-size " + std::to_string(world) + " is not allowed (must be > 0)");
  if (world > 0 && !cfg.plan_only) throw UsageError("--world-size is only allowed with --plan");
  if (!cfg.schedule_json.empty() && !cfg.plan_only) throw UsageError("--schedule-json is only allowed with --plan");
  if (!(lr > 0)) throw UsageError("--lr " + std::to_string(lr) + " is not allowed (must be > 0)");
  if (!(cfg.check_tolerance > 0))
    throw UsageError("--check-tolerance is not allowed to be <= 0");
  if (ddp && !(cfg.strategy.bucket_mb > 0))
    throw UsageError("--bucket-mb " + std::to_string(cfg.strategy.bucket_mb) + " is not allowed (must be > 0)");
  if (cfg.backend != "cpu" && cfg.backend != "cuda")
    throw UsageError("--backend '" + cfg.backend + "' is not allowed (allowed: cpu, cuda)");

  cfg.shape = StepShape{batch, seq_len, dec_len};
  cfg.steps = int(steps);
  cfg.warmup = int(warmup);
  cfg.plan_world = int(world);
  cfg.strategy.kind = kind;
  cfg.strategy.seed = seed;
  cfg.strategy.adam.lr = float(lr);
  cfg.strategy.param_dtype = parse_precision(dtype, "--dtype");
  cfg.strategy.reduce_dtype = reduce_dtype.empty() ? cfg.strategy.param_dtype
                                                   : parse_precision(reduce_dtype, "--reduce-dtype");
  const bool fp16 = cfg.strategy.param_dtype == DType::F16 || cfg.strategy.reduce_dtype == DType::F16;
  if (!o_ls->count() && fp16) loss_scale = "dynamic";
  cfg.strategy.dynamic_loss_scale = loss_scale == "dynamic";
  if (o_init->count() && !cfg.strategy.dynamic_loss_scale)
    throw UsageError("--loss-scale-init is only allowed with --loss-scale dynamic");
  if (cfg.strategy.dynamic_loss_scale) {
    if (!(init_scale > 0) || !(init_scale <= 3.4e38))
      throw UsageError("--loss-scale-init " + std::to_string(init_scale) + " is not allowed (a number > 0)");
    cfg.strategy.loss_scale = float(init_scale);
  } else {
    char* end = nullptr;
    const double v = std::strtod(loss_scale.c_str(), &end);
    if (end == loss_scale.c_str() || *end || !(v > 0) || !std::isfinite(v) || v > 3.4e38)
      throw UsageError("--loss-scale '" + loss_scale + "' is not allowed (a number > 0, or dynamic)");
    cfg.strategy.loss_scale = float(v);
  }
  if (cfg.strategy.loss_scale_growth_interval < 1)
    throw UsageError("--loss-scale-growth-interval " + std::to_string(cfg.strategy.loss_scale_growth_interval) +
                     " is not allowed (must be >= 1)");
  if (!ddp) {
    cfg.strategy.sharding = parse_sharding(sharding);
    cfg.strategy.prefetch = parse_prefetch(prefetch);
    if (shard != 0 && cfg.strategy.sharding != Sharding::Hybrid)
      throw UsageError("--shard-size is only allowed with --sharding hybrid");
    if (cfg.strategy.sharding == Sharding::Hybrid) {
      if (shard <= 0)
        throw UsageError("--sharding hybrid needs --shard-size G > 0 (got " + std::to_string(shard) + ")");
      cfg.strategy.shard_size = int(shard);
    }
  }
  return true;
}

}  // namespace sb
