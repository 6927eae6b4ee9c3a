// What a training run reports on rank 0 and in its result file's attributes.
#include "shardbench/train/report.h"

#include "shardbench/core/format.h"
#include "shardbench/core/nodes.h"
#include "shardbench/run/environment.h"

namespace sb {
namespace {

std::string loss_scale_text(const StrategyConfig& s) {
  char text[96];
  if (s.dynamic_loss_scale)
    std::snprintf(text, sizeof text, "dynamic from %g, x2 / %d steps", double(s.loss_scale), s.loss_scale_growth_interval);
  else
    std::snprintf(text, sizeof text, "%g", double(s.loss_scale));
  return text;
}

}  // namespace

void print_config(const Out& out, const RunConfig& c, const Setup& setup) {
  const ParallelLayout& layout = setup.layout;
  const ModelSpec& m = c.model;
  const int world = layout.world;
  std::vector<std::pair<std::string, std::string>> rows = {
      {"program", c.program},
      {"strategy", setup.strategy.label()},
      {"model", m.name},
      {"parameters", with_commas(param_count(m))},
      {"d_model / d_ff / d_kv", std::to_string(m.d_model) + " / " + std::to_string(m.d_ff) + " / " + std::to_string(m.d_kv)},
      {"layers (enc+dec) / heads", std::to_string(m.layers) + "+" + std::to_string(m.layers) + " / " + std::to_string(m.heads)},
      {"vocab", std::to_string(m.vocab)},
      {"feed-forward / LM head", std::string(ffn_kind_name(m.ffn)) + " / " + (m.tie_embeddings ? "tied" : "untied")},
      {"world / shard group / replicas", std::to_string(world) + " / " + std::to_string(layout.shard) + " / " +
                                             std::to_string(layout.replicate)},
      {"batch per rank / global", std::to_string(c.shape.batch) + " / " + std::to_string(c.shape.batch * layout.dp())},
      {"seq len enc / dec", std::to_string(c.shape.enc_len) + " / " + std::to_string(c.shape.dec_len)},
      {"steps (+ warm-up)", std::to_string(c.steps) + " (+" + std::to_string(c.warmup) + ")"},
      {"backend / dtype / reduce", c.backend + (c.backend == "cuda" ? std::string("+") + comm_library_name(c.comm) : "") +
                                       " / " + precision_name(setup.strategy.param_dtype) + " / " +
                                       precision_name(setup.strategy.reduce_dtype)},
      {"loss scale", loss_scale_text(setup.strategy)},
      {"activation checkpointing", setup.strategy.checkpointing ? "on" : "off"},
      {"attention", attention_impl_name(setup.strategy.attention)},
      {"attention kernel", attention_kernel_name(c.compute.attention_kernel)},
      {"fused epilogues", c.compute.fused_epilogues ? "on" : "off"},
      {"CUDA graphs", c.compute.graphs ? "on" : "off"},
      {"seed", std::to_string(setup.strategy.seed)},
  };
  if (layout.tp > 1 || layout.pp > 1) {  // after the world's row: the ranks a model copy spans
    rows.insert(rows.begin() + 8, {"pipeline / tensor / data par.", std::to_string(layout.pp) + " / " +
                                                                        std::to_string(layout.tp) + " / " +
                                                                        std::to_string(layout.dp())});
    if (layout.tp > 1) rows[3].second += " (" + with_commas(param_count_per_rank(m, layout.tp)) + " per rank)";
  }
  if (layout.pp > 1)
    rows.insert(rows.begin() + 9, {"micro-batches / schedule", std::to_string(setup.strategy.micro_batches) + " / " +
                                                                   pipe_schedule_name(setup.strategy.pp_schedule)});
  if (setup.strategy.kind == StrategyKind::DDP) {
    rows.push_back({"bucket cap", std::to_string(setup.strategy.bucket_mb) + " MiB (first 1 MiB)"});
  } else {
    rows.push_back({"backward prefetch", prefetch_name(setup.strategy.prefetch)});
    rows.push_back({"forward prefetch", setup.strategy.forward_prefetch ? "on" : "off"});
    rows.push_back({"FSDP version", std::to_string(setup.strategy.fsdp_version)});
    if (setup.strategy.micro_batches > 1)
      rows.push_back({"gradient accumulation", grad_accumulation_name(setup.strategy.grad_accumulation)});
    rows.push_back({"CPU offload", cpu_offload_name(setup.strategy.cpu_offload)});
  }
  out("+--------------------------------+----------------------------------+\n");
  for (const auto& [k, v] : rows) out("| %-30s | %-32s |\n", k.c_str(), v.c_str());
  out("+--------------------------------+----------------------------------+\n");
}

void print_summary(const Out& out, const RunConfig& cfg, const Setup& setup, int world, const Summary& s) {
  const double t = s.step_time;
  out("summary over %d timed steps (medians; times: slowest rank; breakdown: mean over ranks)\n", s.steps);
  out("  step time            %.2f ms\n", t * 1e3);
  out("  TFLOPS per rank      %.4f model, %.4f hardware\n", s.model_flops / t / 1e12, s.hardware_flops / t / 1e12);
  out("  tokens/s             %.0f (enc+dec tokens of the global batch)\n", s.tokens / t);
  out("  compute              %.2f ms (GEMM %.2f ms at %.2f GFLOP/s)\n", s.compute * 1e3, s.gemm * 1e3,
      s.gemm_rate / 1e9);
  out("  communication        %.2f ms issued, %.2f ms exposed (not overlapped)\n", s.communication * 1e3,
      s.exposed * 1e3);
  out("  harness overhead     %.3f ms (%.2f%% of the step)\n", s.overhead * 1e3, 100 * s.overhead / t);
  if (!s.placement.empty()) out("  warning: %s\n", s.placement.c_str());
  if (s.pp > 1)
    out("  pipeline bubble      %.1f%% of the step measured (ranks not computing, mean), %.1f%% in theory "
        "((S - 1) / (M + S - 1))\n", 100 * s.idle_share, 100 * s.bubble_theory);
  // With more ranks than cores the replay (all ranks at once) competes for cores unlike the
  // step (ranks alternate compute and waits): the ratio then says nothing about the harness.
  out("  GEMM rate in step    %.1f%% of the same GEMM shapes replayed outside the step (worst rank)%s\n",
      100 * s.gemm_vs_replay, s.oversubscribed() ? "; ranks > cores: not meaningful" : "");
  out("  peak memory / rank   %s accounted = %.2f%% of the plan (%s); resident-set growth %s = %.1f%%\n",
      human_bytes(double(s.peak)).c_str(), 100.0 * double(s.peak) / double(s.plan_peak),
      human_bytes(double(s.plan_peak)).c_str(), human_bytes(double(s.rss_growth)).c_str(),
      100.0 * double(s.rss_growth) / double(s.plan_peak));
  if (s.host_peak > 0 || s.plan_host_peak > 0)
    out("  host memory / rank   %s accounted (CPU offload) = %.2f%% of the plan (%s)\n",
        human_bytes(double(s.host_peak)).c_str(),
        s.plan_host_peak > 0 ? 100.0 * double(s.host_peak) / double(s.plan_host_peak) : 0.0,
        human_bytes(double(s.plan_host_peak)).c_str());
  out("RESULT program=%s strategy=%s model=%s world=%d batch=%lld seq=%lld dec_seq=%lld step_ms=%.3f "
      "tflops_per_rank=%.5f tokens_per_s=%.1f exposed_ms=%.3f overhead_pct=%.3f peak_bytes=%lld "
      "plan_bytes=%lld loss=%.6f\n",
      cfg.program.c_str(), setup.strategy.label().c_str(), cfg.model.name.c_str(), world,
      (long long)cfg.shape.batch, (long long)cfg.shape.enc_len, (long long)cfg.shape.dec_len, t * 1e3,
      s.model_flops / t / 1e12, s.tokens / t, s.exposed * 1e3, 100 * s.overhead / t, (long long)s.peak,
      (long long)s.plan_peak, s.final_loss);
  // A NaN or inf loss (an fp16 overflow, say) means the steps computed garbage: the timings
  // may look fine, but the run is recorded as failed.
  if (s.first_nonfinite)
    out("error: the loss is not finite from step %d on: the run is recorded as failed (%s gradients overflow "
        "under --loss-scale %g? lower it)\n",
        s.first_nonfinite, precision_name(setup.strategy.param_dtype), double(setup.strategy.loss_scale));
}

std::vector<Attr> summary_attrs(const Summary& s) {
  const double t = s.step_time;
  // The console's warnings, kept with the result so that reports built from it show them.
  std::string warnings =
      s.oversubscribed() ? std::to_string(s.ranks_on_node) + " ranks on " + std::to_string(s.cores) +
                               " cores (ranks > cores): ranks share cores; the GEMM rate against its replay is not "
                               "meaningful"
                         : "";
  if (!s.placement.empty()) warnings += (warnings.empty() ? "" : "; ") + s.placement;
  return {
      Attr::integer("first_nonfinite_step", s.first_nonfinite),
      Attr::integer("skipped_steps", s.skipped_steps),
      Attr::num("final_loss_scale", s.final_loss_scale),
      Attr::num("median_step_time_s", t),
      Attr::num("median_model_tflops_per_rank", s.model_flops / t / 1e12),
      Attr::num("median_hardware_tflops_per_rank", s.hardware_flops / t / 1e12),
      Attr::num("median_tokens_per_s", s.tokens / t),
      Attr::num("median_exposed_comm_s", s.exposed),
      Attr::num("gemm_rate_vs_replay", s.gemm_vs_replay),
      Attr::integer("max_peak_memory_bytes", s.peak),
      Attr::integer("plan_peak_memory_bytes", s.plan_peak),
      Attr::integer("max_host_peak_memory_bytes", s.host_peak),
      Attr::integer("plan_host_peak_memory_bytes", s.plan_host_peak),
      Attr::integer("rss_growth_bytes", s.rss_growth),
      Attr::num("final_loss", s.final_loss),
      Attr::num("idle_share", s.idle_share),
      Attr::num("pipeline_bubble_theory", s.bubble_theory),
      Attr::str("warnings", warnings),
  };
}

std::vector<Attr> run_attrs(const RunConfig& c, const Setup& setup, const char* status, double start, double end) {
  const ParallelLayout& layout = setup.layout;
  const ModelSpec& m = c.model;
  const int world = layout.world;
  const NodeMap& nodes = node_map();
  return {
      Attr::str("program", c.program),
      Attr::str("strategy", setup.strategy.kind == StrategyKind::DDP ? "ddp" : "fsdp"),
      Attr::str("label", setup.strategy.label()),
      Attr::str("sharding", setup.strategy.kind == StrategyKind::DDP ? "replicate" : sharding_name(setup.strategy.sharding)),
      Attr::integer("shard_size", layout.shard),
      Attr::integer("replicas", layout.replicate),
      Attr::integer("tp_size", layout.tp),
      Attr::integer("pp_size", layout.pp),
      Attr::integer("micro_batches", setup.strategy.micro_batches),
      Attr::str("pp_schedule", pipe_schedule_name(setup.strategy.pp_schedule)),
      Attr::integer("dp_size", layout.dp()),
      Attr::str("prefetch", setup.strategy.kind == StrategyKind::DDP ? "n/a" : prefetch_name(setup.strategy.prefetch)),
      Attr::integer("forward_prefetch", setup.strategy.forward_prefetch),
      Attr::integer("fsdp_version", setup.strategy.kind == StrategyKind::DDP ? 0 : setup.strategy.fsdp_version),
      Attr::str("grad_accumulation", setup.strategy.kind == StrategyKind::DDP ? "unsharded"
                                                                         : grad_accumulation_name(setup.strategy.grad_accumulation)),
      Attr::integer("activation_checkpointing", setup.strategy.checkpointing),
      Attr::str("attention", attention_impl_name(setup.strategy.attention)),
      Attr::str("attention_kernel", attention_kernel_name(c.compute.attention_kernel)),
      Attr::integer("fused_epilogues", c.compute.fused_epilogues),
      Attr::integer("cuda_graphs", c.compute.graphs),
      Attr::num("bucket_mb", setup.strategy.kind == StrategyKind::DDP ? setup.strategy.bucket_mb : 0.0),
      Attr::str("model", m.name),
      Attr::integer("d_model", m.d_model),
      Attr::integer("d_ff", m.d_ff),
      Attr::integer("layers", m.layers),
      Attr::integer("heads", m.heads),
      Attr::integer("d_kv", m.d_kv),
      Attr::integer("vocab", m.vocab),
      Attr::integer("num_buckets", m.num_buckets),
      Attr::integer("max_distance", m.max_distance),
      Attr::str("ffn", ffn_kind_name(m.ffn)),
      Attr::integer("tie_embeddings", m.tie_embeddings),
      Attr::integer("param_count", param_count(m)),
      Attr::integer("param_count_per_rank", param_count_per_rank(m, layout.tp)),
      Attr::integer("world_size", world),
      Attr::integer("ranks_per_node", nodes.max_ranks_per_node()),
      Attr::integer("nodes", nodes.nodes()),
      Attr::integer("batch_per_rank", c.shape.batch),
      Attr::integer("global_batch", c.shape.batch * layout.dp()),
      Attr::integer("enc_seq_len", c.shape.enc_len),
      Attr::integer("dec_seq_len", c.shape.dec_len),
      Attr::str("dtype", precision_name(setup.strategy.param_dtype)),
      Attr::str("reduce_dtype", precision_name(setup.strategy.reduce_dtype)),
      Attr::num("loss_scale", setup.strategy.loss_scale),
      Attr::str("loss_scale_mode", setup.strategy.dynamic_loss_scale ? "dynamic" : "static"),
      Attr::integer("loss_scale_growth_interval", setup.strategy.loss_scale_growth_interval),
      Attr::str("backend", c.backend),
      Attr::str("comm", c.backend == "cuda" ? comm_library_name(c.comm) : "mpi"),
      Attr::integer("steps", c.steps),
      Attr::integer("warmup", c.warmup),
      Attr::integer("seed", int64_t(setup.strategy.seed)),
      Attr::str("optimizer", optimizer_name(setup.strategy.optimizer.kind)),
      Attr::str("cpu_offload", setup.strategy.kind == StrategyKind::DDP ? "none" : cpu_offload_name(setup.strategy.cpu_offload)),
      Attr::num("lr", setup.strategy.optimizer.lr),
      Attr::num("weight_decay", setup.strategy.optimizer.weight_decay),
      Attr::num("momentum", setup.strategy.optimizer.kind == OptimizerKind::Sgd ? setup.strategy.optimizer.momentum : 0.0),
      // One rank's share (1/tp of a data-parallel rank's under tensor parallelism).
      Attr::num("model_flops_per_step", model_flops_per_step(m, c.shape, layout.tp, layout.pp)),
      Attr::num("hardware_flops_per_step", hardware_flops_per_step(m, c.shape, setup.strategy.checkpointing, layout.tp, layout.pp)),
      Attr::str("status", status),
      Attr::str("start_time", iso_time(start)),
      Attr::str("end_time", iso_time(end)),
  };
}

std::vector<Attr> plan_attrs(const RunConfig& cfg, const Setup& setup, const MemoryPlan& p) {
  std::vector<Attr> a = {Attr::integer("world_size", p.layout.world), Attr::integer("shard_size", p.layout.shard),
                         Attr::integer("tp_size", p.layout.tp),
                         Attr::integer("peak_total", p.peak_total), Attr::integer("limit", p.limit),
                         Attr::integer("fits", p.fits()), Attr::num("counted_gemm_flops", p.counted_flops),
                         Attr::integer("device_fits", p.device_fits()),
                         Attr::integer("host_peak_total", p.host_peak_total), Attr::integer("host_limit", p.host_limit),
                         Attr::integer("host_fits", p.host_fits())};
  for (int c = 0; c < kMemCategories; ++c) {
    a.push_back(Attr::integer(std::string("peak_") + mem_category_name(MemCategory(c)), p.peak[c]));
    a.push_back(Attr::integer(std::string("at_peak_") + mem_category_name(MemCategory(c)), p.at_peak[c]));
  }
  for (int c = 0; c < kMemCategories; ++c) {
    a.push_back(Attr::integer(std::string("host_peak_") + mem_category_name(MemCategory(c)), p.host_peak[c]));
    a.push_back(Attr::integer(std::string("host_at_peak_") + mem_category_name(MemCategory(c)), p.host_at_peak[c]));
  }
  // Each pipeline stage (one without --pp), as comma-separated lists: its first piece
  // (then the total), planned peak, GEMM FLOPs and parameters.
  std::string first, peaks, host_peaks, flops, params;
  char num[64];
  for (const StagePlan& st : p.stages) {
    first += std::to_string(st.first_piece) + ",";
    peaks += std::to_string(st.peak_total) + ",";
    host_peaks += std::to_string(st.host_peak_total) + ",";
    std::snprintf(num, sizeof num, "%.17g,", st.counted_flops);
    flops += num;
    params += std::to_string(st.params) + ",";
  }
  first += std::to_string(p.stages.back().last_piece);
  for (std::string* l : {&peaks, &host_peaks, &flops, &params}) l->pop_back();
  a.push_back(Attr::integer("pp_size", p.layout.pp));
  a.push_back(Attr::str("stage_first", first));
  a.push_back(Attr::str("stage_peak_total", peaks));
  a.push_back(Attr::str("stage_host_peak_total", host_peaks));
  a.push_back(Attr::str("stage_counted_gemm_flops", flops));
  a.push_back(Attr::str("stage_params", params));
  a.push_back(Attr::str("text", format_plan(cfg, setup, p)));
  return a;
}

}  // namespace sb
