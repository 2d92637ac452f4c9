// Helpers for tests whose ranks are threads: a barrier that fails the test
// instead of hanging, and a status check that records shoal's error text.
#pragma once

#include <gtest/gtest.h>

#include <chrono>
#include <condition_variable>
#include <cstdint>
#include <mutex>
#include <string>

#include "shoal/shoal.h"

namespace shoal::test {

// True for SHOAL_OK; otherwise records a failure with the status and shoal_last_error(comm).
inline bool callOk(shoal_status_t status, shoal_comm_t comm, const std::string& what) {
  if (status == SHOAL_OK) return true;
  ADD_FAILURE() << what << ": " << shoal_status_string(status) << ": " << shoal_last_error(comm);
  return false;
}

// A barrier between the rank threads of one test. It gives up (and fails the
// test) instead of hanging when a rank stopped early.
class RankBarrier {
 public:
  explicit RankBarrier(int n) : n_(n) {}
  void wait() {
    std::unique_lock<std::mutex> lock(mutex_);
    if (broken_) return;
    uint64_t generation = generation_;
    if (++arrived_ == n_) {
      arrived_ = 0;
      ++generation_;
      cv_.notify_all();
      return;
    }
    if (!cv_.wait_for(lock, std::chrono::seconds(300), [&] { return generation_ != generation || broken_; })) {
      broken_ = true;
      cv_.notify_all();
      ADD_FAILURE() << "test barrier timed out: a rank stopped early";
    }
  }
  bool broken() {
    std::lock_guard<std::mutex> lock(mutex_);
    return broken_;
  }

 private:
  int n_;
  std::mutex mutex_;
  std::condition_variable cv_;
  int arrived_ = 0;
  uint64_t generation_ = 0;
  bool broken_ = false;
};

}  // namespace shoal::test
