#include "runtime/join.h"

#include <fmt/format.h>

#include "collectives/common/reducer.h"

namespace shoal::runtime {

std::string whyNoStandIn(const Metadata& meta) {
  switch (meta.kind) {
    case OpKind::Allreduce:
      if (meta.memory == SHOAL_MEMORY_CUDA)  // its zeros are host memory; the others' call runs on NCCL
        return "a joined rank cannot stand in for an allreduce of CUDA tensors (it holds no device buffer for it); "
               "allreduce host tensors while ranks may have joined";
      break;
    case OpKind::Blocking:
      return "a joined rank cannot stand in for a blocking call (its peers' arguments never reach it); use the "
             "named async collectives while ranks may have joined";
    default:
      return fmt::format("a joined rank cannot stand in for {} (as in Horovod, only allreduce works with join)",
                         meta.kind == OpKind::Allgather       ? "an allgather"
                         : meta.kind == OpKind::Broadcast     ? "a broadcast"
                         : meta.kind == OpKind::ReduceScatter ? "a reduce-scatter"
                                                              : "an alltoall");
  }
  if (meta.op == SHOAL_SUM || meta.op == SHOAL_AVG || meta.op == SHOAL_BOR || meta.op == SHOAL_BXOR) return "";
  return fmt::format("a joined rank contributes zeros, which is not the identity of op {}; use sum or average "
                     "while ranks may have joined",
                     shoal_op_name(meta.op));
}

std::shared_ptr<Request> makeStandIn(const std::string& name, const Metadata& meta) {
  auto request = std::make_shared<Request>();
  request->name = name;
  request->meta = meta;
  request->standIn = true;
  request->standInBuffer.assign(meta.bytes(), 0);
  shoal_tensor_t tensor{};
  tensor.data = request->standInBuffer.data();
  tensor.dtype = meta.dtype;
  tensor.memory = SHOAL_MEMORY_HOST;
  tensor.ndim = static_cast<int>(meta.shape.size());
  for (size_t d = 0; d < meta.shape.size(); ++d) tensor.shape[d] = meta.shape[d];
  request->input = tensor;
  request->output = tensor;
  return request;
}

void JoinTracker::saw(const std::vector<int>& joined, uint64_t cycle) {
  for (int r : joined)
    if (joinedAt_[r] < 0) joinedAt_[r] = static_cast<int64_t>(cycle);
}

int JoinTracker::lastToJoin() const {
  int last = -1;
  for (int r = 0; r < static_cast<int>(joinedAt_.size()); ++r)
    if (joinedAt_[r] >= 0 && (last < 0 || joinedAt_[r] >= joinedAt_[last])) last = r;
  return last;
}

void JoinTracker::reset() {
  joinedAt_.assign(joinedAt_.size(), -1);
  error_.clear();
}

}  // namespace shoal::runtime
