// The one training-step loop every strategy runs (TrainingSchedule::step). DDP and FSDP
// differ only in their hooks: where a unit's parameters come from before its piece of the
// model (T5Step's pieces) runs, and what happens to its gradients once its last backward
// piece has run.
#pragma once
#include <memory>
#include <vector>

#include "shardbench/backend/backend.h"
#include "shardbench/backend/layout.h"
#include "shardbench/model/model.h"
#include "shardbench/model/t5.h"
#include "shardbench/strategy/config.h"
#include "shardbench/strategy/pipeline.h"
#include "shardbench/strategy/strategy.h"

namespace sb {

// Base for DDP and FSDP: owns the model step and runs the loop over its pieces with hooks.
// Under pipeline parallelism the step is the schedule's list of actions (pipeline_actions): a
// forward action receives the stage's inputs from the previous stage, runs the forward of
// its pieces and sends their outputs on; a backward action receives the outputs'
// gradients, runs the backward and sends the inputs' gradients back (the transfers are
// Pipeline's). Hooks fire for each micro-batch; gradients accumulate over the micro-batches,
// and the strategies reduce them only in the last one's backward (first_micro(),
// last_micro()). A piece uses its own unit and, the bridge and a tied head, the embedding
// unit too (Piece::units()): the hooks see every unit a piece uses. The embedding's
// gradient, where several stages hold it, is summed over them after the strategy's
// reductions (Pipeline's embedding group).
class TrainingSchedule : public Strategy {
 public:
  // `setup`: made once by the caller (Setup::make); its strategy, model, shape and split.
  TrainingSchedule(const Setup& setup, Backend& b, Mesh& mesh);
  double step(int step, const Tokens& tokens) override;
  const T5Step& model() const override { return model_; }
  float loss_scale() const override { return scale_; }
  bool skipped_last_step() const override { return skipped_; }

 protected:
  // For each unit its first/last piece in each pass (positions in that pass's order).
  struct UnitPieces {
    int first_forward = -1, last_forward = -1;
    int first_backward = -1, last_backward = -1;  // positions in backward order
  };
  virtual CBuf params_for(int unit) = 0;             // before forward or backward of a piece
  virtual Buf grads_for(int unit) = 0;               // before backward of a piece
  virtual void before_forward(int pos) {}            // pos: position in forward order
  virtual void after_forward(int pos) {}
  virtual void before_backward(int pos) {}           // pos: position in backward order
  virtual void after_backward(int pos) {}
  virtual void finish_gradients() = 0;               // all reductions complete
  virtual void optimizer_step(int step) = 0;
  // What Adam reads (this rank's reduced gradients) and the group whose ranks hold
  // different parts of it (the shard group): for the dynamic loss scale's inf/NaN check.
  virtual CBuf reduced_gradients(int64_t& n) const = 0;

  // This rank's reduced gradient of unit u (reduce dtype; what Adam reads of it): for the
  // sum over the pipeline stages that share the embedding.
  virtual Buf reduced_gradient(int unit, int64_t& n) = 0;

  // Whether unit u's reduced gradient is summed over the pipeline stages that hold it (the
  // embedding's, after the strategy's reductions): final only then.
  bool summed_across_stages(int u) const { return pipeline_.sums_embedding() && u == model_.pieces()[0].unit; }
  int forward_unit(int pos) const { return model_.pieces()[pos].unit; }  // the piece's own unit
  int backward_piece(int pos) const { return int(model_.pieces().size()) - 1 - pos; }
  int backward_unit(int pos) const { return model_.pieces()[backward_piece(pos)].unit; }
  // Every unit the piece at a position uses: its own, then the embedding where it reads it.
  std::vector<int> forward_units(int pos) const { return model_.pieces()[pos].units(); }
  std::vector<int> backward_units(int pos) const { return model_.pieces()[backward_piece(pos)].units(); }
  int num_pieces() const { return int(model_.pieces().size()); }
  // This pipeline stage's pieces: [forward_begin, forward_end) in forward order,
  // [backward_begin, backward_end) in backward order (every position without --pp).
  int forward_begin() const { return part_.first; }
  int forward_end() const { return part_.last; }
  int backward_begin() const { return num_pieces() - part_.last; }
  int backward_end() const { return num_pieces() - part_.first; }
  // The backward being run is of the step's first / last micro-batch.
  bool first_micro() const { return backward_count_ == 0; }
  bool last_micro() const { return backward_count_ == cfg_.micro_batches - 1; }

  StrategyConfig cfg_;
  Backend& b_;
  Mesh& mesh_;
  PipelinePart part_;  // this pipeline stage's pieces
  T5Step model_;
  std::vector<UnitSpec> units_;  // every unit; the ones this stage does not hold are empty
  std::vector<UnitPieces> unit_pieces_;

 private:
  void forward_micro(int micro);
  void backward_micro(int micro);
  void sum_embedding();
  bool gradients_finite();
  Pipeline pipeline_;      // this stage's transfers and communicators (after model_: it reads it)
  T5Step::Params params_of_;  // params_for and grads_for as the model asks for them
  T5Step::Grads grads_of_;
  int backward_count_ = 0;  // backward actions run in this step
  float base_grad_scale_;  // 1 / global tokens
  float scale_;            // current loss scale
  int good_steps_ = 0;     // in a row, since the scale last changed
  bool skipped_ = false;
};

}  // namespace sb
