#include "runtime/alltoall.h"

#include <vector>

#include <fmt/format.h>

#include "collectives/exchange.h"
#include "comm/agree.h"
#include "comm/call.h"
#include "comm/communicator.h"
#include "runtime/timeline.h"

namespace shoal::runtime {
namespace {

// Byte counts and packed offsets of per-peer element counts.
struct PeerLayout {
  std::vector<size_t> bytes, offset;
  size_t total = 0;
  PeerBlocks view() const { return {bytes.data(), offset.data()}; }
};

PeerLayout packed(const std::vector<size_t>& counts, size_t element) {
  PeerLayout blocks;
  for (size_t count : counts) {
    blocks.bytes.push_back(count * element);
    blocks.offset.push_back(blocks.total);
    blocks.total += count * element;
  }
  return blocks;
}

}  // namespace

CallSignature alltoallSignature(const Request& r, int size) {
  const bool perPeer = r.meta.kind == OpKind::Alltoallv;
  return signatureOf(perPeer ? CallKind::Alltoallv : CallKind::Alltoall, r.meta.dtype, -1,
                     perPeer ? 0 : r.meta.elements() / size, -1, "pairwise");
}

std::vector<size_t> alltoallRecvCounts(shoal_comm& comm, const Request& r) {
  if (r.meta.kind != OpKind::Alltoallv) return r.sendcounts;  // the same shape everywhere (negotiated)
  // Each rank tells each peer how much it sends it: an alltoall of one count each way.
  std::vector<uint64_t> out(r.sendcounts.begin(), r.sendcounts.end()), in(comm.size);
  const std::vector<size_t> word(comm.size, sizeof(uint64_t));
  std::vector<size_t> place(comm.size);
  for (int p = 0; p < comm.size; ++p) place[p] = p * sizeof(uint64_t);
  runCollective(comm, takeSequence(comm), [&](Context& context) {
    alltoallvPairwise(context, reinterpret_cast<const uint8_t*>(out.data()), {word.data(), place.data()},
                      reinterpret_cast<uint8_t*>(in.data()), {word.data(), place.data()});
  });
  return std::vector<size_t>(in.begin(), in.end());
}

void runAlltoall(shoal_comm& comm, Request& r, Timeline* timeline) {
  const size_t element = dtypeSize(r.meta.dtype);
  CallScope scope(comm, alltoallSignature(r, comm.size));
  const Clock::time_point begin = Clock::now();
  r.recvcounts = alltoallRecvCounts(comm, r);
  const PeerLayout send = packed(r.sendcounts, element), recv = packed(r.recvcounts, element);
  r.received.resize(recv.total);
  runCollective(comm, takeSequence(comm), [&](Context& context) {
    alltoallvPairwise(context, static_cast<const uint8_t*>(r.input.data), send.view(), r.received.data(),
                      recv.view());
  });
  if (timeline != nullptr)
    timeline->span(r.name, "ALLTOALL", begin, Clock::now(), fmt::format("\"bytes\": {}", send.total + recv.total));
}

}  // namespace shoal::runtime
