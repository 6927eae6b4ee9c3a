// Counting backend: the memory plan's engine. It runs the real schedule of a strategy but
// allocates nothing and computes nothing: it hands out addresses that point nowhere,
// accounts every allocation by category, and sums GEMM FLOPs. So the plan predicts exactly
// what the code path allocates, for any model and world size, without the memory.
#include <algorithm>
#include <cstring>
#include <utility>

#include "shardbench/backend/backend.h"
#include "shardbench/core/check.h"

namespace sb {
namespace {

class NullComm : public Comm {
 public:
  NullComm(int size, int rank) : size_(size), rank_(rank) {}
  int size() const override { return size_; }
  int rank() const override { return rank_; }

 private:
  int size_, rank_;
};

class CountingBackend final : public Backend {
 public:
  std::string name() const override { return "counting"; }
  std::string device_name() const override { return "none"; }

  void* alloc(size_t bytes, MemCategory cat) override {
    hand_on_run();  // the memory changes after the ops before them
    // Distinct, aligned, never dereferenced.
    const uintptr_t p = next_;
    next_ += (std::max<size_t>(bytes, 1) + 63) / 64 * 64;
    track(reinterpret_cast<void*>(p), bytes, cat);
    return reinterpret_cast<void*>(p);
  }
  void release(void* p) override {
    hand_on_run();
    if (p) untrack(p);
  }
  void release_after(void* p, Request) override { release(p); }
  // Host memory: accounted in the host ledger, from the same address space (never dereferenced).
  void* alloc_host(size_t bytes, MemCategory cat) override {
    hand_on_run();
    const uintptr_t p = next_;
    next_ += (std::max<size_t>(bytes, 1) + 63) / 64 * 64;
    track_host(reinterpret_cast<void*>(p), bytes, cat);
    return reinterpret_cast<void*>(p);
  }
  void release_host(void* p) override {
    hand_on_run();
    if (p) untrack_host(p);
  }
  // Copies are recorded at issue like collectives (start = end = issue index), on their
  // direction's lane, with their request and the request they are ordered after.
  Request copy_async(void*, const void*, size_t bytes, CopyDirection dir, Request after) override {
    record(OpKind::Copy, dir == CopyDirection::HostToDevice ? kCopyH2DLane : kCopyD2HLane, double(next_request_),
           double(next_request_), int64_t(bytes), 0.0, nullptr, next_request_, 0, after);
    return next_request_++;
  }
  // Recorded, not run: the host buffers fn would read point nowhere. The host's waits for
  // its inputs are recorded as waits on kHostLane, so the schedule shows what it reads.
  void host_compute(const std::function<void()>&, int64_t bytes, const std::vector<Request>& inputs,
                    OpKind kind) override {
    for (Request r : inputs) record(OpKind::Wait, kHostLane, 0.0, 0.0, 0, 0.0, nullptr, r);
    record(kind, kHostLane, 0.0, 0.0, bytes, 0.0);
  }
  void upload(void*, const void*, size_t) override {}
  bool holds_data() const override { return false; }
  void download(void* dst, const void*, size_t bytes) override { std::memset(dst, 0, bytes); }

  // GEMMs are counted and recorded with their shapes (kernel_bench reads a step's shapes).
  void gemm(bool ta, bool tb, int M, int N, int K, float, CBuf, int, CBuf, int, float, Buf, int) override {
    count_gemm(ta, tb, M, N, K, 1);
  }
  void gemm_batched(bool ta, bool tb, int M, int N, int K, float, CBuf, int, int64_t, CBuf, int, int64_t,
                    float, Buf, int, int64_t, int batch) override {
    count_gemm(ta, tb, M, N, K, batch);
  }
  // Elementwise kernels and copies are recorded with the bytes the CUDA backend records for
  // them, so the projection can cost them by bytes at a measured bandwidth.
  void embedding_forward(Buf out, CBuf, const int*, int n, int d) override { touched(2, out, int64_t(n) * d); }
  void embedding_backward(Buf dtable, CBuf, const int*, int n, int d) override {
    touched(3, dtable, int64_t(n) * d);
  }
  void rmsnorm_forward(Buf out, float*, CBuf, CBuf, int n, int d, float) override {
    touched(2, out, int64_t(n) * d);
  }
  void rmsnorm_backward(Buf dx, Buf, CBuf, CBuf, CBuf, const float*, int n, int d) override {
    touched(4, dx, int64_t(n) * d);
  }
  void relu_forward(Buf x, int64_t n) override { touched(2, x, n); }
  void relu_backward(Buf dy, CBuf, int64_t n) override { touched(3, dy, n); }
  void gated_gelu_forward(Buf h, CBuf, CBuf, int64_t n) override { touched(3, h, n); }
  void gated_gelu_backward(Buf du, Buf, CBuf, CBuf, CBuf, int64_t n) override { touched(5, du, n); }
  void add(Buf y, CBuf, int64_t n) override { touched(3, y, n); }
  void scale(Buf x, float, int64_t n) override { touched(2, x, n); }
  void copy(Buf dst, CBuf, int64_t n) override {
    record(OpKind::Copy, 0, 0.0, 0.0, 2 * dtype_size(dst.dtype) * n, 0.0);
  }
  void cast(Buf dst, CBuf src, int64_t n) override {  // recorded: the projection replays it
    record(OpKind::Copy, 0, 0.0, 0.0, (dtype_size(dst.dtype) + dtype_size(src.dtype)) * n, 0.0);
  }
  void fill(Buf x, float, int64_t n) override { touched(1, x, n); }
  void init_uniform(float*, int64_t, uint64_t, int64_t, float) override {}
  void position_bias_forward(Buf bias, CBuf, const int*, int heads, int tq, int tk) override {
    touched(2, bias, int64_t(heads) * tq * tk);
  }
  void position_bias_backward(Buf dtable, CBuf, const int*, int heads, int tq, int tk) override {
    touched(2, dtable, int64_t(heads) * tq * tk);
  }
  void softmax_forward(Buf s, CBuf, bool, int batch, int heads, int tq, int tk) override {
    touched(2, s, int64_t(batch) * heads * tq * tk);
  }
  void softmax_backward(Buf ds, CBuf, Buf, int batch, int heads, int tq, int tk) override {
    touched(3, ds, int64_t(batch) * heads * tq * tk);
  }
  // Counted as the GEMMs they stand for (attention_gemm_shape), so the plan's FLOPs and
  // schedule are those of the unfused path.
  void attention_forward(Buf, float*, CBuf, CBuf, CBuf, CBuf, const int*, const AttentionShape& s) override {
    count_attention(s, false);
  }
  void attention_backward(Buf, Buf, Buf, Buf, CBuf, CBuf, CBuf, CBuf, CBuf, const float*, CBuf, const int*, float*,
                          const AttentionShape& s) override {
    count_attention(s, true);
  }
  void cross_entropy(Buf logits, float*, const int*, int n, int vocab, float) override {
    touched(2, logits, int64_t(n) * vocab);
  }
  void cross_entropy_max(CBuf logits, float*, int n, int vocab) override {
    record(OpKind::Elementwise, 0, 0.0, 0.0, dtype_size(logits.dtype) * int64_t(n) * vocab, 0.0);
  }
  void cross_entropy_sums(CBuf logits, const float*, const int*, float*, int n, int vocab) override {
    record(OpKind::Elementwise, 0, 0.0, 0.0, dtype_size(logits.dtype) * int64_t(n) * vocab, 0.0);
  }
  void cross_entropy_finish(Buf logits, float*, const float*, const float*, const int*, int n, int vocab,
                            float) override {
    touched(2, logits, int64_t(n) * vocab);
  }
  bool all_finite(CBuf x, int64_t n) override {
    record(OpKind::Elementwise, 0, 0.0, 0.0, dtype_size(x.dtype) * n, 0.0);
    return true;
  }
  void optimizer_update(const OptimizerConfig& c, int, float*, CBuf g, void*, int64_t n, Buf copy) override {
    record(OpKind::Optimizer, 0, 0.0, 0.0, optimizer_bytes_touched(c, n, g.dtype, copy), 0.0);  // bytes touched, for the projection
  }
  void optimizer_init_state(const OptimizerConfig& c, void*, int64_t n) override {
    record(OpKind::Elementwise, 0, 0.0, 0.0, optimizer_state_bytes(c, n), 0.0);
  }

  std::unique_ptr<Comm> make_comm(MPI_Comm) override { return std::make_unique<NullComm>(1, 0); }
  // Collectives are recorded at issue (start = end = issue index) so tests can read the
  // schedule a strategy would run, with the request each is stream-ordered after.
  Request collective(const CollectiveArgs& a, Comm& c) override {
    record(collective_kind(a.op), 1, double(next_request_), double(next_request_), collective_bytes(a, c.size()),
           0.0, nullptr, next_request_, c.size(), a.after, c.axis(), a.peer);
    return next_request_++;
  }
  void wait(Request r) override { record(OpKind::Wait, 0, 0.0, 0.0, 0, 0.0, nullptr, r); }
  bool test(Request) override { return true; }
  void synchronize() override {}
  double now() const override { return 0.0; }

  double counted_flops() const { return with_run(flops_); }
  void count_runs(bool on) {
    if (!on) hand_on_run();
    runs_ = on;
  }

 private:
  // Every other op this backend records hands on the run held first, so the recorder sees
  // the ops in their order.
  template <class... Args>
  void record(Args&&... args) {
    hand_on_run();
    Backend::record(std::forward<Args>(args)...);
  }

  // With runs on, a GEMM alike the run held (shape, phase and unit: unfused attention's
  // per-sequence calls) only lengthens it: the hot path compares seven ints, no more.
  void count_gemm(bool ta, bool tb, int M, int N, int K, int batch) {
    const int trans = int(ta) | int(tb) << 1;
    if (held_ && run_.gemm[0] == M && run_.gemm[1] == N && run_.gemm[2] == K && run_.gemm[3] == batch &&
        run_.gemm[4] == trans && run_.phase == phase() && run_.unit == unit()) {
      ++held_;
      return;
    }
    hand_on_run();
    const double flops = 2.0 * M * N * K * batch;
    const OpEvent e{OpKind::Gemm, phase(), unit(), 0, 0.0, 0.0, 0, flops, {M, N, K, batch, trans}};
    if (runs_ && recorder_) {
      run_ = e, held_ = 1;
      return;
    }
    flops_ += flops;
    Backend::record(e);
  }
  void hand_on_run() {
    if (!held_) return;
    flops_ = with_run(flops_);
    run_.times = held_;
    held_ = 0;
    Backend::record(run_);
  }
  // flops plus the run's FLOPs added one by one, as each call adds them without runs: the
  // same double (past 2^53 a product would round differently).
  double with_run(double flops) const {
    for (int i = 0; i < held_; ++i) flops += run_.flops;
    return flops;
  }

  void count_attention(const AttentionShape& s, bool backward) {
    const auto g = attention_gemm_shape(s, backward);
    count_gemm(false, false, g[0], g[1], g[2], g[3]);
  }
  // An elementwise kernel touching `passes` arrays of n elements of x's type.
  void touched(int passes, Buf x, int64_t n) {
    record(OpKind::Elementwise, 0, 0.0, 0.0, passes * dtype_size(x.dtype) * n, 0.0);
  }

  double flops_ = 0.0;  // the GEMMs' FLOPs but the run's held
  uintptr_t next_ = 4096;
  Request next_request_ = 0;
  bool runs_ = false;  // count_runs
  OpEvent run_{};  // the run held: held_ GEMMs alike this one, none when 0
  int held_ = 0;
};

}  // namespace

std::unique_ptr<Comm> make_planned_comm(int size, int rank) {
  return std::make_unique<NullComm>(size, rank);
}

std::unique_ptr<Backend> make_counting_backend() { return std::make_unique<CountingBackend>(); }

double counted_gemm_flops(const Backend& b) {
  const auto* c = dynamic_cast<const CountingBackend*>(&b);
  SB_ASSERT(c, "counted_gemm_flops needs the counting backend");
  return c->counted_flops();
}

void count_runs(Backend& b, bool on) {
  auto* c = dynamic_cast<CountingBackend*>(&b);
  SB_ASSERT(c, "count_runs needs the counting backend");
  c->count_runs(on);
}

}  // namespace sb
