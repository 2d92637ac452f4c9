// The async runtime of one communicator (Horovod's background thread): user
// threads only enqueue named requests; one engine thread owns every
// collective once it runs. A negotiation round finds which requests are ready
// on every rank (negotiation.h); the engine fuses them (fusion.h), runs them,
// and completes their requests. A rank starts a round only when it has a
// reason (a new submission, a stall probe, a shutdown); an engine without one
// sleeps and looks every SHOAL_CYCLE_TIME_MS whether a peer started the next
// round, and joins it. See docs/runtime.md.
#pragma once

#include <atomic>
#include <condition_variable>
#include <deque>
#include <functional>
#include <memory>
#include <mutex>
#include <string>
#include <thread>
#include <unordered_map>
#include <unordered_set>
#include <vector>

#include "runtime/fusion.h"
#include "runtime/join.h"
#include "runtime/negotiation.h"
#include "runtime/request.h"
#include "runtime/stall.h"
#include "runtime/timeline.h"

struct shoal_comm;

namespace shoal::runtime {

struct RuntimeSettings {
  double cycleS = 0.001;           // SHOAL_CYCLE_TIME_MS
  size_t fusionThreshold = 0;      // SHOAL_FUSION_THRESHOLD (bytes; 0 = no fusion)
  size_t cacheCapacity = 1024;     // SHOAL_CACHE_CAPACITY (0 = every cycle is a full round)
  std::string timeline;            // SHOAL_TIMELINE (rank 0 writes it)
  StallSettings stall;
  static RuntimeSettings fromEnvironment(double timeoutS);
  // What every rank must agree on (the timeline path is rank 0's business).
  std::string agreement() const;
};

struct EngineStats {
  uint64_t cycles = 0;             // negotiation rounds
  uint64_t readyRounds = 0;        // rounds that made some request ready
  uint64_t peerChecks = 0;         // looks, while waiting, whether a peer started the next round
  uint64_t joinedRounds = 0;       // rounds this rank entered because a peer had started them
  uint64_t fullRounds = 0;
  uint64_t cacheHits = 0;
  uint64_t tensors = 0;
  uint64_t groups = 0;
  double negotiationUs = 0;
};

class Engine {
 public:
  explicit Engine(shoal_comm& comm) : comm_(comm) {}
  ~Engine();
  Engine(const Engine&) = delete;
  Engine& operator=(const Engine&) = delete;

  // Starts the engine thread the first time: a collective (every rank must
  // reach it after the same blocking calls) that also checks that every rank
  // has the same runtime settings. Later calls return at once.
  void ensureStarted(const char* call);
  // True once blocking calls must travel through the engine: it was started,
  // and the caller is not the engine thread itself.
  bool routesBlockingCalls() const;
  // Enqueues a request; throws for a name already in flight on this rank, or
  // when the runtime has stopped (with the reason).
  void submit(const std::shared_ptr<Request>& request, const char* call);
  // A blocking collective once the engine runs: negotiated like a request
  // named kBlockingName, run on the engine thread, waited for here.
  void runBlocking(const char* call, const std::function<void()>& body);
  // shoal_join: this rank stands in for the others' allreduces until every
  // rank joined; returns the last rank to join. On a timeout the rank stays
  // joined and a later join() keeps waiting for the same join.
  int join(const char* call, double timeoutS);
  // Local: asks every rank's engine to stop at the next cycle and waits for
  // this one (bounded by SHOAL_TIMEOUT_S through the collectives' deadlines).
  void shutdown();
  EngineStats stats();
  double timeoutS() const;
  // Rank 0's SHOAL_TIMELINE trace, opened by its first user (a blocking call
  // or the runtime's start) and shared by both; nullptr on other ranks, when
  // unset, once the runtime stopped, or when the file cannot be written
  // (timelineError() says why).
  Timeline* timeline();
  // True once it is known that timeline() is nullptr: one inline load, for
  // the check every blocking call makes (CallTrace).
  bool writesNoTimeline() const { return noTimeline_.load(std::memory_order_acquire); }
  std::string timelineError();

 private:
  enum class State { Idle, Running, Stopped };

  void loop();
  // Returns once this rank has a reason for the next round (a submission, a
  // shutdown, a stall probe due), or a peer has started it.
  void awaitNextRound();
  // Sleeps on the transport's events and wakeFd_ until a peer's message, a
  // submission or shutdown, or `until`; false when the transport cannot tell.
  bool sleepOnPeerEvents(Clock::time_point until, uint64_t nextCall);
  void wakeUp();                                   // any thread: ends sleepOnPeerEvents
  // When this rank's oldest pending request makes it probe for stalls (a
  // full round); time_point::max() with nothing pending.
  Clock::time_point probeDueAt() const;
  bool cycle();                                    // true when the runtime stops
  void logSummary();
  void fullRound(std::vector<Ready>& ready, Clock::time_point now);
  void execute(std::vector<Ready>& ready);
  void finishJoin();                               // every rank joined: complete this rank's join
  void finish(Request& request, shoal_status_t status, const std::string& error);
  void stopWith(shoal_status_t status, const std::string& text);

  shoal_comm& comm_;
  RuntimeSettings settings_;
  std::mutex startMutex_;

  // Shared with submitting threads, under mutex_.
  std::mutex mutex_;
  std::condition_variable wake_;
  State state_ = State::Idle;
  bool shutdownRequested_ = false;
  shoal_status_t stopStatus_ = SHOAL_OK;
  std::string stopText_;
  std::deque<std::shared_ptr<Request>> incoming_;
  std::unordered_set<std::string> inFlight_;
  std::thread thread_;
  std::mutex joinMutex_;  // one joiner at a time
  std::atomic<std::thread::id> engineThread_{};
  int wakeFd_ = -1;  // an eventfd: submissions and shutdown write it (set before the thread starts)

  // Engine thread only.
  std::vector<std::shared_ptr<Request>> pending_;  // submission order
  std::unordered_map<std::string, std::shared_ptr<Request>> pendingByName_;
  std::unique_ptr<ResponseCache> cache_;
  std::unique_ptr<StallInspector> stall_;
  std::unique_ptr<JoinTracker> joins_;
  bool joinsComplete_ = false;                     // this cycle's full round: every rank joined
  std::shared_ptr<Request> join_;                  // this rank's pending join (under mutex_)
  std::mutex timelineMutex_;  // opening and closing; spans come from one thread at a time
  bool timelineOpened_ = false;
  // Set once it is known that this rank writes no timeline (none asked for,
  // not rank 0, the file failed, or it closed): every blocking call asks
  // (CallTrace), and then one load answers instead of the mutex.
  std::atomic<bool> noTimeline_{false};
  std::unique_ptr<Timeline> timeline_;
  std::string timelineError_;
  std::vector<uint8_t> fusionBuffer_;
  uint64_t cycle_ = 0;
  Clock::time_point lastProbe_{};
  Clock::time_point started_{};
  Clock::time_point lastRoundStart_{};             // of the last round with this rank's own requests pending;
                                                   // new submissions wait until a cycle after it
  bool peerStarted_ = false;                       // this round: entered because a peer had begun it

  std::mutex statsMutex_;
  EngineStats stats_;
};

}  // namespace shoal::runtime
