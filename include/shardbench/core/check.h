// Error handling: one checked-call macro per library, naming the call, host, rank, file
// and line. Once MPI is up a fatal error aborts the whole job so no rank is left waiting
// inside a collective.
#pragma once
#include <mpi.h>

#include <cstdint>
#include <stdexcept>
#include <string>
#include <vector>

namespace sb {

// A runtime failure every rank agreed on (e.g. no room for the result): one line on rank 0,
// exit code kExitFailure on every rank, no abort.
struct RunFailure : std::runtime_error {
  using std::runtime_error::runtime_error;
};

// A bad value given by the user: reported as one line, exit code kExitUsage on every rank.
struct UsageError : std::runtime_error {
  using std::runtime_error::runtime_error;
};

// The run finished and wrote its result, but another run took its --out meanwhile: the
// result is kept under a suffixed name (the message names it). Exit code kExitKeptAside on
// every rank.
struct ResultKeptAside : std::runtime_error {
  using std::runtime_error::runtime_error;
};

// Exit codes of every shardbench program (documented in README.md).
enum ExitCode : int {
  kExitOk = 0,
  kExitFailure = 1,     // runtime failure (a library call failed, a rank died)
  kExitUsage = 2,       // bad flag or value; nothing was run
  kExitOutOfMemory = 3, // the memory plan does not fit the limit; nothing was allocated
  kExitCheckFailed = 4, // wrong data: --check found final weights that differ from the
                        // single-rank reference, or the loss became inf/NaN;
                        // collective_perf: wrong elements in a result
  kExitBelowFloor = 5,  // collective_perf: average bus bandwidth under --min-busbw
  kExitKeptAside = 6,   // the result is complete but kept as <out>-2.h5 (...): another run
                        // published --out while this one ran
};

// Prints "shardbench: fatal: <host> rank <r>: <msg> (<file>:<line>)" and aborts the job.
[[noreturn]] void fatal(const std::string& msg, const char* file, int line);

void mpi_check(int rc, const char* call, const char* file, int line);
// HDF5 calls return a negative herr_t or hid_t on failure; the value passes through.
int64_t h5_check(int64_t rc, const char* call, const char* file, int line);

// Temporary files of this process (result files being written). Their owner removes them
// on the normal paths; fatal() and the termination signals (SIGTERM, SIGINT, SIGHUP, after
// remove_temporaries_on_signals()) remove them too, so no exit path leaves one behind.
void register_temporary(const std::string& path, int64_t bytes_needed);
void forget_temporary(const std::string& path);
void remove_temporaries();  // async-signal-safe
void remove_temporaries_on_signals();
// A result's temporary is PATH.<host>.<pid>.tmp (or .failed.tmp), created by its writer with
// create_locked_temporary(), which holds a lock on it until the descriptor is closed: a
// SIGKILL of every rank releases the lock but leaves the file. remove_stale_temporaries()
// removes PATH's temporaries whose writer is gone and returns their names: of this host,
// whose lock is free (where the filesystem has no locks: whose pid is gone); of another
// host, whose lock is free and which nothing wrote for 10 minutes.
int create_locked_temporary(const std::string& path);  // the descriptor, or -1 with errno
// ".<host>.<pid><suffix>": what names this process's temporary after PATH (PATH + tag);
// remove_stale_temporaries() reads the writer back from it.
std::string temporary_tag(const char* suffix = ".tmp");
// Gives a finished temporary `tmp` (in PATH's folder) the name `path`: replacing what is
// there with `overwrite`, else only if the name is free at this moment (atomically:
// renameat2 RENAME_NOREPLACE, or link + unlink where the filesystem lacks it). Every file
// under a final name is complete. Returns 0, or the errno (EEXIST: taken).
int publish_temporary(const std::string& tmp, const std::string& path, bool overwrite);
// Flushes a file (flags O_RDONLY) or a folder's entries (O_RDONLY | O_DIRECTORY) to stable
// storage; 0 or the errno.
int sync_path(const std::string& path, int flags);
std::vector<std::string> remove_stale_temporaries(const std::string& path);
// "No space left on device: '<dir>' has N bytes free, the result needs about M bytes" when
// the filesystem of a registered temporary is (nearly) full, else "".
std::string disk_space_cause();
// Free bytes for an unprivileged writer on the filesystem holding `dir`; -1 if unknown.
int64_t free_bytes(const std::string& dir);

}  // namespace sb

#define SB_FATAL(msg) ::sb::fatal((msg), __FILE__, __LINE__)
#define MPI_CHECK(call) ::sb::mpi_check((call), #call, __FILE__, __LINE__)
#define H5_CHECK(call) ::sb::h5_check((call), #call, __FILE__, __LINE__)
#define SB_ASSERT(cond, msg)                                   \
  do {                                                         \
    if (!(cond)) SB_FATAL(std::string("assertion failed: ") + #cond + ": " + (msg)); \
  } while (0)
