#include "shardbench/check.h"

#include <unistd.h>

#include <cstdio>
#include <cstdlib>
#include <cstring>

namespace sb {

void fatal(const std::string& msg, const char* file, int line) {
  char host[256] = "?";
  gethostname(host, sizeof host - 1);
  int initialized = 0, finalized = 0, rank = -1;
  MPI_Initialized(&initialized);
  MPI_Finalized(&finalized);
  if (initialized && !finalized) MPI_Comm_rank(MPI_COMM_WORLD, &rank);
  std::fprintf(stderr, "shardbench: fatal: %s rank %d: %s (%s:%d)\n", host, rank, msg.c_str(), file,
               line);
  std::fflush(stderr);
  if (initialized && !finalized) MPI_Abort(MPI_COMM_WORLD, kExitFailure);
  std::exit(kExitFailure);
}

void mpi_check(int rc, const char* call, const char* file, int line) {
  if (rc == MPI_SUCCESS) return;
  char text[MPI_MAX_ERROR_STRING];
  int len = 0;
  MPI_Error_string(rc, text, &len);
  fatal(std::string(call) + " failed: " + std::string(text, len), file, line);
}

int64_t h5_check(int64_t rc, const char* call, const char* file, int line) {
  if (rc < 0) fatal(std::string(call) + " failed (HDF5)", file, line);
  return rc;
}

bool injected_fault(const char* fault) {
  static const char* chosen = std::getenv("SHARDBENCH_INJECT_FAULT");
  return chosen && std::strcmp(chosen, fault) == 0;
}

}  // namespace sb
