// The main of every shardbench program.
#pragma once
#include <functional>

namespace sb {

// What a program does once MPI is up: its exit code.
using ProgramBody = std::function<int(int argc, char** argv, int rank, int world)>;

// MPI up with errors returned to MPI_CHECK, `body(argc, argv, rank, world)`, a UsageError
// printed once as "<program>: error: ..." with exit code 2 on every rank (all ranks parsed
// the same argv, so none hangs), a RunFailure likewise with exit code 1, any other
// exception fatal; MPI down.
int mpi_main(int argc, char** argv, const ProgramBody& body);

}  // namespace sb
