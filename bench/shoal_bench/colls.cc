#include "colls.h"

#include <algorithm>
#include <cmath>
#include <cstdio>
#include <cstring>
#include <string>
#include <vector>

#include "../bench_memory.h"

namespace bench {
namespace {

shoal_tensor_t tensorOf(const void *data, size_t count, const Ctx &x) {
  shoal_tensor_t t = shoal_tensor_1d(const_cast<void *>(data), count, x.dtype);
  t.memory = x.memory;
  t.device = x.device;
  return t;
}

bool onCuda(const Ctx &x) { return x.memory == SHOAL_MEMORY_CUDA; }

// A device-to-device copy inside a timed CUDA call (broadcast's and sendrecv's
// staging, below); its failure is this rank's, told here.
shoal_status_t deviceCopy(void *dst, const void *src, size_t bytes, const Ctx &x) {
  if (dst == src || bytes == 0) return SHOAL_OK;
  const std::string why = copyOnDevice(dst, src, bytes);
  if (why.empty()) return SHOAL_OK;
  fprintf(stderr, "shoal-bench: rank %d: --memory cuda: %s\n", x.rank, why.c_str());
  return SHOAL_ERR_SYSTEM;
}

// Scratch that in-place sendrecv stages its send side in: host memory, or
// device memory on the rank's device (allocated once at the largest size seen).
void *stagingFor(size_t bytes, const Ctx &x) {
  static thread_local std::vector<char> host;
  static thread_local void *device = nullptr;
  static thread_local size_t deviceBytes = 0;
  if (!onCuda(x)) {
    host.resize(bytes);
    return host.data();
  }
  if (bytes > deviceBytes) {
    deviceFree(device);
    device = nullptr, deviceBytes = 0;
    if (const std::string why = deviceAlloc(bytes, &device); !why.empty()) {
      fprintf(stderr, "shoal-bench: rank %d: --memory cuda: sendrecv's staging buffer: %s\n", x.rank, why.c_str());
      return nullptr;
    }
    deviceBytes = bytes;
  }
  return device;
}

// nccl-tests' sendrecv: to the right, from the left, in one group. shoal's send
// and receive buffers of one group must not overlap: in place stages the send
// (a copy inside the timed call). One rank has no peer: its exchange with
// itself is the copy. CUDA buffers go through shoal_sendrecv_many_tensor.
shoal_status_t sendRecvRing(shoal_comm_t comm, const void *send, void *recv, const Ctx &x) {
  const size_t bytes = x.c.paramCount * x.ts;
  if (x.nranks == 1) {
    if (onCuda(x)) return deviceCopy(recv, send, bytes, x);
    std::memmove(recv, send, bytes);
    return SHOAL_OK;
  }
  if (send == recv) {
    void *staged = stagingFor(bytes, x);
    if (staged == nullptr) return SHOAL_ERR_NO_MEMORY;
    if (onCuda(x)) {
      if (shoal_status_t s = deviceCopy(staged, send, bytes, x); s != SHOAL_OK) return s;
    } else {
      std::memcpy(staged, send, bytes);
    }
    send = staged;
  }
  const int left = (x.rank + x.nranks - 1) % x.nranks, right = (x.rank + 1) % x.nranks;
  if (onCuda(x)) {
    const shoal_p2p_tensor_t ops[2] = {{SHOAL_P2P_RECV, left, 0, tensorOf(recv, x.c.paramCount, x)},
                                       {SHOAL_P2P_SEND, right, 0, tensorOf(send, x.c.paramCount, x)}};
    return shoal_sendrecv_many_tensor(comm, ops, 2);
  }
  const shoal_p2p_t ops[2] = {{SHOAL_P2P_RECV, left, 0, recv, x.c.paramCount, x.dtype},
                              {SHOAL_P2P_SEND, right, 0, const_cast<void *>(send), x.c.paramCount, x.dtype}};
  return shoal_sendrecv_many(comm, ops, 2);
}

// CUDA broadcast is in place (shoal_broadcast_tensor): out of place, root first
// copies its send buffer into recv on the device, inside the timed call.
shoal_status_t broadcastOf(shoal_comm_t comm, const void *send, void *recv, const Ctx &x) {
  if (!onCuda(x)) return shoal_broadcast(comm, send, recv, x.c.paramCount, x.dtype, x.root);
  if (x.rank == x.root)
    if (shoal_status_t s = deviceCopy(recv, send, x.c.paramCount * x.ts, x); s != SHOAL_OK) return s;
  const shoal_tensor_t t = tensorOf(recv, x.c.paramCount, x);
  return shoal_broadcast_tensor(comm, &t, x.root);
}

// The rooted and exchange collectives: the raw-pointer call for host buffers,
// the tensor form (NCCL underneath) for CUDA buffers. in / out: elements of
// the send and recv tensors.
shoal_status_t alltoallOf(shoal_comm_t comm, const void *send, void *recv, const Ctx &x) {
  if (!onCuda(x)) return shoal_alltoall(comm, send, recv, x.c.paramCount, x.dtype);
  const shoal_tensor_t in = tensorOf(send, x.c.sendCount, x), out = tensorOf(recv, x.c.recvCount, x);
  return shoal_alltoall_tensor(comm, &in, &out);
}

shoal_status_t reduceScatterOf(shoal_comm_t comm, const void *send, void *recv, const Ctx &x) {
  if (!onCuda(x)) return shoal_reduce_scatter(comm, send, recv, x.c.paramCount, x.dtype, x.op);
  const shoal_tensor_t in = tensorOf(send, x.c.sendCount, x), out = tensorOf(recv, x.c.recvCount, x);
  return shoal_reduce_scatter_tensor(comm, &in, &out, x.op);
}

shoal_status_t reduceOf(shoal_comm_t comm, const void *send, void *recv, const Ctx &x) {
  if (!onCuda(x)) return shoal_reduce(comm, send, recv, x.c.paramCount, x.dtype, x.op, x.root);
  const shoal_tensor_t in = tensorOf(send, x.c.sendCount, x), out = tensorOf(recv, x.c.recvCount, x);
  return shoal_reduce_tensor(comm, &in, &out, x.op, x.root);
}

shoal_status_t gatherOf(shoal_comm_t comm, const void *send, void *recv, const Ctx &x) {
  if (!onCuda(x)) return shoal_gather(comm, send, recv, x.c.paramCount, x.dtype, x.root);
  const shoal_tensor_t in = tensorOf(send, x.c.sendCount, x), out = tensorOf(recv, x.c.recvCount, x);
  return shoal_gather_tensor(comm, &in, &out, x.root);
}

shoal_status_t scatterOf(shoal_comm_t comm, const void *send, void *recv, const Ctx &x) {
  if (!onCuda(x)) return shoal_scatter(comm, send, recv, x.c.paramCount, x.dtype, x.root);
  const shoal_tensor_t in = tensorOf(send, x.c.sendCount, x), out = tensorOf(recv, x.c.recvCount, x);
  return shoal_scatter_tensor(comm, &in, &out, x.root);
}

}  // namespace

const char *cudaRefusal(const CollTest &coll, shoal_op_t op) {
  const bool bitwise = op == SHOAL_BAND || op == SHOAL_BOR || op == SHOAL_BXOR;
  if (&coll == &kReduce && bitwise)
    return "reduce on CUDA memory is ncclReduce, which has no band, bor or bxor; use -o sum, avg, prod, min or max, "
           "or --memory host (allreduce runs the bitwise ops on CUDA memory)";
  if (&coll == &kReduceScatter && bitwise)
    return "reduce_scatter on CUDA memory is ncclReduceScatter, which has no band, bor or bxor; use -o sum, avg, "
           "prod, min or max, or --memory host (allreduce runs the bitwise ops on CUDA memory)";
  return nullptr;
}

const CollTest kCollTests[9] = {
    {"allreduce", "every rank receives the reduction of all ranks' buffers", true, false,
     [](size_t count, int) { return Counts{count, count, count, 0, 0}; },
     [](const Ctx &x, size_t k) { return redValue(x, x.rank, k); },
     [](const Ctx &x, size_t k) { return reduceOverRanks(x, k); },
     [](auto comm, auto s, auto r, auto &x) {  // the tensor call, so options select the compressor
       shoal_tensor_t in = tensorOf(s, x.c.paramCount, x), out = tensorOf(r, x.c.paramCount, x);
       if (x.shape != nullptr) {  // --shape: the same elements as a matrix or 4-D tensor
         in.ndim = out.ndim = x.ndim;
         for (int d = 0; d < x.ndim; ++d) in.shape[d] = out.shape[d] = x.shape[d];
       }
       return shoal_allreduce_tensor(comm, &in, &out, x.op, x.arOpts);
     },
     [](int n) { return 2.0 * (n - 1) / n; }},
    {"allgather", "every rank receives all ranks' blocks, rank r's at r * count", false, false,
     [](size_t count, int n) { return Counts{count / n, count / n * n, count / n, count / n, 0}; },
     [](const Ctx &x, size_t k) { return plainValue(x, x.rank, k); },
     [](const Ctx &x, size_t k) { return plainValue(x, int(k / x.c.paramCount), k % x.c.paramCount); },
     [](auto comm, auto s, auto r, auto &x) {
       const shoal_tensor_t in = tensorOf(s, x.c.paramCount, x),
                            out = tensorOf(r, x.c.paramCount * size_t(x.nranks), x);
       return shoal_allgather_tensor(comm, &in, &out);
     },
     [](int n) { return double(n - 1) / n; }},
    {"broadcast", "every rank receives the root's buffer", false, true,
     [](size_t count, int) { return Counts{count, count, count, 0, 0}; },
     [](const Ctx &x, size_t k) { return plainValue(x, x.rank, k); },
     [](const Ctx &x, size_t k) { return plainValue(x, x.root, k); },
     broadcastOf,
     [](int) { return 1.0; }},
    {"reduce_scatter", "rank r receives block r of the reduction of all ranks' buffers", true, false,
     [](size_t count, int n) { return Counts{count / n * n, count / n, count / n, 0, count / n}; },
     [](const Ctx &x, size_t k) { return redValue(x, x.rank, k); },
     [](const Ctx &x, size_t k) { return reduceOverRanks(x, size_t(x.rank) * x.c.paramCount + k); },
     reduceScatterOf,
     [](int n) { return double(n - 1) / n; }},
    {"alltoall", "rank r sends block p of its buffer to rank p, which stores it as block r", false, false,
     [](size_t count, int n) { return Counts{count / n * n, count / n * n, count / n, 0, 0}; },
     [](const Ctx &x, size_t k) { return plainValue(x, x.rank, k); },
     [](const Ctx &x, size_t k) {
       const size_t block = x.c.paramCount;
       return plainValue(x, int(k / block), size_t(x.rank) * block + k % block);
     },
     alltoallOf,
     [](int n) { return double(n - 1) / n; }},
    {"sendrecv", "rank r sends its buffer to rank r+1 and receives rank r-1's", false, false,
     [](size_t count, int) { return Counts{count, count, count, 0, 0}; },
     [](const Ctx &x, size_t k) { return plainValue(x, x.rank, k); },
     [](const Ctx &x, size_t k) { return plainValue(x, (x.rank + x.nranks - 1) % x.nranks, k); },
     sendRecvRing,
     [](int) { return 1.0; }},
    {"reduce", "the root receives the reduction of all ranks' buffers", true, true,
     [](size_t count, int) { return Counts{count, count, count, 0, 0}; },
     [](const Ctx &x, size_t k) { return redValue(x, x.rank, k); },
     [](const Ctx &x, size_t k) { return reduceOverRanks(x, k); },
     reduceOf,
     [](int) { return 1.0; }, true},
    {"gather", "the root receives all ranks' blocks, rank r's at r * count", false, true,
     [](size_t count, int n) { return Counts{count / n, count / n * n, count / n, count / n, 0}; },
     [](const Ctx &x, size_t k) { return plainValue(x, x.rank, k); },
     [](const Ctx &x, size_t k) { return plainValue(x, int(k / x.c.paramCount), k % x.c.paramCount); },
     gatherOf,
     [](int n) { return double(n - 1) / n; }, true},
    {"scatter", "rank r receives block r of the root's buffer", false, true,
     [](size_t count, int n) { return Counts{count / n * n, count / n, count / n, 0, count / n}; },
     [](const Ctx &x, size_t k) { return plainValue(x, x.rank, k); },
     [](const Ctx &x, size_t k) { return plainValue(x, x.root, size_t(x.rank) * x.c.paramCount + k); },
     scatterOf,
     [](int n) { return double(n - 1) / n; }},
};

const CollTest *findColl(const char *name) {
  auto squash = [](std::string s) {
    if (s.size() > 5 && s.compare(s.size() - 5, 5, "_perf") == 0) s.resize(s.size() - 5);
    s.erase(std::remove(s.begin(), s.end(), '_'), s.end());
    return s;
  };
  for (const CollTest &c : kCollTests)
    if (squash(c.name) == squash(name)) return &c;
  return nullptr;
}

void collPointers(const Ctx &x, bool inPlace, char *sendbuf, char *recvbuf, char **s, char **r) {
  *s = inPlace ? recvbuf + x.c.sendInplaceOffset * size_t(x.rank) * x.ts : sendbuf;
  *r = inPlace ? recvbuf + x.c.recvInplaceOffset * size_t(x.rank) * x.ts : recvbuf;
}

void initData(const CollTest &coll, const Ctx &x, char *send, char *recv, bool inPlace, bool forTiming) {
  std::memset(recv, 0xff, x.c.recvCount * x.ts);
  const bool neutral = forTiming && inPlace && coll.hasOp && (x.op == SHOAL_SUM || x.op == SHOAL_PROD);
  for (size_t k = 0; k < x.c.sendCount; ++k) {
    const int64_t v = neutral ? int64_t(x.op == SHOAL_PROD) : coll.input(x, k);
    store(x.dtype, send, k, v, double(v) * x.scale);
  }
}

int64_t checkData(const CollTest &coll, const Ctx &x, const char *recv, Check how) {
  if (coll.checkedOnRootOnly && x.rank != x.root) return 0;
  const bool avg = coll.hasOp && x.op == SHOAL_AVG;
  const int64_t ulps = avg && kTypes[x.dtype].isFloat ? 2 : 0;
  int64_t wrong = 0;
  char want[8];
  for (size_t k = 0; k < x.c.recvCount; ++k) {
    if (how.kind != SHOAL_ERROR_EXACT && how.kind != SHOAL_ERROR_RELATIVE) {  // FEEDBACK
      wrong += !std::isfinite(load(x.dtype, recv, k));
      continue;
    }
    const int64_t v = coll.expected(x, k);
    if (how.kind == SHOAL_ERROR_RELATIVE) {  // allreduce only: x_r is redValue(r, k)
      double sumAbs = 0;
      for (int r = 0; r < x.nranks; ++r) sumAbs += std::fabs(double(redValue(x, r, k)));
      const double exact = double(v) * x.scale / (avg ? x.nranks : 1);
      wrong += !(std::fabs(load(x.dtype, recv, k) - exact) <= how.bound * x.nranks * sumAbs * x.scale);
      continue;
    }
    if (avg) store(x.dtype, want, 0, v / x.nranks, double(v) * x.scale / x.nranks);  // ints truncate
    else store(x.dtype, want, 0, v, double(v) * x.scale);
    wrong += !sameValue(x.dtype, recv + k * x.ts, want, ulps);
  }
  return wrong;
}

}  // namespace bench
