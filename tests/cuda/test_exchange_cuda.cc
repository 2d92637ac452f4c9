// alltoall(v), reduce, gather(v), scatter(v) and grouped send/recv on CUDA
// tensors over NCCL, against the host calls on the same communicator, bit for
// bit (integers); in place; per-peer count disagreements as MISMATCH on every
// rank. One rank per visible device (NCCL takes one rank per device), as
// threads. Every test skips without a device; the exchanges between ranks
// need two devices or more.
#include <gtest/gtest.h>

#include <cuda_runtime_api.h>

#include <cstring>
#include <numeric>
#include <string>
#include <vector>

#include "gpu/cuda/device.h"
#include "harness/harness.h"
#include "harness/rank_sync.h"

namespace {

using shoal::test::callOk;
using shoal::test::runRanks;

int devicesOrZero(std::string* why) { return shoal::cuda::deviceCount(why); }

// Device memory with a copy of host values, on the current device.
struct Device {
  void* data = nullptr;
  size_t count = 0;
  explicit Device(const std::vector<int32_t>& host) : count(host.size()) {
    EXPECT_EQ(cudaMalloc(&data, count > 0 ? count * 4 : 4), cudaSuccess);
    if (count > 0) EXPECT_EQ(cudaMemcpy(data, host.data(), count * 4, cudaMemcpyHostToDevice), cudaSuccess);
  }
  ~Device() { cudaFree(data); }
  std::vector<int32_t> toHost() const {
    std::vector<int32_t> host(count);
    if (count > 0) EXPECT_EQ(cudaMemcpy(host.data(), data, count * 4, cudaMemcpyDeviceToHost), cudaSuccess);
    return host;
  }
  shoal_tensor_t tensor(int device, size_t elements = SIZE_MAX) const {
    shoal_tensor_t t = shoal_tensor_1d(data, elements == SIZE_MAX ? count : elements, SHOAL_I32);
    t.memory = SHOAL_MEMORY_CUDA;
    t.device = device;
    return t;
  }
};

int32_t valueOf(int from, int to, size_t i) { return 100000 * from + 1000 * to + static_cast<int32_t>(i); }

#define DEVICES_OR_SKIP(devices)                                  \
  std::string why_;                                               \
  const int devices = devicesOrZero(&why_);                       \
  if (devices == 0) GTEST_SKIP() << "no CUDA device: " << why_;

TEST(NcclExchange, CudaTensorsMatchTheHostCalls) {
  DEVICES_OR_SKIP(devices);
  const int n = std::min(devices, 8);
  runRanks(n, [&](int rank, shoal_comm_t comm) {
    ASSERT_EQ(cudaSetDevice(rank), cudaSuccess);
    for (size_t block : {size_t(0), size_t(1), size_t(3001)}) {
      const std::string what = "block " + std::to_string(block) + " rank " + std::to_string(rank);
      std::vector<int32_t> send;
      for (int p = 0; p < n; ++p)
        for (size_t i = 0; i < block; ++i) send.push_back(valueOf(rank, p, i));
      // alltoall, out of place and in place.
      std::vector<int32_t> expected(send.size());
      ASSERT_TRUE(callOk(shoal_alltoall(comm, send.data(), expected.data(), block, SHOAL_I32), comm, what));
      Device in(send), out(std::vector<int32_t>(send.size(), -1));
      shoal_tensor_t tin = in.tensor(rank), tout = out.tensor(rank);
      ASSERT_TRUE(callOk(shoal_alltoall_tensor(comm, &tin, &tout), comm, "CUDA alltoall " + what));
      EXPECT_EQ(out.toHost(), expected) << what;
      EXPECT_EQ(in.toHost(), send) << what << ": the input changed";
      ASSERT_TRUE(callOk(shoal_alltoall_tensor(comm, &tin, &tin), comm, "CUDA alltoall in place " + what));
      EXPECT_EQ(in.toHost(), expected) << what << " in place";
      // alltoallv: (rank + p) % 3 * block elements to rank p.
      std::vector<size_t> sendcounts(n), recvcounts(n);
      for (int p = 0; p < n; ++p) {
        sendcounts[p] = (rank + p) % 3 * block;
        recvcounts[p] = (p + rank) % 3 * block;
      }
      std::vector<int32_t> vsend(std::accumulate(sendcounts.begin(), sendcounts.end(), size_t(0)));
      std::iota(vsend.begin(), vsend.end(), rank * 7);
      std::vector<int32_t> vexpected(std::accumulate(recvcounts.begin(), recvcounts.end(), size_t(0)));
      ASSERT_TRUE(callOk(shoal_alltoallv(comm, vsend.data(), sendcounts.data(), nullptr, vexpected.data(),
                                         recvcounts.data(), nullptr, SHOAL_I32),
                         comm, what));
      Device vin(vsend), vout(std::vector<int32_t>(vexpected.size(), -1));
      tin = vin.tensor(rank);
      tout = vout.tensor(rank);
      ASSERT_TRUE(callOk(shoal_alltoallv_tensor(comm, &tin, sendcounts.data(), nullptr, &tout, recvcounts.data(),
                                                nullptr),
                         comm, "CUDA alltoallv " + what));
      EXPECT_EQ(vout.toHost(), vexpected) << what;
      // reduce (sum and max) to the last rank.
      const int root = n - 1;
      for (shoal_op_t op : {SHOAL_SUM, SHOAL_MAX}) {
        std::vector<int32_t> reduced(send.size(), -1);
        ASSERT_TRUE(callOk(shoal_reduce(comm, send.data(), reduced.data(), send.size(), SHOAL_I32, op, root), comm,
                           what));
        Device rin(send), rout(std::vector<int32_t>(send.size(), -1));
        tin = rin.tensor(rank);
        tout = rout.tensor(rank);
        ASSERT_TRUE(callOk(shoal_reduce_tensor(comm, &tin, rank == root ? &tout : nullptr, op, root), comm,
                           "CUDA reduce " + what));
        if (rank == root) EXPECT_EQ(rout.toHost(), reduced) << what << " " << shoal_op_name(op);
      }
      // gather to rank 0 and scatter back from it.
      std::vector<int32_t> mine(send.begin(), send.begin() + block), all(block * n, -1), back(block, -1);
      ASSERT_TRUE(callOk(shoal_gather(comm, mine.data(), all.data(), block, SHOAL_I32, 0), comm, what));
      Device gin(mine), gout(std::vector<int32_t>(block * n, -1)), sout(std::vector<int32_t>(block, -1));
      tin = gin.tensor(rank);
      tout = gout.tensor(rank);
      ASSERT_TRUE(callOk(shoal_gather_tensor(comm, &tin, &tout, 0), comm, "CUDA gather " + what));
      if (rank == 0) EXPECT_EQ(gout.toHost(), all) << what;
      shoal_tensor_t tback = sout.tensor(rank);
      ASSERT_TRUE(callOk(shoal_scatter_tensor(comm, &tout, &tback, 0), comm, "CUDA scatter " + what));
      EXPECT_EQ(sout.toHost(), mine) << what << ": scatter undoes gather";
      // gatherv / scatterv: rank r contributes (r % 2 + 1) * block elements.
      std::vector<size_t> counts(n);
      for (int r = 0; r < n; ++r) counts[r] = (r % 2 + 1) * block;
      std::vector<int32_t> part(counts[rank], rank), packed(std::accumulate(counts.begin(), counts.end(), size_t(0)));
      ASSERT_TRUE(callOk(shoal_gatherv(comm, part.data(), part.size(), packed.data(), counts.data(), nullptr,
                                       SHOAL_I32, root),
                         comm, what));
      Device pin(part), pall(std::vector<int32_t>(packed.size(), -1)), pback(std::vector<int32_t>(part.size(), -1));
      tin = pin.tensor(rank);
      tout = pall.tensor(rank);
      ASSERT_TRUE(callOk(shoal_gatherv_tensor(comm, &tin, &tout, counts.data(), nullptr, root), comm,
                         "CUDA gatherv " + what));
      if (rank == root) EXPECT_EQ(pall.toHost(), packed) << what;
      tback = pback.tensor(rank);
      ASSERT_TRUE(callOk(shoal_scatterv_tensor(comm, &tout, counts.data(), nullptr, &tback, root), comm,
                         "CUDA scatterv " + what));
      EXPECT_EQ(pback.toHost(), part) << what << ": scatterv undoes gatherv";
    }
  }, {nullptr, 60});
}

TEST(NcclExchange, GroupedSendRecvRingAndTags) {
  DEVICES_OR_SKIP(devices);
  if (devices < 2) GTEST_SKIP() << "point-to-point needs two devices, this machine has " << devices;
  const int n = std::min(devices, 8);
  runRanks(n, [&](int rank, shoal_comm_t comm) {
    ASSERT_EQ(cudaSetDevice(rank), cudaSuccess);
    const int right = (rank + 1) % n, left = (rank + n - 1) % n;
    std::vector<int32_t> a(1000, valueOf(rank, right, 0)), b(10, valueOf(rank, right, 1));
    Device sa(a), sb(b), ra(std::vector<int32_t>(1000, -1)), rb(std::vector<int32_t>(10, -1));
    // Posted in different tag orders on the two sides: matched by tag, not by position.
    shoal_p2p_tensor_t ops[4] = {{SHOAL_P2P_SEND, right, 1, sa.tensor(rank)},
                                 {SHOAL_P2P_SEND, right, 2, sb.tensor(rank)},
                                 {SHOAL_P2P_RECV, left, 2, rb.tensor(rank)},
                                 {SHOAL_P2P_RECV, left, 1, ra.tensor(rank)}};
    for (int round = 0; round < 2; ++round) {  // the second reuses the peer communicators
      ASSERT_TRUE(callOk(shoal_sendrecv_many_tensor(comm, ops, 4), comm, "CUDA ring"));
      EXPECT_EQ(ra.toHost(), std::vector<int32_t>(1000, valueOf(left, rank, 0)));
      EXPECT_EQ(rb.toHost(), std::vector<int32_t>(10, valueOf(left, rank, 1)));
    }
  }, {nullptr, 60});
}

TEST(NcclExchange, CountDisagreementIsAMismatchOnEveryRank) {
  DEVICES_OR_SKIP(devices);
  if (devices < 2) GTEST_SKIP() << "a disagreement between ranks needs two devices, this machine has " << devices;
  const int n = std::min(devices, 8);
  runRanks(n, [&](int rank, shoal_comm_t comm) {
    ASSERT_EQ(cudaSetDevice(rank), cudaSuccess);
    std::vector<size_t> sendcounts(n, 2), recvcounts(n, 2);
    if (rank == 1) recvcounts[0] = 3;  // rank 0 sends it 2
    Device in(std::vector<int32_t>(2 * n, rank)), out(std::vector<int32_t>(2 * n + 1, -1));
    shoal_tensor_t tin = in.tensor(rank), tout = out.tensor(rank);
    EXPECT_EQ(shoal_alltoallv_tensor(comm, &tin, sendcounts.data(), nullptr, &tout, recvcounts.data(), nullptr),
              SHOAL_ERR_MISMATCH)
        << "rank " << rank << ": " << shoal_last_error(comm);
    if (rank == 1)
      EXPECT_NE(std::string(shoal_last_error(comm)).find("rank 0 sends 2 elements to rank 1, which expects 3"),
                std::string::npos)
          << shoal_last_error(comm);
    // Refused before any device work: the communicator still runs CUDA calls.
    shoal_tensor_t ok = in.tensor(rank);
    EXPECT_TRUE(callOk(shoal_alltoall_tensor(comm, &ok, &ok), comm, "after the mismatch"));
  }, {nullptr, 30});
}

}  // namespace
