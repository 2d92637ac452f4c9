#include <gtest/gtest.h>

#include <vector>

#include "harness/harness.h"

TEST(Smoke, AllreduceFloatSum) {
  for (const char* algorithm : {"ring", "tree"}) {
    shoal::test::runRanks(3, [&](int rank, shoal_comm_t comm) {
      std::vector<float> data(1000, float(rank + 1));
      ASSERT_EQ(shoal_allreduce(comm, data.data(), data.data(), data.size(), SHOAL_F32, SHOAL_SUM), SHOAL_OK)
          << shoal_last_error(comm);
      for (float v : data) ASSERT_EQ(v, 6.0f);
    }, {algorithm, 20});
  }
}
