// The PowerSGD step on the CPU, shared by the powersgd compressor (its rounds)
// and the PowerSGD plan of include/shoal/lowrank.h (plan.h), so the
// two give the same bits for the same inputs.
//
// A step over a list of matrices (one call of the compressor, or one plan):
//   phaseP:   M = g + e_old in f32 (whatever the gradient dtype), the
//             warm-start Q orthonormalized (drawn on the first step), P_w = M Q;
//             the P buffer = [every P, same-shape groups adjacent | every dense
//             tensor's g + e_old], to be allreduced with SUM.
//   phaseQ:   P orthonormalized, Q_w = Mᵀ P into the Q buffer, to be allreduced
//             with SUM (skipped when nothing is compressed).
//   finish:   Q = Q_sum / n kept for the warm start; A = P Qᵀ; out = A (avg) or
//             n A (sum), in the gradient dtype; e_new = M - A (dense: 0).
// A plain step (before start_iter) lays every tensor densely in the P buffer,
// one allreduce, e untouched.
//
// Where M lives: with an M workspace (mbuf, layout.mElems floats: the plan,
// whose phases do not see the gradients again) phaseP writes M there and the
// later phases read it. Without one (mbuf == nullptr: the compressor), for an
// f32 matrix with error feedback phaseP turns the error vector into M
// (e := g + e_old), phaseQ reads it there and finishStep writes e_new over
// it; otherwise every phase forms M's rows from io.inputs (and the f16/bf16
// error vector) a block of rows at a time, so io.inputs must stay unchanged
// until finishStep has read them (it reads a block's rows before writing
// that block's outputs, so the output may be the input). All give the same
// bits. A step abandoned between phases leaves e = g + e_old in the f32 case.
//
// The products are the row kernels of powersgd_kernels.h (each reads M once,
// no packing); their sums run in a fixed order, so the same inputs give the
// same bits on every rank. Matrices of one shape (rows, cols, r) form a group
// whose P, Q and M blocks are adjacent (strided), so the GPU path runs one
// strided-batched GEMM per group.
#pragma once

#include <cstddef>
#include <cstdint>
#include <string>
#include <vector>

#include "shoal/shoal.h"

namespace shoal::powersgd {

constexpr int kMaxRank = 1024;

struct Options {
  int rank = 4;
  bool ef = true;
  uint64_t startIter = 0;
  double minCompressionRate = 2.0;
  uint64_t seed = 0;
};

// Device copies of a matrix's state (GPU build, CUDA tensors; powersgd_cuda.h):
// error, Q and the RNG draw count live in device memory of `device`.
struct DeviceMatrix {
  int device = -1;
  void* error = nullptr;           // count elements of the dtype
  float* q = nullptr;              // [cols x r]
  uint64_t* generation = nullptr;  // RNG draws so far, advanced by the device
};

// What one matrix keeps between steps (host vectors, or `device` for CUDA
// tensors: then error and q are empty and generation is on the device).
struct MatrixState {
  bool typed = false;               // false: loaded, not yet checked by a step
  shoal_dtype_t dtype = SHOAL_F32;  // of the error vector (the gradient's)
  size_t count = 0;
  size_t cols = 0;                  // 0 for dense matrices
  int r = 0;                        // 0 for dense matrices
  bool qValid = false;
  uint64_t generation = 0;          // RNG draws so far (initial Q and zero-column redraws)
  std::vector<uint8_t> error;       // count elements of dtype (zeros with ef=0 and for dense ones)
  std::vector<float> q;             // [cols x r], row-major
  DeviceMatrix device;
  bool onDevice() const { return device.device >= 0; }
};

// A matrix's shape and route: r = 0 means dense.
struct Shape {
  size_t count = 0, rows = 0, cols = 0;
  int r = 0;
};

// PyTorch's rule on a [rows x cols] matrix at rank min(rows, cols, rank);
// dense = 1 forces the dense route. count may be 0 (then dense).
Shape shapeOf(size_t rows, size_t cols, int rank, double minCompressionRate, bool dense);

struct Entry {
  Shape shape;
  size_t pOffset = 0;      // P block (compressed) or dense values, in the P buffer
  size_t qOffset = 0;      // compressed: Q block in the Q buffer
  size_t mOffset = 0;      // compressed: M block in the M workspace
  size_t plainOffset = 0;  // plain steps: the tensor's place in the P buffer
};

struct Group {
  size_t rows = 0, cols = 0;
  int r = 0;
  std::vector<int> members;  // entry indices, ascending
};

struct Layout {
  std::vector<Entry> entries;
  std::vector<Group> groups;  // in order of first appearance
  size_t pElems = 0;          // all P blocks
  size_t denseElems = 0;      // the dense tail after them
  size_t qElems = 0;
  size_t mElems = 0;
  size_t plainElems = 0;      // every tensor, densely (plain steps)
  int compressed = 0;
  size_t pBufferElems() const { return pElems + denseElems > plainElems ? pElems + denseElems : plainElems; }
};

Layout makeLayout(const std::vector<Shape>& shapes);

// The tensors of one step. states[i] must match entries[i] (checkState).
struct StepIo {
  int num = 0;
  const shoal_dtype_t* dtypes = nullptr;
  const void* const* inputs = nullptr;
  void* const* outputs = nullptr;
  MatrixState* const* states = nullptr;
  const uint64_t* keys = nullptr;  // RNG key of each matrix (nameHash of its name)
};

// Dtypes the step takes: f32, f16, bf16 (factor math in f32 for all).
bool supportedDtype(shoal_dtype_t dtype);

// Creates state for a new matrix, or checks a loaded / earlier one. Returns ""
// or what does not match.
std::string checkState(MatrixState& state, const Shape& shape, shoal_dtype_t dtype);

// Each returns the elements of its buffer to allreduce (SUM, f32); 0: none.
// pbuf has layout.pBufferElems(), qbuf layout.qElems; mbuf is the M workspace
// (layout.mElems) or nullptr (M formed from io.inputs in every phase; see above).
// The same mbuf (or none) and the same io.inputs go to all three phases.
size_t phaseP(const Options& options, const Layout& layout, bool plain, const StepIo& io, float* pbuf, float* mbuf);
size_t phaseQ(const Options& options, const Layout& layout, bool plain, const StepIo& io, float* pbuf,
              const float* mbuf, float* qbuf);
void finishStep(const Options& options, const Layout& layout, bool plain, const StepIo& io, const float* pbuf,
                const float* qbuf, const float* mbuf, int worldSize, shoal_op_t op);

// One matrix's state, native byte order:
//   error[count] in its dtype | f32 Q[cols * r] | u64 {count, cols, r, flags, dtype}
// flags bit 0: Q holds a value; bits 1..63: RNG draws so far.
size_t stateBytes(const MatrixState& state);
void saveState(const MatrixState& state, uint8_t* out);
// Parses a saved state; "" or why it cannot be one.
std::string loadState(const uint8_t* in, size_t bytes, MatrixState* out);

}  // namespace shoal::powersgd
