// The CPU PowerSGD step (see powersgd_engine.h).
#include "compressors/powersgd/powersgd_engine.h"

#include <algorithm>
#include <cstring>
#include <string>
#include <vector>

#include "core/numeric/element_ops.h"
#include "core/numeric/dtype.h"
#include "compressors/powersgd/powersgd_kernels.h"
#include "compressors/powersgd/powersgd_math.h"

namespace shoal::powersgd {
namespace {

using ops::BFloat16;
using ops::Half;
using ops::narrow;
using ops::widen;

constexpr size_t kTrailerWords = 5;

float loadAsFloat(shoal_dtype_t dtype, const void* data, size_t i) {
  switch (dtype) {
    case SHOAL_F16: return widen(static_cast<const Half*>(data)[i]);
    case SHOAL_BF16: return widen(static_cast<const BFloat16*>(data)[i]);
    default: return static_cast<const float*>(data)[i];
  }
}

void storeFromFloat(shoal_dtype_t dtype, void* data, size_t i, float value) {
  switch (dtype) {
    case SHOAL_F16: static_cast<Half*>(data)[i] = narrow<Half>(value); break;
    case SHOAL_BF16: static_cast<BFloat16*>(data)[i] = narrow<BFloat16>(value); break;
    default: static_cast<float*>(data)[i] = value; break;
  }
}

// dst[i] = g[i] + e[i] (ef) or g[i], in f32, for i in [first, first + count).
void gatherM(const Options& options, shoal_dtype_t dtype, const void* g, const MatrixState& state, size_t first,
             size_t count, float* dst) {
  if (dtype == SHOAL_F32) {  // the common case, in loops the compiler vectorizes
    const auto* gf = static_cast<const float*>(g) + first;
    const auto* ef = reinterpret_cast<const float*>(state.error.data()) + first;
    if (!options.ef) {
      if (count) std::memcpy(dst, gf, count * sizeof(float));
    } else {
      for (size_t i = 0; i < count; ++i) dst[i] = gf[i] + ef[i];
    }
    return;
  }
  for (size_t i = first; i < first + count; ++i)
    dst[i - first] =
        loadAsFloat(dtype, g, i) + (options.ef ? loadAsFloat(dtype, state.error.data(), i) : 0.0f);
}

// The gradient of matrix t, or nullptr where the step passes none (the plan after phaseP: it
// reads M from its workspace).
const void* inputOf(const StepIo& io, int t) { return io.inputs != nullptr ? io.inputs[t] : nullptr; }

// The rows of one matrix's M = g + e_old, in f32, a block of rows at a time.
// Where they live:
//  - the M workspace, when the step has one (the plan, whose later phases do
//    not see the gradients);
//  - else, for f32 with error feedback (the compressor's common case), the
//    error vector itself: phaseP turns it into M (e := g + e_old, a block at a
//    time, then P from the block while it is in L1), the later phases read M
//    there and finishStep turns it into e_new = M - A in place. No workspace,
//    and the Q and finish passes read one array instead of two;
//  - else (f16/bf16 errors, or ef=0 with an f16/bf16 gradient) formed from the
//    gradient and the error vector into an L1-sized scratch block each time,
//    or (f32, ef=0: M = g) read from the gradient itself.
class MatrixRows {
 public:
  static constexpr size_t kBlock = kernels::kRowBlock;

  MatrixRows(const Options& options, shoal_dtype_t dtype, const void* g, MatrixState& state, const float* m,
             size_t cols, std::vector<float>& scratch)
      : options_(options), dtype_(dtype), g_(g), state_(state), m_(m), cols_(cols), scratch_(scratch) {
    inError_ = m_ == nullptr && dtype_ == SHOAL_F32 && options_.ef;
    if (inError_) m_ = reinterpret_cast<float*>(state_.error.data());
    if (m_ == nullptr && dtype_ != SHOAL_F32 && scratch_.size() < kBlock * cols_) scratch_.resize(kBlock * cols_);
  }

  // Whether M is the error vector (finishStep then writes e_new over it).
  bool inError() const { return inError_; }

  // phaseP: rows [first, first + count) of M, contiguous (count <= kBlock),
  // formed in the error vector where M lives there.
  const float* form(size_t first, size_t count) const {
    if (!inError_) return rows(first, count);
    float* e = reinterpret_cast<float*>(state_.error.data()) + first * cols_;
    const float* g = static_cast<const float*>(g_) + first * cols_;
    for (size_t i = 0; i < count * cols_; ++i) e[i] += g[i];  // e + g: the bits of g + e
    return e;
  }

  // The later phases: the same rows, as phaseP left them.
  const float* rows(size_t first, size_t count) const {
    if (m_ != nullptr) return m_ + first * cols_;
    if (dtype_ == SHOAL_F32 && !options_.ef) return static_cast<const float*>(g_) + first * cols_;
    gatherM(options_, dtype_, g_, state_, first * cols_, count * cols_, scratch_.data());
    return scratch_.data();
  }

 private:
  const Options& options_;
  shoal_dtype_t dtype_;
  const void* g_;
  MatrixState& state_;
  const float* m_;
  size_t cols_;
  std::vector<float>& scratch_;
  bool inError_ = false;
};

// Orthonormalizes the warm-start Q (drawing it on the first step), redrawing
// zero columns from the RNG (at most a few times: a random column is zero or
// dependent with probability ~0).
void prepareQ(uint64_t seed, uint64_t key, MatrixState& state) {
  const size_t cols = state.cols;
  const int r = state.r;
  float* q = state.q.data();
  auto draw = [&](int c) {
    const uint64_t generation = state.generation++;
    for (size_t i = 0; i < cols; ++i) q[i * r + c] = uniformAt(seed, key, generation, i);
  };
  if (!state.qValid) {
    for (int c = 0; c < r; ++c) draw(c);
    state.qValid = true;
  }
  for (int c = 0; c < r; ++c)
    for (int attempt = 0; attempt < 4 && !orthogonalizeColumn(q, cols, r, c); ++attempt) draw(c);
}

}  // namespace

Shape shapeOf(size_t rows, size_t cols, int rank, double minCompressionRate, bool dense) {
  Shape shape;
  shape.rows = rows;
  shape.cols = cols;
  shape.count = rows * cols;
  if (dense || shape.count == 0 || rows > INT32_MAX || cols > INT32_MAX) return shape;  // CBLAS takes int dimensions
  const size_t r = std::min<size_t>({rows, cols, static_cast<size_t>(std::max(rank, 1))});
  if (shouldCompress(rows, cols, r, minCompressionRate)) shape.r = static_cast<int>(r);
  return shape;
}

Layout makeLayout(const std::vector<Shape>& shapes) {
  Layout layout;
  layout.entries.resize(shapes.size());
  for (size_t i = 0; i < shapes.size(); ++i) {
    Entry& entry = layout.entries[i];
    entry.shape = shapes[i];
    entry.plainOffset = layout.plainElems;
    layout.plainElems += shapes[i].count;
    if (!shapes[i].r) continue;
    ++layout.compressed;
    auto same = [&](const Group& g) { return g.rows == shapes[i].rows && g.cols == shapes[i].cols && g.r == shapes[i].r; };
    auto group = std::find_if(layout.groups.begin(), layout.groups.end(), same);
    if (group == layout.groups.end()) {
      layout.groups.push_back({shapes[i].rows, shapes[i].cols, shapes[i].r, {}});
      group = layout.groups.end() - 1;
    }
    group->members.push_back(static_cast<int>(i));
  }
  for (const Group& group : layout.groups)
    for (int i : group.members) {
      Entry& entry = layout.entries[i];
      entry.pOffset = layout.pElems;
      layout.pElems += group.rows * group.r;
      entry.qOffset = layout.qElems;
      layout.qElems += group.cols * group.r;
      entry.mOffset = layout.mElems;
      layout.mElems += entry.shape.count;
    }
  for (Entry& entry : layout.entries)
    if (!entry.shape.r) entry.pOffset = layout.pElems + layout.denseElems, layout.denseElems += entry.shape.count;
  return layout;
}

bool supportedDtype(shoal_dtype_t dtype) { return dtype == SHOAL_F32 || dtype == SHOAL_F16 || dtype == SHOAL_BF16; }

std::string checkState(MatrixState& state, const Shape& shape, shoal_dtype_t dtype) {
  const size_t cols = shape.r ? shape.cols : 0;
  if (state.typed || state.count || state.cols || !state.error.empty()) {
    if (state.count != shape.count || state.cols != cols || state.r != shape.r || state.dtype != dtype)
      return "it had " + std::to_string(state.count) + " " + shoal_dtype_name(state.dtype) + " elements (Q [" +
             std::to_string(state.cols) + " x " + std::to_string(state.r) + "]) and now has " +
             std::to_string(shape.count) + " " + shoal_dtype_name(dtype) + " (Q [" + std::to_string(cols) + " x " +
             std::to_string(shape.r) + "]): a matrix must keep its shape, dtype and options";
    state.typed = true;
    return "";
  }
  state.typed = true;
  state.dtype = dtype;
  state.count = shape.count;
  state.cols = cols;
  state.r = shape.r;
  state.error.assign(shape.count * dtypeSize(dtype), 0);
  state.q.assign(cols * shape.r, 0.0f);
  return "";
}

// The three phases are compiled twice, for the build's target and for AVX2
// (the loader picks one by the CPU): the same operations in the same order
// (AVX2 brings no FMA contraction), so the same bits, with twice the lanes
// per instruction for the kernels (tests/unit/test_powersgd_kernels.cc checks
// the engine's bits against the kernels compiled for the build's target).
#if defined(__x86_64__) && defined(__GNUC__) && !defined(__clang__)
#define SHOAL_POWERSGD_PHASE __attribute__((target_clones("avx2", "default")))
#else
#define SHOAL_POWERSGD_PHASE
#endif

SHOAL_POWERSGD_PHASE size_t phaseP(const Options& options, const Layout& layout, bool plain, const StepIo& io,
                                    float* pbuf, float* mbuf) {
  if (plain) {
    for (int t = 0; t < io.num; ++t) {
      const Entry& entry = layout.entries[t];
      float* dst = pbuf + entry.plainOffset;
      for (size_t i = 0; i < entry.shape.count; ++i) dst[i] = loadAsFloat(io.dtypes[t], io.inputs[t], i);
    }
    return layout.plainElems;
  }
  for (int t = 0; t < io.num; ++t) {
    const Entry& entry = layout.entries[t];
    if (!entry.shape.r)
      gatherM(options, io.dtypes[t], io.inputs[t], *io.states[t], 0, entry.shape.count, pbuf + entry.pOffset);
  }
  std::vector<float> qt, scratch;
  for (const Group& group : layout.groups)
    for (int t : group.members) {
      const Entry& entry = layout.entries[t];
      MatrixState& state = *io.states[t];
      const float* m = nullptr;
      if (mbuf != nullptr) {
        gatherM(options, io.dtypes[t], io.inputs[t], state, 0, entry.shape.count, mbuf + entry.mOffset);
        m = mbuf + entry.mOffset;
      }
      prepareQ(options.seed, io.keys[t], state);
      // P_w [rows x r] = M [rows x cols] · Q [cols x r], row by row (powersgd_kernels.h)
      qt.resize(group.cols * group.r);
      kernels::toColumns(state.q.data(), group.cols, group.r, qt.data());
      const MatrixRows rows(options, io.dtypes[t], io.inputs[t], state, m, group.cols, scratch);
      float* p = pbuf + entry.pOffset;
      for (size_t i = 0; i < group.rows; i += MatrixRows::kBlock) {
        const size_t count = std::min(MatrixRows::kBlock, group.rows - i);
        const float* block = rows.form(i, count);
        for (size_t b = 0; b < count; ++b)
          kernels::factorDots(block + b * group.cols, group.cols, qt.data(), group.r, p + (i + b) * group.r);
      }
    }
  return layout.pElems + layout.denseElems;
}

SHOAL_POWERSGD_PHASE size_t phaseQ(const Options& options, const Layout& layout, bool plain, const StepIo& io,
                                    float* pbuf, const float* mbuf, float* qbuf) {
  if (plain || layout.compressed == 0) return 0;
  std::vector<float> qt, scratch;
  for (const Group& group : layout.groups)
    for (int t : group.members) {
      const Entry& entry = layout.entries[t];
      float* p = pbuf + entry.pOffset;
      orthogonalize(p, group.rows, group.r);
      // Q_w [cols x r] = Mᵀ [cols x rows] · P [rows x r], accumulated over the rows of M in order into its
      // columns (qt [r x cols]), then laid out as the Q buffer holds it
      qt.assign(group.cols * group.r, 0.0f);
      const MatrixRows rows(options, io.dtypes[t], inputOf(io, t), *io.states[t],
                            mbuf != nullptr ? mbuf + entry.mOffset : nullptr, group.cols, scratch);
      for (size_t i = 0; i < group.rows; i += MatrixRows::kBlock) {
        const size_t count = std::min(MatrixRows::kBlock, group.rows - i);
        kernels::accumulateRows(rows.rows(i, count), count, group.cols, p + i * group.r, group.r, qt.data());
      }
      kernels::fromColumns(qt.data(), group.cols, group.r, qbuf + entry.qOffset);
    }
  return layout.qElems;
}

SHOAL_POWERSGD_PHASE void finishStep(const Options& options, const Layout& layout, bool plain, const StepIo& io,
                                     const float* pbuf, const float* qbuf, const float* mbuf, int worldSize,
                                     shoal_op_t op) {
  const float n = static_cast<float>(worldSize);
  const bool average = op == SHOAL_AVG;
  auto writeDense = [&](int t, const float* sum) {
    for (size_t i = 0; i < layout.entries[t].shape.count; ++i)
      storeFromFloat(io.dtypes[t], io.outputs[t], i, average ? sum[i] / n : sum[i]);
  };
  if (plain) {
    for (int t = 0; t < io.num; ++t) writeDense(t, pbuf + layout.entries[t].plainOffset);
    return;
  }
  for (int t = 0; t < io.num; ++t) {
    const Entry& entry = layout.entries[t];
    if (entry.shape.r) continue;
    writeDense(t, pbuf + entry.pOffset);
    if (options.ef) std::fill(io.states[t]->error.begin(), io.states[t]->error.end(), 0);
  }
  std::vector<float> qt, a, scratch;
  for (const Group& group : layout.groups) {
    const int r = group.r;
    const size_t rows = group.rows, cols = group.cols;
    qt.resize(static_cast<size_t>(r) * cols);
    a.resize(cols);
    for (int t : group.members) {
      const Entry& entry = layout.entries[t];
      MatrixState& state = *io.states[t];
      const float* qsum = qbuf + entry.qOffset;
      for (size_t i = 0; i < cols * r; ++i) state.q[i] = qsum[i] / n;  // Q of the average, kept for the warm start
      kernels::toColumns(state.q.data(), cols, r, qt.data());
      const float* p = pbuf + entry.pOffset;
      const shoal_dtype_t dtype = io.dtypes[t];
      // M's rows are read (formed from g and e_old) a block at a time before
      // that block's error and output rows are written: the output may be the
      // gradient itself.
      const MatrixRows source(options, dtype, inputOf(io, t), state, mbuf != nullptr ? mbuf + entry.mOffset : nullptr,
                              cols, scratch);
      for (size_t first = 0; first < rows; first += MatrixRows::kBlock) {
        const size_t count = std::min(MatrixRows::kBlock, rows - first);
        // ef=0 reads no M (out = A only): no rows to form.
        const float* block = options.ef ? source.rows(first, count) : nullptr;
        for (size_t b = 0; b < count; ++b) {
          const size_t i = first + b;
          // A = P Qᵀ row by row: A[i, :] = sum_k P[i, k] Qᵀ[k, :], k ascending from 0
          // (the same bits on every rank: P and Q are the allreduced sums).
          if (dtype == SHOAL_F32) {  // the common case, in loops the compiler vectorizes
            float* oi = static_cast<float*>(io.outputs[t]) + i * cols;
            float* ai = average ? oi : a.data();  // the average is A itself: written in place
            kernels::productRow(p + i * r, qt.data(), r, cols, ai);
            if (options.ef) {
              const float* mi = block + b * cols;
              float* ei = reinterpret_cast<float*>(state.error.data()) + i * cols;
              if (source.inError())  // M is e: e_new = M - A over it (its own loop: no aliasing check)
                for (size_t j = 0; j < cols; ++j) ei[j] -= ai[j];
              else
                for (size_t j = 0; j < cols; ++j) ei[j] = mi[j] - ai[j];
            }
            if (!average)
              for (size_t j = 0; j < cols; ++j) oi[j] = ai[j] * n;
            continue;
          }
          kernels::productRow(p + i * r, qt.data(), r, cols, a.data());
          if (options.ef) {
            const float* mi = block + b * cols;
            for (size_t j = 0; j < cols; ++j) storeFromFloat(dtype, state.error.data(), i * cols + j, mi[j] - a[j]);
          }
          for (size_t j = 0; j < cols; ++j)
            storeFromFloat(dtype, io.outputs[t], i * cols + j, average ? a[j] : a[j] * n);
        }
      }
    }
  }
}

size_t stateBytes(const MatrixState& state) {
  // From the shape, not the vectors: a device state's host vectors are empty.
  return state.count * dtypeSize(state.dtype) + sizeof(float) * state.cols * state.r + sizeof(uint64_t) * kTrailerWords;
}

void saveState(const MatrixState& state, uint8_t* out) {
  const size_t errorBytes = state.error.size(), qBytes = state.q.size() * sizeof(float);
  if (errorBytes) std::memcpy(out, state.error.data(), errorBytes);
  if (qBytes) std::memcpy(out + errorBytes, state.q.data(), qBytes);
  const uint64_t trailer[kTrailerWords] = {state.count, state.cols, static_cast<uint64_t>(state.r),
                                           (state.qValid ? 1ull : 0ull) | (state.generation << 1),
                                           static_cast<uint64_t>(state.dtype)};
  std::memcpy(out + errorBytes + qBytes, trailer, sizeof trailer);
}

std::string loadState(const uint8_t* in, size_t bytes, MatrixState* out) {
  uint64_t trailer[kTrailerWords];
  if (in == nullptr || bytes < sizeof trailer)
    return "a state of " + std::to_string(bytes) + " bytes is too short (at least " + std::to_string(sizeof trailer) +
           ")";
  std::memcpy(trailer, in + bytes - sizeof trailer, sizeof trailer);
  const uint64_t count = trailer[0], cols = trailer[1], r = trailer[2], dtype = trailer[4];
  const size_t element = dtype < SHOAL_DTYPE_COUNT ? dtypeSize(static_cast<shoal_dtype_t>(dtype)) : 0;
  if (element == 0 || !supportedDtype(static_cast<shoal_dtype_t>(dtype)) || r > kMaxRank || (cols != 0 && r == 0) ||
      count > bytes || cols > bytes || element * count + sizeof(float) * cols * r + sizeof trailer != bytes)
    return "a state of " + std::to_string(bytes) + " bytes does not match its trailer (count " +
           std::to_string(count) + ", Q " + std::to_string(cols) + " x " + std::to_string(r) + ", dtype " +
           std::to_string(dtype) + ")";
  MatrixState loaded;
  loaded.dtype = static_cast<shoal_dtype_t>(dtype);
  loaded.count = count;
  loaded.cols = cols;
  loaded.r = static_cast<int>(r);
  loaded.qValid = (trailer[3] & 1u) != 0;
  loaded.generation = trailer[3] >> 1;
  loaded.error.assign(in, in + count * element);
  loaded.q.resize(cols * r);
  if (cols * r != 0) std::memcpy(loaded.q.data(), in + count * element, cols * r * sizeof(float));
  *out = std::move(loaded);
  return "";
}

}  // namespace shoal::powersgd
