// Point-to-point between forked processes (issue 16): a bad argument to
// shoal_send / shoal_recv / shoal_sendrecv_many on one rank (a NULL buffer, a
// bad dtype, a peer or tag out of range) fails its peer's matching call at
// once with the refusing rank's reason, and a send and receive of different
// sizes fail on both sides: never a wait until SHOAL_TIMEOUT_S. Afterwards
// the communicator is failed on both ranks (docs/collectives.md,
// "send, recv, sendrecv_many"): the next call says so.
#include <cstdlib>
#include <functional>
#include <string>
#include <vector>

#include <gtest/gtest.h>

#include "multiproc/split_job.h"
#include "shoal/shoal.h"

namespace {

using shoal::test::Outcome;

constexpr double kTimeoutS = 30;  // SHOAL_TIMEOUT_S of the ranks
constexpr double kPromptS = 10;   // from the job's start (init included): well before the deadline

using Side = std::function<shoal_status_t(shoal_comm_t comm, float* data)>;

struct Sides {
  Outcome call, next;  // the call's status and text; the following barrier's
};

// Rank 0 runs `first`, rank 1 `second`; then each tries a barrier.
std::vector<Sides> runPair(const Side& first, const Side& second) {
  shoal::test::ShoalJobOptions options;
  options.timeoutS = kTimeoutS;
  options.unset = {"SHOAL_ALGO"};
  auto outcomes = shoal::test::runJob(
      2,
      [&](int rank, shoal_comm_t comm, std::string& text) {
        std::vector<float> data(8, 1.0f);
        const shoal_status_t status = rank == 0 ? first(comm, data.data()) : second(comm, data.data());
        text = shoal_last_error(comm);
        const shoal_status_t next = shoal_barrier(comm);
        // The barrier's status and text follow the call's, after a marker line.
        text += "\n--next " + std::to_string(static_cast<int>(next)) + "\n" + shoal_last_error(comm);
        return status;
      },
      nullptr, options);
  std::vector<Sides> sides(outcomes.size());
  for (size_t rank = 0; rank < outcomes.size(); ++rank) {
    const std::string& text = outcomes[rank].text;
    const size_t marker = text.find("\n--next ");
    sides[rank].call = outcomes[rank];
    if (marker == std::string::npos) continue;  // the rank never reported: the status checks fail
    sides[rank].call.text = text.substr(0, marker);
    const std::string rest = text.substr(marker + 8);
    sides[rank].next.status = std::atoi(rest.c_str());
    sides[rank].next.text = rest.substr(rest.find('\n') + 1);
  }
  return sides;
}

void expectStatus(const Outcome& outcome, shoal_status_t status, const std::string& what,
                  std::initializer_list<std::string> words) {
  EXPECT_EQ(outcome.status, status) << what << ": " << shoal_status_string(static_cast<shoal_status_t>(outcome.status))
                                    << ": " << outcome.text;
  for (const std::string& word : words)
    EXPECT_NE(outcome.text.find(word), std::string::npos) << what << ": lacks '" << word << "': " << outcome.text;
  EXPECT_LT(outcome.seconds, kPromptS) << what << " took " << outcome.seconds << " s: " << outcome.text;
}

// Both ranks' next call fails: the communicator failed with the refusal.
void expectFailedAfter(const std::vector<Sides>& sides, const std::string& what, const std::string& cause) {
  for (size_t rank = 0; rank < sides.size(); ++rank)
    expectStatus(sides[rank].next, SHOAL_ERR_REMOTE, what + ", rank " + std::to_string(rank) + "'s next call",
                 {"failed earlier", cause});
}

// Rank 0 refuses `bad`; rank 1's matching call fails at once, naming rank 0's refusal.
void expectRefusalReachesThePeer(const Side& bad, const Side& peer, const std::string& words) {
  auto sides = runPair(bad, peer);
  ASSERT_EQ(sides.size(), 2u);
  expectStatus(sides[0].call, SHOAL_ERR_INVALID_ARGUMENT, words + " (refusing rank)", {words});
  expectStatus(sides[1].call, SHOAL_ERR_REMOTE, words + " (peer)", {"rank 0 refused its point-to-point call", words});
  expectFailedAfter(sides, words, words);
}

shoal_status_t receiveFour(shoal_comm_t comm, float* data) { return shoal_recv(comm, data, 4, SHOAL_F32, 0, 5); }
shoal_status_t sendFour(shoal_comm_t comm, float* data) { return shoal_send(comm, data, 4, SHOAL_F32, 1, 5); }

TEST(PointToPointRefusal, RefusedSendFailsTheWaitingReceive) {
  expectRefusalReachesThePeer([](shoal_comm_t comm, float*) { return shoal_send(comm, nullptr, 4, SHOAL_F32, 1, 5); },
                              receiveFour, "buf is NULL");
}

TEST(PointToPointRefusal, RefusedReceiveFailsTheWaitingSend) {
  // Rank 1 sends to rank 0, which refuses its receive (dtype 42 is no shoal_dtype_t).
  expectRefusalReachesThePeer(
      [](shoal_comm_t comm, float* data) { return shoal_recv(comm, data, 4, static_cast<shoal_dtype_t>(42), 1, 5); },
      [](shoal_comm_t comm, float* data) { return shoal_send(comm, data, 4, SHOAL_F32, 0, 5); }, "dtype 42");
}

TEST(PointToPointRefusal, PeerOutOfRangeStillReachesTheWaitingRank) {
  expectRefusalReachesThePeer([](shoal_comm_t comm, float* data) { return shoal_send(comm, data, 4, SHOAL_F32, 2, 5); },
                              receiveFour, "peer 2 is not a rank");
}

TEST(PointToPointRefusal, ABadOperationInAGroupFailsThePeersGroup) {
  expectRefusalReachesThePeer(
      [](shoal_comm_t comm, float* data) {
        shoal_p2p_t ops[2] = {{SHOAL_P2P_SEND, 1, 5, data, 4, SHOAL_F32}, {SHOAL_P2P_RECV, 1, -3, data + 4, 4, SHOAL_F32}};
        return shoal_sendrecv_many(comm, ops, 2);
      },
      [](shoal_comm_t comm, float* data) {
        shoal_p2p_t ops[2] = {{SHOAL_P2P_RECV, 0, 5, data, 4, SHOAL_F32}, {SHOAL_P2P_SEND, 0, 6, data + 4, 4, SHOAL_F32}};
        return shoal_sendrecv_many(comm, ops, 2);
      },
      "ops[1]: tag -3");
}

// Not a refusal (each side's arguments are valid), a disagreement: both
// sides fail with MISMATCH, the receiver naming both counts.
TEST(PointToPointRefusal, SizeMismatchFailsBothSides) {
  auto sides = runPair([](shoal_comm_t comm, float* data) { return shoal_send(comm, data, 5, SHOAL_F32, 1, 5); },
                       receiveFour);
  ASSERT_EQ(sides.size(), 2u);
  expectStatus(sides[0].call, SHOAL_ERR_MISMATCH, "sender", {"same count and dtype"});
  expectStatus(sides[1].call, SHOAL_ERR_MISMATCH, "receiver", {"rank 0 sends 5 x float with tag 5", "receives 4 x float"});
  for (size_t rank = 0; rank < 2; ++rank)
    EXPECT_NE(sides[rank].next.status, SHOAL_OK) << "rank " << rank << "'s next call: " << sides[rank].next.text;
}

// The matching pair still works between processes (the tests above fail for the reason they name).
TEST(PointToPointRefusal, ValidPairSucceeds) {
  auto sides = runPair(sendFour, receiveFour);
  ASSERT_EQ(sides.size(), 2u);
  for (size_t rank = 0; rank < 2; ++rank) {
    EXPECT_EQ(sides[rank].call.status, SHOAL_OK) << "rank " << rank << ": " << sides[rank].call.text;
    EXPECT_EQ(sides[rank].next.status, SHOAL_OK) << "rank " << rank << ": " << sides[rank].next.text;
  }
}

}  // namespace
