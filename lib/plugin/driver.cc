#include "plugin/driver.h"

#include <algorithm>
#include <cstring>
#include <string_view>

#include "aggregate/client.h"
#include "collectives/allreduce/hierarchical.h"
#include "gpu/route.h"
#include "comm/call.h"
#include "comm/host_ops.h"
#include "comm/hosts.h"
#include "core/config.h"
#include "core/log.h"
#include "plugin/registry.h"

namespace shoal::plugin {
namespace {

constexpr int kMaxRounds = 64;  // a compressor asking for more is looping

void logFromPlugin(int level, const char* message) {
  log::at(static_cast<log::Level>(std::clamp(level, 0, 3)), "compressor: {}", message ? message : "");
}

}  // namespace

CompressorDefaults CompressorDefaults::fromEnvironment() {
  CompressorDefaults d;
  d.environment = config::getRaw("SHOAL_COMPRESSOR").value_or("");
  d.name = d.environment.empty() ? config::getString("SHOAL_COMPRESSOR") : d.environment;
  if (d.name.empty()) d.name = "none";
  d.options = config::getString("SHOAL_COMPRESSOR_OPTS");
  d.minBytes = config::getInt("SHOAL_COMPRESS_MIN_BYTES");
  // The one rule (resolveCompressor) decides what a call that names nothing gets.
  const CompressorChoice unnamed = resolveCompressor(d, nullptr, nullptr, -1);
  d.plain = unnamed.name == "none" && unnamed.options.empty();
  return d;
}

CompressorChoice resolveCompressor(const CompressorDefaults& defaults, const char* callCompressor,
                                   const char* callOptions, long long callMinBytes) {
  CompressorChoice choice;
  if (callCompressor) choice.name = callCompressor;
  if (choice.name.empty()) choice.name = defaults.name;
  // Only a compressor the environment names owns the environment's options.
  if (callOptions)
    choice.options = callOptions;
  else if (!defaults.environment.empty() && choice.name == defaults.environment)
    choice.options = defaults.options;
  choice.minBytes = callMinBytes >= 0 ? callMinBytes : defaults.minBytes;
  return choice;
}

CompressorChoice resolveCompressor(const char* callCompressor, const char* callOptions, long long callMinBytes) {
  return resolveCompressor(CompressorDefaults::fromEnvironment(), callCompressor, callOptions, callMinBytes);
}

CompressorInstance::CompressorInstance(const shoal_compressor_t* table, const std::string& options)
    : table_(table), options_(options) {
  ParsedOptions parsed = parseOptions(options);
  std::vector<const char*> keys, values;
  for (size_t i = 0; i < parsed.keys.size(); ++i) {
    keys.push_back(parsed.keys[i].c_str());
    values.push_back(parsed.values[i].c_str());
  }
  char errorText[512] = {};
  shoal_compressor_params_t params{};
  params.struct_size = sizeof params;
  params.num_options = static_cast<int>(keys.size());
  params.keys = keys.data();
  params.values = values.data();
  params.log = logFromPlugin;
  params.error_text = errorText;
  params.error_text_size = sizeof errorText;
  shoal_status_t status = table_->create(&params, &instance_);
  if (status != SHOAL_OK)
    fail(status, "compressor {} refused options '{}': {}{}", table_->name, options,
         errorText[0] ? errorText : shoal_status_string(status),
         table_->options_help && table_->options_help[0] ? fmt::format(" (options: {})", table_->options_help) : "");
}

CompressorInstance::~CompressorInstance() {
  for (auto& [name, state] : states_)
    if (state != nullptr && table_->destroy_tensor_state != nullptr) table_->destroy_tensor_state(instance_, state);
  table_->destroy(instance_);
}

void* CompressorInstance::findState(const std::string& name) const {
  auto found = states_.find(name);
  return found == states_.end() ? nullptr : found->second;
}

CompressorInstance* CompressorCache::find(const std::string& name, const std::string& options) {
  auto found = instances_.find(name + "|" + options);
  return found == instances_.end() ? nullptr : found->second.get();
}

void CompressorCacheRelease::operator()(CompressorCache* cache) const { delete cache; }

CompressorInstance& CompressorCache::get(const std::string& name, const std::string& options) {
  if (CompressorInstance* existing = find(name, options)) return *existing;
  const Entry& entry = Registry::current().find(name);
  auto instance = std::make_unique<CompressorInstance>(entry.table, options);
  CompressorInstance& result = *instance;
  instances_[name + "|" + options] = std::move(instance);
  return result;
}

std::string CompressorCache::unnamedKey(const shoal_tensor_t& output) {
  std::string shape = fmt::format("unnamed/{}/", shoal_dtype_name(output.dtype));
  for (int d = 0; d < output.ndim; ++d) shape += fmt::format("{}{}", d ? "x" : "", output.shape[d]);
  std::map<const void*, int>& buffers = unnamedBuffers_[shape];
  auto found = buffers.try_emplace(output.data, static_cast<int>(buffers.size())).first;
  return fmt::format("{}#{}", shape, found->second);
}

}  // namespace shoal::plugin

namespace shoal {
namespace {

using plugin::CompressorInstance;

// What this rank has sent so far: over the host transport, over NCCL, and
// into its shared-memory slots (one host: a payload reaches the peers there).
uint64_t bytesSentSoFar(const shoal_comm& comm) {
  return comm.transport->bytesSent() + cudaBytesSent(comm) + (comm.shm ? comm.shm->bytesPublished() : 0);
}

// Every rank must run the same compressor, options and shapes, and every
// rank's start() must have accepted the call: one small max-allreduce of
// {hash, ~hash, refusal} tells every rank about a disagreement or a refusal
// anywhere, before any payload moves, so the communicator stays usable.
// Returns the largest refusal code seen (0 = every rank accepted).
uint64_t agreeAndShareRefusal(shoal_comm& comm, uint64_t sequence, const std::string& description,
                              shoal_status_t localStatus) {
  Agreement agreement = agree(comm, sequence, description, localStatus);
  if (!agreement.same)
    fail(SHOAL_ERR_MISMATCH,
         "ranks disagree on the compressed allreduce (this rank: {}): every rank must use the same compressor, "
         "options, dtype and shape for the same call",
         description);
  return static_cast<uint64_t>(-static_cast<int64_t>(agreement.refusal));
}

void validatePayload(const shoal_compressor_t& table, int round, const shoal_payload_t& payload) {
  auto refuse = [&](const std::string& why) {
    fail(SHOAL_ERR_INTERNAL, "compressor {} asked in round {} for an invalid payload: {} (a bug in the compressor)",
         table.name, round, why);
  };
  if (payload.collective != SHOAL_COLLECTIVE_ALLREDUCE && payload.collective != SHOAL_COLLECTIVE_ALLGATHERV)
    refuse("unknown collective");
  if (dtypeSize(payload.dtype) == 0) refuse("unknown dtype");
  if (payload.collective == SHOAL_COLLECTIVE_ALLREDUCE && !isValidDtypeOp(payload.dtype, payload.op))
    refuse(fmt::format("op {} on dtype {}", shoal_op_name(payload.op), shoal_dtype_name(payload.dtype)));
  if (payload.buffer == nullptr && payload.count > 0) refuse("NULL buffer");
}

// Issue 13.3: a compressor that sent a tensor uncompressed, or more bytes
// than the tensor holds, says so once per tensor name at info level, and why.
void noteIneffectiveCompression(shoal_comm& comm, const shoal_compressor_t& table,
                                const std::vector<shoal_compress_tensor_t>& tensors, const CompressStats& stats) {
  const std::string compressor = table.name;
  if (stats.inputBytes == 0 || stats.payloadBytes < stats.inputBytes) return;
  for (const shoal_compress_tensor_t& tensor : tensors) {
    const std::string name = tensor.name ? tensor.name : "(unnamed)";
    if (!comm.compressors->firstTime(compressor + "|" + name)) continue;
    std::string why = "its encoding of this tensor is no smaller than the data";
    if ((table.caps & SHOAL_CAP_MATRIX) && tensor.input.ndim < 2)
      why = compressor + " compresses matrices: a 1-D tensor travels densely (give the tensor a 2-D shape)";
    else if (compressor == "sketch")
      why = "the tensor is too dense for a sketch (its index and cells outweigh the dense values)";
    SHOAL_LOG_INFO("compressor {} sent tensor '{}' ({} bytes) as {} payload bytes ({}): {}", compressor, name,
                   stats.inputBytes, stats.payloadBytes,
                   stats.payloadBytes == stats.inputBytes ? "uncompressed" : "larger than the input", why);
  }
}

struct GatherSpace {
  std::vector<uint8_t> data;
  std::vector<size_t> counts, displs;
};

void runRounds(shoal_comm& comm, CompressorInstance& instance, shoal_compress_op_t& operation, void* opState,
               const char* errorText, CompressStats& stats, const MemoryRoute& route,
               const plugin::RoundObserver* observer, Transport* group);

// route.refusal != OK: this rank cannot run the call on its tensors' memory;
// start() is skipped and the refusal reaches every rank through the agreement.
// The agreement round (number `sequence`) is over the whole communicator; the
// rounds' payload collectives are over `group` where one is given (the
// hierarchical compressed allreduce's cross-host ranks: the compressor then
// sees their rank and number), else over the whole communicator too.
void runCompressed(shoal_comm& comm, uint64_t sequence, CompressorInstance& instance,
                   std::vector<shoal_compress_tensor_t>& tensors, shoal_op_t op, const std::string& agreement,
                   CompressStats& stats, const MemoryRoute& route,
                   const plugin::RoundObserver* observer = nullptr, Transport* group = nullptr) {
  const shoal_compressor_t& table = instance.table();
  char errorText[512] = {};
  shoal_compress_op_t operation{};
  operation.struct_size = sizeof operation;
  operation.rank = group ? group->rank() : comm.rank;
  operation.world_size = group ? group->size() : comm.size;
  operation.op = op;
  operation.num_tensors = static_cast<int>(tensors.size());
  operation.tensors = tensors.data();
  operation.step = comm.compressors->nextStep();
  operation.error_text = errorText;
  operation.error_text_size = sizeof errorText;
  const uint64_t sentBefore = bytesSentSoFar(comm);
  void* opState = nullptr;
  shoal_status_t startStatus =
      route.refusal != SHOAL_OK ? route.refusal : table.start(instance.handle(), &operation, &opState);
  uint64_t refusal = 0;
  try {
    refusal = agreeAndShareRefusal(comm, sequence, agreement, startStatus);
  } catch (...) {
    if (startStatus == SHOAL_OK) table.finish(instance.handle(), opState);
    throw;
  }
  if (route.refusal != SHOAL_OK) fail(route.refusal, "{}", route.why);
  if (startStatus != SHOAL_OK)
    fail(startStatus, "compressor {} refused the call: {}", table.name,
         errorText[0] ? errorText : shoal_status_string(startStatus));
  if (refusal != 0) {
    table.finish(instance.handle(), opState);
    auto status = static_cast<shoal_status_t>(-static_cast<int64_t>(refusal));
    fail(status, "compressor {} refused the call on another rank ({}); that rank's error says why", table.name,
         shoal_status_string(status));
  }
  // From here the peers are inside this call with us: a failure on this rank
  // alone (a compressor bug, a payload the transport refuses) must reach them
  // at once, so it aborts the communicator as a failed collective does.
  try {
    runRounds(comm, instance, operation, opState, errorText, stats, route, observer, group);
  } catch (const Error& error) {
    failCommunicator(comm, error.what(), error.status());
    throw;
  }
  stats.wireBytes = bytesSentSoFar(comm) - sentBefore;
  stats.algorithm = "compressed";  // across hosts only, runHierarchicalCompressed renames it
}

// The rounds after a successful start(); always ends with finish().
// Payloads of an op on CUDA tensors are device memory: their collectives run
// over NCCL on the input's stream (see include/shoal/compressor.h).
void runRounds(shoal_comm& comm, CompressorInstance& instance, shoal_compress_op_t& operation, void* opState,
               const char* errorText, CompressStats& stats, const MemoryRoute& route,
               const plugin::RoundObserver* observer, Transport* group) {
  const shoal_compressor_t& table = instance.table();
  auto observe = [&](const char* phase, int index, uint64_t bytes, Clock::time_point begin) {
    if (observer) (*observer)(plugin::RoundEvent{phase, index, bytes, begin, Clock::now()});
  };
  auto failed = [&](shoal_status_t status, const std::string& stage) {
    fail(status, "compressor {} failed in {}: {}", table.name, stage, errorText[0] ? errorText : shoal_status_string(status));
  };
  shoal_status_t status = SHOAL_OK;
  GatherSpace gathers[SHOAL_MAX_ROUND_PAYLOADS];
  try {
    shoal_round_t round{};
    round.struct_size = sizeof round;
    for (;;) {
      Clock::time_point begin = observer ? Clock::now() : Clock::time_point{};
      status = table.round(instance.handle(), opState, &operation, &round);
      if (status != SHOAL_OK) failed(status, fmt::format("round {}", round.index));
      if (round.done) {
        // The outputs of CUDA tensors are written by kernels on the input's
        // stream: the call returns once they ran (docs/gpu.md).
        if (route.cuda) cudaPayloadsDone(comm, route);
        observe("DECODE", round.index, 0, begin);
        break;
      }
      observe("ENCODE", round.index, 0, begin);
      if (round.num_payloads < 1 || round.num_payloads > SHOAL_MAX_ROUND_PAYLOADS)
        fail(SHOAL_ERR_INTERNAL, "compressor {} asked for {} payloads in round {} (1..{} allowed) without done",
             table.name, round.num_payloads, round.index, SHOAL_MAX_ROUND_PAYLOADS);
      if (round.index + 1 >= plugin::kMaxRounds)
        fail(SHOAL_ERR_INTERNAL, "compressor {} asked for more than {} rounds", table.name, plugin::kMaxRounds);
      for (int p = 0; p < round.num_payloads; ++p) {
        shoal_payload_t& payload = round.payloads[p];
        validatePayload(table, round.index, payload);
        stats.payloadBytes += payload.count * dtypeSize(payload.dtype);
        Clock::time_point begin = observer ? Clock::now() : Clock::time_point{};
        if (route.cuda) {
          GatherSpace& space = gathers[p];
          if (payload.collective == SHOAL_COLLECTIVE_ALLREDUCE) {
            cudaPayloadAllreduce(comm, route, payload.buffer, payload.count, payload.dtype, payload.op);
          } else {
            payload.gathered = cudaPayloadAllgatherv(comm, route, p, payload.buffer, payload.count, payload.dtype,
                                                     space.counts, space.displs);
            payload.gathered_counts = space.counts.data();
            payload.gathered_displs = space.displs.data();
          }
        } else if (payload.collective == SHOAL_COLLECTIVE_ALLREDUCE && group) {
          groupAllreduce(comm, *group, payload.buffer, payload.count, payload.dtype, payload.op);
        } else if (payload.collective == SHOAL_COLLECTIVE_ALLREDUCE) {
          plainAllreduce(comm, takeSequence(comm), payload.buffer, payload.buffer, payload.count, payload.dtype,
                         payload.op);
        } else {
          GatherSpace& space = gathers[p];
          if (group)
            groupAllgatherv(comm, *group, payload.buffer, payload.count, payload.dtype, space.data, space.counts,
                            space.displs);
          else {
            if (comm.algorithm == "aggregate") aggregate::noteGathersTakeTheRing();
            allgathervBytes(comm, payload.buffer, payload.count, payload.dtype, space.data, space.counts, space.displs);
          }
          payload.gathered = space.data.data();
          payload.gathered_counts = space.counts.data();
          payload.gathered_displs = space.displs.data();
        }
        observe(payload.collective == SHOAL_COLLECTIVE_ALLREDUCE ? "ALLREDUCE" : "ALLGATHERV", round.index,
                payload.count * dtypeSize(payload.dtype), begin);
      }
      ++stats.rounds;
      ++round.index;
    }
  } catch (...) {
    table.finish(instance.handle(), opState);
    throw;
  }
  table.finish(instance.handle(), opState);
}

// A compressor with SHOAL_CAP_MATRIX (powersgd) views a tensor of ndim >= 2
// as a matrix [shape[0], rest]: its shard must be a block of whole rows, a
// smaller matrix with the same columns, for P = M Q and Q = Mᵀ P to mean
// anything. Every other compressor sees 1-D shards, whatever the shape
// (plugins built before the bit existed among them, as before).
bool shardsByRows(const shoal_compressor_t& table, const shoal_tensor_t& tensor) {
  return (table.caps & SHOAL_CAP_MATRIX) != 0 && tensor.ndim >= 2;
}

// What a tensor's host shards are cut in: its rows (shardsByRows), else its elements.
size_t shardUnits(const shoal_compressor_t& table, const shoal_tensor_t& tensor) {
  return shardsByRows(table, tensor) ? static_cast<size_t>(tensor.shape[0]) : plugin::elementsCount(tensor);
}

// A matrix with fewer rows than a host has ranks has no row block for every
// rank: it is compressed flat, over every rank. Rank 0 says so once per shape.
void noteRowsTooFew(shoal_comm& comm, const char* compressor, const shoal_tensor_t& tensor) {
  std::string shape;
  for (int d = 0; d < tensor.ndim; ++d) shape += fmt::format("{}{}", d ? " x " : "", tensor.shape[d]);
  if (comm.rank != 0 || !comm.compressors->firstTime(fmt::format("{}|rows-flat|{}", compressor, shape))) return;
  SHOAL_LOG_INFO("compressor {}: a [{}] tensor has {} rows, fewer than the {} ranks of a host, so it has no row "
                 "block for each of them: it is compressed flat over every rank, not across hosts only "
                 "(docs/groups.md)",
                 compressor, shape, tensor.shape[0], comm.hosts->local.size());
}

// The name and state slot of this rank's shard of a tensor in the
// hierarchical compressed allreduce: "<name>#host-shard<i>/<l>" for local rank
// i of l. The ranks compressing that shard together (one per host) have the
// same i and l, so they name it alike (powersgd draws its first Q from the
// name); shoal_compressor_state_save and _load take this name.
std::string shardKey(const shoal_comm& comm, const char* tensorName) {
  return fmt::format("{}#host-shard{}/{}", tensorName, comm.hosts->localRank, comm.hosts->local.size());
}

// Where the tensors of one hierarchical compressed operation lie in the
// buffer the host legs run on: shard i (local rank i's) holds block i of
// every tensor, in the operation's order. A tensor's block is the same
// elements (or rows) whether it runs alone or in a fused group, whichever
// tensors share the group, so its shard's state (shardKey) always belongs to
// the same part of the same tensor. Alone, the buffer is the tensor itself.
struct HostShardPlan {
  std::vector<std::vector<size_t>> blocks;  // [tensor][local rank]: elements of its block
  std::vector<size_t> shards;               // [local rank]: elements of the shard, all tensors' blocks

  HostShardPlan(const shoal_compressor_t& table, const std::vector<shoal_compress_tensor_t>& tensors,
                int localSize)
      : shards(localSize, 0) {
    for (const shoal_compress_tensor_t& tensor : tensors) {
      const size_t units = shardUnits(table, tensor.input);
      blocks.push_back(HostLegs::shardCountsOf(units, plugin::elementsCount(tensor.input) / units, localSize));
      for (int b = 0; b < localSize; ++b) shards[b] += blocks.back()[b];
    }
  }
  // In elements: block `b` of tensor `t` in the packed buffer, and in the tensor.
  size_t packedOffset(size_t t, int b) const {
    size_t offset = 0;
    for (int s = 0; s < b; ++s) offset += shards[s];
    for (size_t u = 0; u < t; ++u) offset += blocks[u][b];
    return offset;
  }
  size_t tensorOffset(size_t t, int b) const {
    size_t offset = 0;
    for (int s = 0; s < b; ++s) offset += blocks[t][s];
    return offset;
  }
};

// The hierarchical compressed allreduce (issue 16), for ranks on h hosts with
// l on each, of one tensor (a blocking call) or of a fused group (the async
// runtime): a dense ring reduce-scatter inside each host (local rank i ends
// with shard i of its host's sum: block i of every tensor), the compressor's
// rounds on that shard among the ranks with local index i, one per host (only
// these bytes cross a host link, and they are compressed), and a dense ring
// allgather inside the host. The compressor sees this rank's block of each
// tensor, reduced with sum over h ranks: a 1-D tensor, or with
// SHOAL_CAP_MATRIX a block of whole rows of a matrix, [rows_i, shape[1], ...],
// a matrix again; named tensors under their shard's name and state slot
// (shardKey), so error feedback and warm starts follow the block this rank
// owns from call to call. avg divides by all n ranks once, after it. Legs 1
// and 3 run under the call's number; the agreement round takes the next one
// over the whole communicator; leg 2's groups number their collectives from
// there, each as far as its compressor's rounds go (the sketch's depend on
// the data, powersgd's on whether its row block is worth compressing), and
// leg 3 then sets every rank to the largest number any group reached (every
// host holds one rank of each group, so its largest is everyone's). Every
// tensor must have a block (an element, or a row) for each rank of a host.
void runHierarchicalCompressed(shoal_comm& comm, uint64_t sequence, CompressorInstance& instance,
                               const std::vector<shoal_compress_tensor_t>& tensors, const std::string& agreement,
                               shoal_op_t op, CompressStats& stats, const plugin::RoundObserver* observer) {
  const shoal_compressor_t& table = instance.table();
  const shoal_dtype_t dtype = tensors.front().input.dtype;
  const size_t element = dtypeSize(dtype);
  const int mine = comm.hosts->localRank;
  const HostShardPlan plan(table, tensors, static_cast<int>(comm.hosts->local.size()));
  size_t total = 0;
  for (size_t shard : plan.shards) total += shard;

  // Alone, the tensor's output is the buffer; a group is packed block by block.
  const bool alone = tensors.size() == 1;
  uint8_t* data = static_cast<uint8_t*>(tensors.front().output.data);
  if (alone && tensors.front().input.data != data) std::memcpy(data, tensors.front().input.data, total * element);
  if (!alone) {
    std::vector<uint8_t>& packed = comm.compressors->packedShards;
    if (packed.size() < total * element) packed.resize(total * element);
    data = packed.data();
    for (size_t t = 0; t < tensors.size(); ++t)
      for (size_t b = 0; b < plan.shards.size(); ++b)
        std::memcpy(data + plan.packedOffset(t, static_cast<int>(b)) * element,
                    static_cast<const uint8_t*>(tensors[t].input.data) +
                        plan.tensorOffset(t, static_cast<int>(b)) * element,
                    plan.blocks[t][b] * element);
  }
  const uint64_t sentBefore = bytesSentSoFar(comm);
  HostLegs legs(*comm.transport, *comm.hosts, plan.shards, element, comm.segmentBytes);
  uint64_t leg3Tags = 0;  // where leg 3 starts in the call's tags
  runCollective(comm, sequence, [&](Context& context) {
    legs.reduceScatter(context, data, Reducer(dtype, SHOAL_SUM));
    leg3Tags = context.nextSubTag;
  });

  std::vector<shoal_compress_tensor_t> shards(tensors.size());
  std::vector<std::string> names(tensors.size());
  std::vector<void*> scratch(tensors.size(), nullptr);  // unnamed (stateless) tensors: state for this call only
  for (size_t t = 0; t < tensors.size(); ++t) {
    const shoal_tensor_t& whole = tensors[t].input;
    shoal_tensor_t& shard = shards[t].input;
    shard = shoal_tensor_1d(data + plan.packedOffset(t, mine) * element, plan.blocks[t][mine], dtype);
    if (shardsByRows(table, whole)) {
      shard.ndim = whole.ndim;
      for (int d = 1; d < whole.ndim; ++d) shard.shape[d] = whole.shape[d];
      const size_t rowElements = plugin::elementsCount(whole) / static_cast<size_t>(whole.shape[0]);
      shard.shape[0] = static_cast<int64_t>(plan.blocks[t][mine] / rowElements);
    }
    shards[t].output = shard;  // in place
    if (tensors[t].name) {
      names[t] = shardKey(comm, tensors[t].name);
      shards[t].name = names[t].c_str();
      shards[t].state = instance.stateOf(names[t]);
    } else {
      shards[t].state = &scratch[t];
    }
  }
  auto releaseScratch = [&] {
    for (void* state : scratch)
      if (state && table.destroy_tensor_state) table.destroy_tensor_state(instance.handle(), state);
  };
  try {
    runCompressed(comm, takeSequence(comm), instance, shards, SHOAL_SUM, agreement, stats, MemoryRoute(), observer,
                  &legs.acrossHosts());
  } catch (...) {
    releaseScratch();
    throw;
  }
  releaseScratch();
  if (op == SHOAL_AVG) Reducer(dtype, SHOAL_AVG).finish(data + legs.shardOffset(), legs.shardCount(), comm.size);

  runCollective(comm, sequence, [&](Context& context) {
    context.nextSubTag = leg3Tags;
    comm.sequence = legs.maxOnHost(context, comm.sequence);
    legs.allgather(context, data);
  });
  if (!alone)
    for (size_t t = 0; t < tensors.size(); ++t)
      for (size_t b = 0; b < plan.shards.size(); ++b)
        std::memcpy(static_cast<uint8_t*>(tensors[t].output.data) + plan.tensorOffset(t, static_cast<int>(b)) * element,
                    data + plan.packedOffset(t, static_cast<int>(b)) * element, plan.blocks[t][b] * element);
  stats.wireBytes = bytesSentSoFar(comm) - sentBefore;
  stats.acrossHostsOnly = true;
  stats.algorithm = "hierarchical";
}

// Whether an operation's tensors take the hierarchical compressed allreduce:
// where the communicator runs `bytes` (the tensor's, or the fused group's)
// hierarchically, as a plain allreduce of that size would (SHOAL_ALGO, or
// auto from the layout and SHOAL_HIER_MIN_BYTES), and every tensor has a
// block for each rank of a host: an element, or for row shards a row.
bool runsAcrossHosts(shoal_comm& comm, const shoal_compressor_t& table,
                     const std::vector<shoal_compress_tensor_t>& tensors, size_t bytes) {
  if (!comm.hosts || !comm.hosts->hierarchical() || chooseAllreduce(comm, bytes).run != allreduceHierarchical)
    return false;
  // auto leaves a compressor flat where compressing across hosts only does not
  // pay (the rule and why: hierarchicalSuitsCompressor, algos.cc).
  if (comm.allreduceChoice.fixed == nullptr && !hierarchicalSuitsCompressor(table.caps)) return false;
  for (const shoal_compress_tensor_t& tensor : tensors)
    if (shardUnits(table, tensor.input) < comm.hosts->local.size()) {
      if (shardsByRows(table, tensor.input)) noteRowsTooFew(comm, table.name, tensor.input);
      return false;
    }
  return true;
}

// The agreement text's part that names the hierarchical path: a rank that
// compresses flat fails against it with MISMATCH on every rank.
std::string acrossHostsWords(const shoal_compressor_t& table, const std::vector<shoal_compress_tensor_t>& tensors) {
  for (const shoal_compress_tensor_t& tensor : tensors)
    if (shardsByRows(table, tensor.input)) return "|across hosts, rows";
  return "|across hosts";
}

// What shoal_last_compress_stats reports after a plain allreduce: `bytes` in,
// nothing compressed. The compressor's name is rewritten only when the last
// call's was another (a plain call in a loop builds no string).
void notePlainStats(CompressStats& last, uint64_t bytes, const char* algorithm) {
  if (std::string_view(last.compressor) != "none") last.compressor = "none";
  last.algorithm = algorithm;
  last.inputBytes = bytes;
  last.payloadBytes = 0;
  last.wireBytes = 0;  // not tracked for the plain path
  last.rounds = 0;
  last.acrossHostsOnly = false;
}

// "none", compared inline (a library strcmp per call cost more than this).
bool namesNone(const char* name) {
  return name[0] == 'n' && name[1] == 'o' && name[2] == 'n' && name[3] == 'e' && name[4] == '\0';
}

// The compression decision and the algorithm are part of the call's
// signature (comm/agree.h): a rank that compresses where another does not
// fails with MISMATCH at the first message. `instance` is the compressor a
// compressed call runs (null: plain), `plain` the algorithm of a plain host
// call (null for NCCL's).
void declareDecision(shoal_comm& comm, const CompressorInstance* instance, bool acrossHosts,
                     const AllreduceAlgorithm* plain) {
  if (comm.call.kind != CallKind::Allreduce) return;
  comm.call.compressed = instance != nullptr;
  if (instance != nullptr) {
    comm.call.compressor = instance->table().name;  // outlive the call, unlike the resolved name and options
    comm.call.options = instance->options();
    if (acrossHosts) comm.call.algorithm = "hierarchical";
  } else if (plain != nullptr) {
    comm.call.algorithm = plain->nameView;
  }
  refreshCallWord(comm);
}

// A plain allreduce of host tensors: the algorithm for its size, declared,
// run, and its stats.
void plainHostAllreduce(shoal_comm& comm, uint64_t sequence, const shoal_tensor_t& input,
                        const shoal_tensor_t& output, size_t count, shoal_op_t op) {
  const size_t bytes = count * dtypeSize(input.dtype);
  const AllreduceAlgorithm& plain = chooseAllreduce(comm, bytes);
  declareDecision(comm, nullptr, false, &plain);
  notePlainStats(comm.lastStats, bytes,
                 plainAllreduce(comm, sequence, plain, input.data, output.data, count, input.dtype, op));
}

}  // namespace

namespace {

// A call that names no compressor (or "none") and no options, where the
// environment names none either, runs plain: there is no choice to resolve
// (resolveCompressor would give it "none" without options).
bool plainByDefault(const shoal_comm& comm, const shoal_allreduce_options_t* options) {
  const char* callCompressor = options ? options->compressor : nullptr;
  const char* callOptions = options ? options->compressor_options : nullptr;
  return comm.compressors->defaults.plain &&
         (callCompressor == nullptr || !callCompressor[0] || namesNone(callCompressor)) &&
         (callOptions == nullptr || !callOptions[0]);
}

// Every other call: the compressor resolved, then compressed, plain or NCCL.
// Out of line, so that the plain host call's path has none of its frame.
[[gnu::noinline]] void allreduceResolved(shoal_comm& comm, uint64_t sequence, const shoal_tensor_t& input,
                                         const shoal_tensor_t& output, shoal_op_t op,
                                         const shoal_allreduce_options_t* options, MemoryRoute& route) {
  const size_t count = plugin::elementsCount(input);
  const size_t bytes = count * dtypeSize(input.dtype);
  const char* callCompressor = options ? options->compressor : nullptr;
  const char* callOptions = options ? options->compressor_options : nullptr;
  const plugin::CompressorChoice choice =
      plainByDefault(comm, options) ? plugin::CompressorChoice{}
                                    : plugin::resolveCompressor(comm.compressors->defaults, callCompressor, callOptions,
                                                                options ? options->compress_min_bytes : -1);
  const std::string& name = choice.name;
  const std::string& copts = choice.options;
  const long long minBytes = choice.minBytes;
  // Resolve the compressor first, whatever the tensor: an unknown name or bad
  // options fail every call on every rank, not only the ones that compress.
  // ("none" without options needs no instance: it is the plain path.)
  CompressorInstance* instance = nullptr;
  if (!name.empty() && (name != "none" || !copts.empty())) instance = &comm.compressors->get(name, copts);
  bool compress = instance != nullptr && name != "none" && (op == SHOAL_SUM || op == SHOAL_AVG) && count > 0 &&
                  static_cast<long long>(bytes) >= minBytes && ((instance->table().dtypes >> input.dtype) & 1u);
  if (!compress && !route.cuda) return plainHostAllreduce(comm, sequence, input, output, count, op);
  // CUDA tensors: refusals are gathered here and shared with every rank in
  // the call's first (host) round; never staged through host memory.
  // Named after the entry point the user called (shoal_allreduce_tensor, or
  // the async runtime's shoal_iallreduce), which routeOf recorded.
  const char* call = route.call[0] != '\0' ? route.call : "shoal_allreduce_tensor";
  if (route.cuda && compress && !(instance->table().caps & SHOAL_CAP_CUDA))
    route.refuse(SHOAL_ERR_UNSUPPORTED,
                 fmt::format("{}: compressor {} cannot run on CUDA tensors (it lacks SHOAL_CAP_CUDA) and shoal never "
                             "stages them through host memory: use a compressor with CUDA support, compressor "
                             "\"none\" (plain NCCL allreduce), or host tensors",
                             call, name));
  checkCudaReady(comm, call, route);
  if (!compress) {  // CUDA tensors, plain: NCCL's allreduce
    declareDecision(comm, nullptr, false, nullptr);
    cudaAllreduce(comm, sequence, route, input.data, output.data, count, input.dtype, op);
    notePlainStats(comm.lastStats, bytes, "nccl");
    return;
  }
  // Compressed across hosts only (runHierarchicalCompressed) where the
  // communicator runs this size hierarchically (runsAcrossHosts): host
  // tensors of at least one element per rank of a host, or for row shards
  // (SHOAL_CAP_MATRIX: powersgd's matrices) one row. Stateful compressors
  // keep their state per (tensor, shard).
  std::vector<shoal_compress_tensor_t> tensors(1);
  tensors[0].input = input;
  tensors[0].output = output;
  const bool acrossHosts = !route.cuda && runsAcrossHosts(comm, instance->table(), tensors, bytes);
  declareDecision(comm, instance, acrossHosts, nullptr);

  CompressStats stats;
  stats.inputBytes = bytes;

  // Unnamed tensors of a stateful compressor get a deterministic key from
  // their output buffer, dtype and shape (CompressorCache::unnamedKey), so
  // error feedback and warm starts carry over between steps; a stateless
  // compressor's unnamed tensors get a state slot for this call only.
  std::string unnamed;
  const char* tensorName = options && options->name && options->name[0] ? options->name : nullptr;
  if (tensorName == nullptr && (instance->table().caps & SHOAL_CAP_STATEFUL)) {
    unnamed = comm.compressors->unnamedKey(output);
    tensorName = unnamed.c_str();
  }
  void* scratchState = nullptr;
  tensors[0].name = tensorName;
  // Across hosts the compressor sees this rank's shard, under a name and a
  // state slot of the shard's own (shardKey, runHierarchicalCompressed).
  if (!acrossHosts) tensors[0].state = tensorName ? instance->stateOf(tensorName) : &scratchState;

  std::string agreement = fmt::format("{}|{}|{}|{}|{}|", name, copts, static_cast<int>(op),
                                      static_cast<int>(input.dtype), tensorName ? tensorName : "");
  for (int d = 0; d < input.ndim; ++d) agreement += fmt::format("{},", input.shape[d]);
  if (route.cuda) agreement += "|cuda";
  stats.compressor = name;
  try {
    if (acrossHosts)
      runHierarchicalCompressed(comm, sequence, *instance, tensors,
                                agreement + acrossHostsWords(instance->table(), tensors), op, stats, nullptr);
    else
      runCompressed(comm, sequence, *instance, tensors, op, agreement, stats, route);
    noteIneffectiveCompression(comm, instance->table(), tensors, stats);
  } catch (...) {
    if (scratchState && instance->table().destroy_tensor_state)
      instance->table().destroy_tensor_state(instance->handle(), scratchState);
    throw;
  }
  if (scratchState && instance->table().destroy_tensor_state)
    instance->table().destroy_tensor_state(instance->handle(), scratchState);
  comm.lastStats = stats;
}

}  // namespace

void allreduceHostTensor(shoal_comm& comm, uint64_t sequence, const shoal_tensor_t& input,
                         const shoal_tensor_t& output, shoal_op_t op, const shoal_allreduce_options_t* options) {
  if (plainByDefault(comm, options))
    return plainHostAllreduce(comm, sequence, input, output, plugin::elementsCount(input), op);
  MemoryRoute host;  // both tensors are host memory
  allreduceResolved(comm, sequence, input, output, op, options, host);
}

void allreduceTensor(shoal_comm& comm, uint64_t sequence, const shoal_tensor_t& input, const shoal_tensor_t& output,
                     shoal_op_t op, const shoal_allreduce_options_t* options, MemoryRoute& route) {
  if (!route.cuda) return allreduceHostTensor(comm, sequence, input, output, op, options);
  allreduceResolved(comm, sequence, input, output, op, options, route);
}

void allreduceCompressedGroup(shoal_comm& comm, uint64_t sequence, const std::string& compressor,
                              const std::string& options, std::vector<shoal_compress_tensor_t>& tensors,
                              shoal_op_t op, const plugin::RoundObserver* observer) {
  CompressorInstance& instance = comm.compressors->get(compressor, options);
  const shoal_compressor_t& table = instance.table();
  CompressStats stats;
  stats.compressor = compressor;
  std::string agreement = fmt::format("{}|{}|{}|{}|", compressor, options, static_cast<int>(op), tensors.size());
  for (shoal_compress_tensor_t& tensor : tensors) {
    stats.inputBytes += plugin::elementsCount(tensor.input) * dtypeSize(tensor.input.dtype);
    agreement += fmt::format("{}|{}|", static_cast<int>(tensor.input.dtype), tensor.name ? tensor.name : "");
    for (int d = 0; d < tensor.input.ndim; ++d) agreement += fmt::format("{},", tensor.input.shape[d]);
  }
  // A fused group takes the path a blocking allreduce of the group's size
  // would, as the runtime's uncompressed groups do: across hosts, each
  // tensor's state kept per (tensor, shard) as in the blocking call, so a
  // tensor's state does not depend on which tensors share its group.
  if (runsAcrossHosts(comm, table, tensors, stats.inputBytes)) {
    runHierarchicalCompressed(comm, sequence, instance, tensors, agreement + acrossHostsWords(table, tensors), op,
                              stats, observer);
  } else {
    for (shoal_compress_tensor_t& tensor : tensors) tensor.state = instance.stateOf(tensor.name ? tensor.name : "");
    const MemoryRoute hostRoute;  // the async runtime submits host tensors only
    runCompressed(comm, sequence, instance, tensors, op, agreement, stats, hostRoute, observer);
  }
  noteIneffectiveCompression(comm, table, tensors, stats);
  comm.lastStats = stats;
}

}  // namespace shoal
