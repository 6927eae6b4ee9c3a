// The main of every program: MPI up, the body, errors reported once, MPI down.
#include <cstdio>
#include <string>

#include "shardbench/core/check.h"
#include "shardbench/run/mpi_main.h"

namespace sb {

int mpi_main(int argc, char** argv, const ProgramBody& body) {
  MPI_CHECK(MPI_Init(&argc, &argv));
  // Errors come back to MPI_CHECK, which names the call, host and rank before aborting.
  MPI_CHECK(MPI_Comm_set_errhandler(MPI_COMM_WORLD, MPI_ERRORS_RETURN));
  remove_temporaries_on_signals();  // after MPI_Init, whose handlers these replace
  int rank = 0, world = 1, code = kExitOk;
  MPI_CHECK(MPI_Comm_rank(MPI_COMM_WORLD, &rank));
  MPI_CHECK(MPI_Comm_size(MPI_COMM_WORLD, &world));
  try {
    code = body(argc, argv, rank, world);
  } catch (const UsageError& e) {
    if (rank == 0) std::fprintf(stderr, "%s: error: %s\n", argv[0], e.what());
    code = kExitUsage;
  } catch (const ResultKeptAside& e) {
    if (rank == 0) std::fprintf(stderr, "%s: error: %s\n", argv[0], e.what());
    code = kExitKeptAside;
  } catch (const RunFailure& e) {
    if (rank == 0) std::fprintf(stderr, "%s: error: %s\n", argv[0], e.what());
    code = kExitFailure;
  } catch (const std::exception& e) {
    SB_FATAL(std::string("unexpected error: ") + e.what());
  }
  MPI_CHECK(MPI_Finalize());
  return code;
}

}  // namespace sb
