// collective_perf: collective bandwidth in the nccl-tests conventions, over the backend.
#pragma once

namespace sb {

// The whole program: MPI up, parse, measure, report, exit code.
int run_collective_perf(int argc, char** argv);

}  // namespace sb
