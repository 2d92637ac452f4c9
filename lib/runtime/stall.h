// Stall inspection: names that some ranks submitted and others did not.
// Works on the full round's Partial list, which every rank has identically,
// so a shutdown decision is the same on every rank; only rank 0 logs.
#pragma once

#include <map>
#include <optional>
#include <string>
#include <vector>

#include "runtime/negotiation.h"

namespace shoal::runtime {

struct StallSettings {
  double checkS = 60;           // SHOAL_STALL_CHECK_S: warn (rank 0) after this long; 0 = never
  double shutdownS = 0;         // SHOAL_STALL_SHUTDOWN_S: error on every rank after this long; 0 = never
  double blockingTimeoutS = 300;  // SHOAL_TIMEOUT_S: a blocking call waits at most this long for its peers
};

class StallInspector {
 public:
  StallInspector(const StallSettings& settings, int rank) : settings_(settings), rank_(rank) {}
  // How often a rank with an old pending request asks for a full round, so
  // that the partial submissions become visible.
  double probeIntervalS() const;
  // Logs the stalled names on rank 0 (at most once per check period per name).
  // Returns the error text when the stall must stop the runtime on every rank.
  std::optional<std::string> inspect(const std::vector<Partial>& partial);
  // The status of the last stop inspect() returned: SHOAL_ERR_MISMATCH when
  // the stalled ranks wait for each other's different calls (each side
  // submitted a name the other did not), else SHOAL_ERR_TIMEOUT.
  shoal_status_t fatalStatus() const { return fatalStatus_; }

 private:
  StallSettings settings_;
  int rank_;
  std::map<std::string, double> warnedAtAge_;
  shoal_status_t fatalStatus_ = SHOAL_ERR_TIMEOUT;  // rank 0: the age at which a name was last reported
};

// "'a' (missing ranks 1, 3; submitted by 0, 2; waiting 61.0 s), ..." for at most `limit` names.
std::string describeStalls(const std::vector<const Partial*>& stalls, size_t limit = 8);

}  // namespace shoal::runtime
