// The GPU path's logic that needs no GPU: the device ring's schedule (run
// here as a simulation with the CPU reducer), and routing by memory kind:
// every refusal of a call with CUDA tensors reaches every rank at once (no
// deadline wait) with a text that says what to fix, and the communicator
// stays usable. Runs in every build, with or without CUDA or a device.
#include <gtest/gtest.h>

#include <chrono>
#include <cstdlib>
#include <cstring>
#include <random>
#include <string>
#include <vector>

#include "api/enter.h"
#include "collectives/common/context.h"
#include "collectives/common/reducer.h"
#include "gpu/route.h"
#include "harness/cuda_routing.h"
#include "harness/harness.h"
#include "harness/rank_sync.h"
#include "plugin/driver.h"
#include "plugin/registry.h"
#include "shoal/compressor.h"
#include "collectives/common/ring.h"

namespace {

using shoal::test::callOk;
using shoal::test::cudaTensor;
using shoal::test::cudaUsable;
using shoal::test::expectRefused;
using shoal::test::expectUsable;
using shoal::test::fakeDevicePointer;
using shoal::test::runRanks;
using Clock = std::chrono::steady_clock;

// ---- the device ring's schedule ------------------------------------------------

// Runs the ring of nccl_comm.cc's ringAllreduce on n simulated ranks (the
// sends of a step all happen before its receives, as in one NCCL group),
// with the CPU reducer, and returns every rank's result.
std::vector<std::vector<uint64_t>> simulateRing(const std::vector<std::vector<uint64_t>>& inputs, shoal_op_t op) {
  const int n = static_cast<int>(inputs.size());
  const size_t count = inputs[0].size();
  shoal::Reducer reducer(SHOAL_U64, op);
  std::vector<std::vector<uint64_t>> data = inputs;
  auto block = [&](int b) { return shoal::ring::blockOf(count, n, b); };
  for (int step = 0; step + 1 < n; ++step) {
    std::vector<std::vector<uint64_t>> wire(n);  // wire[r]: what rank r sent right
    for (int r = 0; r < n; ++r) {
      shoal::ring::Block out = block(shoal::ring::reduceScatterStep(r, n, step).sendBlock);
      wire[r].assign(data[r].begin() + out.offset, data[r].begin() + out.offset + out.count);
    }
    for (int r = 0; r < n; ++r) {
      int left = (r + n - 1) % n;
      shoal::ring::Step at = shoal::ring::reduceScatterStep(r, n, step);
      EXPECT_EQ(at.receiveBlock, shoal::ring::reduceScatterStep(left, n, step).sendBlock)
          << "n " << n << " step " << step;
      shoal::ring::Block in = block(at.receiveBlock);
      EXPECT_EQ(wire[left].size(), in.count);
      reducer.combine(data[r].data() + in.offset, wire[left].data(), in.count);
    }
  }
  for (int step = 0; step + 1 < n; ++step) {
    std::vector<std::vector<uint64_t>> wire(n);
    for (int r = 0; r < n; ++r) {
      shoal::ring::Block out = block(shoal::ring::allgatherStep(r, n, step).sendBlock);
      wire[r].assign(data[r].begin() + out.offset, data[r].begin() + out.offset + out.count);
    }
    for (int r = 0; r < n; ++r) {
      int left = (r + n - 1) % n;
      shoal::ring::Step at = shoal::ring::allgatherStep(r, n, step);
      EXPECT_EQ(at.receiveBlock, shoal::ring::allgatherStep(left, n, step).sendBlock);
      shoal::ring::Block in = block(at.receiveBlock);
      std::copy(wire[left].begin(), wire[left].end(), data[r].begin() + in.offset);
    }
  }
  return data;
}

TEST(DeviceRingSchedule, BlocksTileTheBuffer) {
  for (int n : {1, 2, 3, 5, 8})
    for (size_t count : {size_t(0), size_t(1), size_t(4), size_t(7), size_t(1000)}) {
      size_t next = 0;
      for (int b = 0; b < n; ++b) {
        shoal::ring::Block range = shoal::ring::blockOf(count, n, b);
        EXPECT_EQ(range.offset, next) << "n " << n << " count " << count << " block " << b;
        next += range.count;
        EXPECT_LE(range.count, count / n + 1);
      }
      EXPECT_EQ(next, count);
    }
}

// The device ring splits a buffer exactly as the host ring does, which is
// what lets the two agree bit for bit.
TEST(DeviceRingSchedule, BlocksAreTheHostRingsBlocks) {
  for (int n : {1, 2, 3, 5, 8})
    for (size_t count : {size_t(0), size_t(1), size_t(7), size_t(1000), size_t(65537)}) {
      shoal::Blocks host = shoal::splitEvenly(count, 4, n, 1 << 20, 2 * n);
      for (int b = 0; b < n; ++b) {
        shoal::ring::Block range = shoal::ring::blockOf(count, n, b);
        EXPECT_EQ(range.offset * 4, host.offset[b]) << "n " << n << " count " << count << " block " << b;
        EXPECT_EQ(range.count * 4, host.bytes[b]) << "n " << n << " count " << count << " block " << b;
      }
    }
}

// Sum and xor of random words catch a block combined twice or never; every
// rank must end with the fold of all inputs.
TEST(DeviceRingSchedule, SimulatedRingReducesEveryBlockOnce) {
  std::mt19937_64 random(7);
  for (shoal_op_t op : {SHOAL_SUM, SHOAL_BXOR, SHOAL_BOR})
    for (int n : {1, 2, 3, 4, 5, 7, 8})
      for (size_t count : {size_t(0), size_t(1), size_t(3), size_t(8), size_t(9), size_t(101)}) {
        std::vector<std::vector<uint64_t>> inputs(n, std::vector<uint64_t>(count));
        for (auto& input : inputs)
          for (uint64_t& word : input) word = random() & (op == SHOAL_BOR ? 0x0101010101010101ull : ~0ull);
        std::vector<uint64_t> expected = inputs[0];
        shoal::Reducer reducer(SHOAL_U64, op);
        for (int r = 1; r < n; ++r) reducer.combine(expected.data(), inputs[r].data(), count);
        std::vector<std::vector<uint64_t>> results = simulateRing(inputs, op);
        for (int r = 0; r < n; ++r)
          ASSERT_EQ(results[r], expected) << "op " << shoal_op_name(op) << " n " << n << " count " << count
                                          << " rank " << r;
      }
}

// ---- routing by memory kind -------------------------------------------------------

constexpr double kTimeoutS = shoal::test::kRoutingTimeoutS;

TEST(MemoryRouting, MixedMemoryKindsFailOnEveryRank) {
  const int n = 3;
  runRanks(n, [&](int rank, shoal_comm_t comm) {
    float host[4] = {1, 2, 3, 4};
    shoal_tensor_t input = cudaTensor(fakeDevicePointer(), 4, SHOAL_F32);
    shoal_tensor_t output = rank == 0 ? shoal_tensor_1d(host, 4, SHOAL_F32) : input;  // rank 0: CUDA in, host out
    Clock::time_point start = Clock::now();
    shoal_status_t status = shoal_allreduce_tensor(comm, &input, &output, SHOAL_SUM, nullptr);
    if (rank == 0) {
      expectRefused(status, SHOAL_ERR_INVALID_ARGUMENT, comm, start, {"different memory kinds", "both in host"},
                    "mixed kinds");
    } else if (cudaUsable()) {  // its own refusal (the fake pointer) or rank 0's
      expectRefused(status, SHOAL_ERR_INVALID_ARGUMENT, comm, start, {}, "peer of a mixed-kind rank");
    } else {
      expectRefused(status, SHOAL_ERR_UNSUPPORTED, comm, start, {"CUDA"}, "CUDA tensors without CUDA");
    }
    expectUsable(comm, n);
  }, {nullptr, kTimeoutS});
}

// A bad argument on one rank of a CUDA call reaches the others through the
// agreement round at once, instead of leaving them to wait for the deadline.
TEST(MemoryRouting, BadArgumentOfACudaCallFailsEveryRankAtOnce) {
  const int n = 3;
  runRanks(n, [&](int rank, shoal_comm_t comm) {
    shoal_tensor_t input = cudaTensor(fakeDevicePointer(0), 64, SHOAL_F32);
    shoal_tensor_t output = cudaTensor(fakeDevicePointer(1), 64, rank == 2 ? SHOAL_F64 : SHOAL_F32);
    Clock::time_point start = Clock::now();
    shoal_status_t status = shoal_allreduce_tensor(comm, &input, &output, SHOAL_MAX, nullptr);
    if (rank == 2)
      expectRefused(status, SHOAL_ERR_INVALID_ARGUMENT, comm, start, {"output dtype double differs"}, "dtype");
    else if (cudaUsable())  // its own refusal (the fake pointer) or rank 2's
      expectRefused(status, SHOAL_ERR_INVALID_ARGUMENT, comm, start, {}, "peer of a bad rank");
    else
      expectRefused(status, SHOAL_ERR_UNSUPPORTED, comm, start, {"CUDA"}, "CUDA tensors without CUDA");
    expectUsable(comm, n);
  }, {nullptr, kTimeoutS});
}

TEST(MemoryRouting, UnknownMemoryKindIsRefusedOnEveryRank) {
  const int n = 2;
  runRanks(n, [&](int rank, shoal_comm_t comm) {
    float data[2] = {};
    shoal_tensor_t tensor = shoal_tensor_1d(data, 2, SHOAL_F32);
    if (rank == 1) tensor.memory = static_cast<shoal_memory_t>(7);
    shoal_status_t status = shoal_allreduce_tensor(comm, &tensor, &tensor, SHOAL_SUM, nullptr);
    if (rank == 1) {
      EXPECT_EQ(status, SHOAL_ERR_INVALID_ARGUMENT) << shoal_last_error(comm);
      EXPECT_NE(std::string(shoal_last_error(comm)).find("memory 7 is not a shoal_memory_t"), std::string::npos)
          << shoal_last_error(comm);
    } else {
      // Rank 0 made a host call while rank 1 joined the CUDA agreement: the
      // ranks disagree, which fails both (how depends on which messages met).
      EXPECT_NE(status, SHOAL_OK) << "a rank whose peer passed an invalid memory kind succeeded";
    }
  }, {nullptr, 10});
}

TEST(MemoryRouting, DeviceOrdinalOutOfRange) {
  const int n = 2;
  runRanks(n, [&](int, shoal_comm_t comm) {
    shoal_tensor_t tensor = cudaTensor(fakeDevicePointer(), 16, SHOAL_F32, 4096);
    Clock::time_point start = Clock::now();
    shoal_status_t status = shoal_allreduce_tensor(comm, &tensor, &tensor, SHOAL_SUM, nullptr);
    if (cudaUsable())
      expectRefused(status, SHOAL_ERR_INVALID_ARGUMENT, comm, start, {"device 4096", "use 0.."}, "device 4096");
    else
      expectRefused(status, SHOAL_ERR_UNSUPPORTED, comm, start, {"CUDA", "host tensors"}, "no CUDA here");
    expectUsable(comm, n);
  }, {nullptr, kTimeoutS});
}

TEST(MemoryRouting, CudaTensorsWithoutCudaAreUnsupportedEverywhere) {
  if (cudaUsable()) GTEST_SKIP() << "this build and machine run CUDA calls (tests/cuda covers them)";
  const int n = 2;
  runRanks(n, [&](int, shoal_comm_t comm) {
    shoal_tensor_t input = cudaTensor(fakeDevicePointer(), 8, SHOAL_I32);
    shoal_tensor_t output = cudaTensor(fakeDevicePointer(1), 8 * n, SHOAL_I32);
    Clock::time_point start = Clock::now();
    expectRefused(shoal_allreduce_tensor(comm, &input, &input, SHOAL_BOR, nullptr), SHOAL_ERR_UNSUPPORTED, comm,
                  start, {"shoal_allreduce_tensor", "CUDA"}, "allreduce");
    start = Clock::now();
    expectRefused(shoal_allgather_tensor(comm, &input, &output), SHOAL_ERR_UNSUPPORTED, comm, start,
                  {"shoal_allgather_tensor", "CUDA"}, "allgather");
    start = Clock::now();
    expectRefused(shoal_broadcast_tensor(comm, &input, 1), SHOAL_ERR_UNSUPPORTED, comm, start,
                  {"shoal_broadcast_tensor", "CUDA"}, "broadcast");
    start = Clock::now();
    expectRefused(shoal_reduce_scatter_tensor(comm, &output, &input, SHOAL_SUM), SHOAL_ERR_UNSUPPORTED, comm, start,
                  {"shoal_reduce_scatter_tensor", "CUDA"}, "reduce_scatter");
    expectUsable(comm, n);
  }, {nullptr, kTimeoutS});
}

// ncclReduceScatter has no bitwise reduction: refused on every rank in every
// build, before readiness (the fix is the op, whatever the machine).
TEST(MemoryRouting, ReduceScatterOfCudaTensorsRefusesBitwiseOpsOnEveryRank) {
  const int n = 3;
  runRanks(n, [&](int rank, shoal_comm_t comm) {
    shoal_tensor_t input = cudaTensor(fakeDevicePointer(0), 4 * n, SHOAL_I32);
    shoal_tensor_t output = cudaTensor(fakeDevicePointer(1), 4, SHOAL_I32);
    Clock::time_point start = Clock::now();
    shoal_status_t status = shoal_reduce_scatter_tensor(comm, &input, &output, rank == 1 ? SHOAL_BXOR : SHOAL_SUM);
    if (rank == 1)
      expectRefused(status, SHOAL_ERR_UNSUPPORTED, comm, start,
                    {"shoal_reduce_scatter_tensor", "NCCL has no bxor", "shoal_allreduce_tensor"}, "bxor");
    else if (cudaUsable())  // its own refusal (the fake pointer) or rank 1's
      EXPECT_NE(status, SHOAL_OK) << "a peer of a rank that refused succeeded";
    else
      expectRefused(status, SHOAL_ERR_UNSUPPORTED, comm, start, {"CUDA"}, "CUDA tensors without CUDA");
    expectUsable(comm, n);
  }, {nullptr, kTimeoutS});
}

// A wrong size on one rank of a CUDA reduce-scatter reaches the others at once.
TEST(MemoryRouting, ReduceScatterSizeRefusalReachesEveryRank) {
  const int n = 3;
  runRanks(n, [&](int rank, shoal_comm_t comm) {
    shoal_tensor_t input = cudaTensor(fakeDevicePointer(0), rank == 0 ? 4 * n + 1 : 4 * n, SHOAL_F32);
    shoal_tensor_t output = cudaTensor(fakeDevicePointer(1), 4, SHOAL_F32);
    Clock::time_point start = Clock::now();
    shoal_status_t status = shoal_reduce_scatter_tensor(comm, &input, &output, SHOAL_AVG);
    if (rank == 0)
      expectRefused(status, SHOAL_ERR_INVALID_ARGUMENT, comm, start, {"input has 13 elements", "world size x output"},
                    "size");
    else if (cudaUsable())
      expectRefused(status, SHOAL_ERR_INVALID_ARGUMENT, comm, start, {}, "peer of a bad rank");
    else
      expectRefused(status, SHOAL_ERR_UNSUPPORTED, comm, start, {"shoal_reduce_scatter_tensor", "CUDA"},
                    "CUDA tensors without CUDA");
    expectUsable(comm, n);
  }, {nullptr, kTimeoutS});
}

// The driver's refusals of a CUDA allreduce name the entry point the caller
// used (the route records it): the async runtime runs CUDA allreduces through
// the driver with a route named shoal_iallreduce (runtime/cuda_requests.cc),
// whose users never called shoal_allreduce_tensor.
TEST(MemoryRouting, DriverRefusalsNameTheCallersEntryPoint) {
  const int n = 2;
  runRanks(n, [&](int, shoal_comm_t comm) {
    shoal_tensor_t tensor = cudaTensor(fakeDevicePointer(), 16, SHOAL_F32);
    Clock::time_point start = Clock::now();
    shoal_status_t status = shoal::enter(comm, "routing-test", [&](shoal::Call& call) {
      shoal::MemoryRoute route = shoal::routeOf("shoal_iallreduce", {&tensor, &tensor});
      shoal::allreduceTensor(call.comm(), call.sequence(), tensor, tensor, SHOAL_SUM, nullptr, route);
    });
    // No CUDA: unsupported; a device: the fake pointer is not device memory.
    expectRefused(status, cudaUsable() ? SHOAL_ERR_INVALID_ARGUMENT : SHOAL_ERR_UNSUPPORTED, comm, start,
                  {"shoal_iallreduce: "}, "async allreduce's refusal");
    EXPECT_EQ(std::string(shoal_last_error(comm)).find("shoal_allreduce_tensor"), std::string::npos)
        << shoal_last_error(comm);
    expectUsable(comm, n);
  }, {nullptr, kTimeoutS});
}

// The example plugin qint8 (built into SHOAL_TEST_PLUGIN_DIR in the project's
// build) runs on host tensors only: with every built-in able to run on CUDA
// tensors, it is the compressor the refusal test needs. Set before the
// registry is first read.
#ifdef SHOAL_TEST_PLUGIN_DIR
const bool kExamplePluginPath = [] {
  setenv("SHOAL_PLUGIN_PATH", SHOAL_TEST_PLUGIN_DIR, /*overwrite=*/0);
  return true;
}();
#endif

// A compressor that cannot run on CUDA tensors (no SHOAL_CAP_CUDA) and compresses f32.
std::string hostOnlyCompressor() {
  for (const shoal::plugin::Entry& entry : shoal::plugin::Registry::current().entries()) {
    const shoal_compressor_t& table = *entry.table;
    if (!(table.caps & SHOAL_CAP_CUDA) && (table.dtypes >> SHOAL_F32) & 1u && std::string(table.name) != "none")
      return table.name;
  }
  return "";
}

TEST(MemoryRouting, CompressorWithoutCudaCapabilityIsRefusedOnEveryRank) {
  std::string compressor = hostOnlyCompressor();
#ifdef SHOAL_TEST_PLUGIN_DIR
  ASSERT_FALSE(compressor.empty()) << "the example plugin qint8 (host only) was not found in " SHOAL_TEST_PLUGIN_DIR;
#endif
  if (compressor.empty()) GTEST_SKIP() << "every compressor here runs on CUDA tensors";
  const int n = 3;
  runRanks(n, [&](int, shoal_comm_t comm) {
    shoal_tensor_t tensor = cudaTensor(fakeDevicePointer(), 1024, SHOAL_F32);
    shoal_allreduce_options_t options = SHOAL_ALLREDUCE_OPTIONS_INIT;
    options.compressor = compressor.c_str();
    options.name = "grad";
    options.compress_min_bytes = 0;
    Clock::time_point start = Clock::now();
    expectRefused(shoal_allreduce_tensor(comm, &tensor, &tensor, SHOAL_SUM, &options), SHOAL_ERR_UNSUPPORTED, comm,
                  start, {compressor, "SHOAL_CAP_CUDA", "never stages"}, "host-only compressor");
    expectUsable(comm, n);
  }, {nullptr, kTimeoutS});
}

// ---- the tensor variants on host memory ------------------------------------------

TEST(TensorCalls, HostReduceScatter) {
  const int n = 3;
  runRanks(n, [&](int rank, shoal_comm_t comm) {
    // Element j of every rank's input is j + 100 x rank: block r of the sum is (j x n + 300) for j in block r.
    std::vector<int64_t> send(2 * n), recv(2, -1);
    for (int j = 0; j < 2 * n; ++j) send[j] = j + 100 * rank;
    const std::vector<int64_t> original = send;
    shoal_tensor_t input = shoal_tensor_1d(send.data(), send.size(), SHOAL_I64);
    shoal_tensor_t output = shoal_tensor_1d(recv.data(), recv.size(), SHOAL_I64);
    if (callOk(shoal_reduce_scatter_tensor(comm, &input, &output, SHOAL_SUM), comm, "reduce_scatter"))
      for (int i = 0; i < 2; ++i) EXPECT_EQ(recv[i], (2 * rank + i) * n + 100 * n * (n - 1) / 2) << "element " << i;
    EXPECT_EQ(send, original) << "the input changed";
    // In place: output is this rank's block of input; min of the blocks.
    shoal_tensor_t own = shoal_tensor_1d(send.data() + 2 * rank, 2, SHOAL_I64);
    if (callOk(shoal_reduce_scatter_tensor(comm, &input, &own, SHOAL_MIN), comm, "reduce_scatter in place"))
      for (int i = 0; i < 2; ++i) EXPECT_EQ(send[2 * rank + i], 2 * rank + i) << "element " << i;
    // A 2-D input of n x 2 and a 1-D output: shapes may differ, the counts may not.
    shoal_tensor_t matrix = shoal_tensor_1d(send.data(), send.size(), SHOAL_I64);
    matrix.ndim = 2;
    matrix.shape[0] = n;
    matrix.shape[1] = 2;
    EXPECT_TRUE(callOk(shoal_reduce_scatter_tensor(comm, &matrix, &output, SHOAL_MAX), comm, "2-D input"));
    // Wrong sizes, dtypes and overlaps are refused on this rank (every rank passes them here).
    shoal_tensor_t big = shoal_tensor_1d(recv.data(), 3, SHOAL_I64);
    EXPECT_EQ(shoal_reduce_scatter_tensor(comm, &input, &big, SHOAL_SUM), SHOAL_ERR_INVALID_ARGUMENT);
    EXPECT_NE(std::string(shoal_last_error(comm)).find("world size x output"), std::string::npos)
        << shoal_last_error(comm);
    shoal_tensor_t other = shoal_tensor_1d(recv.data(), 2, SHOAL_F64);
    EXPECT_EQ(shoal_reduce_scatter_tensor(comm, &input, &other, SHOAL_SUM), SHOAL_ERR_INVALID_ARGUMENT);
    EXPECT_NE(std::string(shoal_last_error(comm)).find("output dtype double differs"), std::string::npos)
        << shoal_last_error(comm);
    shoal_tensor_t skewed = shoal_tensor_1d(send.data() + 1, 2, SHOAL_I64);
    EXPECT_EQ(shoal_reduce_scatter_tensor(comm, &input, &skewed, SHOAL_SUM), SHOAL_ERR_INVALID_ARGUMENT);
    EXPECT_NE(std::string(shoal_last_error(comm)).find("overlap"), std::string::npos) << shoal_last_error(comm);
    EXPECT_EQ(shoal_reduce_scatter_tensor(comm, nullptr, &output, SHOAL_SUM), SHOAL_ERR_INVALID_ARGUMENT);
    expectUsable(comm, n);
  }, {nullptr, kTimeoutS});
}

TEST(TensorCalls, HostAllgatherAndBroadcast) {
  const int n = 3;
  runRanks(n, [&](int rank, shoal_comm_t comm) {
    std::vector<int32_t> mine = {rank * 10, rank * 10 + 1};
    std::vector<int32_t> all(2 * n, -1);
    shoal_tensor_t input = shoal_tensor_1d(mine.data(), 2, SHOAL_I32);
    shoal_tensor_t output = shoal_tensor_1d(all.data(), 2 * n, SHOAL_I32);
    if (callOk(shoal_allgather_tensor(comm, &input, &output), comm, "allgather"))
      for (int r = 0; r < n; ++r) {
        EXPECT_EQ(all[2 * r], r * 10);
        EXPECT_EQ(all[2 * r + 1], r * 10 + 1);
      }
    std::vector<double> values = {rank + 0.5, -1.0 * rank};
    shoal_tensor_t tensor = shoal_tensor_1d(values.data(), 2, SHOAL_F64);
    if (callOk(shoal_broadcast_tensor(comm, &tensor, 2), comm, "broadcast")) {
      EXPECT_EQ(values[0], 2.5);
      EXPECT_EQ(values[1], -2.0);
    }
    // Wrong output size: refused on this rank, and the others fail with it or by the deadline.
    shoal_tensor_t small = shoal_tensor_1d(all.data(), 2 * n - 1, SHOAL_I32);
    shoal_status_t status = shoal_allgather_tensor(comm, &input, &small);
    EXPECT_EQ(status, SHOAL_ERR_INVALID_ARGUMENT) << shoal_last_error(comm);
    EXPECT_NE(std::string(shoal_last_error(comm)).find("world size x input"), std::string::npos)
        << shoal_last_error(comm);
    expectUsable(comm, n);
  }, {nullptr, kTimeoutS});
}

}  // namespace
