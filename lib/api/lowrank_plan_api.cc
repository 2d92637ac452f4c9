// The PowerSGD plan of include/shoal/lowrank.h: the powersgd compressor's step
// (compressors/powersgd/powersgd_engine.h) over a fixed list of matrices, run
// on a communicator or phase by phase by the caller.
#include <cmath>
#include <cstring>
#include <exception>
#include <limits>
#include <memory>
#include <string>
#include <vector>

#include "api/export.h"
#include "api/guard.h"
#include "comm/communicator.h"
#include "comm/call.h"
#include "comm/host_ops.h"
#include "runtime/blocking.h"
#include "collectives/common/reducer.h"
#include "compressors/powersgd/powersgd_engine.h"
#include "compressors/powersgd/powersgd_math.h"
#include "shoal/lowrank.h"
#if SHOAL_WITH_CUDA
#include "compressors/powersgd/powersgd_cuda.h"
#endif


using namespace shoal;
using namespace shoal::powersgd;

struct shoal_lowrank_plan {
  Options options;
  shoal_dtype_t dtype = SHOAL_F32;
  Layout layout;
  std::vector<MatrixState> states;
  std::vector<MatrixState*> statePointers;
  std::vector<shoal_dtype_t> dtypes;
  std::vector<uint64_t> keys;
  std::vector<float> mbuf;        // M = g + e, f32
  std::vector<float> pbuf, qbuf;  // shoal_lowrank_step's own payloads
  uint64_t steps = 0;
  enum Phase { kExpectP, kExpectQ, kExpectFinish } phase = kExpectP;
  bool plain = false;             // of the step in progress
  uint64_t fingerprint = 0;       // of the matrices and options, compared across ranks
  bool agreed = false;            // shoal_lowrank_step checked it with the peers
  shoal_memory_t memory = SHOAL_MEMORY_HOST;
  int device = 0;
  void* stream = nullptr;
#if SHOAL_WITH_CUDA
  powersgd::cuda::Context* cuda = nullptr;  // CUDA plans: cuBLAS, the M workspace, states on the device
  float* deviceM = nullptr;
  ~shoal_lowrank_plan() {
    for (MatrixState& state : states) powersgd::cuda::release(state);
    powersgd::cuda::freeFloats(deviceM, device, stream);
    powersgd::cuda::destroyContext(cuda);
  }
#endif

  StepIo io(const void* const* inputs, void* const* outputs) const {
    return {static_cast<int>(states.size()), dtypes.data(), inputs, outputs, statePointers.data(), keys.data()};
  }
};

namespace {

constexpr uint64_t kPlanMagic = 0x4e4c504c414f4853ull;  // "SHOALPLN" in little-endian bytes
constexpr size_t kPlanHeaderWords = 3;

shoal_lowrank_plan& usablePlan(shoal_lowrank_plan_t plan, const char* call) {
  if (plan == nullptr) fail(SHOAL_ERR_INVALID_ARGUMENT, "{}: plan is NULL; create it with shoal_lowrank_plan_create", call);
  return *plan;
}

void checkOp(const char* call, shoal_op_t op) {
  if (op != SHOAL_SUM && op != SHOAL_AVG)
    fail(SHOAL_ERR_INVALID_ARGUMENT, "{}: op {} is not supported; use SHOAL_SUM or SHOAL_AVG", call, shoal_op_name(op));
}

// The tensor pointers of a step: present for every non-empty matrix.
void checkTensors(const char* call, const char* what, const shoal_lowrank_plan& plan, const void* const* tensors) {
  if (tensors == nullptr) fail(SHOAL_ERR_INVALID_ARGUMENT, "{}: {} is NULL; pass one pointer per matrix", call, what);
  for (size_t i = 0; i < plan.states.size(); ++i)
    if (tensors[i] == nullptr && plan.layout.entries[i].shape.count > 0)
      fail(SHOAL_ERR_INVALID_ARGUMENT, "{}: {}[{}] is NULL but matrix {} holds {} elements", call, what, i, i,
           plan.layout.entries[i].shape.count);
}

// A phase called out of order resets the plan to a fresh step.
void expectPhase(shoal_lowrank_plan& plan, const char* call, shoal_lowrank_plan::Phase phase) {
  if (plan.phase == phase) return;
  static const char* const kNames[] = {"shoal_lowrank_phase_p", "shoal_lowrank_phase_q", "shoal_lowrank_finish"};
  const auto expected = plan.phase;
  plan.phase = shoal_lowrank_plan::kExpectP;
  fail(SHOAL_ERR_INVALID_ARGUMENT, "{}: called out of order, the plan expected {} (call phase_p, phase_q, finish "
       "once per step; the plan now expects phase_p)", call, kNames[expected]);
}

size_t planStateBytes(const shoal_lowrank_plan& plan) {
  size_t bytes = kPlanHeaderWords * sizeof(uint64_t);
  for (const MatrixState& state : plan.states) bytes += sizeof(uint64_t) + stateBytes(state);
  return bytes;
}

#if SHOAL_WITH_CUDA
void failOnCudaError(const std::string& error) {
  if (!error.empty()) fail(SHOAL_ERR_INTERNAL, "{}", error);
}

powersgd::cuda::StepBuffers deviceBuffers(const shoal_lowrank_plan& plan, const float* pbuf, const float* qbuf) {
  return {const_cast<float*>(pbuf), const_cast<float*>(qbuf), plan.deviceM};
}
#endif

uint64_t mixIn(uint64_t hash, uint64_t value) { return splitmix64(hash ^ splitmix64(value)); }

uint64_t fingerprintOf(const shoal_lowrank_plan& plan) {
  uint64_t hash = mixIn(0, plan.states.size());
  for (size_t i = 0; i < plan.states.size(); ++i) {
    const Shape& shape = plan.layout.entries[i].shape;
    hash = mixIn(mixIn(mixIn(mixIn(hash, shape.rows), shape.cols), static_cast<uint64_t>(shape.r)), plan.keys[i]);
  }
  uint64_t rate = 0;
  std::memcpy(&rate, &plan.options.minCompressionRate, sizeof rate);
  for (uint64_t value : {static_cast<uint64_t>(plan.options.rank), static_cast<uint64_t>(plan.options.ef),
                         plan.options.startIter, plan.options.seed, rate, static_cast<uint64_t>(plan.dtype)})
    hash = mixIn(hash, value);
  return hash;
}

// Once per plan: every rank must step the same plan (else the P and Q
// allreduces would pair unrelated buffers). One allreduce MAX of
// the plan's fingerprint (an agreement round, comm/agree.h).
void agreeOnPlan(shoal_comm& comm, shoal_lowrank_plan& plan, const char* call) {
  if (plan.agreed) return;
  if (!agree(comm, comm.sequence++, fmt::format("{:016x}", plan.fingerprint)).same)
    fail(SHOAL_ERR_MISMATCH,
         "{}: the ranks' plans differ (matrices, names, rank, options or dtype); create the same plan on every rank",
         call);
  plan.agreed = true;
}

size_t runPhaseP(shoal_lowrank_plan& plan, const void* const* grads, float* pbuf) {
  plan.plain = plan.steps < plan.options.startIter;
  size_t count = 0;
#if SHOAL_WITH_CUDA
  if (plan.memory == SHOAL_MEMORY_CUDA) {
    plan.phase = shoal_lowrank_plan::kExpectP;
    failOnCudaError(powersgd::cuda::phaseP(*plan.cuda, plan.options, plan.layout, plan.plain,
                                           plan.io(grads, nullptr), deviceBuffers(plan, pbuf, nullptr), plan.device,
                                           plan.stream, &count));
    plan.phase = shoal_lowrank_plan::kExpectQ;
    return count;
  }
#endif
  plan.mbuf.resize(plan.plain ? 0 : plan.layout.mElems);
  count = phaseP(plan.options, plan.layout, plan.plain, plan.io(grads, nullptr), pbuf, plan.mbuf.data());
  plan.phase = shoal_lowrank_plan::kExpectQ;
  return count;
}

size_t runPhaseQ(shoal_lowrank_plan& plan, float* pbuf, float* qbuf) {
  size_t count = 0;
#if SHOAL_WITH_CUDA
  if (plan.memory == SHOAL_MEMORY_CUDA) {
    plan.phase = shoal_lowrank_plan::kExpectP;
    failOnCudaError(powersgd::cuda::phaseQ(*plan.cuda, plan.layout, plan.plain, deviceBuffers(plan, pbuf, qbuf),
                                           plan.device, plan.stream, &count));
    plan.phase = shoal_lowrank_plan::kExpectFinish;
    return count;
  }
#endif
  count = phaseQ(plan.options, plan.layout, plan.plain, pbuf, plan.mbuf.data(), qbuf);
  plan.phase = shoal_lowrank_plan::kExpectFinish;
  return count;
}

void runFinish(shoal_lowrank_plan& plan, const float* pbuf, const float* qbuf, void* const* outputs, int worldSize,
               shoal_op_t op) {
#if SHOAL_WITH_CUDA
  if (plan.memory == SHOAL_MEMORY_CUDA) {
    plan.phase = shoal_lowrank_plan::kExpectP;
    failOnCudaError(powersgd::cuda::finishStep(plan.options, plan.layout, plan.plain, plan.io(nullptr, outputs),
                                               deviceBuffers(plan, pbuf, qbuf), worldSize, op, plan.device,
                                               plan.stream));
    ++plan.steps;
    return;
  }
#endif
  finishStep(plan.options, plan.layout, plan.plain, plan.io(nullptr, outputs), pbuf, qbuf, plan.mbuf.data(),
             worldSize, op);
  ++plan.steps;
  plan.phase = shoal_lowrank_plan::kExpectP;
}

}  // namespace

SHOAL_EXPORT shoal_status_t shoal_lowrank_plan_create(const shoal_lowrank_matrix_t* matrices, int num_matrices,
                                                      const shoal_lowrank_config_t* config,
                                                      shoal_lowrank_plan_t* plan) {
  return guarded(nullptr, [&] {
    const char* call = "shoal_lowrank_plan_create";
    if (plan == nullptr) fail(SHOAL_ERR_INVALID_ARGUMENT, "{}: plan (the result) is NULL", call);
    *plan = nullptr;
    if (matrices == nullptr) fail(SHOAL_ERR_INVALID_ARGUMENT, "{}: matrices is NULL; pass the descriptors", call);
    if (num_matrices < 1)
      fail(SHOAL_ERR_INVALID_ARGUMENT, "{}: num_matrices is {}; pass at least one matrix", call, num_matrices);
    shoal_lowrank_config_t c = SHOAL_LOWRANK_CONFIG_INIT;
    if (config != nullptr) {
      if (config->struct_size == 0 || config->struct_size > sizeof c)
        fail(SHOAL_ERR_INVALID_ARGUMENT, "{}: config must start from SHOAL_LOWRANK_CONFIG_INIT", call);
      std::memcpy(&c, config, config->struct_size);
    }
    if (c.rank < 1 || c.rank > kMaxRank)
      fail(SHOAL_ERR_INVALID_ARGUMENT, "{}: config rank is {}; it must be in 1..{}", call, c.rank, kMaxRank);
    if (c.error_feedback != 0 && c.error_feedback != 1)
      fail(SHOAL_ERR_INVALID_ARGUMENT, "{}: config error_feedback is {}; it must be 0 or 1", call, c.error_feedback);
    if (!std::isfinite(c.min_compression_rate) || c.min_compression_rate < 0)
      fail(SHOAL_ERR_INVALID_ARGUMENT, "{}: config min_compression_rate is {}; it must be a finite number >= 0", call,
           c.min_compression_rate);
    if (!supportedDtype(c.dtype))
      fail(SHOAL_ERR_INVALID_ARGUMENT, "{}: config dtype is {}; use SHOAL_F32, SHOAL_F16 or SHOAL_BF16", call,
           shoal_dtype_name(c.dtype));
    if (c.memory != SHOAL_MEMORY_HOST && c.memory != SHOAL_MEMORY_CUDA)
      fail(SHOAL_ERR_INVALID_ARGUMENT, "{}: config memory is {}; use SHOAL_MEMORY_HOST or SHOAL_MEMORY_CUDA", call,
           static_cast<int>(c.memory));
#if !SHOAL_WITH_CUDA
    if (c.memory == SHOAL_MEMORY_CUDA)
      fail(SHOAL_ERR_UNSUPPORTED, "{}: a CUDA plan needs a shoal built with CUDA (this one is host only)", call);
#endif
    auto created = std::make_unique<shoal_lowrank_plan>();
    created->options.rank = c.rank;
    created->options.ef = c.error_feedback == 1;
    created->options.minCompressionRate = c.min_compression_rate;
    created->options.startIter = c.start_iter;
    created->options.seed = c.seed;
    created->dtype = c.dtype;
    created->memory = c.memory;
    created->device = c.device;
    created->stream = c.stream;
    std::vector<Shape> shapes(static_cast<size_t>(num_matrices));
    const size_t maxElements = std::numeric_limits<size_t>::max() / sizeof(float) / 2;
    for (int i = 0; i < num_matrices; ++i) {
      const shoal_lowrank_matrix_t& m = matrices[i];
      if (m.rows < 0 || m.cols < 0)
        fail(SHOAL_ERR_INVALID_ARGUMENT, "{}: matrices[{}] is [{} x {}]; extents must be >= 0", call, i, m.rows, m.cols);
      if (m.cols != 0 && static_cast<uint64_t>(m.rows) > maxElements / static_cast<uint64_t>(m.cols))
        fail(SHOAL_ERR_INVALID_ARGUMENT, "{}: matrices[{}] [{} x {}] is too large", call, i, m.rows, m.cols);
      if (m.rank < 0 || m.rank > kMaxRank)
        fail(SHOAL_ERR_INVALID_ARGUMENT, "{}: matrices[{}].rank is {}; use 0 (the config's) or 1..{}", call, i, m.rank,
             kMaxRank);
      if ((m.flags & ~SHOAL_LOWRANK_DENSE) != 0)
        fail(SHOAL_ERR_INVALID_ARGUMENT, "{}: matrices[{}].flags is {:#x}; only SHOAL_LOWRANK_DENSE is defined", call,
             i, m.flags);
      shapes[i] = shapeOf(static_cast<size_t>(m.rows), static_cast<size_t>(m.cols), m.rank ? m.rank : c.rank,
                          c.min_compression_rate, (m.flags & SHOAL_LOWRANK_DENSE) != 0);
      const std::string key = m.name != nullptr ? std::string(m.name) : std::to_string(i);
      created->keys.push_back(nameHash(key.c_str()));
    }
    created->layout = makeLayout(shapes);
    created->states.resize(shapes.size());
    created->dtypes.assign(shapes.size(), c.dtype);
    for (size_t i = 0; i < shapes.size(); ++i) {
      checkState(created->states[i], shapes[i], c.dtype);
      created->statePointers.push_back(&created->states[i]);
    }
#if SHOAL_WITH_CUDA
    if (c.memory == SHOAL_MEMORY_CUDA) {
      created->cuda = powersgd::cuda::createContext();
      for (MatrixState& state : created->states) failOnCudaError(powersgd::cuda::upload(state, c.device));
      failOnCudaError(powersgd::cuda::allocateFloats(created->layout.mElems, c.device, c.stream, &created->deviceM));
    }
#endif
    created->fingerprint = fingerprintOf(*created);
    *plan = created.release();
  });
}

SHOAL_EXPORT void shoal_lowrank_plan_destroy(shoal_lowrank_plan_t plan) { delete plan; }

SHOAL_EXPORT shoal_status_t shoal_lowrank_plan_sizes(shoal_lowrank_plan_t plan, shoal_lowrank_sizes_t* sizes) {
  return guarded(nullptr, [&] {
    const char* call = "shoal_lowrank_plan_sizes";
    shoal_lowrank_plan& p = usablePlan(plan, call);
    if (sizes == nullptr || sizes->struct_size == 0 || sizes->struct_size > sizeof(shoal_lowrank_sizes_t))
      fail(SHOAL_ERR_INVALID_ARGUMENT, "{}: sizes must come from SHOAL_LOWRANK_SIZES_INIT", call);
    shoal_lowrank_sizes_t result = SHOAL_LOWRANK_SIZES_INIT;
    result.p_elems = p.layout.pBufferElems();
    result.q_elems = p.layout.qElems;
    result.compressed = static_cast<size_t>(p.layout.compressed);
    result.dense_elems = p.layout.denseElems;
    result.workspace_bytes = p.layout.mElems * sizeof(float);
    result.state_bytes = planStateBytes(p);
    std::memcpy(sizes, &result, sizes->struct_size);
  });
}

SHOAL_EXPORT shoal_status_t shoal_lowrank_step(shoal_lowrank_plan_t plan, shoal_comm_t comm, const void* const* grads,
                                               void* const* outputs, shoal_op_t op) {
  return guarded(comm, [&] {
    const char* call = "shoal_lowrank_step";
    shoal_comm& c = usableComm(comm, call);
    runtime::blockingCall(c, call, [&] {
      shoal_lowrank_plan& p = usablePlan(plan, call);
      if (p.memory != SHOAL_MEMORY_HOST)
        fail(SHOAL_ERR_UNSUPPORTED, "{}: takes host plans; drive a CUDA plan with the split phases and your own "
             "allreduces on its stream", call);
      checkOp(call, op);
      checkTensors(call, "grads", p, grads);
      checkTensors(call, "outputs", p, reinterpret_cast<const void* const*>(outputs));
      p.phase = shoal_lowrank_plan::kExpectP;
      agreeOnPlan(c, p, call);
      p.pbuf.resize(p.layout.pBufferElems());  // every element read is written first: no fill
      p.qbuf.resize(p.layout.qElems);
      try {
        const size_t pCount = runPhaseP(p, grads, p.pbuf.data());
        if (pCount) plainAllreduce(c, c.sequence++, p.pbuf.data(), p.pbuf.data(), pCount, SHOAL_F32, SHOAL_SUM);
        const size_t qCount = runPhaseQ(p, p.pbuf.data(), p.qbuf.data());
        if (qCount) plainAllreduce(c, c.sequence++, p.qbuf.data(), p.qbuf.data(), qCount, SHOAL_F32, SHOAL_SUM);
        runFinish(p, p.pbuf.data(), p.qbuf.data(), outputs, c.size, op);
      } catch (...) {
        p.phase = shoal_lowrank_plan::kExpectP;
        throw;
      }
    });
  });
}

SHOAL_EXPORT shoal_status_t shoal_lowrank_phase_p(shoal_lowrank_plan_t plan, const void* const* grads, float* p_buf,
                                                  size_t* p_count) {
  return guarded(nullptr, [&] {
    const char* call = "shoal_lowrank_phase_p";
    shoal_lowrank_plan& p = usablePlan(plan, call);
    checkTensors(call, "grads", p, grads);
    if (p_count == nullptr) fail(SHOAL_ERR_INVALID_ARGUMENT, "{}: p_count is NULL", call);
    if (p_buf == nullptr && p.layout.pBufferElems() > 0)
      fail(SHOAL_ERR_INVALID_ARGUMENT, "{}: p_buf is NULL; it must hold {} floats (shoal_lowrank_plan_sizes)", call,
           p.layout.pBufferElems());
    *p_count = runPhaseP(p, grads, p_buf);
  });
}

SHOAL_EXPORT shoal_status_t shoal_lowrank_phase_q(shoal_lowrank_plan_t plan, float* p_buf, float* q_buf,
                                                  size_t* q_count) {
  return guarded(nullptr, [&] {
    const char* call = "shoal_lowrank_phase_q";
    shoal_lowrank_plan& p = usablePlan(plan, call);
    expectPhase(p, call, shoal_lowrank_plan::kExpectQ);
    if (q_count == nullptr || (p_buf == nullptr && p.layout.pBufferElems() > 0) ||
        (q_buf == nullptr && p.layout.qElems > 0)) {
      p.phase = shoal_lowrank_plan::kExpectP;
      fail(SHOAL_ERR_INVALID_ARGUMENT, "{}: p_buf ({} floats), q_buf ({} floats) and q_count must not be NULL; the "
           "plan now expects phase_p", call, p.layout.pBufferElems(), p.layout.qElems);
    }
    *q_count = runPhaseQ(p, p_buf, q_buf);
  });
}

SHOAL_EXPORT shoal_status_t shoal_lowrank_finish(shoal_lowrank_plan_t plan, const float* p_buf, const float* q_buf,
                                                 void* const* outputs, int world_size, shoal_op_t op) {
  return guarded(nullptr, [&] {
    const char* call = "shoal_lowrank_finish";
    shoal_lowrank_plan& p = usablePlan(plan, call);
    expectPhase(p, call, shoal_lowrank_plan::kExpectFinish);
    try {
      checkOp(call, op);
      if (world_size < 1) fail(SHOAL_ERR_INVALID_ARGUMENT, "{}: world_size is {}; it must be >= 1", call, world_size);
      checkTensors(call, "outputs", p, reinterpret_cast<const void* const*>(outputs));
      if ((p_buf == nullptr && p.layout.pBufferElems() > 0) || (q_buf == nullptr && p.layout.qElems > 0 && !p.plain))
        fail(SHOAL_ERR_INVALID_ARGUMENT, "{}: p_buf and q_buf must not be NULL", call);
    } catch (...) {
      p.phase = shoal_lowrank_plan::kExpectP;
      throw;
    }
    runFinish(p, p_buf, q_buf, outputs, world_size, op);
  });
}

SHOAL_EXPORT shoal_status_t shoal_lowrank_state_save(shoal_lowrank_plan_t plan, void* buffer, size_t* bytes) {
  return guarded(nullptr, [&] {
    const char* call = "shoal_lowrank_state_save";
    shoal_lowrank_plan& p = usablePlan(plan, call);
    if (bytes == nullptr) fail(SHOAL_ERR_INVALID_ARGUMENT, "{}: bytes is NULL", call);
    const size_t need = planStateBytes(p);
    if (buffer == nullptr) {
      *bytes = need;
      return;
    }
    if (*bytes < need) {
      const size_t given = *bytes;
      *bytes = need;
      fail(SHOAL_ERR_INVALID_ARGUMENT, "{}: the buffer holds {} bytes; the state needs {}", call, given, need);
    }
    if (p.phase != shoal_lowrank_plan::kExpectP)
      fail(SHOAL_ERR_INVALID_ARGUMENT, "{}: a step is in progress (phase_p was called, finish not yet); save between "
           "steps", call);
    auto* out = static_cast<uint8_t*>(buffer);
    const uint64_t header[kPlanHeaderWords] = {kPlanMagic, p.states.size(), p.steps};
    std::memcpy(out, header, sizeof header);
    out += sizeof header;
    for (const MatrixState& state : p.states) {
      const uint64_t size = stateBytes(state);
      std::memcpy(out, &size, sizeof size);
#if SHOAL_WITH_CUDA
      if (state.onDevice()) {
        MatrixState host;
        failOnCudaError(powersgd::cuda::download(state, &host));
        saveState(host, out + sizeof size);
        out += sizeof size + size;
        continue;
      }
#endif
      saveState(state, out + sizeof size);
      out += sizeof size + size;
    }
    *bytes = need;
  });
}

SHOAL_EXPORT shoal_status_t shoal_lowrank_state_load(shoal_lowrank_plan_t plan, const void* buffer, size_t bytes) {
  return guarded(nullptr, [&] {
    const char* call = "shoal_lowrank_state_load";
    shoal_lowrank_plan& p = usablePlan(plan, call);
    if (buffer == nullptr) fail(SHOAL_ERR_INVALID_ARGUMENT, "{}: buffer is NULL", call);
    const auto* in = static_cast<const uint8_t*>(buffer);
    uint64_t header[kPlanHeaderWords];
    if (bytes < sizeof header)
      fail(SHOAL_ERR_INVALID_ARGUMENT, "{}: {} bytes are too few for a plan state (at least {})", call, bytes,
           sizeof header);
    std::memcpy(header, in, sizeof header);
    if (header[0] != kPlanMagic)
      fail(SHOAL_ERR_INVALID_ARGUMENT, "{}: the buffer is not a plan state from shoal_lowrank_state_save", call);
    if (header[1] != p.states.size())
      fail(SHOAL_ERR_INVALID_ARGUMENT, "{}: the state holds {} matrices, the plan {}", call, header[1], p.states.size());
    std::vector<MatrixState> loaded(p.states.size());
    size_t offset = sizeof header;
    for (size_t i = 0; i < p.states.size(); ++i) {
      uint64_t size = 0;
      if (bytes - offset < sizeof size)
        fail(SHOAL_ERR_INVALID_ARGUMENT, "{}: the state ends before matrix {}", call, i);
      std::memcpy(&size, in + offset, sizeof size);
      offset += sizeof size;
      if (bytes - offset < size) fail(SHOAL_ERR_INVALID_ARGUMENT, "{}: the state ends inside matrix {}", call, i);
      const std::string why = loadState(in + offset, size, &loaded[i]);
      if (!why.empty()) fail(SHOAL_ERR_INVALID_ARGUMENT, "{}: matrix {}: {}", call, i, why);
      const MatrixState& mine = p.states[i];
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
    if (offset != bytes)
      fail(SHOAL_ERR_INVALID_ARGUMENT, "{}: {} bytes follow the last matrix's state", call, bytes - offset);
#if SHOAL_WITH_CUDA
    if (p.memory == SHOAL_MEMORY_CUDA)
      for (MatrixState& state : loaded) failOnCudaError(powersgd::cuda::upload(state, p.device));
#endif
    for (size_t i = 0; i < p.states.size(); ++i) {
#if SHOAL_WITH_CUDA
      powersgd::cuda::release(p.states[i]);
#endif
      p.states[i] = std::move(loaded[i]);
    }
    p.steps = header[2];
    p.phase = shoal_lowrank_plan::kExpectP;
  });
}
