// libFuzzer target: the tcp store's wire decoding (lib/bootstrap/tcp/wire.h),
// as the server reads a byte stream from a stranger on its port and as a
// client reads replies. The input is a stream of frames; the first is decoded
// as a handshake, the rest as requests after one, and every frame also as a
// reply to each op. Nothing may read out of bounds, allocate without bound, or
// accept trailing bytes; a decoded request re-encodes to the same bytes.
#include <algorithm>
#include <cstddef>
#include <cstdint>
#include <cstdlib>

#include "bootstrap/tcp/wire.h"

using namespace shoal::detail::tcp;

namespace {

// Re-encodes a decoded request; decoding is strict, so the bytes must match the frame's body.
shoal::Bytes encode(const Request& q) {
  Writer w;
  w.u8(q.op);
  switch (q.op) {
    case kHello:
      w.u32(q.magic).u8(q.version).u32(q.rank).str(q.token);
      break;
    case kSet:
      w.str(q.keys.at(0)).bytes(q.value);
      break;
    case kGet:
      w.str(q.keys.at(0)).u32(q.waitMs);
      break;
    case kWait:
      w.u32(static_cast<uint32_t>(q.keys.size()));
      for (const std::string& key : q.keys) w.str(key);
      w.u32(q.waitMs);
      break;
    case kAdd:
      w.str(q.keys.at(0)).u64(static_cast<uint64_t>(q.delta));
      break;
  }
  shoal::Bytes frame = w.frame();
  return shoal::Bytes(frame.begin() + 4, frame.end());
}

}  // namespace

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  bool beforeHello = true;
  size_t pos = 0;
  while (pos < size) {
    uint32_t length = 0;
    FrameScan scan = scanFrame(data + pos, size - pos, beforeHello ? kMaxHello : kMaxMessage, length);
    if (scan != FrameScan::kComplete) break;
    const uint8_t* body = data + pos + 4;
    if (auto request = decodeRequest(body, length, beforeHello)) {
      shoal::Bytes again = encode(*request);
      if (again.size() != length || !std::equal(again.begin(), again.end(), body)) std::abort();
      beforeHello = false;
    }
    for (Op op : {kHello, kSet, kGet, kWait, kAdd}) {
      if (auto reply = decodeReply(op, body, length)) {
        if (reply->missing.size() > length / 4) std::abort();  // every key costs its 4-byte length
      }
    }
    pos += 4 + length;
  }
  return 0;
}
