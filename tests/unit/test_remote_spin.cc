// How long a wait for peers on other hosts spins before it sleeps, carried from
// one wait to the next (lib/transport/ucx/remote_spin.h). The transport's own
// waits are checked across emulated hosts by ctest multiproc.netns_two_hosts
// (the idle polls before each sleep, from SHOAL_LOG_LEVEL=debug).
#include <gtest/gtest.h>

#include <chrono>

#include "transport/ucx/remote_spin.h"

namespace {

using shoal::RemoteSpin;
using namespace std::chrono_literals;

constexpr size_t kSegment = size_t(256) << 10;  // the ring's segment

TEST(RemoteSpin, AFreshTransportSpinsInFull) {
  EXPECT_EQ(RemoteSpin().rounds(kSegment), RemoteSpin::kFullRounds);
  EXPECT_GT(RemoteSpin::kFullRounds, RemoteSpin::kShortRounds);
}

// Data streaming in at the link's pace: every wait sleeps for milliseconds, so
// after the first, each spins only kShortRounds.
TEST(RemoteSpin, StreamingWaitsSpinShort) {
  RemoteSpin spin;
  for (int wait = 0; wait < 5; ++wait) {
    spin.sleptWait(2ms);
    EXPECT_EQ(spin.rounds(kSegment), RemoteSpin::kShortRounds) << "after wait " << wait;
  }
}

// A reply that came soon after the wait fell asleep would have been caught by
// a full spin: the next wait spins in full again (small-message latency).
TEST(RemoteSpin, AReplySoonAfterSleepingRestoresTheFullSpin) {
  RemoteSpin spin;
  spin.sleptWait(5ms);  // a straggler
  ASSERT_EQ(spin.rounds(kSegment), RemoteSpin::kShortRounds);
  spin.sleptWait(10us);
  EXPECT_EQ(spin.rounds(kSegment), RemoteSpin::kFullRounds);
  spin.sleptWait(RemoteSpin::kPaysWithin);
  EXPECT_EQ(spin.rounds(kSegment), RemoteSpin::kFullRounds);
  spin.sleptWait(RemoteSpin::kPaysWithin + 1us);
  EXPECT_EQ(spin.rounds(kSegment), RemoteSpin::kShortRounds);
}

// Small messages are latency-bound: their waits spin in full even while
// large ones spin short (after a straggler, say).
TEST(RemoteSpin, SmallMessagesAlwaysSpinInFull) {
  RemoteSpin spin;
  spin.sleptWait(5ms);
  EXPECT_EQ(spin.rounds(kSegment), RemoteSpin::kShortRounds);
  EXPECT_EQ(spin.rounds(RemoteSpin::kStreamingBytes), RemoteSpin::kShortRounds);
  EXPECT_EQ(spin.rounds(RemoteSpin::kStreamingBytes - 1), RemoteSpin::kFullRounds);
  EXPECT_EQ(spin.rounds(8), RemoteSpin::kFullRounds);
}

// The window lies between a full spin (under a microsecond per poll: 8.6 us
// for 50 across emulated hosts) and the time a 256 KiB ring segment takes at
// 10 Gbit/s.
TEST(RemoteSpin, TheWindowOutlastsAFullSpin) {
  EXPECT_GE(RemoteSpin::kPaysWithin, std::chrono::microseconds(RemoteSpin::kFullRounds));
  EXPECT_LT(RemoteSpin::kPaysWithin, 210us);
}

}  // namespace
