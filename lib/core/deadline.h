// A collective call's deadline, read from the clock only when a wait needs it.
#pragma once

#include <atomic>
#include <limits>

#include "core/error.h"

namespace shoal {

// SHOAL_TIMEOUT_S (or a call's own timeout) from the first moment a wait of
// the call needs a deadline: a call whose peers are already there (a small
// call through the shared segment) reads no clock at all. Once read it stays,
// the one deadline of every later wait of the call, so the call as a whole
// still ends by it. Converts to the Deadline that transports and stores take.
// (The moment is set once, by whichever thread asks first.)
class CallDeadline {
 public:
  explicit CallDeadline(double seconds) : seconds_(seconds) {}
  // A deadline already read (implicit: every Deadline is one).
  CallDeadline(Deadline at) : seconds_(0), at_(at.time_since_epoch().count()) {}  // NOLINT(google-explicit-constructor)
  // A copy has the same deadline: the original's is read now if no wait read it yet.
  CallDeadline(const CallDeadline& other) : seconds_(other.seconds_), at_(other.get().time_since_epoch().count()) {}
  // A move keeps the original's state: a deadline not read yet stays unread.
  CallDeadline(CallDeadline&& other) noexcept
      : seconds_(other.seconds_), at_(other.at_.load(std::memory_order_relaxed)) {}
  CallDeadline& operator=(const CallDeadline&) = delete;

  // The deadline, counted from now where no wait read it before.
  Deadline get() const {
    const Clock::rep at = at_.load(std::memory_order_relaxed);
    return at != kUnread ? Deadline(Clock::duration(at)) : from(Clock::now());
  }
  // The same, counted from `now` (a clock reading the wait has just made) where it is not read yet.
  Deadline from(Clock::time_point now) const {
    Clock::rep at = at_.load(std::memory_order_relaxed);
    if (at == kUnread) {
      const Clock::rep mine = deadlineFrom(now, seconds_).time_since_epoch().count();
      at = at_.compare_exchange_strong(at, mine, std::memory_order_relaxed) ? mine : at;
    }
    return Deadline(Clock::duration(at));
  }
  operator Deadline() const { return get(); }  // NOLINT(google-explicit-constructor)

 private:
  static constexpr Clock::rep kUnread = std::numeric_limits<Clock::rep>::min();
  double seconds_;
  mutable std::atomic<Clock::rep> at_{kUnread};
};

}  // namespace shoal
