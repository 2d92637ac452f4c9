#include "colls.h"

#include <algorithm>
#include <cmath>
#include <cstring>
#include <string>
#include <vector>

namespace bench {
namespace {

shoal_tensor_t tensorOf(const void *data, size_t count, const Ctx &x) {
  shoal_tensor_t t = shoal_tensor_1d(const_cast<void *>(data), count, x.dtype);
  t.memory = x.memory;
  t.device = x.device;
  return t;
}

// nccl-tests' sendrecv: to the right, from the left, in one group. shoal's send
// and receive buffers of one group must not overlap: in place stages the send
// (a copy inside the timed call). One rank has no peer: its exchange with
// itself is the copy.
shoal_status_t sendRecvRing(shoal_comm_t comm, const void *send, void *recv, const Ctx &x) {
  const size_t bytes = x.c.paramCount * x.ts;
  if (x.nranks == 1) {
    std::memmove(recv, send, bytes);
    return SHOAL_OK;
  }
  static thread_local std::vector<char> staged;
  if (send == recv) {
    staged.assign(static_cast<const char *>(send), static_cast<const char *>(send) + bytes);
    send = staged.data();
  }
  const shoal_p2p_t ops[2] = {
      {SHOAL_P2P_RECV, (x.rank + x.nranks - 1) % x.nranks, 0, recv, x.c.paramCount, x.dtype},
      {SHOAL_P2P_SEND, (x.rank + 1) % x.nranks, 0, const_cast<void *>(send), x.c.paramCount, x.dtype}};
  return shoal_sendrecv_many(comm, ops, 2);
}

}  // namespace

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
     [](auto comm, auto s, auto r, auto &x) { return shoal_broadcast(comm, s, r, x.c.paramCount, x.dtype, x.root); },
     [](int) { return 1.0; }},
    {"reduce_scatter", "rank r receives block r of the reduction of all ranks' buffers", true, false,
     [](size_t count, int n) { return Counts{count / n * n, count / n, count / n, 0, count / n}; },
     [](const Ctx &x, size_t k) { return redValue(x, x.rank, k); },
     [](const Ctx &x, size_t k) { return reduceOverRanks(x, size_t(x.rank) * x.c.paramCount + k); },
     [](auto comm, auto s, auto r, auto &x) { return shoal_reduce_scatter(comm, s, r, x.c.paramCount, x.dtype, x.op); },
     [](int n) { return double(n - 1) / n; }},
    {"alltoall", "rank r sends block p of its buffer to rank p, which stores it as block r", false, false,
     [](size_t count, int n) { return Counts{count / n * n, count / n * n, count / n, 0, 0}; },
     [](const Ctx &x, size_t k) { return plainValue(x, x.rank, k); },
     [](const Ctx &x, size_t k) {
       const size_t block = x.c.paramCount;
       return plainValue(x, int(k / block), size_t(x.rank) * block + k % block);
     },
     [](auto comm, auto s, auto r, auto &x) { return shoal_alltoall(comm, s, r, x.c.paramCount, x.dtype); },
     [](int n) { return double(n - 1) / n; }},
    {"sendrecv", "rank r sends its buffer to rank r+1 and receives rank r-1's", false, false,
     [](size_t count, int) { return Counts{count, count, count, 0, 0}; },
     [](const Ctx &x, size_t k) { return plainValue(x, x.rank, k); },
     [](const Ctx &x, size_t k) { return plainValue(x, (x.rank + x.nranks - 1) % x.nranks, k); },
     [](auto comm, auto s, auto r, auto &x) { return sendRecvRing(comm, s, r, x); },
     [](int) { return 1.0; }},
    {"reduce", "the root receives the reduction of all ranks' buffers", true, true,
     [](size_t count, int) { return Counts{count, count, count, 0, 0}; },
     [](const Ctx &x, size_t k) { return redValue(x, x.rank, k); },
     [](const Ctx &x, size_t k) { return reduceOverRanks(x, k); },
     [](auto comm, auto s, auto r, auto &x) {
       return shoal_reduce(comm, s, r, x.c.paramCount, x.dtype, x.op, x.root);
     },
     [](int) { return 1.0; }, true},
    {"gather", "the root receives all ranks' blocks, rank r's at r * count", false, true,
     [](size_t count, int n) { return Counts{count / n, count / n * n, count / n, count / n, 0}; },
     [](const Ctx &x, size_t k) { return plainValue(x, x.rank, k); },
     [](const Ctx &x, size_t k) { return plainValue(x, int(k / x.c.paramCount), k % x.c.paramCount); },
     [](auto comm, auto s, auto r, auto &x) { return shoal_gather(comm, s, r, x.c.paramCount, x.dtype, x.root); },
     [](int n) { return double(n - 1) / n; }, true},
    {"scatter", "rank r receives block r of the root's buffer", false, true,
     [](size_t count, int n) { return Counts{count / n * n, count / n, count / n, 0, count / n}; },
     [](const Ctx &x, size_t k) { return plainValue(x, x.rank, k); },
     [](const Ctx &x, size_t k) { return plainValue(x, x.root, size_t(x.rank) * x.c.paramCount + k); },
     [](auto comm, auto s, auto r, auto &x) { return shoal_scatter(comm, s, r, x.c.paramCount, x.dtype, x.root); },
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
