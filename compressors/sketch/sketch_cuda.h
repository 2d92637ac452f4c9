// The sketch compressor's CUDA kernels (sketch.cu), for host code: plain C++,
// no CUDA headers. Built only when SHOAL_WITH_CUDA; call under
// #if SHOAL_WITH_CUDA. Every pointer is device memory on the current device
// unless named host*; `stream` is a cudaStream_t (nullptr: the default
// stream). Functions enqueue work and return at once, except those that say
// they synchronise (they hand a device value to the host). Each returns a
// cudaError_t as int (0: success; errorText() says what went wrong).
// Per-element logic is sketch_math.h's, shared with the CPU path.
#pragma once

#include <cstddef>
#include <cstdint>

#include "compressors/sketch/sketch_math.h"

namespace shoal::sketch::gpu {

const char* errorText(int error);

// Makes `device` the calling thread's current device.
int useDevice(int device);

// ---- memory --------------------------------------------------------------------
int allocate(void** pointer, size_t bytes, void* stream);  // stream-ordered; bytes 0 gives nullptr
int release(void* pointer, void* stream);
int zero(void* pointer, size_t bytes, void* stream);
int copy(void* destination, const void* source, size_t bytes, void* stream);  // device to device
int copyToHost(void* hostDestination, const void* source, size_t bytes, void* stream);  // synchronises
int copyFromHost(void* destination, const void* hostSource, size_t bytes, void* stream);  // synchronises

// ---- round 0 -----------------------------------------------------------------------
// Sets the index bit(s) of every nonzero of x (the bitmap, or the Bloom
// filter when bloom.words > 0; words zeroed by the caller) and folds the
// exponent statistics into stats[0..3) with atomicMax (zeroed by the caller):
// [top + 200, 200 - lowest, nonfinite], as the CPU path.
int encodeIndex(const float* x, size_t count, const BloomGeometry& bloom, uint64_t* words, uint64_t* stats,
                void* stream);

// ---- supports ---------------------------------------------------------------------
// This rank's nonzero coordinates, ascending (CUB select): support[0..*hostCount). Synchronises.
int compactSupport(const float* x, size_t count, uint64_t* support, size_t* hostCount, void* stream);
// The members of an ORed index (bitmap, or Bloom filter when bloom.words > 0). Synchronises.
// *hostFlags: sketch_checks.h's kFlagIndexPastCount when the bitmap has bits past count (refuse).
int countMembers(const uint64_t* words, size_t count, const BloomGeometry& bloom, size_t* hostCount,
                 unsigned* hostFlags, void* stream);
// members[0..u) ascending, u from countMembers (CUB select).
int listMembers(const uint64_t* words, size_t count, const BloomGeometry& bloom, uint64_t* members, void* stream);

// ---- values -----------------------------------------------------------------------
// values=compact: each member's K limbs at values[k * u + p] (zeroed by the caller); Inf/NaN skipped.
// flags (device, one word): kFlagOutsideScale when a value does not fit the agreed scale (refuse);
// the same for scatterSketch and encodeLeftovers.
int encodeCompact(const float* x, const uint64_t* members, size_t u, int Q, int L, int K, uint64_t* values,
                  unsigned* flags, void* stream);
// values=compact as f32 (when f32 sums are exact): values[p] = x[members[p]], 0 for Inf/NaN.
int gatherValues(const float* x, const uint64_t* members, size_t u, float* values, void* stream);
// One word per member: specialBits (sketch_math.h), for the BOR of Inf/NaN.
int encodeSpecials(const float* x, const uint64_t* members, size_t u, uint64_t* specials, void* stream);
// values=sketch: every coordinate in support[0..s) adds its limbs to its three
// cells (atomicAdd on u64: exact modulo 2^64, so the order does not matter).
// cells: K limbs per cell, limb-major, stride 3 * g.part, zeroed by the caller.
int scatterSketch(const float* x, const uint64_t* support, size_t s, const SketchGeometry& g, int Q, int L, int K,
                  uint64_t* cells, unsigned* flags, void* stream);

// Peels summed cells (consumed) over the members: counts from the members,
// then two-phase rounds (find pure cells; apply) on the device, batches of
// rounds between host checks. limbs: K per member, limb-major (limbs[k * u + p]);
// leftover: positions in U of members not recovered, [0..*hostLeftovers).
// *hostCertified: false only if every member peeled and a cell or count is not
// zero. Synchronises (once per batch of rounds).
int peel(const uint64_t* members, size_t u, const SketchGeometry& g, int K, uint64_t* cells, uint64_t* limbs,
         uint64_t* leftover, size_t* hostLeftovers, bool* hostCertified, int* hostRounds, void* stream);

// The leftovers' limbs: out[k * m + l] += limbs of x[members[leftover[l]]] (zeroed by the caller).
int encodeLeftovers(const float* x, const uint64_t* members, const uint64_t* leftover, size_t m, int Q, int L, int K,
                    uint64_t* out, unsigned* flags, void* stream);
// Summed leftovers back into the members' limbs: limbs[k * u + leftover[l]] = summed[k * m + l].
int placeLeftovers(const uint64_t* summed, const uint64_t* leftover, size_t m, size_t u, int K, uint64_t* limbs,
                   void* stream);

// ---- decode -----------------------------------------------------------------------
// out[members[p]] = the member's exact sum rounded once (avg: / n), or its
// Inf/NaN when specials (may be nullptr) says so. Other coordinates of out are
// left alone: zero out first.
int decodeMembers(const uint64_t* limbs, size_t stride, const uint64_t* members, size_t u, const uint64_t* specials,
                  int K, int L, int Q, int n, bool avg, float* out, void* stream);
// out[members[p]] = sums[p] (avg: / n, one IEEE division), or the member's Inf/NaN.
int scatterValues(const float* sums, const uint64_t* members, size_t u, const uint64_t* specials, int n, bool avg,
                  float* out, void* stream);
// values=dense: out = sum (avg: sum / n, one IEEE division).
int finishDense(const float* sum, size_t count, int n, bool avg, float* out, void* stream);

}  // namespace shoal::sketch::gpu
