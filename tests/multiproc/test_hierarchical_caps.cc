// SHOAL_CAP_MATRIX (include/shoal/compressor.h) through the hierarchical
// compressed allreduce: an external plugin with the bit is given whole-row
// shards of a matrix, one without it (every plugin built before the bit) keeps
// getting 1-D shards, as before. The plugin is tests/plugins/shape_probe.c,
// built as "shape_probe" (no bit) and "shape_probe_rows" (the bit); it
// records the shape of each tensor it is given as the tensor's state, and
// sums like an uncompressed allreduce. Forked ranks, hosts faked with
// SHOAL_HOST_ID, SHOAL_ALGO=hierarchical.
#include <cstdlib>
#include <cstring>
#include <string>
#include <vector>

#include <gtest/gtest.h>

#include "collectives/common/ring.h"
#include "multiproc/hierarchical_util.h"

#ifndef SHOAL_TEST_PROBE_DIR
#error "tests/CMakeLists.txt defines SHOAL_TEST_PROBE_DIR for this test"
#endif

namespace {

using namespace shoal::test;

// The shape the probe recorded under `key`, or {} with text.
std::vector<int64_t> recordedShape(shoal_comm_t comm, const char* probe, const std::string& key, std::string& text) {
  std::vector<uint8_t> bytes;
  if (!savedState(comm, probe, nullptr, key, bytes, text)) return {};
  std::vector<int64_t> words(bytes.size() / sizeof(int64_t));
  std::memcpy(words.data(), bytes.data(), words.size() * sizeof(int64_t));
  if (words.empty() || words[0] + 1 != static_cast<int64_t>(words.size()))
    return text = key + ": a malformed record", std::vector<int64_t>{};
  return std::vector<int64_t>(words.begin() + 1, words.end());
}

std::string shapeText(const std::vector<int64_t>& shape) {
  std::string out = "[";
  for (size_t d = 0; d < shape.size(); ++d) out += (d ? " x " : "") + std::to_string(shape[d]);
  return out + "]";
}

// Runs one tensor of `shape` through `probe` (blocking, named), checks the
// exact sum (small integers: any order is exact) and that the probe saw
// `expected` under the shard's name (acrossHosts) or the tensor's own.
shoal_status_t runShape(int rank, int size, shoal_comm_t comm, const char* probe, const std::string& name,
                        std::vector<int64_t> shape, std::vector<int64_t> expected, bool acrossHosts,
                        std::string& text) {
  size_t count = 1;
  for (int64_t extent : shape) count *= static_cast<size_t>(extent);
  std::vector<float> input(count), output(count, -1);
  for (size_t i = 0; i < count; ++i) input[i] = static_cast<float>((i * 7 + rank * 3) % 11);
  shoal_allreduce_options_t o = SHOAL_ALLREDUCE_OPTIONS_INIT;
  o.compressor = probe;
  o.name = name.c_str();
  o.compress_min_bytes = 0;
  shoal_tensor_t in = shaped(input.data(), shape), out = shaped(output.data(), shape);
  if (shoal_allreduce_tensor(comm, &in, &out, SHOAL_SUM, &o) != SHOAL_OK)
    return text = std::string(probe) + " " + name + ": " + shoal_last_error(comm), SHOAL_ERR_INTERNAL;
  for (size_t i = 0; i < count; ++i) {
    float exact = 0;
    for (int r = 0; r < size; ++r) exact += static_cast<float>((i * 7 + r * 3) % 11);
    if (output[i] != exact)
      return text = std::string(probe) + " " + name + " element " + std::to_string(i) + ": " +
                    std::to_string(output[i]) + " vs " + std::to_string(exact),
             SHOAL_ERR_INTERNAL;
  }
  if (comm->lastStats.acrossHostsOnly != acrossHosts)
    return text = std::string(probe) + " " + name + " ran " + (acrossHosts ? "flat" : "across hosts"),
           SHOAL_ERR_INTERNAL;
  const std::string key = acrossHosts ? shardKeyOf(comm, name) : name;
  std::vector<int64_t> seen = recordedShape(comm, probe, key, text);
  if (seen != expected)
    return text = std::string(probe) + " was given " + shapeText(seen) + " under '" + key + "', expected " +
                  shapeText(expected) + (text.empty() ? "" : " (" + text + ")"),
           SHOAL_ERR_INTERNAL;
  return SHOAL_OK;
}

shoal_status_t checkShapes(int rank, int size, shoal_comm_t comm, std::string& text) {
  const int local = static_cast<int>(comm->hosts->local.size()), mine = comm->hosts->localRank;
  auto rowsOf = [&](size_t rows) { return static_cast<int64_t>(shoal::ring::blockOf(rows, local, mine).count); };
  auto elementsOf = [&](size_t count) { return static_cast<int64_t>(shoal::ring::blockOf(count, local, mine).count); };
  struct Case {
    const char* probe;
    std::string name;
    std::vector<int64_t> shape, expected;
    bool acrossHosts;
  };
  const std::vector<Case> cases = {
      // With the bit: whole rows of a matrix, the other dimensions kept.
      {"shape_probe_rows", "m", {7, 5}, {rowsOf(7), 5}, true},
      {"shape_probe_rows", "t", {5, 2, 3}, {rowsOf(5), 2, 3}, true},
      {"shape_probe_rows", "v", {11}, {elementsOf(11)}, true},  // 1-D: 1-D shards
      // Fewer rows than a host has ranks: flat, the whole matrix.
      {"shape_probe_rows", "r", {1, 64}, {1, 64}, false},
      // Without the bit (a plugin from before it): 1-D shards of any shape, as always.
      {"shape_probe", "m", {7, 5}, {elementsOf(35)}, true},
      {"shape_probe", "t", {5, 2, 3}, {elementsOf(30)}, true},
      {"shape_probe", "r", {1, 64}, {elementsOf(64)}, true},
  };
  for (const Case& c : cases)
    if (shoal_status_t status = runShape(rank, size, comm, c.probe, c.name, c.shape, c.expected, c.acrossHosts, text))
      return status;

  // A fused group of the async runtime: every matrix of it in row blocks of its own.
  if (shoal_async_start(comm) != SHOAL_OK) return text = shoal_last_error(comm), SHOAL_ERR_INTERNAL;
  std::vector<float> a(9 * 4, 1.0f), b(6 * 3 * 2, 2.0f), c(13, 3.0f);
  shoal_tensor_t tensors[3] = {shaped(a.data(), {9, 4}), shaped(b.data(), {6, 3, 2}), shaped(c.data(), {13})};
  const char* names[3] = {"fa", "fb", "fc"};
  for (const char* probe : {"shape_probe_rows", "shape_probe"}) {
    std::vector<shoal_request_t> requests;
    shoal_async_options_t o = SHOAL_ASYNC_OPTIONS_INIT;
    o.compressor = probe;
    o.compress_min_bytes = 0;
    for (int t = 0; t < 3; ++t) {
      shoal_request_t request = nullptr;
      if (shoal_iallreduce(comm, names[t], &tensors[t], &tensors[t], SHOAL_SUM, &o, &request) != SHOAL_OK)
        return text = shoal_last_error(comm), SHOAL_ERR_INTERNAL;
      requests.push_back(request);
    }
    shoal_status_t status = shoal_wait_all(requests.data(), 3, 20);
    for (shoal_request_t request : requests) shoal_request_free(request);
    if (status != SHOAL_OK) return text = shoal_last_error(nullptr), status;
    const bool rows = std::strcmp(probe, "shape_probe_rows") == 0;
    const std::vector<std::vector<int64_t>> expected =
        rows ? std::vector<std::vector<int64_t>>{{rowsOf(9), 4}, {rowsOf(6), 3, 2}, {elementsOf(13)}}
             : std::vector<std::vector<int64_t>>{{elementsOf(36)}, {elementsOf(36)}, {elementsOf(13)}};
    for (int t = 0; t < 3; ++t) {
      std::vector<int64_t> seen = recordedShape(comm, probe, shardKeyOf(comm, names[t]), text);
      if (seen != expected[t])
        return text = std::string("fused ") + probe + " was given " + shapeText(seen) + " for " + names[t] +
                      ", expected " + shapeText(expected[t]) + (text.empty() ? "" : " (" + text + ")"),
               SHOAL_ERR_INTERNAL;
    }
  }
  // In place, twice (each probe sums like an allreduce): 1, then n, then n x n.
  for (size_t i = 0; i < a.size(); ++i)
    if (a[i] != static_cast<float>(size) * static_cast<float>(size))
      return text = "fused sums wrong: fa[" + std::to_string(i) + "] = " + std::to_string(a[i]), SHOAL_ERR_INTERNAL;
  return SHOAL_OK;
}

class HierarchicalMatrixCap : public ::testing::TestWithParam<const char*> {};

TEST_P(HierarchicalMatrixCap, RowShardsWithTheBitFlatShardsWithout) {
  const std::string layout = GetParam();
  const int n = static_cast<int>(layout.size());
  auto outcomes = runJob(
      n, [&](int rank, shoal_comm_t comm, std::string& text) { return checkShapes(rank, n, comm, text); },
      fakeHosts(layout, {{"SHOAL_PLUGIN_PATH", SHOAL_TEST_PROBE_DIR}, {"SHOAL_CYCLE_TIME_MS", "2"}}));
  expectAllOk(outcomes, n);
}

INSTANTIATE_TEST_SUITE_P(Layouts, HierarchicalMatrixCap, ::testing::Values("aabb", "aaabbb"));

// The registry takes both builds; only the one built with the bit has it.
TEST(HierarchicalMatrixCap, BothBuildsRegister) {
  setenv("SHOAL_PLUGIN_PATH", SHOAL_TEST_PROBE_DIR, 1);
  const shoal_compressor_t* rows = nullptr;
  const shoal_compressor_t* flat = nullptr;
  ASSERT_EQ(shoal_compressor_lookup("shape_probe_rows", &rows), SHOAL_OK) << shoal_last_error(nullptr);
  ASSERT_EQ(shoal_compressor_lookup("shape_probe", &flat), SHOAL_OK) << shoal_last_error(nullptr);
  EXPECT_NE(rows->caps & SHOAL_CAP_MATRIX, 0u);
  EXPECT_EQ(flat->caps & SHOAL_CAP_MATRIX, 0u);
  EXPECT_EQ(flat->abi_version, 1u);
  const shoal_compressor_t* powersgd = nullptr;
  ASSERT_EQ(shoal_compressor_lookup("powersgd", &powersgd), SHOAL_OK);
  EXPECT_NE(powersgd->caps & SHOAL_CAP_MATRIX, 0u) << "powersgd views tensors as matrices";
  for (const char* name : {"fp16", "bf16", "topk", "sketch", "qint8"}) {
    const shoal_compressor_t* other = nullptr;
    if (shoal_compressor_lookup(name, &other) == SHOAL_OK) EXPECT_EQ(other->caps & SHOAL_CAP_MATRIX, 0u) << name;
  }
  unsetenv("SHOAL_PLUGIN_PATH");
}

}  // namespace
