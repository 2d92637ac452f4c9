// shoal-bench: nccl-tests-style sweep of one shoal collective on host memory, e.g.
//   shoalrun -np 4 shoal-bench allreduce -b 8 -e 256M -f 2 -n 20 -w 5 -c 1 -d float -o sum
//
// nccl-tests' vocabulary (src/common.h): each collective is one CollTest row {name, description,
// getCollByteCount, input, expected, runColl, busbwFactor}; one driver sweeps the sizes, times
// out-of-place then in-place runs, verifies one extra run of each, prints on rank 0, writes JSON.
// The cells after `size count type redop root` come from the kColumns table (text and JSON);
// compressor columns (ratio, bytes sent, effective algbw) are Result fields + kColumns rows shown
// only while a compressor is active.
// Checked inputs (bench_data.h) are small integers or bit patterns, chosen per dtype and op so
// that the exact result is known whatever the reduction order; only float avg allows 2 ULP (as
// nccl-tests). --density/--overlap make allreduce inputs sparse (construction at nonzeroAt).
//
// Allreduce with a compressor (--compressor NAME, else SHOAL_COMPRESSOR; "none" = the plain table):
// every call is shoal_allreduce_tensor with the compressor, its options and a tensor name (one per
// size: stateful compressors such as topk refuse a name whose count changes). Float sum/avg inputs
// are then signed multiples of 2^-12 in (-1, 1) (sums still exact in the dtype) and #wrong counts
// elements outside the compressor's declared bound (see Check). algbw and busbw count the payload
// bytes the compressor handed to collectives, effbw the uncompressed bytes. Timed in-place calls
// restore the input before each call (the copies' time is subtracted), as a compressor's cost
// depends on the data; without a compressor they start from zeros, as before.

#include <getopt.h>
#include <shoal/compressor.h>
#include <shoal/shoal.h>
#include <unistd.h>

#include <algorithm>
#include <chrono>
#include <cctype>
#include <cerrno>
#include <cinttypes>
#include <cmath>
#include <cstdarg>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <iterator>
#include <string>
#include <vector>

#include "bench_data.h"
#include "bench_memory.h"

namespace {

using namespace bench;  // NOLINT(google-build-using-namespace): its types and values, in bench_data.h

int g_rank = -1;  // this process's rank once the communicator exists
// --memory: where the collectives' buffers live. For CUDA memory the inputs are
// made and checked in host buffers and copied to and from device buffers
// outside the timed loop.
shoal_memory_t g_memory = SHOAL_MEMORY_HOST;
int g_device = 0;

shoal_tensor_t tensorOf(const void *data, size_t count, shoal_dtype_t dtype) {
  shoal_tensor_t t = shoal_tensor_1d(const_cast<void *>(data), count, dtype);
  t.memory = g_memory;
  t.device = g_device;
  return t;
}

__attribute__((format(printf, 1, 2))) std::string format(const char *fmt, ...) {
  char buf[256];
  va_list ap;
  va_start(ap, fmt);
  vsnprintf(buf, sizeof buf, fmt, ap);
  va_end(ap);
  return buf;
}

// ---- the collectives ----------------------------------------------------------------------

struct CollTest {
  const char *name;
  const char *description;
  bool hasOp, hasRoot;
  Counts (*getCollByteCount)(size_t count, int nranks);  // count = size / type size
  int64_t (*input)(const Ctx &, size_t k);               // element k of this rank's send buffer
  int64_t (*expected)(const Ctx &, size_t k);            // element k of its recv buffer
  shoal_status_t (*runColl)(shoal_comm_t, const void *send, void *recv, const Ctx &);
  double (*busbwFactor)(int nranks);  // algbw uses S = max(send, recv) bytes: the total
};

const CollTest kCollTests[] = {
    {"allreduce", "every rank receives the reduction of all ranks' buffers", true, false,
     [](size_t count, int) { return Counts{count, count, count, 0, 0}; },
     [](const Ctx &x, size_t k) { return redValue(x, x.rank, k); },
     [](const Ctx &x, size_t k) { return reduceOverRanks(x, k); },
     [](auto comm, auto s, auto r, auto &x) {  // the tensor call, so options select the compressor
       const shoal_tensor_t in = tensorOf(s, x.c.paramCount, x.dtype), out = tensorOf(r, x.c.paramCount, x.dtype);
       return shoal_allreduce_tensor(comm, &in, &out, x.op, x.arOpts);
     },
     [](int n) { return 2.0 * (n - 1) / n; }},
    {"allgather", "every rank receives all ranks' blocks, rank r's at r * count", false, false,
     [](size_t count, int n) { return Counts{count / n, count / n * n, count / n, count / n, 0}; },
     [](const Ctx &x, size_t k) { return plainValue(x, x.rank, k); },
     [](const Ctx &x, size_t k) { return plainValue(x, int(k / x.c.paramCount), k % x.c.paramCount); },
     [](auto comm, auto s, auto r, auto &x) {
       const shoal_tensor_t in = tensorOf(s, x.c.paramCount, x.dtype),
                            out = tensorOf(r, x.c.paramCount * size_t(x.nranks), x.dtype);
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
};

// In place, the send and recv buffers sit inside one buffer at offsets times the rank.
void collPointers(const Ctx &x, bool inPlace, char *sendbuf, char *recvbuf, char **s, char **r) {
  *s = inPlace ? recvbuf + x.c.sendInplaceOffset * size_t(x.rank) * x.ts : sendbuf;
  *r = inPlace ? recvbuf + x.c.recvInplaceOffset * size_t(x.rank) * x.ts : recvbuf;
}

// Recv gets a sentinel (NaN / -1 / all ones) that no expected value equals, then send gets
// the input. Timed in-place sum/prod runs start from 0 / 1 instead, so that repeating the
// collective on its own output cannot grow the values to inf or overflow integers.
void initData(const CollTest &coll, const Ctx &x, char *send, char *recv, bool inPlace, bool forTiming) {
  std::memset(recv, 0xff, x.c.recvCount * x.ts);
  const bool neutral = forTiming && inPlace && coll.hasOp && (x.op == SHOAL_SUM || x.op == SHOAL_PROD);
  for (size_t k = 0; k < x.c.sendCount; ++k) {
    const int64_t v = neutral ? int64_t(x.op == SHOAL_PROD) : coll.input(x, k);
    store(x.dtype, send, k, v, double(v) * x.scale);
  }
}

int64_t checkData(const CollTest &coll, const Ctx &x, const char *recv, Check how) {
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

// ---- output columns --------------------------------------------------------------------------

struct Result {  // one run (out-of-place or in-place) of one size, already combined over ranks
  double timeUs = 0, algBw = 0, busBw = 0;
  int64_t wrong = -1;  // -1 = not checked
  // With a compressor: input / payload bytes, payload and wire bytes per rank of one call (wire
  // -1: unknown, the call went uncompressed), and the uncompressed bytes over the time.
  double ratio = 0, payloadBytes = 0, wireBytes = -1, effBw = 0;
};

std::string human(double bytes) {  // 1536 -> "1.50K", in powers of 1024 as -b and -e take them
  static const char *const kUnits[] = {"", "K", "M", "G", "T"};
  int unit = 0;
  for (; bytes >= 1024 && unit < 4; ++unit) bytes /= 1024;
  const char *fmt = unit == 0 || bytes >= 100 ? "%.0f%s" : bytes >= 10 ? "%.1f%s" : "%.2f%s";
  return format(fmt, bytes, kUnits[unit]);
}

enum Show { kAlways, kCompressor, kCompressorJson };  // the last: in JSON only
struct Column {
  const char *title, *unit, *jsonKey;
  int width;
  std::string (*value)(const Result &, bool json);  // the cell's text, or its JSON value
  Show show;
};
bool g_compressorColumns = false;  // a compressor is active: its columns are shown
bool shown(const Column &c, bool json) {
  return c.show == kAlways || (g_compressorColumns && (json || c.show == kCompressor));
}

const Column kColumns[] = {
    {"time", "(us)", "time_us", 7, [](const Result &r, bool json) {
       return format(json ? "%.3f" : r.timeUs >= 10000 ? "%.0f" : r.timeUs >= 100 ? "%.1f" : "%.2f", r.timeUs);
     }, kAlways},
    {"algbw", "(GB/s)", "algbw", 6, [](const Result &r, bool json) { return format(json ? "%.6g" : "%.2f", r.algBw); },
     kAlways},
    {"busbw", "(GB/s)", "busbw", 6, [](const Result &r, bool json) { return format(json ? "%.6g" : "%.2f", r.busBw); },
     kAlways},
    {"#wrong", "", "wrong", 6, [](const Result &r, bool json) {
       return r.wrong >= 0 ? format("%" PRId64, r.wrong) : std::string(json ? "null" : "N/A");
     }, kAlways},
    {"ratio", "", "ratio", 6, [](const Result &r, bool json) { return format(json ? "%.6g" : "%.2f", r.ratio); },
     kCompressor},
    {"", "", "payload_bytes", 0, [](const Result &r, bool) { return format("%.0f", r.payloadBytes); },
     kCompressorJson},
    {"sent", "(B)", "wire_bytes", 6, [](const Result &r, bool json) {
       if (r.wireBytes < 0) return std::string(json ? "null" : "N/A");
       return json ? format("%.0f", r.wireBytes) : human(r.wireBytes);
     }, kCompressor},
    {"effbw", "(GB/s)", "effbw", 6, [](const Result &r, bool json) { return format(json ? "%.6g" : "%.2f", r.effBw); },
     kCompressor},
};

struct Row { size_t size, count; Result res[2]; };  // res: out-of-place, in-place

const char *kModeTitle[2] = {"out-of-place", "in-place"}, *kModeJson[2] = {"oop", "ip"};

// ---- command line ------------------------------------------------------------------------

struct Options {
  const CollTest *coll = &kCollTests[0];
  size_t minBytes = size_t{32} << 20, maxBytes = size_t{32} << 20, stepFactor = 2, stepBytes = 0;
  int iters = 20, warmup = 5, check = 1, root = 0;
  shoal_dtype_t dtype = SHOAL_F32;  // -d
  shoal_op_t op = SHOAL_SUM;        // -o
  const char *algorithm = nullptr;  // NULL: SHOAL_ALGO or the library's default
  const char *jsonPath = nullptr;
  // Allreduce only:
  const char *compressor = nullptr;  // --compressor; NULL: SHOAL_COMPRESSOR, else none
  const shoal_compressor_t *table = nullptr;  // the compressor's, when one is active
  const char *copts = nullptr;                // NULL: SHOAL_COMPRESSOR_OPTS
  long long compressMinBytes = 0;             // --min-bytes
  double density = 1, overlap = 0;
};

// Only the process the launcher calls rank 0 (or a lone process) reports argument errors, so
// `shoalrun -np 8` prints them once; the others wait a moment before they exit, lest a launcher
// that stops the job on the first failure kill rank 0 before it has printed.
bool mayReport() {
  if (g_rank >= 0) return g_rank == 0;
  for (const char *v : {"SHOAL_RANK", "OMPI_COMM_WORLD_RANK", "PMI_RANK", "SLURM_PROCID"})
    if (const char *s = getenv(v)) return atoi(s) == 0;
  return true;
}

[[noreturn]] __attribute__((format(printf, 1, 2))) void usageError(const char *fmt, ...) {
  if (mayReport()) {
    va_list ap;
    va_start(ap, fmt);
    fputs("shoal-bench: ", stderr);
    vfprintf(stderr, fmt, ap);
    va_end(ap);
    fputs("\nrun 'shoal-bench -h' for usage\n", stderr);
  } else {
    usleep(500 * 1000);
  }
  exit(2);
}

void usage() {
  printf("usage: shoal-bench [COLLECTIVE] [options]     (run under shoalrun, mpirun or srun)\n\n"
         "collectives (default allreduce):\n");
  for (const CollTest &c : kCollTests) printf("  %-15s %s\n", c.name, c.description);
  printf("\noptions (as nccl-tests; sizes take K, M, G suffixes, powers of 1024):\n"
         "  -b, -e BYTES  smallest and largest size [32M, 32M]\n"
         "  -f FACTOR     multiply the size by FACTOR at each step [2]\n"
         "  -i BYTES      add BYTES at each step instead\n"
         "  -n, -w ITERS  timed and warm-up iterations per size [20, 5]\n"
         "  -c 0|1        check results [1]\n"
         "  -d DTYPE      float, double, half, bfloat16, int8, uint8, int32, uint32, int64, uint64 [float]\n"
         "  -o OP         sum, avg, prod, min, max, band, bor, bxor [sum]\n"
         "  -a ALGO       auto, ring or tree [SHOAL_ALGO, else auto]\n"
         "  -r ROOT       root rank of broadcast [0]\n"
         "  -J, --json FILE      rank 0 writes the results as JSON\n"
         "  --memory host|cuda   where the buffers live; cuda: device (local rank mod devices),\n"
         "                       allreduce and allgather, NCCL underneath (CUDA build) [host]\n"
         "  -h, --help           this help\n"
         "\nallreduce only:\n"
         "  --compressor NAME    compress inside the allreduce [SHOAL_COMPRESSOR, else none]\n"
         "  --copts K=V,...      the compressor's options [SHOAL_COMPRESSOR_OPTS]\n"
         "  --min-bytes BYTES    smaller calls go uncompressed [0]\n"
         "  --density D          fraction of nonzero inputs, in (0, 1], positions differ per rank [1]\n"
         "  --overlap O          fraction of each rank's nonzeros that all ranks share, in [0, 1] [0]\n"
         "  --list-compressors   list the compressors and exit\n"
         "\nsize is the total bytes (for allgather and reduce_scatter: count x type size x nranks),\n"
         "count the elements per call; busbw = algbw x 2(n-1)/n (allreduce), (n-1)/n (allgather,\n"
         "reduce_scatter), 1 (broadcast), GB = 1e9. Time is the slowest rank's mean per iteration.\n"
         "With a compressor, algbw and busbw count its payload bytes, effbw the uncompressed bytes;\n"
         "ratio = uncompressed / payload bytes, sent = bytes on the wire per rank and call.\n");
}

size_t parseSize(const char *flag, const char *s) {
  char *end = nullptr;
  errno = 0;
  const unsigned long long v = strtoull(s, &end, 10);
  if (errno || end == s || *s == '-') usageError("%s: '%s' is not a size (e.g. 8, 64K, 256M, 1G)", flag, s);
  int shift = 0;
  static const char kUnits[] = "KMG";
  if (const char *u = *end ? strchr(kUnits, toupper(*end)) : nullptr) shift = 10 * int(u - kUnits + 1), ++end;
  if (*end == 'B' || *end == 'b') ++end;
  if (*end) usageError("%s: '%s' is not a size (e.g. 8, 64K, 256M, 1G)", flag, s);
  if (v > (~0ull >> shift)) usageError("%s: '%s' is too large", flag, s);
  return size_t(v << shift);
}

int parseInt(const char *flag, const char *s, int lo) {
  char *end = nullptr;
  errno = 0;
  const long v = strtol(s, &end, 10);
  if (errno || end == s || *end || v < lo || v > 1000000000L)
    usageError("%s: '%s' is not an integer >= %d", flag, s, lo);
  return int(v);
}

double parseFraction(const char *flag, const char *s, bool zeroOk) {
  char *end = nullptr;
  const double v = strtod(s, &end);
  if (end == s || *end || !(v <= 1) || v < 0 || (v == 0 && !zeroOk))
    usageError("%s: '%s' is not a number in %s0, 1]", flag, s, zeroOk ? "[" : "(");
  return v;
}

const CollTest *findColl(const char *name) {
  auto squash = [](std::string s) {  // accept nccl-tests' all_reduce(_perf) spellings too
    if (s.size() > 5 && s.compare(s.size() - 5, 5, "_perf") == 0) s.resize(s.size() - 5);
    s.erase(std::remove(s.begin(), s.end(), '_'), s.end());
    return s;
  };
  for (const CollTest &c : kCollTests)
    if (squash(c.name) == squash(name)) return &c;
  return nullptr;
}

Options parseArgs(int argc, char **argv) {
  Options o;
  enum { kCompressor = 256, kCopts, kMinBytes, kDensity, kOverlap, kMemory };
  const option longOpts[] = {{"json", required_argument, nullptr, 'J'},
                             {"list-compressors", no_argument, nullptr, 'L'},
                             {"help", no_argument, nullptr, 'h'},
                             {"compressor", required_argument, nullptr, kCompressor},
                             {"copts", required_argument, nullptr, kCopts},
                             {"min-bytes", required_argument, nullptr, kMinBytes},
                             {"density", required_argument, nullptr, kDensity},
                             {"overlap", required_argument, nullptr, kOverlap},
                             {"memory", required_argument, nullptr, kMemory},
                             {nullptr, 0, nullptr, 0}};
  const char *allreduceOnly = nullptr;  // the last allreduce-only flag given
  opterr = 0;
  for (int ch; (ch = getopt_long(argc, argv, ":b:e:f:i:n:w:c:d:o:a:r:J:h", longOpts, nullptr)) != -1;) {
    switch (ch) {
      case 'b': o.minBytes = parseSize("-b", optarg); break;
      case 'e': o.maxBytes = parseSize("-e", optarg); break;
      case 'f': o.stepFactor = size_t(parseInt("-f", optarg, 2)), o.stepBytes = 0; break;
      case 'i': o.stepBytes = parseSize("-i", optarg), o.stepFactor = 1; break;
      case 'n': o.iters = parseInt("-n", optarg, 1); break;
      case 'w': o.warmup = parseInt("-w", optarg, 0); break;
      case 'c': o.check = parseInt("-c", optarg, 0); break;
      case 'r': o.root = parseInt("-r", optarg, 0); break;
      case 'a': o.algorithm = optarg; break;
      case 'J': o.jsonPath = optarg; break;
      case 'd':
        if (shoal_dtype_from_name(optarg, &o.dtype) != SHOAL_OK)
          usageError("-d: %s", shoal_last_error(nullptr));
        break;
      case 'o':
        if (shoal_op_from_name(optarg, &o.op) != SHOAL_OK) usageError("-o: %s", shoal_last_error(nullptr));
        break;
      case kCompressor: o.compressor = optarg, allreduceOnly = "--compressor"; break;
      case kCopts: o.copts = optarg, allreduceOnly = "--copts"; break;
      case kMinBytes:
        o.compressMinBytes = (long long)parseSize("--min-bytes", optarg), allreduceOnly = "--min-bytes";
        break;
      case kDensity: o.density = parseFraction("--density", optarg, false), allreduceOnly = "--density"; break;
      case kOverlap: o.overlap = parseFraction("--overlap", optarg, true), allreduceOnly = "--overlap"; break;
      case kMemory:
        if (strcmp(optarg, "host") == 0) g_memory = SHOAL_MEMORY_HOST;
        else if (strcmp(optarg, "cuda") == 0) g_memory = SHOAL_MEMORY_CUDA;
        else usageError("--memory: '%s' is neither host nor cuda", optarg);
        break;
      case 'L':
        if (shoal_compressors_print(stdout) != SHOAL_OK) usageError("%s", shoal_last_error(nullptr));
        exit(0);
      case 'h': usage(); exit(0);
      case ':': usageError("option %s needs a value", argv[optind - 1]);
      default: usageError("unknown option %s", optopt ? format("-%c", optopt).c_str() : argv[optind - 1]);
    }
  }
  if (optind < argc && !(o.coll = findColl(argv[optind])))
    usageError("unknown collective '%s' (allreduce, allgather, broadcast, reduce_scatter)", argv[optind]);
  if (optind + 1 < argc) usageError("unexpected argument '%s'", argv[optind + 1]);
  if (o.minBytes == 0) usageError("-b: the smallest size must be at least 1 byte");
  if (o.maxBytes < o.minBytes) usageError("-e %zu is smaller than -b %zu", o.maxBytes, o.minBytes);
  if (o.stepFactor < 2 && o.stepBytes == 0) usageError("-i: the step must be at least 1 byte");
  if (g_memory == SHOAL_MEMORY_CUDA && o.coll != &kCollTests[0] && o.coll != &kCollTests[1])
    usageError("--memory cuda: allreduce and allgather only, not %s", o.coll->name);
  const bool bitwise = o.op == SHOAL_BAND || o.op == SHOAL_BOR || o.op == SHOAL_BXOR;
  if (o.coll->hasOp && bitwise && kTypes[o.dtype].isFloat)
    usageError("-o %s needs an integer dtype, not %s", shoal_op_name(o.op), shoal_dtype_name(o.dtype));
  if (o.coll != &kCollTests[0]) {  // SHOAL_COMPRESSOR does not touch the other collectives
    if (allreduceOnly) usageError("%s applies to allreduce only, not %s", allreduceOnly, o.coll->name);
    return o;
  }
  const char *from = o.compressor ? "--compressor" : "SHOAL_COMPRESSOR";
  if (!o.compressor) o.compressor = getenv("SHOAL_COMPRESSOR");
  if (!o.compressor || !*o.compressor) o.compressor = "none";
  if (strcmp(o.compressor, "none") != 0 && shoal_compressor_lookup(o.compressor, &o.table) != SHOAL_OK)
    usageError("%s: %s", from, shoal_last_error(nullptr));
  return o;
}

// ---- driver ----------------------------------------------------------------------------------

shoal_comm_t g_comm = nullptr;

[[noreturn]] void fail(const std::string &what, shoal_status_t s) {
  fprintf(stderr, "shoal-bench: rank %d: %s failed: %s: %s\n", g_rank, what.c_str(), shoal_status_string(s),
          shoal_last_error(g_comm));
  shoal_comm_destroy(g_comm);
  exit(1);
}
#define CHECK(call) \
  do { if (const shoal_status_t s_ = (call); s_ != SHOAL_OK) fail(#call, s_); } while (0)

// The bench's own bookkeeping, never compressed whatever SHOAL_COMPRESSOR says.
shoal_status_t plainAllreduce(void *buf, size_t count, shoal_dtype_t dtype, shoal_op_t op) {
  shoal_allreduce_options_t options = SHOAL_ALLREDUCE_OPTIONS_INIT;
  options.compressor = "none";
  const shoal_tensor_t t = shoal_tensor_1d(buf, count, dtype);
  return shoal_allreduce_tensor(g_comm, &t, &t, op, &options);
}

void printTableHeader() {
  int half = 0;
  for (const Column &c : kColumns) half += shown(c, false) ? 2 + c.width : 0;
  std::string line[3] = {format("# %10s  %12s  %8s  %6s  %6s", "", "", "", "", ""),
                         format("# %10s  %12s  %8s  %6s  %6s", "size", "count", "type", "redop", "root"),
                         format("# %10s  %12s  %8s  %6s  %6s", "(B)", "(elements)", "", "", "")};
  for (const char *title : kModeTitle) {
    const int pad = (half - int(strlen(title))) / 2;
    line[0] += format("%*s%-*s", pad, "", half - pad, title);
    for (const Column &c : kColumns) {
      if (!shown(c, false)) continue;
      line[1] += format("  %*s", c.width, c.title);
      line[2] += format("  %*s", c.width, c.unit);
    }
  }
  for (std::string &l : line) printf("%s\n", l.erase(l.find_last_not_of(' ') + 1).c_str());
}

// What the compressor columns and #wrong mean for this run, and what the input looks like.
void printCompressorHeader(const Options &o, int nranks) {
  if (const shoal_compressor_t *t = o.table) {
    const char *copts = o.copts ? o.copts : getenv("SHOAL_COMPRESSOR_OPTS");
    printf("# compressor %s, options '%s', min bytes %lld, tensor name bench_<count>: ", t->name,
           copts ? copts : "", o.compressMinBytes);
    if (t->error_kind == SHOAL_ERROR_EXACT) printf("lossless, #wrong counts outputs unequal to the exact result\n");
    else if (t->error_kind == SHOAL_ERROR_RELATIVE)
      printf("#wrong counts |out - exact| > %g * n * sum_r |x_r|\n", t->error_bound);
    else printf("error feedback; FEEDBACK compressors are checked for finiteness only "
                "(the conformance suite checks them fully)\n");
    if (!((t->dtypes >> o.dtype) & 1u) || (o.op != SHOAL_SUM && o.op != SHOAL_AVG))
      printf("# note: %s does not compress %s %s: every call goes uncompressed (ratio 1, exact check)\n", t->name,
             shoal_dtype_name(o.dtype), shoal_op_name(o.op));
  }
  if (o.density < 1) {
    double common, arc;
    sparsity(o.density, o.overlap, &common, &arc);
    printf("# input density %g, overlap %g: %g of positions common to all ranks, %g of the rest per rank%s\n",
           o.density, o.overlap, common, arc,
           nranks * arc > 1 + 1e-9 ? " (more than 1/nranks: private positions overlap too)" : "");
  }
}

void writeJson(FILE *f, const Options &o, int nranks, const char *algo, const char *opName,
               const std::vector<Row> &rows, double avgBusBw, int64_t wrong) {
  const char *type = shoal_dtype_name(o.dtype);  // every string here is a name without quotes
  fprintf(f, "{\"collective\": \"%s\", \"nranks\": %d, \"algorithm\": \"%s\", \"dtype\": \"%s\", \"op\": \"%s\",\n",
          o.coll->name, nranks, algo, type, opName);
  fprintf(f, " \"iters\": %d, \"warmup\": %d, \"check\": %s, \"avg_busbw\": %.6g, \"wrong\": %" PRId64 ",\n",
          o.iters, o.warmup, o.check ? "true" : "false", avgBusBw, wrong);
  if (o.table) {  // names are [a-z0-9_]+; the options are escaped below
    std::string copts;
    for (const char *c = o.copts ? o.copts : getenv("SHOAL_COMPRESSOR_OPTS"); c && *c; ++c)
      copts += *c == '"' || *c == '\\' ? format("\\%c", *c)
               : uint8_t(*c) < 0x20    ? format("\\u%04x", *c)
                                       : std::string(1, *c);
    static const char *const kKinds[] = {"exact", "relative", "feedback"};
    fprintf(f, " \"compressor\": \"%s\", \"compressor_options\": \"%s\", \"compress_min_bytes\": %lld,"
            " \"error_kind\": \"%s\", \"error_bound\": %.6g,\n", o.table->name, copts.c_str(), o.compressMinBytes,
            kKinds[o.table->error_kind % 3], o.table->error_bound);
  }
  if (o.table || o.density < 1) fprintf(f, " \"density\": %.6g, \"overlap\": %.6g,\n", o.density, o.overlap);
  fprintf(f, " \"results\": [");
  for (size_t i = 0; i < rows.size(); ++i) {
    const Row &r = rows[i];
    fprintf(f, "%s\n  {\"size\": %zu, \"count\": %zu, \"type\": \"%s\", \"redop\": \"%s\", \"root\": %d",
            i ? "," : "", r.size, r.count, type, opName, o.coll->hasRoot ? o.root : -1);
    for (int m = 0; m < 2; ++m) {
      fprintf(f, ", \"%s\": {", kModeJson[m]);
      const char *sep = "";
      for (const Column &c : kColumns)
        if (shown(c, true)) fprintf(f, "%s\"%s\": %s", sep, c.jsonKey, c.value(r.res[m], true).c_str()), sep = ", ";
      fprintf(f, "}");
    }
    fprintf(f, "}");
  }
  fprintf(f, "\n ]}\n");
}

}  // namespace

int main(int argc, char **argv) {
  const Options o = parseArgs(argc, argv);
  const CollTest &coll = *o.coll;

  shoal_config_t config = SHOAL_CONFIG_INIT;  // rank, size and store from the environment
  config.algorithm = o.algorithm;
  if (shoal_status_t s = shoal_comm_init_config(&config, &g_comm); s != SHOAL_OK) {
    const bool badArg = s == SHOAL_ERR_NOT_FOUND || s == SHOAL_ERR_INVALID_ARGUMENT;
    if (badArg) usageError("%s: %s", shoal_status_string(s), shoal_last_error(nullptr));
    fprintf(stderr, "shoal-bench: shoal_comm_init_config failed: %s: %s\n", shoal_status_string(s),
            shoal_last_error(nullptr));
    exit(1);
  }
  int nranks = 0;
  CHECK(shoal_comm_rank(g_comm, &g_rank));
  CHECK(shoal_comm_size(g_comm, &nranks));
  if (coll.hasRoot && o.root >= nranks) usageError("-r %d: the root must be below nranks %d", o.root, nranks);
  const bool rank0 = g_rank == 0;
  g_compressorColumns = o.table != nullptr;
  const char *env = getenv("SHOAL_ALGO");
  const char *algo = o.algorithm ? o.algorithm : env && *env ? env : "auto";
  const char *opName = coll.hasOp ? shoal_op_name(o.op) : "none";
  const char *type = shoal_dtype_name(o.dtype);

  // --memory cuda: every rank needs a device before anything is printed.
  if (g_memory == SHOAL_MEMORY_CUDA) {
    const char *local = getenv("SHOAL_LOCAL_RANK");
    std::string why = selectDevice(local ? atoi(local) : g_rank, &g_device);
    int32_t bad = !why.empty();
    CHECK(plainAllreduce(&bad, 1, SHOAL_I32, SHOAL_MAX));
    if (bad) {
      fprintf(stderr, "shoal-bench: rank %d: --memory cuda: %s\n", g_rank, why.empty() ? "another rank has no device" : why.c_str());
      exit(1);
    }
  }

  // Open the JSON file now, so that a bad path stops every rank before the sweep.
  FILE *json = rank0 && o.jsonPath ? fopen(o.jsonPath, "w") : nullptr;
  const int openErrno = errno;
  int32_t jsonBad = rank0 && o.jsonPath && !json;
  CHECK(plainAllreduce(&jsonBad, 1, SHOAL_I32, SHOAL_MAX));
  if (jsonBad) usageError("--json: cannot write %s: %s", o.jsonPath, strerror(openErrno));

  // nccl-tests' "Using devices" block: where each rank runs.
  struct RankInfo { int32_t pid; char host[60]; } me{int32_t(getpid()), {}};
  std::vector<RankInfo> all(static_cast<size_t>(nranks));
  gethostname(me.host, sizeof me.host - 1);
  CHECK(shoal_allgather(g_comm, &me, all.data(), sizeof me, SHOAL_U8));
  if (rank0) {
    printf("# shoal-bench %s: nranks %d, algorithm %s, dtype %s, op %s, minBytes %zu maxBytes %zu ", coll.name,
           nranks, algo, type, opName, o.minBytes, o.maxBytes);
    printf(o.stepBytes ? "step: %zu(bytes)" : "step: %zu(factor)", o.stepBytes ? o.stepBytes : o.stepFactor);
    printf(" warmup iters: %d iters: %d validation: %d memory: %s\n", o.warmup, o.iters, o.check ? 1 : 0,
           g_memory == SHOAL_MEMORY_CUDA ? "cuda" : "host");
    printCompressorHeader(o, nranks);
    printf("#\n");
    printf("# Using ranks\n");
    for (int r = 0; r < nranks; ++r) printf("#  Rank %2d Pid %7d on %s\n", r, all[r].pid, all[r].host);
    printf("#\n");
    printTableHeader();
    fflush(stdout);
  }

  // Both buffers are allocated once, at the largest size, 64-byte aligned.
  const size_t bufBytes = (o.maxBytes + 63) / 64 * 64;
  char *sendbuf = static_cast<char *>(std::aligned_alloc(64, bufBytes));
  char *recvbuf = static_cast<char *>(std::aligned_alloc(64, bufBytes));
  if (!sendbuf || !recvbuf) fail(format("allocating 2 x %zu bytes", bufBytes), SHOAL_ERR_NO_MEMORY);
  // --memory cuda: device twins of both buffers; every rank learns whether all got theirs.
  char *deviceSend = nullptr, *deviceRecv = nullptr;
  if (g_memory == SHOAL_MEMORY_CUDA) {
    std::string why = deviceAlloc(bufBytes, reinterpret_cast<void **>(&deviceSend));
    if (why.empty()) why = deviceAlloc(bufBytes, reinterpret_cast<void **>(&deviceRecv));
    int32_t bad = !why.empty();
    CHECK(plainAllreduce(&bad, 1, SHOAL_I32, SHOAL_MAX));
    if (bad) {
      fprintf(stderr, "shoal-bench: rank %d: --memory cuda: %s\n", g_rank, why.empty() ? "another rank failed" : why.c_str());
      exit(1);
    }
  }
  // The device twin of a host pointer into sendbuf or recvbuf (itself for host memory).
  auto onDevice = [&](char *p) -> char * {
    if (!deviceSend) return p;
    return p >= recvbuf && p < recvbuf + bufBytes ? deviceRecv + (p - recvbuf) : deviceSend + (p - sendbuf);
  };
  auto deviceCopy = [&](const std::string &why) {
    if (!why.empty()) fail("--memory cuda: " + why, SHOAL_ERR_SYSTEM);
  };

  const TypeInfo &ti = kTypes[o.dtype];
  const size_t ts = shoal_dtype_size(o.dtype);
  Ctx x{o.dtype, o.op, nranks, g_rank, o.root, {}, ts, 8 * ts, ti.isSigned,
        std::min<int64_t>(3, ti.exactLimit / nranks), ti.plainMod};
  const shoal_compressor_t *table = o.table;  // NULL: allreduce goes uncompressed
  shoal_allreduce_options_t arOpts = SHOAL_ALLREDUCE_OPTIONS_INIT;
  arOpts.compressor = table ? table->name : "none";
  arOpts.compressor_options = o.copts;
  arOpts.compress_min_bytes = o.compressMinBytes;
  std::string tensorName;  // per size: a name keeps its count (stateful compressors check that)
  x.arOpts = &arOpts;
  if (table && ti.isFloat && (o.op == SHOAL_SUM || o.op == SHOAL_AVG))  // normal numbers, exact sums
    x.richMax = std::clamp<int64_t>(ti.exactLimit / nranks, 1, 4095), x.scale = 0x1p-12;
  x.sparse = o.density < 1;
  sparsity(o.density, o.overlap, &x.common, &x.arc);
  char *pristine = nullptr;  // the input of timed in-place calls, restored before each
  if (table && !(pristine = static_cast<char *>(std::aligned_alloc(64, bufBytes))))
    fail(format("allocating %zu bytes", bufBytes), SHOAL_ERR_NO_MEMORY);
  std::vector<Row> rows;
  int64_t totalWrong = 0;
  double busBwSum = 0;
  auto nextSize = [&](size_t size) -> size_t {  // 0 ends the sweep on overflow
    const size_t next = o.stepBytes ? size + o.stepBytes : size * o.stepFactor;
    return next <= size || (!o.stepBytes && next / o.stepFactor != size) ? 0 : next;
  };
  for (size_t size = o.minBytes; size && size <= o.maxBytes; size = nextSize(size)) {
    x.c = coll.getCollByteCount(size / ts, nranks);
    Row row{std::max(x.c.sendCount, x.c.recvCount) * ts, x.c.paramCount, {}};
    if (row.count == 0) {
      if (rank0) printf("# skipping size %zu: less than one %s per rank\n", size, type);
      continue;
    }
    tensorName = format("bench_%zu", row.count);
    arOpts.name = tensorName.c_str();
    double timeUs[2] = {0, 0};
    int64_t wrong[2] = {0, 0};
    uint64_t bytes[2][4] = {};  // per mode, summed over ranks: input, payload, wire, compressed calls
    for (int inPlace = 0; inPlace < 2; ++inPlace) {
      using Clock = std::chrono::steady_clock;
      using Us = std::chrono::duration<double, std::micro>;
      char *s, *r;
      collPointers(x, inPlace, sendbuf, recvbuf, &s, &r);
      // Inputs are made and checked on the host; for CUDA memory they travel here.
      auto toDevice = [&] {
        if (!deviceSend) return;
        deviceCopy(copyToDevice(onDevice(r), r, x.c.recvCount * ts));
        deviceCopy(copyToDevice(onDevice(s), s, x.c.sendCount * ts));
      };
      auto run = [&] {
        if (shoal_status_t st = coll.runColl(g_comm, onDevice(s), onDevice(r), x); st != SHOAL_OK)
          fail(format("%s (%s, %zu bytes)", coll.name, kModeTitle[inPlace], row.size), st);
      };
      const bool restore = pristine && inPlace;
      double copyUs = 0;  // the restores' time, taken out of the timed loop's
      auto restoreInput = [&] {
        if (!restore) return;
        const auto c0 = Clock::now();
        if (deviceSend) deviceCopy(copyToDevice(onDevice(s), pristine, x.c.sendCount * ts));
        else std::memcpy(s, pristine, x.c.sendCount * ts);
        copyUs += Us(Clock::now() - c0).count();
      };
      initData(coll, x, s, r, inPlace, /*forTiming=*/!restore);
      if (restore) std::memcpy(pristine, s, x.c.sendCount * ts);
      toDevice();
      for (int i = 0; i < o.warmup; ++i) restoreInput(), run();
      CHECK(shoal_barrier(g_comm));
      copyUs = 0;
      const auto t0 = Clock::now();
      for (int i = 0; i < o.iters; ++i) restoreInput(), run();
      timeUs[inPlace] = std::max(0.0, Us(Clock::now() - t0).count() - copyUs) / o.iters;
      shoal_compress_stats_t st = SHOAL_COMPRESS_STATS_INIT;  // of the last timed call
      if (table) CHECK(shoal_last_compress_stats(g_comm, &st));
      const bool compressed = table && strcmp(st.compressor, "none") != 0;
      uint64_t *b = bytes[inPlace];
      b[0] = st.input_bytes, b[1] = compressed ? st.payload_bytes : st.input_bytes;
      b[2] = compressed ? st.wire_bytes : 0, b[3] = compressed;
      if (o.check) {  // one more run, from fresh inputs, verified element by element
        initData(coll, x, s, r, inPlace, /*forTiming=*/false);
        toDevice();
        run();
        if (deviceRecv) deviceCopy(copyToHost(r, onDevice(r), x.c.recvCount * ts));
        Check how;  // uncompressed calls are exact
        if (compressed) how = {table->error_kind, table->error_bound};
        wrong[inPlace] = checkData(coll, x, r, how);
      }
    }
    // The slowest rank's time, and the wrong elements and bytes of all ranks.
    CHECK(plainAllreduce(timeUs, 2, SHOAL_F64, SHOAL_MAX));
    CHECK(plainAllreduce(wrong, 2, SHOAL_I64, SHOAL_SUM));
    if (table) CHECK(plainAllreduce(bytes, 8, SHOAL_U64, SHOAL_SUM));
    for (int m = 0; m < 2; ++m) {
      const uint64_t *b = bytes[m];
      const double moved = table ? double(b[1]) / nranks : double(row.size);  // per rank
      const double algBw = timeUs[m] > 0 ? moved / 1e3 / timeUs[m] : 0;  // B/us / 1e3 = GB/s
      row.res[m] = {timeUs[m], algBw, algBw * coll.busbwFactor(nranks), o.check ? wrong[m] : -1,
                    b[1] ? double(b[0]) / double(b[1]) : 0, moved,
                    b[3] == uint64_t(nranks) ? double(b[2]) / nranks : -1,
                    timeUs[m] > 0 ? double(row.size) / 1e3 / timeUs[m] : 0};
      busBwSum += row.res[m].busBw;
      totalWrong += wrong[m];
    }
    if (rank0) {
      printf("%12zu  %12zu  %8s  %6s  %6d", row.size, row.count, type, opName, coll.hasRoot ? o.root : -1);
      for (const Result &res : row.res)
        for (const Column &c : kColumns)
          if (shown(c, false)) printf("  %*s", c.width, c.value(res, false).c_str());
      printf("\n");
      fflush(stdout);
    }
    rows.push_back(row);
  }

  const double avgBusBw = rows.empty() ? 0 : busBwSum / double(2 * rows.size());
  if (rank0) {
    printf("# Out of bounds values : %" PRId64 " %s\n", totalWrong, totalWrong ? "FAILED" : "OK");
    printf("# Avg bus bandwidth    : %g\n#\n", avgBusBw);
    fflush(stdout);
  }
  if (json) {
    writeJson(json, o, nranks, algo, opName, rows, avgBusBw, totalWrong);
    if (fclose(json) != 0) fail(format("writing %s (%s)", o.jsonPath, strerror(errno)), SHOAL_ERR_SYSTEM);
  }
  std::free(sendbuf);
  std::free(recvbuf);
  std::free(pristine);
  deviceFree(deviceSend);
  deviceFree(deviceRecv);
  CHECK(shoal_comm_finalize(g_comm));
  shoal_comm_destroy(g_comm);
  return totalWrong ? 1 : 0;
}
