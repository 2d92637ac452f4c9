// topk: top-k sparsification with error feedback, two rounds.
//
// Per tensor g of count elements, on every rank:
//   g' = g + e_old                    (e_old = 0 the first time, or with ef=0)
//   S  = the k elements of g' of largest magnitude: larger |g'| first, then
//        lower index (a strict total order, see topk_math.h); NaN counts as the
//        largest magnitude, so a NaN is sent, never hidden in the residual
//   e_new = g' with the elements of S set to +0 (ef=1 only; with ef=0 nothing
//        is kept). Exact: e_new[i] + sent[i] == g'[i] for every i.
// Selection is std::nth_element (O(count) on average) under that order: on
// packed 64-bit words for f32 (key, ~index), else on indices with the
// (key, index) comparator; then the k indices are sorted, so the payload is
// the same bytes whatever the standard library.
// Round 0: the (index, value) pairs of S of every tensor of the call, in one
//   allgatherv payload of dtype u64, two words a pair (topk_math.h: global
//   index across the call's tensors, then the value's bits), sorted by index.
// Round 1: every output is zeroed, then every rank's pairs are added in rank
//   order r = 0 .. n-1 in the output's dtype, so every rank computes the same
//   bits; SHOAL_AVG divides by n once at the end. Done.
// With k >= count everything is sent and the output is the plain sum, added
// in rank order.
//
// Options: k=<int> elements kept per tensor (capped at the tensor's count), or
// ratio=<float in (0,1]> keeping max(1, ceil(ratio * count)) (the product is
// rounded up ignoring floating-point noise below 1e-12 relative, so that
// ratio=0.07 of 100 elements keeps 7, not 8); default ratio=0.01. ef=0|1
// error feedback, default 1. dtypes f32 and f64 (several tensors of one call
// may mix them), host memory.
//
// Names: the table declares SHOAL_CAP_STATEFUL, and caps belong to the table,
// not to an option set: so the driver asks for named tensors even with ef=0,
// which keeps no state. (Unnamed tensors reaching round() with ef=0 work.)
//
// Tensor state (shoal_compressor_state_save / _load), layout: the error vector
// e of the tensor, count elements in the tensor's dtype (f32 or f64), native
// byte order, nothing else: count * 4 or count * 8 bytes. A state loaded
// before the tensor's first call takes its dtype and count from that call,
// which refuses it unless its size is count * sizeof(dtype); loading into an
// existing state requires the existing size. A name must keep its dtype and
// count from call to call (a mismatch is refused: the residual would be
// meaningless).
//
// CUDA tensors (GPU build only; SHOAL_CAP_CUDA is set only there): every
// tensor of a call on one device and stream, at most 2^32 - 1 elements each.
// The same steps as kernels on that stream (topk_kernels.cu): selection by a
// stable descending radix sort of the magnitude keys (the order above), the
// payload and the residual in device memory. Round 0 never waits for the
// device; round 1 waits once, at its end, to learn whether a gathered pair
// was malformed. A name's residual stays where its first call put it (host
// or one device; a later call elsewhere is refused); save and load copy it
// to and from host memory after the stream's last use of it. A state loaded
// before its tensor's first call moves to the device then.
#include <algorithm>
#include <cmath>
#include <cstdarg>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <functional>
#include <numeric>
#include <string>
#include <type_traits>
#include <vector>

#include "compressors/common/payload.h"
#include "compressors/common/text.h"
#include "compressors/topk/topk_math.h"
#include "core/tensor.h"
#include "shoal/compressor.h"

#if SHOAL_WITH_CUDA
#include "compressors/topk/topk_cuda.h"
#include "gpu/cuda/stream_memory.h"
#endif

namespace shoal::compressors {
namespace {

constexpr double kDefaultRatio = 0.01;
constexpr uint64_t kMaxK = 1000000000000000000ull;  // 10^18: beyond any tensor
constexpr const char* kOptionsHelp =
    "k=<int >= 1>: elements kept per tensor (capped at its size); "
    "ratio=<float in (0,1]>: keep max(1, ceil(ratio * count)) per tensor (default 0.01; not together with k); "
    "ef=0|1: error feedback, the unsent rest is added to the next call's tensor of the same name (default 1). "
    "With ef=1 tensors need a name.";

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

TensorState* newState(size_t bytes) {
  auto* state = new TensorState;
  state->bytes = bytes;
  if (bytes > 0) {
    state->data = std::calloc(1, bytes);  // all-zero bits: +0.0 in f32 and f64
    if (state->data == nullptr) {
      delete state;
      return nullptr;
    }
  }
  return state;
}

void freeState(TensorState* state) {
  if (state == nullptr) return;
#if SHOAL_WITH_CUDA
  if (state->onDevice) {
    cuda::DeviceScope scope(state->device);
    cuda::waitEvent(state->lastUse);  // the stream's kernels may still use it
    cuda::freeDevice(state->data);
    cuda::destroyEvent(state->lastUse);
    delete state;
    return;
  }
#endif
  std::free(state->data);
  delete state;
}

#if SHOAL_WITH_CUDA
// Moves a host state's bytes to `device` (zeros when fresh); nullptr, or the CUDA error's text.
const char* moveToDevice(TensorState* state, int device) {
  cuda::DeviceScope scope(device);
  if (scope.error()) return scope.error();
  void* data = nullptr;
  const char* error = cuda::allocDevice(&data, state->bytes);
  if (error == nullptr && state->bytes > 0) error = cuda::copyBlocking(data, state->data, state->bytes);
  void* event = nullptr;
  if (error == nullptr) error = cuda::createEvent(&event);
  if (error != nullptr) {
    cuda::freeDevice(data);
    return error;
  }
  std::free(state->data);
  state->data = data;
  state->onDevice = true;
  state->device = device;
  state->lastUse = event;
  return nullptr;
}
#endif

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

// ---- options ------------------------------------------------------------------

bool parseK(const char* text, uint64_t* k) {
  size_t length = std::strlen(text);
  if (length == 0 || length > 19) return false;
  uint64_t value = 0;
  for (size_t i = 0; i < length; ++i) {
    if (text[i] < '0' || text[i] > '9') return false;
    value = value * 10 + static_cast<uint64_t>(text[i] - '0');
  }
  if (value < 1 || value > kMaxK) return false;
  *k = value;
  return true;
}

bool parseRatio(const char* text, double* ratio) {
  if (text[0] == '\0' || std::isspace(static_cast<unsigned char>(text[0]))) return false;
  char* end = nullptr;
  double value = std::strtod(text, &end);
  if (end == text || *end != '\0' || !std::isfinite(value) || !(value > 0) || value > 1) return false;
  *ratio = value;
  return true;
}

shoal_status_t create(const shoal_compressor_params_t* params, void** instance) {
  auto refuse = [&](auto... args) {
    writeText(params->error_text, params->error_text_size, args...);
    return SHOAL_ERR_INVALID_ARGUMENT;
  };
  Instance parsed;
  parsed.log = params->log;
  const char* kText = nullptr;
  const char* ratioText = nullptr;
  for (int i = 0; i < params->num_options; ++i) {
    const char* key = params->keys[i];
    const char* value = params->values[i];
    if (std::strcmp(key, "k") == 0) {
      if (!parseK(value, &parsed.k))
        return refuse("topk: option k must be an integer >= 1 (elements kept per tensor, at most 10^18), got '%s'",
                      value);
      parsed.useK = true;
      kText = value;
    } else if (std::strcmp(key, "ratio") == 0) {
      if (!parseRatio(value, &parsed.ratio))
        return refuse("topk: option ratio must be a number in (0, 1] (the fraction of each tensor's elements kept), "
                      "got '%s'",
                      value);
      ratioText = value;
    } else if (std::strcmp(key, "ef") == 0) {
      if (std::strcmp(value, "0") != 0 && std::strcmp(value, "1") != 0)
        return refuse("topk: option ef must be 0 or 1 (error feedback off or on), got '%s'", value);
      parsed.ef = value[0] == '1';
    } else {
      return refuse("topk: unknown option '%s'; topk takes k=<int >= 1>, ratio=<float in (0,1]> (not both), ef=0|1",
                    key);
    }
  }
  if (kText && ratioText)
    return refuse("topk: give either option k or option ratio, not both (got k=%s and ratio=%s)", kText, ratioText);
  auto* result = new Instance(std::move(parsed));
  *instance = result;
  return SHOAL_OK;
}

void destroy(void* instance) { delete static_cast<Instance*>(instance); }

// ---- selection ------------------------------------------------------------------

// The k indices of values[0..count) first in the selection order, ascending by
// index in index[0..k). O(count) on average (std::nth_element), plus k log k.
template <typename T, typename Index>
void selectTopK(const T* values, size_t count, size_t k, std::vector<Index>& index, std::vector<uint64_t>& words) {
  index.resize(count);
  if (k >= count) {
    std::iota(index.begin(), index.end(), Index{0});
    return;
  }
  if constexpr (std::is_same_v<T, float> && std::is_same_v<Index, uint32_t>) {
    // f32 below 2^32 elements: the same order on packed words (topk_math.h),
    // plain integer comparisons with no indirection (about twice as fast).
    words.resize(count);
    for (size_t i = 0; i < count; ++i) words[i] = topk::selectionWord(values[i], static_cast<uint32_t>(i));
    std::nth_element(words.begin(), words.begin() + static_cast<std::ptrdiff_t>(k), words.end(),
                     std::greater<uint64_t>());
    for (size_t j = 0; j < k; ++j) index[j] = topk::selectionIndex(words[j]);
  } else {
    std::iota(index.begin(), index.end(), Index{0});
    std::nth_element(index.begin(), index.begin() + static_cast<std::ptrdiff_t>(k), index.end(),
                     [values](Index a, Index b) {
                       return topk::selectedBefore(topk::magnitudeKey(values[a]), a, topk::magnitudeKey(values[b]), b);
                     });
  }
  std::sort(index.begin(), index.begin() + static_cast<std::ptrdiff_t>(k));
}

// Encodes one tensor: selects from g' (the error vector updated in place with
// ef, else the input itself), writes k pairs at pairs, zeroes the sent
// elements of the error vector.
template <typename T, typename Index>
void encodeTensor(const T* input, T* error, size_t count, size_t k, uint64_t offset, uint64_t* pairs,
                  std::vector<Index>& index, std::vector<uint64_t>& words) {
  const T* selectFrom = input;
  if (error != nullptr) {
    for (size_t i = 0; i < count; ++i) error[i] = input[i] + error[i];
    selectFrom = error;
  }
  selectTopK(selectFrom, count, k, index, words);
  for (size_t j = 0; j < k; ++j) {
    size_t i = index[j];
    topk::packPair(pairs + 2 * j, offset + i, selectFrom[i]);
  }
  if (error != nullptr)
    for (size_t j = 0; j < k; ++j) error[index[j]] = T(0);
}

template <typename T>
void encodeTensor(Scratch& scratch, const T* input, T* error, size_t count, size_t k, uint64_t offset,
                  uint64_t* pairs) {
  if (count <= UINT32_MAX) encodeTensor(input, error, count, k, offset, pairs, scratch.index32, scratch.words);
  else encodeTensor(input, error, count, k, offset, pairs, scratch.index64, scratch.words);
}

// ---- the operation ------------------------------------------------------------------

// Where a tensor's data lives, for messages.
std::string placeText(bool onDevice, int device) {
  return onDevice ? "CUDA device " + std::to_string(device) : std::string("host memory");
}

// The tensor's error vector, created or checked; nullptr with error text on a mismatch.
TensorState* stateFor(shoal_compress_op_t* op, int t, size_t count, const OpState& opState) {
  const shoal_compress_tensor_t& tensor = op->tensors[t];
  const shoal_dtype_t dtype = tensor.input.dtype;
  const size_t bytes = count * shoal_dtype_size(dtype);
  auto* state = static_cast<TensorState*>(*tensor.state);
  // Puts a fresh or loaded (host) state where the op's tensors are.
  auto place = [&]([[maybe_unused]] TensorState* placed) -> bool {  // used by the CUDA build
    if (!opState.onDevice) return true;
#if SHOAL_WITH_CUDA
    if (const char* error = moveToDevice(placed, opState.device)) {
      writeText(op->error_text, op->error_text_size, "topk: no room for the residual of '%s' (%zu bytes) on %s: %s",
                tensor.name, bytes, placeText(true, opState.device).c_str(), error);
      return false;
    }
#endif
    return true;
  };
  if (state == nullptr) {
    state = newState(bytes);
    if (state == nullptr) {
      writeText(op->error_text, op->error_text_size, "topk: out of host memory for the residual of '%s' (%zu bytes)",
                tensor.name, bytes);
      return nullptr;
    }
    if (!place(state)) {
      freeState(state);
      return nullptr;
    }
    state->typed = true;
    state->dtype = dtype;
    state->count = count;
    *tensor.state = state;
    return state;
  }
  if (!state->typed) {
    if (state->bytes != bytes) {
      writeText(op->error_text, op->error_text_size,
                "topk: the state loaded for tensor '%s' holds %zu bytes, but the tensor has %zu elements of %s "
                "(%zu bytes): load the error vector saved for this tensor",
                tensor.name, state->bytes, count, shoal_dtype_name(dtype), bytes);
      return nullptr;
    }
    if (!state->onDevice && !place(state)) return nullptr;
    state->typed = true;
    state->dtype = dtype;
    state->count = count;
    return state;
  }
  if (state->onDevice != opState.onDevice || (state->onDevice && state->device != opState.device)) {
    writeText(op->error_text, op->error_text_size,
              "topk: tensor '%s' kept its residual in %s in earlier calls and is now in %s: a name must stay where "
              "it is (save its state, and load it under a new name)",
              tensor.name, placeText(state->onDevice, state->device).c_str(),
              placeText(opState.onDevice, opState.device).c_str());
    return nullptr;
  }
  if (state->dtype != dtype || state->count != count) {
    writeText(op->error_text, op->error_text_size,
              "topk: tensor '%s' had %zu elements of %s in earlier calls and now has %zu elements of %s: a name "
              "must keep its dtype and size (its residual belongs to that shape)",
              tensor.name, state->count, shoal_dtype_name(state->dtype), count, shoal_dtype_name(dtype));
    return nullptr;
  }
  return state;
}

shoal_status_t start(void* instancePointer, shoal_compress_op_t* op, void** opState) {
  auto* instance = static_cast<Instance*>(instancePointer);
  if (op->op != SHOAL_SUM && op->op != SHOAL_AVG) {
    writeText(op->error_text, op->error_text_size, "topk: op %s is not supported (sum and avg only)",
              shoal_op_name(op->op));
    return SHOAL_ERR_UNSUPPORTED;
  }
  for (int t = 0; t < op->num_tensors; ++t) {
    const shoal_compress_tensor_t& tensor = op->tensors[t];
    if ((tensor.input.dtype != SHOAL_F32 && tensor.input.dtype != SHOAL_F64) ||
        tensor.output.dtype != tensor.input.dtype) {
      writeText(op->error_text, op->error_text_size,
                "topk: tensor %d has dtype %s (output %s): topk takes f32 and f64, output of the input's dtype", t,
                shoal_dtype_name(tensor.input.dtype), shoal_dtype_name(tensor.output.dtype));
      return SHOAL_ERR_UNSUPPORTED;
    }
    const shoal_tensor_t& first = op->tensors[0].input;
    for (const shoal_tensor_t* side : {&tensor.input, &tensor.output})
      if (side->memory != first.memory ||
          (first.memory == SHOAL_MEMORY_CUDA && (side->device != first.device || side->stream != first.stream))) {
        writeText(op->error_text, op->error_text_size,
                  "topk: tensor %d's %s is in %s, tensor 0's input in %s: the tensors of one call must share the "
                  "memory kind, and on CUDA the device and stream",
                  t, side == &tensor.input ? "input" : "output",
                  placeText(side->memory == SHOAL_MEMORY_CUDA, side->device).c_str(),
                  placeText(first.memory == SHOAL_MEMORY_CUDA, first.device).c_str());
        return SHOAL_ERR_INVALID_ARGUMENT;
      }
    if (tensor.input.memory == SHOAL_MEMORY_CUDA) {
#if SHOAL_WITH_CUDA
      if (shoal::elementsCount(tensor.input) > topk::kMaxDeviceCount) {
        writeText(op->error_text, op->error_text_size,
                  "topk: CUDA tensor %d has %zu elements; the GPU path takes at most 2^32 - 1 per tensor (split it)",
                  t, shoal::elementsCount(tensor.input));
        return SHOAL_ERR_UNSUPPORTED;
      }
#else
      writeText(op->error_text, op->error_text_size, "topk: tensor %d is a CUDA tensor; this build has no CUDA "
                "(configure with -DSHOAL_WITH_CUDA=ON)", t);
      return SHOAL_ERR_UNSUPPORTED;
#endif
    }
    if (instance->ef && (tensor.name == nullptr || tensor.name[0] == '\0' || tensor.state == nullptr)) {
      writeText(op->error_text, op->error_text_size,
                "topk: tensor %d has no name, but error feedback (ef=1) keeps its residual by name: pass "
                "shoal_allreduce_options_t.name",
                t);
      return SHOAL_ERR_INVALID_ARGUMENT;
    }
  }
  auto* state = new OpState;
  if (op->num_tensors > 0 && op->tensors[0].input.memory == SHOAL_MEMORY_CUDA) {
    state->onDevice = true;
    state->device = op->tensors[0].input.device;
    state->stream = op->tensors[0].input.stream;
  }
  state->offsets.resize(op->num_tensors + 1);
  size_t total = 0;
  for (int t = 0; t < op->num_tensors; ++t) {
    state->offsets[t] = total;
    total += shoal::elementsCount(op->tensors[t].input);
  }
  state->offsets[op->num_tensors] = total;
  // Check or create every residual here, before any payload moves: a refusal
  // in start() reaches every rank and leaves the communicator usable.
  state->errors.assign(op->num_tensors, nullptr);
  if (instance->ef)
    for (int t = 0; t < op->num_tensors; ++t)
      if ((state->errors[t] = stateFor(op, t, state->offsets[t + 1] - state->offsets[t], *state)) == nullptr) {
        delete state;
        return SHOAL_ERR_INVALID_ARGUMENT;
      }
  *opState = state;
  return SHOAL_OK;
}

#if SHOAL_WITH_CUDA
shoal_status_t cudaFailure(shoal_compress_op_t* op, const OpState& state, const char* what, const char* error) {
  writeText(op->error_text, op->error_text_size, "topk: %s on CUDA device %d failed: %s", what, state.device, error);
  return SHOAL_ERR_INTERNAL;
}

shoal_status_t encodeRoundOnDevice(OpState& state, shoal_compress_op_t* op, shoal_round_t* round,
                                   const std::vector<size_t>& kept, size_t totalKept) {
  cuda::DeviceScope scope(state.device);
  if (scope.error()) return cudaFailure(op, state, "selecting the device", scope.error());
  void* pairs = nullptr;
  if (const char* error = cuda::allocAsync(&pairs, 2 * totalKept * sizeof(uint64_t), state.stream)) {
    writeText(op->error_text, op->error_text_size, "topk: no device memory for the payload (%zu bytes on device %d): %s",
              2 * totalKept * sizeof(uint64_t), state.device, error);
    return SHOAL_ERR_NO_MEMORY;
  }
  state.devicePairs = static_cast<uint64_t*>(pairs);
  uint64_t* written = state.devicePairs;
  for (int t = 0; t < op->num_tensors; ++t) {
    const shoal_compress_tensor_t& tensor = op->tensors[t];
    TensorState* error = state.errors[t];
    if (const char* failure =
            topk::encodeOnDevice(tensor.input.dtype, tensor.input.data, error ? error->data : nullptr,
                                 state.offsets[t + 1] - state.offsets[t], kept[t], state.offsets[t], written,
                                 state.stream))
      return cudaFailure(op, state, "the selection", failure);
    if (error != nullptr)
      if (const char* failure = cuda::recordEvent(error->lastUse, state.stream))
        return cudaFailure(op, state, "recording the residual's last use", failure);
    written += 2 * kept[t];
  }
  requestOnePayload(round, SHOAL_COLLECTIVE_ALLGATHERV, SHOAL_U64, SHOAL_SUM, state.devicePairs, 2 * totalKept);
  return SHOAL_OK;
}
#endif

shoal_status_t encodeRound(Instance& instance, OpState& state, shoal_compress_op_t* op, shoal_round_t* round) {
  const int tensors = op->num_tensors;
  std::vector<size_t> kept(tensors);
  size_t totalKept = 0;
  for (int t = 0; t < tensors; ++t) {
    kept[t] = instance.keptOf(state.offsets[t + 1] - state.offsets[t]);
    totalKept += kept[t];
  }
  state.expectedWords = 2 * totalKept;
  if (state.offsets[tensors] == 0) {  // nothing to reduce (every rank agrees: same shapes)
    round->num_payloads = 0;
    round->done = 1;
    return SHOAL_OK;
  }
  const std::vector<TensorState*>& errors = state.errors;
#if SHOAL_WITH_CUDA
  if (state.onDevice) return encodeRoundOnDevice(state, op, round, kept, totalKept);
#endif

  state.pairs.resize(2 * totalKept);
  uint64_t* pairs = state.pairs.data();
  for (int t = 0; t < tensors; ++t) {
    const shoal_compress_tensor_t& tensor = op->tensors[t];
    const size_t count = state.offsets[t + 1] - state.offsets[t];
    void* error = errors[t] ? errors[t]->data : nullptr;
    if (tensor.input.dtype == SHOAL_F32)
      encodeTensor(instance.scratch, static_cast<const float*>(tensor.input.data), static_cast<float*>(error), count,
                   kept[t], state.offsets[t], pairs);
    else
      encodeTensor(instance.scratch, static_cast<const double*>(tensor.input.data), static_cast<double*>(error), count,
                   kept[t], state.offsets[t], pairs);
    pairs += 2 * kept[t];
  }
  // (op is unused by an allgatherv)
  requestOnePayload(round, SHOAL_COLLECTIVE_ALLGATHERV, SHOAL_U64, SHOAL_SUM, state.pairs.data(),
                    state.pairs.size());
  return SHOAL_OK;
}

inline uint64_t wordAt(const unsigned char* words, size_t w) {
  uint64_t word;
  std::memcpy(&word, words + 8 * w, sizeof word);
  return word;
}

// Adds pairs p, p+1, ... while their index lies in [first, last) to out; returns the next pair.
template <typename T>
size_t addRun(const unsigned char* words, size_t p, size_t pairs, uint64_t first, uint64_t last, T* out) {
  for (; p < pairs; ++p) {
    uint64_t index = wordAt(words, 2 * p);
    if (index < first || index >= last) break;
    out[index - first] += topk::wordValue<T>(wordAt(words, 2 * p + 1));
  }
  return p;
}

#if SHOAL_WITH_CUDA
// Round 1 on the device: zero, add every rank's pairs in rank order, divide
// for avg; then wait for the stream once to read the malformed-pair count.
shoal_status_t decodeOnDevice(OpState& state, shoal_compress_op_t* op, const shoal_payload_t& payload,
                              unsigned* badPairs) {
  cuda::DeviceScope scope(state.device);
  if (scope.error()) return cudaFailure(op, state, "selecting the device", scope.error());
  const int tensors = op->num_tensors;
  std::vector<topk::DeviceOutput> outputs(tensors);
  for (int t = 0; t < tensors; ++t) {
    const shoal_tensor_t& output = op->tensors[t].output;
    outputs[t] = {output.data, output.dtype, state.offsets[t], state.offsets[t + 1]};
    const size_t bytes = (state.offsets[t + 1] - state.offsets[t]) * shoal_dtype_size(output.dtype);
    if (const char* failure = cuda::zeroAsync(output.data, bytes, state.stream))
      return cudaFailure(op, state, "zeroing an output", failure);
  }
  const size_t tableBytes = (tensors * sizeof(topk::DeviceOutput) + 15) / 16 * 16;
  if (const char* failure = cuda::allocAsync(&state.deviceDecode, tableBytes + sizeof(unsigned), state.stream))
    return cudaFailure(op, state, "allocating the outputs' table", failure);
  auto* table = static_cast<topk::DeviceOutput*>(state.deviceDecode);
  auto* deviceBad = reinterpret_cast<unsigned*>(static_cast<unsigned char*>(state.deviceDecode) + tableBytes);
  const char* failure = cuda::copyAsync(table, outputs.data(), tensors * sizeof(topk::DeviceOutput), state.stream);
  if (!failure) failure = cuda::zeroAsync(deviceBad, sizeof(unsigned), state.stream);
  if (!failure)
    failure = topk::addPairsOnDevice(table, tensors, state.offsets[tensors],
                                     static_cast<const uint64_t*>(payload.gathered), payload.gathered_counts,
                                     payload.gathered_displs, op->world_size, deviceBad, state.stream);
  for (int t = 0; t < tensors && !failure && op->op == SHOAL_AVG; ++t)
    failure = topk::divideOnDevice(outputs[t].dtype, outputs[t].data, state.offsets[t + 1] - state.offsets[t],
                                   op->world_size, state.stream);
  if (!failure) failure = cuda::copyAsync(badPairs, deviceBad, sizeof(unsigned), state.stream);
  if (!failure) failure = cuda::synchronize(state.stream);
  if (failure) return cudaFailure(op, state, "adding the gathered pairs", failure);
  return SHOAL_OK;
}
#endif

shoal_status_t decodeRound(OpState& state, shoal_compress_op_t* op, shoal_round_t* round) {
  auto broken = [&](auto... args) {
    char detail[200];
    std::snprintf(detail, sizeof detail, args...);
    writeText(op->error_text, op->error_text_size, "topk: malformed gathered payload in round 1: %s", detail);
    return SHOAL_ERR_INTERNAL;
  };
  if (round->num_payloads != 1 || round->payloads[0].collective != SHOAL_COLLECTIVE_ALLGATHERV ||
      round->payloads[0].dtype != SHOAL_U64)
    return broken("expected the one u64 allgatherv payload of round 0 (got %d payloads)", round->num_payloads);
  const shoal_payload_t& payload = round->payloads[0];
  if (payload.gathered_counts == nullptr || payload.gathered_displs == nullptr)
    return broken("no gathered counts");
  const int tensors = op->num_tensors;
  const uint64_t total = state.offsets[tensors];
  // Every rank sends the same number of pairs (k follows from the agreed
  // options and shapes), one after the other: anything else was not sent by
  // this code, and a count or offset from it must not size a read.
  for (int r = 0; r < op->world_size; ++r) {
    if (payload.gathered_counts[r] != state.expectedWords)
      return broken("rank %d sent %zu words, every rank sends %zu (2 per kept element)", r,
                    payload.gathered_counts[r], state.expectedWords);
    if (payload.gathered_displs[r] != size_t(r) * state.expectedWords)
      return broken("rank %d's words start at %zu, not %zu", r, payload.gathered_displs[r],
                    size_t(r) * state.expectedWords);
  }
  if (total > 0 && state.expectedWords > 0 && payload.gathered == nullptr) return broken("no gathered words");
#if SHOAL_WITH_CUDA
  if (state.onDevice) {
    unsigned badPairs = 0;
    if (shoal_status_t status = decodeOnDevice(state, op, payload, &badPairs); status != SHOAL_OK) return status;
    if (badPairs > 0) return broken("%u gathered pairs have an index beyond the %llu elements", badPairs,
                                    static_cast<unsigned long long>(total));
    round->num_payloads = 0;
    round->done = 1;
    return SHOAL_OK;
  }
#endif
  for (int t = 0; t < tensors; ++t) {
    const shoal_compress_tensor_t& tensor = op->tensors[t];
    size_t count = state.offsets[t + 1] - state.offsets[t];
    if (count > 0) std::memset(tensor.output.data, 0, count * shoal_dtype_size(tensor.output.dtype));
  }
  const auto* gathered = static_cast<const unsigned char*>(payload.gathered);
  // Each rank's indices are strictly ascending and below the total (the
  // encoder sorts them): checked before any is added, so a corrupted payload
  // leaves the outputs zero rather than half-summed.
  for (int r = 0; r < op->world_size; ++r) {
    const unsigned char* base = gathered + 8 * payload.gathered_displs[r];
    for (size_t p = 0; p < payload.gathered_counts[r] / 2; ++p) {
      const uint64_t index = wordAt(base, 2 * p);
      if (index >= total)
        return broken("rank %d's pair %zu has index %llu, past the %llu elements", r, p,
                      static_cast<unsigned long long>(index), static_cast<unsigned long long>(total));
      if (p > 0 && index <= wordAt(base, 2 * (p - 1)))
        return broken("rank %d's pair %zu has index %llu, not above the previous one", r, p,
                      static_cast<unsigned long long>(index));
    }
  }
  for (int r = 0; r < op->world_size; ++r) {
    const size_t words = payload.gathered_counts[r];
    if (words % 2 != 0) return broken("rank %d sent an odd number of words (%zu)", r, words);
    const size_t pairs = words / 2;
    const unsigned char* base = gathered + 8 * payload.gathered_displs[r];
    size_t p = 0;
    int t = 0;
    while (p < pairs) {
      uint64_t index = wordAt(base, 2 * p);
      if (index >= total)
        return broken("index %llu out of range (%llu elements)", static_cast<unsigned long long>(index),
                      static_cast<unsigned long long>(total));
      if (index < state.offsets[t] || index >= state.offsets[t + 1])
        t = static_cast<int>(std::upper_bound(state.offsets.begin(), state.offsets.end() - 1, index) -
                             state.offsets.begin() - 1);
      const shoal_compress_tensor_t& tensor = op->tensors[t];
      if (tensor.output.dtype == SHOAL_F32)
        p = addRun(base, p, pairs, state.offsets[t], state.offsets[t + 1], static_cast<float*>(tensor.output.data));
      else
        p = addRun(base, p, pairs, state.offsets[t], state.offsets[t + 1], static_cast<double*>(tensor.output.data));
    }
  }
  if (op->op == SHOAL_AVG) {
    for (int t = 0; t < tensors; ++t) {
      const shoal_compress_tensor_t& tensor = op->tensors[t];
      size_t count = state.offsets[t + 1] - state.offsets[t];
      if (tensor.output.dtype == SHOAL_F32) {
        auto* out = static_cast<float*>(tensor.output.data);
        const float n = static_cast<float>(op->world_size);
        for (size_t i = 0; i < count; ++i) out[i] /= n;
      } else {
        auto* out = static_cast<double*>(tensor.output.data);
        const double n = static_cast<double>(op->world_size);
        for (size_t i = 0; i < count; ++i) out[i] /= n;
      }
    }
  }
  round->num_payloads = 0;
  round->done = 1;
  return SHOAL_OK;
}

shoal_status_t round(void* instance, void* opState, shoal_compress_op_t* op, shoal_round_t* round) {
  auto& state = *static_cast<OpState*>(opState);
  if (round->index == 0) return encodeRound(*static_cast<Instance*>(instance), state, op, round);
  if (round->index == 1) return decodeRound(state, op, round);
  writeText(op->error_text, op->error_text_size, "topk: called for round %d, but it is done after round 1",
            round->index);
  return SHOAL_ERR_INTERNAL;
}

void finish(void*, void* opStatePointer) {
  auto* state = static_cast<OpState*>(opStatePointer);
#if SHOAL_WITH_CUDA
  if (state->onDevice) {
    cuda::DeviceScope scope(state->device);
    cuda::freeAsync(state->devicePairs, state->stream);  // stream-ordered: after the kernels that use them
    cuda::freeAsync(state->deviceDecode, state->stream);
  }
#endif
  delete state;
}

// ---- tensor state ------------------------------------------------------------------

void destroyTensorState(void*, void* state) { freeState(static_cast<TensorState*>(state)); }

shoal_status_t saveTensorState(void*, const void* statePointer, void* buffer, size_t* bytes) {
  const auto* state = static_cast<const TensorState*>(statePointer);
  if (state == nullptr || bytes == nullptr) return state == nullptr ? SHOAL_ERR_NOT_FOUND : SHOAL_ERR_INVALID_ARGUMENT;
  if (buffer == nullptr) {
    *bytes = state->bytes;
    return SHOAL_OK;
  }
  if (*bytes < state->bytes) {
    *bytes = state->bytes;
    return SHOAL_ERR_INVALID_ARGUMENT;  // buffer too small: *bytes says how much is needed
  }
  if (state->onDevice) {
#if SHOAL_WITH_CUDA
    cuda::DeviceScope scope(state->device);
    const char* error = scope.error();
    if (!error) error = cuda::waitEvent(state->lastUse);
    if (!error) error = cuda::copyBlocking(buffer, state->data, state->bytes);
    if (error) return SHOAL_ERR_INTERNAL;
#endif
  } else if (state->bytes > 0) {
    std::memcpy(buffer, state->data, state->bytes);
  }
  *bytes = state->bytes;
  return SHOAL_OK;
}

shoal_status_t loadTensorState(void* instancePointer, void** statePointer, const void* buffer, size_t bytes) {
  const auto& instance = *static_cast<const Instance*>(instancePointer);
  if (statePointer == nullptr || (buffer == nullptr && bytes > 0)) return SHOAL_ERR_INVALID_ARGUMENT;
  if (!instance.ef) {
    logText(instance.log, 1, "topk: ef=0 keeps no state; nothing to load");
    return SHOAL_ERR_UNSUPPORTED;
  }
  if (bytes % sizeof(float) != 0) {
    logText(instance.log, 1, "topk: a state of %zu bytes is no error vector of f32 or f64 elements", bytes);
    return SHOAL_ERR_INVALID_ARGUMENT;
  }
  auto* state = static_cast<TensorState*>(*statePointer);
  if (state == nullptr) {
    state = newState(bytes);
    if (state == nullptr) return SHOAL_ERR_NO_MEMORY;
    if (bytes > 0) std::memcpy(state->data, buffer, bytes);
    *statePointer = state;  // untyped until the tensor's next call checks the size
    return SHOAL_OK;
  }
  if (bytes != state->bytes) {
    if (state->typed)
      logText(instance.log, 1, "topk: the tensor's error vector has %zu elements of %s (%zu bytes); got %zu bytes",
                 state->count, shoal_dtype_name(state->dtype), state->bytes, bytes);
    else
      logText(instance.log, 1, "topk: the tensor's loaded state has %zu bytes; got %zu bytes", state->bytes, bytes);
    return SHOAL_ERR_INVALID_ARGUMENT;
  }
  if (state->onDevice) {
#if SHOAL_WITH_CUDA
    cuda::DeviceScope scope(state->device);
    const char* error = scope.error();
    if (!error) error = cuda::waitEvent(state->lastUse);
    if (!error) error = cuda::copyBlocking(state->data, buffer, bytes);
    if (error) {
      logText(instance.log, 0, "topk: loading the state into CUDA device %d failed: %s", state->device, error);
      return SHOAL_ERR_INTERNAL;
    }
#endif
    return SHOAL_OK;
  }
  if (bytes > 0) std::memcpy(state->data, buffer, bytes);
  return SHOAL_OK;
}

#if SHOAL_WITH_CUDA
constexpr uint64_t kCudaCap = SHOAL_CAP_CUDA;
#else
constexpr uint64_t kCudaCap = 0;
#endif

const shoal_compressor_t kTopk = {
    .abi_version = SHOAL_COMPRESSOR_ABI_VERSION,
    .struct_size = sizeof(shoal_compressor_t),
    .name = "topk",
    .description = "top-k sparsification: each rank sends its k largest |g + e| as (index, value) pairs "
                   "(allgatherv); error feedback keeps the rest for the next call",
    .options_help = kOptionsHelp,
    .caps = SHOAL_CAP_HOST | SHOAL_CAP_STATEFUL | kCudaCap,
    .error_kind = SHOAL_ERROR_FEEDBACK,
    .error_bound = 0.0,
    .dtypes = (1u << SHOAL_F32) | (1u << SHOAL_F64),
    .create = create,
    .destroy = destroy,
    .start = start,
    .round = round,
    .finish = finish,
    .destroy_tensor_state = destroyTensorState,
    .save_tensor_state = saveTensorState,
    .load_tensor_state = loadTensorState,
};

}  // namespace

const shoal_compressor_t* topk() { return &kTopk; }

}  // namespace shoal::compressors
