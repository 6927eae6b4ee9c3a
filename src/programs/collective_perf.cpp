// collective_perf: collective bandwidth in the nccl-tests conventions, over the backend.
#include "shardbench/bench/collective_bench.h"

int main(int argc, char** argv) { return sb::run_collective_perf(argc, argv); }
