// shoal-bench: nccl-tests-style sweep of one shoal collective, e.g.
//   shoalrun -np 4 shoal-bench allreduce -b 8 -e 256M -f 2 -n 20 -w 5 -c 1 -d float -o sum
//
// The driver sweeps the sizes (or the --shape rows), times out-of-place then in-place runs,
// verifies -c more runs of each from fresh inputs, and prints on rank 0 (report.h). colls.h
// holds the collectives, options.h the flags.
//
// Allreduce with a compressor (--compressor NAME, else SHOAL_COMPRESSOR): every call is
// shoal_allreduce_tensor with the compressor, its options and a tensor name (one per size or
// shape tensor: stateful compressors such as topk refuse a name whose count changes). Float
// sum/avg inputs are then signed multiples of 2^-12 in (-1, 1) (sums still exact in the dtype)
// and #wrong counts elements outside the compressor's declared bound. Timed in-place calls
// restore the input before each call (the copies' time is subtracted), as a compressor's cost
// depends on the data; without a compressor they start from zeros, as nccl-tests.
#include <unistd.h>

#include <algorithm>
#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <string>
#include <vector>

#include "../bench_memory.h"
#include "colls.h"
#include "options.h"
#include "report.h"

namespace bench {
namespace {

using Clock = std::chrono::steady_clock;
using Us = std::chrono::duration<double, std::micro>;

// One collective call of a row: its counts, where it sits in the buffers, its tensor.
struct Part {
  Counts c;
  size_t offset = 0;  // elements from the start of sendbuf / recvbuf
  std::string name;   // the tensor name the compressor sees
  const Tensor *tensor = nullptr;  // --shape; nullptr: 1-D
};

struct Plan {
  Row row;
  std::vector<Part> parts;
};

class Bench {
 public:
  explicit Bench(const Options &o);
  ~Bench();
  const std::vector<Plan> &plans() const { return plans_; }
  Row runOne(const Plan &plan);
  void finish(const std::vector<Row> &rows);

 private:
  [[noreturn]] void fail(const std::string &what, shoal_status_t s);  // a shoal call failed
  [[noreturn]] void die(const std::string &why);                       // anything else
  void check(shoal_status_t s, const char *what) {
    if (s != SHOAL_OK) fail(what, s);
  }
  // The bench's own bookkeeping, never compressed whatever SHOAL_COMPRESSOR says.
  void plainAllreduce(void *buf, size_t count, shoal_dtype_t dtype, shoal_op_t op);
  void allocate(size_t bytes);
  char *onDevice(char *p) const;
  void deviceCopy(const std::string &why) {
    if (!why.empty()) die("--memory cuda: " + why);
  }
  std::vector<Plan> makePlans() const;
  Ctx partCtx(const Part &part) const;
  void runParts(const Plan &plan, bool inPlace, bool collectStats, uint64_t bytes[4]);

  const Options &o_;
  shoal_comm_t comm_ = nullptr;
  int rank_ = -1, nranks_ = 0;
  RunInfo run_;
  FILE *json_ = nullptr;
  Ctx base_;
  shoal_allreduce_options_t arOpts_ = SHOAL_ALLREDUCE_OPTIONS_INIT;
  size_t bufBytes_ = 0;
  char *sendbuf_ = nullptr, *recvbuf_ = nullptr, *pristine_ = nullptr;
  char *deviceSend_ = nullptr, *deviceRecv_ = nullptr;
  std::vector<Plan> plans_;
  int64_t totalWrong_ = 0;
  double busBwSum_ = 0, payBusBwSum_ = 0;
};

Bench::Bench(const Options &o) : o_(o) {
  shoal_config_t config = SHOAL_CONFIG_INIT;  // rank, size and store from the environment
  config.algorithm = o.algorithm;
  if (shoal_status_t s = shoal_comm_init_config(&config, &comm_); s != SHOAL_OK) {
    if (s == SHOAL_ERR_NOT_FOUND || s == SHOAL_ERR_INVALID_ARGUMENT)
      usageError(-1, "%s: %s", shoal_status_string(s), shoal_last_error(nullptr));
    fprintf(stderr, "shoal-bench: shoal_comm_init_config failed: %s: %s\n", shoal_status_string(s),
            shoal_last_error(nullptr));
    exit(1);
  }
  check(shoal_comm_rank(comm_, &rank_), "shoal_comm_rank");
  check(shoal_comm_size(comm_, &nranks_), "shoal_comm_size");
  if (o.coll->hasRoot && o.root >= nranks_) usageError(rank_, "-r %d: the root must be below nranks %d", o.root, nranks_);
  const char *env = getenv("SHOAL_ALGO");
  run_ = {&o, nranks_, o.algorithm ? o.algorithm : env && *env ? env : "auto",
          o.coll->hasOp ? shoal_op_name(o.op) : "none", {}, nowText()};

  const size_t ts = shoal_dtype_size(o.dtype);
  const TypeInfo &ti = kTypes[o.dtype];
  base_ = Ctx{o.dtype, o.op, nranks_, rank_, o.root, {}, ts, 8 * ts, ti.isSigned,
              std::min<int64_t>(3, ti.exactLimit / nranks_), ti.plainMod};
  base_.memory = o.memory;
  arOpts_.compressor = o.table ? o.table->name : "none";
  arOpts_.compressor_options = o.copts;
  arOpts_.compress_min_bytes = o.compressMinBytes;
  base_.arOpts = &arOpts_;
  if (o.table && ti.isFloat && (o.op == SHOAL_SUM || o.op == SHOAL_AVG))  // normal numbers, exact sums
    base_.richMax = std::clamp<int64_t>(ti.exactLimit / nranks_, 1, 4095), base_.scale = 0x1p-12;
  base_.sparse = o.density < 1;
  sparsity(o.density, o.overlap, &base_.common, &base_.arc);

  // --memory cuda: every rank needs a device before anything is printed.
  if (o.memory == SHOAL_MEMORY_CUDA) {
    const char *local = getenv("SHOAL_LOCAL_RANK");
    std::string why = selectDevice(local ? atoi(local) : rank_, &base_.device);
    int32_t bad = !why.empty();
    plainAllreduce(&bad, 1, SHOAL_I32, SHOAL_MAX);
    if (bad) die(why.empty() ? "--memory cuda: another rank has no device" : "--memory cuda: " + why);
  }
  // Open the JSON file now, so that a bad path stops every rank before the sweep.
  json_ = rank_ == 0 && o.jsonPath ? fopen(o.jsonPath, "w") : nullptr;
  const int openErrno = errno;
  int32_t jsonBad = rank_ == 0 && o.jsonPath && !json_;
  plainAllreduce(&jsonBad, 1, SHOAL_I32, SHOAL_MAX);
  if (jsonBad) usageError(rank_, "-J: cannot write %s: %s", o.jsonPath, strerror(openErrno));

  // nccl-tests' "Using devices" block: where each rank runs.
  struct Place { int32_t pid; char host[60]; } me{int32_t(getpid()), {}};
  std::vector<Place> all(static_cast<size_t>(nranks_));
  gethostname(me.host, sizeof me.host - 1);
  check(shoal_allgather(comm_, &me, all.data(), sizeof me, SHOAL_U8), "shoal_allgather");
  for (const Place &p : all) run_.ranks.push_back({p.pid, p.host});
  if (rank_ == 0) printHeader(run_);

  plans_ = makePlans();
  size_t largest = 0;
  for (const Plan &plan : plans_) largest = std::max(largest, plan.row.size);
  allocate(largest);
}

Bench::~Bench() {
  std::free(sendbuf_);
  std::free(recvbuf_);
  std::free(pristine_);
  deviceFree(deviceSend_);
  deviceFree(deviceRecv_);
  if (comm_) shoal_comm_destroy(comm_);
}

void Bench::fail(const std::string &what, shoal_status_t s) {
  fprintf(stderr, "shoal-bench: rank %d: %s failed: %s: %s\n", rank_, what.c_str(), shoal_status_string(s),
          shoal_last_error(comm_));
  shoal_comm_destroy(comm_);
  exit(1);
}

void Bench::die(const std::string &why) {
  fprintf(stderr, "shoal-bench: rank %d: %s\n", rank_, why.c_str());
  shoal_comm_destroy(comm_);
  exit(1);
}

void Bench::plainAllreduce(void *buf, size_t count, shoal_dtype_t dtype, shoal_op_t op) {
  shoal_allreduce_options_t options = SHOAL_ALLREDUCE_OPTIONS_INIT;
  options.compressor = "none";
  const shoal_tensor_t t = shoal_tensor_1d(buf, count, dtype);
  check(shoal_allreduce_tensor(comm_, &t, &t, op, &options), "the bench's own allreduce");
}

// Both buffers once, at the largest size, 64-byte aligned; for CUDA memory device twins too
// (every rank learns whether all got theirs).
void Bench::allocate(size_t bytes) {
  bufBytes_ = (std::max<size_t>(bytes, 1) + 63) / 64 * 64;
  sendbuf_ = static_cast<char *>(std::aligned_alloc(64, bufBytes_));
  recvbuf_ = static_cast<char *>(std::aligned_alloc(64, bufBytes_));
  if (o_.table) pristine_ = static_cast<char *>(std::aligned_alloc(64, bufBytes_));
  if (!sendbuf_ || !recvbuf_ || (o_.table && !pristine_))
    die("cannot allocate 3 x " + std::to_string(bufBytes_) + " bytes of host memory");
  if (o_.memory != SHOAL_MEMORY_CUDA) return;
  std::string why = deviceAlloc(bufBytes_, reinterpret_cast<void **>(&deviceSend_));
  if (why.empty()) why = deviceAlloc(bufBytes_, reinterpret_cast<void **>(&deviceRecv_));
  int32_t bad = !why.empty();
  plainAllreduce(&bad, 1, SHOAL_I32, SHOAL_MAX);
  if (bad) die(why.empty() ? "--memory cuda: another rank could not allocate its buffers" : "--memory cuda: " + why);
}

// The device twin of a host pointer into sendbuf or recvbuf (itself for host memory).
char *Bench::onDevice(char *p) const {
  if (!deviceSend_) return p;
  return p >= recvbuf_ && p < recvbuf_ + bufBytes_ ? deviceRecv_ + (p - recvbuf_) : deviceSend_ + (p - sendbuf_);
}

// The rows: the -b/-e sweep of 1-D buffers, or one row per --shape entry.
std::vector<Plan> Bench::makePlans() const {
  const size_t ts = base_.ts;
  std::vector<Plan> plans;
  for (const ShapeRow &shape : o_.shapes) {
    Plan plan;
    plan.row.shape = shape.label;
    plan.row.tensors = shape.tensors.size();
    for (const Tensor &t : shape.tensors) {
      const size_t n = t.elements();
      plan.parts.push_back({Counts{n, n, n, 0, 0}, plan.row.count, t.name, &t});
      plan.row.count += n;
    }
    plan.row.size = plan.row.count * ts;
    plans.push_back(plan);
  }
  if (!o_.shapes.empty()) return plans;
  for (size_t size = o_.minBytes; size && size <= o_.maxBytes;) {
    Plan plan;
    const Counts c = o_.coll->getCollByteCount(size / ts, nranks_);
    plan.row.size = std::max(c.sendCount, c.recvCount) * ts;
    plan.row.count = c.paramCount;
    plan.parts.push_back({c, 0, "bench_" + std::to_string(c.paramCount), nullptr});
    if (c.paramCount > 0) plans.push_back(plan);
    else if (rank_ == 0) printf("# skipping size %zu: less than one %s per rank\n", size, shoal_dtype_name(o_.dtype));
    const size_t next = o_.stepBytes ? size + o_.stepBytes : size * o_.stepFactor;  // 0 ends it on overflow
    size = next <= size || (!o_.stepBytes && next / o_.stepFactor != size) ? 0 : next;
  }
  return plans;
}

Ctx Bench::partCtx(const Part &part) const {
  Ctx x = base_;
  x.c = part.c;
  if (part.tensor) x.ndim = int(part.tensor->shape.size()), x.shape = part.tensor->shape.data();
  return x;
}

// Every part once; collectStats adds each call's compressor statistics to bytes (input,
// payload, wire, compressed calls).
void Bench::runParts(const Plan &plan, bool inPlace, bool collectStats, uint64_t bytes[4]) {
  for (const Part &part : plan.parts) {
    const Ctx x = partCtx(part);
    char *s, *r;
    collPointers(x, inPlace, sendbuf_ + part.offset * x.ts, recvbuf_ + part.offset * x.ts, &s, &r);
    arOpts_.name = part.name.c_str();
    if (shoal_status_t st = o_.coll->runColl(comm_, onDevice(s), onDevice(r), x); st != SHOAL_OK)
      fail(std::string(o_.coll->name) + (inPlace ? " (in-place, " : " (out-of-place, ") + part.name + ")", st);
    if (!collectStats || !o_.table) continue;
    shoal_compress_stats_t stats = SHOAL_COMPRESS_STATS_INIT;
    check(shoal_last_compress_stats(comm_, &stats), "shoal_last_compress_stats");
    const bool compressed = strcmp(stats.compressor, "none") != 0;
    bytes[0] += stats.input_bytes;
    bytes[1] += compressed ? stats.payload_bytes : stats.input_bytes;
    bytes[2] += compressed ? stats.wire_bytes : 0;
    bytes[3] += compressed;
  }
}

Row Bench::runOne(const Plan &plan) {
  Row row = plan.row;
  const size_t ts = base_.ts;
  double times[2] = {0, 0};
  int64_t wrong[2] = {0, 0};
  uint64_t bytes[2][4] = {};  // per mode, summed over ranks: input, payload, wire, compressed calls
  for (int inPlace = 0; inPlace < 2; ++inPlace) {
    const bool restore = pristine_ && inPlace;
    double copyUs = 0;  // the restores' time, taken out of the timed loop's
    // Inputs are made and checked on the host; for CUDA memory they travel to the device.
    auto prepare = [&](bool timed) {
      for (const Part &part : plan.parts) {
        const Ctx x = partCtx(part);
        char *s, *r;
        collPointers(x, inPlace, sendbuf_ + part.offset * ts, recvbuf_ + part.offset * ts, &s, &r);
        initData(*o_.coll, x, s, r, inPlace, /*forTiming=*/timed && !restore);
        if (timed && restore) std::memcpy(pristine_ + part.offset * ts, s, x.c.sendCount * ts);
        if (deviceSend_) {
          deviceCopy(copyToDevice(onDevice(r), r, x.c.recvCount * ts));
          deviceCopy(copyToDevice(onDevice(s), s, x.c.sendCount * ts));
        }
      }
    };
    auto restoreInputs = [&] {
      if (!restore) return;
      const auto c0 = Clock::now();
      for (const Part &part : plan.parts) {
        char *s, *r;
        collPointers(partCtx(part), true, sendbuf_ + part.offset * ts, recvbuf_ + part.offset * ts, &s, &r);
        if (deviceSend_) deviceCopy(copyToDevice(onDevice(s), pristine_ + part.offset * ts, part.c.sendCount * ts));
        else std::memcpy(s, pristine_ + part.offset * ts, part.c.sendCount * ts);
      }
      copyUs += Us(Clock::now() - c0).count();
    };
    prepare(/*timed=*/true);
    for (int i = 0; i < o_.warmup; ++i) restoreInputs(), runParts(plan, inPlace, false, bytes[inPlace]);
    check(shoal_barrier(comm_), "shoal_barrier");
    copyUs = 0;
    const auto t0 = Clock::now();
    for (int i = 0; i < o_.iters; ++i) restoreInputs(), runParts(plan, inPlace, i + 1 == o_.iters, bytes[inPlace]);
    times[inPlace] = std::max(0.0, Us(Clock::now() - t0).count() - copyUs) / o_.iters;
    for (int c = 0; c < o_.check; ++c) {  // more runs, from fresh inputs, verified element by element
      prepare(/*timed=*/false);
      uint64_t unused[4] = {};
      runParts(plan, inPlace, false, unused);
      for (const Part &part : plan.parts) {
        const Ctx x = partCtx(part);
        char *s, *r;
        collPointers(x, inPlace, sendbuf_ + part.offset * ts, recvbuf_ + part.offset * ts, &s, &r);
        if (deviceRecv_) deviceCopy(copyToHost(r, onDevice(r), x.c.recvCount * ts));
        Check how;  // uncompressed calls are exact
        if (o_.table && bytes[inPlace][3] > 0) how = {o_.table->error_kind, o_.table->error_bound};
        wrong[inPlace] += checkData(*o_.coll, x, r, how);
      }
    }
  }
  // Every rank's times (for -a), and the wrong elements and bytes of all ranks.
  std::vector<double> all(2 * size_t(nranks_));
  check(shoal_allgather(comm_, times, all.data(), 2, SHOAL_F64), "shoal_allgather");
  plainAllreduce(wrong, 2, SHOAL_I64, SHOAL_SUM);
  if (o_.table) plainAllreduce(bytes, 8, SHOAL_U64, SHOAL_SUM);
  const size_t calls = plan.parts.size() * size_t(nranks_);
  for (int m = 0; m < 2; ++m) {
    Result &res = row.res[m];
    res.timeRank0 = all[m];
    res.timeMin = res.timeMax = all[m];
    for (int r = 0; r < nranks_; ++r) {
      const double t = all[2 * size_t(r) + m];
      res.timeAvg += t / nranks_;
      res.timeMin = std::min(res.timeMin, t);
      res.timeMax = std::max(res.timeMax, t);
    }
    const double picked[] = {res.timeRank0, res.timeAvg, res.timeMin, res.timeMax};
    res.time = picked[int(o_.average)];
    const double factor = o_.coll->busbwFactor(nranks_);
    res.algBw = res.time > 0 ? double(row.size) / 1e3 / res.time : 0;  // B/us / 1e3 = GB/s
    res.busBw = res.algBw * factor;
    res.wrong = o_.check ? wrong[m] : -1;
    if (o_.table) {
      const uint64_t *b = bytes[m];
      res.ratio = b[1] ? double(b[0]) / double(b[1]) : 0;
      res.payloadBytes = double(b[1]) / nranks_;
      res.wireBytes = b[3] == calls ? double(b[2]) / nranks_ : -1;
      res.payBusBw = res.time > 0 ? res.payloadBytes / 1e3 / res.time * factor : 0;
    }
    busBwSum_ += res.busBw;
    payBusBwSum_ += res.payBusBw;
    totalWrong_ += wrong[m];
  }
  if (rank_ == 0) printShapeNote(row), printRow(run_, row);
  return row;
}

void Bench::finish(const std::vector<Row> &rows) {
  const double modes = double(2 * std::max<size_t>(rows.size(), 1));
  const double avgBusBw = rows.empty() ? 0 : busBwSum_ / modes, avgPayBusBw = rows.empty() ? 0 : payBusBwSum_ / modes;
  if (rank_ == 0) printFooter(run_, totalWrong_, avgBusBw, avgPayBusBw);
  if (json_) {
    const bool written = writeJson(json_, run_, rows, totalWrong_, avgBusBw, avgPayBusBw);
    if (fclose(json_) != 0 || !written) die(std::string("-J: writing ") + o_.jsonPath + ": " + strerror(errno));
    json_ = nullptr;
  }
  check(shoal_comm_finalize(comm_), "shoal_comm_finalize");
}

}  // namespace
}  // namespace bench

int main(int argc, char **argv) {
  const bench::Options options = bench::parseArgs(argc, argv);
  bench::Bench bench(options);
  std::vector<bench::Row> rows;
  int64_t wrong = 0;
  for (const auto &plan : bench.plans()) {
    rows.push_back(bench.runOne(plan));
    for (const bench::Result &r : rows.back().res) wrong += std::max<int64_t>(r.wrong, 0);
  }
  bench.finish(rows);
  return wrong ? 1 : 0;
}
