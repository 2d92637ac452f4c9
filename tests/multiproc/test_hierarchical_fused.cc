// The async runtime's fused groups in the hierarchical allreduce (issue 16):
// where ranks span hosts with several per host, a fused compressed group
// takes the path a blocking call would, compressing only the cross-host leg,
// with state per (tensor, shard). Forked ranks on loopback, hosts faked with
// SHOAL_HOST_ID, SHOAL_ALGO=hierarchical (docs/groups.md, "Fused groups").
//
// On two hosts every cross-host sum has two terms, so the bits of a tensor's
// result do not depend on the group it was fused with: fp16 and topk fused
// async equal per-tensor blocking calls bit for bit, step after step, while
// the groups' membership changes (topk's residuals then prove that state
// follows the tensor). Uncompressed groups (compressor none) already ran the
// fusion buffer hierarchically: they equal the blocking call of that buffer.
#include <cmath>
#include <cstring>
#include <string>
#include <vector>

#include <gtest/gtest.h>

#include "collectives/common/ring.h"
#include "multiproc/hierarchical_util.h"

namespace {

using namespace shoal::test;

constexpr double kWaitS = 20;

float valueOf(int tensor, int rank, int step, size_t i) {
  return std::sin(0.37f * static_cast<float>(i) + 1.3f * rank + 0.7f * tensor + 0.11f * step) * (1 + rank);
}

// Three tensors of a step: 1-D, a matrix, 1-D again (counts that shard unevenly).
struct Tensors {
  std::vector<std::vector<float>> input, output;
  std::vector<std::vector<int64_t>> shapes{{1001}, {37, 13}, {4096}};
  Tensors(int rank, int step) {
    for (int t = 0; t < 3; ++t) {
      size_t count = 1;
      for (int64_t extent : shapes[t]) count *= static_cast<size_t>(extent);
      input.emplace_back(count);
      output.emplace_back(count, -1.0f);
      for (size_t i = 0; i < count; ++i) input[t][i] = valueOf(t, rank, step, i);
    }
  }
  shoal_tensor_t in(int t) { return shaped(input[t].data(), shapes[t]); }
  shoal_tensor_t out(int t) { return shaped(output[t].data(), shapes[t]); }
};

shoal_status_t blockingCall(shoal_comm_t comm, const char* compressor, const char* options, const std::string& name,
                            shoal_tensor_t input, shoal_tensor_t output, shoal_op_t op, std::string& text) {
  shoal_allreduce_options_t o = SHOAL_ALLREDUCE_OPTIONS_INIT;
  o.compressor = compressor;
  o.compressor_options = options;
  o.name = name.c_str();
  o.compress_min_bytes = 0;
  shoal_status_t status = shoal_allreduce_tensor(comm, &input, &output, op, &o);
  if (status != SHOAL_OK) text = "blocking " + name + ": " + shoal_last_error(comm);
  return status;
}

// Submits the listed tensors (in that order on every rank) and waits for all;
// *fusedInOne is whether they ran as one group.
shoal_status_t asyncStep(shoal_comm_t comm, const char* compressor, const char* options, const std::string& prefix,
                         Tensors& tensors, const std::vector<int>& which, shoal_op_t op, bool* fusedInOne,
                         std::string& text) {
  shoal_async_stats_t before = SHOAL_ASYNC_STATS_INIT, after = SHOAL_ASYNC_STATS_INIT;
  if (shoal_async_stats(comm, &before) != SHOAL_OK) return text = shoal_last_error(comm), SHOAL_ERR_INTERNAL;
  std::vector<shoal_request_t> requests;
  shoal_async_options_t o = SHOAL_ASYNC_OPTIONS_INIT;
  o.compressor = compressor;
  o.compressor_options = options;
  o.compress_min_bytes = 0;
  for (int t : which) {
    shoal_tensor_t in = tensors.in(t), out = tensors.out(t);
    shoal_request_t request = nullptr;
    const std::string name = prefix + std::to_string(t);
    if (shoal_status_t status = shoal_iallreduce(comm, name.c_str(), &in, &out, op, &o, &request))
      return text = "submitting " + name + ": " + shoal_last_error(comm), status;
    requests.push_back(request);
  }
  shoal_status_t status = shoal_wait_all(requests.data(), static_cast<int>(requests.size()), kWaitS);
  if (status != SHOAL_OK) text = std::string("async step: ") + shoal_last_error(nullptr);
  for (shoal_request_t request : requests) shoal_request_free(request);
  if (status != SHOAL_OK) return status;
  if (shoal_async_stats(comm, &after) != SHOAL_OK) return text = shoal_last_error(comm), SHOAL_ERR_INTERNAL;
  *fusedInOne = after.groups - before.groups == 1;
  return SHOAL_OK;
}

shoal_status_t sameBits(const std::vector<float>& got, const std::vector<float>& expected, const std::string& what,
                        std::string& text) {
  if (got.size() == expected.size() && std::memcmp(got.data(), expected.data(), got.size() * sizeof(float)) == 0)
    return SHOAL_OK;
  for (size_t i = 0; i < got.size(); ++i)
    if (std::memcmp(&got[i], &expected[i], sizeof(float)) != 0)
      return text = what + ", element " + std::to_string(i) + ": fused async " + std::to_string(got[i]) +
                    " but blocking " + std::to_string(expected[i]),
             SHOAL_ERR_INTERNAL;
  return text = what + ": sizes differ", SHOAL_ERR_INTERNAL;
}

// ---- stateless: fp16, and none ------------------------------------------------

shoal_status_t checkStateless(int rank, shoal_comm_t comm, std::string& text) {
  // References first, blocking, before the runtime starts: fp16 per tensor,
  // and the plain allreduce of the three tensors packed in submission order
  // (the uncompressed fusion buffer).
  Tensors reference(rank, 0);
  for (int t = 0; t < 3; ++t)
    if (shoal_status_t status =
            blockingCall(comm, "fp16", nullptr, "b" + std::to_string(t), reference.in(t), reference.out(t), SHOAL_AVG,
                         text))
      return status;
  if (!(comm->lastStats.acrossHostsOnly)) return text = "the blocking fp16 call ran flat", SHOAL_ERR_INTERNAL;
  std::vector<float> packed, packedSum;
  for (int t = 0; t < 3; ++t) packed.insert(packed.end(), reference.input[t].begin(), reference.input[t].end());
  packedSum.resize(packed.size());
  if (shoal_allreduce(comm, packed.data(), packedSum.data(), packed.size(), SHOAL_F32, SHOAL_SUM) != SHOAL_OK)
    return text = shoal_last_error(comm), SHOAL_ERR_INTERNAL;

  if (shoal_async_start(comm) != SHOAL_OK) return text = shoal_last_error(comm), SHOAL_ERR_INTERNAL;
  // The runtime fuses what is ready in one negotiation round; a round may
  // catch part of a step. Tries until a step ran as one group (fp16's bits do
  // not depend on the grouping, so every try is compared).
  bool fp16Fused = false, noneFused = false;
  for (int attempt = 0; attempt < 5 && !(fp16Fused && noneFused); ++attempt) {
    Tensors fp16(rank, 0);
    bool one = false;
    if (shoal_status_t status = asyncStep(comm, "fp16", nullptr, "a", fp16, {0, 1, 2}, SHOAL_AVG, &one, text))
      return status;
    fp16Fused = fp16Fused || one;
    for (int t = 0; t < 3; ++t)
      if (shoal_status_t status =
              sameBits(fp16.output[t], reference.output[t], "fp16 tensor " + std::to_string(t), text))
        return status;

    Tensors none(rank, 0);
    if (shoal_status_t status = asyncStep(comm, "none", nullptr, "n", none, {0, 1, 2}, SHOAL_SUM, &one, text))
      return status;
    if (one) {  // one fusion buffer: the blocking call of that buffer, bit for bit
      noneFused = true;
      std::vector<float> got;
      for (int t = 0; t < 3; ++t) got.insert(got.end(), none.output[t].begin(), none.output[t].end());
      if (shoal_status_t status = sameBits(got, packedSum, "none, the fused buffer", text)) return status;
    }
  }
  if (!fp16Fused || !noneFused)
    return text = std::string("the runtime never fused a step into one group in 5 tries (fp16 ") +
                  (fp16Fused ? "did" : "did not") + ", none " + (noneFused ? "did" : "did not") + ")",
           SHOAL_ERR_INTERNAL;
  return SHOAL_OK;
}

class FusedHierarchicalStateless : public ::testing::TestWithParam<const char*> {};

TEST_P(FusedHierarchicalStateless, EqualsBlockingBitForBit) {
  const std::string layout = GetParam();
  const int n = static_cast<int>(layout.size());
  auto outcomes = runJob(
      n, [&](int rank, shoal_comm_t comm, std::string& text) { return checkStateless(rank, comm, text); },
      fakeHosts(layout, {{"SHOAL_CYCLE_TIME_MS", "2"}}));
  expectAllOk(outcomes, n);
}

INSTANTIATE_TEST_SUITE_P(Layouts, FusedHierarchicalStateless, ::testing::Values("aabb", "abab", "aaabbb"));

// ---- topk: state per (tensor, shard) while groups change ----------------------

// Steps alternate the groups' membership: {0, 1, 2}, then {0, 2}, then {2, 1}.
std::vector<int> membersAt(int step) {
  switch (step % 3) {
    case 0: return {0, 1, 2};
    case 1: return {0, 2};
    default: return {2, 1};
  }
}

shoal_status_t checkTopk(int rank, int size, shoal_comm_t comm, std::string& text) {
  const char* options = "ratio=0.2";
  const int steps = 15;
  if (shoal_async_start(comm) != SHOAL_OK) return text = shoal_last_error(comm), SHOAL_ERR_INTERNAL;
  Tensors shapes(rank, 0);
  std::vector<std::vector<double>> outputs(3), dense(3), magnitude(3);
  std::vector<int> calls(3, 0);
  for (int t = 0; t < 3; ++t) {
    outputs[t].assign(shapes.input[t].size(), 0);
    dense[t].assign(shapes.input[t].size(), 0);
    magnitude[t].assign(shapes.input[t].size(), 0);
  }
  int fusedSteps = 0;
  for (int step = 0; step < steps; ++step) {
    // The same gradients every step, so that over the calls the outputs plus
    // the residuals add up to calls x the dense sum.
    Tensors fused(rank, 0), blocking(rank, 0);
    const std::vector<int> members = membersAt(step);
    bool one = false;
    if (shoal_status_t status = asyncStep(comm, "topk", options, "g", fused, members, SHOAL_SUM, &one, text))
      return status;
    fusedSteps += one && members.size() > 1;
    std::vector<float> stepOutputs;
    for (int t : members) {
      // The same tensor alone, blocking, under another name: the same state
      // history, so the same bits if the fused group applied t's own state.
      if (shoal_status_t status = blockingCall(comm, "topk", options, "solo" + std::to_string(t), blocking.in(t),
                                               blocking.out(t), SHOAL_SUM, text))
        return status;
      const std::string what = "topk step " + std::to_string(step) + " tensor " + std::to_string(t);
      if (shoal_status_t status = sameBits(fused.output[t], blocking.output[t], what, text)) return status;
      stepOutputs.insert(stepOutputs.end(), fused.output[t].begin(), fused.output[t].end());
      for (size_t i = 0; i < fused.output[t].size(); ++i) outputs[t][i] += fused.output[t][i];
      ++calls[t];
    }
    const std::string what = "topk step " + std::to_string(step);
    if (shoal_status_t status =
            sameOnEveryRank(comm, stepOutputs.data(), stepOutputs.size() * sizeof(float), what, text))
      return status;
  }
  if (fusedSteps < steps / 3)
    return text = "only " + std::to_string(fusedSteps) + " of " + std::to_string(steps) +
                  " steps ran fused as one group",
           SHOAL_ERR_INTERNAL;
  for (int t = 0; t < 3; ++t) {
    const size_t count = shapes.input[t].size();
    for (int r = 0; r < size; ++r)
      for (size_t i = 0; i < count; ++i)
        dense[t][i] += valueOf(t, r, 0, i), magnitude[t][i] += std::fabs(valueOf(t, r, 0, i));
    // The residual lives under the shard's name, at the shard's size (topk
    // sees 1-D shards, the matrix's too); none under the tensor's own name.
    const std::string name = "g" + std::to_string(t);
    const shoal::ring::Block shard =
        shoal::ring::blockOf(count, static_cast<int>(comm->hosts->local.size()), comm->hosts->localRank);
    std::vector<uint8_t> state;
    if (!savedState(comm, "topk", options, shardKeyOf(comm, name), state, text)) return SHOAL_ERR_INTERNAL;
    if (state.size() != shard.count * sizeof(float))
      return text = name + ": the shard's residual has " + std::to_string(state.size()) + " bytes, expected " +
                    std::to_string(shard.count * sizeof(float)),
             SHOAL_ERR_INTERNAL;
    if (hasState(comm, "topk", options, name))
      return text = "topk kept a state for the whole " + name, SHOAL_ERR_INTERNAL;
    std::vector<double> residuals(count, 0);
    for (size_t i = 0; i < shard.count; ++i) {
      float e;
      std::memcpy(&e, state.data() + i * sizeof(float), sizeof e);
      residuals[shard.offset + i] = e;
    }
    if (shoal_allreduce(comm, residuals.data(), residuals.data(), count, SHOAL_F64, SHOAL_SUM) != SHOAL_OK)
      return text = shoal_last_error(comm), SHOAL_ERR_INTERNAL;
    // Error feedback loses nothing: outputs + residuals == calls x the dense sum.
    for (size_t i = 0; i < count; ++i) {
      const double exact = calls[t] * dense[t][i];
      if (!(std::fabs(outputs[t][i] + residuals[i] - exact) <= 1e-4 * calls[t] * magnitude[t][i] + 1e-6))
        return text = name + " element " + std::to_string(i) + ": outputs " + std::to_string(outputs[t][i]) +
                      " + residuals " + std::to_string(residuals[i]) + " != " + std::to_string(calls[t]) +
                      " x dense " + std::to_string(dense[t][i]),
               SHOAL_ERR_INTERNAL;
    }
  }
  return SHOAL_OK;
}

class FusedHierarchicalTopk : public ::testing::TestWithParam<const char*> {};

TEST_P(FusedHierarchicalTopk, StatePerTensorShardWhileGroupsChange) {
  const std::string layout = GetParam();
  const int n = static_cast<int>(layout.size());
  auto outcomes = runJob(
      n, [&](int rank, shoal_comm_t comm, std::string& text) { return checkTopk(rank, n, comm, text); },
      fakeHosts(layout, {{"SHOAL_CYCLE_TIME_MS", "2"}}));
  expectAllOk(outcomes, n);
}

INSTANTIATE_TEST_SUITE_P(Layouts, FusedHierarchicalTopk, ::testing::Values("aabb", "aaabbb"));

// ---- powersgd: row blocks of every matrix of a group ---------------------------

// Rank w's matrix m: U C V^T with U [rows x 2], V [cols x 2]; the sum over
// ranks has rank <= 2, below powersgd's rank 4, so row blocks are exact up to
// rounding (as in test_hierarchical_stateful.cc).
float lowRank(int m, int rank, size_t i, size_t j) {
  const double u0 = std::sin(0.7 * i + m), u1 = std::cos(0.45 * i + 1);
  const double v0 = std::cos(0.3 * j), v1 = std::sin(0.9 * j + 2 + m);
  const double c00 = 1 + rank, c01 = 0.5, c10 = -0.3 * rank * rank, c11 = 2 - 0.2 * rank;
  return static_cast<float>(u0 * (c00 * v0 + c01 * v1) + u1 * (c10 * v0 + c11 * v1));
}

shoal_status_t checkPowerSgd(int rank, int size, shoal_comm_t comm, std::string& text) {
  const char* options = "rank=4";
  const size_t rows[2] = {61, 45}, cols[2] = {40, 30};
  if (shoal_async_start(comm) != SHOAL_OK) return text = shoal_last_error(comm), SHOAL_ERR_INTERNAL;
  bool fusedOnce = false;
  for (int step = 0; step < 3 || (!fusedOnce && step < 6); ++step) {
    std::vector<std::vector<float>> input(2), output(2);
    std::vector<shoal_request_t> requests;
    shoal_async_stats_t before = SHOAL_ASYNC_STATS_INIT, after = SHOAL_ASYNC_STATS_INIT;
    shoal_async_stats(comm, &before);
    for (int m = 0; m < 2; ++m) {
      input[m].resize(rows[m] * cols[m]);
      output[m].assign(rows[m] * cols[m], 0);
      for (size_t e = 0; e < input[m].size(); ++e) input[m][e] = lowRank(m, rank, e / cols[m], e % cols[m]);
      shoal_tensor_t in = shaped(input[m].data(), {static_cast<int64_t>(rows[m]), static_cast<int64_t>(cols[m])});
      shoal_tensor_t out = shaped(output[m].data(), {static_cast<int64_t>(rows[m]), static_cast<int64_t>(cols[m])});
      shoal_async_options_t o = SHOAL_ASYNC_OPTIONS_INIT;
      o.compressor = "powersgd";
      o.compressor_options = options;
      o.compress_min_bytes = 0;
      shoal_request_t request = nullptr;
      const std::string name = "w" + std::to_string(m);
      if (shoal_iallreduce(comm, name.c_str(), &in, &out, SHOAL_SUM, &o, &request) != SHOAL_OK)
        return text = shoal_last_error(comm), SHOAL_ERR_INTERNAL;
      requests.push_back(request);
    }
    shoal_status_t status = shoal_wait_all(requests.data(), 2, kWaitS);
    for (shoal_request_t request : requests) shoal_request_free(request);
    if (status != SHOAL_OK) return text = std::string("powersgd step: ") + shoal_last_error(nullptr), status;
    shoal_async_stats(comm, &after);
    fusedOnce = fusedOnce || after.groups - before.groups == 1;
    for (int m = 0; m < 2; ++m) {
      const std::string what = "powersgd step " + std::to_string(step) + " matrix " + std::to_string(m);
      double largest = 0;
      std::vector<double> exact(input[m].size(), 0);
      for (size_t e = 0; e < exact.size(); ++e) {
        for (int r = 0; r < size; ++r) exact[e] += lowRank(m, r, e / cols[m], e % cols[m]);
        largest = std::max(largest, std::fabs(exact[e]));
      }
      for (size_t e = 0; e < exact.size(); ++e)
        if (!(std::fabs(output[m][e] - exact[e]) <= 1e-4 * largest))
          return text = what + ", element " + std::to_string(e) + ": " + std::to_string(output[m][e]) +
                        " vs dense " + std::to_string(exact[e]),
                 SHOAL_ERR_INTERNAL;
      if ((status = sameOnEveryRank(comm, output[m].data(), output[m].size() * sizeof(float), what, text)))
        return status;
      // The matrix's state is its row block's: error vector [rows_i x cols], Q [cols x 4], a 40-byte header.
      const size_t blockRows =
          shoal::ring::blockOf(rows[m], static_cast<int>(comm->hosts->local.size()), comm->hosts->localRank).count;
      std::vector<uint8_t> state;
      const std::string name = "w" + std::to_string(m);
      if (!savedState(comm, "powersgd", options, shardKeyOf(comm, name), state, text)) return SHOAL_ERR_INTERNAL;
      const size_t expected = 4 * blockRows * cols[m] + 4 * cols[m] * 4 + 40;
      if (state.size() != expected)
        return text = what + ": the shard's state has " + std::to_string(state.size()) + " bytes, a [" +
                      std::to_string(blockRows) + " x " + std::to_string(cols[m]) + "] row block's has " +
                      std::to_string(expected),
               SHOAL_ERR_INTERNAL;
      if (hasState(comm, "powersgd", options, name))
        return text = "powersgd kept a state for the whole " + name, SHOAL_ERR_INTERNAL;
    }
  }
  if (!fusedOnce) return text = "the two matrices never ran as one group in 6 steps", SHOAL_ERR_INTERNAL;
  return SHOAL_OK;
}

TEST(FusedHierarchicalPowerSgd, RowBlocksOfEveryMatrix) {
  const int n = 4;
  auto outcomes = runJob(
      n, [&](int rank, shoal_comm_t comm, std::string& text) { return checkPowerSgd(rank, n, comm, text); },
      fakeHosts("abab", {{"SHOAL_CYCLE_TIME_MS", "2"}}));
  expectAllOk(outcomes, n);
}

}  // namespace
