// Pipeline parallelism (--pp S), in one home: which pieces of the model (T5Step's) each
// pipeline stage runs (the split), in which order a stage runs the forwards and backwards of the
// micro-batches (the schedule), and what a stage exchanges with its neighbours (Pipeline:
// the communicators, the transfers across its cuts, the embedding group).
//   one pass   M = 1 and S = 1: forward, then backward (every run without --pp)
//   gpipe      all M forwards, then all M backwards (Huang et al., GPipe, NeurIPS 2019):
//              the activations of every micro-batch are held at once
//   1f1b       PipeDream-Flush (Narayanan et al., SC21 §2.2): stage s runs min(S − s − 1, M)
//              forwards first, then one forward and one backward in turn, then the
//              remaining backwards: at most S − s micro-batches in flight
// Micro-batches go forward and backward in ascending order in both schedules; a stage's
// gradients accumulate over them and are reduced after the last one's backward.
#pragma once
#include <mpi.h>

#include <memory>
#include <string>
#include <vector>

#include "shardbench/backend/backend.h"
#include "shardbench/backend/layout.h"
#include "shardbench/model/t5.h"

namespace sb {

enum class PipeSchedule { GPipe, OneFOneB };
const char* pipe_schedule_name(PipeSchedule s);           // "gpipe", "1f1b"
PipeSchedule parse_pipe_schedule(const std::string& s);   // throws UsageError

struct PipeAction {
  enum Kind { Forward, Backward } kind;
  int micro;  // micro-batch, 0 .. M-1
  bool operator==(const PipeAction& o) const { return kind == o.kind && micro == o.micro; }
};

// The actions of pipeline stage `stage` of `stages`, for `micro_batches` micro-batches.
std::vector<PipeAction> pipeline_actions(PipeSchedule schedule, int stages, int stage, int micro_batches);

// The bubble in theory: the share of a step a stage idles, (S − 1) / (M + S − 1), for
// equal stages and free transfers (GPipe, Huang et al.; the same for 1F1B, Narayanan et al.); 0 without --pp.
double pipeline_bubble(int stages, int micro_batches);

// The micro-batches whose activations a stage holds at most at once under the schedule.
int micro_batches_in_flight(PipeSchedule schedule, int stages, int stage, int micro_batches);

// How the model's pieces (the T5Step's, in forward order: the encoder embedding, the L
// encoder blocks, the bridge, the L decoder blocks, the head) are split over S pipeline
// stages: stage s runs pieces [first[s], first[s + 1]). Every pipeline stage gets at least one
// block; the encoder embedding goes with encoder block 0, the bridge (encoder final norm,
// decoder embedding) with decoder block 0, the head with the last decoder block.
// `block_cost[i]`: the cost of block i of the 2L (encoder blocks, then decoder blocks; the
// head's cost counted in the last); `first_decoder_stage`: the pipeline stage where the
// decoder starts (Megatron-LM's split rank), or -1 to balance over all blocks. The split
// minimises the largest stage's cost (ties: the earliest cut). Throws UsageError for more
// stages than blocks and for a first decoder stage that leaves a side without a stage or
// with more stages than its blocks.
struct PipelineSplit {
  std::vector<int> first;  // S + 1 entries: first piece of each pipeline stage, then the total
  int stage_of(int piece) const;  // the pipeline stage that runs `piece`
};
PipelineSplit split_pipeline(const std::vector<double>& block_cost, int layers, int stages,
                             int first_decoder_stage = -1);

// The pipeline stages that hold unit `unit` of the model whose pieces are `pieces`
// (model_pieces), ascending: each stage holds the units its pieces use (pieces_use_unit), so
// every unit is held by exactly one stage but the embedding, which the stages that look
// tokens up hold (the first; the bridge's, where the decoder starts) and, tied, the last
// (its LM head is the embedding); one stage may be several of these.
std::vector<int> stages_holding(const std::vector<Piece>& pieces, const PipelineSplit& split, int unit);

// One pipeline stage's side of the pipeline: the communicators it shares with its
// neighbours, the transfers across its two cuts (T5Step::cut) and Megatron-LM's embedding
// group. Activations go to the next stage on the mesh's pipeline communicator, their
// gradients come back on a duplicate of it, so the two directions never match each other's
// messages (and each has its P2PDirection: on CUDA, a stream of its own). A stage without a
// neighbour on a side skips that side's transfers; without --pp every call does nothing.
class Pipeline {
 public:
  // `model` runs the stage's pieces, split.first[stage] .. split.first[stage + 1] - 1,
  // for `micro_batches` micro-batches; the stage is the mesh's pipeline coordinate.
  Pipeline(Backend& b, const Mesh& mesh, T5Step& model, const PipelineSplit& split, int micro_batches);
  ~Pipeline();
  Pipeline(const Pipeline&) = delete;
  Pipeline& operator=(const Pipeline&) = delete;

  int stage() const { return stage_; }
  int stages() const { return stages_; }

  // A forward action of micro-batch m: the stage's inputs from the previous stage (waited
  // for) before its pieces run, its outputs to the next stage after (not waited for: the
  // micro-batch's backward waits, once the next stage has long received them).
  void receive_inputs(int m);
  void send_outputs(int m);
  // A backward action of micro-batch m: the outputs' gradients from the next stage (waited
  // for), then the inputs' gradients to the previous stage, sent from a copy (the model
  // reuses its gradient buffers in the next action; the copy goes once the send has read it).
  void receive_output_grads(int m);
  void send_input_grads(int m);
  // The end of a step's actions: every gradient sent has left.
  void wait_sends();

  // Megatron-LM's embedding group: the stages that hold the embedding unit
  // (stages_holding) each compute a part of its gradient; after the data-parallel reductions
  // each adds the others' (`g`: n elements of this stage's reduced gradient of the
  // embedding), so every copy takes the same Adam step. Only where this stage is one of two
  // or more that hold it.
  bool sums_embedding() const { return embedding_group_ != nullptr; }
  void sum_embedding(Buf g, int64_t n);

 private:
  // The MPI tag of a transfer: the cut's tensor and the micro-batch (each direction has a
  // communicator of its own, so the tags of the two never meet).
  static int tag(int micro, int tensor) { return micro * 8 + tensor; }
  int unit_of(int piece) const { return model_.pieces()[size_t(piece)].unit; }

  Backend& b_;
  T5Step& model_;
  int stage_ = 0, stages_ = 1;
  int first_ = 0, last_ = 0;                   // this stage's pieces [first_, last_)
  Comm* activations_ = nullptr;                // the mesh's pipeline communicator
  MPI_Comm gradients_mpi_ = MPI_COMM_NULL;     // a duplicate of it, for the gradients
  std::unique_ptr<Comm> gradients_;
  int embedding_ = 0;                          // the embedding unit
  MPI_Comm embedding_mpi_ = MPI_COMM_NULL;     // the stages holding it
  std::unique_ptr<Comm> embedding_group_;
  std::vector<std::vector<Request>> sent_;     // per micro-batch: its forward sends, waited on in its backward
  std::vector<Request> grad_sends_;            // backward sends, waited on at the end of the step
};

}  // namespace sb
