// fsdp_perf: FSDP training steps of a synthetic T5; everything else is the training protocol (src/train/).
#include "shardbench/train/train.h"

int main(int argc, char** argv) { return sb::run_program(argc, argv, sb::StrategyKind::FSDP); }
