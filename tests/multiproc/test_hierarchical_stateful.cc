// Stateful compressors in the hierarchical compressed allreduce (issue 16):
// topk with error feedback and powersgd compress only the inter-host leg,
// each rank on its host shard, with state kept per (tensor, shard) from call
// to call. Forked ranks on loopback, hosts faked with SHOAL_HOST_ID
// (docs/groups.md, "Compressed hierarchical allreduce").
//
// topk: every rank gets the same bits; over T calls of the same gradients the
// outputs plus the residuals every rank keeps for its shard add up to T times
// the dense sum (error feedback loses nothing), so the running mean converges
// to the dense sum. powersgd: on matrices whose sum has rank <= r, exact up to
// rounding (its documented bound), the same on every rank, with a state the
// size of a row block. A rank with another compressor: MISMATCH everywhere.
#include <algorithm>
#include <chrono>
#include <cmath>
#include <cstdint>
#include <cstring>
#include <functional>
#include <map>
#include <string>
#include <vector>

#include <gtest/gtest.h>

#include "collectives/common/host_layout.h"
#include "collectives/common/ring.h"
#include "comm/communicator.h"
#include "multiproc/hierarchical_util.h"
#include "multiproc/split_job.h"
#include "shoal/compressor.h"

namespace {

using shoal::test::Outcome;
using shoal::test::runJob;
using shoal::test::expectAllOk;
using shoal::test::fakeHosts;
using shoal::test::sameOnEveryRank;
using shoal::test::savedState;
using shoal::test::shardKeyOf;

shoal_status_t allreduceWith(shoal_comm_t comm, const char* compressor, const char* options, const char* name,
                             shoal_tensor_t input, shoal_tensor_t output, shoal_op_t op, std::string& text) {
  shoal_allreduce_options_t o = SHOAL_ALLREDUCE_OPTIONS_INIT;
  o.compressor = compressor;
  o.compressor_options = options;
  o.name = name;
  o.compress_min_bytes = 0;
  shoal_status_t status = shoal_allreduce_tensor(comm, &input, &output, op, &o);
  if (status != SHOAL_OK) text = std::string(compressor) + ": " + shoal_last_error(comm);
  return status;
}

bool ranAcrossHosts(shoal_comm_t comm, const char* compressor, bool expected, const std::string& what,
                    std::string& text) {
  if (comm->lastStats.compressor == compressor && comm->lastStats.acrossHostsOnly == expected) return true;
  text = what + ": ran " + (comm->lastStats.acrossHostsOnly ? "across hosts only" : "flat") + " with " +
         comm->lastStats.compressor + ", expected " + (expected ? "across hosts only" : "flat");
  return false;
}

// ---- topk -------------------------------------------------------------------

float topkInput(int rank, size_t i) { return std::sin(0.37f * static_cast<float>(i) + 1.3f * rank) * (1 + rank); }

shoal_status_t checkTopk(int rank, int size, shoal_comm_t comm, std::string& text) {
  const char* options = "ratio=0.25";
  const size_t count = 1001;  // shards of 501 and 500 (2 per host), 334 and 333 (3)
  const int steps = 40;
  std::vector<float> input(count), output(count);
  for (size_t i = 0; i < count; ++i) input[i] = topkInput(rank, i);
  std::vector<double> dense(count, 0), magnitude(count, 0), sum(count, 0);
  for (int r = 0; r < size; ++r)
    for (size_t i = 0; i < count; ++i) dense[i] += topkInput(r, i), magnitude[i] += std::fabs(topkInput(r, i));
  double firstError = 0;
  for (int step = 0; step < steps; ++step) {
    const std::string what = "topk step " + std::to_string(step);
    shoal_status_t status =
        allreduceWith(comm, "topk", options, "grad", shoal_tensor_1d(input.data(), count, SHOAL_F32),
                      shoal_tensor_1d(output.data(), count, SHOAL_F32), SHOAL_SUM, text);
    if (status != SHOAL_OK) return status;
    if (!ranAcrossHosts(comm, "topk", true, what, text)) return SHOAL_ERR_INTERNAL;
    if ((status = sameOnEveryRank(comm, output.data(), count * sizeof(float), what, text))) return status;
    for (size_t i = 0; i < count; ++i) sum[i] += output[i];
    if (step == 0)
      for (size_t i = 0; i < count; ++i) firstError = std::max(firstError, std::fabs(output[i] - dense[i]));
  }
  // The residual is kept for the shard, in the shard's size; none for the whole tensor.
  const shoal::ring::Block shard =
      shoal::ring::blockOf(count, static_cast<int>(comm->hosts->local.size()), comm->hosts->localRank);
  std::vector<uint8_t> state;
  if (!savedState(comm, "topk", options, shardKeyOf(comm, "grad"), state, text)) return SHOAL_ERR_INTERNAL;
  if (state.size() != shard.count * sizeof(float))
    return text = "the shard's residual has " + std::to_string(state.size()) + " bytes, expected " +
                  std::to_string(shard.count * sizeof(float)),
           SHOAL_ERR_INTERNAL;
  size_t unused = 0;
  if (shoal_compressor_state_save(comm, "topk", options, "grad", nullptr, &unused) != SHOAL_ERR_NOT_FOUND)
    return text = "topk kept a state for the whole tensor 'grad' too", SHOAL_ERR_INTERNAL;
  // Every shard's residuals, summed over its ranks (one per host), by a dense allreduce.
  std::vector<double> residuals(count, 0);
  for (size_t i = 0; i < shard.count; ++i) {
    float e;
    std::memcpy(&e, state.data() + i * sizeof(float), sizeof e);
    residuals[shard.offset + i] = e;
  }
  if (shoal_allreduce(comm, residuals.data(), residuals.data(), count, SHOAL_F64, SHOAL_SUM) != SHOAL_OK)
    return text = shoal_last_error(comm), SHOAL_ERR_INTERNAL;
  // Error feedback loses nothing: outputs + residuals == steps x the dense sum, up to f32 rounding.
  double lastError = 0;
  for (size_t i = 0; i < count; ++i) {
    const double exact = steps * dense[i];
    if (!(std::fabs(sum[i] + residuals[i] - exact) <= 1e-4 * steps * magnitude[i] + 1e-6))
      return text = "element " + std::to_string(i) + ": outputs " + std::to_string(sum[i]) + " + residuals " +
                    std::to_string(residuals[i]) + " != " + std::to_string(steps) + " x dense " +
                    std::to_string(dense[i]),
             SHOAL_ERR_INTERNAL;
    lastError = std::max(lastError, std::fabs(sum[i] / steps - dense[i]));
  }
  // And the running mean converges to the dense sum.
  if (!(firstError > 0) || !(lastError <= 0.25 * firstError))
    return text = "the mean of " + std::to_string(steps) + " outputs is off the dense sum by " +
                  std::to_string(lastError) + ", the first output by " + std::to_string(firstError) +
                  ": error feedback should shrink it",
           SHOAL_ERR_INTERNAL;
  return SHOAL_OK;
}

class HierarchicalTopk : public ::testing::TestWithParam<const char*> {};

TEST_P(HierarchicalTopk, SameEverywhereAndErrorFeedbackLosesNothing) {
  const std::string layout = GetParam();
  const int n = static_cast<int>(layout.size());
  auto outcomes = runJob(
      n, [&](int rank, shoal_comm_t comm, std::string& text) { return checkTopk(rank, n, comm, text); },
      fakeHosts(layout));
  expectAllOk(outcomes, n);
}

INSTANTIATE_TEST_SUITE_P(Layouts, HierarchicalTopk, ::testing::Values("aabb", "abab", "aaabbb"));

// ---- powersgd ---------------------------------------------------------------

// Rank w's matrix at a step: U C_w V^T with U [rows x 2], V [cols x 2]: the
// sum over ranks has rank <= 2, below powersgd's rank 4. (C_w is not linear in
// w, or a middle host's sum would equal the hosts' average: a zero residual.)
float lowRankInput(int rank, int step, size_t i, size_t j) {
  const double u0 = std::sin(0.7 * i), u1 = std::cos(0.45 * i + 1);
  const double v0 = std::cos(0.3 * j), v1 = std::sin(0.9 * j + 2);
  const double s = 1 + 0.25 * step;
  const double c00 = s * (1 + rank), c01 = 0.5, c10 = -0.3 * rank * rank, c11 = s * (2 - 0.2 * rank);
  return static_cast<float>(u0 * (c00 * v0 + c01 * v1) + u1 * (c10 * v0 + c11 * v1));
}

shoal_tensor_t matrix(std::vector<float>& data, size_t rows, size_t cols) {
  shoal_tensor_t tensor = shoal_tensor_1d(data.data(), data.size(), SHOAL_F32);
  tensor.ndim = 2;
  tensor.shape[0] = static_cast<int64_t>(rows);
  tensor.shape[1] = static_cast<int64_t>(cols);
  return tensor;
}

shoal_status_t checkPowerSgd(int rank, int size, shoal_comm_t comm, std::string& text) {
  const char* options = "rank=4";
  const size_t rows = 61, cols = 40;  // row blocks of 31 and 30 rows (2 per host), 21, 20, 20 (3)
  std::vector<float> input(rows * cols), output(rows * cols);
  for (int step = 0; step < 4; ++step) {
    const shoal_op_t op = step == 3 ? SHOAL_AVG : SHOAL_SUM;
    const std::string what = std::string("powersgd step ") + std::to_string(step) + " " + shoal_op_name(op);
    for (size_t i = 0; i < rows; ++i)
      for (size_t j = 0; j < cols; ++j) input[i * cols + j] = lowRankInput(rank, step, i, j);
    shoal_status_t status = allreduceWith(comm, "powersgd", options, "weight", matrix(input, rows, cols),
                                          matrix(output, rows, cols), op, text);
    if (status != SHOAL_OK) return status;
    if (!ranAcrossHosts(comm, "powersgd", true, what, text)) return SHOAL_ERR_INTERNAL;
    if ((status = sameOnEveryRank(comm, output.data(), output.size() * sizeof(float), what, text))) return status;
    // The sum has rank <= r: exact up to rounding (compressors/powersgd/powersgd.cc).
    double largest = 0;
    std::vector<double> exact(rows * cols, 0);
    for (size_t e = 0; e < exact.size(); ++e) {
      for (int r = 0; r < size; ++r) exact[e] += lowRankInput(r, step, e / cols, e % cols);
      if (op == SHOAL_AVG) exact[e] /= size;
      largest = std::max(largest, std::fabs(exact[e]));
    }
    for (size_t e = 0; e < exact.size(); ++e)
      if (!(std::fabs(output[e] - exact[e]) <= 1e-4 * largest))
        return text = what + ", element (" + std::to_string(e / cols) + ", " + std::to_string(e % cols) + "): " +
                      std::to_string(output[e]) + " vs dense " + std::to_string(exact[e]),
               SHOAL_ERR_INTERNAL;
    // The state is the shard's: its error vector (a row block) and Q [cols x r], kept between steps.
    const size_t shardRows =
        shoal::ring::blockOf(rows, static_cast<int>(comm->hosts->local.size()), comm->hosts->localRank).count;
    std::vector<uint8_t> state;
    if (!savedState(comm, "powersgd", options, shardKeyOf(comm, "weight"), state, text)) return SHOAL_ERR_INTERNAL;
    const size_t expected = 4 * shardRows * cols + 4 * cols * 4 + 40;
    if (state.size() != expected)
      return text = what + ": the shard's state has " + std::to_string(state.size()) + " bytes, a [" +
                    std::to_string(shardRows) + " x " + std::to_string(cols) + "] row block's has " +
                    std::to_string(expected),
             SHOAL_ERR_INTERNAL;
    // Error feedback is on: a rank's residual (its matrix minus the group's
    // approximation of the average) is not zero where the ranks' matrices differ.
    bool residual = false;
    for (size_t e = 0; e < shardRows * cols && !residual; ++e) {
      float value;
      std::memcpy(&value, state.data() + 4 * e, sizeof value);
      residual = std::fabs(value) > 1e-3;
    }
    if (!residual) return text = what + ": the shard's error vector is all zero", SHOAL_ERR_INTERNAL;
  }
  size_t unused = 0;
  if (shoal_compressor_state_save(comm, "powersgd", options, "weight", nullptr, &unused) != SHOAL_ERR_NOT_FOUND)
    return text = "powersgd kept a state for the whole tensor 'weight' too", SHOAL_ERR_INTERNAL;

  // A matrix with fewer rows than a host has ranks has no row block per rank:
  // it runs flat (rank 0 says so at info), and stays right. ([1 x 64] at rank 4
  // rides densely: the exact sum up to f32 rounding.)
  std::vector<float> row(64), rowOut(64);
  for (size_t j = 0; j < row.size(); ++j) row[j] = lowRankInput(rank, 0, 0, j);
  shoal_status_t status =
      allreduceWith(comm, "powersgd", options, "bias-row", matrix(row, 1, 64), matrix(rowOut, 1, 64), SHOAL_SUM, text);
  if (status != SHOAL_OK) return status;
  if (!ranAcrossHosts(comm, "powersgd", false, "powersgd [1 x 64]", text)) return SHOAL_ERR_INTERNAL;
  for (size_t j = 0; j < row.size(); ++j) {
    double exact = 0, magnitude = 0;
    for (int r = 0; r < size; ++r) exact += lowRankInput(r, 0, 0, j), magnitude += std::fabs(lowRankInput(r, 0, 0, j));
    if (!(std::fabs(rowOut[j] - exact) <= 1e-6 * magnitude + 1e-30))
      return text = "powersgd [1 x 64], element " + std::to_string(j) + ": " + std::to_string(rowOut[j]) + " vs " +
                    std::to_string(exact),
             SHOAL_ERR_INTERNAL;
  }
  return SHOAL_OK;
}

class HierarchicalPowerSgd : public ::testing::TestWithParam<const char*> {};

TEST_P(HierarchicalPowerSgd, RowBlocksExactOnLowRankAndSameEverywhere) {
  const std::string layout = GetParam();
  const int n = static_cast<int>(layout.size());
  auto outcomes = runJob(
      n, [&](int rank, shoal_comm_t comm, std::string& text) { return checkPowerSgd(rank, n, comm, text); },
      fakeHosts(layout));
  expectAllOk(outcomes, n);
}

INSTANTIATE_TEST_SUITE_P(Layouts, HierarchicalPowerSgd, ::testing::Values("aabb", "abab", "aaabbb", "aabbcc"));

// ---- agreement ----------------------------------------------------------------

// One rank names another compressor (both across hosts now): MISMATCH on
// every rank, promptly.
void expectMismatch(const std::function<const char*(int rank)>& compressorOf) {
  const int n = 4;
  auto outcomes = runJob(
      n,
      [&](int rank, shoal_comm_t comm, std::string& text) {
        std::vector<float> input(64 * 64), output(64 * 64);
        for (size_t i = 0; i < input.size(); ++i) input[i] = topkInput(rank, i);
        auto begin = shoal::test::Clock::now();
        shoal_status_t status = allreduceWith(comm, compressorOf(rank), nullptr, "grad", matrix(input, 64, 64),
                                              matrix(output, 64, 64), SHOAL_SUM, text);
        double seconds = std::chrono::duration<double>(shoal::test::Clock::now() - begin).count();
        if (status == SHOAL_OK) return text = "succeeded", SHOAL_ERR_INTERNAL;
        if (seconds > 5) return text = "took " + std::to_string(seconds) + " s: " + text, SHOAL_ERR_INTERNAL;
        return status;
      },
      fakeHosts("aabb"));
  ASSERT_EQ(outcomes.size(), static_cast<size_t>(n));
  for (int r = 0; r < n; ++r) {
    EXPECT_EQ(outcomes[r].status, SHOAL_ERR_MISMATCH) << "rank " << r << ": " << outcomes[r].text;
    EXPECT_NE(outcomes[r].text.find("disagree"), std::string::npos) << "rank " << r << ": " << outcomes[r].text;
  }
}

TEST(HierarchicalStatefulMismatch, TopkAgainstFp16) {
  expectMismatch([](int rank) { return rank == 3 ? "fp16" : "topk"; });
}

TEST(HierarchicalStatefulMismatch, PowerSgdAgainstTopk) {
  expectMismatch([](int rank) { return rank == 1 ? "topk" : "powersgd"; });
}

}  // namespace
