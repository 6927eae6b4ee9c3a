// CPU backend: OpenBLAS GEMMs, plain loops for the elementwise ops, MPI non-blocking
// collectives. MPI only progresses a non-blocking collective when it is called, so every
// compute operation ends with a poll of the outstanding requests: that is what lets a
// bucket all-reduce or a prefetched all-gather advance while backward computes.
#include <cblas.h>
#include <unistd.h>

#include <algorithm>
#include <chrono>
#include <cmath>
#include <cstdlib>
#include <cstring>
#include <functional>
#include <unordered_map>
#include <vector>

#include "shardbench/backend.h"
#include "shardbench/check.h"
#include "shardbench/model.h"
#include "shardbench/rng.h"

namespace sb {
namespace {

class MpiComm : public Comm {
 public:
  explicit MpiComm(MPI_Comm c) : comm(c) {
    MPI_CHECK(MPI_Comm_size(c, &size_));
    MPI_CHECK(MPI_Comm_rank(c, &rank_));
  }
  int size() const override { return size_; }
  int rank() const override { return rank_; }
  MPI_Comm comm;

 private:
  int size_ = 0, rank_ = 0;
};

struct Pending {
  MPI_Request req = MPI_REQUEST_NULL;
  MPI_Request req2 = MPI_REQUEST_NULL;  // send/recv: the receive
  std::function<void()> on_complete;    // work MPI leaves to us (avg scaling, in-place moves)
  OpKind kind;
  Phase phase;
  int unit, lane;
  double start;
  int64_t bytes;
};

class CpuBackend final : public Backend {
 public:
  CpuBackend() : epoch_(std::chrono::steady_clock::now()) {}
  ~CpuBackend() override {
    // Complete what MPI may still write into before freeing the memory.
    int finalized = 0;
    MPI_Finalized(&finalized);
    for (auto& [id, p] : pending_) {
      MPI_Request reqs[2] = {p.req, p.req2};
      if (!finalized) MPI_Waitall(2, reqs, MPI_STATUSES_IGNORE);
    }
    for (void* p : tracked()) std::free(p);
  }
  std::string name() const override { return "cpu"; }
  std::string device_name() const override {
    char host[256] = "?";
    gethostname(host, sizeof host - 1);
    return std::string("cpu:") + host;
  }

  // ---- memory ----
  void* alloc(size_t bytes, MemCategory cat) override {
    const size_t rounded = std::max<size_t>(64, (bytes + 63) / 64 * 64);
    void* p = std::aligned_alloc(64, rounded);
    if (!p) SB_FATAL("out of host memory allocating " + human_bytes(double(bytes)) + " for " +
                     mem_category_name(cat));
    track(p, bytes, cat);
    return p;
  }
  void release(void* p) override {
    if (!p) return;
    untrack(p);
    std::free(p);
  }
  void upload(void* dst, const void* src, size_t bytes) override { std::memcpy(dst, src, bytes); }
  void download(void* dst, const void* src, size_t bytes) override { std::memcpy(dst, src, bytes); }

  // ---- compute ----
  void gemm(bool ta, bool tb, int M, int N, int K, float alpha, const float* A, int lda,
            const float* B, int ldb, float beta, float* C, int ldc) override {
    const double t0 = now();
    cblas_sgemm(CblasRowMajor, ta ? CblasTrans : CblasNoTrans, tb ? CblasTrans : CblasNoTrans, M, N,
                K, alpha, A, lda, B, ldb, beta, C, ldc);
    const int32_t shape[5] = {M, N, K, 1, int(ta) | int(tb) << 1};
    done(OpKind::Gemm, t0, 4 * (int64_t(M) * K + int64_t(K) * N + 2 * int64_t(M) * N),
         2.0 * M * N * K, shape);
  }
  void gemm_batched(bool ta, bool tb, int M, int N, int K, float alpha, const float* A, int lda,
                    int64_t sa, const float* B, int ldb, int64_t sb, float beta, float* C, int ldc,
                    int64_t sc, int batch) override {
    const double t0 = now();
    const auto opa = ta ? CblasTrans : CblasNoTrans, opb = tb ? CblasTrans : CblasNoTrans;
    for (int i = 0; i < batch; ++i)
      cblas_sgemm(CblasRowMajor, opa, opb, M, N, K, alpha, A + i * sa, lda, B + i * sb, ldb, beta,
                  C + i * sc, ldc);
    const int32_t shape[5] = {M, N, K, batch, int(ta) | int(tb) << 1};
    done(OpKind::Gemm, t0,
         4 * int64_t(batch) * (int64_t(M) * K + int64_t(K) * N + 2 * int64_t(M) * N),
         2.0 * M * N * K * batch, shape);
  }
  void embedding_forward(float* out, const float* table, const int* ids, int n, int d) override {
    const double t0 = now();
    for (int i = 0; i < n; ++i) std::memcpy(out + int64_t(i) * d, table + int64_t(ids[i]) * d, 4 * size_t(d));
    done(OpKind::Elementwise, t0, 8 * int64_t(n) * d);
  }
  void embedding_backward(float* dtable, const float* dout, const int* ids, int n, int d) override {
    const double t0 = now();
    for (int i = 0; i < n; ++i) {
      float* row = dtable + int64_t(ids[i]) * d;
      const float* g = dout + int64_t(i) * d;
      for (int j = 0; j < d; ++j) row[j] += g[j];
    }
    done(OpKind::Elementwise, t0, 12 * int64_t(n) * d);
  }
  void rmsnorm_forward(float* out, float* rstd, const float* x, const float* w, int n, int d,
                       float eps) override {
    const double t0 = now();
    for (int i = 0; i < n; ++i) {
      const float* xi = x + int64_t(i) * d;
      float* oi = out + int64_t(i) * d;
      double ss = 0;
      for (int j = 0; j < d; ++j) ss += double(xi[j]) * xi[j];
      const float r = float(1.0 / std::sqrt(ss / d + eps));
      rstd[i] = r;
      for (int j = 0; j < d; ++j) oi[j] = xi[j] * r * w[j];
    }
    done(OpKind::Elementwise, t0, 8 * int64_t(n) * d);
  }
  void rmsnorm_backward(float* dx, float* dw, const float* dout, const float* x, const float* w,
                        const float* rstd, int n, int d) override {
    const double t0 = now();
    for (int i = 0; i < n; ++i) {
      const float* xi = x + int64_t(i) * d;
      const float* gi = dout + int64_t(i) * d;
      float* dxi = dx + int64_t(i) * d;
      const float r = rstd[i];
      // out_j = x_j r w_j, r = (mean x^2 + eps)^-1/2  ⇒  dx_j = r (g_j w_j − x_j r² mean_k(g_k w_k x_k))
      double dot = 0;
      for (int j = 0; j < d; ++j) dot += double(gi[j]) * w[j] * xi[j];
      const float c = float(dot / d) * r * r;
      for (int j = 0; j < d; ++j) {
        dxi[j] += r * (gi[j] * w[j] - xi[j] * c);
        dw[j] += gi[j] * xi[j] * r;
      }
    }
    done(OpKind::Elementwise, t0, 16 * int64_t(n) * d);
  }
  void relu_forward(float* x, int64_t n) override {
    const double t0 = now();
    for (int64_t i = 0; i < n; ++i) x[i] = x[i] > 0.f ? x[i] : 0.f;
    done(OpKind::Elementwise, t0, 8 * n);
  }
  void relu_backward(float* dy, const float* y, int64_t n) override {
    const double t0 = now();
    for (int64_t i = 0; i < n; ++i) dy[i] = y[i] > 0.f ? dy[i] : 0.f;
    done(OpKind::Elementwise, t0, 12 * n);
  }
  void add(float* y, const float* x, int64_t n) override {
    const double t0 = now();
    for (int64_t i = 0; i < n; ++i) y[i] += x[i];
    done(OpKind::Elementwise, t0, 12 * n);
  }
  void scale(float* x, float a, int64_t n) override {
    const double t0 = now();
    for (int64_t i = 0; i < n; ++i) x[i] *= a;
    done(OpKind::Elementwise, t0, 8 * n);
  }
  void copy(float* dst, const float* src, int64_t n) override {
    const double t0 = now();
    std::memcpy(dst, src, size_t(n) * 4);
    done(OpKind::Copy, t0, 8 * n);
  }
  void fill(float* x, float value, int64_t n) override {
    const double t0 = now();
    std::fill(x, x + n, value);
    done(OpKind::Elementwise, t0, 4 * n);
  }
  void init_uniform(float* x, int64_t n, uint64_t key, int64_t first, float scale) override {
    const double t0 = now();
    for (int64_t i = 0; i < n; ++i) x[i] = scale * uniform_pm1(key, uint64_t(first + i));
    done(OpKind::Elementwise, t0, 4 * n);
  }
  void position_bias_forward(float* bias, const float* table, const int* buckets, int heads, int tq,
                             int tk) override {
    const double t0 = now();
    const int64_t tt = int64_t(tq) * tk;
    for (int h = 0; h < heads; ++h)
      for (int64_t ij = 0; ij < tt; ++ij) bias[h * tt + ij] = table[int64_t(buckets[ij]) * heads + h];
    done(OpKind::Elementwise, t0, 8 * heads * tt);
  }
  void position_bias_backward(float* dtable, const float* dbias, const int* buckets, int heads,
                              int tq, int tk) override {
    const double t0 = now();
    const int64_t tt = int64_t(tq) * tk;
    for (int h = 0; h < heads; ++h)
      for (int64_t ij = 0; ij < tt; ++ij) dtable[int64_t(buckets[ij]) * heads + h] += dbias[h * tt + ij];
    done(OpKind::Elementwise, t0, 8 * heads * tt);
  }
  void softmax_forward(float* s, const float* bias, bool causal, int batch, int heads, int tq,
                       int tk) override {
    const double t0 = now();
    for (int b = 0; b < batch; ++b)
      for (int h = 0; h < heads; ++h)
        for (int i = 0; i < tq; ++i) {
          float* row = s + ((int64_t(b) * heads + h) * tq + i) * tk;
          const float* brow = bias ? bias + (int64_t(h) * tq + i) * tk : nullptr;
          const int valid = causal ? std::min(tk, i + 1) : tk;
          float mx = -INFINITY;
          for (int j = 0; j < valid; ++j) {
            if (brow) row[j] += brow[j];
            mx = std::max(mx, row[j]);
          }
          float sum = 0.f;
          for (int j = 0; j < valid; ++j) sum += (row[j] = std::exp(row[j] - mx));
          const float inv = 1.f / sum;
          for (int j = 0; j < valid; ++j) row[j] *= inv;
          for (int j = valid; j < tk; ++j) row[j] = 0.f;
        }
    done(OpKind::Elementwise, t0, 8 * int64_t(batch) * heads * tq * tk);
  }
  void softmax_backward(float* ds, const float* p, float* dbias, int batch, int heads, int tq,
                        int tk) override {
    const double t0 = now();
    for (int b = 0; b < batch; ++b)
      for (int h = 0; h < heads; ++h)
        for (int i = 0; i < tq; ++i) {
          const int64_t off = ((int64_t(b) * heads + h) * tq + i) * tk;
          float* g = ds + off;
          const float* pr = p + off;
          float dot = 0.f;
          for (int j = 0; j < tk; ++j) dot += g[j] * pr[j];
          for (int j = 0; j < tk; ++j) g[j] = pr[j] * (g[j] - dot);
          if (dbias) {
            float* db = dbias + (int64_t(h) * tq + i) * tk;
            for (int j = 0; j < tk; ++j) db[j] += g[j];
          }
        }
    done(OpKind::Elementwise, t0, 12 * int64_t(batch) * heads * tq * tk);
  }
  void cross_entropy(float* logits, float* losses, const int* labels, int n, int vocab,
                     float grad_scale) override {
    const double t0 = now();
    for (int i = 0; i < n; ++i) {
      float* row = logits + int64_t(i) * vocab;
      float mx = -INFINITY;
      for (int j = 0; j < vocab; ++j) mx = std::max(mx, row[j]);
      const float target = row[labels[i]] - mx;
      double sum = 0;  // exponentials computed once, kept in the row
      for (int j = 0; j < vocab; ++j) sum += (row[j] = std::exp(row[j] - mx));
      losses[i] = float(std::log(sum)) - target;
      const float k = float(grad_scale / sum);
      for (int j = 0; j < vocab; ++j) row[j] *= k;
      row[labels[i]] -= grad_scale;
    }
    done(OpKind::Elementwise, t0, 8 * int64_t(n) * vocab);
  }
  void adam(float* p, const float* g, float* m, float* v, int64_t n, const AdamConfig& c,
            int step) override {
    const double t0 = now();
    adam_kernel(p, g, m, v, n, c.lr, c.beta1, c.beta2, c.eps, 1.f - std::pow(c.beta1, float(step)),
                1.f - std::pow(c.beta2, float(step)));
    done(OpKind::Optimizer, t0, 28 * n);
  }
  // Separate buffers (restrict) and bias corrections folded into multipliers let the
  // compiler vectorise the loop.
  static void adam_kernel(float* __restrict__ p, const float* __restrict__ g, float* __restrict__ m,
                          float* __restrict__ v, int64_t n, float lr, float b1, float b2, float eps,
                          float bc1, float bc2) {
    const float step_size = lr / bc1, inv_bc2 = 1.f / bc2;
    for (int64_t i = 0; i < n; ++i) {
      m[i] = b1 * m[i] + (1.f - b1) * g[i];
      v[i] = b2 * v[i] + (1.f - b2) * g[i] * g[i];
      p[i] -= step_size * m[i] / (std::sqrt(v[i] * inv_bc2) + eps);
    }
  }

  // ---- collectives ----
  std::unique_ptr<Comm> make_comm(MPI_Comm c) override { return std::make_unique<MpiComm>(c); }

  Request all_reduce(float* buf, int64_t count, Comm& c) override {
    Pending p = begin(OpKind::AllReduce, count * 4);
    MPI_CHECK(MPI_Iallreduce(MPI_IN_PLACE, buf, mpi_count(count), MPI_FLOAT, MPI_SUM, mpi(c), &p.req));
    return enqueue(p);
  }
  Request all_gather(const float* send, float* recv, int64_t count, Comm& c) override {
    Pending p = begin(OpKind::AllGather, count * 4 * c.size());
    MPI_CHECK(MPI_Iallgather(send, mpi_count(count), MPI_FLOAT, recv, mpi_count(count), MPI_FLOAT,
                             mpi(c), &p.req));
    return enqueue(p);
  }
  Request reduce_scatter(const float* send, float* recv, int64_t count, Comm& c) override {
    Pending p = begin(OpKind::ReduceScatter, count * 4 * c.size());
    MPI_CHECK(MPI_Ireduce_scatter_block(send, recv, mpi_count(count), MPI_FLOAT, MPI_SUM, mpi(c),
                                        &p.req));
    return enqueue(p);
  }
  bool supports(Collective op, DType dtype, ReduceOp redop) const override {
    const bool reduces = op == Collective::AllReduce || op == Collective::ReduceScatter || op == Collective::Reduce;
    // MPI has no bfloat16 or half arithmetic: those types only move.
    if (reduces && (dtype == DType::BF16 || dtype == DType::F16)) return false;
    return int(dtype) >= 0 && dtype < DType::kCount && int(redop) >= 0 && redop < ReduceOp::kCount;
  }

  Request collective(const CollectiveArgs& a, Comm& c) override {
    if (!supports(a.op, a.dtype, a.redop))
      throw UsageError(std::string(collective_name(a.op)) + " of " + dtype_name(a.dtype) + " with " +
                       reduce_op_name(a.redop) + " is not supported by the cpu backend (MPI)");
    const MPI_Comm comm = mpi(c);
    const int n = c.size(), r = c.rank(), es = dtype_size(a.dtype);
    const MPI_Datatype t = mpi_type(a.dtype);
    const MPI_Op op = mpi_op(a.redop);
    const int cnt = mpi_count(a.count);
    auto* send = static_cast<const char*>(a.send);
    auto* recv = static_cast<char*>(a.recv);
    Pending p;
    switch (a.op) {
      case Collective::AllReduce: {
        p = begin(OpKind::AllReduce, a.count * es);
        const void* s = send == recv ? MPI_IN_PLACE : send;
        MPI_CHECK(MPI_Iallreduce(s, recv, cnt, t, op, comm, &p.req));
        p.on_complete = average(a, recv, a.count, n);
        break;
      }
      case Collective::AllGather: {
        p = begin(OpKind::AllGather, a.count * es * n);
        const void* s = send == recv + int64_t(r) * a.count * es ? MPI_IN_PLACE : send;
        MPI_CHECK(MPI_Iallgather(s, cnt, t, recv, cnt, t, comm, &p.req));
        break;
      }
      case Collective::ReduceScatter: {
        p = begin(OpKind::ReduceScatter, a.count * es * n);
        if (recv == send + int64_t(r) * a.count * es) {
          // MPI leaves the in-place result at the start of the buffer; NCCL at this rank's slice.
          char* base = const_cast<char*>(send);
          MPI_CHECK(MPI_Ireduce_scatter_block(MPI_IN_PLACE, base, cnt, t, op, comm, &p.req));
          auto avg = average(a, base, a.count, n);
          p.on_complete = [=] {
            if (avg) avg();
            if (base != recv) std::memmove(recv, base, size_t(a.count) * es);
          };
        } else {
          MPI_CHECK(MPI_Ireduce_scatter_block(send, recv, cnt, t, op, comm, &p.req));
          p.on_complete = average(a, recv, a.count, n);
        }
        break;
      }
      case Collective::Broadcast: {
        p = begin(OpKind::Broadcast, a.count * es);
        if (r == a.root && send != recv) std::memcpy(recv, send, size_t(a.count) * es);
        MPI_CHECK(MPI_Ibcast(recv, cnt, t, a.root, comm, &p.req));
        break;
      }
      case Collective::Reduce: {
        p = begin(OpKind::Reduce, a.count * es);
        const void* s = (r == a.root && send == recv) ? MPI_IN_PLACE : send;
        MPI_CHECK(MPI_Ireduce(s, recv, cnt, t, op, a.root, comm, &p.req));
        if (r == a.root) p.on_complete = average(a, recv, a.count, n);
        break;
      }
      case Collective::AllToAll: {
        SB_ASSERT(a.count % n == 0 && send != recv, "all-to-all needs count divisible by ranks, out of place");
        p = begin(OpKind::AllToAll, a.count * es);
        MPI_CHECK(MPI_Ialltoall(send, mpi_count(a.count / n), t, recv, mpi_count(a.count / n), t, comm, &p.req));
        break;
      }
      case Collective::SendRecv: {
        SB_ASSERT(send != recv, "send-recv is out of place");
        p = begin(OpKind::SendRecv, a.count * es);
        MPI_CHECK(MPI_Irecv(recv, cnt, t, (r - 1 + n) % n, 0, comm, &p.req2));
        MPI_CHECK(MPI_Isend(send, cnt, t, (r + 1) % n, 0, comm, &p.req));
        break;
      }
      default: SB_FATAL("unknown collective");
    }
    return enqueue(p);
  }

  void wait(Request r) override {
    auto it = pending_.find(r);
    if (it == pending_.end()) return;  // already completed by a poll
    const double t0 = now();
    MPI_Request reqs[2] = {it->second.req, it->second.req2};
    MPI_CHECK(MPI_Waitall(2, reqs, MPI_STATUSES_IGNORE));
    if (it->second.on_complete) it->second.on_complete();
    const double t1 = now();
    finish(it->second, t1);
    pending_.erase(it);
    record(OpKind::Wait, 0, t0, t1, 0, 0.0);
    poll();
  }
  bool test(Request r) override {
    poll();
    return pending_.find(r) == pending_.end();
  }
  void synchronize() override {}

  double now() const override {
    return std::chrono::duration<double>(std::chrono::steady_clock::now() - epoch_).count();
  }

 private:
  static MPI_Comm mpi(Comm& c) { return static_cast<MpiComm&>(c).comm; }
  static MPI_Datatype mpi_type(DType t) {
    switch (t) {
      case DType::F32: return MPI_FLOAT;
      case DType::F64: return MPI_DOUBLE;
      case DType::I32: return MPI_INT32_T;
      case DType::I64: return MPI_INT64_T;
      case DType::U8: return MPI_UINT8_T;
      default: return MPI_UINT16_T;  // bfloat16, half: moved as 16-bit words
    }
  }
  static MPI_Op mpi_op(ReduceOp o) {
    switch (o) {
      case ReduceOp::Prod: return MPI_PROD;
      case ReduceOp::Min: return MPI_MIN;
      case ReduceOp::Max: return MPI_MAX;
      default: return MPI_SUM;  // avg = sum, divided on completion (MPI has no average)
    }
  }
  template <class T>
  static void divide(void* buf, int64_t n, int by) {
    T* p = static_cast<T*>(buf);
    for (int64_t i = 0; i < n; ++i) p[i] = T(p[i] / by);
  }
  static std::function<void()> average(const CollectiveArgs& a, void* buf, int64_t n, int ranks) {
    if (a.redop != ReduceOp::Avg) return {};
    switch (a.dtype) {
      case DType::F32: return [=] { divide<float>(buf, n, ranks); };
      case DType::F64: return [=] { divide<double>(buf, n, ranks); };
      case DType::I32: return [=] { divide<int32_t>(buf, n, ranks); };
      case DType::I64: return [=] { divide<int64_t>(buf, n, ranks); };
      case DType::U8: return [=] { divide<uint8_t>(buf, n, ranks); };
      default: return {};
    }
  }

  static int mpi_count(int64_t n) {
    SB_ASSERT(n <= INT32_MAX, "collective of more than 2^31 elements");
    return int(n);
  }

  // Records a compute operation and lets outstanding collectives advance.
  void done(OpKind kind, double t0, int64_t bytes, double flops = 0.0,
            const int32_t* gemm_shape = nullptr) {
    const double t1 = now();
    record(kind, 0, t0, t1, bytes, flops, gemm_shape);
    if (pending_.empty()) return;
    // MPI's reductions and copies for outstanding collectives run here, on this thread:
    // communication work the compute lane pays for, recorded as such.
    poll();
    record(OpKind::Progress, 0, t1, now(), 0, 0.0);
  }

  Pending begin(OpKind kind, int64_t bytes) {
    Pending p;
    p.kind = kind;
    p.phase = phase();
    p.unit = unit();
    p.start = now();
    p.bytes = bytes;
    p.lane = free_lane();
    return p;
  }
  Request enqueue(const Pending& p) {
    lane_busy_[p.lane - 1] = true;
    pending_[next_id_] = p;
    return next_id_++;
  }
  // Communication lanes are assigned first-free, so events never overlap within a lane.
  int free_lane() {
    for (size_t i = 0; i < lane_busy_.size(); ++i)
      if (!lane_busy_[i]) return int(i) + 1;
    lane_busy_.push_back(false);
    return int(lane_busy_.size());
  }
  void finish(const Pending& p, double t_end) {
    lane_busy_[p.lane - 1] = false;
    if (recorder_) recorder_->on_op(OpEvent{p.kind, p.phase, p.unit, p.lane, p.start, t_end, p.bytes, 0.0, {0, 0, 0, 0, 0}});
  }
  void poll() {
    for (auto it = pending_.begin(); it != pending_.end();) {
      int flag = 0;
      MPI_Request reqs[2] = {it->second.req, it->second.req2};
      MPI_CHECK(MPI_Testall(2, reqs, &flag, MPI_STATUSES_IGNORE));
      it->second.req = reqs[0];
      it->second.req2 = reqs[1];
      if (flag) {
        if (it->second.on_complete) it->second.on_complete();
        finish(it->second, now());
        it = pending_.erase(it);
      } else {
        ++it;
      }
    }
  }

  std::chrono::steady_clock::time_point epoch_;
  std::unordered_map<Request, Pending> pending_;
  std::vector<bool> lane_busy_;
  Request next_id_ = 0;
};

}  // namespace

std::unique_ptr<Backend> make_cpu_backend() {
  // One BLAS thread per rank unless the user asks otherwise: ranks already fill the cores.
  if (!std::getenv("OPENBLAS_NUM_THREADS")) openblas_set_num_threads(1);
  return std::make_unique<CpuBackend>();
}

}  // namespace sb
