// The sketch compressor on CUDA tensors: the host path's rounds (sketch.cc
// explains the encoding), with every payload in device memory on the tensors'
// device and every kernel (sketch.cu) on the first tensor's stream. The host
// synchronises only where it must decide from device values: after round 0
// (the statistics, |U|), when sizing the sketch (the local support), after a
// peel (its leftovers), i.e. a few times per operation, never per element.
#if SHOAL_WITH_CUDA

#include <cmath>
#include <cstring>
#include <string>
#include <vector>

#include "compressors/common/text.h"
#include "compressors/sketch/sketch_checks.h"
#include "compressors/sketch/sketch_cuda.h"
#include "compressors/sketch/sketch_instance.h"
#include "compressors/sketch/sketch_math.h"
#include "compressors/sketch/sketch_peel.h"
#include "core/tensor.h"

namespace shoal::compressors::sketch_impl {
namespace {

using namespace shoal::sketch;

struct DevicePlan {
  size_t count = 0;
  size_t wordOffset = 0, words = 0;
  BloomGeometry bloom;
  bool anyFinite = false, nonfinite = false;
  int Q = 0, T = 0, L = 63, K = 0;
  Mode mode = Mode::None;
  size_t u = 0;
  uint64_t* members = nullptr;  // device, u
  size_t valueOffset = 0, specialOffset = 0;
  bool compactF32 = false;  // compact values as f32 (in dense) when their sums are exact
  SketchGeometry geometry;
  uint64_t* limbs = nullptr;     // device, K * u (sketch)
  uint64_t* leftover = nullptr;  // device, positions in U not peeled
  size_t m = 0, leftoverOffset = 0;
};

struct DeviceState {
  void* stream = nullptr;
  int device = 0;
  std::vector<DevicePlan> plans;
  uint64_t *index = nullptr, *stats = nullptr, *values = nullptr, *specials = nullptr, *leftovers = nullptr;
  float* dense = nullptr;
  size_t indexWords = 0, statsWords = 0, valueWords = 0, specialWords = 0, leftoverWords = 0, denseCount = 0;
  std::vector<void*> owned;  // released by deviceFinish
  int stage = 0;
  bool malformed = false;  // a received payload failed its checks (the error text says which)
  unsigned* flags = nullptr;  // the kernels' checks (sketch_checks.h), read back after them
};

const float* inputOf(const shoal_compress_op_t* op, int t) {
  return static_cast<const float*>(op->tensors[t].input.data);
}
float* outputOf(const shoal_compress_op_t* op, int t) { return static_cast<float*>(op->tensors[t].output.data); }

// Every CUDA call goes through here: a failure becomes the operation's error text.
struct Checker {
  shoal_compress_op_t* op;
  bool ok = true;
  bool operator()(int error, const char* what) {
    if (error != 0 && ok) {
      writeText(op->error_text, op->error_text_size, "sketch (CUDA): %s failed: %s", what, gpu::errorText(error));
      ok = false;
    }
    return ok;
  }
};

// A received payload no honest set of ranks can produce (see sketch.cc): the
// same text on every rank, since every rank reads the same reduced bytes.
bool refuseMalformed(DeviceState& s, shoal_compress_op_t* op, Checker& check, int t, const char* what,
                     const char* why) {
  writeText(op->error_text, op->error_text_size,
            "sketch (CUDA): malformed payload after round 0, tensor %d: %s: %s (a rank sent corrupted data, or it "
            "runs a different shoal)",
            t, what, why);
  s.malformed = true;
  check.ok = false;
  return false;
}

// The encode kernels' flag word (one synchronisation): a local value that the
// agreed scale does not cover means the reduced statistics were corrupted;
// refused, as the CPU path's coversLocal refuses it, instead of dropped.
bool scaleCovered(DeviceState& s, shoal_compress_op_t* op, Checker& check, int round) {
  unsigned flags = 0;
  if (s.flags == nullptr) return true;
  if (!check(gpu::copyToHost(&flags, s.flags, sizeof flags, s.stream), "reading the check flags")) return false;
  if (!(flags & kFlagOutsideScale)) return true;
  writeText(op->error_text, op->error_text_size,
            "sketch (CUDA): malformed payload after round %d: statistics: the agreed scale does not cover this "
            "rank's values (a rank sent corrupted data, or it runs a different shoal)",
            round);
  s.malformed = true;
  check.ok = false;
  return false;
}

template <class T>
bool allocateOwned(DeviceState& s, Checker& check, T** pointer, size_t elements, const char* what) {
  void* raw = nullptr;
  if (!check(gpu::allocate(&raw, elements * sizeof(T), s.stream), what)) return false;
  *pointer = static_cast<T*>(raw);
  if (raw) s.owned.push_back(raw);
  return check(gpu::zero(raw, elements * sizeof(T), s.stream), what);
}

// After round 0: plans, members, and the values payloads.
bool encodeValues(const Instance& inst, DeviceState& s, shoal_compress_op_t* op, Checker& check) {
  const int n = op->world_size;
  std::vector<uint64_t> stats(s.statsWords);
  if (!check(gpu::copyToHost(stats.data(), s.stats, stats.size() * sizeof(uint64_t), s.stream), "reading the stats"))
    return false;
  for (int t = 0; t < op->num_tensors; ++t) {
    DevicePlan& plan = s.plans[t];
    // The statistics came from the peers: checked before they size anything.
    const uint64_t* w = stats.data() + 3 * size_t(t);
    Scale scale;
    char why[200];
    if (!readScale(w, n, scale, why, sizeof why)) return refuseMalformed(s, op, check, t, "statistics", why);
    plan.anyFinite = scale.anyFinite;
    plan.nonfinite = scale.nonfinite;
    plan.T = scale.T;
    plan.Q = scale.Q;
    plan.L = scale.L;
    plan.K = scale.K;
    const uint64_t* words = s.index + plan.wordOffset;
    // countMembers counts only coordinates below count and flags index bits past it.
    unsigned flags = 0;
    if (!check(gpu::countMembers(words, plan.count, plan.bloom, &plan.u, &flags, s.stream), "counting the union"))
      return false;
    if (flags & kFlagIndexPastCount)
      return refuseMalformed(s, op, check, t, "index", "bits set past the tensor's count");
    if (plan.u > plan.count) return refuseMalformed(s, op, check, t, "index", "more members than coordinates");
    if (plan.u > 0 && !plan.anyFinite && !plan.nonfinite)
      return refuseMalformed(s, op, check, t, "index", "members in the union but no rank holds a nonzero value");
    if (plan.u > 0) {
      if (!allocateOwned(s, check, &plan.members, plan.u, "allocating the union")) return false;
      if (!check(gpu::listMembers(words, plan.count, plan.bloom, plan.members, s.stream), "listing the union"))
        return false;
    }
    plan.mode = chooseMode(inst.mode, true, inst.exact, plan.count, plan.u, plan.K, plan.anyFinite,
                           plan.nonfinite, plan.T - plan.Q + 1, plan.T, n);
    if (plan.mode == Mode::None) continue;
    if (plan.mode == Mode::Dense) {
      plan.valueOffset = s.denseCount;
      s.denseCount += plan.count;
      continue;
    }
    if (plan.nonfinite) {
      plan.specialOffset = s.specialWords;
      s.specialWords += plan.u;
    }
    plan.valueOffset = s.valueWords;
    if (plan.mode == Mode::Compact) {
      plan.compactF32 = compactValuesInF32(inst.exact, plan.anyFinite, plan.T - plan.Q + 1, plan.T, n);
      if (plan.compactF32) {
        plan.valueOffset = s.denseCount;
        s.denseCount += plan.u;
      } else {
        s.valueWords += size_t(plan.K) * plan.u;
      }
    } else {
      plan.geometry = sketchGeometry(afterIndexPart(inst.cellsPerItem, plan.u),
                                     mix64(op->step * 0x9e3779b97f4a7c15ull + uint64_t(t) + 1));
      s.valueWords += size_t(plan.K) * 3 * plan.geometry.part;
    }
  }
  if (!allocateOwned(s, check, &s.values, s.valueWords, "allocating the values") ||
      !allocateOwned(s, check, &s.specials, s.specialWords, "allocating the specials") ||
      !allocateOwned(s, check, &s.dense, s.denseCount, "allocating the dense values") ||
      !allocateOwned(s, check, &s.flags, 1, "allocating the check flags"))
    return false;
  for (int t = 0; t < op->num_tensors; ++t) {
    DevicePlan& plan = s.plans[t];
    const float* x = inputOf(op, t);
    if (plan.mode == Mode::None) continue;
    if (plan.mode == Mode::Dense) {
      if (!check(gpu::copy(s.dense + plan.valueOffset, x, plan.count * sizeof(float), s.stream), "copying dense"))
        return false;
      continue;
    }
    if (plan.nonfinite &&
        !check(gpu::encodeSpecials(x, plan.members, plan.u, s.specials + plan.specialOffset, s.stream), "specials"))
      return false;
    if (plan.compactF32) {
      if (!check(gpu::gatherValues(x, plan.members, plan.u, s.dense + plan.valueOffset, s.stream), "compact f32"))
        return false;
      continue;
    }
    uint64_t* base = s.values + plan.valueOffset;
    if (plan.mode == Mode::Compact) {
      if (!check(gpu::encodeCompact(x, plan.members, plan.u, plan.Q, plan.L, plan.K, base, s.flags, s.stream),
                 "compact encode"))
        return false;
      continue;
    }
    // Sketch: only this rank's nonzeros are scattered (the support, compacted first; a subset of U).
    uint64_t* support = nullptr;
    size_t supportCount = 0;
    if (!allocateOwned(s, check, &support, plan.u, "allocating the support") ||
        !check(gpu::compactSupport(x, plan.count, support, &supportCount, s.stream), "support compaction") ||
        !check(gpu::scatterSketch(x, support, supportCount, plan.geometry, plan.Q, plan.L, plan.K, base, s.flags,
                                  s.stream),
               "sketch scatter"))
      return false;
  }
  return scaleCovered(s, op, check, 0);
}

// After round 1: peel the sketches; the leftovers' payload.
bool peelSketches(DeviceState& s, shoal_compress_op_t* op, Checker& check) {
  for (int t = 0; t < op->num_tensors; ++t) {
    DevicePlan& plan = s.plans[t];
    if (plan.mode != Mode::Sketch) continue;
    if (!allocateOwned(s, check, &plan.limbs, size_t(plan.K) * plan.u, "allocating limbs") ||
        !allocateOwned(s, check, &plan.leftover, plan.u, "allocating leftovers"))
      return false;
    bool certified = true;
    int rounds = 0;
    if (!check(gpu::peel(plan.members, plan.u, plan.geometry, plan.K, s.values + plan.valueOffset, plan.limbs,
                         plan.leftover, &plan.m, &certified, &rounds, s.stream),
               "peeling"))
      return false;
    if (!certified) {
      writeText(op->error_text, op->error_text_size,
                "sketch (CUDA): malformed payload after round 1, tensor %d: sketch: a cell is not zero once every "
                "member is peeled (a rank sent corrupted data, or it runs a different shoal)", t);
      s.malformed = true;
      check.ok = false;
      return false;
    }
    plan.leftoverOffset = s.leftoverWords;
    s.leftoverWords += size_t(plan.K) * plan.m;
  }
  if (!allocateOwned(s, check, &s.leftovers, s.leftoverWords, "allocating the leftover payload")) return false;
  for (int t = 0; t < op->num_tensors; ++t) {
    DevicePlan& plan = s.plans[t];
    if (plan.mode != Mode::Sketch || plan.m == 0) continue;
    if (!check(gpu::encodeLeftovers(inputOf(op, t), plan.members, plan.leftover, plan.m, plan.Q, plan.L, plan.K,
                                    s.leftovers + plan.leftoverOffset, s.flags, s.stream),
               "leftover encode"))
      return false;
  }
  return scaleCovered(s, op, check, 1);
}

bool writeOutputs(DeviceState& s, shoal_compress_op_t* op, Checker& check) {
  const int n = op->world_size;
  const bool avg = op->op == SHOAL_AVG;
  for (int t = 0; t < op->num_tensors; ++t) {
    DevicePlan& plan = s.plans[t];
    float* out = outputOf(op, t);
    if (plan.count == 0) continue;
    if (plan.mode == Mode::Dense) {
      if (!check(gpu::finishDense(s.dense + plan.valueOffset, plan.count, n, avg, out, s.stream), "dense output"))
        return false;
      continue;
    }
    if (!check(gpu::zero(out, plan.count * sizeof(float), s.stream), "zeroing the output")) return false;
    if (plan.mode == Mode::None) continue;
    const uint64_t* specials = plan.nonfinite ? s.specials + plan.specialOffset : nullptr;
    if (plan.compactF32) {
      if (!check(gpu::scatterValues(s.dense + plan.valueOffset, plan.members, plan.u, specials, n, avg, out, s.stream),
                 "compact f32 output"))
        return false;
      continue;
    }
    const uint64_t* limbs = s.values + plan.valueOffset;
    if (plan.mode == Mode::Sketch) {
      if (!check(gpu::placeLeftovers(s.leftovers + plan.leftoverOffset, plan.leftover, plan.m, plan.u, plan.K,
                                     plan.limbs, s.stream),
                 "placing leftovers"))
        return false;
      limbs = plan.limbs;
    }
    if (!check(gpu::decodeMembers(limbs, plan.u, plan.members, plan.u, specials, plan.K, plan.L, plan.Q, n, avg, out,
                                  s.stream),
               "decode"))
      return false;
  }
  return true;
}

}  // namespace

shoal_status_t deviceStart(const Instance& inst, shoal_compress_op_t* op, void** opState) {
  const shoal_tensor_t& first = op->tensors[0].input;
  for (int t = 0; t < op->num_tensors; ++t) {
    const shoal_compress_tensor_t& tensor = op->tensors[t];
    if (tensor.input.memory != SHOAL_MEMORY_CUDA || tensor.output.memory != SHOAL_MEMORY_CUDA ||
        tensor.input.device != first.device || tensor.input.dtype != SHOAL_F32) {
      writeText(op->error_text, op->error_text_size,
                "sketch: the tensors of one operation must all be f32 CUDA tensors on one device (tensor %d is not)",
                t);
      return SHOAL_ERR_INVALID_ARGUMENT;
    }
  }
  auto* s = new DeviceState;
  s->stream = first.stream;
  s->device = first.device;
  Checker check{op};
  auto failed = [&] {
    deviceFinish(s);  // finish() is not called when start() fails
    return SHOAL_ERR_SYSTEM;
  };
  if (!check(gpu::useDevice(first.device), "selecting the device")) return failed();
  s->plans.resize(op->num_tensors);
  for (int t = 0; t < op->num_tensors; ++t) {
    DevicePlan& plan = s->plans[t];
    plan.count = shoal::elementsCount(op->tensors[t].input);
    plan.wordOffset = s->indexWords;
    if (inst.bloom)
      plan.bloom = bloomGeometry(plan.count, inst.expectedDensity, mix64(op->step * 0xa0761d6478bd642full + uint64_t(t)));
    plan.words = plan.bloom.words > 0 ? plan.bloom.words : (plan.count + 63) / 64;
    s->indexWords += plan.words;
  }
  s->statsWords = 3 * size_t(op->num_tensors);
  if (!allocateOwned(*s, check, &s->index, s->indexWords, "allocating the index") ||
      !allocateOwned(*s, check, &s->stats, s->statsWords, "allocating the stats"))
    return failed();
  *opState = s;
  return SHOAL_OK;
}

shoal_status_t deviceRound(const Instance& inst, void* opState, shoal_compress_op_t* op, shoal_round_t* round) {
  DeviceState& s = *static_cast<DeviceState*>(opState);
  Checker check{op};
  // The driver may have made another device current between rounds.
  if (!check(gpu::useDevice(s.device), "selecting the device")) return SHOAL_ERR_SYSTEM;
  if (round->index == 0) {
    for (int t = 0; t < op->num_tensors; ++t) {
      const DevicePlan& plan = s.plans[t];
      if (!check(gpu::encodeIndex(inputOf(op, t), plan.count, plan.bloom, s.index + plan.wordOffset,
                                  s.stats + 3 * size_t(t), s.stream),
                 "index encode"))
        return SHOAL_ERR_SYSTEM;
    }
    round->num_payloads = 2;
    setAllreducePayload(round->payloads[0], SHOAL_U64, SHOAL_BOR, s.index, s.indexWords);
    setAllreducePayload(round->payloads[1], SHOAL_U64, SHOAL_MAX, s.stats, s.statsWords);
    s.stage = 0;
    return SHOAL_OK;
  }
  if (s.stage == 0) {
    if (!encodeValues(inst, s, op, check)) return s.malformed ? SHOAL_ERR_INTERNAL : SHOAL_ERR_SYSTEM;
    s.stage = 1;
    int np = 0;
    if (s.valueWords) setAllreducePayload(round->payloads[np++], SHOAL_U64, SHOAL_SUM, s.values, s.valueWords);
    if (s.denseCount) setAllreducePayload(round->payloads[np++], SHOAL_F32, SHOAL_SUM, s.dense, s.denseCount);
    if (s.specialWords) setAllreducePayload(round->payloads[np++], SHOAL_U64, SHOAL_BOR, s.specials, s.specialWords);
    round->num_payloads = np;
    if (np > 0) return SHOAL_OK;
  } else if (s.stage == 1) {
    if (!peelSketches(s, op, check)) return s.malformed ? SHOAL_ERR_INTERNAL : SHOAL_ERR_SYSTEM;
    s.stage = 2;
    if (s.leftoverWords > 0) {
      round->num_payloads = 1;
      setAllreducePayload(round->payloads[0], SHOAL_U64, SHOAL_SUM, s.leftovers, s.leftoverWords);
      return SHOAL_OK;
    }
  }
  if (!writeOutputs(s, op, check)) return SHOAL_ERR_SYSTEM;
  return roundsDone(round);
}

void deviceFinish(void* opState) {
  auto* s = static_cast<DeviceState*>(opState);
  gpu::useDevice(s->device);
  for (void* p : s->owned) gpu::release(p, s->stream);
  delete s;
}

}  // namespace shoal::compressors::sketch_impl

#endif  // SHOAL_WITH_CUDA
