// The PowerSGD plan of include/shoal/lowrank.h: the powersgd compressor's step
// (powersgd_engine.h, or powersgd_cuda.h for a CUDA plan) over a fixed list of
// matrices, with the matrices' states, the phase order, the fingerprint the
// ranks compare and the saved-state format.
//
// The plan never talks to other ranks. Its caller does: lib/api/lowrank_plan_api.cc
// checks the arguments, agrees on the fingerprint once per communicator and
// hands step() the allreduce that sums a phase's buffer across the ranks; a
// caller of the split phases runs its own allreduces between them.
#pragma once

#include <cstddef>
#include <cstdint>
#include <functional>
#include <vector>

#include "compressors/powersgd/powersgd_engine.h"
#include "shoal/lowrank.h"

namespace shoal::powersgd {

#if SHOAL_WITH_CUDA
namespace cuda {
class Context;
}
#endif

class Plan {
 public:
  // Which call the plan expects next: phase_p, phase_q, then finish, once per step.
  enum class Phase { ExpectP, ExpectQ, ExpectFinish };
  // Sums count f32 elements of buffer in place across the ranks.
  using Allreduce = std::function<void(float* buffer, size_t count)>;

  // From checked arguments (lib/api/lowrank_plan_api.cc checks them). A CUDA
  // plan moves the states to config.device; throws an Error when it cannot.
  Plan(const shoal_lowrank_matrix_t* matrices, int count, const shoal_lowrank_config_t& config);
  ~Plan();
  Plan(const Plan&) = delete;
  Plan& operator=(const Plan&) = delete;

  const Layout& layout() const { return layout_; }
  size_t matrices() const { return states_.size(); }
  // Elements of matrix i (a NULL tensor is allowed only where this is 0).
  size_t elements(size_t i) const { return layout_.entries[i].shape.count; }
  shoal_memory_t memory() const { return memory_; }
  // The matrices, names and options hashed: equal on ranks that run the same plan.
  uint64_t fingerprint() const { return fingerprint_; }
  // Whether the step in progress is a plain one (before start_iter: no Q round).
  bool plain() const { return plain_; }

  // A call out of order fails with text naming `call` and starts the plan over
  // at phase P; so does restart() (an argument refused mid-step).
  void expect(const char* call, Phase phase);
  Phase phase() const { return phase_; }
  void restart() { phase_ = Phase::ExpectP; }

  // The split phases: each returns the elements of its buffer to sum across
  // the ranks (SUM, f32; 0: none). pbuf holds layout().pBufferElems() floats,
  // qbuf layout().qElems, in the plan's memory.
  size_t phaseP(const void* const* grads, float* pbuf);
  size_t phaseQ(float* pbuf, float* qbuf);
  void finish(const float* pbuf, const float* qbuf, void* const* outputs, int worldSize, shoal_op_t op);

  // A whole host step with the plan's own buffers, each phase's buffer summed
  // by allreduce. A failure leaves the plan expecting phase P.
  void step(const void* const* grads, void* const* outputs, int worldSize, shoal_op_t op, const Allreduce& allreduce);

  // The saved state: u64 {magic, matrices, steps}, then per matrix u64 bytes
  // and its state (powersgd_engine.h saveState). Saved between steps only;
  // load() replaces every matrix's state or, on any error, none. `call` names
  // the entry point in error text.
  size_t stateBytes() const;
  void save(const char* call, uint8_t* out) const;
  void load(const char* call, const uint8_t* in, size_t bytes);

 private:
  StepIo io(const void* const* inputs, void* const* outputs) const;
#if SHOAL_WITH_CUDA
  void releaseDevice();
#endif

  Options options_;
  shoal_dtype_t dtype_ = SHOAL_F32;
  Layout layout_;
  std::vector<MatrixState> states_;
  std::vector<MatrixState*> statePointers_;
  std::vector<shoal_dtype_t> dtypes_;
  std::vector<uint64_t> keys_;
  std::vector<float> mbuf_;        // M = g + e, f32 (host plans)
  std::vector<float> pbuf_, qbuf_;  // step()'s own payloads
  uint64_t steps_ = 0;
  Phase phase_ = Phase::ExpectP;
  bool plain_ = false;
  uint64_t fingerprint_ = 0;
  shoal_memory_t memory_ = SHOAL_MEMORY_HOST;
  int device_ = 0;
  void* stream_ = nullptr;
#if SHOAL_WITH_CUDA
  cuda::Context* cuda_ = nullptr;  // CUDA plans: cuBLAS, the M workspace, states on the device
  float* deviceM_ = nullptr;
#endif
};

}  // namespace shoal::powersgd
