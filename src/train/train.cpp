// The timing protocol, written once for every training program. `TrainingRun::run` reads as
// the protocol: layout → result path and watchdog → plan → (--plan or out of memory: report
// and stop) → backend, mesh, strategy → warm-up + timed steps (barrier, step, cross-rank
// reduction, rank-0 line) → summary → optional --check verdict → result file.
#include "shardbench/train/train.h"

#include <sys/stat.h>

#include <algorithm>
#include <cmath>
#include <cstdio>
#include <ctime>
#include <fstream>
#include <memory>
#include <thread>

#include "shardbench/core/check.h"
#include "shardbench/core/format.h"
#include "shardbench/core/nodes.h"
#include "shardbench/model/t5.h"
#include "shardbench/run/environment.h"
#include "shardbench/run/mpi_main.h"
#include "shardbench/run/provenance.h"
#include "shardbench/run/watchdog.h"
#include "shardbench/strategy/pipeline.h"
#include "shardbench/trace/trace.h"
#include "shardbench/train/check_weights.h"
#include "shardbench/train/options.h"
#include "shardbench/train/plan.h"
#include "shardbench/train/plan_batch.h"
#include "shardbench/train/report.h"

namespace sb {
namespace {

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

// One run of ddp_perf or fsdp_perf; each part of the protocol is one method.
class TrainingRun {
 public:
  // `setup`: seen from this rank (rank 0's view where --world-size plans for another world).
  TrainingRun(const RunConfig& cfg, const Setup& setup, int rank, int world)
      : cfg_(cfg), rank_(rank), world_(world), out_{rank}, setup_(setup) {}

  int run() {
    start_ = wall_clock_rank0();
    path_ = result_path();
    // What a record of a failed run holds, gathered (collectively) before the watchdog
    // starts: its thread may not call MPI while the other ranks hang.
    if (!path_.empty()) {
      provenance_ = trace_.provenance = collect_provenance(cfg_.argv);
      failed_attrs_ = run_attrs(cfg_, setup_, "failed", start_, start_);
      char tag[128];  // rank 0's: the name of the run's one failure record's temporary
      std::snprintf(tag, sizeof tag, "%s", temporary_tag(".failed.tmp").c_str());
      MPI_CHECK(MPI_Bcast(tag, sizeof tag, MPI_CHAR, 0, MPI_COMM_WORLD));
      record_tag_ = tag;
    }
    // A stopped or stuck rank ends the job after --timeout-s; rank 0 records the run as failed.
    watchdog_ = std::make_unique<Watchdog>(cfg_.timeout_s, rank_,
                                           [this](const std::string& line) { record_timeout(line); });
    // The backend exists before the plan (it allocates nothing) so that the default limit
    // can be the device's free memory; --plan alone needs no device.
    if (!cfg_.plan_only) backend_ = make_backend(cfg_.backend, cfg_.comm);
    if (backend_) backend_->set_compute_options(cfg_.compute);
    const MemoryPlan plan = make_plan();
    print_config(out_, cfg_, setup_);
    if (backend_ && cfg_.backend == "cuda") out_("collectives: %s\n", backend_->comm_name().c_str());
    if (cfg_.plan_only && !cfg_.schedule_json.empty() && rank_ == 0) write_schedule_json(cfg_.schedule_json, cfg_, setup_, plan);
    if (cfg_.plan_only && (plan.fits() || path_.empty())) {
      out_("%s", format_plan(cfg_, setup_, plan).c_str());
      return plan.fits() ? kExitOk : kExitOutOfMemory;
    }
    trace_.host = hostname();
    trace_.layout = layout_;
    trace_.plan = plan_attrs(cfg_, setup_, plan);
    for (const UnitSpec& u : model_units(cfg_.model)) trace_.unit_names.push_back(u.name);
    if (!plan.fits()) return record_out_of_memory(plan);

    set_up();
    train_steps();
    const Summary summary = summarize(plan);
    print_summary(out_, cfg_, setup_, world_, summary);
    std::vector<Attr> summary_attributes = summary_attrs(summary);
    bool ok = summary.first_nonfinite == 0;
    if (cfg_.check) ok = finish_check(summary_attributes) && ok;
    return write_result(summary_attributes, ok, summary.first_nonfinite);
  }

 private:
  // --plan writes a result only with --out, and only to record an out-of-memory verdict
  // (so a sweep can skip the point without allocating the ranks).
  std::string result_path() const {
    const bool writes = !cfg_.plan_only || !cfg_.out_path.empty();
    const std::string stem = cfg_.program + "-" + setup_.strategy.label() + "-" + cfg_.model.name + "-w" +
                             std::to_string(layout_.world);
    return writes ? resolve_output(cfg_.out_path, cfg_.overwrite, stem, rank_) : "";
  }

  // The watchdog's last act (from its thread): the first rank to get here records the run
  // as failed (rank 0 may be the one that hangs), with the attributes and provenance of a
  // result (so every reader takes it as status failed) and no tables; the others wait for
  // that record before they exit (write_failure_record).
  void record_timeout(const std::string& line) const {
    if (path_.empty()) return;
    std::string command;
    for (const std::string& a : cfg_.argv) command += (command.empty() ? "" : " ") + a;
    std::vector<Attr> attrs = {Attr::integer("schema_version", kSchemaVersion)};
    attrs.insert(attrs.end(), failed_attrs_.begin(), failed_attrs_.end());
    for (Attr& a : attrs)
      if (a.name == "end_time") a.text = iso_time(double(std::time(nullptr)));
    attrs.push_back(Attr::str("command", command));
    attrs.push_back(Attr::str("failure", line));
    if (write_failure_record(path_, record_tag_, attrs, provenance_))
      std::fprintf(stderr, "shardbench: rank %d recorded the run as failed in %s\n", rank_, path_.c_str());
  }

  MemoryPlan make_plan() const {
    const int64_t device_free = backend_ ? backend_->memory_capacity() : -1;
    MemoryPlan plan = plan_memory(setup_);
    const int64_t device_default = default_memory_limit(device_free);  // collective: every rank calls it
    set_plan_limits(plan, cfg_, device_default, default_host_memory_limit());
    return plan;
  }

  // Either side short (device memory against --mem-limit-gib, host memory against
  // --host-mem-limit-gib): the plan printed, the run recorded, exit 3.
  int record_out_of_memory(const MemoryPlan& plan) {
    out_("%s", format_plan(cfg_, setup_, plan).c_str());
    if (!plan.device_fits())
      out_("status: out-of-memory: the plan needs %s per rank, the limit is %s (--mem-limit-gib); "
           "nothing was allocated\n",
           human_bytes(double(plan.peak_total)).c_str(), human_bytes(double(plan.limit)).c_str());
    if (!plan.host_fits())
      out_("status: out-of-memory: the plan needs %s of host memory per rank, the limit is %s "
           "(--host-mem-limit-gib); nothing was allocated\n",
           human_bytes(double(plan.host_peak_total)).c_str(), human_bytes(double(plan.host_limit)).c_str());
    trace_.device = backend_ ? backend_->device_name() + " (not allocated)" : "not allocated";
    trace_.run = run_attrs(cfg_, setup_, "out-of-memory", start_, wall_clock_rank0());
    trace_.run.push_back(Attr::integer("planned_only", cfg_.plan_only));
    write_trace(path_, trace_, MPI_COMM_WORLD, cfg_.overwrite);
    out_("wrote %s (status out-of-memory)\n", path_.c_str());
    return kExitOutOfMemory;
  }

  // The mesh, a common time origin for every rank's events, the strategy and --check.
  void set_up() {
    rss_start_ = rss_bytes("VmRSS:");
    trace_.device = backend_->device_name();
    mesh_ = Mesh::from_world(*backend_, MPI_COMM_WORLD, layout_);
    MPI_CHECK(MPI_Barrier(MPI_COMM_WORLD));
    recorder_ = std::make_unique<TraceRecorder>(backend_->now());
    backend_->set_recorder(recorder_.get());
    Setup setup = setup_;  // the CPU update of offload shares the node's cores with its ranks
    setup.strategy.host_threads = std::max(1, int(std::thread::hardware_concurrency()) / std::max(1, node_map().local_ranks()));
    strategy_ = make_strategy(setup, *backend_, mesh_);
    if (cfg_.check) check_ = std::make_unique<StepCheck>(cfg_, setup_, *strategy_, mesh_);
  }

  // Warm-up and timed steps: each between barriers, its figures reduced across ranks, one
  // line on rank 0, one row per rank in the result.
  void train_steps() {
    const RunConfig& cfg = cfg_;
    const int tp = layout_.tp, dp = layout_.dp();
    const double model_flops = model_flops_per_step(cfg.model, cfg.shape, tp, layout_.pp);  // this rank's share
    const double hw_flops = hardware_flops_per_step(cfg.model, cfg.shape, setup_.strategy.checkpointing, tp, layout_.pp);
    const double global_tokens = double(cfg.shape.batch) * dp * cfg.shape.dec_len;
    const double tokens_per_step = double(cfg.shape.batch) * dp * (cfg.shape.enc_len + cfg.shape.dec_len);
    Backend& backend = *backend_;
    out_("%-6s %-10s %12s %12s %14s %13s %12s\n", "step", "loss", "time ms", "TFLOPS/rank", "tokens/s",
         "exposed ms", "peak mem");
    for (int s = 1; s <= cfg.warmup + cfg.steps; ++s) {
      // The data-parallel rank's slice of the global batch (a tensor-parallel group shares it).
      const Tokens tokens = make_tokens(setup_.strategy.seed, s, int64_t(layout_.dp_rank()) * cfg.shape.batch,
                                        cfg.shape, cfg.model.vocab);
      if (check_) check_->before_step(s);
      watchdog_->progress(s, "barrier before the step");
      MPI_CHECK(MPI_Barrier(MPI_COMM_WORLD));
      watchdog_->progress(s, "training step (forward, backward, gradient collectives, optimizer)");
      backend.synchronize();
      recorder_->begin_step(s, backend.now());
      const float scale_used = strategy_->loss_scale();
      const double loss_sum = strategy_->step(s, tokens);
      const bool skipped = strategy_->skipped_last_step();  // the same on every rank
      skipped_steps_ += skipped;
      backend.synchronize();
      const StepStats st = recorder_->end_step(backend.now(), backend.mem_peak_total());
      watchdog_->progress(s, "reduction of the step's figures across ranks");
      // Every rank of a tensor-parallel group has the group's loss: counted once.
      const GlobalStep g = reduce_step(st, layout_.tp_rank() == 0 ? loss_sum : 0.0, global_tokens, world_);
      if (!std::isfinite(g.loss) && first_nonfinite_ == 0) first_nonfinite_ = s;
      watchdog_->progress(s, "--check");
      if (check_) check_->after_step(s, skipped);  // outside the timed region
      const bool warm = s <= cfg.warmup;
      trace_.steps.push_back(StepRow{rank_, s, warm, st.time(), st.compute, st.communication, st.exposed_comm,
                                     st.overhead(), st.gemm, st.gemm_flops, model_flops / st.time() / 1e12,
                                     hw_flops / st.time() / 1e12, tokens_per_step / st.time(),
                                     loss_sum / (double(cfg.shape.batch) * cfg.shape.dec_len), st.comm_bytes,
                                     st.peak_memory, backend.device_memory_used(), scale_used, skipped,
                                     st.sent_bytes, st.time() - st.compute});
      if (!warm) {
        timed_.push_back(g);
        my_gemm_time_.push_back(st.gemm);
        my_gemm_flops_.push_back(st.gemm_flops);
      }
      out_("%-6s %-10.5f %12.2f %12.4f %14.0f %13.2f %12s%s\n",
           (std::to_string(s) + "/" + std::to_string(cfg.warmup + cfg.steps)).c_str(), g.loss, g.time * 1e3,
           model_flops / g.time / 1e12, tokens_per_step / g.time, g.exposed * 1e3,
           human_bytes(double(g.peak)).c_str(), warm ? "  (warm-up)" : "");
      if (skipped)
        out_("       inf/NaN gradients at loss scale %g: update skipped, loss scale now %g\n", double(scale_used),
             double(strategy_->loss_scale()));
    }
  }

  // Medians of the timed steps, the GEMM replay, and the peaks across ranks.
  Summary summarize(const MemoryPlan& plan) {
    watchdog_->progress(cfg_.warmup + cfg_.steps, "GEMM replay and the summary's reductions");
    auto med = [&](double GlobalStep::*f) {
      std::vector<double> v;
      for (const auto& g : timed_) v.push_back(g.*f);
      return median(v);
    };
    Summary s;
    s.steps = cfg_.steps;
    s.step_time = med(&GlobalStep::time);
    s.model_flops = model_flops_per_step(cfg_.model, cfg_.shape, layout_.tp, layout_.pp);
    s.hardware_flops = hardware_flops_per_step(cfg_.model, cfg_.shape, setup_.strategy.checkpointing, layout_.tp, layout_.pp);
    s.tokens = double(cfg_.shape.batch) * layout_.dp() * (cfg_.shape.enc_len + cfg_.shape.dec_len);
    s.compute = med(&GlobalStep::compute);
    s.gemm = med(&GlobalStep::gemm);
    s.gemm_rate = med(&GlobalStep::gemm_flops) / s.gemm;
    s.communication = med(&GlobalStep::communication);
    s.exposed = med(&GlobalStep::exposed);
    s.overhead = med(&GlobalStep::overhead);
    // Peaks of the training run itself, before the GEMM replay and --check allocate more.
    trace_.peak = backend_->mem_peak();
    trace_.peak_total = backend_->mem_peak_total();
    trace_.host_peak = backend_->host_mem_peak();
    trace_.host_peak_total = backend_->host_mem_peak_total();
    s.peak = trace_.peak_total;
    s.host_peak = trace_.host_peak_total;
    s.rss_growth = rss_bytes("VmHWM:") - rss_start_;
    backend_->set_recorder(nullptr);
    const double raw_rate =
        replay_gemms(*backend_, recorder_->step_events(cfg_.warmup + cfg_.steps), setup_.strategy.param_dtype);
    // Each rank compares its own in-step GEMM rate with its own replay; the worst rank counts.
    s.gemm_vs_replay = median(my_gemm_flops_) / median(my_gemm_time_) / raw_rate;
    MPI_CHECK(MPI_Allreduce(MPI_IN_PLACE, &s.gemm_vs_replay, 1, MPI_DOUBLE, MPI_MIN, MPI_COMM_WORLD));
    MPI_CHECK(MPI_Allreduce(MPI_IN_PLACE, &s.peak, 1, MPI_INT64_T, MPI_MAX, MPI_COMM_WORLD));
    MPI_CHECK(MPI_Allreduce(MPI_IN_PLACE, &s.host_peak, 1, MPI_INT64_T, MPI_MAX, MPI_COMM_WORLD));
    MPI_CHECK(MPI_Allreduce(MPI_IN_PLACE, &s.rss_growth, 1, MPI_INT64_T, MPI_MAX, MPI_COMM_WORLD));
    s.cores = int(std::thread::hardware_concurrency());
    s.ranks_on_node = node_map().local_ranks();
    s.placement = placement_warning(layout_, node_map(), setup_.strategy);
    s.plan_peak = plan.peak_total;
    s.plan_host_peak = plan.host_peak_total;
    s.final_loss = timed_.back().loss;
    s.first_nonfinite = first_nonfinite_;
    s.skipped_steps = skipped_steps_;
    s.final_loss_scale = strategy_->loss_scale();
    std::vector<double> idle;
    for (const GlobalStep& g : timed_) idle.push_back(1 - g.compute / g.time);
    s.idle_share = median(idle);
    s.pp = layout_.pp;
    s.bubble_theory = pipeline_bubble(layout_.pp, setup_.strategy.micro_batches);
    return s;
  }

  // --check's verdict (printed by StepCheck on rank 0) and its attributes.
  bool finish_check(std::vector<Attr>& attrs) {
    double worst = 0;
    const bool ok = check_->finish(worst);
    attrs.push_back(Attr::num("check_bound_ratio", worst));
    attrs.push_back(Attr::num("check_tolerance", cfg_.check_tolerance));
    return ok;
  }

  int write_result(std::vector<Attr> summary, bool ok, int first_nonfinite) {
    if (cfg_.check) summary.push_back(Attr::str("check_result", ok ? "pass" : "fail"));
    trace_.run = run_attrs(cfg_, setup_, ok ? "ok" : "failed", start_, wall_clock_rank0());
    trace_.run.insert(trace_.run.end(), summary.begin(), summary.end());
    trace_.events = &recorder_->events();
    trace_.memory = &recorder_->memory();
    trace_.host_memory = &recorder_->host_memory();
    watchdog_->progress(cfg_.warmup + cfg_.steps, "writing the result file");
    const double t_write = MPI_Wtime();
    write_trace(path_, trace_, MPI_COMM_WORLD, cfg_.overwrite);
    struct stat st {};
    stat(path_.c_str(), &st);
    out_("wrote %s (%s in %.3f s)%s\n", path_.c_str(), human_bytes(double(st.st_size)).c_str(),
         MPI_Wtime() - t_write,
         ok ? "" : first_nonfinite ? " (status failed: non-finite loss)" : " (status failed: --check)");
    return ok ? kExitOk : kExitCheckFailed;
  }

  const RunConfig& cfg_;
  const int rank_, world_;
  const Out out_;
  const Setup setup_;  // made once: the plan, the mesh, the strategy and the result attributes
  const ParallelLayout& layout_ = setup_.layout;
  double start_ = 0;
  std::string path_;             // the result file; "" when --plan writes none
  // A record of a failed run: its root attributes and provenance (before the watchdog,
  // which reads them, so that they outlive it).
  std::vector<Attr> failed_attrs_, provenance_;
  std::string record_tag_;  // rank 0's temporary_tag: names the record's temporary on every rank
  std::unique_ptr<Watchdog> watchdog_;  // outlives everything below it
  std::unique_ptr<Backend> backend_;
  TraceData trace_;
  Mesh mesh_;
  std::unique_ptr<TraceRecorder> recorder_;
  std::unique_ptr<Strategy> strategy_;
  std::unique_ptr<StepCheck> check_;
  int64_t rss_start_ = 0;
  std::vector<GlobalStep> timed_;
  int first_nonfinite_ = 0;  // the first step whose global loss was inf or NaN
  int skipped_steps_ = 0;    // dynamic loss scaling: updates skipped for inf/NaN gradients
  std::vector<double> my_gemm_time_, my_gemm_flops_;  // this rank's timed steps
};

}  // namespace

int run_program(int argc, char** argv, StrategyKind kind) {
  return mpi_main(argc, argv, [kind](int argc, char** argv, int rank, int world) {
    RunConfig cfg;
    if (!parse_options(argc, argv, kind, cfg)) return int(kExitOk);
    if (!cfg.plan_batch.empty()) return run_plan_batch(cfg, kind, rank);
    // --world-size plans for a world this job is not: the setup is then rank 0's view, with no
    // nodes to take hybrid's shard group from (Setup::make refuses hybrid without --shard-size).
    const Setup setup = cfg.plan_world ? Setup::make(cfg.strategy, cfg.model, cfg.shape, cfg.plan_world)
                                       : Setup::make(cfg.strategy, cfg.model, cfg.shape, world, &node_map());
    return TrainingRun(cfg, cfg.plan_world ? setup : setup.at_rank(rank), rank, world).run();
  });
}

}  // namespace sb
