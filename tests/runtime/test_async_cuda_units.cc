// The async runtime's handling of CUDA tensors, on the CPU: the fusion
// planner never puts a CUDA request in a group with another (the CUDA-marked
// descriptors here are planned, never executed), the memory kind is part of
// what ranks agree on and of the negotiation's encoding, a joined rank does
// not stand in for a CUDA allreduce, and submission follows the build (one
// without CUDA refuses every CUDA tensor with its text; a CUDA build takes
// them, and without a device the request fails). The real CUDA path runs in
// tests/cuda/test_async_cuda.cc (skips without a device).
#include <gtest/gtest.h>

#include <cstring>
#include <memory>
#include <string>
#include <vector>

#include "harness/harness.h"
#include "runtime/fusion.h"
#include "runtime/join.h"
#include "runtime/negotiation.h"

namespace shoal::runtime {
namespace {

Metadata allreduceIn(shoal_memory_t memory, int64_t elements = 10) {
  Metadata m;
  m.kind = OpKind::Allreduce;
  m.dtype = SHOAL_F32;
  m.shape = {elements};
  m.compressor = "none";
  m.memory = memory;
  return m;
}

std::vector<Ready> readyOf(const std::vector<Metadata>& metas) {
  std::vector<Ready> ready;
  for (size_t i = 0; i < metas.size(); ++i) {
    auto r = std::make_shared<Request>();
    r->name = "t" + std::to_string(i);
    r->meta = metas[i];
    ready.push_back({r, false, Clock::now()});
  }
  return ready;
}

TEST(AsyncCuda, PlannerNeverFusesCudaRequestsWithAnything) {
  const Metadata host = allreduceIn(SHOAL_MEMORY_HOST), cuda = allreduceIn(SHOAL_MEMORY_CUDA);
  // Same dtype, op and compression throughout: only the memory kind differs.
  std::vector<Ready> ready = readyOf({host, cuda, host, cuda, cuda, host});
  std::vector<Group> groups = planGroups(ready, size_t{1} << 20);
  std::vector<std::vector<std::string>> names;
  for (const Group& g : groups) {
    names.emplace_back();
    for (const Ready* r : g.members) names.back().push_back(r->request->name);
    for (const Ready* r : g.members)
      EXPECT_EQ(r->request->meta.memory, g.members.front()->request->meta.memory) << "a group mixes memory kinds";
  }
  // The host tensors fuse into one group at the first one's place; every CUDA tensor runs alone, in order.
  const std::vector<std::vector<std::string>> expected = {{"t0", "t2", "t5"}, {"t1"}, {"t3"}, {"t4"}};
  EXPECT_EQ(names, expected);
}

TEST(AsyncCuda, MemoryKindIsAgreedAndTravelsInTheNegotiation) {
  const Metadata host = allreduceIn(SHOAL_MEMORY_HOST), cuda = allreduceIn(SHOAL_MEMORY_CUDA);
  EXPECT_FALSE(host == cuda);
  EXPECT_EQ(differences(host, cuda), "memory host memory vs CUDA memory");
  EXPECT_NE(cuda.describe().find("in CUDA memory"), std::string::npos) << cuda.describe();

  const std::string encoded = encodeAnnouncements({{"g", cuda, 0.5}, {"h", host, 0.1}});
  std::vector<Announcement> decoded =
      decodeAnnouncements(reinterpret_cast<const uint8_t*>(encoded.data()), encoded.size());
  ASSERT_EQ(decoded.size(), 2u);
  EXPECT_EQ(decoded[0].meta.memory, SHOAL_MEMORY_CUDA);
  EXPECT_TRUE(decoded[0].meta == cuda);
  EXPECT_EQ(decoded[1].meta.memory, SHOAL_MEMORY_HOST);

  // A name submitted with host memory on one rank and CUDA memory on another fails on every rank.
  Verdict v = decide({{{"g", host, 0.1}}, {{"g", cuda, 0.1}}});
  EXPECT_TRUE(v.ready.empty());
  ASSERT_EQ(v.errors.size(), 1u);
  EXPECT_NE(v.errors[0].second.find("memory host memory vs CUDA memory"), std::string::npos) << v.errors[0].second;
}

TEST(AsyncCuda, CorruptMemoryKindInAnAnnouncementIsAnError) {
  std::string encoded = encodeAnnouncements({{"g", allreduceIn(SHOAL_MEMORY_CUDA), 0.0}});
  // The memory word follows count, name (length + bytes), kind, dtype, op and root.
  const size_t at = 8 + 8 + 1 + 4 * 8;
  uint64_t memory = 0;
  std::memcpy(&memory, encoded.data() + at, 8);
  ASSERT_EQ(memory, uint64_t{SHOAL_MEMORY_CUDA});
  memory = 7;
  std::memcpy(encoded.data() + at, &memory, 8);
  EXPECT_THROW(decodeAnnouncements(reinterpret_cast<const uint8_t*>(encoded.data()), encoded.size()), Error);
}

TEST(AsyncCuda, JoinedRanksDoNotStandInForCudaAllreduces) {
  EXPECT_EQ(whyNoStandIn(allreduceIn(SHOAL_MEMORY_HOST)), "");
  const std::string why = whyNoStandIn(allreduceIn(SHOAL_MEMORY_CUDA));
  EXPECT_NE(why.find("CUDA tensors"), std::string::npos) << why;
  // Rank 1 joined; rank 0's CUDA allreduce fails with that reason instead of running against host zeros.
  Verdict v = decide({{{"g", allreduceIn(SHOAL_MEMORY_CUDA), 0.1}}, {{kJoinName, Metadata{}, 0.1}}});
  EXPECT_TRUE(v.ready.empty());
  ASSERT_EQ(v.joinErrors.size(), 1u);
  EXPECT_NE(v.joinErrors[0].second.find("CUDA tensors"), std::string::npos) << v.joinErrors[0].second;
}

#if SHOAL_WITH_CUDA
constexpr bool kCudaBuild = true;
#else
constexpr bool kCudaBuild = false;
#endif

shoal_tensor_t cudaTensor(void* data, size_t count) {
  shoal_tensor_t t = shoal_tensor_1d(data, count, SHOAL_F32);
  t.memory = SHOAL_MEMORY_CUDA;
  return t;
}

// What this build does with a CUDA tensor at submission. The pointer is host
// memory: a CUDA build accepts the submission and its request then fails on
// every rank (no device, or the pointer is not device memory); nothing here
// runs device work.
TEST(AsyncCuda, SubmissionOfCudaTensorsFollowsTheBuild) {
  shoal::test::runRanks(1, [](int, shoal_comm_t comm) {
    std::vector<float> data(8, 1.0f);
    const shoal_tensor_t t = cudaTensor(data.data(), data.size());
    shoal_request_t request = nullptr;
    const shoal_status_t submitted = shoal_iallreduce(comm, "cuda.grad", &t, &t, SHOAL_SUM, nullptr, &request);
#if SHOAL_WITH_CUDA
    ASSERT_EQ(submitted, SHOAL_OK) << shoal_last_error(comm);
    const shoal_status_t waited = shoal_wait(request, 30);
    EXPECT_TRUE(waited == SHOAL_ERR_UNSUPPORTED || waited == SHOAL_ERR_INVALID_ARGUMENT)
        << shoal_status_string(waited) << ": " << shoal_request_error(request);
    EXPECT_NE(std::string(shoal_request_error(request)).find("CUDA"), std::string::npos)
        << shoal_request_error(request);
    // The refusal names the call the user made, not the blocking one the runtime runs it through.
    EXPECT_NE(std::string(shoal_request_error(request)).find("shoal_iallreduce: "), std::string::npos)
        << shoal_request_error(request);
    EXPECT_EQ(std::string(shoal_request_error(request)).find("shoal_allreduce_tensor"), std::string::npos)
        << shoal_request_error(request);
    shoal_request_free(request);
#else
    EXPECT_EQ(submitted, SHOAL_ERR_UNSUPPORTED);
    EXPECT_EQ(request, nullptr);
    EXPECT_NE(std::string(shoal_last_error(comm)).find("is not host memory; the async runtime handles host tensors"),
              std::string::npos)
        << shoal_last_error(comm);
    EXPECT_EQ(shoal_ibroadcast(comm, "cuda.bcast", &t, 0, &request), SHOAL_ERR_UNSUPPORTED);
    EXPECT_EQ(shoal_iallgather(comm, "cuda.gather", &t, data.data(), &request), SHOAL_ERR_UNSUPPORTED);
#endif
    // Mixed kinds in one request are refused on the submitting rank in every build.
    const shoal_tensor_t host = shoal_tensor_1d(data.data(), data.size(), SHOAL_F32);
    EXPECT_NE(shoal_iallreduce(comm, "mixed", &host, &t, SHOAL_SUM, nullptr, &request), SHOAL_OK);
    EXPECT_NE(std::string(shoal_last_error(comm)).find(kCudaBuild ? "host memory but output CUDA memory"
                                                                       : "is not host memory"),
              std::string::npos)
        << shoal_last_error(comm);
    // The async alltoall likewise (in a CUDA build what arrives is device memory the request holds).
    const shoal_status_t alltoall = shoal_ialltoall(comm, "cuda.a2a", &t, nullptr, &request);
    if (kCudaBuild) {
      ASSERT_EQ(alltoall, SHOAL_OK) << shoal_last_error(comm);
      const shoal_status_t waited = shoal_wait(request, 30);
      EXPECT_TRUE(waited == SHOAL_ERR_UNSUPPORTED || waited == SHOAL_ERR_INVALID_ARGUMENT)
          << shoal_status_string(waited) << ": " << shoal_request_error(request);
      shoal_request_free(request);
    } else {
      EXPECT_EQ(alltoall, SHOAL_ERR_UNSUPPORTED);
    }
    // The runtime still works for host tensors afterwards.
    std::vector<float> out(8, 0.0f);
    const shoal_tensor_t o = shoal_tensor_1d(out.data(), out.size(), SHOAL_F32);
    ASSERT_EQ(shoal_iallreduce(comm, "host.grad", &host, &o, SHOAL_SUM, nullptr, &request), SHOAL_OK);
    EXPECT_EQ(shoal_wait(request, 30), SHOAL_OK) << shoal_request_error(request);
    shoal_request_free(request);
    EXPECT_EQ(out, data);
  });
}

}  // namespace
}  // namespace shoal::runtime
