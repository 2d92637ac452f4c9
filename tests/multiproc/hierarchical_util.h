// Helpers of the hierarchical compressed allreduce tests that fork ranks with
// faked hosts (test_hierarchical_fused.cc, test_hierarchical_caps.cc): the
// ranks' environment, same-bits checks, saved compressor state, shard names.
#pragma once

#include <cstdint>
#include <functional>
#include <map>
#include <string>
#include <vector>

#include <gtest/gtest.h>

#include "collectives/common/host_layout.h"
#include "comm/communicator.h"
#include "multiproc/split_job.h"
#include "shoal/compressor.h"

namespace shoal::test {

// Every rank's host id from a layout string ("aabb": ranks 0, 1 on host a),
// with the hierarchical algorithm forced (the tensors here are small), plus
// `extra` variables for every rank.
inline std::function<std::map<std::string, std::string>(int)> fakeHosts(
    const std::string& layout, const std::map<std::string, std::string>& extra = {}) {
  return [=](int rank) {
    std::map<std::string, std::string> environment = extra;
    environment["SHOAL_HOST_ID"] = std::string("host-") + layout[rank];
    environment["SHOAL_ALGO"] = "hierarchical";
    return environment;
  };
}

inline void expectAllOk(const std::vector<Outcome>& outcomes, size_t n) {
  ASSERT_EQ(outcomes.size(), n);
  for (size_t r = 0; r < n; ++r) EXPECT_EQ(outcomes[r].status, SHOAL_OK) << "rank " << r << ": " << outcomes[r].text;
}

// SHOAL_OK when every rank holds the same bytes: a max-allreduce of {hash, ~hash}.
inline shoal_status_t sameOnEveryRank(shoal_comm_t comm, const void* data, size_t bytes, const std::string& what,
                                      std::string& text) {
  uint64_t hash = 1469598103934665603ull;
  for (size_t i = 0; i < bytes; ++i) hash = (hash ^ static_cast<const uint8_t*>(data)[i]) * 1099511628211ull;
  uint64_t words[2] = {hash, ~hash};
  if (shoal_status_t status = shoal_allreduce(comm, words, words, 2, SHOAL_U64, SHOAL_MAX))
    return text = shoal_last_error(comm), status;
  if (words[0] != ~words[1]) return text = what + ": the ranks' results differ", SHOAL_ERR_INTERNAL;
  return SHOAL_OK;
}

// The state a compressor keeps under `key`: its bytes, or false with text.
inline bool savedState(shoal_comm_t comm, const char* compressor, const char* options, const std::string& key,
                       std::vector<uint8_t>& bytes, std::string& text) {
  size_t size = 0;
  if (shoal_compressor_state_save(comm, compressor, options, key.c_str(), nullptr, &size) != SHOAL_OK)
    return text = "no state under '" + key + "': " + shoal_last_error(comm), false;
  bytes.resize(size);
  if (shoal_compressor_state_save(comm, compressor, options, key.c_str(), bytes.data(), &size) != SHOAL_OK)
    return text = "saving '" + key + "': " + shoal_last_error(comm), false;
  return true;
}

inline bool hasState(shoal_comm_t comm, const char* compressor, const char* options, const std::string& key) {
  size_t size = 0;
  return shoal_compressor_state_save(comm, compressor, options, key.c_str(), nullptr, &size) == SHOAL_OK;
}

// The name the driver keeps this rank's shard of tensor `name` under (docs/groups.md).
inline std::string shardKeyOf(shoal_comm_t comm, const std::string& name) {
  return name + "#host-shard" + std::to_string(comm->hosts->localRank) + "/" +
         std::to_string(comm->hosts->local.size());
}

inline shoal_tensor_t shaped(void* data, std::vector<int64_t> shape, shoal_dtype_t dtype = SHOAL_F32) {
  shoal_tensor_t tensor = shoal_tensor_1d(data, 0, dtype);
  tensor.ndim = static_cast<int>(shape.size());
  for (size_t d = 0; d < shape.size(); ++d) tensor.shape[d] = shape[d];
  return tensor;
}

}  // namespace shoal::test
