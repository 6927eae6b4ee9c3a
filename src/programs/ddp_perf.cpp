// ddp_perf: DDP training steps of a synthetic T5; everything else is the shared harness.
#include "shardbench/harness.h"

int main(int argc, char** argv) { return sb::run_program(argc, argv, sb::StrategyKind::DDP); }
