// The powersgd step on CUDA tensors (see powersgd_cuda.h).
#include <cublas_v2.h>
#include <cuda_runtime.h>

#include <algorithm>
#include <cstring>
#include <map>
#include <string>

#include "core/numeric/element_ops.h"
#include "core/numeric/dtype.h"
#include "compressors/powersgd/powersgd_cuda.h"
#include "compressors/powersgd/powersgd_math.h"

namespace shoal::powersgd::cuda {

class Context {
 public:
  ~Context() {
    for (auto& [device, handle] : handles_) {
      int previous = 0;
      cudaGetDevice(&previous);
      cudaSetDevice(device);
      cublasDestroy(handle);
      cudaSetDevice(previous);
    }
  }
  // The device's handle, bound to stream; nullptr with *error on failure.
  cublasHandle_t handle(int device, void* stream, std::string* error) {
    auto found = handles_.find(device);
    if (found == handles_.end()) {
      cublasHandle_t created = nullptr;
      cublasStatus_t status = cublasCreate(&created);
      if (status != CUBLAS_STATUS_SUCCESS) {
        *error = std::string("powersgd (CUDA): cublasCreate: ") + cublasGetStatusString(status);
        return nullptr;
      }
      found = handles_.emplace(device, created).first;
    }
    cublasStatus_t status = cublasSetStream(found->second, static_cast<cudaStream_t>(stream));
    if (status != CUBLAS_STATUS_SUCCESS) {
      *error = std::string("powersgd (CUDA): cublasSetStream: ") + cublasGetStatusString(status);
      return nullptr;
    }
    return found->second;
  }

 private:
  std::map<int, cublasHandle_t> handles_;
};

Context* createContext() { return new Context; }
void destroyContext(Context* context) { delete context; }

namespace {

using ops::BFloat16;
using ops::Half;
using ops::narrow;
using ops::widen;

constexpr int kThreads = 256;
constexpr unsigned kMaxBlocks = 4096;

std::string check(cudaError_t status, const char* what) {
  if (status == cudaSuccess) return "";
  return std::string("powersgd (CUDA): ") + what + ": " + cudaGetErrorString(status);
}

std::string check(cublasStatus_t status, const char* what) {
  if (status == CUBLAS_STATUS_SUCCESS) return "";
  return std::string("powersgd (CUDA): ") + what + ": " + cublasGetStatusString(status);
}

// Makes `device` current for the scope.
class DeviceScope {
 public:
  explicit DeviceScope(int device) {
    cudaGetDevice(&previous_);
    status_ = cudaSetDevice(device);
  }
  ~DeviceScope() { cudaSetDevice(previous_); }
  std::string error() const { return check(status_, "cudaSetDevice"); }

 private:
  int previous_ = 0;
  cudaError_t status_ = cudaSuccess;
};

unsigned blocksFor(size_t count) {
  return static_cast<unsigned>(std::max<size_t>(1, std::min<size_t>((count + kThreads - 1) / kThreads, kMaxBlocks)));
}

cudaStream_t asStream(void* stream) { return static_cast<cudaStream_t>(stream); }

// ---- elementwise kernels ---------------------------------------------------------------

// dst = g + e (e may be null: dst = g), widened to f32.
template <typename T>
__global__ void gatherKernel(const T* g, const T* e, float* dst, size_t count) {
  for (size_t i = blockIdx.x * size_t(blockDim.x) + threadIdx.x; i < count; i += size_t(gridDim.x) * blockDim.x)
    dst[i] = e ? __fadd_rn(widen(g[i]), widen(e[i])) : widen(g[i]);
}

// out = sum (/ n when average), narrowed to T.
template <typename T>
__global__ void denseOutKernel(const float* sum, T* out, size_t count, int average, float n) {
  for (size_t i = blockIdx.x * size_t(blockDim.x) + threadIdx.x; i < count; i += size_t(gridDim.x) * blockDim.x)
    out[i] = narrow<T>(average ? __fdiv_rn(sum[i], n) : sum[i]);
}

__global__ void divideKernel(const float* sum, float* out, size_t count, float n) {
  for (size_t i = blockIdx.x * size_t(blockDim.x) + threadIdx.x; i < count; i += size_t(gridDim.x) * blockDim.x)
    out[i] = __fdiv_rn(sum[i], n);
}

// A = P Qᵀ per element, k ascending without FMA contraction (the CPU's order);
// error = M - A (error may be null), out = A or n A.
template <typename T>
__global__ void reconstructKernel(const float* p, const float* q, const float* m, T* out, T* error, size_t rows,
                                  size_t cols, int r, int average, float n) {
  const size_t total = rows * cols;
  for (size_t index = blockIdx.x * size_t(blockDim.x) + threadIdx.x; index < total;
       index += size_t(gridDim.x) * blockDim.x) {
    const size_t i = index / cols, j = index % cols;
    float a = 0.0f;
    for (int k = 0; k < r; ++k) a = __fadd_rn(a, __fmul_rn(p[i * r + k], q[j * r + k]));
    if (error) error[index] = narrow<T>(__fsub_rn(m[index], a));
    out[index] = narrow<T>(average ? a : __fmul_rn(a, n));
  }
}

// ---- Gram-Schmidt, one block per matrix ---------------------------------------------------

__device__ double blockSum(double value, double* shared) {
  shared[threadIdx.x] = value;
  __syncthreads();
  for (int stride = blockDim.x / 2; stride > 0; stride >>= 1) {
    if (threadIdx.x < stride) shared[threadIdx.x] += shared[threadIdx.x + stride];
    __syncthreads();
  }
  const double total = shared[0];
  __syncthreads();
  return total;
}

__device__ double columnDotBlock(const float* f, size_t rows, int r, int a, int b, double* shared) {
  double sum = 0;
  for (size_t i = threadIdx.x; i < rows; i += blockDim.x) sum += double(f[i * r + a]) * double(f[i * r + b]);
  return blockSum(sum, shared);
}

__device__ void drawColumn(float* f, size_t rows, int r, int c, uint64_t seed, uint64_t key, uint64_t generation) {
  for (size_t i = threadIdx.x; i < rows; i += blockDim.x) f[i * r + c] = uniformAt(seed, key, generation, i);
  __syncthreads();
}

__device__ void zeroColumn(float* f, size_t rows, int r, int c) {
  for (size_t i = threadIdx.x; i < rows; i += blockDim.x) f[i * r + c] = 0.0f;
  __syncthreads();
}

// orthogonalizeColumn of powersgd_math.h with block-wide dot products.
__device__ int orthogonalizeColumnBlock(float* f, size_t rows, int r, int c, double* shared) {
  const double before = sqrt(columnDotBlock(f, rows, r, c, c, shared));
  if (!keepColumn(before, 0.0)) {
    zeroColumn(f, rows, r, c);
    return 0;
  }
  for (int pass = 0; pass < 2; ++pass)
    for (int j = 0; j < c; ++j) {
      const double coefficient = columnDotBlock(f, rows, r, j, c, shared);
      if (coefficient == 0) continue;
      const float k = static_cast<float>(coefficient);
      for (size_t i = threadIdx.x; i < rows; i += blockDim.x)
        f[i * r + c] = __fsub_rn(f[i * r + c], __fmul_rn(k, f[i * r + j]));
      __syncthreads();
    }
  const double norm = sqrt(columnDotBlock(f, rows, r, c, c, shared));
  if (!keepColumn(norm, before)) {
    zeroColumn(f, rows, r, c);
    return 0;
  }
  const float inverse = static_cast<float>(1.0 / norm);
  for (size_t i = threadIdx.x; i < rows; i += blockDim.x) f[i * r + c] = __fmul_rn(f[i * r + c], inverse);
  __syncthreads();
  return 1;
}

// The CPU's prepareQ: draw every column on the first step, then orthonormalize
// column by column, redrawing a zeroed column (up to 4 times) from the next
// generation. *generation is the draw count, read and advanced here.
__global__ void prepareQKernel(float* q, size_t cols, int r, uint64_t seed, uint64_t key, uint64_t* generation,
                               int drawAll) {
  __shared__ double shared[kThreads];
  __shared__ uint64_t next;
  if (threadIdx.x == 0) next = *generation;
  __syncthreads();
  const uint64_t first = next;
  if (drawAll) {
    for (int c = 0; c < r; ++c) drawColumn(q, cols, r, c, seed, key, first + c);
    if (threadIdx.x == 0) next = first + r;
    __syncthreads();
  }
  for (int c = 0; c < r; ++c)
    for (int attempt = 0; attempt < 4 && !orthogonalizeColumnBlock(q, cols, r, c, shared); ++attempt) {
      const uint64_t g = next;
      __syncthreads();
      if (threadIdx.x == 0) next = g + 1;
      drawColumn(q, cols, r, c, seed, key, g);
    }
  if (threadIdx.x == 0) *generation = next;
}

// Orthonormalizes blockIdx.x-th of the group's adjacent [rows x r] blocks.
__global__ void orthogonalizeKernel(float* first, size_t rows, int r) {
  __shared__ double shared[kThreads];
  float* f = first + blockIdx.x * rows * size_t(r);
  for (int c = 0; c < r; ++c) orthogonalizeColumnBlock(f, rows, r, c, shared);
}

__global__ void drawKernel(float* q, size_t cols, int r, uint64_t seed, uint64_t key, uint64_t firstGeneration) {
  for (int c = 0; c < r; ++c) drawColumn(q, cols, r, c, seed, key, firstGeneration + c);
}

// ---- dtype dispatch ---------------------------------------------------------------------

template <typename Body>
void withType(shoal_dtype_t dtype, Body&& body) {
  switch (dtype) {
    case SHOAL_F16: body(Half{}); break;
    case SHOAL_BF16: body(BFloat16{}); break;
    default: body(float{}); break;
  }
}

void launchGather(shoal_dtype_t dtype, const void* g, const void* e, float* dst, size_t count, cudaStream_t stream) {
  if (count == 0) return;
  withType(dtype, [&](auto type) {
    using T = decltype(type);
    gatherKernel<T><<<blocksFor(count), kThreads, 0, stream>>>(static_cast<const T*>(g), static_cast<const T*>(e),
                                                               dst, count);
  });
}

void launchDenseOut(shoal_dtype_t dtype, const float* sum, void* out, size_t count, bool average, float n,
                    cudaStream_t stream) {
  if (count == 0) return;
  withType(dtype, [&](auto type) {
    using T = decltype(type);
    denseOutKernel<T><<<blocksFor(count), kThreads, 0, stream>>>(sum, static_cast<T*>(out), count, average, n);
  });
}

}  // namespace

// ---- memory and state ---------------------------------------------------------------------

std::string allocateStep(const Layout& layout, int device, void* stream, StepBuffers* buffers) {
  DeviceScope scope(device);
  if (std::string error = scope.error(); !error.empty()) return error;
  *buffers = StepBuffers{};
  auto grab = [&](float** out, size_t elems) {
    if (elems == 0) return cudaSuccess;
    return cudaMallocAsync(reinterpret_cast<void**>(out), elems * sizeof(float), asStream(stream));
  };
  if (std::string error = check(grab(&buffers->p, layout.pBufferElems()), "cudaMallocAsync (P buffer)"); !error.empty())
    return error;
  if (std::string error = check(grab(&buffers->q, layout.qElems), "cudaMallocAsync (Q buffer)"); !error.empty())
    return error;
  return check(grab(&buffers->m, layout.mElems), "cudaMallocAsync (M workspace)");
}

void freeStep(StepBuffers* buffers, int device, void* stream) {
  DeviceScope scope(device);
  for (float* buffer : {buffers->p, buffers->q, buffers->m})
    if (buffer) cudaFreeAsync(buffer, asStream(stream));
  *buffers = StepBuffers{};
}

std::string allocateFloats(size_t elems, int device, void* stream, float** buffer) {
  *buffer = nullptr;
  if (elems == 0) return "";
  DeviceScope scope(device);
  if (std::string error = scope.error(); !error.empty()) return error;
  return check(cudaMallocAsync(reinterpret_cast<void**>(buffer), elems * sizeof(float), asStream(stream)),
               "cudaMallocAsync");
}

void freeFloats(float* buffer, int device, void* stream) {
  if (buffer == nullptr) return;
  DeviceScope scope(device);
  cudaFreeAsync(buffer, asStream(stream));
}

std::string upload(MatrixState& state, int device) {
  if (state.onDevice()) {
    if (state.device.device == device) return "";
    return "powersgd (CUDA): the tensor's state lives on device " + std::to_string(state.device.device) +
           " and the tensor on device " + std::to_string(device) + "; a name must stay on one device";
  }
  DeviceScope scope(device);
  if (std::string error = scope.error(); !error.empty()) return error;
  DeviceMatrix copy;
  copy.device = device;
  const size_t errorBytes = state.error.size(), qBytes = state.q.size() * sizeof(float);
  std::string error = check(cudaMalloc(&copy.error, std::max<size_t>(errorBytes, 1)), "cudaMalloc (error vector)");
  if (error.empty()) error = check(cudaMalloc(reinterpret_cast<void**>(&copy.q), std::max<size_t>(qBytes, 1)), "cudaMalloc (Q)");
  if (error.empty()) error = check(cudaMalloc(reinterpret_cast<void**>(&copy.generation), sizeof(uint64_t)), "cudaMalloc");
  if (error.empty() && errorBytes)
    error = check(cudaMemcpy(copy.error, state.error.data(), errorBytes, cudaMemcpyHostToDevice), "cudaMemcpy (error)");
  if (error.empty() && qBytes)
    error = check(cudaMemcpy(copy.q, state.q.data(), qBytes, cudaMemcpyHostToDevice), "cudaMemcpy (Q)");
  if (error.empty())
    error = check(cudaMemcpy(copy.generation, &state.generation, sizeof(uint64_t), cudaMemcpyHostToDevice),
                  "cudaMemcpy (draw count)");
  if (!error.empty()) {
    cudaFree(copy.error);
    cudaFree(copy.q);
    cudaFree(copy.generation);
    return error;
  }
  state.device = copy;
  state.error = {};
  state.q = {};
  return "";
}

std::string download(const MatrixState& state, MatrixState* host) {
  *host = state;
  host->device = DeviceMatrix{};
  if (!state.onDevice()) return "";
  DeviceScope scope(state.device.device);
  if (std::string error = scope.error(); !error.empty()) return error;
  if (std::string error = check(cudaDeviceSynchronize(), "cudaDeviceSynchronize"); !error.empty()) return error;
  host->error.resize(state.count * dtypeSize(state.dtype));
  host->q.resize(state.cols * state.r);
  std::string error;
  if (!host->error.empty())
    error = check(cudaMemcpy(host->error.data(), state.device.error, host->error.size(), cudaMemcpyDeviceToHost),
                  "cudaMemcpy (error)");
  if (error.empty() && !host->q.empty())
    error = check(cudaMemcpy(host->q.data(), state.device.q, host->q.size() * sizeof(float), cudaMemcpyDeviceToHost),
                  "cudaMemcpy (Q)");
  if (error.empty())
    error = check(cudaMemcpy(&host->generation, state.device.generation, sizeof(uint64_t), cudaMemcpyDeviceToHost),
                  "cudaMemcpy (draw count)");
  return error;
}

void release(MatrixState& state) {
  if (!state.onDevice()) return;
  DeviceScope scope(state.device.device);
  cudaFree(state.device.error);
  cudaFree(state.device.q);
  cudaFree(state.device.generation);
  state.device = DeviceMatrix{};
}

// ---- the phases ---------------------------------------------------------------------

std::string phaseP(Context& context, const Options& options, const Layout& layout, bool plain, const StepIo& io,
                   const StepBuffers& buffers, int device, void* streamPointer, size_t* count) {
  DeviceScope scope(device);
  if (std::string error = scope.error(); !error.empty()) return error;
  const cudaStream_t stream = asStream(streamPointer);
  *count = 0;
  if (plain) {
    for (int t = 0; t < io.num; ++t)
      launchGather(io.dtypes[t], io.inputs[t], nullptr, buffers.p + layout.entries[t].plainOffset,
                   layout.entries[t].shape.count, stream);
    *count = layout.plainElems;
    return check(cudaGetLastError(), "a gather kernel");
  }
  for (int t = 0; t < io.num; ++t) {
    const Entry& entry = layout.entries[t];
    const void* e = options.ef ? io.states[t]->device.error : nullptr;
    float* dst = entry.shape.r ? buffers.m + entry.mOffset : buffers.p + entry.pOffset;
    launchGather(io.dtypes[t], io.inputs[t], e, dst, entry.shape.count, stream);
  }
  for (const Group& group : layout.groups)
    for (int t : group.members) {
      MatrixState& state = *io.states[t];
      const Entry& entry = layout.entries[t];
      prepareQKernel<<<1, kThreads, 0, stream>>>(state.device.q, group.cols, group.r, options.seed, io.keys[t],
                                                 state.device.generation, state.qValid ? 0 : 1);
      state.qValid = true;
      const std::string error =
          check(cudaMemcpyAsync(buffers.q + entry.qOffset, state.device.q, group.cols * group.r * sizeof(float),
                                cudaMemcpyDeviceToDevice, stream),
                "cudaMemcpyAsync (Q into the Q buffer)");
      if (!error.empty()) return error;
    }
  if (std::string error = check(cudaGetLastError(), "a PowerSGD kernel"); !error.empty()) return error;
  std::string error;
  cublasHandle_t handle = layout.groups.empty() ? nullptr : context.handle(device, streamPointer, &error);
  if (!layout.groups.empty() && handle == nullptr) return error;
  const float one = 1.0f, zero = 0.0f;
  for (const Group& group : layout.groups) {
    const Entry& first = layout.entries[group.members.front()];
    const int rows = static_cast<int>(group.rows), cols = static_cast<int>(group.cols), r = group.r;
    // Row-major P [rows x r] = M [rows x cols] Q [cols x r], as column-major Pᵀ = Qᵀ Mᵀ.
    error = check(cublasSgemmStridedBatched(handle, CUBLAS_OP_N, CUBLAS_OP_N, r, rows, cols, &one,
                                            buffers.q + first.qOffset, r, static_cast<long long>(cols) * r,
                                            buffers.m + first.mOffset, cols, static_cast<long long>(rows) * cols,
                                            &zero, buffers.p + first.pOffset, r, static_cast<long long>(rows) * r,
                                            static_cast<int>(group.members.size())),
                  "cublasSgemmStridedBatched (P = M Q)");
    if (!error.empty()) return error;
  }
  *count = layout.pElems + layout.denseElems;
  return "";
}

std::string phaseQ(Context& context, const Layout& layout, bool plain, const StepBuffers& buffers, int device,
                   void* streamPointer, size_t* count) {
  *count = 0;
  if (plain || layout.compressed == 0) return "";
  DeviceScope scope(device);
  if (std::string error = scope.error(); !error.empty()) return error;
  const cudaStream_t stream = asStream(streamPointer);
  std::string error;
  cublasHandle_t handle = context.handle(device, streamPointer, &error);
  if (handle == nullptr) return error;
  const float one = 1.0f, zero = 0.0f;
  for (const Group& group : layout.groups) {
    const Entry& first = layout.entries[group.members.front()];
    const int rows = static_cast<int>(group.rows), cols = static_cast<int>(group.cols), r = group.r;
    orthogonalizeKernel<<<static_cast<unsigned>(group.members.size()), kThreads, 0, stream>>>(
        buffers.p + first.pOffset, group.rows, r);
    if ((error = check(cudaGetLastError(), "the orthogonalization kernel")), !error.empty()) return error;
    // Row-major Q_w [cols x r] = Mᵀ P, as column-major Q_wᵀ [r x cols] = Pᵀ M.
    error = check(cublasSgemmStridedBatched(handle, CUBLAS_OP_N, CUBLAS_OP_T, r, cols, rows, &one,
                                            buffers.p + first.pOffset, r, static_cast<long long>(rows) * r,
                                            buffers.m + first.mOffset, cols, static_cast<long long>(rows) * cols,
                                            &zero, buffers.q + first.qOffset, r, static_cast<long long>(cols) * r,
                                            static_cast<int>(group.members.size())),
                  "cublasSgemmStridedBatched (Q = Mᵀ P)");
    if (!error.empty()) return error;
  }
  *count = layout.qElems;
  return "";
}

std::string finishStep(const Options& options, const Layout& layout, bool plain, const StepIo& io,
                       const StepBuffers& buffers, int worldSize, shoal_op_t op, int device, void* streamPointer) {
  DeviceScope scope(device);
  if (std::string error = scope.error(); !error.empty()) return error;
  const cudaStream_t stream = asStream(streamPointer);
  const float n = static_cast<float>(worldSize);
  const bool average = op == SHOAL_AVG;
  for (int t = 0; t < io.num; ++t) {
    const Entry& entry = layout.entries[t];
    if (plain) {
      launchDenseOut(io.dtypes[t], buffers.p + entry.plainOffset, io.outputs[t], entry.shape.count, average, n, stream);
      continue;
    }
    if (entry.shape.r) continue;
    launchDenseOut(io.dtypes[t], buffers.p + entry.pOffset, io.outputs[t], entry.shape.count, average, n, stream);
    if (options.ef && entry.shape.count) {
      const std::string error = check(
          cudaMemsetAsync(io.states[t]->device.error, 0, entry.shape.count * dtypeSize(io.dtypes[t]), stream),
          "cudaMemsetAsync (error)");
      if (!error.empty()) return error;
    }
  }
  if (!plain)
    for (const Group& group : layout.groups)
      for (int t : group.members) {
        const Entry& entry = layout.entries[t];
        MatrixState& state = *io.states[t];
        const size_t qCount = group.cols * group.r;
        divideKernel<<<blocksFor(qCount), kThreads, 0, stream>>>(buffers.q + entry.qOffset, state.device.q, qCount, n);
        withType(io.dtypes[t], [&](auto type) {
          using T = decltype(type);
          reconstructKernel<T><<<blocksFor(entry.shape.count), kThreads, 0, stream>>>(
              buffers.p + entry.pOffset, state.device.q, buffers.m + entry.mOffset, static_cast<T*>(io.outputs[t]),
              options.ef ? static_cast<T*>(state.device.error) : nullptr, group.rows, group.cols, group.r, average, n);
        });
      }
  return check(cudaGetLastError(), "a PowerSGD finish kernel");
}

std::string drawQ(float* q, size_t cols, int r, uint64_t seed, uint64_t key, uint64_t firstGeneration, int device,
                  void* stream) {
  DeviceScope scope(device);
  if (std::string error = scope.error(); !error.empty()) return error;
  drawKernel<<<1, kThreads, 0, asStream(stream)>>>(q, cols, r, seed, key, firstGeneration);
  return check(cudaGetLastError(), "the draw kernel");
}

}  // namespace shoal::powersgd::cuda
