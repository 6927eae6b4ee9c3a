// One setup: what a strategy runs on, made and validated once. The strategy's configuration,
// the model, the step's shape, the parallel layout over the world and the pipeline's split of
// the model, checked together by Setup::make (the pipeline's stages against the model's
// blocks, --tp against the model, the layout against the world) and then
// handed whole to make_strategy, the plan, TrainingSchedule and --check. (torchtitan builds
// ParallelDims once and validates it once.)
#pragma once

#include "shardbench/backend/layout.h"
#include "shardbench/model/model.h"
#include "shardbench/strategy/config.h"
#include "shardbench/strategy/pipeline.h"

namespace sb {

struct Setup {
  StrategyConfig strategy;
  ModelSpec model;
  StepShape shape;        // per data-parallel rank
  ParallelLayout layout;  // over the world, seen from layout.rank (0 from make)
  PipelineSplit split;    // the pieces each pipeline stage runs (every stage shares it)

  // Checks, in this order (root causes first), each a UsageError naming the flag: the
  // pipeline's own limits (a stage per block at most, --pp-split), --tp against the model's
  // heads, d_ff and vocab, then the layout's sizes against `world` (hybrid needs its
  // --shard-size settled first: node_shard_size). Seen from rank 0.
  static Setup make(const StrategyConfig& strategy, const ModelSpec& model, const StepShape& shape, int world);
  // The same setup seen from `rank` (its layout's coordinates; nothing is checked again).
  Setup at_rank(int rank) const;
};

}  // namespace sb
