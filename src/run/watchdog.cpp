// The watchdog (as PyTorch's NCCL watchdog): a thread per rank that ends the whole job when
// its rank has made no progress for --timeout-s, e.g. because another rank is stopped or
// stuck and a collective never completes. It names the rank, the step and what was pending,
// lets the first rank to time out record the run as failed (rank 0 may be
// the stuck one), removes temporaries and exits non-zero, which makes
// mpirun (or srun) end every other rank.
#include <unistd.h>

#include <algorithm>
#include <chrono>
#include <cstdio>
#include <cstdlib>

#include "shardbench/core/check.h"
#include "shardbench/run/watchdog.h"

namespace sb {

Watchdog::Watchdog(double timeout_s, int rank, std::function<void(const std::string&)> on_timeout)
    : timeout_s_(timeout_s), rank_(rank), on_timeout_(std::move(on_timeout)) {
  progress(0, "start-up");
  if (timeout_s_ > 0) thread_ = std::thread([this] { watch(); });
}

Watchdog::~Watchdog() {
  {
    std::lock_guard<std::mutex> lock(mutex_);
    stop_ = true;
  }
  wake_.notify_all();
  if (thread_.joinable()) thread_.join();
}

void Watchdog::progress(int step, const char* pending) {
  std::lock_guard<std::mutex> lock(mutex_);
  step_ = step;
  pending_ = pending;
  last_ = std::chrono::steady_clock::now();
}

void Watchdog::watch() {
  std::unique_lock<std::mutex> lock(mutex_);
  const auto period = std::chrono::duration<double>(std::min(1.0, timeout_s_ / 4));
  while (!wake_.wait_for(lock, period, [this] { return stop_; })) {
    const double idle = std::chrono::duration<double>(std::chrono::steady_clock::now() - last_).count();
    if (idle < timeout_s_) continue;
    char host[256] = "?";
    gethostname(host, sizeof host - 1);
    char line[512];
    std::snprintf(line, sizeof line,
                  "watchdog: %s rank %d: no progress for %.0f s in step %d (pending: %s); ending the job "
                  "(--timeout-s %g)",
                  host, rank_, idle, step_, pending_, timeout_s_);
    std::fprintf(stderr, "shardbench: %s\n", line);
    std::fflush(stderr);
    if (on_timeout_) on_timeout_(line);
    remove_temporaries();
    std::_Exit(kExitFailure);
  }
}

}  // namespace sb
