// The compressed-collective driver: runs a compressor's rounds through the
// collectives layer, keeps compressor instances and per-tensor state, and
// decides per call whether to compress at all.
#pragma once

#include "core/tensor.h"

#include <cstdint>
#include <functional>
#include <map>
#include <memory>
#include <set>
#include <string>
#include <vector>

#include "core/error.h"
#include "gpu/route.h"
#include "shoal/compressor.h"

struct shoal_comm;

namespace shoal::plugin {

// One compressor with one option set, and the state of every tensor it has seen.
class CompressorInstance {
 public:
  CompressorInstance(const shoal_compressor_t* table, const std::string& options);
  ~CompressorInstance();
  CompressorInstance(const CompressorInstance&) = delete;
  CompressorInstance& operator=(const CompressorInstance&) = delete;

  const shoal_compressor_t& table() const { return *table_; }
  void* handle() const { return instance_; }
  const std::string& options() const { return options_; }
  // The state slot of a named tensor (created empty on first use).
  void** stateOf(const std::string& name) { return &states_[name]; }
  void* findState(const std::string& name) const;

 private:
  const shoal_compressor_t* table_;
  void* instance_ = nullptr;
  std::string options_;
  std::map<std::string, void*> states_;
};

// The environment's part of a compressor's resolution (resolveCompressor),
// read once per communicator at init (CompressorCache::defaults): a small allreduce costs little more
// than the getenv calls and config-table scans of reading it per call. A
// process that changes SHOAL_COMPRESSOR* between calls creates a new
// communicator (or passes the compressor per call).
struct CompressorDefaults {
  std::string environment;  // SHOAL_COMPRESSOR as set, "" when unset: it owns SHOAL_COMPRESSOR_OPTS
  std::string name;         // SHOAL_COMPRESSOR, else its default, else "none"
  std::string options;      // SHOAL_COMPRESSOR_OPTS
  long long minBytes = 0;   // SHOAL_COMPRESS_MIN_BYTES
  // resolveCompressor gives "none" without options to a call that names
  // neither a compressor nor options: such calls skip resolving (a small
  // allreduce's cost; allreduceTensor). fromEnvironment derives it from the
  // fields above (whoever changes them must derive it again).
  bool plain = true;
  static CompressorDefaults fromEnvironment();
};

// Compressor instances of one communicator, keyed by "name|options".
class CompressorCache {
 public:
  CompressorInstance& get(const std::string& name, const std::string& options);
  CompressorInstance* find(const std::string& name, const std::string& options);
  uint64_t nextStep() { return steps_++; }
  // The key of an unnamed tensor (issue 13.2): "unnamed/<dtype>/<shape>#k",
  // where k numbers the distinct output buffers of that dtype and shape in
  // the order this communicator first saw them. Calls are collective and
  // ordered, so every rank derives the same key for the same buffer, step
  // after step: error feedback and warm starts work on persistent buffers.
  std::string unnamedKey(const shoal_tensor_t& output);
  // True the first time a key is given (for once-per-tensor log lines).
  bool firstTime(const std::string& key) { return noticed_.insert(key).second; }
  // SHOAL_COMPRESSOR* as they were when the communicator was made.
  CompressorDefaults defaults = CompressorDefaults::fromEnvironment();
  // A fused group's tensors packed shard by shard for the hierarchical
  // compressed allreduce (driver.cc), reused from group to group.
  std::vector<uint8_t> packedShards;

 private:
  std::map<std::string, std::unique_ptr<CompressorInstance>> instances_;
  uint64_t steps_ = 0;
  std::map<std::string, std::map<const void*, int>> unnamedBuffers_;  // dtype/shape -> buffer -> k
  std::set<std::string> noticed_;
};

// Elements of a tensor: the product of its shape (1 for a scalar).
using ::shoal::elementsCount;  // lib/core/tensor.h

// Sees each phase of a compressed operation (for the runtime's timeline):
// "ENCODE"/"DECODE" for round() calls (round > 0 also decodes the previous
// round's results), "ALLREDUCE"/"ALLGATHERV" for a payload's collective.
struct RoundEvent {
  const char* phase;
  int round;
  uint64_t bytes;  // payload bytes of a collective; 0 for round() calls
  Clock::time_point begin, end;
};
using RoundObserver = std::function<void(const RoundEvent&)>;

}  // namespace shoal::plugin

namespace shoal::plugin {
// The compressor a call runs, its options and minimum size, resolved in one
// place for the blocking and the async calls: the call's own name, else
// SHOAL_COMPRESSOR, else "none". SHOAL_COMPRESSOR_OPTS belongs to the
// environment's compressor only: a call that names another compressor (say
// "none" or "fp16" while topk's options are exported) runs it with its own
// options or none. A call's minimum < 0 means SHOAL_COMPRESS_MIN_BYTES.
struct CompressorChoice {
  std::string name;
  std::string options;
  long long minBytes = 0;
};
CompressorChoice resolveCompressor(const CompressorDefaults& defaults, const char* callCompressor,
                                   const char* callOptions, long long callMinBytes);
// The same against the environment as it is now (tests, and callers without a communicator).
CompressorChoice resolveCompressor(const char* callCompressor, const char* callOptions, long long callMinBytes);
}  // namespace shoal::plugin

namespace shoal {
// Allreduce of one tensor: compressed when a compressor is selected and the
// tensor qualifies (op sum/avg, a dtype the compressor takes, at least the
// minimum size), else the plain allreduce. `sequence` is the call's number.
// `route` is routeOf(input, output), which the caller has (gpu/route.h); a
// compressor that cannot run on CUDA tensors adds its refusal to it.
void allreduceTensor(shoal_comm& comm, uint64_t sequence, const shoal_tensor_t& input, const shoal_tensor_t& output,
                     shoal_op_t op, const shoal_allreduce_options_t* options, MemoryRoute& route);
// The same for host tensors (the route of every host call: nothing to refuse,
// no route to build).
void allreduceHostTensor(shoal_comm& comm, uint64_t sequence, const shoal_tensor_t& input,
                         const shoal_tensor_t& output, shoal_op_t op, const shoal_allreduce_options_t* options);

// Hook for the runtime's tensor fusion (lib/runtime/fusion.cc): ONE compressed
// operation (one start, one series of round() calls) over every tensor of a
// fused group. The caller has decided that the group compresses; tensors carry
// input, output and name (named: state slots are filled in here). Where a
// blocking allreduce of the group's size would run hierarchically, the group
// does too, compressing only across hosts with state per (tensor, shard), as
// the blocking call does (docs/groups.md). `observer` may be null.
void allreduceCompressedGroup(shoal_comm& comm, uint64_t sequence, const std::string& compressor,
                              const std::string& options, std::vector<shoal_compress_tensor_t>& tensors,
                              shoal_op_t op, const plugin::RoundObserver* observer);
}  // namespace shoal
