// A view of a communicator's transport that renumbers a subset of its ranks:
// the legs of the hierarchical allreduce run ordinary ring functions over the
// ranks of one host, or over one rank per host, through it. Messages go
// through the parent with the parent's rank numbers, so tags, signatures,
// aborts and failure reports are the parent's.
#pragma once

#include <string>
#include <vector>

#include "transport/transport.h"

namespace shoal {

// The ranks `members` of `parent` seen as ranks 0..members.size()-1; `rank` is
// this rank's index in members. `members` must outlive the view.
class GroupTransport final : public Transport {
 public:
  GroupTransport(Transport& parent, const std::vector<int>& members, int rank)
      : parent_(parent), members_(members), rank_(rank) {}
  int rank() const override { return rank_; }
  int size() const override { return static_cast<int>(members_.size()); }
  const char* name() const override { return parent_.name(); }
  Request isend(int peer, uint64_t tag, const void* data, size_t bytes) override {
    return parent_.isend(members_[peer], tag, data, bytes);
  }
  Request irecv(int peer, uint64_t tag, void* data, size_t bytes) override {
    return parent_.irecv(members_[peer], tag, data, bytes);
  }
  void waitAll(Request* requests, size_t count, Deadline deadline) override {
    parent_.waitAll(requests, count, deadline);
  }
  void waitAny(Request* requests, size_t count, Deadline deadline) override {
    parent_.waitAny(requests, count, deadline);
  }
  void checkNotAborted() override { parent_.checkNotAborted(); }
  void abort(const std::string& reason, shoal_status_t status) override { parent_.abort(reason, status); }
  bool failed() const override { return parent_.failed(); }
  uint64_t bytesSent() const override { return parent_.bytesSent(); }
  std::string failure() const override { return parent_.failure(); }
  shoal_status_t failureStatus() const override { return parent_.failureStatus(); }
  std::string describePeer(int peer) const override { return parent_.describePeer(members_[peer]); }
  void checkForOtherCalls(uint64_t tag) override { parent_.checkForOtherCalls(tag); }
  void checkForMessagesOf(uint64_t tag) override { parent_.checkForMessagesOf(tag); }

 private:
  Transport& parent_;
  const std::vector<int>& members_;
  int rank_;
};

}  // namespace shoal
