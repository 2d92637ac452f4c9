// The argument checks (lib/api/checks.h) and the compressor resolution
// (plugin::resolveCompressor), directly and through the C API on a world of
// one: counts and shapes whose bytes overflow, NaN and infinite timeouts, and
// SHOAL_COMPRESSOR_OPTS applying only to SHOAL_COMPRESSOR's compressor.
#include <gtest/gtest.h>

#include <cmath>
#include <cstdint>
#include <cstdlib>
#include <string>
#include <vector>

#include "api/checks.h"
#include "core/error.h"
#include "harness/harness.h"
#include "plugin/driver.h"

namespace {

using shoal::Error;

// body() throws INVALID_ARGUMENT whose text holds every word.
template <typename Body>
void expectRefused(Body&& body, std::initializer_list<std::string> words) {
  try {
    body();
    ADD_FAILURE() << "accepted";
  } catch (const Error& error) {
    EXPECT_EQ(error.status(), SHOAL_ERR_INVALID_ARGUMENT) << error.what();
    for (const std::string& word : words)
      EXPECT_NE(std::string(error.what()).find(word), std::string::npos) << "lacks '" << word << "': " << error.what();
  }
}

TEST(ArgumentChecks, ByteCounts) {
  EXPECT_EQ(shoal::checkedByteCount("call", "count", 10, SHOAL_F32), 40u);
  EXPECT_EQ(shoal::checkedByteCount("call", "count", 0, SHOAL_F64, 8), 0u);
  EXPECT_EQ(shoal::checkedByteCount("call", "count", 3, SHOAL_F16, 4), 24u);
  // SIZE_MAX/4 f32 elements: SIZE_MAX - 3 bytes do not wrap, yet no buffer is that large.
  expectRefused([] { shoal::checkedByteCount("shoal_allgather", "sendcount", SIZE_MAX / 4, SHOAL_F32); },
                {"shoal_allgather", "sendcount", std::to_string(SIZE_MAX / 4), "at most"});
  expectRefused([] { shoal::checkedByteCount("call", "recvcount x world size", SIZE_MAX / 16, SHOAL_F32, 8); },
                {"recvcount x world size", "x 8"});
  expectRefused([] { shoal::checkedByteCount("call", "count", 1, static_cast<shoal_dtype_t>(99)); }, {"dtype 99"});
}

TEST(ArgumentChecks, ShapesWhoseProductWraps) {
  int64_t shape[2] = {int64_t(1) << 62, 4};  // the product wraps to 0 in 64 bits
  shoal_tensor_t tensor{};
  shoal_tensor_init(&tensor, nullptr, 0, SHOAL_F32);
  tensor.ndim = 2;
  tensor.shape[0] = shape[0];
  tensor.shape[1] = shape[1];
  expectRefused([&] { shoal::checkedTensorElements("shoal_allreduce_tensor", "input", tensor); },
                {"shoal_allreduce_tensor", "input", "shape[0] = 4611686018427387904", "overflow"});
  tensor.shape[0] = int64_t(1) << 30;  // each extent fits; the product does not
  tensor.shape[1] = int64_t(1) << 40;
  expectRefused([&] { shoal::checkedTensorElements("call", "input", tensor); }, {"shape[1] = 1099511627776"});
  tensor.shape[1] = -3;
  expectRefused([&] { shoal::checkedTensorElements("call", "input", tensor); }, {"shape[1] is -3", ">= 0"});
  tensor.shape[0] = 0;  // a zero extent: no elements, whatever the others (not negative) hold
  tensor.shape[1] = int64_t(1) << 62;
  EXPECT_EQ(shoal::checkedTensorElements("call", "input", tensor), 0u);
  tensor.shape[0] = 3;
  tensor.shape[1] = 5;
  EXPECT_EQ(shoal::checkedTensorElements("call", "input", tensor), 15u);
  tensor.ndim = SHOAL_MAX_DIMS + 1;
  expectRefused([&] { shoal::checkedTensorElements("call", "input", tensor); }, {"ndim", "0.."});
}

TEST(ArgumentChecks, Timeouts) {
  EXPECT_EQ(shoal::checkedTimeout("shoal_wait", "timeout_s", 5, 300), 5);
  EXPECT_EQ(shoal::checkedTimeout("shoal_wait", "timeout_s", 0, 300), 300);
  EXPECT_EQ(shoal::checkedTimeout("shoal_wait", "timeout_s", -1, 300), 300);
  EXPECT_EQ(shoal::checkedTimeout("shoal_wait", "timeout_s", INFINITY, 300), 300);
  expectRefused([] { shoal::checkedTimeout("shoal_wait", "timeout_s", NAN, 300); }, {"shoal_wait", "timeout_s", "NaN"});
  // A deadline far in the future stays in the future (it used to wrap into the past).
  EXPECT_GT(shoal::deadlineAfter(1e10), shoal::Clock::now() + std::chrono::hours(24 * 365));
  EXPECT_GT(shoal::deadlineAfter(INFINITY), shoal::Clock::now() + std::chrono::hours(24 * 365));
}

// ---- through the C API, a world of one ---------------------------------------

void onOneRank(const std::function<void(shoal_comm_t)>& body) {
  shoal::test::runRanks(1, [&](int, shoal_comm_t comm) { body(comm); }, {nullptr, 20});
}

TEST(ArgumentChecks, CallsRefuseOverflowingSizesInAWorldOfOne) {
  onOneRank([](shoal_comm_t comm) {
    float one = 1;
    EXPECT_EQ(shoal_allgather(comm, &one, &one, SIZE_MAX / 4, SHOAL_F32), SHOAL_ERR_INVALID_ARGUMENT);
    EXPECT_NE(std::string(shoal_last_error(comm)).find("sendcount"), std::string::npos) << shoal_last_error(comm);
    shoal_tensor_t tensor{};
    shoal_tensor_init(&tensor, &one, 1, SHOAL_F32);
    tensor.ndim = 2;
    tensor.shape[0] = int64_t(1) << 62;
    tensor.shape[1] = 4;
    EXPECT_EQ(shoal_allreduce_tensor(comm, &tensor, &tensor, SHOAL_SUM, nullptr), SHOAL_ERR_INVALID_ARGUMENT);
    EXPECT_NE(std::string(shoal_last_error(comm)).find("shape[0]"), std::string::npos) << shoal_last_error(comm);
    shoal_request_t request = nullptr;
    EXPECT_EQ(shoal_iallreduce(comm, "t", &tensor, &tensor, SHOAL_SUM, nullptr, &request), SHOAL_ERR_INVALID_ARGUMENT);
    // The communicator is still usable after refusals.
    EXPECT_EQ(shoal_allreduce(comm, &one, &one, 1, SHOAL_F32, SHOAL_SUM), SHOAL_OK) << shoal_last_error(comm);
  });
}

TEST(ArgumentChecks, WaitWithInfinityMeansTheCommunicatorsDeadline) {
  onOneRank([](shoal_comm_t comm) {
    std::vector<float> data(4, 2.0f);
    shoal_tensor_t tensor{};
    shoal_tensor_init(&tensor, data.data(), data.size(), SHOAL_F32);
    shoal_request_t request = nullptr;
    ASSERT_EQ(shoal_iallreduce(comm, "wait-inf", &tensor, &tensor, SHOAL_SUM, nullptr, &request), SHOAL_OK)
        << shoal_last_error(comm);
    EXPECT_EQ(shoal_wait(request, NAN), SHOAL_ERR_INVALID_ARGUMENT);
    EXPECT_NE(std::string(shoal_last_error(nullptr)).find("NaN"), std::string::npos) << shoal_last_error(nullptr);
    EXPECT_EQ(shoal_wait(request, INFINITY), SHOAL_OK) << shoal_last_error(nullptr);
    EXPECT_EQ(data[0], 2.0f);
    shoal_request_free(request);
  });
}

// ---- issue 13.1: SHOAL_COMPRESSOR_OPTS belongs to SHOAL_COMPRESSOR's compressor

struct ScopedEnv {
  ScopedEnv(const char* compressor, const char* options) {
    compressor ? setenv("SHOAL_COMPRESSOR", compressor, 1) : unsetenv("SHOAL_COMPRESSOR");
    options ? setenv("SHOAL_COMPRESSOR_OPTS", options, 1) : unsetenv("SHOAL_COMPRESSOR_OPTS");
  }
  ~ScopedEnv() {
    unsetenv("SHOAL_COMPRESSOR");
    unsetenv("SHOAL_COMPRESSOR_OPTS");
  }
};

TEST(CompressorResolution, EnvironmentOptionsBelongToTheEnvironmentsCompressor) {
  ScopedEnv env("topk", "ratio=0.01");
  auto fromEnv = shoal::plugin::resolveCompressor(nullptr, nullptr, -1);
  EXPECT_EQ(fromEnv.name, "topk");
  EXPECT_EQ(fromEnv.options, "ratio=0.01");
  auto none = shoal::plugin::resolveCompressor("none", nullptr, -1);
  EXPECT_EQ(none.name, "none");
  EXPECT_EQ(none.options, "");
  auto fp16 = shoal::plugin::resolveCompressor("fp16", nullptr, 128);
  EXPECT_EQ(fp16.options, "");
  EXPECT_EQ(fp16.minBytes, 128);
  auto sameName = shoal::plugin::resolveCompressor("topk", nullptr, -1);  // the environment's own compressor
  EXPECT_EQ(sameName.options, "ratio=0.01");
  auto explicitOptions = shoal::plugin::resolveCompressor("topk", "ratio=0.5", -1);
  EXPECT_EQ(explicitOptions.options, "ratio=0.5");
}

TEST(CompressorResolution, OptionsWithoutACompressorApplyToNothing) {
  ScopedEnv env(nullptr, "ratio=0.01");
  auto choice = shoal::plugin::resolveCompressor(nullptr, nullptr, -1);
  EXPECT_EQ(choice.name, "none");
  EXPECT_EQ(choice.options, "");
}

TEST(CompressorResolution, PerCallNoneAndFp16WorkWhileTopkOptionsAreExported) {
  ScopedEnv env("topk", "ratio=0.01");
  onOneRank([](shoal_comm_t comm) {
    std::vector<float> data(64, 1.0f);
    shoal_tensor_t tensor{};
    shoal_tensor_init(&tensor, data.data(), data.size(), SHOAL_F32);
    for (const char* compressor : {"none", "fp16"}) {
      shoal_allreduce_options_t options = SHOAL_ALLREDUCE_OPTIONS_INIT;
      options.compressor = compressor;
      options.compress_min_bytes = 0;
      EXPECT_EQ(shoal_allreduce_tensor(comm, &tensor, &tensor, SHOAL_SUM, &options), SHOAL_OK)
          << compressor << ": " << shoal_last_error(comm);
      shoal_request_t request = nullptr;
      shoal_async_options_t async = SHOAL_ASYNC_OPTIONS_INIT;
      async.compressor = compressor;
      ASSERT_EQ(shoal_iallreduce(comm, compressor, &tensor, &tensor, SHOAL_SUM, &async, &request), SHOAL_OK)
          << compressor << ": " << shoal_last_error(comm);
      EXPECT_EQ(shoal_wait(request, 20), SHOAL_OK) << compressor << ": " << shoal_last_error(nullptr);
      shoal_request_free(request);
    }
    EXPECT_EQ(data[0], 1.0f);
  });
}

}  // namespace
