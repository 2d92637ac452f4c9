// CUDA kernels of the sketch compressor (declared in sketch_cuda.h). The
// per-element logic is sketch_math.h's, the same functions the CPU path runs,
// so a device result equals the host result bit for bit (integer sums are
// exact in any order; decoding is a pure function of the limb sums).
#include <cuda_runtime.h>

#include <cub/device/device_select.cuh>
#include <thrust/iterator/counting_iterator.h>

#include "compressors/sketch/sketch_checks.h"
#include "compressors/sketch/sketch_cuda.h"

namespace shoal::sketch::gpu {
namespace {

constexpr int kThreads = 256;

cudaStream_t asStream(void* stream) { return static_cast<cudaStream_t>(stream); }

unsigned blocksFor(size_t items) {
  size_t blocks = (items + kThreads - 1) / kThreads;
  if (blocks == 0) blocks = 1;
  return unsigned(blocks < 65535 * 16 ? blocks : 65535 * 16);  // grid-stride loops cover the rest
}

__device__ inline size_t threadIndex() { return size_t(blockIdx.x) * blockDim.x + threadIdx.x; }
__device__ inline size_t threadCount() { return size_t(gridDim.x) * blockDim.x; }

__device__ inline void atomicOr64(uint64_t* word, uint64_t bits) {
  atomicOr(reinterpret_cast<unsigned long long*>(word), static_cast<unsigned long long>(bits));
}
// A peer's payload failed a check (sketch_checks.h): the host reads the word back and refuses.
__device__ inline void flagBad(unsigned* flags, unsigned flag) { atomicOr(flags, flag); }

__device__ inline void atomicAdd64(uint64_t* cell, uint64_t v) {  // wraps modulo 2^64, like the CPU's +=
  atomicAdd(reinterpret_cast<unsigned long long*>(cell), static_cast<unsigned long long>(v));
}

// ---- round 0 ----------------------------------------------------------------------
// Each warp takes 32 consecutive elements at a time: one ballot, one atomicOr
// per 32 bits of bitmap (the warp's lanes stay together: the loop bound is the
// warp's first element).
__global__ void encodeIndexKernel(const float* x, size_t count, BloomGeometry bloom, uint64_t* words,
                                  uint64_t* stats) {
  const unsigned lane = threadIdx.x & 31u;
  unsigned topWord = 0, lowWord = 0, nonfinite = 0;
  for (size_t i = threadIndex(); i - lane < count; i += threadCount()) {
    const float v = i < count ? x[i] : 0.0f;
    const bool nonzero = i < count && isNonzero(v);
    if (bloom.words == 0) {
      const unsigned ballot = __ballot_sync(0xffffffffu, nonzero);
      if (lane == 0 && ballot != 0) atomicOr64(words + (i >> 6), uint64_t(ballot) << (i & 63));
    } else if (nonzero) {
      for (int h = 0; h < bloom.hashes; ++h) {
        const uint64_t bit = bloomBit(i, bloom, h);
        atomicOr64(words + (bit >> 6), uint64_t(1) << (bit & 63));
      }
    }
    if (!nonzero) continue;
    if (!isFinite(v)) {
      nonfinite = 1;
      continue;
    }
    const FloatParts p = decompose(v);
    topWord = max(topWord, unsigned(p.top + 200));
    lowWord = max(lowWord, unsigned(200 - p.lowest));
  }
  topWord = __reduce_max_sync(0xffffffffu, topWord);
  lowWord = __reduce_max_sync(0xffffffffu, lowWord);
  nonfinite = __reduce_max_sync(0xffffffffu, nonfinite);
  if (lane == 0) {
    if (topWord) atomicMax(reinterpret_cast<unsigned long long*>(stats + 0), (unsigned long long)topWord);
    if (lowWord) atomicMax(reinterpret_cast<unsigned long long*>(stats + 1), (unsigned long long)lowWord);
    if (nonfinite) atomicMax(reinterpret_cast<unsigned long long*>(stats + 2), 1ull);
  }
}

// ---- supports ------------------------------------------------------------------------
struct NonzeroAt {
  const float* x;
  __device__ bool operator()(uint64_t i) const { return isNonzero(x[i]); }
};

struct MemberAt {
  const uint64_t* words;
  BloomGeometry bloom;
  __device__ bool operator()(uint64_t i) const {
    return bloom.words > 0 ? bloomTest(words, i, bloom) : bitmapTest(words, i);
  }
};

// CUB select of the indices [0, count) that satisfy pick, into out; the number
// selected lands in *selected (device).
template <class Pick>
int selectIndices(size_t count, Pick pick, uint64_t* out, unsigned long long* selected, cudaStream_t stream) {
  thrust::counting_iterator<uint64_t> first(0);
  size_t temp = 0;
  cudaError_t e = cub::DeviceSelect::If(nullptr, temp, first, out, selected, count, pick, stream);
  if (e != cudaSuccess) return e;
  void* storage = nullptr;
  if ((e = cudaMallocAsync(&storage, temp, stream)) != cudaSuccess) return e;
  e = cub::DeviceSelect::If(storage, temp, first, out, selected, count, pick, stream);
  cudaError_t f = cudaFreeAsync(storage, stream);
  return e != cudaSuccess ? e : f;
}

__global__ void countMembersKernel(const uint64_t* words, size_t count, BloomGeometry bloom,
                                   unsigned long long* total, unsigned* flags) {
  unsigned long long mine = 0;
  if (bloom.words == 0) {
    const size_t wordCount = (count + 63) / 64;
    // Bits of the last word past count name no coordinate: a corrupted index, refused by the
    // host through the flag (never counted or listed).
    const uint64_t lastMask = count % 64 == 0 ? ~uint64_t(0) : (uint64_t(1) << (count % 64)) - 1;
    for (size_t k = threadIndex(); k < wordCount; k += threadCount()) {
      if (k + 1 == wordCount && indexBitsPastCount(words[k], count)) flagBad(flags, kFlagIndexPastCount);
      mine += __popcll(k + 1 == wordCount ? words[k] & lastMask : words[k]);
    }
  } else {
    for (size_t i = threadIndex(); i < count; i += threadCount()) mine += bloomTest(words, i, bloom);
  }
  for (int offset = 16; offset > 0; offset /= 2) mine += __shfl_down_sync(0xffffffffu, mine, offset);
  if ((threadIdx.x & 31u) == 0 && mine) atomicAdd(total, mine);
}

// ---- values ----------------------------------------------------------------------------
__global__ void encodeCompactKernel(const float* x, const uint64_t* members, size_t u, int Q, int L, int K,
                                    uint64_t* values, unsigned* flags) {
  for (size_t p = threadIndex(); p < u; p += threadCount()) {
    const float v = x[members[p]];
    if (!isFinite(v)) continue;
    if (!fitsScale(v, Q, L, K)) flagBad(flags, kFlagOutsideScale);
    addLimbs(v, Q, L, K, values + p, u);  // one writer per member: no atomics
  }
}

__global__ void gatherValuesKernel(const float* x, const uint64_t* members, size_t u, float* values) {
  for (size_t p = threadIndex(); p < u; p += threadCount()) {
    const float v = x[members[p]];
    values[p] = isFinite(v) ? v + 0.0f : 0.0f;  // -0 as +0: two -0 (a Bloom false positive) sum to +0
  }
}

__global__ void scatterValuesKernel(const float* sums, const uint64_t* members, size_t u, const uint64_t* specials,
                                    float n, bool avg, float* out) {
  for (size_t p = threadIndex(); p < u; p += threadCount()) {
    float v;
    if (specials != nullptr && specials[p] != 0) v = decodeSpecial(specials[p]);
    else v = avg ? sums[p] / n : sums[p];
    out[members[p]] = v;
  }
}

__global__ void encodeSpecialsKernel(const float* x, const uint64_t* members, size_t u, uint64_t* specials) {
  for (size_t p = threadIndex(); p < u; p += threadCount()) specials[p] = specialBits(x[members[p]]);
}

__global__ void scatterSketchKernel(const float* x, const uint64_t* support, size_t s, SketchGeometry g, int Q, int L,
                                    int K, uint64_t* cells, unsigned* flags) {
  const uint64_t stride = 3 * g.part;
  for (size_t e = threadIndex(); e < s; e += threadCount()) {
    const uint64_t i = support[e];
    const float v = x[i];
    if (!isFinite(v)) continue;
    if (!fitsScale(v, Q, L, K)) flagBad(flags, kFlagOutsideScale);
    const LimbPair limbs = limbPairOf(v, Q, L);
    if (limbs.k0 < 0) continue;
    for (int j = 0; j < 3; ++j) {
      const uint64_t c = cellOf(i, g, j);
      if (limbs.k0 < K) atomicAdd64(cells + uint64_t(limbs.k0) * stride + c, limbs.lo);
      if (limbs.k0 + 1 < K) atomicAdd64(cells + uint64_t(limbs.k0 + 1) * stride + c, limbs.hi);
    }
  }
}

// ---- peeling ---------------------------------------------------------------------------------
struct PeelControl {
  unsigned long long taken;  // members taken in this round's phase A
  unsigned stop;             // set once a round takes nothing: later kernels of the batch return at once
  unsigned rounds;
  unsigned nonzero;          // certificate: some count or cell is not zero
};

enum : uint8_t { kPending = 0, kTaken = 1, kDone = 2 };

__global__ void countCellsKernel(const uint64_t* members, size_t u, SketchGeometry g, unsigned* counts) {
  for (size_t p = threadIndex(); p < u; p += threadCount())
    for (int j = 0; j < 3; ++j) atomicAdd(counts + cellOf(members[p], g, j), 1u);
}

// Phase A: reads only (counts and cells are not written in this kernel).
__global__ void peelFindKernel(const uint64_t* members, size_t u, SketchGeometry g, int K, const unsigned* counts,
                               const uint64_t* cells, uint64_t* limbs, uint8_t* state, PeelControl* control) {
  if (control->stop) return;
  const uint64_t stride = 3 * g.part;
  unsigned long long taken = 0;
  for (size_t p = threadIndex(); p < u; p += threadCount()) {
    if (state[p] != kPending) continue;
    const uint64_t c = pureCellOf(members[p], g, counts);
    if (c == ~uint64_t(0)) continue;
    for (int k = 0; k < K; ++k) limbs[uint64_t(k) * u + p] = cells[uint64_t(k) * stride + c];
    state[p] = kTaken;
    ++taken;
  }
  for (int offset = 16; offset > 0; offset /= 2) taken += __shfl_down_sync(0xffffffffu, taken, offset);
  if ((threadIdx.x & 31u) == 0 && taken) atomicAdd(&control->taken, taken);
}

__global__ void peelStepKernel(PeelControl* control) {
  if (control->stop) return;
  if (control->taken == 0) {
    control->stop = 1;
  } else {
    ++control->rounds;
    control->taken = 0;
  }
}

// Phase B: the members taken leave their three cells (atomics: cells are shared).
__global__ void peelApplyKernel(const uint64_t* members, size_t u, SketchGeometry g, int K, unsigned* counts,
                                uint64_t* cells, const uint64_t* limbs, uint8_t* state, const PeelControl* control) {
  if (control->stop) return;
  const uint64_t stride = 3 * g.part;
  for (size_t p = threadIndex(); p < u; p += threadCount()) {
    if (state[p] != kTaken) continue;
    state[p] = kDone;
    const uint64_t index = members[p];
    for (int j = 0; j < 3; ++j) {
      const uint64_t c = cellOf(index, g, j);
      for (int k = 0; k < K; ++k) atomicAdd64(cells + uint64_t(k) * stride + c, 0 - limbs[uint64_t(k) * u + p]);
      atomicSub(counts + c, 1u);
    }
  }
}

__global__ void certifyKernel(const unsigned* counts, const uint64_t* cells, size_t cellCount, int K,
                              PeelControl* control) {
  bool nonzero = false;
  for (size_t c = threadIndex(); c < cellCount; c += threadCount()) {
    nonzero = nonzero || counts[c] != 0;
    for (int k = 0; k < K; ++k) nonzero = nonzero || cells[uint64_t(k) * cellCount + c] != 0;
  }
  if (__any_sync(0xffffffffu, nonzero) && (threadIdx.x & 31u) == 0) atomicOr(&control->nonzero, 1u);
}

struct NotDone {
  const uint8_t* state;
  __device__ bool operator()(uint64_t p) const { return state[p] != kDone; }
};

__global__ void encodeLeftoversKernel(const float* x, const uint64_t* members, const uint64_t* leftover, size_t m,
                                      int Q, int L, int K, uint64_t* out, unsigned* flags) {
  for (size_t l = threadIndex(); l < m; l += threadCount()) {
    const float v = x[members[leftover[l]]];
    if (!isFinite(v)) continue;
    if (!fitsScale(v, Q, L, K)) flagBad(flags, kFlagOutsideScale);
    addLimbs(v, Q, L, K, out + l, m);
  }
}

__global__ void placeLeftoversKernel(const uint64_t* summed, const uint64_t* leftover, size_t m, size_t u, int K,
                                     uint64_t* limbs) {
  for (size_t l = threadIndex(); l < m; l += threadCount())
    for (int k = 0; k < K; ++k) limbs[uint64_t(k) * u + leftover[l]] = summed[uint64_t(k) * m + l];
}

// ---- decode -----------------------------------------------------------------------------------
__global__ void decodeMembersKernel(const uint64_t* limbs, size_t stride, const uint64_t* members, size_t u,
                                    const uint64_t* specials, int K, int L, int Q, int n, bool avg, float* out) {
  for (size_t p = threadIndex(); p < u; p += threadCount()) {
    float v;
    if (specials != nullptr && specials[p] != 0) v = decodeSpecial(specials[p]);
    else v = K > 0 ? decodeLimbs(limbs + p, stride, K, L, Q, n, avg) : 0.0f;
    out[members[p]] = v;
  }
}

__global__ void finishDenseKernel(const float* sum, size_t count, float n, bool avg, float* out) {
  for (size_t i = threadIndex(); i < count; i += threadCount()) out[i] = avg ? sum[i] / n : sum[i];
}

int launched() { return int(cudaGetLastError()); }

}  // namespace

const char* errorText(int error) { return cudaGetErrorString(static_cast<cudaError_t>(error)); }

int useDevice(int device) { return int(cudaSetDevice(device)); }

int allocate(void** pointer, size_t bytes, void* stream) {
  *pointer = nullptr;
  return bytes == 0 ? 0 : int(cudaMallocAsync(pointer, bytes, asStream(stream)));
}
int release(void* pointer, void* stream) { return pointer ? int(cudaFreeAsync(pointer, asStream(stream))) : 0; }
int zero(void* pointer, size_t bytes, void* stream) {
  return bytes ? int(cudaMemsetAsync(pointer, 0, bytes, asStream(stream))) : 0;
}
int copy(void* destination, const void* source, size_t bytes, void* stream) {
  return bytes ? int(cudaMemcpyAsync(destination, source, bytes, cudaMemcpyDeviceToDevice, asStream(stream))) : 0;
}
int copyToHost(void* hostDestination, const void* source, size_t bytes, void* stream) {
  cudaError_t e = bytes ? cudaMemcpyAsync(hostDestination, source, bytes, cudaMemcpyDeviceToHost, asStream(stream))
                        : cudaSuccess;
  return int(e != cudaSuccess ? e : cudaStreamSynchronize(asStream(stream)));
}
int copyFromHost(void* destination, const void* hostSource, size_t bytes, void* stream) {
  cudaError_t e = bytes ? cudaMemcpyAsync(destination, hostSource, bytes, cudaMemcpyHostToDevice, asStream(stream))
                        : cudaSuccess;
  return int(e != cudaSuccess ? e : cudaStreamSynchronize(asStream(stream)));
}

int encodeIndex(const float* x, size_t count, const BloomGeometry& bloom, uint64_t* words, uint64_t* stats,
                void* stream) {
  if (count == 0) return 0;
  encodeIndexKernel<<<blocksFor(count), kThreads, 0, asStream(stream)>>>(x, count, bloom, words, stats);
  return launched();
}

int compactSupport(const float* x, size_t count, uint64_t* support, size_t* hostCount, void* stream) {
  *hostCount = 0;
  if (count == 0) return 0;
  unsigned long long* selected = nullptr;
  int e = allocate(reinterpret_cast<void**>(&selected), sizeof *selected, stream);
  if (e == 0) e = selectIndices(count, NonzeroAt{x}, support, selected, asStream(stream));
  unsigned long long n = 0;
  if (e == 0) e = copyToHost(&n, selected, sizeof n, stream);
  int f = release(selected, stream);
  *hostCount = size_t(n);
  return e ? e : f;
}

int countMembers(const uint64_t* words, size_t count, const BloomGeometry& bloom, size_t* hostCount,
                 unsigned* hostFlags, void* stream) {
  *hostCount = 0;
  *hostFlags = 0;
  if (count == 0) return 0;
  struct Result {
    unsigned long long total;
    unsigned flags;
  };
  Result* result = nullptr;
  int e = allocate(reinterpret_cast<void**>(&result), sizeof *result, stream);
  if (e == 0) e = zero(result, sizeof *result, stream);
  if (e == 0) {
    const size_t items = bloom.words == 0 ? (count + 63) / 64 : count;
    countMembersKernel<<<blocksFor(items), kThreads, 0, asStream(stream)>>>(words, count, bloom, &result->total,
                                                                           &result->flags);
    e = launched();
  }
  Result host{};
  if (e == 0) e = copyToHost(&host, result, sizeof host, stream);
  int f = release(result, stream);
  *hostCount = size_t(host.total);
  *hostFlags = host.flags;
  return e ? e : f;
}

int listMembers(const uint64_t* words, size_t count, const BloomGeometry& bloom, uint64_t* members, void* stream) {
  if (count == 0) return 0;
  unsigned long long* selected = nullptr;
  int e = allocate(reinterpret_cast<void**>(&selected), sizeof *selected, stream);
  if (e == 0) e = selectIndices(count, MemberAt{words, bloom}, members, selected, asStream(stream));
  int f = release(selected, stream);
  return e ? e : f;
}

int encodeCompact(const float* x, const uint64_t* members, size_t u, int Q, int L, int K, uint64_t* values,
                  unsigned* flags, void* stream) {
  if (u == 0) return 0;
  encodeCompactKernel<<<blocksFor(u), kThreads, 0, asStream(stream)>>>(x, members, u, Q, L, K, values, flags);
  return launched();
}

int gatherValues(const float* x, const uint64_t* members, size_t u, float* values, void* stream) {
  if (u == 0) return 0;
  gatherValuesKernel<<<blocksFor(u), kThreads, 0, asStream(stream)>>>(x, members, u, values);
  return launched();
}

int scatterValues(const float* sums, const uint64_t* members, size_t u, const uint64_t* specials, int n, bool avg,
                  float* out, void* stream) {
  if (u == 0) return 0;
  scatterValuesKernel<<<blocksFor(u), kThreads, 0, asStream(stream)>>>(sums, members, u, specials, float(n), avg, out);
  return launched();
}

int encodeSpecials(const float* x, const uint64_t* members, size_t u, uint64_t* specials, void* stream) {
  if (u == 0) return 0;
  encodeSpecialsKernel<<<blocksFor(u), kThreads, 0, asStream(stream)>>>(x, members, u, specials);
  return launched();
}

int scatterSketch(const float* x, const uint64_t* support, size_t s, const SketchGeometry& g, int Q, int L, int K,
                  uint64_t* cells, unsigned* flags, void* stream) {
  if (s == 0) return 0;
  scatterSketchKernel<<<blocksFor(s), kThreads, 0, asStream(stream)>>>(x, support, s, g, Q, L, K, cells, flags);
  return launched();
}

int peel(const uint64_t* members, size_t u, const SketchGeometry& g, int K, uint64_t* cells, uint64_t* limbs,
         uint64_t* leftover, size_t* hostLeftovers, bool* hostCertified, int* hostRounds, void* stream) {
  *hostLeftovers = 0;
  *hostCertified = true;
  *hostRounds = 0;
  if (u == 0) return 0;
  cudaStream_t s = asStream(stream);
  const size_t cellCount = 3 * g.part;
  unsigned* counts = nullptr;
  uint8_t* state = nullptr;
  PeelControl* control = nullptr;
  unsigned long long* selected = nullptr;
  int e = allocate(reinterpret_cast<void**>(&counts), cellCount * sizeof *counts, stream);
  if (e == 0) e = allocate(reinterpret_cast<void**>(&state), u, stream);
  if (e == 0) e = allocate(reinterpret_cast<void**>(&control), sizeof *control, stream);
  if (e == 0) e = allocate(reinterpret_cast<void**>(&selected), sizeof *selected, stream);
  if (e == 0) e = zero(counts, cellCount * sizeof *counts, stream);
  if (e == 0) e = zero(state, u, stream);
  if (e == 0) e = zero(control, sizeof *control, stream);
  if (e == 0) e = zero(limbs, size_t(K) * u * sizeof *limbs, stream);
  if (e == 0) {
    countCellsKernel<<<blocksFor(u), kThreads, 0, s>>>(members, u, g, counts);
    e = launched();
  }
  // Rounds run in batches with no host synchronisation inside a batch: once a
  // round takes nothing, peelStepKernel sets stop and the rest of the batch
  // returns at once. Every round before the stop recovers >= 1 member, so
  // u + 1 rounds always suffice.
  constexpr int kBatch = 16;
  PeelControl host{};
  for (size_t done = 0; e == 0 && !host.stop && done <= u; done += kBatch) {
    for (int r = 0; r < kBatch && e == 0; ++r) {
      peelFindKernel<<<blocksFor(u), kThreads, 0, s>>>(members, u, g, K, counts, cells, limbs, state, control);
      peelStepKernel<<<1, 1, 0, s>>>(control);
      peelApplyKernel<<<blocksFor(u), kThreads, 0, s>>>(members, u, g, K, counts, cells, limbs, state, control);
      e = launched();
    }
    if (e == 0) e = copyToHost(&host, control, sizeof host, stream);
  }
  if (e == 0) {
    certifyKernel<<<blocksFor(cellCount), kThreads, 0, s>>>(counts, cells, cellCount, K, control);
    e = launched();
  }
  if (e == 0) e = selectIndices(u, NotDone{state}, leftover, selected, s);
  unsigned long long m = 0;
  if (e == 0) e = copyToHost(&m, selected, sizeof m, stream);
  if (e == 0) e = copyToHost(&host, control, sizeof host, stream);
  *hostLeftovers = size_t(m);
  *hostCertified = !(m == 0 && host.nonzero);
  *hostRounds = int(host.rounds);
  int f = release(counts, stream);
  if (f == 0) f = release(state, stream);
  if (f == 0) f = release(control, stream);
  if (f == 0) f = release(selected, stream);
  return e ? e : f;
}

int encodeLeftovers(const float* x, const uint64_t* members, const uint64_t* leftover, size_t m, int Q, int L, int K,
                    uint64_t* out, unsigned* flags, void* stream) {
  if (m == 0) return 0;
  encodeLeftoversKernel<<<blocksFor(m), kThreads, 0, asStream(stream)>>>(x, members, leftover, m, Q, L, K, out,
                                                                          flags);
  return launched();
}

int placeLeftovers(const uint64_t* summed, const uint64_t* leftover, size_t m, size_t u, int K, uint64_t* limbs,
                   void* stream) {
  if (m == 0) return 0;
  placeLeftoversKernel<<<blocksFor(m), kThreads, 0, asStream(stream)>>>(summed, leftover, m, u, K, limbs);
  return launched();
}

int decodeMembers(const uint64_t* limbs, size_t stride, const uint64_t* members, size_t u, const uint64_t* specials,
                  int K, int L, int Q, int n, bool avg, float* out, void* stream) {
  if (u == 0) return 0;
  decodeMembersKernel<<<blocksFor(u), kThreads, 0, asStream(stream)>>>(limbs, stride, members, u, specials, K, L, Q,
                                                                        n, avg, out);
  return launched();
}

int finishDense(const float* sum, size_t count, int n, bool avg, float* out, void* stream) {
  if (count == 0) return 0;
  finishDenseKernel<<<blocksFor(count), kThreads, 0, asStream(stream)>>>(sum, count, float(n), avg, out);
  return launched();
}

}  // namespace shoal::sketch::gpu
