// The tcp store's wire format, shared by its server and client (and fed raw
// bytes by tests/fuzz/fuzz_store_wire.cc).
//
// Every message is a frame: a little-endian u32 body length, then the body.
// Requests start with an op byte, replies with a status byte; strings and byte
// strings are a u32 length and the bytes. The first request of a connection is
// HELLO (magic, version, rank, job token); the server refuses a wrong token and
// closes. GET and WAIT carry how long the server may hold them (at most
// kWaitSlice): it answers as soon as the keys exist, or NOT_YET when that time
// is up and the client asks again. So no reply is ever outstanding for long,
// and every client read is bounded by poll() timeouts.
#pragma once

#include <chrono>
#include <cstdint>
#include <optional>
#include <string>
#include <string_view>
#include <vector>

#include "bootstrap/store.h"

namespace shoal::detail::tcp {

using namespace std::chrono_literals;

constexpr uint32_t kMagic = 0x4c4f4853;     // "SHOL": tells a shoal store from another service on the port
constexpr uint8_t kVersion = 1;
constexpr uint32_t kMaxHello = 4096;        // a peer that has not shown the token gets little buffer
constexpr uint32_t kMaxMessage = 256u << 20;
constexpr uint32_t kMaxHeldMs = 60000;      // the longest a server holds a GET/WAIT, whatever the client asks
constexpr auto kWaitSlice = 500ms;          // the longest a client asks the server to hold one GET or WAIT
constexpr auto kReplyGrace = 250ms;         // network slack on top of a server-side wait

enum Op : uint8_t { kHello = 1, kSet = 2, kGet = 3, kWait = 4, kAdd = 5 };
enum Status : uint8_t { kOk = 0, kNotYet = 1, kRefused = 2, kBadRequest = 3 };

class Writer {
 public:
  // Room for the frame length. (Reserving first also quiets a GCC 12 -Warray-bounds false positive.)
  Writer() {
    buf_.reserve(64);
    buf_.resize(4);
  }
  Writer& u8(uint8_t v) { buf_.push_back(v); return *this; }
  Writer& u32(uint32_t v) { return le(v, 4); }
  Writer& u64(uint64_t v) { return le(v, 8); }
  Writer& str(std::string_view s) { return blob(s.begin(), s.end()); }
  Writer& bytes(const Bytes& b) { return blob(b.begin(), b.end()); }
  Bytes frame();

 private:
  Writer& le(uint64_t v, int n) {
    for (int i = 0; i < n; ++i) buf_.push_back(static_cast<uint8_t>(v >> (8 * i)));
    return *this;
  }
  template <typename It>
  Writer& blob(It begin, It end) {
    u32(static_cast<uint32_t>(end - begin));
    buf_.insert(buf_.end(), begin, end);
    return *this;
  }
  Bytes buf_;
};

// Reads past the end set ok() false instead of throwing, so callers check once.
class Reader {
 public:
  Reader(const uint8_t* data, size_t size) : p_(data), n_(size) {}
  explicit Reader(const Bytes& b) : Reader(b.data(), b.size()) {}
  bool ok() const { return ok_; }
  bool done() const { return ok_ && n_ == 0; }
  uint8_t u8();
  uint32_t u32() { return static_cast<uint32_t>(le(4)); }
  uint64_t u64() { return le(8); }
  std::string str();
  Bytes bytes();

 private:
  const uint8_t* take(size_t k);
  uint64_t le(int k);
  const uint8_t* p_;
  size_t n_;
  bool ok_ = true;
};

// Where the next frame of a byte stream stands: incomplete (read more), complete
// (bodyLength bytes follow the 4-byte header), or longer than maxBody (drop the peer).
enum class FrameScan { kIncomplete, kComplete, kTooLarge };
FrameScan scanFrame(const uint8_t* data, size_t size, uint32_t maxBody, uint32_t& bodyLength);

// One request, as the server reads it.
struct Request {
  Op op = kHello;
  // HELLO
  uint32_t magic = 0;
  uint8_t version = 0;
  uint32_t rank = 0;
  std::string token;
  // SET, GET (one key), WAIT (keys), ADD
  std::vector<std::string> keys;
  Bytes value;
  uint32_t waitMs = 0;
  int64_t delta = 0;
};

// Decodes a frame body; nullopt when it is malformed (unknown op, short,
// trailing bytes). Before the handshake only HELLO is accepted. A WAIT's key
// count is checked against the bytes present before anything is allocated.
std::optional<Request> decodeRequest(const uint8_t* body, size_t size, bool beforeHello);

// One reply, as the client reads it, to a request of type op.
struct Reply {
  Status status = kOk;
  Bytes value;                       // GET: the value
  std::vector<std::string> missing;  // GET/WAIT NOT_YET: the keys still missing (WAIT only)
  int64_t sum = 0;                   // ADD: the new value
  std::string text;                  // REFUSED / BAD_REQUEST: the server's reason
};

// nullopt when the body is not a well-formed reply to op.
std::optional<Reply> decodeReply(Op op, const uint8_t* body, size_t size);

}  // namespace shoal::detail::tcp
