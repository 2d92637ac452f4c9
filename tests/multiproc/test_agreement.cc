// Every call agrees on every rank or fails on every rank (issue 12, items 1
// and 2): ranks that disagree on a call's dtype (also of the same size), op,
// root, allgather dtype, or on whether it is compressed, all fail with
// SHOAL_ERR_MISMATCH and text that names what differs, promptly (long before
// the deadline), never with SHOAL_OK and wrong data. Ranks are forked
// processes over a tcp store on loopback (comm/agree.h explains the mechanism).
#include <unistd.h>

#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <functional>
#include <map>
#include <string>
#include <vector>

#include <gtest/gtest.h>

#include "multiproc/split_job.h"
#include "shoal/shoal.h"

namespace {

using shoal::test::Outcome;  // a shoal_status_t (1: the rank never reported), its text, its time

constexpr double kTimeoutS = 30;     // SHOAL_TIMEOUT_S of the ranks
constexpr double kPromptS = 10;      // a mismatch must be reported well before it
constexpr double kJobDeadlineS = 60; // then the test kills what is left

using Body = std::function<shoal_status_t(int rank, int size, shoal_comm_t comm)>;
using Environment = std::function<std::map<std::string, std::string>(int rank)>;

// Forks n ranks (multiproc/split_job.h); each sets its environment, joins a
// communicator, runs body and reports its status and shoal_last_error text.
std::vector<Outcome> runJob(int n, const Body& body, const Environment& environment = nullptr) {
  shoal::test::ShoalJobOptions options;
  options.timeoutS = kTimeoutS;
  options.deadlineS = kJobDeadlineS;
  options.unset = {"SHOAL_COMPRESSOR", "SHOAL_COMPRESSOR_OPTS", "SHOAL_COMPRESS_MIN_BYTES", "SHOAL_ALGO"};
  return shoal::test::runJob(
      n,
      [&](int rank, shoal_comm_t comm, std::string& text) {
        shoal_status_t status = body(rank, n, comm);
        const char* error = shoal_last_error(comm);
        text = status == SHOAL_OK ? "" : (error ? error : "");
        return status;
      },
      environment, options);
}

// Every rank failed with MISMATCH, promptly, with text that mentions `word`.
void expectMismatchEverywhere(const std::vector<Outcome>& outcomes, const std::string& word) {
  ASSERT_FALSE(outcomes.empty());
  for (size_t rank = 0; rank < outcomes.size(); ++rank) {
    const Outcome& outcome = outcomes[rank];
    if (std::getenv("SHOAL_TEST_VERBOSE"))  // to read every rank's text
      std::printf("rank %zu (%.2f s): %s\n", rank, outcome.seconds, outcome.text.c_str());
    EXPECT_EQ(outcome.status, SHOAL_ERR_MISMATCH)
        << "rank " << rank << " returned " << outcome.status << " ("
        << shoal_status_string(static_cast<shoal_status_t>(outcome.status)) << "): " << outcome.text;
    EXPECT_NE(outcome.text.find(word), std::string::npos) << "rank " << rank << "'s text lacks '" << word
                                                          << "': " << outcome.text;
    EXPECT_LT(outcome.seconds, kPromptS) << "rank " << rank << " took " << outcome.seconds << " s: " << outcome.text;
  }
}

class Agreement : public ::testing::TestWithParam<int> {};

TEST_P(Agreement, AllreduceDtypeOfTheSameSize) {
  auto outcomes = runJob(GetParam(), [](int rank, int, shoal_comm_t comm) {
    std::vector<float> data(6, 1.0f);
    return shoal_allreduce(comm, data.data(), data.data(), data.size(), rank == 1 ? SHOAL_I32 : SHOAL_F32, SHOAL_SUM);
  });
  expectMismatchEverywhere(outcomes, "dtype");
}

TEST_P(Agreement, AllreduceHalfTheElementsOfTwiceTheSize) {
  auto outcomes = runJob(GetParam(), [](int rank, int, shoal_comm_t comm) {
    std::vector<float> data(8, 1.0f);
    return rank == 1 ? shoal_allreduce(comm, data.data(), data.data(), 16, SHOAL_F16, SHOAL_SUM)
                     : shoal_allreduce(comm, data.data(), data.data(), 8, SHOAL_F32, SHOAL_SUM);
  });
  expectMismatchEverywhere(outcomes, "dtype");
}

TEST_P(Agreement, AllreduceSumAgainstMax) {
  auto outcomes = runJob(GetParam(), [](int rank, int, shoal_comm_t comm) {
    std::vector<float> data(6, 1.0f);
    return shoal_allreduce(comm, data.data(), data.data(), data.size(), SHOAL_F32, rank == 1 ? SHOAL_MAX : SHOAL_SUM);
  });
  expectMismatchEverywhere(outcomes, "op");
}

TEST_P(Agreement, LargeAllreduceDtype) {  // the ring: many segments, no agreement round
  auto outcomes = runJob(GetParam(), [](int rank, int, shoal_comm_t comm) {
    std::vector<float> data(1 << 18, 1.0f);
    return shoal_allreduce(comm, data.data(), data.data(), data.size(), rank == 1 ? SHOAL_I32 : SHOAL_F32, SHOAL_SUM);
  });
  expectMismatchEverywhere(outcomes, "dtype");
}

TEST_P(Agreement, ReduceScatterSumAgainstMax) {
  auto outcomes = runJob(GetParam(), [](int rank, int size, shoal_comm_t comm) {
    std::vector<float> send(4 * size, 1.0f), recv(4);
    return shoal_reduce_scatter(comm, send.data(), recv.data(), 4, SHOAL_F32, rank == 1 ? SHOAL_MAX : SHOAL_SUM);
  });
  expectMismatchEverywhere(outcomes, "op");
}

TEST_P(Agreement, AllgatherDtype) {
  auto outcomes = runJob(GetParam(), [](int rank, int size, shoal_comm_t comm) {
    std::vector<float> send(5, 1.0f), recv(5 * size);
    return shoal_allgather(comm, send.data(), recv.data(), 5, rank == 1 ? SHOAL_U32 : SHOAL_F32);
  });
  expectMismatchEverywhere(outcomes, "dtype");
}

TEST_P(Agreement, BroadcastRoot) {
  auto outcomes = runJob(GetParam(), [](int rank, int, shoal_comm_t comm) {
    std::vector<float> data(6, static_cast<float>(rank));
    return shoal_broadcast(comm, data.data(), data.data(), data.size(), SHOAL_F32, rank == 1 ? 1 : 0);
  });
  expectMismatchEverywhere(outcomes, "root");
}

TEST_P(Agreement, BroadcastDtype) {
  auto outcomes = runJob(GetParam(), [](int rank, int, shoal_comm_t comm) {
    std::vector<float> data(6, 1.0f);
    return shoal_broadcast(comm, data.data(), data.data(), data.size(), rank == 1 ? SHOAL_I32 : SHOAL_F32, 0);
  });
  expectMismatchEverywhere(outcomes, "dtype");
}

// Issue 12 item 2: a 24-byte tensor, fp16, min-bytes 0 on rank 1 and 65536 elsewhere.
TEST_P(Agreement, CompressedOnOneRankPlainOnAnother) {
  auto outcomes = runJob(
      GetParam(),
      [](int, int, shoal_comm_t comm) {
        std::vector<float> data(6, 1.0f);
        return shoal_allreduce(comm, data.data(), data.data(), data.size(), SHOAL_F32, SHOAL_SUM);
      },
      [](int rank) {
        return std::map<std::string, std::string>{{"SHOAL_COMPRESSOR", "fp16"},
                                                  {"SHOAL_COMPRESS_MIN_BYTES", rank == 1 ? "0" : "65536"}};
      });
  expectMismatchEverywhere(outcomes, "compress");
}

TEST_P(Agreement, CompressorOnOneRankNoneOnAnother) {  // a large tensor: the plain ranks run the ring
  auto outcomes = runJob(
      GetParam(),
      [](int, int, shoal_comm_t comm) {
        std::vector<float> data(1 << 16, 1.0f);
        return shoal_allreduce(comm, data.data(), data.data(), data.size(), SHOAL_F32, SHOAL_SUM);
      },
      [](int rank) {
        return std::map<std::string, std::string>{{"SHOAL_COMPRESSOR", rank == 1 ? "topk" : "none"},
                                                  {"SHOAL_COMPRESSOR_OPTS", rank == 1 ? "ratio=0.1,ef=0" : ""},
                                                  {"SHOAL_COMPRESS_MIN_BYTES", "0"}};
      });
  expectMismatchEverywhere(outcomes, "compress");
}

TEST_P(Agreement, TwoCompressors) {
  auto outcomes = runJob(
      GetParam(),
      [](int, int, shoal_comm_t comm) {
        std::vector<float> data(4096, 1.0f);
        return shoal_allreduce(comm, data.data(), data.data(), data.size(), SHOAL_F32, SHOAL_SUM);
      },
      [](int rank) {
        return std::map<std::string, std::string>{{"SHOAL_COMPRESSOR", rank == 1 ? "bf16" : "fp16"},
                                                  {"SHOAL_COMPRESS_MIN_BYTES", "0"}};
      });
  expectMismatchEverywhere(outcomes, "compress");
}

// One compressor, its options differing (the sketch's exact=0 changes its
// payloads' layout): every rank's signature carries the options, so MISMATCH.
TEST_P(Agreement, SameCompressorOtherOptions) {
  auto outcomes = runJob(
      GetParam(),
      [](int rank, int, shoal_comm_t comm) {
        std::vector<float> data(4096, rank % 2 ? 0.0f : 1.5f);
        return shoal_allreduce(comm, data.data(), data.data(), data.size(), SHOAL_F32, SHOAL_SUM);
      },
      [](int rank) {
        return std::map<std::string, std::string>{{"SHOAL_COMPRESSOR", "sketch"},
                                                  {"SHOAL_COMPRESSOR_OPTS", rank == 1 ? "exact=0" : ""},
                                                  {"SHOAL_COMPRESS_MIN_BYTES", "0"}};
      });
  expectMismatchEverywhere(outcomes, "compress");
}

// The control: ranks that agree get exact results from every collective, and
// the communicator stays usable across calls of every kind.
TEST_P(Agreement, AgreeingRanksSucceed) {
  auto outcomes = runJob(GetParam(), [](int rank, int size, shoal_comm_t comm) {
    for (size_t count : {size_t(1), size_t(6), size_t(1000), size_t(1) << 18}) {
      std::vector<float> data(count, static_cast<float>(rank + 1));
      shoal_status_t status = shoal_allreduce(comm, data.data(), data.data(), count, SHOAL_F32, SHOAL_SUM);
      if (status != SHOAL_OK) return status;
      for (float value : data)
        if (value != size * (size + 1) / 2.0f) return SHOAL_ERR_INTERNAL;
    }
    std::vector<int> value(3, rank == 2 % size ? 7 : 0);
    shoal_status_t status = shoal_broadcast(comm, value.data(), value.data(), 3, SHOAL_I32, 2 % size);
    if (status != SHOAL_OK) return status;
    if (value[0] != 7 || value[2] != 7) return SHOAL_ERR_INTERNAL;
    std::vector<int> gathered(2 * size), mine(2, rank);
    status = shoal_allgather(comm, mine.data(), gathered.data(), 2, SHOAL_I32);
    if (status != SHOAL_OK) return status;
    for (int r = 0; r < size; ++r)
      if (gathered[2 * r] != r) return SHOAL_ERR_INTERNAL;
    return shoal_barrier(comm);
  });
  ASSERT_FALSE(outcomes.empty());
  for (size_t rank = 0; rank < outcomes.size(); ++rank)
    EXPECT_EQ(outcomes[rank].status, SHOAL_OK) << "rank " << rank << ": " << outcomes[rank].text;
}

INSTANTIATE_TEST_SUITE_P(Ranks, Agreement, ::testing::Values(2, 4),
                         [](const ::testing::TestParamInfo<int>& info) {
                           return std::to_string(info.param) + "ranks";
                         });

}  // namespace
