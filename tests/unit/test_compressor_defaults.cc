// SHOAL_COMPRESSOR, SHOAL_COMPRESSOR_OPTS and SHOAL_COMPRESS_MIN_BYTES are read
// once per communicator at init (plugin::CompressorDefaults), not per call: a
// change of the environment after init does not reach that communicator's
// calls, blocking or async; a communicator created afterwards sees it.
#include <gtest/gtest.h>
#include <stdlib.h>

#include <string>
#include <vector>

#include "harness/harness.h"
#include "shoal/shoal.h"

namespace {

std::string lastCompressor(shoal_comm_t comm) {
  shoal_compress_stats_t stats = SHOAL_COMPRESS_STATS_INIT;
  if (shoal_last_compress_stats(comm, &stats) != SHOAL_OK) return "(error)";
  return stats.compressor ? stats.compressor : "(null)";
}

// One blocking allreduce of 64 floats; the compressor it ran.
std::string blockingCompressor(shoal_comm_t comm) {
  std::vector<float> data(64, 1.0f);
  if (shoal_allreduce(comm, data.data(), data.data(), data.size(), SHOAL_F32, SHOAL_SUM) != SHOAL_OK)
    return std::string("(failed: ") + shoal_last_error(comm) + ")";
  return lastCompressor(comm);
}

TEST(CompressorDefaults, ReadOncePerCommunicatorAtInit) {
  setenv("SHOAL_COMPRESSOR", "fp16", 1);
  setenv("SHOAL_COMPRESS_MIN_BYTES", "0", 1);
  shoal::test::runRanks(1, [](int, shoal_comm_t comm) {
    EXPECT_EQ(blockingCompressor(comm), "fp16");
    // Changed after init: this communicator keeps what it read.
    setenv("SHOAL_COMPRESS_MIN_BYTES", "1000000", 1);
    setenv("SHOAL_COMPRESSOR", "bf16", 1);
    EXPECT_EQ(blockingCompressor(comm), "fp16");
  });
  // A new communicator reads the environment as it is now: 256 bytes < 1000000, uncompressed.
  shoal::test::runRanks(1, [](int, shoal_comm_t comm) { EXPECT_EQ(blockingCompressor(comm), "none"); });
  unsetenv("SHOAL_COMPRESSOR");
  unsetenv("SHOAL_COMPRESS_MIN_BYTES");
}

}  // namespace
