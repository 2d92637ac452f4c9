// Fuzzes topk's decode (round 1): the gathered (index, value) pairs of every
// rank, and with header byte 3's top bit the gathered counts too, are replaced
// by fuzzer bytes after an honest round 0 (header: k, count, world size and
// dtype, counts mode; see fuzz_common.h).
#include "fuzz_common.h"

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  using namespace shoal::fuzz;
  if (size < 4) return 0;
  const std::string k = std::to_string(1 + data[0] % 8);
  const size_t count = 1 + size_t(data[1]);
  const int world = 2 + data[2] % 3;
  const shoal_dtype_t dtype = data[2] & 0x80 ? SHOAL_F64 : SHOAL_F32;
  const bool fuzzCounts = (data[3] & 0x80) != 0;
  PayloadFeeder feeder(data, size, 4);
  Lockstep run(shoal::compressors::topk(), world);
  if (run.create({{"k", k}, {"ef", "0"}}) != SHOAL_OK) return 0;
  if (run.start({{dtype, {int64_t(count)}, ""}, {dtype, {2, 5}, ""}}, SHOAL_AVG, 0, [&](int r, int t, void* x) {
        const size_t n = t == 0 ? count : 10;
        for (size_t i = 0; i < n; ++i) {
          const float v = seededValue(data[3], r, i + size_t(t) * 1000, 20, true);
          if (dtype == SHOAL_F32) static_cast<float*>(x)[i] = v;
          else static_cast<double*>(x)[i] = v;
        }
      }) != SHOAL_OK)
    return 0;
  const shoal_status_t status = run.run([&](Delivered& d) {
    if (fuzzCounts && !feeder.recording())
      for (size_t& c : d.counts) c = feeder.byte();  // up to 255 words a rank: the driver sizes the gather from them
    feeder.feed(d.bytes);
  });
  requireText(run, status);
  return 0;
}
