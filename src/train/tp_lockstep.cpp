// The tensor-parallel lockstep of --check (tp_lockstep.h, docs/reliability.md).
#include "shardbench/train/tp_lockstep.h"

#include <cinttypes>
#include <cmath>
#include <cstdio>
#include <cstring>
#include <limits>
#include <map>

#include "shardbench/core/check.h"
#include "shardbench/train/reference_step.h"

namespace sb {
namespace {

constexpr double kU = 0x1p-24;     // fp32's unit roundoff
constexpr double kEta = 0x1p-150;  // half fp32's smallest subnormal: a rounding's absolute error below the normal range
// The bound is itself computed in double: each element's budget is a sum of fewer than 2^20
// non-negative terms (two roundings per decoder block at most, L <= 1024) and the group's
// sum of T of them, each addition relatively within 2^-53, so it is low by less than 2^-33
// of itself. Raised by 2^-30 of itself, it is an upper bound.
constexpr double kBoundArithmetic = 1 + 0x1p-30;

// Each buffer's rounding budget since the last sum over the group that read it: per
// element, Σ (u·|acc| + η) over the roundings into it (T5Step::GroupSumHook::rounded).
class Budgets {
 public:
  void clear() { by_buffer_.clear(); }
  void add(Backend& b, CBuf acc, int64_t n) {
    SB_ASSERT(acc.dtype == DType::F32, "the tensor-parallel lockstep runs in fp32");
    std::vector<float> v(static_cast<size_t>(n));
    b.download(v.data(), acc.ptr, size_t(n) * 4);
    std::vector<double>& e = by_buffer_[acc.ptr];
    if (int64_t(e.size()) != n) e.assign(size_t(n), 0.0);
    for (size_t i = 0; i < v.size(); ++i) e[i] += kU * std::fabs(double(v[i])) + kEta;
  }
  // The budget of the buffer at p (zero where nothing was rounded into it), then forgotten:
  // the next product into it starts afresh.
  std::vector<double> take(const void* p, int64_t n) {
    auto it = by_buffer_.find(p);
    if (it == by_buffer_.end() || int64_t(it->second.size()) != n) {
      if (it != by_buffer_.end()) by_buffer_.erase(it);
      return std::vector<double>(size_t(n), 0.0);
    }
    std::vector<double> e = std::move(it->second);
    by_buffer_.erase(it);
    return e;
  }

 private:
  std::map<const void*, std::vector<double>> by_buffer_;
};

// One sum over the group as the full model made it.
struct GroupSum {
  std::string what, where;
  int op = 0;                  // ReduceOp
  std::vector<float> value;    // F
  std::vector<double> budget;  // β_F
};

std::vector<float> download(Backend& b, CBuf x, int64_t n) {
  std::vector<float> v(static_cast<size_t>(n));
  b.download(v.data(), x.ptr, size_t(n) * 4);
  return v;
}

// The full model: records each sum (nothing to sum in a group of one).
class SumRecorder final : public T5Step::GroupSumHook {
 public:
  SumRecorder(Backend& b, std::vector<GroupSum>& out, const std::string& where) : b_(b), out_(out), where_(where) {}
  void rounded(CBuf acc, int64_t n) override { budgets_.add(b_, acc, n); }
  void sum(Buf x, int64_t n, ReduceOp op, const char* what, const std::function<void()>& reduce) override {
    reduce();
    GroupSum s{what, where_, int(op), download(b_, x, n), budgets_.take(x.ptr, n)};
    out_.push_back(std::move(s));
  }

 private:
  Backend& b_;
  std::vector<GroupSum>& out_;
  const std::string& where_;
  Budgets budgets_;
};

// The tensor-parallel model: each sum against the full model's, then set to it.
class Lockstep final : public T5Step::GroupSumHook {
 public:
  Lockstep(Backend& b, MPI_Comm group, int T, int rank, const std::vector<GroupSum>& full, const std::string& where)
      : b_(b), group_(group), T_(T), rank_(rank), full_(full), where_(where) {}
  void rounded(CBuf acc, int64_t n) override { budgets_.add(b_, acc, n); }
  void sum(Buf x, int64_t n, ReduceOp op, const char* what, const std::function<void()>& reduce) override {
    // The same records on every rank of the group, so every rank takes the same path here.
    if (lost_) return reduce();
    if (next_ >= full_.size() || full_[next_].what != what || full_[next_].where != where_ ||
        int64_t(full_[next_].value.size()) != n || full_[next_].op != int(op)) {
      lost_ = true;
      if (failure.empty())
        failure = where_ + ": the tensor-parallel model's sum " + std::to_string(next_ + 1) + " (" + what +
                  ") is not the full model's (" +
                  (next_ < full_.size() ? full_[next_].what + ", " + full_[next_].where : "none") +
                  "): the two models no longer make the same sums";
      return reduce();
    }
    const GroupSum& f = full_[next_++];
    const std::vector<float> part = download(b_, x, n);
    const std::vector<double> beta = budgets_.take(x.ptr, n);
    reduce();
    const std::vector<float> s = download(b_, x, n);
    // Σ_r (β_r + γ(T−1)·|p_r|) on group rank 0; a maximum is exact.
    std::vector<double> mine, total;
    if (op == ReduceOp::Sum) {
      const double k = T_ - 1, gamma = k * kU / (1 - k * kU);
      mine.resize(size_t(n));
      for (size_t i = 0; i < mine.size(); ++i) mine[i] = beta[i] + gamma * std::fabs(double(part[i]));
      total.resize(rank_ == 0 ? size_t(n) : 0);
      MPI_CHECK(MPI_Reduce(mine.data(), total.data(), int(n), MPI_DOUBLE, MPI_SUM, 0, group_));
    }
    if (rank_ == 0) compare(f, s, total, what, op);
    b_.upload(x.ptr, f.value.data(), size_t(n) * 4);  // back in lockstep
  }

  std::string failure;  // group rank 0: the first sum out of its bound
  double worst = 0;
  long long sums = 0, elements = 0;

 private:
  void compare(const GroupSum& f, const std::vector<float>& s, const std::vector<double>& total,
               const char* what, ReduceOp op) {
    ++sums;
    for (size_t i = 0; i < s.size(); ++i) {
      ++elements;
      const double S = s[i], F = f.value[i];
      double bound = 0, ratio = 0;
      bool ok;
      if (std::isfinite(S) && std::isfinite(F)) {
        if (op == ReduceOp::Sum) bound = (total[i] + (T_ - 1) * kEta + f.budget[i]) * kBoundArithmetic;
        const double err = std::fabs(S - F);
        ratio = err == 0 ? 0 : bound > 0 ? err / bound : std::numeric_limits<double>::infinity();
        ok = err <= bound;
      } else {  // an inf or nan: the same one
        ok = S == F || (std::isnan(S) && std::isnan(F));
        ratio = ok ? 0 : std::numeric_limits<double>::infinity();
      }
      worst = std::max(worst, ratio);
      if (ok || !failure.empty()) continue;
      char text[512];
      if (op == ReduceOp::Sum)
        std::snprintf(text, sizeof text,
                      "%s: the group's sum of the %s, element %zu of %zu, is %.9g, the full model's %.9g: %.3g apart, "
                      "%.3g x its rounding bound %.3g",
                      where_.c_str(), what, i, s.size(), S, F, std::fabs(S - F), ratio, bound);
      else
        std::snprintf(text, sizeof text,
                      "%s: the group's maximum of the %s, element %zu of %zu, is %.9g, the full model's %.9g "
                      "(a maximum is exact)",
                      where_.c_str(), what, i, s.size(), S, F);
      failure = text;
    }
  }

  Backend& b_;
  MPI_Comm group_;
  int T_, rank_;
  const std::vector<GroupSum>& full_;
  const std::string& where_;
  Budgets budgets_;
  size_t next_ = 0;
  bool lost_ = false;
};

// The records, from group rank 0 to every rank of the group.
void broadcast(std::vector<GroupSum>& sums, int rank, MPI_Comm group) {
  std::vector<char> bytes;
  auto put = [&](const void* p, size_t n) {
    const char* c = static_cast<const char*>(p);
    bytes.insert(bytes.end(), c, c + n);
  };
  if (rank == 0)
    for (const GroupSum& s : sums) {
      const int64_t head[4] = {int64_t(s.what.size()), int64_t(s.where.size()), s.op, int64_t(s.value.size())};
      put(head, sizeof head);
      put(s.what.data(), s.what.size());
      put(s.where.data(), s.where.size());
      put(s.value.data(), s.value.size() * 4);
      put(s.budget.data(), s.budget.size() * 8);
    }
  int64_t size = int64_t(bytes.size());
  MPI_CHECK(MPI_Bcast(&size, 1, MPI_INT64_T, 0, group));
  bytes.resize(size_t(size));
  for (int64_t at = 0; at < size; at += int64_t(1) << 30) {
    const int len = int(std::min<int64_t>(int64_t(1) << 30, size - at));
    MPI_CHECK(MPI_Bcast(bytes.data() + at, len, MPI_CHAR, 0, group));
  }
  if (rank == 0) return;
  sums.clear();
  size_t at = 0;
  auto get = [&](void* p, size_t n) {
    std::memcpy(p, bytes.data() + at, n);
    at += n;
  };
  while (at < bytes.size()) {
    int64_t head[4];
    get(head, sizeof head);
    GroupSum s;
    s.what.resize(size_t(head[0]));
    s.where.resize(size_t(head[1]));
    s.op = int(head[2]);
    s.value.resize(size_t(head[3]));
    s.budget.resize(size_t(head[3]));
    get(&s.what[0], s.what.size());
    get(&s.where[0], s.where.size());
    get(s.value.data(), s.value.size() * 4);
    get(s.budget.data(), s.budget.size() * 8);
    sums.push_back(std::move(s));
  }
}

// "encoder block 3", "the head": a piece as a message names it.
std::string named(const Piece& p) {
  const bool block = p.kind == Piece::EncoderBlock || p.kind == Piece::DecoderBlock;
  return (block ? "" : "the ") + piece_name(p);
}

}  // namespace

struct TpLockstep::Impl {
  using Model = ReferenceModel;
  const Setup& setup;
  MPI_Comm mpi = MPI_COMM_NULL;       // the hook's reductions, the records, the gradients
  MPI_Comm comm_mpi = MPI_COMM_NULL;  // the tensor-parallel model's own all-reduces
  int T = 1, rank = 0;
  std::unique_ptr<Backend> b;
  std::unique_ptr<Comm> comm;
  Model full, tp;  // full: group rank 0 only
  std::vector<UnitSpec> full_units;
  std::vector<std::vector<UnitSpec>> parts;  // per tensor-parallel rank
  std::string where;                         // the piece running now, for the messages
  double worst = 0;
  long long sums = 0, sum_elements = 0, gradient_elements = 0;

  explicit Impl(const Setup& s) : setup(s) {}

  void make(Model& m, TensorGroup g) { m.make(setup, *b, DType::F32, 1.f, g); }
  void release(Model& m) { m.release(*b); }

  // A data-parallel rank's step: each micro-batch's forward then backward, the gradients
  // accumulated in order. Returns the loss summed over the micro-batches.
  double run(Model& m, const Tokens& tokens) {
    const auto& pieces = m.step->pieces();
    const int S = int(pieces.size()), M = setup.strategy.micro_batches;
    for (size_t k = 0; k < m.grads.size(); ++k) b->fill(m.grads[k], 0.f, m.step->units()[k].numel);
    double loss = 0;
    for (int mb = 0; mb < M; ++mb) {
      auto slice = [&](const std::vector<int>& v) {
        const size_t n = v.size() / size_t(M);
        return std::vector<int>(v.begin() + long(n * mb), v.begin() + long(n * (mb + 1)));
      };
      m.step->set_tokens(M == 1 ? tokens : Tokens{slice(tokens.enc_ids), slice(tokens.dec_ids), slice(tokens.labels)});
      const std::string micro = M == 1 ? "" : "micro-batch " + std::to_string(mb) + ", ";
      for (int pos = 0; pos < S; ++pos) {
        where = micro + "forward of " + named(pieces[size_t(pos)]);
        m.step->forward(pos, by_unit(m.params));
      }
      for (int pos = 0; pos < S; ++pos) {
        const int pi = S - 1 - pos;
        where = micro + "backward of " + named(pieces[size_t(pi)]);
        m.step->backward(pi, by_unit(m.params), by_unit(m.grads));
      }
      loss += m.step->loss_sum();
    }
    return loss;
  }

  // Group rank 0: the first gradient element of the tensor-parallel model (gathered) that
  // is not the full model's. Collective over the group.
  std::string compare_gradients() {
    std::string first;
    for (size_t k = 0; k < full_units.size(); ++k) {
      const int64_t numel = parts[size_t(rank)][k].numel;
      const std::vector<float> g = download(*b, tp.grads[k], numel);
      std::vector<float> all(rank == 0 ? size_t(numel) * size_t(T) : 0);
      MPI_CHECK(MPI_Gather(g.data(), int(numel), MPI_FLOAT, all.data(), int(numel), MPI_FLOAT, 0, mpi));
      if (rank != 0 || !first.empty()) continue;
      const std::vector<float> want = download(*b, full.grads[k], full_units[k].numel);
      for (int t = 0; t < T && first.empty(); ++t)
        for (size_t i = 0; i < parts[size_t(t)][k].tensors.size() && first.empty(); ++i) {
          const TensorSpec& ts = parts[size_t(t)][k].tensors[i];
          const TensorSpec& fs = full_units[k].tensors[i];
          for (int64_t r = 0; r < ts.rows && first.empty(); ++r)
            for (int64_t c = 0; c < ts.cols; ++c) {
              ++gradient_elements;
              const float x = all[size_t(t * numel + ts.offset + r * ts.cols + c)];
              const float y = want[size_t(fs.offset + ts.full_index(r, c))];
              if (x == y || (std::isnan(x) && std::isnan(y))) continue;
              char text[512];
              std::snprintf(text, sizeof text,
                            "unit %s tensor %s element (%" PRId64 ", %" PRId64 ") (tensor-parallel rank %d's): "
                            "gradient %.9g, the full model's %.9g; with every sum over the group set to the full "
                            "model's, the two make the same operations on the same values",
                            full_units[k].name.c_str(), fs.name.c_str(), ts.row_begin + r, ts.col_begin + c, t,
                            double(x), double(y));
              first = text;
              break;
            }
        }
    }
    return first;
  }
};

TpLockstep::TpLockstep(const Setup& setup, MPI_Comm group) : impl_(std::make_unique<Impl>(setup)) {
  Impl& m = *impl_;
  MPI_CHECK(MPI_Comm_dup(group, &m.mpi));
  MPI_CHECK(MPI_Comm_dup(group, &m.comm_mpi));
  MPI_CHECK(MPI_Comm_size(m.mpi, &m.T));
  MPI_CHECK(MPI_Comm_rank(m.mpi, &m.rank));
  m.b = make_backend("cpu");  // whatever the run's: exact sums are the CPU backend's
  ComputeOptions exact;
  exact.exact_sums = true;
  m.b->set_compute_options(exact);
  m.comm = m.b->make_comm(m.comm_mpi);
  m.comm->set_axis(Axis::Tensor);
  m.full_units = model_units(setup.model);
  for (int t = 0; t < m.T; ++t) m.parts.push_back(model_units(setup.model, {m.T, t}));
  m.make(m.tp, TensorGroup{m.T, m.rank, m.comm.get()});
  if (m.rank == 0) m.make(m.full, TensorGroup{});
}

TpLockstep::~TpLockstep() {
  Impl& m = *impl_;
  m.release(m.tp);
  m.release(m.full);
  m.comm.reset();
  int finalized = 0;
  MPI_Finalized(&finalized);
  if (finalized) return;
  for (MPI_Comm* c : {&m.mpi, &m.comm_mpi})
    if (*c != MPI_COMM_NULL) MPI_Comm_free(c);
}

std::string TpLockstep::check(const std::vector<std::vector<float>>& weights, const Tokens& tokens, float grad_scale) {
  Impl& m = *impl_;
  for (size_t k = 0; k < m.full_units.size(); ++k) {
    const std::vector<float> part = take_from_full_unit(m.parts[size_t(m.rank)][k], m.full_units[k], weights[k]);
    m.b->upload(m.tp.params[k].ptr, part.data(), part.size() * 4);
    if (m.rank == 0) m.b->upload(m.full.params[k].ptr, weights[k].data(), weights[k].size() * 4);
  }
  // The full model, recording its sums.
  std::vector<GroupSum> record;
  double full_loss = 0;
  if (m.rank == 0) {
    SumRecorder recorder(*m.b, record, m.where);
    m.full.step->set_grad_scale(grad_scale);
    m.full.step->set_group_sum_hook(&recorder);
    full_loss = m.run(m.full, tokens);
    m.full.step->set_group_sum_hook(nullptr);
  }
  broadcast(record, m.rank, m.mpi);
  // The tensor-parallel model in lockstep.
  Lockstep lockstep(*m.b, m.mpi, m.T, m.rank, record, m.where);
  m.tp.step->set_grad_scale(grad_scale);
  m.tp.step->set_group_sum_hook(&lockstep);
  const double tp_loss = m.run(m.tp, tokens);
  m.tp.step->set_group_sum_hook(nullptr);
  m.worst = std::max(m.worst, lockstep.worst);
  m.sums += lockstep.sums;
  m.sum_elements += lockstep.elements;
  const std::string gradients = m.compare_gradients();
  if (m.rank != 0) return "";
  if (!lockstep.failure.empty()) return lockstep.failure;
  if (!gradients.empty()) return gradients;
  if (tp_loss != full_loss) {
    char text[256];
    std::snprintf(text, sizeof text, "the tensor-parallel model's loss %.17g is not the full model's %.17g", tp_loss,
                  full_loss);
    return text;
  }
  return "";
}

double TpLockstep::worst_ratio() const { return impl_->worst; }
long long TpLockstep::sums() const { return impl_->sums; }
long long TpLockstep::sum_elements() const { return impl_->sum_elements; }
long long TpLockstep::gradient_elements() const { return impl_->gradient_elements; }

}  // namespace sb
