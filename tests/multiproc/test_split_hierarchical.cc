// The hierarchical allreduce (collectives/allreduce/hierarchical.cc) on
// emulated hosts: forked ranks on loopback, each told its host by
// SHOAL_HOST_ID. Integers must come out exact; floats within the error of
// summing in another order; avg, max and odd sizes too. An irregular layout
// (3 + 1) must fall back to the flat algorithms and stay correct. CUDA is not
// involved: the hierarchical path is the host path (docs/groups.md).
#include <chrono>
#include <cmath>
#include <cstdint>
#include <functional>
#include <string>
#include <vector>

#include <gtest/gtest.h>

#include "comm/communicator.h"
#include "comm/hosts.h"
#include "shoal/compressor.h"
#include "collectives/common/host_layout.h"
#include "multiproc/split_job.h"

namespace {

using shoal::test::Outcome;
using shoal::test::runJob;

// Every rank's host id from a layout string: "aabb" = ranks 0, 1 on host a.
std::function<std::map<std::string, std::string>(int)> hostsFrom(const std::string& layout,
                                                                 const std::string& algorithm) {
  return [=](int rank) {
    return std::map<std::string, std::string>{{"SHOAL_HOST_ID", std::string("host-") + layout[rank]},
                                              {"SHOAL_ALGO", algorithm},
                                              {"SHOAL_HIER_MIN_BYTES", "4096"}};
  };
}

int64_t intInput(int rank, size_t i) { return static_cast<int64_t>((i * 7919 + rank * 104729) % 1000003) - 500000; }
float floatInput(int rank, size_t i) { return std::sin(0.001f * static_cast<float>(i) + rank) * (1 + rank); }

// Runs sum (i64, f32), avg (f32) and max (i32) allreduces at several sizes;
// returns the first wrong element as text.
shoal_status_t checkAllreduces(int rank, int size, shoal_comm_t comm, std::string& text) {
  for (size_t count : {size_t(1), size_t(3), size_t(1000), size_t(65537), size_t(1 << 20)}) {
    std::vector<int64_t> ints(count);
    for (size_t i = 0; i < count; ++i) ints[i] = intInput(rank, i);
    shoal_status_t status = shoal_allreduce(comm, ints.data(), ints.data(), count, SHOAL_I64, SHOAL_SUM);
    if (status != SHOAL_OK) return text = shoal_last_error(comm), status;
    for (size_t i = 0; i < count; ++i) {
      int64_t expected = 0;
      for (int r = 0; r < size; ++r) expected += intInput(r, i);
      if (ints[i] != expected)
        return text = "i64 sum, count " + std::to_string(count) + ", element " + std::to_string(i) + ": " +
                      std::to_string(ints[i]) + " != " + std::to_string(expected),
               SHOAL_ERR_INTERNAL;
    }
    for (shoal_op_t op : {SHOAL_SUM, SHOAL_AVG}) {
      std::vector<float> input(count), output(count);
      for (size_t i = 0; i < count; ++i) input[i] = floatInput(rank, i);
      status = shoal_allreduce(comm, input.data(), output.data(), count, SHOAL_F32, op);  // out of place
      if (status != SHOAL_OK) return text = shoal_last_error(comm), status;
      for (size_t i = 0; i < count; ++i) {
        double exact = 0, magnitude = 0;
        for (int r = 0; r < size; ++r) exact += floatInput(r, i), magnitude += std::fabs(floatInput(r, i));
        if (op == SHOAL_AVG) exact /= size, magnitude /= size;
        // size - 1 additions in some order, plus the division: a few units of roundoff.
        double bound = (size + 1) * 6e-8 * magnitude + 1e-30;
        if (!(std::fabs(output[i] - exact) <= bound))
          return text = std::string(op == SHOAL_SUM ? "f32 sum" : "f32 avg") + ", count " + std::to_string(count) +
                        ", element " + std::to_string(i) + ": " + std::to_string(output[i]) + " vs " +
                        std::to_string(exact),
                 SHOAL_ERR_INTERNAL;
      }
    }
    std::vector<int32_t> maxes(count);
    for (size_t i = 0; i < count; ++i) maxes[i] = static_cast<int32_t>(intInput(rank, i));
    status = shoal_allreduce(comm, maxes.data(), maxes.data(), count, SHOAL_I32, SHOAL_MAX);
    if (status != SHOAL_OK) return text = shoal_last_error(comm), status;
    for (size_t i = 0; i < count; ++i) {
      int32_t expected = INT32_MIN;
      for (int r = 0; r < size; ++r) expected = std::max(expected, static_cast<int32_t>(intInput(r, i)));
      if (maxes[i] != expected) return text = "i32 max, element " + std::to_string(i), SHOAL_ERR_INTERNAL;
    }
  }
  return SHOAL_OK;
}

// What auto picks for a large message, and whether the layout is hierarchical.
std::string autoChoice(shoal_comm_t comm) {
  return std::string(shoal::chooseAllreduce(*comm, 8 << 20).name) +
         (comm->hosts && comm->hosts->hierarchical() ? "/hierarchical-layout" : "/flat-layout");
}

void expectAllOk(const std::vector<Outcome>& outcomes, size_t n) {
  ASSERT_EQ(outcomes.size(), n);
  for (size_t r = 0; r < n; ++r) EXPECT_EQ(outcomes[r].status, SHOAL_OK) << "rank " << r << ": " << outcomes[r].text;
}

// layout, algorithm, what auto must choose for 8 MiB on that layout.
struct Case {
  const char* layout;
  const char* algorithm;
  const char* choice;
};

class Hierarchical : public ::testing::TestWithParam<Case> {};

TEST_P(Hierarchical, CorrectAndChosenAsExpected) {
  const Case c = GetParam();
  const int n = static_cast<int>(std::string(c.layout).size());
  auto outcomes = runJob(
      n,
      [&](int rank, shoal_comm_t comm, std::string& text) {
        std::string choice = autoChoice(comm);
        if (std::string(c.algorithm) == "auto" && choice != c.choice)
          return text = "auto chose " + choice + ", expected " + c.choice, SHOAL_ERR_INTERNAL;
        return checkAllreduces(rank, n, comm, text);
      },
      hostsFrom(c.layout, c.algorithm));
  expectAllOk(outcomes, n);
}

INSTANTIATE_TEST_SUITE_P(
    Layouts, Hierarchical,
    ::testing::Values(Case{"aabb", "hierarchical", ""}, Case{"aabb", "auto", "hierarchical/hierarchical-layout"},
                      Case{"abab", "auto", "hierarchical/hierarchical-layout"},  // hosts not contiguous in rank
                      Case{"aaabbb", "hierarchical", ""},
                      Case{"aaab", "auto", "ring/flat-layout"},       // 3 + 1: irregular, flat
                      Case{"aaab", "hierarchical", ""},               // asked for, falls back to the ring
                      Case{"abcd", "auto", "ring/flat-layout"}),      // one rank per host: nothing to gain
    [](const ::testing::TestParamInfo<Case>& info) {
      return std::string(info.param.layout) + "_" + info.param.algorithm;
    });

// A sub-communicator inherits its members' hosts: halves of "aabbaabb" by
// rank / 4 are each 2 hosts x 2 ranks again.
TEST(HierarchicalSplit, ChildInheritsTheLayout) {
  auto outcomes = runJob(
      8,
      [](int rank, shoal_comm_t comm, std::string& text) {
        shoal_comm_t half = nullptr;
        shoal_status_t status = shoal_comm_split(comm, rank / 4, rank, &half);
        if (status != SHOAL_OK) return text = shoal_last_error(comm), status;
        std::string choice = autoChoice(half);
        if (choice != "hierarchical/hierarchical-layout") return text = "child: auto chose " + choice, SHOAL_ERR_INTERNAL;
        std::vector<int64_t> data(100000);
        for (size_t i = 0; i < data.size(); ++i) data[i] = intInput(rank, i);
        status = shoal_allreduce(half, data.data(), data.data(), data.size(), SHOAL_I64, SHOAL_SUM);
        if (status != SHOAL_OK) return text = shoal_last_error(half), status;
        for (size_t i = 0; i < data.size(); ++i) {
          int64_t expected = 0;
          for (int r = rank / 4 * 4; r < rank / 4 * 4 + 4; ++r) expected += intInput(r, i);
          if (data[i] != expected) return text = "element " + std::to_string(i), SHOAL_ERR_INTERNAL;
        }
        shoal_comm_destroy(half);
        return SHOAL_OK;
      },
      hostsFrom("aabbaabb", "auto"));
  expectAllOk(outcomes, 8);
}


// ---- Compressed allreduces on hosts (issue 16) ------------------------------
// Where the layout is hierarchical and the size takes the hierarchical
// algorithm, a stateless compressor compresses only the inter-host leg: dense
// inside each host, its rounds across hosts on each rank's shard, dense again
// inside. The sketch stays exact; fp16 stays within its declared bound; and
// the call's statistics say which way it went.

// Sparse, small integers: every rank's nonzeros at its own stride, so that
// sums are exact in f32 and the host sums stay sparse enough for the sketch.
float sparseInput(int rank, size_t i) {
  return (i + 13 * static_cast<size_t>(rank)) % 101 == 0 ? static_cast<float>(1 + i % 7 + rank) : 0.0f;
}

// Whether this call should have compressed across hosts only: the size the
// communicator runs hierarchically, on a hierarchical layout, with at least
// one element per rank of a host.
bool expectAcrossHosts(shoal_comm_t comm, size_t count) {
  return comm->hosts && comm->hosts->hierarchical() && count >= comm->hosts->local.size() &&
         shoal::chooseAllreduce(*comm, count * sizeof(float)).run == shoal::allreduceHierarchical;
}

shoal_status_t compressedAllreduce(shoal_comm_t comm, const char* compressor, std::vector<float>& input,
                                   std::vector<float>& output, shoal_op_t op, std::string& text) {
  shoal_tensor_t in = shoal_tensor_1d(input.data(), input.size(), SHOAL_F32);
  shoal_tensor_t out = shoal_tensor_1d(output.data(), output.size(), SHOAL_F32);
  shoal_allreduce_options_t options = SHOAL_ALLREDUCE_OPTIONS_INIT;
  options.compressor = compressor;
  options.compress_min_bytes = 0;
  shoal_status_t status = shoal_allreduce_tensor(comm, &in, &out, op, &options);
  if (status != SHOAL_OK) text = std::string(compressor) + ": " + shoal_last_error(comm);
  return status;
}

shoal_status_t checkCompressed(int rank, int size, shoal_comm_t comm, std::string& text) {
  const shoal_compressor_t* fp16 = nullptr;
  if (shoal_compressor_lookup("fp16", &fp16) != SHOAL_OK) return text = "no fp16 compressor", SHOAL_ERR_INTERNAL;
  int acrossHosts = 0;
  for (size_t count : {size_t(1), size_t(7), size_t(1000), size_t(70001), size_t(1 << 19)}) {
    const bool expected = expectAcrossHosts(comm, count);
    auto checkPath = [&](const char* compressor) {
      if (comm->lastStats.compressor != compressor || comm->lastStats.acrossHostsOnly != expected)
        return text = std::string(compressor) + ", count " + std::to_string(count) + ": ran " +
                      (comm->lastStats.acrossHostsOnly ? "across hosts only" : "flat") + " with " +
                      comm->lastStats.compressor + ", expected " + (expected ? "across hosts only" : "flat"),
               false;
      return true;
    };
    // The sketch: lossless, so the exact sum, and the average of it.
    for (shoal_op_t op : {SHOAL_SUM, SHOAL_AVG}) {
      std::vector<float> input(count), output(count, -1.0f);
      for (size_t i = 0; i < count; ++i) input[i] = sparseInput(rank, i);
      if (shoal_status_t status = compressedAllreduce(comm, "sketch", input, output, op, text)) return status;
      if (!checkPath("sketch")) return SHOAL_ERR_INTERNAL;
      for (size_t i = 0; i < count; ++i) {
        float exact = 0;
        for (int r = 0; r < size; ++r) exact += sparseInput(r, i);
        if (op == SHOAL_AVG) exact /= static_cast<float>(size);
        // avg: the sum is exact; dividing it may round differently by an ulp.
        const double slack = op == SHOAL_AVG ? 1.2e-7 * std::fabs(exact) : 0.0;
        if (!(std::fabs(output[i] - exact) <= slack))
          return text = std::string("sketch ") + shoal_op_name(op) + ", count " + std::to_string(count) +
                        ", element " + std::to_string(i) + ": " + std::to_string(output[i]) + " != " +
                        std::to_string(exact),
                 SHOAL_ERR_INTERNAL;
      }
    }
    // fp16: within its declared bound, error_bound x n x sum |x|.
    std::vector<float> input(count), output(count, -1.0f);
    for (size_t i = 0; i < count; ++i) input[i] = floatInput(rank, i);
    if (shoal_status_t status = compressedAllreduce(comm, "fp16", input, output, SHOAL_SUM, text)) return status;
    if (!checkPath("fp16")) return SHOAL_ERR_INTERNAL;
    for (size_t i = 0; i < count; ++i) {
      double exact = 0, magnitude = 0;
      for (int r = 0; r < size; ++r) exact += floatInput(r, i), magnitude += std::fabs(floatInput(r, i));
      if (!(std::fabs(output[i] - exact) <= fp16->error_bound * size * magnitude))
        return text = "fp16, count " + std::to_string(count) + ", element " + std::to_string(i) + ": " +
                      std::to_string(output[i]) + " vs " + std::to_string(exact),
               SHOAL_ERR_INTERNAL;
    }
    acrossHosts += expected;
  }
  // The largest count takes the hierarchical algorithm on every hierarchical layout here.
  if (comm->hosts && comm->hosts->hierarchical() && acrossHosts == 0)
    return text = "no call compressed across hosts only", SHOAL_ERR_INTERNAL;
  return SHOAL_OK;
}

class HierarchicalCompressed : public ::testing::TestWithParam<Case> {};

TEST_P(HierarchicalCompressed, InterHostLegOnlyExactOrWithinBound) {
  const Case c = GetParam();
  const int n = static_cast<int>(std::string(c.layout).size());
  auto outcomes = runJob(
      n, [&](int rank, shoal_comm_t comm, std::string& text) { return checkCompressed(rank, n, comm, text); },
      hostsFrom(c.layout, c.algorithm));
  expectAllOk(outcomes, n);
}

INSTANTIATE_TEST_SUITE_P(
    Layouts, HierarchicalCompressed,
    ::testing::Values(Case{"aabb", "hierarchical", ""}, Case{"abab", "auto", ""}, Case{"aaabbb", "auto", ""},
                      Case{"aabbcc", "auto", ""},  // 3 hosts x 2
                      Case{"aaab", "auto", ""}),   // irregular: flat, compressed over every rank
    [](const ::testing::TestParamInfo<Case>& info) {
      return std::string(info.param.layout) + "_" + info.param.algorithm;
    });

// A rank that compresses with another compressor, or not at all, fails the
// call with MISMATCH on every rank, promptly: its signature differs from the
// first message of the host leg on.
void expectCompressedMismatch(const std::function<const char*(int rank)>& compressorOf) {
  const int n = 4;
  auto outcomes = runJob(
      n,
      [&](int rank, shoal_comm_t comm, std::string& text) {
        std::vector<float> input(1 << 18), output(1 << 18);
        for (size_t i = 0; i < input.size(); ++i) input[i] = sparseInput(rank, i);
        auto begin = shoal::test::Clock::now();
        shoal_status_t status = compressedAllreduce(comm, compressorOf(rank), input, output, SHOAL_SUM, text);
        double seconds = std::chrono::duration<double>(shoal::test::Clock::now() - begin).count();
        if (status == SHOAL_OK) return text = "succeeded", SHOAL_ERR_INTERNAL;
        if (seconds > 5) return text = "took " + std::to_string(seconds) + " s: " + text, SHOAL_ERR_INTERNAL;
        return status;
      },
      hostsFrom("aabb", "auto"));
  ASSERT_EQ(outcomes.size(), static_cast<size_t>(n));
  for (int r = 0; r < n; ++r) {
    EXPECT_EQ(outcomes[r].status, SHOAL_ERR_MISMATCH) << "rank " << r << ": " << outcomes[r].text;
    EXPECT_NE(outcomes[r].text.find("disagree"), std::string::npos) << "rank " << r << ": " << outcomes[r].text;
  }
}

TEST(HierarchicalCompressedMismatch, AnotherCompressorOnOneRank) {
  expectCompressedMismatch([](int rank) { return rank == 3 ? "fp16" : "sketch"; });
}

TEST(HierarchicalCompressedMismatch, PlainOnOneRank) {
  expectCompressedMismatch([](int rank) { return rank == 1 ? "none" : "fp16"; });
}
}  // namespace
