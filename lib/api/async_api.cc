// C entry points of the async runtime (lib/runtime): submission checks the
// arguments locally and enqueues; test/wait/free work on the request handle.
#include <algorithm>
#include <cstring>
#include <memory>
#include <string>

#include "api/export.h"
#include "api/guard.h"
#include "api/versioned.h"
#include "plugin/driver.h"
#include "runtime/engine.h"
#include "api/checks.h"
#include "comm/communicator.h"
#include "collectives/common/reducer.h"
#include "core/config.h"
#include "runtime/engine.h"
#include "runtime/reduce_scatter.h"
#if SHOAL_WITH_CUDA
#include "gpu/cuda/stream_memory.h"
#endif


struct shoal_request {
  std::shared_ptr<shoal::runtime::Request> request;
  double timeoutS = 300;
  std::string error;  // a stable copy for shoal_request_error
};

using namespace shoal;
using runtime::Metadata;
using runtime::OpKind;

namespace {

shoal_comm& startedComm(shoal_comm_t comm, const char* call) {
  shoal_comm& c = usableComm(comm, call);
  c.engine->ensureStarted(call);
  return c;
}

void checkName(const char* call, const char* name) {
  if (name == nullptr || name[0] == '\0')
    fail(SHOAL_ERR_INVALID_ARGUMENT, "{}: name is NULL or empty; every async tensor needs a name that is the same on "
         "every rank", call);
  if (std::strncmp(name, "__shoal", 7) == 0)
    fail(SHOAL_ERR_INVALID_ARGUMENT, "{}: names starting with __shoal are reserved; rename '{}'", call, name);
}

// The memory kind of an async tensor. A CUDA build takes CUDA tensors too
// (runtime/cuda_requests.h: never fused, run through NCCL); a build without
// CUDA refuses them here, on the submitting rank.
shoal_memory_t checkMemory(const char* call, const char* what, const shoal_tensor_t& tensor) {
  int memory = 0;  // read as the int a C caller stored: a value outside the enum is UB to load as one
  static_assert(sizeof memory == sizeof tensor.memory);
  std::memcpy(&memory, &tensor.memory, sizeof memory);
#if SHOAL_WITH_CUDA
  if (memory == SHOAL_MEMORY_HOST || memory == SHOAL_MEMORY_CUDA) return static_cast<shoal_memory_t>(memory);
  fail(SHOAL_ERR_INVALID_ARGUMENT, "{}: {}->memory {} is not a shoal_memory_t; use SHOAL_MEMORY_HOST or "
       "SHOAL_MEMORY_CUDA", call, what, memory);
#else
  if (memory == SHOAL_MEMORY_HOST) return SHOAL_MEMORY_HOST;
  fail(SHOAL_ERR_UNSUPPORTED, "{}: {} is not host memory; the async runtime handles host tensors", call, what);
#endif
}

// Input and output of one request: one memory kind, and CUDA tensors on one device.
void checkSameMemory(const char* call, const shoal_tensor_t& input, const shoal_tensor_t& output) {
  if (input.memory != output.memory)
    fail(SHOAL_ERR_INVALID_ARGUMENT, "{}: input is {} but output {}; shoal does not copy between them: pass both in "
         "host memory or both in CUDA memory", call, runtime::memoryName(input.memory),
         runtime::memoryName(output.memory));
  if (input.memory == SHOAL_MEMORY_CUDA && input.device != output.device)
    fail(SHOAL_ERR_INVALID_ARGUMENT, "{}: input is on CUDA device {} but output on {}; put both on one device", call,
         input.device, output.device);
}

// The tensor's shape as metadata; checks dtype, memory, ndim, extents and data.
std::vector<int64_t> checkTensor(const char* call, const char* what, const shoal_tensor_t* tensor) {
  if (tensor == nullptr) fail(SHOAL_ERR_INVALID_ARGUMENT, "{}: {} is NULL", call, what);
  if (dtypeSize(tensor->dtype) == 0)
    fail(SHOAL_ERR_INVALID_ARGUMENT, "{}: {}->dtype {} is not a shoal_dtype_t; use SHOAL_F16 .. SHOAL_U64", call, what,
         static_cast<int>(tensor->dtype));
  checkMemory(call, what, *tensor);
  if (tensor->ndim < 0 || tensor->ndim > SHOAL_MAX_DIMS)
    fail(SHOAL_ERR_INVALID_ARGUMENT, "{}: {}->ndim {} is outside 0..{}", call, what, tensor->ndim, SHOAL_MAX_DIMS);
  const size_t elements = checkedTensorElements(call, what, *tensor);
  std::vector<int64_t> shape(tensor->shape, tensor->shape + tensor->ndim);
  if (elements > 0 && tensor->data == nullptr)
    fail(SHOAL_ERR_INVALID_ARGUMENT, "{}: {}->data is NULL but it holds {} elements", call, what, elements);
  return shape;
}

shoal_status_t submit(shoal_comm_t comm, const char* call, shoal_request_t* handle,
                      const std::function<std::shared_ptr<runtime::Request>(shoal_comm&)>& build) {
  return guarded(comm, [&] {
    if (handle == nullptr) fail(SHOAL_ERR_INVALID_ARGUMENT, "{}: request (the out-parameter) is NULL", call);
    *handle = nullptr;
    shoal_comm& c = usableComm(comm, call);
    std::shared_ptr<runtime::Request> request = build(c);
    c.engine->ensureStarted(call);
    auto wrapper = std::make_unique<shoal_request>();
    wrapper->request = request;
    wrapper->timeoutS = c.timeoutS;
    c.engine->submit(request, call);
    *handle = wrapper.release();
  });
}

}  // namespace

SHOAL_EXPORT shoal_status_t shoal_async_start(shoal_comm_t comm) {
  return guarded(comm, [&] { startedComm(comm, "shoal_async_start"); });
}

SHOAL_EXPORT shoal_status_t shoal_iallreduce(shoal_comm_t comm, const char* name, const shoal_tensor_t* input,
                                             const shoal_tensor_t* output, shoal_op_t op,
                                             const shoal_async_options_t* options, shoal_request_t* request) {
  const char* call = "shoal_iallreduce";
  return submit(comm, call, request, [&](shoal_comm& c) {
    checkName(call, name);
    auto r = std::make_shared<runtime::Request>();
    r->name = name;
    r->meta.kind = OpKind::Allreduce;
    r->meta.shape = checkTensor(call, "input", input);
    std::vector<int64_t> outShape = checkTensor(call, "output", output);
    checkSameMemory(call, *input, *output);
    r->meta.memory = input->memory;
    r->meta.dtype = input->dtype;
    r->meta.op = op;
    if (op < 0 || op >= SHOAL_OP_COUNT || !isValidDtypeOp(input->dtype, op))
      fail(SHOAL_ERR_INVALID_ARGUMENT, "{}: op {} is not valid on dtype {}; bitwise ops need an integer dtype", call,
           static_cast<int>(op), shoal_dtype_name(input->dtype));
    if (output->dtype != input->dtype)
      fail(SHOAL_ERR_INVALID_ARGUMENT, "{}: output dtype {} differs from input dtype {}", call,
           shoal_dtype_name(output->dtype), shoal_dtype_name(input->dtype));
    Metadata outMeta = r->meta;
    outMeta.shape = outShape;
    if (outMeta.elements() != r->meta.elements())
      fail(SHOAL_ERR_INVALID_ARGUMENT, "{}: input has {} elements but output {}; they must hold the same count", call,
           r->meta.elements(), outMeta.elements());
    const shoal_async_options_t resolved =
        readVersioned<shoal_async_options_t>(call, "options", options, SHOAL_ASYNC_OPTIONS_INIT);
    plugin::CompressorChoice choice =
        plugin::resolveCompressor(c.compressors->defaults, resolved.compressor, resolved.compressor_options,
                                  resolved.compress_min_bytes);
    r->meta.compressor = choice.name;
    r->meta.options = choice.options;
    r->meta.minBytes = choice.minBytes;
    r->input = *input;
    r->output = *output;
    return r;
  });
}

SHOAL_EXPORT shoal_status_t shoal_iallgather(shoal_comm_t comm, const char* name, const shoal_tensor_t* input,
                                             void* output, shoal_request_t* request) {
  const char* call = "shoal_iallgather";
  return submit(comm, call, request, [&](shoal_comm& c) {
    checkName(call, name);
    auto r = std::make_shared<runtime::Request>();
    r->name = name;
    r->meta.kind = OpKind::Allgather;
    r->meta.shape = checkTensor(call, "input", input);
    r->meta.memory = input->memory;  // output: memory of the same kind and device
    r->meta.dtype = input->dtype;
    if (output == nullptr && r->meta.bytes() > 0)
      fail(SHOAL_ERR_INVALID_ARGUMENT, "{}: output is NULL; pass room for {} x {} elements", call, c.size,
           r->meta.elements());
    r->input = *input;
    r->output = *input;
    r->output.data = output;
    return r;
  });
}

SHOAL_EXPORT shoal_status_t shoal_ibroadcast(shoal_comm_t comm, const char* name, const shoal_tensor_t* tensor,
                                             int root, shoal_request_t* request) {
  const char* call = "shoal_ibroadcast";
  return submit(comm, call, request, [&](shoal_comm& c) {
    checkName(call, name);
    checkRank(call, "root", root, c.size);
    auto r = std::make_shared<runtime::Request>();
    r->name = name;
    r->meta.kind = OpKind::Broadcast;
    r->meta.shape = checkTensor(call, "tensor", tensor);
    r->meta.memory = tensor->memory;
    r->meta.dtype = tensor->dtype;
    r->meta.root = root;
    r->input = *tensor;
    r->output = *tensor;
    return r;
  });
}

SHOAL_EXPORT shoal_status_t shoal_ireduce_scatter(shoal_comm_t comm, const char* name, const shoal_tensor_t* input,
                                                  const shoal_tensor_t* output, shoal_op_t op,
                                                  shoal_request_t* request) {
  const char* call = "shoal_ireduce_scatter";
  return submit(comm, call, request, [&](shoal_comm& c) {
    checkName(call, name);
    auto r = std::make_shared<runtime::Request>();
    r->name = name;
    r->meta.kind = OpKind::ReduceScatter;
    r->meta.shape = checkTensor(call, "input", input);
    checkTensor(call, "output", output);
    checkSameMemory(call, *input, *output);
    r->meta.memory = input->memory;  // CUDA (a CUDA build): runtime/cuda_requests.h
    checkDtypeOp(call, input->dtype, op);
    r->meta.dtype = input->dtype;
    r->meta.op = op;
    if (output->dtype != input->dtype)
      fail(SHOAL_ERR_INVALID_ARGUMENT, "{}: output dtype {} differs from input dtype {}", call,
           shoal_dtype_name(output->dtype), shoal_dtype_name(input->dtype));
    if (r->meta.shape.empty())
      fail(SHOAL_ERR_INVALID_ARGUMENT, "{}: input is 0-dimensional; pass a tensor with a first dimension (each rank "
           "receives its share of the reduced tensor's rows)", call);
    const size_t rows = static_cast<size_t>(r->meta.shape.front());
    const runtime::RowShare share = runtime::shareOf(rows, c.size, c.rank);
    const size_t row = runtime::rowElements(r->meta.shape);
    const size_t have = checkedTensorElements(call, "output", *output);
    if (have != share.rows * row)
      fail(SHOAL_ERR_INVALID_ARGUMENT, "{}: output holds {} elements, but rank {}'s share of input's {} rows over {} "
           "ranks is {} rows of {} elements ({} elements; rows / world size each, one more on the first rows % "
           "world size ranks)", call, have, c.rank, rows, c.size, share.rows, row, share.rows * row);
    r->input = *input;
    r->output = *output;
    return r;
  });
}

SHOAL_EXPORT shoal_status_t shoal_ialltoall(shoal_comm_t comm, const char* name, const shoal_tensor_t* input,
                                            const size_t* sendcounts, shoal_request_t* request) {
  const char* call = "shoal_ialltoall";
  return submit(comm, call, request, [&](shoal_comm& c) {
    checkName(call, name);
    auto r = std::make_shared<runtime::Request>();
    r->name = name;
    std::vector<int64_t> shape = checkTensor(call, "input", input);
    r->meta.memory = input->memory;  // CUDA: what arrives is device memory the request holds
    r->meta.dtype = input->dtype;
    const size_t elements = checkedTensorElements(call, "input", *input);
    if (sendcounts == nullptr) {
      // Even blocks: the shape is what every rank must agree on.
      r->meta.kind = OpKind::Alltoall;
      r->meta.shape = shape;
      if (elements % c.size != 0)
        fail(SHOAL_ERR_INVALID_ARGUMENT, "{}: input has {} elements, not a multiple of the world size {}; pass "
             "sendcounts for blocks of different sizes", call, elements, c.size);
      r->sendcounts.assign(c.size, elements / c.size);
    } else {
      // Per-peer counts differ between ranks: only the dtype is common (the shape stays empty).
      r->meta.kind = OpKind::Alltoallv;
      size_t total = 0;
      for (int p = 0; p < c.size; ++p) {
        if (sendcounts[p] > elements - std::min(total, elements))
          fail(SHOAL_ERR_INVALID_ARGUMENT, "{}: sendcounts[0..{}] add up to more than input's {} elements", call, p,
               elements);
        total += sendcounts[p];
      }
      if (total != elements)
        fail(SHOAL_ERR_INVALID_ARGUMENT, "{}: sendcounts add up to {} but input has {} elements; they must be equal",
             call, total, elements);
      r->sendcounts.assign(sendcounts, sendcounts + c.size);
    }
    r->input = *input;
    r->output = *input;
    return r;
  });
}

namespace {

// A completed alltoall request whose result may be read: `call` names the
// entry point in the refusals.
runtime::Request& completedAlltoall(shoal_request_t request, const char* call) {
  if (request == nullptr || !request->request)
    fail(SHOAL_ERR_INVALID_ARGUMENT, "{}: request is NULL; pass the handle shoal_ialltoall returned", call);
  runtime::Request& r = *request->request;
  if (r.meta.kind != OpKind::Alltoall && r.meta.kind != OpKind::Alltoallv)
    fail(SHOAL_ERR_INVALID_ARGUMENT, "{}: request '{}' is a {}, not an alltoall", call, r.name,
         runtime::opKindName(r.meta.kind));
  if (!r.done())
    fail(SHOAL_ERR_INVALID_ARGUMENT, "{}: request '{}' is still pending; wait for it first", call, r.name);
  if (r.status() != SHOAL_OK) fail(r.status(), "{}: request '{}' failed: {}", call, r.name, r.error());
  return r;
}

}  // namespace

SHOAL_EXPORT shoal_status_t shoal_request_alltoall_result(shoal_request_t request, const void** data, size_t* count,
                                                          size_t* recvcounts) {
  return guarded(nullptr, [&] {
    runtime::Request& r = completedAlltoall(request, "shoal_request_alltoall_result");
    if (data == nullptr || count == nullptr)
      fail(SHOAL_ERR_INVALID_ARGUMENT, "shoal_request_alltoall_result: data and count (out-parameters) must not be "
           "NULL");
    const size_t element = dtypeSize(r.meta.dtype);
    if (r.meta.memory == SHOAL_MEMORY_CUDA) {  // device memory on the input's device, freed with the request
      *count = r.receivedBytes / element;
      *data = r.deviceReceived.get();
    } else {
      *count = r.received.size() / element;
      *data = r.received.empty() ? nullptr : r.received.data();
    }
    if (recvcounts != nullptr) std::copy(r.recvcounts.begin(), r.recvcounts.end(), recvcounts);
  });
}

// Why a copy and not the pointer alone: a binding (shoal.torch) has no CUDA
// of its own to copy device memory with, and the device memory is freed with
// the request. The copy is ordered on the input's stream and waited for, so
// dst is ready for any stream and the request can be freed at once.
SHOAL_EXPORT shoal_status_t shoal_request_alltoall_copy(shoal_request_t request, void* dst, size_t capacity) {
  return guarded(nullptr, [&] {
    const char* call = "shoal_request_alltoall_copy";
    runtime::Request& r = completedAlltoall(request, call);
    const bool onCuda = r.meta.memory == SHOAL_MEMORY_CUDA;
    const size_t bytes = onCuda ? r.receivedBytes : r.received.size();
    if (capacity < bytes)
      fail(SHOAL_ERR_INVALID_ARGUMENT, "{}: dst holds {} bytes but request '{}' received {}; pass a buffer of at "
           "least that size", call, capacity, r.name, bytes);
    if (bytes == 0) return;
    if (dst == nullptr)
      fail(SHOAL_ERR_INVALID_ARGUMENT, "{}: dst is NULL but request '{}' received {} bytes", call, r.name, bytes);
    if (!onCuda) {
      std::memcpy(dst, r.received.data(), bytes);
      return;
    }
#if SHOAL_WITH_CUDA
    cuda::DeviceScope onDevice(r.input.device);
    const char* error = onDevice.error();
    if (error == nullptr) error = cuda::copyAsync(dst, r.deviceReceived.get(), bytes, r.input.stream);
    if (error == nullptr) error = cuda::synchronize(r.input.stream);
    if (error != nullptr)
      fail(SHOAL_ERR_SYSTEM, "{}: copying request '{}''s {} bytes from CUDA device {}: {}", call, r.name, bytes,
           r.input.device, error);
#else
    fail(SHOAL_ERR_INTERNAL, "{}: request '{}' holds CUDA memory in a build without CUDA", call, r.name);
#endif
  });
}

namespace {

shoal_request& checkRequest(shoal_request_t request, const char* call) {
  if (request == nullptr || !request->request)
    fail(SHOAL_ERR_INVALID_ARGUMENT, "{}: request is NULL; pass the handle a shoal_i* call returned", call);
  return *request;
}

// The completed request's status; its text becomes the thread's last error.
shoal_status_t completed(shoal_request& request) {
  shoal_status_t status = request.request->status();
  if (status != SHOAL_OK) {
    request.error = request.request->error();
    setLastError(nullptr, request.error);
  }
  return status;
}

}  // namespace

SHOAL_EXPORT shoal_status_t shoal_test(shoal_request_t request, int* done) {
  shoal_status_t status = guarded(nullptr, [&] {
    checkRequest(request, "shoal_test");
    if (done == nullptr) fail(SHOAL_ERR_INVALID_ARGUMENT, "shoal_test: done (the out-parameter) is NULL");
    *done = request->request->done() ? 1 : 0;
  });
  if (status != SHOAL_OK || *done == 0) return status;
  return completed(*request);
}

SHOAL_EXPORT shoal_status_t shoal_wait_all(shoal_request_t* requests, int count, double timeout_s) {
  shoal_status_t status = guarded(nullptr, [&] {
    if (count < 0 || (requests == nullptr && count > 0))
      fail(SHOAL_ERR_INVALID_ARGUMENT, "shoal_wait_all: requests is NULL or count {} is negative", count);
    for (int i = 0; i < count; ++i) checkRequest(requests[i], "shoal_wait_all");
    if (count == 0) return;
    const Deadline deadline = deadlineAfter(checkedTimeout("shoal_wait", "timeout_s", timeout_s, requests[0]->timeoutS));
    for (int i = 0; i < count; ++i)
      if (!requests[i]->request->waitUntil(deadline))
        fail(SHOAL_ERR_TIMEOUT,
             "shoal_wait_all: request {} ('{}') is still pending after the deadline; it stays pending (keep its "
             "buffers valid), wait again or look for a rank that did not submit it",
             i, requests[i]->request->name);
  });
  if (status != SHOAL_OK) return status;
  for (int i = 0; i < count; ++i) {
    shoal_status_t one = completed(*requests[i]);
    if (one != SHOAL_OK) return one;
  }
  return SHOAL_OK;
}

SHOAL_EXPORT shoal_status_t shoal_wait(shoal_request_t request, double timeout_s) {
  return shoal_wait_all(&request, 1, timeout_s);
}

SHOAL_EXPORT const char* shoal_request_error(shoal_request_t request) {
  if (request == nullptr || !request->request || !request->request->done()) return "";
  request->error = request->request->error();
  return request->error.c_str();
}

SHOAL_EXPORT shoal_status_t shoal_request_free(shoal_request_t request) {
  return guarded(nullptr, [&] {
    if (request == nullptr) return;
    if (request->request && !request->request->done())
      fail(SHOAL_ERR_INVALID_ARGUMENT, "shoal_request_free: request '{}' is still pending; wait for it first",
           request->request->name);
    delete request;
  });
}

SHOAL_EXPORT shoal_status_t shoal_async_stats(shoal_comm_t comm, shoal_async_stats_t* stats) {
  return guarded(comm, [&] {
    if (comm == nullptr) fail(SHOAL_ERR_INVALID_ARGUMENT, "shoal_async_stats: comm is NULL");
    runtime::EngineStats s = comm->engine ? comm->engine->stats() : runtime::EngineStats{};
    shoal_async_stats_t result = SHOAL_ASYNC_STATS_INIT;
    result.cycles = s.cycles;
    result.full_rounds = s.fullRounds;
    result.cache_hits = s.cacheHits;
    result.tensors = s.tensors;
    result.groups = s.groups;
    result.negotiation_us = s.negotiationUs;
    writeVersioned("shoal_async_stats", "stats", stats, result);
  });
}
