// powersgd: rank-r PowerSGD (Vogels et al. 2019) with warm start and error
// feedback, following PyTorch's powerSGD_hook, CPU path, f32 tensors only.
//
// Each tensor of count elements is viewed as a matrix M [rows, cols] with
// rows = shape[0] and cols = count / rows. It is compressed at rank
// r = min(rows, cols, rank) iff ndim >= 2 and (rows + cols) * r *
// min_compression_rate < rows * cols (PyTorch's rule); every other tensor (1-D,
// scalars, small or square-ish ones) rides densely in the P payload.
//
// Per call, on every rank (n ranks; M_w below is rank w's matrix):
//   M = g + e_old                 (ef=1; e_old = 0 the first time; ef=0: M = g)
//   round 0: Q (per tensor state, identical on every rank) is orthonormalized
//            (Gram-Schmidt, powersgd_math.h); on the first call it is drawn from
//            a counter-based RNG keyed by (seed, FNV-1a hash of the tensor's
//            name, generation), and any column that is zero (e.g. after an
//            all-zero gradient) is redrawn with the next generation, so Q never
//            gets stuck at zero. P_w = M_w Q (BLAS sgemm).
//            Payload 0: one f32 buffer [every P | every dense tensor's M],
//            allreduce SUM (P = sum_w P_w, not divided: orthonormalization
//            removes the scale).
//   round 1: dense tensors: out = sum (avg: / n), e_new = 0 (all of M was
//            sent). Compressed ones: P orthonormalized (zero-column guard: a
//            column that is zero or in the span of the earlier ones becomes 0,
//            never NaN); Q_w = M_wᵀ P (sgemm). Payload 0: flat f32 buffer of
//            every Q, allreduce SUM.
//   round 2: Q = Q_sum / n is kept for the warm start (the same bits on every
//            rank); A = P Qᵀ, the approximation of the *average* M (plain
//            loops, so every rank computes the same bits); out = A (avg) or
//            n * A (sum); e_new = M_w - A (PyTorch: error = input copy - the
//            decompressed average). So out == sum_w (g_w + e_old_w - e_new_w)
//            (avg: / n) up to rounding. With ef=1, M lives in the error vector
//            between rounds (e <- g + e in round 0, e <- M - A in round 2: no
//            allocation per call), so a call that fails between rounds leaves
//            e = g + e_old there (as topk does).
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
//   f32 e[count]        the error vector (zeros with ef=0 or for dense tensors)
//   f32 Q[cols * r]     the warm-start factor, row-major [cols x r]
//                       (absent, 0 elements, for tensors routed dense)
//   u64 count, u64 cols, u64 r, u64 flags   (flags bit 0: Q holds a value; bits
//                       1..63: how many columns the RNG has drawn so far, so a
//                       resumed run redraws zero columns with the same bits)
// total 4 * (count + cols * r) + 32 bytes. A state loaded before the tensor's
// first call is checked by that call (count, and cols / r of the plan when Q is
// present); a name must keep its shape and options between calls.
#include <cblas.h>

#include <algorithm>
#include <cmath>
#include <cstdarg>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <string>
#include <vector>

#include "compressors/common/payload.h"
#include "compressors/common/text.h"
#include "compressors/powersgd/powersgd_math.h"
#include "plugin/driver.h"
#include "shoal/compressor.h"

namespace shoal::compressors {
namespace {

using namespace shoal::powersgd;

constexpr int kMaxRank = 1024;
constexpr size_t kTrailerWords = 4;
constexpr const char* kOptionsHelp =
    "rank=<int 1..1024>: rank of the approximation (default 4); "
    "ef=0|1: error feedback (default 1); "
    "start_iter=<int >= 0>: plain allreduce while the communicator's compressed-call step is below it (default 0); "
    "min_compression_rate=<float >= 0>: compress a [rows x cols] tensor only if (rows+cols)*r*rate < rows*cols, "
    "others go dense (default 2); seed=<uint64>: seed of the initial Q (default 0). f32 only; tensors need a name";

struct Instance {
  std::vector<std::vector<float>> scratch;  // ef=0: M per tensor of a call, reused across calls
  int rank = 4;
  bool ef = true;
  uint64_t startIter = 0;
  double minCompressionRate = 2.0;
  uint64_t seed = 0;
  shoal_log_fn log = nullptr;
};

struct TensorState {
  bool typed = false;     // false: loaded, not yet checked by a call
  size_t count = 0;
  size_t cols = 0;        // 0 for dense tensors
  int r = 0;              // 0 for dense tensors
  bool qValid = false;
  uint64_t generation = 0;  // RNG draws so far (initial Q and zero-column redraws)
  std::vector<float> error;  // count
  std::vector<float> q;      // cols * r
};

// The plan of one tensor in one call.
struct Plan {
  size_t count = 0, rows = 0, cols = 0;
  int r = 0;                   // 0: dense
  size_t offset = 0;           // in the P buffer (P block or dense M)
  size_t qOffset = 0;          // in the Q buffer
  TensorState* state = nullptr;
  float* m = nullptr;          // compressed tensors: this rank's M (rows x cols): the error
                               // vector itself with ef=1 (e <- g + e, then e <- M - A), else
                               // the instance's scratch
};

struct OpState {
  bool plain = false;
  std::vector<Plan> plans;
  std::vector<float> pbuf, qbuf;
  std::vector<float> qt, row;  // round 2: Qᵀ [r x cols] and one row of A
  size_t compressed = 0;
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
  Instance parsed;
  parsed.log = params->log;
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
  *instance = new Instance(parsed);
  return SHOAL_OK;
}

void destroy(void* instance) { delete static_cast<Instance*>(instance); }

// ---- the operation ------------------------------------------------------------------

// Fills plan's shape (rows, cols, r) from the tensor and the options.
void shapePlan(const Instance& instance, const shoal_tensor_t& tensor, Plan& plan) {
  plan.count = plugin::elementsCount(tensor);
  plan.r = 0;
  if (tensor.ndim < 2 || plan.count == 0) return;
  plan.rows = static_cast<size_t>(tensor.shape[0]);
  plan.cols = plan.count / plan.rows;
  if (plan.rows > INT32_MAX || plan.cols > INT32_MAX) return;  // beyond CBLAS's int dimensions: dense
  size_t r = std::min<size_t>({plan.rows, plan.cols, static_cast<size_t>(instance.rank)});
  if (r >= 1 && shouldCompress(plan.rows, plan.cols, r, instance.minCompressionRate)) plan.r = static_cast<int>(r);
}

// Creates or checks the tensor's state; nullptr with error text on a mismatch.
TensorState* stateFor(shoal_compress_op_t* op, int t, const Plan& plan) {
  const shoal_compress_tensor_t& tensor = op->tensors[t];
  auto* state = static_cast<TensorState*>(*tensor.state);
  const size_t cols = plan.r ? plan.cols : 0;
  if (state == nullptr) {
    state = new TensorState;
    state->typed = true;
    state->count = plan.count;
    state->cols = cols;
    state->r = plan.r;
    state->error.assign(plan.count, 0.0f);
    state->q.assign(cols * plan.r, 0.0f);
    *tensor.state = state;
    return state;
  }
  if (!state->typed) {
    bool qFits = !state->qValid || (state->cols == cols && state->r == plan.r);
    if (state->count != plan.count || !qFits) {
      writeText(op->error_text, op->error_text_size,
                "powersgd: the state loaded for tensor '%s' holds %zu error elements and a Q of [%zu x %d], but the "
                "call has %zu elements and a Q of [%zu x %d]: load the state saved for this tensor and options",
                tensor.name, state->count, state->cols, state->r, plan.count, cols, plan.r);
      return nullptr;
    }
    state->typed = true;
    state->cols = cols;
    state->r = plan.r;
    state->q.resize(cols * plan.r, 0.0f);
    return state;
  }
  if (state->count != plan.count || state->cols != cols || state->r != plan.r) {
    writeText(op->error_text, op->error_text_size,
              "powersgd: tensor '%s' had %zu elements (Q [%zu x %d]) in earlier calls and now has %zu (Q [%zu x %d]): "
              "a name must keep its shape and options",
              tensor.name, state->count, state->cols, state->r, plan.count, cols, plan.r);
    return nullptr;
  }
  return state;
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
    if (tensor.input.dtype != SHOAL_F32 || tensor.output.dtype != SHOAL_F32) {
      writeText(op->error_text, op->error_text_size, "powersgd: tensor %d has dtype %s (output %s): f32 only for now",
                t, shoal_dtype_name(tensor.input.dtype), shoal_dtype_name(tensor.output.dtype));
      return SHOAL_ERR_UNSUPPORTED;
    }
    if (tensor.input.memory != SHOAL_MEMORY_HOST || tensor.output.memory != SHOAL_MEMORY_HOST) {
      writeText(op->error_text, op->error_text_size, "powersgd: tensor %d is not in host memory (host only for now)",
                t);
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
  state->plain = op->step < instance->startIter;
  state->plans.resize(op->num_tensors);
  for (int t = 0; t < op->num_tensors; ++t) {
    Plan& plan = state->plans[t];
    shapePlan(*instance, op->tensors[t].input, plan);
    if ((plan.state = stateFor(op, t, plan)) == nullptr) {
      delete state;
      return SHOAL_ERR_INVALID_ARGUMENT;
    }
  }
  *opState = state;
  return SHOAL_OK;
}

// Orthonormalizes the warm-start Q (drawing it on the first call), redrawing
// zero columns from the RNG (at most a few times: a random column is zero or
// dependent with probability ~0).
void prepareQ(const Instance& instance, const char* name, TensorState& state) {
  const size_t cols = state.cols;
  const int r = state.r;
  const uint64_t hash = nameHash(name);
  float* q = state.q.data();
  auto draw = [&](int c) {
    const uint64_t generation = state.generation++;
    for (size_t i = 0; i < cols; ++i) q[i * r + c] = uniformAt(instance.seed, hash, generation, i);
  };
  if (!state.qValid) {
    for (int c = 0; c < r; ++c) draw(c);
    state.qValid = true;
  }
  for (int c = 0; c < r; ++c)
    for (int attempt = 0; attempt < 4 && !orthogonalizeColumn(q, cols, r, c); ++attempt) draw(c);
}

shoal_status_t plainRound0(OpState& state, shoal_compress_op_t* op, shoal_round_t* round) {
  size_t total = 0;
  for (Plan& plan : state.plans) plan.offset = total, total += plan.count;
  state.pbuf.resize(total);
  if (total == 0) {
    round->num_payloads = 0;
    round->done = 1;
    return SHOAL_OK;
  }
  for (int t = 0; t < op->num_tensors; ++t)
    if (state.plans[t].count)
      std::memcpy(state.pbuf.data() + state.plans[t].offset, op->tensors[t].input.data,
                  state.plans[t].count * sizeof(float));
  requestOnePayload(round, SHOAL_COLLECTIVE_ALLREDUCE, SHOAL_F32, SHOAL_SUM, state.pbuf.data(), total);
  return SHOAL_OK;
}

shoal_status_t round0(Instance& instance, OpState& state, shoal_compress_op_t* op, shoal_round_t* round) {
  if (state.plain) return plainRound0(state, op, round);
  size_t total = 0, qTotal = 0;
  for (Plan& plan : state.plans)
    if (plan.r) plan.offset = total, total += plan.rows * plan.r, plan.qOffset = qTotal, qTotal += plan.cols * plan.r;
  for (Plan& plan : state.plans)
    if (!plan.r) plan.offset = total, total += plan.count;
  state.pbuf.assign(total, 0.0f);
  state.qbuf.assign(qTotal, 0.0f);
  for (int t = 0; t < op->num_tensors; ++t) {
    Plan& plan = state.plans[t];
    const auto* g = static_cast<const float*>(op->tensors[t].input.data);
    TensorState& ts = *plan.state;
    float* m = state.pbuf.data() + plan.offset;
    if (plan.r && instance.ef) {
      m = ts.error.data();  // M = g + e in place: no allocation per call
    } else if (plan.r) {
      if (instance.scratch.size() <= static_cast<size_t>(t)) instance.scratch.resize(t + 1);
      instance.scratch[t].resize(plan.count);
      m = instance.scratch[t].data();
    }
    plan.m = m;
    if (instance.ef)
      for (size_t i = 0; i < plan.count; ++i) m[i] = g[i] + ts.error[i];
    else if (plan.count)
      std::memcpy(m, g, plan.count * sizeof(float));
    if (!plan.r) continue;
    ++state.compressed;
    prepareQ(instance, op->tensors[t].name, ts);
    // P_w [rows x r] = M [rows x cols] · Q [cols x r]
    cblas_sgemm(CblasRowMajor, CblasNoTrans, CblasNoTrans, static_cast<int>(plan.rows), plan.r,
                static_cast<int>(plan.cols), 1.0f, m, static_cast<int>(plan.cols), ts.q.data(), plan.r, 0.0f,
                state.pbuf.data() + plan.offset, plan.r);
  }
  if (total == 0) {
    round->num_payloads = 0;
    round->done = 1;
    return SHOAL_OK;
  }
  requestOnePayload(round, SHOAL_COLLECTIVE_ALLREDUCE, SHOAL_F32, SHOAL_SUM, state.pbuf.data(), total);
  return SHOAL_OK;
}

// Writes a dense tensor's reduced values (avg: / n); e_new = 0 with ef.
void finishDense(const Instance& instance, const OpState& state, const Plan& plan, shoal_compress_op_t* op, int t,
                 bool resetError) {
  auto* out = static_cast<float*>(op->tensors[t].output.data);
  const float* sum = state.pbuf.data() + plan.offset;
  if (op->op == SHOAL_AVG) {
    const float n = static_cast<float>(op->world_size);
    for (size_t i = 0; i < plan.count; ++i) out[i] = sum[i] / n;
  } else if (plan.count) {
    std::memmove(out, sum, plan.count * sizeof(float));
  }
  if (resetError && instance.ef) std::fill(plan.state->error.begin(), plan.state->error.end(), 0.0f);
}

shoal_status_t round1(Instance& instance, OpState& state, shoal_compress_op_t* op, shoal_round_t* round) {
  if (round->num_payloads != 1 || round->payloads[0].buffer != state.pbuf.data()) {
    writeText(op->error_text, op->error_text_size, "powersgd: round 1 did not get back the P payload");
    return SHOAL_ERR_INTERNAL;
  }
  for (int t = 0; t < op->num_tensors; ++t)
    if (!state.plans[t].r || state.plain) finishDense(instance, state, state.plans[t], op, t, !state.plain);
  if (state.plain || state.compressed == 0) {
    round->num_payloads = 0;
    round->done = 1;
    return SHOAL_OK;
  }
  for (Plan& plan : state.plans) {
    if (!plan.r) continue;
    float* p = state.pbuf.data() + plan.offset;
    orthogonalize(p, plan.rows, plan.r);
    // Q_w [cols x r] = Mᵀ [cols x rows] · P [rows x r]
    cblas_sgemm(CblasRowMajor, CblasTrans, CblasNoTrans, static_cast<int>(plan.cols), plan.r,
                static_cast<int>(plan.rows), 1.0f, plan.m, static_cast<int>(plan.cols), p, plan.r, 0.0f,
                state.qbuf.data() + plan.qOffset, plan.r);
  }
  requestOnePayload(round, SHOAL_COLLECTIVE_ALLREDUCE, SHOAL_F32, SHOAL_SUM, state.qbuf.data(), state.qbuf.size());
  return SHOAL_OK;
}

shoal_status_t round2(Instance& instance, OpState& state, shoal_compress_op_t* op, shoal_round_t* round) {
  if (round->num_payloads != 1 || round->payloads[0].buffer != state.qbuf.data()) {
    writeText(op->error_text, op->error_text_size, "powersgd: round 2 did not get back the Q payload");
    return SHOAL_ERR_INTERNAL;
  }
  const float n = static_cast<float>(op->world_size);
  for (int t = 0; t < op->num_tensors; ++t) {
    Plan& plan = state.plans[t];
    if (!plan.r) continue;
    TensorState& ts = *plan.state;
    const int r = plan.r;
    const float* qsum = state.qbuf.data() + plan.qOffset;
    for (size_t i = 0; i < plan.cols * r; ++i) ts.q[i] = qsum[i] / n;  // Q of the average, kept for the warm start
    // A = P Qᵀ row by row: A[i, :] = sum_k P[i, k] Qᵀ[k, :], k ascending from 0
    // (the same bits on every rank; the inner loops run along contiguous rows).
    const float* p = state.pbuf.data() + plan.offset;
    state.qt.resize(static_cast<size_t>(r) * plan.cols);
    state.row.resize(plan.cols);
    for (size_t j = 0; j < plan.cols; ++j)
      for (int k = 0; k < r; ++k) state.qt[k * plan.cols + j] = ts.q[j * r + k];
    auto* out = static_cast<float*>(op->tensors[t].output.data);
    float* m = plan.m;  // with ef, the error vector: M - A is written over M
    float* a = state.row.data();
    const bool sum = op->op == SHOAL_SUM;
    for (size_t i = 0; i < plan.rows; ++i) {
      const float* pi = p + i * r;
      for (size_t j = 0; j < plan.cols; ++j) a[j] = 0.0f;
      for (int k = 0; k < r; ++k) {
        const float pik = pi[k];
        const float* qk = state.qt.data() + k * plan.cols;
        for (size_t j = 0; j < plan.cols; ++j) a[j] += pik * qk[j];
      }
      float* mi = m + i * plan.cols;
      float* oi = out + i * plan.cols;
      if (instance.ef)
        for (size_t j = 0; j < plan.cols; ++j) mi[j] -= a[j];
      if (sum)
        for (size_t j = 0; j < plan.cols; ++j) oi[j] = a[j] * n;
      else
        std::memcpy(oi, a, plan.cols * sizeof(float));
    }
  }
  round->num_payloads = 0;
  round->done = 1;
  return SHOAL_OK;
}

shoal_status_t round(void* instance, void* opState, shoal_compress_op_t* op, shoal_round_t* round) {
  auto& self = *static_cast<Instance*>(instance);
  auto& state = *static_cast<OpState*>(opState);
  switch (round->index) {
    case 0: return round0(self, state, op, round);
    case 1: return round1(self, state, op, round);
    case 2:
      if (!state.plain && state.compressed) return round2(self, state, op, round);
      break;
    default: break;
  }
  writeText(op->error_text, op->error_text_size, "powersgd: called for round %d after it was done", round->index);
  return SHOAL_ERR_INTERNAL;
}

void finish(void*, void* opState) { delete static_cast<OpState*>(opState); }

// ---- tensor state ------------------------------------------------------------------

void destroyTensorState(void*, void* state) { delete static_cast<TensorState*>(state); }

size_t stateBytes(const TensorState& state) {
  return sizeof(float) * (state.error.size() + state.q.size()) + sizeof(uint64_t) * kTrailerWords;
}

shoal_status_t saveTensorState(void*, const void* statePointer, void* buffer, size_t* bytes) {
  const auto* state = static_cast<const TensorState*>(statePointer);
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
  auto* out = static_cast<unsigned char*>(buffer);
  const size_t errorBytes = state->error.size() * sizeof(float), qBytes = state->q.size() * sizeof(float);
  if (errorBytes) std::memcpy(out, state->error.data(), errorBytes);
  if (qBytes) std::memcpy(out + errorBytes, state->q.data(), qBytes);
  const uint64_t trailer[kTrailerWords] = {state->count, state->cols, static_cast<uint64_t>(state->r),
                                           (state->qValid ? 1ull : 0ull) | (state->generation << 1)};
  std::memcpy(out + errorBytes + qBytes, trailer, sizeof trailer);
  *bytes = need;
  return SHOAL_OK;
}

shoal_status_t loadTensorState(void* instancePointer, void** statePointer, const void* buffer, size_t bytes) {
  const auto& instance = *static_cast<const Instance*>(instancePointer);
  if (statePointer == nullptr || buffer == nullptr) return SHOAL_ERR_INVALID_ARGUMENT;
  uint64_t trailer[kTrailerWords];
  if (bytes < sizeof trailer) {
    logText(instance.log, 1, "powersgd: a state of %zu bytes is too short (at least %zu)", bytes, sizeof trailer);
    return SHOAL_ERR_INVALID_ARGUMENT;
  }
  const auto* in = static_cast<const unsigned char*>(buffer);
  std::memcpy(trailer, in + bytes - sizeof trailer, sizeof trailer);
  const uint64_t count = trailer[0], cols = trailer[1], r = trailer[2];
  if (r > kMaxRank || (cols != 0 && r == 0) || count > (bytes / sizeof(float)) ||
      cols > (bytes / sizeof(float)) || sizeof(float) * (count + cols * r) + sizeof trailer != bytes) {
    logText(instance.log, 1, "powersgd: a state of %zu bytes does not match its trailer (count %llu, Q %llu x %llu)",
               bytes, static_cast<unsigned long long>(count), static_cast<unsigned long long>(cols),
               static_cast<unsigned long long>(r));
    return SHOAL_ERR_INVALID_ARGUMENT;
  }
  auto* existing = static_cast<TensorState*>(*statePointer);
  if (existing != nullptr && existing->typed && (existing->count != count || existing->cols != cols ||
                                                 existing->r != static_cast<int>(r))) {
    logText(instance.log, 1, "powersgd: the tensor's state has %zu elements and Q [%zu x %d]; the loaded one %llu and "
               "[%llu x %llu]", existing->count, existing->cols, existing->r,
               static_cast<unsigned long long>(count), static_cast<unsigned long long>(cols),
               static_cast<unsigned long long>(r));
    return SHOAL_ERR_INVALID_ARGUMENT;
  }
  TensorState loaded;
  loaded.typed = existing != nullptr && existing->typed;
  loaded.count = count;
  loaded.cols = cols;
  loaded.r = static_cast<int>(r);
  loaded.qValid = (trailer[3] & 1u) != 0;
  loaded.generation = trailer[3] >> 1;
  loaded.error.resize(count);
  loaded.q.resize(cols * r);
  if (count) std::memcpy(loaded.error.data(), in, count * sizeof(float));
  if (cols * r != 0) std::memcpy(loaded.q.data(), in + count * sizeof(float), cols * r * sizeof(float));
  if (existing == nullptr) *statePointer = new TensorState(std::move(loaded));
  else *existing = std::move(loaded);
  return SHOAL_OK;
}

const shoal_compressor_t kPowerSgd = {
    SHOAL_COMPRESSOR_ABI_VERSION,
    sizeof(shoal_compressor_t),
    "powersgd",
    "PowerSGD low-rank compression: P = M Q and Q = M^T P summed by allreduce (warm start, one power iteration "
    "per call); small and 1-D tensors ride densely with P; error feedback",
    kOptionsHelp,
    SHOAL_CAP_HOST | SHOAL_CAP_STATEFUL | SHOAL_CAP_HOMOMORPHIC,
    SHOAL_ERROR_FEEDBACK,
    0.0,
    1u << SHOAL_F32,
    create,
    destroy,
    start,
    round,
    finish,
    destroyTensorState,
    saveTensorState,
    loadTensorState,
};

}  // namespace

const shoal_compressor_t* powersgd() { return &kPowerSgd; }

}  // namespace shoal::compressors
