// The async runtime on CUDA tensors (docs/gpu.md, "Async requests on CUDA
// tensors"): iallreduce, iallgather, ibroadcast, ireduce_scatter and ialltoall of device memory against
// the values every rank can compute, with host requests of the same cycle
// beside them (those fuse; the CUDA ones never do, which the stats show), and
// a host/CUDA disagreement on one name as MISMATCH on every rank. One rank per
// visible device, at most four, as threads; skips without a device.
#include <gtest/gtest.h>

#include <cuda_runtime_api.h>

#include <algorithm>
#include <cstdint>
#include <string>
#include <vector>

#include "gpu/cuda/device.h"
#include "harness/harness.h"
#include "harness/rank_sync.h"
#include "runtime/async_helpers.h"

namespace {

using shoal::test::asyncStats;
using shoal::test::callOk;
using shoal::test::runRanks;
using shoal::test::ScopedEnv;
using shoal::test::waitAndFree;

struct DeviceFloats {
  float* data = nullptr;
  size_t count = 0;
  explicit DeviceFloats(const std::vector<float>& host) : count(host.size()) {
    EXPECT_EQ(cudaMalloc(reinterpret_cast<void**>(&data), std::max<size_t>(count, 1) * sizeof(float)), cudaSuccess);
    EXPECT_EQ(cudaMemcpy(data, host.data(), count * sizeof(float), cudaMemcpyHostToDevice), cudaSuccess);
  }
  ~DeviceFloats() { cudaFree(data); }
  std::vector<float> toHost() const {
    std::vector<float> host(count);
    EXPECT_EQ(cudaMemcpy(host.data(), data, count * sizeof(float), cudaMemcpyDeviceToHost), cudaSuccess);
    return host;
  }
  shoal_tensor_t tensor(int device) const {
    shoal_tensor_t t = shoal_tensor_1d(data, count, SHOAL_F32);
    t.memory = SHOAL_MEMORY_CUDA;
    t.device = device;
    return t;
  }
};

int devicesOrSkip(std::string* why) { return shoal::cuda::deviceCount(why); }

TEST(AsyncCudaDevice, AllreduceAllgatherBroadcastOfDeviceTensorsBesideHostOnes) {
  std::string why;
  const int devices = devicesOrSkip(&why);
  if (devices == 0) GTEST_SKIP() << "no CUDA device: " << why;
  const int n = std::min(devices, 4);
  ScopedEnv env{{"SHOAL_FUSION_THRESHOLD", "1048576"}, {"SHOAL_CYCLE_TIME_MS", "5"}};
  runRanks(n, [&](int rank, shoal_comm_t comm) {
    ASSERT_EQ(cudaSetDevice(rank), cudaSuccess);
    const size_t count = 1001;
    std::vector<float> mine(count);
    for (size_t i = 0; i < count; ++i) mine[i] = float(rank + 1) * float(i % 7);
    DeviceFloats a(mine), b(mine), g(mine), gathered(std::vector<float>(count * n, -1)), bcast(mine);
    std::vector<float> hostIn(mine), hostOut(count, -1), hostIn2(mine), hostOut2(count, -1);
    ASSERT_TRUE(callOk(shoal_async_start(comm), comm, "shoal_async_start"));
    const shoal_async_stats_t before = asyncStats(comm);
    const shoal_tensor_t ta = a.tensor(rank), tb = b.tensor(rank), tg = g.tensor(rank), tc = bcast.tensor(rank);
    const shoal_tensor_t hi = shoal_tensor_1d(hostIn.data(), count, SHOAL_F32),
                         ho = shoal_tensor_1d(hostOut.data(), count, SHOAL_F32),
                         hi2 = shoal_tensor_1d(hostIn2.data(), count, SHOAL_F32),
                         ho2 = shoal_tensor_1d(hostOut2.data(), count, SHOAL_F32);
    std::vector<shoal_request_t> requests(6);
    ASSERT_TRUE(callOk(shoal_iallreduce(comm, "cuda.a", &ta, &ta, SHOAL_SUM, nullptr, &requests[0]), comm, "a"));
    ASSERT_TRUE(callOk(shoal_iallreduce(comm, "host.a", &hi, &ho, SHOAL_SUM, nullptr, &requests[1]), comm, "h"));
    ASSERT_TRUE(callOk(shoal_iallreduce(comm, "cuda.b", &tb, &tb, SHOAL_AVG, nullptr, &requests[2]), comm, "b"));
    ASSERT_TRUE(callOk(shoal_iallreduce(comm, "host.b", &hi2, &ho2, SHOAL_SUM, nullptr, &requests[3]), comm, "h2"));
    ASSERT_TRUE(callOk(shoal_iallgather(comm, "cuda.g", &tg, gathered.data, &requests[4]), comm, "g"));
    ASSERT_TRUE(callOk(shoal_ibroadcast(comm, "cuda.c", &tc, n - 1, &requests[5]), comm, "c"));
    EXPECT_EQ(waitAndFree(requests, 60, "rank " + std::to_string(rank)), 0);
    const float ranksSum = float(n * (n + 1) / 2);
    std::vector<float> sum(count), avg(count), last(count);
    for (size_t i = 0; i < count; ++i) {
      sum[i] = ranksSum * float(i % 7);
      avg[i] = sum[i] / float(n);
      last[i] = float(n) * float(i % 7);
    }
    EXPECT_EQ(a.toHost(), sum);
    EXPECT_EQ(hostOut, sum);
    EXPECT_EQ(hostOut2, sum);
    const std::vector<float> averaged = b.toHost();
    for (size_t i = 0; i < count; ++i) EXPECT_NEAR(averaged[i], avg[i], 1e-5f * std::max(1.0f, avg[i])) << i;
    EXPECT_EQ(bcast.toHost(), last);
    const std::vector<float> all = gathered.toHost();
    for (int r = 0; r < n; ++r) {
      std::vector<float> block(all.begin() + r * count, all.begin() + (r + 1) * count), input(count);
      for (size_t i = 0; i < count; ++i) input[i] = float(r + 1) * float(i % 7);
      EXPECT_EQ(block, input) << "block " << r;
    }
    // Six requests: the two host allreduces may share one collective, each CUDA one runs alone.
    const shoal_async_stats_t after = asyncStats(comm);
    EXPECT_EQ(after.tensors - before.tensors, 6u);
    EXPECT_GE(after.groups - before.groups, 5u);
  });
}

TEST(AsyncCudaDevice, HostOnOneRankAndCudaOnAnotherIsAMismatchEverywhere) {
  std::string why;
  const int devices = devicesOrSkip(&why);
  if (devices == 0) GTEST_SKIP() << "no CUDA device: " << why;
  runRanks(2, [&](int rank, shoal_comm_t comm) {
    // The disagreement is found in the negotiation, before any NCCL work: one device serves.
    ASSERT_EQ(cudaSetDevice(0), cudaSuccess);
    std::vector<float> host(16, 1.0f);
    DeviceFloats device(host);
    const shoal_tensor_t t = rank == 0 ? shoal_tensor_1d(host.data(), host.size(), SHOAL_F32) : device.tensor(0);
    shoal_request_t request = nullptr;
    ASSERT_TRUE(callOk(shoal_iallreduce(comm, "kind", &t, &t, SHOAL_SUM, nullptr, &request), comm, "submit"));
    EXPECT_EQ(shoal_wait(request, 60), SHOAL_ERR_MISMATCH);
    EXPECT_NE(std::string(shoal_request_error(request)).find("memory host memory vs CUDA memory"), std::string::npos)
        << shoal_request_error(request);
    shoal_request_free(request);
  });
}
// The async alltoall of device memory: even blocks and per-peer counts; what arrives is device
// memory the request holds (shoal_request_alltoall_result), rank p's block first.
TEST(AsyncCudaDevice, AlltoallOfDeviceTensorsGivesDeviceMemory) {
  std::string why;
  const int devices = devicesOrSkip(&why);
  if (devices == 0) GTEST_SKIP() << "no CUDA device: " << why;
  const int n = std::min(devices, 4);
  runRanks(n, [&](int rank, shoal_comm_t comm) {
    ASSERT_EQ(cudaSetDevice(rank), cudaSuccess);
    for (bool perPeer : {false, true}) {
      // Rank r sends rank p (p + 1) * (r + 1) elements per peer (per-peer form), or 3 (even form).
      std::vector<size_t> sendcounts(n);
      std::vector<float> send;
      for (int p = 0; p < n; ++p) {
        sendcounts[p] = perPeer ? size_t(p + 1) * size_t(rank + 1) : 3;
        for (size_t i = 0; i < sendcounts[p]; ++i) send.push_back(float(1000 * rank + 10 * p) + float(i));
      }
      DeviceFloats input(send);
      const shoal_tensor_t t = input.tensor(rank);
      shoal_request_t request = nullptr;
      const std::string name = perPeer ? "a2av" : "a2a";
      ASSERT_TRUE(callOk(shoal_ialltoall(comm, name.c_str(), &t, perPeer ? sendcounts.data() : nullptr, &request),
                         comm, name));
      ASSERT_EQ(shoal_wait(request, 60), SHOAL_OK) << shoal_request_error(request);
      const void* data = nullptr;
      size_t count = 0;
      std::vector<size_t> recvcounts(n);
      ASSERT_TRUE(callOk(shoal_request_alltoall_result(request, &data, &count, recvcounts.data()), comm, "result"));
      std::vector<float> expected;
      for (int r = 0; r < n; ++r) {
        const size_t from = perPeer ? size_t(rank + 1) * size_t(r + 1) : 3;
        EXPECT_EQ(recvcounts[r], from) << name << " from " << r;
        for (size_t i = 0; i < from; ++i) expected.push_back(float(1000 * r + 10 * rank) + float(i));
      }
      ASSERT_EQ(count, expected.size()) << name;
      cudaPointerAttributes attributes{};
      ASSERT_EQ(cudaPointerGetAttributes(&attributes, data), cudaSuccess) << name;
      EXPECT_EQ(attributes.type, cudaMemoryTypeDevice) << name << ": the result is not device memory";
      std::vector<float> got(count);
      ASSERT_EQ(cudaMemcpy(got.data(), data, count * sizeof(float), cudaMemcpyDeviceToHost), cudaSuccess);
      EXPECT_EQ(got, expected) << name;
      shoal_request_free(request);
    }
  });
}

// The async reduce-scatter of device memory: rank r gets its rows of dim 0 (rows / n each, one
// more on the first rows % n ranks) in its device output. Even rows under sum go through
// ncclReduceScatter; uneven rows and a bitwise op (i32 xor) through the CUDA allreduce and a copy
// of this rank's rows, so one device (n = 1) still runs both branches; an output inside the input.
TEST(AsyncCudaDevice, ReduceScatterOfDeviceTensorsGivesEveryRankItsRows) {
  std::string why;
  const int devices = devicesOrSkip(&why);
  if (devices == 0) GTEST_SKIP() << "no CUDA device: " << why;
  const int n = std::min(devices, 4);
  runRanks(n, [&](int rank, shoal_comm_t comm) {
    ASSERT_EQ(cudaSetDevice(rank), cudaSuccess);
    struct Case {
      const char* name;
      shoal_dtype_t dtype;
      shoal_op_t op;
      int64_t rows;
    };
    const Case cases[] = {{"even-sum", SHOAL_F32, SHOAL_SUM, 4 * n},
                          {"uneven-avg", SHOAL_F32, SHOAL_AVG, 2 * n + 1},
                          {"fewer-rows-max", SHOAL_F32, SHOAL_MAX, 1},
                          {"even-xor", SHOAL_I32, SHOAL_BXOR, 2 * n}};
    const int64_t row = 3;
    for (const Case& c : cases) {
      const size_t total = static_cast<size_t>(c.rows * row);
      const int64_t base = c.rows / n, extra = c.rows % n;
      const int64_t first = rank * base + std::min<int64_t>(rank, extra), mine = base + (rank < extra ? 1 : 0);
      // Rank r's element i: (r + 1) * (i % 7 + 1) as a float, or a bit pattern for xor.
      auto value = [&](int r, size_t i) { return (r + 1) * static_cast<int>(i % 7 + 1); };
      std::vector<int32_t> bits(total);
      std::vector<float> floats(total);
      for (size_t i = 0; i < total; ++i) {
        bits[i] = (1 << ((i + rank) % 16)) | rank;
        floats[i] = static_cast<float>(value(rank, i));
      }
      void* input = nullptr;
      void* output = nullptr;
      ASSERT_EQ(cudaMalloc(&input, total * 4), cudaSuccess);
      ASSERT_EQ(cudaMalloc(&output, std::max<size_t>(mine * row, 1) * 4), cudaSuccess);
      const void* host = c.dtype == SHOAL_I32 ? static_cast<const void*>(bits.data()) : floats.data();
      ASSERT_EQ(cudaMemcpy(input, host, total * 4, cudaMemcpyHostToDevice), cudaSuccess);
      shoal_tensor_t in = shoal_tensor_1d(input, total, c.dtype), out = shoal_tensor_1d(output, mine * row, c.dtype);
      in.ndim = out.ndim = 2;
      in.shape[0] = c.rows;
      out.shape[0] = mine;
      in.shape[1] = out.shape[1] = row;
      in.memory = out.memory = SHOAL_MEMORY_CUDA;
      in.device = out.device = rank;
      shoal_request_t request = nullptr;
      ASSERT_TRUE(callOk(shoal_ireduce_scatter(comm, c.name, &in, &out, c.op, &request), comm, c.name));
      ASSERT_EQ(shoal_wait(request, 60), SHOAL_OK) << c.name << ": " << shoal_request_error(request);
      shoal_request_free(request);
      std::vector<int32_t> gotBits(mine * row);
      std::vector<float> gotFloats(mine * row);
      void* got = c.dtype == SHOAL_I32 ? static_cast<void*>(gotBits.data()) : gotFloats.data();
      ASSERT_EQ(cudaMemcpy(got, output, mine * row * 4, cudaMemcpyDeviceToHost), cudaSuccess);
      for (int64_t k = 0; k < mine * row; ++k) {
        const size_t i = static_cast<size_t>(first * row + k);
        if (c.dtype == SHOAL_I32) {
          int32_t want = 0;
          for (int r = 0; r < n; ++r) want ^= (1 << ((i + r) % 16)) | r;
          EXPECT_EQ(gotBits[k], want) << c.name << " element " << i;
        } else {
          float sum = 0, max = static_cast<float>(value(0, i));
          for (int r = 0; r < n; ++r) {
            sum += static_cast<float>(value(r, i));
            max = std::max(max, static_cast<float>(value(r, i)));
          }
          const float want = c.op == SHOAL_SUM ? sum : c.op == SHOAL_AVG ? sum / static_cast<float>(n) : max;
          if (c.op == SHOAL_AVG)  // a sum of small integers, then one division (or its reciprocal's product)
            EXPECT_FLOAT_EQ(gotFloats[k], want) << c.name << " element " << i;
          else
            EXPECT_EQ(gotFloats[k], want) << c.name << " element " << i;
        }
      }
      cudaFree(input);
      cudaFree(output);
    }
    // The output inside the input, at its first rows on every rank: NCCL's in-place layout on
    // rank 0 only; every other rank's output overlaps rows it still sends, which the request
    // must not clobber before they are sent (it reduces into scratch there, as the host form).
    const int64_t rows = 2 * n;
    const size_t total = static_cast<size_t>(rows * row), mine = static_cast<size_t>(2 * row);
    std::vector<float> floats(total);
    for (size_t i = 0; i < total; ++i) floats[i] = static_cast<float>((rank + 1) * static_cast<int>(i % 7 + 1));
    DeviceFloats inout(floats);
    shoal_tensor_t in = inout.tensor(rank), out = inout.tensor(rank);
    in.ndim = out.ndim = 2;
    in.shape[0] = rows;
    out.shape[0] = 2;
    in.shape[1] = out.shape[1] = row;
    shoal_request_t request = nullptr;
    ASSERT_TRUE(callOk(shoal_ireduce_scatter(comm, "overlapping", &in, &out, SHOAL_SUM, &request), comm, "overlap"));
    ASSERT_EQ(shoal_wait(request, 60), SHOAL_OK) << shoal_request_error(request);
    shoal_request_free(request);
    const std::vector<float> got = inout.toHost();
    for (size_t k = 0; k < mine; ++k) {
      const size_t i = static_cast<size_t>(rank) * mine + k;
      float want = 0;
      for (int r = 0; r < n; ++r) want += static_cast<float>((r + 1) * static_cast<int>(i % 7 + 1));
      EXPECT_EQ(got[k], want) << "overlapping output, element " << i;
    }
  });
}

}  // namespace
