// Asking the driver for one collective in the next round: the step every
// single-payload compressor round ends with.
#pragma once

#include <cstddef>

#include "shoal/compressor.h"

namespace shoal::compressors {

inline void requestOnePayload(shoal_round_t* round, shoal_collective_t collective, shoal_dtype_t dtype,
                              shoal_op_t op, void* buffer, size_t count) {
  round->num_payloads = 1;
  shoal_payload_t& payload = round->payloads[0];
  payload = shoal_payload_t{};
  payload.collective = collective;
  payload.dtype = dtype;
  payload.op = op;
  payload.buffer = buffer;
  payload.count = count;
}

}  // namespace shoal::compressors
