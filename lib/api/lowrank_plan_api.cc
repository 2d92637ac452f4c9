// C entry points of the PowerSGD plan (include/shoal/lowrank.h): argument
// checks, the one agreement round a plan needs on a communicator, and the
// allreduces of shoal_lowrank_step. The plan itself (matrices, phases, saved
// state) is compressors/powersgd/plan.h.
#include <cmath>
#include <cstring>
#include <limits>
#include <memory>
#include <string>

#include "api/enter.h"
#include "api/export.h"
#include "api/guard.h"
#include "api/versioned.h"
#include "comm/agree.h"
#include "comm/call.h"
#include "comm/communicator.h"
#include "comm/host_ops.h"
#include "compressors/powersgd/plan.h"
#include "shoal/lowrank.h"

using namespace shoal;
using powersgd::Plan;

struct shoal_lowrank_plan {
  shoal_lowrank_plan(const shoal_lowrank_matrix_t* matrices, int count, const shoal_lowrank_config_t& config)
      : plan(matrices, count, config) {}
  Plan plan;
  bool agreed = false;  // shoal_lowrank_step checked it with the peers
};

namespace {

Plan& usablePlan(shoal_lowrank_plan_t plan, const char* call) {
  if (plan == nullptr) fail(SHOAL_ERR_INVALID_ARGUMENT, "{}: plan is NULL; create it with shoal_lowrank_plan_create", call);
  return plan->plan;
}

void checkOp(const char* call, shoal_op_t op) {
  if (op != SHOAL_SUM && op != SHOAL_AVG)
    fail(SHOAL_ERR_INVALID_ARGUMENT, "{}: op {} is not supported; use SHOAL_SUM or SHOAL_AVG", call, shoal_op_name(op));
}

// The tensor pointers of a step: present for every non-empty matrix.
void checkTensors(const char* call, const char* what, const Plan& plan, const void* const* tensors) {
  if (tensors == nullptr) fail(SHOAL_ERR_INVALID_ARGUMENT, "{}: {} is NULL; pass one pointer per matrix", call, what);
  for (size_t i = 0; i < plan.matrices(); ++i)
    if (tensors[i] == nullptr && plan.elements(i) > 0)
      fail(SHOAL_ERR_INVALID_ARGUMENT, "{}: {}[{}] is NULL but matrix {} holds {} elements", call, what, i, i,
           plan.elements(i));
}

void checkConfig(const char* call, const shoal_lowrank_config_t& c) {
  if (c.rank < 1 || c.rank > powersgd::kMaxRank)
    fail(SHOAL_ERR_INVALID_ARGUMENT, "{}: config rank is {}; it must be in 1..{}", call, c.rank, powersgd::kMaxRank);
  if (c.error_feedback != 0 && c.error_feedback != 1)
    fail(SHOAL_ERR_INVALID_ARGUMENT, "{}: config error_feedback is {}; it must be 0 or 1", call, c.error_feedback);
  if (!std::isfinite(c.min_compression_rate) || c.min_compression_rate < 0)
    fail(SHOAL_ERR_INVALID_ARGUMENT, "{}: config min_compression_rate is {}; it must be a finite number >= 0", call,
         c.min_compression_rate);
  if (!powersgd::supportedDtype(c.dtype))
    fail(SHOAL_ERR_INVALID_ARGUMENT, "{}: config dtype is {}; use SHOAL_F32, SHOAL_F16 or SHOAL_BF16", call,
         shoal_dtype_name(c.dtype));
  if (c.memory != SHOAL_MEMORY_HOST && c.memory != SHOAL_MEMORY_CUDA)
    fail(SHOAL_ERR_INVALID_ARGUMENT, "{}: config memory is {}; use SHOAL_MEMORY_HOST or SHOAL_MEMORY_CUDA", call,
         static_cast<int>(c.memory));
#if !SHOAL_WITH_CUDA
  if (c.memory == SHOAL_MEMORY_CUDA)
    fail(SHOAL_ERR_UNSUPPORTED, "{}: a CUDA plan needs a shoal built with CUDA (this one is host only)", call);
#endif
}

void checkMatrix(const char* call, int i, const shoal_lowrank_matrix_t& m) {
  const size_t maxElements = std::numeric_limits<size_t>::max() / sizeof(float) / 2;
  if (m.rows < 0 || m.cols < 0)
    fail(SHOAL_ERR_INVALID_ARGUMENT, "{}: matrices[{}] is [{} x {}]; extents must be >= 0", call, i, m.rows, m.cols);
  if (m.cols != 0 && static_cast<uint64_t>(m.rows) > maxElements / static_cast<uint64_t>(m.cols))
    fail(SHOAL_ERR_INVALID_ARGUMENT, "{}: matrices[{}] [{} x {}] is too large", call, i, m.rows, m.cols);
  if (m.rank < 0 || m.rank > powersgd::kMaxRank)
    fail(SHOAL_ERR_INVALID_ARGUMENT, "{}: matrices[{}].rank is {}; use 0 (the config's) or 1..{}", call, i, m.rank,
         powersgd::kMaxRank);
  if ((m.flags & ~SHOAL_LOWRANK_DENSE) != 0)
    fail(SHOAL_ERR_INVALID_ARGUMENT, "{}: matrices[{}].flags is {:#x}; only SHOAL_LOWRANK_DENSE is defined", call, i,
         m.flags);
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
    const shoal_lowrank_config_t c =
        readVersioned<shoal_lowrank_config_t>(call, "config", config, SHOAL_LOWRANK_CONFIG_INIT);
    checkConfig(call, c);
    for (int i = 0; i < num_matrices; ++i) checkMatrix(call, i, matrices[i]);
    *plan = std::make_unique<shoal_lowrank_plan>(matrices, num_matrices, c).release();
  });
}

SHOAL_EXPORT void shoal_lowrank_plan_destroy(shoal_lowrank_plan_t plan) { delete plan; }

SHOAL_EXPORT shoal_status_t shoal_lowrank_plan_sizes(shoal_lowrank_plan_t plan, shoal_lowrank_sizes_t* sizes) {
  return guarded(nullptr, [&] {
    const char* call = "shoal_lowrank_plan_sizes";
    const Plan& p = usablePlan(plan, call);
    shoal_lowrank_sizes_t result = SHOAL_LOWRANK_SIZES_INIT;
    result.p_elems = p.layout().pBufferElems();
    result.q_elems = p.layout().qElems;
    result.compressed = static_cast<size_t>(p.layout().compressed);
    result.dense_elems = p.layout().denseElems;
    result.workspace_bytes = p.layout().mElems * sizeof(float);
    result.state_bytes = p.stateBytes();
    writeVersioned(call, "sizes", sizes, result);
  });
}

// One call, up to three collectives: the agreement on the plan (once per plan:
// every rank must step the same plan, else the P and Q allreduces would pair
// unrelated buffers), the P allreduce and the Q allreduce. The first of them
// runs under the call's own sequence number, the others take the next ones.
SHOAL_EXPORT shoal_status_t shoal_lowrank_step(shoal_lowrank_plan_t plan, shoal_comm_t comm, const void* const* grads,
                                               void* const* outputs, shoal_op_t op) {
  return enter(comm, "shoal_lowrank_step", [&](Call& step) {
    const char* call = step.name();
    shoal_comm& c = step.comm();
    Plan& p = usablePlan(plan, call);
    if (p.memory() != SHOAL_MEMORY_HOST)
      fail(SHOAL_ERR_UNSUPPORTED, "{}: takes host plans; drive a CUDA plan with the split phases and your own "
           "allreduces on its stream", call);
    checkOp(call, op);
    checkTensors(call, "grads", p, grads);
    checkTensors(call, "outputs", p, reinterpret_cast<const void* const*>(outputs));
    p.restart();
    bool callNumberUsed = false;
    auto nextSequence = [&] {
      if (callNumberUsed) return takeSequence(c);
      callNumberUsed = true;
      return step.sequence();
    };
    if (!plan->agreed) {
      if (!agree(c, nextSequence(), fmt::format("{:016x}", p.fingerprint())).same)
        fail(SHOAL_ERR_MISMATCH,
             "{}: the ranks' plans differ (matrices, names, rank, options or dtype); create the same plan on every "
             "rank", call);
      plan->agreed = true;
    }
    p.step(grads, outputs, c.size, op, [&](float* buffer, size_t count) {
      plainAllreduce(c, nextSequence(), buffer, buffer, count, SHOAL_F32, SHOAL_SUM);
    });
  });
}

SHOAL_EXPORT shoal_status_t shoal_lowrank_phase_p(shoal_lowrank_plan_t plan, const void* const* grads, float* p_buf,
                                                  size_t* p_count) {
  return guarded(nullptr, [&] {
    const char* call = "shoal_lowrank_phase_p";
    Plan& p = usablePlan(plan, call);
    checkTensors(call, "grads", p, grads);
    if (p_count == nullptr) fail(SHOAL_ERR_INVALID_ARGUMENT, "{}: p_count is NULL", call);
    if (p_buf == nullptr && p.layout().pBufferElems() > 0)
      fail(SHOAL_ERR_INVALID_ARGUMENT, "{}: p_buf is NULL; it must hold {} floats (shoal_lowrank_plan_sizes)", call,
           p.layout().pBufferElems());
    *p_count = p.phaseP(grads, p_buf);
  });
}

SHOAL_EXPORT shoal_status_t shoal_lowrank_phase_q(shoal_lowrank_plan_t plan, float* p_buf, float* q_buf,
                                                  size_t* q_count) {
  return guarded(nullptr, [&] {
    const char* call = "shoal_lowrank_phase_q";
    Plan& p = usablePlan(plan, call);
    p.expect(call, Plan::Phase::ExpectQ);
    if (q_count == nullptr || (p_buf == nullptr && p.layout().pBufferElems() > 0) ||
        (q_buf == nullptr && p.layout().qElems > 0)) {
      p.restart();
      fail(SHOAL_ERR_INVALID_ARGUMENT, "{}: p_buf ({} floats), q_buf ({} floats) and q_count must not be NULL; the "
           "plan now expects phase_p", call, p.layout().pBufferElems(), p.layout().qElems);
    }
    *q_count = p.phaseQ(p_buf, q_buf);
  });
}

SHOAL_EXPORT shoal_status_t shoal_lowrank_finish(shoal_lowrank_plan_t plan, const float* p_buf, const float* q_buf,
                                                 void* const* outputs, int world_size, shoal_op_t op) {
  return guarded(nullptr, [&] {
    const char* call = "shoal_lowrank_finish";
    Plan& p = usablePlan(plan, call);
    p.expect(call, Plan::Phase::ExpectFinish);
    try {
      checkOp(call, op);
      if (world_size < 1) fail(SHOAL_ERR_INVALID_ARGUMENT, "{}: world_size is {}; it must be >= 1", call, world_size);
      checkTensors(call, "outputs", p, reinterpret_cast<const void* const*>(outputs));
      if ((p_buf == nullptr && p.layout().pBufferElems() > 0) || (q_buf == nullptr && p.layout().qElems > 0 && !p.plain()))
        fail(SHOAL_ERR_INVALID_ARGUMENT, "{}: p_buf and q_buf must not be NULL", call);
    } catch (...) {
      p.restart();
      throw;
    }
    p.finish(p_buf, q_buf, outputs, world_size, op);
  });
}

SHOAL_EXPORT shoal_status_t shoal_lowrank_state_save(shoal_lowrank_plan_t plan, void* buffer, size_t* bytes) {
  return guarded(nullptr, [&] {
    const char* call = "shoal_lowrank_state_save";
    const Plan& p = usablePlan(plan, call);
    if (bytes == nullptr) fail(SHOAL_ERR_INVALID_ARGUMENT, "{}: bytes is NULL", call);
    const size_t need = p.stateBytes();
    if (buffer == nullptr) {
      *bytes = need;
      return;
    }
    if (*bytes < need) {
      const size_t given = *bytes;
      *bytes = need;
      fail(SHOAL_ERR_INVALID_ARGUMENT, "{}: the buffer holds {} bytes; the state needs {}", call, given, need);
    }
    p.save(call, static_cast<uint8_t*>(buffer));
    *bytes = need;
  });
}

SHOAL_EXPORT shoal_status_t shoal_lowrank_state_load(shoal_lowrank_plan_t plan, const void* buffer, size_t bytes) {
  return guarded(nullptr, [&] {
    const char* call = "shoal_lowrank_state_load";
    Plan& p = usablePlan(plan, call);
    if (buffer == nullptr) fail(SHOAL_ERR_INVALID_ARGUMENT, "{}: buffer is NULL", call);
    p.load(call, static_cast<const uint8_t*>(buffer), bytes);
  });
}
