// Sub-communicators (issue 16, part B): shoal_comm_split and
// shoal_comm_create_group. Ranks are threads over an in-memory store
// (harness.h) for the layouts, and forked processes over a tcp store on
// loopback for the store-sharing path and the failures (a dead rank, lists
// that differ). Each check reads values the new communicator can only produce
// when its membership and order are right: an allgather of the parent ranks
// and an exact integer allreduce.
#include <unistd.h>

#include <chrono>
#include <cstdint>
#include <string>
#include <thread>
#include <vector>

#include <gtest/gtest.h>

#include "harness/harness.h"
#include "multiproc/split_job.h"
#include "shoal/shoal.h"

namespace {

using shoal::test::runRanks;

// The parent ranks of comm's members in comm's rank order, by an allgather.
std::vector<int64_t> membersOf(shoal_comm_t comm, int parentRank) {
  int size = 0;
  EXPECT_EQ(shoal_comm_size(comm, &size), SHOAL_OK);
  std::vector<int64_t> all(size, -1);
  int64_t mine = parentRank;
  EXPECT_EQ(shoal_allgather(comm, &mine, all.data(), 1, SHOAL_I64), SHOAL_OK) << shoal_last_error(comm);
  return all;
}

// Sum over the members of (parent rank + 1) * 1000 + i, exactly, in i64.
void expectGroupSum(shoal_comm_t comm, int parentRank, const std::vector<int64_t>& members, size_t count = 1000) {
  std::vector<int64_t> data(count);
  for (size_t i = 0; i < count; ++i) data[i] = (parentRank + 1) * 1000 + static_cast<int64_t>(i);
  ASSERT_EQ(shoal_allreduce(comm, data.data(), data.data(), count, SHOAL_I64, SHOAL_SUM), SHOAL_OK)
      << shoal_last_error(comm);
  for (size_t i = 0; i < count; ++i) {
    int64_t expected = 0;
    for (int64_t member : members) expected += (member + 1) * 1000 + static_cast<int64_t>(i);
    ASSERT_EQ(data[i], expected) << "element " << i;
  }
}

int childRank(shoal_comm_t comm) {
  int rank = -1;
  EXPECT_EQ(shoal_comm_rank(comm, &rank), SHOAL_OK);
  return rank;
}

TEST(Split, ByParity) {
  runRanks(5, [](int rank, shoal_comm_t comm) {
    shoal_comm_t child = nullptr;
    ASSERT_EQ(shoal_comm_split(comm, rank % 2, rank, &child), SHOAL_OK) << shoal_last_error(comm);
    ASSERT_NE(child, nullptr);
    std::vector<int64_t> expected;
    for (int r = rank % 2; r < 5; r += 2) expected.push_back(r);
    EXPECT_EQ(childRank(child), rank / 2);
    EXPECT_EQ(membersOf(child, rank), expected);
    expectGroupSum(child, rank, expected);
    EXPECT_EQ(shoal_comm_destroy(child), SHOAL_OK);
  });
}

TEST(Split, ByHalves) {
  runRanks(4, [](int rank, shoal_comm_t comm) {
    shoal_comm_t child = nullptr;
    ASSERT_EQ(shoal_comm_split(comm, rank / 2, 0, &child), SHOAL_OK) << shoal_last_error(comm);
    ASSERT_NE(child, nullptr);
    std::vector<int64_t> expected = rank < 2 ? std::vector<int64_t>{0, 1} : std::vector<int64_t>{2, 3};
    EXPECT_EQ(membersOf(child, rank), expected);  // equal keys: parent order
    expectGroupSum(child, rank, expected, 100000);  // the ring, several segments
    shoal_comm_destroy(child);
  });
}

TEST(Split, KeyReversesTheOrder) {
  runRanks(4, [](int rank, shoal_comm_t comm) {
    shoal_comm_t child = nullptr;
    ASSERT_EQ(shoal_comm_split(comm, 7, -rank, &child), SHOAL_OK) << shoal_last_error(comm);
    ASSERT_NE(child, nullptr);
    EXPECT_EQ(childRank(child), 3 - rank);
    EXPECT_EQ(membersOf(child, rank), (std::vector<int64_t>{3, 2, 1, 0}));
    // A broadcast from the child's rank 0 (parent rank 3) proves the order too.
    int64_t value = rank == 3 ? 42 : -1;
    ASSERT_EQ(shoal_broadcast(child, &value, &value, 1, SHOAL_I64, 0), SHOAL_OK) << shoal_last_error(child);
    EXPECT_EQ(value, 42);
    shoal_comm_destroy(child);
  });
}

TEST(Split, UndefinedColorGetsNull) {
  runRanks(4, [](int rank, shoal_comm_t comm) {
    shoal_comm_t child = reinterpret_cast<shoal_comm_t>(&rank);  // must be overwritten
    int color = rank == 1 ? SHOAL_SPLIT_UNDEFINED : 0;
    ASSERT_EQ(shoal_comm_split(comm, color, 0, &child), SHOAL_OK) << shoal_last_error(comm);
    if (rank == 1) {
      EXPECT_EQ(child, nullptr);
    } else {
      ASSERT_NE(child, nullptr);
      std::vector<int64_t> expected{0, 2, 3};
      EXPECT_EQ(membersOf(child, rank), expected);
      expectGroupSum(child, rank, expected);
      shoal_comm_destroy(child);
    }
    // The parent still works for everyone, the left-out rank included.
    expectGroupSum(comm, rank, {0, 1, 2, 3});
  });
}

TEST(Split, GroupOfOne) {
  runRanks(3, [](int rank, shoal_comm_t comm) {
    shoal_comm_t child = nullptr;
    ASSERT_EQ(shoal_comm_split(comm, rank, 0, &child), SHOAL_OK) << shoal_last_error(comm);
    ASSERT_NE(child, nullptr);
    EXPECT_EQ(membersOf(child, rank), std::vector<int64_t>{rank});
    expectGroupSum(child, rank, {rank});
    shoal_comm_destroy(child);
  });
}

TEST(Split, CreateGroupFromSubsets) {
  runRanks(5, [](int rank, shoal_comm_t comm) {
    const int listed[] = {3, 1, 4};
    shoal_comm_t group = nullptr;
    ASSERT_EQ(shoal_comm_create_group(comm, listed, 3, &group), SHOAL_OK) << shoal_last_error(comm);
    if (rank == 0 || rank == 2) {
      EXPECT_EQ(group, nullptr);
    } else {
      ASSERT_NE(group, nullptr);
      EXPECT_EQ(childRank(group), rank == 3 ? 0 : rank == 1 ? 1 : 2);  // list order
      EXPECT_EQ(membersOf(group, rank), (std::vector<int64_t>{3, 1, 4}));
      expectGroupSum(group, rank, {3, 1, 4});
    }
    // A second group overlapping the first: both alive at once.
    const int pair[] = {0, 1};
    shoal_comm_t second = nullptr;
    ASSERT_EQ(shoal_comm_create_group(comm, pair, 2, &second), SHOAL_OK) << shoal_last_error(comm);
    EXPECT_EQ(second != nullptr, rank <= 1);
    if (second) expectGroupSum(second, rank, {0, 1});
    if (group) expectGroupSum(group, rank, {3, 1, 4});
    shoal_comm_destroy(second);
    shoal_comm_destroy(group);
  });
}

TEST(Split, Nested) {
  runRanks(8, [](int rank, shoal_comm_t comm) {
    shoal_comm_t half = nullptr;
    ASSERT_EQ(shoal_comm_split(comm, rank / 4, rank, &half), SHOAL_OK) << shoal_last_error(comm);
    ASSERT_NE(half, nullptr);
    int halfRank = childRank(half);
    shoal_comm_t quarter = nullptr;
    ASSERT_EQ(shoal_comm_split(half, halfRank % 2, halfRank, &quarter), SHOAL_OK) << shoal_last_error(half);
    ASSERT_NE(quarter, nullptr);
    // Parent ranks with the same half and the same parity.
    std::vector<int64_t> expected;
    for (int r = 0; r < 8; ++r)
      if (r / 4 == rank / 4 && r % 2 == rank % 2) expected.push_back(r);
    EXPECT_EQ(membersOf(quarter, rank), expected);
    expectGroupSum(quarter, rank, expected);
    // The grandparent goes first; the grandchild must not notice.
    shoal_comm_finalize(comm);
    shoal_comm_destroy(half);
    expectGroupSum(quarter, rank, expected);
    shoal_comm_destroy(quarter);
  });
}

TEST(Split, ParentAndChildInterleaved) {
  runRanks(4, [](int rank, shoal_comm_t comm) {
    shoal_comm_t child = nullptr;
    ASSERT_EQ(shoal_comm_split(comm, rank % 2, 0, &child), SHOAL_OK) << shoal_last_error(comm);
    ASSERT_NE(child, nullptr);
    std::vector<int64_t> group = rank % 2 ? std::vector<int64_t>{1, 3} : std::vector<int64_t>{0, 2};
    for (int round = 0; round < 5; ++round) {
      expectGroupSum(comm, rank, {0, 1, 2, 3}, 1 + round * 5000);
      expectGroupSum(child, rank, group, 1 + round * 7000);
      ASSERT_EQ(shoal_barrier(round % 2 ? child : comm), SHOAL_OK);
    }
    // Destroyed in the other order: the parent first.
    shoal_comm_finalize(comm);
    expectGroupSum(child, rank, group);
    shoal_comm_destroy(child);
  });
}

// Once the parent's async runtime runs, the split goes through its engine
// (runtime/blocking.h) like any blocking call, between async requests.
TEST(Split, AfterAsyncCallsOnTheParent) {
  runRanks(3, [](int rank, shoal_comm_t comm) {
    std::vector<int64_t> data(64, rank + 1);
    shoal_tensor_t tensor = shoal_tensor_1d(data.data(), data.size(), SHOAL_I64);
    shoal_request_t request = nullptr;
    ASSERT_EQ(shoal_iallreduce(comm, "before", &tensor, &tensor, SHOAL_SUM, nullptr, &request), SHOAL_OK)
        << shoal_last_error(comm);
    ASSERT_EQ(shoal_wait(request, 30), SHOAL_OK) << shoal_last_error(comm);
    shoal_request_free(request);
    EXPECT_EQ(data[0], 6);
    shoal_comm_t child = nullptr;
    ASSERT_EQ(shoal_comm_split(comm, rank == 0 ? 0 : 1, 0, &child), SHOAL_OK) << shoal_last_error(comm);
    ASSERT_NE(child, nullptr);
    std::vector<int64_t> expected = rank == 0 ? std::vector<int64_t>{0} : std::vector<int64_t>{1, 2};
    expectGroupSum(child, rank, expected);
    ASSERT_EQ(shoal_iallreduce(comm, "after", &tensor, &tensor, SHOAL_SUM, nullptr, &request), SHOAL_OK);
    ASSERT_EQ(shoal_wait(request, 30), SHOAL_OK) << shoal_last_error(comm);
    shoal_request_free(request);
    EXPECT_EQ(data[0], 18);
    shoal_comm_destroy(child);
  });
}

TEST(Split, BadArgumentsOnEveryRank) {
  runRanks(3, [](int rank, shoal_comm_t comm) {
    shoal_comm_t child = nullptr;
    EXPECT_EQ(shoal_comm_split(comm, 0, 0, nullptr), SHOAL_ERR_INVALID_ARGUMENT);
    // One rank's bad color: every rank refuses, naming it, and the parent lives on.
    EXPECT_EQ(shoal_comm_split(comm, rank == 2 ? -5 : 0, 0, &child), SHOAL_ERR_INVALID_ARGUMENT);
    EXPECT_NE(std::string(shoal_last_error(comm)).find("rank 2 passed color -5"), std::string::npos)
        << shoal_last_error(comm);
    EXPECT_EQ(child, nullptr);
    const int twice[] = {0, 0};
    EXPECT_EQ(shoal_comm_create_group(comm, twice, 2, &child), SHOAL_ERR_INVALID_ARGUMENT);
    EXPECT_NE(std::string(shoal_last_error(comm)).find("listed twice"), std::string::npos) << shoal_last_error(comm);
    const int outside[] = {0, 3};
    EXPECT_EQ(shoal_comm_create_group(comm, outside, 2, &child), SHOAL_ERR_INVALID_ARGUMENT);
    EXPECT_EQ(child, nullptr);
    expectGroupSum(comm, rank, {0, 1, 2});
  });
}

// ---- forked ranks over a tcp store (split_job.h) -------------------------

using shoal::test::Outcome;
using shoal::test::runJob;
using shoal::test::kTimeoutS;

// A split over processes: the child's store is the parent's tcp store, served
// by parent rank 0, which is in only one of the groups and destroys its parent
// first; the other group must keep working.
TEST(SplitProcesses, ParityOverTcpStore) {
  auto outcomes = runJob(4, [](int rank, shoal_comm_t comm, std::string& text) {
    shoal_comm_t child = nullptr;
    shoal_status_t status = shoal_comm_split(comm, rank % 2, rank, &child);
    if (status != SHOAL_OK) return text = shoal_last_error(comm), status;
    int64_t value = rank + 1;
    for (int round = 0; round < 3; ++round) {
      int64_t sum = value;
      if ((status = shoal_allreduce(child, &sum, &sum, 1, SHOAL_I64, SHOAL_SUM)) != SHOAL_OK)
        return text = shoal_last_error(child), status;
      int64_t expected = rank % 2 ? 2 + 4 : 1 + 3;
      if (sum != expected) return text = "wrong sum " + std::to_string(sum), SHOAL_ERR_INTERNAL;
      if (round == 0) shoal_comm_finalize(comm);  // the parent goes while the child works
    }
    shoal_comm_destroy(child);
    return SHOAL_OK;
  });
  ASSERT_EQ(outcomes.size(), 4u);
  for (size_t r = 0; r < outcomes.size(); ++r)
    EXPECT_EQ(outcomes[r].status, SHOAL_OK) << "rank " << r << ": " << outcomes[r].text;
}

TEST(SplitProcesses, MismatchedListsFailEveryRank) {
  auto outcomes = runJob(4, [](int rank, shoal_comm_t comm, std::string& text) {
    std::vector<int> ranks = rank == 2 ? std::vector<int>{0, 2} : std::vector<int>{0, 1};
    shoal_comm_t group = nullptr;
    shoal_status_t status = shoal_comm_create_group(comm, ranks.data(), static_cast<int>(ranks.size()), &group);
    text = shoal_last_error(comm);
    if (status != SHOAL_ERR_MISMATCH) return status == SHOAL_OK ? SHOAL_ERR_INTERNAL : status;
    // A refused split leaves the parent usable.
    int64_t one = 1;
    if (shoal_allreduce(comm, &one, &one, 1, SHOAL_I64, SHOAL_SUM) != SHOAL_OK || one != 4)
      return text = std::string("parent after the refusal: ") + shoal_last_error(comm), SHOAL_ERR_INTERNAL;
    return SHOAL_ERR_MISMATCH;
  });
  ASSERT_EQ(outcomes.size(), 4u);
  for (size_t r = 0; r < outcomes.size(); ++r) {
    EXPECT_EQ(outcomes[r].status, SHOAL_ERR_MISMATCH) << "rank " << r << ": " << outcomes[r].text;
    EXPECT_NE(outcomes[r].text.find("rank 2 passed a different list"), std::string::npos)
        << "rank " << r << ": " << outcomes[r].text;
  }
}

// A rank dies just before the split: every other rank, in its group or not,
// fails with an error (not OK, not a hang) within the deadline.
TEST(SplitProcesses, DeadRankFailsEveryRank) {
  auto outcomes = runJob(4, [](int rank, shoal_comm_t comm, std::string& text) {
    if (rank == 3) _exit(3);  // never reports
    shoal_comm_t child = nullptr;
    shoal_status_t status = shoal_comm_split(comm, rank % 2, 0, &child);
    text = shoal_last_error(comm);
    if (status == SHOAL_OK) shoal_comm_destroy(child);
    return status;
  });
  ASSERT_EQ(outcomes.size(), 4u);
  for (size_t r = 0; r < 3; ++r) {
    EXPECT_NE(outcomes[r].status, SHOAL_OK) << "rank " << r << " succeeded without rank 3";
    EXPECT_NE(outcomes[r].status, 1) << "rank " << r << " never reported (hung)";
    EXPECT_LT(outcomes[r].seconds, kTimeoutS + 10) << "rank " << r << ": " << outcomes[r].text;
  }
}

}  // namespace
