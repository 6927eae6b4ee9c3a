// CPU backend: OpenBLAS GEMMs, plain loops for the elementwise ops, MPI non-blocking
// collectives. MPI only progresses a non-blocking collective when it is called, so every
// compute operation ends with a poll of the outstanding requests: that is what lets a
// bucket all-reduce or a prefetched all-gather advance while backward computes.
#include <cblas.h>
#ifdef __F16C__
#include <immintrin.h>
#endif
#include <unistd.h>

#include <algorithm>
#include <chrono>
#include <cmath>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <functional>
#include <unordered_map>
#include <vector>

#include "shardbench/backend/backend.h"
#include "shardbench/backend/host_optimizer.h"
#include "shardbench/backend/exact_sum.h"
#include "shardbench/core/check.h"
#include "shardbench/core/half.h"
#include "shardbench/core/format.h"
#include "shardbench/backend/mpi_ops.h"
#include "shardbench/core/rng.h"

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

// Elements a strided matrix spans: `batch` matrices of rows × cols with leading dimension
// ld, `stride` elements apart.
int64_t span(int rows, int cols, int ld, int64_t stride, int batch) {
  return int64_t(batch - 1) * stride + int64_t(rows - 1) * ld + cols;
}

void load_f32(float* dst, CBuf src, int64_t n) {
  switch (src.dtype) {
    case DType::BF16: {
      auto* s = static_cast<const bf16*>(src.ptr);
      for (int64_t i = 0; i < n; ++i) dst[i] = float(s[i]);
      break;
    }
    case DType::F16: {
      auto* s = static_cast<const f16*>(src.ptr);
      int64_t i = 0;
#ifdef __F16C__  // 8 at a time in hardware: the same values as the scalar conversion
      for (; i + 8 <= n; i += 8)
        _mm256_storeu_ps(dst + i, _mm256_cvtph_ps(_mm_loadu_si128(reinterpret_cast<const __m128i*>(s + i))));
#endif
      for (; i < n; ++i) dst[i] = float(s[i]);
      break;
    }
    default: std::memcpy(dst, src.ptr, size_t(n) * 4);
  }
}

void store_f32(Buf dst, const float* src, int64_t n) {
  switch (dst.dtype) {
    case DType::BF16: {
      auto* d = static_cast<bf16*>(dst.ptr);
      for (int64_t i = 0; i < n; ++i) d[i] = bf16(src[i]);
      break;
    }
    case DType::F16: {
      auto* d = static_cast<f16*>(dst.ptr);
      int64_t i = 0;
#ifdef __F16C__  // round to nearest even, as the scalar conversion
      for (; i + 8 <= n; i += 8)
        _mm_storeu_si128(reinterpret_cast<__m128i*>(d + i),
                         _mm256_cvtps_ph(_mm256_loadu_ps(src + i), _MM_FROUND_TO_NEAREST_INT));
#endif
      for (; i < n; ++i) d[i] = f16(src[i]);
      break;
    }
    default: std::memcpy(dst.ptr, src, size_t(n) * 4);
  }
}

// gelu_tanh (Hugging Face's "gelu_new") and its derivative at x, in fp32 as the CUDA kernel
// computes them: t = tanh(k (x + a x^3)), g = x (1 + t) / 2, g' = (1 + t) / 2 + x (1 - t^2) k (1 + 3 a x^2) / 2.
constexpr float kGeluK = 0.7978845608028654f;  // sqrt(2 / pi)
constexpr float kGeluA = 0.044715f;
inline void gelu_tanh(float x, float& g, float& dg) {
  const float t = std::tanh(kGeluK * (x + kGeluA * x * x * x));
  g = 0.5f * x * (1.f + t);
  dg = 0.5f * (1.f + t) + 0.5f * x * (1.f - t * t) * kGeluK * (1.f + 3.f * kGeluA * x * x);
}

// An fp32 view of n elements of a tensor: the tensor itself when it is fp32; otherwise a
// host copy converted to fp32 (when read) and, for an output, stored back rounded at
// store() or the end of the view. The copies are the CPU's emulation of 16-bit storage and
// are not in the memory ledger. A null tensor gives a null view.
class F32View {
 public:
  F32View(CBuf in, int64_t n) : out_(nullptr), n_(n) { init(in, true); }
  F32View(Buf out, int64_t n, bool read) : out_(out), n_(n) { init(out, read); }
  ~F32View() { store(); }
  F32View(const F32View&) = delete;
  F32View& operator=(const F32View&) = delete;
  void store() {
    if (out_ && !copy_.empty()) store_f32(out_, p, n_);
    out_ = nullptr;
  }
  float* p = nullptr;

 private:
  void init(CBuf b, bool read) {
    if (!b || b.dtype == DType::F32) {
      p = const_cast<float*>(static_cast<const float*>(b.ptr));
      return;
    }
    SB_ASSERT(b.dtype == DType::BF16 || b.dtype == DType::F16,
              std::string("compute on ") + dtype_name(b.dtype) + " tensors");
    copy_.resize(size_t(n_));
    p = copy_.data();
    if (read) load_f32(p, b, n_);
  }
  Buf out_;
  int64_t n_;
  std::vector<float> copy_;
};

// ---- fused attention on fp32 views: the algorithm the CUDA kernels implement ----
constexpr int kAttnTile = 64;  // query rows per tile; keys per tile = kAttentionKeyChunk
static_assert(kAttnTile == kAttentionKeyChunk, "the CPU's key tile is the bias-gradient chunk");

// The position bias of (head, query i, key j), 0 without a table.
struct AttnBias {
  const float* table;  // [num_buckets, heads] or null
  const int* rel;      // [tq + tk - 1], indexed by j - i + tq - 1
  int heads, tq;
  float at(int h, int i, int j) const {
    return table ? table[int64_t(rel[j - i + tq - 1]) * heads + h] : 0.f;
  }
};

// C[m,n] (ldc) = A B^T-or-not + beta C, row-major, fp32; `exact`: ComputeOptions::exact_sums.
void sgemm(bool exact, bool ta, bool tb, int m, int n, int k, const float* a, int lda, const float* b, int ldb,
           float beta, float* c, int ldc) {
  if (exact) return exact_sgemm(ta, tb, m, n, k, 1.f, a, lda, b, ldb, beta, c, ldc);
  cblas_sgemm(CblasRowMajor, ta ? CblasTrans : CblasNoTrans, tb ? CblasTrans : CblasNoTrans, m, n, k,
              1.f, a, lda, b, ldb, beta, c, ldc);
}

// One query tile of one (batch, head): online softmax over key tiles in ascending order.
void attention_forward_tile(bool exact, float* o, float* lse, const float* q, const float* k, const float* v,
                            const AttnBias& bias, const AttentionShape& s, int h, int i0) {
  const int D = s.d_kv, ld = int(s.ld()), br = std::min(kAttnTile, s.tq - i0);
  std::vector<float> S(kAttnTile * kAttnTile), acc(size_t(kAttnTile) * D, 0.f);
  std::vector<float> m(kAttnTile, -INFINITY), l(kAttnTile, 0.f);
  for (int j0 = 0; j0 < s.tk; j0 += kAttnTile) {
    if (s.causal && j0 > i0 + br - 1) break;  // every key of the tile is masked
    const int bc = std::min(kAttnTile, s.tk - j0);
    sgemm(exact, false, true, br, bc, D, q + int64_t(i0) * ld, ld, k + int64_t(j0) * ld, ld, 0.f, S.data(), kAttnTile);
    for (int r = 0; r < br; ++r) {
      const int i = i0 + r;
      float* row = S.data() + r * kAttnTile;
      float mx = m[r];
      for (int c = 0; c < bc; ++c) {
        const int j = j0 + c;
        row[c] = s.causal && j > i ? -INFINITY : row[c] + bias.at(h, i, j);
        mx = std::max(mx, row[c]);
      }
      if (mx == -INFINITY) {  // no valid key yet: nothing to add
        std::fill(row, row + bc, 0.f);
        continue;
      }
      const float corr = std::exp(m[r] - mx);  // 0 on the first valid tile
      l[r] *= corr;
      for (int c = 0; c < D; ++c) acc[size_t(r) * D + c] *= corr;
      m[r] = mx;
      for (int c = 0; c < bc; ++c) l[r] += (row[c] = std::exp(row[c] - mx));
    }
    sgemm(exact, false, false, br, D, bc, S.data(), kAttnTile, v + int64_t(j0) * ld, ld, 1.f, acc.data(), D);
  }
  for (int r = 0; r < br; ++r) {
    const float inv = 1.f / l[r];
    for (int c = 0; c < D; ++c) o[int64_t(i0 + r) * ld + c] = acc[size_t(r) * D + c] * inv;
    lse[i0 + r] = m[r] + std::log(l[r]);
  }
}

// o, q [B*tq, ld] and k, v [B*tk, ld]; lse [B, H, tq].
void attention_forward_f32(bool exact, float* o, float* lse, const float* q, const float* k, const float* v,
                           const AttnBias& bias, const AttentionShape& s) {
  const int64_t ld = s.ld();
  for (int b = 0; b < s.batch; ++b)
    for (int h = 0; h < s.heads; ++h) {
      const int64_t qo = int64_t(b) * s.tq * ld + int64_t(h) * s.d_kv;
      const int64_t ko = int64_t(b) * s.tk * ld + int64_t(h) * s.d_kv;
      for (int i0 = 0; i0 < s.tq; i0 += kAttnTile)
        attention_forward_tile(exact, o + qo, lse + (int64_t(b) * s.heads + h) * s.tq, q + qo, k + ko, v + ko, bias, s,
                               h, i0);
    }
}

// The pointers of one (batch, head) for the backward.
struct AttnHead {
  const float *q, *k, *v, *dout, *lse, *drow;  // drow: Σ dO⊙O per query row
  float *dq, *dk, *dv;
  float* slot;  // this key chunk's bias partial sums [tq + chunk - 1], or null
};

// Adds one query tile's dS [br, bc] to the chunk's slot, one diagonal (fixed j - i) at a
// time, rows in ascending order; slot index = j - i + tq - 1 - j0.
void add_diagonals(float* slot, const float* dS, int br, int bc, int tq, int i0) {
  for (int delta = -(br - 1); delta < bc; ++delta) {
    float t = 0.f;
    for (int r = std::max(0, -delta); r < br && r + delta < bc; ++r) t += dS[r * kAttnTile + r + delta];
    slot[tq - 1 - i0 + delta] += t;
  }
}

// Key chunk [j0, j0+bc) of one (batch, head): dK, dV of the chunk, dQ accumulated (the CPU
// runs the chunks one after another, so the order is fixed), the bias partial sums.
void attention_backward_chunk(bool exact, const AttnHead& a, const AttnBias& bias, const AttentionShape& s, int h,
                              int j0) {
  const int D = s.d_kv, ld = int(s.ld()), bc = std::min(kAttnTile, s.tk - j0);
  std::vector<float> P(kAttnTile * kAttnTile), dS(kAttnTile * kAttnTile);
  std::vector<float> dk(size_t(kAttnTile) * D, 0.f), dv(size_t(kAttnTile) * D, 0.f);
  const int first = s.causal ? j0 / kAttnTile * kAttnTile : 0;  // earlier rows see none of these keys
  for (int i0 = first; i0 < s.tq; i0 += kAttnTile) {
    const int br = std::min(kAttnTile, s.tq - i0);
    sgemm(exact, false, true, br, bc, D, a.q + int64_t(i0) * ld, ld, a.k + int64_t(j0) * ld, ld, 0.f, P.data(),
          kAttnTile);
    for (int r = 0; r < br; ++r)
      for (int c = 0; c < bc; ++c) {
        const int i = i0 + r, j = j0 + c;
        float& p = P[r * kAttnTile + c];
        p = s.causal && j > i ? 0.f : std::exp(p + bias.at(h, i, j) - a.lse[i]);
      }
    const float* dout = a.dout + int64_t(i0) * ld;
    sgemm(exact, true, false, bc, D, br, P.data(), kAttnTile, dout, ld, 1.f, dv.data(), D);  // dV += P^T dO
    sgemm(exact, false, true, br, bc, D, dout, ld, a.v + int64_t(j0) * ld, ld, 0.f, dS.data(),
          kAttnTile);  // dP = dO V^T
    for (int r = 0; r < br; ++r)
      for (int c = 0; c < bc; ++c) {
        float& g = dS[r * kAttnTile + c];
        g = P[r * kAttnTile + c] * (g - a.drow[i0 + r]);  // dS = P ⊙ (dP − Σ dO⊙O)
      }
    sgemm(exact, true, false, bc, D, br, dS.data(), kAttnTile, a.q + int64_t(i0) * ld, ld, 1.f, dk.data(),
          D);  // dK += dS^T Q
    sgemm(exact, false, false, br, D, bc, dS.data(), kAttnTile, a.k + int64_t(j0) * ld, ld, 1.f,
          a.dq + int64_t(i0) * ld, ld);  // dQ += dS K
    if (a.slot) add_diagonals(a.slot, dS.data(), br, bc, s.tq, i0);
  }
  for (int c = 0; c < bc; ++c)
    for (int x = 0; x < D; ++x) {
      a.dk[int64_t(j0 + c) * ld + x] = dk[size_t(c) * D + x];
      a.dv[int64_t(j0 + c) * ld + x] = dv[size_t(c) * D + x];
    }
}

// The second and third passes of the bias-gradient reduction (backend.h): slots → sums per
// (head, j - i) over batch then chunk → each bucket's row in ascending j - i.
void reduce_bias_gradient(float* dtable, const float* partial, float* rel, const int* rel_buckets,
                          const AttentionShape& s) {
  const int chunks = (s.tk + kAttentionKeyChunk - 1) / kAttentionKeyChunk;
  const int W = s.tq + kAttentionKeyChunk - 1, R = s.tq + s.tk - 1;
  for (int h = 0; h < s.heads; ++h)
    for (int x = 0; x < R; ++x) {  // x = j - i + tq - 1
      float t = 0.f;
      for (int b = 0; b < s.batch; ++b)
        for (int c = 0; c < chunks; ++c) {
          const int u = x - c * kAttentionKeyChunk;
          if (u >= 0 && u < W) t += partial[((int64_t(b) * s.heads + h) * chunks + c) * W + u];
        }
      rel[int64_t(h) * R + x] = t;
    }
  for (int n = 0; n < s.num_buckets; ++n)
    for (int h = 0; h < s.heads; ++h) {
      float t = 0.f;
      bool used = false;
      for (int x = 0; x < R; ++x)
        if (rel_buckets[x] == n) t += rel[int64_t(h) * R + x], used = true;
      if (used) dtable[int64_t(n) * s.heads + h] += t;
    }
}

void attention_backward_f32(bool exact, float* dq, float* dk, float* dv, float* dtable, const float* dout, const float* q,
                            const float* k, const float* v, const float* o, const float* lse, const AttnBias& bias,
                            float* ws, const AttentionShape& s) {
  const int64_t ld = s.ld(), rows = int64_t(s.batch) * s.heads * s.tq;
  const int chunks = (s.tk + kAttentionKeyChunk - 1) / kAttentionKeyChunk;
  const int W = s.tq + kAttentionKeyChunk - 1;
  float* drow = ws;  // [B, H, tq]
  float* partial = bias.table ? ws + rows : nullptr;
  for (int b = 0; b < s.batch; ++b)
    for (int h = 0; h < s.heads; ++h)
      for (int i = 0; i < s.tq; ++i) {
        const int64_t off = (int64_t(b) * s.tq + i) * ld + int64_t(h) * s.d_kv;
        float t = 0.f;
        for (int c = 0; c < s.d_kv; ++c) t += dout[off + c] * o[off + c];
        drow[(int64_t(b) * s.heads + h) * s.tq + i] = t;
      }
  for (int b = 0; b < s.batch; ++b)
    for (int h = 0; h < s.heads; ++h) {
      const int64_t qo = int64_t(b) * s.tq * ld + int64_t(h) * s.d_kv;
      const int64_t ko = int64_t(b) * s.tk * ld + int64_t(h) * s.d_kv;
      for (int i = 0; i < s.tq; ++i) std::fill(dq + qo + i * ld, dq + qo + i * ld + s.d_kv, 0.f);
      const int64_t bh = int64_t(b) * s.heads + h;
      for (int c = 0; c < chunks; ++c) {
        float* slot = partial ? partial + (bh * chunks + c) * W : nullptr;
        if (slot) std::fill(slot, slot + W, 0.f);
        const AttnHead a{q + qo, k + ko, v + ko, dout + qo, lse + bh * s.tq, drow + bh * s.tq,
                         dq + qo, dk + ko, dv + ko, slot};
        attention_backward_chunk(exact, a, bias, s, h, c * kAttentionKeyChunk);
      }
    }
  if (bias.table)
    reduce_bias_gradient(dtable, partial, partial + int64_t(s.batch) * s.heads * chunks * W, bias.rel, s);
}

// An outstanding collective, or a copy_async deferred until its `after` completes (`copy`).
struct Pending {
  MPI_Request req = MPI_REQUEST_NULL;
  MPI_Request req2 = MPI_REQUEST_NULL;  // send/recv: the receive
  std::function<void()> on_complete;    // work MPI leaves to us (avg scaling, in-place moves)
  CollectiveArgs args;
  MPI_Comm comm = MPI_COMM_NULL;
  int size = 1, rank = 0;
  int axis = -1;                        // the communicator's mesh axis
  Request id = kNoRequest;
  bool deferred = false;                // waiting for args.after (not started)
  std::vector<void*> free_after;        // release_after(): freed on completion
  OpKind kind = OpKind::AllReduce;
  Phase phase = Phase::Other;
  int unit = -1, lane = 0;
  double start = 0;
  int64_t bytes = 0;
  bool blocking = false;  // ran as a blocking call: complete when started
  // copy_async: a memcpy waiting for args.after (never in flight: done when started)
  bool copy = false;
  CopyDirection dir = CopyDirection::HostToDevice;
  void* dst = nullptr;
  const void* src = nullptr;
  size_t copy_bytes = 0;
};

// Two deferred operations that must start in issue order: collectives on one communicator,
// copies of one direction.
bool same_queue(const Pending& a, const Pending& b) {
  return a.copy == b.copy && (a.copy ? a.dir == b.dir : a.comm == b.comm);
}

class CpuBackend final : public Backend {
 public:
  CpuBackend() : epoch_(std::chrono::steady_clock::now()) {}
  ~CpuBackend() override {
    // Complete what MPI may still write into before freeing the memory.
    int finalized = 0;
    MPI_Finalized(&finalized);
    if (!finalized) issue_lazy();  // every rank issued it: it must run to match theirs
    for (auto& [id, p] : pending_) {
      MPI_Request reqs[2] = {p.req, p.req2};
      if (!finalized) MPI_Waitall(2, reqs, MPI_STATUSES_IGNORE);
      for (void* ptr : p.free_after) std::free(ptr);
    }
    for (void* p : tracked()) std::free(p);
    for (void* p : tracked_host()) std::free(p);
  }
  std::string name() const override { return "cpu"; }
  std::string device_name() const override {
    char host[256] = "?";
    gethostname(host, sizeof host - 1);
    return std::string("cpu:") + host;
  }

  // ---- memory ----
  void* alloc(size_t bytes, MemCategory cat) override {
    void* p = page_aligned(bytes, cat);
    track(p, bytes, cat);
    return p;
  }
  void release(void* p) override {
    if (!p) return;
    untrack(p);
    std::free(p);
  }
  // Host memory is this process's memory too: the same allocation, in the host ledger.
  void* alloc_host(size_t bytes, MemCategory cat) override {
    void* p = page_aligned(bytes, cat);
    track_host(p, bytes, cat);
    return p;
  }
  void release_host(void* p) override {
    if (!p) return;
    untrack_host(p);
    std::free(p);
  }
  // Page-aligned from one page up, as MPI benchmarks allocate: a buffer that starts
  // mid-page makes every page-sized piece of a shared-memory copy span two pages.
  // The page is the system's (4 KiB on x86, 64 KiB on some Arm nodes).
  static void* page_aligned(size_t bytes, MemCategory cat) {
    static const size_t page = size_t(sysconf(_SC_PAGESIZE));
    const size_t align = bytes >= page ? page : 64;
    const size_t rounded = std::max<size_t>(align, (bytes + align - 1) / align * align);
    void* p = std::aligned_alloc(align, rounded);
    if (!p) SB_FATAL("out of host memory allocating " + human_bytes(double(bytes)) + " for " +
                     mem_category_name(cat));
    return p;
  }

  // ---- host offload: copies and host compute, on this thread as everything else ----
  // A copy is a memcpy by this thread: at issue (compute issued before it has finished:
  // it ran on this thread), or, when `after` is still outstanding or an earlier copy of its
  // direction waits, deferred like a stream-ordered collective and done in the poll (or
  // wait) that sees `after` complete. Either way it is recorded on its direction's lane.
  Request copy_async(void* dst, const void* src, size_t bytes, CopyDirection dir, Request after) override {
    issue_lazy();  // a collective `after` names is in flight before the copy waits for it
    const Request id = next_id_++;
    Pending p;
    p.id = id;
    p.args.after = after;
    p.copy = true;
    p.dir = dir;
    p.dst = dst;
    p.src = src;
    p.copy_bytes = bytes;
    p.phase = phase();
    p.unit = unit();
    bool queued = false;  // an earlier copy of this direction still waits
    for (Request d : deferred_) queued = queued || same_queue(pending_.at(d), p);
    if (pending_.count(after) || queued) {
      p.deferred = true;
      pending_[id] = p;
      deferred_.push_back(id);
      return id;
    }
    run_copy(p);
    progress();
    return id;
  }
  // The host is this thread, the compute lane's: waiting for an input is the compute lane
  // waiting (recorded by wait(), lane 0); fn's time is recorded on kHostLane.
  void host_compute(const std::function<void()>& fn, int64_t bytes, const std::vector<Request>& inputs,
                    OpKind kind) override {
    for (Request r : inputs) wait(r);
    issue_lazy();
    const double t0 = now();
    fn();
    record(kind, kHostLane, t0, now(), bytes, 0.0);
    progress();
  }
  void upload(void* dst, const void* src, size_t bytes) override {
    issue_lazy();
    std::memcpy(dst, src, bytes);
  }
  int64_t device_memory_used() const override {  // resident pages of this process
    long pages = 0, resident = 0;
    FILE* f = std::fopen("/proc/self/statm", "r");
    if (!f) return -1;
    const int n = std::fscanf(f, "%ld %ld", &pages, &resident);
    std::fclose(f);
    return n == 2 ? int64_t(resident) * sysconf(_SC_PAGESIZE) : -1;
  }
  void download(void* dst, const void* src, size_t bytes) override {
    issue_lazy();
    std::memcpy(dst, src, bytes);
  }

  // ---- compute ----
  // Each operation runs its fp32 kernel on fp32 views of its tensors (F32View): bf16 and
  // fp16 tensors are loaded, computed in fp32 and stored rounded, as GPU kernels do.
  void gemm(bool ta, bool tb, int M, int N, int K, float alpha, CBuf A, int lda, CBuf B, int ldb,
            float beta, Buf C, int ldc) override {
    gemm_batched(ta, tb, M, N, K, alpha, A, lda, 0, B, ldb, 0, beta, C, ldc, 0, 1);
  }
  void gemm_batched(bool ta, bool tb, int M, int N, int K, float alpha, CBuf A, int lda, int64_t sa,
                    CBuf B, int ldb, int64_t sb, float beta, Buf C, int ldc, int64_t sc,
                    int batch) override {
    gemm_impl(ta, tb, M, N, K, alpha, A, lda, sa, B, ldb, sb, beta, C, ldc, sc, batch, false);
  }
  // Fused (--fused-epilogues): the ReLU on the fp32 result before it is stored, one
  // recorded GEMM; otherwise the default's gemm then relu_forward. The same values.
  void gemm_relu(bool ta, bool tb, int M, int N, int K, float alpha, CBuf A, int lda, CBuf B, int ldb,
                 float beta, Buf C, int ldc) override {
    if (!options_.fused_epilogues) return Backend::gemm_relu(ta, tb, M, N, K, alpha, A, lda, B, ldb, beta, C, ldc);
    SB_ASSERT(ldc == N, "gemm_relu needs a dense C (ldc == N)");
    gemm_impl(ta, tb, M, N, K, alpha, A, lda, 0, B, ldb, 0, beta, C, ldc, 0, 1, true);
  }
  void gemm_impl(bool ta, bool tb, int M, int N, int K, float alpha, CBuf A, int lda, int64_t sa,
                 CBuf B, int ldb, int64_t sb, float beta, Buf C, int ldc, int64_t sc, int batch, bool relu) {
    const double t0 = start_compute();
    const int es = dtype_size(common_dtype("gemm", {A, B, C}));
    {
      const F32View a(A, span(ta ? K : M, ta ? M : K, lda, sa, batch));
      const F32View b(B, span(tb ? N : K, tb ? K : N, ldb, sb, batch));
      // C is loaded when beta reads it, or when its span has gaps (ldc > N, sparse batch
      // strides) that the store back must leave as they were.
      const bool dense = ldc == N && (batch == 1 || sc == int64_t(M) * ldc);
      F32View c(C, span(M, N, ldc, sc, batch), /*read=*/beta != 0.f || !dense);
      const auto opa = ta ? CblasTrans : CblasNoTrans, opb = tb ? CblasTrans : CblasNoTrans;
      for (int i = 0; i < batch; ++i)
        if (options_.exact_sums)
          exact_sgemm(ta, tb, M, N, K, alpha, a.p + i * sa, lda, b.p + i * sb, ldb, beta, c.p + i * sc, ldc);
        else
          cblas_sgemm(CblasRowMajor, opa, opb, M, N, K, alpha, a.p + i * sa, lda, b.p + i * sb, ldb, beta,
                      c.p + i * sc, ldc);
      if (relu)  // dense and one matrix: gemm_relu's contract
        for (int64_t i = 0; i < int64_t(M) * N; ++i) c.p[i] = c.p[i] > 0.f ? c.p[i] : 0.f;
    }
    const int32_t shape[5] = {M, N, K, batch, int(ta) | int(tb) << 1};
    done(OpKind::Gemm, t0, es * int64_t(batch) * (int64_t(M) * K + int64_t(K) * N + 2 * int64_t(M) * N),
         2.0 * M * N * K * batch, shape);
  }
  void embedding_forward(Buf out, CBuf table, const int* ids, int n, int d) override {
    const double t0 = start_compute();
    const int es = dtype_size(common_dtype("embedding_forward", {out, table}));
    // A row gather moves elements unchanged, whatever their type.
    auto* o = static_cast<char*>(out.ptr);
    auto* t = static_cast<const char*>(table.ptr);
    for (int i = 0; i < n; ++i)
      if (ids[i] >= 0) std::memcpy(o + int64_t(i) * d * es, t + int64_t(ids[i]) * d * es, size_t(d) * es);
      else std::memset(o + int64_t(i) * d * es, 0, size_t(d) * es);
    done(OpKind::Elementwise, t0, 2 * es * int64_t(n) * d);
  }
  void embedding_backward(Buf dtable, CBuf dout, const int* ids, int n, int d) override {
    const double t0 = start_compute();
    const int es = dtype_size(common_dtype("embedding_backward", {dtable, dout}));
    const int rows = *std::max_element(ids, ids + n) + 1;
    F32View table(dtable, int64_t(rows) * d, true);
    const F32View g(dout, int64_t(n) * d);
    for (int i = 0; i < n; ++i) {
      if (ids[i] < 0) continue;  // another tensor-parallel rank's row
      float* row = table.p + int64_t(ids[i]) * d;
      const float* gi = g.p + int64_t(i) * d;
      for (int j = 0; j < d; ++j) row[j] += gi[j];
    }
    table.store();  // inside the timed operation
    done(OpKind::Elementwise, t0, 3 * es * int64_t(n) * d);
  }
  void rmsnorm_forward(Buf out, float* rstd, CBuf x, CBuf w, int n, int d, float eps) override {
    const double t0 = start_compute();
    const int es = dtype_size(common_dtype("rmsnorm_forward", {out, x, w}));
    rmsnorm_rows(out, rstd, x, w, n, d, eps);
    done(OpKind::Elementwise, t0, 2 * es * int64_t(n) * d);
  }
  void rmsnorm_rows(Buf out, float* rstd, CBuf x, CBuf w, int n, int d, float eps) {
    const int64_t nd = int64_t(n) * d;
    F32View o(out, nd, false);
    const F32View xv(x, nd), wv(w, d);
    for (int i = 0; i < n; ++i) {
      const float* xi = xv.p + int64_t(i) * d;
      float* oi = o.p + int64_t(i) * d;
      double ss = 0;
      for (int j = 0; j < d; ++j) ss += double(xi[j]) * xi[j];
      const float r = float(1.0 / std::sqrt(ss / d + eps));
      rstd[i] = r;
      for (int j = 0; j < d; ++j) oi[j] = xi[j] * r * wv.p[j];
    }
    o.store();
  }
  // Fused (--fused-epilogues): the rows of x copied into residual in the same pass, as
  // stored (bit-identical to copy()); otherwise the default's rmsnorm_forward then copy.
  void rmsnorm_forward_residual(Buf out, float* rstd, Buf residual, CBuf x, CBuf w, int n, int d,
                                float eps) override {
    if (!options_.fused_epilogues) return Backend::rmsnorm_forward_residual(out, rstd, residual, x, w, n, d, eps);
    const double t0 = start_compute();
    const int es = dtype_size(common_dtype("rmsnorm_forward_residual", {out, residual, x, w}));
    const int64_t nd = int64_t(n) * d;
    std::memcpy(residual.ptr, x.ptr, size_t(nd) * es);
    rmsnorm_rows(out, rstd, x, w, n, d, eps);
    done(OpKind::Elementwise, t0, 3 * es * nd);
  }
  void rmsnorm_backward(Buf dx, Buf dw, CBuf dout, CBuf x, CBuf w, const float* rstd, int n,
                        int d) override {
    const double t0 = start_compute();
    const int es = dtype_size(common_dtype("rmsnorm_backward", {dx, dw, dout, x, w}));
    const int64_t nd = int64_t(n) * d;
    F32View dxv(dx, nd, true), dwv(dw, d, true);
    const F32View g(dout, nd), xv(x, nd), wv(w, d);
    for (int i = 0; i < n; ++i) {
      const float* xi = xv.p + int64_t(i) * d;
      const float* gi = g.p + int64_t(i) * d;
      float* dxi = dxv.p + int64_t(i) * d;
      const float r = rstd[i];
      // out_j = x_j r w_j, r = (mean x^2 + eps)^-1/2  ⇒  dx_j = r (g_j w_j − x_j r² mean_k(g_k w_k x_k))
      double dot = 0;
      for (int j = 0; j < d; ++j) dot += double(gi[j]) * wv.p[j] * xi[j];
      const float c = float(dot / d) * r * r;
      for (int j = 0; j < d; ++j) {
        dxi[j] += r * (gi[j] * wv.p[j] - xi[j] * c);
        dwv.p[j] += gi[j] * xi[j] * r;
      }
    }
    dxv.store();
    dwv.store();
    done(OpKind::Elementwise, t0, 4 * es * nd);
  }
  void relu_forward(Buf x, int64_t n) override {
    const double t0 = start_compute();
    F32View v(x, n, true);
    for (int64_t i = 0; i < n; ++i) v.p[i] = v.p[i] > 0.f ? v.p[i] : 0.f;
    v.store();
    done(OpKind::Elementwise, t0, 2 * dtype_size(x.dtype) * n);
  }
  void relu_backward(Buf dy, CBuf y, int64_t n) override {
    const double t0 = start_compute();
    const int es = dtype_size(common_dtype("relu_backward", {dy, y}));
    {
      F32View g(dy, n, true);
      const F32View yv(y, n);
      for (int64_t i = 0; i < n; ++i) g.p[i] = yv.p[i] > 0.f ? g.p[i] : 0.f;
    }
    done(OpKind::Elementwise, t0, 3 * es * n);
  }
  void gated_gelu_forward(Buf h, CBuf u, CBuf v, int64_t n) override {
    const double t0 = start_compute();
    const int es = dtype_size(common_dtype("gated_gelu_forward", {h, u, v}));
    {
      F32View hv(h, n, false);
      const F32View uv(u, n), vv(v, n);
      for (int64_t i = 0; i < n; ++i) {
        float g, dg;
        gelu_tanh(uv.p[i], g, dg);
        hv.p[i] = g * vv.p[i];
      }
    }
    done(OpKind::Elementwise, t0, 3 * es * n);
  }
  void gated_gelu_backward(Buf du, Buf dv, CBuf dh, CBuf u, CBuf v, int64_t n) override {
    const double t0 = start_compute();
    const int es = dtype_size(common_dtype("gated_gelu_backward", {du, dv, dh, u, v}));
    {
      // dh is read into its own view first, so du may be dh (each element is read, then written).
      const F32View dhv(dh, n), uv(u, n), vv(v, n);
      F32View duv(du, n, false), dvv(dv, n, false);
      for (int64_t i = 0; i < n; ++i) {
        float g, dg;
        gelu_tanh(uv.p[i], g, dg);
        const float d = dhv.p[i];
        dvv.p[i] = d * g;
        duv.p[i] = d * vv.p[i] * dg;
      }
    }
    done(OpKind::Elementwise, t0, 5 * es * n);
  }
  void add(Buf y, CBuf x, int64_t n) override {
    const double t0 = start_compute();
    const int es = dtype_size(common_dtype("add", {y, x}));
    {
      F32View yv(y, n, true);
      const F32View xv(x, n);
      for (int64_t i = 0; i < n; ++i) yv.p[i] += xv.p[i];
    }
    done(OpKind::Elementwise, t0, 3 * es * n);
  }
  void scale(Buf x, float a, int64_t n) override {
    const double t0 = start_compute();
    F32View v(x, n, true);
    for (int64_t i = 0; i < n; ++i) v.p[i] *= a;
    v.store();
    done(OpKind::Elementwise, t0, 2 * dtype_size(x.dtype) * n);
  }
  void copy(Buf dst, CBuf src, int64_t n) override {
    const double t0 = start_compute();
    const int es = dtype_size(common_dtype("copy", {dst, src}));
    std::memcpy(dst.ptr, src.ptr, size_t(n) * es);
    done(OpKind::Copy, t0, 2 * es * n);
  }
  void cast(Buf dst, CBuf src, int64_t n) override {
    const double t0 = start_compute();
    if (dst.dtype == src.dtype) {
      std::memcpy(dst.ptr, src.ptr, size_t(n) * dtype_size(src.dtype));
    } else {
      const F32View s(src, n);
      store_f32(dst, s.p, n);
    }
    done(OpKind::Copy, t0, (dtype_size(dst.dtype) + dtype_size(src.dtype)) * n);
  }
  void fill(Buf x, float value, int64_t n) override {
    const double t0 = start_compute();
    const int es = dtype_size(x.dtype);
    switch (x.dtype) {
      case DType::BF16: std::fill_n(static_cast<bf16*>(x.ptr), n, bf16(value)); break;
      case DType::F16: std::fill_n(static_cast<f16*>(x.ptr), n, f16(value)); break;
      default: std::fill_n(static_cast<float*>(x.ptr), n, value);
    }
    done(OpKind::Elementwise, t0, es * n);
  }
  void init_uniform(float* x, int64_t n, uint64_t key, int64_t first, float scale) override {
    const double t0 = start_compute();
    for (int64_t i = 0; i < n; ++i) x[i] = scale * uniform_pm1(key, uint64_t(first + i));
    done(OpKind::Elementwise, t0, 4 * n);
  }
  void position_bias_forward(Buf bias, CBuf table, const int* buckets, int heads, int tq,
                             int tk) override {
    const double t0 = start_compute();
    const int es = dtype_size(common_dtype("position_bias_forward", {bias, table}));
    const int64_t tt = int64_t(tq) * tk;
    const int rows = *std::max_element(buckets, buckets + tt) + 1;
    {
      F32View b(bias, heads * tt, false);
      const F32View t(table, int64_t(rows) * heads);
      for (int h = 0; h < heads; ++h)
        for (int64_t ij = 0; ij < tt; ++ij) b.p[h * tt + ij] = t.p[int64_t(buckets[ij]) * heads + h];
    }
    done(OpKind::Elementwise, t0, 2 * es * heads * tt);
  }
  void position_bias_backward(Buf dtable, CBuf dbias, const int* buckets, int heads, int tq,
                              int tk) override {
    const double t0 = start_compute();
    const int es = dtype_size(common_dtype("position_bias_backward", {dtable, dbias}));
    const int64_t tt = int64_t(tq) * tk;
    const int rows = *std::max_element(buckets, buckets + tt) + 1;
    {
      F32View t(dtable, int64_t(rows) * heads, true);
      const F32View b(dbias, heads * tt);
      for (int h = 0; h < heads; ++h)
        for (int64_t ij = 0; ij < tt; ++ij) t.p[int64_t(buckets[ij]) * heads + h] += b.p[h * tt + ij];
    }
    done(OpKind::Elementwise, t0, 2 * es * heads * tt);
  }
  void softmax_forward(Buf scores, CBuf bias, bool causal, int batch, int heads, int tq,
                       int tk) override {
    const double t0 = start_compute();
    const int es = dtype_size(common_dtype("softmax_forward", {scores, bias}));
    {
      F32View sv(scores, int64_t(batch) * heads * tq * tk, true);
      const F32View bv(bias, int64_t(heads) * tq * tk);
      for (int b = 0; b < batch; ++b)
        for (int h = 0; h < heads; ++h)
          for (int i = 0; i < tq; ++i) {
            float* row = sv.p + ((int64_t(b) * heads + h) * tq + i) * tk;
            const float* brow = bv.p ? bv.p + (int64_t(h) * tq + i) * tk : nullptr;
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
    }
    done(OpKind::Elementwise, t0, 2 * es * int64_t(batch) * heads * tq * tk);
  }
  void softmax_backward(Buf ds, CBuf p, Buf dbias, int batch, int heads, int tq, int tk) override {
    const double t0 = start_compute();
    const int es = dtype_size(common_dtype("softmax_backward", {ds, p, dbias}));
    {
      const int64_t total = int64_t(batch) * heads * tq * tk;
      F32View g(ds, total, true);
      const F32View pv(p, total);
      F32View db(dbias, int64_t(heads) * tq * tk, true);
      for (int b = 0; b < batch; ++b)
        for (int h = 0; h < heads; ++h)
          for (int i = 0; i < tq; ++i) {
            const int64_t off = ((int64_t(b) * heads + h) * tq + i) * tk;
            float* gi = g.p + off;
            const float* pr = pv.p + off;
            float dot = 0.f;
            for (int j = 0; j < tk; ++j) dot += gi[j] * pr[j];
            for (int j = 0; j < tk; ++j) gi[j] = pr[j] * (gi[j] - dot);
            if (db.p) {
              float* dbi = db.p + (int64_t(h) * tq + i) * tk;
              for (int j = 0; j < tk; ++j) dbi[j] += gi[j];
            }
          }
    }
    done(OpKind::Elementwise, t0, 3 * es * int64_t(batch) * heads * tq * tk);
  }
  void attention_forward(Buf o, float* lse, CBuf q, CBuf k, CBuf v, CBuf table, const int* rel_buckets,
                         const AttentionShape& s) override {
    const double t0 = start_compute();
    const int es = dtype_size(common_dtype("attention_forward", {o, q, k, v, table}));
    const int64_t nq = int64_t(s.batch) * s.tq * s.ld(), nk = int64_t(s.batch) * s.tk * s.ld();
    {
      F32View ov(o, nq, false);
      const F32View qv(q, nq), kv(k, nk), vv(v, nk), tv(table, int64_t(s.num_buckets) * s.heads);
      attention_forward_f32(options_.exact_sums, ov.p, lse, qv.p, kv.p, vv.p, AttnBias{tv.p, rel_buckets, s.heads, s.tq}, s);
    }
    done(OpKind::Gemm, t0, es * (2 * nq + 2 * nk), attention_flops(s, false), attention_gemm_shape(s, false).data());
  }
  void attention_backward(Buf dq, Buf dk, Buf dv, Buf dtable, CBuf dout, CBuf q, CBuf k, CBuf v, CBuf o,
                          const float* lse, CBuf table, const int* rel_buckets, float* workspace,
                          const AttentionShape& s) override {
    const double t0 = start_compute();
    const int es = dtype_size(common_dtype("attention_backward", {dq, dk, dv, dtable, dout, q, k, v, o, table}));
    SB_ASSERT(!table || dtable, "attention_backward with a bias table needs its gradient");
    const int64_t nq = int64_t(s.batch) * s.tq * s.ld(), nk = int64_t(s.batch) * s.tk * s.ld();
    {
      F32View dqv(dq, nq, false), dkv(dk, nk, false), dvv(dv, nk, false);
      F32View dtv(table ? dtable : Buf(), int64_t(s.num_buckets) * s.heads, true);
      const F32View gv(dout, nq), qv(q, nq), kv(k, nk), vv(v, nk), ov(o, nq);
      const F32View tv(table, int64_t(s.num_buckets) * s.heads);
      attention_backward_f32(options_.exact_sums, dqv.p, dkv.p, dvv.p, dtv.p, gv.p, qv.p, kv.p, vv.p, ov.p, lse,
                             AttnBias{tv.p, rel_buckets, s.heads, s.tq}, workspace, s);
    }
    done(OpKind::Gemm, t0, es * (4 * nq + 4 * nk), attention_flops(s, true), attention_gemm_shape(s, true).data());
  }
  void cross_entropy(Buf logits, float* losses, const int* labels, int n, int vocab,
                     float grad_scale) override {
    const double t0 = start_compute();
    {
      F32View lv(logits, int64_t(n) * vocab, true);
      for (int i = 0; i < n; ++i) {
        float* row = lv.p + int64_t(i) * vocab;
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
    }
    done(OpKind::Elementwise, t0, 2 * dtype_size(logits.dtype) * int64_t(n) * vocab);
  }
  void cross_entropy_max(CBuf logits, float* row_max, int n, int vocab) override {
    const double t0 = start_compute();
    const F32View lv(logits, int64_t(n) * vocab);
    for (int i = 0; i < n; ++i) {
      const float* row = lv.p + int64_t(i) * vocab;
      float mx = -INFINITY;
      for (int j = 0; j < vocab; ++j) mx = std::max(mx, row[j]);
      row_max[i] = mx;
    }
    done(OpKind::Elementwise, t0, dtype_size(logits.dtype) * int64_t(n) * vocab);
  }
  void cross_entropy_sums(CBuf logits, const float* row_max, const int* labels, float* sums, int n,
                          int vocab) override {
    const double t0 = start_compute();
    const F32View lv(logits, int64_t(n) * vocab);
    std::vector<float> terms;
    for (int i = 0; i < n; ++i) {
      const float* row = lv.p + int64_t(i) * vocab;
      if (options_.exact_sums) {  // the terms as the double sum below takes them, summed exactly
        terms.resize(size_t(vocab));
        for (int j = 0; j < vocab; ++j) terms[size_t(j)] = std::exp(row[j] - row_max[i]);
        sums[i] = exact_sum(terms.data(), vocab);
      } else {
        double sum = 0;
        for (int j = 0; j < vocab; ++j) sum += std::exp(row[j] - row_max[i]);
        sums[i] = float(sum);
      }
      sums[n + i] = labels[i] >= 0 ? row[labels[i]] : 0.f;
    }
    done(OpKind::Elementwise, t0, dtype_size(logits.dtype) * int64_t(n) * vocab);
  }
  void cross_entropy_finish(Buf logits, float* losses, const float* row_max, const float* sums, const int* labels,
                            int n, int vocab, float grad_scale) override {
    const double t0 = start_compute();
    {
      F32View lv(logits, int64_t(n) * vocab, true);
      for (int i = 0; i < n; ++i) {
        float* row = lv.p + int64_t(i) * vocab;
        losses[i] = std::log(sums[i]) + row_max[i] - sums[n + i];
        const float k = grad_scale / sums[i];
        for (int j = 0; j < vocab; ++j) row[j] = std::exp(row[j] - row_max[i]) * k;
        if (labels[i] >= 0) row[labels[i]] -= grad_scale;
      }
    }
    done(OpKind::Elementwise, t0, 2 * dtype_size(logits.dtype) * int64_t(n) * vocab);
  }
  bool all_finite(CBuf x, int64_t n) override {
    const double t0 = start_compute();
    const F32View v(x, n);
    bool finite = true;
    for (int64_t i = 0; i < n; ++i) finite &= std::isfinite(v.p[i]);
    done(OpKind::Elementwise, t0, dtype_size(x.dtype) * n);
    return finite;
  }
  // The host optimizer (backend/host_optimizer.h), on this rank's one core.
  void optimizer_update(const OptimizerConfig& c, int step, float* p, CBuf g, void* state, int64_t n,
                        Buf copy) override {
    const double t0 = start_compute();
    host_optimizer_update(c, step, p, g, state, n, copy, /*threads=*/1);
    done(OpKind::Optimizer, t0, optimizer_bytes_touched(c, n, g.dtype, copy));
  }
  void optimizer_init_state(const OptimizerConfig& c, void* state, int64_t n) override {
    const double t0 = start_compute();
    host_optimizer_init_state(c, state, n);
    done(OpKind::Elementwise, t0, optimizer_state_bytes(c, n));
  }

  // ---- collectives ----
  std::unique_ptr<Comm> make_comm(MPI_Comm c) override { return std::make_unique<MpiComm>(c); }

  // Every type and reduction; bfloat16 and half reduce through user-defined MPI operations
  // (MPI has no 16-bit float arithmetic) that compute in fp32 and round, as NCCL does.
  //
  // A collective is issued lazily: collective() keeps it (`lazy_`) and the next backend call
  // decides the path. wait() on it, before any other call, runs MPI's blocking collective
  // (the tuned algorithms applications use; Open MPI's non-blocking ones are libnbc's,
  // slower for a collective that is waited on at once). Any other call first starts it
  // non-blocking, so it overlaps that call's work. The path follows the order of backend
  // calls, which is the same on every rank, so all ranks take the same one (a blocking
  // collective does not match a non-blocking one).
  // A collective stream-ordered after one still outstanding (CollectiveArgs::after) waits in
  // `deferred_` and starts in the poll that sees it complete; collectives on a communicator
  // start in issue order (MPI requires the same order on every rank).
  // A point-to-point send or receive starts at once, non-blocking: its two ranks issue it at
  // different points of different schedules, so no order across ranks can be assumed.
  Request collective(const CollectiveArgs& a, Comm& c) override {
    require_supported(a);
    issue_lazy();
    const Request id = next_id_++;
    Pending& p = pending_[id];
    p.id = id;
    p.args = a;
    p.comm = mpi(c);
    p.size = c.size();
    p.rank = c.rank();
    p.axis = c.axis();
    p.phase = phase();
    p.unit = unit();
    if (collective_info(a.op).point_to_point) {
      start(p, false);
    } else if (pending_.count(a.after) || comm_deferred(p.comm)) {
      p.deferred = true;
      deferred_.push_back(id);
    } else if (blocking_when_waited_) {
      p.deferred = true;  // not started until the next call says how
      lazy_ = id;
    } else {
      start(p, false);
    }
    return id;
  }

  void release_after(void* ptr, Request r) override {
    if (!ptr) return;
    untrack(ptr);
    auto it = pending_.find(r);
    if (it == pending_.end()) std::free(ptr);
    else it->second.free_after.push_back(ptr);  // freed when r completes
  }

 private:
  // Starts p's MPI operation: blocking, it has completed on return (no request); otherwise it
  // is in flight on p.req (and p.req2).
  void start(Pending& p, bool blocking) {
    const CollectiveArgs& a = p.args;
    const MPI_Comm comm = p.comm;
    const int n = p.size, r = p.rank, es = dtype_size(a.dtype);
    const MPI_Datatype t = mpi_type(a.dtype);
    const MPI_Op op = mpi_op(a.redop, a.dtype);
    const int cnt = mpi_count(a.count);
    auto* send = static_cast<const char*>(a.send);
    auto* recv = static_cast<char*>(a.recv);
    MPI_Request* req = &p.req;
    p.deferred = false;
    p.blocking = blocking;
    begin(p, collective_kind(a.op), collective_bytes(a, n));
    switch (a.op) {
      case Collective::AllReduce: {
        const void* s = send == recv ? MPI_IN_PLACE : send;
        MPI_CHECK(blocking ? MPI_Allreduce(s, recv, cnt, t, op, comm) : MPI_Iallreduce(s, recv, cnt, t, op, comm, req));
        p.on_complete = average(a, recv, a.count, n);
        break;
      }
      case Collective::AllGather: {
        const void* s = send == recv + int64_t(r) * a.count * es ? MPI_IN_PLACE : send;
        MPI_CHECK(blocking ? MPI_Allgather(s, cnt, t, recv, cnt, t, comm)
                           : MPI_Iallgather(s, cnt, t, recv, cnt, t, comm, req));
        break;
      }
      case Collective::ReduceScatter: {
        // MPI leaves the in-place result at the start of the buffer; NCCL at this rank's slice.
        const bool in_place = recv == send + int64_t(r) * a.count * es;
        char* out = in_place ? const_cast<char*>(send) : recv;
        const void* s = in_place ? MPI_IN_PLACE : send;
        // Blocking: MPI_Reduce_scatter with equal counts, whose tuned algorithms (recursive
        // halving, ring) Open MPI 4.1 does not use for MPI_Reduce_scatter_block.
        if (blocking) {
          equal_counts_.assign(size_t(n), cnt);
          MPI_CHECK(MPI_Reduce_scatter(s, out, equal_counts_.data(), t, op, comm));
        } else {
          MPI_CHECK(MPI_Ireduce_scatter_block(s, out, cnt, t, op, comm, req));
        }
        auto avg = average(a, out, a.count, n);
        if (out == recv) {
          p.on_complete = avg;
        } else {
          p.on_complete = [=] {
            if (avg) avg();
            std::memmove(recv, out, size_t(a.count) * es);
          };
        }
        break;
      }
      case Collective::Broadcast: {
        if (r == a.root && send != recv) std::memcpy(recv, send, size_t(a.count) * es);
        MPI_CHECK(blocking ? MPI_Bcast(recv, cnt, t, a.root, comm) : MPI_Ibcast(recv, cnt, t, a.root, comm, req));
        break;
      }
      case Collective::Reduce: {
        const void* s = (r == a.root && send == recv) ? MPI_IN_PLACE : send;
        MPI_CHECK(blocking ? MPI_Reduce(s, recv, cnt, t, op, a.root, comm)
                           : MPI_Ireduce(s, recv, cnt, t, op, a.root, comm, req));
        if (r == a.root) p.on_complete = average(a, recv, a.count, n);
        break;
      }
      case Collective::AllToAll: {
        SB_ASSERT(a.count % n == 0 && send != recv, "all-to-all needs count divisible by ranks, out of place");
        const int per = mpi_count(a.count / n);
        MPI_CHECK(blocking ? MPI_Alltoall(send, per, t, recv, per, t, comm)
                           : MPI_Ialltoall(send, per, t, recv, per, t, comm, req));
        break;
      }
      case Collective::SendRecv: {
        SB_ASSERT(send != recv, "send-recv is out of place");
        const int to = (r + 1) % n, from = (r - 1 + n) % n;
        if (blocking) {
          MPI_CHECK(MPI_Sendrecv(send, cnt, t, to, 0, recv, cnt, t, from, 0, comm, MPI_STATUS_IGNORE));
        } else {
          MPI_CHECK(MPI_Irecv(recv, cnt, t, from, 0, comm, &p.req2));
          MPI_CHECK(MPI_Isend(send, cnt, t, to, 0, comm, req));
        }
        break;
      }
      case Collective::Send: MPI_CHECK(MPI_Isend(send, cnt, t, a.peer, a.tag, comm, req)); break;
      case Collective::Recv: MPI_CHECK(MPI_Irecv(recv, cnt, t, a.peer, a.tag, comm, req)); break;
      default: SB_FATAL("unknown collective");
    }
    lane_busy_[p.lane - 1] = true;
  }
  // Starts the lazy collective, if any, non-blocking: some other work comes first.
  void issue_lazy() {
    if (lazy_ == kNoRequest) return;
    Pending& p = pending_.at(lazy_);
    lazy_ = kNoRequest;
    start(p, false);
  }
  // The start of every compute operation: what is lazy overlaps it.
  double start_compute() {
    issue_lazy();
    return now();
  }
  bool comm_deferred(MPI_Comm c) const {
    for (Request d : deferred_)
      if (!pending_.at(d).copy && pending_.at(d).comm == c) return true;
    return false;
  }

 public:
  void wait(Request r) override {
    if (lazy_ == r && r != kNoRequest) {  // waited on at once: the blocking call
      lazy_ = kNoRequest;
      start(pending_.at(r), true);
    } else {
      issue_lazy();
    }
    auto it = pending_.find(r);
    if (it == pending_.end()) return;  // already completed by a poll
    const double t0 = it->second.blocking ? it->second.start : now();  // a blocking call's wait is the call
    complete(r);
    record(OpKind::Wait, 0, t0, now(), 0, 0.0, nullptr, r);
    poll();
  }
  bool test(Request r) override {
    issue_lazy();
    poll();
    return pending_.find(r) == pending_.end();
  }
  void synchronize() override { issue_lazy(); }

  double now() const override {
    return std::chrono::duration<double>(std::chrono::steady_clock::now() - epoch_).count();
  }

 private:
  static MPI_Comm mpi(Comm& c) { return static_cast<MpiComm&>(c).comm; }
  static MPI_Datatype mpi_type(DType t) { return mpi_datatype(t); }
  MPI_Op mpi_op(ReduceOp o, DType t) { return reductions_.op(o, t); }
  static std::function<void()> average(const CollectiveArgs& a, void* buf, int64_t n, int ranks) {
    if (a.redop != ReduceOp::Avg) return {};
    const DType t = a.dtype;
    return [=] { divide_elements(buf, n, t, ranks); };
  }

  // Records a compute operation and lets outstanding collectives advance.
  void done(OpKind kind, double t0, int64_t bytes, double flops = 0.0,
            const int32_t* gemm_shape = nullptr) {
    record(kind, 0, t0, now(), bytes, flops, gemm_shape);
    progress();
  }
  // Lets outstanding collectives advance after work of this thread.
  void progress() {
    const double t1 = now();
    if (pending_.empty()) return;
    // MPI's reductions and copies for outstanding collectives run here, on this thread:
    // communication work the compute lane pays for, recorded as such.
    poll();
    record(OpKind::Progress, 0, t1, now(), 0, 0.0);
  }

  void begin(Pending& p, OpKind kind, int64_t bytes) {
    p.kind = kind;
    p.start = now();
    p.bytes = bytes;
    p.lane = free_lane();
  }
  // Communication lanes are assigned first-free, so events never overlap within a lane.
  int free_lane() {
    for (size_t i = 0; i < lane_busy_.size(); ++i)
      if (!lane_busy_[i]) return int(i) + 1;
    lane_busy_.push_back(false);
    return int(lane_busy_.size());
  }
  // p's MPI operation has completed: MPI's leftover work, the event, deferred frees.
  void finish(const Pending& p) {
    if (p.copy) return;  // run_copy recorded it
    if (p.on_complete) p.on_complete();
    lane_busy_[p.lane - 1] = false;
    if (recorder_) {
      OpEvent e{p.kind, p.phase, p.unit, p.lane, p.start, now(), p.bytes, 0.0, {0, 0, 0, 0, 0}};
      e.request = p.id;
      e.ranks = p.size;
      e.axis = p.axis;
      e.peer = p.args.peer;
      recorder_->on_op(e);
    }
    for (void* ptr : p.free_after) std::free(ptr);
  }
  // Blocks until collective r has completed, starting what it is stream-ordered after.
  void complete(Request r) {
    while (pending_.count(r)) {
      Pending& p = pending_.at(r);
      if (p.deferred) {  // first the earlier deferred one on its communicator, or its `after`
        Request dep = p.args.after;
        for (Request d : deferred_) {
          if (d == r) break;
          if (same_queue(pending_.at(d), p)) {
            dep = d;
            break;
          }
        }
        complete(dep);
        start_deferred();
        continue;
      }
      MPI_Request reqs[2] = {p.req, p.req2};
      MPI_CHECK(MPI_Waitall(2, reqs, MPI_STATUSES_IGNORE));
      finish(p);
      pending_.erase(r);
    }
  }
  // Starts, in issue order, the deferred collectives whose `after` has completed and that
  // no earlier deferred one on the same communicator holds back.
  // A copy runs (and completes) here.
  void start_deferred() {
    std::vector<const Pending*> held;
    for (auto it = deferred_.begin(); it != deferred_.end();) {
      Pending& p = pending_.at(*it);
      bool blocked = false;
      for (const Pending* h : held) blocked = blocked || same_queue(*h, p);
      if (!blocked && !pending_.count(p.args.after)) {
        if (p.copy) {
          run_copy(p);
          for (void* ptr : p.free_after) std::free(ptr);
          pending_.erase(*it);
        } else {
          start(p, false);
        }
        it = deferred_.erase(it);
      } else {
        held.push_back(&p);
        ++it;
      }
    }
  }
  // The memcpy of a copy_async, recorded on its direction's lane with the phase and unit
  // of its issue.
  void run_copy(const Pending& p) {
    const double t0 = now();
    if (p.copy_bytes) std::memcpy(p.dst, p.src, p.copy_bytes);
    if (!recorder_) return;
    OpEvent e{OpKind::Copy, p.phase, p.unit, p.dir == CopyDirection::HostToDevice ? kCopyH2DLane : kCopyD2HLane,
              t0, now(), int64_t(p.copy_bytes), 0.0, {0, 0, 0, 0, 0}};
    e.request = p.id;
    e.after = p.args.after;
    record(e);
  }
  void poll() {
    for (auto it = pending_.begin(); it != pending_.end();) {
      if (it->second.deferred) {
        ++it;
        continue;
      }
      int flag = 0;
      MPI_Request reqs[2] = {it->second.req, it->second.req2};
      MPI_CHECK(MPI_Testall(2, reqs, &flag, MPI_STATUSES_IGNORE));
      it->second.req = reqs[0];
      it->second.req2 = reqs[1];
      if (flag) {
        finish(it->second);
        it = pending_.erase(it);
      } else {
        ++it;
      }
    }
    if (!deferred_.empty()) start_deferred();
  }

  std::chrono::steady_clock::time_point epoch_;
  std::unordered_map<Request, Pending> pending_;
  MpiReductions reductions_;  // user-defined operations of bfloat16 and half
  std::vector<Request> deferred_;  // not started yet, in issue order (waiting for `after`)
  Request lazy_ = kNoRequest;      // issued, not started: its next call decides how
  std::vector<int> equal_counts_;  // recvcounts of a blocking reduce-scatter
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
