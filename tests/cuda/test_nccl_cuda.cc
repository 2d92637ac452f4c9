// The NCCL transport on a GPU machine: CUDA tensors through the C API against
// the host path on the same communicator, bit for bit where the math is the
// same (integers, min/max, integer-valued floats; shoal's own device ring
// against the host ring for any floats); and deadlines instead of hangs.
// One rank per visible device (NCCL takes one rank per device), as threads.
// Every test skips without a device.
#include <gtest/gtest.h>

#include <cuda_runtime_api.h>

#include <chrono>
#include <cstring>
#include <random>
#include <string>
#include <vector>

#include "comm/communicator.h"
#include "bootstrap/store.h"
#include "collectives/common/reducer.h"
#include "gpu/cuda/device.h"
#include "harness/cuda_routing.h"
#include "harness/harness.h"
#include "harness/rank_sync.h"
#include "plugin/registry.h"
#include "shoal/compressor.h"
#include "gpu/nccl/nccl_comm.h"

namespace {

using shoal::test::callOk;
using shoal::test::cudaTensor;
using shoal::test::runRanks;
using Clock = std::chrono::steady_clock;

int devicesOrSkipReason(std::string* why) { return shoal::cuda::deviceCount(why); }

#define DEVICES_OR_SKIP(devices)                                                   \
  std::string why_;                                                                \
  const int devices = devicesOrSkipReason(&why_);                                  \
  if (devices == 0) GTEST_SKIP() << "no CUDA device: " << why_;

// Device memory holding a copy of a host vector, on the current device.
struct DeviceCopy {
  void* data = nullptr;
  size_t bytes = 0;
  explicit DeviceCopy(const std::vector<uint8_t>& host) : bytes(host.size()) {
    EXPECT_EQ(cudaMalloc(&data, bytes > 0 ? bytes : 1), cudaSuccess);
    if (bytes > 0) EXPECT_EQ(cudaMemcpy(data, host.data(), bytes, cudaMemcpyHostToDevice), cudaSuccess);
  }
  ~DeviceCopy() { cudaFree(data); }
  std::vector<uint8_t> toHost() const {
    std::vector<uint8_t> host(bytes);
    if (bytes > 0) EXPECT_EQ(cudaMemcpy(host.data(), data, bytes, cudaMemcpyDeviceToHost), cudaSuccess);
    return host;
  }
};

// -2, -1, 0, 1, 2 as f16 and bf16 bits.
const uint16_t kHalf[] = {0xc000, 0xbc00, 0x0000, 0x3c00, 0x4000};
const uint16_t kBFloat16[] = {0xc000, 0xbf80, 0x0000, 0x3f80, 0x4000};

// Elements whose reductions are exact in any order: small integers (as the
// dtype's values) for floats, any bits for integers (wrapping is associative).
std::vector<uint8_t> exactElements(shoal_dtype_t dtype, size_t count, std::mt19937_64& random) {
  size_t element = shoal::dtypeSize(dtype);
  std::vector<uint8_t> bytes(count * element);
  for (size_t i = 0; i < count; ++i) {
    uint64_t bits = random();
    int small = int(bits % 5) - 2;  // products and sums of a few ranks stay exact in every float type
    uint8_t* at = bytes.data() + i * element;
    switch (dtype) {
      case SHOAL_F32: { float v = float(small); std::memcpy(at, &v, 4); break; }
      case SHOAL_F64: { double v = double(small); std::memcpy(at, &v, 8); break; }
      case SHOAL_F16: std::memcpy(at, &kHalf[small + 2], 2); break;
      case SHOAL_BF16: std::memcpy(at, &kBFloat16[small + 2], 2); break;
      default: std::memcpy(at, &bits, element);
    }
  }
  return bytes;
}

TEST(NcclTransport, AllreduceOfCudaTensorsMatchesHost) {
  DEVICES_OR_SKIP(devices);
  const int n = std::min(devices, 8);
  runRanks(n, [&](int rank, shoal_comm_t comm) {
    ASSERT_EQ(cudaSetDevice(rank), cudaSuccess);
    std::mt19937_64 random(100 + rank);
    for (shoal_dtype_t dtype : {SHOAL_I32, SHOAL_U8, SHOAL_I64, SHOAL_F32, SHOAL_F64, SHOAL_F16, SHOAL_BF16})
      for (int o = 0; o < SHOAL_OP_COUNT; ++o) {
        auto op = static_cast<shoal_op_t>(o);
        if (!shoal::isValidDtypeOp(dtype, op)) continue;
        for (size_t count : {size_t(0), size_t(1), size_t(7), size_t(100003)}) {
          std::string what = std::string(shoal_dtype_name(dtype)) + " " + shoal_op_name(op) + " count " +
                             std::to_string(count) + " rank " + std::to_string(rank);
          std::vector<uint8_t> input = exactElements(dtype, count, random), expected(input.size());
          if (!callOk(shoal_allreduce(comm, input.data(), expected.data(), count, dtype, op), comm, what)) return;
          DeviceCopy send(input), recv(std::vector<uint8_t>(input.size(), 0));
          shoal_tensor_t in = cudaTensor(send.data, count, dtype, rank);
          shoal_tensor_t out = cudaTensor(recv.data, count, dtype, rank);
          if (!callOk(shoal_allreduce_tensor(comm, &in, &out, op, nullptr), comm, what)) return;
          EXPECT_EQ(recv.toHost(), expected) << what;
          EXPECT_EQ(send.toHost(), input) << what << ": the input changed";
        }
      }
  });
}

TEST(NcclTransport, AllgatherAndBroadcastOfCudaTensorsMatchHost) {
  DEVICES_OR_SKIP(devices);
  const int n = std::min(devices, 8);
  runRanks(n, [&](int rank, shoal_comm_t comm) {
    ASSERT_EQ(cudaSetDevice(rank), cudaSuccess);
    std::mt19937_64 random(7 + rank);
    cudaStream_t stream = nullptr;
    ASSERT_EQ(cudaStreamCreate(&stream), cudaSuccess);
    for (size_t count : {size_t(0), size_t(1), size_t(4099)}) {
      std::vector<uint8_t> mine = exactElements(SHOAL_U32, count, random), all(mine.size() * n);
      if (!callOk(shoal_allgather(comm, mine.data(), all.data(), count, SHOAL_U32), comm, "host allgather")) return;
      DeviceCopy send(mine), gathered(std::vector<uint8_t>(all.size(), 0));
      shoal_tensor_t in = cudaTensor(send.data, count, SHOAL_U32, rank, stream);
      shoal_tensor_t out = cudaTensor(gathered.data, count * n, SHOAL_U32, rank, stream);
      if (!callOk(shoal_allgather_tensor(comm, &in, &out), comm, "CUDA allgather")) return;
      EXPECT_EQ(gathered.toHost(), all) << "allgather count " << count;

      const int root = n - 1;
      std::vector<uint8_t> values = exactElements(SHOAL_F64, count, random), broadcast = values;
      if (!callOk(shoal_broadcast(comm, broadcast.data(), broadcast.data(), count, SHOAL_F64, root), comm,
                  "host broadcast"))
        return;
      DeviceCopy device(values);
      shoal_tensor_t tensor = cudaTensor(device.data, count, SHOAL_F64, rank, stream);
      if (!callOk(shoal_broadcast_tensor(comm, &tensor, root), comm, "CUDA broadcast")) return;
      EXPECT_EQ(device.toHost(), broadcast) << "broadcast count " << count;
    }
    cudaStreamDestroy(stream);
  });
}

// ncclReduceScatter through shoal_reduce_scatter_tensor against the host
// reduce-scatter, out of place and in place, for the ops NCCL has; counts
// that disagree between ranks are a MISMATCH on every rank.
TEST(NcclTransport, ReduceScatterOfCudaTensorsMatchesHost) {
  DEVICES_OR_SKIP(devices);
  const int n = std::min(devices, 8);
  runRanks(n, [&](int rank, shoal_comm_t comm) {
    ASSERT_EQ(cudaSetDevice(rank), cudaSuccess);
    std::mt19937_64 random(300 + rank);
    for (shoal_dtype_t dtype : {SHOAL_I32, SHOAL_U8, SHOAL_F32, SHOAL_F64, SHOAL_F16, SHOAL_BF16})
      for (shoal_op_t op : {SHOAL_SUM, SHOAL_AVG, SHOAL_PROD, SHOAL_MIN, SHOAL_MAX})
        for (size_t count : {size_t(0), size_t(1), size_t(4099)}) {
          const std::string what = std::string("reduce_scatter ") + shoal_dtype_name(dtype) + " " +
                                   shoal_op_name(op) + " count " + std::to_string(count) + " rank " +
                                   std::to_string(rank);
          const size_t element = shoal::dtypeSize(dtype);
          std::vector<uint8_t> input = exactElements(dtype, count * n, random), expected(count * element);
          if (!callOk(shoal_reduce_scatter(comm, input.data(), expected.data(), count, dtype, op), comm, what))
            return;
          DeviceCopy send(input), recv(std::vector<uint8_t>(expected.size(), 0));
          shoal_tensor_t in = cudaTensor(send.data, count * n, dtype, rank);
          shoal_tensor_t out = cudaTensor(recv.data, count, dtype, rank);
          if (!callOk(shoal_reduce_scatter_tensor(comm, &in, &out, op), comm, what)) return;
          EXPECT_EQ(recv.toHost(), expected) << what;
          EXPECT_EQ(send.toHost(), input) << what << ": the input changed";
          // In place: the output is this rank's block of the input.
          shoal_tensor_t own = cudaTensor(static_cast<uint8_t*>(send.data) + rank * count * element, count, dtype,
                                          rank);
          if (!callOk(shoal_reduce_scatter_tensor(comm, &in, &own, op), comm, what + " in place")) return;
          std::vector<uint8_t> after = send.toHost();
          EXPECT_EQ(std::vector<uint8_t>(after.begin() + rank * count * element,
                                         after.begin() + (rank + 1) * count * element),
                    expected)
              << what << " in place";
        }
    if (n < 2) return;
    DeviceCopy send(std::vector<uint8_t>(4 * 8 * n, 0)), recv(std::vector<uint8_t>(4 * 8, 0));
    const size_t count = rank == 0 ? 7 : 8;
    shoal_tensor_t in = cudaTensor(send.data, count * n, SHOAL_F32, rank);
    shoal_tensor_t out = cudaTensor(recv.data, count, SHOAL_F32, rank);
    EXPECT_EQ(shoal_reduce_scatter_tensor(comm, &in, &out, SHOAL_SUM), SHOAL_ERR_MISMATCH) << shoal_last_error(comm);
  });
}

// shoal's own device ring takes the same steps in the same order as the host
// ring, so even float sums of arbitrary values agree bit for bit.
TEST(NcclTransport, DeviceRingMatchesHostRingBitForBit) {
  DEVICES_OR_SKIP(devices);
  const int n = std::min(devices, 8);
  runRanks(n, [&](int rank, shoal_comm_t comm) {
    ASSERT_EQ(cudaSetDevice(rank), cudaSuccess);
    std::mt19937 random(31 + rank);
    std::uniform_real_distribution<float> uniform(-1000.0f, 1000.0f);
    // The first CUDA call creates the NCCL communicator; then the test drives its ring directly.
    DeviceCopy warm(std::vector<uint8_t>(4, 0));
    shoal_tensor_t warmTensor = cudaTensor(warm.data, 1, SHOAL_F32, rank);
    if (!callOk(shoal_allreduce_tensor(comm, &warmTensor, &warmTensor, SHOAL_MAX, nullptr), comm, "first CUDA call"))
      return;
    ASSERT_TRUE(comm->nccl);
    for (shoal_op_t op : {SHOAL_SUM, SHOAL_AVG, SHOAL_PROD}) {
      for (size_t count : {size_t(1), size_t(n + 1), size_t(65537)}) {
        std::vector<float> values(count);
        for (float& v : values) v = op == SHOAL_PROD ? 1.0f + uniform(random) / 4000.0f : uniform(random);
        std::vector<uint8_t> bytes(count * 4);
        std::memcpy(bytes.data(), values.data(), bytes.size());
        std::vector<uint8_t> expected(bytes.size());
        if (!callOk(shoal_allreduce(comm, bytes.data(), expected.data(), count, SHOAL_F32, op), comm, "host ring"))
          return;
        DeviceCopy data(bytes);
        comm->nccl->ringAllreduce(data.data, data.data, count, SHOAL_F32, op, nullptr, shoal::deadlineAfter(60));
        EXPECT_EQ(data.toHost(), expected) << shoal_op_name(op) << " count " << count << " rank " << rank;
      }
    }
  }, {"ring", 60});
}

// A compressor that runs on CUDA tensors and promises the exact result must
// give what the host path gives.
TEST(NcclTransport, LosslessCudaCompressorsMatchHost) {
  DEVICES_OR_SKIP(devices);
  std::vector<std::string> names;
  for (const shoal::plugin::Entry& entry : shoal::plugin::Registry::current().entries()) {
    const shoal_compressor_t& table = *entry.table;
    if ((table.caps & SHOAL_CAP_CUDA) && (table.caps & SHOAL_CAP_LOSSLESS) && ((table.dtypes >> SHOAL_F32) & 1u))
      names.push_back(table.name);
  }
  if (names.empty()) GTEST_SKIP() << "no lossless compressor with SHOAL_CAP_CUDA takes f32 in this build";
  const int n = std::min(devices, 8);
  runRanks(n, [&](int rank, shoal_comm_t comm) {
    ASSERT_EQ(cudaSetDevice(rank), cudaSuccess);
    std::mt19937_64 random(5 + rank);
    for (const std::string& name : names) {
      const size_t count = 1 << 16;
      std::vector<uint8_t> input = exactElements(SHOAL_F32, count, random), expected(input.size());
      for (size_t i = 0; i < count; i += 3) std::memset(input.data() + 4 * i, 0, 4);  // some sparsity
      if (!callOk(shoal_allreduce(comm, input.data(), expected.data(), count, SHOAL_F32, SHOAL_SUM), comm, name))
        return;
      DeviceCopy data(input);
      shoal_tensor_t tensor = cudaTensor(data.data, count, SHOAL_F32, rank);
      shoal_allreduce_options_t options = SHOAL_ALLREDUCE_OPTIONS_INIT;
      options.compressor = name.c_str();
      options.compress_min_bytes = 0;
      options.name = "lossless";
      if (!callOk(shoal_allreduce_tensor(comm, &tensor, &tensor, SHOAL_SUM, &options), comm, name)) return;
      EXPECT_EQ(data.toHost(), expected) << name;
    }
  });
}

// Host memory described as CUDA memory is refused before NCCL sees it, on
// every rank, and the communicator stays usable.
TEST(NcclTransport, HostPointerLabelledCudaIsRefusedEverywhere) {
  DEVICES_OR_SKIP(devices);
  const int n = std::min(devices, 8);
  runRanks(n, [&](int rank, shoal_comm_t comm) {
    ASSERT_EQ(cudaSetDevice(rank), cudaSuccess);
    std::vector<float> host(64, 1.0f);
    DeviceCopy device(std::vector<uint8_t>(64 * 4, 0));
    // The last rank lies about its input; the others pass real device memory.
    void* data = rank == n - 1 ? static_cast<void*>(host.data()) : device.data;
    shoal_tensor_t input = cudaTensor(data, 64, SHOAL_F32, rank);
    shoal_status_t status = shoal_allreduce_tensor(comm, &input, &input, SHOAL_SUM, nullptr);
    EXPECT_EQ(status, SHOAL_ERR_INVALID_ARGUMENT) << shoal_last_error(comm);
    std::string text = shoal_last_error(comm);
    EXPECT_NE(text.find(rank == n - 1 ? "not CUDA memory of device" : "another rank"), std::string::npos) << text;
    int one = 1, sum = 0;
    if (callOk(shoal_allreduce(comm, &one, &sum, 1, SHOAL_I32, SHOAL_SUM), comm, "host allreduce after"))
      EXPECT_EQ(sum, n);
  });
}

// NCCL's initialisation waits for every rank: a rank that never comes is the
// deadline's business, and the wait ends with an error, not a hang.
TEST(NcclTransport, PeerThatNeverJoinsIsADeadline) {
  DEVICES_OR_SKIP(devices);
  shoal::StoreOptions storeOptions;
  storeOptions.url = shoal::test::freshMemoryStore();
  std::unique_ptr<shoal::Store> store = shoal::makeStore(storeOptions);
  for (int rank : {0, 1}) {
    shoal::nccl::Options options;
    options.store = store.get();
    options.key = "nccl-test/" + std::to_string(rank) + "/id";  // rank 1 finds no id: its peer never came
    options.rank = rank;
    options.size = 2;
    options.device = 0;
    options.deadline = shoal::deadlineAfter(3);
    Clock::time_point start = Clock::now();
    try {
      shoal::nccl::Communicator::create(options);
      ADD_FAILURE() << "rank " << rank << " of 2 initialised NCCL alone";
    } catch (const shoal::Error& error) {
      EXPECT_EQ(error.status(), SHOAL_ERR_TIMEOUT) << "rank " << rank << ": " << error.what();
    }
    double waited = std::chrono::duration<double>(Clock::now() - start).count();
    EXPECT_GE(waited, 2.5) << "rank " << rank;
    EXPECT_LT(waited, 30) << "rank " << rank << ": the deadline was not kept";
  }
}

}  // namespace
