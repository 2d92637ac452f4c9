// The async runtime through the C API, ranks as threads: named requests in
// different orders per rank, fusion on/off, mixed compressors, mismatches,
// name reuse, and blocking calls mixed with async requests.
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <cstring>
#include <numeric>
#include <random>
#include <string>
#include <vector>

#include "harness/harness.h"
#include "harness/rank_sync.h"
#include "runtime/async_helpers.h"
#include "shoal/lowrank.h"
#include "shoal/shoal.h"

namespace shoal::test {
namespace {

constexpr double kWaitS = 60;

// Integer-valued data, so every summation order gives the same bits.
float valueOf(size_t tensor, size_t element, int rank) {
  return static_cast<float>(static_cast<int>((tensor * 131 + element * 7 + static_cast<size_t>(rank) * 17) % 61) - 30);
}

std::vector<size_t> shuffledOrder(size_t n, int rank, int step) {
  std::vector<size_t> order(n);
  std::iota(order.begin(), order.end(), 0);
  std::mt19937 random(static_cast<uint32_t>(1000 * step + rank + 1));
  std::shuffle(order.begin(), order.end(), random);
  return order;
}

TEST(Async, ThousandsOfSmallTensorsInShuffledOrdersAreExactAndCached) {
  ScopedEnv env{{"SHOAL_CACHE_CAPACITY", "4096"}};
  constexpr int kRanks = 4;
  constexpr size_t kTensors = 2000;
  runRanks(kRanks, [&](int rank, shoal_comm_t comm) {
    std::vector<std::vector<float>> floats(kTensors);
    std::vector<std::vector<int32_t>> ints(kTensors);
    uint64_t fullRoundsAfterFirstStep = 0;
    for (int step = 0; step < 3; ++step) {
      std::vector<shoal_request_t> requests;
      for (size_t t : shuffledOrder(kTensors, rank, step)) {
        const size_t count = 1 + (t * 37) % 64;
        const std::string name = "t" + std::to_string(t);
        shoal_tensor_t tensor;
        if (t % 2 == 0) {
          floats[t].resize(count);
          for (size_t e = 0; e < count; ++e) floats[t][e] = valueOf(t, e, rank) + static_cast<float>(step);
          tensor = tensorOf(floats[t].data(), SHOAL_F32, {static_cast<int64_t>(count)});
        } else {
          ints[t].resize(count);
          for (size_t e = 0; e < count; ++e) ints[t][e] = static_cast<int32_t>(valueOf(t, e, rank)) * 1000 + step;
          tensor = tensorOf(ints[t].data(), SHOAL_I32, {static_cast<int64_t>(count)});
        }
        shoal_request_t request = nullptr;
        if (!callOk(shoal_iallreduce(comm, name.c_str(), &tensor, &tensor, SHOAL_SUM, nullptr, &request), comm, name))
          return;
        requests.push_back(request);
      }
      if (waitAndFree(requests, kWaitS, "step " + std::to_string(step)) > 0) return;
      for (size_t t = 0; t < kTensors; ++t) {
        const size_t count = 1 + (t * 37) % 64;
        for (size_t e = 0; e < count; ++e) {
          float expected = 0;
          for (int r = 0; r < kRanks; ++r) expected += valueOf(t, e, r) + static_cast<float>(step);
          if (t % 2 == 0) {
            ASSERT_EQ(floats[t][e], expected) << "rank " << rank << " step " << step << " tensor " << t << "[" << e << "]";
          } else {
            ASSERT_EQ(ints[t][e], static_cast<int32_t>(expected - kRanks * step) * 1000 + kRanks * step)
                << "rank " << rank << " step " << step << " tensor " << t << "[" << e << "]";
          }
        }
      }
      if (step == 0) fullRoundsAfterFirstStep = asyncStats(comm).full_rounds;
    }
    // Steps 2 and 3 submit only cached names: the bitvector alone negotiates them.
    shoal_async_stats_t stats = asyncStats(comm);
    EXPECT_EQ(stats.full_rounds, fullRoundsAfterFirstStep) << "rank " << rank;
    EXPECT_GE(stats.cache_hits, 2 * kTensors) << "rank " << rank;
    EXPECT_EQ(stats.tensors, 3 * kTensors) << "rank " << rank;
  });
}

// Runs one step of `count` tensors of mixed dtypes and ops, returns the results.
struct FusionRun {
  std::vector<std::vector<float>> floats;
  std::vector<std::vector<double>> doubles;
  std::vector<std::vector<int64_t>> ints;
  shoal_async_stats_t stats;
};

FusionRun runFusionStep(int rank, shoal_comm_t comm, size_t count) {
  FusionRun run;
  run.floats.resize(count);
  run.doubles.resize(count);
  run.ints.resize(count);
  std::mt19937 random(12345 + rank);
  std::uniform_real_distribution<double> uniform(-1, 1);
  std::vector<shoal_request_t> requests;
  for (size_t t : shuffledOrder(count, rank, 7)) {
    const size_t n = 1 + (t * 7919) % 3000;
    const std::string name = "fusion." + std::to_string(t);
    shoal_tensor_t tensor;
    shoal_op_t op;
    switch (t % 3) {
      case 0:  // f32 avg of integer values: exact whatever the summation order
        run.floats[t].resize(n);
        for (size_t e = 0; e < n; ++e) run.floats[t][e] = valueOf(t, e, rank);
        tensor = tensorOf(run.floats[t].data(), SHOAL_F32, {static_cast<int64_t>(n)});
        op = SHOAL_AVG;
        break;
      case 1:  // f64 max of arbitrary values: exact
        run.doubles[t].resize(n);
        for (size_t e = 0; e < n; ++e) run.doubles[t][e] = uniform(random);
        tensor = tensorOf(run.doubles[t].data(), SHOAL_F64, {static_cast<int64_t>(n)});
        op = SHOAL_MAX;
        break;
      default:  // i64 sum
        run.ints[t].resize(n);
        for (size_t e = 0; e < n; ++e) run.ints[t][e] = static_cast<int64_t>(random()) - (1ll << 31);
        tensor = tensorOf(run.ints[t].data(), SHOAL_I64, {static_cast<int64_t>(n)});
        op = SHOAL_SUM;
        break;
    }
    shoal_request_t request = nullptr;
    if (!callOk(shoal_iallreduce(comm, name.c_str(), &tensor, &tensor, op, nullptr, &request), comm, name)) break;
    requests.push_back(request);
  }
  waitAndFree(requests, kWaitS, "fusion step");
  run.stats = asyncStats(comm);
  return run;
}

TEST(Async, FusionOnAndOffGiveEqualResults) {
  constexpr size_t kCount = 300;
  std::vector<FusionRun> unfused(3), fused(3);
  {
    ScopedEnv env{{"SHOAL_FUSION_THRESHOLD", "0"}, {"SHOAL_CYCLE_TIME_MS", "20"}};
    runRanks(3, [&](int rank, shoal_comm_t comm) { unfused[rank] = runFusionStep(rank, comm, kCount); });
  }
  {
    ScopedEnv env{{"SHOAL_FUSION_THRESHOLD", "65536"}, {"SHOAL_CYCLE_TIME_MS", "20"}};
    runRanks(3, [&](int rank, shoal_comm_t comm) { fused[rank] = runFusionStep(rank, comm, kCount); });
  }
  for (int rank = 0; rank < 3; ++rank) {
    EXPECT_EQ(unfused[rank].stats.groups, kCount) << "fusion off: every tensor is its own collective";
    EXPECT_LT(fused[rank].stats.groups, kCount / 4) << "fusion on: tensors share collectives";
    EXPECT_EQ(fused[rank].stats.tensors, kCount);
    for (size_t t = 0; t < kCount; ++t) {
      ASSERT_EQ(unfused[rank].floats[t], fused[rank].floats[t]) << "tensor " << t;
      ASSERT_EQ(unfused[rank].doubles[t], fused[rank].doubles[t]) << "tensor " << t;
      ASSERT_EQ(unfused[rank].ints[t], fused[rank].ints[t]) << "tensor " << t;
      // And both are right: compare with rank 0's view of the result and the avg formula.
      for (size_t e = 0; e < fused[rank].floats[t].size(); ++e) {
        float sum = 0;
        for (int r = 0; r < 3; ++r) sum += valueOf(t, e, r);
        ASSERT_EQ(fused[rank].floats[t][e], sum / 3) << "tensor " << t << "[" << e << "]";
      }
      ASSERT_EQ(fused[rank].doubles[t], fused[0].doubles[t]);
      ASSERT_EQ(fused[rank].ints[t], fused[0].ints[t]);
    }
  }
}

TEST(Async, MixedCompressorsInOneStepFuseByCompressor) {
  // A long cycle, so each rank's submissions (microseconds) land in one cycle
  // and every compressor's tensors form one group.
  ScopedEnv env{{"SHOAL_CYCLE_TIME_MS", "300"}};
  constexpr int kRanks = 3;
  constexpr int kPerKind = 12;
  constexpr int64_t kRows = 24, kCols = 40;
  RankBarrier barrier(kRanks);
  runRanks(kRanks, [&](int rank, shoal_comm_t comm) {
    // Started first: the engine's first cycle runs at once, the next 300 ms later.
    ASSERT_TRUE(callOk(shoal_async_start(comm), comm, "shoal_async_start"));
    barrier.wait();
    std::vector<std::vector<float>> inputs(3 * kPerKind), outputs(3 * kPerKind);
    std::vector<shoal_request_t> requests;
    for (size_t t : shuffledOrder(3 * kPerKind, rank, 3)) {
      const int kind = static_cast<int>(t) % 3;  // 0 none, 1 fp16, 2 powersgd
      shoal_async_options_t options = SHOAL_ASYNC_OPTIONS_INIT;
      options.compress_min_bytes = 0;
      options.compressor = kind == 0 ? "none" : kind == 1 ? "fp16" : "powersgd";
      options.compressor_options = kind == 2 ? "rank=2" : "";
      inputs[t].resize(kRows * kCols);
      outputs[t].assign(kRows * kCols, -1);
      for (int64_t i = 0; i < kRows; ++i)
        for (int64_t j = 0; j < kCols; ++j) {
          // powersgd: a rank-1 matrix u v^T scaled per rank (the sum has rank 1: recovered up to rounding);
          // none and fp16: small integers (exact in fp16 and in every summation order).
          inputs[t][i * kCols + j] = kind == 2 ? static_cast<float>((rank + 1) * (1 + (i + t) % 5) * (1 + (j * 3) % 7)) / 8
                                               : valueOf(t, static_cast<size_t>(i * kCols + j), rank) / 4;
        }
      shoal_tensor_t in = tensorOf(inputs[t].data(), SHOAL_F32, {kRows, kCols});
      shoal_tensor_t out = tensorOf(outputs[t].data(), SHOAL_F32, {kRows, kCols});
      const std::string name = "mixed." + std::to_string(t);
      shoal_request_t request = nullptr;
      if (!callOk(shoal_iallreduce(comm, name.c_str(), &in, &out, SHOAL_SUM, &options, &request), comm, name)) return;
      requests.push_back(request);
    }
    if (waitAndFree(requests, kWaitS, "mixed step") > 0) return;
    for (size_t t = 0; t < 3 * kPerKind; ++t) {
      const int kind = static_cast<int>(t) % 3;
      for (int64_t i = 0; i < kRows; ++i)
        for (int64_t j = 0; j < kCols; ++j) {
          const size_t e = static_cast<size_t>(i * kCols + j);
          if (kind == 2) {
            double expected = 0;
            for (int r = 0; r < kRanks; ++r) expected += (r + 1) * (1 + (i + t) % 5) * (1 + (j * 3) % 7) / 8.0;
            ASSERT_NEAR(outputs[t][e], expected, 1e-4 * std::abs(expected) + 1e-5) << "powersgd tensor " << t;
          } else {
            float expected = 0;
            for (int r = 0; r < kRanks; ++r) expected += valueOf(t, e, r) / 4;
            ASSERT_EQ(outputs[t][e], expected) << (kind ? "fp16" : "none") << " tensor " << t << "[" << e << "]";
          }
        }
    }
    // One collective for the uncompressed tensors, one compressor operation
    // for fp16's and one for powersgd's.
    EXPECT_EQ(asyncStats(comm).groups, 3u) << "rank " << rank;
  });
}

TEST(Async, MismatchedRequestsFailOnEveryRankNamingWhatDiffers) {
  constexpr int kRanks = 3;
  runRanks(kRanks, [&](int rank, shoal_comm_t comm) {
    std::vector<float> a(12, 1.0f), b(12, 1.0f), c(12, 1.0f), d(12, 1.0f), e(16, 1.0f);
    std::vector<double> b64(12, 1.0);
    struct Case {
      const char* name;
      shoal_request_t request;
      const char* expected;
    };
    std::vector<Case> cases;
    shoal_request_t request = nullptr;
    // (the request is read after the call returned: argument order is unspecified)
    auto add = [&](const char* name, shoal_status_t status, const char* expected) {
      if (callOk(status, comm, name)) cases.push_back({name, request, expected});
    };
    // shape: rank 1 submits [4, 4] instead of [3, 4]
    shoal_tensor_t ta = rank == 1 ? tensorOf(e.data(), SHOAL_F32, {4, 4}) : tensorOf(a.data(), SHOAL_F32, {3, 4});
    add("w.shape", shoal_iallreduce(comm, "w.shape", &ta, &ta, SHOAL_SUM, nullptr, &request), "shape [3, 4] vs [4, 4]");
    // dtype
    shoal_tensor_t tb = rank == 2 ? tensorOf(b64.data(), SHOAL_F64, {12}) : tensorOf(b.data(), SHOAL_F32, {12});
    add("w.dtype", shoal_iallreduce(comm, "w.dtype", &tb, &tb, SHOAL_SUM, nullptr, &request), "dtype float vs double");
    // op
    shoal_tensor_t tc = tensorOf(c.data(), SHOAL_F32, {12});
    add("w.op", shoal_iallreduce(comm, "w.op", &tc, &tc, rank == 1 ? SHOAL_MAX : SHOAL_SUM, nullptr, &request), "op sum vs max");
    // compressor
    shoal_async_options_t options = SHOAL_ASYNC_OPTIONS_INIT;
    options.compressor = rank == 2 ? "fp16" : "none";
    shoal_tensor_t td = tensorOf(d.data(), SHOAL_F32, {12});
    add("w.compressor", shoal_iallreduce(comm, "w.compressor", &td, &td, SHOAL_SUM, &options, &request),
        "compressor none vs fp16");
    // broadcast root
    std::vector<float> f(8, 2.0f);
    shoal_tensor_t tf = tensorOf(f.data(), SHOAL_F32, {8});
    add("w.root", shoal_ibroadcast(comm, "w.root", &tf, rank == 1 ? 1 : 0, &request), "root 0 vs 1");
    for (Case& item : cases) {
      shoal_status_t status = shoal_wait(item.request, kWaitS);
      EXPECT_EQ(status, SHOAL_ERR_MISMATCH) << "rank " << rank << " " << item.name << ": " << shoal_status_string(status);
      std::string text = shoal_request_error(item.request);
      EXPECT_NE(text.find(std::string("'") + item.name + "'"), std::string::npos) << text;
      EXPECT_NE(text.find(item.expected), std::string::npos) << "rank " << rank << ": " << text;
      shoal_request_free(item.request);
    }
    // The runtime stays usable after mismatches.
    std::vector<float> ok(5, static_cast<float>(rank));
    shoal_tensor_t tok = tensorOf(ok.data(), SHOAL_F32, {5});
    if (!callOk(shoal_iallreduce(comm, "after", &tok, &tok, SHOAL_SUM, nullptr, &request), comm, "after")) return;
    EXPECT_EQ(shoal_wait(request, kWaitS), SHOAL_OK) << shoal_request_error(request);
    shoal_request_free(request);
    EXPECT_EQ(ok[0], 0.0f + 1 + 2);
  });
}

TEST(Async, ReusingANameInFlightIsAnError) {
  constexpr int kRanks = 2;
  RankBarrier barrier(kRanks);
  runRanks(kRanks, [&](int rank, shoal_comm_t comm) {
    ASSERT_TRUE(callOk(shoal_async_start(comm), comm, "shoal_async_start"));
    std::vector<float> x(4, 1.0f), y(4, 1.0f);
    shoal_tensor_t tx = tensorOf(x.data(), SHOAL_F32, {4});
    shoal_tensor_t ty = tensorOf(y.data(), SHOAL_F32, {4});
    shoal_request_t first = nullptr, second = nullptr;
    if (rank == 0) {  // rank 1 has not submitted "x" yet: it stays in flight on rank 0
      ASSERT_TRUE(callOk(shoal_iallreduce(comm, "x", &tx, &tx, SHOAL_SUM, nullptr, &first), comm, "first x"));
      EXPECT_EQ(shoal_iallreduce(comm, "x", &ty, &ty, SHOAL_SUM, nullptr, &second), SHOAL_ERR_INVALID_ARGUMENT);
      EXPECT_NE(std::string(shoal_last_error(comm)).find("'x' is already in flight"), std::string::npos)
          << shoal_last_error(comm);
      EXPECT_EQ(second, nullptr);
      EXPECT_EQ(shoal_request_free(first), SHOAL_ERR_INVALID_ARGUMENT) << "a pending request cannot be freed";
      int done = 1;
      EXPECT_EQ(shoal_test(first, &done), SHOAL_OK);
      EXPECT_EQ(done, 0);
    }
    barrier.wait();
    if (rank == 1) ASSERT_TRUE(callOk(shoal_iallreduce(comm, "x", &tx, &tx, SHOAL_SUM, nullptr, &first), comm, "x"));
    EXPECT_EQ(shoal_wait(first, kWaitS), SHOAL_OK) << shoal_request_error(first);
    shoal_request_free(first);
    EXPECT_EQ(x[0], 2.0f);
    // Once complete, the name is free again.
    shoal_request_t again = nullptr;
    ASSERT_TRUE(callOk(shoal_iallreduce(comm, "x", &tx, &tx, SHOAL_SUM, nullptr, &again), comm, "x again"));
    EXPECT_EQ(shoal_wait(again, kWaitS), SHOAL_OK);
    shoal_request_free(again);
    EXPECT_EQ(x[0], 4.0f);
  });
}

TEST(Async, BlockingCallsMixWithPendingRequests) {
  constexpr int kRanks = 3;
  runRanks(kRanks, [&](int rank, shoal_comm_t comm) {
    // Async requests in a rank-dependent order, with blocking calls in between.
    std::vector<std::vector<float>> data(6, std::vector<float>(100));
    std::vector<shoal_request_t> requests;
    for (size_t t : shuffledOrder(6, rank, 1)) {
      for (size_t e = 0; e < 100; ++e) data[t][e] = valueOf(t, e, rank);
      shoal_tensor_t tensor = tensorOf(data[t].data(), SHOAL_F32, {100});
      shoal_request_t request = nullptr;
      std::string name = "mix." + std::to_string(t);
      ASSERT_TRUE(callOk(shoal_iallreduce(comm, name.c_str(), &tensor, &tensor, SHOAL_SUM, nullptr, &request), comm, name));
      requests.push_back(request);
      if (requests.size() == 3) {  // every rank makes the same blocking calls, in the same order
        int64_t value = rank + 1;
        ASSERT_TRUE(callOk(shoal_allreduce(comm, &value, &value, 1, SHOAL_I64, SHOAL_SUM), comm, "allreduce"));
        EXPECT_EQ(value, 6);
        std::vector<int32_t> gathered(kRanks);
        int32_t mine = 10 * rank;
        ASSERT_TRUE(callOk(shoal_allgather(comm, &mine, gathered.data(), 1, SHOAL_I32), comm, "allgather"));
        for (int r = 0; r < kRanks; ++r) EXPECT_EQ(gathered[r], 10 * r);
        double root = rank == 2 ? 3.5 : 0;
        ASSERT_TRUE(callOk(shoal_broadcast(comm, &root, &root, 1, SHOAL_F64, 2), comm, "broadcast"));
        EXPECT_EQ(root, 3.5);
        std::vector<int32_t> blocks(kRanks, rank);
        int32_t reduced = 0;
        ASSERT_TRUE(callOk(shoal_reduce_scatter(comm, blocks.data(), &reduced, 1, SHOAL_I32, SHOAL_SUM), comm, "rs"));
        EXPECT_EQ(reduced, 0 + 1 + 2);
        ASSERT_TRUE(callOk(shoal_barrier(comm), comm, "barrier"));
        // The tensor calls and the fused allreduce go through the engine too.
        std::vector<int32_t> all(kRanks, -1);
        shoal_tensor_t mineTensor = shoal_tensor_1d(&mine, 1, SHOAL_I32);
        shoal_tensor_t allTensor = shoal_tensor_1d(all.data(), kRanks, SHOAL_I32);
        ASSERT_TRUE(callOk(shoal_allgather_tensor(comm, &mineTensor, &allTensor), comm, "allgather_tensor"));
        for (int r = 0; r < kRanks; ++r) EXPECT_EQ(all[r], 10 * r);
        int64_t fromRoot = rank == 1 ? 77 : 0;
        shoal_tensor_t rootTensor = shoal_tensor_1d(&fromRoot, 1, SHOAL_I64);
        ASSERT_TRUE(callOk(shoal_broadcast_tensor(comm, &rootTensor, 1), comm, "broadcast_tensor"));
        EXPECT_EQ(fromRoot, 77);
        float first[2] = {float(rank), 1}, second[3] = {2, float(rank), 3};
        shoal_tensor_t fused[2] = {shoal_tensor_1d(first, 2, SHOAL_F32), shoal_tensor_1d(second, 3, SHOAL_F32)};
        ASSERT_TRUE(callOk(shoal_fused_allreduce(comm, fused, 2, SHOAL_SUM), comm, "fused_allreduce"));
        EXPECT_EQ(first[0], 3.0f);
        EXPECT_EQ(first[1], 3.0f);
        EXPECT_EQ(second[0], 6.0f);
        EXPECT_EQ(second[1], 3.0f);
        EXPECT_EQ(second[2], 9.0f);
      }
    }
    waitAndFree(requests, kWaitS, "mixed with blocking");
    for (size_t t = 0; t < 6; ++t)
      for (size_t e = 0; e < 100; ++e)
        ASSERT_EQ(data[t][e], valueOf(t, e, 0) + valueOf(t, e, 1) + valueOf(t, e, 2));
    // Different blocking calls at the same point: an error on every rank, not a hang.
    int64_t value = 1;
    shoal_status_t status = rank == 0 ? shoal_barrier(comm) : shoal_allreduce(comm, &value, &value, 1, SHOAL_I64, SHOAL_SUM);
    EXPECT_EQ(status, SHOAL_ERR_MISMATCH) << "rank " << rank << ": " << shoal_last_error(comm);
    EXPECT_NE(std::string(shoal_last_error(comm)).find("call shoal_barrier vs shoal_allreduce"), std::string::npos)
        << shoal_last_error(comm);
    // ... and the communicator still works.
    EXPECT_TRUE(callOk(shoal_barrier(comm), comm, "barrier after mismatch"));
  });
}

TEST(Async, AlternatingBlockingCallsStayOnTheCacheFastPath) {
  runRanks(3, [&](int rank, shoal_comm_t comm) {
    ASSERT_TRUE(callOk(shoal_async_start(comm), comm, "start"));
    uint64_t fullRounds = 0;
    for (int i = 0; i < 6; ++i) {
      if (i == 2) fullRounds = asyncStats(comm).full_rounds;  // both calls negotiated once by now
      ASSERT_TRUE(callOk(shoal_barrier(comm), comm, "barrier"));
      double value = rank;
      ASSERT_TRUE(callOk(shoal_allreduce(comm, &value, &value, 1, SHOAL_F64, SHOAL_SUM), comm, "allreduce"));
      EXPECT_EQ(value, 3.0);
    }
    EXPECT_EQ(asyncStats(comm).full_rounds, fullRounds) << "rank " << rank;
  });
}

TEST(Async, AllgatherAndBroadcast) {
  constexpr int kRanks = 4;
  runRanks(kRanks, [&](int rank, shoal_comm_t comm) {
    std::vector<int16_t> mine(7);
    for (size_t i = 0; i < mine.size(); ++i) mine[i] = static_cast<int16_t>(rank * 100 + static_cast<int>(i));
    std::vector<int16_t> all(7 * kRanks, -1);
    std::vector<double> shared(5, rank == 3 ? 2.25 : -1.0);
    shoal_tensor_t in = tensorOf(mine.data(), SHOAL_U8, {14});  // 7 int16 as 14 bytes
    shoal_tensor_t bcast = tensorOf(shared.data(), SHOAL_F64, {5});
    shoal_request_t requests[2] = {nullptr, nullptr};
    // Submitted in opposite orders on odd and even ranks.
    int first = rank % 2, second = 1 - first;
    auto submit = [&](int which) {
      return which == 0 ? shoal_iallgather(comm, "gathered", &in, all.data(), &requests[0])
                        : shoal_ibroadcast(comm, "shared", &bcast, 3, &requests[1]);
    };
    ASSERT_TRUE(callOk(submit(first), comm, "first"));
    ASSERT_TRUE(callOk(submit(second), comm, "second"));
    ASSERT_EQ(shoal_wait_all(requests, 2, kWaitS), SHOAL_OK) << shoal_last_error(nullptr);
    for (shoal_request_t r : requests) shoal_request_free(r);
    for (int r = 0; r < kRanks; ++r)
      for (int i = 0; i < 7; ++i) ASSERT_EQ(all[r * 7 + i], r * 100 + i);
    for (double v : shared) ASSERT_EQ(v, 2.25);
  });
}

TEST(Async, FinalizeOnOneRankFailsThePeersPendingRequests) {
  constexpr int kRanks = 3;
  RankBarrier barrier(kRanks);
  runRanks(kRanks, [&](int rank, shoal_comm_t comm) {
    ASSERT_TRUE(callOk(shoal_async_start(comm), comm, "start"));
    std::vector<float> x(3, 1.0f);
    shoal_tensor_t t = tensorOf(x.data(), SHOAL_F32, {3});
    shoal_request_t request = nullptr;
    if (rank != 0) ASSERT_TRUE(callOk(shoal_iallreduce(comm, "orphan", &t, &t, SHOAL_SUM, nullptr, &request), comm, "orphan"));
    barrier.wait();
    if (rank == 0) {
      EXPECT_EQ(shoal_comm_finalize(comm), SHOAL_OK) << shoal_last_error(comm);
      return;
    }
    shoal_status_t status = shoal_wait(request, kWaitS);
    EXPECT_EQ(status, SHOAL_ERR_REMOTE) << shoal_status_string(status);
    EXPECT_NE(std::string(shoal_request_error(request)).find("finalized"), std::string::npos) << shoal_request_error(request);
    shoal_request_free(request);
    // Later requests fail at once, with the reason.
    EXPECT_EQ(shoal_iallreduce(comm, "later", &t, &t, SHOAL_SUM, nullptr, &request), SHOAL_ERR_REMOTE);
    EXPECT_NE(std::string(shoal_last_error(comm)).find("finalized"), std::string::npos) << shoal_last_error(comm);
  });
}

TEST(Async, BadArgumentsAreRefusedAtSubmission) {
  runRanks(1, [&](int, shoal_comm_t comm) {
    std::vector<float> x(4);
    shoal_tensor_t t = tensorOf(x.data(), SHOAL_F32, {4});
    shoal_request_t request = nullptr;
    EXPECT_EQ(shoal_iallreduce(comm, nullptr, &t, &t, SHOAL_SUM, nullptr, &request), SHOAL_ERR_INVALID_ARGUMENT);
    EXPECT_EQ(shoal_iallreduce(comm, "__shoal_x", &t, &t, SHOAL_SUM, nullptr, &request), SHOAL_ERR_INVALID_ARGUMENT);
    EXPECT_EQ(shoal_iallreduce(comm, "x", &t, &t, SHOAL_BXOR, nullptr, &request), SHOAL_ERR_INVALID_ARGUMENT);
    EXPECT_NE(std::string(shoal_last_error(comm)).find("integer dtype"), std::string::npos);
    shoal_tensor_t bad = t;
    bad.data = nullptr;
    EXPECT_EQ(shoal_iallreduce(comm, "x", &bad, &bad, SHOAL_SUM, nullptr, &request), SHOAL_ERR_INVALID_ARGUMENT);
    EXPECT_EQ(shoal_ibroadcast(comm, "x", &t, 1, &request), SHOAL_ERR_INVALID_ARGUMENT);
    EXPECT_EQ(shoal_wait(nullptr, 1), SHOAL_ERR_INVALID_ARGUMENT);
    // An unknown compressor fails the request (on every rank), with the valid names.
    shoal_async_options_t options = SHOAL_ASYNC_OPTIONS_INIT;
    options.compressor = "no-such-compressor";
    options.compress_min_bytes = 0;
    ASSERT_TRUE(callOk(shoal_iallreduce(comm, "x", &t, &t, SHOAL_SUM, &options, &request), comm, "x"));
    EXPECT_EQ(shoal_wait(request, kWaitS), SHOAL_ERR_NOT_FOUND) << shoal_request_error(request);
    EXPECT_NE(std::string(shoal_request_error(request)).find("no-such-compressor"), std::string::npos);
    shoal_request_free(request);
  });
}

}  // namespace
}  // namespace shoal::test
