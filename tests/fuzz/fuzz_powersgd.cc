// Fuzzes PowerSGD's decode: the summed P factors (round 0) or Q factors
// (round 1), header byte 3 picks which, are replaced by fuzzer bytes (any
// f32 bits: NaN, Inf, huge) after an honest start (header: rank, rows, cols;
// see fuzz_common.h). Two tensors, one compressed and one riding densely.
#include "fuzz_common.h"

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  using namespace shoal::fuzz;
  if (size < 4) return 0;
  const std::string rank = std::to_string(1 + data[0] % 4);
  const int64_t rows = 2 + data[1] % 40, cols = 2 + data[2] % 40;
  const int target = data[3] % 2;
  PayloadFeeder feeder(data, size, 4);
  Lockstep run(shoal::compressors::powersgd(), 2);
  if (run.create({{"rank", rank}, {"start_iter", "0"}}) != SHOAL_OK) return 0;
  if (run.start({{SHOAL_F32, {rows, cols}, "m"}, {SHOAL_F32, {7}, "bias"}}, SHOAL_AVG, 0, [&](int r, int t, void* x) {
        const size_t n = t == 0 ? size_t(rows * cols) : 7;
        for (size_t i = 0; i < n; ++i) static_cast<float*>(x)[i] = seededValue(data[3], r, i, 10, false);
      }) != SHOAL_OK)
    return 0;
  const shoal_status_t status = run.run([&](Delivered& d) {
    if (d.round == target) feeder.feed(d.bytes);
  });
  requireText(run, status);
  return 0;
}
