// Fuzzes the sketch compressor's decode of round 0 (index bitmap or Bloom
// filter, statistics, ratio= sketch): that round's delivered payloads are
// replaced by fuzzer bytes after an honest start (fuzz_sketch.h).
#include "fuzz_sketch.h"

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  return shoal::fuzz::fuzzSketchRounds(data, size, [](int round) { return round == 0; });
}
