// shoal-bench's collectives in nccl-tests' vocabulary (src/common.h): each is one CollTest row
// {name, description, getCollByteCount, input, expected, runColl, busbwFactor}, plus how its
// buffers are filled and checked. Inputs (bench_data.h) are small integers or bit patterns,
// chosen per dtype and op so that the exact result is known whatever the reduction order; only
// float avg allows 2 ULP (as nccl-tests).
#pragma once

#include <shoal/shoal.h>

#include <cstdint>

#include "../bench_data.h"

namespace bench {

struct CollTest {
  const char *name;
  const char *description;
  bool hasOp, hasRoot;
  Counts (*getCollByteCount)(size_t count, int nranks);  // count = size / type size
  int64_t (*input)(const Ctx &, size_t k);               // element k of this rank's send buffer
  int64_t (*expected)(const Ctx &, size_t k);            // element k of its recv buffer
  shoal_status_t (*runColl)(shoal_comm_t, const void *send, void *recv, const Ctx &);
  double (*busbwFactor)(int nranks);  // algbw uses S = max(send, recv) bytes: the total
  bool checkedOnRootOnly = false;      // reduce, gather: other ranks' recv is not written
};

extern const CollTest kCollTests[9];
inline const CollTest &kAllreduce = kCollTests[0];
inline const CollTest &kAllgather = kCollTests[1];
inline const CollTest &kReduceScatter = kCollTests[3];
inline const CollTest &kReduce = kCollTests[6];

// --memory cuda runs every collective through the C API's tensor forms (NCCL
// underneath); this says why coll with op cannot run there (nullptr: it can):
// NCCL has no such reduction (reduce and reduce_scatter with a bitwise op).
const char *cudaRefusal(const CollTest &coll, shoal_op_t op);

// nccl-tests' names (all_reduce, all_reduce_perf) are accepted too; nullptr when unknown.
const CollTest *findColl(const char *name);

// In place, the send and recv buffers sit inside one buffer at offsets times the rank.
void collPointers(const Ctx &x, bool inPlace, char *sendbuf, char *recvbuf, char **s, char **r);

// Recv gets a sentinel (NaN / -1 / all ones) that no expected value equals, then send gets
// the input. Timed in-place sum/prod runs start from 0 / 1 instead (forTiming), so that
// repeating the collective on its own output cannot grow the values to inf or overflow.
void initData(const CollTest &coll, const Ctx &x, char *send, char *recv, bool inPlace, bool forTiming);

// The number of wrong elements in recv: exact for uncompressed calls, else within the
// compressor's declared bound (FEEDBACK compressors: finite values only).
int64_t checkData(const CollTest &coll, const Ctx &x, const char *recv, Check how);

}  // namespace bench
