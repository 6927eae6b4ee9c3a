// The timing protocol, written once for every training program:
//   parse → validate against the world → plan → (out of memory? report, exit 3) →
//   build backend, mesh, strategy → warm-up + timed steps (barrier, step, cross-rank
//   reduction, rank-0 line) → summary → optional --check against a single-rank reference.
#include <sys/stat.h>
#include <unistd.h>

#include <ctime>
#include <thread>

#include <algorithm>
#include <cmath>
#include <cstdio>
#include <cstring>
#include <fstream>
#include <map>
#include <numeric>
#include <sstream>
#include <tuple>

#include "shardbench/check.h"
#include "shardbench/harness.h"
#include "shardbench/t5.h"
#include "shardbench/trace.h"

namespace sb {
namespace {

// Rank-0 printing goes through one helper.
struct Out {
  int rank = 0;
  template <class... A>
  void operator()(const char* fmt, A... a) const {
    if (rank != 0) return;
    std::printf(fmt, a...);
    std::fflush(stdout);
  }
};



// Resident set of this process from /proc/self/status: "VmHWM:" (peak) or "VmRSS:" (now).
// The peak's growth over the start-up value is an independent check of the accounted peak.
int64_t rss_bytes(const char* field) {
  std::ifstream f("/proc/self/status");
  std::string key;
  while (f >> key) {
    if (key == field) {
      int64_t kb = 0;
      f >> kb;
      return kb * 1024;
    }
    f.ignore(1 << 20, '\n');
  }
  return 0;
}

double median(std::vector<double> v) {
  if (v.empty()) return 0;
  std::sort(v.begin(), v.end());
  const size_t n = v.size();
  return n % 2 ? v[n / 2] : 0.5 * (v[n / 2 - 1] + v[n / 2]);
}

std::string loss_scale_text(const StrategyConfig& s) {
  char text[96];
  if (s.dynamic_loss_scale)
    std::snprintf(text, sizeof text, "dynamic from %g, x2 / %d steps", double(s.loss_scale), s.loss_scale_growth_interval);
  else
    std::snprintf(text, sizeof text, "%g", double(s.loss_scale));
  return text;
}

void print_config(const Out& out, const RunConfig& c, int world, int shard) {
  const ModelSpec& m = c.model;
  std::vector<std::pair<std::string, std::string>> rows = {
      {"program", c.program},
      {"strategy", c.strategy.label()},
      {"model", m.name},
      {"parameters", with_commas(param_count(m))},
      {"d_model / d_ff / d_kv", std::to_string(m.d_model) + " / " + std::to_string(m.d_ff) + " / " + std::to_string(m.d_kv)},
      {"layers (enc+dec) / heads", std::to_string(m.layers) + "+" + std::to_string(m.layers) + " / " + std::to_string(m.heads)},
      {"vocab", std::to_string(m.vocab)},
      {"world / shard group / replicas", std::to_string(world) + " / " + std::to_string(shard) + " / " + std::to_string(world / shard)},
      {"batch per rank / global", std::to_string(c.shape.batch) + " / " + std::to_string(c.shape.batch * world)},
      {"seq len enc / dec", std::to_string(c.shape.enc_len) + " / " + std::to_string(c.shape.dec_len)},
      {"steps (+ warm-up)", std::to_string(c.steps) + " (+" + std::to_string(c.warmup) + ")"},
      {"backend / dtype / reduce", c.backend + (c.backend == "cuda" ? std::string("+") + comm_library_name(c.comm) : "") +
                                       " / " + precision_name(c.strategy.param_dtype) + " / " +
                                       precision_name(c.strategy.reduce_dtype)},
      {"loss scale", loss_scale_text(c.strategy)},
      {"activation checkpointing", c.strategy.checkpointing ? "on" : "off"},
      {"attention", attention_impl_name(c.strategy.attention)},
      {"seed", std::to_string(c.strategy.seed)},
  };
  if (c.strategy.kind == StrategyKind::DDP) {
    rows.push_back({"bucket cap", std::to_string(c.strategy.bucket_mb) + " MiB (first 1 MiB)"});
  } else {
    rows.push_back({"backward prefetch", prefetch_name(c.strategy.prefetch)});
    rows.push_back({"forward prefetch", c.strategy.forward_prefetch ? "on" : "off"});
    rows.push_back({"FSDP version", std::to_string(c.strategy.fsdp_version)});
  }
  out("+--------------------------------+----------------------------------+\n");
  for (const auto& [k, v] : rows) out("| %-30s | %-32s |\n", k.c_str(), v.c_str());
  out("+--------------------------------+----------------------------------+\n");
}

// Step figures reduced across ranks.
struct GlobalStep {
  double time = 0;          // max over ranks
  double loss = 0;          // mean token loss of the global batch
  double compute = 0, communication = 0, exposed = 0, overhead = 0;  // mean over ranks
  double gemm = 0, gemm_flops = 0;  // mean over ranks
  int64_t peak = 0;                 // max over ranks
};

GlobalStep reduce_step(const StepStats& s, double loss_sum, double global_tokens, int world) {
  double local_max[1] = {s.time()}, global_max[1];
  double local_sum[7] = {loss_sum, s.compute, s.communication, s.exposed_comm, s.overhead(), s.gemm, s.gemm_flops};
  double global_sum[7];
  int64_t peak = 0;
  MPI_CHECK(MPI_Allreduce(local_max, global_max, 1, MPI_DOUBLE, MPI_MAX, MPI_COMM_WORLD));
  MPI_CHECK(MPI_Allreduce(local_sum, global_sum, 7, MPI_DOUBLE, MPI_SUM, MPI_COMM_WORLD));
  MPI_CHECK(MPI_Allreduce(&s.peak_memory, &peak, 1, MPI_INT64_T, MPI_MAX, MPI_COMM_WORLD));
  GlobalStep g;
  g.time = global_max[0];
  g.loss = global_sum[0] / global_tokens;
  g.compute = global_sum[1] / world;
  g.communication = global_sum[2] / world;
  g.exposed = global_sum[3] / world;
  g.overhead = global_sum[4] / world;
  g.gemm = global_sum[5] / world;
  g.gemm_flops = global_sum[6] / world;
  g.peak = peak;
  return g;
}

// Replays the GEMM shapes of one step outside the step, on fresh buffers of the run's
// element type, and returns the achieved FLOP/s: the reference for the GEMM rate inside
// the step.
double replay_gemms(Backend& b, const std::vector<OpEvent>& events, DType dtype) {
  int64_t max_a = 1, max_b = 1, max_c = 1;
  for (const OpEvent& e : events)
    if (e.kind == OpKind::Gemm) {
      const int64_t m = e.gemm[0], n = e.gemm[1], k = e.gemm[2], batch = e.gemm[3];
      max_a = std::max(max_a, m * k * batch);
      max_b = std::max(max_b, k * n * batch);
      max_c = std::max(max_c, m * n * batch);
    }
  const Buf A = b.alloc_buf(max_a, dtype, MemCategory::Workspace);
  const Buf B = b.alloc_buf(max_b, dtype, MemCategory::Workspace);
  const Buf C = b.alloc_buf(max_c, dtype, MemCategory::Workspace);
  float* init = b.alloc_floats(std::max(max_a, max_b), MemCategory::Workspace);
  b.init_uniform(init, max_a, 1, 0, 1.f);
  b.cast(A, init, max_a);
  b.init_uniform(init, max_b, 2, 0, 1.f);
  b.cast(B, init, max_b);
  b.release(init);
  b.fill(C, 0.f, max_c);
  b.synchronize();
  const double t0 = b.now();
  double flops = 0;
  for (const OpEvent& e : events) {
    if (e.kind != OpKind::Gemm) continue;
    const int m = e.gemm[0], n = e.gemm[1], k = e.gemm[2], batch = e.gemm[3];
    const bool ta = e.gemm[4] & 1, tb = e.gemm[4] & 2;
    const int lda = ta ? m : k, ldb = tb ? k : n;
    b.gemm_batched(ta, tb, m, n, k, 1.f, A, lda, int64_t(m) * k, B, ldb, int64_t(k) * n, 1.f, C, n,
                   int64_t(m) * n, batch);
    flops += e.flops;
  }
  b.synchronize();
  const double t = b.now() - t0;
  for (const Buf& p : {A, B, C}) b.release(p.ptr);
  return flops / t;
}

// Wall-clock time as ISO 8601 UTC.



// Decides the result path and checks it on rank 0 before any work: an existing file
// (without --overwrite), a missing or unwritable directory is a usage error on every rank.
// A default name is made unique with a numeric suffix, so it never replaces a result.


// Root attributes: what ran (docs/trace-format.md lists every one).
std::vector<Attr> run_attrs(const RunConfig& c, int world, const char* status, double start, double end) {
  const ModelSpec& m = c.model;
  const int shard = shard_group_size(c.strategy, world);
  const int rpn = local_ranks();
  return {
      Attr::str("program", c.program),
      Attr::str("strategy", c.strategy.kind == StrategyKind::DDP ? "ddp" : "fsdp"),
      Attr::str("label", c.strategy.label()),
      Attr::str("sharding", c.strategy.kind == StrategyKind::DDP ? "replicate" : sharding_name(c.strategy.sharding)),
      Attr::integer("shard_size", shard),
      Attr::integer("replicas", world / shard),
      Attr::str("prefetch", c.strategy.kind == StrategyKind::DDP ? "n/a" : prefetch_name(c.strategy.prefetch)),
      Attr::integer("forward_prefetch", c.strategy.forward_prefetch),
      Attr::integer("fsdp_version", c.strategy.kind == StrategyKind::DDP ? 0 : c.strategy.fsdp_version),
      Attr::integer("activation_checkpointing", c.strategy.checkpointing),
      Attr::str("attention", attention_impl_name(c.strategy.attention)),
      Attr::num("bucket_mb", c.strategy.kind == StrategyKind::DDP ? c.strategy.bucket_mb : 0.0),
      Attr::str("model", m.name),
      Attr::integer("d_model", m.d_model),
      Attr::integer("d_ff", m.d_ff),
      Attr::integer("layers", m.layers),
      Attr::integer("heads", m.heads),
      Attr::integer("d_kv", m.d_kv),
      Attr::integer("vocab", m.vocab),
      Attr::integer("num_buckets", m.num_buckets),
      Attr::integer("max_distance", m.max_distance),
      Attr::integer("param_count", param_count(m)),
      Attr::integer("world_size", world),
      Attr::integer("ranks_per_node", rpn),
      Attr::integer("nodes", count_nodes()),
      Attr::integer("batch_per_rank", c.shape.batch),
      Attr::integer("global_batch", c.shape.batch * world),
      Attr::integer("enc_seq_len", c.shape.enc_len),
      Attr::integer("dec_seq_len", c.shape.dec_len),
      Attr::str("dtype", precision_name(c.strategy.param_dtype)),
      Attr::str("reduce_dtype", precision_name(c.strategy.reduce_dtype)),
      Attr::num("loss_scale", c.strategy.loss_scale),
      Attr::str("loss_scale_mode", c.strategy.dynamic_loss_scale ? "dynamic" : "static"),
      Attr::integer("loss_scale_growth_interval", c.strategy.loss_scale_growth_interval),
      Attr::str("backend", c.backend),
      Attr::str("comm", c.backend == "cuda" ? comm_library_name(c.comm) : "mpi"),
      Attr::integer("steps", c.steps),
      Attr::integer("warmup", c.warmup),
      Attr::integer("seed", int64_t(c.strategy.seed)),
      Attr::num("lr", c.strategy.adam.lr),
      Attr::num("model_flops_per_step", model_flops_per_step(m, c.shape)),
      Attr::num("hardware_flops_per_step", hardware_flops_per_step(m, c.shape, c.strategy.checkpointing)),
      Attr::str("status", status),
      Attr::str("start_time", iso_time(start)),
      Attr::str("end_time", iso_time(end)),
  };
}

std::vector<Attr> plan_attrs(const RunConfig& cfg, const MemoryPlan& p) {
  std::vector<Attr> a = {Attr::integer("world_size", p.world), Attr::integer("shard_size", p.shard),
                         Attr::integer("peak_total", p.peak_total), Attr::integer("limit", p.limit),
                         Attr::integer("fits", p.fits()), Attr::num("counted_gemm_flops", p.counted_flops)};
  for (int c = 0; c < kMemCategories; ++c) {
    a.push_back(Attr::integer(std::string("peak_") + mem_category_name(MemCategory(c)), p.peak[c]));
    a.push_back(Attr::integer(std::string("at_peak_") + mem_category_name(MemCategory(c)), p.at_peak[c]));
  }
  a.push_back(Attr::str("text", format_plan(cfg, p)));
  return a;
}

int run(const RunConfig& cfg, int rank, int world) {
  const Out out{rank};
  const int plan_world = cfg.plan_world ? cfg.plan_world : world;
  const int shard = shard_group_size(cfg.strategy, plan_world);
  ParallelLayout::make(plan_world, 0, shard);  // validates before any work

  const double start = wall_clock_rank0();
  // --plan writes a result only with --out, and only to record an out-of-memory verdict
  // (so a sweep can skip the point without allocating the ranks).
  const bool writes = !cfg.plan_only || !cfg.out_path.empty();
  const std::string stem = cfg.program + "-" + cfg.strategy.label() + "-" + cfg.model.name + "-w" +
                           std::to_string(plan_world);
  const std::string path = writes ? resolve_output(cfg.out_path, cfg.overwrite, stem, rank) : "";
  // A stopped or stuck rank ends the job after --timeout-s; rank 0 records the run as failed.
  std::string command;
  for (const std::string& a : cfg.argv) command += (command.empty() ? "" : " ") + a;
  const std::vector<Attr> failed = {Attr::str("program", cfg.program), Attr::str("label", cfg.strategy.label()),
                                    Attr::str("model", cfg.model.name), Attr::integer("world_size", world),
                                    Attr::str("command", command), Attr::str("status", "failed"),
                                    Attr::str("start_time", iso_time(start))};
  Watchdog watchdog(cfg.timeout_s, rank, [&](const std::string& line) {
    if (rank != 0 || path.empty()) return;
    std::vector<Attr> attrs = failed;
    attrs.push_back(Attr::str("failure", line));
    write_failure_record(path, attrs);
    std::fprintf(stderr, "shardbench: recorded the run as failed in %s\n", path.c_str());
  });

  // The backend exists before the plan (it allocates nothing) so that the default limit
  // can be the device's free memory; --plan alone needs no device.
  std::unique_ptr<Backend> backend = cfg.plan_only ? nullptr : make_backend(cfg.backend, cfg.comm);
  const int64_t device_free = backend ? backend->memory_capacity() : -1;
  MemoryPlan plan = plan_memory(cfg, plan_world);
  plan.limit = cfg.mem_limit_gib > 0 ? int64_t(cfg.mem_limit_gib * 1024 * 1024 * 1024)
                                     : default_memory_limit(device_free);
  print_config(out, cfg, plan_world, shard);
  if (backend && cfg.backend == "cuda") out("collectives: %s\n", backend->comm_name().c_str());
  if (cfg.plan_only && !cfg.schedule_json.empty() && rank == 0) write_schedule_json(cfg.schedule_json, cfg, plan);
  if (cfg.plan_only && (plan.fits() || path.empty())) {
    out("%s", format_plan(cfg, plan).c_str());
    return plan.fits() ? kExitOk : kExitOutOfMemory;
  }
  TraceData trace;
  trace.host = hostname();
  trace.provenance = collect_provenance(cfg.argv);
  trace.plan = plan_attrs(cfg, plan);
  if (!plan.fits()) {
    out("%s", format_plan(cfg, plan).c_str());
    out("status: out-of-memory: the plan needs %s per rank, the limit is %s (--mem-limit-gib); "
        "nothing was allocated\n",
        human_bytes(double(plan.peak_total)).c_str(), human_bytes(double(plan.limit)).c_str());
    trace.device = backend ? backend->device_name() + " (not allocated)" : "not allocated";
    trace.run = run_attrs(cfg, plan_world, "out-of-memory", start, wall_clock_rank0());
    trace.run.push_back(Attr::integer("planned_only", cfg.plan_only));
    write_trace(path, trace, MPI_COMM_WORLD, cfg.overwrite);
    out("wrote %s (status out-of-memory)\n", path.c_str());
    return kExitOutOfMemory;
  }

  const int64_t rss_start = rss_bytes("VmRSS:");
  trace.device = backend->device_name();
  Mesh mesh = Mesh::split(*backend, MPI_COMM_WORLD, shard);
  MPI_CHECK(MPI_Barrier(MPI_COMM_WORLD));
  TraceRecorder recorder(backend->now());  // a common time origin for every rank's events
  backend->set_recorder(&recorder);
  auto strategy = make_strategy(cfg.strategy, cfg.model, *backend, mesh, cfg.shape);
  std::unique_ptr<StepCheck> check = cfg.check ? std::make_unique<StepCheck>(cfg, *strategy, rank, world) : nullptr;

  const double model_flops = model_flops_per_step(cfg.model, cfg.shape);
  const double hw_flops = hardware_flops_per_step(cfg.model, cfg.shape, cfg.strategy.checkpointing);
  const double global_tokens = double(cfg.shape.batch) * world * cfg.shape.dec_len;
  const double tokens_per_step = double(cfg.shape.batch) * world * (cfg.shape.enc_len + cfg.shape.dec_len);
  std::vector<GlobalStep> timed;
  int first_nonfinite = 0;  // the first step whose global loss was inf or NaN
  int skipped_steps = 0;    // dynamic loss scaling: updates skipped for inf/NaN gradients
  std::vector<double> my_gemm_time, my_gemm_flops;  // this rank's timed steps
  out("%-6s %-10s %12s %12s %14s %13s %12s\n", "step", "loss", "time ms", "TFLOPS/rank", "tokens/s",
      "exposed ms", "peak mem");
  for (int s = 1; s <= cfg.warmup + cfg.steps; ++s) {
    const Tokens tokens = make_tokens(cfg.strategy.seed, s, int64_t(rank) * cfg.shape.batch, cfg.shape,
                                      cfg.model.vocab);
    if (check) check->before_step(s);
    watchdog.progress(s, "barrier before the step");
    MPI_CHECK(MPI_Barrier(MPI_COMM_WORLD));
    watchdog.progress(s, "training step (forward, backward, gradient collectives, optimizer)");
    backend->synchronize();
    recorder.begin_step(s, backend->now());
    const float scale_used = strategy->loss_scale();
    const double loss_sum = strategy->step(s, tokens);
    const bool skipped = strategy->skipped_last_step();  // the same on every rank
    skipped_steps += skipped;
    backend->synchronize();
    const StepStats st = recorder.end_step(backend->now(), backend->mem_peak_total());
    watchdog.progress(s, "reduction of the step's figures across ranks");
    const GlobalStep g = reduce_step(st, loss_sum, global_tokens, world);
    if (!std::isfinite(g.loss) && first_nonfinite == 0) first_nonfinite = s;
    watchdog.progress(s, "--check");
    if (check) check->after_step(s, skipped);  // outside the timed region
    const bool warm = s <= cfg.warmup;
    trace.steps.push_back(StepRow{rank, s, warm, st.time(), st.compute, st.communication, st.exposed_comm,
                                  st.overhead(), st.gemm, st.gemm_flops, model_flops / st.time() / 1e12,
                                  hw_flops / st.time() / 1e12, tokens_per_step / st.time(),
                                  loss_sum / (double(cfg.shape.batch) * cfg.shape.dec_len), st.comm_bytes,
                                  st.peak_memory, backend->device_memory_used(), scale_used, skipped,
                                  st.sent_bytes});
    if (!warm) {
      timed.push_back(g);
      my_gemm_time.push_back(st.gemm);
      my_gemm_flops.push_back(st.gemm_flops);
    }
    out("%-6s %-10.5f %12.2f %12.4f %14.0f %13.2f %12s%s\n",
        (std::to_string(s) + "/" + std::to_string(cfg.warmup + cfg.steps)).c_str(), g.loss, g.time * 1e3,
        model_flops / g.time / 1e12, tokens_per_step / g.time, g.exposed * 1e3,
        human_bytes(double(g.peak)).c_str(), warm ? "  (warm-up)" : "");
    if (skipped)
      out("       inf/NaN gradients at loss scale %g: update skipped, loss scale now %g\n", double(scale_used),
          double(strategy->loss_scale()));
  }

  watchdog.progress(cfg.warmup + cfg.steps, "GEMM replay and the summary's reductions");
  auto med = [&](double GlobalStep::*f) {
    std::vector<double> v;
    for (const auto& g : timed) v.push_back(g.*f);
    return median(v);
  };
  const double t = med(&GlobalStep::time);
  const double gemm_rate = med(&GlobalStep::gemm_flops) / med(&GlobalStep::gemm);
  // Peaks of the training run itself, before the GEMM replay and --check allocate more.
  trace.peak = backend->mem_peak();
  trace.peak_total = backend->mem_peak_total();
  int64_t measured = trace.peak_total, rss = rss_bytes("VmHWM:") - rss_start;
  backend->set_recorder(nullptr);
  const double raw_rate = replay_gemms(*backend, recorder.step_events(cfg.warmup + cfg.steps), cfg.strategy.param_dtype);
  // Each rank compares its own in-step GEMM rate with its own replay; the worst rank counts.
  double rate_min = median(my_gemm_flops) / median(my_gemm_time) / raw_rate;
  MPI_CHECK(MPI_Allreduce(MPI_IN_PLACE, &rate_min, 1, MPI_DOUBLE, MPI_MIN, MPI_COMM_WORLD));
  MPI_CHECK(MPI_Allreduce(MPI_IN_PLACE, &measured, 1, MPI_INT64_T, MPI_MAX, MPI_COMM_WORLD));
  MPI_CHECK(MPI_Allreduce(MPI_IN_PLACE, &rss, 1, MPI_INT64_T, MPI_MAX, MPI_COMM_WORLD));

  out("summary over %d timed steps (medians; times: slowest rank; breakdown: mean over ranks)\n", cfg.steps);
  out("  step time            %.2f ms\n", t * 1e3);
  out("  TFLOPS per rank      %.4f model, %.4f hardware\n", model_flops / t / 1e12, hw_flops / t / 1e12);
  out("  tokens/s             %.0f (enc+dec tokens of the global batch)\n", tokens_per_step / t);
  out("  compute              %.2f ms (GEMM %.2f ms at %.2f GFLOP/s)\n", med(&GlobalStep::compute) * 1e3,
      med(&GlobalStep::gemm) * 1e3, gemm_rate / 1e9);
  out("  communication        %.2f ms issued, %.2f ms exposed (not overlapped)\n",
      med(&GlobalStep::communication) * 1e3, med(&GlobalStep::exposed) * 1e3);
  out("  harness overhead     %.3f ms (%.2f%% of the step)\n", med(&GlobalStep::overhead) * 1e3,
      100 * med(&GlobalStep::overhead) / t);
  // With more ranks than cores the replay (all ranks at once) competes for cores unlike the
  // step (ranks alternate compute and waits): the ratio then says nothing about the harness.
  const int cores = int(std::thread::hardware_concurrency());
  const bool oversubscribed = local_ranks() > cores;
  out("  GEMM rate in step    %.1f%% of the same GEMM shapes replayed outside the step (worst rank)%s\n",
      100 * rate_min, oversubscribed ? "; ranks > cores: not meaningful" : "");
  // The console's warnings, kept with the result so that reports built from it show them.
  const std::string warnings =
      oversubscribed ? std::to_string(local_ranks()) + " ranks on " + std::to_string(cores) +
                           " cores (ranks > cores): ranks share cores; the GEMM rate against its replay is not meaningful"
                     : "";
  out("  peak memory / rank   %s accounted = %.2f%% of the plan (%s); resident-set growth %s = %.1f%%\n",
      human_bytes(double(measured)).c_str(), 100.0 * double(measured) / double(plan.peak_total),
      human_bytes(double(plan.peak_total)).c_str(), human_bytes(double(rss)).c_str(),
      100.0 * double(rss) / double(plan.peak_total));
  out("RESULT program=%s strategy=%s model=%s world=%d batch=%lld seq=%lld dec_seq=%lld step_ms=%.3f "
      "tflops_per_rank=%.5f tokens_per_s=%.1f exposed_ms=%.3f overhead_pct=%.3f peak_bytes=%lld "
      "plan_bytes=%lld loss=%.6f\n",
      cfg.program.c_str(), cfg.strategy.label().c_str(), cfg.model.name.c_str(), world,
      (long long)cfg.shape.batch, (long long)cfg.shape.enc_len, (long long)cfg.shape.dec_len, t * 1e3, model_flops / t / 1e12,
      tokens_per_step / t, med(&GlobalStep::exposed) * 1e3, 100 * med(&GlobalStep::overhead) / t,
      (long long)measured, (long long)plan.peak_total, timed.back().loss);

  // A NaN or inf loss (an fp16 overflow, say) means the steps computed garbage: the timings
  // may look fine, but the run is recorded as failed.
  bool ok = first_nonfinite == 0;
  if (!ok)
    out("error: the loss is not finite from step %d on: the run is recorded as failed (%s gradients overflow "
        "under --loss-scale %g? lower it)\n",
        first_nonfinite, precision_name(cfg.strategy.param_dtype), double(cfg.strategy.loss_scale));
  std::vector<Attr> summary = {
      Attr::integer("first_nonfinite_step", first_nonfinite),
      Attr::integer("skipped_steps", skipped_steps),
      Attr::num("final_loss_scale", strategy->loss_scale()),
      Attr::num("median_step_time_s", t),
      Attr::num("median_model_tflops_per_rank", model_flops / t / 1e12),
      Attr::num("median_hardware_tflops_per_rank", hw_flops / t / 1e12),
      Attr::num("median_tokens_per_s", tokens_per_step / t),
      Attr::num("median_exposed_comm_s", med(&GlobalStep::exposed)),
      Attr::num("gemm_rate_vs_replay", rate_min),
      Attr::integer("max_peak_memory_bytes", measured),
      Attr::integer("plan_peak_memory_bytes", plan.peak_total),
      Attr::integer("rss_growth_bytes", rss),
      Attr::num("final_loss", timed.back().loss),
      Attr::str("warnings", warnings),
  };
  if (cfg.check) {
    double worst = 0;
    ok = check->finish(worst) && ok;
    summary.push_back(Attr::num("check_bound_ratio", worst));
    summary.push_back(Attr::num("check_tolerance", cfg.check_tolerance));
    summary.push_back(Attr::str("check_result", ok ? "pass" : "fail"));
  }
  trace.run = run_attrs(cfg, world, ok ? "ok" : "failed", start, wall_clock_rank0());
  trace.run.insert(trace.run.end(), summary.begin(), summary.end());
  trace.events = &recorder.events();
  trace.memory = &recorder.memory();
  watchdog.progress(cfg.warmup + cfg.steps, "writing the result file");
  const double t_write = MPI_Wtime();
  write_trace(path, trace, MPI_COMM_WORLD, cfg.overwrite);
  struct stat st {};
  stat(path.c_str(), &st);
  out("wrote %s (%s in %.3f s)%s\n", path.c_str(), human_bytes(double(st.st_size)).c_str(),
      MPI_Wtime() - t_write,
      ok ? "" : first_nonfinite ? " (status failed: non-finite loss)" : " (status failed: --check)");
  return ok ? kExitOk : kExitCheckFailed;
}

}  // namespace

int run_program(int argc, char** argv, StrategyKind kind) {
  static StrategyKind program_kind;  // the one piece of state a plain function pointer needs
  program_kind = kind;
  return mpi_main(argc, argv, [](int argc, char** argv, int rank, int world) {
    RunConfig cfg;
    return parse_options(argc, argv, program_kind, cfg) ? run(cfg, rank, world) : int(kExitOk);
  });
}

}  // namespace sb
