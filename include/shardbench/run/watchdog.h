// The watchdog: ends the job when this rank has made no progress for timeout_s (0: off),
// after one line naming the rank, step and pending operation and a call of on_timeout
// (from the watchdog's thread; the first rank to time out records the failure there).
#pragma once
#include <chrono>
#include <condition_variable>
#include <functional>
#include <mutex>
#include <string>
#include <thread>

namespace sb {

class Watchdog {
 public:
  Watchdog(double timeout_s, int rank, std::function<void(const std::string&)> on_timeout);
  ~Watchdog();
  void progress(int step, const char* pending);  // `pending`: a string literal

 private:
  void watch();
  double timeout_s_;
  int rank_;
  std::function<void(const std::string&)> on_timeout_;
  std::mutex mutex_;
  std::condition_variable wake_;
  std::thread thread_;
  bool stop_ = false;
  int step_ = 0;
  const char* pending_ = "";
  std::chrono::steady_clock::time_point last_;
};

}  // namespace sb
