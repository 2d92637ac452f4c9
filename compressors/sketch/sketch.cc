// sketch: lossless, homomorphic compression of sparse f32 tensors (DESIGN.md
// §7.2, after LHC, arXiv 2402.07529), CPU path (CUDA tensors: sketch_device.cc,
// the same rounds on the device). Output bits == the exact sum
// over ranks rounded once to f32 (avg: the exact sum / n rounded once), the
// same bits on every rank and every run (exact=0, opt-in: see below).
//
// Round 0 (index), one payload (two with ratio=):
//   - the bitmap of this rank's nonzero coordinates (1 bit per coordinate,
//     u64 words, each tensor starting at a word boundary), SHOAL_BOR: every
//     rank gets the union U. Nonzero means "not +-0": Inf and NaN are members.
//     index=bloom: a Bloom filter instead (sketch_peel.h sizes it from
//     expected_density and the count, so every rank agrees without a round
//     trip); U is then a superset whose extra members sum to exactly 0.
//   - after every tensor's index, in the same SHOAL_BOR payload, the
//     statistics of each tensor: the words [top + 200, 200 - lowest,
//     nonfinite], where top is the highest bit position (2^top <= |x|) and
//     lowest the lowest set bit position of this rank's finite nonzero values
//     (0 when it has none), nonfinite = 1 if it holds an Inf or a NaN, as
//     OR-able codes whose OR is the words' MAX (thermometer codes for top and
//     lowest: encodeStatsCodes, sketch_instance.h; 11 u64 per tensor, 13 with
//     ratio=). After the OR every rank knows T = max top, Q = min lowest and
//     whether any Inf/NaN exists; one exchange, not an OR and a MAX.
//
// Fixed point (exactness rule). Every finite nonzero f32 of every rank is
// +-m 2^q with m odd, q >= Q, and |x| < 2^(T+1): so x 2^-Q is an integer of at
// most span = T - Q + 1 bits. With n ranks and c = ceil(log2 n), the limb width
// is L = 63 - c and K = ceil(span / L) limbs (K = 1 for span <= 63 - c: any
// tensor whose values span fewer than ~2^55 ... 2^62 in magnitude ratio; the f32
// range needs at most 5 limbs). Each limb of each rank lies in (-2^L, 2^L), so
// the sum of n limbs is below n 2^L <= 2^63 in magnitude: an int64 holds it
// exactly. Payloads are summed as SHOAL_U64 (wrapping, no undefined overflow);
// the final wrapped sum read as int64 is the true limb sum because the true sum
// is in range. Decoding rebuilds sum_k S_k 2^(kL + Q) exactly in 512 bits and
// rounds once (sketch_math.h). Hence output == round_f32(exact sum): exactness
// holds by construction, not by luck of ordering, for any finite inputs.
// Inf/NaN: when any rank holds one (nonfinite word), one more u64 per member of
// U travels with the values, SHOAL_BOR of {1: +Inf, 2: -Inf, 4: NaN}; a member
// with 4, or with 1 and 2, decodes to NaN (0x7fc00000), else to +-Inf.
// Zeros: the output is +0 off U and where the exact sum is 0 (a -0 input is
// treated as +0: the exact sum -0 + -0 = -0 comes back as +0).
//
// Round 1 (values), per tensor, by the mode picked after round 0:
//   compact: K words per member of U, in U's order (limb-major), SHOAL_SUM;
//            or, when f32 sums are exact (the dense rule below), the f32
//            values at U in the f32 payload.
//   sketch:  a count sketch: 3 * part cells, part >= ceil(cells_per_item * |U| / 3)
//            (lane-rotated blocks, sketchGeometry), K words per cell
//            (limb-major); element i adds its limbs to cells cellOf(i, g, j),
//            j = 0, 1, 2 (sketch_math.h), seed = mix of (step, tensor); summed
//            with SHOAL_SUM. cells=f32: f32 cells in the f32 payload when every
//            partial sum of a cell is provably exact (floatCellsExact). Decoding peels: each rank
//            computes, from U alone, every cell's count of members and the XOR
//            of their indices (never sent); a cell of count 1 holds exactly one
//            member's sum: take it, subtract it from that member's other two
//            cells, repeat. Wrapping u64 arithmetic is exact modulo 2^64, and
//            the recovered value is the true limb sum (in range, see above), so
//            cell overflow cannot corrupt a result. Certificate: when every
//            member is recovered every count and every cell is zero (checked; a
//            nonzero cell is an internal error). Members not recovered (peeling
//            stalled) go in round 2: their K limbs densely, in U's order,
//            SHOAL_SUM. Never an estimate.
//   dense:   the f32 data as it is, SHOAL_SUM on SHOAL_F32, only when no rank
//            holds an Inf/NaN (their words decode them, the same NaN everywhere)
//            and that is exact: span + c <= 24 and T + c + 1 <= 127, i.e. every partial sum
//            of any subset of ranks is a multiple of 2^Q below 2^(Q+24) in
//            magnitude and below 2^127, so representable: every hop's
//            addition is exact whatever the algorithm. avg divides the exact
//            f32 sum by n once (IEEE division: rounded once).
// values=auto (default) picks per tensor, from the bytes of round 1:
//   dense 4 count (when exact) vs compact 4 |U| (f32-exact) or 8 K |U|
//   (+ 8 |U| with Inf/NaN); the sketch costs >= cells_per_item (>= 1.1) times
//   compact, so once U is known compact always beats it: auto never picks it.
// ratio=R (host tensors): a sketch of count / R one-limb cells sized in
//   advance travels in round 0 (SHOAL_SUM) at a scale guessed from the last
//   agreed one (Instance::lastScale); two more stats words check that every
//   rank guessed alike. If they did and every value fit, it is peeled after
//   round 0 and only leftovers (if any) travel in round 1; else the tensor
//   takes the values round as above. Lossless either way.
// values=dense when not exact falls back to compact; values=sketch with
// |U| = 0 sends nothing. Tensors with |U| = 0 need no values round.
// exact=0 (opt-in) gives the rule up for compact and dense values: they travel
//   and sum as f32 wherever the rule fails (3+ ranks, a span beyond f32's
//   bits), 4 bytes a member instead of 8 K: for dense gradients on many ranks,
//   where the lossless limbs cost ~2x the plain allreduce's bytes. The output
//   is then an f32 sum in the payload allreduce's order, the same bits on
//   every rank (as the plain allreduce's), not the exact sum. The count
//   sketch's cells and ratio='s pre-sized sketch stay exact (peeling needs it;
//   a tensor whose pre-sized sketch fails takes the values round, in f32).
// chunk=C (host tensors, default 2^22 elements): an operation of one tensor of
//   at least 2C elements (values=auto|compact|dense, bitmap index, no ratio)
//   goes in P <= 8 chunks, each exactly as a tensor of its own (own index,
//   scale and mode), staggered over P + 2 rounds: round r carries chunk r's
//   index and chunk r-2's values while a helper thread scans chunk r+1,
//   encodes chunk r-1's values and writes chunk r-3's output, so the encode
//   and decode passes overlap the wire (pipelineRound).
//
// Options: kOptionsHelp. dtypes: f32 only (f64 would need the same rule with
// 53-bit significands and up to 2^11 exponents: more limbs; not done). Host
// and CUDA memory. Stateless except ratio='s scale history, and the host
// path's buffers of a finished call, emptied and kept for the next one (no
// page faults on the next call's fresh memory: giveBack); several tensors of
// one call share the payloads (each with its own scale, mode and seed).
//
// CPU cost (measured, 2 ranks as threads on a loaded 2-core machine, 2^22
// elements, K = 1): compact 7-25 ms at 0.1-10% density (decode has a 128-bit
// fast path for K = 1; K > 1 goes through the 512-bit path), ~100-160 ms at
// 50%; sketch is bound by random cell accesses in the encode scatter and the
// peel (one rank, 2^22 elements, batched and prefetched: 0.8 / 3.6 / 28 ms a
// call at 0.1 / 1 / 10%, docs/benchmarks.md). Another reason auto does not
// pick it on the CPU.
#include <algorithm>
#include <cmath>
#include <cstdarg>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <iterator>
#include <map>
#include <memory>
#include <mutex>
#include <string>
#include <system_error>
#include <thread>
#include <utility>
#include <vector>

#include "compressors/common/text.h"
#include "compressors/sketch/sketch_host.h"
#include "compressors/sketch/sketch_instance.h"
#include "compressors/sketch/sketch_math.h"
#include "compressors/sketch/sketch_peel.h"
#include "core/tensor.h"
#include "shoal/compressor.h"

namespace shoal::compressors {
namespace {

using namespace shoal::sketch;
using namespace shoal::compressors::sketch_impl;

constexpr const char* kOptionsHelp =
    "values=auto|compact|sketch|dense: how the values at the union of supports travel (default auto: dense f32 "
    "when exact and smaller, else compact); cells_per_item=<float in [1.1, 64]>: sketch cells per union member "
    "(default 1.3); index=bitmap|bloom: the union's index (default bitmap; bloom: a Bloom filter sized for "
    "expected_density, smaller when the union is very sparse, its false positives decode to exact zeros); "
    "expected_density=<float in (0, 1)>: the expected union density that sizes the Bloom filter (default 0.001); "
    "ratio=<float in [1.5, 1e6]>: a count sketch of count/ratio cells sized in advance and sent with the index "
    "(one round when it peels; default off: the sketch is sized after the index); cells=i64|f32: the sketch's "
    "cells (default i64; f32: 4-byte cells, used only where every partial sum is provably exact, else i64); "
    "chunk=<elements>: one host tensor of at least two chunks travels in chunks of this many elements (at most 8 "
    "chunks), the next chunk's index encoded while the previous one's values are on the wire (default 4194304; 0: "
    "one piece; values=auto|compact|dense with the bitmap index, no ratio); exact=1|0: 1 (default) lossless; 0: "
    "the compact and dense values travel as f32 and are summed in f32 even where that is not provably exact (3 or "
    "more ranks, values spanning more than f32's 24 bits): 4 bytes a member instead of 8 or more, the same bits on "
    "every rank, no longer the exact sum (the count sketch's cells and ratio='s pre-sized sketch stay exact; a "
    "tensor whose pre-sized sketch does not peel takes the f32 values round)";

struct TensorPlan {
  size_t count = 0;
  size_t wordOffset = 0, words = 0;  // index: bitmap, or Bloom filter when bloom.words > 0
  BloomGeometry bloom;
  bool anyFinite = false, nonfinite = false;
  int Q = 0, T = 0, L = 63, K = 0;
  // This rank's own round-0 statistics: the agreed (MAX-ed) ones must cover them.
  bool localAny = false, localNonfinite = false;
  int localTop = 0, localLowest = 0;
  // Bitmap index: this rank's own bitmap and nonzero values in index order (round 0's scan), read
  // sequentially by the values round instead of gathering the input at U.
  bool haveLocal = false;
  bool localNegativeZero = false;  // this rank's input holds a -0 (the scan says)
  // The union was checked to hold every one of this rank's members (memberValues): then, in place,
  // every coordinate off U already holds a zero of this rank's input.
  bool unionCoversLocal = false;
  std::vector<uint64_t> localBits;
  LocalValues localValues;
  Mode mode = Mode::None;
  MemberList members;  // U, ascending
  size_t valueOffset = 0;         // in values (u64) or dense (f32)
  size_t specialOffset = 0;       // in specials
  // sketch
  SketchGeometry geometry;
  std::vector<uint64_t> limbs;       // |U| * K recovered limb sums (limb-major: k * |U| + u)
  std::vector<size_t> leftover;      // positions in U not recovered
  size_t leftoverOffset = 0;
  const uint64_t* leftoverBase = nullptr;  // the leftovers' summed limbs (limb-major, m per limb)
  // cells=f32 where provably exact: the cells live in the f32 payload (dense) at valueOffset.
  bool floatCells = false;
  std::vector<float> floatSums;
  // values=compact as f32 (at dense, valueOffset) when f32 sums are exact.
  bool compactF32 = false;  // |U| recovered exact sums (leftovers: from limbs)
  std::vector<float> result;         // |U| decoded values
  // This rank's value at each member of U where the values are not written straight into the
  // payload (limbs, sketch cells, Inf/NaN beside them): every entry written before it is read.
  std::vector<float, UninitializedAllocator<float>> mine;
  const float* resultView = nullptr; // or, when set, where they already are (compact f32 sums: the payload)
  // ratio mode: a sketch in round 0 at a scale guessed in advance (Tg, Qg, Kg limbs).
  bool presized = false, presizedValid = false;
  int Tg = 0, Qg = 0, Kg = 0;
  size_t presizedOffset = 0;
};

struct Pipeline;

struct OpState {
  std::vector<TensorPlan> plans;
  std::vector<uint64_t> bitmap, stats, values, specials, leftovers, presized, presizedLeftovers;
  std::vector<float, UninitializedAllocator<float>> dense;  // zeroed only where a tensor needs it (encodeValues)
  PeelScratch<uint64_t> peel;   // the peel's working memory (limb cells), shared by the tensors in turn
  PeelScratch<float> peelF32;   // ... and for f32 cells
  size_t statsStride = 3;  // per tensor: top, lowest, nonfinite (+ the scale guess, twice, in ratio mode)
  size_t indexWords = 0;   // bitmap = every tensor's index words, then their statistics' codes
  int stage = 0;  // 0: index sent; 1: values sent; 2: leftovers sent
  void* device = nullptr;  // the CUDA path's state (sketch_device.cc) when the tensors are CUDA tensors
  bool pipelined = false;  // this operation is one large tensor in chunks (pipelineStart)
  // The chunks' states when pipelined; a kept state (giveBack) may hold one from an earlier call
  // while not pipelined, unused.
  std::unique_ptr<Pipeline> pipeline;
};

// One chunk of the pipelined path (see pipelineRound).
struct Chunk {
  shoal_compress_tensor_t tensor{};
  shoal_compress_op_t op{};  // the operation's fields, with this chunk as its one tensor
  OpState state;
};

struct Pipeline {
  std::vector<std::unique_ptr<Chunk>> chunks;
  int next = 0;          // the round the next round() call handles
  std::thread helper;    // at most one task in flight, joined at the start of every round() and in finish()
  bool helperFailed = false;
  shoal_status_t helperStatus = SHOAL_OK;  // a chunk's union or statistics refused on the helper
  int helperChunk = -1;                    // ... which chunk
  ~Pipeline() {
    if (helper.joinable()) helper.join();
  }
};

// ---- a finished operation's buffers, kept for the next call ------------------
// Every call used to allocate its state afresh: at 64-256 MiB, ~6,000 page
// faults per rank and call, 12-15% of each rank's CPU in the kernel's
// clear_page_erms (docs/benchmarks.md). finish() now empties the host
// state (recycle: every field back to its default, the buffers cleared with
// their capacity kept) and keeps it as the instance's spare; start() takes the
// spare, or makes a fresh state when there is none. Nothing stale reaches a
// result: every buffer is written by the call before it is read (assign /
// resize + a full write; the f32 payload `dense` and `mine` are never zeroed
// as a whole, but every range of them that is read is written first, fresh
// memory or not: encodeValues).
//
// One spare, taken under a mutex: operations in flight at once on one
// instance (the test harness runs several ranks on one; the driver runs one
// call at a time) each hold a state of their own, the second a fresh one; a
// finishing operation whose spare slot is taken is freed.
//
// Memory kept: at most one operation's buffers (of the order of its tensor's
// bytes: bitmaps, members, payloads, local values), and only while they are
// not far larger than what the recent calls needed: a state whose capacity
// exceeds twice the largest need of the recent calls (SpareBudget,
// sketch_host.h) is freed instead of kept, so one huge call does not pin its
// memory for the instance's life, while a step's mix of large and small calls
// (fusion buckets, then a small last one) keeps the large state. destroy()
// frees the spare.
struct HostInstance : Instance {
  explicit HostInstance(const Instance& options) : Instance(options) {}
  std::mutex spareMutex;  // guards the fields below
  std::unique_ptr<OpState> spare;
  SpareBudget budget;
};

template <class V>
size_t capacityBytes(const V& v) {
  return v.capacity() * sizeof(typename V::value_type);
}
template <class V>
size_t sizeBytes(const V& v) {
  return v.size() * sizeof(typename V::value_type);
}

// The bytes a state's buffers hold (bytes = capacityBytes, used = false) or that the finished
// call used (sizeBytes, used = true; of the local values' room it needed count + LocalValues::kRoom floats).
template <class Bytes>
size_t stateBytes(const OpState& s, Bytes bytes, bool used) {
  size_t total = bytes(s.bitmap) + bytes(s.stats) + bytes(s.values) + bytes(s.specials) + bytes(s.leftovers) +
                 bytes(s.presized) + bytes(s.presizedLeftovers) + bytes(s.dense);
  total += s.peel.bytes(bytes) + s.peelF32.bytes(bytes);
  for (const TensorPlan& p : s.plans) {
    total += bytes(p.localBits) + bytes(p.members) + bytes(p.limbs) + bytes(p.leftover) + bytes(p.floatSums) +
             bytes(p.result) + bytes(p.mine);
    total += sizeof(float) * (used ? (p.haveLocal ? p.count + LocalValues::kRoom : 0) : p.localValues.capacity);
  }
  if (s.pipeline && (s.pipelined || !used))
    for (const auto& c : s.pipeline->chunks) total += stateBytes(c->state, bytes, used);
  return total;
}
size_t keptBytes(const OpState& s) { return stateBytes(s, [](const auto& v) { return capacityBytes(v); }, false); }
size_t neededBytes(const OpState& s) { return stateBytes(s, [](const auto& v) { return sizeBytes(v); }, true); }

// Moves a buffer into a fresh object, emptied, its capacity kept.
template <class V>
void keepBuffer(V& to, V& from) {
  to = std::move(from);
  to.clear();
}

// A plan as a default one, with the buffers' capacity kept. Reset by
// construction: a field added later starts at its default without being
// named here; only the buffers named here keep their memory.
void recycle(TensorPlan& plan) {
  TensorPlan fresh;
  keepBuffer(fresh.localBits, plan.localBits);
  keepBuffer(fresh.members, plan.members);
  keepBuffer(fresh.limbs, plan.limbs);
  keepBuffer(fresh.leftover, plan.leftover);
  keepBuffer(fresh.floatSums, plan.floatSums);
  keepBuffer(fresh.result, plan.result);
  keepBuffer(fresh.mine, plan.mine);
  fresh.localValues.data = std::move(plan.localValues.data);  // size 0: nothing of it is valid
  fresh.localValues.capacity = fresh.localValues.data ? plan.localValues.capacity : 0;
  plan = std::move(fresh);
}

// The same for a whole state (host path), its chunks' states included.
void recycle(OpState& s) {
  if (s.pipeline) {
    Pipeline& p = *s.pipeline;
    // (its helper thread is joined: giveBack)
    p.next = 0;
    p.helperFailed = false;
    p.helperStatus = SHOAL_OK;
    p.helperChunk = -1;
    for (auto& c : p.chunks) {
      recycle(c->state);
      c->tensor = shoal_compress_tensor_t{};
      c->op = shoal_compress_op_t{};
    }
  }
  OpState fresh;
  fresh.plans = std::move(s.plans);
  for (TensorPlan& plan : fresh.plans) recycle(plan);
  keepBuffer(fresh.bitmap, s.bitmap);
  keepBuffer(fresh.stats, s.stats);
  keepBuffer(fresh.values, s.values);
  keepBuffer(fresh.specials, s.specials);
  keepBuffer(fresh.leftovers, s.leftovers);
  keepBuffer(fresh.presized, s.presized);
  keepBuffer(fresh.presizedLeftovers, s.presizedLeftovers);
  keepBuffer(fresh.dense, s.dense);
  fresh.peel = std::move(s.peel);
  fresh.peel.clear();
  fresh.peelF32 = std::move(s.peelF32);
  fresh.peelF32.clear();
  fresh.pipeline = std::move(s.pipeline);  // pipelined: false until pipelineStart sets it
  s = std::move(fresh);
}

// A state for a host operation: the spare when there is one, else a fresh one.
OpState* takeState(HostInstance& inst) {
  {
    std::lock_guard<std::mutex> lock(inst.spareMutex);
    if (inst.spare) return inst.spare.release();
  }
  return new OpState;
}

// A finished host operation's state: kept as the spare, or freed (see above).
void giveBack(HostInstance& inst, OpState* s) {
  // A call that failed between rounds may leave its helper running: joined before its buffers are read.
  if (s->pipeline && s->pipeline->helper.joinable()) s->pipeline->helper.join();
  const size_t need = neededBytes(*s);
  recycle(*s);
  const size_t kept = keptBytes(*s);
  std::unique_lock<std::mutex> lock(inst.spareMutex);
  if (inst.budget.keep(need, kept) && !inst.spare) {
    inst.spare.reset(s);
    return;
  }
  lock.unlock();
  delete s;
}

const float* inputOf(const shoal_compress_tensor_t& t) { return static_cast<const float*>(t.input.data); }

shoal_status_t create(const shoal_compressor_params_t* params, void** instance) {
  Instance config;
  for (int i = 0; i < params->num_options; ++i) {
    std::string key = params->keys[i], value = params->values[i];
    if (key == "values") {
      if (value == "auto") config.mode = Mode::Auto;
      else if (value == "compact") config.mode = Mode::Compact;
      else if (value == "sketch") config.mode = Mode::Sketch;
      else if (value == "dense") config.mode = Mode::Dense;
      else {
        writeText(params->error_text, params->error_text_size,
                  "sketch: values='%s' is not one of auto, compact, sketch, dense", value.c_str());
        return SHOAL_ERR_INVALID_ARGUMENT;
      }
    } else if (key == "cells_per_item") {
      char* end = nullptr;
      double v = std::strtod(value.c_str(), &end);
      if (value.empty() || end == nullptr || *end != '\0' || !(v >= 1.1 && v <= 64)) {
        writeText(params->error_text, params->error_text_size,
                  "sketch: cells_per_item='%s' is not a number in [1.1, 64]", value.c_str());
        return SHOAL_ERR_INVALID_ARGUMENT;
      }
      config.cellsPerItem = v;
    } else if (key == "index") {
      if (value == "bitmap" || value == "bloom") config.bloom = value == "bloom";
      else {
        writeText(params->error_text, params->error_text_size, "sketch: index='%s' is not one of bitmap, bloom",
                  value.c_str());
        return SHOAL_ERR_INVALID_ARGUMENT;
      }
    } else if (key == "expected_density") {
      char* end = nullptr;
      double v = std::strtod(value.c_str(), &end);
      if (value.empty() || end == nullptr || *end != '\0' || !(v > 0.0 && v < 1.0)) {
        writeText(params->error_text, params->error_text_size,
                  "sketch: expected_density='%s' is not a number in (0, 1)", value.c_str());
        return SHOAL_ERR_INVALID_ARGUMENT;
      }
      config.expectedDensity = v;
    } else if (key == "cells") {
      if (value == "i64" || value == "f32") config.floatCells = value == "f32";
      else {
        writeText(params->error_text, params->error_text_size, "sketch: cells='%s' is not one of i64, f32",
                  value.c_str());
        return SHOAL_ERR_INVALID_ARGUMENT;
      }
    } else if (key == "chunk") {
      char* end = nullptr;
      const unsigned long long v = std::strtoull(value.c_str(), &end, 10);
      if (value.empty() || value[0] == '-' || end == nullptr || *end != '\0' || v > (1ull << 40)) {
        writeText(params->error_text, params->error_text_size,
                  "sketch: chunk='%s' is not a whole number of elements in [0, 2^40]", value.c_str());
        return SHOAL_ERR_INVALID_ARGUMENT;
      }
      config.chunk = size_t(v);
    } else if (key == "scan") {
      const auto* named = std::find_if(std::begin(kScanPaths), std::end(kScanPaths),
                                       [&](ScanPath path) { return value == scanPathName(path); });
      if (value == "auto") {
        config.scan = -1;
      } else if (named == std::end(kScanPaths)) {
        writeText(params->error_text, params->error_text_size,
                  "sketch: scan='%s' is not one of auto, avx512, avx2, sse4.1, portable", value.c_str());
        return SHOAL_ERR_INVALID_ARGUMENT;
      } else if (!scanPathAvailable(*named)) {
        writeText(params->error_text, params->error_text_size,
                  "sketch: scan=%s: this CPU or build lacks that scan (scan=auto takes the best it has)",
                  value.c_str());
        return SHOAL_ERR_UNSUPPORTED;
      } else {
        config.scan = int(*named);
      }
    } else if (key == "exact") {
      if (value == "1" || value == "0") config.exact = value == "1";
      else {
        writeText(params->error_text, params->error_text_size,
                  "sketch: exact='%s' is not 1 (lossless, the default) or 0 (f32 sums where not provably exact)",
                  value.c_str());
        return SHOAL_ERR_INVALID_ARGUMENT;
      }
    } else if (key == "ratio") {
      char* end = nullptr;
      double v = std::strtod(value.c_str(), &end);
      if (value.empty() || end == nullptr || *end != '\0' || !(v >= 1.5 && v <= 1e6)) {
        writeText(params->error_text, params->error_text_size, "sketch: ratio='%s' is not a number in [1.5, 1e6]",
                  value.c_str());
        return SHOAL_ERR_INVALID_ARGUMENT;
      }
      config.ratio = v;
    } else {
      writeText(params->error_text, params->error_text_size, "sketch: unknown option '%s'", key.c_str());
      return SHOAL_ERR_INVALID_ARGUMENT;
    }
  }
  *instance = new HostInstance(config);
  return SHOAL_OK;
}

void destroy(void* instance) { delete static_cast<HostInstance*>(instance); }

// The host path's state of one operation: the index's kind and size per
// tensor (from the options and shapes alone, so every rank agrees without a
// round trip), and in ratio mode the pre-sized sketch.
void setUpHost(const Instance& inst, shoal_compress_op_t* op, OpState* state) {
  state->plans.resize(op->num_tensors);
  size_t words = 0;
  for (int t = 0; t < op->num_tensors; ++t) {
    TensorPlan& plan = state->plans[t];
    plan.count = shoal::elementsCount(op->tensors[t].input);
    plan.wordOffset = words;
    // The index's kind and size follow from the options and the shape alone: agreed without a round trip.
    if (inst.bloom) plan.bloom = bloomGeometry(plan.count, inst.expectedDensity, mix64(op->step * 0xa0761d6478bd642full + uint64_t(t)));
    plan.words = plan.bloom.words > 0 ? plan.bloom.words : (plan.count + 63) / 64;
    words += plan.words;
  }
  if (inst.ratio > 0) {
    state->statsStride = 5;
    const int L = 63 - ceilLog2(op->world_size);
    size_t cells = 0;
    for (int t = 0; t < op->num_tensors; ++t) {
      TensorPlan& plan = state->plans[t];
      if (plan.count == 0) continue;
      plan.presized = true;
      // One limb per cell, so the payload's size follows from the options and the shape alone (ranks
      // whose histories differ still send equal sizes; the guess words catch the difference). The
      // window is L bits below 2^(Tg+1): the last agreed top + 2, or without history 2^8 (values in
      // (-512, 512) down to 2^(9 - L), about 2^-51: typical gradients).
      auto last = inst.lastScale.find({t, plan.count});
      plan.Tg = last == inst.lastScale.end() ? 8 : std::min(127, last->second.first + 2);
      plan.Kg = 1;
      plan.Qg = plan.Tg + 1 - L;
      plan.geometry = sketchGeometry(uint64_t(std::ceil(double(plan.count) / inst.ratio / 3.0)),
                                     mix64(op->step * 0x9e3779b97f4a7c15ull + uint64_t(t) + 0x51));
      plan.presizedOffset = cells;
      cells += size_t(plan.Kg) * 3 * plan.geometry.part;
    }
    state->presized.assign(cells, 0);
  }
  state->stats.assign(state->statsStride * size_t(op->num_tensors), 0);
  state->indexWords = words;
  state->bitmap.assign(words + statsCodeWords(state->statsStride) * size_t(op->num_tensors), 0);
}

size_t pipelineChunk(const Instance& inst, const shoal_compress_op_t* op);
void pipelineStart(const Instance& inst, shoal_compress_op_t* op, size_t chunk, OpState* state);

shoal_status_t start(void* instance, shoal_compress_op_t* op, void** opState) {
  HostInstance& inst = *static_cast<HostInstance*>(instance);
  if (op->num_tensors > 0 && op->tensors[0].input.memory == SHOAL_MEMORY_CUDA) {
#if SHOAL_WITH_CUDA
    void* device = nullptr;
    if (shoal_status_t status = deviceStart(inst, op, &device); status != SHOAL_OK) return status;
    auto* state = new OpState;
    state->device = device;
    *opState = state;
    return SHOAL_OK;
#else
    writeText(op->error_text, op->error_text_size, "sketch: CUDA tensors need a build with SHOAL_WITH_CUDA");
    return SHOAL_ERR_UNSUPPORTED;
#endif
  }
  for (int t = 0; t < op->num_tensors; ++t) {
    const shoal_tensor_t& in = op->tensors[t].input;
    if (in.dtype != SHOAL_F32 || in.memory != SHOAL_MEMORY_HOST || op->tensors[t].output.memory != SHOAL_MEMORY_HOST) {
      writeText(op->error_text, op->error_text_size,
                "sketch: the tensors of one operation must all be f32 host tensors (tensor %d is not)", t);
      return SHOAL_ERR_INVALID_ARGUMENT;
    }
  }
  OpState* state = takeState(inst);
  if (const size_t chunk = pipelineChunk(inst, op); chunk > 0)
    pipelineStart(inst, op, chunk, state);
  else
    setUpHost(inst, op, state);
  *opState = state;
  return SHOAL_OK;
}

// Tensor t's statistics' codes in the index payload (encodeStatsCodes).
uint64_t* statsCodesOf(OpState& s, int t) {
  return s.bitmap.data() + s.indexWords + statsCodeWords(s.statsStride) * size_t(t);
}

uint64_t scaleCode(const TensorPlan& plan) { return (uint64_t(plan.Tg + 200) << 32) | uint64_t(200 - plan.Qg); }

// Round 0: local index and exponent statistics (+ in ratio mode the pre-sized sketch).
void encodeIndex(const Instance& inst, OpState& s, shoal_compress_op_t* op) {
  for (int t = 0; t < op->num_tensors; ++t) {
    TensorPlan& plan = s.plans[t];
    const float* x = inputOf(op->tensors[t]);
    uint64_t* bits = s.bitmap.data() + plan.wordOffset;
    LocalStats local;
    if (plan.bloom.words == 0) {
      local = inst.scan < 0 ? scanIndex(x, plan.count, bits, &plan.localValues)  // sketch_host.cc: 64 a step
                            : scanIndexWith(ScanPath(inst.scan), x, plan.count, bits, &plan.localValues);
      plan.localBits.assign(bits, bits + plan.words);  // the payload is reduced in place
      plan.haveLocal = true;
      plan.localNegativeZero = local.negativeZero;
    } else {
      for (size_t i = 0; i < plan.count; ++i) {
        if (!isNonzero(x[i])) continue;
        bloomInsert(bits, i, plan.bloom);
        addMemberStats(x + i, 1, local);
      }
    }
    const bool any = local.any, nonfinite = local.nonfinite;
    const int top = local.top, lowest = local.lowest;
    plan.localAny = any;
    plan.localNonfinite = nonfinite;
    plan.localTop = top;
    plan.localLowest = lowest;
    uint64_t* w = s.stats.data() + s.statsStride * size_t(t);
    w[0] = any ? uint64_t(top + 200) : 0;
    w[1] = any ? uint64_t(200 - lowest) : 0;
    w[2] = nonfinite ? 1 : 0;
    if (plan.presized) {
      // After the OR, w[3] = OR of the guesses and ~w[4] their AND: equal iff every rank guessed alike.
      w[3] = scaleCode(plan);
      w[4] = ~scaleCode(plan);
    }
    encodeStatsCodes(w, s.statsStride, statsCodesOf(s, t));
    if (!plan.presized) continue;
    // Values outside the guessed scale stay out: the stats reveal them and the tensor falls back.
    uint64_t* cells = s.presized.data() + plan.presizedOffset;
    const size_t stride = 3 * plan.geometry.part;
    const int L = 63 - ceilLog2(op->world_size);
    for (size_t i = 0; i < plan.count; ++i) {
      if ((ops::floatBits(x[i]) & 0x7fffffffu) == 0 || !isFinite(x[i])) continue;
      FloatParts p = decompose(x[i]);
      if (p.lowest < plan.Qg || p.top > plan.Tg) continue;
      for (int j = 0; j < 3; ++j) addLimbs(x[i], plan.Qg, L, plan.Kg, cells + cellOf(i, plan.geometry, j), stride);
    }
  }
}

// Round 0's payloads: the index with the statistics' codes (OR), in ratio mode
// the pre-sized sketch (SUM). Returns how many.
int indexPayloads(OpState& s, shoal_payload_t* out) {
  setAllreducePayload(out[0], SHOAL_U64, SHOAL_BOR, s.bitmap.data(), s.bitmap.size());
  if (s.presized.empty()) return 1;
  setAllreducePayload(out[1], SHOAL_U64, SHOAL_SUM, s.presized.data(), s.presized.size());
  return 2;
}

// The K limbs of each leftover member (limb-major, m per limb), summed next.
void encodeLeftovers(TensorPlan& plan, const float* x, uint64_t* base) {
  const size_t m = plan.leftover.size();
  plan.leftoverBase = base + plan.leftoverOffset;
  for (size_t l = 0; l < m; ++l) {
    float v = x[plan.members[plan.leftover[l]]];
    if (isFinite(v)) addLimbs(v, plan.Q, plan.L, plan.K, base + plan.leftoverOffset + l, m);
  }
}

// A received payload that no honest set of ranks can produce: refused with
// text on every rank (every rank reads the same reduced bytes, so every rank
// refuses alike), never decoded into reads or writes out of bounds.
shoal_status_t malformed(shoal_compress_op_t* op, int round, int t, const char* what, const char* why) {
  writeText(op->error_text, op->error_text_size,
            "sketch: malformed payload after round %d, tensor %d: %s: %s (a rank sent corrupted data, or it runs "
            "a different shoal)",
            round, t, what, why);
  return SHOAL_ERR_INTERNAL;
}

// Checks the agreed scale against this rank's own statistics: the MAX of
// every rank's words is at least this rank's, so a scale that does not cover
// this rank's values was not made by the MAX (its values would not fit the
// limbs).
bool coversLocal(const TensorPlan& plan, char* why, size_t whySize) {
  if (plan.localNonfinite && !plan.nonfinite) {
    std::snprintf(why, whySize, "this rank holds an Inf or NaN but the agreed nonfinite word is 0");
    return false;
  }
  if (plan.localAny && (!plan.anyFinite || plan.T < plan.localTop || plan.Q > plan.localLowest)) {
    std::snprintf(why, whySize, "the agreed scale [2^%d, 2^%d] does not cover this rank's values [2^%d, 2^%d]",
                  plan.Q, plan.T, plan.localLowest, plan.localTop);
    return false;
  }
  return true;
}

// After round 0: the union, the agreed scale, and in ratio mode whether the
// pre-sized sketch holds every value (then it is peeled now). Every word read
// here came from the peers: checked before it sizes or indexes anything.
shoal_status_t readIndex(Instance& inst, OpState& s, shoal_compress_op_t* op) {
  char why[200];
  for (int t = 0; t < op->num_tensors; ++t) {
    TensorPlan& plan = s.plans[t];
    uint64_t* w = s.stats.data() + s.statsStride * size_t(t);
    Scale scale;
    if (!decodeStatsCodes(statsCodesOf(s, t), s.statsStride, w, why, sizeof why) ||
        !readScale(w, op->world_size, scale, why, sizeof why))
      return malformed(op, 0, t, "statistics", why);
    plan.anyFinite = scale.anyFinite;
    plan.nonfinite = scale.nonfinite;
    plan.T = scale.T;
    plan.Q = scale.Q;
    plan.L = scale.L;
    plan.K = scale.K;
    if (!coversLocal(plan, why, sizeof why)) return malformed(op, 0, t, "statistics", why);
    const uint64_t* bits = s.bitmap.data() + plan.wordOffset;
    if (plan.bloom.words > 0) {
      bloomMembers(bits, plan.count, plan.bloom, plan.members);
    } else {
      // Bits past the tensor's count would name coordinates that do not exist.
      const size_t tail = plan.count % 64;
      if (tail != 0 && (bits[plan.words - 1] >> tail) != 0)
        return malformed(op, 0, t, "index", "bits set past the tensor's count");
      bitmapMembersFast(bits, plan.count, plan.members);
    }
    if (!plan.members.empty() && !plan.anyFinite && !plan.nonfinite)
      return malformed(op, 0, t, "index", "members in the union but no rank holds a nonzero value");
    if (!plan.presized) continue;
    if (plan.anyFinite) inst.lastScale[{t, plan.count}] = {plan.T, plan.Q};
    const bool agreed = w[4] == ~w[3];
    plan.presizedValid = agreed && !plan.nonfinite && !plan.members.empty() && plan.T <= plan.Tg &&
                         plan.Q >= plan.Qg;
    if (!plan.presizedValid) continue;
    plan.mode = Mode::Sketch;
    plan.Q = plan.Qg;
    plan.K = plan.Kg;
    if (!peelSketch(plan.members.data(), plan.members.size(), plan.geometry, plan.K,
                    s.presized.data() + plan.presizedOffset, plan.limbs, plan.leftover, s.peel)) {
      return malformed(op, 0, t, "pre-sized sketch", "a cell is not zero once every member is peeled");
    }
  }
  return SHOAL_OK;
}

// Whether f32 cells hold this sketch exactly: every value is a multiple of
// 2^Q below 2^(T+1) in magnitude, so any partial sum of a cell (up to n
// ranks x the cell's members, in any order, and what is left of it while
// peeling) is a multiple of 2^Q below n * maxCount * 2^(T+1) <= 2^(Q+24):
// representable in f32, so every addition and subtraction is exact. maxCount
// comes from U (every rank computes the same); Inf/NaN need the i64 path.
bool floatCellsExact(const TensorPlan& plan, int n) {
  if (!plan.anyFinite || plan.nonfinite || plan.Q < -149) return false;
  std::vector<uint32_t> counts(3 * plan.geometry.part, 0);
  uint32_t maxCount = 0;
  forEachMemberCells(
      plan.members.data(), plan.members.size(), plan.geometry, [&](uint64_t c) { __builtin_prefetch(&counts[c], 1); },
      [&](size_t, uint64_t, const uint64_t* where) {
        for (int j = 0; j < 3; ++j) maxCount = std::max(maxCount, ++counts[where[j]]);
      });
  const int bits = ceilLog2(int(std::min<uint64_t>(uint64_t(n) * maxCount, 1u << 30)));
  return plan.T - plan.Q + 1 + bits <= 24 && plan.T + 1 + bits <= 127;
}

// After round 0: choose each tensor's values mode and encode its values (and
// the leftovers of valid pre-sized sketches).
shoal_status_t encodeValues(const Instance& inst, OpState& s, shoal_compress_op_t* op) {
  const int n = op->world_size;
  size_t valueWords = 0, denseCount = 0, specialWords = 0, presizedLeftoverWords = 0;
  for (int t = 0; t < op->num_tensors; ++t) {
    TensorPlan& plan = s.plans[t];
    const size_t u = plan.members.size();
    if (plan.presizedValid) {
      plan.leftoverOffset = presizedLeftoverWords;
      presizedLeftoverWords += size_t(plan.K) * plan.leftover.size();
      continue;
    }
    if (u == 0) {
      plan.mode = Mode::None;
      continue;
    }
    plan.mode = chooseMode(inst.mode, inst.ratio == 0, inst.exact, plan.count, u, plan.K, plan.anyFinite,
                           plan.nonfinite, plan.T - plan.Q + 1, plan.T, n);
    if (plan.mode == Mode::Dense) {
      plan.valueOffset = denseCount;
      denseCount += plan.count;
      continue;
    }
    if (plan.nonfinite) {
      plan.specialOffset = specialWords;
      specialWords += u;
    }
    plan.valueOffset = valueWords;
    if (plan.mode == Mode::Compact) {
      plan.compactF32 = compactValuesInF32(inst.exact, plan.anyFinite, plan.T - plan.Q + 1, plan.T, n);
      if (plan.compactF32) {
        plan.valueOffset = denseCount;
        denseCount += u;
      } else {
        valueWords += size_t(plan.K) * u;
      }
    } else {
      plan.geometry = sketchGeometry(afterIndexPart(inst.cellsPerItem, u),
                                     mix64(op->step * 0x9e3779b97f4a7c15ull + uint64_t(t) + 1));
      plan.floatCells = inst.floatCells && floatCellsExact(plan, n);
      if (plan.floatCells) {
        plan.valueOffset = denseCount;
        denseCount += 3 * plan.geometry.part;
      } else {
        valueWords += size_t(plan.K) * 3 * plan.geometry.part;
      }
    }
  }
  s.values.assign(valueWords, 0);
  s.specials.assign(specialWords, 0);
  // The f32 payload is not zeroed as a whole: dense data and this rank's compact f32 values
  // (memberValues) overwrite their ranges entirely; only the ranges written sparsely (values
  // beside Inf/NaN, a gathered union) or added into (f32 cells) start at zero.
  s.dense.resize(denseCount);
  for (const TensorPlan& plan : s.plans) {
    if (plan.presizedValid || plan.mode == Mode::None || plan.mode == Mode::Dense) continue;
    size_t zeros = 0;
    if (plan.mode == Mode::Compact && plan.compactF32 && !(plan.haveLocal && !plan.nonfinite))
      zeros = plan.members.size();
    else if (plan.mode == Mode::Sketch && plan.floatCells)
      zeros = 3 * plan.geometry.part;
    if (zeros > 0) std::fill_n(s.dense.data() + plan.valueOffset, zeros, 0.0f);  // data() is null when empty
  }
  s.presizedLeftovers.assign(presizedLeftoverWords, 0);
  for (int t = 0; t < op->num_tensors; ++t) {
    TensorPlan& plan = s.plans[t];
    const float* x = inputOf(op->tensors[t]);
    const size_t u = plan.members.size();
    if (plan.presizedValid) {
      encodeLeftovers(plan, x, s.presizedLeftovers.data());
      continue;
    }
    if (plan.mode == Mode::Dense) {
      std::memcpy(s.dense.data() + plan.valueOffset, x, plan.count * sizeof(float));
      continue;
    }
    if (plan.mode == Mode::None) {  // an empty union: this rank must hold no member either
      if (plan.haveLocal && plan.localValues.size > 0)
        return malformed(op, 0, t, "index", "the union is empty but this rank holds a nonzero value");
      plan.unionCoversLocal = plan.haveLocal;
      continue;
    }
    uint64_t* base = s.values.data() + plan.valueOffset;
    if (plan.mode == Mode::Compact && plan.compactF32 && !plan.nonfinite && plan.haveLocal) {
      // The common case, f32 values and no Inf/NaN anywhere: this rank's values go straight into the
      // payload (memberValues writes its own nonzero values and +0 elsewhere, never -0).
      if (!memberValues(s.bitmap.data() + plan.wordOffset, plan.localBits.data(), plan.words, plan.localValues.data.get(),
                        plan.localValues.size, s.dense.data() + plan.valueOffset))
        return malformed(op, 0, t, "index", "the union lacks a coordinate where this rank holds a nonzero value");
      plan.unionCoversLocal = true;
      continue;
    }
    std::vector<float, UninitializedAllocator<float>>& mine = plan.mine;  // this rank's value at each member of U
    mine.resize(u);  // every entry written next (memberValues writes all u, or the call fails)
    if (plan.haveLocal) {
      if (!memberValues(s.bitmap.data() + plan.wordOffset, plan.localBits.data(), plan.words, plan.localValues.data.get(),
                        plan.localValues.size, mine.data()))
        return malformed(op, 0, t, "index", "the union lacks a coordinate where this rank holds a nonzero value");
      plan.unionCoversLocal = true;
    } else {
      for (size_t p = 0; p < u; ++p) mine[p] = x[plan.members[p]];
    }
    if (plan.mode == Mode::Sketch) {  // each member's limbs into its three cells, prefetched ahead
      float* floatCells = plan.floatCells ? s.dense.data() + plan.valueOffset : nullptr;
      const size_t cells = 3 * plan.geometry.part;
      forEachMemberCells(
          plan.members.data(), u, plan.geometry,
          [&](uint64_t c) {
            if (floatCells)
              __builtin_prefetch(floatCells + c, 1);
            else
              __builtin_prefetch(base + c, 1);
          },
          [&](size_t p, uint64_t, const uint64_t* where) {
            const float v = mine[p];
            if (!isFinite(v)) {
              s.specials[plan.specialOffset + p] = specialBits(v);
            } else if (floatCells) {
              for (int j = 0; j < 3; ++j) floatCells[where[j]] += v;  // exact: floatCellsExact
            } else {
              for (int j = 0; j < 3; ++j) addLimbs(v, plan.Q, plan.L, plan.K, base + where[j], cells);
            }
          });
      continue;
    }
    for (size_t p = 0; p < u; ++p) {
      const float v = mine[p];
      if (!isFinite(v)) {
        s.specials[plan.specialOffset + p] = specialBits(v);
        continue;
      }
      if (plan.compactF32) {
        s.dense[plan.valueOffset + p] = v + 0.0f;  // -0 as +0: two -0 (a Bloom false positive) must sum to +0
      } else {
        addLimbs(v, plan.Q, plan.L, plan.K, base + p, u);
      }
    }
  }
  return SHOAL_OK;
}

void writeOutputs(OpState& s, shoal_compress_op_t* op) {
  const int n = op->world_size;
  const bool avg = op->op == SHOAL_AVG;
  for (int t = 0; t < op->num_tensors; ++t) {
    TensorPlan& plan = s.plans[t];
    float* out = static_cast<float*>(op->tensors[t].output.data);
    if (plan.count == 0) continue;
    if (plan.mode == Mode::Dense) {
      const float* sum = s.dense.data() + plan.valueOffset;
      if (avg) {
        for (size_t i = 0; i < plan.count; ++i) out[i] = sum[i] / static_cast<float>(n);
      } else {
        std::memcpy(out, sum, plan.count * sizeof(float));
      }
      continue;
    }
    const float* result = plan.resultView ? plan.resultView : plan.result.data();
    if (out == inputOf(op->tensors[t]) && plan.unionCoversLocal && !plan.localNegativeZero) {
      // In place: off U the buffer holds this rank's input, zeros there (every nonzero of it is a
      // member, checked) and none of them -0, so it already holds the +0 the output needs there. Only
      // U's members are written: no pass over the dense output (an embedding's gradient: a few rows).
      for (size_t p = 0; p < plan.members.size(); ++p) out[plan.members[p]] = result[p];
      continue;
    }
    writeMembers(out, plan.count, plan.members.data(), result, plan.members.size());
  }
}

// Decodes every compact/sketch tensor whose values are all known into plan.result.
void decodeKnown(OpState& s, shoal_compress_op_t* op, bool leftoversArrived) {
  const int n = op->world_size;
  const bool avg = op->op == SHOAL_AVG;
  for (TensorPlan& plan : s.plans) {
    if (plan.mode != Mode::Compact && plan.mode != Mode::Sketch) continue;
    const size_t u = plan.members.size();
    const uint64_t* limbs = nullptr;
    size_t stride = u;
    if (plan.mode == Mode::Compact) {
      if (!plan.compactF32) limbs = s.values.data() + plan.valueOffset;
    } else {
      if (!plan.leftover.empty() && !leftoversArrived) continue;
      const size_t m = plan.leftover.size();
      for (size_t l = 0; l < m; ++l)
        for (int k = 0; k < plan.K; ++k)
          plan.limbs[size_t(k) * u + plan.leftover[l]] = plan.leftoverBase[size_t(k) * m + l];
      limbs = plan.limbs.data();
    }
    if (plan.mode == Mode::Compact && plan.compactF32 && !plan.nonfinite && !avg) {
      plan.resultView = s.dense.data() + plan.valueOffset;  // the exact sums as they arrived: no copy
      continue;
    }
    plan.result.resize(u);
    std::vector<uint8_t> fromLimbs;
    if (plan.floatCells) {  // recovered members: their exact f32 sum; leftovers: their limbs
      fromLimbs.assign(u, 0);
      for (size_t p : plan.leftover) fromLimbs[p] = 1;
    }
    const float* exactSums = plan.compactF32 ? s.dense.data() + plan.valueOffset : plan.floatSums.data();
    for (size_t p = 0; p < u; ++p) {
      if (plan.nonfinite && s.specials[plan.specialOffset + p] != 0)
        plan.result[p] = decodeSpecial(s.specials[plan.specialOffset + p]);
      else if (plan.compactF32 || (plan.floatCells && !fromLimbs[p]))
        plan.result[p] = avg ? exactSums[p] / static_cast<float>(n) : exactSums[p];
      else
        plan.result[p] = plan.K > 0 ? decodeLimbs(limbs + p, stride, plan.K, plan.L, plan.Q, n, avg) : 0.0f;
    }
  }
}

// Round 1's payloads (the values of every tensor: pre-sized sketch leftovers,
// limbs, f32 values or cells, Inf/NaN words), in that order. Returns how many
// (0: nothing to send).
int valuePayloads(OpState& s, shoal_payload_t* out) {
  int np = 0;
  if (!s.presizedLeftovers.empty())
    setAllreducePayload(out[np++], SHOAL_U64, SHOAL_SUM, s.presizedLeftovers.data(), s.presizedLeftovers.size());
  if (!s.values.empty()) setAllreducePayload(out[np++], SHOAL_U64, SHOAL_SUM, s.values.data(), s.values.size());
  if (!s.dense.empty()) setAllreducePayload(out[np++], SHOAL_F32, SHOAL_SUM, s.dense.data(), s.dense.size());
  if (!s.specials.empty())
    setAllreducePayload(out[np++], SHOAL_U64, SHOAL_BOR, s.specials.data(), s.specials.size());
  return np;
}

// ---- the pipelined path: one large host tensor in chunks ---------------------
// Each rank's CPU work (round 0's scan of the input, the dense output write)
// otherwise runs strictly before and after the wire, with the link idle. A
// large tensor is therefore cut into chunks of whole bitmap words, each an
// independent tensor of its own sub-operation (own index, scale, mode and
// payloads: exact by the same rule), and the rounds are staggered: round r
// sends chunk r's index and chunk r-2's values, while a helper thread scans
// chunk r+1, reads chunk r-1's union and encodes its values, and decodes chunk
// r-3 during round r's collectives. P chunks take P + 2 rounds, and between
// two rounds the calling thread only joins the helper: every dense pass and
// every per-member pass overlaps the wire (with chunk r-1's values in round r
// its union's read and the values' encode ran between rounds, a third of the
// call at 1 Gbit/s, docs/benchmarks.md). Every payload is read by the same
// checked functions as the one-piece path (readIndex, encodeValues, ...).
// Only where rounds are exactly two per tensor: values=auto|compact|dense,
// bitmap index, no ratio, one tensor per operation.
constexpr size_t kMaxChunks = 8;

// Elements per chunk, or 0 when the operation goes in one piece. At most
// kMaxChunks chunks (larger chunks for larger tensors: each chunk costs one
// more round of small collectives), each a multiple of 64 elements.
size_t pipelineChunk(const Instance& inst, const shoal_compress_op_t* op) {
  if (inst.chunk == 0 || op->num_tensors != 1 || inst.ratio > 0 || inst.bloom || inst.mode == Mode::Sketch) return 0;
  const size_t count = shoal::elementsCount(op->tensors[0].input);
  size_t chunk = std::max(inst.chunk, (count + kMaxChunks - 1) / kMaxChunks);
  chunk = (chunk + 63) / 64 * 64;
  return count >= 2 * chunk ? chunk : 0;
}

// Sets up `state` (fresh or recycled) for one tensor in chunks; a recycled
// state's chunks are reused in order (extra ones are freed).
void pipelineStart(const Instance& inst, shoal_compress_op_t* op, size_t chunk, OpState* state) {
  if (!state->pipeline) state->pipeline = std::make_unique<Pipeline>();
  state->pipelined = true;
  std::vector<std::unique_ptr<Chunk>>& chunks = state->pipeline->chunks;
  const shoal_compress_tensor_t& whole = op->tensors[0];
  const size_t count = shoal::elementsCount(whole.input);
  chunks.resize((count + chunk - 1) / chunk);
  auto* in = static_cast<float*>(whole.input.data);
  auto* out = static_cast<float*>(whole.output.data);
  for (size_t k = 0, offset = 0; offset < count; ++k, offset += chunk) {
    if (!chunks[k]) chunks[k] = std::make_unique<Chunk>();
    Chunk& c = *chunks[k];
    const size_t n = std::min(chunk, count - offset);
    c.tensor = whole;
    c.tensor.input = shoal_tensor_1d(in + offset, n, SHOAL_F32);
    c.tensor.output = shoal_tensor_1d(out + offset, n, SHOAL_F32);
    c.op = *op;
    c.op.num_tensors = 1;
    c.op.tensors = &c.tensor;
    setUpHost(inst, &c.op, &c.state);
  }
}

// Runs task on the helper thread (on this one if no thread can be started).
template <class Task>
void startHelper(Pipeline& p, Task task) {
  auto guarded = [&p, task] {
    try {
      task();
    } catch (...) {  // out of memory: reported by the next round() on the calling thread
      p.helperFailed = true;
    }
  };
  try {
    p.helper = std::thread(guarded);
  } catch (const std::system_error&) {
    guarded();
  }
}

// Names the chunk in a chunk's error text (its checks speak of "round 0,
// tensor 0": the chunk's own sub-operation).
shoal_status_t chunkFailed(shoal_compress_op_t* op, shoal_status_t status, int chunk, int chunks) {
  char text[512];
  std::snprintf(text, sizeof text, "%s", op->error_text_size > 0 ? op->error_text : "");
  writeText(op->error_text, op->error_text_size, "%s [chunk %d of the tensor's %d, its index sent in round %d]", text,
            chunk, chunks, chunk);
  return status;
}

shoal_status_t pipelineRound(Instance& inst, OpState& s, shoal_compress_op_t* op, shoal_round_t* round) {
  Pipeline& p = *s.pipeline;
  const int chunks = int(p.chunks.size());
  for (;;) {  // repeats only when a round has nothing to send
    const int r = p.next++;
    if (p.helper.joinable()) p.helper.join();
    if (p.helperFailed) {
      writeText(op->error_text, op->error_text_size, "sketch: out of memory in the pipelined encode or decode");
      return SHOAL_ERR_INTERNAL;
    }
    // The helper's readIndex / encodeValues refused chunk helperChunk (its text is in op's error buffer).
    if (p.helperStatus != SHOAL_OK) return chunkFailed(op, p.helperStatus, p.helperChunk, chunks);
    if (r == 0) encodeIndex(inst, p.chunks[0]->state, &p.chunks[0]->op);
    if (r == chunks + 2) {  // the last chunk's values arrived: the call ends here
      Chunk& c = *p.chunks[chunks - 1];
      decodeKnown(c.state, &c.op, true);
      writeOutputs(c.state, &c.op);
      return roundsDone(round);
    }
    // This round's payloads: chunk r's index (scanned during round r - 1) and
    // chunk r - 2's values (encoded during round r - 1).
    int np = 0;
    if (r < chunks) np += indexPayloads(p.chunks[r]->state, round->payloads);
    if (r >= 2 && r - 2 < chunks) {
      OpState& values = p.chunks[r - 2]->state;
      shoal_payload_t extra[SHOAL_MAX_ROUND_PAYLOADS];
      const int nv = valuePayloads(values, extra);
      if (np + nv > SHOAL_MAX_ROUND_PAYLOADS) {  // the index payload + one value dtype + Inf/NaN words
        writeText(op->error_text, op->error_text_size, "sketch: %d payloads in pipelined round %d", np + nv, r);
        return SHOAL_ERR_INTERNAL;
      }
      for (int v = 0; v < nv; ++v) round->payloads[np++] = extra[v];
    }
    // While they travel, the helper scans chunk r + 1, reads chunk r - 1's union (its index
    // arrived in round r - 1) and encodes its values, and decodes chunk r - 3 (its values
    // arrived in round r - 1): chunks no payload of this round belongs to.
    Chunk* scan = r + 1 < chunks ? p.chunks[r + 1].get() : nullptr;
    Chunk* encode = r >= 1 && r - 1 < chunks ? p.chunks[r - 1].get() : nullptr;
    Chunk* decode = r >= 3 ? p.chunks[r - 3].get() : nullptr;  // r - 3 <= chunks - 2: the last is decoded above
    if (scan || encode || decode)
      startHelper(p, [&inst, &p, scan, encode, decode, chunk = r - 1] {
        if (scan) encodeIndex(inst, scan->state, &scan->op);
        if (encode) {
          shoal_status_t status = readIndex(inst, encode->state, &encode->op);
          if (status == SHOAL_OK) status = encodeValues(inst, encode->state, &encode->op);
          if (status != SHOAL_OK) {
            p.helperStatus = status;
            p.helperChunk = chunk;
            return;
          }
        }
        if (decode) {
          decodeKnown(decode->state, &decode->op, true);
          writeOutputs(decode->state, &decode->op);
        }
      });
    round->num_payloads = np;
    if (np > 0) return SHOAL_OK;
  }
}

shoal_status_t round(void* instance, void* opState, shoal_compress_op_t* op, shoal_round_t* round) {
  Instance& inst = *static_cast<Instance*>(instance);
  OpState& s = *static_cast<OpState*>(opState);
#if SHOAL_WITH_CUDA
  if (s.device != nullptr) return deviceRound(inst, s.device, op, round);
#endif
  if (s.pipelined) return pipelineRound(inst, s, op, round);
  if (round->index == 0) {
    encodeIndex(inst, s, op);
    round->num_payloads = indexPayloads(s, round->payloads);
    s.stage = 0;
    return SHOAL_OK;
  }
  if (s.stage == 0) {
    if (shoal_status_t status = readIndex(inst, s, op); status != SHOAL_OK) return status;
    if (shoal_status_t status = encodeValues(inst, s, op); status != SHOAL_OK) return status;
    s.stage = 1;
    const int np = valuePayloads(s, round->payloads);
    round->num_payloads = np;
    if (np > 0) return SHOAL_OK;
    // Nothing to send: every tensor is zero, or its pre-sized sketch peeled completely.
    decodeKnown(s, op, true);
    writeOutputs(s, op);
    return roundsDone(round);
  }
  if (s.stage == 1) {
    // Values arrived: peel sketches, collect leftovers.
    size_t leftoverWords = 0;
    for (int t = 0; t < op->num_tensors; ++t) {
      TensorPlan& plan = s.plans[t];
      if (plan.mode != Mode::Sketch || plan.presizedValid) continue;
      const bool ok = plan.floatCells
                          ? peelSketch(plan.members.data(), plan.members.size(), plan.geometry, 1,
                                       s.dense.data() + plan.valueOffset, plan.floatSums, plan.leftover, s.peelF32)
                          : peelSketch(plan.members.data(), plan.members.size(), plan.geometry, plan.K,
                                       s.values.data() + plan.valueOffset, plan.limbs, plan.leftover, s.peel);
      if (plan.floatCells) plan.limbs.assign(size_t(plan.K) * plan.members.size(), 0);  // the leftovers' limbs
      if (!ok) {
        return malformed(op, 1, t, "sketch", "a cell is not zero once every member is peeled");
      }
      plan.leftoverOffset = leftoverWords;
      leftoverWords += size_t(plan.K) * plan.leftover.size();
    }
    s.stage = 2;
    if (leftoverWords > 0) {
      s.leftovers.assign(leftoverWords, 0);
      for (int t = 0; t < op->num_tensors; ++t) {
        TensorPlan& plan = s.plans[t];
        if (plan.mode != Mode::Sketch || plan.presizedValid || plan.leftover.empty()) continue;
        encodeLeftovers(plan, inputOf(op->tensors[t]), s.leftovers.data());
      }
      round->num_payloads = 1;
      setAllreducePayload(round->payloads[0], SHOAL_U64, SHOAL_SUM, s.leftovers.data(), s.leftovers.size());
      return SHOAL_OK;
    }
  }
  // stage 2: everything known.
  decodeKnown(s, op, true);
  writeOutputs(s, op);
  return roundsDone(round);
}

void finish(void* instance, void* opState) {
  auto* s = static_cast<OpState*>(opState);
#if SHOAL_WITH_CUDA
  if (s->device != nullptr) {  // the CUDA path's buffers are its own (sketch_device.cc): not kept
    deviceFinish(s->device);
    delete s;
    return;
  }
#endif
  giveBack(*static_cast<HostInstance*>(instance), s);
}

#if SHOAL_WITH_CUDA
constexpr uint64_t kCaps = SHOAL_CAP_HOST | SHOAL_CAP_CUDA | SHOAL_CAP_LOSSLESS | SHOAL_CAP_HOMOMORPHIC;
#else
constexpr uint64_t kCaps = SHOAL_CAP_HOST | SHOAL_CAP_LOSSLESS | SHOAL_CAP_HOMOMORPHIC;
#endif

const shoal_compressor_t kSketch = {
    .abi_version = SHOAL_COMPRESSOR_ABI_VERSION,
    .struct_size = sizeof(shoal_compressor_t),
    .name = "sketch",
    .description = "lossless homomorphic compression of sparse f32: OR-ed index bitmap, then exact 64-bit "
                   "fixed-point values (compact, count sketch with peeling, or dense)",
    .options_help = kOptionsHelp,
    .caps = kCaps,
    .error_kind = SHOAL_ERROR_EXACT,
    .error_bound = 0.0,
    .dtypes = 1u << SHOAL_F32,
    .create = create,
    .destroy = destroy,
    .start = start,
    .round = round,
    .finish = finish,
    .destroy_tensor_state = nullptr,
    .save_tensor_state = nullptr,
    .load_tensor_state = nullptr,
};

}  // namespace

const shoal_compressor_t* sketch() { return &kSketch; }

}  // namespace shoal::compressors
