#include "runtime/call_trace.h"

#include <fmt/format.h>

#include "comm/communicator.h"
#include "runtime/engine.h"
#include "collectives/collectives.h"
#include "core/config.h"
#include "core/log.h"
#include "runtime/request.h"

namespace shoal::runtime {
namespace {

// Marks comm.lastStats while a call runs: every allreduce path (plain or
// compressed) overwrites it with rounds >= 0, so a marker still in place
// afterwards means the call was not an allreduce.
constexpr int kNotAnAllreduce = -1;

std::string compressorDecision(const CompressStats& stats) {
  if (stats.compressor != "none" && stats.rounds > 0)
    return fmt::format("compressor {}: {} -> {} payload bytes in {} round{} (ratio {:.3f})", stats.compressor,
                       stats.inputBytes, stats.payloadBytes, stats.rounds, stats.rounds == 1 ? "" : "s",
                       stats.inputBytes ? double(stats.payloadBytes) / double(stats.inputBytes) : 0.0);
  const std::string configured = config::getString("SHOAL_COMPRESSOR");
  if (configured == "none") return "uncompressed";
  const long long minBytes = config::getInt("SHOAL_COMPRESS_MIN_BYTES");
  if (static_cast<long long>(stats.inputBytes) < minBytes)
    return fmt::format("uncompressed (below SHOAL_COMPRESS_MIN_BYTES={} for SHOAL_COMPRESSOR={})", minBytes,
                       configured);
  return fmt::format("uncompressed (SHOAL_COMPRESSOR={} not applied: the call asked for none, or its op or dtype "
                     "does not compress)",
                     configured);
}

}  // namespace

CallTrace::CallTrace(shoal_comm& comm, const char* call) : comm_(comm), call_(call) {
  debug_ = log::threshold() >= log::Level::Debug;
  timeline_ = comm.engine && !comm.engine->writesNoTimeline() && comm.engine->timeline() != nullptr;
  if (!debug_ && !timeline_) return;
  begin_ = Clock::now();
  sentBefore_ = comm.transport ? comm.transport->bytesSent() : 0;
  saved_.emplace(comm.lastStats);
  comm.lastStats.rounds = kNotAnAllreduce;
}

CallTrace::~CallTrace() {
  if (!debug_ && !timeline_) return;
  const Clock::time_point end = Clock::now();
  const bool allreduce = comm_.lastStats.rounds != kNotAnAllreduce;
  if (!allreduce) comm_.lastStats = *saved_;
  const CompressStats& stats = comm_.lastStats;
  const uint64_t sent = comm_.transport ? comm_.transport->bytesSent() - sentBefore_ : 0;
  try {
    std::string what;
    std::string args = fmt::format("\"call\": \"{}\", \"ok\": {}, \"sent_bytes\": {}", call_, ok_, sent);
    if (allreduce) {
      // What the driver ran, as it recorded it (comm/communicator.h): never chosen again here.
      const char* algorithm = stats.algorithm != nullptr ? stats.algorithm : "unknown";
      what = fmt::format("{} bytes, algorithm {}, {}", stats.inputBytes, algorithm, compressorDecision(stats));
      args += fmt::format(", \"bytes\": {}, \"algorithm\": \"{}\", \"compressor\": \"{}\", \"payload_bytes\": {}",
                          stats.inputBytes, algorithm, stats.compressor, stats.payloadBytes);
    } else {
      what = fmt::format("sent {} bytes", sent);
    }
    if (timeline_) {
      if (Timeline* timeline = comm_.engine->timeline()) {
        timeline->span(kBlockingName, "BLOCKING_CALL", begin_, end, args);
        timeline->flush();
      }
    }
    if (debug_)
      SHOAL_LOG_DEBUG("rank {}: {} {}: {}, {:.1f} us", comm_.rank, call_, ok_ ? "done" : "failed", what,
                      std::chrono::duration<double, std::micro>(end - begin_).count());
  } catch (const std::exception&) {
    // Diagnostics never turn a call's result into another error.
  }
}

}  // namespace shoal::runtime
