// shoal-bench: nccl-tests-style sweep of one shoal collective on host memory, e.g.
//   shoalrun -np 4 shoal-bench allreduce -b 8 -e 256M -f 2 -n 20 -w 5 -c 1 -d float -o sum
//
// nccl-tests' vocabulary (src/common.h): each collective is one CollTest row {name, description,
// getCollByteCount, input, expected, runColl, busbwFactor}; one driver sweeps the sizes, times
// out-of-place then in-place runs, verifies one extra run of each, prints on rank 0, writes JSON.
// The cells after `size count type redop root` come from the kColumns table (text and JSON);
// compressor columns (ratio, bytes sent, effective algbw) are new Result fields + kColumns rows.
// Checked inputs are small integers or bit patterns, chosen per dtype and op so that the exact
// result is known whatever the reduction order; only float avg allows 2 ULP (as nccl-tests).

#include <getopt.h>
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

namespace {

int g_rank = -1;  // this process's rank once the communicator exists

__attribute__((format(printf, 1, 2))) std::string format(const char *fmt, ...) {
  char buf[256];
  va_list ap;
  va_start(ap, fmt);
  vsnprintf(buf, sizeof buf, fmt, ap);
  va_end(ap);
  return buf;
}

// ---- data types: host-side encoding of the values we send and expect -----------------

struct TypeInfo {
  bool isFloat, isSigned;
  int64_t exactLimit;  // every integer in [0, exactLimit] is exact (enough for what we use)
  int64_t plainMod;    // prime modulus of the values moved without reduction
  uint64_t infBits;    // floats: the bits of +inf; larger magnitudes are NaN
};
const TypeInfo kTypes[SHOAL_DTYPE_COUNT] = {
    {true, true, 2048, 2039, 0x7c00u},                     // f16
    {true, true, 256, 251, 0x7f80u},                       // bf16
    {true, true, 1 << 24, 1000003, 0x7f800000u},           // f32
    {true, true, 1 << 24, 1000003, 0x7ff0000000000000u},   // f64
    {false, true, 127, 127, 0},                            // i8
    {false, false, 255, 127, 0},                           // u8
    {false, true, 1 << 24, 1000003, 0},                    // i32
    {false, false, 1 << 24, 1000003, 0},                   // u32
    {false, true, 1 << 24, 1000003, 0},                    // i64
    {false, false, 1 << 24, 1000003, 0},                   // u64
};

uint16_t toHalf(float f) {  // IEEE binary16, round to nearest even
  uint32_t x;
  std::memcpy(&x, &f, 4);
  const uint32_t sign = (x >> 16) & 0x8000u;
  x &= 0x7fffffffu;
  if (x >= 0x7f800000u) return uint16_t(sign | (x > 0x7f800000u ? 0x7e00u : 0x7c00u));
  if (x >= 0x477ff000u) return uint16_t(sign | 0x7c00u);  // >= 65520 rounds to inf
  if (x < 0x38800000u) {                                    // below 2^-14: subnormal half
    float a;
    std::memcpy(&a, &x, 4);
    return uint16_t(sign | uint32_t(std::nearbyint(a * 16777216.0f)));
  }
  uint32_t h = (((x >> 23) - 112) << 10) | ((x & 0x7fffffu) >> 13);  // rebias 127 -> 15
  const uint32_t rest = x & 0x1fffu;
  if (rest > 0x1000u || (rest == 0x1000u && (h & 1))) ++h;
  return uint16_t(sign | h);
}

uint16_t toBf16(float f) {  // round to nearest even
  uint32_t x;
  std::memcpy(&x, &f, 4);
  if ((x & 0x7fffffffu) > 0x7f800000u) return uint16_t((x >> 16) | 0x40u);
  return uint16_t((x + 0x7fffu + ((x >> 16) & 1u)) >> 16);
}

template <typename T> void put(char *buf, size_t k, T v) { std::memcpy(buf + k * sizeof(T), &v, sizeof(T)); }

// Element k of buf = i for integer dtypes (truncated to the width), d for float dtypes.
void store(shoal_dtype_t t, char *buf, size_t k, int64_t i, double d) {
  switch (t) {
    case SHOAL_F16: put(buf, k, toHalf(float(d))); break;
    case SHOAL_BF16: put(buf, k, toBf16(float(d))); break;
    case SHOAL_F32: put(buf, k, float(d)); break;
    case SHOAL_F64: put(buf, k, d); break;
    case SHOAL_I8: put(buf, k, int8_t(i)); break;
    case SHOAL_U8: put(buf, k, uint8_t(i)); break;
    case SHOAL_I32: put(buf, k, int32_t(i)); break;
    case SHOAL_U32: put(buf, k, uint32_t(i)); break;
    case SHOAL_I64: put(buf, k, int64_t(i)); break;
    default: put(buf, k, uint64_t(i)); break;
  }
}

// Integers compare bit for bit; floats by distance in ULPs (so -0 == +0), NaN never matches.
bool sameValue(shoal_dtype_t t, const char *got, const char *want, int64_t ulps) {
  const size_t ts = shoal_dtype_size(t);
  if (!kTypes[t].isFloat) return std::memcmp(got, want, ts) == 0;
  uint64_t a = 0, b = 0;
  std::memcpy(&a, got, ts);
  std::memcpy(&b, want, ts);
  const uint64_t signBit = uint64_t{1} << (8 * ts - 1), inf = kTypes[t].infBits;
  auto ordered = [&](uint64_t u) { return (u & signBit ? -1 : 1) * int64_t(u & (signBit - 1)); };
  if ((a & (signBit - 1)) > inf || (b & (signBit - 1)) > inf) return false;
  return std::llabs(ordered(a) - ordered(b)) <= ulps;
}

// ---- verifiable inputs ------------------------------------------------------------------

struct Counts {  // elements, as nccl-tests' getCollByteCount
  size_t sendCount, recvCount, paramCount, sendInplaceOffset, recvInplaceOffset;
};

struct Ctx {  // everything the value functions need for one size
  shoal_dtype_t dtype;
  shoal_op_t op;
  int nranks, rank, root;
  Counts c;
  size_t ts, bits;  // type size in bytes and bits
  bool isSigned;
  int64_t sumMax;  // sum/avg inputs lie in [0, sumMax]; 0 = one rank holds a 1
  int64_t plainMod;
};

// Rank r's contribution at global index k of a reduction.
int64_t redValue(const Ctx &x, int r, size_t k) {
  const size_t rk = size_t(r) + k, n = size_t(x.nranks), bits = x.bits;
  switch (x.op) {
    case SHOAL_SUM:
    case SHOAL_AVG: return x.sumMax > 0 ? int64_t(rk % size_t(x.sumMax + 1)) : int64_t(rk % n == 0);
    case SHOAL_PROD:  // one 2 per element, and -1s where signed: |product| == 2
      if (rk % n == 0) return 2;
      return x.isSigned && (3 * size_t(r) + k) % 5 == 0 ? -1 : 1;
    case SHOAL_MIN:
    case SHOAL_MAX: {  // distinct per rank (up to 127 ranks), negative too where signed
      const size_t span = std::min<size_t>(n, 127);
      return int64_t(rk % n % span) - (x.isSigned ? int64_t(span / 2) : 0);
    }
    case SHOAL_BAND: return int64_t(~(uint64_t{1} << ((5 * size_t(r) + k) % bits)));
    case SHOAL_BOR: return int64_t(uint64_t{1} << ((5 * size_t(r) + k) % (bits - 1)));  // never all ones
    default: return int64_t((uint64_t(r) + 1) * 0x9e3779b97f4a7c15ull ^ (k + 1) * 0xbf58476d1ce4e5b9ull);  // BXOR
  }
}

// The reduction over all ranks at global index k (before avg's division).
int64_t reduceOverRanks(const Ctx &x, size_t k) {
  int64_t acc = redValue(x, 0, k);
  for (int r = 1; r < x.nranks; ++r) {
    const int64_t v = redValue(x, r, k);
    switch (x.op) {
      case SHOAL_SUM:
      case SHOAL_AVG: acc += v; break;
      case SHOAL_PROD: acc *= v; break;
      case SHOAL_MIN: acc = std::min(acc, v); break;
      case SHOAL_MAX: acc = std::max(acc, v); break;
      case SHOAL_BAND: acc &= v; break;
      case SHOAL_BOR: acc |= v; break;
      default: acc ^= v; break;
    }
  }
  return acc;
}

// Values of allgather/broadcast: differ between ranks at every index, never the sentinel.
int64_t plainValue(const Ctx &x, int r, size_t k) {
  return int64_t((size_t(r) * 31 + k * 7 + 1) % size_t(x.plainMod));
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
     [](auto comm, auto s, auto r, auto &x) { return shoal_allreduce(comm, s, r, x.c.paramCount, x.dtype, x.op); },
     [](int n) { return 2.0 * (n - 1) / n; }},
    {"allgather", "every rank receives all ranks' blocks, rank r's at r * count", false, false,
     [](size_t count, int n) { return Counts{count / n, count / n * n, count / n, count / n, 0}; },
     [](const Ctx &x, size_t k) { return plainValue(x, x.rank, k); },
     [](const Ctx &x, size_t k) { return plainValue(x, int(k / x.c.paramCount), k % x.c.paramCount); },
     [](auto comm, auto s, auto r, auto &x) { return shoal_allgather(comm, s, r, x.c.paramCount, x.dtype); },
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
    store(x.dtype, send, k, v, double(v));
  }
}

int64_t checkData(const CollTest &coll, const Ctx &x, const char *recv) {
  const bool avg = coll.hasOp && x.op == SHOAL_AVG;
  const int64_t ulps = avg && kTypes[x.dtype].isFloat ? 2 : 0;
  int64_t wrong = 0;
  char want[8];
  for (size_t k = 0; k < x.c.recvCount; ++k) {
    const int64_t v = coll.expected(x, k);
    if (avg) store(x.dtype, want, 0, v / x.nranks, double(v) / x.nranks);  // ints truncate
    else store(x.dtype, want, 0, v, double(v));
    wrong += !sameValue(x.dtype, recv + k * x.ts, want, ulps);
  }
  return wrong;
}

// ---- output columns --------------------------------------------------------------------------

struct Result {  // one run (out-of-place or in-place) of one size, already combined over ranks
  double timeUs = 0, algBw = 0, busBw = 0;
  int64_t wrong = -1;  // -1 = not checked
};

struct Column {
  const char *title, *unit, *jsonKey;
  int width;
  std::string (*value)(const Result &, bool json);  // the cell's text, or its JSON value
};

const Column kColumns[] = {
    {"time", "(us)", "time_us", 7, [](const Result &r, bool json) {
       return format(json ? "%.3f" : r.timeUs >= 10000 ? "%.0f" : r.timeUs >= 100 ? "%.1f" : "%.2f", r.timeUs);
     }},
    {"algbw", "(GB/s)", "algbw", 6, [](const Result &r, bool json) { return format(json ? "%.6g" : "%.2f", r.algBw); }},
    {"busbw", "(GB/s)", "busbw", 6, [](const Result &r, bool json) { return format(json ? "%.6g" : "%.2f", r.busBw); }},
    {"#wrong", "", "wrong", 6, [](const Result &r, bool json) {
       return r.wrong >= 0 ? format("%" PRId64, r.wrong) : std::string(json ? "null" : "N/A");
     }},
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
         "  --list-compressors   list the compressors and exit\n"
         "  -h, --help           this help\n"
         "\nsize is the total bytes (for allgather and reduce_scatter: count x type size x nranks),\n"
         "count the elements per call; busbw = algbw x 2(n-1)/n (allreduce), (n-1)/n (allgather,\n"
         "reduce_scatter), 1 (broadcast), GB = 1e9. Time is the slowest rank's mean per iteration.\n");
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
  const option longOpts[] = {{"json", required_argument, nullptr, 'J'},
                             {"list-compressors", no_argument, nullptr, 'L'},
                             {"help", no_argument, nullptr, 'h'},
                             {nullptr, 0, nullptr, 0}};
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
      case 'L': puts("none"); exit(0);
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
  const bool bitwise = o.op == SHOAL_BAND || o.op == SHOAL_BOR || o.op == SHOAL_BXOR;
  if (o.coll->hasOp && bitwise && kTypes[o.dtype].isFloat)
    usageError("-o %s needs an integer dtype, not %s", shoal_op_name(o.op), shoal_dtype_name(o.dtype));
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

void printTableHeader() {
  int half = 0;
  for (const Column &c : kColumns) half += 2 + c.width;
  std::string line[3] = {format("# %10s  %12s  %8s  %6s  %6s", "", "", "", "", ""),
                         format("# %10s  %12s  %8s  %6s  %6s", "size", "count", "type", "redop", "root"),
                         format("# %10s  %12s  %8s  %6s  %6s", "(B)", "(elements)", "", "", "")};
  for (const char *title : kModeTitle) {
    const int pad = (half - int(strlen(title))) / 2;
    line[0] += format("%*s%-*s", pad, "", half - pad, title);
    for (const Column &c : kColumns) {
      line[1] += format("  %*s", c.width, c.title);
      line[2] += format("  %*s", c.width, c.unit);
    }
  }
  for (std::string &l : line) printf("%s\n", l.erase(l.find_last_not_of(' ') + 1).c_str());
}

void writeJson(FILE *f, const Options &o, int nranks, const char *algo, const char *opName,
               const std::vector<Row> &rows, double avgBusBw, int64_t wrong) {
  const char *type = shoal_dtype_name(o.dtype);  // every string here is a name without quotes
  fprintf(f, "{\"collective\": \"%s\", \"nranks\": %d, \"algorithm\": \"%s\", \"dtype\": \"%s\", \"op\": \"%s\",\n",
          o.coll->name, nranks, algo, type, opName);
  fprintf(f, " \"iters\": %d, \"warmup\": %d, \"check\": %s, \"avg_busbw\": %.6g, \"wrong\": %" PRId64 ",\n",
          o.iters, o.warmup, o.check ? "true" : "false", avgBusBw, wrong);
  fprintf(f, " \"results\": [");
  for (size_t i = 0; i < rows.size(); ++i) {
    const Row &r = rows[i];
    fprintf(f, "%s\n  {\"size\": %zu, \"count\": %zu, \"type\": \"%s\", \"redop\": \"%s\", \"root\": %d",
            i ? "," : "", r.size, r.count, type, opName, o.coll->hasRoot ? o.root : -1);
    for (int m = 0; m < 2; ++m) {
      fprintf(f, ", \"%s\": {", kModeJson[m]);
      for (size_t c = 0; c < std::size(kColumns); ++c)
        fprintf(f, "%s\"%s\": %s", c ? ", " : "", kColumns[c].jsonKey, kColumns[c].value(r.res[m], true).c_str());
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
  const char *env = getenv("SHOAL_ALGO");
  const char *algo = o.algorithm ? o.algorithm : env && *env ? env : "auto";
  const char *opName = coll.hasOp ? shoal_op_name(o.op) : "none";
  const char *type = shoal_dtype_name(o.dtype);

  // Open the JSON file now, so that a bad path stops every rank before the sweep.
  FILE *json = rank0 && o.jsonPath ? fopen(o.jsonPath, "w") : nullptr;
  const int openErrno = errno;
  int32_t jsonBad = rank0 && o.jsonPath && !json;
  CHECK(shoal_allreduce(g_comm, &jsonBad, &jsonBad, 1, SHOAL_I32, SHOAL_MAX));
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
    printf(" warmup iters: %d iters: %d validation: %d\n#\n", o.warmup, o.iters, o.check ? 1 : 0);
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

  const TypeInfo &ti = kTypes[o.dtype];
  const size_t ts = shoal_dtype_size(o.dtype);
  Ctx x{o.dtype, o.op, nranks, g_rank, o.root, {}, ts, 8 * ts, ti.isSigned,
        std::min<int64_t>(3, ti.exactLimit / nranks), ti.plainMod};
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
    double timeUs[2] = {0, 0};
    int64_t wrong[2] = {0, 0};
    for (int inPlace = 0; inPlace < 2; ++inPlace) {
      char *s, *r;
      collPointers(x, inPlace, sendbuf, recvbuf, &s, &r);
      auto run = [&] {
        if (shoal_status_t st = coll.runColl(g_comm, s, r, x); st != SHOAL_OK)
          fail(format("%s (%s, %zu bytes)", coll.name, kModeTitle[inPlace], row.size), st);
      };
      initData(coll, x, s, r, inPlace, /*forTiming=*/true);
      for (int i = 0; i < o.warmup; ++i) run();
      CHECK(shoal_barrier(g_comm));
      const auto t0 = std::chrono::steady_clock::now();
      for (int i = 0; i < o.iters; ++i) run();
      const std::chrono::duration<double, std::micro> elapsed = std::chrono::steady_clock::now() - t0;
      timeUs[inPlace] = elapsed.count() / o.iters;
      if (o.check) {  // one more run, from fresh inputs, verified element by element
        initData(coll, x, s, r, inPlace, /*forTiming=*/false);
        run();
        wrong[inPlace] = checkData(coll, x, r);
      }
    }
    // The slowest rank's time, and the wrong elements of all ranks.
    CHECK(shoal_allreduce(g_comm, timeUs, timeUs, 2, SHOAL_F64, SHOAL_MAX));
    CHECK(shoal_allreduce(g_comm, wrong, wrong, 2, SHOAL_I64, SHOAL_SUM));
    for (int m = 0; m < 2; ++m) {
      const double algBw = timeUs[m] > 0 ? double(row.size) / 1e3 / timeUs[m] : 0;  // B/us / 1e3 = GB/s
      row.res[m] = {timeUs[m], algBw, algBw * coll.busbwFactor(nranks), o.check ? wrong[m] : -1};
      busBwSum += row.res[m].busBw;
      totalWrong += wrong[m];
    }
    if (rank0) {
      printf("%12zu  %12zu  %8s  %6s  %6d", row.size, row.count, type, opName, coll.hasRoot ? o.root : -1);
      for (const Result &res : row.res)
        for (const Column &c : kColumns) printf("  %*s", c.width, c.value(res, false).c_str());
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
  CHECK(shoal_comm_finalize(g_comm));
  shoal_comm_destroy(g_comm);
  return totalWrong ? 1 : 0;
}
