// Array conversions between 16-bit floats and f32, vectorised: F16C/AVX2 on
// x86 CPUs that have it (chosen at run time), else the portable per-element
// code of element_ops.h. Both round to nearest even, so the results match bit
// for bit except NaN payloads (always NaN either way).
#pragma once

#include <cstddef>
#include <cstdint>

namespace shoal::ops {

void halfToFloat(const uint16_t* in, float* out, size_t count);
void floatToHalf(const float* in, uint16_t* out, size_t count);
void bfloat16ToFloat(const uint16_t* in, float* out, size_t count);
void floatToBfloat16(const float* in, uint16_t* out, size_t count);

}  // namespace shoal::ops
