// shoal::Error carries a status code and text that names what to fix. Internal
// code throws it; lib/api is the only place that catches and turns it into a
// shoal_status_t.
#pragma once

#include <chrono>
#include <stdexcept>
#include <string>

#include <fmt/format.h>

#include "shoal/status.h"

namespace shoal {

class Error : public std::runtime_error {
 public:
  Error(shoal_status_t status, const std::string& what) : std::runtime_error(what), status_(status) {}
  shoal_status_t status() const { return status_; }

 private:
  shoal_status_t status_;
};

// Out of line and cold: a refusal formats text, and inlined into a check it
// would give the check's healthy path the stack frame of the formatting.
template <typename... Args>
[[noreturn, gnu::noinline, gnu::cold]] void fail(shoal_status_t status, fmt::format_string<Args...> format,
                                                 Args&&... args) {
  throw Error(status, fmt::format(format, std::forward<Args>(args)...));
}

using Clock = std::chrono::steady_clock;
using Deadline = Clock::time_point;

// `seconds` after `now`. Saturates: a huge (or infinite) number of seconds is
// the farthest representable time, not an overflow into the past that would
// make every wait fail at once.
inline Deadline deadlineFrom(Clock::time_point now, double seconds) {
  constexpr double kFarthest = 1e9;  // about 31 years; far below the clock's range
  if (!(seconds < kFarthest)) seconds = seconds != seconds ? 0 : kFarthest;  // NaN: now
  if (!(seconds > 0)) seconds = 0;
  return now + std::chrono::duration_cast<Clock::duration>(std::chrono::duration<double>(seconds));
}

inline Deadline deadlineAfter(double seconds) { return deadlineFrom(Clock::now(), seconds); }

}  // namespace shoal
