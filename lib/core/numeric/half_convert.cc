#include "core/numeric/half_convert.h"

#include <cstring>

#include "core/numeric/element_ops.h"

#if defined(__x86_64__)
#include <cpuid.h>
#include <immintrin.h>
#endif

namespace shoal::ops {
namespace {

#if defined(__x86_64__)
__attribute__((target("avx2,f16c"))) void halfToFloatF16c(const uint16_t* in, float* out, size_t count) {
  size_t i = 0;
  for (; i + 8 <= count; i += 8)
    _mm256_storeu_ps(out + i, _mm256_cvtph_ps(_mm_loadu_si128(reinterpret_cast<const __m128i*>(in + i))));
  for (; i < count; ++i) out[i] = toFloat(Half{in[i]});
}

__attribute__((target("avx2,f16c"))) void floatToHalfF16c(const float* in, uint16_t* out, size_t count) {
  size_t i = 0;
  for (; i + 8 <= count; i += 8)
    _mm_storeu_si128(reinterpret_cast<__m128i*>(out + i),
                     _mm256_cvtps_ph(_mm256_loadu_ps(in + i), _MM_FROUND_TO_NEAREST_INT | _MM_FROUND_NO_EXC));
  for (; i < count; ++i) out[i] = toHalf(in[i]).bits;
}

bool hasF16c() {
  // F16C from CPUID leaf 1 (ECX bit 29): clang 14's __builtin_cpu_supports does not know "f16c".
  static const bool supported = [] {
    unsigned a = 0, b = 0, c = 0, d = 0;
    return __get_cpuid(1, &a, &b, &c, &d) && (c & bit_F16C) != 0 && __builtin_cpu_supports("avx2");
  }();
  return supported;
}
#endif

}  // namespace

void halfToFloat(const uint16_t* in, float* out, size_t count) {
#if defined(__x86_64__)
  if (hasF16c()) return halfToFloatF16c(in, out, count);
#endif
  for (size_t i = 0; i < count; ++i) out[i] = toFloat(Half{in[i]});
}

void floatToHalf(const float* in, uint16_t* out, size_t count) {
#if defined(__x86_64__)
  if (hasF16c()) return floatToHalfF16c(in, out, count);
#endif
  for (size_t i = 0; i < count; ++i) out[i] = toHalf(in[i]).bits;
}

void bfloat16ToFloat(const uint16_t* in, float* out, size_t count) {
  // A shift: plain integer code the compiler vectorises.
  uint32_t* bits = reinterpret_cast<uint32_t*>(out);
  for (size_t i = 0; i < count; ++i) bits[i] = uint32_t(in[i]) << 16;
}

void floatToBfloat16(const float* in, uint16_t* out, size_t count) {
  const uint32_t* bits = reinterpret_cast<const uint32_t*>(in);
  for (size_t i = 0; i < count; ++i) {
    uint32_t u = bits[i];
    uint32_t rounded = u + 0x7fffu + ((u >> 16) & 1u);
    bool nan = (u & 0x7fffffffu) > 0x7f800000u;
    out[i] = nan ? uint16_t((u >> 16) | 0x40u) : uint16_t(rounded >> 16);
  }
}

}  // namespace shoal::ops
