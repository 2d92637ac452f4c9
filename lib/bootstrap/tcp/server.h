// The tcp store's server: rank 0 runs one single-threaded poll() loop per
// host:port in the process, shared by every communicator (every TcpStore of
// rank 0) on that port, so a second communicator on the same store works.
//
// As a server on a port anyone on the network can reach, it protects the job:
// a connection must present the job token within kHandshakeDeadline or it is
// closed; at most kMaxUnverified connections may be waiting to do so (the
// oldest is closed to admit a new one), so strangers cannot exhaust rank 0's
// descriptors; and its warnings are rate-limited.
#pragma once

#include <chrono>
#include <memory>
#include <string>

namespace shoal::detail::tcp {

using namespace std::chrono_literals;

constexpr auto kHandshakeDeadline = 5s;
constexpr size_t kMaxUnverified = 64;
constexpr auto kWarnWindow = 10s;       // at most kWarnBurst warnings per window; the rest are counted
constexpr int kWarnBurst = 5;
// A server nobody uses (no communicator of this process, no client connected)
// stops after this long; the next communicator starts a new one.
constexpr auto kIdleLinger = 1s;

class Server;

// Keeps the server of host:port running while held. Throws SYSTEM when the port
// cannot be served, INVALID_ARGUMENT when a communicator of this process already
// serves it with another job token.
class ServerLease {
 public:
  ServerLease(const std::string& host, int port, const std::string& token, const std::string& url);
  ~ServerLease();
  ServerLease(const ServerLease&) = delete;
  ServerLease& operator=(const ServerLease&) = delete;

 private:
  std::shared_ptr<Server> server_;
};

}  // namespace shoal::detail::tcp
