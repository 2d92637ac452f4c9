// Fuzzes the fp16/bf16 cast compressors' decode: the summed 16-bit payload of
// round 0 is replaced by fuzzer bytes (header: format, dtype, count; see
// fuzz_common.h), decoded into f32 or f64 outputs.
#include "fuzz_common.h"

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  using namespace shoal::fuzz;
  if (size < 4) return 0;
  const shoal_compressor_t* table = data[0] & 1 ? shoal::compressors::bf16() : shoal::compressors::fp16();
  const shoal_dtype_t dtype = data[0] & 2 ? SHOAL_F64 : SHOAL_F32;
  const size_t count = 1 + size_t(data[1]) * 2;
  const int world = 2 + data[2] % 3;
  PayloadFeeder feeder(data, size, 4);
  Lockstep run(table, world);
  if (run.create({}) != SHOAL_OK) return 0;
  if (run.start({{dtype, {int64_t(count)}, ""}}, data[3] & 1 ? SHOAL_AVG : SHOAL_SUM, 0, [&](int r, int, void* x) {
        for (size_t i = 0; i < count; ++i) {
          const float v = seededValue(data[3], r, i, 12, true);
          if (dtype == SHOAL_F32) static_cast<float*>(x)[i] = v;
          else static_cast<double*>(x)[i] = v;
        }
      }) != SHOAL_OK)
    return 0;
  const shoal_status_t status = run.run([&](Delivered& d) { feeder.feed(d.bytes); });
  requireText(run, status);
  return 0;
}
