// shoal_last_compress_stats' wire_bytes counts what a compressed call sent
// wherever it went: on one host a payload that travels through the shared
// segment is written into this rank's slots for its peers, and counts as sent
// (it counted nothing before, so shoal-bench's "sent" column showed a few
// bytes for PowerSGD on one host); with the segment off it goes over the
// transport, and the count is the ring's.
#include <gtest/gtest.h>
#include <stdlib.h>

#include <cstdint>
#include <string>
#include <vector>

#include "harness/harness.h"
#include "shoal/shoal.h"

namespace {

// One fp16-compressed allreduce of `count` floats on 2 ranks; rank 0's stats
// (the compressor's name copied: the communicator owns the text).
struct Stats {
  std::string compressor;
  uint64_t payloadBytes = 0, wireBytes = 0;
};
Stats compressedCall(size_t count) {
  Stats result;
  shoal::test::runRanks(2, [&](int rank, shoal_comm_t comm) {
    std::vector<float> data(count, 1.0f + static_cast<float>(rank));
    shoal_tensor_t tensor = shoal_tensor_1d(data.data(), count, SHOAL_F32);
    shoal_allreduce_options_t options = SHOAL_ALLREDUCE_OPTIONS_INIT;
    options.compressor = "fp16";
    options.compress_min_bytes = 0;
    ASSERT_EQ(shoal_allreduce_tensor(comm, &tensor, &tensor, SHOAL_SUM, &options), SHOAL_OK) << shoal_last_error(comm);
    EXPECT_EQ(data[count / 2], 3.0f);
    shoal_compress_stats_t stats = SHOAL_COMPRESS_STATS_INIT;
    ASSERT_EQ(shoal_last_compress_stats(comm, &stats), SHOAL_OK);
    if (rank == 0) result = {stats.compressor ? stats.compressor : "(null)", stats.payload_bytes, stats.wire_bytes};
  });
  return result;
}

TEST(CompressStats, SentCountsThePayloadWhereverItWent) {
  const size_t count = 16384;  // 64 KiB of floats, 32 KiB of fp16 payload: one slot of the segment
  for (const char* shm : {"262144", "0"}) {
    setenv("SHOAL_SHM_MAX_BYTES", shm, 1);
    const Stats stats = compressedCall(count);
    EXPECT_EQ(stats.compressor, "fp16");
    EXPECT_EQ(stats.payloadBytes, count * 2) << "SHOAL_SHM_MAX_BYTES=" << shm;
    // Two ranks: the segment publishes the whole payload once, the ring sends 2 (n - 1) / n of it.
    EXPECT_GE(stats.wireBytes, stats.payloadBytes) << "SHOAL_SHM_MAX_BYTES=" << shm;
    EXPECT_LT(stats.wireBytes, stats.payloadBytes + 4096) << "SHOAL_SHM_MAX_BYTES=" << shm;
  }
  unsetenv("SHOAL_SHM_MAX_BYTES");
}

}  // namespace
