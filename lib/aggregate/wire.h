// The wire format between shoal ranks and shoal-aggd (docs/aggregation.md).
//
// A connection opens with one HELLO frame (u32 length, then magic, version,
// job token, communicator key, rank, world size) and one reply frame (status,
// slot size, text). After that both directions carry messages of a fixed
// 32-byte header and `bytes` bytes of body: ranks send SLOTs (a slot of their
// payload, with the 64-bit digest of the call's signature, comm/agree.h), the
// aggregator answers each completed slot with a RESULT (the sum of every
// rank's slot) or an ERROR (its body is text that says what happened; its kind
// says whether the ranks disagreed on the call).
// Every integer is little-endian.
#pragma once

#include <cstddef>
#include <cstdint>
#include <string>

#include "shoal/shoal.h"

namespace shoal::aggregate {

constexpr uint32_t kMagic = 0x47414853;  // "SHAG": tells shoal-aggd from another service on the port
constexpr uint8_t kVersion = 2;  // 2: slots carry the call's signature, errors their kind
constexpr uint32_t kMaxHello = 4096;     // a peer that has not shown the token gets little buffer
constexpr uint32_t kMaxSlotBytes = 64u << 20;
constexpr uint32_t kMaxErrorText = 4096;

// kRefusedDisagreement: the communicator already failed here because its
// ranks disagreed on a call (the rank reports SHOAL_ERR_MISMATCH too).
enum HelloStatus : uint8_t { kAccepted = 0, kRefused = 1, kRefusedDisagreement = 2 };
enum MessageType : uint8_t { kSlot = 1, kResult = 2, kError = 3 };
// What an ERROR reports: a failure (a rank left, a slot expired, a malformed
// message: SHOAL_ERR_REMOTE on the ranks) or ranks that disagree on a call
// (another dtype, op, count or signature: SHOAL_ERR_MISMATCH).
enum ErrorKind : uint8_t { kFailure = 0, kDisagreement = 1 };

constexpr size_t kHeaderBytes = 32;

struct Header {
  uint8_t type = 0;
  uint8_t dtype = 0;      // shoal_dtype_t of the elements
  uint8_t op = 0;         // SHOAL_SUM or SHOAL_BOR (avg travels as a sum)
  uint8_t errorKind = 0;  // ERROR only: ErrorKind
  uint32_t slot = 0;      // index of this slot within the call's share of this aggregator
  uint64_t sequence = 0;  // the communicator's call number
  uint32_t bytes = 0;     // body bytes that follow the header
  uint32_t slots = 0;     // slots of the call at this aggregator (a consistency check)
  uint64_t signature = 0; // SLOT and RESULT: CallSignature::digest() of the call (every rank's must match)
};

inline void putLE(uint8_t* p, uint64_t v, int n) {
  for (int i = 0; i < n; ++i) p[i] = static_cast<uint8_t>(v >> (8 * i));
}
inline uint64_t getLE(const uint8_t* p, int n) {
  uint64_t v = 0;
  for (int i = 0; i < n; ++i) v |= uint64_t{p[i]} << (8 * i);
  return v;
}

inline void encode(const Header& h, uint8_t* out) {
  out[0] = h.type;
  out[1] = h.dtype;
  out[2] = h.op;
  out[3] = h.errorKind;
  putLE(out + 4, h.slot, 4);
  putLE(out + 8, h.sequence, 8);
  putLE(out + 16, h.bytes, 4);
  putLE(out + 20, h.slots, 4);
  putLE(out + 24, h.signature, 8);
}

inline Header decode(const uint8_t* in) {
  Header h;
  h.type = in[0];
  h.dtype = in[1];
  h.op = in[2];
  h.errorKind = in[3];
  h.slot = static_cast<uint32_t>(getLE(in + 4, 4));
  h.sequence = getLE(in + 8, 8);
  h.bytes = static_cast<uint32_t>(getLE(in + 16, 4));
  h.slots = static_cast<uint32_t>(getLE(in + 20, 4));
  h.signature = getLE(in + 24, 8);
  return h;
}

// The (dtype, op) pairs an aggregator adds without knowing what they encode:
// wrapping integer sums, bitwise OR of integers, and f16/bf16/f32/f64 sums.
inline bool aggregatable(shoal_dtype_t dtype, shoal_op_t op) {
  bool integer = dtype == SHOAL_I8 || dtype == SHOAL_U8 || dtype == SHOAL_I32 || dtype == SHOAL_U32 ||
                 dtype == SHOAL_I64 || dtype == SHOAL_U64;
  bool floating = dtype == SHOAL_F16 || dtype == SHOAL_BF16 || dtype == SHOAL_F32 || dtype == SHOAL_F64;
  if (op == SHOAL_SUM) return integer || floating;
  if (op == SHOAL_BOR) return integer;
  return false;
}

}  // namespace shoal::aggregate
