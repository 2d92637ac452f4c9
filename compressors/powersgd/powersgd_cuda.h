// The powersgd step on CUDA tensors (powersgd.cu; GPU build only, host code
// calls it under #if SHOAL_WITH_CUDA). Plain C++: no CUDA headers; streams are
// void* (cudaStream_t).
//
// The same phases and buffer layout as the CPU engine (powersgd_engine.h), with
// every buffer (M workspace, P and Q payloads, each matrix's error and Q) in
// device memory on the tensors' device and every kernel and cuBLAS call
// enqueued on the tensors' stream:
//   - M = g + e: one elementwise kernel per matrix (f16/bf16 widened to f32);
//   - Q drawn with the same counter-based RNG as the CPU (uniformAt: the same
//     bits) and orthonormalized by a one-block-per-matrix Gram-Schmidt kernel
//     with the CPU's zero-column guard (keepColumn) and redraws, the draw
//     count advanced on the device;
//   - P = M Q and Q_w = Mᵀ P: one cublasSgemmStridedBatched per same-shape group
//     (the layout keeps a group's P, Q and M blocks adjacent; Q is copied into
//     the Q buffer's group slots first);
//   - finish: out = P Qᵀ (scaled), e_new = M - P Qᵀ in one kernel (k ascending,
//     no FMA contraction: the CPU's operation order).
// The results match the CPU path up to rounding (GEMMs and dot products sum in
// another order), not bit for bit; the drawn Q does match bit for bit.
#pragma once

#include <cstddef>
#include <cstdint>
#include <string>

#include "compressors/powersgd/powersgd_engine.h"

namespace shoal::powersgd::cuda {

// A cuBLAS handle for one device, created on first use; one per compressor
// instance (used by one thread at a time).
class Context;
Context* createContext();
void destroyContext(Context* context);

// Device memory for one step's buffers, stream-ordered (cudaMallocAsync).
struct StepBuffers {
  float* p = nullptr;  // layout.pBufferElems()
  float* q = nullptr;  // layout.qElems
  float* m = nullptr;  // layout.mElems
};
std::string allocateStep(const Layout& layout, int device, void* stream, StepBuffers* buffers);
void freeStep(StepBuffers* buffers, int device, void* stream);
// One device buffer of elems floats (stream-ordered; elems 0: nullptr).
std::string allocateFloats(size_t elems, int device, void* stream, float** buffer);
void freeFloats(float* buffer, int device, void* stream);

// Moves a host state (fresh from checkState or loaded) to `device`: allocates
// its device copies, uploads, and empties the host vectors. No-op when it is
// there already; a state on another device is an error.
std::string upload(MatrixState& state, int device);
// A host copy of a device state (synchronizes the device), for saving.
std::string download(const MatrixState& state, MatrixState* host);
// Frees the device copies.
void release(MatrixState& state);

// The phases, as in powersgd_engine.h; io's pointers are device memory and
// io.states[i]->onDevice(). Each returns "" or the CUDA / cuBLAS error; the
// count to allreduce (SUM, f32, device memory) goes to *count.
std::string phaseP(Context& context, const Options& options, const Layout& layout, bool plain, const StepIo& io,
                   const StepBuffers& buffers, int device, void* stream, size_t* count);
std::string phaseQ(Context& context, const Layout& layout, bool plain, const StepBuffers& buffers, int device,
                   void* stream, size_t* count);
std::string finishStep(const Options& options, const Layout& layout, bool plain, const StepIo& io,
                       const StepBuffers& buffers, int worldSize, shoal_op_t op, int device, void* stream);

// For tests: draws q [cols x r] (device memory) as the first step does before
// orthonormalization, column c from generation firstGeneration + c.
std::string drawQ(float* q, size_t cols, int r, uint64_t seed, uint64_t key, uint64_t firstGeneration, int device,
                  void* stream);

}  // namespace shoal::powersgd::cuda
