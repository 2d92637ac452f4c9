// Fuzzes the sketch compressor's decode of the values rounds (compact limbs,
// count-sketch cells, dense f32, specials, leftovers): the delivered payloads
// of rounds 1 and later are replaced by fuzzer bytes after an honest start
// (fuzz_sketch.h).
#include "fuzz_sketch.h"

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  return shoal::fuzz::fuzzSketchRounds(data, size, [](int round) { return round >= 1; });
}
