// Horovod's join for uneven data: a rank that ran out of batches calls
// shoal_join and, until every rank has joined, keeps taking part in the other
// ranks' named allreduces with the op's identity (zeros for sum and average),
// so their training loop finishes instead of hanging. The negotiation treats a
// joined rank as having submitted every allreduce (decide() in negotiation.h);
// the joined rank learns each name's dtype, shape and compressor from the full
// round's announcements and runs a stand-in request on its engine thread.
//
// As in Horovod ("... is not supported with Join"), allgather, broadcast,
// alltoall, reduce-scatter and blocking calls cannot be stood in
// for: they fail on the ranks that submitted them, and the joined ranks'
// shoal_join reports the same text once every rank has joined. Average
// divides by the communicator's size, joined ranks included (Horovod's too).
#pragma once

#include <cstdint>
#include <memory>
#include <string>
#include <vector>

#include "runtime/request.h"

namespace shoal::runtime {

// Why a joined rank cannot stand in for a request with this metadata ("" if
// it can): only allreduces whose op has zero as its identity (sum, avg, bor, bxor).
std::string whyNoStandIn(const Metadata& meta);

// A joined rank's request for `name`: zeros of meta's dtype and shape, reduced in place.
std::shared_ptr<Request> makeStandIn(const std::string& name, const Metadata& meta);

// Which ranks joined in which negotiation cycle; every rank records the same
// cycles from the same full rounds, so every rank names the same last rank.
class JoinTracker {
 public:
  explicit JoinTracker(int ranks) : joinedAt_(ranks, -1) {}
  // Records the ranks with a pending join in this cycle's full round.
  void saw(const std::vector<int>& joined, uint64_t cycle);
  // The rank that joined last (ties: the highest rank, as Horovod's
  // coordinator reports the last join it processed in a cycle).
  int lastToJoin() const;
  // A stand-in or a refused collective's error, kept for this rank's join.
  void noteError(const std::string& text) {
    if (error_.empty()) error_ = text;
  }
  const std::string& error() const { return error_; }
  void reset();

 private:
  std::vector<int64_t> joinedAt_;
  std::string error_;
};

}  // namespace shoal::runtime
