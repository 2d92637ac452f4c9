#include "report.h"

#include <cinttypes>
#include <cmath>
#include <cstdarg>
#include <cstdlib>
#include <cstring>
#include <ctime>

extern char **environ;

namespace bench {
namespace {

std::string format(const char *fmt, ...) __attribute__((format(printf, 1, 2)));
std::string format(const char *fmt, ...) {
  char buf[256];
  va_list ap;
  va_start(ap, fmt);
  vsnprintf(buf, sizeof buf, fmt, ap);
  va_end(ap);
  return buf;
}

std::string human(double bytes) {  // 1536 -> "1.50K", in powers of 1024 as -b and -e take them
  static const char *const kUnits[] = {"", "K", "M", "G", "T"};
  int unit = 0;
  for (; bytes >= 1024 && unit < 4; ++unit) bytes /= 1024;
  const char *fmt = unit == 0 || bytes >= 100 ? "%.0f%s" : bytes >= 10 ? "%.1f%s" : "%.2f%s";
  return format(fmt, bytes, kUnits[unit]);
}

// A cell of width w, as nccl-tests' getFloatStr: 2 decimals, fewer when they do not fit.
std::string cell(double value, int width) {
  for (const char *fmt : {"%*.2f", "%*.1f", "%*.0f"}) {
    std::string s = format(fmt, width, value);
    if (int(s.size()) <= width) return s;
  }
  return format("%*.1e", width, value);
}

struct Column {
  const char *title, *unit;
  int width;
  std::string (*text)(const Result &);
  bool compressorOnly;
};

const Column kColumns[] = {
    {"time", "(us)", 7, [](const Result &r) { return cell(r.time, 7); }, false},
    {"algbw", "(GB/s)", 6, [](const Result &r) { return cell(r.algBw, 6); }, false},
    {"busbw", "(GB/s)", 6, [](const Result &r) { return cell(r.busBw, 6); }, false},
    {"#wrong", "", 6, [](const Result &r) { return r.wrong >= 0 ? format("%6" PRId64, r.wrong) : std::string("   N/A"); },
     false},
    {"ratio", "", 6, [](const Result &r) { return cell(r.ratio, 6); }, true},
    {"sent", "(B)", 6, [](const Result &r) { return r.wireBytes < 0 ? std::string("N/A") : human(r.wireBytes); }, true},
    {"paybw", "(GB/s)", 6, [](const Result &r) { return cell(r.payBusBw, 6); }, true},
};

bool shown(const RunInfo &run, const Column &c) { return !c.compressorOnly || run.compressorColumns(); }

// nccl-tests' JSON writer conventions: booleans in config are the strings "true"/"false",
// root is its formatted cell, NaN is the string "nan".
class Json {
 public:
  explicit Json(FILE *f) : f_(f) {}
  void begin(char bracket) { value(), fputc(bracket, f_), first_ = true; }
  void end(char bracket) { fputc(bracket, f_), first_ = false; }
  void key(const char *k) { value(), fprintf(f_, "\"%s\":", k), afterKey_ = true; }
  void str(const std::string &s) { value(), fprintf(f_, "\"%s\"", escape(s).c_str()); }
  void integer(long long v) { value(), fprintf(f_, "%lld", v); }
  void number(double v) { value(), std::isnan(v) ? (void)fputs("\"nan\"", f_) : (void)fprintf(f_, "%.6f", v); }
  void null() { value(), fputs("null", f_); }
  void boolText(bool v) { str(v ? "true" : "false"); }

 private:
  void value() {
    if (afterKey_) {
      afterKey_ = false;
      return;
    }
    if (!first_) fputc(',', f_);
    first_ = false;
  }
  static std::string escape(const std::string &s) {
    std::string out;
    for (unsigned char c : s) {
      if (c == '"' || c == '\\') out += '\\', out += char(c);
      else if (c == '\n') out += "\\n";
      else if (c == '\t') out += "\\t";
      else if (c < 0x20) out += format("\\u%04x", c);
      else out += char(c);
    }
    return out;
  }
  FILE *f_;
  bool first_ = true, afterKey_ = false;
};

void jsonResult(Json &j, const RunInfo &run, const Result &r) {
  j.begin('{');
  j.key("time"), j.number(r.time);
  j.key("alg_bw"), j.number(r.algBw);
  j.key("bus_bw"), j.number(r.busBw);
  j.key("nwrong");
  r.wrong >= 0 ? j.number(double(r.wrong)) : j.null();
  // shoal's: every -a figure, so one run serves each reading.
  j.key("time_rank0"), j.number(r.timeRank0);
  j.key("time_avg"), j.number(r.timeAvg);
  j.key("time_min"), j.number(r.timeMin);
  j.key("time_max"), j.number(r.timeMax);
  if (run.compressorColumns()) {
    j.key("ratio"), j.number(r.ratio);
    j.key("payload_bytes"), j.number(r.payloadBytes);
    j.key("wire_bytes");
    r.wireBytes < 0 ? j.null() : j.number(r.wireBytes);
    j.key("payload_bus_bw"), j.number(r.payBusBw);
  }
  j.end('}');
}

}  // namespace

std::string nowText() {
  char text[64];
  const time_t now = time(nullptr);
  strftime(text, sizeof text, "%Y-%m-%d %H:%M:%S", localtime(&now));
  return text;
}

void printHeader(const RunInfo &run) {
  const Options &o = *run.options;
  int library = 0;
  shoal_get_version(&library);
  printf("# shoal-bench version %d.%d.%d, libshoal %d.%d.%d\n", SHOAL_VERSION_MAJOR, SHOAL_VERSION_MINOR,
         SHOAL_VERSION_PATCH, library / 10000, library / 100 % 100, library % 100);
  printf("# Collective test starting: %s\n", o.coll->name);
  printf("# nranks %d algorithm %s dtype %s op %s ", run.nranks, run.algorithm.c_str(), shoal_dtype_name(o.dtype),
         run.opName);
  if (o.shapes.empty()) {
    printf("minBytes %zu maxBytes %zu ", o.minBytes, o.maxBytes);
    printf(o.stepBytes ? "step: %zu(bytes)" : "step: %zu(factor)", o.stepBytes ? o.stepBytes : o.stepFactor);
  } else {
    printf("shapes:");
    for (const ShapeRow &s : o.shapes) printf(" %s", s.label.c_str());
  }
  printf(" warmup iters: %d iters: %d validation: %d memory: %s\n", o.warmup, o.iters, o.check,
         o.memory == SHOAL_MEMORY_CUDA ? "cuda" : "host");
  printf("# time: %s (-a %d; -a 3: the slowest rank's; the JSON has all four)\n",
         averageName(o.average), int(o.average));
  if (const shoal_compressor_t *t = o.table) {
    const char *copts = o.copts ? o.copts : getenv("SHOAL_COMPRESSOR_OPTS");
    printf("# compressor %s, options '%s', min bytes %lld: ", t->name, copts ? copts : "", o.compressMinBytes);
    if (t->error_kind == SHOAL_ERROR_EXACT) printf("lossless, #wrong counts outputs unequal to the exact result\n");
    else if (t->error_kind == SHOAL_ERROR_RELATIVE)
      printf("#wrong counts |out - exact| > %g * n * sum_r |x_r|\n", t->error_bound);
    else printf("error feedback; FEEDBACK compressors are checked for finiteness only "
                "(the conformance suite checks them fully)\n");
    printf("# algbw and busbw are effective (uncompressed bytes / time); paybw is the payload's bus bandwidth\n");
    if (!((t->dtypes >> o.dtype) & 1u) || (o.op != SHOAL_SUM && o.op != SHOAL_AVG))
      printf("# note: %s does not compress %s %s: every call goes uncompressed (ratio 1, exact check)\n", t->name,
             shoal_dtype_name(o.dtype), shoal_op_name(o.op));
  }
  if (o.density < 1) {
    double common, arc;
    sparsity(o.density, o.overlap, &common, &arc);
    printf("# input density %g, overlap %g: %g of positions common to all ranks, %g of the rest per rank%s\n",
           o.density, o.overlap, common, arc,
           run.nranks * arc > 1 + 1e-9 ? " (more than 1/nranks: private positions overlap too)" : "");
  }
  printf("#\n# Using ranks\n");
  for (size_t r = 0; r < run.ranks.size(); ++r)
    printf("#  Rank %2zu Pid %7d on %s\n", r, run.ranks[r].pid, run.ranks[r].host.c_str());
  printf("#\n");

  int half = 0;
  for (const Column &c : kColumns) half += shown(run, c) ? 2 + c.width : 0;
  std::string line[3] = {format("# %10s  %12s  %8s  %6s  %6s", "", "", "", "", ""),
                         format("# %10s  %12s  %8s  %6s  %6s", "size", "count", "type", "redop", "root"),
                         format("# %10s  %12s  %8s  %6s  %6s", "(B)", "(elements)", "", "", "")};
  for (const char *title : {"out-of-place", "in-place"}) {
    const int pad = (half - int(strlen(title))) / 2;
    line[0] += format("%*s%-*s", pad, "", half - pad, title);
    for (const Column &c : kColumns) {
      if (!shown(run, c)) continue;
      line[1] += format("  %*s", c.width, c.title);
      line[2] += format("  %*s", c.width, c.unit);
    }
  }
  for (std::string &l : line) printf("%s\n", l.erase(l.find_last_not_of(' ') + 1).c_str());
  fflush(stdout);
}

void printShapeNote(const Row &row) {
  if (!row.shape.empty())
    printf("# shape %s: %zu tensor%s of %zu elements in all, each allreduced once per iteration\n", row.shape.c_str(),
           row.tensors, row.tensors == 1 ? "" : "s", row.count);
}

void printRow(const RunInfo &run, const Row &row) {
  const Options &o = *run.options;
  printf("%12zu  %12zu  %8s  %6s  %6d", row.size, row.count, shoal_dtype_name(o.dtype), run.opName,
         o.coll->hasRoot ? o.root : -1);
  for (const Result &res : row.res)
    for (const Column &c : kColumns)
      if (shown(run, c)) printf("  %*s", c.width, c.text(res).c_str());
  printf("\n");
  fflush(stdout);
}

void printFooter(const RunInfo &run, int64_t wrong, double avgBusBw, double avgPayBusBw) {
  printf("# %-20s : %" PRId64 " %s\n", "Out of bounds values", wrong, wrong ? "FAILED" : "OK");
  if (run.compressorColumns()) {
    printf("# %-20s : %g (effective: uncompressed bytes over the time)\n", "Avg bus bandwidth", avgBusBw);
    printf("# %-20s : %g (the compressed payload over the time)\n", "Avg payload bus bandwidth", avgPayBusBw);
  } else {
    printf("# %-20s : %g\n", "Avg bus bandwidth", avgBusBw);
  }
  printf("#\n# Collective test concluded: %s\n", run.options->coll->name);
  fflush(stdout);
}

bool writeJson(FILE *f, const RunInfo &run, const std::vector<Row> &rows, int64_t wrong, double avgBusBw,
               double avgPayBusBw) {
  const Options &o = *run.options;
  int library = 0;
  shoal_get_version(&library);
  Json j(f);
  j.begin('{');
  j.key("version"), j.integer(3);
  j.key("start_time"), j.str(run.startTime);
  j.key("args"), j.begin('[');
  for (const std::string &a : o.args) j.str(a);
  j.end(']');
  // shoal's variables and UCX's, never SHOAL_TOKEN (a secret): not the whole environment.
  j.key("env"), j.begin('[');
  for (char **e = environ; *e; ++e)
    if ((!strncmp(*e, "SHOAL_", 6) || !strncmp(*e, "UCX_", 4)) && strncmp(*e, "SHOAL_TOKEN=", 12) != 0) j.str(*e);
  j.end(']');
  j.key("shoal_version"), j.integer(library);
  j.key("config"), j.begin('{');
  j.key("nthreads"), j.integer(1);
  j.key("ngpus"), j.integer(o.memory == SHOAL_MEMORY_CUDA ? 1 : 0);
  j.key("minimum_bytes"), j.integer((long long)o.minBytes);
  j.key("maximum_bytes"), j.integer((long long)o.maxBytes);
  if (o.stepBytes) j.key("step_bytes"), j.integer((long long)o.stepBytes);
  else j.key("step_factor"), j.integer((long long)o.stepFactor);
  j.key("warmup_iters"), j.integer(o.warmup);
  j.key("iterations"), j.integer(o.iters);
  j.key("aggregated_iterations"), j.integer(1);
  j.key("validation"), j.integer(o.check);
  j.key("graph"), j.integer(0);
  j.key("blocking_collectives"), j.boolText(true);
  j.key("parallel_init"), j.boolText(false);
  j.key("devices"), j.begin('[');
  for (size_t r = 0; r < run.ranks.size(); ++r) {
    j.begin('{');
    j.key("rank"), j.integer((long long)r);
    j.key("group"), j.integer(0);
    j.key("pid"), j.integer(run.ranks[r].pid);
    j.key("hostname"), j.str(run.ranks[r].host);
    j.key("device"), j.integer(-1);
    j.key("device_hex"), j.str("");
    j.key("device_info"), j.str(o.memory == SHOAL_MEMORY_CUDA ? "cuda memory" : "host memory");
    j.end('}');
  }
  j.end(']');
  // shoal's configuration keys.
  j.key("collective"), j.str(o.coll->name);
  j.key("nranks"), j.integer(run.nranks);
  j.key("algorithm"), j.str(run.algorithm);
  j.key("dtype"), j.str(shoal_dtype_name(o.dtype));
  j.key("op"), j.str(run.opName);
  j.key("average"), j.integer(int(o.average));
  j.key("time_reported"), j.str(averageName(o.average));
  j.key("memory"), j.str(o.memory == SHOAL_MEMORY_CUDA ? "cuda" : "host");
  if (const shoal_compressor_t *t = o.table) {
    static const char *const kKinds[] = {"exact", "relative", "feedback"};
    const char *copts = o.copts ? o.copts : getenv("SHOAL_COMPRESSOR_OPTS");
    j.key("compressor"), j.str(t->name);
    j.key("compressor_options"), j.str(copts ? copts : "");
    j.key("compress_min_bytes"), j.integer(o.compressMinBytes);
    j.key("error_kind"), j.str(kKinds[t->error_kind % 3]);
    j.key("error_bound"), j.number(t->error_bound);
    j.key("bandwidth"), j.str("alg_bw and bus_bw: uncompressed bytes over the time; payload_bus_bw: the payload's");
  }
  if (o.table || o.density < 1) j.key("density"), j.number(o.density), j.key("overlap"), j.number(o.overlap);
  j.end('}');

  j.key("results"), j.begin('[');
  for (const Row &row : rows) {
    j.begin('{');
    j.key("size"), j.integer((long long)row.size);
    j.key("count"), j.integer((long long)row.count);
    j.key("type"), j.str(shoal_dtype_name(o.dtype));
    j.key("redop"), j.str(run.opName);
    j.key("root"), j.str(format("%6i", o.coll->hasRoot ? o.root : -1));
    j.key("out_of_place"), jsonResult(j, run, row.res[0]);
    j.key("in_place"), jsonResult(j, run, row.res[1]);
    j.key("actual_iterations"), j.integer(o.iters);
    j.key("experiment_name"), j.str(row.shape.empty() ? o.coll->name : row.shape);
    if (!row.shape.empty()) j.key("shape"), j.str(row.shape), j.key("tensors"), j.integer((long long)row.tensors);
    j.end('}');
  }
  j.end(']');
  j.key("out_of_bounds"), j.begin('{');
  j.key("count"), j.integer(wrong);
  j.key("okay"), j.boolText(wrong == 0);
  j.end('}');
  j.key("average_bus_bandwidth"), j.begin('{');
  j.key("bandwidth"), j.number(avgBusBw);
  j.key("okay"), j.str("unchecked");
  if (run.compressorColumns()) j.key("payload_bandwidth"), j.number(avgPayBusBw);
  j.end('}');
  j.key("errors"), j.begin('['), j.end(']');
  j.key("end_time"), j.str(nowText());
  j.end('}');
  fputc('\n', f);
  return !ferror(f);
}

}  // namespace bench
