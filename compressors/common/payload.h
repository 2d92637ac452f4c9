// Asking the driver for collectives in the next round: one payload set up
// (what a round with several payloads does per payload), or a round of one
// payload (the step every single-payload compressor round ends with).
#pragma once

#include <cstddef>

#include "shoal/compressor.h"

namespace shoal::compressors {

// Clears the payload and sets what the driver needs to run it (op: allreduce only).
inline void setPayload(shoal_payload_t& payload, shoal_collective_t collective, shoal_dtype_t dtype, shoal_op_t op,
                       void* buffer, size_t count) {
  payload = shoal_payload_t{};
  payload.collective = collective;
  payload.dtype = dtype;
  payload.op = op;
  payload.buffer = buffer;
  payload.count = count;
}

// The same for an allreduce payload (a round of several, as the sketch's).
inline void setAllreducePayload(shoal_payload_t& payload, shoal_dtype_t dtype, shoal_op_t op, void* buffer,
                                size_t count) {
  setPayload(payload, SHOAL_COLLECTIVE_ALLREDUCE, dtype, op, buffer, count);
}

// The operation's last round: every output is written, no collective follows.
inline shoal_status_t roundsDone(shoal_round_t* round) {
  round->num_payloads = 0;
  round->done = 1;
  return SHOAL_OK;
}

// A round of one payload (the step every single-payload compressor round ends with).
inline void requestOnePayload(shoal_round_t* round, shoal_collective_t collective, shoal_dtype_t dtype,
                              shoal_op_t op, void* buffer, size_t count) {
  round->num_payloads = 1;
  setPayload(round->payloads[0], collective, dtype, op, buffer, count);
}

}  // namespace shoal::compressors
