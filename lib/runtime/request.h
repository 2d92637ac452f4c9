// A request of the async runtime: what a rank submitted under a name, the
// metadata every rank must agree on for that name, and its completion.
#pragma once

#include <condition_variable>
#include <cstdint>
#include <functional>
#include <memory>
#include <mutex>
#include <string>
#include <vector>

#include "core/error.h"
#include "shoal/shoal.h"

namespace shoal::runtime {

enum class OpKind : uint8_t { Allreduce = 0, Allgather = 1, Broadcast = 2, Blocking = 3, Join = 4, Alltoall = 5,
                              Alltoallv = 6, ReduceScatter = 7 };
const char* opKindName(OpKind kind);
const char* memoryName(shoal_memory_t memory);  // "host memory", "CUDA memory"

// The name under which blocking calls travel through the engine once it runs
// (one at a time per rank, so one name suffices and stays cached).
inline constexpr const char* kBlockingName = "__shoal_blocking_call";
// The name of a rank's shoal_join (one at a time per rank); see runtime/join.h.
inline constexpr const char* kJoinName = "__shoal_join";

// What every rank must submit identically for one name. Compressor settings
// are resolved from the environment at submission.
struct Metadata {
  OpKind kind = OpKind::Allreduce;
  shoal_dtype_t dtype = SHOAL_F32;
  shoal_op_t op = SHOAL_SUM;     // allreduce, reduce-scatter
  int root = -1;                 // broadcast only
  // Where the tensors live: CUDA requests never fuse with host ones and run
  // through the CUDA path (runtime/cuda_requests.h). The device ordinal is
  // each rank's own business, not agreed.
  shoal_memory_t memory = SHOAL_MEMORY_HOST;
  std::vector<int64_t> shape;    // reduce-scatter: the input's (every rank's output is its share of dim 0)
  std::string compressor;        // allreduce: "none" = uncompressed
  std::string options;
  long long minBytes = 0;
  std::string call;              // blocking calls: the C entry point

  bool operator==(const Metadata&) const = default;
  size_t elements() const;
  size_t bytes() const;
  std::string describe() const;  // "allreduce float [3, 4] sum compressor fp16"
};

// Which fields of a and b differ, e.g. "shape [3, 4] vs [4, 4]; dtype float vs half".
std::string differences(const Metadata& a, const Metadata& b);

// A compact byte encoding, for the negotiation's allgatherv.
void appendMetadata(std::string& out, const Metadata& meta);
Metadata readMetadata(const uint8_t*& cursor, const uint8_t* end);
// Little helpers of the encoding, shared with negotiation.cc.
void appendString(std::string& out, const std::string& text);
std::string readString(const uint8_t*& cursor, const uint8_t* end);
void appendU64(std::string& out, uint64_t value);
uint64_t readU64(const uint8_t*& cursor, const uint8_t* end);

enum class RequestState { Queued, Running, Done, Cancelled };

struct Request {
  std::string name;
  Metadata meta;
  shoal_tensor_t input{};
  shoal_tensor_t output{};
  std::function<void()> body;    // blocking calls: the call itself, run on the engine thread
  Clock::time_point submitted = Clock::now();
  // A joined rank's stand-in for an allreduce it never submitted: its input
  // and output are standInBuffer (the op's identity); no submitter waits on it.
  bool standIn = false;
  std::vector<uint8_t> standInBuffer;
  int lastJoined = -1;           // join: the last rank to join, set before completing
  // Alltoall (runtime/alltoall.h): elements to each rank (set at submission),
  // then from each rank and the received data (set by the engine before completing).
  std::vector<size_t> sendcounts, recvcounts;
  std::vector<uint8_t> received;
  // CUDA memory (runtime/cuda_requests.h): the received data lies on the input's
  // device instead, freed with the request; receivedBytes says how much.
  std::shared_ptr<void> deviceReceived;
  size_t receivedBytes = 0;

  // Queued -> Running; false when the submitter gave up (Cancelled).
  bool tryStart();
  // Queued -> Cancelled; false when it already runs or ran.
  bool tryCancel();
  void complete(shoal_status_t status, const std::string& error);
  // True once done; false when the deadline passed first.
  bool waitUntil(Deadline deadline);
  bool done();
  shoal_status_t status();
  std::string error();

 private:
  std::mutex mutex_;
  std::condition_variable cv_;
  RequestState state_ = RequestState::Queued;
  shoal_status_t status_ = SHOAL_OK;
  std::string error_;
};

}  // namespace shoal::runtime
