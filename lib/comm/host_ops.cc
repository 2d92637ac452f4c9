#include "comm/host_ops.h"

#include <chrono>
#include <cstring>
#include <string>
#include <string_view>
#include <thread>

#include "aggregate/client.h"
#include "comm/call.h"
#include "comm/hosts.h"
#include "core/config.h"
#include "core/log.h"

namespace shoal {
namespace {

// How often a rank waiting on the aggregator looks for a peer in another call.
constexpr auto kOtherCallProbePeriod = std::chrono::milliseconds(20);

}  // namespace

const char* plainAllreduce(shoal_comm& comm, uint64_t sequence, const void* send, void* recv, size_t count,
                           shoal_dtype_t dtype, shoal_op_t op) {
  const AllreduceAlgorithm& algorithm = chooseAllreduce(comm, count * dtypeSize(dtype));
  return plainAllreduce(comm, sequence, algorithm, send, recv, count, dtype, op);
}

const char* plainAllreduce(shoal_comm& comm, uint64_t sequence, const AllreduceAlgorithm& algorithm, const void* send,
                           void* recv, size_t count, shoal_dtype_t dtype, shoal_op_t op) {
  const size_t bytes = count * dtypeSize(dtype);
  Reducer reducer(dtype, op);
  if (count == 0) {
    emptyCall(comm, sequence);
    return algorithm.name;
  }
  if (comm.allreduceChoice.aggregate && aggregate::carries(dtype, op)) {  // else the ring (algos.cc)
    aggregateAllreduce(comm, sequence, send, recv, count, dtype, op);
    return "aggregate";
  }
  runCollective(comm, sequence, [&](Context& context) {
    if (algorithm.run == allreduceRing) {  // the ring reads send directly: no copy
      allreduceRingOutOfPlace(context, send, recv, count, reducer);
    } else if (algorithm.run == allreduceShm) {  // so does the shared segment (send goes into this rank's slot)
      allreduceShmOutOfPlace(context, send, recv, count, reducer);
    } else {
      if (send != recv) std::memcpy(recv, send, bytes);
      algorithm.run(context, recv, count, reducer);
    }
  });
  return algorithm.name;
}

namespace {

// gatherCounts and allgathervBytes over `transport` (the communicator's, or
// a view of some of its ranks): ranks and counts are the transport's.
size_t gatherCountsOn(shoal_comm& comm, Transport& transport, size_t count, std::vector<size_t>& counts,
                      std::vector<size_t>& displs) {
  const int size = transport.size();
  counts.assign(size, 0);
  counts[transport.rank()] = count;
  Blocks countBlocks =
      blocksFrom(std::vector<size_t>(size, 1).data(), nullptr, sizeof(size_t), size, comm.segmentBytes, size);
  runCollectiveOn(comm, transport, takeSequence(comm), [&](Context& context) {
    ringAllgather(context, reinterpret_cast<uint8_t*>(counts.data()), countBlocks);
  });
  displs.assign(size, 0);
  size_t total = 0;
  for (int r = 0; r < size; ++r) {
    displs[r] = total;
    total += counts[r];
  }
  return total;
}

void allgathervOn(shoal_comm& comm, Transport& transport, const void* send, size_t count, shoal_dtype_t dtype,
                  std::vector<uint8_t>& gathered, std::vector<size_t>& counts, std::vector<size_t>& displs) {
  const size_t element = dtypeSize(dtype);
  // First every rank's count, then the data.
  const size_t total = gatherCountsOn(comm, transport, count, counts, displs);
  gathered.resize(total * element);
  if (count > 0) std::memcpy(gathered.data() + displs[transport.rank()] * element, send, count * element);
  const uint64_t sequence = takeSequence(comm);
  const int size = transport.size();
  runCollectiveOn(comm, transport, sequence, [&](Context& context) {
    if (total == 0) {  // nothing to move, but the ranks still meet (emptyCall)
      uint8_t unused = 0;
      return allreduceTree(context, &unused, 0, Reducer(SHOAL_U8, SHOAL_SUM));
    }
    Blocks blocks = blocksFrom(counts.data(), displs.data(), element, size, comm.segmentBytes, size);
    ringAllgather(context, gathered.data(), blocks);
  });
}

}  // namespace

size_t gatherCounts(shoal_comm& comm, size_t count, std::vector<size_t>& counts, std::vector<size_t>& displs) {
  return gatherCountsOn(comm, *comm.transport, count, counts, displs);
}

void allgathervBytes(shoal_comm& comm, const void* send, size_t count, shoal_dtype_t dtype,
                     std::vector<uint8_t>& gathered, std::vector<size_t>& counts, std::vector<size_t>& displs) {
  allgathervOn(comm, *comm.transport, send, count, dtype, gathered, counts, displs);
}

void groupAllreduce(shoal_comm& comm, Transport& group, void* buffer, size_t count, shoal_dtype_t dtype,
                    shoal_op_t op) {
  const uint64_t sequence = takeSequence(comm);
  // The flat algorithm SHOAL_ALGO names, else the one auto picks for the group's size.
  const bool flat = comm.algorithm == "ring" || comm.algorithm == "tree" || comm.algorithm == "doubling";
  const AllreduceAlgorithm& algorithm =
      selectAllreduce(flat ? comm.algorithm : "auto", count * dtypeSize(dtype), group.size(), comm.treeMaxBytes);
  Reducer reducer(dtype, op);
  runCollectiveOn(comm, group, sequence, [&](Context& context) {
    if (count == 0) {
      uint8_t unused = 0;
      return allreduceTree(context, &unused, 0, Reducer(SHOAL_U8, SHOAL_SUM));
    }
    algorithm.run(context, buffer, count, reducer);
  });
}

void groupAllgatherv(shoal_comm& comm, Transport& group, const void* send, size_t count, shoal_dtype_t dtype,
                     std::vector<uint8_t>& gathered, std::vector<size_t>& counts, std::vector<size_t>& displs) {
  allgathervOn(comm, group, send, count, dtype, gathered, counts, displs);
}

void aggregateAllreduce(shoal_comm& comm, uint64_t sequence, const void* send, void* recv, size_t count, shoal_dtype_t dtype,
               shoal_op_t op) {
  runCollective(comm, sequence, [&](Context& context) {
    if (!comm.aggregator) {
      std::string list = config::getString("SHOAL_AGGREGATOR");
      if (list.empty())
        fail(SHOAL_ERR_INVALID_ARGUMENT, "SHOAL_ALGO=aggregate needs SHOAL_AGGREGATOR=tcp://host:port[,tcp://host:port"
             "...] naming running shoal-aggd aggregators");
      std::vector<aggregate::Endpoint> endpoints = aggregate::parseEndpoints(list, "SHOAL_AGGREGATOR");
      // The aggregator tells communicators apart by a key the ranks share:
      // a nonce rank 0 draws for this communicator, plus its store prefix.
      std::string nonceKey = comm.keyPrefix + "aggregate/nonce";
      std::string nonce;
      if (comm.rank == 0) {
        nonce = aggregate::randomNonce();
        comm.store->set(nonceKey, Bytes(nonce.begin(), nonce.end()));
      } else {
        Bytes value = comm.store->get(nonceKey, context.deadline);
        nonce.assign(value.begin(), value.end());
      }
      comm.aggregator.reset(new aggregate::Client(endpoints, config::getString("SHOAL_TOKEN"), nonce + "/" + comm.keyPrefix,
                                       comm.rank, comm.size, context.deadline));
      SHOAL_LOG_INFO("SHOAL_ALGO=aggregate: rank {} connected to {} aggregator(s): {}", comm.rank, endpoints.size(),
                     list);
    }
    // A rank whose call went elsewhere (an op the aggregator cannot add takes
    // the ring) sends its messages over the transport, where they wait with
    // another signature: probe for them now and then, as a shared-memory wait
    // does, so that both sides fail with MISMATCH instead of at the deadline.
    Clock::time_point nextProbe = Clock::now() + kOtherCallProbePeriod;
    auto checkPeers = [&] {
      comm.transport->checkNotAborted();
      if (Clock::now() < nextProbe) return;
      nextProbe = Clock::now() + kOtherCallProbePeriod;
      comm.transport->checkForMessagesOf(context.tagBase);
    };
    // The aggregator compares every rank's signature, slot by slot: a dtype
    // of the same size or avg against sum (both travel as sums) is MISMATCH.
    shoal_op_t wireOp = op == SHOAL_AVG ? SHOAL_SUM : op;
    try {
      comm.aggregator->allreduce(sequence, comm.call.digest(), send, recv, count, dtype, wireOp, context.deadline,
                                 checkPeers);
    } catch (const Error& error) {
      // A peer that gave up on this call (it found a peer in another call)
      // closes its communicator and leaves the aggregator, whose word of that
      // can overtake the peer's abort notice, which says why: wait a moment
      // for the notice (checkNotAborted throws it).
      if (error.status() != SHOAL_ERR_MISMATCH) {
        const Deadline grace = deadlineAfter(kAbortNoticeGraceS);
        while (Clock::now() < grace) {
          comm.transport->checkNotAborted();
          std::this_thread::sleep_for(std::chrono::milliseconds(1));
        }
        throw;
      }
      // The aggregator's text names the ranks; add what this rank called.
      const bool named = std::string_view(error.what()).find("This rank's call") != std::string_view::npos;
      if (error.status() != SHOAL_ERR_MISMATCH || named) throw;
      throw Error(SHOAL_ERR_MISMATCH, fmt::format("{}. This rank's call: {}", error.what(), comm.call.describe()));
    }
    if (op == SHOAL_AVG) Reducer(dtype, op).finish(recv, count, comm.size);
  });
}

}  // namespace shoal
