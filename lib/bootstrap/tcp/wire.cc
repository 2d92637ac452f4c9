// The tcp store's frame codec (wire.h).
#include "bootstrap/tcp/wire.h"

namespace shoal::detail::tcp {

Bytes Writer::frame() {
  uint32_t n = static_cast<uint32_t>(buf_.size() - 4);
  for (int i = 0; i < 4; ++i) buf_[i] = static_cast<uint8_t>(n >> (8 * i));
  return std::move(buf_);
}

const uint8_t* Reader::take(size_t k) {
  if (!ok_ || n_ < k) {
    ok_ = false;
    return nullptr;
  }
  const uint8_t* p = p_;
  p_ += k;
  n_ -= k;
  return p;
}

uint64_t Reader::le(int k) {
  const uint8_t* p = take(k);
  uint64_t v = 0;
  for (int i = 0; p && i < k; ++i) v |= uint64_t{p[i]} << (8 * i);
  return v;
}

uint8_t Reader::u8() {
  const uint8_t* p = take(1);
  return p ? p[0] : 0;
}

std::string Reader::str() {
  uint32_t n = u32();
  const uint8_t* p = take(n);
  return p ? std::string(p, p + n) : std::string();
}

Bytes Reader::bytes() {
  uint32_t n = u32();
  const uint8_t* p = take(n);
  return p ? Bytes(p, p + n) : Bytes();
}

FrameScan scanFrame(const uint8_t* data, size_t size, uint32_t maxBody, uint32_t& bodyLength) {
  if (size < 4) return FrameScan::kIncomplete;
  bodyLength = data[0] | data[1] << 8 | data[2] << 16 | uint32_t{data[3]} << 24;
  if (bodyLength > maxBody) return FrameScan::kTooLarge;
  return size - 4 >= bodyLength ? FrameScan::kComplete : FrameScan::kIncomplete;
}

std::optional<Request> decodeRequest(const uint8_t* body, size_t size, bool beforeHello) {
  Reader r(body, size);
  Request q;
  q.op = static_cast<Op>(r.u8());
  if (beforeHello != (q.op == kHello)) return std::nullopt;
  switch (q.op) {
    case kHello:
      q.magic = r.u32();
      q.version = r.u8();
      q.rank = r.u32();
      q.token = r.str();
      break;
    case kSet:
      q.keys.push_back(r.str());
      q.value = r.bytes();
      break;
    case kGet:
      q.keys.push_back(r.str());
      q.waitMs = r.u32();
      break;
    case kWait: {
      uint32_t count = r.u32();
      // Each key takes at least its 4-byte length: a count the body cannot hold is malformed,
      // and is refused before it sizes anything.
      if (!r.ok() || count > (size - 5) / 4) return std::nullopt;
      q.keys.reserve(count);
      for (uint32_t i = 0; i < count && r.ok(); ++i) q.keys.push_back(r.str());
      q.waitMs = r.u32();
      break;
    }
    case kAdd:
      q.keys.push_back(r.str());
      q.delta = static_cast<int64_t>(r.u64());
      break;
    default:
      return std::nullopt;
  }
  if (!r.done()) return std::nullopt;
  return q;
}

std::optional<Reply> decodeReply(Op op, const uint8_t* body, size_t size) {
  Reader r(body, size);
  Reply reply;
  reply.status = static_cast<Status>(r.u8());
  if (!r.ok()) return std::nullopt;
  switch (reply.status) {
    case kOk:
      if (op == kGet) reply.value = r.bytes();
      if (op == kAdd) reply.sum = static_cast<int64_t>(r.u64());
      break;
    case kNotYet: {
      if (op != kGet && op != kWait) return std::nullopt;
      uint32_t count = r.u32();
      if (!r.ok() || count == 0 || count > (size - 5) / 4) return std::nullopt;
      reply.missing.reserve(count);
      for (uint32_t i = 0; i < count && r.ok(); ++i) reply.missing.push_back(r.str());
      break;
    }
    case kRefused:
    case kBadRequest:
      reply.text = r.str();
      break;
    default:
      return std::nullopt;
  }
  if (!r.done()) return std::nullopt;
  return reply;
}

}  // namespace shoal::detail::tcp
