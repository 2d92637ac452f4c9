// How long a wait for peers on other hosts spins before it sleeps on the
// worker's event fd (lib/transport/ucx/ucx_transport.cc), carried from one wait
// to the next.
//
// Spinning pays when a reply is already on its way (a small message's round
// trip); it is waste while data streams in at the link's pace, where every
// wait of a large ring (one per 256 KiB segment) sleeps anyway. Each idle poll
// is a ucp_worker_progress, i.e. an epoll_wait: spinning the full
// kFullRounds at the start of every wait cost a 64 MiB allreduce across two
// emulated hosts at 1 Gbit/s about 10,000 of them per rank and call, 2.3-5.3x
// what the carried short spin costs (at ~0.17 us each, about 2 ms of CPU per
// rank and call: docs/benchmarks.md, "Waiting ranks' CPU across hosts, third
// pass"). So the next wait spins only kShortRounds when the last wait that
// slept had its data come long after it fell asleep (more than kPaysWithin: a
// full spin would not have caught it either), and the full kFullRounds again
// once a wait's data came within kPaysWithin of its first sleep (replies on
// their way: spinning may catch the next one). A wait that never slept leaves
// the choice as it is. A
// wait that receives less than kStreamingBytes always spins in full: small messages are
// latency-bound, and one late peer (a straggler) must not cost the next small
// call a wake-up.
#pragma once

#include <chrono>
#include <cstddef>

namespace shoal {

class RemoteSpin {
 public:
  static constexpr unsigned kFullRounds = 50;
  static constexpr unsigned kShortRounds = 2;
  // Longer than kFullRounds idle polls take (a ucp_worker_progress with an
  // epoll_wait each: 50 took 8.6 us across emulated hosts), shorter than a
  // 256 KiB segment takes at 10 Gbit/s (210 us).
  static constexpr std::chrono::microseconds kPaysWithin{50};

  // A 64 KiB message takes 52 us at 10 Gbit/s: what a wait for less spends
  // is the round trip, not the link's pace.
  static constexpr size_t kStreamingBytes = size_t(64) << 10;

  // Idle polls the next wait, receiving `bytes` in all, spins before it sleeps.
  unsigned rounds(size_t bytes) const { return bytes < kStreamingBytes ? kFullRounds : rounds_; }
  // A wait that slept is complete, `sinceFirstSleep` after it first fell asleep.
  void sleptWait(std::chrono::steady_clock::duration sinceFirstSleep) {
    rounds_ = sinceFirstSleep <= kPaysWithin ? kFullRounds : kShortRounds;
  }

 private:
  unsigned rounds_ = kFullRounds;
};

}  // namespace shoal
