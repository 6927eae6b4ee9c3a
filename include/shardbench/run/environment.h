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

}  // namespace sb
