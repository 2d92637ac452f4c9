// What every blocking call leaves behind, recorded in one place (blockingCall,
// runtime/blocking.h), on the thread that runs the call's body: a BLOCKING_CALL
// span in the SHOAL_TIMELINE trace (rank 0) and, at SHOAL_LOG_LEVEL=debug, one
// line per call with its bytes, algorithm and compressor decision.
// Costs two predictable checks when neither is on, and builds nothing.
#pragma once

#include <cstdint>
#include <optional>
#include <string>

#include "comm/communicator.h"
#include "core/error.h"

namespace shoal::runtime {

class CallTrace {
 public:
  CallTrace(shoal_comm& comm, const char* call);
  ~CallTrace();  // records the call; a call that threw is recorded as failed
  CallTrace(const CallTrace&) = delete;
  CallTrace& operator=(const CallTrace&) = delete;
  void succeeded() { ok_ = true; }

 private:
  shoal_comm& comm_;
  const char* call_;
  bool debug_ = false;
  bool timeline_ = false;
  bool ok_ = false;
  Clock::time_point begin_;
  uint64_t sentBefore_ = 0;
  // The previous allreduce's stats, restored for calls that are not allreduces;
  // made only when the call is traced (an untraced call builds no strings).
  std::optional<CompressStats> saved_;
};

}  // namespace shoal::runtime
