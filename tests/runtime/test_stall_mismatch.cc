// A stall whose ranks wait for each other's different calls (rank 0 inside a
// blocking call, rank 1 waiting for an async name rank 0 never submitted) is a
// MISMATCH on every rank, not a TIMEOUT; a rank that is merely absent stays a
// TIMEOUT (test_async_diagnostics, Stall.ABlockingCallOtherRanksNeverMake...).
#include <gtest/gtest.h>

#include <string>
#include <vector>

#include "harness/harness.h"
#include "harness/rank_sync.h"
#include "runtime/async_helpers.h"
#include "runtime/stall.h"
#include "shoal/shoal.h"

namespace shoal::test {
namespace {

TEST(StallMismatch, CrossedNamesAreAMismatchOneSidedOnesATimeout) {
  runtime::StallSettings settings;
  settings.checkS = 0;
  settings.shutdownS = 30;
  runtime::Partial a, b;
  a.name = "a";
  a.submitted = {0};
  a.missing = {1};
  a.ageS = 31;
  b.name = "b";
  b.submitted = {1};
  b.missing = {0};
  b.ageS = 1;
  runtime::StallInspector inspector(settings, 0);
  auto fatal = inspector.inspect({a, b});
  ASSERT_TRUE(fatal.has_value());
  EXPECT_EQ(inspector.fatalStatus(), SHOAL_ERR_MISMATCH);
  EXPECT_NE(fatal->find("rank(s) 0 made 'a' while rank(s) 1 made 'b'"), std::string::npos) << *fatal;
  fatal = inspector.inspect({a});
  ASSERT_TRUE(fatal.has_value());
  EXPECT_EQ(inspector.fatalStatus(), SHOAL_ERR_TIMEOUT);
}

TEST(StallMismatch, ABlockingCallAgainstAnAsyncRequestIsAMismatchOnEveryRank) {
  RankOptions options;
  options.timeoutS = 1.5;
  runRanks(2, [&](int rank, shoal_comm_t comm) {
    ASSERT_TRUE(callOk(shoal_async_start(comm), comm, "start"));
    if (rank == 0) {
      EXPECT_EQ(shoal_barrier(comm), SHOAL_ERR_MISMATCH) << shoal_last_error(comm);
      const std::string text = shoal_last_error(comm);
      EXPECT_NE(text.find("blocking call shoal_barrier while rank(s) 1 made 'other'"), std::string::npos) << text;
      return;
    }
    std::vector<float> x(4, 1.0f);
    shoal_tensor_t tensor = tensorOf(x.data(), SHOAL_F32, {4});
    shoal_request_t request = nullptr;
    ASSERT_TRUE(callOk(shoal_iallreduce(comm, "other", &tensor, &tensor, SHOAL_SUM, nullptr, &request), comm, "other"));
    EXPECT_EQ(shoal_wait(request, 30), SHOAL_ERR_MISMATCH) << shoal_request_error(request);
    EXPECT_NE(std::string(shoal_request_error(request)).find("different calls"), std::string::npos)
        << shoal_request_error(request);
    shoal_request_free(request);
  }, options);
}

}  // namespace
}  // namespace shoal::test
