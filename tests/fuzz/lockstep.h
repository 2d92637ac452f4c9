// The fuzz targets' name for the shared compressor driver of the tests
// (tests/harness/compressor_rounds.h): a compressed allreduce run in one
// thread, ranks in lockstep, with a hook that may rewrite the reduced bytes
// (and an allgatherv's counts) before the ranks read them, as a buggy or
// hostile rank could make them. Plus the fuzzer's byte reader.
//
// Used by the payload-validation unit tests (tests/unit/test_payload_validation.cc)
// and the fuzz targets (tests/fuzz/fuzz_*.cc): header-only, no test framework.
#pragma once

#include <algorithm>
#include <cstdint>
#include <cstring>
#include <vector>

#include "../harness/compressor_rounds.h"

namespace shoal::fuzz {

using Delivered = shoal::test::Delivered;
using Hook = shoal::test::Hook;
using Lockstep = shoal::test::CompressorRounds;

// Reads fuzzer input front to back; past the end every read is zero.
class ByteReader {
 public:
  ByteReader(const uint8_t* data, size_t size) : data_(data), size_(size) {}
  uint8_t byte() { return pos_ < size_ ? data_[pos_++] : 0; }
  size_t left() const { return size_ - pos_; }
  // Overwrites dst with the next bytes (as many as there are).
  void overwrite(std::vector<uint8_t>& dst) {
    const size_t n = std::min(dst.size(), left());
    if (n > 0) std::memcpy(dst.data(), data_ + pos_, n);
    pos_ += n;
  }

 private:
  const uint8_t* data_;
  size_t size_, pos_ = 0;
};

}  // namespace shoal::fuzz
