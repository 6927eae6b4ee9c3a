#include "shardbench/strategy/pipeline.h"

#include <algorithm>
#include <limits>
#include <string>

#include "shardbench/core/check.h"

namespace sb {

const char* pipe_schedule_name(PipeSchedule s) { return s == PipeSchedule::GPipe ? "gpipe" : "1f1b"; }

PipeSchedule parse_pipe_schedule(const std::string& s) {
  for (PipeSchedule v : {PipeSchedule::GPipe, PipeSchedule::OneFOneB})
    if (s == pipe_schedule_name(v)) return v;
  throw UsageError("--pp-schedule '" + s + "' is not allowed (allowed: gpipe, 1f1b)");
}

std::vector<PipeAction> pipeline_actions(PipeSchedule schedule, int stages, int stage, int micro_batches) {
  SB_ASSERT(stages >= 1 && stage >= 0 && stage < stages && micro_batches >= 1, "bad pipeline");
  std::vector<PipeAction> a;
  const int M = micro_batches;
  if (schedule == PipeSchedule::GPipe) {
    for (int m = 0; m < M; ++m) a.push_back({PipeAction::Forward, m});
    for (int m = 0; m < M; ++m) a.push_back({PipeAction::Backward, m});
    return a;
  }
  const int warmup = std::min(stages - stage - 1, M);
  int f = 0, b = 0;
  for (; f < warmup; ++f) a.push_back({PipeAction::Forward, f});
  for (; f < M; ++f, ++b) {  // steady state: one forward, one backward
    a.push_back({PipeAction::Forward, f});
    a.push_back({PipeAction::Backward, b});
  }
  for (; b < M; ++b) a.push_back({PipeAction::Backward, b});
  return a;
}

double pipeline_bubble(int stages, int micro_batches) {
  return stages > 1 ? double(stages - 1) / double(micro_batches + stages - 1) : 0.0;
}

int micro_batches_in_flight(PipeSchedule schedule, int stages, int stage, int micro_batches) {
  int live = 0, most = 0;
  for (const PipeAction& x : pipeline_actions(schedule, stages, stage, micro_batches)) {
    live += x.kind == PipeAction::Forward ? 1 : -1;
    most = std::max(most, live);
  }
  return most;
}

int PipelineSplit::stage_of(int piece) const {
  for (size_t s = 0; s + 1 < first.size(); ++s)
    if (piece < first[s + 1]) return int(s);
  SB_FATAL("piece " + std::to_string(piece) + " outside the pipeline");
}

namespace {
// Cuts of blocks [lo, hi) into `parts` contiguous groups minimising the largest group's cost
// (linear partition by dynamic programming); returns each group's first block.
std::vector<int> balanced_cuts(const std::vector<double>& cost, int lo, int hi, int parts) {
  const int n = hi - lo;
  std::vector<double> prefix(size_t(n) + 1, 0.0);
  for (int i = 0; i < n; ++i) prefix[size_t(i) + 1] = prefix[size_t(i)] + cost[size_t(lo + i)];
  const double inf = std::numeric_limits<double>::infinity();
  // best[k][i]: the least largest cost of the first i blocks in k groups; cut[k][i]: where the kth starts
  std::vector<std::vector<double>> best(size_t(parts) + 1, std::vector<double>(size_t(n) + 1, inf));
  std::vector<std::vector<int>> cut(size_t(parts) + 1, std::vector<int>(size_t(n) + 1, 0));
  best[0][0] = 0;
  for (int k = 1; k <= parts; ++k)
    for (int i = k; i <= n; ++i)
      for (int j = k - 1; j < i; ++j) {
        const double v = std::max(best[size_t(k - 1)][size_t(j)], prefix[size_t(i)] - prefix[size_t(j)]);
        if (v < best[size_t(k)][size_t(i)] * (1 - 1e-12)) best[size_t(k)][size_t(i)] = v, cut[size_t(k)][size_t(i)] = j;
      }
  std::vector<int> starts(static_cast<size_t>(parts));
  for (int k = parts, i = n; k >= 1; --k) {
    starts[size_t(k - 1)] = lo + cut[size_t(k)][size_t(i)];
    i = cut[size_t(k)][size_t(i)];
  }
  return starts;
}
}  // namespace

PipelineSplit split_pipeline(const std::vector<double>& block_cost, int layers, int stages, int first_decoder_stage) {
  const int blocks = 2 * layers;
  SB_ASSERT(int(block_cost.size()) == blocks, "one cost per block");
  if (stages > blocks)
    throw UsageError("--pp " + std::to_string(stages) + " is not allowed with " + std::to_string(blocks) +
                     " blocks (" + std::to_string(layers) + " encoder + " + std::to_string(layers) +
                     " decoder; at most one stage per block)");
  std::vector<int> starts;  // each stage's first block
  if (first_decoder_stage < 0) {
    starts = balanced_cuts(block_cost, 0, blocks, stages);
  } else {
    const int k = first_decoder_stage;
    if (k < 1 || k > stages - 1 || k > layers || stages - k > layers)
      throw UsageError("--pp-split " + std::to_string(k) + " is not allowed with --pp " + std::to_string(stages) +
                       " and " + std::to_string(layers) + " layers per stack (the first decoder stage: at least 1, "
                       "at most --pp - 1, with no more stages than blocks on either side)");
    starts = balanced_cuts(block_cost, 0, layers, k);
    const std::vector<int> dec = balanced_cuts(block_cost, layers, blocks, stages - k);
    starts.insert(starts.end(), dec.begin(), dec.end());
  }
  // Blocks to pieces: encoder block i is piece 1 + i, the bridge is 1 + L, decoder block i
  // is 2 + L + i; the embedding (0) joins encoder block 0's stage, the bridge decoder block
  // 0's stage.
  PipelineSplit p;
  for (int s = 0; s < stages; ++s) {
    const int b = starts[size_t(s)];
    p.first.push_back(s == 0 ? 0 : b < layers ? 1 + b : b == layers ? 1 + layers : 2 + b);
  }
  p.first.push_back(2 * layers + 3);
  return p;
}

std::vector<int> stages_holding(const std::vector<Piece>& pieces, const PipelineSplit& split, int unit) {
  std::vector<int> stages;
  for (size_t s = 0; s + 1 < split.first.size(); ++s)
    if (pieces_use_unit(pieces, split.first[s], split.first[s + 1], unit)) stages.push_back(int(s));
  return stages;
}

Pipeline::Pipeline(Backend& b, const Mesh& mesh, T5Step& model, const PipelineSplit& split, int micro_batches)
    : b_(b),
      model_(model),
      stage_(mesh.layout.pp_rank()),
      stages_(mesh.layout.pp),
      first_(split.first[size_t(stage_)]),
      last_(split.first[size_t(stage_) + 1]),
      embedding_(model.pieces()[0].unit),
      sent_(size_t(micro_batches)) {
  if (stages_ == 1) return;
  activations_ = &mesh.comm(Axis::Pipeline);
  // The stages that hold the embedding sum its gradients (one of them alone: no group).
  const std::vector<int> holders = stages_holding(model.pieces(), split, embedding_);
  const auto at = std::find(holders.begin(), holders.end(), stage_);
  const int n = int(holders.size()), mine = at == holders.end() ? -1 : int(at - holders.begin());
  const MPI_Comm pipeline = mesh.mpi(Axis::Pipeline);
  if (pipeline == MPI_COMM_NULL) {  // a planned mesh
    gradients_ = make_planned_comm(stages_, stage_);
    if (n > 1 && mine >= 0) embedding_group_ = make_planned_comm(n, mine);
  } else {
    MPI_CHECK(MPI_Comm_dup(pipeline, &gradients_mpi_));
    gradients_ = b.make_comm(gradients_mpi_);
    if (n > 1) {
      MPI_CHECK(MPI_Comm_split(pipeline, mine >= 0 ? 0 : MPI_UNDEFINED, stage_, &embedding_mpi_));
      if (mine >= 0) embedding_group_ = b.make_comm(embedding_mpi_);
    }
  }
  gradients_->set_axis(Axis::Pipeline);
  if (embedding_group_) embedding_group_->set_axis(Axis::Pipeline);
}

Pipeline::~Pipeline() {
  embedding_group_.reset();
  gradients_.reset();
  int finalized = 0;
  MPI_Finalized(&finalized);
  if (finalized) return;
  for (MPI_Comm* c : {&gradients_mpi_, &embedding_mpi_})
    if (*c != MPI_COMM_NULL) MPI_Comm_free(c);
}

void Pipeline::receive_inputs(int m) {
  if (stage_ == 0) return;
  ScopedContext ctx(b_, Phase::Forward, unit_of(first_));
  std::vector<Request> in;
  const auto cut = model_.cut(first_);
  for (size_t i = 0; i < cut.size(); ++i)
    in.push_back(b_.recv(model_.cut_input(first_, m, int(i)), cut[i].numel, stage_ - 1, tag(m, int(i)),
                         P2PDirection::Activations, *activations_));
  for (Request r : in) b_.wait(r);
}

void Pipeline::send_outputs(int m) {
  if (stage_ == stages_ - 1) return;
  ScopedContext ctx(b_, Phase::Forward, unit_of(last_ - 1));
  const auto cut = model_.cut(last_);
  for (size_t i = 0; i < cut.size(); ++i)
    sent_[size_t(m)].push_back(b_.send(model_.cut_output(last_, m, int(i)), cut[i].numel, stage_ + 1, tag(m, int(i)),
                                       P2PDirection::Activations, *activations_));
}

void Pipeline::receive_output_grads(int m) {
  for (Request r : sent_[size_t(m)]) b_.wait(r);  // received long since: its buffers may go
  sent_[size_t(m)].clear();
  if (stage_ == stages_ - 1) return;
  ScopedContext ctx(b_, Phase::Backward, unit_of(last_ - 1));
  std::vector<Request> in;
  const auto cut = model_.cut(last_);
  for (size_t i = 0; i < cut.size(); ++i)
    in.push_back(b_.recv(model_.cut_grad_input(last_, int(i)), cut[i].grad_numel, stage_ + 1, tag(m, int(i)),
                         P2PDirection::Gradients, *gradients_));
  for (Request r : in) b_.wait(r);
}

void Pipeline::send_input_grads(int m) {
  if (stage_ == 0) return;
  ScopedContext ctx(b_, Phase::Backward, unit_of(first_));
  const auto cut = model_.cut(first_);
  for (size_t i = 0; i < cut.size(); ++i) {
    const CBuf g = model_.cut_grad_output(first_, int(i));
    const Buf copy = b_.alloc_buf(cut[i].grad_numel, g.dtype, MemCategory::CommBuffers);
    b_.copy(copy, g, cut[i].grad_numel);
    const Request r = b_.send(copy, cut[i].grad_numel, stage_ - 1, tag(m, int(i)), P2PDirection::Gradients,
                              *gradients_);
    b_.release_after(copy.ptr, r);
    grad_sends_.push_back(r);
  }
}

void Pipeline::wait_sends() {
  for (Request r : grad_sends_) b_.wait(r);
  grad_sends_.clear();
}

void Pipeline::sum_embedding(Buf g, int64_t n) {
  SB_ASSERT(embedding_group_, "this stage is in no embedding group");
  ScopedContext ctx(b_, Phase::Backward, embedding_);
  if (n > 0) b_.wait(b_.all_reduce(g, n, *embedding_group_));
}

}  // namespace sb
