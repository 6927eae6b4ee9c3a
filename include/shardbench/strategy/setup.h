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
  // As the flags give it, with what they leave open resolved (the flags' own config keeps
  // what was typed): micro_batches 0 becomes the default count (default_micro_batches), a
  // hybrid shard_size 0 one node's data-parallel ranks (node_shard_size over `nodes`).
  StrategyConfig strategy;
  ModelSpec model;
  StepShape shape;        // per data-parallel rank
  ParallelLayout layout;  // over the world, seen from layout.rank (0 from make)
  PipelineSplit split;    // the pieces each pipeline stage runs (every stage shares it)

  // Resolves the open values, then checks, in this order (root causes first), each a
  // UsageError naming the flag: hybrid's shard group from `nodes` (node_shard_size), the
  // pipeline's own limits (a stage per block at most, --pp-split), --tp against the model's
  // heads, d_ff and vocab, then the layout's sizes against `world` (a hybrid shard_size 0
  // without `nodes`, a plan of --world-size ranks, is refused). Seen from rank 0.
  static Setup make(const StrategyConfig& strategy, const ModelSpec& model, const StepShape& shape, int world,
                    const NodeMap* nodes = nullptr);
  // The same setup seen from `rank` (its layout's coordinates; nothing is checked again).
  Setup at_rank(int rank) const;
};

// Micro-batches per step without --micro-batches: one per stage (--pp), or the largest count
// below it that divides the batch (the default --batch 2 with --pp 4: 2), so a pipeline runs
// without the flag.
int default_micro_batches(int pp, int64_t batch);

}  // namespace sb
