#include "runtime/fusion.h"

#include <cstring>
#include <map>
#include <tuple>

#include <fmt/format.h>

#include "comm/call.h"
#include "comm/host_ops.h"
#include "plugin/driver.h"
#include "runtime/alltoall.h"
#include "runtime/reduce_scatter.h"
#include "runtime/timeline.h"

namespace shoal::runtime {
namespace {

// Requests that may share a group: same dtype, op and compression.
using FusionKey = std::tuple<int, int, bool, std::string, std::string>;

FusionKey keyOf(const Ready& ready) {
  const Metadata& m = ready.request->meta;
  return {static_cast<int>(m.dtype), static_cast<int>(m.op), ready.compress, ready.compress ? m.compressor : "",
          ready.compress ? m.options : ""};
}

void spanAll(Timeline* timeline, const Group& group, const char* phase, Clock::time_point begin,
             const std::string& args = "") {
  if (timeline == nullptr) return;
  Clock::time_point end = Clock::now();
  for (const Ready* member : group.members) timeline->span(member->request->name, phase, begin, end, args);
}

void runPlainAllreduce(shoal_comm& comm, Group& group, std::vector<uint8_t>& fusionBuffer, Timeline* timeline) {
  const Metadata& first = group.members.front()->request->meta;
  const size_t element = dtypeSize(first.dtype);
  if (group.members.size() == 1) {  // nothing to fuse: straight from input to output
    Request& r = *group.members.front()->request;
    Clock::time_point begin = Clock::now();
    group.algorithm = plainAllreduce(comm, takeSequence(comm), r.input.data, r.output.data, r.meta.elements(),
                                     r.meta.dtype, r.meta.op);
    spanAll(timeline, group, "ALLREDUCE", begin,
            fmt::format("\"bytes\": {}, \"algorithm\": \"{}\"", r.meta.bytes(), group.algorithm));
    return;
  }
  size_t total = 0;
  for (const Ready* member : group.members) total += member->request->meta.elements();
  if (fusionBuffer.size() < total * element) fusionBuffer.resize(total * element);
  Clock::time_point begin = Clock::now();
  size_t offset = 0;
  for (const Ready* member : group.members) {
    const Request& r = *member->request;
    size_t bytes = r.meta.bytes();
    if (bytes > 0) std::memcpy(fusionBuffer.data() + offset, r.input.data, bytes);
    offset += bytes;
  }
  const std::string fused = fmt::format("\"fused\": {}, \"bytes\": {}", group.members.size(), total * element);
  spanAll(timeline, group, "MEMCPY_IN_FUSION", begin, fused);
  begin = Clock::now();
  group.algorithm =
      plainAllreduce(comm, takeSequence(comm), fusionBuffer.data(), fusionBuffer.data(), total, first.dtype, first.op);
  spanAll(timeline, group, "ALLREDUCE", begin, fused + fmt::format(", \"algorithm\": \"{}\"", group.algorithm));
  begin = Clock::now();
  offset = 0;
  for (const Ready* member : group.members) {
    const Request& r = *member->request;
    size_t bytes = r.meta.bytes();
    if (bytes > 0) std::memcpy(r.output.data, fusionBuffer.data() + offset, bytes);
    offset += bytes;
  }
  spanAll(timeline, group, "MEMCPY_OUT_FUSION", begin, fused);
}

void runCompressedAllreduce(shoal_comm& comm, Group& group, Timeline* timeline) {
  const Metadata& first = group.members.front()->request->meta;
  std::vector<shoal_compress_tensor_t> tensors(group.members.size());
  for (size_t i = 0; i < group.members.size(); ++i) {
    Request& r = *group.members[i]->request;
    tensors[i].input = r.input;
    tensors[i].output = r.output;
    tensors[i].name = r.name.c_str();
  }
  plugin::RoundObserver observer = [&](const plugin::RoundEvent& event) {
    const bool roundCall = !std::strcmp(event.phase, "ENCODE") || !std::strcmp(event.phase, "DECODE");
    std::string phase = roundCall ? std::string(event.phase) : fmt::format("COMPRESSED_{}", event.phase);
    std::string args = fmt::format("\"compressor\": \"{}\", \"round\": {}, \"fused\": {}", first.compressor,
                                   event.round, group.members.size());
    if (!roundCall) args += fmt::format(", \"bytes\": {}", event.bytes);
    for (const Ready* member : group.members)
      timeline->span(member->request->name, phase.c_str(), event.begin, event.end, args);
  };
  allreduceCompressedGroup(comm, takeSequence(comm), first.compressor, first.options, tensors, first.op,
                           timeline ? &observer : nullptr);
  group.algorithm = comm.lastStats.algorithm;  // the driver's record of the path it took
}

void runAllgather(shoal_comm& comm, Request& r, Timeline* timeline, const Group& group) {
  const size_t element = dtypeSize(r.meta.dtype);
  const size_t count = r.meta.elements();
  const size_t bytes = count * element;
  auto* out = static_cast<uint8_t*>(r.output.data);
  const uint64_t sequence = takeSequence(comm);
  if (bytes > 0 && out + comm.rank * bytes != r.input.data) std::memmove(out + comm.rank * bytes, r.input.data, bytes);
  if (bytes == 0) return emptyCall(comm, sequence);
  Clock::time_point begin = Clock::now();
  std::vector<size_t> counts(comm.size, count);
  Blocks blocks = blocksFrom(counts.data(), nullptr, element, comm.size, comm.segmentBytes, comm.size);
  runCollective(comm, sequence, [&](Context& context) { ringAllgather(context, out, blocks); });
  spanAll(timeline, group, "ALLGATHER", begin, fmt::format("\"bytes\": {}", bytes * comm.size));
}

void runBroadcast(shoal_comm& comm, Request& r, Timeline* timeline, const Group& group) {
  const size_t bytes = r.meta.bytes();
  const uint64_t sequence = takeSequence(comm);
  if (bytes == 0) return emptyCall(comm, sequence);
  Clock::time_point begin = Clock::now();
  bool tree = comm.algorithm == "tree" || (comm.algorithm != "ring" && bytes <= comm.treeMaxBytes);
  runCollective(comm, sequence, [&](Context& context) {
    tree ? broadcastTree(context, r.output.data, bytes, r.meta.root)
         : broadcastChain(context, r.output.data, bytes, r.meta.root);
  });
  spanAll(timeline, group, "BROADCAST", begin, fmt::format("\"bytes\": {}", bytes));
}

}  // namespace

bool compresses(shoal_comm& comm, const Metadata& meta) {
  if (meta.kind != OpKind::Allreduce || meta.compressor.empty() || meta.compressor == "none") return false;
  // Resolved even for tensors that will not compress: an unknown compressor
  // or bad options fail every such request on every rank, as in the driver.
  const shoal_compressor_t& table = comm.compressors->get(meta.compressor, meta.options).table();
  return (meta.op == SHOAL_SUM || meta.op == SHOAL_AVG) && meta.elements() > 0 &&
         static_cast<long long>(meta.bytes()) >= meta.minBytes && ((table.dtypes >> meta.dtype) & 1u);
}

std::vector<Group> planGroups(std::vector<Ready>& ready, size_t threshold) {
  std::vector<Group> groups;
  std::map<FusionKey, std::pair<size_t, size_t>> open;  // key -> (group index, bytes so far)
  for (Ready& r : ready) {
    const Metadata& meta = r.request->meta;
    // CUDA tensors never fuse (runtime/cuda_requests.h): each runs alone, so
    // no group mixes memory kinds and no host fusion buffer sees device memory.
    const bool fusable = meta.kind == OpKind::Allreduce && meta.memory == SHOAL_MEMORY_HOST && threshold > 0;
    if (fusable) {
      FusionKey key = keyOf(r);
      auto found = open.find(key);
      if (found != open.end() && found->second.second + meta.bytes() <= threshold) {
        groups[found->second.first].members.push_back(&r);
        found->second.second += meta.bytes();
        continue;
      }
      open[key] = {groups.size(), meta.bytes()};
    }
    groups.push_back(Group{{&r}});
  }
  return groups;
}

void runGroup(shoal_comm& comm, Group& group, std::vector<uint8_t>& fusionBuffer, Timeline* timeline) {
  Request& first = *group.members.front()->request;
  if (timeline != nullptr) {
    Clock::time_point now = Clock::now();
    for (const Ready* member : group.members) timeline->span(member->request->name, "QUEUE", member->readyAt, now);
  }
  switch (first.meta.kind) {
    case OpKind::Blocking:
      return first.body();  // its BLOCKING_CALL span is recorded by blockingCall (runtime/call_trace.h)
    case OpKind::Broadcast:
      return runBroadcast(comm, first, timeline, group);
    case OpKind::Allgather:
      return runAllgather(comm, first, timeline, group);
    case OpKind::Alltoall:
    case OpKind::Alltoallv:
      return runAlltoall(comm, first, timeline);
    case OpKind::ReduceScatter:
      return runReduceScatter(comm, first, timeline);
    case OpKind::Allreduce:
      if (group.members.front()->compress) return runCompressedAllreduce(comm, group, timeline);
      return runPlainAllreduce(comm, group, fusionBuffer, timeline);
    case OpKind::Join:  // completed by the engine once every rank joined, never ready
      fail(SHOAL_ERR_INTERNAL, "async runtime: a join request reached the collectives");
  }
}

}  // namespace shoal::runtime
