#include "runtime/request.h"

#include <cstring>

#include <fmt/format.h>
#include <fmt/ranges.h>

#include "collectives/common/reducer.h"

namespace shoal::runtime {

const char* opKindName(OpKind kind) {
  switch (kind) {
    case OpKind::Allreduce: return "allreduce";
    case OpKind::Allgather: return "allgather";
    case OpKind::Broadcast: return "broadcast";
    case OpKind::Blocking: return "blocking call";
    case OpKind::Join: return "join";
    case OpKind::Alltoall: return "alltoall";
    case OpKind::Alltoallv: return "alltoallv";
    case OpKind::ReduceScatter: return "reduce-scatter";
  }
  return "invalid";
}

const char* memoryName(shoal_memory_t memory) { return memory == SHOAL_MEMORY_CUDA ? "CUDA memory" : "host memory"; }

size_t Metadata::elements() const {
  size_t count = 1;
  for (int64_t extent : shape) count *= static_cast<size_t>(extent);
  return count;
}

size_t Metadata::bytes() const { return elements() * dtypeSize(dtype); }

std::string Metadata::describe() const {
  if (kind == OpKind::Blocking) return fmt::format("blocking call {}", call);
  std::string text = fmt::format("{} {} [{}]", opKindName(kind), shoal_dtype_name(dtype), fmt::join(shape, ", "));
  if (kind == OpKind::Allreduce)
    text += fmt::format(" op {} compressor {}{}", shoal_op_name(op), compressor,
                        options.empty() ? "" : " (" + options + ")");
  if (kind == OpKind::ReduceScatter) text += fmt::format(" op {}", shoal_op_name(op));
  if (kind == OpKind::Broadcast) text += fmt::format(" root {}", root);
  if (memory != SHOAL_MEMORY_HOST) text += fmt::format(" in {}", memoryName(memory));
  return text;
}

std::string differences(const Metadata& a, const Metadata& b) {
  std::vector<std::string> parts;
  if (a.kind != b.kind) parts.push_back(fmt::format("collective {} vs {}", opKindName(a.kind), opKindName(b.kind)));
  if (a.call != b.call) parts.push_back(fmt::format("call {} vs {}", a.call, b.call));
  if (a.dtype != b.dtype)
    parts.push_back(fmt::format("dtype {} vs {}", shoal_dtype_name(a.dtype), shoal_dtype_name(b.dtype)));
  if (a.shape != b.shape) parts.push_back(fmt::format("shape [{}] vs [{}]", fmt::join(a.shape, ", "), fmt::join(b.shape, ", ")));
  if (a.op != b.op) parts.push_back(fmt::format("op {} vs {}", shoal_op_name(a.op), shoal_op_name(b.op)));
  if (a.root != b.root) parts.push_back(fmt::format("root {} vs {}", a.root, b.root));
  if (a.memory != b.memory)
    parts.push_back(fmt::format("memory {} vs {}", memoryName(a.memory), memoryName(b.memory)));
  if (a.compressor != b.compressor) parts.push_back(fmt::format("compressor {} vs {}", a.compressor, b.compressor));
  if (a.options != b.options) parts.push_back(fmt::format("compressor options '{}' vs '{}'", a.options, b.options));
  if (a.minBytes != b.minBytes) parts.push_back(fmt::format("compress_min_bytes {} vs {}", a.minBytes, b.minBytes));
  return fmt::format("{}", fmt::join(parts, "; "));
}

void appendU64(std::string& out, uint64_t value) { out.append(reinterpret_cast<const char*>(&value), sizeof value); }

uint64_t readU64(const uint8_t*& cursor, const uint8_t* end) {
  if (end - cursor < static_cast<ptrdiff_t>(sizeof(uint64_t)))
    fail(SHOAL_ERR_INTERNAL, "async runtime: a negotiation message is truncated");
  uint64_t value;
  std::memcpy(&value, cursor, sizeof value);
  cursor += sizeof value;
  return value;
}

void appendString(std::string& out, const std::string& text) {
  appendU64(out, text.size());
  out += text;
}

std::string readString(const uint8_t*& cursor, const uint8_t* end) {
  uint64_t length = readU64(cursor, end);
  if (static_cast<uint64_t>(end - cursor) < length)
    fail(SHOAL_ERR_INTERNAL, "async runtime: a negotiation message is truncated");
  std::string text(reinterpret_cast<const char*>(cursor), length);
  cursor += length;
  return text;
}

void appendMetadata(std::string& out, const Metadata& meta) {
  appendU64(out, static_cast<uint64_t>(meta.kind));
  appendU64(out, static_cast<uint64_t>(meta.dtype));
  appendU64(out, static_cast<uint64_t>(meta.op));
  appendU64(out, static_cast<uint64_t>(static_cast<int64_t>(meta.root)));
  appendU64(out, static_cast<uint64_t>(meta.memory));
  appendU64(out, meta.shape.size());
  for (int64_t extent : meta.shape) appendU64(out, static_cast<uint64_t>(extent));
  appendString(out, meta.compressor);
  appendString(out, meta.options);
  appendU64(out, static_cast<uint64_t>(meta.minBytes));
  appendString(out, meta.call);
}

Metadata readMetadata(const uint8_t*& cursor, const uint8_t* end) {
  Metadata meta;
  meta.kind = static_cast<OpKind>(readU64(cursor, end));
  meta.dtype = static_cast<shoal_dtype_t>(readU64(cursor, end));
  meta.op = static_cast<shoal_op_t>(readU64(cursor, end));
  meta.root = static_cast<int>(static_cast<int64_t>(readU64(cursor, end)));
  const uint64_t memory = readU64(cursor, end);
  if (memory != SHOAL_MEMORY_HOST && memory != SHOAL_MEMORY_CUDA)
    fail(SHOAL_ERR_INTERNAL, "async runtime: a negotiation message is corrupt");
  meta.memory = static_cast<shoal_memory_t>(memory);
  uint64_t dims = readU64(cursor, end);
  if (dims > SHOAL_MAX_DIMS) fail(SHOAL_ERR_INTERNAL, "async runtime: a negotiation message is corrupt");
  for (uint64_t d = 0; d < dims; ++d) meta.shape.push_back(static_cast<int64_t>(readU64(cursor, end)));
  meta.compressor = readString(cursor, end);
  meta.options = readString(cursor, end);
  meta.minBytes = static_cast<long long>(readU64(cursor, end));
  meta.call = readString(cursor, end);
  return meta;
}

bool Request::tryStart() {
  std::lock_guard<std::mutex> lock(mutex_);
  if (state_ != RequestState::Queued) return false;
  state_ = RequestState::Running;
  return true;
}

bool Request::tryCancel() {
  std::lock_guard<std::mutex> lock(mutex_);
  if (state_ != RequestState::Queued) return false;
  state_ = RequestState::Cancelled;
  return true;
}

void Request::complete(shoal_status_t status, const std::string& error) {
  {
    std::lock_guard<std::mutex> lock(mutex_);
    if (state_ == RequestState::Done) return;
    state_ = RequestState::Done;
    status_ = status;
    error_ = error;
  }
  cv_.notify_all();
}

bool Request::waitUntil(Deadline deadline) {
  std::unique_lock<std::mutex> lock(mutex_);
  return cv_.wait_until(lock, deadline, [&] { return state_ == RequestState::Done; });
}

bool Request::done() {
  std::lock_guard<std::mutex> lock(mutex_);
  return state_ == RequestState::Done;
}

shoal_status_t Request::status() {
  std::lock_guard<std::mutex> lock(mutex_);
  return status_;
}

std::string Request::error() {
  std::lock_guard<std::mutex> lock(mutex_);
  return error_;
}

}  // namespace shoal::runtime
