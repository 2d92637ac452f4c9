// sketch-kernels-bench: Google Benchmark throughput of the CPU building blocks of
// the lossless `sketch` compressor (compressors/sketch), one rank, no
// communication, next to memcpy of the same bytes on the same machine.
//
//   build/bin/sketch-kernels-bench --benchmark_min_time=0.2
//
// Input: n = 2^22 f32 (16 MiB), density d in {0.1%, 1%, 10%} at random
// positions, values signed multiples of 2^-12 in (-1, 1) (as shoal-bench's
// checked inputs: one 64-bit limb, K = 1). Every benchmark reports GB/s of the
// DENSE f32 input (4 n bytes per iteration / time, 1 GB = 1e9 B), so the
// numbers compare directly with BM_Memcpy.
//
// The kernels are the per-element functions of sketch_math.h (bitmapSet,
// decompose, addLimbs, cellOf, decodeOneLimb) in the loops of sketch.cc, which
// keeps them in an anonymous namespace: the loops below mirror encodeValues and
// decodeKnown line by line; round 0's scan, the member list and the output
// writer are sketch.cc's own (sketch_host.h), as is the peel (peelSketch,
// sketch_peel.h). The pipelines also report per-core encode and decode rates
// (encGB/s, decGB/s: the dense bytes over this thread's CPU time, which other
// jobs on a shared machine do not inflate), memcpy its cpuGB/s.
// BM_Pipeline_* drive the real compressor table (shoal::compressors::sketch())
// on a 1-rank op, where every reduction is the identity: it is the true code
// path, all rounds' CPU work, without the collectives. BM_ScanPath runs round
// 0's scan on each of its paths (portable, SSE4.1, AVX2, AVX-512); BM_NcfStep_* one step
// of the NCF training task's gradients (mostly zero rows) in place and out of place.
#include <benchmark/benchmark.h>
#include <shoal/compressor.h>
#include <shoal/shoal.h>

#include <algorithm>
#include <chrono>
#include <cmath>
#include <cstdint>
#include <cstring>
#include <random>
#include <ctime>
#include <vector>

#include "compressors/sketch/sketch_host.h"
#include "compressors/sketch/sketch_math.h"
#include "compressors/sketch/sketch_peel.h"

namespace shoal::compressors {
const shoal_compressor_t* sketch();
}

namespace {

using namespace shoal::sketch;

constexpr size_t kCount = size_t(1) << 22;
constexpr double kBytes = 4.0 * double(kCount);

// density in 1/1000 (benchmark args are integers)
struct Data {
  std::vector<float> x;
  std::vector<uint64_t> bitmap;   // filled
  std::vector<uint64_t> members;  // U, ascending
  int Q = 0, T = 0, L = 63, K = 1;
};

const Data& data(int permille) {
  static Data cache[1001];
  static bool ready[1001] = {};
  Data& d = cache[permille];
  if (ready[permille]) return d;
  ready[permille] = true;
  std::mt19937_64 rng(1234 + permille);
  d.x.assign(kCount, 0.0f);
  const double p = permille / 1000.0;
  std::uniform_real_distribution<double> uni(0.0, 1.0);
  std::uniform_int_distribution<int> val(1, 4095);
  for (size_t i = 0; i < kCount; ++i)
    if (uni(rng) < p) d.x[i] = float((rng() & 1) ? -val(rng) : val(rng)) * 0x1p-12f;
  d.bitmap.assign(kCount / 64, 0);
  int top = -1000, lowest = 1000;
  for (size_t i = 0; i < kCount; ++i) {
    if (d.x[i] == 0.0f) continue;
    bitmapSet(d.bitmap.data(), i);
    d.members.push_back(i);
    FloatParts fp = decompose(d.x[i]);
    top = std::max(top, fp.top);
    lowest = std::min(lowest, fp.lowest);
  }
  d.T = top;
  d.Q = lowest;
  d.L = 63;  // one rank: c = 0
  d.K = (d.T - d.Q + 1 + d.L - 1) / d.L;
  return d;
}

// This thread's CPU time in seconds: on a shared machine the wall clock also
// counts other jobs' time slices, the thread's CPU time does not.
double threadSeconds() {
  timespec ts{};
  clock_gettime(CLOCK_THREAD_CPUTIME_ID, &ts);
  return double(ts.tv_sec) + 1e-9 * double(ts.tv_nsec);
}

// This process's CPU time in seconds (every thread: the chunked pipeline's
// helper thread too).
double processSeconds() {
  timespec ts{};
  clock_gettime(CLOCK_PROCESS_CPUTIME_ID, &ts);
  return double(ts.tv_sec) + 1e-9 * double(ts.tv_nsec);
}

void setRate(benchmark::State& state, size_t members) {
  state.counters["GB/s"] = benchmark::Counter(kBytes / 1e9, benchmark::Counter::kIsIterationInvariantRate);
  state.counters["members"] = double(members);
}

// ---- memcpy of the same 16 MiB --------------------------------------------------------
void BM_Memcpy(benchmark::State& state) {
  std::vector<float> src(kCount, 1.0f), dst(kCount, 0.0f);
  const double begin = threadSeconds();
  for (auto _ : state) {
    std::memcpy(dst.data(), src.data(), kCount * sizeof(float));
    benchmark::DoNotOptimize(dst.data());
    benchmark::ClobberMemory();
  }
  const double cpu = threadSeconds() - begin;
  setRate(state, kCount);
  state.counters["cpuGB/s"] = kBytes * double(state.iterations()) / cpu / 1e9;
}

// ---- encode -------------------------------------------------------------------------------
// Round 0 (encodeIndex, bitmap index): sketch_host.h's scan, the bitmap words,
// the exponent statistics and this rank's nonzero values in index order.
void BM_BitmapBuild(benchmark::State& state) {
  const Data& d = data(int(state.range(0)));
  std::vector<uint64_t> bits(kCount / 64);
  LocalValues values;
  for (auto _ : state) {
    LocalStats s = scanIndex(d.x.data(), kCount, bits.data(), &values);
    benchmark::DoNotOptimize(s);
    benchmark::DoNotOptimize(bits.data());
    benchmark::DoNotOptimize(values.data.get());
  }
  setRate(state, d.members.size());
}

// Round 0's scan on each of its paths (sketch_host.cc: portable, SSE4.1 = the build's x86-64-v2
// baseline, AVX2 and AVX-512 by the CPU); scanIndex takes the best one the CPU has.
void BM_ScanPath(benchmark::State& state) {
  const Data& d = data(int(state.range(1)));
  const auto path = static_cast<ScanPath>(state.range(0));
  if (!scanPathAvailable(path)) {
    state.SkipWithError("this CPU lacks the path");
    return;
  }
  std::vector<uint64_t> bits(kCount / 64);
  LocalValues values;
  const double begin = threadSeconds();
  for (auto _ : state) {
    LocalStats s = scanIndexWith(path, d.x.data(), kCount, bits.data(), &values);
    benchmark::DoNotOptimize(s);
    benchmark::DoNotOptimize(bits.data());
    benchmark::DoNotOptimize(values.data.get());
  }
  setRate(state, d.members.size());
  state.counters["cpuGB/s"] = kBytes * double(state.iterations()) / (threadSeconds() - begin) / 1e9;
}

// After round 0 (encodeValues): the union bitmap to the member list U.
void BM_SupportCompaction(benchmark::State& state) {
  const Data& d = data(int(state.range(0)));
  for (auto _ : state) {
    std::vector<uint64_t> members;  // as sketch.cc: a fresh vector
    bitmapMembersFast(d.bitmap.data(), kCount, members);
    benchmark::DoNotOptimize(members.data());
  }
  setRate(state, d.members.size());
}

// values=compact: the members' fixed-point limbs, in U's order.
void BM_EncodeCompact(benchmark::State& state) {
  const Data& d = data(int(state.range(0)));
  const size_t u = d.members.size();
  std::vector<uint64_t> values;
  for (auto _ : state) {
    values.assign(size_t(d.K) * u, 0);
    for (size_t p = 0; p < u; ++p) addLimbs(d.x[d.members[p]], d.Q, d.L, d.K, values.data() + p, u);
    benchmark::DoNotOptimize(values.data());
  }
  setRate(state, u);
}

SketchGeometry sketchShape(size_t u) {
  return sketchGeometry(std::max<uint64_t>(1, uint64_t(std::ceil(1.3 * double(u) / 3.0))), 0x1234567887654321ull);
}

void scatter(const Data& d, const SketchGeometry& g, std::vector<uint64_t>& values) {
  const size_t cells = 3 * g.part;
  values.assign(size_t(d.K) * cells, 0);
  uint64_t* base = values.data();
  forEachMemberCells(
      d.members.data(), d.members.size(), g, [&](uint64_t c) { __builtin_prefetch(base + c, 1); },
      [&](size_t, uint64_t i, const uint64_t* where) {
        for (int j = 0; j < 3; ++j) addLimbs(d.x[i], d.Q, d.L, d.K, base + where[j], cells);
      });
}

// values=sketch: each member's limbs added to its 3 cells (cells_per_item 1.3), prefetched ahead as in encodeValues.
void BM_SketchScatter(benchmark::State& state) {
  const Data& d = data(int(state.range(0)));
  const SketchGeometry g = sketchShape(d.members.size());
  std::vector<uint64_t> values;
  for (auto _ : state) {
    scatter(d, g, values);
    benchmark::DoNotOptimize(values.data());
  }
  setRate(state, d.members.size());
}

// ---- decode -------------------------------------------------------------------------------
void BM_PeelDecode(benchmark::State& state) {
  const Data& d = data(int(state.range(0)));
  const SketchGeometry g = sketchShape(d.members.size());
  std::vector<uint64_t> summed, limbs;
  std::vector<size_t> leftover;
  PeelScratch<uint64_t> scratch;  // kept across calls, as sketch.cc keeps it
  scatter(d, g, summed);
  size_t recovered = 0;
  for (auto _ : state) {
    if (!peelSketch(d.members.data(), d.members.size(), g, d.K, summed.data(), limbs, leftover, scratch))
      state.SkipWithError("peeling certificate failed");
    recovered = d.members.size() - leftover.size();
    benchmark::DoNotOptimize(limbs.data());
  }
  setRate(state, d.members.size());
  state.counters["recovered"] = double(recovered) / double(std::max<size_t>(1, d.members.size()));
}

// values=compact decode: each member's limb sum to f32 (rounded once), then the
// dense output: zero it and scatter the members (writeOutputs).
void BM_DecodeCompact(benchmark::State& state) {
  const Data& d = data(int(state.range(0)));
  const size_t u = d.members.size();
  std::vector<uint64_t> limbs(u);
  for (size_t p = 0; p < u; ++p) addLimbs(d.x[d.members[p]], d.Q, d.L, d.K, limbs.data() + p, u);
  std::vector<float> result(u), out(kCount);
  for (auto _ : state) {
    for (size_t p = 0; p < u; ++p) result[p] = decodeOneLimb(static_cast<int64_t>(limbs[p]), d.Q, 1);
    writeMembers(out.data(), kCount, d.members.data(), result.data(), u);
    benchmark::DoNotOptimize(out.data());
  }
  if (u && out[d.members[0]] != d.x[d.members[0]]) state.SkipWithError("decode mismatch");
  setRate(state, u);
}

// The decode alone of an average over n ranks (DistributedOptimizer's default op): the sums of n
// copies of the data, decoded to S * 2^Q / n. n = 4 (a power of two) takes the conversion-and-scale
// path, n = 3 the double division (decodeOneLimb). GB/s of the members' f32 results.
void BM_DecodeAvg(benchmark::State& state) {
  const Data& d = data(int(state.range(0)));
  const int n = int(state.range(1));
  const size_t u = d.members.size();
  std::vector<uint64_t> limbs(u);
  for (int r = 0; r < n; ++r)
    for (size_t p = 0; p < u; ++p) addLimbs(d.x[d.members[p]], d.Q, d.L, d.K, limbs.data() + p, u);
  std::vector<float> result(u);
  for (auto _ : state) {
    for (size_t p = 0; p < u; ++p) result[p] = decodeOneLimb(static_cast<int64_t>(limbs[p]), d.Q, n);
    benchmark::DoNotOptimize(result.data());
  }
  if (u && result[0] != d.x[d.members[0]]) state.SkipWithError("decode mismatch");  // (n x) / n = x
  setRate(state, u);
}

// The dense output write alone (writeMembersWith) by its stores, density and size: one member per
// 1/density elements at random positions; GB/s of the output. Then a read of every line of it (the
// caller's next pass, as the optimizer's), timed apart: plain stores leave a cache-sized output in
// cache, streaming stores do not. writeMembers picks by outputStoresFor (the "picked" counter).
void BM_WriteMembers(benchmark::State& state) {
  const auto stores = static_cast<OutputStores>(state.range(0));
  const double density = double(state.range(1)) / 1000.0;
  const size_t count = size_t(state.range(2)) << 18;  // MiB of f32
  std::mt19937_64 rng(77);
  std::vector<uint64_t> members;
  for (size_t i = 0; i < count; ++i)
    if (double(rng() >> 11) * 0x1p-53 < density) members.push_back(i);
  std::vector<float> result(members.size(), 1.0f), out(count, 1.0f);
  double readSeconds = 0;
  float sink = 0;
  for (auto _ : state) {
    writeMembersWith(stores, out.data(), count, members.data(), result.data(), members.size());
    benchmark::ClobberMemory();
    state.PauseTiming();
    const auto begin = std::chrono::steady_clock::now();
    for (size_t i = 0; i < count; i += 16) sink += out[i];
    readSeconds += std::chrono::duration<double>(std::chrono::steady_clock::now() - begin).count();
    state.ResumeTiming();
  }
  benchmark::DoNotOptimize(sink);
  size_t p = 0;
  for (size_t i = 0; i < count; ++i)
    if (out[i] != (p < members.size() && members[p] == i ? result[p++] : 0.0f)) {
      state.SkipWithError("wrong output");
      break;
    }
  state.counters["GB/s"] = benchmark::Counter(4.0 * double(count) / 1e9, benchmark::Counter::kIsIterationInvariantRate);
  state.counters["read_ms"] = 1e3 * readSeconds / double(std::max<int64_t>(1, state.iterations()));
  state.counters["picked"] = double(outputStoresFor(count, members.size()) == stores);
}

// ---- the real compressor, one rank --------------------------------------------------------
void pipeline(benchmark::State& state, const char* mode, const char* chunk = "0") {
  const Data& d = data(int(state.range(0)));
  const shoal_compressor_t* c = shoal::compressors::sketch();
  const char* keys[] = {"values", "chunk"};
  const char* vals[] = {mode, chunk};
  char err[256] = {};
  shoal_compressor_params_t params{};
  params.struct_size = sizeof params;
  params.num_options = 2;
  params.keys = keys;
  params.values = vals;
  params.error_text = err;
  params.error_text_size = sizeof err;
  void* inst = nullptr;
  if (c->create(&params, &inst) != SHOAL_OK) {
    state.SkipWithError(err);
    return;
  }
  std::vector<float> out(kCount);
  shoal_compress_tensor_t t{};
  t.input = shoal_tensor_1d(const_cast<float*>(d.x.data()), kCount, SHOAL_F32);
  t.output = shoal_tensor_1d(out.data(), kCount, SHOAL_F32);
  shoal_compress_op_t op{};
  op.struct_size = sizeof op;
  op.rank = 0;
  op.world_size = 1;
  op.op = SHOAL_SUM;
  op.num_tensors = 1;
  op.tensors = &t;
  op.error_text = err;
  op.error_text_size = sizeof err;
  double sent = 0, encodeSeconds = 0, decodeSeconds = 0, opSeconds = 0;
  int rounds = 0;
  for (auto _ : state) {
    void* os = nullptr;
    const double opBegin = processSeconds();
    if (c->start(inst, &op, &os) != SHOAL_OK) {
      state.SkipWithError(err);
      break;
    }
    shoal_round_t r{};
    r.struct_size = sizeof r;
    sent = 0;
    for (r.index = 0; !r.done; ++r.index) {  // 1 rank: every allreduce is the identity
      const double before = threadSeconds();
      const shoal_status_t status = c->round(inst, os, &op, &r);
      // Rounds 0 and 1 encode (index, then values); later rounds peel and decode.
      (r.index < 2 ? encodeSeconds : decodeSeconds) += threadSeconds() - before;
      if (status != SHOAL_OK) {
        state.SkipWithError(err);
        break;
      }
      for (int p = 0; p < r.num_payloads; ++p) sent += double(r.payloads[p].count) * (r.payloads[p].dtype == SHOAL_F32 ? 4 : 8);
    }
    rounds = r.index;
    c->finish(inst, os);
    opSeconds += processSeconds() - opBegin;
    ++op.step;
    benchmark::DoNotOptimize(out.data());
  }
  if (std::memcmp(out.data(), d.x.data(), kCount * sizeof(float)) != 0) state.SkipWithError("output != input");
  c->destroy(inst);
  setRate(state, d.members.size());
  state.counters["ratio"] = kBytes / std::max(1.0, sent);
  state.counters["rounds"] = rounds;
  // Per core: the dense input's bytes over this thread's CPU time in each half.
  state.counters["encGB/s"] = kBytes * double(state.iterations()) / std::max(1e-12, encodeSeconds) / 1e9;
  state.counters["decGB/s"] = kBytes * double(state.iterations()) / std::max(1e-12, decodeSeconds) / 1e9;
  // The whole operation's CPU, every thread (chunk=: the helper's scans and output writes too).
  state.counters["opGB/s"] = kBytes * double(state.iterations()) / std::max(1e-12, opSeconds) / 1e9;
}
void BM_Pipeline_Compact(benchmark::State& state) { pipeline(state, "compact"); }
void BM_Pipeline_Sketch(benchmark::State& state) { pipeline(state, "sketch"); }
// chunk=: the same tensor in 8 chunks of 2^19 (the pipelined path; encGB/s and decGB/s are
// this thread's share only, opGB/s counts the helper thread too).
void BM_Pipeline_Chunked(benchmark::State& state) { pipeline(state, "compact", "524288"); }


// ---- the NCF task's gradients (issue 19) ---------------------------------------------------
// One step's gradients of examples/train/embeddings.py: nn.Embedding(sparse=False) gives dense
// gradients that are zero but for the rows the batch touched. User and item tables of 100,000 and
// 20,000 rows of 32 (about 200 and 450 rows touched by a batch of 256 positives and 256 negatives,
// as measured by the task's user_rows_touched_per_rank), then the MLP's 4 dense gradients (6,144 +
// 64 + 64 + 1), as one operation of 6 tensors, in place (DistributedOptimizer's allreduce) or out
// of place. world_size 2 where the other rank holds zeros (every reduction is still the identity,
// so the output must equal the input): the two-rank path, f32 values, that the task takes.
struct NcfStep {
  std::vector<std::vector<float>> grads;
  size_t elements = 0, members = 0;
};

const NcfStep& ncfStep() {
  static NcfStep step;
  if (!step.grads.empty()) return step;
  std::mt19937_64 rng(19);
  std::normal_distribution<float> value(0.0f, 1e-3f);
  const size_t rows[2] = {100000, 20000}, touched[2] = {200, 450}, dim = 32;
  for (int e = 0; e < 2; ++e) {
    std::vector<float> g(rows[e] * dim, 0.0f);
    std::uniform_int_distribution<size_t> row(0, rows[e] - 1);
    for (size_t k = 0; k < touched[e]; ++k) {
      const size_t r = row(rng);
      for (size_t c = 0; c < dim; ++c) g[r * dim + c] = value(rng);
    }
    step.grads.push_back(std::move(g));
  }
  for (size_t n : {size_t(6144), size_t(64), size_t(64), size_t(1)}) {
    std::vector<float> g(n);
    for (float& v : g) v = value(rng);
    step.grads.push_back(std::move(g));
  }
  for (const auto& g : step.grads) {
    step.elements += g.size();
    for (float v : g) step.members += v != 0.0f;
  }
  return step;
}

void ncf(benchmark::State& state, bool inPlace) {
  const NcfStep& step = ncfStep();
  const shoal_compressor_t* c = shoal::compressors::sketch();
  char err[256] = {};
  shoal_compressor_params_t params{};
  params.struct_size = sizeof params;
  params.error_text = err;
  params.error_text_size = sizeof err;
  void* inst = nullptr;
  if (c->create(&params, &inst) != SHOAL_OK) {
    state.SkipWithError(err);
    return;
  }
  std::vector<std::vector<float>> buffers = step.grads, outs;
  for (const auto& g : step.grads) outs.emplace_back(g.size());
  std::vector<shoal_compress_tensor_t> tensors(buffers.size());
  for (size_t t = 0; t < buffers.size(); ++t) {
    tensors[t].input = shoal_tensor_1d(buffers[t].data(), buffers[t].size(), SHOAL_F32);
    tensors[t].output = shoal_tensor_1d(inPlace ? buffers[t].data() : outs[t].data(), buffers[t].size(), SHOAL_F32);
  }
  shoal_compress_op_t op{};
  op.struct_size = sizeof op;
  op.rank = 0;
  op.world_size = 2;
  op.op = SHOAL_SUM;
  op.num_tensors = int(tensors.size());
  op.tensors = tensors.data();
  op.error_text = err;
  op.error_text_size = sizeof err;
  double encodeSeconds = 0, decodeSeconds = 0;
  for (auto _ : state) {
    void* os = nullptr;
    if (c->start(inst, &op, &os) != SHOAL_OK) {
      state.SkipWithError(err);
      break;
    }
    shoal_round_t r{};
    r.struct_size = sizeof r;
    for (r.index = 0; !r.done; ++r.index) {  // the other rank's zeros: every reduction is the identity
      const double before = threadSeconds();
      const shoal_status_t status = c->round(inst, os, &op, &r);
      (r.index < 2 ? encodeSeconds : decodeSeconds) += threadSeconds() - before;
      if (status != SHOAL_OK) {
        state.SkipWithError(err);
        break;
      }
    }
    c->finish(inst, os);
    ++op.step;
  }
  for (size_t t = 0; t < buffers.size(); ++t) {
    const float* got = inPlace ? buffers[t].data() : outs[t].data();
    if (std::memcmp(got, step.grads[t].data(), step.grads[t].size() * sizeof(float)) != 0)
      state.SkipWithError("output != input");
  }
  c->destroy(inst);
  const double iterations = double(std::max<int64_t>(1, state.iterations()));
  state.counters["members"] = double(step.members);
  // CPU per step (ms, this thread): what the sketch costs the NCF step on one rank.
  state.counters["encode_ms"] = 1e3 * encodeSeconds / iterations;
  state.counters["decode_ms"] = 1e3 * decodeSeconds / iterations;
  state.counters["encGB/s"] = 4.0 * double(step.elements) * iterations / std::max(1e-12, encodeSeconds) / 1e9;
  state.counters["decGB/s"] = 4.0 * double(step.elements) * iterations / std::max(1e-12, decodeSeconds) / 1e9;
}
void BM_NcfStep_InPlace(benchmark::State& state) { ncf(state, true); }
void BM_NcfStep_OutOfPlace(benchmark::State& state) { ncf(state, false); }

void densities(benchmark::internal::Benchmark* b) {
  b->ArgName("permille")->Arg(1)->Arg(10)->Arg(100)->Unit(benchmark::kMillisecond)->UseRealTime();
}

}  // namespace

BENCHMARK(BM_Memcpy)->Unit(benchmark::kMillisecond)->UseRealTime();
BENCHMARK(BM_BitmapBuild)->Apply(densities);
BENCHMARK(BM_ScanPath)
    ->ArgNames({"path", "permille"})
    ->ArgsProduct({{0, 1, 2, 3}, {1, 10, 100}})
    ->Unit(benchmark::kMillisecond)
    ->UseRealTime();
BENCHMARK(BM_SupportCompaction)->Apply(densities);
BENCHMARK(BM_EncodeCompact)->Apply(densities);
BENCHMARK(BM_SketchScatter)->Apply(densities);
BENCHMARK(BM_PeelDecode)->Apply(densities);
BENCHMARK(BM_DecodeCompact)->Apply(densities);
BENCHMARK(BM_DecodeAvg)
    ->ArgNames({"permille", "ranks"})
    ->ArgsProduct({{10, 100}, {3, 4}})
    ->Unit(benchmark::kMillisecond)
    ->UseRealTime();
BENCHMARK(BM_WriteMembers)
    ->ArgNames({"streaming", "permille", "MiB"})
    ->ArgsProduct({{0, 1}, {1, 10, 100}, {4, 16, 64, 256}})
    ->Unit(benchmark::kMillisecond)
    ->UseRealTime();
BENCHMARK(BM_Pipeline_Compact)->Apply(densities);
BENCHMARK(BM_Pipeline_Sketch)->Apply(densities);
BENCHMARK(BM_Pipeline_Chunked)->Apply(densities);
BENCHMARK(BM_NcfStep_InPlace)->Unit(benchmark::kMillisecond)->UseRealTime();
BENCHMARK(BM_NcfStep_OutOfPlace)->Unit(benchmark::kMillisecond)->UseRealTime();

BENCHMARK_MAIN();
