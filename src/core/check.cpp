#include "shardbench/core/check.h"

#include <dirent.h>
#include <fcntl.h>
#include <sys/file.h>
#include <sys/stat.h>
#include <sys/statvfs.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <csignal>
#include <cstdio>
#include <cstdlib>
#include <ctime>

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

int create_locked_temporary(const std::string& path) {
  const int fd = open(path.c_str(), O_RDWR | O_CREAT | O_EXCL | O_CLOEXEC, 0644);
  if (fd < 0) return -1;
  // Shared: the writer's own HDF5 opens do not conflict; a cleaner's exclusive try does.
  // A filesystem without flock leaves the file unlocked: the pid check below covers it.
  flock(fd, LOCK_SH | LOCK_NB);
  return fd;
}

std::string temporary_tag(const char* suffix) {
  char host[64] = "host";
  gethostname(host, sizeof host - 1);
  char tag[128];
  std::snprintf(tag, sizeof tag, ".%s.%ld%s", host, long(getpid()), suffix);
  return tag;
}

int publish_temporary(const std::string& tmp, const std::string& path, bool overwrite) {
  if (overwrite) return std::rename(tmp.c_str(), path.c_str()) == 0 ? 0 : errno;
  if (renameat2(AT_FDCWD, tmp.c_str(), AT_FDCWD, path.c_str(), RENAME_NOREPLACE) == 0) return 0;
  if (errno != EINVAL && errno != ENOSYS && errno != ENOTSUP) return errno;
  if (link(tmp.c_str(), path.c_str()) != 0) return errno;
  unlink(tmp.c_str());
  return 0;
}

int sync_path(const std::string& path, int flags) {
  const int fd = open(path.c_str(), flags);
  if (fd < 0) return errno;
  const int rc = fsync(fd) == 0 ? 0 : errno;
  close(fd);
  return rc;
}

std::vector<std::string> remove_stale_temporaries(const std::string& path) {
  const size_t slash = path.find_last_of('/');
  const std::string dir = slash == std::string::npos ? "." : path.substr(0, slash);
  const std::string base = path.substr(slash == std::string::npos ? 0 : slash + 1) + ".";
  char host[64] = "host";  // as the temporaries' names hold it (h5_file.cpp)
  gethostname(host, sizeof host - 1);
  std::vector<std::string> removed;
  DIR* d = opendir(dir.empty() ? "/" : dir.c_str());
  if (!d) return removed;
  while (const dirent* e = readdir(d)) {
    const std::string name = e->d_name;
    const std::string tail = name.size() > base.size() && name.compare(0, base.size(), base) == 0
                                 ? name.substr(base.size()) : "";
    // <host>.<pid>.tmp or <host>.<pid>.failed.tmp
    std::string id = tail.size() > 4 && tail.compare(tail.size() - 4, 4, ".tmp") == 0 ? tail.substr(0, tail.size() - 4) : "";
    if (id.size() > 7 && id.compare(id.size() - 7, 7, ".failed") == 0) id.resize(id.size() - 7);
    const size_t dot = id.find_last_of('.');
    if (dot == std::string::npos || dot == 0 || id.find_first_not_of("0123456789", dot + 1) != std::string::npos ||
        dot + 1 == id.size())
      continue;
    const std::string file = (slash == std::string::npos ? "" : dir + "/") + name;
    const int fd = open(file.c_str(), O_RDONLY | O_NOFOLLOW | O_CLOEXEC);
    if (fd < 0) continue;
    const bool here = id.compare(0, dot, host) == 0;
    const long pid = std::atol(id.c_str() + dot + 1);
    const bool unlocked = flock(fd, LOCK_EX | LOCK_NB) == 0, no_locks = !unlocked && errno != EWOULDBLOCK;
    struct stat st;
    const bool quiet = fstat(fd, &st) == 0 && std::time(nullptr) - st.st_mtime > 600;
    // This host's locks are exact; where the filesystem has none, a gone pid says it. A
    // cluster filesystem's locks may be node-local: another host's writer must also have
    // left its file untouched for 10 minutes (a live writer writes).
    const bool stale = here ? unlocked || (no_locks && pid > 0 && kill(pid_t(pid), 0) != 0 && errno == ESRCH)
                            : unlocked && quiet;
    if (stale && unlink(file.c_str()) == 0) removed.push_back(file);
    close(fd);
  }
  closedir(d);
  return removed;
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

}  // namespace sb
