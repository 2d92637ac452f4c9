// What every blocking call leaves behind, recorded in one place (blockingCall,
// runtime/blocking.h), on the thread that runs the call's body: a BLOCKING_CALL
// span in the SHOAL_TIMELINE trace (rank 0) and, at SHOAL_LOG_LEVEL=debug, one
// line per call with its bytes, algorithm and compressor decision.
// Costs nothing more than two checks when neither is on.
#pragma once

#include <cstdint>
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
  CompressStats saved_;  // the previous allreduce's stats, restored for calls that are not allreduces
};

}  // namespace shoal::runtime
