// What the files of the topk compressor share: its instance (options and
// selection scratch), a tensor's residual, one operation's state, and the
// functions one file gives the others. Internal to compressors/topk:
//   topk.cc         the table, options, host rounds (the spec is at its top)
//   topk_math.h     per-element code shared with the kernels
//   topk_state.cc   the tensors' residuals: life, placement, save and load
//   topk_device.cc  the host side of the device rounds (GPU build)
//   topk_kernels.cu the kernels, topk_cuda.h their seam
#pragma once

#include <algorithm>
#include <cmath>
#include <cstddef>
#include <cstdint>
#include <string>
#include <vector>

#include "shoal/compressor.h"

namespace shoal::compressors::topk_impl {

constexpr double kDefaultRatio = 0.01;

// Selection scratch of an instance, reused across calls (an instance is used by one thread at a time).
struct Scratch {
  std::vector<uint32_t> index32;
  std::vector<uint64_t> index64;
  std::vector<uint64_t> words;
};

struct Instance {
  bool useK = false;
  uint64_t k = 0;
  double ratio = kDefaultRatio;
  bool ef = true;
  shoal_log_fn log = nullptr;
  Scratch scratch;

  size_t keptOf(size_t count) const {
    if (count == 0) return 0;
    if (useK) return static_cast<size_t>(std::min<uint64_t>(k, count));
    double x = ratio * static_cast<double>(count);
    double kept = std::ceil(x - x * 1e-12);
    if (kept < 1) return 1;
    if (kept >= static_cast<double>(count)) return count;
    return static_cast<size_t>(kept);
  }
};

// The error vector of one named tensor. Loaded before first use, it is
// untyped (dtype and count unknown) until a call adopts it.
struct TensorState {
  bool typed = false;
  shoal_dtype_t dtype = SHOAL_F32;
  size_t count = 0;
  size_t bytes = 0;
  void* data = nullptr;  // malloc'd, bytes long (nullptr when 0); device memory when onDevice
  bool onDevice = false;
  int device = 0;
  void* lastUse = nullptr;  // onDevice: a CUDA event recorded after the last kernels that touch data
};

struct OpState {
  std::vector<size_t> offsets;  // offsets[t] = first global index of tensor t; offsets[T] = total
  std::vector<uint64_t> pairs;  // this rank's payload
  size_t expectedWords = 0;     // what every rank sends: 2 words per kept element (k follows from options and shapes)
  std::vector<TensorState*> errors;        // each tensor's residual (ef=1), checked in start()
  // CUDA tensors: device, stream, and the device memory freed in finish().
  bool onDevice = false;
  int device = 0;
  void* stream = nullptr;
  uint64_t* devicePairs = nullptr;  // this rank's payload
  void* deviceDecode = nullptr;     // round 1: the outputs' table and the malformed-pair counter
};

// ---- topk_state.cc ----------------------------------------------------------------

// Where a tensor's data lives, for messages.
std::string placeText(bool onDevice, int device);
// The tensor's error vector, created or checked (and placed where the op's
// tensors are); nullptr with error text in op on a mismatch.
TensorState* stateFor(shoal_compress_op_t* op, int t, size_t count, const OpState& opState);
// The table's tensor-state functions (include/shoal/compressor.h).
void destroyTensorState(void* instance, void* state);
shoal_status_t saveTensorState(void* instance, const void* state, void* buffer, size_t* bytes);
shoal_status_t loadTensorState(void* instance, void** state, const void* buffer, size_t bytes);

#if SHOAL_WITH_CUDA
// ---- topk_device.cc ---------------------------------------------------------------

// Round 0 on the device: kept[t] pairs of tensor t (totalKept in all) into one
// device payload, requested in round.
shoal_status_t encodeRoundOnDevice(OpState& state, shoal_compress_op_t* op, shoal_round_t* round,
                                   const std::vector<size_t>& kept, size_t totalKept);
// Round 1 on the device; *badPairs counts gathered pairs with an index past the tensors.
shoal_status_t decodeOnDevice(OpState& state, shoal_compress_op_t* op, const shoal_payload_t& payload,
                              unsigned* badPairs);
// Frees the operation's device memory, stream-ordered (finish()).
void releaseDeviceMemory(OpState& state);
#endif

}  // namespace shoal::compressors::topk_impl
