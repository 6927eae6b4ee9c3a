// The run's environment: host, ranks per node, nodes, memory, wall-clock time, the result path.
#include <sys/stat.h>
#include <unistd.h>

#include <algorithm>
#include <chrono>
#include <cstdio>
#include <ctime>
#include <string>
#include <vector>

#include "shardbench/core/check.h"
#include "shardbench/core/nodes.h"
#include "shardbench/run/environment.h"

namespace sb {

namespace {
// Broadcasts rank 0's string to every rank.
void bcast_string(std::string& s) {
  int size = int(s.size());
  MPI_CHECK(MPI_Bcast(&size, 1, MPI_INT, 0, MPI_COMM_WORLD));
  s.resize(size);
  MPI_CHECK(MPI_Bcast(s.data(), size, MPI_CHAR, 0, MPI_COMM_WORLD));
}

// The file --out names, followed through its symbolic links as cp and a shell's `>` follow
// them: a link (dangling or not) is written through to its target, and stays a link. ""
// when the links loop.
std::string through_links(const std::string& path) {
  std::string p = path;
  for (int hops = 0; hops < 40; ++hops) {  // Linux's own limit (ELOOP)
    struct stat st;
    char target[4096];
    if (lstat(p.c_str(), &st) != 0 || !S_ISLNK(st.st_mode)) return p;
    const ssize_t n = readlink(p.c_str(), target, sizeof target - 1);
    if (n <= 0) return p;
    target[n] = 0;
    const size_t slash = p.find_last_of('/');
    p = target[0] == '/' || slash == std::string::npos ? std::string(target) : p.substr(0, slash + 1) + target;
  }
  return "";
}
}  // namespace

std::string hostname() {
  char host[256] = "?";
  gethostname(host, sizeof host - 1);
  return host;
}

int64_t default_memory_limit(int64_t device_free) {
  const int64_t host = default_host_memory_limit();  // collective: every rank calls it
  return device_free > 0 ? device_free : host;
}

int64_t default_host_memory_limit() {
  const int ranks = node_map().local_ranks();
  return int64_t(sysconf(_SC_PHYS_PAGES)) * sysconf(_SC_PAGE_SIZE) / ranks;
}

std::string iso_time(double epoch_seconds) {
  const time_t t = time_t(epoch_seconds);
  struct tm tm;
  gmtime_r(&t, &tm);
  char buf[32];
  std::strftime(buf, sizeof buf, "%Y-%m-%dT%H:%M:%SZ", &tm);
  return buf;
}

HostShare HostShare::now() {
  HostShare h;
  h.wall = std::chrono::duration<double>(std::chrono::steady_clock::now().time_since_epoch()).count();
  timespec ts{};
  if (clock_gettime(CLOCK_PROCESS_CPUTIME_ID, &ts) == 0) h.cpu = double(ts.tv_sec) + 1e-9 * double(ts.tv_nsec);
  if (FILE* f = std::fopen("/proc/loadavg", "r")) {  // Linux; elsewhere the load stays 0
    if (std::fscanf(f, "%lf", &h.load1) != 1) h.load1 = 0;
    std::fclose(f);
  }
  return h;
}

HostShareSummary host_share_since(const HostShare& since) {
  const HostShare end = HostShare::now();
  const double wall = end.wall - since.wall;
  double share = wall > 0 ? (end.cpu - since.cpu) / wall : 0;
  int world = 1, rank = 0;
  MPI_CHECK(MPI_Comm_size(MPI_COMM_WORLD, &world));
  MPI_CHECK(MPI_Comm_rank(MPI_COMM_WORLD, &rank));
  std::vector<double> all(size_t(world), 0.0);
  MPI_CHECK(MPI_Allgather(&share, 1, MPI_DOUBLE, all.data(), 1, MPI_DOUBLE, MPI_COMM_WORLD));
  std::sort(all.begin(), all.end());
  HostShareSummary s;
  s.cpu_share_min = all.front();
  s.cpu_share_median = world % 2 ? all[size_t(world / 2)] : 0.5 * (all[size_t(world / 2 - 1)] + all[size_t(world / 2)]);
  double loads[2] = {since.load1, end.load1};
  MPI_CHECK(MPI_Bcast(loads, 2, MPI_DOUBLE, 0, MPI_COMM_WORLD));
  s.load_start = loads[0];
  s.load_end = loads[1];
  s.cpus_online = rank == 0 ? int(sysconf(_SC_NPROCESSORS_ONLN)) : 0;
  MPI_CHECK(MPI_Bcast(&s.cpus_online, 1, MPI_INT, 0, MPI_COMM_WORLD));
  return s;
}

double wall_clock_rank0() {
  double t = double(std::time(nullptr));
  MPI_CHECK(MPI_Bcast(&t, 1, MPI_DOUBLE, 0, MPI_COMM_WORLD));
  return t;
}

std::string resolve_output(const std::string& out, bool overwrite, const std::string& stem, int rank) {
  std::string path = out, error;
  struct stat st;
  if (rank == 0 && path.empty()) {
    struct tm tm;
    const time_t t = time_t(std::time(nullptr));
    gmtime_r(&t, &tm);
    char stamp[32];
    std::strftime(stamp, sizeof stamp, "%Y%m%d-%H%M%S", &tm);
    const std::string base = "results/" + stem + "-" + stamp;
    mkdir("results", 0755);
    path = base + ".h5";
    for (int i = 2; stat(path.c_str(), &st) == 0; ++i)
      path = base + "-" + std::to_string(i) + ".h5";
  }
  if (rank == 0) {
    const std::string file = path.empty() || path.back() == '/' ? path : through_links(path);
    const std::string out = "--out '" + path + "'" +
                            (file != path && !file.empty() ? " (a symbolic link to '" + file + "')" : "");
    const size_t slash = file.find_last_of('/');
    const std::string dir = slash == std::string::npos ? "." : file.substr(0, slash + 1);
    if (path.empty() || path.back() == '/')
      error = out + " is not allowed (must name a file, e.g. results/run.h5)";
    else if (file.empty())
      error = out + " is not allowed (its symbolic links loop)";
    else if (stat(dir.c_str(), &st) != 0 || !S_ISDIR(st.st_mode))
      error = out + ": directory '" + dir + "' does not exist (create it first)";
    else if (access(dir.c_str(), W_OK) != 0)
      error = out + ": directory '" + dir + "' is not writable";
    else if (stat(file.c_str(), &st) == 0 && S_ISDIR(st.st_mode))
      error = out + " is a directory (must name a file)";
    else if (stat(file.c_str(), &st) == 0 && !overwrite)
      error = out + " exists (pass --overwrite to replace it, or choose another name)";
    if (error.empty()) {
      path = file;
      // Temporaries of earlier runs to this name whose every rank was killed (SIGKILL
      // leaves them): removed, or they would pile up beside the results.
      for (const std::string& stale : remove_stale_temporaries(path))
        std::fprintf(stderr, "shardbench: removed '%s', the temporary of an earlier run to this --out that "
                             "was killed\n", stale.c_str());
    }
  }
  bcast_string(error);
  if (!error.empty()) throw UsageError(error);
  bcast_string(path);
  return path;
}

}  // namespace sb
