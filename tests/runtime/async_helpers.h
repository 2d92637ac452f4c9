// Helpers of the async-runtime tests: environment overrides for one test,
// tensors with a shape, and "submit, then wait for all" with failures recorded.
#pragma once

#include <gtest/gtest.h>
#include <stdlib.h>

#include <initializer_list>
#include <map>
#include <optional>
#include <string>
#include <vector>

#include "harness/rank_sync.h"
#include "shoal/shoal.h"

namespace shoal::test {

// Sets environment variables for the lifetime of the object (the runtime
// reads them when it starts), restoring the previous values afterwards.
class ScopedEnv {
 public:
  ScopedEnv(std::initializer_list<std::pair<std::string, std::string>> values) {
    for (const auto& [name, value] : values) {
      const char* old = getenv(name.c_str());
      saved_[name] = old ? std::optional<std::string>(old) : std::nullopt;
      setenv(name.c_str(), value.c_str(), 1);
    }
  }
  ScopedEnv(const ScopedEnv&) = delete;
  ScopedEnv& operator=(const ScopedEnv&) = delete;
  ~ScopedEnv() {
    for (const auto& [name, value] : saved_) {
      if (value) setenv(name.c_str(), value->c_str(), 1);
      else unsetenv(name.c_str());
    }
  }

 private:
  std::map<std::string, std::optional<std::string>> saved_;
};

inline shoal_tensor_t tensorOf(void* data, shoal_dtype_t dtype, std::vector<int64_t> shape) {
  shoal_tensor_t t = shoal_tensor_1d(data, 0, dtype);
  t.ndim = static_cast<int>(shape.size());
  for (size_t d = 0; d < shape.size(); ++d) t.shape[d] = shape[d];
  return t;
}

// Waits for every request (deadline seconds), records failures, frees them.
// Returns the number of requests that failed.
inline int waitAndFree(std::vector<shoal_request_t>& requests, double deadline, const std::string& what) {
  int failed = 0;
  shoal_status_t status = shoal_wait_all(requests.data(), static_cast<int>(requests.size()), deadline);
  if (status != SHOAL_OK) {
    ADD_FAILURE() << what << ": shoal_wait_all: " << shoal_status_string(status) << ": " << shoal_last_error(nullptr);
    ++failed;
  }
  for (shoal_request_t r : requests) {
    if (shoal_request_free(r) != SHOAL_OK) {
      ADD_FAILURE() << what << ": shoal_request_free: " << shoal_last_error(nullptr);
      ++failed;
    }
  }
  requests.clear();
  return failed;
}

inline shoal_async_stats_t asyncStats(shoal_comm_t comm) {
  shoal_async_stats_t stats = SHOAL_ASYNC_STATS_INIT;
  callOk(shoal_async_stats(comm, &stats), comm, "shoal_async_stats");
  return stats;
}

}  // namespace shoal::test
