// Store: the key-value rendezvous that ranks use to find each other (worker
// addresses, agreed configuration). Every blocking call has a deadline and
// throws shoal::Error(SHOAL_ERR_TIMEOUT) naming the keys it waited for.
//
// Implementations: memory (threads in one process), file (a shared
// directory), tcp (rank 0 serves; every connection presents the job token;
// lib/bootstrap/tcp/).
#pragma once

#include <cstdint>
#include <memory>
#include <string>
#include <vector>

#include "core/error.h"

namespace shoal {

using Bytes = std::vector<uint8_t>;

class Store {
 public:
  virtual ~Store() = default;
  // Overwrites the key.
  virtual void set(const std::string& key, const Bytes& value) = 0;
  // Waits until the key exists, then returns its value.
  virtual Bytes get(const std::string& key, Deadline deadline) = 0;
  // Waits until every key exists.
  virtual void wait(const std::vector<std::string>& keys, Deadline deadline) = 0;
  // Atomically adds delta to the integer stored at key (missing = 0) and returns the new value.
  virtual int64_t add(const std::string& key, int64_t delta) = 0;
};

struct StoreOptions {
  std::string url;      // "tcp://host:port", "file:///dir", "memory://name"
  int rank = 0;         // rank 0 serves a tcp store
  int worldSize = 1;
  std::string token;    // tcp only; required there
  double timeoutS = 300;
};

// Throws Error(SHOAL_ERR_INVALID_ARGUMENT) for a malformed URL and
// Error(SHOAL_ERR_NOT_FOUND) for an unknown scheme, naming the valid ones.
// memory:// stores with the same name share one key space while any Store
// for that name is alive; the last one destroyed drops it. A tcp store's
// server runs in rank 0's process, one per port, shared by every rank-0 Store
// of the process on that port; it serves while any of them, or any client that
// presented the token, is connected, and stops (freeing the port) about a
// second after the last goes (lib/bootstrap/tcp/server.h).
std::unique_ptr<Store> makeStore(const StoreOptions& options);

// Internals shared by the backends (lib/bootstrap/*.cc); not for other callers.
namespace detail {

std::unique_ptr<Store> makeMemoryStore(const std::string& name, const std::string& url);
std::unique_ptr<Store> makeFileStore(const std::string& dir, const std::string& url);
std::unique_ptr<Store> makeTcpStore(const std::string& host, int port, const StoreOptions& options);

// add() keeps counters as decimal text so every backend reads the same. current == nullptr
// means the key is missing (0). Throws INVALID_ARGUMENT for a non-integer value or overflow.
int64_t addCounter(const std::string& key, const Bytes* current, int64_t delta);
Bytes counterBytes(int64_t value);

// Throws Error(SHOAL_ERR_TIMEOUT) naming the missing keys, the store and how long it waited.
[[noreturn]] void failTimeout(const std::vector<std::string>& missing, const std::string& url, Clock::time_point start);

}  // namespace detail

}  // namespace shoal
