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
// Tensor state (each name's residual, its saved layout): topk_state.cc. CUDA
// tensors: topk_device.cc. What the files share: topk_instance.h.
#include <algorithm>
#include <cmath>
#include <cstdio>
#include <cstring>
#include <functional>
#include <numeric>
#include <string>
#include <type_traits>
#include <vector>

#include "compressors/common/payload.h"
#include "compressors/common/text.h"
#include "compressors/topk/topk_instance.h"
#include "compressors/topk/topk_math.h"
#include "core/tensor.h"
#include "shoal/compressor.h"

#if SHOAL_WITH_CUDA
#include "compressors/topk/topk_cuda.h"
#endif

namespace shoal::compressors {
namespace {

using namespace shoal::compressors::topk_impl;

constexpr uint64_t kMaxK = 1000000000000000000ull;  // 10^18: beyond any tensor
constexpr const char* kOptionsHelp =
    "k=<int >= 1>: elements kept per tensor (capped at its size); "
    "ratio=<float in (0,1]>: keep max(1, ceil(ratio * count)) per tensor (default 0.01; not together with k); "
    "ef=0|1: error feedback, the unsent rest is added to the next call's tensor of the same name (default 1). "
    "With ef=1 tensors need a name.";

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
    return roundsDone(round);
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
    return roundsDone(round);
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
  return roundsDone(round);
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
  if (state->onDevice) releaseDeviceMemory(*state);
#endif
  delete state;
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
