// bench_powersgd: one PowerSGD step on the GPU (compressors/powersgd/powersgd.cu)
// over ResNet-50's gradients: its 54 weight matrices ([out, in*kh*kw]; the fc
// layer [1000, 2048]) and its 107 1-D parameters as one dense vector of 54,120
// elements, f32, 25,557,032 parameters in all. One rank: the phases without
// the allreduces between them (those are the transport's, timed elsewhere).
//
// Prints, per rank r in {1, 4, 16}, one line per phase and one for the step:
//   kernel <name> bytes <B> time_us <t> GBps <g>
// with B = the f32 gradient bytes the step compresses (102 MB) and
// g = B / t, the rate at which the step digests gradients. Exits 77 (skip)
// without a CUDA device.
#include <cuda_runtime.h>

#include <cstdio>
#include <string>
#include <vector>

#include "compressors/powersgd/powersgd_cuda.h"
#include "compressors/powersgd/powersgd_engine.h"
#include "compressors/powersgd/powersgd_math.h"
#include "gpu/cuda/device.h"

namespace {

using namespace shoal::powersgd;
namespace gpu = shoal::powersgd::cuda;

struct MatrixShape {
  size_t rows, cols;
  int copies;
};

// torchvision resnet50's conv and fc weights, grouped by shape.
const MatrixShape kResNet50Matrices[] = {
    {64, 147, 1},   {64, 64, 1},    {64, 256, 2},    {64, 576, 3},    {256, 64, 4},   {128, 256, 1},
    {128, 512, 3},  {128, 1152, 4}, {512, 128, 4},   {512, 256, 1},   {256, 512, 1},  {256, 1024, 5},
    {256, 2304, 6}, {1024, 256, 6}, {1024, 512, 1},  {512, 1024, 1},  {512, 2048, 2}, {512, 4608, 3},
    {2048, 512, 3}, {2048, 1024, 1}, {1000, 2048, 1},
};
constexpr size_t kDenseElements = 54120;  // the 107 batch-norm and bias vectors
constexpr int kWarmup = 3, kSteps = 20;

bool ok(cudaError_t status, const char* what) {
  if (status == cudaSuccess) return true;
  std::fprintf(stderr, "bench_powersgd: %s: %s\n", what, cudaGetErrorString(status));
  return false;
}

bool ok(const std::string& error) {
  if (error.empty()) return true;
  std::fprintf(stderr, "bench_powersgd: %s\n", error.c_str());
  return false;
}

void report(const std::string& name, size_t bytes, double microseconds) {
  std::printf("kernel %s bytes %zu time_us %.1f GBps %.2f\n", name.c_str(), bytes, microseconds,
              bytes / (microseconds * 1e3));
}

bool benchRank(int rank, void* stream) {
  Options options;
  options.rank = rank;
  std::vector<Shape> shapes;
  for (const MatrixShape& m : kResNet50Matrices)
    for (int c = 0; c < m.copies; ++c) shapes.push_back(shapeOf(m.rows, m.cols, rank, options.minCompressionRate, false));
  shapes.push_back(shapeOf(kDenseElements, 1, rank, options.minCompressionRate, true));
  const Layout layout = makeLayout(shapes);
  const int count = static_cast<int>(shapes.size());

  std::vector<MatrixState> states(count);
  std::vector<MatrixState*> statePointers;
  std::vector<shoal_dtype_t> dtypes(count, SHOAL_F32);
  std::vector<const void*> inputs(count);
  std::vector<void*> outputs(count);
  std::vector<uint64_t> keys;
  size_t bytes = 0;
  bool good = true;
  for (int t = 0; t < count && good; ++t) {
    checkState(states[t], shapes[t], SHOAL_F32);
    good = ok(gpu::upload(states[t], 0));
    statePointers.push_back(&states[t]);
    keys.push_back(nameHash(("matrix" + std::to_string(t)).c_str()));
    const size_t elems = shapes[t].count;
    bytes += elems * sizeof(float);
    std::vector<float> host(elems);
    for (size_t i = 0; i < elems; ++i) host[i] = uniformAt(1, t, 0, i);
    void* in = nullptr;
    void* out = nullptr;
    good = good && ok(cudaMalloc(&in, elems * sizeof(float)), "cudaMalloc") &&
           ok(cudaMalloc(&out, elems * sizeof(float)), "cudaMalloc") &&
           ok(cudaMemcpy(in, host.data(), elems * sizeof(float), cudaMemcpyHostToDevice), "cudaMemcpy");
    inputs[t] = in;
    outputs[t] = out;
  }
  const StepIo io{count, dtypes.data(), inputs.data(), outputs.data(), statePointers.data(), keys.data()};
  gpu::Context* context = gpu::createContext();
  gpu::StepBuffers buffers;
  cudaEvent_t marks[4];
  for (cudaEvent_t& mark : marks) good = good && ok(cudaEventCreate(&mark), "cudaEventCreate");
  good = good && ok(gpu::allocateStep(layout, 0, stream, &buffers));
  double phaseUs[3] = {0, 0, 0};
  for (int step = 0; step < kWarmup + kSteps && good; ++step) {
    size_t pCount = 0, qCount = 0;
    const auto s = static_cast<cudaStream_t>(stream);
    good = ok(cudaEventRecord(marks[0], s), "cudaEventRecord") &&
           ok(gpu::phaseP(*context, options, layout, false, io, buffers, 0, stream, &pCount)) &&
           ok(cudaEventRecord(marks[1], s), "cudaEventRecord") &&
           ok(gpu::phaseQ(*context, layout, false, buffers, 0, stream, &qCount)) &&
           ok(cudaEventRecord(marks[2], s), "cudaEventRecord") &&
           ok(gpu::finishStep(options, layout, false, io, buffers, 1, SHOAL_AVG, 0, stream)) &&
           ok(cudaEventRecord(marks[3], s), "cudaEventRecord") && ok(cudaEventSynchronize(marks[3]), "sync");
    if (!good || step < kWarmup) continue;
    for (int phase = 0; phase < 3; ++phase) {
      float ms = 0;
      good = good && ok(cudaEventElapsedTime(&ms, marks[phase], marks[phase + 1]), "cudaEventElapsedTime");
      phaseUs[phase] += ms * 1e3 / kSteps;
    }
  }
  if (good) {
    const std::string suffix = "_r" + std::to_string(rank);
    report("powersgd_phase_p" + suffix, bytes, phaseUs[0]);
    report("powersgd_phase_q" + suffix, bytes, phaseUs[1]);
    report("powersgd_finish" + suffix, bytes, phaseUs[2]);
    report("powersgd_step" + suffix, bytes, phaseUs[0] + phaseUs[1] + phaseUs[2]);
  }
  gpu::freeStep(&buffers, 0, stream);
  cudaStreamSynchronize(static_cast<cudaStream_t>(stream));
  for (cudaEvent_t mark : marks) cudaEventDestroy(mark);
  gpu::destroyContext(context);
  for (int t = 0; t < count; ++t) {
    gpu::release(states[t]);
    cudaFree(const_cast<void*>(inputs[t]));
    cudaFree(outputs[t]);
  }
  return good;
}

}  // namespace

int main() {
  std::string why;
  if (shoal::cuda::deviceCount(&why) == 0) {
    std::fprintf(stderr, "bench_powersgd: no CUDA device (%s); skipped\n", why.c_str());
    return 77;
  }
  cudaStream_t stream = nullptr;
  if (!ok(cudaStreamCreate(&stream), "cudaStreamCreate")) return 1;
  bool good = true;
  for (int rank : {1, 4, 16}) good = benchRank(rank, stream) && good;
  cudaStreamDestroy(stream);
  return good ? 0 : 1;
}
