// UCX transport: the UCP tag API over whatever UCX finds (shared memory, TCP,
// RDMA), host memory only.
//
// Tag layout (64 bits, transport.h): bit 63 marks an abort notice; bits
// 47..62 hold the sender's rank; bits 28..46 the sender's call signature;
// bits 0..27 the collective's tag. UCP matches receives by tag alone, so the
// sender's rank in the tag is what makes a receive "from peer". Receives mask
// the signature out and compare it on completion; while a wait is idle, a
// probe of the unexpected queue finds messages of the same call number whose
// signature differs (ranks whose calls differ so much that their messages
// never match), so disagreeing ranks fail with MISMATCH, not at the deadline.
//
// Dead peers: endpoints to other hosts use UCP_ERR_HANDLING_MODE_PEER, so UCX
// calls onEndpointError when a peer vanishes (on both endpoints of a pair
// connected through the listeners, see "Large messages across hosts" below). UCX 1.13 offers no shared-memory
// transport in that mode, so endpoints to peers on the same host use mode NONE
// (shared memory, several times faster than TCP over loopback) and waitAll
// watches those peers' processes instead (/proc/<pid>). Either way a dead peer
// becomes SHOAL_ERR_REMOTE. Every wait also has a deadline, and a rank that
// fails sends an abort notice to all peers so they fail at once, not at their
// deadline.
//
// Large messages across hosts (SHOAL_UCX_REMOTE_RNDV_BYTES): UCX's eager
// protocol over TCP reads every byte into its receive segment and copies it
// again into the receive buffer; its rendezvous over TCP (the receiver sends
// the buffer's address, the sender's put lands in it: uct/tcp reads the socket
// straight into the buffer) skips that copy, but UCX 1.13 offers it with
// UCP_ERR_HANDLING_MODE_PEER only on endpoints connected through its
// connection manager (a TCP lane that can also connect to an interface would
// need memory invalidation, which uct/tcp lacks: rendezvous then falls back to
// active messages, copied like eager ones). So each rank listens (ucp_listener,
// its port and addresses in the store) and connects one endpoint to each peer
// on another host; the endpoint that peer accepts is the one UCX answers that
// peer's rendezvous on. Same-host peers keep worker addresses (shared memory).
#include <arpa/inet.h>
#include <fcntl.h>
#include <ifaddrs.h>
#include <net/if.h>
#include <netinet/in.h>
#include <poll.h>
#include <signal.h>
#include <sched.h>
#include <sys/stat.h>
#include <ucp/api/ucp.h>
#include <unistd.h>

#include <algorithm>
#include <atomic>
#include <cstdlib>
#include <cstring>
#include <fstream>
#include <optional>
#include <mutex>
#include <sstream>
#include <string_view>
#include <thread>
#include <unordered_set>
#include <vector>

#include "core/config.h"
#include "core/log.h"
#include "transport/host.h"
#include "transport/transport.h"
#include "transport/ucx/remote_spin.h"

namespace shoal {
namespace {

constexpr uint64_t kAbortBit = uint64_t(1) << 63;
constexpr uint64_t kFullMask = ~uint64_t(0);
constexpr uint64_t kReceiveMask = kFullMask & ~kSignatureMask;  // any signature: compared on completion
constexpr size_t kAbortMessageBytes = 512;

void checkUcs(ucs_status_t status, const char* what) {
  if (status != UCS_OK) fail(SHOAL_ERR_SYSTEM, "UCX {} failed: {}", what, ucs_status_string(status));
}

// Whether UCX_TLS lets UCX use its TCP transport: unset, "all", a list naming tcp, or an
// exclusion list ("^...") that does not. (A setting for a transport UCX does not open makes
// it warn "invalid configuration" on every rank.)
bool tcpAllowed() {
  const char* tls = std::getenv("UCX_TLS");
  if (tls == nullptr || *tls == '\0') return true;
  std::string_view list(tls);
  const bool exclude = list.front() == '^';
  if (exclude) list.remove_prefix(1);
  bool named = false;
  for (size_t at = 0; at <= list.size();) {
    size_t comma = std::min(list.find(',', at), list.size());
    std::string_view name = list.substr(at, comma - at);
    named = named || name == "tcp" || (!exclude && name == "all");
    at = comma + 1;
  }
  return exclude ? !named : named;
}

// Peers on other hosts: UCX's TCP transport (uct/tcp) cuts eager messages into fragments of
// its receive segment (UCX_TCP_RX_SEG_SIZE, 64 KiB by default) and reads the socket into
// buffers of that size, one recv per ready socket and progress call. A 64 MiB allreduce then
// costs every rank thousands of sendmsg, recvfrom and epoll_wait calls, and the kernel a
// packet push and an ACK for each (measured: docs/benchmarks.md, "Waiting CPU and syscall
// sizes, second pass"). Larger segments move the same bytes in a fraction of the calls.
// Every rank must use the same segment (a receiver's buffer must hold the sender's largest
// fragment): all ranks of a job that spans hosts decide alike, and a user's UCX_TCP_* wins.
// (ucp_config_modify hands names it does not know to every UCX transport's own table, where
// only TCP has these fields.)
void setTcpDefaults(ucp_config_t* config) {
  if (!tcpAllowed()) return;
  auto setDefault = [&](const char* name, const char* value) {
    if (std::getenv(fmt::format("UCX_TCP_{}", name).c_str()) == nullptr) ucp_config_modify(config, name, value);
  };
  setDefault("RX_SEG_SIZE", "1m");
}

// Whether UCX_NET_DEVICES (unset: all) names network device `name`. Entries may carry a port
// ("mlx5_0:1"); "all" names every device.
bool netDeviceAllowed(const char* name) {
  const char* devices = std::getenv("UCX_NET_DEVICES");
  if (devices == nullptr || *devices == '\0') return true;
  std::string_view list(devices);
  for (size_t at = 0; at <= list.size();) {
    size_t comma = std::min(list.find(',', at), list.size());
    std::string_view entry = list.substr(at, comma - at);
    entry = entry.substr(0, entry.find(':'));
    if (entry == "all" || entry == name) return true;
    at = comma + 1;
  }
  return false;
}

// This host's IPv4 addresses that a peer on another host may reach (interfaces up, not
// loopback, allowed by UCX_NET_DEVICES), with their netmasks; network byte order.
struct InterfaceAddress {
  in_addr_t address;
  in_addr_t mask;
};
std::vector<InterfaceAddress> interfaceAddresses() {
  std::vector<InterfaceAddress> result;
  ifaddrs* list = nullptr;
  if (getifaddrs(&list) != 0) return result;
  for (ifaddrs* it = list; it != nullptr; it = it->ifa_next) {
    if (it->ifa_addr == nullptr || it->ifa_netmask == nullptr || it->ifa_addr->sa_family != AF_INET) continue;
    if (!(it->ifa_flags & IFF_UP) || (it->ifa_flags & IFF_LOOPBACK) || !netDeviceAllowed(it->ifa_name)) continue;
    result.push_back({reinterpret_cast<const sockaddr_in*>(it->ifa_addr)->sin_addr.s_addr,
                      reinterpret_cast<const sockaddr_in*>(it->ifa_netmask)->sin_addr.s_addr});
  }
  freeifaddrs(list);
  return result;
}

std::string ipv4Text(in_addr_t address) {
  char text[INET_ADDRSTRLEN] = {};
  in_addr value{};
  value.s_addr = address;
  inet_ntop(AF_INET, &value, text, sizeof(text));
  return text;
}


class UcxTransport final : public Transport {
 public:
  explicit UcxTransport(const TransportOptions& options);
  ~UcxTransport() override;

  int rank() const override { return rank_; }
  int size() const override { return size_; }
  const char* name() const override { return "ucx"; }
  Request isend(int peer, uint64_t tag, const void* data, size_t bytes) override;
  Request irecv(int peer, uint64_t tag, void* data, size_t bytes) override;
  void waitAll(Request* requests, size_t count, Deadline deadline) override { waitFor(requests, count, deadline, false); }
  void waitAny(Request* requests, size_t count, Deadline deadline) override { waitFor(requests, count, deadline, true); }
  void abort(const std::string& reason, shoal_status_t status = SHOAL_ERR_REMOTE) override;
  void checkNotAborted() override;
  bool failed() const override { return failedFlag_.load(std::memory_order_acquire); }
  uint64_t bytesSent() const override { return bytesSent_; }
  std::string failure() const override {
    std::lock_guard<std::mutex> lock(failureMutex_);
    return failure_;
  }
  shoal_status_t failureStatus() const override {
    std::lock_guard<std::mutex> lock(failureMutex_);
    return failureStatus_;
  }
  std::string describePeer(int peer) const override;  // defined at the end of this file

 private:
  struct PeerSlot {
    UcxTransport* self;
    int peer;
  };
  static void onEndpointError(void* arg, ucp_ep_h ep, ucs_status_t status);
  static void onConnectionRequest(ucp_conn_request_h request, void* arg);
  // Rendezvous across hosts (the file's comment): listen, connect, wait for the peers' connections.
  void listen(Store& store, const std::string& key);
  void connectToListener(int peer, Store& store, const std::string& key, Deadline deadline);
  Bytes checkPeerListens(int peer, bool listening, Store& store, const std::string& key, Deadline deadline) const;
  void awaitPeerConnections(Deadline deadline);

  uint64_t wireTag(int sender, uint64_t tag) const { return (uint64_t(sender) << kRankShift) | tag; }
  void checkUsable() const;
  bool poll(Request& request);
  // waitAll, or with `any` waitAny: one loop, one failure path.
  void waitFor(Request* requests, size_t count, Deadline deadline, bool any);
  void postAbortReceive();
  void checkForPeerTrouble(Request* requests, size_t count);
  void checkSignature(const Request& request, uint64_t senderTag) const;
  std::optional<Error> takeAbortNotice();
  std::optional<Error> awaitAbortNotice(double seconds);
  void probeForOtherCalls(const Request* requests, size_t count);
  void checkForOtherCalls(uint64_t tag) override {
    ucp_worker_progress(worker_);  // what has arrived reaches the unexpected queue
    Request pending;
    pending.tag = tag;
    probeForOtherCalls(&pending, 1);
  }
  void checkForMessagesOf(uint64_t tag) override;

  bool peerStartedCall(uint64_t tag) override;
  int armPeerEvents() override {
    checkUsable();
    // Only when every peer is on another host: same-host peers' shared
    // memory raises no event (the waits treat them so too).
    if (eventFd_ < 0) return -1;
    for (int peer = 0; peer < size_; ++peer)
      if (peer != rank_ && !remotePeer_[peer]) return -1;
    const ucs_status_t status = ucp_worker_arm(worker_);
    if (status == UCS_ERR_BUSY) return -2;
    return status == UCS_OK ? eventFd_ : -1;
  }
  [[noreturn]] void failWith(Request* requests, size_t count, shoal_status_t status, const std::string& text,
                             bool notifyPeers);
  // failWith for an error a wait or look found; a bare REMOTE (a peer gone,
  // a send refused) first waits kAbortNoticeGraceS for the notice that says why.
  [[noreturn]] void failExplained(Request* requests, size_t count, const Error& error);
  void cancelPending(Request* requests, size_t count);
  void idle(Clock::time_point idleSince);
  bool waitsOnlyForRemotePeers(const Request* requests, size_t count) const;
  void sleepOnEvents(Deadline deadline);
  // Records the first failure only; returns whether this call recorded it.
  bool recordFailure(shoal_status_t status, const std::string& text);

  // Idle polls spin spinRounds_ times, then yield for kYieldPhaseMs, then sleep
  // on the event fd in slices of kEventWaitMs (deadlines and peer liveness are
  // still checked between slices).
  static constexpr int kYieldPhaseMs = 5;
  static constexpr unsigned kDedicatedSpinRounds = 2000;
  static constexpr unsigned kOversubscribedSpinRounds = 20;
  static constexpr int kEventWaitMs = 2;
  // A wait for peers on other hosts only (bench/netns, real clusters): after
  // remoteSpin_.rounds() idle polls (up to RemoteSpin::kFullRounds, a few
  // microseconds: a reply already on its way) the rank arms the worker's event
  // fd and sleeps in poll() until UCX has something (data, a writable socket,
  // an abort notice), the deadline, or the next liveness/mismatch probe
  // (checkForPeerTrouble, every 50 ms) is due. Network latency dwarfs the
  // wake-up (a few microseconds), and a waiting rank then costs no CPU, as
  // Gloo's blocking sockets do. Peers on this host keep the spin-then-yield
  // policy: shared memory raises no event, and their replies come in
  // microseconds.
  // Once a wait has slept, its data is streaming in at the link's pace: after
  // each wake-up's progress it sleeps again after this many idle polls (each
  // idle poll is an epoll_wait: at 1 Gbit/s the full spin cost a 64 MiB
  // allreduce ~30,000 of them per rank). remoteSpin_ carries the same from one
  // wait to the next (remote_spin.h).
  static constexpr unsigned kRemoteRespinRounds = RemoteSpin::kShortRounds;
  static constexpr int kRemoteSleepMaxMs = 50;
  RemoteSpin remoteSpin_;
  // For SHOAL_LOG_LEVEL=debug at the end (ctest multiproc.netns_two_hosts reads it): waits that
  // slept on the event fd, and the idle polls they spun before their first sleep.
  uint64_t sleptWaits_ = 0;
  uint64_t pollsBeforeSleep_ = 0;
  unsigned spinRounds_ = 2000;
  int eventFd_ = -1;
  std::vector<bool> remotePeer_;  // peers on other hosts (not this host, not this process)

  int rank_;
  int size_;
  ucp_context_h context_ = nullptr;
  ucp_worker_h worker_ = nullptr;
  std::vector<ucp_ep_h> endpoints_;
  // Rendezvous across hosts: this rank's listener, the endpoint each remote peer connected to
  // it (UCX answers that peer's rendezvous on it), and where this rank connected to each.
  bool remoteRendezvous_ = false;
  ucp_listener_h listener_ = nullptr;
  std::vector<ucp_ep_h> accepted_;
  std::vector<sockaddr_in> listenerOf_;
  std::unordered_set<void*> live_;
  uint64_t bytesSent_ = 0;  // requests handed out and not yet completed
  std::vector<PeerSlot> peerSlots_;
  std::vector<ucs_status_t> peerStatus_;  // written by onEndpointError
  std::vector<long> localPeerPid_;        // same-host peers' pids, 0 for remote peers and self
  Clock::time_point nextLivenessCheck_{};
  // The failure is written by whichever thread drives the transport (the
  // engine's, for async calls) and read by any caller thread (usableComm,
  // shoal_iallreduce): guarded by failureMutex_, with failedFlag_ for the
  // lock-free fast check.
  mutable std::mutex failureMutex_;
  std::atomic<bool> failedFlag_{false};
  std::string failure_;
  shoal_status_t failureStatus_ = SHOAL_OK;
  bool peerAborted_ = false;  // the failure came from a peer's abort notice: no need to tell the peers

  // Abort notices: one receive always posted for any sender's notice.
  char abortInbox_[kAbortMessageBytes] = {};
  void* abortReceive_ = nullptr;
  std::string abortOutbox_;
};

UcxTransport::UcxTransport(const TransportOptions& options) : rank_(options.rank), size_(options.worldSize) {
  if (size_ > kMaxRanks)
    fail(SHOAL_ERR_INVALID_ARGUMENT, "world size {} exceeds the {} ranks the UCX transport's tags can name", size_,
         kMaxRanks);
  // Which peers share this host (same host, boot, pid and network namespace)
  // decides the error mode per endpoint and the protocol thresholds below.
  Deadline deadline = deadlineAfter(options.timeoutS);
  std::string prefix = options.keyPrefix + "ucx/address/";
  std::string hostPrefix = options.keyPrefix + "ucx/host/";
  std::string identity = hostIdentity();
  std::string hostValue = fmt::format("{} {}", static_cast<long>(getpid()), identity);
  options.store->set(hostPrefix + std::to_string(rank_), Bytes(hostValue.begin(), hostValue.end()));
  localPeerPid_.assign(size_, 0);
  int ranksOnThisHost = 1;
  std::vector<bool> sameHost(size_, true);
  for (int peer = 0; peer < size_; ++peer) {
    if (peer == rank_) continue;
    Bytes peerHost = options.store->get(hostPrefix + std::to_string(peer), deadline);
    std::string peerHostText(peerHost.begin(), peerHost.end());
    size_t space = peerHostText.find(' ');
    sameHost[peer] = space != std::string::npos && peerHostText.substr(space + 1) == identity;
    if (sameHost[peer]) {
      localPeerPid_[peer] = std::stol(peerHostText.substr(0, space));
      ++ranksOnThisHost;
    }
  }
  const bool anyRemotePeer = ranksOnThisHost < size_;
  // Every rank of a job across hosts decides alike (anyRemotePeer holds on all of them), as the
  // TCP receive segment below requires.
  const long long remoteRndvBytes = config::getInt("SHOAL_UCX_REMOTE_RNDV_BYTES");
  remoteRendezvous_ = anyRemotePeer && tcpAllowed() && remoteRndvBytes > 0;
  remotePeer_.assign(size_, false);
  for (int peer = 0; peer < size_; ++peer) remotePeer_[peer] = !sameHost[peer];
  peerSlots_.resize(size_);
  for (int peer = 0; peer < size_; ++peer) peerSlots_[peer] = {this, peer};
  peerStatus_.assign(size_, UCS_OK);

  ucp_config_t* config = nullptr;
  checkUcs(ucp_config_read(nullptr, nullptr, &config), "ucp_config_read");
  // Protocol thresholds (measured: docs/benchmarks.md); a user's own UCX_* setting wins.
  // - One host: UCX's automatic rendezvous threshold switches shared-memory
  //   messages to rendezvous at ~8 KiB, doubling the latency of 16-128 KiB
  //   messages: 128 KiB instead.
  // - Peers on other hosts: rendezvous from SHOAL_UCX_REMOTE_RNDV_BYTES, which
  //   puts into the receive buffer (the file's comment), with UCX's default
  //   64 KiB TCP receive segment: a put's first read lands in that segment and
  //   is copied, the rest goes straight to the buffer, so a larger segment
  //   would copy more. Without it (0, or TCP not allowed), eager only: the
  //   rendezvous of worker-address endpoints is copied like eager messages
  //   and cost 30% more CPU (docs/benchmarks.md), and 1 MiB segments.
  if (std::getenv("UCX_RNDV_THRESH") == nullptr) {
    const std::string threshold =
        remoteRendezvous_ ? std::to_string(remoteRndvBytes) : anyRemotePeer ? "inf" : "131072";
    ucp_config_modify(config, "RNDV_THRESH", threshold.c_str());
  }
  if (anyRemotePeer && !remoteRendezvous_) setTcpDefaults(config);
  // Listening: UCX's TCP transport listens on every network device it uses. When every peer is
  // on this host (and network namespace), the only device the job needs is loopback, so a
  // one-host job is not reachable from the network. Jobs spanning hosts keep UCX's choice. A
  // user's UCX_NET_DEVICES (or UCX_TCP_* settings read by UCX itself) always wins.
  if (!anyRemotePeer && std::getenv("UCX_NET_DEVICES") == nullptr) ucp_config_modify(config, "NET_DEVICES", "lo");
  ucp_params_t params{};
  params.field_mask = UCP_PARAM_FIELD_FEATURES | UCP_PARAM_FIELD_MT_WORKERS_SHARED;
  params.features = UCP_FEATURE_TAG | UCP_FEATURE_WAKEUP;
  params.mt_workers_shared = 0;
  ucs_status_t status = ucp_init(&params, config, &context_);
  ucp_config_release(config);
  checkUcs(status, "ucp_init");

  ucp_worker_params_t workerParams{};
  workerParams.field_mask = UCP_WORKER_PARAM_FIELD_THREAD_MODE | UCP_WORKER_PARAM_FIELD_CLIENT_ID;
  workerParams.thread_mode = UCS_THREAD_MODE_SINGLE;
  workerParams.client_id = static_cast<uint64_t>(rank_);  // names this rank to the listeners it connects to
  checkUcs(ucp_worker_create(context_, &workerParams, &worker_), "ucp_worker_create");

  ucp_worker_attr_t attr{};
  attr.field_mask = UCP_WORKER_ATTR_FIELD_ADDRESS;
  checkUcs(ucp_worker_query(worker_, &attr), "ucp_worker_query");
  Bytes address(static_cast<uint8_t*>(static_cast<void*>(attr.address)),
                static_cast<uint8_t*>(static_cast<void*>(attr.address)) + attr.address_length);
  ucp_worker_release_address(worker_, attr.address);

  if (ucp_worker_get_efd(worker_, &eventFd_) != UCS_OK) eventFd_ = -1;
  spinRounds_ = static_cast<unsigned>(options.spinRounds);
  postAbortReceive();
  const std::string listenerPrefix = options.keyPrefix + "ucx/listener/";
  // Without listeners (SHOAL_UCX_REMOTE_RNDV_BYTES=0, or TCP not allowed) a job across hosts
  // says so under the same key, so that ranks that disagree fail at once, with text, instead of
  // one side waiting for connections until the deadline.
  if (remoteRendezvous_) listen(*options.store, listenerPrefix);
  else if (anyRemotePeer) options.store->set(listenerPrefix + std::to_string(rank_), Bytes{'n', 'o', 'n', 'e'});
  options.store->set(prefix + std::to_string(rank_), address);

  endpoints_.assign(size_, nullptr);
  accepted_.assign(size_, nullptr);
  listenerOf_.assign(size_, sockaddr_in{});
  for (int peer = 0; peer < size_; ++peer) {
    if (peer == rank_) continue;
    if (remoteRendezvous_ && remotePeer_[peer]) {
      connectToListener(peer, *options.store, listenerPrefix, deadline);
      continue;
    }
    if (remotePeer_[peer]) checkPeerListens(peer, false, *options.store, listenerPrefix, deadline);
    Bytes remote = options.store->get(prefix + std::to_string(peer), deadline);
    ucp_ep_params_t epParams{};
    epParams.field_mask = UCP_EP_PARAM_FIELD_REMOTE_ADDRESS | UCP_EP_PARAM_FIELD_ERR_HANDLING_MODE |
                          UCP_EP_PARAM_FIELD_ERR_HANDLER;
    epParams.address = reinterpret_cast<const ucp_address_t*>(remote.data());
    // Same process (threads as ranks) or same host: mode NONE allows shared memory.
    epParams.err_mode = sameHost[peer] ? UCP_ERR_HANDLING_MODE_NONE : UCP_ERR_HANDLING_MODE_PEER;
    epParams.err_handler.cb = &UcxTransport::onEndpointError;
    epParams.err_handler.arg = &peerSlots_[peer];
    checkUcs(ucp_ep_create(worker_, &epParams, &endpoints_[peer]), "ucp_ep_create");
  }
  if (remoteRendezvous_) awaitPeerConnections(deadline);
  if (options.spinRounds < 0) {
    // Auto: spinning pays only while every rank of this host has a core of its own.
    long cores = sysconf(_SC_NPROCESSORS_ONLN);
    spinRounds_ = ranksOnThisHost > cores ? kOversubscribedSpinRounds : kDedicatedSpinRounds;
  }
}

UcxTransport::~UcxTransport() {
  if (sleptWaits_ > 0)
    SHOAL_LOG_DEBUG("rank {}: {} waits for peers on other hosts slept, after {:.1f} idle polls each on average",
                    rank_, sleptWaits_, static_cast<double>(pollsBeforeSleep_) / static_cast<double>(sleptWaits_));
  if (abortReceive_ != nullptr) {
    ucp_request_cancel(worker_, abortReceive_);
    ucp_request_free(abortReceive_);
    abortReceive_ = nullptr;
  }
  if (listener_ != nullptr) ucp_listener_destroy(listener_);
  // Close gracefully (flush) when healthy; force-close when peers may be gone.
  // (Force-close exists only for error-handling mode PEER, i.e. remote peers.)
  std::vector<void*> closing;
  auto close = [&](ucp_ep_h endpoint, int peer) {
    if (endpoint == nullptr) return;
    ucp_request_param_t param{};
    param.op_attr_mask = UCP_OP_ATTR_FIELD_FLAGS;
    param.flags = (failed() && localPeerPid_[peer] == 0) ? UCP_EP_CLOSE_FLAG_FORCE : 0;
    void* request = ucp_ep_close_nbx(endpoint, &param);
    if (request != nullptr && !UCS_PTR_IS_ERR(request)) closing.push_back(request);
  };
  for (int peer = 0; peer < static_cast<int>(endpoints_.size()); ++peer) close(endpoints_[peer], peer);
  for (int peer = 0; peer < static_cast<int>(accepted_.size()); ++peer) close(accepted_[peer], peer);
  Deadline deadline = deadlineAfter(2.0);
  for (void* request : closing) {
    while (ucp_request_check_status(request) == UCS_INPROGRESS && Clock::now() < deadline)
      ucp_worker_progress(worker_);
    ucp_request_free(request);
  }
  if (worker_ != nullptr) ucp_worker_destroy(worker_);
  if (context_ != nullptr) ucp_cleanup(context_);
}

void UcxTransport::onEndpointError(void* arg, ucp_ep_h, ucs_status_t status) {
  auto* slot = static_cast<PeerSlot*>(arg);
  slot->self->peerStatus_[slot->peer] = status;
}

// Listens on every interface, on a port the kernel picks; the store gets "port address ..."
// (the addresses a peer may reach, interfaceAddresses()).
void UcxTransport::listen(Store& store, const std::string& key) {
  sockaddr_in any{};
  any.sin_family = AF_INET;
  any.sin_addr.s_addr = htonl(INADDR_ANY);
  any.sin_port = 0;
  ucp_listener_params_t params{};
  params.field_mask = UCP_LISTENER_PARAM_FIELD_SOCK_ADDR | UCP_LISTENER_PARAM_FIELD_CONN_HANDLER;
  params.sockaddr.addr = reinterpret_cast<const sockaddr*>(&any);
  params.sockaddr.addrlen = sizeof(any);
  params.conn_handler.cb = &UcxTransport::onConnectionRequest;
  params.conn_handler.arg = this;
  checkUcs(ucp_listener_create(worker_, &params, &listener_),
           "ucp_listener_create (set SHOAL_UCX_REMOTE_RNDV_BYTES=0 on every rank to connect without listeners)");
  ucp_listener_attr_t attr{};
  attr.field_mask = UCP_LISTENER_ATTR_FIELD_SOCKADDR;
  checkUcs(ucp_listener_query(listener_, &attr), "ucp_listener_query");
  const unsigned port = ntohs(reinterpret_cast<const sockaddr_in*>(&attr.sockaddr)->sin_port);
  std::string value = std::to_string(port);
  for (const InterfaceAddress& local : interfaceAddresses()) {
    value += ' ';
    value += ipv4Text(local.address);  // (not " " + text: GCC 12's -Wrestrict misfires on it)
  }
  store.set(key + std::to_string(rank_), Bytes(value.begin(), value.end()));
}

// Connects this rank's endpoint for sends to `peer` to that peer's listener: at the first of
// its addresses on a subnet of one of this host's interfaces, else at its first.
// Whether `peer` connects as this rank does (through listeners or not), from what it published
// under `key`; returns that value. Ranks that differ fail here on both sides.
Bytes UcxTransport::checkPeerListens(int peer, bool listening, Store& store, const std::string& key,
                                     Deadline deadline) const {
  Bytes value = store.get(key + std::to_string(peer), deadline);
  const bool peerListens = std::string(value.begin(), value.end()) != "none";
  if (peerListens != listening)
    fail(SHOAL_ERR_INVALID_ARGUMENT,
         "rank {}: rank {} (on another host) connects {} listeners, this rank {} (SHOAL_UCX_REMOTE_RNDV_BYTES > 0 and "
         "TCP allowed: through them; 0: without); set the same SHOAL_UCX_REMOTE_RNDV_BYTES and UCX_TLS on every rank",
         rank_, peer, peerListens ? "through" : "without", listening ? "through them" : "without");
  return value;
}

void UcxTransport::connectToListener(int peer, Store& store, const std::string& key, Deadline deadline) {
  Bytes value = checkPeerListens(peer, true, store, key, deadline);
  std::istringstream words(std::string(value.begin(), value.end()));
  unsigned port = 0;
  words >> port;
  std::vector<in_addr_t> addresses;
  for (std::string word; words >> word;) {
    in_addr address{};
    if (inet_pton(AF_INET, word.c_str(), &address) == 1) addresses.push_back(address.s_addr);
  }
  if (port == 0 || port > 65535 || addresses.empty())
    fail(SHOAL_ERR_SYSTEM,
         "rank {}: rank {} (on another host) published no address for its UCX listener ('{}'): has its host an IPv4 "
         "interface up that UCX_NET_DEVICES allows? (SHOAL_UCX_REMOTE_RNDV_BYTES=0 on every rank connects without "
         "listeners)",
         rank_, peer, std::string(value.begin(), value.end()));
  in_addr_t chosen = addresses.front();
  const std::vector<InterfaceAddress> locals = interfaceAddresses();
  auto onLocalSubnet = [&](in_addr_t address) {
    for (const InterfaceAddress& local : locals)
      if ((address & local.mask) == (local.address & local.mask)) return true;
    return false;
  };
  for (in_addr_t address : addresses)
    if (onLocalSubnet(address)) {
      chosen = address;
      break;
    }
  sockaddr_in& target = listenerOf_[peer];  // a member: outlives the endpoint's connection
  target.sin_family = AF_INET;
  target.sin_port = htons(static_cast<uint16_t>(port));
  target.sin_addr.s_addr = chosen;
  ucp_ep_params_t params{};
  params.field_mask = UCP_EP_PARAM_FIELD_FLAGS | UCP_EP_PARAM_FIELD_SOCK_ADDR | UCP_EP_PARAM_FIELD_ERR_HANDLING_MODE |
                      UCP_EP_PARAM_FIELD_ERR_HANDLER;
  params.flags = UCP_EP_PARAMS_FLAGS_CLIENT_SERVER | UCP_EP_PARAMS_FLAGS_SEND_CLIENT_ID;
  params.sockaddr.addr = reinterpret_cast<const sockaddr*>(&target);
  params.sockaddr.addrlen = sizeof(target);
  params.err_mode = UCP_ERR_HANDLING_MODE_PEER;
  params.err_handler.cb = &UcxTransport::onEndpointError;
  params.err_handler.arg = &peerSlots_[peer];
  checkUcs(ucp_ep_create(worker_, &params, &endpoints_[peer]), "ucp_ep_create (to a peer's listener)");
}

// Called from ucp_worker_progress: accepts the connection of a peer on another host (its rank
// is the client id its worker sent), once per peer; anything else is rejected.
void UcxTransport::onConnectionRequest(ucp_conn_request_h request, void* arg) {
  auto* self = static_cast<UcxTransport*>(arg);
  ucp_conn_request_attr_t attr{};
  attr.field_mask = UCP_CONN_REQUEST_ATTR_FIELD_CLIENT_ID;
  const bool known = ucp_conn_request_query(request, &attr) == UCS_OK;
  const uint64_t peer = attr.client_id;
  if (!known || peer >= static_cast<uint64_t>(self->size_) || !self->remotePeer_[peer] ||
      self->accepted_[peer] != nullptr) {
    SHOAL_LOG_DEBUG("rank {}: rejected a UCX connection request (client id {})", self->rank_, attr.client_id);
    ucp_listener_reject(self->listener_, request);
    return;
  }
  ucp_ep_params_t params{};
  params.field_mask = UCP_EP_PARAM_FIELD_CONN_REQUEST | UCP_EP_PARAM_FIELD_ERR_HANDLING_MODE |
                      UCP_EP_PARAM_FIELD_ERR_HANDLER;
  params.conn_request = request;
  params.err_mode = UCP_ERR_HANDLING_MODE_PEER;
  params.err_handler.cb = &UcxTransport::onEndpointError;
  params.err_handler.arg = &self->peerSlots_[peer];
  const ucs_status_t status = ucp_ep_create(self->worker_, &params, &self->accepted_[peer]);
  if (status != UCS_OK) {
    self->accepted_[peer] = nullptr;
    self->peerStatus_[peer] = status;
  }
}

// UCX accepts a connection only while this rank progresses: wait here until every peer on
// another host has connected, so that no peer's first message waits on a rank busy elsewhere
// after init, and a peer that cannot reach this host fails init with the address it used.
void UcxTransport::awaitPeerConnections(Deadline deadline) {
  for (;;) {
    std::string missing;
    for (int peer = 0; peer < size_; ++peer) {
      if (peer == rank_ || !remotePeer_[peer]) continue;
      if (peerStatus_[peer] != UCS_OK)
        fail(SHOAL_ERR_REMOTE, "rank {}: connecting to rank {} (UCX listener at {}:{}) failed: {}", rank_, peer,
             ipv4Text(listenerOf_[peer].sin_addr.s_addr), ntohs(listenerOf_[peer].sin_port),
             ucs_status_string(peerStatus_[peer]));
      if (accepted_[peer] == nullptr) missing += fmt::format("{}{}", missing.empty() ? "" : ", ", peer);
    }
    if (missing.empty()) return;
    if (Clock::now() > deadline)
      fail(SHOAL_ERR_TIMEOUT,
           "rank {}: rank(s) {} on other hosts did not connect to this rank's UCX listener within SHOAL_TIMEOUT_S: are "
           "they running, and can they reach this host?",
           rank_, missing);
    if (ucp_worker_progress(worker_) == 0) {
      pollfd descriptor{eventFd_, POLLIN, 0};
      if (eventFd_ >= 0 && ucp_worker_arm(worker_) == UCS_OK) ::poll(&descriptor, 1, 10);
    }
  }
}

void UcxTransport::postAbortReceive() {
  ucp_request_param_t param{};
  param.op_attr_mask = UCP_OP_ATTR_FLAG_NO_IMM_CMPL;
  void* request = ucp_tag_recv_nbx(worker_, abortInbox_, kAbortMessageBytes - 1, kAbortBit, kAbortBit, &param);
  if (UCS_PTR_IS_ERR(request)) checkUcs(UCS_PTR_STATUS(request), "posting the abort receive");
  abortReceive_ = request;
}

void UcxTransport::checkUsable() const {
  if (!failed()) return;
  std::lock_guard<std::mutex> lock(failureMutex_);
  throw Error(failureStatus_, failure_);
}

bool UcxTransport::recordFailure(shoal_status_t status, const std::string& text) {
  std::lock_guard<std::mutex> lock(failureMutex_);
  if (failedFlag_.load(std::memory_order_relaxed)) return false;
  failure_ = text;
  failureStatus_ = status;
  failedFlag_.store(true, std::memory_order_release);
  return true;
}

Transport::Request UcxTransport::isend(int peer, uint64_t tag, const void* data, size_t bytes) {
  checkUsable();
  bytesSent_ += bytes;
  ucp_request_param_t param{};
  void* request = ucp_tag_send_nbx(endpoints_[peer], data, bytes, wireTag(rank_, tag), &param);
  Request result;
  result.peer = peer;
  result.bytes = bytes;
  result.tag = tag;
  if (UCS_PTR_IS_ERR(request)) {
    result.done = true;
    // A peer that gave up (say, it saw a mismatch) and closed can make the
    // send fail before its abort notice, which says why, is read.
    failExplained(nullptr, 0,
                  Error(SHOAL_ERR_REMOTE, fmt::format("rank {}: sending {} bytes to rank {} failed: {}", rank_, bytes,
                                                      peer, ucs_status_string(UCS_PTR_STATUS(request)))));
  }
  result.handle = request;
  result.done = request == nullptr;
  if (request != nullptr) live_.insert(request);
  return result;
}

Transport::Request UcxTransport::irecv(int peer, uint64_t tag, void* data, size_t bytes) {
  checkUsable();
  // Always get a request back: ucp_tag_recv_request_test then reports the
  // received length uniformly (recv_info is not filled reliably on UCX 1.13).
  ucp_request_param_t param{};
  param.op_attr_mask = UCP_OP_ATTR_FLAG_NO_IMM_CMPL;
  void* request = ucp_tag_recv_nbx(worker_, data, bytes, wireTag(peer, tag), kReceiveMask, &param);
  Request result;
  result.peer = peer;
  result.bytes = bytes;
  result.tag = tag;
  result.isReceive = true;
  if (UCS_PTR_IS_ERR(request)) {
    failWith(nullptr, 0, SHOAL_ERR_MISMATCH,
             fmt::format("rank {}: receiving {} bytes from rank {} failed: {} (do all ranks pass the same count "
                         "and dtype?)",
                         rank_, bytes, peer, ucs_status_string(UCS_PTR_STATUS(request))),
             true);
  }
  result.handle = request;
  live_.insert(request);
  return result;
}

// Returns true when the request is complete; throws on a failed one.
bool UcxTransport::poll(Request& request) {
  if (request.done) return true;
  ucs_status_t status;
  uint64_t senderTag = 0;
  if (request.isReceive) {
    ucp_tag_recv_info_t info{};
    status = ucp_tag_recv_request_test(request.handle, &info);
    if (status == UCS_INPROGRESS) return false;
    request.receivedBytes = info.length;
    senderTag = info.sender_tag;
  } else {
    status = ucp_request_check_status(request.handle);
    if (status == UCS_INPROGRESS) return false;
  }
  ucp_request_free(request.handle);
  live_.erase(request.handle);
  request.handle = nullptr;
  request.done = true;
  // A message of another call (its signature differs) explains a wrong size too: check it first.
  if (request.isReceive && (status == UCS_OK || status == UCS_ERR_MESSAGE_TRUNCATED))
    checkSignature(request, senderTag);
  if (status == UCS_ERR_MESSAGE_TRUNCATED)
    throw Error(SHOAL_ERR_MISMATCH,
                fmt::format("rank {} expected {} bytes from rank {} but it sent more: do all ranks pass the same "
                            "count and dtype?",
                            rank_, request.bytes, request.peer));
  if (status != UCS_OK)
    throw Error(SHOAL_ERR_REMOTE, fmt::format("rank {}: {} rank {} failed: {}", rank_,
                                              request.isReceive ? "receiving from" : "sending to", request.peer,
                                              ucs_status_string(status)));
  return true;
}

// Throws MISMATCH when the sender of a completed receive made another call.
// (A truncated receive may carry no sender tag: then its size speaks.)
void UcxTransport::checkSignature(const Request& request, uint64_t senderTag) const {
  if (senderTag == 0) return;
  uint64_t theirs = senderTag & kSignatureMask, mine = request.tag & kSignatureMask;
  if (theirs == mine) return;
  throw Error(SHOAL_ERR_MISMATCH,
              describeSignatureMismatch(rank_, request.peer, static_cast<uint32_t>(mine >> kSignatureShift),
                                        static_cast<uint32_t>(theirs >> kSignatureShift)));
}

// Ranks whose calls differ may exchange messages that never match (another
// algorithm, another number of rounds): they wait in UCX's unexpected queue.
// One probe per signature bit finds any message of a pending request's call
// number whose signature differs from ours in that bit, from any sender.
void UcxTransport::probeForOtherCalls(const Request* requests, size_t count) {
  for (size_t i = 0; i < count; ++i) {
    if (requests[i].done) continue;
    const uint64_t sequence = requests[i].tag & kSequenceMask, mine = requests[i].tag & kSignatureMask;
    for (int bit = 0; bit < kSignatureBits; ++bit) {
      const uint64_t bitMask = uint64_t(1) << (kSignatureShift + bit);
      ucp_tag_recv_info_t info{};
      ucp_tag_message_h message =
          ucp_tag_probe_nb(worker_, sequence | (~mine & bitMask), kAbortBit | kSequenceMask | bitMask, 0, &info);
      if (message == nullptr) continue;
      int sender = static_cast<int>((info.sender_tag & ~kAbortBit) >> kRankShift);
      throw Error(SHOAL_ERR_MISMATCH,
                  describeSignatureMismatch(rank_, sender, static_cast<uint32_t>(mine >> kSignatureShift),
                                            static_cast<uint32_t>((info.sender_tag & kSignatureMask) >>
                                                                  kSignatureShift)));
    }
    return;  // every pending request of one wait belongs to the same call
  }
}

// One probe for any message of the call's number, whatever its signature:
// for a call that sends nothing over UCX (transport.h), any such message comes
// from a peer that took another path, even where the two signatures' 7-bit
// digests happen to collide.
void UcxTransport::checkForMessagesOf(uint64_t tag) {
  ucp_worker_progress(worker_);  // what has arrived reaches the unexpected queue
  ucp_tag_recv_info_t info{};
  ucp_tag_message_h message = ucp_tag_probe_nb(worker_, tag & kSequenceMask, kAbortBit | kSequenceMask, 0, &info);
  if (message == nullptr) return;
  int sender = static_cast<int>((info.sender_tag & ~kAbortBit) >> kRankShift);
  throw Error(SHOAL_ERR_MISMATCH,
              describeSignatureMismatch(rank_, sender, static_cast<uint32_t>((tag & kSignatureMask) >> kSignatureShift),
                                        static_cast<uint32_t>((info.sender_tag & kSignatureMask) >> kSignatureShift)));
}

// A peer's abort notice as an error, once it has arrived.
std::optional<Error> UcxTransport::takeAbortNotice() {
  if (abortReceive_ == nullptr || ucp_request_check_status(abortReceive_) == UCS_INPROGRESS) return std::nullopt;
  ucp_tag_recv_info_t info{};
  ucp_tag_recv_request_test(abortReceive_, &info);
  ucp_request_free(abortReceive_);
  abortReceive_ = nullptr;
  int sender = static_cast<int>((info.sender_tag & ~kAbortBit) >> kRankShift);
  abortInbox_[std::min(info.length, kAbortMessageBytes - 1)] = '\0';
  peerAborted_ = true;
  // The notice is "<status> <reason>" (see abort()).
  char* reason = nullptr;
  long status = std::strtol(abortInbox_, &reason, 10);
  if (reason != nullptr && *reason == ' ') ++reason;
  if (status == SHOAL_ERR_MISMATCH)
    return Error(SHOAL_ERR_MISMATCH, fmt::format("rank {} reports: {}", sender, reason));
  return Error(SHOAL_ERR_REMOTE, fmt::format("rank {} aborted the communicator: {}", sender, reason));
}

// A peer that gives up cancels its messages, and their failure can overtake
// its abort notice, which says why: wait a moment for it.
std::optional<Error> UcxTransport::awaitAbortNotice(double seconds) {
  Deadline deadline = deadlineAfter(seconds);
  for (;;) {
    if (std::optional<Error> notice = takeAbortNotice()) return notice;
    if (Clock::now() > deadline || abortReceive_ == nullptr) return std::nullopt;
    ucp_worker_progress(worker_);
  }
}

// Throws when a peer aborted, or when a peer that one of the pending requests
// needs is gone. A peer that finished its part and exited is no failure: its
// last messages may already sit in our queues, so drain before judging.
void UcxTransport::checkForPeerTrouble(Request* requests, size_t count) {
  if (std::optional<Error> notice = takeAbortNotice()) throw *notice;
  bool checkLiveness = Clock::now() >= nextLivenessCheck_;
  if (checkLiveness) {
    nextLivenessCheck_ = Clock::now() + std::chrono::milliseconds(50);
    probeForOtherCalls(requests, count);
  }
  for (size_t i = 0; i < count; ++i) {
    if (requests[i].done) continue;
    int peer = requests[i].peer;
    bool gone = peerStatus_[peer] != UCS_OK;
    if (!gone && checkLiveness && localPeerPid_[peer] != 0 && localPeerPid_[peer] != getpid())
      gone = !processAlive(localPeerPid_[peer]);
    if (!gone) continue;
    for (int drain = 0; drain < 1000 && !requests[i].done; ++drain) {
      ucp_worker_progress(worker_);
      poll(requests[i]);
    }
    if (requests[i].done) continue;
    if (peerStatus_[peer] != UCS_OK)
      throw Error(SHOAL_ERR_REMOTE, fmt::format("rank {} lost its connection to rank {} ({}): did that rank exit or "
                                                "crash?",
                                                rank_, peer, ucs_status_string(peerStatus_[peer])));
    throw Error(SHOAL_ERR_REMOTE, fmt::format("rank {} (pid {}, on this host) exited or crashed; rank {} cannot "
                                              "complete the collective",
                                              peer, localPeerPid_[peer], rank_));
  }
}

// One cheap look (no wait): what has arrived reaches the unexpected queue,
// where a message of the call shows without being received. Peers are
// checked as a wait checks them (an abort notice; every 50 ms the processes
// of same-host peers), since an idle rank has no wait that would notice.
bool UcxTransport::peerStartedCall(uint64_t tag) {
  checkUsable();
  ucp_worker_progress(worker_);
  try {
    if (std::optional<Error> notice = takeAbortNotice()) throw *notice;
    const bool checkLiveness = Clock::now() >= nextLivenessCheck_;
    if (checkLiveness) nextLivenessCheck_ = Clock::now() + std::chrono::milliseconds(50);
    for (int peer = 0; peer < size_; ++peer) {
      if (peer == rank_) continue;
      if (peerStatus_[peer] != UCS_OK)
        throw Error(SHOAL_ERR_REMOTE, fmt::format("rank {} lost its connection to rank {} ({}): did that rank exit "
                                                  "or crash?",
                                                  rank_, peer, ucs_status_string(peerStatus_[peer])));
      if (checkLiveness && localPeerPid_[peer] != 0 && localPeerPid_[peer] != getpid() &&
          !processAlive(localPeerPid_[peer]))
        throw Error(SHOAL_ERR_REMOTE, fmt::format("rank {} (pid {}, on this host) exited or crashed", peer,
                                                  localPeerPid_[peer]));
    }
  } catch (const Error& error) {
    failExplained(nullptr, 0, error);
  }
  ucp_tag_recv_info_t info{};
  return ucp_tag_probe_nb(worker_, tag & kSequenceMask, kAbortBit | kSequenceMask, 0, &info) != nullptr;
}

// Called on every idle poll past the spin phase: yield the CPU (ranks that
// outnumber cores need it to run the peers they wait for), and once idle for
// long (a straggler), sleep on the worker's event fd instead of burning a core.
void UcxTransport::idle(Clock::time_point idleSince) {
  if (eventFd_ < 0 || Clock::now() - idleSince < std::chrono::milliseconds(kYieldPhaseMs)) {
    sched_yield();
    return;
  }
  // ucp_worker_arm says BUSY when events are already pending: progress instead.
  if (ucp_worker_arm(worker_) != UCS_OK) return;
  pollfd descriptor{eventFd_, POLLIN, 0};
  ::poll(&descriptor, 1, kEventWaitMs);
}

// Whether every request still pending goes to a peer on another host.
bool UcxTransport::waitsOnlyForRemotePeers(const Request* requests, size_t count) const {
  bool any = false;
  for (size_t i = 0; i < count; ++i) {
    if (requests[i].done) continue;
    if (requests[i].peer < 0 || requests[i].peer >= size_ || !remotePeer_[requests[i].peer]) return false;
    any = true;
  }
  return any;
}

// Sleeps until the worker has events, the deadline passes, or the next
// liveness/mismatch probe is due (at most kRemoteSleepMaxMs).
void UcxTransport::sleepOnEvents(Deadline deadline) {
  // ucp_worker_arm says BUSY when events are already pending: progress instead.
  if (ucp_worker_arm(worker_) != UCS_OK) return;
  const Clock::time_point now = Clock::now();
  const Clock::time_point wake =
      std::min({deadline, nextLivenessCheck_, now + std::chrono::milliseconds(kRemoteSleepMaxMs)});
  const auto ms = std::chrono::ceil<std::chrono::milliseconds>(wake - now).count();
  pollfd descriptor{eventFd_, POLLIN, 0};
  ::poll(&descriptor, 1, static_cast<int>(std::clamp<long long>(ms, 0, kRemoteSleepMaxMs)));
}

void UcxTransport::waitFor(Request* requests, size_t count, Deadline deadline, bool any) {
  checkUsable();
  unsigned idleRounds = 0;
  Clock::time_point idleSince{};
  // What streams in is what this wait receives: sends leave at the socket's
  // pace and a symmetric exchange of small messages stays latency-bound.
  size_t pendingBytes = 0;
  for (size_t i = 0; i < count; ++i)
    pendingBytes += requests[i].done || !requests[i].isReceive ? 0 : requests[i].bytes;
  unsigned remoteSpinRounds = std::min(spinRounds_, remoteSpin_.rounds(pendingBytes));
  Clock::time_point firstSleep{};  // when this wait first slept on the event fd
  bool slept = false;
  try {
    for (;;) {
      bool allDone = true, anyDone = count == 0;
      for (size_t i = 0; i < count; ++i) {
        const bool done = poll(requests[i]);
        allDone = allDone && done;
        anyDone = anyDone || done;
      }
      if (any ? anyDone : allDone) break;
      if (ucp_worker_progress(worker_) != 0) {
        idleRounds = 0;
        continue;
      }
      checkForPeerTrouble(requests, count);
      if (Clock::now() > deadline) {
        std::string pending;
        for (size_t i = 0; i < count; ++i)
          if (!requests[i].done)
            pending += fmt::format("{}{} rank {}", pending.empty() ? "" : ", ",
                                   requests[i].isReceive ? "receive from" : "send to", requests[i].peer);
        throw Error(SHOAL_ERR_TIMEOUT,
                    fmt::format("rank {} timed out (SHOAL_TIMEOUT_S) waiting for {}: is that rank alive and calling "
                                "the same collective?",
                                rank_, pending));
      }
      // Spin briefly (lowest latency), then sleep on the worker's event fd so
      // that ranks outnumbering cores leave the CPU to the peers they wait for.
      if (++idleRounds == spinRounds_ + 1) idleSince = Clock::now();
      if (eventFd_ >= 0 && idleRounds > remoteSpinRounds && waitsOnlyForRemotePeers(requests, count)) {
        if (!slept) {
          firstSleep = Clock::now(), slept = true;
          ++sleptWaits_;
          pollsBeforeSleep_ += idleRounds - 1;  // the last idle round is the one that sleeps
        }
        sleepOnEvents(deadline);
        remoteSpinRounds = std::min(remoteSpinRounds, kRemoteRespinRounds);
        continue;
      }
      if (idleRounds > spinRounds_) idle(idleSince);
    }
  } catch (const Error& error) {
    failExplained(requests, count, error);
  }
  if (slept) remoteSpin_.sleptWait(Clock::now() - firstSleep);
  for (size_t i = 0; i < count; ++i) {
    Request& request = requests[i];
    if (request.done && request.isReceive && request.receivedBytes != request.bytes)
      failWith(requests, count, SHOAL_ERR_MISMATCH,
               fmt::format("rank {} expected {} bytes from rank {} but received {}: do all ranks pass the same count "
                           "and dtype?",
                           rank_, request.bytes, request.peer, request.receivedBytes),
               true);
  }
}

void UcxTransport::checkNotAborted() {
  checkUsable();
  ucp_worker_progress(worker_);
  try {
    checkForPeerTrouble(nullptr, 0);
  } catch (const Error& error) {
    failWith(nullptr, 0, error.status(), error.what(), false);
  }
}

void UcxTransport::cancelPending(Request* requests, size_t count) {
  // Every outstanding request of the communicator, not only this wait's: a
  // ring posts later steps' receives early, and none may land in user
  // buffers after the call returned an error.
  for (void* handle : live_) {
    ucp_request_cancel(worker_, handle);
    ucp_request_free(handle);
  }
  live_.clear();
  for (size_t i = 0; i < count; ++i) {
    requests[i].handle = nullptr;
    requests[i].done = true;
  }
}

void UcxTransport::failWith(Request* requests, size_t count, shoal_status_t status, const std::string& text,
                            bool notifyPeers) {
  cancelPending(requests, count);
  if (recordFailure(status, text) && notifyPeers) abort(text, status);
  throw Error(status, text);
}

void UcxTransport::failExplained(Request* requests, size_t count, const Error& error) {
  if (error.status() == SHOAL_ERR_REMOTE && !peerAborted_)
    if (std::optional<Error> notice = awaitAbortNotice(kAbortNoticeGraceS))
      failWith(requests, count, notice->status(), notice->what(), false);
  failWith(requests, count, error.status(), error.what(), !peerAborted_);
}

void UcxTransport::abort(const std::string& reason, shoal_status_t status) {
  runBeforeNotices(reason, status);  // the shared segment's word first (transport.h)
  recordFailure(status == SHOAL_ERR_MISMATCH ? status : SHOAL_ERR_REMOTE, "the communicator was aborted: " + reason);
  // The peers learn the status (MISMATCH or REMOTE) and the reason.
  abortOutbox_ = fmt::format("{} {}", static_cast<int>(status == SHOAL_ERR_MISMATCH ? status : SHOAL_ERR_REMOTE),
                             reason).substr(0, kAbortMessageBytes - 1);
  std::vector<void*> sends;
  for (int peer = 0; peer < size_; ++peer) {
    if (peer == rank_ || peerStatus_[peer] != UCS_OK) continue;
    ucp_request_param_t param{};
    void* request =
        ucp_tag_send_nbx(endpoints_[peer], abortOutbox_.data(), abortOutbox_.size(), kAbortBit | wireTag(rank_, 0),
                         &param);
    if (request != nullptr && !UCS_PTR_IS_ERR(request)) sends.push_back(request);
  }
  // Best effort: give the notices a moment to leave, never block for long.
  Deadline deadline = deadlineAfter(0.5);
  for (void* request : sends) {
    while (ucp_request_check_status(request) == UCS_INPROGRESS && Clock::now() < deadline)
      ucp_worker_progress(worker_);
    if (ucp_request_check_status(request) == UCS_INPROGRESS) ucp_request_cancel(worker_, request);
    ucp_request_free(request);
  }
  SHOAL_LOG_DEBUG("rank {} aborted the communicator: {}", rank_, reason);
}

// ---- Describing what UCX chose for each peer (SHOAL_LOG_LEVEL=info, comm/describe.cc) ----
//
// UCX 1.13's ucp_ep_query reports no transports, so the endpoint's own report
// (ucp_ep_print_info) is read back: its "lane[i]: n:tl/dev.k ..." lines name
// the transport and device of every lane.
std::string UcxTransport::describePeer(int peer) const {
  if (peer == rank_) return "self";
  if (peer < 0 || peer >= size_ || endpoints_[peer] == nullptr) return "not connected";
  char* text = nullptr;
  size_t length = 0;
  FILE* out = open_memstream(&text, &length);
  if (out == nullptr) return "unknown (open_memstream failed)";
  ucp_ep_print_info(endpoints_[peer], out);
  std::fclose(out);
  std::string report(text, length);
  std::free(text);
  SHOAL_LOG_DEBUG("rank {}: UCX endpoint to rank {}:\n{}", rank_, peer, report);

  std::vector<std::string> lanes;  // "tl/dev", each once, in lane order
  for (size_t at = report.find("lane["); at != std::string::npos; at = report.find("lane[", at + 1)) {
    size_t colon = report.find(':', at);
    if (colon == std::string::npos) break;
    size_t begin = report.find_first_not_of(" \t", colon + 1);
    size_t end = report.find_first_of(" \t\n", begin);
    if (begin == std::string::npos || end == std::string::npos) break;
    std::string resource = report.substr(begin, end - begin);       // e.g. "8:posix/memory.0"
    if (resource == "cm") continue;  // the connection manager's lane (endpoints through a listener)
    if (size_t index = resource.find(':'); index != std::string::npos) resource.erase(0, index + 1);
    if (size_t dot = resource.rfind('.'); dot != std::string::npos) resource.erase(dot);  // the lane's sub-index
    bool seen = false;
    for (const std::string& lane : lanes) seen = seen || lane == resource;
    if (!seen) lanes.push_back(resource);
  }
  if (lanes.empty()) return "unknown (UCX reported no lanes)";
  bool sharedMemory = false, tcp = false, rdma = false;
  for (const std::string& lane : lanes) {
    const std::string tl = lane.substr(0, lane.find('/'));
    if (tl == "posix" || tl == "sysv" || tl == "cma" || tl == "xpmem" || tl == "knem" || tl == "self")
      sharedMemory = true;
    else if (tl == "tcp")
      tcp = true;
    else if (tl.rfind("rc", 0) == 0 || tl.rfind("ud", 0) == 0 || tl.rfind("dc", 0) == 0 || tl == "ib")
      rdma = true;
  }
  std::string kinds;
  for (auto [on, kind] : {std::pair{sharedMemory, "shared memory"}, {tcp, "TCP"}, {rdma, "RDMA"}})
    if (on) kinds += (kinds.empty() ? "" : " + ") + std::string(kind);
  std::string joined;
  for (const std::string& lane : lanes) joined += (joined.empty() ? "" : ", ") + lane;
  // A lane for remote memory access (a lane line's "rma_bw#0") is what lets a rendezvous put
  // into the receive buffer; without one, UCX's rendezvous copies like its eager protocol.
  const bool rendezvousInPlace = report.find("rma_bw#") != std::string::npos;
  return fmt::format("{} ({}){}{}", kinds.empty() ? "other" : kinds, joined,
                     localPeerPid_[peer] != 0 ? ", same host" : "",
                     tcp && rendezvousInPlace ? ", rendezvous into the receive buffer" : "");
}

}  // namespace

std::unique_ptr<Transport> makeUcxTransport(const TransportOptions& options) {
  return std::make_unique<UcxTransport>(options);
}

}  // namespace shoal
