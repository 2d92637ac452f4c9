// Checks of peers' data that the sketch's CUDA kernels make on the device
// (sketch.cu) and report through a flag word the host reads back after the
// kernels (sketch_device.cc), as the CPU path refuses the same payloads
// (sketch.cc, readIndex and coversLocal). Plain functions, __host__ __device__
// under nvcc, so a CPU test runs exactly the logic the kernels run.
#pragma once

#include <cstddef>
#include <cstdint>

#include "compressors/sketch/sketch_math.h"

namespace shoal::sketch {

// Bits of the device flag word; any set bit refuses the payload on that rank.
enum DeviceCheckFlag : unsigned {
  kFlagIndexPastCount = 1u,   // the ORed bitmap names coordinates >= count
  kFlagOutsideScale = 2u,     // a local value below 2^Q or beyond K limbs: the agreed scale does not cover it
};

// Whether the last word of a `count`-coordinate bitmap has bits past count.
SHOAL_HD inline bool indexBitsPastCount(uint64_t lastWord, size_t count) {
  const unsigned tail = static_cast<unsigned>(count % 64);
  return tail != 0 && (lastWord >> tail) != 0;
}

// Whether a finite x fits the agreed scale (lowest bit >= 2^Q, both limbs
// inside K limbs of L bits). Always true for a scale every rank's statistics
// produced (the MAX of the statistics covers each rank's values); false means
// the reduced statistics were corrupted, and x would otherwise be dropped.
SHOAL_HD inline bool fitsScale(float x, int Q, int L, int K) {
  if (decompose(x).mag == 0) return true;
  const LimbPair l = limbPairOf(x, Q, L);
  if (l.k0 < 0 || l.k0 >= K) return false;
  return l.k0 + 1 < K || l.hi == 0;
}

}  // namespace shoal::sketch
