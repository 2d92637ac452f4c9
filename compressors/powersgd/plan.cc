// The PowerSGD plan (plan.h): matrices and options fixed at creation, the
// engine's phases run on the host or, for a CUDA plan, on the device.
#include "compressors/powersgd/plan.h"

#include <cstring>
#include <string>
#include <utility>

#include "compressors/powersgd/powersgd_math.h"
#include "core/error.h"
#if SHOAL_WITH_CUDA
#include "compressors/powersgd/powersgd_cuda.h"
#endif

namespace shoal::powersgd {

namespace {

constexpr uint64_t kPlanMagic = 0x4e4c504c414f4853ull;  // "SHOALPLN" in little-endian bytes
constexpr size_t kPlanHeaderWords = 3;

uint64_t mixIn(uint64_t hash, uint64_t value) { return splitmix64(hash ^ splitmix64(value)); }

#if SHOAL_WITH_CUDA
void failOnCudaError(const std::string& error) {
  if (!error.empty()) fail(SHOAL_ERR_INTERNAL, "{}", error);
}
#endif

}  // namespace

Plan::Plan(const shoal_lowrank_matrix_t* matrices, int count, const shoal_lowrank_config_t& config) {
  options_.rank = config.rank;
  options_.ef = config.error_feedback == 1;
  options_.minCompressionRate = config.min_compression_rate;
  options_.startIter = config.start_iter;
  options_.seed = config.seed;
  dtype_ = config.dtype;
  memory_ = config.memory;
  device_ = config.device;
  stream_ = config.stream;
  std::vector<Shape> shapes(static_cast<size_t>(count));
  for (int i = 0; i < count; ++i) {
    const shoal_lowrank_matrix_t& m = matrices[i];
    shapes[i] = shapeOf(static_cast<size_t>(m.rows), static_cast<size_t>(m.cols), m.rank ? m.rank : config.rank,
                        config.min_compression_rate, (m.flags & SHOAL_LOWRANK_DENSE) != 0);
    const std::string key = m.name != nullptr ? std::string(m.name) : std::to_string(i);
    keys_.push_back(nameHash(key.c_str()));
  }
  layout_ = makeLayout(shapes);
  states_.resize(shapes.size());
  dtypes_.assign(shapes.size(), config.dtype);
  for (size_t i = 0; i < shapes.size(); ++i) {
    checkState(states_[i], shapes[i], config.dtype);
    statePointers_.push_back(&states_[i]);
  }
#if SHOAL_WITH_CUDA
  if (memory_ == SHOAL_MEMORY_CUDA) {
    try {
      cuda_ = cuda::createContext();
      for (MatrixState& state : states_) failOnCudaError(cuda::upload(state, device_));
      failOnCudaError(cuda::allocateFloats(layout_.mElems, device_, stream_, &deviceM_));
    } catch (...) {
      releaseDevice();  // no destructor runs for a constructor that throws
      throw;
    }
  }
#endif

  uint64_t hash = mixIn(0, states_.size());
  for (size_t i = 0; i < states_.size(); ++i) {
    const Shape& shape = layout_.entries[i].shape;
    hash = mixIn(mixIn(mixIn(mixIn(hash, shape.rows), shape.cols), static_cast<uint64_t>(shape.r)), keys_[i]);
  }
  uint64_t rate = 0;
  std::memcpy(&rate, &options_.minCompressionRate, sizeof rate);
  for (uint64_t value : {static_cast<uint64_t>(options_.rank), static_cast<uint64_t>(options_.ef), options_.startIter,
                         options_.seed, rate, static_cast<uint64_t>(dtype_)})
    hash = mixIn(hash, value);
  fingerprint_ = hash;
}

Plan::~Plan() {
#if SHOAL_WITH_CUDA
  releaseDevice();
#endif
}

#if SHOAL_WITH_CUDA
void Plan::releaseDevice() {
  for (MatrixState& state : states_) cuda::release(state);
  cuda::freeFloats(deviceM_, device_, stream_);
  deviceM_ = nullptr;
  cuda::destroyContext(cuda_);
  cuda_ = nullptr;
}
#endif

StepIo Plan::io(const void* const* inputs, void* const* outputs) const {
  return {static_cast<int>(states_.size()), dtypes_.data(), inputs, outputs, statePointers_.data(), keys_.data()};
}

void Plan::expect(const char* call, Phase phase) {
  if (phase_ == phase) return;
  static const char* const kNames[] = {"shoal_lowrank_phase_p", "shoal_lowrank_phase_q", "shoal_lowrank_finish"};
  const Phase expected = phase_;
  phase_ = Phase::ExpectP;
  fail(SHOAL_ERR_INVALID_ARGUMENT, "{}: called out of order, the plan expected {} (call phase_p, phase_q, finish "
       "once per step; the plan now expects phase_p)", call, kNames[static_cast<int>(expected)]);
}

size_t Plan::phaseP(const void* const* grads, float* pbuf) {
  plain_ = steps_ < options_.startIter;
  size_t count = 0;
#if SHOAL_WITH_CUDA
  if (memory_ == SHOAL_MEMORY_CUDA) {
    phase_ = Phase::ExpectP;
    failOnCudaError(cuda::phaseP(*cuda_, options_, layout_, plain_, io(grads, nullptr), {pbuf, nullptr, deviceM_},
                                 device_, stream_, &count));
    phase_ = Phase::ExpectQ;
    return count;
  }
#endif
  mbuf_.resize(plain_ ? 0 : layout_.mElems);
  count = powersgd::phaseP(options_, layout_, plain_, io(grads, nullptr), pbuf, mbuf_.data());
  phase_ = Phase::ExpectQ;
  return count;
}

size_t Plan::phaseQ(float* pbuf, float* qbuf) {
  size_t count = 0;
#if SHOAL_WITH_CUDA
  if (memory_ == SHOAL_MEMORY_CUDA) {
    phase_ = Phase::ExpectP;
    failOnCudaError(cuda::phaseQ(*cuda_, layout_, plain_, {pbuf, qbuf, deviceM_}, device_, stream_, &count));
    phase_ = Phase::ExpectFinish;
    return count;
  }
#endif
  count = powersgd::phaseQ(options_, layout_, plain_, io(nullptr, nullptr), pbuf, mbuf_.data(), qbuf);
  phase_ = Phase::ExpectFinish;
  return count;
}

void Plan::finish(const float* pbuf, const float* qbuf, void* const* outputs, int worldSize, shoal_op_t op) {
#if SHOAL_WITH_CUDA
  if (memory_ == SHOAL_MEMORY_CUDA) {
    phase_ = Phase::ExpectP;
    failOnCudaError(cuda::finishStep(options_, layout_, plain_, io(nullptr, outputs),
                                     {const_cast<float*>(pbuf), const_cast<float*>(qbuf), deviceM_}, worldSize, op,
                                     device_, stream_));
    ++steps_;
    return;
  }
#endif
  finishStep(options_, layout_, plain_, io(nullptr, outputs), pbuf, qbuf, mbuf_.data(), worldSize, op);
  ++steps_;
  phase_ = Phase::ExpectP;
}

void Plan::step(const void* const* grads, void* const* outputs, int worldSize, shoal_op_t op,
                const Allreduce& allreduce) {
  phase_ = Phase::ExpectP;
  pbuf_.resize(layout_.pBufferElems());  // every element read is written first: no fill
  qbuf_.resize(layout_.qElems);
  try {
    const size_t pCount = phaseP(grads, pbuf_.data());
    if (pCount) allreduce(pbuf_.data(), pCount);
    const size_t qCount = phaseQ(pbuf_.data(), qbuf_.data());
    if (qCount) allreduce(qbuf_.data(), qCount);
    finish(pbuf_.data(), qbuf_.data(), outputs, worldSize, op);
  } catch (...) {
    phase_ = Phase::ExpectP;
    throw;
  }
}

size_t Plan::stateBytes() const {
  size_t bytes = kPlanHeaderWords * sizeof(uint64_t);
  for (const MatrixState& state : states_) bytes += sizeof(uint64_t) + powersgd::stateBytes(state);
  return bytes;
}

void Plan::save(const char* call, uint8_t* out) const {
  if (phase_ != Phase::ExpectP)
    fail(SHOAL_ERR_INVALID_ARGUMENT, "{}: a step is in progress (phase_p was called, finish not yet); save between "
         "steps", call);
  const uint64_t header[kPlanHeaderWords] = {kPlanMagic, states_.size(), steps_};
  std::memcpy(out, header, sizeof header);
  out += sizeof header;
  for (const MatrixState& state : states_) {
    const uint64_t size = powersgd::stateBytes(state);
    std::memcpy(out, &size, sizeof size);
#if SHOAL_WITH_CUDA
    if (state.onDevice()) {
      MatrixState host;
      failOnCudaError(cuda::download(state, &host));
      saveState(host, out + sizeof size);
      out += sizeof size + size;
      continue;
    }
#endif
    saveState(state, out + sizeof size);
    out += sizeof size + size;
  }
}

void Plan::load(const char* call, const uint8_t* in, size_t bytes) {
  uint64_t header[kPlanHeaderWords];
  if (bytes < sizeof header)
    fail(SHOAL_ERR_INVALID_ARGUMENT, "{}: {} bytes are too few for a plan state (at least {})", call, bytes,
         sizeof header);
  std::memcpy(header, in, sizeof header);
  if (header[0] != kPlanMagic)
    fail(SHOAL_ERR_INVALID_ARGUMENT, "{}: the buffer is not a plan state from shoal_lowrank_state_save", call);
  if (header[1] != states_.size())
    fail(SHOAL_ERR_INVALID_ARGUMENT, "{}: the state holds {} matrices, the plan {}", call, header[1], states_.size());
  std::vector<MatrixState> loaded(states_.size());
  size_t offset = sizeof header;
  for (size_t i = 0; i < states_.size(); ++i) {
    uint64_t size = 0;
    if (bytes - offset < sizeof size) fail(SHOAL_ERR_INVALID_ARGUMENT, "{}: the state ends before matrix {}", call, i);
    std::memcpy(&size, in + offset, sizeof size);
    offset += sizeof size;
    if (bytes - offset < size) fail(SHOAL_ERR_INVALID_ARGUMENT, "{}: the state ends inside matrix {}", call, i);
    const std::string why = loadState(in + offset, size, &loaded[i]);
    if (!why.empty()) fail(SHOAL_ERR_INVALID_ARGUMENT, "{}: matrix {}: {}", call, i, why);
    const MatrixState& mine = states_[i];
    if (loaded[i].count != mine.count || loaded[i].cols != mine.cols || loaded[i].r != mine.r ||
        loaded[i].dtype != mine.dtype)
      fail(SHOAL_ERR_INVALID_ARGUMENT,
           "{}: matrix {} has {} {} elements and Q [{} x {}] in the plan, {} {} and [{} x {}] in the state; create "
           "the plan with the matrices and config it was saved from",
           call, i, mine.count, shoal_dtype_name(mine.dtype), mine.cols, mine.r, loaded[i].count,
           shoal_dtype_name(loaded[i].dtype), loaded[i].cols, loaded[i].r);
    loaded[i].typed = true;
    offset += size;
  }
  if (offset != bytes) fail(SHOAL_ERR_INVALID_ARGUMENT, "{}: {} bytes follow the last matrix's state", call, bytes - offset);
#if SHOAL_WITH_CUDA
  if (memory_ == SHOAL_MEMORY_CUDA)
    for (MatrixState& state : loaded) failOnCudaError(cuda::upload(state, device_));
#endif
  for (size_t i = 0; i < states_.size(); ++i) {
#if SHOAL_WITH_CUDA
    cuda::release(states_[i]);
#endif
    states_[i] = std::move(loaded[i]);
  }
  steps_ = header[2];
  phase_ = Phase::ExpectP;
}

}  // namespace shoal::powersgd
