// powersgd: rank-r PowerSGD (Vogels et al. 2019) with warm start and error
// feedback, following PyTorch's powerSGD_hook. f32, f16 and bf16 gradients
// (factor math in f32; the error vector in the gradient's dtype, as PyTorch
// keeps it). The step itself is powersgd_engine.{h,cc}, shared with the PowerSGD
// plan of include/shoal/lowrank.h (plan.h); this file maps it onto the compressor rounds.
//
// Each tensor of count elements is viewed as a matrix M [rows, cols] with
// rows = shape[0] and cols = count / rows. It is compressed at rank
// r = min(rows, cols, rank) iff ndim >= 2 and (rows + cols) * r *
// min_compression_rate < rows * cols (PyTorch's rule); every other tensor (1-D,
// scalars, small or square-ish ones) rides densely in the P payload.
//
// Per call, on every rank (n ranks; M_w below is rank w's matrix):
//   round 0: M = g + e_old in f32 (ef=1; e_old = 0 the first
//            time; ef=0: M = g). Q (per tensor state, identical on every rank)
//            is orthonormalized (Gram-Schmidt, powersgd_math.h); on the first
//            call it is drawn from a counter-based RNG keyed by (seed, FNV-1a
//            hash of the tensor's name, generation), and any column that is
//            zero (e.g. after an all-zero gradient) is redrawn with the next
//            generation, so Q never gets stuck at zero. P_w = M_w Q. No M
//            workspace (powersgd_engine.h): for f32 tensors with ef=1 the
//            error vector becomes M here (e := g + e_old) and round 2 writes
//            e_new over it; otherwise each round forms M's rows from the input
//            (which must stay as it is until the outputs are written) and e.
//            The products are the row kernels of powersgd_kernels.h.
//            Payload 0: one f32 buffer [every P, same-shape matrices adjacent |
//            every dense tensor's M], allreduce SUM (P = sum_w P_w, not
//            divided: orthonormalization removes the scale).
//   round 1: P orthonormalized (zero-column guard: a column that is zero or in
//            the span of the earlier ones becomes 0, never NaN); Q_w = M_wᵀ P.
//            Payload 0: flat f32 buffer of every Q, allreduce SUM.
//            (No compressed tensor: the outputs are written and the call is done.)
//   round 2: Q = Q_sum / n is kept for the warm start (the same bits on every
//            rank); A = P Qᵀ, the approximation of the *average* M (loops in
//            a fixed order, so every rank computes the same bits); out = A (avg) or
//            n * A (sum); e_new = M_w - A (PyTorch: error = input copy - the
//            decompressed average); dense tensors: out = sum (avg: / n),
//            e_new = 0. So out == sum_w (g_w + e_old_w - e_new_w) (avg: / n) up
//            to rounding. A call that fails between rounds leaves e = g + e_old
//            (f32, ef=1: the failed step's gradient carried by the error
//            feedback) or e_old (f16/bf16) in the tensor's state.
// If the summed matrix has rank <= r (and Q's columns are in general position
// with respect to it), P spans its column space and P Pᵀ M_sum = M_sum, so the
// output is exact up to rounding from the first call on.
// Before start_iter (op->step < start_iter): one round, a plain SUM allreduce of
// g (avg: / n); e is left as it is (PyTorch's vanilla allreduce phase).
//
// Options: rank=<int 1..1024> (default 4), ef=0|1 (default 1),
// start_iter=<int >= 0> (default 0), min_compression_rate=<float >= 0>
// (default 2), seed=<uint64> (default 0). Tensors must be named (the table
// declares SHOAL_CAP_STATEFUL; Q is kept by name even with ef=0).
//
// Tensor state layout (shoal_compressor_state_save / _load), native byte order:
//   error[count]        the error vector in the tensor's dtype (zeros with ef=0
//                       or for dense tensors)
//   f32 Q[cols * r]     the warm-start factor, row-major [cols x r]
//                       (absent, 0 elements, for tensors routed dense)
//   u64 count, u64 cols, u64 r, u64 flags, u64 dtype   (flags bit 0: Q holds a
//                       value; bits 1..63: how many columns the RNG has drawn so
//                       far, so a resumed run redraws zero columns with the same
//                       bits; dtype: the shoal_dtype_t of the error vector)
// total size(dtype) * count + 4 * cols * r + 40 bytes. A state loaded before the
// tensor's first call is checked by that call (count, dtype, and cols / r of the
// plan); a name must keep its shape, dtype and options between calls.
//
// CUDA tensors (GPU build only): the same step on the device, powersgd_cuda.h.
#include <cmath>
#include <cstdlib>
#include <cstring>
#include <string>
#include <vector>

#include "compressors/common/payload.h"
#include "compressors/common/text.h"
#include "compressors/powersgd/powersgd_engine.h"
#include "compressors/powersgd/powersgd_math.h"
#include "core/tensor.h"
#if SHOAL_WITH_CUDA
#include "compressors/powersgd/powersgd_cuda.h"
#endif
#include "shoal/compressor.h"

namespace shoal::compressors {
namespace {

using namespace shoal::powersgd;

constexpr const char* kOptionsHelp =
    "rank=<int 1..1024>: rank of the approximation (default 4); "
    "ef=0|1: error feedback (default 1); "
    "start_iter=<int >= 0>: plain allreduce while the communicator's compressed-call step is below it (default 0); "
    "min_compression_rate=<float >= 0>: compress a [rows x cols] tensor only if (rows+cols)*r*rate < rows*cols, "
    "others go dense (default 2); seed=<uint64>: seed of the initial Q (default 0). f32, f16, bf16 (factor math "
    "in f32); tensors need a name";

// One call's host buffers: the P and Q payloads (no M workspace: see round 0).
struct HostBuffers {
  std::vector<float> p, q;
};

struct Instance {
  Options options;
  shoal_log_fn log = nullptr;
  // Buffers of finished calls, reused (no allocation and page faults per call
  // once they have grown to the largest tensor).
  std::vector<HostBuffers> spare;
#if SHOAL_WITH_CUDA
  cuda::Context* cuda = nullptr;  // created by the first call on CUDA tensors
  ~Instance() { cuda::destroyContext(cuda); }
#endif
};

struct OpState {
  bool plain = false;
#if SHOAL_WITH_CUDA
  bool onDevice = false;  // CUDA tensors: the step runs in powersgd.cu
  int device = -1;
  void* stream = nullptr;
  cuda::StepBuffers deviceBuffers;
#endif
  Layout layout;
  std::vector<shoal_dtype_t> dtypes;
  std::vector<const void*> inputs;
  std::vector<void*> outputs;
  std::vector<MatrixState*> states;
  std::vector<uint64_t> keys;
  HostBuffers buffers;
  std::vector<float>& pbuf = buffers.p;
  std::vector<float>& qbuf = buffers.q;
  StepIo io() const {
    return {static_cast<int>(states.size()), dtypes.data(), inputs.data(), outputs.data(), states.data(), keys.data()};
  }
};

// ---- options ------------------------------------------------------------------

bool parseUnsigned(const char* text, uint64_t max, uint64_t* out) {
  size_t length = std::strlen(text);
  if (length == 0 || length > 20) return false;
  unsigned long long value = 0;
  for (size_t i = 0; i < length; ++i) {
    if (text[i] < '0' || text[i] > '9') return false;
    unsigned digit = static_cast<unsigned>(text[i] - '0');
    if (value > (max - digit) / 10) return false;
    value = value * 10 + digit;
  }
  *out = value;
  return true;
}

shoal_status_t create(const shoal_compressor_params_t* params, void** instance) {
  auto refuse = [&](auto... args) {
    writeText(params->error_text, params->error_text_size, args...);
    return SHOAL_ERR_INVALID_ARGUMENT;
  };
  Options parsed;
  shoal_log_fn log = params->log;
  for (int i = 0; i < params->num_options; ++i) {
    const char* key = params->keys[i];
    const char* value = params->values[i];
    uint64_t number = 0;
    if (std::strcmp(key, "rank") == 0) {
      if (!parseUnsigned(value, kMaxRank, &number) || number < 1)
        return refuse("powersgd: option rank must be an integer in 1..%d, got '%s'", kMaxRank, value);
      parsed.rank = static_cast<int>(number);
    } else if (std::strcmp(key, "ef") == 0) {
      if (std::strcmp(value, "0") != 0 && std::strcmp(value, "1") != 0)
        return refuse("powersgd: option ef must be 0 or 1 (error feedback off or on), got '%s'", value);
      parsed.ef = value[0] == '1';
    } else if (std::strcmp(key, "start_iter") == 0) {
      if (!parseUnsigned(value, UINT64_MAX, &number))
        return refuse("powersgd: option start_iter must be an integer >= 0, got '%s'", value);
      parsed.startIter = number;
    } else if (std::strcmp(key, "seed") == 0) {
      if (!parseUnsigned(value, UINT64_MAX, &number))
        return refuse("powersgd: option seed must be an unsigned 64-bit integer, got '%s'", value);
      parsed.seed = number;
    } else if (std::strcmp(key, "min_compression_rate") == 0) {
      char* end = nullptr;
      double rate = value[0] && !std::isspace(static_cast<unsigned char>(value[0])) ? std::strtod(value, &end) : -1;
      if (end == nullptr || end == value || *end != '\0' || !std::isfinite(rate) || rate < 0)
        return refuse("powersgd: option min_compression_rate must be a finite number >= 0, got '%s'", value);
      parsed.minCompressionRate = rate;
    } else {
      return refuse("powersgd: unknown option '%s'; powersgd takes rank=<int>, ef=0|1, start_iter=<int>, "
                    "min_compression_rate=<float>, seed=<int>",
                    key);
    }
  }
  auto* created = new Instance;
  created->options = parsed;
  created->log = log;
  *instance = created;
  return SHOAL_OK;
}

void destroy(void* instance) { delete static_cast<Instance*>(instance); }

// ---- the operation ------------------------------------------------------------------

bool supportedMemory(shoal_memory_t memory) {
#if SHOAL_WITH_CUDA
  return memory == SHOAL_MEMORY_HOST || memory == SHOAL_MEMORY_CUDA;
#else
  return memory == SHOAL_MEMORY_HOST;
#endif
}

shoal_status_t start(void* instancePointer, shoal_compress_op_t* op, void** opState) {
  auto* instance = static_cast<Instance*>(instancePointer);
  if (op->op != SHOAL_SUM && op->op != SHOAL_AVG) {
    writeText(op->error_text, op->error_text_size, "powersgd: op %s is not supported (sum and avg only)",
              shoal_op_name(op->op));
    return SHOAL_ERR_UNSUPPORTED;
  }
  for (int t = 0; t < op->num_tensors; ++t) {
    const shoal_compress_tensor_t& tensor = op->tensors[t];
    if (!supportedDtype(tensor.input.dtype) || tensor.output.dtype != tensor.input.dtype) {
      writeText(op->error_text, op->error_text_size,
                "powersgd: tensor %d has dtype %s (output %s): f32, f16 or bf16, the same for input and output", t,
                shoal_dtype_name(tensor.input.dtype), shoal_dtype_name(tensor.output.dtype));
      return SHOAL_ERR_UNSUPPORTED;
    }
    const shoal_tensor_t& first = op->tensors[0].input;
    if (tensor.input.memory != first.memory || tensor.output.memory != first.memory ||
        (first.memory == SHOAL_MEMORY_CUDA &&
         (tensor.input.device != first.device || tensor.output.device != first.device ||
          tensor.input.stream != first.stream))) {
      writeText(op->error_text, op->error_text_size,
                "powersgd: tensor %d's memory (input, output) differs from tensor 0's: one call takes host tensors or "
                "CUDA tensors of one device and stream",
                t);
      return SHOAL_ERR_UNSUPPORTED;
    }
    if (!supportedMemory(first.memory)) {
      writeText(op->error_text, op->error_text_size,
                "powersgd: tensor %d is not in host memory (CUDA tensors need the GPU build)", t);
      return SHOAL_ERR_UNSUPPORTED;
    }
    if (tensor.name == nullptr || tensor.name[0] == '\0' || tensor.state == nullptr) {
      writeText(op->error_text, op->error_text_size,
                "powersgd: tensor %d has no name, but powersgd keeps its warm-start Q and error feedback by name: "
                "pass shoal_allreduce_options_t.name",
                t);
      return SHOAL_ERR_INVALID_ARGUMENT;
    }
  }
  auto* state = new OpState;
  state->plain = op->step < instance->options.startIter;
  if (!instance->spare.empty()) {
    state->buffers = std::move(instance->spare.back());
    instance->spare.pop_back();
  }
#if SHOAL_WITH_CUDA
  state->onDevice = op->num_tensors > 0 && op->tensors[0].input.memory == SHOAL_MEMORY_CUDA;
  state->device = state->onDevice ? op->tensors[0].input.device : -1;
  state->stream = state->onDevice ? op->tensors[0].input.stream : nullptr;
#endif
  std::vector<Shape> shapes(op->num_tensors);
  for (int t = 0; t < op->num_tensors; ++t) {
    const shoal_tensor_t& input = op->tensors[t].input;
    const size_t count = shoal::elementsCount(input);
    const size_t rows = input.ndim >= 2 && count ? static_cast<size_t>(input.shape[0]) : count;
    shapes[t] = shapeOf(rows, rows ? count / rows : 0, instance->options.rank, instance->options.minCompressionRate,
                        input.ndim < 2);
  }
  state->layout = makeLayout(shapes);
  for (int t = 0; t < op->num_tensors; ++t) {
    const shoal_compress_tensor_t& tensor = op->tensors[t];
    auto* matrix = static_cast<MatrixState*>(*tensor.state);
    if (matrix == nullptr) *tensor.state = matrix = new MatrixState;
    const std::string mismatch = checkState(*matrix, shapes[t], tensor.input.dtype);
    if (!mismatch.empty()) {
      writeText(op->error_text, op->error_text_size, "powersgd: tensor '%s': %s", tensor.name, mismatch.c_str());
      delete state;
      return SHOAL_ERR_INVALID_ARGUMENT;
    }
#if SHOAL_WITH_CUDA
    // The state follows the tensor: to the device for CUDA tensors, back to the host otherwise.
    std::string moved;
    if (state->onDevice) {
      moved = cuda::upload(*matrix, state->device);
    } else if (matrix->onDevice()) {
      MatrixState host;
      moved = cuda::download(*matrix, &host);
      if (moved.empty()) {
        cuda::release(*matrix);
        *matrix = std::move(host);
      }
    }
    if (!moved.empty()) {
      writeText(op->error_text, op->error_text_size, "powersgd: tensor '%s': %s", tensor.name, moved.c_str());
      delete state;
      return SHOAL_ERR_INTERNAL;
    }
#endif
    state->dtypes.push_back(tensor.input.dtype);
    state->inputs.push_back(tensor.input.data);
    state->outputs.push_back(tensor.output.data);
    state->states.push_back(matrix);
    state->keys.push_back(nameHash(tensor.name));
  }
  *opState = state;
  return SHOAL_OK;
}

shoal_status_t finishOutputs(const Instance& instance, OpState& state, shoal_compress_op_t* op,
                             shoal_round_t* round) {
#if SHOAL_WITH_CUDA
  if (state.onDevice) {
    const std::string error = cuda::finishStep(instance.options, state.layout, state.plain, state.io(),
                                               state.deviceBuffers, op->world_size, op->op, state.device, state.stream);
    if (!error.empty()) {
      writeText(op->error_text, op->error_text_size, "%s", error.c_str());
      return SHOAL_ERR_INTERNAL;
    }
    return roundsDone(round);
  }
#endif
  finishStep(instance.options, state.layout, state.plain, state.io(), state.pbuf.data(), state.qbuf.data(),
             nullptr, op->world_size, op->op);
  return roundsDone(round);
}

#if SHOAL_WITH_CUDA
// The CUDA rounds: the same phases on device buffers; payloads in device memory.
shoal_status_t deviceRound(Instance& instance, OpState& state, shoal_compress_op_t* op, shoal_round_t* round) {
  std::string error;
  size_t count = 0;
  float* payload = nullptr;
  if (round->index == 0) {
    if (instance.cuda == nullptr) instance.cuda = cuda::createContext();
    error = cuda::allocateStep(state.layout, state.device, state.stream, &state.deviceBuffers);
    if (error.empty())
      error = cuda::phaseP(*instance.cuda, instance.options, state.layout, state.plain, state.io(),
                           state.deviceBuffers, state.device, state.stream, &count);
    payload = state.deviceBuffers.p;
  } else if (round->index == 1) {
    error = cuda::phaseQ(*instance.cuda, state.layout, state.plain, state.deviceBuffers, state.device, state.stream,
                         &count);
    payload = state.deviceBuffers.q;
  }
  if (!error.empty()) {
    writeText(op->error_text, op->error_text_size, "%s", error.c_str());
    return SHOAL_ERR_INTERNAL;
  }
  if (round->index == 2 || count == 0) return finishOutputs(instance, state, op, round);
  requestOnePayload(round, SHOAL_COLLECTIVE_ALLREDUCE, SHOAL_F32, SHOAL_SUM, payload, count);
  return SHOAL_OK;
}
#endif

shoal_status_t round0(const Instance& instance, OpState& state, shoal_compress_op_t* op, shoal_round_t* round) {
  // Every element the step reads is written first: resize, no fill.
  const Layout& layout = state.layout;
  state.pbuf.resize(state.plain ? layout.plainElems : layout.pElems + layout.denseElems);
  state.qbuf.resize(state.plain ? 0 : layout.qElems);
  const size_t count = phaseP(instance.options, state.layout, state.plain, state.io(), state.pbuf.data(), nullptr);
  if (count == 0) return finishOutputs(instance, state, op, round);
  requestOnePayload(round, SHOAL_COLLECTIVE_ALLREDUCE, SHOAL_F32, SHOAL_SUM, state.pbuf.data(), count);
  return SHOAL_OK;
}

shoal_status_t round1(const Instance& instance, OpState& state, shoal_compress_op_t* op, shoal_round_t* round) {
  if (round->num_payloads != 1 || round->payloads[0].buffer != state.pbuf.data()) {
    writeText(op->error_text, op->error_text_size, "powersgd: round 1 did not get back the P payload");
    return SHOAL_ERR_INTERNAL;
  }
  const size_t count =
      phaseQ(instance.options, state.layout, state.plain, state.io(), state.pbuf.data(), nullptr, state.qbuf.data());
  if (count == 0) return finishOutputs(instance, state, op, round);
  requestOnePayload(round, SHOAL_COLLECTIVE_ALLREDUCE, SHOAL_F32, SHOAL_SUM, state.qbuf.data(), count);
  return SHOAL_OK;
}

shoal_status_t round2(const Instance& instance, OpState& state, shoal_compress_op_t* op, shoal_round_t* round) {
  if (round->num_payloads != 1 || round->payloads[0].buffer != state.qbuf.data()) {
    writeText(op->error_text, op->error_text_size, "powersgd: round 2 did not get back the Q payload");
    return SHOAL_ERR_INTERNAL;
  }
  return finishOutputs(instance, state, op, round);
}

shoal_status_t round(void* instance, void* opState, shoal_compress_op_t* op, shoal_round_t* round) {
  auto& self = *static_cast<Instance*>(instance);
  auto& state = *static_cast<OpState*>(opState);
#if SHOAL_WITH_CUDA
  const bool expected = round->index < 2 || (round->index == 2 && !state.plain && state.layout.compressed);
  if (state.onDevice && expected) {
    if (round->index > 0 && (round->num_payloads != 1 || (round->payloads[0].buffer != state.deviceBuffers.p &&
                                                          round->payloads[0].buffer != state.deviceBuffers.q))) {
      writeText(op->error_text, op->error_text_size, "powersgd: round %d did not get back its payload", round->index);
      return SHOAL_ERR_INTERNAL;
    }
    return deviceRound(self, state, op, round);
  }
#endif
  switch (round->index) {
    case 0: return round0(self, state, op, round);
    case 1: return round1(self, state, op, round);
    case 2:
      if (!state.plain && state.layout.compressed) return round2(self, state, op, round);
      break;
    default: break;
  }
  writeText(op->error_text, op->error_text_size, "powersgd: called for round %d after it was done", round->index);
  return SHOAL_ERR_INTERNAL;
}

void finish(void* instancePointer, void* opState) {
  auto* instance = static_cast<Instance*>(instancePointer);
  auto* state = static_cast<OpState*>(opState);
#if SHOAL_WITH_CUDA
  if (state->onDevice) cuda::freeStep(&state->deviceBuffers, state->device, state->stream);
#endif
  if (instance->spare.size() < 2) instance->spare.push_back(std::move(state->buffers));
  delete state;
}

// ---- tensor state ------------------------------------------------------------------

void destroyTensorState(void*, void* statePointer) {
  auto* state = static_cast<MatrixState*>(statePointer);
#if SHOAL_WITH_CUDA
  if (state != nullptr) cuda::release(*state);
#endif
  delete state;
}

shoal_status_t saveTensorState(void*, const void* statePointer, void* buffer, size_t* bytes) {
  const auto* state = static_cast<const MatrixState*>(statePointer);
  if (state == nullptr) return SHOAL_ERR_NOT_FOUND;
  if (bytes == nullptr) return SHOAL_ERR_INVALID_ARGUMENT;
  const size_t need = stateBytes(*state);
  if (buffer == nullptr) {
    *bytes = need;
    return SHOAL_OK;
  }
  if (*bytes < need) {
    *bytes = need;
    return SHOAL_ERR_INVALID_ARGUMENT;
  }
#if SHOAL_WITH_CUDA
  if (state->onDevice()) {
    MatrixState host;
    if (!cuda::download(*state, &host).empty()) return SHOAL_ERR_INTERNAL;
    saveState(host, static_cast<uint8_t*>(buffer));
    *bytes = need;
    return SHOAL_OK;
  }
#endif
  saveState(*state, static_cast<uint8_t*>(buffer));
  *bytes = need;
  return SHOAL_OK;
}

shoal_status_t loadTensorState(void* instancePointer, void** statePointer, const void* buffer, size_t bytes) {
  const auto& instance = *static_cast<const Instance*>(instancePointer);
  if (statePointer == nullptr || buffer == nullptr) return SHOAL_ERR_INVALID_ARGUMENT;
  MatrixState loaded;
  const std::string why = loadState(static_cast<const uint8_t*>(buffer), bytes, &loaded);
  if (!why.empty()) {
    logText(instance.log, 1, "powersgd: %s", why.c_str());
    return SHOAL_ERR_INVALID_ARGUMENT;
  }
  auto* existing = static_cast<MatrixState*>(*statePointer);
  if (existing != nullptr && existing->typed &&
      (existing->count != loaded.count || existing->cols != loaded.cols || existing->r != loaded.r ||
       existing->dtype != loaded.dtype)) {
    logText(instance.log, 1,
            "powersgd: the tensor's state has %zu %s elements and Q [%zu x %d]; the loaded one %zu %s and [%zu x %d]",
            existing->count, shoal_dtype_name(existing->dtype), existing->cols, existing->r, loaded.count,
            shoal_dtype_name(loaded.dtype), loaded.cols, loaded.r);
    return SHOAL_ERR_INVALID_ARGUMENT;
  }
  loaded.typed = existing != nullptr && existing->typed;
#if SHOAL_WITH_CUDA
  if (existing != nullptr) cuda::release(*existing);  // the next call on CUDA tensors uploads the loaded state
#endif
  if (existing == nullptr) *statePointer = new MatrixState(std::move(loaded));
  else *existing = std::move(loaded);
  return SHOAL_OK;
}

#if SHOAL_WITH_CUDA
constexpr uint64_t kCaps =
    SHOAL_CAP_HOST | SHOAL_CAP_CUDA | SHOAL_CAP_STATEFUL | SHOAL_CAP_HOMOMORPHIC | SHOAL_CAP_MATRIX;
#else
constexpr uint64_t kCaps = SHOAL_CAP_HOST | SHOAL_CAP_STATEFUL | SHOAL_CAP_HOMOMORPHIC | SHOAL_CAP_MATRIX;
#endif

const shoal_compressor_t kPowerSgd = {
    .abi_version = SHOAL_COMPRESSOR_ABI_VERSION,
    .struct_size = sizeof(shoal_compressor_t),
    .name = "powersgd",
    .description = "PowerSGD low-rank compression: P = M Q and Q = M^T P summed by allreduce (warm start, one power "
                   "iteration per call); small and 1-D tensors ride densely with P; error feedback",
    .options_help = kOptionsHelp,
    .caps = kCaps,
    .error_kind = SHOAL_ERROR_FEEDBACK,
    .error_bound = 0.0,
    .dtypes = (1u << SHOAL_F32) | (1u << SHOAL_F16) | (1u << SHOAL_BF16),
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

const shoal_compressor_t* powersgd() { return &kPowerSgd; }

}  // namespace shoal::compressors
