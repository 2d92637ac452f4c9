#include "options.h"

#include <getopt.h>
#include <unistd.h>

#include <cctype>
#include <cerrno>
#include <cstdarg>
#include <cstdio>
#include <cstdlib>
#include <cstring>

#include "../resnet50_shapes.h"

namespace bench {
namespace {

void usage() {
  printf("usage: shoal-bench [COLLECTIVE] [options]     (run under shoalrun, mpirun or srun)\n\n"
         "collectives (default allreduce):\n");
  for (const CollTest &c : kCollTests) printf("  %-15s %s\n", c.name, c.description);
  printf("\noptions with nccl-tests' meanings (sizes take K, M, G suffixes, powers of 1024):\n"
         "  -b, -e BYTES  smallest and largest size [32M, 32M]\n"
         "  -f FACTOR     multiply the size by FACTOR at each step [2]\n"
         "  -i BYTES      add BYTES at each step instead\n"
         "  -n, -w ITERS  timed and warm-up iterations per size [20, 5]\n"
         "  -c N          N extra iterations per size and mode, each from fresh inputs and checked\n"
         "                element by element; 0 = no check [1]\n"
         "  -a 0|1|2|3    the time reported: 0 rank 0's, 1 the average over ranks, 2 the fastest\n"
         "                rank's, 3 the slowest rank's (each rank's mean per iteration) [1]\n"
         "  -d DTYPE      float, double, half, bfloat16, int8, uint8, int32, uint32, int64, uint64 [float]\n"
         "  -o OP         sum, avg, prod, min, max, band, bor, bxor [sum]\n"
         "  -r ROOT       root rank of broadcast, reduce, gather, scatter [0]\n"
         "  -J, --json FILE      rank 0 writes the results as JSON (nccl-tests' -J schema, version 3,\n"
         "                       with shoal's keys added)\n"
         "\nshoal's options:\n"
         "  --algo ALGO          allreduce algorithm: auto, ring, tree or doubling; bruck: alltoall by\n"
         "                       Bruck's algorithm (else pairwise) [SHOAL_ALGO, else auto]\n"
         "  --memory host|cuda   where the buffers live; cuda: device (local rank mod devices),\n"
         "                       every collective (reduce, reduce_scatter: no bitwise ops), through\n"
         "                       the C API's tensor calls, NCCL underneath (CUDA build) [host]\n"
         "  --version            shoal-bench's and the loaded libshoal's versions\n"
         "  -h, --help           this help\n"
         "\nallreduce only:\n"
         "  --shape SHAPES       allreduce tensors of these shapes instead of the -b/-e sweep: a comma\n"
         "                       list of matrices or 4-D shapes (1024x4096,512x512x3x3: one row each),\n"
         "                       or resnet50 (its 161 gradient tensors, all in each iteration: one row)\n"
         "  --compressor NAME    compress inside the allreduce [SHOAL_COMPRESSOR, else none]\n"
         "  --copts K=V,...      the compressor's options [SHOAL_COMPRESSOR_OPTS]\n"
         "  --min-bytes BYTES    smaller calls go uncompressed [0]\n"
         "  --density D          fraction of nonzero inputs, in (0, 1], positions differ per rank [1]\n"
         "  --overlap O          fraction of each rank's nonzeros that all ranks share, in [0, 1] [0]\n"
         "  --list-compressors   list the compressors and exit\n"
         "\nsize is the total bytes (for allgather, reduce_scatter, alltoall, gather and scatter:\n"
         "count x type size x nranks), count the elements per call; algbw = size / time, busbw =\n"
         "algbw x 2(n-1)/n (allreduce), (n-1)/n (allgather, reduce_scatter, alltoall, gather,\n"
         "scatter), 1 (broadcast, reduce, sendrecv), GB = 1e9. With a compressor, algbw\n"
         "and busbw are effective bandwidths (the uncompressed size over the time); paybw is the\n"
         "bus bandwidth of the payload the compressor handed to collectives, ratio = uncompressed /\n"
         "payload bytes, sent = bytes on the wire per rank and call.\n");
}

void version() {
  int library = 0;
  shoal_get_version(&library);
  printf("shoal-bench %d.%d.%d (built against shoal %d.%d.%d, running libshoal %d.%d.%d)\n", SHOAL_VERSION_MAJOR,
         SHOAL_VERSION_MINOR, SHOAL_VERSION_PATCH, SHOAL_VERSION_MAJOR, SHOAL_VERSION_MINOR, SHOAL_VERSION_PATCH,
         library / 10000, library / 100 % 100, library % 100);
}

std::string format(const char *fmt, ...) __attribute__((format(printf, 1, 2)));
std::string format(const char *fmt, ...) {
  char buf[256];
  va_list ap;
  va_start(ap, fmt);
  vsnprintf(buf, sizeof buf, fmt, ap);
  va_end(ap);
  return buf;
}

size_t parseSize(const char *flag, const char *s) {
  char *end = nullptr;
  errno = 0;
  const unsigned long long v = strtoull(s, &end, 10);
  if (errno || end == s || *s == '-') usageError(-1, "%s: '%s' is not a size (e.g. 8, 64K, 256M, 1G)", flag, s);
  int shift = 0;
  static const char kUnits[] = "KMG";
  if (const char *u = *end ? strchr(kUnits, toupper(*end)) : nullptr) shift = 10 * int(u - kUnits + 1), ++end;
  if (*end == 'B' || *end == 'b') ++end;
  if (*end) usageError(-1, "%s: '%s' is not a size (e.g. 8, 64K, 256M, 1G)", flag, s);
  if (v > (~0ull >> shift)) usageError(-1, "%s: '%s' is too large", flag, s);
  return size_t(v << shift);
}

int parseInt(const char *flag, const char *s, int lo, int hi = 1000000000) {
  char *end = nullptr;
  errno = 0;
  const long v = strtol(s, &end, 10);
  if (errno || end == s || *end || v < lo || v > hi)
    usageError(-1, "%s: '%s' is not an integer in [%d, %d]", flag, s, lo, hi);
  return int(v);
}

double parseFraction(const char *flag, const char *s, bool zeroOk) {
  char *end = nullptr;
  const double v = strtod(s, &end);
  if (end == s || *end || !(v <= 1) || v < 0 || (v == 0 && !zeroOk))
    usageError(-1, "%s: '%s' is not a number in %s0, 1]", flag, s, zeroOk ? "[" : "(");
  return v;
}

// "1024x4096,64x3x7x7" (one row per shape) or "resnet50" (one row of 161 tensors).
std::vector<ShapeRow> parseShapes(const char *text) {
  std::vector<ShapeRow> rows;
  if (strcmp(text, "resnet50") == 0) {
    ShapeRow row{"resnet50", {}};
    for (const shoal::bench::Param &p : shoal::bench::kResNet50)
      row.tensors.push_back({p.name, std::vector<int64_t>(p.shape, p.shape + p.ndim)});
    rows.push_back(row);
    return rows;
  }
  std::string all = text;
  for (size_t begin = 0; begin <= all.size();) {
    size_t comma = all.find(',', begin);
    if (comma == std::string::npos) comma = all.size();
    const std::string item = all.substr(begin, comma - begin);
    std::vector<int64_t> dims;
    for (size_t at = 0; at <= item.size();) {
      size_t x = item.find('x', at);
      if (x == std::string::npos) x = item.size();
      const std::string dim = item.substr(at, x - at);
      char *end = nullptr;
      const long long v = dim.empty() ? 0 : strtoll(dim.c_str(), &end, 10);
      if (dim.empty() || *end || v < 1 || v > (1ll << 40))
        usageError(-1, "--shape: '%s' is not a shape: write dimensions >= 1 joined by x (1024x4096), "
                   "or resnet50", item.c_str());
      dims.push_back(v);
      at = x + 1;
    }
    if (dims.size() < 1 || dims.size() > 4)
      usageError(-1, "--shape: '%s' has %zu dimensions; give 1 to 4", item.c_str(), dims.size());
    rows.push_back({item, {{"bench_" + item, dims}}});
    begin = comma + 1;
  }
  return rows;
}

}  // namespace

const char *averageName(Average a) {
  switch (a) {
    case Average::Rank0: return "rank 0's mean time per iteration";
    case Average::Mean: return "the average over ranks of each rank's mean time per iteration";
    case Average::Min: return "the fastest rank's mean time per iteration";
    case Average::Max: return "the slowest rank's mean time per iteration";
  }
  return "?";
}

size_t Tensor::elements() const {
  size_t n = 1;
  for (int64_t d : shape) n *= size_t(d);
  return n;
}

void usageError(int rank, const char *fmt, ...) {
  bool report = rank == 0;
  if (rank < 0) {
    report = true;
    for (const char *v : {"SHOAL_RANK", "OMPI_COMM_WORLD_RANK", "PMI_RANK", "SLURM_PROCID"})
      if (const char *s = getenv(v)) {
        report = atoi(s) == 0;
        break;
      }
  }
  if (report) {
    va_list ap;
    va_start(ap, fmt);
    fputs("shoal-bench: ", stderr);
    vfprintf(stderr, fmt, ap);
    va_end(ap);
    fputs("\nrun 'shoal-bench -h' for usage\n", stderr);
  } else {
    // The others wait a moment, lest a launcher that stops the job on the first
    // failure kill rank 0 before it has printed.
    usleep(500 * 1000);
  }
  exit(2);
}

Options parseArgs(int argc, char **argv) {
  Options o;
  o.args.assign(argv, argv + argc);
  enum { kCompressor = 256, kCopts, kMinBytes, kDensity, kOverlap, kMemory, kAlgo, kShape, kVersion };
  const option longOpts[] = {{"json", required_argument, nullptr, 'J'},
                             {"list-compressors", no_argument, nullptr, 'L'},
                             {"help", no_argument, nullptr, 'h'},
                             {"version", no_argument, nullptr, kVersion},
                             {"algo", required_argument, nullptr, kAlgo},
                             {"shape", required_argument, nullptr, kShape},
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
      case 'a':
        if (!isdigit(static_cast<unsigned char>(optarg[0])))
          usageError(-1, "-a is nccl-tests' averaging mode (0 rank 0, 1 average, 2 min, 3 max), not '%s'; "
                     "choose the algorithm with --algo %s", optarg, optarg);
        o.average = Average(parseInt("-a", optarg, 0, 3));
        break;
      case kAlgo: o.algorithm = optarg; break;
      case 'J': o.jsonPath = optarg; break;
      case 'd':
        if (shoal_dtype_from_name(optarg, &o.dtype) != SHOAL_OK) usageError(-1, "-d: %s", shoal_last_error(nullptr));
        break;
      case 'o':
        if (shoal_op_from_name(optarg, &o.op) != SHOAL_OK) usageError(-1, "-o: %s", shoal_last_error(nullptr));
        break;
      case kShape: o.shapes = parseShapes(optarg), allreduceOnly = "--shape"; break;
      case kCompressor: o.compressor = optarg, allreduceOnly = "--compressor"; break;
      case kCopts: o.copts = optarg, allreduceOnly = "--copts"; break;
      case kMinBytes:
        o.compressMinBytes = (long long)parseSize("--min-bytes", optarg), allreduceOnly = "--min-bytes";
        break;
      case kDensity: o.density = parseFraction("--density", optarg, false), allreduceOnly = "--density"; break;
      case kOverlap: o.overlap = parseFraction("--overlap", optarg, true), allreduceOnly = "--overlap"; break;
      case kMemory:
        if (strcmp(optarg, "host") == 0) o.memory = SHOAL_MEMORY_HOST;
        else if (strcmp(optarg, "cuda") == 0) o.memory = SHOAL_MEMORY_CUDA;
        else usageError(-1, "--memory: '%s' is neither host nor cuda", optarg);
        break;
      case 'L':
        if (shoal_compressors_print(stdout) != SHOAL_OK) usageError(-1, "%s", shoal_last_error(nullptr));
        exit(0);
      case kVersion: version(); exit(0);
      case 'h': usage(); exit(0);
      case ':': usageError(-1, "option %s needs a value", argv[optind - 1]);
      default:
        usageError(-1, "unknown option %s", optopt ? format("-%c", optopt).c_str() : argv[optind - 1]);
    }
  }
  if (optind < argc && !(o.coll = findColl(argv[optind])))
    usageError(-1, "unknown collective '%s' (allreduce, allgather, broadcast, reduce_scatter, alltoall, sendrecv, reduce, gather, scatter)", argv[optind]);
  if (optind + 1 < argc) usageError(-1, "unexpected argument '%s'", argv[optind + 1]);
  if (o.minBytes == 0) usageError(-1, "-b: the smallest size must be at least 1 byte");
  if (o.maxBytes < o.minBytes) usageError(-1, "-e %zu is smaller than -b %zu", o.maxBytes, o.minBytes);
  if (o.stepFactor < 2 && o.stepBytes == 0) usageError(-1, "-i: the step must be at least 1 byte");
  const bool bitwise = o.op == SHOAL_BAND || o.op == SHOAL_BOR || o.op == SHOAL_BXOR;
  if (o.coll->hasOp && bitwise && kTypes[o.dtype].isFloat)
    usageError(-1, "-o %s needs an integer dtype, not %s", shoal_op_name(o.op), shoal_dtype_name(o.dtype));
  if (o.memory == SHOAL_MEMORY_CUDA)
    if (const char *why = cudaRefusal(*o.coll, o.op)) usageError(-1, "--memory cuda: %s", why);
  if (o.coll != &kAllreduce) {  // SHOAL_COMPRESSOR does not touch the other collectives
    if (allreduceOnly) usageError(-1, "%s applies to allreduce only, not %s", allreduceOnly, o.coll->name);
    return o;
  }
  const char *from = o.compressor ? "--compressor" : "SHOAL_COMPRESSOR";
  if (!o.compressor) o.compressor = getenv("SHOAL_COMPRESSOR");
  if (!o.compressor || !*o.compressor) o.compressor = "none";
  if (strcmp(o.compressor, "none") != 0 && shoal_compressor_lookup(o.compressor, &o.table) != SHOAL_OK)
    usageError(-1, "%s: %s", from, shoal_last_error(nullptr));
  return o;
}

}  // namespace bench
