// What the fuzz targets share: inputs that depend only on a seed, and the
// hook that puts fuzzer bytes where a round's reduced payload was.
//
// A fuzz input is a few header bytes (each target reads its own: options,
// sizes, world size, seed) followed by the bytes that replace the delivered
// payloads, in order, as far as they reach (what they do not reach stays
// honest). Seeds: with SHOAL_FUZZ_WRITE_SEED=<file>, a run records its header
// and the honest bytes instead, which is how tests/fuzz/make_corpus.sh makes
// the seed corpora from real encodes.
#pragma once

#include <cmath>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <vector>

#include "compressors/sketch/sketch_math.h"
#include "lockstep.h"

namespace shoal::fuzz {

// A value of rank r at coordinate i: zero three times in four; otherwise an
// f32 with a random significand and an exponent within `spread` of 0 (spread
// 150: the whole f32 range), and with `specials` an occasional Inf or NaN.
inline float seededValue(uint64_t seed, int r, size_t i, int spread, bool specials) {
  const uint64_t h = shoal::sketch::mix64(seed * 0x9e3779b97f4a7c15ull + uint64_t(r) * 0x632be59bd9b4e019ull + i);
  if (h % 4 != 0) return 0.0f;
  if (specials && (h >> 8) % 61 == 0) return (h >> 20) & 1 ? NAN : ((h >> 21) & 1 ? INFINITY : -INFINITY);
  const float mant = float((h >> 24) & 0xffffffu | 0x800000u);
  const int e = spread == 0 ? 0 : int((h >> 48) % uint64_t(2 * spread + 1)) - spread;
  const float v = std::ldexp(mant, std::max(-149, std::min(e, 104)) - 23);
  return (h >> 2) & 1 ? -v : v;
}

// Replaces delivered payloads with the input's bytes (or records the honest ones).
class PayloadFeeder {
 public:
  PayloadFeeder(const uint8_t* data, size_t size, size_t headerBytes)
      : reader_(data + std::min(size, headerBytes), size - std::min(size, headerBytes)) {
    const char* path = std::getenv("SHOAL_FUZZ_WRITE_SEED");
    if (path != nullptr && path[0] != '\0') {
      path_ = path;
      seed_.assign(data, data + std::min(size, headerBytes));
    }
  }
  ~PayloadFeeder() {
    if (path_ == nullptr) return;
    if (FILE* f = std::fopen(path_, "wb")) {
      std::fwrite(seed_.data(), 1, seed_.size(), f);
      std::fclose(f);
    }
  }
  void feed(std::vector<uint8_t>& bytes) {
    if (path_ != nullptr) seed_.insert(seed_.end(), bytes.begin(), bytes.end());
    else reader_.overwrite(bytes);
  }
  uint8_t byte() {
    uint8_t b = reader_.byte();
    if (path_ != nullptr) seed_.push_back(b);
    return b;
  }
  bool recording() const { return path_ != nullptr; }

 private:
  ByteReader reader_;
  const char* path_ = nullptr;
  std::vector<uint8_t> seed_;
};

// A failure must come with text on the rank that reports it.
inline void requireText(const Lockstep& run, shoal_status_t status) {
  if (status == SHOAL_OK) return;
  const int r = run.failedRank();
  if (r < 0 || run.error(r)[0] == '\0') {
    std::fprintf(stderr, "a compressor failed (status %d) without error text\n", int(status));
    std::abort();
  }
}

}  // namespace shoal::fuzz
