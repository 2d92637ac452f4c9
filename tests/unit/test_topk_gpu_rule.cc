// The selection rule the topk CUDA kernels use (topk_kernels.cu), run here on
// the CPU with the same topk_math.h functions: keys = magnitudeKey, a STABLE
// descending sort of (key, index) by key (what cub::DeviceRadixSort does),
// the first k indices sorted ascending, then packPair. It must give the very
// payload the CPU compressor (std::nth_element on its own order) sends, on
// data full of ties, signed zeros, NaNs of every kind, infinities and
// denormals. Also checks the radix sort's bit range: every key fits the 31
// (f32) or 63 (f64) bits the kernels sort on.
#include <algorithm>
#include <cmath>
#include <cstring>
#include <limits>
#include <numeric>
#include <random>
#include <string>
#include <vector>

#include <gtest/gtest.h>

#include "compressors/topk/topk_math.h"
#include "harness/compressor_rounds.h"
#include "shoal/compressor.h"
#include "shoal/shoal.h"

namespace {

using shoal::test::CompressorRounds;

template <typename T>
constexpr shoal_dtype_t dtypeOf() {
  return sizeof(T) == 4 ? SHOAL_F32 : SHOAL_F64;
}

// The GPU path's rule, on the CPU.
template <typename T>
std::vector<uint64_t> gpuRulePairs(const std::vector<T>& values, size_t k, uint64_t offset) {
  using Key = decltype(shoal::topk::magnitudeKey(T{}));
  std::vector<Key> keys(values.size());
  for (size_t i = 0; i < values.size(); ++i) keys[i] = shoal::topk::magnitudeKey(values[i]);
  std::vector<uint32_t> order(values.size());
  std::iota(order.begin(), order.end(), 0u);
  std::stable_sort(order.begin(), order.end(), [&](uint32_t a, uint32_t b) { return keys[a] > keys[b]; });
  order.resize(std::min(k, values.size()));
  std::sort(order.begin(), order.end());
  std::vector<uint64_t> pairs(2 * order.size());
  for (size_t j = 0; j < order.size(); ++j) shoal::topk::packPair(pairs.data() + 2 * j, offset + order[j], values[order[j]]);
  return pairs;
}

// Round 0 of the CPU compressor on one rank (ef=0): its payload words, as the
// rank wrote them (harness/compressor_rounds.h runs the whole call).
template <typename T>
std::vector<uint64_t> cpuPayload(const std::vector<T>& values, size_t k) {
  const shoal_compressor_t* table = nullptr;
  EXPECT_EQ(shoal_compressor_lookup("topk", &table), SHOAL_OK);
  CompressorRounds rounds(table, 1);
  const shoal_status_t created = rounds.create({{"k", std::to_string(k)}, {"ef", "0"}});
  EXPECT_EQ(created, SHOAL_OK) << rounds.error(0);
  std::vector<uint64_t> words;
  if (created != SHOAL_OK) return words;
  rounds.observe([&](int, const shoal_round_t& round) {
    if (round.index != 0 || round.num_payloads != 1) return;
    const auto* buffer = static_cast<const uint64_t*>(round.payloads[0].buffer);
    words.assign(buffer, buffer + round.payloads[0].count);
  });
  auto fill = [&](int, int, void* data) { std::memcpy(data, values.data(), values.size() * sizeof(T)); };
  EXPECT_EQ(rounds.allreduce({{dtypeOf<T>(), {int64_t(values.size())}, "g"}}, SHOAL_SUM, 0, fill), SHOAL_OK)
      << rounds.error(0);
  return words;
}

// Values with many exact ties and every special kind, shuffled.
template <typename T>
std::vector<T> awkwardValues(size_t count, uint64_t seed) {
  using Bits = std::conditional_t<sizeof(T) == 4, uint32_t, uint64_t>;
  std::mt19937_64 random(seed);
  const T specials[] = {T(0), -T(0), std::numeric_limits<T>::infinity(), -std::numeric_limits<T>::infinity(),
                        std::numeric_limits<T>::quiet_NaN(), -std::numeric_limits<T>::quiet_NaN(),
                        std::numeric_limits<T>::denorm_min(), -std::numeric_limits<T>::denorm_min(),
                        std::numeric_limits<T>::max(), std::numeric_limits<T>::lowest()};
  std::vector<T> values(count);
  for (size_t i = 0; i < count; ++i) {
    switch (random() % 4) {
      case 0: values[i] = specials[random() % std::size(specials)]; break;
      case 1: {  // a NaN with a random payload and sign
        const T inf = std::numeric_limits<T>::infinity();
        Bits exponentBits;
        std::memcpy(&exponentBits, &inf, sizeof exponentBits);
        const Bits signBit = Bits(1) << (sizeof(Bits) * 8 - 1);
        const Bits mantissaMask = ~(signBit | exponentBits);
        Bits bits = (static_cast<Bits>(random()) & ~exponentBits) | exponentBits;
        if ((bits & mantissaMask) == 0) bits |= 1;  // a NaN, not an infinity
        std::memcpy(&values[i], &bits, sizeof bits);
        break;
      }
      default: values[i] = T(int(random() % 9) - 4); break;  // small integers: ties everywhere
    }
  }
  return values;
}

template <typename T>
void checkRuleAgainstCpu() {
  for (size_t count : {1, 2, 7, 64, 1000, 4099})
    for (size_t k : {size_t(1), size_t(3), count / 2 + 1, count - 1, count}) {
      if (k == 0 || k > count) continue;
      std::vector<T> values = awkwardValues<T>(count, count * 131 + k);
      std::vector<uint64_t> expected = cpuPayload(values, k);
      std::vector<uint64_t> rule = gpuRulePairs(values, k, 0);
      ASSERT_EQ(rule, expected) << "count " << count << ", k " << k;
    }
}

TEST(TopkGpuRule, StableKeySortGivesTheCpuPayloadF32) { checkRuleAgainstCpu<float>(); }
TEST(TopkGpuRule, StableKeySortGivesTheCpuPayloadF64) { checkRuleAgainstCpu<double>(); }

TEST(TopkGpuRule, KeysFitTheSortedBits) {
  std::mt19937_64 random(99);
  for (int i = 0; i < 1000000; ++i) {
    uint64_t bits = random();
    uint32_t bits32 = static_cast<uint32_t>(bits);
    float f;
    double d;
    std::memcpy(&f, &bits32, sizeof f);
    std::memcpy(&d, &bits, sizeof d);
    ASSERT_EQ(shoal::topk::magnitudeKey(f) >> 31, 0u) << std::hex << bits32;
    ASSERT_EQ(shoal::topk::magnitudeKey(d) >> 63, 0u) << std::hex << bits;
  }
  ASSERT_EQ(shoal::topk::magnitudeKey(-std::numeric_limits<float>::quiet_NaN()) >> 31, 0u);
  ASSERT_EQ(shoal::topk::magnitudeKey(-std::numeric_limits<double>::quiet_NaN()) >> 63, 0u);
}

}  // namespace
