// Pipeline parallelism (--pp S): which model stages each pipeline stage runs, and in which
// order a pipeline stage runs the forwards and backwards of the micro-batches.
//   one pass   M = 1 and S = 1: forward, then backward (every run without --pp)
//   gpipe      all M forwards, then all M backwards (Huang et al., GPipe, NeurIPS 2019):
//              the activations of every micro-batch are held at once
//   1f1b       PipeDream-Flush (Narayanan et al., SC21 §2.2): stage s runs min(S − s − 1, M)
//              forwards first, then one forward and one backward in turn, then the
//              remaining backwards: at most S − s micro-batches in flight
// Micro-batches go forward and backward in ascending order in both schedules; a stage's
// gradients accumulate over them and are reduced after the last one's backward.
#pragma once
#include <string>
#include <vector>

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

// How the model's stages (the T5Step's, in forward order: the encoder embedding, the L
// encoder blocks, the bridge, the L decoder blocks, the head) are split over S pipeline
// stages: stage s runs [first[s], first[s + 1]). Every pipeline stage gets at least one
// block; the encoder embedding goes with encoder block 0, the bridge (encoder final norm,
// decoder embedding) with decoder block 0, the head with the last decoder block.
// `block_cost[i]`: the cost of block i of the 2L (encoder blocks, then decoder blocks; the
// head's cost counted in the last); `first_decoder_stage`: the pipeline stage where the
// decoder starts (Megatron-LM's split rank), or -1 to balance over all blocks. The split
// minimises the largest stage's cost (ties: the earliest cut). Throws UsageError for more
// stages than blocks and for a first decoder stage that leaves a side without a stage or
// with more stages than its blocks.
struct PipelineSplit {
  std::vector<int> first;  // S + 1 entries: first model stage of each pipeline stage, then the total
  int stage_of(int model_stage) const;
};
PipelineSplit split_pipeline(const std::vector<double>& block_cost, int layers, int stages,
                             int first_decoder_stage = -1);

}  // namespace sb
