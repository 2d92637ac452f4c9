// The allreduce choice (collectives/allreduce/algos.cc): SHOAL_ALGO resolved
// once into an AllreduceChoice, then picked by size per call. The rules are
// the ones selectAllreduce always had; these tests pin them down.
#include <gtest/gtest.h>

#include <string>
#include <utility>
#include <vector>

#include "collectives/collectives.h"
#include "core/error.h"
#include "shoal/compressor.h"

namespace {

using shoal::AllreduceChoice;

std::string pick(const std::string& name, size_t bytes, int worldSize, size_t treeMax, size_t sharedMax) {
  return AllreduceChoice::of(name).at(bytes, worldSize, treeMax, sharedMax).name;
}

TEST(AllreduceChoice, AutoPicksBySizeAndRanks) {
  for (const char* name : {"", "auto", "bruck"}) {  // bruck names an alltoall algorithm: allreduce chooses as auto
    EXPECT_EQ(AllreduceChoice::of(name).fixed, nullptr) << name;
    EXPECT_FALSE(AllreduceChoice::of(name).aggregate) << name;
    EXPECT_EQ(pick(name, 64, 2, 4096, 1024), "shm") << name;          // one host, within the slot
    EXPECT_EQ(pick(name, 1024, 2, 4096, 1024), "shm") << name;        // the slot's size itself
    EXPECT_EQ(pick(name, 1025, 2, 4096, 1024), "doubling") << name;   // above the slot, up to treeMax
    EXPECT_EQ(pick(name, 4096, 4, 4096, 0), "doubling") << name;      // no segment
    EXPECT_EQ(pick(name, 4097, 4, 4096, 0), "ring") << name;          // above treeMax
    EXPECT_EQ(pick(name, 1 << 20, 1, 4096, 1 << 21), "doubling") << name;  // one rank: never shm, never the ring
  }
}

TEST(AllreduceChoice, ANamedAlgorithmIsFixedWhateverTheSize) {
  for (const char* name : {"ring", "tree", "doubling", "hierarchical", "shm"}) {
    const AllreduceChoice choice = AllreduceChoice::of(name);
    ASSERT_NE(choice.fixed, nullptr) << name;
    EXPECT_EQ(std::string(choice.fixed->name), name);
    EXPECT_FALSE(choice.aggregate);
    for (size_t bytes : {size_t(0), size_t(8), size_t(1) << 30}) EXPECT_EQ(pick(name, bytes, 4, 4096, 1024), name);
    // selectAllreduce is the same rule for a name not resolved already.
    EXPECT_EQ(&shoal::selectAllreduce(name, 8, 4, 4096, 1024), choice.fixed);
  }
  EXPECT_EQ(std::string(shoal::hierarchicalAllreduce().name), "hierarchical");
}

TEST(AllreduceChoice, AggregateFallsBackToTheRing) {
  const AllreduceChoice choice = AllreduceChoice::of("aggregate");
  EXPECT_TRUE(choice.aggregate);
  ASSERT_NE(choice.fixed, nullptr);
  EXPECT_EQ(std::string(choice.fixed->name), "ring");
}

TEST(AllreduceChoice, AnUnknownNameIsNotFoundAndListsTheValidOnes) {
  try {
    AllreduceChoice::of("rnig");
    FAIL() << "no error for an unknown name";
  } catch (const shoal::Error& error) {
    EXPECT_EQ(error.status(), SHOAL_ERR_NOT_FOUND);
    EXPECT_NE(std::string(error.what()).find("unknown allreduce algorithm 'rnig'"), std::string::npos) << error.what();
    for (const shoal::AllreduceAlgorithm& algorithm : shoal::allreduceAlgorithms())
      EXPECT_NE(std::string(error.what()).find(algorithm.name), std::string::npos) << error.what();
  }
}

}  // namespace

// auto's rule for compressed calls across hosts (algos.cc): from what the
// compressor does, its capability bits, never its name. A low-rank compressor
// (SHOAL_CAP_MATRIX) stays flat; one whose payload grows with the tensor
// compresses only the cross-host leg. The built-ins fall on the measured side:
// powersgd flat (0.83x hierarchical), topk across hosts (1.13x).
TEST(AllreduceChoice, CompressedAcrossHostsFromTheCompressorsBits) {
  EXPECT_FALSE(shoal::hierarchicalSuitsCompressor(SHOAL_CAP_HOST | SHOAL_CAP_STATEFUL | SHOAL_CAP_MATRIX));
  EXPECT_FALSE(shoal::hierarchicalSuitsCompressor(SHOAL_CAP_MATRIX));
  EXPECT_TRUE(shoal::hierarchicalSuitsCompressor(SHOAL_CAP_HOST | SHOAL_CAP_STATEFUL));
  EXPECT_TRUE(shoal::hierarchicalSuitsCompressor(SHOAL_CAP_HOST | SHOAL_CAP_LOSSLESS | SHOAL_CAP_HOMOMORPHIC));
  EXPECT_TRUE(shoal::hierarchicalSuitsCompressor(0));
  const std::vector<std::pair<const char*, bool>> builtins = {
      {"powersgd", false}, {"topk", true}, {"fp16", true}, {"bf16", true}, {"sketch", true}};
  for (const auto& [name, acrossHosts] : builtins) {
    const shoal_compressor_t* table = nullptr;
    ASSERT_EQ(shoal_compressor_lookup(name, &table), SHOAL_OK) << name;
    EXPECT_EQ(shoal::hierarchicalSuitsCompressor(table->caps), acrossHosts) << name;
  }
}
