// The memory plan: one step of the configured strategy on the counting backend, for rank 0
// of any world size. The allocations are the code's own, so the plan is exact for
// everything the backend accounts; the ZeRO formula is printed beside it as a cross-check.
#include <fcntl.h>
#include <sys/stat.h>
#include <unistd.h>

#include <algorithm>
#include <charconv>
#include <cmath>
#include <cerrno>
#include <cstdarg>
#include <cstdio>
#include <cstring>
#include <optional>
#include <sstream>

#include "shardbench/core/check.h"
#include "shardbench/core/format.h"
#include "shardbench/model/t5.h"
#include "shardbench/strategy/pipeline.h"
#include "shardbench/train/plan.h"

namespace sb {
namespace {

// What PlanTotals::add reads of an op: two ops alike in these add alike. The shape's ints
// compared one by one (std::equal on them is a memcmp call, a fifth of a plan's time at
// 256 sequences a micro-batch).
bool sums_alike(const OpEvent& a, const OpEvent& b) {
  return a.kind == b.kind && a.lane == b.lane && a.axis == b.axis && a.ranks == b.ranks && a.bytes == b.bytes &&
         a.flops == b.flops && a.gemm[0] == b.gemm[0] && a.gemm[1] == b.gemm[1] && a.gemm[2] == b.gemm[2] &&
         a.gemm[3] == b.gemm[3];
}

// Remembers the per-category bytes at the moment the total was highest, the step's totals
// and its schedule. The plan's fast path: a run of ops alike in a row (unfused attention's
// per-sequence GEMMs, B of each, come as one op with its count: count_runs) is added to the
// totals once, with its length.
class PeakRecorder : public Recorder {
 public:
  void on_op(const OpEvent& e) override {
    if (!recording_) return;
    if (keep_ops) keep(e);
    if (run_ && sums_alike(e, last_)) {
      run_ += e.times;
      return;
    }
    flush();
    last_ = e, run_ = e.times;
  }
  void start() { recording_ = true; }
  void stop() {  // the totals complete
    flush();
    recording_ = false;
  }
  bool keep_ops = true;
  PlanTotals totals;
  std::vector<OpEvent> schedule;
  void on_memory(double, const MemBytes& cur) override {
    int64_t total = 0;
    for (int64_t v : cur) total += v;
    if (total > peak_) peak_ = total, at_peak = cur;
  }
  void on_host_memory(double, const MemBytes& cur) override {
    int64_t total = 0;
    for (int64_t v : cur) total += v;
    if (total > host_peak_) host_peak_ = total, host_at_peak = cur;
  }
  MemBytes at_peak{}, host_at_peak{};

 private:
  void flush() {
    if (run_) totals.add(last_, run_);
    run_ = 0;
  }
  void keep(const OpEvent& e) {  // the schedule holds every op
    if (e.times == 1) return schedule.push_back(e);
    OpEvent one = e;
    one.times = 1;
    schedule.insert(schedule.end(), size_t(e.times), one);
  }
  bool recording_ = false;
  OpEvent last_{};  // the run not yet in the totals: run_ ops alike
  int run_ = 0;
  int64_t peak_ = -1, host_peak_ = -1;
};

}  // namespace

// Integers throughout: a GEMM's FLOPs (2 m n k batch) are one, and a step's sum can pass
// 2^53, where a double would round.
void PlanTotals::add(const OpEvent& e, int times) {
  if (is_offload_lane(e.lane)) {  // the host offload's group; the host's waits for its inputs are no op of its own
    OpSums* s = e.kind == OpKind::Copy ? (e.lane == kCopyH2DLane ? &h2d : &d2h)
                : e.kind == OpKind::Optimizer ? &update : nullptr;
    if (s) s->count += times, s->bytes += e.bytes * times;
    return;
  }
  const int a = e.axis >= 0 && e.axis < kAxes ? e.axis + 1 : 0;
  OpSums& s = ops[int(e.kind)][a];
  s.count += times;
  s.bytes += e.bytes * times;
  if (a) s.sent += bytes_sent(e) * times;
  if (e.kind == OpKind::Gemm) {
    gemm_flops += int64_t(e.flops) * times;
    auto& [n, flops] = gemm_shapes[{e.gemm[0], e.gemm[1], e.gemm[2], e.gemm[3]}];
    n += times;
    flops += int64_t(e.flops) * times;
  } else if (e.kind == OpKind::Elementwise) {
    elementwise_sizes[e.bytes] += times;
  }
}

namespace {

// ops_hint: the schedule's expected length (the previous stage's), reserved up front.
// `setup`: seen from the stage's first rank.
StagePlan plan_stage(const Setup& setup, size_t ops_hint, bool with_ops) {
  StagePlan p;
  auto backend = make_counting_backend();
  PeakRecorder rec;
  rec.keep_ops = with_ops;
  if (with_ops) rec.schedule.reserve(ops_hint);
  backend->set_recorder(&rec);
  Mesh mesh = Mesh::planned(setup.layout);
  {
    auto strategy = make_strategy(setup, *backend, mesh);
    const T5Step& model = strategy->model();
    p.first_piece = model.part().first;
    p.last_piece = model.part().last;
    for (size_t u = 0; u < model.units().size(); ++u)
      if (model.holds_unit(int(u))) p.units.push_back(int(u)), p.params += model.units()[u].numel;
    const double before = counted_gemm_flops(*backend);
    count_runs(*backend, true);
    rec.start();
    strategy->step(1, Tokens{});  // the counting backend needs no tokens: nothing grows with the shapes
    count_runs(*backend, false);  // hands on the run held
    rec.stop();
    p.counted_flops = counted_gemm_flops(*backend) - before;
    p.totals = std::move(rec.totals);
    p.schedule = std::move(rec.schedule);
  }
  SB_ASSERT(backend->mem_total_current() == 0, "the plan's schedule leaked memory");
  SB_ASSERT(backend->host_mem_total_current() == 0, "the plan's schedule leaked host memory");
  p.peak = backend->mem_peak();
  p.peak_total = backend->mem_peak_total();
  p.at_peak = rec.at_peak;
  p.host_peak = backend->host_mem_peak();
  p.host_peak_total = backend->host_mem_peak_total();
  p.host_at_peak = rec.host_at_peak;
  return p;
}

// The worst stages and their figures (every rank's limit is the same).
void pick_worst_stages(MemoryPlan& plan) {
  plan.worst_stage = plan.worst_host_stage = 0;
  for (int s = 0; s < plan.layout.pp; ++s) {
    if (plan.stages[size_t(s)].peak_total > plan.stages[size_t(plan.worst_stage)].peak_total) plan.worst_stage = s;
    if (plan.stages[size_t(s)].host_peak_total > plan.stages[size_t(plan.worst_host_stage)].host_peak_total)
      plan.worst_host_stage = s;
  }
  const StagePlan& worst = plan.stages[size_t(plan.worst_stage)];
  plan.peak = worst.peak;
  plan.at_peak = worst.at_peak;
  plan.peak_total = worst.peak_total;
  const StagePlan& worst_host = plan.stages[size_t(plan.worst_host_stage)];
  plan.host_peak = worst_host.host_peak;
  plan.host_at_peak = worst_host.host_at_peak;
  plan.host_peak_total = worst_host.host_peak_total;
  plan.counted_flops = plan.stages[0].counted_flops;
}

MemoryPlan plan_directly(const Setup& setup, bool with_ops) {
  MemoryPlan plan;
  plan.layout = setup.layout.at_rank(0);
  plan.split = setup.split;
  for (int s = 0; s < plan.layout.pp; ++s)  // the first rank of each stage: the others hold the same
    plan.stages.push_back(plan_stage(setup.at_rank(plan.layout.rank_at({s, 0, 0, 0})),
                                     s ? plan.stages.back().schedule.size() + 64 : 0, with_ops));
  pick_worst_stages(plan);
  return plan;
}

// Every integer of a stage's plan without its ops, visited in the same order in `n` plans:
// f gets the n addresses of one figure. False where the plans' maps differ in their keys
// (a GEMM shape or an elementwise size one of them lacks).
template <size_t n, typename F>
bool each_figure(const std::array<StagePlan*, n>& p, F f) {
  std::array<int64_t*, n> v;
  auto figure = [&](auto get) {
    for (size_t i = 0; i < n; ++i) v[i] = &get(*p[i]);
    f(v);
  };
  for (size_t c = 0; c < size_t(kMemCategories); ++c) {
    figure([c](StagePlan& s) -> int64_t& { return s.peak[c]; });
    figure([c](StagePlan& s) -> int64_t& { return s.at_peak[c]; });
    figure([c](StagePlan& s) -> int64_t& { return s.host_peak[c]; });
    figure([c](StagePlan& s) -> int64_t& { return s.host_at_peak[c]; });
  }
  figure([](StagePlan& s) -> int64_t& { return s.peak_total; });
  figure([](StagePlan& s) -> int64_t& { return s.host_peak_total; });
  std::array<std::vector<int64_t*>, n> sums;  // the totals' sums, each plan's in PlanTotals::each_sum's order
  for (size_t i = 0; i < n; ++i) p[i]->totals.each_sum([&](int64_t& x) { sums[i].push_back(&x); });
  for (size_t j = 0; j < sums[0].size(); ++j) {
    for (size_t i = 0; i < n; ++i) v[i] = sums[i][j];
    f(v);
  }
  auto same_keys = [](const auto& x, const auto& y) {
    return x.size() == y.size() && std::equal(x.begin(), x.end(), y.begin(),
                                              [](const auto& l, const auto& r) { return l.first == r.first; });
  };
  for (size_t i = 1; i < n; ++i)
    if (!same_keys(p[i]->totals.gemm_shapes, p[0]->totals.gemm_shapes) ||
        !same_keys(p[i]->totals.elementwise_sizes, p[0]->totals.elementwise_sizes))
      return false;
  std::array<decltype(p[0]->totals.gemm_shapes.begin()), n> g;
  for (size_t i = 0; i < n; ++i) g[i] = p[i]->totals.gemm_shapes.begin();
  for (size_t j = 0; j < p[0]->totals.gemm_shapes.size(); ++j) {
    for (size_t i = 0; i < n; ++i) v[i] = &g[i]->second.first;
    f(v);
    for (size_t i = 0; i < n; ++i) v[i] = &(g[i]++)->second.second;
    f(v);
  }
  std::array<decltype(p[0]->totals.elementwise_sizes.begin()), n> e;
  for (size_t i = 0; i < n; ++i) e[i] = p[i]->totals.elementwise_sizes.begin();
  for (size_t j = 0; j < p[0]->totals.elementwise_sizes.size(); ++j) {
    for (size_t i = 0; i < n; ++i) v[i] = &(e[i]++)->second;
    f(v);
  }
  return true;
}

// A pipeline's plan without its ops, at M micro-batches, from its plans at m0, m0 + 1 and
// m0 + 2 micro-batches of the same size: m0 = S + 2 under 1F1B (S stages; every stage then
// runs a forward-backward pair past its first and before its last), 4 under GPipe (a
// micro-batch besides the first and the last). Each figure (peaks per category, op counts
// and bytes, FLOPs) is then a + (M - m0) (b - a); the three plans must agree on that line
// (c - b = b - a for every figure), else the plan is made directly. Why a line:
// - 1F1B: past its warm-up (S - 1 - s forwards on stage s) a stage runs the same
//   forward-backward pair for every further micro-batch with the same micro-batches in
//   flight, so a pair adds the same ops, and what grows with M is only what each micro-batch
//   holds for the whole step (its tokens): every moment's memory grows alike.
// - GPipe: all forwards, then all backwards. A moment's memory grows by the tokens, plus
//   one micro-batch's saved activations where the micro-batches in flight grow with M (the
//   end of the forwards, the first backwards). The peak is the larger of two lines, so the
//   extension holds only when the peak already sits on the steeper one: its activations
//   grow from plan to plan, on every stage; else the plan is made directly.
// tests/test_plan_batch.py compares both with the direct plan. Empty when it does not apply
// (no pipeline, or three plans would cost more than the direct one).
std::optional<MemoryPlan> plan_by_micro_batch_line(const Setup& setup) {
  const bool gpipe = setup.strategy.pp_schedule == PipeSchedule::GPipe;
  const int S = setup.layout.pp, M = setup.strategy.micro_batches, m0 = gpipe ? 4 : S + 2;
  if (S < 2 || M <= 3 * m0 + 3) return std::nullopt;
  const int64_t size = setup.shape.batch / M;  // sequences per micro-batch (the batch divides: parse_options)
  std::array<MemoryPlan, 3> at;
  for (int i = 0; i < 3; ++i) {
    Setup s = setup;  // the same split of the stages: setup.split is kept
    s.strategy.micro_batches = m0 + i;
    s.shape.batch = size * (m0 + i);
    at[size_t(i)] = plan_directly(s, false);
  }
  MemoryPlan plan = std::move(at[0]);
  constexpr size_t kAct = size_t(MemCategory::Activations);
  for (size_t s = 0; s < plan.stages.size(); ++s) {
    if (gpipe && at[1].stages[s].at_peak[kAct] <= plan.stages[s].at_peak[kAct])
      return std::nullopt;  // the peak on the flatter line: the steeper one may pass it at M
    StagePlan out = plan.stages[s];
    bool on_line = true;
    const bool same_shapes = each_figure<4>({&plan.stages[s], &at[1].stages[s], &at[2].stages[s], &out},
                                            [&](const std::array<int64_t*, 4>& v) {
      const int64_t step = *v[1] - *v[0];
      if (*v[2] - *v[1] != step) on_line = false;
      *v[3] = *v[0] + int64_t(M - m0) * step;
    });
    if (!same_shapes || !on_line) return std::nullopt;
    out.counted_flops = double(out.totals.gemm_flops);
    plan.stages[s] = std::move(out);
  }
  pick_worst_stages(plan);
  plan.line_micro_batches = {m0, m0 + 1, m0 + 2};
  return plan;
}
}  // namespace

MemoryPlan plan_memory(const Setup& setup, bool with_ops) {
  if (!with_ops)
    if (std::optional<MemoryPlan> plan = plan_by_micro_batch_line(setup)) return std::move(*plan);
  return plan_directly(setup, with_ops);
}

void set_plan_limits(MemoryPlan& plan, const RunConfig& cfg, int64_t default_limit, int64_t default_host_limit) {
  plan.limit = cfg.mem_limit_gib > 0 ? int64_t(cfg.mem_limit_gib * 1024 * 1024 * 1024) : default_limit;
  plan.host_limit = cfg.host_mem_limit_gib > 0 ? int64_t(cfg.host_mem_limit_gib * 1024 * 1024 * 1024) : default_host_limit;
}

std::string format_plan(const RunConfig& cfg, const Setup& setup, const MemoryPlan& plan) {
  const double psi = double(plan.stages[size_t(plan.worst_stage)].params);  // what a rank of that stage holds
  const int n = plan.layout.shard;  // ZeRO's data-parallel degree for the sharded states
  // Model states per parameter: 4 bytes of fp32 master parameters and the optimizer's state
  // (ZeRO's K = 4 + its bytes per parameter: adamw 8, sgd 4, adamw-8bit 2 + 8 per block of
  // 256), sharded n ways; gradients in the reduce dtype (sharded), and under DDP in the param
  // dtype plus a reduce-dtype copy when they differ; without sharding a param-dtype copy
  // of the parameters when that is not fp32.
  const StrategyConfig& sc = setup.strategy;
  const double pb = dtype_size(sc.param_dtype), rb = dtype_size(sc.reduce_dtype);
  // ZeRO-1 (optimizer-state): the whole parameters and gradients in the param dtype, the
  // master shard apart only when that is not fp32, and the reduced gradient shard.
  const bool zero1 = sc.kind == StrategyKind::FSDP && sc.sharding == Sharding::OptimizerState;
  const double params = zero1 ? pb * psi + (sc.param_dtype != DType::F32 ? 4 * psi / n : 0)
                              : 4 * psi / n + (n == 1 && sc.param_dtype != DType::F32 ? pb * psi : 0);
  const double grads = sc.kind == StrategyKind::DDP ? pb * psi + (rb != pb ? rb * psi : 0)
                       : zero1                      ? pb * psi + rb * psi / n
                                                    : rb * psi / n;
  const double state = double(optimizer_state_bytes(sc.optimizer, int64_t(psi))) / n;
  // CPU offload: the master shard (and its param-dtype rounding), the optimizer state and a
  // copy of the reduced gradient shard on the host; the device keeps the gradient shard and,
  // under optimizer, the param-dtype shard (ZeRO-1: the whole parameters).
  const bool offload = sc.cpu_offload != CpuOffload::None;
  const double device_params = sc.cpu_offload == CpuOffload::Params ? 0 : zero1 ? pb * psi : pb * psi / n;
  const double zero[kMemCategories] = {offload ? device_params : params, grads, offload ? 0 : state, -1, -1, -1};
  const double host_zero[kMemCategories] = {(4 + (sc.param_dtype != DType::F32 ? pb : 0)) * psi / n, rb * psi / n,
                                            state, -1, -1, -1};
  std::ostringstream o;
  char line[256];
  std::snprintf(line, sizeof line,
                "memory plan, per rank: %s, %s, world %d, shard group %d, dtype %s, reduce %s, optimizer %s (fp32 master)%s\n",
                cfg.model.name.c_str(), sc.label().c_str(), plan.layout.world, plan.layout.shard, precision_name(sc.param_dtype),
                precision_name(sc.reduce_dtype), optimizer_name(sc.optimizer.kind),
                offload ? (std::string(", CPU offload ") + cpu_offload_name(sc.cpu_offload)).c_str() : "");
  o << line;
  std::snprintf(line, sizeof line, "  %-16s %14s %15s %16s\n", "category", "peak", "at total peak",
                "ZeRO formula");
  o << line;
  for (int c = 0; c < kMemCategories; ++c) {
    std::snprintf(line, sizeof line, "  %-16s %14s %15s %16s\n", mem_category_name(MemCategory(c)),
                  human_bytes(double(plan.peak[c])).c_str(), human_bytes(double(plan.at_peak[c])).c_str(),
                  zero[c] >= 0 ? human_bytes(zero[c]).c_str() : "-");
    o << line;
  }
  std::snprintf(line, sizeof line, "  %-16s %14s %15s\n", "total peak", human_bytes(double(plan.peak_total)).c_str(),
                "");
  o << line;
  std::snprintf(line, sizeof line, "  %-16s %14s  -> %s\n", "limit", human_bytes(double(plan.limit)).c_str(),
                plan.device_fits() ? "fits"
                                   : ("DOES NOT FIT: short by " + human_bytes(double(plan.peak_total - plan.limit)))
                                         .c_str());
  o << line;
  // The second block: host memory (CPU offload's alloc_host), against its own limit.
  const std::string host_verdict =
      plan.host_fits() ? "fits" : "DOES NOT FIT: short by " + human_bytes(double(plan.host_peak_total - plan.host_limit));
  if (plan.host_peak_total == 0) {
    std::snprintf(line, sizeof line, "host memory (CPU offload), per rank: none; limit %s (--host-mem-limit-gib)\n",
                  human_bytes(double(plan.host_limit)).c_str());
    o << line;
  } else {
    std::snprintf(line, sizeof line, "host memory (CPU offload), per rank%s\n",
                  plan.stages.size() > 1 ? (": stage " + std::to_string(plan.worst_host_stage)).c_str() : "");
    o << line;
    std::snprintf(line, sizeof line, "  %-16s %14s %15s %16s\n", "category", "peak", "at total peak", "ZeRO formula");
    o << line;
    for (int c = 0; c < kMemCategories; ++c) {
      std::snprintf(line, sizeof line, "  %-16s %14s %15s %16s\n", mem_category_name(MemCategory(c)),
                    human_bytes(double(plan.host_peak[c])).c_str(), human_bytes(double(plan.host_at_peak[c])).c_str(),
                    offload && host_zero[c] >= 0 ? human_bytes(host_zero[c]).c_str() : "-");
      o << line;
    }
    std::snprintf(line, sizeof line, "  %-16s %14s\n", "total peak", human_bytes(double(plan.host_peak_total)).c_str());
    o << line;
    std::snprintf(line, sizeof line, "  %-16s %14s  -> %s\n", "host limit", human_bytes(double(plan.host_limit)).c_str(),
                  host_verdict.c_str());
    o << line;
  }
  const double model = model_flops_per_step(cfg.model, cfg.shape, plan.layout.tp, plan.layout.pp);
  const double hw = hardware_flops_per_step(cfg.model, cfg.shape, setup.strategy.checkpointing, plan.layout.tp, plan.layout.pp);
  double issued = 0;  // the stages' average, as the model's figures (one stage without --pp)
  for (const StagePlan& st : plan.stages) issued += st.counted_flops / double(plan.stages.size());
  std::snprintf(line, sizeof line,
                "FLOPs per rank per step: model %.4g (3 x forward), hardware %.4g, issued by the schedule %.4g\n",
                model, hw, issued);
  o << line;
  if (plan.stages.size() > 1) {
    const std::vector<Piece> pieces = model_pieces(cfg.model);
    std::snprintf(line, sizeof line, "pipeline: %d stages, %d micro-batches, %s (the peak above: stage %d)\n",
                  int(plan.stages.size()), sc.micro_batches, pipe_schedule_name(sc.pp_schedule), plan.worst_stage);
    o << line;
    for (size_t s = 0; s < plan.stages.size(); ++s) {
      const StagePlan& st = plan.stages[s];
      std::snprintf(line, sizeof line, "  stage %zu: %s .. %s, %s parameters, peak %s, GEMM FLOPs %.4g\n", s,
                    piece_name(pieces[size_t(st.first_piece)]).c_str(), piece_name(pieces[size_t(st.last_piece - 1)]).c_str(),
                    with_commas(st.params).c_str(), human_bytes(double(st.peak_total)).c_str(), st.counted_flops);
      o << line;
    }
    // Each stage holds what its pieces use; only the embedding may be on several (tied copies).
    const std::vector<int> holders = stages_holding(pieces, plan.split, pieces[0].unit);
    std::string stages;
    for (int s : holders) stages += (stages.empty() ? "" : ", ") + std::to_string(s);
    const int64_t embedding = model_units(cfg.model, {plan.layout.tp, 0})[size_t(pieces[0].unit)].numel;
    std::snprintf(line, sizeof line, "  the embedding (%s parameters) on stage%s %s%s\n", with_commas(embedding).c_str(),
                  holders.size() > 1 ? "s" : "", stages.c_str(),
                  holders.size() > 1 ? ": a copy on each, its gradient summed over them" : " alone");
    o << line;
    // The head unit (the decoder's final norm and, untied, lm_head) on the last stage only.
    const UnitSpec head = model_units(cfg.model, {plan.layout.tp, 0})[size_t(pieces.back().unit)];
    std::string tensors;
    for (const TensorSpec& t : head.tensors) tensors += (tensors.empty() ? "" : ", ") + t.name;
    const int head_stage = stages_holding(pieces, plan.split, pieces.back().unit).front();
    std::snprintf(line, sizeof line, "  the head (%s: %s parameters) on stage %d alone%s\n", tensors.c_str(),
                  with_commas(head.numel).c_str(), head_stage,
                  cfg.model.tie_embeddings ? ", its LM head the embedding" : "");
    o << line;
  }
  return o.str();
}

namespace {

// printf onto the end of a string.
__attribute__((format(printf, 2, 3))) void appendf(std::string& out, const char* format, ...) {
  char small[512];
  va_list args, again;
  va_start(args, format);
  va_copy(again, args);
  const int n = std::vsnprintf(small, sizeof small, format, args);
  va_end(args);
  if (n < int(sizeof small)) {
    out.append(small, size_t(std::max(n, 0)));
  } else {
    const size_t at = out.size();
    out.resize(at + size_t(n) + 1);
    std::vsnprintf(&out[at], size_t(n) + 1, format, again);
    out.resize(at + size_t(n));
  }
  va_end(again);
}

// A separator and an integer, as "%s%lld" would write them (lists of hundreds of ranks).
void append_integer(std::string& out, int64_t v, const char* separator) {
  out += separator;
  char digits[24];
  const auto end = std::to_chars(digits, digits + sizeof digits, v).ptr;
  out.append(digits, size_t(end - digits));
}

// A separator and a number as "%s%.17g" writes it: an integral value below 1e17 is its
// digits there (17 significant digits, no exponent), which to_chars writes faster.
void append_real(std::string& out, double v, const char* separator) {
  if (v == std::floor(v) && std::fabs(v) < 1e17 && !(v == 0 && std::signbit(v))) {
    append_integer(out, int64_t(v), separator);
  } else {
    appendf(out, "%s%.17g", separator, v);
  }
}

// "totals": per stage (one without --pp), the device lanes' ops of one step summed by kind
// and mesh axis (count, bytes; sent_bytes where the op has an axis: collectives, sends,
// receives), the GEMM FLOPs, the compute lane's distinct GEMM shapes ([m, n, k, batch,
// count, FLOPs]) and elementwise sizes ([bytes, count]), so an estimate need not read the
// ops; under CPU offload "host": the bytes and counts of the ops on the offload lanes
// (uploads, downloads, the CPU update), which "ops" leaves out. One line.
void append_totals(std::string& f, const MemoryPlan& p) {
  appendf(f, "  \"totals\": [");
  for (size_t s = 0; s < p.stages.size(); ++s) {
    const PlanTotals& t = p.stages[s].totals;
    appendf(f, "%s{\"gemm_flops\": %lld, ", s ? ", " : "", (long long)t.gemm_flops);
    if (t.h2d.count || t.d2h.count || t.update.count)  // the offload lanes (101, 102, 100)
      appendf(f, "\"host\": {\"h2d_bytes\": %lld, \"d2h_bytes\": %lld, \"update_bytes\": %lld, \"copy_count\": %lld, "
              "\"update_count\": %lld}, ", (long long)t.h2d.bytes, (long long)t.d2h.bytes, (long long)t.update.bytes,
              (long long)(t.h2d.count + t.d2h.count), (long long)t.update.count);
    appendf(f, "\"gemm_shapes\": [");
    bool first = true;
    for (const auto& [shape, v] : t.gemm_shapes) {
      appendf(f, "%s[%d, %d, %d, %d, %lld, %lld]", first ? "" : ", ", shape[0], shape[1], shape[2], shape[3],
              (long long)v.first, (long long)v.second);
      first = false;
    }
    appendf(f, "], \"elementwise_sizes\": [");
    first = true;
    for (const auto& [size, n] : t.elementwise_sizes) {
      appendf(f, "%s[%lld, %lld]", first ? "" : ", ", (long long)size, (long long)n);
      first = false;
    }
    appendf(f, "], \"ops\": {");
    bool first_kind = true;
    for (int k = 0; k < PlanTotals::kKinds; ++k) {
      bool first_axis = true;
      for (int a = 0; a < PlanTotals::kSlots; ++a) {
        const OpSums& o = t.ops[k][a];
        if (!o.count) continue;
        if (first_axis) appendf(f, "%s\"%s\": {", first_kind ? "" : ", ", op_kind_name(OpKind(k)));
        appendf(f, "%s\"%s\": {\"count\": %lld, \"bytes\": %lld", first_axis ? "" : ", ",
                a ? axis_name(Axis(a - 1)) : "none", (long long)o.count, (long long)o.bytes);
        first_kind = first_axis = false;
        if (a) appendf(f, ", \"sent_bytes\": %lld", (long long)o.sent);
        appendf(f, "}");
      }
      if (!first_axis) appendf(f, "}");
    }
    appendf(f, "}}");
  }
  appendf(f, "],\n");
}

void append_schedule_json(std::string& f, const RunConfig& cfg, const Setup& setup, const MemoryPlan& p, bool with_ops) {
  const ModelSpec& m = cfg.model;
  appendf(f, "{\n  \"schema\": \"shardbench-schedule-2\",\n");
  appendf(f, "  \"program\": \"%s\", \"label\": \"%s\", \"model\": \"%s\",\n", cfg.program.c_str(),
               setup.strategy.label().c_str(), m.name.c_str());
  appendf(f, "  \"d_model\": %lld, \"d_ff\": %lld, \"layers\": %lld, \"heads\": %lld, \"d_kv\": %lld, "
               "\"vocab\": %lld, \"ffn\": \"%s\", \"tie_embeddings\": %d,\n",
               (long long)m.d_model, (long long)m.d_ff, (long long)m.layers, (long long)m.heads, (long long)m.d_kv,
               (long long)m.vocab, ffn_kind_name(m.ffn), int(m.tie_embeddings));
  appendf(f, "  \"world_size\": %d, \"shard_size\": %d, \"batch_per_rank\": %lld, \"enc_seq_len\": %lld, "
               "\"dec_seq_len\": %lld, \"activation_checkpointing\": %d, \"grad_accumulation\": \"%s\",\n",
               p.layout.world, p.layout.shard, (long long)cfg.shape.batch, (long long)cfg.shape.enc_len,
               (long long)cfg.shape.dec_len, int(setup.strategy.checkpointing),
               setup.strategy.reduces_every_micro_batch() ? "sharded" : "unsharded");
  // The mesh as rank 0 sees it: each axis's size and the ranks of rank 0's group along it
  // (the rank order is the programs' own), so readers need not re-derive groups.
  appendf(f, "  \"tp_size\": %d, \"dp_size\": %d, \"pp_size\": %d, \"replicas\": %d,\n  \"axes\": {",
               p.layout.tp, p.layout.dp(), p.layout.pp, p.layout.replicate);
  for (int a = 0; a < kAxes; ++a) {
    appendf(f, "%s\"%s\": {\"size\": %d, \"ranks\": [", a ? ", " : "", axis_name(Axis(a)), p.layout.size(Axis(a)));
    const std::vector<int> ranks = p.layout.group(Axis(a));
    for (size_t i = 0; i < ranks.size(); ++i) append_integer(f, ranks[i], i ? ", " : "");
    appendf(f, "]}");
  }
  appendf(f, "},\n");
  appendf(f, "  \"dtype\": \"%s\", \"reduce_dtype\": \"%s\", \"optimizer\": \"%s\", \"cpu_offload\": \"%s\",\n",
               precision_name(setup.strategy.param_dtype), precision_name(setup.strategy.reduce_dtype),
               optimizer_name(setup.strategy.optimizer.kind), cpu_offload_name(setup.strategy.cpu_offload));
  appendf(f, "  \"param_count\": %lld, \"model_flops_per_step\": %.17g, \"hardware_flops_per_step\": %.17g,\n",
               (long long)param_count(m), model_flops_per_step(m, cfg.shape, p.layout.tp, p.layout.pp),
               hardware_flops_per_step(m, cfg.shape, setup.strategy.checkpointing, p.layout.tp, p.layout.pp));
  // The units (the ops' "unit" codes): names and parameters (a tensor-parallel rank's part).
  const std::vector<UnitSpec> units = model_units(m, {p.layout.tp, 0});
  appendf(f, "  \"unit_names\": [");
  for (size_t u = 0; u < units.size(); ++u) appendf(f, "%s\"%s\"", u ? ", " : "", units[u].name.c_str());
  appendf(f, "],\n  \"unit_params\": [");
  for (size_t u = 0; u < units.size(); ++u) append_integer(f, units[u].numel, u ? ", " : "");
  appendf(f, "],\n");
  appendf(f, "  \"memory\": {\"peak_total\": %lld, \"limit\": %lld, \"fits\": %s",
               (long long)p.peak_total, (long long)p.limit, p.fits() ? "true" : "false");
  for (int c = 0; c < kMemCategories; ++c)
    appendf(f, ", \"%s\": %lld", mem_category_name(MemCategory(c)), (long long)p.peak[c]);
  appendf(f, ", \"host_peak_total\": %lld, \"host_limit\": %lld, \"host_fits\": %s", (long long)p.host_peak_total,
               (long long)p.host_limit, p.host_fits() ? "true" : "false");
  for (int c = 0; c < kMemCategories; ++c)
    appendf(f, ", \"host_%s\": %lld", mem_category_name(MemCategory(c)), (long long)p.host_peak[c]);
  appendf(f, "},\n  \"op_names\": [");
  for (int k = 0; k < int(OpKind::kCount); ++k) appendf(f, "%s\"%s\"", k ? ", " : "", op_kind_name(OpKind(k)));
  appendf(f, "],\n  \"phase_names\": [");
  for (int k = 0; k < int(Phase::kCount); ++k) appendf(f, "%s\"%s\"", k ? ", " : "", phase_name(Phase(k)));
  appendf(f, "],\n  \"axis_names\": [");
  for (int a = 0; a < kAxes; ++a) appendf(f, "%s\"%s\"", a ? ", " : "", axis_name(Axis(a)));
  // One op per row: [op, phase, unit, bytes, flops, request, m, n, k, batch, axis, ranks,
  // sent_bytes, peer, lane, after] (the GEMM shape costs a GEMM by its shape class in the projection;
  // zeros for other ops; a collective's axis (-1 for none), ranks, the bytes the rank sends
  // in it, and a send's or receive's peer as a world rank; the lane, 0 compute, 1 the
  // collectives, 100 the host (CPU offload's update and its waits), 101 and 102 the host
  // copies by direction; the request a collective or copy is ordered after, -1 for none).
  // Readers index the columns by name. "ops" is the first rank's step;
  // under pipeline parallelism "stages" holds every stage's first rank's step.
  appendf(f, "],\n");
  append_totals(f, p);
  appendf(f, "  \"columns\": [\"op\", \"phase\", \"unit\", \"bytes\", \"flops\", \"request\", \"m\", \"n\", "
             "\"k\", \"batch\", \"axis\", \"ranks\", \"sent_bytes\", \"peer\", \"lane\", \"after\"]");
  auto ops = [&](const StagePlan& st, int stage, const char* indent) {
    const ParallelLayout me = p.layout.at_rank(p.layout.rank_at({stage, 0, 0, 0}));
    for (size_t i = 0; i < st.schedule.size(); ++i) {
      const OpEvent& e = st.schedule[i];
      const int peer = e.peer >= 0 && e.axis >= 0 ? me.group(Axis(e.axis))[size_t(e.peer)] : -1;
      // The row as "%s[%d, %d, %d, %lld, %.17g, %lld, %d, %d, %d, %d, %d, %d, %lld, %d, %d, %lld]%s\n"
      // writes it, without printf (a pipeline's schedule has tens of thousands of rows).
      f += indent;
      f += '[';
      append_integer(f, int64_t(e.kind), "");
      for (const int64_t v : {int64_t(e.phase), int64_t(e.unit), e.bytes}) append_integer(f, v, ", ");
      append_real(f, e.flops, ", ");
      for (const int64_t v : {e.request, int64_t(e.gemm[0]), int64_t(e.gemm[1]), int64_t(e.gemm[2]), int64_t(e.gemm[3]),
                              int64_t(e.axis), int64_t(e.ranks), bytes_sent(e), int64_t(peer), int64_t(e.lane), e.after})
        append_integer(f, v, ", ");
      f += i + 1 < st.schedule.size() ? "],\n" : "]\n";
    }
  };
  if (with_ops) {
    appendf(f, ",\n  \"ops\": [\n");
    ops(p.stages[0], 0, "    ");
    appendf(f, "  ]");
  }
  if (p.stages.size() > 1) {
    appendf(f, ",\n  \"micro_batches\": %d, \"pp_schedule\": \"%s\", \"pipeline_bubble_theory\": %.17g,\n",
            setup.strategy.micro_batches, pipe_schedule_name(setup.strategy.pp_schedule),
            pipeline_bubble(int(p.stages.size()), setup.strategy.micro_batches));
    if (!p.line_micro_batches.empty())  // planned from fewer micro-batches (plan_by_micro_batch_line)
      appendf(f, "  \"planned_from_micro_batches\": [%d, %d, %d],\n", p.line_micro_batches[0], p.line_micro_batches[1],
              p.line_micro_batches[2]);
    appendf(f, "  \"stages\": [\n");
    for (size_t s = 0; s < p.stages.size(); ++s) {
      const StagePlan& st = p.stages[s];
      // first_piece / last_piece: the stage's pieces [first, last).
      appendf(f, "    {\"first_piece\": %d, \"last_piece\": %d, \"rank\": %d, \"peak_total\": %lld, "
                   "\"params\": %lld, \"units\": [", st.first_piece, st.last_piece,
                   p.layout.rank_at({int(s), 0, 0, 0}), (long long)st.peak_total, (long long)st.params);
      for (size_t i = 0; i < st.units.size(); ++i) append_integer(f, st.units[i], i ? ", " : "");
      if (with_ops) {
        appendf(f, "], \"ops\": [\n");
        ops(st, int(s), "      ");
        appendf(f, "    ]}%s\n", s + 1 < p.stages.size() ? "," : "");
      } else {
        appendf(f, "]}%s\n", s + 1 < p.stages.size() ? "," : "");
      }
    }
    appendf(f, "  ]");
  }
  appendf(f, "\n}\n");
}

}  // namespace

std::string schedule_json(const RunConfig& cfg, const Setup& setup, const MemoryPlan& plan, bool with_ops) {
  std::string out;
  append_schedule_json(out, cfg, setup, plan, with_ops);
  return out;
}

// As the results: under a temporary of this process in the same folder, published whole
// (publish_temporary) or not at all; an existing file is replaced only with --overwrite.
void write_schedule_json(const std::string& path, const RunConfig& cfg, const Setup& setup, const MemoryPlan& plan) {
  const std::string name = "--schedule-json '" + path + "'";
  struct stat st;
  if (stat(path.c_str(), &st) == 0 && S_ISDIR(st.st_mode)) throw UsageError(name + " is a directory (must name a file)");
  if (stat(path.c_str(), &st) == 0 && !cfg.overwrite)
    throw UsageError(name + " exists (pass --overwrite to replace it, or choose another name)");
  const std::string text = schedule_json(cfg, setup, plan, true), tmp = path + temporary_tag(".tmp");
  register_temporary(tmp, int64_t(text.size()));
  const int fd = create_locked_temporary(tmp);  // its lock held until published, as a result's
  if (fd < 0) {
    const int err = errno;
    forget_temporary(tmp);
    throw UsageError(name + " cannot be written: " + std::strerror(err));
  }
  int err = 0;
  for (size_t done = 0; done < text.size() && !err;) {
    const ssize_t n = write(fd, text.data() + done, text.size() - done);
    if (n > 0) done += size_t(n);
    else if (errno != EINTR) err = errno;
  }
  if (!err && fsync(fd) != 0) err = errno;  // on stable storage before it gets the final name
  const std::string cause = err ? disk_space_cause() : "";  // reads errno: the failed call's
  if (!err) err = publish_temporary(tmp, path, cfg.overwrite);
  const size_t slash = path.find_last_of('/');
  if (!err) sync_path(slash == std::string::npos ? "." : path.substr(0, slash + 1), O_RDONLY | O_DIRECTORY);
  if (err) unlink(tmp.c_str());
  close(fd);
  forget_temporary(tmp);
  if (err == EEXIST)
    throw RunFailure(name + " was written by another run while this one ran: this plan's is not written (pass "
                     "--overwrite to replace it, or choose another name)");
  if (err) throw RunFailure(name + " cannot be written: " + (cause.empty() ? std::strerror(err) : cause) + "; nothing was written");
}

}  // namespace sb
