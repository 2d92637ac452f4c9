#include "runtime/engine.h"

#include <algorithm>
#include <cmath>
#include <cstdlib>
#include <cstring>

#include <poll.h>
#include <pthread.h>
#include <sys/eventfd.h>
#include <unistd.h>

#include <fmt/format.h>

#include "comm/communicator.h"
#include "comm/call.h"
#include "comm/host_ops.h"
#include "core/config.h"
#include "core/log.h"
#include "runtime/cuda_requests.h"

namespace shoal::runtime {
namespace {

double seconds(Clock::duration d) { return std::chrono::duration<double>(d).count(); }

// A stop every rank decides in the same cycle from the same data (a stall
// past SHOAL_STALL_SHUTDOWN_S): no need to abort the transport.
struct AgreedStop : Error {
  using Error::Error;
};

constexpr double kBlockingProbeS = 0.1;
// The longest an engine with nothing pending sleeps between looks for a
// peer's round (awaitNextRound).
constexpr double kIdleLookMaxS = 0.01;
// The longest an engine sleeps on the transport's events before it looks at
// its peers (liveness, an abort notice) as a transport wait does.
constexpr double kEventSleepMaxS = 0.05;

Clock::duration durationOf(double s) {
  return std::chrono::duration_cast<Clock::duration>(std::chrono::duration<double>(s));
}

Clock::time_point after(Clock::time_point t, double s) {
  return t == Clock::time_point::max() ? t : t + durationOf(s);
}

// A round's flags and cache bits, ANDed over every rank. Each rank sends its
// words to every peer before it waits, so a waiting peer sees the round begin
// (Transport::peerStartedCall) whichever rank started it: in a reduction
// tree or the shared-memory exchange a rank that starts alone may only wait
// for others and stay unseen. N - 1 small messages per rank and round.
void exchangeFlags(shoal_comm& comm, uint64_t sequence, std::vector<uint64_t>& words) {
  if (comm.size == 1) return;
  runCollective(comm, sequence, [&](Context& context) {
    const size_t n = words.size(), bytes = n * sizeof(uint64_t);
    const uint64_t tag = context.reserveTags(1);
    std::vector<uint64_t> theirs(n * static_cast<size_t>(context.size));
    std::vector<Transport::Request> requests;
    requests.reserve(2 * static_cast<size_t>(context.size));
    for (int peer = 0; peer < context.size; ++peer)
      if (peer != context.rank)
        requests.push_back(context.transport.irecv(peer, tag, theirs.data() + static_cast<size_t>(peer) * n, bytes));
    for (int peer = 0; peer < context.size; ++peer)
      if (peer != context.rank) requests.push_back(context.transport.isend(peer, tag, words.data(), bytes));
    context.waitAll(requests);
    for (int peer = 0; peer < context.size; ++peer)
      if (peer != context.rank)
        for (size_t i = 0; i < n; ++i) words[i] &= theirs[static_cast<size_t>(peer) * n + i];
  });
}

// SHOAL_LOG_LEVEL=debug: one line per request the engine ran (blocking calls
// have theirs from blockingCall), with its group's bytes, algorithm and
// compressor decision.
void logGroup(const shoal_comm& comm, const Group& group) {
  const Ready& head = *group.members.front();
  const Metadata& meta = head.request->meta;
  if (meta.kind == OpKind::Blocking || log::threshold() < log::Level::Debug) return;
  size_t bytes = 0;
  for (const Ready* member : group.members) bytes += member->request->meta.bytes();
  std::string how;
  if (meta.memory == SHOAL_MEMORY_CUDA)
    how = fmt::format(", CUDA tensors through NCCL{}", head.compress ? ", compressor " + meta.compressor : "");
  else if (meta.kind == OpKind::Allreduce)
    // The algorithm the group ran, as runGroup recorded it: never chosen again here.
    how = head.compress ? fmt::format(", compressor {}{}{}", meta.compressor,
                                      meta.options.empty() ? "" : " (" + meta.options + ")",
                                      group.algorithm && std::strcmp(group.algorithm, "hierarchical") == 0
                                          ? ", algorithm hierarchical (compressed across hosts only)"
                                          : "")
                        : fmt::format(", algorithm {}, uncompressed{}",
                                      group.algorithm ? group.algorithm : "unknown",
                                      meta.compressor.empty() || meta.compressor == "none"
                                          ? ""
                                          : fmt::format(" (compressor {}: below its min bytes, or an op or dtype it "
                                                        "does not take)",
                                                        meta.compressor));
  for (const Ready* member : group.members)
    SHOAL_LOG_DEBUG("rank {}: async {} '{}' done: {} bytes{}{}", comm.rank, opKindName(meta.kind),
                    member->request->name, member->request->meta.bytes(),
                    group.members.size() > 1 ? fmt::format(" (fused, {} tensors, {} bytes)", group.members.size(), bytes)
                                             : std::string(),
                    how);
}

// Engines whose thread runs, stopped by exit() when the program returns from
// main without shoal_comm_destroy. Otherwise the thread would keep running
// collectives while exit() destroys the library's static tables (the
// algorithm table, the compressor registry) and UCX's globals: a SIGSEGV in
// the engine thread. The handler is registered with atexit when the first
// engine starts, so it runs before the destructors of every static the
// library made until then, and before the shared libraries' own finalizers.
// The set is never destroyed, so the handler cannot outlive it.
struct LiveEngines {
  std::mutex mutex;
  std::unordered_set<Engine*> engines;

  static LiveEngines& get() {
    static LiveEngines* live = new LiveEngines;  // leaked on purpose, see above
    return *live;
  }
  void add(Engine* engine) {
    static std::once_flag registered;
    std::call_once(registered, [] { std::atexit(stopAllAtExit); });
    std::lock_guard<std::mutex> lock(mutex);
    engines.insert(engine);
  }
  void remove(Engine* engine) {
    std::lock_guard<std::mutex> lock(mutex);
    engines.erase(engine);
  }
  // The same stop as shoal_comm_finalize's (peers see the communicator
  // finalized), bounded by SHOAL_TIMEOUT_S. Held under the lock so that a
  // concurrent shoal_comm_destroy waits instead of freeing the engine.
  static void stopAllAtExit() {
    LiveEngines& live = get();
    std::lock_guard<std::mutex> lock(live.mutex);
    for (Engine* engine : live.engines) engine->shutdown();
    live.engines.clear();
  }
};

}  // namespace

RuntimeSettings RuntimeSettings::fromEnvironment(double timeoutS) {
  RuntimeSettings s;
  double cycleMs = config::getDouble("SHOAL_CYCLE_TIME_MS");
  if (!(cycleMs >= 0) || cycleMs > 10000)
    fail(SHOAL_ERR_INVALID_ARGUMENT, "SHOAL_CYCLE_TIME_MS must be between 0 and 10000 (milliseconds), not {}", cycleMs);
  s.cycleS = cycleMs / 1e3;
  long long threshold = config::getInt("SHOAL_FUSION_THRESHOLD");
  if (threshold < 0) fail(SHOAL_ERR_INVALID_ARGUMENT, "SHOAL_FUSION_THRESHOLD must be >= 0 bytes, not {}", threshold);
  s.fusionThreshold = static_cast<size_t>(threshold);
  long long capacity = config::getInt("SHOAL_CACHE_CAPACITY");
  if (capacity < 0 || capacity > (1 << 20))
    fail(SHOAL_ERR_INVALID_ARGUMENT, "SHOAL_CACHE_CAPACITY must be between 0 and 1048576 entries, not {}", capacity);
  s.cacheCapacity = static_cast<size_t>(capacity);
  s.timeline = config::getString("SHOAL_TIMELINE");
  s.stall.checkS = config::getDouble("SHOAL_STALL_CHECK_S");
  s.stall.shutdownS = config::getDouble("SHOAL_STALL_SHUTDOWN_S");
  if (!(s.stall.checkS >= 0) || !(s.stall.shutdownS >= 0))
    fail(SHOAL_ERR_INVALID_ARGUMENT, "SHOAL_STALL_CHECK_S and SHOAL_STALL_SHUTDOWN_S must be >= 0 seconds, not {} and {}",
         s.stall.checkS, s.stall.shutdownS);
  s.stall.blockingTimeoutS = timeoutS;
  return s;
}

std::string RuntimeSettings::agreement() const {
  return fmt::format("cycle {} fusion {} cache {} stall {} {}", cycleS, fusionThreshold, cacheCapacity, stall.checkS,
                     stall.shutdownS);
}

void EngineRelease::operator()(Engine* engine) const { delete engine; }

Engine::~Engine() {
  LiveEngines::get().remove(this);
  shutdown();
  if (wakeFd_ >= 0) ::close(wakeFd_);
}

void Engine::wakeUp() {
  if (wakeFd_ < 0) return;
  const uint64_t one = 1;
  // Nonblocking: a full counter (never, in practice) already means "awake".
  [[maybe_unused]] ssize_t written = ::write(wakeFd_, &one, sizeof one);
}

double Engine::timeoutS() const { return comm_.timeoutS; }

Timeline* Engine::timeline() {
  if (noTimeline_.load(std::memory_order_acquire)) return nullptr;
  std::lock_guard<std::mutex> lock(timelineMutex_);
  if (!timelineOpened_) {
    timelineOpened_ = true;
    const std::string path = config::getString("SHOAL_TIMELINE");
    if (comm_.rank == 0 && !path.empty()) {
      try {
        timeline_ = std::make_unique<Timeline>(path);
      } catch (const Error& error) {
        timelineError_ = error.what();
        SHOAL_LOG_WARN("{}; this run writes no timeline", timelineError_);
      }
    }
  }
  if (!timeline_) noTimeline_.store(true, std::memory_order_release);
  return timeline_.get();
}

std::string Engine::timelineError() {
  std::lock_guard<std::mutex> lock(timelineMutex_);
  return timelineError_;
}

void Engine::ensureStarted(const char* call) {
  std::lock_guard<std::mutex> start(startMutex_);
  {
    std::lock_guard<std::mutex> lock(mutex_);
    if (state_ != State::Idle) return;
  }
  RuntimeSettings settings = RuntimeSettings::fromEnvironment(comm_.timeoutS);
  timeline();  // rank 0 opens it now if no blocking call did
  const std::string timelineError = this->timelineError();
  // One agreement round finds a rank with other settings; rank 0's refusal
  // tells everyone that it could not open the timeline.
  const std::string agreement = settings.agreement();
  Agreement agreed;
  try {
    agreed = agree(comm_, takeSequence(comm_), agreement, timelineError.empty() ? SHOAL_OK : SHOAL_ERR_SYSTEM);
  } catch (const Error& error) {
    fail(error.status(),
         "{}: starting the async runtime failed (a collective step: every rank must make its first async call, or "
         "shoal_async_start, after the same blocking calls): {}",
         call, error.what());
  }
  if (!agreed.same)
    fail(SHOAL_ERR_MISMATCH,
         "{}: ranks disagree on the async runtime's settings (this rank: {}); set SHOAL_CYCLE_TIME_MS, "
         "SHOAL_FUSION_THRESHOLD, SHOAL_CACHE_CAPACITY, SHOAL_STALL_CHECK_S and SHOAL_STALL_SHUTDOWN_S identically on "
         "every rank",
         call, agreement);
  if (agreed.refusal != SHOAL_OK)
    fail(SHOAL_ERR_SYSTEM, "{}: {}", call,
         timelineError.empty() ? "rank 0 could not open the SHOAL_TIMELINE file; its error says why" : timelineError);

  settings_ = settings;
  cache_ = std::make_unique<ResponseCache>(settings_.cacheCapacity);
  stall_ = std::make_unique<StallInspector>(settings_.stall, comm_.rank);
  joins_ = std::make_unique<JoinTracker>(comm_.size);
  lastProbe_ = Clock::now();
  started_ = lastProbe_;
  lastRoundStart_ = lastProbe_;  // the first submissions of a cycle share its first round
  {
    std::lock_guard<std::mutex> lock(mutex_);
    state_ = State::Running;
    wakeFd_ = ::eventfd(0, EFD_NONBLOCK | EFD_CLOEXEC);  // -1: awaitNextRound keeps to its condition variable
    thread_ = std::thread([this] { loop(); });
    engineThread_ = thread_.get_id();
  }
  LiveEngines::get().add(this);  // outside mutex_: the exit handler takes the two locks the other way round
}

bool Engine::routesBlockingCalls() const {
  if (engineThread_.load() == std::thread::id{}) return false;  // never started
  return std::this_thread::get_id() != engineThread_.load();
}

void Engine::submit(const std::shared_ptr<Request>& request, const char* call) {
  {
    std::lock_guard<std::mutex> lock(mutex_);
    if (state_ == State::Stopped) fail(stopStatus_, "{}: {}", call, stopText_);
    if (state_ != State::Running) fail(SHOAL_ERR_INTERNAL, "{}: the async runtime was not started", call);
    if (!inFlight_.insert(request->name).second) {
      if (request->name == kBlockingName)
        fail(SHOAL_ERR_INVALID_ARGUMENT,
             "{}: another thread's blocking call is in flight on this communicator; make blocking calls from one "
             "thread at a time",
             call);
      fail(SHOAL_ERR_INVALID_ARGUMENT,
           "{}: tensor name '{}' is already in flight on this rank; wait for its request before reusing the name, or "
           "give this tensor another name",
           call, request->name);
    }
    incoming_.push_back(request);
  }
  wake_.notify_one();  // wakes an engine that waits for a reason to negotiate
  wakeUp();            // ... or sleeps on the transport's events (awaitNextRound)
}

void Engine::runBlocking(const char* call, const std::function<void()>& body) {
  auto request = std::make_shared<Request>();
  request->name = kBlockingName;
  request->meta.kind = OpKind::Blocking;
  request->meta.call = call;
  request->body = body;
  submit(request, call);
  // The stall inspector fails a blocking call its peers do not make within
  // SHOAL_TIMEOUT_S; this deadline only guards against a runtime bug.
  if (!request->waitUntil(deadlineAfter(2 * comm_.timeoutS + 10))) {
    if (request->tryCancel())
      fail(SHOAL_ERR_TIMEOUT, "{}: the async runtime did not run this blocking call within 2 x SHOAL_TIMEOUT_S", call);
    // It runs now, with our arguments: wait (its collectives have deadlines).
    while (!request->waitUntil(deadlineAfter(comm_.timeoutS))) {
    }
  }
  if (request->status() != SHOAL_OK) throw Error(request->status(), request->error());
}

int Engine::join(const char* call, double timeoutS) {
  std::shared_ptr<Request> request;
  {
    std::lock_guard<std::mutex> lock(mutex_);
    request = join_;
  }
  if (!request) {
    request = std::make_shared<Request>();
    request->name = kJoinName;
    request->meta.kind = OpKind::Join;
    request->meta.call = call;
    submit(request, call);
    std::lock_guard<std::mutex> lock(mutex_);
    join_ = request;
  }
  if (!request->waitUntil(deadlineAfter(timeoutS)))
    fail(SHOAL_ERR_TIMEOUT,
         "{}: not every rank joined within {} s; this rank stays joined (it keeps standing in for the others' "
         "allreduces): call shoal_join again to keep waiting, with a longer timeout_s if the others have much data "
         "left",
         call, timeoutS);
  {
    std::lock_guard<std::mutex> lock(mutex_);
    if (join_ == request) join_.reset();
  }
  if (request->status() != SHOAL_OK) throw Error(request->status(), request->error());
  return request->lastJoined;
}

void Engine::shutdown() {
  {
    std::lock_guard<std::mutex> lock(mutex_);
    shutdownRequested_ = true;
  }
  wake_.notify_all();
  wakeUp();
  // shoal_comm_finalize, shoal_comm_destroy and exit may all stop the engine.
  std::lock_guard<std::mutex> join(joinMutex_);
  if (thread_.joinable() && thread_.get_id() != std::this_thread::get_id()) thread_.join();
}

EngineStats Engine::stats() {
  std::lock_guard<std::mutex> lock(statsMutex_);
  return stats_;
}

void Engine::finish(Request& request, shoal_status_t status, const std::string& error) {
  if (request.standIn) {  // nobody waits for it; its error belongs to this rank's join
    if (status != SHOAL_OK) joins_->noteError(error);
    request.complete(status, error);
    return;
  }
  pendingByName_.erase(request.name);
  {
    // Before completing: the submitter may reuse the name at once.
    std::lock_guard<std::mutex> lock(mutex_);
    inFlight_.erase(request.name);
  }
  request.complete(status, error);
}

void Engine::stopWith(shoal_status_t status, const std::string& text) {
  {
    std::lock_guard<std::mutex> lock(mutex_);
    state_ = State::Stopped;
    stopStatus_ = status;
    stopText_ = text;
    for (auto& request : incoming_) pending_.push_back(request);
    incoming_.clear();
  }
  for (auto& request : pending_)
    if (!request->done()) finish(*request, status, text);
  pending_.clear();
  pendingByName_.clear();
  std::lock_guard<std::mutex> lock(timelineMutex_);
  timeline_.reset();  // closes the JSON array; later blocking calls are not recorded
  noTimeline_.store(true, std::memory_order_release);
}

void Engine::loop() {
  // Named, so that top -H, perf and /proc/<pid>/task/<tid>/comm tell the engine apart from the
  // user's threads (bench/train/step_profile.py reads its CPU by this name).
  pthread_setname_np(pthread_self(), "shoal-engine");
  try {
    for (;;) {
      awaitNextRound();
      if (cycle()) break;
    }
  } catch (const AgreedStop& stop) {
    stopWith(stop.status(), fmt::format("the async runtime stopped on every rank: {}", stop.what()));
  } catch (const Error& error) {
    std::string text = fmt::format("the async runtime stopped: {}", error.what());
    failCommunicator(comm_, text, error.status());  // peers must not wait for this rank
    stopWith(error.status(), text);
  } catch (const std::exception& error) {
    std::string text = fmt::format("the async runtime stopped after an internal error: {}", error.what());
    failCommunicator(comm_, text, SHOAL_ERR_INTERNAL);
    stopWith(SHOAL_ERR_INTERNAL, text);
  }
  logSummary();
}

// No round while no rank has a reason for one: a round with nothing new on
// any rank decides what the last one decided (the same bits, the same
// announcements), so only a submission, a stall probe or a shutdown starts
// one, and the peers join when they see its first message. An idle runtime
// then does not negotiate at all, and a step's rounds follow its submissions,
// not its duration. New submissions still wait until SHOAL_CYCLE_TIME_MS
// after the previous round with requests of this rank pending began, so that
// those of one cycle share a round (and can fuse), as in Horovod's cycle; a
// round this rank only joined batched nothing of its own and delays nothing.
void Engine::awaitNextRound() {
  const Clock::time_point batchEnd = lastRoundStart_ + durationOf(settings_.cycleS);
  const uint64_t nextCall = (comm_.sequence % kCollectiveSequences) << kSubTagBits;
  peerStarted_ = false;
  double idleLookS = std::max(settings_.cycleS, 50e-6);
  for (;;) {
    const Clock::time_point now = Clock::now(), probeAt = probeDueAt();
    if (now >= probeAt) return;
    bool news = false;
    {
      std::unique_lock<std::mutex> lock(mutex_);
      if (shutdownRequested_) return;
      news = !incoming_.empty();
      if (news && now >= batchEnd) return;
      if (!news) {
        // With every peer on another host: sleep until one of them sends (the
        // round it began), a submission or shutdown, or the probe is due, and at
        // least every kEventSleepMaxS to look at the peers as a wait does. No
        // looks every quarter cycle (a wake-up and a UCX progress call each:
        // 34-60 per training step, docs/training.md), and no look's delay.
        lock.unlock();
        if (sleepOnPeerEvents(std::min(probeAt, now + durationOf(kEventSleepMaxS)), nextCall)) {
          if (peerStarted_) return;
          continue;
        }
        lock.lock();  // the transport cannot tell: look as below
      }
      // How often to look for a peer's round. Four times per cycle while this
      // rank waits for its peers: a peer's submission then is on the critical
      // path. With nothing pending here, from once per cycle, doubling after
      // each look that found nothing, up to kIdleLookMaxS: a peer's round can
      // then make nothing ready before this rank submits, and a submission
      // wakes this engine at once; only a stall probe or a shutdown waits
      // longer (a look costs a wake-up and a UCX progress call, ~10-20 us on
      // a loaded machine). At least every 50 us: SHOAL_CYCLE_TIME_MS=0 polls
      // rather than spins.
      const bool waiting = news || !pending_.empty();
      const double lookS =
          waiting ? settings_.cycleS / 4 : std::min(idleLookS, std::max(kIdleLookMaxS, settings_.cycleS));
      const Clock::time_point look = now + durationOf(std::max(lookS, 50e-6));
      const Clock::time_point until = news ? std::min({probeAt, look, batchEnd}) : std::min(probeAt, look);
      wake_.wait_until(lock, until, [&] { return shutdownRequested_ || (!news && !incoming_.empty()); });
      if (shutdownRequested_ || (!incoming_.empty() && Clock::now() >= batchEnd)) return;
    }
    if (Clock::now() >= probeAt) return;
    {
      std::lock_guard<std::mutex> lock(statsMutex_);
      ++stats_.peerChecks;
    }
    if (comm_.transport->peerStartedCall(nextCall)) {
      peerStarted_ = true;
      return;
    }
    idleLookS *= 2;
  }
}

bool Engine::sleepOnPeerEvents(Clock::time_point until, uint64_t nextCall) {
  if (wakeFd_ < 0) return false;
  const int fd = comm_.transport->armPeerEvents();  // the engine thread owns the transport
  if (fd == -1) return false;
  {
    std::lock_guard<std::mutex> lock(statsMutex_);
    ++stats_.peerChecks;
  }
  // A message that came before the arming waits in the unexpected queue already.
  if (comm_.transport->peerStartedCall(nextCall)) {
    peerStarted_ = true;
    return true;
  }
  if (fd == -2) return true;  // events were pending (progressed just now): arm again
  const auto leftMs = std::chrono::ceil<std::chrono::milliseconds>(until - Clock::now()).count();
  if (leftMs > 0) {
    pollfd descriptors[2] = {{fd, POLLIN, 0}, {wakeFd_, POLLIN, 0}};
    ::poll(descriptors, 2, static_cast<int>(std::min<long long>(leftMs, 1000)));
  }
  uint64_t count = 0;
  [[maybe_unused]] ssize_t drained = ::read(wakeFd_, &count, sizeof count);  // nonblocking: empty is fine
  return true;
}

// A request pending this long is stalled or waits for a late rank: a full
// round shows every rank which ranks submitted what. Blocking calls are
// probed sooner: two ranks whose different blocking calls are both cached
// wait for each other until a full round shows the mismatch.
Clock::time_point Engine::probeDueAt() const {
  if (pending_.empty()) return Clock::time_point::max();
  Clock::time_point oldest = Clock::time_point::max(), oldestBlocking = Clock::time_point::max();
  for (const auto& request : pending_) {
    oldest = std::min(oldest, request->submitted);
    if (request->meta.kind == OpKind::Blocking) oldestBlocking = std::min(oldestBlocking, request->submitted);
  }
  const double probe = stall_->probeIntervalS();
  const Clock::time_point due = std::min(after(oldest, probe), after(oldestBlocking, kBlockingProbeS));
  return std::max(due, after(lastProbe_, std::min(probe, kBlockingProbeS)));
}

void Engine::logSummary() {
  const EngineStats s = stats();
  SHOAL_LOG_DEBUG("rank {}: the async runtime ran {} negotiation rounds in {:.3f} s ({} full, {} made requests ready, "
                  "{} started by a peer; {} looks for a peer's round while waiting), {} requests in {} collectives",
                  comm_.rank, s.cycles, seconds(Clock::now() - started_), s.fullRounds, s.readyRounds,
                  s.joinedRounds, s.peerChecks, s.tensors, s.groups);
}

bool Engine::cycle() {
  bool localShutdown = false;
  {
    std::lock_guard<std::mutex> lock(mutex_);
    localShutdown = shutdownRequested_;
    for (auto& request : incoming_) {
      pending_.push_back(request);
      pendingByName_[request->name] = request;
    }
    incoming_.clear();
  }
  const Clock::time_point start = Clock::now();
  // A round this rank only joined, with nothing of its own pending, could batch none of its
  // submissions: it does not hold back the next one. Otherwise the rank that finishes its
  // backward second, having joined the first rank's round for the last gradient a moment
  // before, would wait up to a cycle to start the round that makes that gradient ready: on
  // the step's critical path (docs/training.md, "The NCF sketch step (issue 19, seventh session)").
  if (!pending_.empty()) lastRoundStart_ = start;
  std::vector<uint64_t> words(bitWords(cache_->slots()), 0);
  bool needFullRound = false;
  for (const auto& request : pending_) {
    int index = cache_->lookup(cacheKey(request->name, request->meta), request->meta);
    if (index < 0) needFullRound = true;
    else words[1 + index / 64] |= uint64_t(1) << (index % 64);
  }
  if (start >= probeDueAt()) {
    needFullRound = true;
    lastProbe_ = start;
  }
  words[0] = ~((needFullRound ? kFlagNeedFullRound : 0) | (localShutdown ? kFlagShutdown : 0));
  exchangeFlags(comm_, takeSequence(comm_), words);
  const bool anyFullRound = !(words[0] & kFlagNeedFullRound);
  const bool anyShutdown = !(words[0] & kFlagShutdown);

  std::vector<Ready> ready;
  Clock::time_point now = Clock::now();
  uint64_t hits = 0;
  if (anyFullRound) {
    fullRound(ready, now);
  } else {
    for (size_t index = 0; index < cache_->slots(); ++index) {
      if (!(words[1 + index / 64] >> (index % 64) & 1)) continue;
      ready.push_back({pendingByName_.at(cache_->nameAt(index)), false, now});
      cache_->touch(index, cycle_);
      ++hits;
    }
  }
  const Clock::time_point negotiated = Clock::now();
  {
    std::lock_guard<std::mutex> lock(statsMutex_);
    ++stats_.cycles;
    stats_.fullRounds += anyFullRound;
    stats_.readyRounds += !ready.empty();
    stats_.joinedRounds += peerStarted_;
    stats_.cacheHits += hits;
    stats_.negotiationUs += std::chrono::duration<double, std::micro>(negotiated - start).count();
  }
  if (timeline_)
    for (const Ready& r : ready) timeline_->span(r.request->name, "NEGOTIATE", r.request->submitted, now);
  execute(ready);
  if (joinsComplete_) finishJoin();
  ++cycle_;
  if (!ready.empty() || anyFullRound)
    pending_.erase(std::remove_if(pending_.begin(), pending_.end(), [](const auto& r) { return r->done(); }),
                   pending_.end());
  if (anyShutdown) {
    stopWith(localShutdown ? SHOAL_ERR_INVALID_ARGUMENT : SHOAL_ERR_REMOTE,
             localShutdown ? "the communicator was finalized while this request was pending"
                           : "another rank finalized its communicator (shoal_comm_finalize/destroy) while this request "
                             "was pending; pending and later requests cannot complete");
    return true;
  }
  return false;
}

void Engine::fullRound(std::vector<Ready>& ready, Clock::time_point now) {
  std::vector<Announcement> mine;
  mine.reserve(pending_.size());
  for (const auto& request : pending_) mine.push_back({request->name, request->meta, seconds(now - request->submitted)});
  const std::string encoded = encodeAnnouncements(mine);
  std::vector<uint8_t> gathered;
  std::vector<size_t> counts, displs;
  allgathervBytes(comm_, encoded.data(), encoded.size(), SHOAL_U8, gathered, counts, displs);
  std::vector<std::vector<Announcement>> perRank(comm_.size);
  for (int r = 0; r < comm_.size; ++r) perRank[r] = decodeAnnouncements(gathered.data() + displs[r], counts[r]);
  Verdict verdict = decide(perRank);
  // With joined ranks a name may be pending on some ranks only: those fail it,
  // a joined rank keeps the text for its join.
  auto failHere = [&](const std::string& name, shoal_status_t status, const std::string& text) {
    auto found = pendingByName_.find(name);
    if (found != pendingByName_.end()) finish(*found->second, status, text);
    else joins_->noteError(text);
  };
  for (const auto& [name, text] : verdict.errors) failHere(name, SHOAL_ERR_MISMATCH, text);
  for (const auto& [name, text] : verdict.joinErrors) failHere(name, SHOAL_ERR_UNSUPPORTED, text);
  if (auto fatal = stall_->inspect(verdict.partial)) throw AgreedStop(stall_->fatalStatus(), *fatal);
  joins_->saw(verdict.joined, cycle_);
  joinsComplete_ = verdict.allJoined;
  for (const std::string& name : verdict.ready) {
    auto found = pendingByName_.find(name);
    // Not pending here: this rank joined and stands in (decide() says so).
    std::shared_ptr<Request> request =
        found != pendingByName_.end() ? found->second : makeStandIn(name, verdict.standIn.at(name));
    ready.push_back({request, false, Clock::now()});
    cache_->put(cacheKey(name, request->meta), name, request->meta, cycle_);
  }
}

void Engine::finishJoin() {
  joinsComplete_ = false;
  auto found = pendingByName_.find(kJoinName);
  if (found != pendingByName_.end()) {
    std::shared_ptr<Request> request = found->second;
    request->lastJoined = joins_->lastToJoin();
    const std::string& error = joins_->error();
    finish(*request, error.empty() ? SHOAL_OK : SHOAL_ERR_UNSUPPORTED,
           error.empty() ? std::string()
                         : fmt::format("{}: every rank joined, but while this rank was joined: {}",
                                       request->meta.call, error));
  }
  joins_->reset();
}

void Engine::execute(std::vector<Ready>& ready) {
  // Whether each allreduce compresses: the same answer on every rank (same
  // metadata, same registry); an unknown compressor fails its requests everywhere.
  std::vector<Ready> runnable;
  runnable.reserve(ready.size());
  for (Ready& r : ready) {
    try {
      r.compress = compresses(comm_, r.request->meta);
      runnable.push_back(r);
    } catch (const Error& error) {
      finish(*r.request, error.status(), fmt::format("tensor '{}': {}", r.request->name, error.what()));
    }
  }
  std::vector<Group> groups = planGroups(runnable, settings_.fusionThreshold);
  for (Group& group : groups) {
    for (Ready* member : group.members)
      if (!member->request->tryStart())
        fail(SHOAL_ERR_TIMEOUT, "rank {} gave up waiting for its blocking call {} before the runtime could run it",
             comm_.rank, member->request->meta.call);
    try {
      Request& head = *group.members.front()->request;
      if (onCuda(head)) {  // alone in its group (planGroups): the CUDA path
        if (timeline_) timeline_->span(head.name, "QUEUE", group.members.front()->readyAt, Clock::now());
        runCudaRequest(comm_, head, timeline_.get());
      } else {
        runGroup(comm_, group, fusionBuffer_, timeline_.get());
      }
    } catch (const Error& error) {
      std::string text = group.members.front()->request->name == kBlockingName
                             ? std::string(error.what())
                             : fmt::format("tensor '{}'{}: {}", group.members.front()->request->name,
                                           group.members.size() > 1
                                               ? fmt::format(" (fused with {} others)", group.members.size() - 1)
                                               : "",
                                           error.what());
      for (Ready* member : group.members) finish(*member->request, error.status(), text);
      if (comm_.transport->failed()) throw Error(error.status(), text);  // the communicator is gone: stop
      continue;
    }
    {
      std::lock_guard<std::mutex> lock(statsMutex_);  // before completing: a waiter may read the stats at once
      ++stats_.groups;
      stats_.tensors += group.members.size();
    }
    logGroup(comm_, group);
    for (Ready* member : group.members) finish(*member->request, SHOAL_OK, "");
  }
  if (timeline_ && !ready.empty()) timeline_->flush();
}

}  // namespace shoal::runtime
