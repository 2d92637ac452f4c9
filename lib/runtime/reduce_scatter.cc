#include "runtime/reduce_scatter.h"

#include <algorithm>
#include <cstring>

#include <fmt/format.h>

#include "collectives/collectives.h"
#include "comm/agree.h"
#include "comm/call.h"
#include "comm/communicator.h"
#include "runtime/timeline.h"

namespace shoal::runtime {

RowShare shareOf(size_t rows, int size, int rank) {
  const size_t base = rows / static_cast<size_t>(size), extra = rows % static_cast<size_t>(size);
  const size_t r = static_cast<size_t>(rank);
  return {r * base + std::min(r, extra), base + (r < extra ? 1 : 0)};
}

size_t rowElements(const std::vector<int64_t>& shape) {
  size_t count = 1;
  for (size_t d = 1; d < shape.size(); ++d) count *= static_cast<size_t>(shape[d]);
  return count;
}

std::vector<size_t> shareCounts(const Metadata& meta, int size) {
  const size_t rows = static_cast<size_t>(meta.shape.front()), row = rowElements(meta.shape);
  std::vector<size_t> counts(size);
  for (int p = 0; p < size; ++p) counts[p] = shareOf(rows, size, p).rows * row;
  return counts;
}

void runReduceScatter(shoal_comm& comm, Request& r, Timeline* timeline) {
  const size_t element = dtypeSize(r.meta.dtype), total = r.meta.elements();
  // The total count is what every rank agreed on (the shape was negotiated).
  CallScope scope(comm, signatureOf(CallKind::ReduceScatter, r.meta.dtype, r.meta.op, total, -1, "ring"));
  const uint64_t sequence = takeSequence(comm);
  if (total == 0) return emptyCall(comm, sequence);
  const Clock::time_point begin = Clock::now();
  const std::vector<size_t> counts = shareCounts(r.meta, comm.size);
  const Blocks blocks = blocksFrom(counts.data(), nullptr, element, comm.size, comm.segmentBytes, comm.size);
  const Reducer reducer(r.meta.dtype, r.meta.op);
  const auto* input = static_cast<const uint8_t*>(r.input.data);
  // The ring writes partial reductions of every block: into scratch, so the
  // input stays intact (and the output may lie inside it). Slots 0 and 1 are
  // the ring's receive buffers; 2 is free, as for shoal_reduce_scatter.
  uint8_t* work = comm.scratch.get(2, total * element);
  runCollective(comm, sequence, [&](Context& context) { ringReduceScatter(context, input, work, blocks, reducer); });
  if (comm.size == 1) std::memcpy(work, input, total * element);
  uint8_t* mine = work + blocks.offset[comm.rank];
  reducer.finish(mine, counts[comm.rank], comm.size);
  if (counts[comm.rank] > 0) std::memcpy(r.output.data, mine, counts[comm.rank] * element);
  if (timeline != nullptr)
    timeline->span(r.name, "REDUCESCATTER", begin, Clock::now(), fmt::format("\"bytes\": {}", total * element));
}

}  // namespace shoal::runtime
