// The pipelined hierarchical allreduce (collectives/allreduce/hierarchical.cc)
// on emulated hosts: forked ranks on loopback told their host by
// SHOAL_HOST_ID, with chunks of SHOAL_HIER_CHUNK_BYTES = 4 KiB so that small
// buffers run as many chunks. Every dtype and op the algorithm takes, at
// counts smaller than a chunk, of several chunks, and of several chunks and a
// partial last one: integers exact (so equal to the flat ring's result, bit for
// bit), floats within the error of another summation order, min and max exact,
// and the same bits on every rank. A rank that dies while the pipeline runs
// is an error on every other rank, promptly. Also here: auto's choice for
// compressed calls (hierarchicalSuitsCompressor, from the compressor's bits)
// and the algorithm the debug log and the timeline name on such a layout.
#include <unistd.h>

#include <chrono>
#include <cmath>
#include <cstdint>
#include <cstdio>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <functional>
#include <sstream>
#include <string>
#include <thread>
#include <type_traits>
#include <vector>

#include <gtest/gtest.h>

#include "collectives/allreduce/hierarchical.h"
#include "comm/communicator.h"
#include "core/numeric/half_convert.h"
#include "multiproc/hierarchical_util.h"
#include "multiproc/split_job.h"
#include "shoal/compressor.h"

namespace {

using shoal::test::expectAllOk;
using shoal::test::Outcome;
using shoal::test::runJob;

constexpr size_t kChunkBytes = 4096;

std::function<std::map<std::string, std::string>(int)> pipelinedHosts(
    const std::string& layout, const std::string& algorithm = "hierarchical",
    std::map<std::string, std::string> extra = {}) {
  return [=](int rank) {
    std::map<std::string, std::string> environment = extra;
    environment["SHOAL_HOST_ID"] = std::string("host-") + layout[rank];
    environment["SHOAL_ALGO"] = algorithm;
    environment["SHOAL_HIER_CHUNK_BYTES"] = std::to_string(kChunkBytes);
    environment["SHOAL_HIER_MIN_BYTES"] = "4096";
    return environment;
  };
}

// A small integer per (rank, element): 1..11, or -5..5 for signed types, so
// that no sum, product or average overflows a wider type and narrow ones wrap
// the same way in any order.
int smallInt(int rank, size_t i, bool signedType) {
  const int value = static_cast<int>((i * 31 + static_cast<size_t>(rank) * 17) % 11);
  return signedType ? value - 5 : value + 1;
}

std::string where(const char* dtype, shoal_op_t op, size_t count, size_t i) {
  return std::string(dtype) + " " + shoal_op_name(op) + ", count " + std::to_string(count) + ", element " +
         std::to_string(i);
}

// The reduction of every rank's value in T's own arithmetic (wrapping as the
// reducer's does for narrow types; exact, since + and * mod 2^k commute).
template <typename T>
T reduceInts(int size, size_t i, shoal_op_t op) {
  const bool isSigned = std::is_signed<T>::value;
  T result = static_cast<T>(smallInt(0, i, isSigned));
  for (int r = 1; r < size; ++r) {
    const T v = static_cast<T>(smallInt(r, i, isSigned));
    switch (op) {
      case SHOAL_SUM: case SHOAL_AVG: result = static_cast<T>(result + v); break;
      case SHOAL_PROD: result = static_cast<T>(result * v); break;
      case SHOAL_MIN: result = std::min(result, v); break;
      case SHOAL_MAX: result = std::max(result, v); break;
      case SHOAL_BAND: result = static_cast<T>(result & v); break;
      case SHOAL_BOR: result = static_cast<T>(result | v); break;
      case SHOAL_BXOR: result = static_cast<T>(result ^ v); break;
      default: break;
    }
  }
  if (op == SHOAL_AVG) result = static_cast<T>(result / static_cast<T>(size));
  return result;
}

template <typename T>
shoal_status_t checkInts(shoal_comm_t comm, int rank, int size, shoal_dtype_t dtype, size_t count, std::string& text) {
  for (int o = 0; o < SHOAL_OP_COUNT; ++o) {
    const shoal_op_t op = static_cast<shoal_op_t>(o);
    std::vector<T> data(count);
    for (size_t i = 0; i < count; ++i) data[i] = static_cast<T>(smallInt(rank, i, std::is_signed<T>::value));
    if (shoal_status_t status = shoal_allreduce(comm, data.data(), data.data(), count, dtype, op))
      return text = where(shoal_dtype_name(dtype), op, count, 0) + ": " + shoal_last_error(comm), status;
    for (size_t i = 0; i < count; ++i)
      if (data[i] != reduceInts<T>(size, i, op))
        return text = where(shoal_dtype_name(dtype), op, count, i) + ": " + std::to_string(data[i]) + " != " +
                      std::to_string(reduceInts<T>(size, i, op)),
               SHOAL_ERR_INTERNAL;
  }
  return SHOAL_OK;
}

// Floats: sum, avg and prod within a few units of roundoff of the exact
// value, min and max exact; every rank the same bits.
double floatValue(int rank, size_t i, shoal_op_t op) {
  const double x = std::sin(0.001 * static_cast<double>(i) + rank) * (1 + rank);
  return op == SHOAL_PROD ? 1 + 0.25 * x / (1 + rank) : x;  // products of values near 1
}

template <typename T>
shoal_status_t checkFloats(shoal_comm_t comm, int rank, int size, shoal_dtype_t dtype, size_t count,
                           std::string& text) {
  const double epsilon = std::is_same<T, float>::value ? 6e-8 : 1.2e-16;
  for (shoal_op_t op : {SHOAL_SUM, SHOAL_AVG, SHOAL_PROD, SHOAL_MIN, SHOAL_MAX}) {
    std::vector<T> input(count), output(count);
    for (size_t i = 0; i < count; ++i) input[i] = static_cast<T>(floatValue(rank, i, op));
    if (shoal_status_t status = shoal_allreduce(comm, input.data(), output.data(), count, dtype, op))  // out of place
      return text = where(shoal_dtype_name(dtype), op, count, 0) + ": " + shoal_last_error(comm), status;
    for (size_t i = 0; i < count; ++i) {
      double exact = op == SHOAL_PROD ? 1 : op == SHOAL_MIN ? INFINITY : op == SHOAL_MAX ? -INFINITY : 0;
      double magnitude = op == SHOAL_PROD ? 1 : 0;
      for (int r = 0; r < size; ++r) {
        const double v = static_cast<T>(floatValue(r, i, op));
        if (op == SHOAL_PROD) exact *= v, magnitude *= std::fabs(v);
        else if (op == SHOAL_MIN) exact = std::min(exact, v);
        else if (op == SHOAL_MAX) exact = std::max(exact, v);
        else exact += v, magnitude += std::fabs(v);
      }
      if (op == SHOAL_AVG) exact /= size, magnitude /= size;
      const double bound = op == SHOAL_MIN || op == SHOAL_MAX ? 0 : (size + 1) * epsilon * magnitude + 1e-300;
      if (!(std::fabs(output[i] - exact) <= bound))
        return text = where(shoal_dtype_name(dtype), op, count, i) + ": " + std::to_string(output[i]) + " vs " +
                      std::to_string(exact),
               SHOAL_ERR_INTERNAL;
    }
    std::string what = where(shoal_dtype_name(dtype), op, count, 0);
    if (shoal_status_t status = shoal::test::sameOnEveryRank(comm, output.data(), count * sizeof(T), what, text))
      return status;
  }
  return SHOAL_OK;
}

// f16 and bf16: quarters from -1.25 to 1.25 (exact in both, and so are their
// sums over a few ranks), so sum, min and max are exact whatever the order;
// avg and prod round once per hop, within n units of the format's roundoff.
shoal_status_t checkHalves(shoal_comm_t comm, int rank, int size, shoal_dtype_t dtype, size_t count,
                           std::string& text) {
  const bool bf16 = dtype == SHOAL_BF16;
  auto toHalf = [&](const std::vector<float>& in, std::vector<uint16_t>& out) {
    out.resize(in.size());
    bf16 ? shoal::ops::floatToBfloat16(in.data(), out.data(), in.size())
         : shoal::ops::floatToHalf(in.data(), out.data(), in.size());
  };
  auto toFloat = [&](const std::vector<uint16_t>& in, std::vector<float>& out) {
    out.resize(in.size());
    bf16 ? shoal::ops::bfloat16ToFloat(in.data(), out.data(), in.size())
         : shoal::ops::halfToFloat(in.data(), out.data(), in.size());
  };
  auto value = [](int r, size_t i, shoal_op_t op) {
    const int k = smallInt(r, i, true);  // -5..5
    return op == SHOAL_PROD ? 1.0f + 0.125f * static_cast<float>(k) : 0.25f * static_cast<float>(k);
  };
  const double unit = bf16 ? 1.0 / 256 : 1.0 / 2048;
  for (shoal_op_t op : {SHOAL_SUM, SHOAL_AVG, SHOAL_PROD, SHOAL_MIN, SHOAL_MAX}) {
    std::vector<float> values(count), result;
    for (size_t i = 0; i < count; ++i) values[i] = value(rank, i, op);
    std::vector<uint16_t> data;
    toHalf(values, data);
    if (shoal_status_t status = shoal_allreduce(comm, data.data(), data.data(), count, dtype, op))
      return text = where(shoal_dtype_name(dtype), op, count, 0) + ": " + shoal_last_error(comm), status;
    toFloat(data, result);
    for (size_t i = 0; i < count; ++i) {
      double exact = op == SHOAL_PROD ? 1 : op == SHOAL_MIN ? INFINITY : op == SHOAL_MAX ? -INFINITY : 0;
      for (int r = 0; r < size; ++r) {
        const double v = value(r, i, op);
        if (op == SHOAL_PROD) exact *= v;
        else if (op == SHOAL_MIN) exact = std::min(exact, v);
        else if (op == SHOAL_MAX) exact = std::max(exact, v);
        else exact += v;
      }
      if (op == SHOAL_AVG) exact /= size;
      const double bound = op == SHOAL_AVG || op == SHOAL_PROD ? size * unit * std::fabs(exact) + 1e-30 : 0;
      if (!(std::fabs(result[i] - exact) <= bound))
        return text = where(shoal_dtype_name(dtype), op, count, i) + ": " + std::to_string(result[i]) + " vs " +
                      std::to_string(exact),
               SHOAL_ERR_INTERNAL;
    }
    std::string what = where(shoal_dtype_name(dtype), op, count, 0);
    if (shoal_status_t status = shoal::test::sameOnEveryRank(comm, data.data(), count * 2, what, text)) return status;
  }
  return SHOAL_OK;
}

shoal_status_t checkEveryDtype(int rank, int size, shoal_comm_t comm, std::string& text) {
  if (!comm->hosts || !comm->hosts->hierarchical() || comm->hosts->chunkBytes != kChunkBytes)
    return text = "the layout is not hierarchical, or SHOAL_HIER_CHUNK_BYTES did not reach it", SHOAL_ERR_INTERNAL;
  for (int d = 0; d < SHOAL_DTYPE_COUNT; ++d) {
    const shoal_dtype_t dtype = static_cast<shoal_dtype_t>(d);
    const size_t element = shoal_dtype_size(dtype);
    const size_t chunk = kChunkBytes / element;
    // Smaller than a chunk; half a chunk; three chunks and a partial fourth.
    for (size_t count : {size_t(5), chunk / 2 + 3, 3 * chunk + 7}) {
      const size_t chunkElements = shoal::hierarchicalChunkElements(count, element, *comm->hosts);
      if (count > chunk && !(chunkElements == chunk && count % chunkElements != 0))
        return text = std::string(shoal_dtype_name(dtype)) + ": " + std::to_string(count) + " elements in chunks of " +
                      std::to_string(chunkElements) + ", expected several of " + std::to_string(chunk) +
                      " and a partial one",
               SHOAL_ERR_INTERNAL;
      shoal_status_t status = SHOAL_OK;
      switch (dtype) {
        case SHOAL_F16: case SHOAL_BF16: status = checkHalves(comm, rank, size, dtype, count, text); break;
        case SHOAL_F32: status = checkFloats<float>(comm, rank, size, dtype, count, text); break;
        case SHOAL_F64: status = checkFloats<double>(comm, rank, size, dtype, count, text); break;
        case SHOAL_I8: status = checkInts<int8_t>(comm, rank, size, dtype, count, text); break;
        case SHOAL_U8: status = checkInts<uint8_t>(comm, rank, size, dtype, count, text); break;
        case SHOAL_I32: status = checkInts<int32_t>(comm, rank, size, dtype, count, text); break;
        case SHOAL_U32: status = checkInts<uint32_t>(comm, rank, size, dtype, count, text); break;
        case SHOAL_I64: status = checkInts<int64_t>(comm, rank, size, dtype, count, text); break;
        case SHOAL_U64: status = checkInts<uint64_t>(comm, rank, size, dtype, count, text); break;
        default: break;
      }
      if (status != SHOAL_OK) return status;
    }
  }
  // Whole chunks only, and many of them: 40 chunks of i64.
  const size_t count = 40 * (kChunkBytes / sizeof(int64_t));
  std::vector<int64_t> data(count);
  for (size_t i = 0; i < count; ++i) data[i] = smallInt(rank, i, true) * static_cast<int64_t>(i);
  if (shoal_status_t status = shoal_allreduce(comm, data.data(), data.data(), count, SHOAL_I64, SHOAL_SUM))
    return text = shoal_last_error(comm), status;
  for (size_t i = 0; i < count; ++i) {
    int64_t expected = 0;
    for (int r = 0; r < size; ++r) expected += smallInt(r, i, true) * static_cast<int64_t>(i);
    if (data[i] != expected) return text = where("i64", SHOAL_SUM, count, i), SHOAL_ERR_INTERNAL;
  }
  return SHOAL_OK;
}

class HierarchicalPipeline : public ::testing::TestWithParam<const char*> {};

TEST_P(HierarchicalPipeline, EveryDtypeAndOpAcrossChunks) {
  const std::string layout = GetParam();
  const int n = static_cast<int>(layout.size());
  auto outcomes = runJob(
      n, [&](int rank, shoal_comm_t comm, std::string& text) { return checkEveryDtype(rank, n, comm, text); },
      pipelinedHosts(layout));
  expectAllOk(outcomes, static_cast<size_t>(n));
}

// 2 x 2 with hosts contiguous and interleaved in rank order, 2 x 3 (host rings
// of several steps), 3 x 2 (a cross-host ring of several steps).
INSTANTIATE_TEST_SUITE_P(Layouts, HierarchicalPipeline, ::testing::Values("aabb", "abab", "aaabbb", "aabbcc"));

// A rank that dies while the others run the pipeline: every other rank fails
// its call with an error that says so, long before SHOAL_TIMEOUT_S.
TEST(HierarchicalPipelineFailure, ADeadRankFailsEveryOtherRank) {
  const int n = 4, victim = 3;
  auto outcomes = runJob(
      n,
      [&](int rank, shoal_comm_t comm, std::string& text) {
        std::vector<float> data(1 << 20, 1.0f);  // 4 MiB: 256 chunks of 16 KiB
        if (rank == victim) {
          std::thread([] {
            std::this_thread::sleep_for(std::chrono::milliseconds(30));
            _exit(3);
          }).detach();
        }
        const auto begin = shoal::test::Clock::now();
        for (int call = 0; call < 10000; ++call) {
          shoal_status_t status = shoal_allreduce(comm, data.data(), data.data(), data.size(), SHOAL_F32, SHOAL_MAX);
          if (status != SHOAL_OK) {
            text = shoal_last_error(comm);
            const double seconds = std::chrono::duration<double>(shoal::test::Clock::now() - begin).count();
            if (seconds > 10) return text = "failed only after " + std::to_string(seconds) + " s: " + text,
                                     SHOAL_ERR_INTERNAL;
            return status;
          }
        }
        return text = "10000 calls succeeded with a dead rank", SHOAL_ERR_INTERNAL;
      },
      pipelinedHosts("aabb"));
  ASSERT_EQ(outcomes.size(), static_cast<size_t>(n));
  for (int r = 0; r < n; ++r) {
    if (r == victim) continue;
    EXPECT_TRUE(outcomes[r].status == SHOAL_ERR_REMOTE || outcomes[r].status == SHOAL_ERR_TIMEOUT)
        << "rank " << r << ": status " << outcomes[r].status << ": " << outcomes[r].text;
    EXPECT_FALSE(outcomes[r].text.empty()) << "rank " << r;
  }
}

// ---- auto's choice for compressed calls -------------------------------------
// On a hierarchical layout auto compresses across hosts only where the
// compressor's payload grows with the tensor (topk), and keeps a low-rank one
// (SHOAL_CAP_MATRIX: powersgd) flat; SHOAL_ALGO=hierarchical runs it across
// hosts anyway.
shoal_status_t compressedPath(shoal_comm_t comm, const char* compressor, bool matrix, std::string& path,
                              std::string& text) {
  // 128 KiB: above SHOAL_TREE_MAX_BYTES, as auto needs for the hierarchical algorithm.
  std::vector<float> input(256 * 128), output(input.size());
  for (size_t i = 0; i < input.size(); ++i) input[i] = static_cast<float>((i * 7) % 13) - 6.0f;
  shoal_tensor_t in = matrix ? shoal::test::shaped(input.data(), {256, 128})
                             : shoal_tensor_1d(input.data(), input.size(), SHOAL_F32);
  shoal_tensor_t out = matrix ? shoal::test::shaped(output.data(), {256, 128})
                              : shoal_tensor_1d(output.data(), output.size(), SHOAL_F32);
  shoal_allreduce_options_t options = SHOAL_ALLREDUCE_OPTIONS_INIT;
  options.compressor = compressor;
  options.compress_min_bytes = 0;
  options.name = "choice";
  if (shoal_status_t status = shoal_allreduce_tensor(comm, &in, &out, SHOAL_SUM, &options))
    return text = std::string(compressor) + ": " + shoal_last_error(comm), status;
  if (comm->lastStats.compressor != compressor)
    return text = std::string(compressor) + " did not compress: " + comm->lastStats.compressor, SHOAL_ERR_INTERNAL;
  path = comm->lastStats.acrossHostsOnly ? "across hosts" : "flat";
  return SHOAL_OK;
}

void expectPaths(const char* algorithm, const char* powersgdPath, const char* topkPath) {
  auto outcomes = runJob(
      4,
      [&](int, shoal_comm_t comm, std::string& text) {
        std::string powersgd, topk;
        if (shoal_status_t status = compressedPath(comm, "powersgd", true, powersgd, text)) return status;
        if (shoal_status_t status = compressedPath(comm, "topk", false, topk, text)) return status;
        if (powersgd != powersgdPath || topk != topkPath)
          return text = std::string(algorithm) + ": powersgd ran " + powersgd + ", topk " + topk + "; expected " +
                        powersgdPath + ", " + topkPath,
                 SHOAL_ERR_INTERNAL;
        return SHOAL_OK;
      },
      pipelinedHosts("aabb", algorithm));
  expectAllOk(outcomes, 4);
}

TEST(HierarchicalAutoChoice, LowRankStaysFlatTopkCrossesHostsCompressed) {
  expectPaths("auto", "flat", "across hosts");
}

TEST(HierarchicalAutoChoice, AskedForItEveryCompressorCrossesHosts) {
  expectPaths("hierarchical", "across hosts", "across hosts");
}

// ---- the algorithm the debug log and the trace name -------------------------
// Each rank's debug lines go to a file of its own (its stderr); rank 0 writes
// the timeline. Blocking and async, dense and compressed: on a 2 x 2 layout
// they name hierarchical; asked for on 3 + 1, where the ring runs, the ring.
std::string readAll(const std::string& path) {
  std::ifstream in(path);
  std::stringstream text;
  text << in.rdbuf();
  return text.str();
}

shoal_status_t namedCalls(int rank, shoal_comm_t comm, const std::string& logPath, bool compressedToo,
                          std::string& text) {
  std::fflush(stderr);
  FILE* log = std::freopen(logPath.c_str(), "w", stderr);
  if (log == nullptr) return text = "cannot write " + logPath, SHOAL_ERR_SYSTEM;
  // 128 KiB each: above SHOAL_TREE_MAX_BYTES, which auto needs for the hierarchical algorithm.
  std::vector<float> dense(1 << 15, 1.0f), sparse(1 << 15);
  for (size_t i = 0; i < sparse.size(); ++i) sparse[i] = static_cast<float>(i % 5) + rank;
  if (shoal_status_t status = shoal_allreduce(comm, dense.data(), dense.data(), dense.size(), SHOAL_F32, SHOAL_SUM))
    return text = shoal_last_error(comm), status;
  if (shoal_status_t status = shoal_async_start(comm)) return text = shoal_last_error(comm), status;
  std::vector<shoal_request_t> requests(2, nullptr);
  shoal_tensor_t denseTensor = shoal_tensor_1d(dense.data(), dense.size(), SHOAL_F32);
  shoal_tensor_t sparseTensor = shoal_tensor_1d(sparse.data(), sparse.size(), SHOAL_F32);
  shoal_async_options_t options = SHOAL_ASYNC_OPTIONS_INIT;
  options.compressor = "topk";
  options.compress_min_bytes = 0;
  if (shoal_status_t status =
          shoal_iallreduce(comm, "dense", &denseTensor, &denseTensor, SHOAL_SUM, nullptr, &requests[0]))
    return text = shoal_last_error(comm), status;
  if (compressedToo)
    if (shoal_status_t status =
            shoal_iallreduce(comm, "sparse", &sparseTensor, &sparseTensor, SHOAL_SUM, &options, &requests[1]))
      return text = shoal_last_error(comm), status;
  if (!compressedToo) requests.pop_back();
  if (shoal_status_t status = shoal_wait_all(requests.data(), static_cast<int>(requests.size()), 30))
    return text = std::string("wait: ") + shoal_last_error(nullptr), status;
  for (shoal_request_t request : requests) shoal_request_free(request);
  // A blocking call while the runtime runs goes through the engine: its span is in the timeline.
  if (shoal_status_t status = shoal_allreduce(comm, dense.data(), dense.data(), dense.size(), SHOAL_F32, SHOAL_SUM))
    return text = shoal_last_error(comm), status;
  std::fflush(stderr);
  text = readAll(logPath);
  return SHOAL_OK;
}

size_t occurrences(const std::string& text, const std::string& what) {
  size_t count = 0;
  for (size_t at = text.find(what); at != std::string::npos; at = text.find(what, at + 1)) ++count;
  return count;
}

TEST(HierarchicalNames, LogAndTimelineNameTheAlgorithmThatRan) {
  const std::string dir = std::filesystem::temp_directory_path() / ("shoal_hier_names_" + std::to_string(getpid()));
  std::filesystem::create_directories(dir);
  const std::string timeline = dir + "/timeline.json";
  auto outcomes = runJob(
      4,
      [&](int rank, shoal_comm_t comm, std::string& text) {
        return namedCalls(rank, comm, dir + "/log" + std::to_string(rank), true, text);
      },
      pipelinedHosts("aabb", "auto", {{"SHOAL_LOG_LEVEL", "debug"}, {"SHOAL_TIMELINE", timeline}}));
  expectAllOk(outcomes, 4);
  for (int r = 0; r < 4; ++r) {
    const std::string& log = outcomes[r].text;
    EXPECT_EQ(occurrences(log, "shoal_allreduce done: 131072 bytes, algorithm hierarchical, uncompressed"), 2u)
        << "rank " << r << ":\n" << log;
    EXPECT_EQ(occurrences(log, "async allreduce 'dense' done: 131072 bytes, algorithm hierarchical, uncompressed"), 1u)
        << "rank " << r << ":\n" << log;
    EXPECT_EQ(occurrences(log, "async allreduce 'sparse' done: 131072 bytes, compressor topk, algorithm hierarchical "
                               "(compressed across hosts only)"),
              1u)
        << "rank " << r << ":\n" << log;
    EXPECT_EQ(occurrences(log, "algorithm ring"), 0u) << "rank " << r << ":\n" << log;
  }
  const std::string trace = readAll(timeline);
  // The async ALLREDUCE span and the blocking call's BLOCKING_CALL span.
  EXPECT_GE(occurrences(trace, "\"algorithm\": \"hierarchical\""), 2u) << trace.substr(0, 3000);
  EXPECT_EQ(occurrences(trace, "\"algorithm\": \"ring\""), 0u) << trace.substr(0, 3000);
  std::filesystem::remove_all(dir);
}

TEST(HierarchicalNames, AskedForOnAnIrregularLayoutTheRingIsNamed) {
  const std::string dir = std::filesystem::temp_directory_path() / ("shoal_hier_ring_" + std::to_string(getpid()));
  std::filesystem::create_directories(dir);
  auto outcomes = runJob(
      4,
      [&](int rank, shoal_comm_t comm, std::string& text) {
        return namedCalls(rank, comm, dir + "/log" + std::to_string(rank), false, text);
      },
      pipelinedHosts("aaab", "hierarchical", {{"SHOAL_LOG_LEVEL", "debug"}}));
  expectAllOk(outcomes, 4);
  for (int r = 0; r < 4; ++r) {
    const std::string& log = outcomes[r].text;
    EXPECT_EQ(occurrences(log, "shoal_allreduce done: 131072 bytes, algorithm ring, uncompressed"), 2u)
        << "rank " << r << ":\n" << log;
    EXPECT_EQ(occurrences(log, "async allreduce 'dense' done: 131072 bytes, algorithm ring, uncompressed"), 1u)
        << "rank " << r << ":\n" << log;
    EXPECT_EQ(occurrences(log, "algorithm hierarchical"), 0u) << "rank " << r << ":\n" << log;
  }
  std::filesystem::remove_all(dir);
}

}  // namespace
