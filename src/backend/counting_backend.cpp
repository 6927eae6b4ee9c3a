// Counting backend: the memory plan's engine. It runs the real schedule of a strategy but
// allocates nothing and computes nothing: it hands out addresses that point nowhere,
// accounts every allocation by category, and sums GEMM FLOPs. So the plan predicts exactly
// what the code path allocates, for any model and world size, without the memory.
#include <algorithm>
#include <cstring>
#include <unordered_map>

#include "shardbench/backend.h"
#include "shardbench/check.h"
#include "shardbench/layout.h"

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
    // Distinct, aligned, never dereferenced.
    const uintptr_t p = next_;
    next_ += (std::max<size_t>(bytes, 1) + 63) / 64 * 64;
    track(reinterpret_cast<void*>(p), bytes, cat);
    return reinterpret_cast<void*>(p);
  }
  void release(void* p) override {
    if (p) untrack(p);
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
  void embedding_forward(Buf, CBuf, const int*, int, int) override {}
  void embedding_backward(Buf, CBuf, const int*, int, int) override {}
  void rmsnorm_forward(Buf, float*, CBuf, CBuf, int, int, float) override {}
  void rmsnorm_backward(Buf, Buf, CBuf, CBuf, CBuf, const float*, int, int) override {}
  void relu_forward(Buf, int64_t) override {}
  void relu_backward(Buf, CBuf, int64_t) override {}
  void add(Buf, CBuf, int64_t) override {}
  void scale(Buf, float, int64_t) override {}
  void copy(Buf, CBuf, int64_t) override {}
  void cast(Buf dst, CBuf src, int64_t n) override {  // recorded: the projection replays it
    record(OpKind::Copy, 0, 0.0, 0.0, (dtype_size(dst.dtype) + dtype_size(src.dtype)) * n, 0.0);
  }
  void fill(Buf, float, int64_t) override {}
  void init_uniform(float*, int64_t, uint64_t, int64_t, float) override {}
  void position_bias_forward(Buf, CBuf, const int*, int, int, int) override {}
  void position_bias_backward(Buf, CBuf, const int*, int, int, int) override {}
  void softmax_forward(Buf, CBuf, bool, int, int, int, int) override {}
  void softmax_backward(Buf, CBuf, Buf, int, int, int, int) override {}
  void cross_entropy(Buf, float*, const int*, int, int, float) override {}
  bool all_finite(CBuf, int64_t) override { return true; }
  void adam(float*, CBuf g, float*, float*, int64_t n, const AdamConfig&, int) override {
    record(OpKind::Optimizer, 0, 0.0, 0.0, (24 + dtype_size(g.dtype)) * n, 0.0);  // bytes touched, for the projection
  }

  std::unique_ptr<Comm> make_comm(MPI_Comm) override { return std::make_unique<NullComm>(1, 0); }
  // Collectives are recorded at issue (start = end = issue index) so tests can read the
  // schedule a strategy would run.
  Request collective(const CollectiveArgs& a, Comm& c) override {
    record(collective_kind(a.op), 1, double(next_request_), double(next_request_), collective_bytes(a, c.size()),
           0.0, nullptr, next_request_);
    return next_request_++;
  }
  void wait(Request r) override { record(OpKind::Wait, 0, 0.0, 0.0, 0, 0.0, nullptr, r); }
  bool test(Request) override { return true; }
  void synchronize() override {}
  double now() const override { return 0.0; }

  double flops_ = 0.0;

 private:
  void count_gemm(bool ta, bool tb, int M, int N, int K, int batch) {
    const double flops = 2.0 * M * N * K * batch;
    flops_ += flops;
    const int32_t shape[5] = {M, N, K, batch, int(ta) | int(tb) << 1};
    record(OpKind::Gemm, 0, 0.0, 0.0, 0, flops, shape);
  }

  uintptr_t next_ = 4096;
  Request next_request_ = 0;
};

}  // namespace

std::unique_ptr<Comm> make_planned_comm(int size, int rank) {
  return std::make_unique<NullComm>(size, rank);
}

std::unique_ptr<Backend> make_counting_backend() { return std::make_unique<CountingBackend>(); }

double counted_gemm_flops(const Backend& b) {
  const auto* c = dynamic_cast<const CountingBackend*>(&b);
  SB_ASSERT(c, "counted_gemm_flops needs the counting backend");
  return c->flops_;
}

}  // namespace sb
