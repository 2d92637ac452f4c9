// lib/gpu/cuda/pack: tensors packed back to back into one device buffer and
// unpacked again, compared byte for byte with the host's concatenation.
// Odd sizes, zero-size tensors, misaligned pointers, one tensor larger than
// a copy chunk, a table passed inline (few tensors) and one uploaded to the
// device (more than kInlineEntries); guard bytes around every destination
// catch writes past the end.
#include <gtest/gtest.h>

#include <cstdint>
#include <random>
#include <string>
#include <vector>

#include "gpu/cuda/pack.h"
#include "cuda_test_util.h"

namespace {

using shoal::test::DeviceBytes;
using shoal::test::download;
using shoal::test::upload;

constexpr size_t kGuard = 64;
constexpr unsigned char kGuardByte = 0xa5;

struct Case {
  std::vector<size_t> sizes;
  std::vector<size_t> misalign;  // bytes added to each tensor's address
};

void roundTrip(const Case& c) {
  const size_t n = c.sizes.size();
  std::mt19937 random(static_cast<unsigned>(n * 7919 + c.sizes[0]));
  // All tensors live in one device arena, each at its own misaligned offset with guard bytes around.
  std::vector<size_t> at(n);
  size_t arenaBytes = 0;
  for (size_t i = 0; i < n; ++i) {
    arenaBytes = (arenaBytes + kGuard + 255) / 256 * 256 + c.misalign[i];
    at[i] = arenaBytes;
    arenaBytes += c.sizes[i] + kGuard;
  }
  std::vector<unsigned char> arena(arenaBytes, kGuardByte);
  std::vector<unsigned char> expected;
  for (size_t i = 0; i < n; ++i)
    for (size_t b = 0; b < c.sizes[i]; ++b) {
      arena[at[i] + b] = static_cast<unsigned char>(random());
      expected.push_back(arena[at[i] + b]);
    }
  DeviceBytes tensors(arenaBytes);
  upload(tensors.get(), arena.data(), arenaBytes);
  std::vector<const void*> sources(n);
  std::vector<void*> destinations(n);
  for (size_t i = 0; i < n; ++i) {
    sources[i] = tensors.get<unsigned char>() + at[i];
    destinations[i] = tensors.get<unsigned char>() + at[i];
  }
  const size_t total = shoal::cuda::packedBytes(c.sizes.data(), n);
  ASSERT_EQ(total, expected.size());
  // The packed buffer at an odd offset too, with guards.
  DeviceBytes packedArena(total + 2 * kGuard + 3);
  std::vector<unsigned char> packedInit(packedArena.bytes(), kGuardByte);
  upload(packedArena.get(), packedInit.data(), packedInit.size());
  unsigned char* packed = packedArena.get<unsigned char>() + kGuard + 3;

  cudaStream_t stream;
  ASSERT_EQ(cudaStreamCreateWithFlags(&stream, cudaStreamNonBlocking), cudaSuccess);
  ASSERT_EQ(shoal::cuda::packTensors(sources.data(), c.sizes.data(), n, packed, stream), nullptr);
  ASSERT_EQ(cudaStreamSynchronize(stream), cudaSuccess);
  std::vector<unsigned char> gotPacked = download<unsigned char>(packedArena.get(), packedArena.bytes());
  for (size_t b = 0; b < kGuard + 3; ++b) ASSERT_EQ(gotPacked[b], kGuardByte) << "written before the packed buffer";
  for (size_t b = 0; b < total; ++b) ASSERT_EQ(gotPacked[kGuard + 3 + b], expected[b]) << "packed byte " << b;
  for (size_t b = kGuard + 3 + total; b < gotPacked.size(); ++b) ASSERT_EQ(gotPacked[b], kGuardByte) << "written past it";

  // Unpack into the cleared arena: every tensor comes back, guards untouched.
  std::vector<unsigned char> cleared(arenaBytes, kGuardByte);
  for (size_t i = 0; i < n; ++i)
    for (size_t b = 0; b < c.sizes[i]; ++b) cleared[at[i] + b] = 0;
  upload(tensors.get(), cleared.data(), arenaBytes);
  ASSERT_EQ(shoal::cuda::unpackTensors(packed, destinations.data(), c.sizes.data(), n, stream), nullptr);
  ASSERT_EQ(cudaStreamSynchronize(stream), cudaSuccess);
  std::vector<unsigned char> gotArena = download<unsigned char>(tensors.get(), arenaBytes);
  EXPECT_EQ(gotArena, arena) << "unpack did not restore the tensors (or wrote outside them)";
  cudaStreamDestroy(stream);
}

class CudaPack : public ::testing::Test {
 protected:
  void SetUp() override {
    std::string why;
    if (shoal::test::noCudaDevice(&why)) GTEST_SKIP() << "no CUDA device: " << why;
  }
};

TEST_F(CudaPack, OddSizesAndZeroSizeTensors) {
  roundTrip({{1, 0, 3, 4097, 0, 16, 15, 0}, {0, 0, 1, 2, 0, 0, 3, 0}});
}

TEST_F(CudaPack, AlignedFloatsUseWideCopies) {
  roundTrip({{4 * 1000, 4 * 7, 4 * 65536, 4}, {0, 0, 0, 0}});
}

TEST_F(CudaPack, OneTensorLargerThanManyChunks) {
  roundTrip({{5 * 1000 * 1000 + 3}, {1}});
}

TEST_F(CudaPack, ManyTensorsUseTheDeviceTable) {
  Case c;
  std::mt19937 random(3);
  for (size_t i = 0; i < 3 * shoal::cuda::kInlineEntries + 5; ++i) {
    c.sizes.push_back(random() % 5 == 0 ? 0 : random() % 3000);
    c.misalign.push_back(random() % 8);
  }
  roundTrip(c);
}

TEST_F(CudaPack, NothingToCopy) {
  std::vector<size_t> sizes = {0, 0};
  std::vector<const void*> sources = {nullptr, nullptr};
  EXPECT_EQ(shoal::cuda::packedBytes(sizes.data(), 2), 0u);
  EXPECT_EQ(shoal::cuda::packTensors(sources.data(), sizes.data(), 2, nullptr, nullptr), nullptr);
  EXPECT_EQ(shoal::cuda::packTensors(nullptr, nullptr, 0, nullptr, nullptr), nullptr);
}

}  // namespace
