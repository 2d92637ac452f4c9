// shoal-aggd's core: adds the slots that ranks send, without decoding them,
// and streams every completed slot back to every rank (docs/aggregation.md).
#pragma once

#include <condition_variable>
#include <cstdint>
#include <map>
#include <memory>
#include <mutex>
#include <string>
#include <tuple>
#include <vector>

#include "aggregate/socket.h"
#include "aggregate/wire.h"

namespace shoal::aggregate {

struct AggregatorOptions {
  Endpoint listen;
  std::string token;          // every connection must present it
  uint32_t slotBytes = 256u << 10;
  size_t poolSlots = 256;     // slots in flight at once, over every job
  double timeoutS = 300;      // a partly filled slot older than this fails its communicator
};

class Aggregator {
 public:
  explicit Aggregator(AggregatorOptions options);
  ~Aggregator();
  int port() const { return port_; }
  // Accepts connections and serves them until the process ends.
  [[noreturn]] void serve();

 private:
  struct Group;
  // Closed when the last holder lets go, never while another thread may
  // still be writing a result to it (the number could be reused meanwhile).
  struct Connection {
    ~Connection();
    int fd = -1;
    std::string peer;
    std::mutex writeMutex;  // one message at a time on the socket
    std::shared_ptr<Group> group;
    int rank = -1;
    std::weak_ptr<Connection> self;
  };
  // The ranks of one communicator of one job, keyed by the job's token and the
  // communicator's key (the client derives it from a per-communicator nonce).
  struct Group {
    std::string key;
    int worldSize = 0;
    std::vector<std::shared_ptr<Connection>> members;
    std::string broken;  // set once the communicator failed here: later slots get this error
    ErrorKind brokenKind = kFailure;  // kDisagreement when its ranks disagreed on a call
  };
  // One slot of one call being summed.
  struct Slot {
    std::shared_ptr<Group> group;
    uint64_t sequence = 0;
    uint32_t index = 0;
    Header header;           // of the first arrival: the others must match it
    uint8_t* sum = nullptr;  // from the pool
    std::vector<bool> arrived;
    int arrivals = 0;
    int firstRank = 0;       // whose header the others are compared with
    Clock::time_point started;
  };
  using SlotKey = std::tuple<const Group*, uint64_t, uint32_t>;

  void serveConnection(std::shared_ptr<Connection> connection);
  bool handshake(Connection& connection);
  // Adds one rank's slot; sends the result to every rank once it is the last.
  void contribute(const std::shared_ptr<Connection>& connection, const Header& header, const uint8_t* body);
  void leave(const std::shared_ptr<Connection>& connection);
  void reapExpired();
  // Under mutex_: removes every pending slot of the group, returns buffers,
  // marks the group broken and returns the members to tell.
  std::vector<std::shared_ptr<Connection>> breakGroupLocked(Group& group, const std::string& why,
                                                            ErrorKind kind = kFailure);
  void sendError(Connection& connection, uint64_t sequence, uint32_t slot, const std::string& text,
                 ErrorKind kind = kFailure);
  void sendMessage(Connection& connection, const Header& header, const void* body);
  uint8_t* takeBufferLocked();
  void returnBufferLocked(uint8_t* buffer);

  AggregatorOptions options_;
  int listenFd_ = -1;
  int port_ = 0;
  std::mutex mutex_;
  std::condition_variable bufferFreed_;
  std::map<std::string, std::shared_ptr<Group>> groups_;
  std::map<SlotKey, std::unique_ptr<Slot>> slots_;
  std::vector<std::unique_ptr<uint8_t[]>> buffers_;  // every buffer ever made (at most poolSlots)
  std::vector<uint8_t*> freeBuffers_;
};

}  // namespace shoal::aggregate
