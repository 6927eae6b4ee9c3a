// ddp_perf: DDP training steps of a synthetic T5; everything else is the training protocol (src/train/).
#include "describe.h"
#include "shardbench/train/train.h"

int main(int argc, char** argv) {
  int code = 0;
  if (sb::describe(argc, argv, sb::StrategyKind::DDP, &code)) return code;  // before MPI: no launcher needed
  return sb::run_program(argc, argv, sb::StrategyKind::DDP);
}
