#include "shardbench/core/check.h"

#include <sys/stat.h>
#include <sys/statvfs.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <csignal>
#include <cstdio>
#include <cstdlib>
#include <cstring>

namespace sb {

namespace {
constexpr int kMaxTemporaries = 4;
char g_temporary[kMaxTemporaries][4096];
int64_t g_needed[kMaxTemporaries];
volatile sig_atomic_t g_in_use[kMaxTemporaries];

std::string directory_of(const std::string& path) {
  const size_t slash = path.find_last_of('/');
  return slash == std::string::npos ? "." : path.substr(0, slash + 1);
}

void on_termination(int sig) {
  remove_temporaries();
  std::signal(sig, SIG_DFL);
  std::raise(sig);
}
}  // namespace

void register_temporary(const std::string& path, int64_t bytes_needed) {
  for (int i = 0; i < kMaxTemporaries; ++i)
    if (!g_in_use[i] && path.size() < sizeof g_temporary[i]) {
      std::snprintf(g_temporary[i], sizeof g_temporary[i], "%s", path.c_str());
      g_needed[i] = bytes_needed;
      g_in_use[i] = 1;
      return;
    }
}

void forget_temporary(const std::string& path) {
  for (int i = 0; i < kMaxTemporaries; ++i)
    if (g_in_use[i] && path == g_temporary[i]) g_in_use[i] = 0;
}

void remove_temporaries() {
  for (int i = 0; i < kMaxTemporaries; ++i)
    if (g_in_use[i]) {
      unlink(g_temporary[i]);  // every rank may try; all but the first get ENOENT
      g_in_use[i] = 0;
    }
}

void remove_temporaries_on_signals() {
  for (int sig : {SIGTERM, SIGINT, SIGHUP}) std::signal(sig, on_termination);
}

int64_t free_bytes(const std::string& dir) {
  struct statvfs fs;
  if (statvfs(dir.c_str(), &fs) != 0) return -1;
  return int64_t(fs.f_bavail) * int64_t(fs.f_frsize);
}

std::string disk_space_cause() {
  const int err = errno;
  for (int i = 0; i < kMaxTemporaries; ++i) {
    if (!g_in_use[i]) continue;
    const std::string dir = directory_of(g_temporary[i]);
    struct stat st;
    const int64_t written = stat(g_temporary[i], &st) == 0 ? int64_t(st.st_size) : 0;
    const int64_t avail = free_bytes(dir);
    // Full: the write said so, or less room is left than the rest of the result needs.
    if (err == ENOSPC || (avail >= 0 && avail < std::max<int64_t>(g_needed[i] - written, 64 * 1024)))
      return "No space left on device: '" + dir + "' has " + std::to_string(avail) +
             " bytes free, the result needs about " + std::to_string(g_needed[i]) + " bytes";
  }
  return "";
}

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
  remove_temporaries();  // MPI_Abort ends the process without unwinding
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
  if (rc < 0) {
    const std::string cause = disk_space_cause();
    fatal(std::string(call) + " failed (HDF5)" + (cause.empty() ? "" : ": " + cause), file, line);
  }
  return rc;
}

bool injected_fault(const char* fault) {
  static const char* chosen = std::getenv("SHARDBENCH_INJECT_FAULT");
  return chosen && std::strcmp(chosen, fault) == 0;
}

}  // namespace sb
