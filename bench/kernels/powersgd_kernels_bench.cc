// powersgd-kernels-bench: the host CPU of one call of the `powersgd` compressor
// (compressors/powersgd), one rank, no communication, through the compressor's
// own table (start, its rounds, finish): the true code path of a training
// step's PowerSGD arithmetic without the collectives (with one rank every
// allreduce is the identity).
//
//   OPENBLAS_NUM_THREADS=1 build-nocuda/bin/powersgd-kernels-bench --benchmark_min_time=0.5
//
// BM_Call/<rows>/<cols>/<rank>/<in_place>: one f32 matrix, error feedback on (the
// default); in_place 0: a separate output (the input stays the same from call to
// call); 1: the output is the input, as in training (M = g + e then stays the
// same from call to call, up to rounding: g becomes the last A).
// The time column that matters is CPU: this thread's CPU time per call, which
// other jobs on a shared machine do not inflate (Time is wall clock).
// Counters: P_ms, Q_ms, finish_ms, this thread's CPU time per call in round 0
// (M = g + e, P = M Q), round 1 (orthonormalize P, Q = Mᵀ P) and round 2 (A =
// P Qᵀ, the new error and the output); GB/s = the matrix's f32 bytes over the
// CPU time of a call.
// BM_DigitsSet/<rank>: the six gradients of examples/train/digits_mlp.py
// (64-1024-1024-10: [1024 x 64], [1024 x 1024], [10 x 1024] and three biases,
// which ride densely), one call each, in place, as DistributedOptimizer submits them.
// OPENBLAS_NUM_THREADS=1 keeps a BLAS-based build's helper threads (whose CPU
// this thread's time would not count) out of the comparison.
#include <benchmark/benchmark.h>
#include <shoal/compressor.h>
#include <shoal/shoal.h>

#include <algorithm>
#include <cstdint>
#include <cstring>
#include <ctime>
#include <string>
#include <utility>
#include <vector>

namespace shoal::compressors {
const shoal_compressor_t* powersgd();
}

namespace {

double threadSeconds() {
  timespec ts{};
  clock_gettime(CLOCK_THREAD_CPUTIME_ID, &ts);
  return double(ts.tv_sec) + 1e-9 * double(ts.tv_nsec);
}

// Deterministic values in [-1, 1).
float valueAt(uint64_t key, uint64_t i) {
  uint64_t x = (key * 0x9e3779b97f4a7c15ull) ^ (i + 0x632be59bd9b4e019ull);
  x = (x ^ (x >> 30)) * 0xbf58476d1ce4e5b9ull;
  x = (x ^ (x >> 27)) * 0x94d049bb133111ebull;
  x ^= x >> 31;
  return static_cast<float>(static_cast<double>(x >> 40) * 0x1.0p-23 - 1.0);
}

struct Tensor {
  std::string name;
  int64_t rows = 0, cols = 0;  // cols = 0: 1-D
  std::vector<float> input, output;
  bool inPlace = false;  // output = input, as DistributedOptimizer's allreduces run
  void* state = nullptr;
};

// One compressor instance and its tensors; runs calls, timing each round on this thread.
class Bench {
 public:
  Bench(int rank, std::vector<Tensor> tensors) : tensors_(std::move(tensors)) {
    table_ = shoal::compressors::powersgd();
    rankText_ = std::to_string(rank);
    const char* keys[] = {"rank"};
    const char* values[] = {rankText_.c_str()};
    shoal_compressor_params_t params{};
    params.struct_size = sizeof params;
    params.num_options = 1;
    params.keys = keys;
    params.values = values;
    params.error_text = error_;
    params.error_text_size = sizeof error_;
    if (table_->create(&params, &instance_) != SHOAL_OK) instance_ = nullptr;
  }
  ~Bench() {
    for (Tensor& t : tensors_)
      if (t.state != nullptr) table_->destroy_tensor_state(instance_, t.state);
    if (instance_ != nullptr) table_->destroy(instance_);
  }

  const char* error() const { return error_; }
  double roundSeconds[3] = {0, 0, 0};

  // One call per tensor; false (and error()) on failure.
  bool step() {
    if (instance_ == nullptr) return false;
    for (Tensor& t : tensors_) {
      shoal_compress_tensor_t tensor{};
      const size_t count = t.cols ? size_t(t.rows * t.cols) : size_t(t.rows);
      tensor.input = shoal_tensor_1d(t.input.data(), count, SHOAL_F32);
      if (t.cols) {
        tensor.input.ndim = 2;
        tensor.input.shape[0] = t.rows;
        tensor.input.shape[1] = t.cols;
      }
      tensor.output = tensor.input;
      tensor.output.data = t.inPlace ? t.input.data() : t.output.data();
      tensor.name = t.name.c_str();
      tensor.state = &t.state;
      shoal_compress_op_t op{};
      op.struct_size = sizeof op;
      op.rank = 0;
      op.world_size = 1;
      op.op = SHOAL_AVG;
      op.num_tensors = 1;
      op.tensors = &tensor;
      op.step = step_++;
      op.error_text = error_;
      op.error_text_size = sizeof error_;
      void* opState = nullptr;
      if (table_->start(instance_, &op, &opState) != SHOAL_OK) return false;
      shoal_round_t round{};
      round.struct_size = sizeof round;
      for (round.index = 0; !round.done; ++round.index) {  // one rank: every allreduce is the identity
        const double before = threadSeconds();
        const shoal_status_t status = table_->round(instance_, opState, &op, &round);
        if (round.index < 3) roundSeconds[round.index] += threadSeconds() - before;
        if (status != SHOAL_OK) {
          table_->finish(instance_, opState);
          return false;
        }
      }
      table_->finish(instance_, opState);
    }
    return true;
  }

 private:
  const shoal_compressor_t* table_ = nullptr;
  void* instance_ = nullptr;
  std::string rankText_;
  std::vector<Tensor> tensors_;
  uint64_t step_ = 0;
  char error_[512] = {};
};

Tensor makeTensor(const char* name, int64_t rows, int64_t cols, uint64_t key) {
  Tensor t;
  t.name = name;
  t.rows = rows;
  t.cols = cols;
  const size_t count = cols ? size_t(rows * cols) : size_t(rows);
  t.input.resize(count);
  for (size_t i = 0; i < count; ++i) t.input[i] = valueAt(key, i) * 0.01f;
  t.output.assign(count, 0.0f);
  return t;
}

void report(benchmark::State& state, const Bench& bench, double elements) {
  const double calls = double(state.iterations());
  state.counters["P_ms"] = 1e3 * bench.roundSeconds[0] / calls;
  state.counters["Q_ms"] = 1e3 * bench.roundSeconds[1] / calls;
  state.counters["finish_ms"] = 1e3 * bench.roundSeconds[2] / calls;
  const double cpu = bench.roundSeconds[0] + bench.roundSeconds[1] + bench.roundSeconds[2];
  state.counters["GB/s"] = 4.0 * elements * calls / std::max(1e-12, cpu) / 1e9;
}

void BM_Call(benchmark::State& state) {
  const int64_t rows = state.range(0), cols = state.range(1);
  std::vector<Tensor> tensors;
  tensors.push_back(makeTensor("m", rows, cols, 1));
  tensors.back().inPlace = state.range(3) != 0;
  Bench bench(int(state.range(2)), std::move(tensors));
  if (!bench.step()) {  // the first call draws Q and sizes the buffers: not timed
    state.SkipWithError(bench.error());
    return;
  }
  for (double& s : bench.roundSeconds) s = 0;
  for (auto _ : state)
    if (!bench.step()) {
      state.SkipWithError(bench.error());
      break;
    }
  report(state, bench, double(rows * cols));
}

void BM_DigitsSet(benchmark::State& state) {
  std::vector<Tensor> tensors;
  tensors.push_back(makeTensor("fc3.bias", 10, 0, 6));
  tensors.push_back(makeTensor("fc3.weight", 10, 1024, 5));
  tensors.push_back(makeTensor("fc2.bias", 1024, 0, 4));
  tensors.push_back(makeTensor("fc2.weight", 1024, 1024, 3));
  tensors.push_back(makeTensor("fc1.bias", 1024, 0, 2));
  tensors.push_back(makeTensor("fc1.weight", 1024, 64, 1));
  for (Tensor& t : tensors) t.inPlace = true;
  Bench bench(int(state.range(0)), std::move(tensors));
  if (!bench.step()) {
    state.SkipWithError(bench.error());
    return;
  }
  for (double& s : bench.roundSeconds) s = 0;
  for (auto _ : state)
    if (!bench.step()) {
      state.SkipWithError(bench.error());
      break;
    }
  report(state, bench, 10 * 1024 + 1024 * 1024 + 1024 * 64 + 10 + 1024 + 1024);
}

}  // namespace

BENCHMARK(BM_Call)->ArgNames({"rows", "cols", "rank", "in_place"})->Args({1024, 1024, 4, 0})->Args({1024, 1024, 4, 1})
    ->Args({1024, 1024, 1, 0})
    ->Args({1024, 1024, 8, 0})->Args({4096, 1024, 4, 0})->Unit(benchmark::kMillisecond);
BENCHMARK(BM_DigitsSet)->ArgName("rank")->Arg(4)->Unit(benchmark::kMillisecond);

BENCHMARK_MAIN();
