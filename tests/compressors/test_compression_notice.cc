// Issue 13.3's log line: when a compressor sends a tensor uncompressed or
// larger than the input, an info-level line says so once per tensor, and why
// (powersgd on a 1-D buffer; sketch on dense data). Its own executable: the
// log level is read once per process.
#include <gtest/gtest.h>

#include <cstdlib>
#include <string>
#include <vector>

#include "harness/harness.h"

namespace {

size_t occurrences(const std::string& text, const std::string& word) {
  size_t count = 0;
  for (size_t at = text.find(word); at != std::string::npos; at = text.find(word, at + 1)) ++count;
  return count;
}

void runSteps(const char* compressor, int steps) {
  setenv("SHOAL_COMPRESSOR", compressor, 1);
  setenv("SHOAL_COMPRESS_MIN_BYTES", "0", 1);
  shoal::test::runRanks(2, [&](int rank, shoal_comm_t comm) {
    std::vector<float> data(256);
    for (size_t i = 0; i < data.size(); ++i) data[i] = static_cast<float>(i % 7 + rank + 1);  // dense, 1-D
    // One persistent output buffer, as a training loop has: an unnamed call's key
    // follows its output buffer (a fresh allocation per step would be a new tensor,
    // and allocators such as ASan's never hand back the same address).
    std::vector<float> output(data.size());
    for (int step = 0; step < steps; ++step) {
      ASSERT_EQ(shoal_allreduce(comm, data.data(), output.data(), data.size(), SHOAL_F32, SHOAL_SUM), SHOAL_OK)
          << compressor << ": " << shoal_last_error(comm);
    }
  });
  unsetenv("SHOAL_COMPRESSOR");
  unsetenv("SHOAL_COMPRESS_MIN_BYTES");
}

TEST(CompressionNotice, OncePerTensorWithTheReason) {
  setenv("SHOAL_LOG_LEVEL", "info", 1);
  testing::internal::CaptureStderr();
  runSteps("powersgd", 3);
  runSteps("sketch", 3);
  std::string text = testing::internal::GetCapturedStderr();
  // Two ranks, one tensor each, three steps: one line per rank and compressor.
  EXPECT_EQ(occurrences(text, "compressor powersgd sent tensor"), 2u) << text;
  EXPECT_EQ(occurrences(text, "1-D tensor travels densely"), 2u) << text;
  EXPECT_EQ(occurrences(text, "compressor sketch sent tensor"), 2u) << text;
  EXPECT_EQ(occurrences(text, "too dense for a sketch"), 2u) << text;
}

}  // namespace
