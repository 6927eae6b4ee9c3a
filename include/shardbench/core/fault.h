// Test-only fault injection, in one home. The environment variable SHARDBENCH_INJECT_FAULT
// names one fault of the list below, as NAME or, for a delay, NAME=SECONDS (mpirun passes it
// to every rank with -x); the code asks injected_fault() at the one place each fault acts.
// Nothing else in the programs reads a test-only variable. A name that is not in the list
// ends the run (SB_FATAL) the first time any fault is asked for, so a misspelt fault cannot
// let a test pass without having happened.
//
//   fault                           acts in                        what it does / the test that injects it
//   drop-grad-shard                 strategy/training_schedule.cpp the last rank zeroes a quarter of its reduced
//                                                                  gradients before Adam; --check fails at step 1
//                                                                  (tests/mpi_tests.sh, "injected fault")
//   wrong-reduction-scale           backend/backend.cpp            the strategies' gradient reductions average instead
//                                                                  of summing (scaled by 1/ranks); --check fails at
//                                                                  step 1 (tests/mpi_tests.sh)
//   stale-prefetch                  strategy/fsdp.cpp              FSDP unit 1 keeps the parameters gathered in an
//                                                                  earlier step; --check fails at step 2
//                                                                  (tests/mpi_tests.sh)
//   zero1-skip-param-gather         strategy/fsdp.cpp              ZeRO-1 (--sharding optimizer-state) does not
//                                                                  all-gather the updated parameters: each rank
//                                                                  computes the next step on its own slice's update
//                                                                  alone; --check fails at step 2 (tests/mpi_tests.sh)
//   offload-skip-upload             strategy/offload.cpp           CPU offload uploads nothing: the device computes with
//                                                                  parameters the CPU update never reached; --check
//                                                                  fails at step 1 or 2 (tests/mpi_tests.sh)
//   tp-skip-attention-all-reduce    model/t5_attention.cpp         the attention's input gradient is not summed over
//                                                                  the tensor-parallel group; --check fails against the
//                                                                  full model (tests/tp_tests.sh)
//   tp-skip-feed-forward-all-reduce model/t5_block.cpp             the feed-forward block's row-parallel output (wo's
//                                                                  product) is not summed over the tensor-parallel
//                                                                  group in forward; --check fails against the full
//                                                                  model (tests/tp_tests.sh)
//   tp-wrong-head-shard             model/spec.cpp                 each tensor-parallel rank's attention q, k and v
//                                                                  hold the next rank's heads, its o and position bias
//                                                                  its own; --check fails against the full model
//                                                                  (tests/tp_tests.sh)
//   tp-wrong-vocab-offset           model/t5.cpp                   each tensor-parallel rank's vocabulary range starts
//                                                                  one token late (its embedding rows and labels);
//                                                                  --check fails against the full model
//                                                                  (tests/tp_tests.sh)
//   tp-bf16-gradient-all-reduce     model/t5.cpp                   an fp32 run sums its input gradients over the
//                                                                  tensor-parallel group in bf16 (each rank's part and
//                                                                  the sum rounded, as a 16-bit wire format would);
//                                                                  --check fails against the full model
//                                                                  (tests/tp_tests.sh)
//   write-delay=S                   trace/h5_file.cpp              rank 0 holds a new result's temporary open S seconds
//                                                                  before any table is written, so a test can fill the
//                                                                  disk mid-write (tests/mpi_tests.sh, "disk filling
//                                                                  during the collective write")
//   publish-delay=S                 trace/h5_file.cpp              rank 0 waits S seconds before publishing a result,
//                                                                  so that runs overlap, a signal or the watchdog finds
//                                                                  the temporary open (tests/mpi_tests.sh,
//                                                                  tests/bad_input_tests.sh)
//   record-delay=S                  trace/h5_file.cpp              the rank that writes the watchdog's failure record
//                                                                  holds it S seconds before publishing, so the other
//                                                                  ranks' watchdogs fire meanwhile (tests/mpi_tests.sh,
//                                                                  "rank 0 stopped")
//
// docs/reliability.md, "Injected faults", says what each shows.
#pragma once
#include <string>

namespace sb {

enum class Fault {
  DropGradShard,
  WrongReductionScale,
  StalePrefetch,
  Zero1SkipParamGather,
  OffloadSkipUpload,
  TpSkipAttentionAllReduce,
  TpSkipFeedForwardAllReduce,
  TpWrongHeadShard,
  TpWrongVocabOffset,
  TpBf16GradientAllReduce,
  WriteDelay,
  PublishDelay,
  RecordDelay
};

// Whether `f` is the injected fault, and for a delay its seconds.
struct InjectedFault {
  bool on = false;
  unsigned seconds = 0;
  explicit operator bool() const { return on; }
};
InjectedFault injected_fault(Fault f);

// What SHARDBENCH_INJECT_FAULT's value `v` chooses (nothing for an empty value); throws
// UsageError naming the faults for a value that is none of them. injected_fault() reads
// the variable through it once.
struct FaultChoice {
  bool any = false;
  Fault fault = Fault::DropGradShard;
  unsigned seconds = 0;
};
FaultChoice parse_fault_choice(const std::string& v);

}  // namespace sb
