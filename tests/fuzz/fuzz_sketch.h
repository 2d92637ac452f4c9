// The sketch targets' shared setup (fuzz_sketch_index.cc, fuzz_sketch_values.cc):
// the header (options, count, world size, input seed; see fuzz_common.h), an
// honest start, and fuzzer bytes in place of the delivered payloads of the
// rounds the target names. Any outcome but a crash, a sanitizer report or an
// error without text is fine: corrupted payloads may decode to garbage, the
// same on every rank.
#pragma once

#include <string>
#include <utility>
#include <vector>

#include "fuzz_common.h"

namespace shoal::fuzz {

template <typename FeedsRound>
int fuzzSketchRounds(const uint8_t* data, size_t size, FeedsRound feedsRound) {
  if (size < 4) return 0;
  static const std::vector<std::pair<std::string, std::string>> kOptions[] = {
      {},
      {{"values", "sketch"}},
      {{"values", "compact"}},
      {{"values", "dense"}},
      {{"ratio", "2"}},
      {{"index", "bloom"}, {"expected_density", "0.05"}},
      {{"values", "sketch"}, {"cells", "f32"}},
      {{"chunk", "64"}},  // counts >= 256: 2..6 chunks, the pipelined rounds
  };
  const auto& options = kOptions[data[0] % (sizeof kOptions / sizeof kOptions[0])];
  const size_t count = 1 + size_t(data[1]) * 3;
  const int world = 2 + data[2] % 3;
  const uint64_t seed = data[3];
  const int spread = (data[3] & 0x30) == 0 ? 150 : 20;
  const bool specials = (data[3] & 0x40) != 0;
  PayloadFeeder feeder(data, size, 4);
  Lockstep run(shoal::compressors::sketch(), world);
  if (run.create(options) != SHOAL_OK) return 0;
  if (run.start({{SHOAL_F32, {int64_t(count)}, ""}}, SHOAL_SUM, 0, [&](int r, int, void* x) {
        for (size_t i = 0; i < count; ++i) static_cast<float*>(x)[i] = seededValue(seed, r, i, spread, specials);
      }) != SHOAL_OK)
    return 0;
  const shoal_status_t status = run.run([&](Delivered& d) {
    if (feedsRound(d.round)) feeder.feed(d.bytes);
  });
  requireText(run, status);
  return 0;
}

}  // namespace shoal::fuzz
