// shoal_join (Horovod's join for uneven data), ranks as threads: ranks run
// different numbers of steps, joined ranks stand in with zeros, the sums are
// exact, join names the last rank; collectives a joined rank cannot stand in
// for fail with text on every rank; a join that times out can be resumed.
#include <gtest/gtest.h>

#include <chrono>
#include <string>
#include <thread>
#include <vector>

#include "harness/harness.h"
#include "harness/rank_sync.h"
#include "runtime/async_helpers.h"
#include "runtime/join.h"
#include "runtime/negotiation.h"
#include "shoal/shoal.h"

namespace shoal::test {
namespace {

constexpr double kWaitS = 60;
constexpr int kTensors = 4;

// Small integers: exact in float and in fp16, in every summation order.
float valueOf(int rank, int step, int tensor, size_t element) {
  return static_cast<float>((rank + 1) * (step + 1) + tensor + static_cast<int>(element % 3));
}

// One training loop: `steps[rank]` steps of kTensors named allreduces (one
// averaged, one through fp16), then join. Checks every step's result against
// the ranks that still had that step, and join's last rank.
void unevenLoop(const std::vector<int>& steps, int expectedLast) {
  const int ranks = static_cast<int>(steps.size());
  runRanks(ranks, [&](int rank, shoal_comm_t comm) {
    constexpr size_t kCount = 6;
    for (int step = 0; step < steps[rank]; ++step) {
      std::vector<std::vector<float>> data(kTensors, std::vector<float>(kCount));
      std::vector<shoal_request_t> requests;
      for (int t = 0; t < kTensors; ++t) {
        for (size_t i = 0; i < kCount; ++i) data[t][i] = valueOf(rank, step, t, i);
        shoal_tensor_t tensor = tensorOf(data[t].data(), SHOAL_F32, {2, 3});
        shoal_async_options_t options = SHOAL_ASYNC_OPTIONS_INIT;
        options.compressor = t == 2 ? "fp16" : "none";
        options.compress_min_bytes = 0;
        const std::string name = "grad." + std::to_string(t);
        shoal_request_t request = nullptr;
        if (!callOk(shoal_iallreduce(comm, name.c_str(), &tensor, &tensor, t == 1 ? SHOAL_AVG : SHOAL_SUM, &options,
                                     &request),
                    comm, name.c_str()))
          return;
        requests.push_back(request);
      }
      if (waitAndFree(requests, kWaitS, "rank " + std::to_string(rank) + " step " + std::to_string(step)) > 0) return;
      for (int t = 0; t < kTensors; ++t)
        for (size_t i = 0; i < kCount; ++i) {
          float sum = 0;
          for (int r = 0; r < ranks; ++r)
            if (step < steps[r]) sum += valueOf(r, step, t, i);  // joined ranks add zeros
          const float expected = t == 1 ? sum / static_cast<float>(ranks) : sum;  // average over the world
          ASSERT_FLOAT_EQ(data[t][i], expected) << "rank " << rank << " step " << step << " tensor " << t;
        }
    }
    int last = -2;
    ASSERT_TRUE(callOk(shoal_join(comm, kWaitS, &last), comm, "shoal_join"));
    EXPECT_EQ(last, expectedLast) << "rank " << rank;
  });
}

// decide(): a joined rank counts as a submitter of every allreduce, never of other collectives.
TEST(AsyncJoin, DecideTreatsJoinedRanksAsSubmittersOfAllreducesOnly) {
  using namespace runtime;
  Metadata sum;
  sum.shape = {4};
  Metadata gather = sum;
  gather.kind = OpKind::Allgather;
  Metadata join;
  join.kind = OpKind::Join;
  std::vector<std::vector<Announcement>> perRank = {
      {{"a", sum, 0}, {"g", gather, 0}, {"only0", sum, 0}},
      {{kJoinName, join, 0}},
      {{"a", sum, 0}, {"g", gather, 0}},
  };
  Verdict v = decide(perRank);
  EXPECT_EQ(v.joined, std::vector<int>{1});
  EXPECT_FALSE(v.allJoined);
  EXPECT_EQ(v.ready, std::vector<std::string>{"a"});
  ASSERT_EQ(v.standIn.count("a"), 1u);
  EXPECT_EQ(v.standIn.at("a"), sum);
  ASSERT_EQ(v.joinErrors.size(), 1u);
  EXPECT_EQ(v.joinErrors[0].first, "g");
  EXPECT_NE(v.joinErrors[0].second.find("rank(s) 1 called shoal_join"), std::string::npos) << v.joinErrors[0].second;
  ASSERT_EQ(v.partial.size(), 1u);  // rank 2 has not submitted it and has not joined
  EXPECT_EQ(v.partial[0].name, "only0");
  EXPECT_EQ(v.partial[0].missing, std::vector<int>{2});
  // Everyone joined: the joins complete; a name some ranks left pending is stood in for.
  perRank[0] = {{"x", sum, 0}, {kJoinName, join, 0}};
  perRank[2] = {{kJoinName, join, 0}};
  v = decide(perRank);
  EXPECT_TRUE(v.allJoined);
  EXPECT_EQ(v.ready, std::vector<std::string>{"x"});
  // Every rank has submitted: no stand-in.
  perRank = {{{"y", sum, 0}}, {{"y", sum, 0}}};
  v = decide(perRank);
  EXPECT_TRUE(v.joined.empty());
  EXPECT_TRUE(v.standIn.empty());
  EXPECT_EQ(v.ready, std::vector<std::string>{"y"});
}

TEST(AsyncJoin, JoinTrackerNamesTheLastRankTiesToTheHighest) {
  runtime::JoinTracker tracker(3);
  tracker.saw({1}, 4);
  tracker.saw({0, 1}, 9);
  EXPECT_EQ(tracker.lastToJoin(), 0);
  tracker.saw({0, 1, 2}, 9);
  EXPECT_EQ(tracker.lastToJoin(), 2);  // 0 and 2 both first seen in cycle 9
  tracker.reset();
  EXPECT_EQ(tracker.lastToJoin(), -1);
}

TEST(AsyncJoin, UnevenStepsFinishWithExactSumsAndNameTheLastRank) {
  ScopedEnv env({{"SHOAL_FUSION_THRESHOLD", "0"}});
  unevenLoop({3, 5, 8}, 2);
}

TEST(AsyncJoin, UnevenStepsWithFusion) {
  ScopedEnv env({{"SHOAL_FUSION_THRESHOLD", "1048576"}});
  unevenLoop({6, 2, 4}, 0);
}

TEST(AsyncJoin, EvenStepsAndTwoJoinsInARow) {
  runRanks(2, [&](int rank, shoal_comm_t comm) {
    for (int epoch = 0; epoch < 2; ++epoch) {
      const int steps = epoch == 0 ? (rank == 0 ? 4 : 1) : (rank == 0 ? 1 : 3);
      for (int step = 0; step < steps; ++step) {
        std::vector<int32_t> x(5, rank + 1);
        shoal_tensor_t tensor = tensorOf(x.data(), SHOAL_I32, {5});
        shoal_request_t request = nullptr;
        if (!callOk(shoal_iallreduce(comm, "x", &tensor, &tensor, SHOAL_SUM, nullptr, &request), comm, "x")) return;
        std::vector<shoal_request_t> requests{request};
        if (waitAndFree(requests, kWaitS, "x") > 0) return;
        const bool otherHasStep = epoch == 0 ? step < (rank == 0 ? 1 : 4) : step < (rank == 0 ? 3 : 1);
        EXPECT_EQ(x[0], (rank + 1) + (otherHasStep ? 2 - rank : 0)) << "epoch " << epoch << " step " << step;
      }
      int last = -2;
      ASSERT_TRUE(callOk(shoal_join(comm, kWaitS, &last), comm, "shoal_join"));
      EXPECT_EQ(last, epoch == 0 ? 0 : 1) << "rank " << rank << " epoch " << epoch;
    }
    // Every rank joined: plain requests work as before.
    std::vector<float> y(3, 1.0f);
    shoal_tensor_t tensor = tensorOf(y.data(), SHOAL_F32, {3});
    shoal_request_t request = nullptr;
    ASSERT_TRUE(callOk(shoal_iallreduce(comm, "y", &tensor, &tensor, SHOAL_SUM, nullptr, &request), comm, "y"));
    EXPECT_EQ(shoal_wait(request, kWaitS), SHOAL_OK) << shoal_request_error(request);
    shoal_request_free(request);
    EXPECT_EQ(y[0], 2.0f);
  });
}

TEST(AsyncJoin, CollectivesAJoinedRankCannotStandInForFailOnEveryRank) {
  runRanks(2, [&](int rank, shoal_comm_t comm) {
    if (rank == 0) {
      int last = -2;
      EXPECT_EQ(shoal_join(comm, kWaitS, &last), SHOAL_ERR_UNSUPPORTED);
      const std::string text = shoal_last_error(comm);
      EXPECT_NE(text.find("while this rank was joined"), std::string::npos) << text;
      EXPECT_NE(text.find("'gathered'"), std::string::npos) << text;
      EXPECT_EQ(last, -1);
      return;
    }
    std::vector<float> in(4, 1.0f), out(8, 0.0f);
    shoal_tensor_t tensor = tensorOf(in.data(), SHOAL_F32, {4});
    struct Case {
      const char* name;
      shoal_request_t request;
      const char* expected;
    };
    std::vector<Case> cases;
    shoal_request_t request = nullptr;
    ASSERT_TRUE(callOk(shoal_iallgather(comm, "gathered", &tensor, out.data(), &request), comm, "iallgather"));
    cases.push_back({"gathered", request, "cannot stand in for an allgather"});
    ASSERT_TRUE(callOk(shoal_ibroadcast(comm, "sent", &tensor, 1, &request), comm, "ibroadcast"));
    cases.push_back({"sent", request, "cannot stand in for a broadcast"});
    std::vector<float> m(4, 3.0f);
    shoal_tensor_t tm = tensorOf(m.data(), SHOAL_F32, {4});
    ASSERT_TRUE(callOk(shoal_iallreduce(comm, "maxed", &tm, &tm, SHOAL_MAX, nullptr, &request), comm, "max"));
    cases.push_back({"maxed", request, "not the identity of op max"});
    for (Case& item : cases) {
      EXPECT_EQ(shoal_wait(item.request, kWaitS), SHOAL_ERR_UNSUPPORTED) << item.name;
      const std::string text = shoal_request_error(item.request);
      EXPECT_NE(text.find("rank(s) 0 called shoal_join"), std::string::npos) << text;
      EXPECT_NE(text.find(item.expected), std::string::npos) << text;
      shoal_request_free(item.request);
    }
    // A blocking call: its peers' arguments never reach the joined rank.
    EXPECT_EQ(shoal_allreduce(comm, in.data(), in.data(), in.size(), SHOAL_F32, SHOAL_SUM), SHOAL_ERR_UNSUPPORTED);
    const std::string blocking = shoal_last_error(comm);
    EXPECT_NE(blocking.find("cannot stand in for a blocking call"), std::string::npos) << blocking;
    // A sum still works with the joined rank's zeros.
    std::vector<float> s(4, 5.0f);
    shoal_tensor_t ts = tensorOf(s.data(), SHOAL_F32, {4});
    ASSERT_TRUE(callOk(shoal_iallreduce(comm, "summed", &ts, &ts, SHOAL_SUM, nullptr, &request), comm, "sum"));
    EXPECT_EQ(shoal_wait(request, kWaitS), SHOAL_OK) << shoal_request_error(request);
    shoal_request_free(request);
    EXPECT_EQ(s[0], 5.0f);
    int last = -2;
    EXPECT_EQ(shoal_join(comm, kWaitS, &last), SHOAL_OK) << shoal_last_error(comm);
    EXPECT_EQ(last, 1);
  });
}

TEST(AsyncJoin, ATimedOutJoinStaysJoinedAndResumes) {
  runRanks(2, [&](int rank, shoal_comm_t comm) {
    ASSERT_TRUE(callOk(shoal_async_start(comm), comm, "shoal_async_start"));
    if (rank == 0) {
      int last = -2;
      EXPECT_EQ(shoal_join(comm, 0.3, &last), SHOAL_ERR_TIMEOUT);
      const std::string text = shoal_last_error(comm);
      EXPECT_NE(text.find("stays joined"), std::string::npos) << text;
      ASSERT_TRUE(callOk(shoal_join(comm, kWaitS, &last), comm, "second shoal_join"));
      EXPECT_EQ(last, 1);
      return;
    }
    std::this_thread::sleep_for(std::chrono::milliseconds(800));
    std::vector<float> s(2, 7.0f);  // rank 0 joined: it stands in for this one
    shoal_tensor_t ts = tensorOf(s.data(), SHOAL_F32, {2});
    shoal_request_t request = nullptr;
    ASSERT_TRUE(callOk(shoal_iallreduce(comm, "late", &ts, &ts, SHOAL_SUM, nullptr, &request), comm, "late"));
    EXPECT_EQ(shoal_wait(request, kWaitS), SHOAL_OK) << shoal_request_error(request);
    shoal_request_free(request);
    EXPECT_EQ(s[0], 7.0f);
    int last = -2;
    ASSERT_TRUE(callOk(shoal_join(comm, kWaitS, &last), comm, "shoal_join"));
    EXPECT_EQ(last, 1);
  });
}

}  // namespace
}  // namespace shoal::test
