// The index arithmetic the GPU kernels share with the CPU, run here on the
// CPU: the pack kernel's chunk loop (lib/gpu/cuda/pack_math.h) over tiny chunks,
// so every entry is split every way, must copy every byte exactly once to its
// place; topk's per-pair tensor lookup (topk_math.h tensorOfIndex) must agree
// with the CPU decoder's std::upper_bound, zero-size tensors included.
#include <gtest/gtest.h>

#include <algorithm>
#include <cstdint>
#include <random>
#include <vector>

#include "compressors/topk/topk_math.h"
#include "gpu/cuda/pack_math.h"

namespace {

struct Entry {
  size_t end;
};

// The kernel's loop (pack.cu batchedCopy), serial: every chunk, its entries, their pieces.
void packLikeTheKernel(const std::vector<std::vector<unsigned char>>& tensors, const std::vector<Entry>& table,
                       size_t chunkBytes, std::vector<unsigned char>& packed, std::vector<int>& writes) {
  const size_t total = table.empty() ? 0 : table.back().end;
  for (size_t chunkStart = 0; chunkStart < total; chunkStart += chunkBytes) {
    const size_t chunkEnd = std::min(chunkStart + chunkBytes, total);
    for (size_t e = shoal::cuda::firstEntryEndingAfter(table, table.size(), chunkStart); e < table.size(); ++e) {
      const size_t entryStart = e == 0 ? 0 : table[e - 1].end;
      if (entryStart >= chunkEnd) break;
      const shoal::cuda::Piece piece = shoal::cuda::pieceOf(entryStart, table[e].end, chunkStart, chunkEnd);
      for (size_t b = 0; b < piece.bytes; ++b) {
        packed[entryStart + piece.offsetInEntry + b] = tensors[e][piece.offsetInEntry + b];
        ++writes[entryStart + piece.offsetInEntry + b];
      }
    }
  }
}

TEST(PackMath, EveryByteOnceInItsPlace) {
  std::mt19937 random(17);
  for (int trial = 0; trial < 200; ++trial) {
    const size_t n = random() % 12;
    std::vector<std::vector<unsigned char>> tensors(n);
    std::vector<Entry> table(n);
    std::vector<unsigned char> expected;
    for (size_t i = 0; i < n; ++i) {
      tensors[i].resize(random() % 3 == 0 ? 0 : random() % 40);
      for (auto& b : tensors[i]) b = static_cast<unsigned char>(random());
      expected.insert(expected.end(), tensors[i].begin(), tensors[i].end());
      table[i].end = expected.size();
    }
    for (size_t chunk : {1, 3, 7, 16, 1000}) {
      std::vector<unsigned char> packed(expected.size(), 0);
      std::vector<int> writes(expected.size(), 0);
      packLikeTheKernel(tensors, table, chunk, packed, writes);
      ASSERT_EQ(packed, expected) << "trial " << trial << ", chunk " << chunk;
      ASSERT_TRUE(std::all_of(writes.begin(), writes.end(), [](int w) { return w == 1; }))
          << "trial " << trial << ", chunk " << chunk;
    }
  }
}

TEST(PackMath, FirstEntryAndPieces) {
  const std::vector<Entry> table = {{0}, {5}, {5}, {9}, {9}};  // sizes 0, 5, 0, 4, 0
  EXPECT_EQ(shoal::cuda::firstEntryEndingAfter(table, table.size(), 0), 1u);
  EXPECT_EQ(shoal::cuda::firstEntryEndingAfter(table, table.size(), 4), 1u);
  EXPECT_EQ(shoal::cuda::firstEntryEndingAfter(table, table.size(), 5), 3u);
  EXPECT_EQ(shoal::cuda::firstEntryEndingAfter(table, table.size(), 9), table.size());
  shoal::cuda::Piece piece = shoal::cuda::pieceOf(5, 9, 6, 8);
  EXPECT_EQ(piece.offsetInEntry, 1u);
  EXPECT_EQ(piece.bytes, 2u);
  EXPECT_EQ(shoal::cuda::pieceOf(0, 5, 5, 10).bytes, 0u);
}

struct Output {
  uint64_t first;
};

TEST(TopkMath, TensorOfIndexMatchesTheCpuDecoder) {
  std::mt19937 random(23);
  for (int trial = 0; trial < 300; ++trial) {
    const int tensors = 1 + int(random() % 8);
    std::vector<size_t> offsets(tensors + 1, 0);  // as topk.cc's OpState::offsets
    std::vector<Output> table(tensors);
    for (int t = 0; t < tensors; ++t) {
      table[t].first = offsets[t];
      offsets[t + 1] = offsets[t] + (random() % 3 == 0 ? 0 : random() % 20);
    }
    for (uint64_t index = 0; index < offsets[tensors]; ++index) {
      const int cpu = int(std::upper_bound(offsets.begin(), offsets.end() - 1, index) - offsets.begin() - 1);
      const int shared = shoal::topk::tensorOfIndex(table, tensors, index);
      ASSERT_EQ(shared, cpu) << "trial " << trial << ", index " << index;
      ASSERT_LT(index - offsets[shared], offsets[shared + 1] - offsets[shared]) << "a zero-size tensor was chosen";
    }
  }
}

}  // namespace
