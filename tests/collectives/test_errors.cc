// Errors: every invalid argument is refused before any communication with
// SHOAL_ERR_INVALID_ARGUMENT and a text naming the argument; ranks that
// disagree turn into an error on every rank within the deadline, and the
// communicator then fails fast; init refuses ranks configured differently.
#include <gtest/gtest.h>

#include <atomic>
#include <chrono>
#include <climits>
#include <cstddef>
#include <cstdint>
#include <cstdlib>
#include <cstring>
#include <functional>
#include <string>
#include <thread>
#include <vector>

#include "harness/harness.h"

namespace {

using shoal::test::runRanks;
using Clock = std::chrono::steady_clock;

double secondsSince(Clock::time_point start) { return std::chrono::duration<double>(Clock::now() - start).count(); }

// Rank, size and store come only from what each test passes.
void clearLaunchEnvironment() {
  for (const char* name : {"SHOAL_RANK", "SHOAL_WORLD_SIZE", "SHOAL_STORE", "SHOAL_TOKEN", "SHOAL_ALGO",
                           "OMPI_COMM_WORLD_RANK", "OMPI_COMM_WORLD_SIZE", "SLURM_PROCID", "SLURM_NTASKS"})
    unsetenv(name);
}

// The call returned INVALID_ARGUMENT and the comm's (and thread's) error text
// contains every one of `words`.
void expectInvalid(shoal_status_t status, shoal_comm_t comm, std::initializer_list<std::string> words,
                   const std::string& what) {
  EXPECT_EQ(status, SHOAL_ERR_INVALID_ARGUMENT) << what << ": " << shoal_status_string(status);
  std::string text = shoal_last_error(comm);
  for (const std::string& word : words)
    EXPECT_NE(text.find(word), std::string::npos) << what << ": error text does not mention '" << word << "': " << text;
  EXPECT_EQ(text, std::string(shoal_last_error(nullptr))) << what << ": thread and comm texts differ";
}

void expectOk(shoal_status_t status, shoal_comm_t comm, const std::string& what) {
  EXPECT_EQ(status, SHOAL_OK) << what << ": " << shoal_status_string(status) << ": " << shoal_last_error(comm);
}

void onOneRank(const std::function<void(shoal_comm_t)>& body) {
  runRanks(1, [&](int, shoal_comm_t comm) { body(comm); }, {nullptr, 20});
}

// ---- invalid arguments ---------------------------------------------------------

TEST(InvalidArgument, NullComm) {
  float a[4] = {}, b[4] = {};
  size_t counts[1] = {4};
  int value = 0;
  expectInvalid(shoal_allreduce(nullptr, a, b, 4, SHOAL_F32, SHOAL_SUM), nullptr, {"comm is NULL"}, "allreduce");
  expectInvalid(shoal_allgather(nullptr, a, b, 4, SHOAL_F32), nullptr, {"comm is NULL"}, "allgather");
  expectInvalid(shoal_allgatherv(nullptr, a, 4, b, counts, nullptr, SHOAL_F32), nullptr, {"comm is NULL"},
                "allgatherv");
  expectInvalid(shoal_broadcast(nullptr, a, b, 4, SHOAL_F32, 0), nullptr, {"comm is NULL"}, "broadcast");
  expectInvalid(shoal_reduce_scatter(nullptr, a, b, 4, SHOAL_F32, SHOAL_SUM), nullptr, {"comm is NULL"},
                "reduce_scatter");
  expectInvalid(shoal_barrier(nullptr), nullptr, {"comm is NULL"}, "barrier");
  expectInvalid(shoal_comm_rank(nullptr, &value), nullptr, {"comm is NULL"}, "comm_rank");
  expectInvalid(shoal_comm_size(nullptr, &value), nullptr, {"comm is NULL"}, "comm_size");
  expectInvalid(shoal_comm_finalize(nullptr), nullptr, {"comm is NULL"}, "comm_finalize");
  EXPECT_EQ(shoal_comm_destroy(nullptr), SHOAL_OK);
  EXPECT_EQ(shoal_comm_init(nullptr), SHOAL_ERR_INVALID_ARGUMENT);
  EXPECT_NE(std::string(shoal_last_error(nullptr)).find("comm"), std::string::npos) << shoal_last_error(nullptr);
}

TEST(InvalidArgument, NullOutParameters) {
  onOneRank([](shoal_comm_t comm) {
    expectInvalid(shoal_comm_rank(comm, nullptr), comm, {"rank"}, "comm_rank");
    expectInvalid(shoal_comm_size(comm, nullptr), comm, {"size"}, "comm_size");
  });
}

TEST(InvalidArgument, NullBuffersWithCount) {
  onOneRank([](shoal_comm_t comm) {
    float a[8] = {}, b[8] = {};
    size_t counts[1] = {4};
    expectInvalid(shoal_allreduce(comm, nullptr, b, 4, SHOAL_F32, SHOAL_SUM), comm, {"sendbuf"}, "allreduce send");
    expectInvalid(shoal_allreduce(comm, a, nullptr, 4, SHOAL_F32, SHOAL_SUM), comm, {"recvbuf"}, "allreduce recv");
    expectInvalid(shoal_allgather(comm, nullptr, b, 4, SHOAL_F32), comm, {"sendbuf"}, "allgather send");
    expectInvalid(shoal_allgather(comm, a, nullptr, 4, SHOAL_F32), comm, {"recvbuf"}, "allgather recv");
    expectInvalid(shoal_allgatherv(comm, nullptr, 4, b, counts, nullptr, SHOAL_F32), comm, {"sendbuf"},
                  "allgatherv send");
    expectInvalid(shoal_allgatherv(comm, a, 4, nullptr, counts, nullptr, SHOAL_F32), comm, {"recvbuf"},
                  "allgatherv recv");
    expectInvalid(shoal_broadcast(comm, nullptr, b, 4, SHOAL_F32, 0), comm, {"sendbuf"}, "broadcast send on root");
    expectInvalid(shoal_broadcast(comm, a, nullptr, 4, SHOAL_F32, 0), comm, {"recvbuf"}, "broadcast recv");
    expectInvalid(shoal_reduce_scatter(comm, nullptr, b, 4, SHOAL_F32, SHOAL_SUM), comm, {"sendbuf"},
                  "reduce_scatter send");
    expectInvalid(shoal_reduce_scatter(comm, a, nullptr, 4, SHOAL_F32, SHOAL_SUM), comm, {"recvbuf"},
                  "reduce_scatter recv");
    // The communicator is still usable after refused arguments.
    expectOk(shoal_allreduce(comm, a, b, 8, SHOAL_F32, SHOAL_SUM), comm, "allreduce after refusals");
  });
}

// Count 0 with NULL buffers is a valid no-op, also across several ranks (no hang, no desync).
TEST(InvalidArgument, NullBuffersWithZeroCountAreFine) {
  for (int n : {1, 3}) {
    runRanks(n, [&](int rank, shoal_comm_t comm) {
      std::vector<size_t> counts(n, 0);
      expectOk(shoal_allreduce(comm, nullptr, nullptr, 0, SHOAL_F32, SHOAL_SUM), comm, "allreduce");
      expectOk(shoal_allgather(comm, nullptr, nullptr, 0, SHOAL_F64), comm, "allgather");
      expectOk(shoal_allgatherv(comm, nullptr, 0, nullptr, counts.data(), nullptr, SHOAL_I8), comm, "allgatherv");
      expectOk(shoal_broadcast(comm, nullptr, nullptr, 0, SHOAL_U8, n - 1), comm, "broadcast");
      expectOk(shoal_reduce_scatter(comm, nullptr, nullptr, 0, SHOAL_I32, SHOAL_MAX), comm, "reduce_scatter");
      // Still in step: a real collective afterwards gives the right answer.
      int64_t value = rank + 1;
      expectOk(shoal_allreduce(comm, &value, &value, 1, SHOAL_I64, SHOAL_SUM), comm, "allreduce after no-ops");
      EXPECT_EQ(value, int64_t(n) * (n + 1) / 2);
    }, {nullptr, 20});
  }
}

TEST(InvalidArgument, InvalidDtype) {
  onOneRank([](shoal_comm_t comm) {
    float a[4] = {}, b[4] = {};
    size_t counts[1] = {1};
    for (int raw : {-1, int(SHOAL_DTYPE_COUNT), 99}) {
      auto dtype = static_cast<shoal_dtype_t>(raw);
      std::string word = "dtype " + std::to_string(raw);
      expectInvalid(shoal_allreduce(comm, a, b, 1, dtype, SHOAL_SUM), comm, {word}, "allreduce");
      expectInvalid(shoal_allgather(comm, a, b, 1, dtype), comm, {word}, "allgather");
      expectInvalid(shoal_allgatherv(comm, a, 1, b, counts, nullptr, dtype), comm, {word}, "allgatherv");
      expectInvalid(shoal_broadcast(comm, a, b, 1, dtype, 0), comm, {word}, "broadcast");
      expectInvalid(shoal_reduce_scatter(comm, a, b, 1, dtype, SHOAL_SUM), comm, {word}, "reduce_scatter");
      EXPECT_EQ(shoal_dtype_size(dtype), 0u);
      EXPECT_STREQ(shoal_dtype_name(dtype), "invalid");
    }
  });
}

TEST(InvalidArgument, InvalidOp) {
  onOneRank([](shoal_comm_t comm) {
    int32_t a[4] = {}, b[4] = {};
    for (int raw : {-1, int(SHOAL_OP_COUNT), 99}) {
      auto op = static_cast<shoal_op_t>(raw);
      std::string word = "op " + std::to_string(raw);
      expectInvalid(shoal_allreduce(comm, a, b, 1, SHOAL_I32, op), comm, {word}, "allreduce");
      expectInvalid(shoal_reduce_scatter(comm, a, b, 1, SHOAL_I32, op), comm, {word}, "reduce_scatter");
      EXPECT_STREQ(shoal_op_name(op), "invalid");
    }
  });
}

TEST(InvalidArgument, BitwiseOpOnFloat) {
  onOneRank([](shoal_comm_t comm) {
    double a[4] = {}, b[4] = {};
    for (shoal_dtype_t dtype : {SHOAL_F16, SHOAL_BF16, SHOAL_F32, SHOAL_F64})
      for (shoal_op_t op : {SHOAL_BAND, SHOAL_BOR, SHOAL_BXOR}) {
        std::string what = std::string(shoal_op_name(op)) + " on " + shoal_dtype_name(dtype);
        expectInvalid(shoal_allreduce(comm, a, b, 1, dtype, op), comm, {shoal_op_name(op), shoal_dtype_name(dtype)},
                      "allreduce " + what);
        expectInvalid(shoal_reduce_scatter(comm, a, b, 1, dtype, op), comm,
                      {shoal_op_name(op), shoal_dtype_name(dtype)}, "reduce_scatter " + what);
      }
  });
}

TEST(InvalidArgument, RootOutOfRange) {
  runRanks(2, [](int, shoal_comm_t comm) {
    float a[4] = {}, b[4] = {};
    for (int root : {-1, 2, INT_MAX, INT_MIN})
      expectInvalid(shoal_broadcast(comm, a, b, 4, SHOAL_F32, root), comm, {"root " + std::to_string(root)},
                    "broadcast root " + std::to_string(root));
    // Refused locally on both ranks, so both are still in step.
    expectOk(shoal_broadcast(comm, a, b, 4, SHOAL_F32, 1), comm, "broadcast root 1");
  }, {nullptr, 20});
}

TEST(InvalidArgument, CountOverflow) {
  onOneRank([](shoal_comm_t comm) {
    uint64_t a[4] = {}, b[4] = {};
    size_t huge[1] = {SIZE_MAX};
    for (size_t count : {SIZE_MAX, SIZE_MAX / 8 + 1}) {
      std::string what = " count " + std::to_string(count);
      expectInvalid(shoal_allreduce(comm, a, b, count, SHOAL_U64, SHOAL_SUM), comm, {"count", "overflow"},
                    "allreduce" + what);
      expectInvalid(shoal_allgather(comm, a, b, count, SHOAL_F64), comm, {"sendcount", "overflow"},
                    "allgather" + what);
      expectInvalid(shoal_broadcast(comm, a, b, count, SHOAL_I64, 0), comm, {"count", "overflow"},
                    "broadcast" + what);
      expectInvalid(shoal_reduce_scatter(comm, a, b, count, SHOAL_U64, SHOAL_MAX), comm, {"recvcount", "overflow"},
                    "reduce_scatter" + what);
    }
    huge[0] = SIZE_MAX;
    expectInvalid(shoal_allgatherv(comm, a, SIZE_MAX, b, huge, nullptr, SHOAL_U64), comm, {"recvcounts", "overflow"},
                  "allgatherv");
  });
  // sendcount x world size overflows although sendcount x element size does not.
  runRanks(4, [](int, shoal_comm_t comm) {
    uint8_t a[4] = {}, b[16] = {};
    expectInvalid(shoal_allgather(comm, a, b, SIZE_MAX / 2, SHOAL_U8), comm, {"sendcount", "overflow"},
                  "allgather x world size");
    expectInvalid(shoal_reduce_scatter(comm, b, a, SIZE_MAX / 2, SHOAL_U8, SHOAL_SUM), comm,
                  {"recvcount", "overflow"}, "reduce_scatter x world size");
  }, {nullptr, 20});
}

TEST(InvalidArgument, AllgathervCounts) {
  runRanks(2, [](int rank, shoal_comm_t comm) {
    int32_t a[8] = {}, b[16] = {};
    expectInvalid(shoal_allgatherv(comm, a, 2, b, nullptr, nullptr, SHOAL_I32), comm, {"recvcounts"},
                  "NULL recvcounts");
    size_t counts[2] = {2, 3};
    expectInvalid(shoal_allgatherv(comm, a, counts[rank] + 1, b, counts, nullptr, SHOAL_I32), comm, {"sendcount"},
                  "sendcount != recvcounts[rank]");
    expectOk(shoal_allgatherv(comm, a, counts[rank], b, counts, nullptr, SHOAL_I32), comm, "matching counts");
  }, {nullptr, 20});
}

// A caller's options struct is read up to its struct_size: an older (smaller)
// struct's missing fields take SHOAL_ALLREDUCE_OPTIONS_INIT's values, whatever
// lies behind it; a struct of this size is read whole; 0 or a size larger
// than this library knows is refused.
TEST(InvalidArgument, AllreduceOptionsStructSize) {
  onOneRank([](shoal_comm_t comm) {
    float data[4] = {1, 2, 3, 4};
    shoal_tensor_t tensor = shoal_tensor_1d(data, 4, SHOAL_F32);
    shoal_allreduce_options_t options = SHOAL_ALLREDUCE_OPTIONS_INIT;
    options.compressor = "fp16";
    options.compress_min_bytes = 0;
    shoal_compress_stats_t stats{};
    stats.struct_size = sizeof stats;
    options.struct_size = offsetof(shoal_allreduce_options_t, compressor);  // name only: fp16 is not read
    expectOk(shoal_allreduce_tensor(comm, &tensor, &tensor, SHOAL_SUM, &options), comm, "older struct");
    ASSERT_EQ(shoal_last_compress_stats(comm, &stats), SHOAL_OK);
    EXPECT_STREQ(stats.compressor, "none") << "a field beyond struct_size was read";
    options.struct_size = sizeof options;
    expectOk(shoal_allreduce_tensor(comm, &tensor, &tensor, SHOAL_SUM, &options), comm, "this size");
    ASSERT_EQ(shoal_last_compress_stats(comm, &stats), SHOAL_OK);
    EXPECT_STREQ(stats.compressor, "fp16");
    for (size_t size : {size_t(0), sizeof options + 8}) {
      options.struct_size = size;
      expectInvalid(shoal_allreduce_tensor(comm, &tensor, &tensor, SHOAL_SUM, &options), comm,
                    {"shoal_allreduce_tensor", "struct_size", "SHOAL_ALLREDUCE_OPTIONS_INIT"},
                    "struct_size " + std::to_string(size));
    }
  });
}

// A struct_size inside a field (here: half of the compressor pointer) is
// refused with text naming the sizes that are accepted, not read as a
// struct that ends there.
TEST(InvalidArgument, StructSizeInsideAFieldIsRefused) {
  onOneRank([](shoal_comm_t comm) {
    float data[4] = {1, 2, 3, 4};
    shoal_tensor_t tensor = shoal_tensor_1d(data, 4, SHOAL_F32);
    shoal_allreduce_options_t options = SHOAL_ALLREDUCE_OPTIONS_INIT;
    options.compressor = "fp16";
    options.struct_size = offsetof(shoal_allreduce_options_t, compressor) + 4;
    const std::string size = std::to_string(options.struct_size);
    // The sizes accepted, listed: every field's end (8-byte fields here).
    std::string older;
    for (size_t end = 8; end <= sizeof(shoal_allreduce_options_t); end += 8)
      older += (older.empty() ? "" : ", ") + std::to_string(end);
    expectInvalid(shoal_allreduce_tensor(comm, &tensor, &tensor, SHOAL_SUM, &options), comm,
                  {"shoal_allreduce_tensor", "struct_size is " + size, older, "SHOAL_ALLREDUCE_OPTIONS_INIT"},
                  "allreduce options of " + size + " bytes");
    shoal_async_options_t async = SHOAL_ASYNC_OPTIONS_INIT;
    async.struct_size = offsetof(shoal_async_options_t, compressor) + 2;
    shoal_request_t request = nullptr;
    expectInvalid(shoal_iallreduce(comm, "t", &tensor, &tensor, SHOAL_SUM, &async, &request), comm,
                  {"struct_size is " + std::to_string(async.struct_size), "SHOAL_ASYNC_OPTIONS_INIT"},
                  "async options");
    EXPECT_EQ(request, nullptr);
  });
}

// A caller built against an older header gets only the fields its struct
// has, and its struct_size stays its own: a later call with the same struct
// must not write beyond it.
TEST(InvalidArgument, StatsIntoAnOlderStructWriteOnlyItsFields) {
  onOneRank([](shoal_comm_t comm) {
    float data[4] = {1, 2, 3, 4};
    shoal_tensor_t tensor = shoal_tensor_1d(data, 4, SHOAL_F32);
    expectOk(shoal_allreduce_tensor(comm, &tensor, &tensor, SHOAL_SUM, nullptr), comm, "allreduce");
    struct {
      shoal_compress_stats_t stats;
      unsigned char guard[sizeof(shoal_compress_stats_t)];
    } older;
    std::memset(&older, 0xa5, sizeof older);
    const size_t olderSize = offsetof(shoal_compress_stats_t, input_bytes) + sizeof(uint64_t);
    older.stats.struct_size = olderSize;
    for (int call = 0; call < 2; ++call) {
      ASSERT_EQ(shoal_last_compress_stats(comm, &older.stats), SHOAL_OK) << shoal_last_error(comm);
      EXPECT_EQ(older.stats.struct_size, olderSize) << "call " << call << " changed the caller's struct_size";
      EXPECT_EQ(older.stats.input_bytes, sizeof data);
      const auto* bytes = reinterpret_cast<const unsigned char*>(&older.stats);
      for (size_t i = olderSize; i < sizeof older; ++i)
        ASSERT_EQ(bytes[i], 0xa5) << "byte " << i << " beyond the caller's struct was written (call " << call << ")";
    }
    shoal_compress_stats_t halfField = SHOAL_COMPRESS_STATS_INIT;
    halfField.struct_size = olderSize - 4;
    expectInvalid(shoal_last_compress_stats(comm, &halfField), comm,
                  {"shoal_last_compress_stats", "struct_size", "SHOAL_COMPRESS_STATS_INIT"}, "stats mid-field");
    expectInvalid(shoal_last_compress_stats(comm, nullptr), comm, {"stats is NULL"}, "stats NULL");
  });
}

TEST(InvalidArgument, PartialOverlap) {
  onOneRank([](shoal_comm_t comm) {
    float buffer[64] = {};
    size_t counts[1] = {8};
    expectInvalid(shoal_allreduce(comm, buffer, buffer + 1, 8, SHOAL_F32, SHOAL_SUM), comm, {"overlap"}, "allreduce");
    expectInvalid(shoal_allreduce(comm, buffer + 4, buffer, 8, SHOAL_F32, SHOAL_SUM), comm, {"overlap"},
                  "allreduce, recv first");
    expectInvalid(shoal_allgather(comm, buffer + 1, buffer, 8, SHOAL_F32), comm, {"overlap"}, "allgather");
    expectInvalid(shoal_allgatherv(comm, buffer + 3, 8, buffer, counts, nullptr, SHOAL_F32), comm, {"overlap"},
                  "allgatherv");
    expectInvalid(shoal_broadcast(comm, buffer, buffer + 7, 8, SHOAL_F32, 0), comm, {"overlap"}, "broadcast");
    expectInvalid(shoal_reduce_scatter(comm, buffer, buffer + 2, 8, SHOAL_F32, SHOAL_SUM), comm, {"overlap"},
                  "reduce_scatter");
    // Adjacent (touching) buffers do not overlap.
    expectOk(shoal_allreduce(comm, buffer, buffer + 8, 8, SHOAL_F32, SHOAL_SUM), comm, "adjacent allreduce");
  });
}

// The documented in-place layouts are accepted on every rank (not refused as
// overlaps) and give the right answer. One communicator per collective, so a
// failure in one does not desynchronise the others.
constexpr int kInPlaceRanks = 3;
void onThreeRanks(const std::function<void(int, shoal_comm_t)>& body) { runRanks(kInPlaceRanks, body, {nullptr, 5}); }

TEST(InPlace, AllgatherRecvBlockIsSendbuf) {
  const int n = kInPlaceRanks;
  onThreeRanks([&](int rank, shoal_comm_t comm) {
    std::vector<int32_t> buffer(n, -1);
    buffer[rank] = 100 + rank;
    expectOk(shoal_allgather(comm, buffer.data() + rank, buffer.data(), 1, SHOAL_I32), comm,
             "allgather in place, rank " + std::to_string(rank));
    for (int r = 0; r < n; ++r) EXPECT_EQ(buffer[r], 100 + r) << "allgather in place, rank " << rank;
  });
}

TEST(InPlace, AllgathervWithDispls) {
  const int n = kInPlaceRanks;
  onThreeRanks([&](int rank, shoal_comm_t comm) {
    std::vector<size_t> counts(n, 2), displs(n);
    for (int r = 0; r < n; ++r) displs[r] = 1 + 3 * static_cast<size_t>(n - 1 - r);  // reversed, with gaps
    std::vector<int32_t> buffer(3 * n + 1, -1);
    buffer[displs[rank]] = 10 * rank, buffer[displs[rank] + 1] = 10 * rank + 1;
    expectOk(shoal_allgatherv(comm, buffer.data() + displs[rank], 2, buffer.data(), counts.data(), displs.data(),
                              SHOAL_I32),
             comm, "allgatherv in place with displs, rank " + std::to_string(rank));
    for (int r = 0; r < n; ++r) {
      EXPECT_EQ(buffer[displs[r]], 10 * r) << "allgatherv in place, rank " << rank;
      EXPECT_EQ(buffer[displs[r] + 1], 10 * r + 1) << "allgatherv in place, rank " << rank;
    }
  });
}

TEST(InPlace, ReduceScatterRecvbufIsOwnBlock) {
  const int n = kInPlaceRanks;
  onThreeRanks([&](int rank, shoal_comm_t comm) {
    std::vector<int32_t> buffer(n);
    for (int i = 0; i < n; ++i) buffer[i] = i + rank;
    expectOk(shoal_reduce_scatter(comm, buffer.data(), buffer.data() + rank, 1, SHOAL_I32, SHOAL_SUM), comm,
             "reduce_scatter in place, rank " + std::to_string(rank));
    EXPECT_EQ(buffer[rank], n * rank + n * (n - 1) / 2) << "reduce_scatter in place, rank " << rank;
  });
}

TEST(InPlace, AllreduceAndBroadcastSendIsRecv) {
  const int n = kInPlaceRanks;
  onThreeRanks([&](int rank, shoal_comm_t comm) {
    int32_t value = rank;
    expectOk(shoal_allreduce(comm, &value, &value, 1, SHOAL_I32, SHOAL_MAX), comm, "allreduce in place");
    EXPECT_EQ(value, n - 1);
    value = rank == 1 ? 42 : 0;
    expectOk(shoal_broadcast(comm, &value, &value, 1, SHOAL_I32, 1), comm, "broadcast in place");
    EXPECT_EQ(value, 42);
  });
}

TEST(InvalidArgument, UseAfterFinalize) {
  onOneRank([](shoal_comm_t comm) {
    float a[4] = {}, b[4] = {};
    size_t counts[1] = {4};
    int value = 0;
    ASSERT_EQ(shoal_comm_finalize(comm), SHOAL_OK) << shoal_last_error(comm);
    expectInvalid(shoal_allreduce(comm, a, b, 4, SHOAL_F32, SHOAL_SUM), comm, {"finalized"}, "allreduce");
    expectInvalid(shoal_allgather(comm, a, b, 4, SHOAL_F32), comm, {"finalized"}, "allgather");
    expectInvalid(shoal_allgatherv(comm, a, 4, b, counts, nullptr, SHOAL_F32), comm, {"finalized"}, "allgatherv");
    expectInvalid(shoal_broadcast(comm, a, b, 4, SHOAL_F32, 0), comm, {"finalized"}, "broadcast");
    expectInvalid(shoal_reduce_scatter(comm, a, b, 4, SHOAL_F32, SHOAL_SUM), comm, {"finalized"}, "reduce_scatter");
    expectInvalid(shoal_barrier(comm), comm, {"finalized"}, "barrier");
    expectInvalid(shoal_comm_rank(comm, &value), comm, {"finalized"}, "comm_rank");
    expectInvalid(shoal_comm_size(comm, &value), comm, {"finalized"}, "comm_size");
    expectInvalid(shoal_allreduce(comm, nullptr, nullptr, 0, SHOAL_F32, SHOAL_SUM), comm, {"finalized"},
                  "allreduce count 0");
    expectInvalid(shoal_comm_finalize(comm), comm, {"already finalized"}, "second finalize");
    // runRanks then destroys the finalized handle, which must be fine.
  });
}

TEST(InvalidArgument, FinalizeOnSeveralRanks) {
  runRanks(3, [](int, shoal_comm_t comm) {
    expectOk(shoal_barrier(comm), comm, "barrier");
    expectOk(shoal_comm_finalize(comm), comm, "finalize");
    expectInvalid(shoal_barrier(comm), comm, {"finalized"}, "barrier after finalize");
  }, {nullptr, 20});
}

// ---- communicator configuration ---------------------------------------------------

// Creates one rank's communicator; returns the status with the thread's error text.
shoal_status_t tryInit(shoal_config_t config, std::string* text) {
  shoal_comm_t comm = reinterpret_cast<shoal_comm_t>(uintptr_t(1));
  shoal_status_t status = shoal_comm_init_config(&config, &comm);
  *text = shoal_last_error(nullptr);
  if (status == SHOAL_OK) {
    EXPECT_NE(comm, nullptr);
    shoal_comm_destroy(comm);
  } else {
    EXPECT_EQ(comm, nullptr) << "a failed init must leave *comm NULL";
  }
  return status;
}

shoal_config_t oneRankConfig() {
  static std::string store;
  store = shoal::test::freshMemoryStore();
  shoal_config_t config = SHOAL_CONFIG_INIT;
  config.rank = 0;
  config.world_size = 1;
  config.store = store.c_str();
  config.timeout_s = 10;
  return config;
}

TEST(Config, StructSize) {
  clearLaunchEnvironment();
  std::string text;
  shoal_config_t config = oneRankConfig();
  config.struct_size = 0;
  EXPECT_EQ(tryInit(config, &text), SHOAL_ERR_INVALID_ARGUMENT);
  EXPECT_NE(text.find("struct_size"), std::string::npos) << text;
  config.struct_size = sizeof(shoal_config_t) + 64;
  EXPECT_EQ(tryInit(config, &text), SHOAL_ERR_INVALID_ARGUMENT);
  EXPECT_NE(text.find("struct_size"), std::string::npos) << text;
  // An older, shorter struct (without `algorithm`) is accepted with defaults for the rest.
  config = oneRankConfig();
  config.struct_size = offsetof(shoal_config_t, algorithm);
  config.algorithm = "bogus";  // beyond struct_size: must not be read
  EXPECT_EQ(tryInit(config, &text), SHOAL_OK) << text;
  // The full struct works.
  EXPECT_EQ(tryInit(oneRankConfig(), &text), SHOAL_OK) << text;
}

TEST(Config, RankAndWorldSize) {
  clearLaunchEnvironment();
  std::string text;
  shoal_config_t config = oneRankConfig();
  config.rank = 2;
  config.world_size = 2;
  EXPECT_EQ(tryInit(config, &text), SHOAL_ERR_INVALID_ARGUMENT);
  EXPECT_NE(text.find("config.rank"), std::string::npos) << text;
  EXPECT_NE(text.find("rank 2"), std::string::npos) << text;
  config.rank = 5;
  config.world_size = 3;
  EXPECT_EQ(tryInit(config, &text), SHOAL_ERR_INVALID_ARGUMENT);
  EXPECT_NE(text.find("rank 5"), std::string::npos) << text;
  config.rank = 0;
  config.world_size = 0;
  EXPECT_EQ(tryInit(config, &text), SHOAL_ERR_INVALID_ARGUMENT);
  EXPECT_NE(text.find("world_size"), std::string::npos) << text;
  config.rank = -1;  // not in the environment either
  config.world_size = 2;
  EXPECT_EQ(tryInit(config, &text), SHOAL_ERR_INVALID_ARGUMENT);
  EXPECT_NE(text.find("rank"), std::string::npos) << text;
  // A NULL out-parameter.
  config = oneRankConfig();
  EXPECT_EQ(shoal_comm_init_config(&config, nullptr), SHOAL_ERR_INVALID_ARGUMENT);
  EXPECT_NE(std::string(shoal_last_error(nullptr)).find("comm"), std::string::npos) << shoal_last_error(nullptr);
}

TEST(Config, SeveralRanksNeedAStore) {
  clearLaunchEnvironment();
  std::string text;
  shoal_config_t config = oneRankConfig();
  config.world_size = 2;
  config.store = nullptr;
  EXPECT_EQ(tryInit(config, &text), SHOAL_ERR_INVALID_ARGUMENT);
  EXPECT_NE(text.find("SHOAL_STORE"), std::string::npos) << text;
}

TEST(Config, UnknownAlgorithm) {
  clearLaunchEnvironment();
  std::string text;
  shoal_config_t config = oneRankConfig();
  config.algorithm = "bogus";
  EXPECT_EQ(tryInit(config, &text), SHOAL_ERR_NOT_FOUND);
  for (const char* word : {"bogus", "ring", "tree"})
    EXPECT_NE(text.find(word), std::string::npos) << "missing '" << word << "' in: " << text;
  for (const char* valid : {"auto", "ring", "tree"}) {
    config = oneRankConfig();
    config.algorithm = valid;
    EXPECT_EQ(tryInit(config, &text), SHOAL_OK) << valid << ": " << text;
  }
}

TEST(Config, UnknownStoreScheme) {
  clearLaunchEnvironment();
  std::string text;
  shoal_config_t config = oneRankConfig();
  config.store = "nosuch://somewhere";
  EXPECT_EQ(tryInit(config, &text), SHOAL_ERR_NOT_FOUND) << text;
  EXPECT_NE(text.find("nosuch"), std::string::npos) << text;
}

// ---- names --------------------------------------------------------------------------

TEST(Names, Dtypes) {
  struct Case { const char* name; shoal_dtype_t dtype; };
  const Case cases[] = {
      {"half", SHOAL_F16},     {"f16", SHOAL_F16},     {"float16", SHOAL_F16}, {"fp16", SHOAL_F16},
      {"bfloat16", SHOAL_BF16}, {"bf16", SHOAL_BF16},  {"float", SHOAL_F32},   {"f32", SHOAL_F32},
      {"float32", SHOAL_F32},  {"fp32", SHOAL_F32},    {"double", SHOAL_F64},  {"f64", SHOAL_F64},
      {"float64", SHOAL_F64},  {"int8", SHOAL_I8},     {"i8", SHOAL_I8},       {"uint8", SHOAL_U8},
      {"u8", SHOAL_U8},        {"int32", SHOAL_I32},   {"i32", SHOAL_I32},     {"int", SHOAL_I32},
      {"uint32", SHOAL_U32},   {"u32", SHOAL_U32},     {"int64", SHOAL_I64},   {"i64", SHOAL_I64},
      {"uint64", SHOAL_U64},   {"u64", SHOAL_U64},
  };
  for (const Case& c : cases) {
    shoal_dtype_t dtype = SHOAL_DTYPE_COUNT;
    EXPECT_EQ(shoal_dtype_from_name(c.name, &dtype), SHOAL_OK) << c.name << ": " << shoal_last_error(nullptr);
    EXPECT_EQ(dtype, c.dtype) << c.name;
  }
  const size_t sizes[SHOAL_DTYPE_COUNT] = {2, 2, 4, 8, 1, 1, 4, 4, 8, 8};
  for (int raw = 0; raw < SHOAL_DTYPE_COUNT; ++raw) {
    auto dtype = static_cast<shoal_dtype_t>(raw);
    EXPECT_EQ(shoal_dtype_size(dtype), sizes[raw]) << raw;
    shoal_dtype_t back = SHOAL_DTYPE_COUNT;
    EXPECT_EQ(shoal_dtype_from_name(shoal_dtype_name(dtype), &back), SHOAL_OK) << shoal_dtype_name(dtype);
    EXPECT_EQ(back, dtype) << "name round trip of " << shoal_dtype_name(dtype);
  }
  shoal_dtype_t dtype = SHOAL_F32;
  EXPECT_EQ(shoal_dtype_from_name("float128", &dtype), SHOAL_ERR_NOT_FOUND);
  EXPECT_NE(std::string(shoal_last_error(nullptr)).find("float128"), std::string::npos) << shoal_last_error(nullptr);
  EXPECT_EQ(dtype, SHOAL_F32) << "a failed parse must not write the result";
  EXPECT_EQ(shoal_dtype_from_name("", &dtype), SHOAL_ERR_NOT_FOUND);
  EXPECT_EQ(shoal_dtype_from_name(nullptr, &dtype), SHOAL_ERR_INVALID_ARGUMENT);
  EXPECT_EQ(shoal_dtype_from_name("float", nullptr), SHOAL_ERR_INVALID_ARGUMENT);
}

TEST(Names, Ops) {
  const char* names[] = {"sum", "avg", "prod", "min", "max", "band", "bor", "bxor"};
  for (int raw = 0; raw < SHOAL_OP_COUNT; ++raw) {
    shoal_op_t op = SHOAL_OP_COUNT;
    EXPECT_EQ(shoal_op_from_name(names[raw], &op), SHOAL_OK) << names[raw] << ": " << shoal_last_error(nullptr);
    EXPECT_EQ(op, static_cast<shoal_op_t>(raw)) << names[raw];
    EXPECT_STREQ(shoal_op_name(static_cast<shoal_op_t>(raw)), names[raw]);
  }
  shoal_op_t op = SHOAL_SUM;
  EXPECT_EQ(shoal_op_from_name("median", &op), SHOAL_ERR_NOT_FOUND);
  EXPECT_NE(std::string(shoal_last_error(nullptr)).find("median"), std::string::npos) << shoal_last_error(nullptr);
  EXPECT_EQ(op, SHOAL_SUM);
  EXPECT_EQ(shoal_op_from_name(nullptr, &op), SHOAL_ERR_INVALID_ARGUMENT);
  EXPECT_EQ(shoal_op_from_name("sum", nullptr), SHOAL_ERR_INVALID_ARGUMENT);
}

TEST(Names, StatusStrings) {
  const std::pair<shoal_status_t, const char*> codes[] = {
      {SHOAL_OK, "SHOAL_OK"},
      {SHOAL_ERR_INVALID_ARGUMENT, "SHOAL_ERR_INVALID_ARGUMENT"},
      {SHOAL_ERR_TIMEOUT, "SHOAL_ERR_TIMEOUT"},
      {SHOAL_ERR_REMOTE, "SHOAL_ERR_REMOTE"},
      {SHOAL_ERR_MISMATCH, "SHOAL_ERR_MISMATCH"},
      {SHOAL_ERR_SYSTEM, "SHOAL_ERR_SYSTEM"},
      {SHOAL_ERR_NOT_FOUND, "SHOAL_ERR_NOT_FOUND"},
      {SHOAL_ERR_UNSUPPORTED, "SHOAL_ERR_UNSUPPORTED"},
      {SHOAL_ERR_NO_MEMORY, "SHOAL_ERR_NO_MEMORY"},
      {SHOAL_ERR_INTERNAL, "SHOAL_ERR_INTERNAL"},
  };
  for (auto [status, name] : codes) EXPECT_EQ(std::string(shoal_status_string(status)).rfind(name, 0), 0u) << name;
  EXPECT_NE(shoal_status_string(static_cast<shoal_status_t>(-100)), nullptr);
}

// ---- ranks that disagree ---------------------------------------------------------------

constexpr double kTimeoutS = 3;
constexpr double kSlackS = 4;  // abort notices, thread scheduling on 2 cores, sanitizers

struct Outcome {
  shoal_status_t status = SHOAL_OK;
  double seconds = 0;
  std::string text;
  shoal_status_t nextStatus = SHOAL_OK;
  double nextSeconds = 0;
  std::string nextText;
};

bool isCrossRankError(shoal_status_t status) {
  return status == SHOAL_ERR_MISMATCH || status == SHOAL_ERR_REMOTE || status == SHOAL_ERR_TIMEOUT;
}

// Runs `call` on n ranks, then a barrier as the next call on the same communicator.
std::vector<Outcome> runDisagreement(int n, const char* algorithm,
                                     const std::function<shoal_status_t(int rank, shoal_comm_t comm)>& call) {
  std::vector<Outcome> outcomes(n);
  runRanks(n, [&](int rank, shoal_comm_t comm) {
    Outcome& out = outcomes[rank];
    auto start = Clock::now();
    out.status = call(rank, comm);
    out.seconds = secondsSince(start);
    out.text = shoal_last_error(comm);
    start = Clock::now();
    out.nextStatus = shoal_barrier(comm);
    out.nextSeconds = secondsSince(start);
    out.nextText = shoal_last_error(comm);
  }, {algorithm, kTimeoutS});
  return outcomes;
}

// Every rank got an error within the deadline (plus slack), and the next call
// failed at once, saying that the communicator failed earlier.
void expectErrorOnEveryRank(const std::vector<Outcome>& outcomes, const std::string& what) {
  for (size_t rank = 0; rank < outcomes.size(); ++rank) {
    const Outcome& out = outcomes[rank];
    EXPECT_TRUE(isCrossRankError(out.status))
        << what << ", rank " << rank << ": got " << shoal_status_string(out.status) << ": " << out.text;
    EXPECT_LT(out.seconds, kTimeoutS + kSlackS) << what << ", rank " << rank << ": error came too late";
    EXPECT_FALSE(out.text.empty()) << what << ", rank " << rank;
    EXPECT_NE(out.nextStatus, SHOAL_OK) << what << ", rank " << rank << ": the next call succeeded";
    // A disagreement stays one: a rank that reached the next call after a
    // peer's mismatch notice had failed its transport reports MISMATCH too.
    if (out.status == SHOAL_ERR_MISMATCH)
      EXPECT_EQ(out.nextStatus, SHOAL_ERR_MISMATCH) << what << ", rank " << rank << ": " << out.nextText;
    EXPECT_LT(out.nextSeconds, 1.0) << what << ", rank " << rank << ": the next call did not fail fast: "
                                    << out.nextText;
    EXPECT_NE(out.nextText.find("failed earlier"), std::string::npos)
        << what << ", rank " << rank << ": next call's text: " << out.nextText;
  }
}

class Disagreement : public ::testing::TestWithParam<std::string> {
 protected:
  const char* algorithm() const { return GetParam().c_str(); }
};

TEST_P(Disagreement, AllreduceCounts1000Vs999) {
  for (int n : {2, 3}) {
    auto outcomes = runDisagreement(n, algorithm(), [&](int rank, shoal_comm_t comm) {
      std::vector<float> data(1000, 1.0f);
      size_t count = rank == n - 1 ? 999 : 1000;
      return shoal_allreduce(comm, data.data(), data.data(), count, SHOAL_F32, SHOAL_SUM);
    });
    expectErrorOnEveryRank(outcomes, std::to_string(n) + " ranks, last rank count 999");
  }
}

TEST_P(Disagreement, AllreduceCounts0Vs7) {
  auto outcomes = runDisagreement(2, algorithm(), [](int rank, shoal_comm_t comm) {
    std::vector<int32_t> data(7, 1);
    return shoal_allreduce(comm, data.data(), data.data(), rank == 0 ? 0 : 7, SHOAL_I32, SHOAL_SUM);
  });
  expectErrorOnEveryRank(outcomes, "rank 0 count 0, rank 1 count 7");
}

TEST_P(Disagreement, AllreduceDtypesF32VsF64) {
  auto outcomes = runDisagreement(2, algorithm(), [](int rank, shoal_comm_t comm) {
    std::vector<double> data(100, 1.0);
    return shoal_allreduce(comm, data.data(), data.data(), 100, rank == 0 ? SHOAL_F32 : SHOAL_F64, SHOAL_SUM);
  });
  expectErrorOnEveryRank(outcomes, "rank 0 f32, rank 1 f64");
}

// Broadcast: only a rank that receives the wrong size can notice; the root and
// ranks that only forward complete. Checked here: the receiving rank fails,
// and every other rank fails at the latest on its next call, promptly (the
// failing rank's abort notice), never by hanging.
TEST_P(Disagreement, BroadcastCounts) {
  auto outcomes = runDisagreement(3, algorithm(), [](int rank, shoal_comm_t comm) {
    std::vector<uint8_t> data(5000, 7);
    return shoal_broadcast(comm, data.data(), data.data(), rank == 2 ? 4000 : 5000, SHOAL_U8, 0);
  });
  const std::string what = "broadcast root 0, rank 2 count 4000";
  EXPECT_TRUE(isCrossRankError(outcomes[2].status)) << what << ", rank 2: " << shoal_status_string(outcomes[2].status);
  for (size_t rank = 0; rank < outcomes.size(); ++rank) {
    const Outcome& out = outcomes[rank];
    EXPECT_LT(out.seconds, kTimeoutS + kSlackS) << what << ", rank " << rank;
    EXPECT_TRUE(out.status != SHOAL_OK || isCrossRankError(out.nextStatus))
        << what << ", rank " << rank << ": neither the broadcast nor the next call failed: " << out.nextText;
    EXPECT_LT(out.nextSeconds, kTimeoutS) << what << ", rank " << rank << ": next call: " << out.nextText;
  }
}

TEST_P(Disagreement, AllgatherCounts) {
  auto outcomes = runDisagreement(3, algorithm(), [](int rank, shoal_comm_t comm) {
    std::vector<int64_t> send(100, rank), recv(300);
    return shoal_allgather(comm, send.data(), recv.data(), rank == 1 ? 99 : 100, SHOAL_I64);
  });
  expectErrorOnEveryRank(outcomes, "allgather, rank 1 count 99");
}

TEST_P(Disagreement, ReduceScatterCounts) {
  auto outcomes = runDisagreement(3, algorithm(), [](int rank, shoal_comm_t comm) {
    std::vector<float> send(3 * 1000, 1.0f), recv(1000);
    return shoal_reduce_scatter(comm, send.data(), recv.data(), rank == 0 ? 999 : 1000, SHOAL_F32, SHOAL_SUM);
  });
  expectErrorOnEveryRank(outcomes, "reduce_scatter, rank 0 count 999");
}

TEST_P(Disagreement, ReduceScatterTensorCounts) {
  auto outcomes = runDisagreement(3, algorithm(), [](int rank, shoal_comm_t comm) {
    const size_t count = rank == 2 ? 999 : 1000;
    std::vector<float> send(3 * count, 1.0f), recv(count);
    const shoal_tensor_t in = shoal_tensor_1d(send.data(), send.size(), SHOAL_F32);
    const shoal_tensor_t out = shoal_tensor_1d(recv.data(), recv.size(), SHOAL_F32);
    return shoal_reduce_scatter_tensor(comm, &in, &out, SHOAL_SUM);
  });
  expectErrorOnEveryRank(outcomes, "reduce_scatter_tensor, rank 2 count 999");
}

// A rank that does not call the collective: the others time out; when it calls
// later, it fails too instead of waiting for its own deadline.
TEST_P(Disagreement, StalledRank) {
  std::vector<Outcome> outcomes(2);
  runRanks(2, [&](int rank, shoal_comm_t comm) {
    Outcome& out = outcomes[rank];
    std::vector<float> data(64, 1.0f);
    if (rank == 1) std::this_thread::sleep_for(std::chrono::duration<double>(kTimeoutS + 1.5));
    auto start = Clock::now();
    out.status = shoal_allreduce(comm, data.data(), data.data(), data.size(), SHOAL_F32, SHOAL_SUM);
    out.seconds = secondsSince(start);
    out.text = shoal_last_error(comm);
  }, {algorithm(), kTimeoutS});
  EXPECT_EQ(outcomes[0].status, SHOAL_ERR_TIMEOUT) << outcomes[0].text;
  EXPECT_GE(outcomes[0].seconds, kTimeoutS * 0.9) << "timed out before the deadline";
  EXPECT_LT(outcomes[0].seconds, kTimeoutS + kSlackS);
  EXPECT_NE(outcomes[0].text.find("rank 1"), std::string::npos) << "should name the missing rank: " << outcomes[0].text;
  EXPECT_TRUE(isCrossRankError(outcomes[1].status)) << shoal_status_string(outcomes[1].status) << ": "
                                                    << outcomes[1].text;
  EXPECT_LT(outcomes[1].seconds, kTimeoutS + kSlackS);
}

// The plain host path (the driver's shortcut for a call that names no
// compressor) against a rank that compresses: the compression decision is in
// the call's signature, so every rank fails, whichever path each took.
TEST_P(Disagreement, AllreduceTensorPlainVsCompressed) {
  auto outcomes = runDisagreement(2, algorithm(), [](int rank, shoal_comm_t comm) {
    std::vector<float> data(256, 1.0f);
    shoal_tensor_t tensor = shoal_tensor_1d(data.data(), data.size(), SHOAL_F32);
    shoal_allreduce_options_t options = SHOAL_ALLREDUCE_OPTIONS_INIT;
    options.compressor = rank == 0 ? "none" : "fp16";
    options.compress_min_bytes = 0;
    return shoal_allreduce_tensor(comm, &tensor, &tensor, SHOAL_SUM, &options);
  });
  expectErrorOnEveryRank(outcomes, "rank 0 plain, rank 1 fp16");
}

// One allreduce_tensor step: f32 or f64 data of rank + 1 (and 10 x (rank + 1)
// at odd indices), reduced with `op`.
struct Step {
  shoal_dtype_t dtype;
  shoal_op_t op;
  size_t count;
};

shoal_status_t allreduceStep(shoal_comm_t comm, int rank, const Step& step, std::vector<double>* result) {
  std::vector<float> f32(step.count);
  std::vector<double> f64(step.count);
  for (size_t i = 0; i < step.count; ++i) f32[i] = static_cast<float>(f64[i] = (i % 2 ? 10.0 : 1.0) * (rank + 1));
  void* data = step.dtype == SHOAL_F32 ? static_cast<void*>(f32.data()) : static_cast<void*>(f64.data());
  shoal_tensor_t tensor = shoal_tensor_1d(data, step.count, step.dtype);
  shoal_status_t status = shoal_allreduce_tensor(comm, &tensor, &tensor, step.op, nullptr);
  if (result != nullptr) {
    result->resize(step.count);
    for (size_t i = 0; i < step.count; ++i) (*result)[i] = step.dtype == SHOAL_F32 ? f32[i] : f64[i];
  }
  return status;
}

// A communicator keeps the last call's signature and tag word (the call
// word's memo, comm/agree.cc), so a call that repeats costs a comparison:
// calls that then change the dtype, the op or the count (on every rank alike)
// get their own word and the right result, and a repeated call that one rank
// then changes in one field fails on every rank.
TEST_P(Disagreement, RepeatedCallsThenOneFieldChanges) {
  const Step base{SHOAL_F32, SHOAL_SUM, 8};
  const std::vector<Step> steps = {base, base, base, {SHOAL_F64, SHOAL_SUM, 8}, base, {SHOAL_F32, SHOAL_MAX, 8},
                                   base, {SHOAL_F32, SHOAL_SUM, 9}, base, {SHOAL_F32, SHOAL_SUM, 0}, base};
  runRanks(2, [&](int rank, shoal_comm_t comm) {
    for (size_t s = 0; s < steps.size(); ++s) {
      std::vector<double> result;
      ASSERT_EQ(allreduceStep(comm, rank, steps[s], &result), SHOAL_OK) << "step " << s << ": " << shoal_last_error(comm);
      for (size_t i = 0; i < result.size(); ++i) {
        const double unit = i % 2 ? 10.0 : 1.0;  // ranks hold 1 and 2 units
        EXPECT_EQ(result[i], steps[s].op == SHOAL_MAX ? 2 * unit : 3 * unit) << "step " << s << ", element " << i;
      }
    }
  }, {algorithm(), kTimeoutS});
  for (const Step& changed : {Step{SHOAL_F64, SHOAL_SUM, 8}, Step{SHOAL_F32, SHOAL_MAX, 8}, Step{SHOAL_F32, SHOAL_SUM, 9}}) {
    auto outcomes = runDisagreement(2, algorithm(), [&](int rank, shoal_comm_t comm) {
      for (int repeat = 0; repeat < 3; ++repeat)
        EXPECT_EQ(allreduceStep(comm, rank, base, nullptr), SHOAL_OK) << "repeat " << repeat << ": "
                                                                      << shoal_last_error(comm);
      return allreduceStep(comm, rank, rank == 1 ? changed : base, nullptr);
    });
    expectErrorOnEveryRank(outcomes, std::string("after 3 repeats, rank 1 ") + shoal_dtype_name(changed.dtype) + " " +
                                         shoal_op_name(changed.op) + " count " + std::to_string(changed.count));
  }
}

INSTANTIATE_TEST_SUITE_P(Algorithms, Disagreement,
                         ::testing::Values(std::string("ring"), std::string("tree"), std::string("doubling"),
                                           std::string("shm")),
                         [](const ::testing::TestParamInfo<std::string>& info) { return info.param; });

// A late rank in a ring allgather: ranks 0 and 1 time out waiting for rank 2
// and abort. Rank 1 had already sent rank 2 everything rank 2 needs, so when
// rank 2 finally calls, its data is complete; still, the others reported an
// error for this call, so rank 2 must too (the abort notices are waiting for
// it), not return SHOAL_OK from a collective its peers gave up on.
// Also checked: after the call returned an error, the library does not write
// into the caller's recvbuf any more (ring allgather posts the receives of all
// steps up front), not even while finalize progresses the transport.
TEST(AfterError, LateRankInAllgather) {
  constexpr size_t kCount = 100;  // small: eager messages, delivered without the sender's help
  std::atomic<bool> lateRankDone{false};
  runRanks(3, [&](int rank, shoal_comm_t comm) {
    std::vector<int64_t> send(kCount, 1000 + rank), recv(3 * kCount, -1);
    if (rank == 2) {
      std::this_thread::sleep_for(std::chrono::duration<double>(kTimeoutS + 1));
      shoal_status_t status = shoal_allgather(comm, send.data(), recv.data(), kCount, SHOAL_I64);
      EXPECT_TRUE(isCrossRankError(status))
          << "late rank 2: shoal_allgather returned " << shoal_status_string(status)
          << " although ranks 0 and 1 had already failed this call and sent abort notices";
      lateRankDone = true;
      return;
    }
    shoal_status_t status = shoal_allgather(comm, send.data(), recv.data(), kCount, SHOAL_I64);
    // TIMEOUT, or REMOTE when the other one's deadline fired first and its abort notice arrived.
    EXPECT_TRUE(isCrossRankError(status)) << "rank " << rank << ": " << shoal_status_string(status) << ": "
                                          << shoal_last_error(comm);
    const std::vector<int64_t> snapshot = recv;
    for (int i = 0; i < 500 && !lateRankDone; ++i) std::this_thread::sleep_for(std::chrono::milliseconds(10));
    std::this_thread::sleep_for(std::chrono::milliseconds(100));
    EXPECT_EQ(shoal_comm_finalize(comm), SHOAL_OK) << shoal_last_error(comm);
    size_t changed = 0, first = 0;
    for (size_t i = 0; i < recv.size(); ++i)
      if (recv[i] != snapshot[i] && changed++ == 0) first = i;
    EXPECT_EQ(changed, 0u) << "rank " << rank << ": " << changed << " recvbuf elements changed after shoal_allgather "
                           << "returned " << shoal_status_string(status) << "; first at index " << first << ": "
                           << snapshot[first] << " -> " << recv[first];
  }, {nullptr, kTimeoutS});
}

// Ranks configured with different algorithms: init fails on every rank.
TEST(Config, AlgorithmsDifferAcrossRanks) {
  const std::string store = shoal::test::freshMemoryStore();
  const char* algorithms[3] = {"ring", "tree", "ring"};
  std::vector<shoal_status_t> statuses(3, SHOAL_OK);
  std::vector<std::string> texts(3);
  std::vector<double> seconds(3);
  std::vector<std::thread> threads;
  for (int rank = 0; rank < 3; ++rank) {
    threads.emplace_back([&, rank] {
      shoal_config_t config = SHOAL_CONFIG_INIT;
      config.rank = rank;
      config.world_size = 3;
      config.store = store.c_str();
      config.timeout_s = kTimeoutS;
      config.algorithm = algorithms[rank];
      shoal_comm_t comm = nullptr;
      auto start = Clock::now();
      statuses[rank] = shoal_comm_init_config(&config, &comm);
      seconds[rank] = secondsSince(start);
      texts[rank] = shoal_last_error(nullptr);
      shoal_comm_destroy(comm);
    });
  }
  for (std::thread& thread : threads) thread.join();
  for (int rank = 0; rank < 3; ++rank) {
    EXPECT_EQ(statuses[rank], SHOAL_ERR_MISMATCH) << "rank " << rank << ": " << shoal_status_string(statuses[rank])
                                                  << ": " << texts[rank];
    EXPECT_NE(texts[rank].find("SHOAL_ALGO"), std::string::npos) << "rank " << rank << ": " << texts[rank];
    EXPECT_LT(seconds[rank], kTimeoutS + kSlackS) << "rank " << rank;
  }
}

}  // namespace
