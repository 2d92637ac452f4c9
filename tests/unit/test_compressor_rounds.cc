// CompressorRounds' placed tensors (tests/harness/compressor_rounds.h,
// placeTensors), the path the CUDA compressor tests drive with device memory,
// checked here without a GPU: the same operations over tensors in memory the
// test provides (host blocks it allocates, copies it counts; the tensors say
// host, so the compressors take their CPU paths) must give the same outputs,
// rounds, gathered payloads, payloads seen by an observer and saved states as
// over the harness's own host vectors, bit for bit, and release every block.
#include <gtest/gtest.h>

#include <cstdint>
#include <cstring>
#include <memory>
#include <set>
#include <string>
#include <vector>

#include "harness/compressor_rounds.h"
#include "shoal/compressor.h"
#include "shoal/shoal.h"

namespace {

using shoal::test::CompressorRounds;

// Host blocks standing in for device memory: every block is the test's, and
// every copy into or out of one goes through copy().
struct CountedMemory {
  std::set<void*> blocks;
  int copies = 0;

  shoal::test::TensorMemory memory() {
    shoal::test::TensorMemory m;
    m.kind = SHOAL_MEMORY_HOST;
    m.allocate = [this](size_t bytes) {
      void* data = ::operator new(bytes);
      std::memset(data, 0x3c, bytes);  // not what the host vectors start with
      blocks.insert(data);
      return data;
    };
    m.release = [this](void* data) {
      EXPECT_EQ(blocks.erase(data), 1u) << "released a block that is not the test's";
      ::operator delete(data);
    };
    m.copy = [this](void* to, const void* from, size_t bytes) {
      ++copies;
      std::memcpy(to, from, bytes);
    };
    return m;
  }
};

struct Record {
  std::vector<std::vector<uint8_t>> outputs;   // [step * ranks * tensors + ...]
  std::vector<std::vector<uint8_t>> seen;      // each rank's payloads as the observer read them
  std::vector<std::vector<uint8_t>> delivered;  // what each collective delivered
  std::vector<std::vector<uint8_t>> states;    // saved after the last step
  std::vector<int> rounds;
};

struct Case {
  const char* compressor;
  const char* options;
  std::vector<CompressorRounds::TensorSpec> specs;
};

// Three steps of `c` on 3 ranks; over `memory` when given.
Record runCase(const Case& c, CountedMemory* memory) {
  const int n = 3;
  const shoal_compressor_t* table = nullptr;
  EXPECT_EQ(shoal_compressor_lookup(c.compressor, &table), SHOAL_OK) << shoal_last_error(nullptr);
  Record record;
  if (table == nullptr) return record;
  CompressorRounds rounds(table, n);
  EXPECT_EQ(rounds.create(shoal::test::optionPairs(c.options)), SHOAL_OK) << rounds.error(rounds.failedRank());
  if (memory) rounds.placeTensors(memory->memory());
  rounds.observe([&](int, const shoal_round_t& round) {
    for (int p = 0; p < round.num_payloads && !round.done; ++p)
      record.seen.push_back(rounds.payloadBytes(round.payloads[p]));
  });
  for (int step = 0; step < 3; ++step) {
    auto fill = [&](int r, int t, void* data) {
      const CompressorRounds::TensorSpec& spec = c.specs[t];
      size_t count = 1;
      for (int64_t d : spec.shape) count *= size_t(d);
      for (size_t i = 0; i < count; ++i) {
        // Spread values with a few large ones, different per rank, tensor and step.
        const uint32_t h = uint32_t(i * 2654435761u + r * 40503u + t * 977u + step * 131u);
        const float x = float(int(h % 2001) - 1000) / 250.0f * ((h >> 20) % 53 == 0 ? 40.0f : 1.0f);
        if (spec.dtype == SHOAL_F64) static_cast<double*>(data)[i] = x;
        else static_cast<float*>(data)[i] = x;
      }
    };
    auto keep = [&](shoal::test::Delivered& d) { record.delivered.push_back(d.bytes); };
    EXPECT_EQ(rounds.allreduce(c.specs, SHOAL_SUM, uint64_t(step), fill, keep), SHOAL_OK)
        << c.compressor << ": " << rounds.error(rounds.failedRank());
    record.rounds.push_back(rounds.rounds());
    for (int r = 0; r < n; ++r)
      for (size_t t = 0; t < c.specs.size(); ++t) {
        size_t bytes = shoal_dtype_size(c.specs[t].dtype);
        for (int64_t d : c.specs[t].shape) bytes *= size_t(d);
        const auto* out = static_cast<const uint8_t*>(rounds.output(r, int(t)));
        record.outputs.emplace_back(out, out + bytes);
      }
  }
  for (int r = 0; r < n; ++r)
    for (size_t t = 0; t < c.specs.size(); ++t) {
      std::vector<uint8_t> blob;
      if (table->save_tensor_state && rounds.state(r, int(t))) {
        size_t bytes = 0;
        EXPECT_EQ(table->save_tensor_state(rounds.instance(r), rounds.state(r, int(t)), nullptr, &bytes), SHOAL_OK);
        blob.resize(bytes);
        EXPECT_EQ(table->save_tensor_state(rounds.instance(r), rounds.state(r, int(t)), blob.data(), &bytes),
                  SHOAL_OK);
      }
      record.states.push_back(blob);
    }
  return record;
}

TEST(CompressorRounds, PlacedTensorsGiveTheHostVectorsResults) {
  const std::vector<Case> cases = {
      {"fp16", "", {{SHOAL_F32, {1000}, "a"}, {SHOAL_F32, {0}, "empty"}}},
      {"topk", "k=17,ef=1", {{SHOAL_F32, {1000}, "a"}, {SHOAL_F64, {77}, "b"}, {SHOAL_F32, {0}, "empty"}}},
      {"sketch", "values=auto", {{SHOAL_F32, {20000}, "a"}}},
      {"powersgd", "rank=4,seed=9,ef=1", {{SHOAL_F32, {64, 48}, "w"}, {SHOAL_F32, {50}, "bias"}}},
  };
  for (const Case& c : cases) {
    SCOPED_TRACE(c.compressor);
    const Record host = runCase(c, nullptr);
    CountedMemory memory;
    const Record placed = runCase(c, &memory);
    EXPECT_TRUE(memory.blocks.empty()) << memory.blocks.size() << " blocks were never released";
    EXPECT_GT(memory.copies, 0);
    EXPECT_EQ(placed.rounds, host.rounds);
    EXPECT_EQ(placed.delivered, host.delivered);
    EXPECT_EQ(placed.seen, host.seen);
    EXPECT_EQ(placed.states, host.states);
    ASSERT_EQ(placed.outputs.size(), host.outputs.size());
    for (size_t i = 0; i < host.outputs.size(); ++i) EXPECT_EQ(placed.outputs[i], host.outputs[i]) << "output " << i;
  }
}

// The fp16 table with a start() that records the tensors it is handed.
const shoal_compressor_t* g_fp16 = nullptr;
std::vector<shoal_tensor_t> g_seen;

shoal_status_t recordingStart(void* instance, shoal_compress_op_t* op, void** opState) {
  g_seen.push_back(op->tensors[0].input);
  g_seen.push_back(op->tensors[0].output);
  return g_fp16->start(instance, op, opState);
}

// The tensors the compressor sees are the placed ones, with the memory's
// kind, device and stream: what the CUDA tests rely on.
TEST(CompressorRounds, TheCompressorSeesThePlacedTensors) {
  ASSERT_EQ(shoal_compressor_lookup("fp16", &g_fp16), SHOAL_OK);
  shoal_compressor_t recording = *g_fp16;
  recording.start = recordingStart;
  g_seen.clear();
  CountedMemory memory;
  int stream = 0;
  {
    shoal::test::TensorMemory placed = memory.memory();
    placed.device = 3;
    placed.stream = &stream;
    CompressorRounds rounds(&recording, 2);
    ASSERT_EQ(rounds.create({}), SHOAL_OK);
    rounds.placeTensors(placed);
    ASSERT_EQ(rounds.allreduce({{SHOAL_F32, {8}, "x"}}, SHOAL_SUM, 0, nullptr), SHOAL_OK)
        << rounds.error(rounds.failedRank());
    ASSERT_EQ(g_seen.size(), 4u);
    for (const shoal_tensor_t& tensor : g_seen) {
      EXPECT_EQ(memory.blocks.count(tensor.data), 1u) << "a tensor outside the placed memory";
      EXPECT_EQ(tensor.memory, SHOAL_MEMORY_HOST);  // the memory's kind (host, so fp16's CPU path runs)
      EXPECT_EQ(tensor.device, 3);
      EXPECT_EQ(tensor.stream, &stream);
    }
    EXPECT_EQ(memory.blocks.size(), 4u) << "an input and an output block per rank";
  }
  EXPECT_TRUE(memory.blocks.empty());
}

}  // namespace
