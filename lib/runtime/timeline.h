// The Chrome-trace timeline (SHOAL_TIMELINE=path, written by rank 0): one
// row (tid) per tensor, named by a thread_name metadata record, with one
// complete ("X") event per phase: NEGOTIATE, QUEUE, MEMCPY_IN_FUSION, the
// collective (ALLREDUCE, ALLGATHER, BROADCAST) or the compressor's rounds
// (ENCODE, COMPRESSED_ALLREDUCE / COMPRESSED_ALLGATHERV with bytes, DECODE),
// MEMCPY_OUT_FUSION; and one BLOCKING_CALL event per blocking call (with or
// without the runtime) on the row __shoal_blocking_call, whose args say the
// call, bytes, algorithm and compressor (runtime/call_trace.h).
// The file is a JSON array, closed when the runtime stops
// (chrome://tracing and Perfetto also read an unclosed one).
#pragma once

#include <cstdio>
#include <string>
#include <unordered_map>

#include "core/error.h"

namespace shoal::runtime {

class Timeline {
 public:
  // Throws Error(SHOAL_ERR_SYSTEM) naming the path when it cannot be written.
  // While another communicator of this process writes `path`, this one writes
  // `path` with ".1" (".2", ...) before a ".json" ending (or after the path).
  explicit Timeline(const std::string& path);
  const std::string& path() const { return path_; }
  ~Timeline();
  Timeline(const Timeline&) = delete;
  Timeline& operator=(const Timeline&) = delete;

  // One phase of one tensor; args is "" or JSON members without braces, e.g. "\"bytes\": 12".
  void span(const std::string& tensor, const char* phase, Clock::time_point begin, Clock::time_point end,
            const std::string& args = "");
  void flush();

 private:
  int rowOf(const std::string& tensor);
  void event(const std::string& json);

  std::string path_;
  std::FILE* file_ = nullptr;
  Clock::time_point origin_;
  std::unordered_map<std::string, int> rows_;
  bool first_ = true;
};

}  // namespace shoal::runtime
