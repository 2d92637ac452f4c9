// The rank side of in-network aggregation: SHOAL_ALGO=aggregate sends plain
// sum/avg/bor allreduces (and so every homomorphic compressor round, which the
// driver runs as such an allreduce) to the shoal-aggd aggregators named in
// SHOAL_AGGREGATOR, sharded by element range, in fixed-size slots.
#pragma once

#include <cstddef>
#include <cstdint>
#include <functional>
#include <string>
#include <vector>

#include "aggregate/socket.h"
#include "shoal/shoal.h"

namespace shoal::aggregate {

class Client;
// The deleter of shoal_comm::aggregator (comm/communicator.h).
struct ClientRelease { void operator()(Client* client) const; };

// Connections to every aggregator for one communicator.
class Client {
 public:
  // Connects to each endpoint and introduces this rank; Error when one is
  // unreachable before the deadline or refuses the token.
  Client(const std::vector<Endpoint>& endpoints, const std::string& token, const std::string& key, int rank,
         int worldSize, Deadline deadline);
  ~Client();
  Client(const Client&) = delete;
  Client& operator=(const Client&) = delete;

  // recv = the sum (or OR) over every rank of send, count elements; send may
  // equal recv. `signature` (CallSignature::digest, comm/agree.h) travels with
  // every slot: the aggregator fails the call on every rank with
  // SHOAL_ERR_MISMATCH when ranks' signatures differ. checkPeers runs between
  // polls (it throws when a peer aborted or makes another call).
  void allreduce(uint64_t sequence, uint64_t signature, const void* send, void* recv, size_t count,
                 shoal_dtype_t dtype, shoal_op_t op, Deadline deadline, const std::function<void()>& checkPeers);
  size_t aggregators() const { return links_.size(); }

 private:
  struct Link {
    Endpoint where;
    int fd = -1;
    uint32_t slotBytes = 0;
    std::string broken;  // set after a failure: the connection's stream is no longer in step
  };
  std::vector<Link> links_;
};

// ClientRelease (the deleter of shoal_comm::aggregator) is declared in comm/communicator.h.

// SHOAL_ALGO=aggregate: true when this allreduce goes to the aggregators;
// otherwise logs (info, once per dtype and op) that it takes the ring.
bool carries(shoal_dtype_t dtype, shoal_op_t op);

// Under SHOAL_ALGO=aggregate, says once per process (info) that compressor
// rounds that gather (topk's allgatherv) take the ring: the aggregator only adds.
void noteGathersTakeTheRing();
// A fresh random key part that tells one communicator's calls apart at the aggregator.
std::string randomNonce();

}  // namespace shoal::aggregate
