// The run's environment: host, memory, wall-clock time, the result path.
// Every function that says "collective" is called by every rank of MPI_COMM_WORLD.
#pragma once
#include <cstdint>
#include <string>

namespace sb {

std::string hostname();
// Memory one rank may plan for: the device's free memory where known (device_free > 0),
// else host memory / ranks on the node (collective).
int64_t default_memory_limit(int64_t device_free);
// Host memory one rank may plan for (CPU offload's host ledger): the node's memory / ranks
// on the node (collective).
int64_t default_host_memory_limit();
// Decides a result path (default under results/ from `stem`, made unique with a numeric
// suffix; a symbolic link is followed to its target, which the result is written as) and
// checks it on rank 0 before any work; throws UsageError on every rank for an existing
// file (without overwrite), a missing or unwritable directory, links that loop. Removes
// the temporaries of killed runs to the same file (collective).
std::string resolve_output(const std::string& out, bool overwrite, const std::string& stem, int rank);
std::string iso_time(double epoch_seconds);  // ISO 8601 UTC
double wall_clock_rank0();  // rank 0's wall clock, seconds since the epoch (collective)

// How much of the host the run had: each rank's process CPU time over its wall time since
// `since` (a HostShare::now() taken at the start of the measurement), and the load average.
// A check starved by other work on its cores (its ranks at 50 % of a core where the baseline's
// had 100 %) is slower for that reason, not the fabric's: regress.py reads these.
struct HostShare {
  double wall = 0, cpu = 0, load1 = 0;  // steady seconds, process CPU seconds, 1-minute load
  static HostShare now();
};
struct HostShareSummary {
  double cpu_share_min = 0, cpu_share_median = 0;  // over ranks
  double load_start = 0, load_end = 0;              // rank 0's 1-minute load average
  int cpus_online = 0;                              // rank 0's
};
HostShareSummary host_share_since(const HostShare& since);  // collective

}  // namespace sb
