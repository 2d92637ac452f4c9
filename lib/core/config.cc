#include "core/config.h"

#include <cctype>
#include <cerrno>
#include <charconv>
#include <cmath>
#include <cstdlib>
#include <cstring>
#include <string_view>

#include "core/error.h"

namespace shoal::config {

// Limits shared by several rows. A rank number travels in 16 bits of the
// transport's tag (kMaxRanks in lib/transport/transport.h), so that bounds the world size.
constexpr double kMaxRank = (1 << 16) - 1;
constexpr double kMaxWorld = 1 << 16;
constexpr double kMaxBytes = 1LL << 50;      // 1 PiB: larger is a typo
constexpr double kMaxSeconds = 31536000;     // a year: every wait has a deadline (no "inf")

const std::vector<Variable>& table() {
  using K = Kind;
  // Never destroyed: threads that outlive main() (a tcp store server until the registry stops
  // it at exit, a leaked communicator's) still read it while static destructors run; a table
  // destroyed under them was a use-after-free under ASan (StoreTest.GetWaitsForALaterSet/tcp).
  static const std::vector<Variable>& variables = *new std::vector<Variable>{
      // Launch and rendezvous (set by shoalrun, mpirun -x, or by hand).
      {"SHOAL_RANK", "", "This process's rank; else a launcher's (docs/reliability-store.md: RANK, PMI_RANK, OMPI_COMM_WORLD_RANK, SLURM_PROCID, ...).", K::Integer, 0, kMaxRank},
      {"SHOAL_WORLD_SIZE", "", "Number of ranks; else a launcher's (WORLD_SIZE, PMI_SIZE, OMPI_COMM_WORLD_SIZE, SLURM_NTASKS, ...).", K::Integer, 1, kMaxWorld},
      {"SHOAL_STORE", "", "Rendezvous store: tcp://host:port (rank 0 serves), file:///shared/dir, memory://name; under torchrun tcp://MASTER_ADDR:MASTER_PORT+1."},
      {"SHOAL_LOCAL_RANK", "", "Rank within this machine (set by shoalrun; informational).", K::Integer, 0, kMaxRank},
      {"SHOAL_LOCAL_SIZE", "", "Ranks on this machine (set by shoalrun; informational).", K::Integer, 1, kMaxWorld},
      {"SHOAL_TOKEN", "", "Job token every tcp store connection must present; shoalrun makes a fresh one."},
      // Behaviour.
      {"SHOAL_TIMEOUT_S", "300", "Deadline in seconds of every wait; a dead or stalled peer becomes an error after it.", K::Number, 0.001, kMaxSeconds},
      {"SHOAL_ALGO", "auto", "Allreduce algorithm: auto, ring, tree, doubling, hierarchical (docs/groups.md), shm (ranks on one host; also broadcast and barrier) or aggregate (shoal-aggd, see SHOAL_AGGREGATOR) (broadcast: tree or chain, chosen by size unless ring/tree); bruck: alltoall by Bruck's algorithm (log2 n rounds, for small blocks; alltoallv stays pairwise), allreduce chosen as under auto (docs/collectives.md). Alltoall under auto: Bruck up to 16 KiB per rank, pairwise above; other values: pairwise.", K::Choice, 0, 0, "auto,ring,tree,doubling,aggregate,hierarchical,shm,bruck"},
      {"SHOAL_AGGREGATOR", "", "SHOAL_ALGO=aggregate: tcp://host:port[,tcp://host:port...] of shoal-aggd aggregators; several shard each tensor (docs/aggregation.md)."},
      {"SHOAL_TREE_MAX_BYTES", "65536", "auto: allreduce messages up to this size use recursive doubling, larger ones the ring; broadcasts the tree, larger ones the chain.", K::Integer, 0, kMaxBytes},
      {"SHOAL_HIER_MIN_BYTES", "1048576", "auto: allreduce messages of at least this size take the hierarchical algorithm when the ranks span >= 2 hosts with the same number (>= 2) on each (docs/groups.md).", K::Integer, 0, kMaxBytes},
      {"SHOAL_HIER_CHUNK_BYTES", "2097152", "The dense hierarchical allreduce pipelines its legs over chunks of this many bytes: while one chunk crosses hosts, the next is reduced inside each host and the one before gathered (docs/groups.md); 0 = the whole buffer at once, leg after leg.", K::Integer, 0, kMaxBytes},
      {"SHOAL_HOST_ID", "", "Names this rank's host for the hierarchical allreduce; ranks with the same id share a host. Default: host name, boot id and network namespace (emulated hosts in namespaces count apart)."},
      {"SHOAL_SHM_MAX_BYTES", "auto", "When every rank shares one host: auto runs allreduces, broadcasts and barriers up to this size through a shared-memory segment (its slot size; 0 = no segment; auto: 262144 at 2 ranks, 2097152 at 3-16, 262144 above).", K::Integer, 0, 1 << 26, "auto"},
      {"SHOAL_SEGMENT_BYTES", "262144", "Pipelining segment of ring and chain algorithms, in bytes.", K::Integer, 4096, 1 << 30},
      {"SHOAL_SPIN_ROUNDS", "auto", "Idle polls before a waiting rank yields its core (auto: 2000, or 20 when ranks outnumber cores).", K::Integer, 0, 1 << 30, "auto"},
      {"SHOAL_UCX_REMOTE_RNDV_BYTES", "0", "Peers on other hosts over UCX's TCP: > 0 = messages of at least this many bytes go by rendezvous, which lands them in the receive buffer itself (no copy out of UCX's receive segments); the endpoints to those peers then connect through UCX's connection manager (a listener per rank), the only way UCX 1.13 offers that path together with peer-failure detection. 0 (the default: it measured no faster and used more CPU, docs/benchmarks.md) = eager only, endpoints from worker addresses, 1 MiB receive segments. Every rank must use the same 0 or non-zero (checked at init); a user's UCX_RNDV_THRESH wins for the threshold.", K::Integer, 0, kMaxBytes},
      // Compression.
      {"SHOAL_COMPRESSOR", "none", "Compressor for allreduce (sum/avg of float tensors): none or a name from shoalrun --list-compressors."},
      {"SHOAL_COMPRESSOR_OPTS", "", "Options of the compressor, k=v,k=v (see shoalrun --list-compressors)."},
      {"SHOAL_COMPRESS_MIN_BYTES", "65536", "Tensors smaller than this many bytes go uncompressed.", K::Integer, 0, kMaxBytes},
      {"SHOAL_PLUGIN_PATH", "", "Colon-separated folders searched for libshoal-compressor-<name>.so plugins."},
      {"SHOAL_LOG_LEVEL", "warn", "Logging: error, warn, info or debug.", K::Choice, 0, 0, "error,warn,info,debug"},
      // Runtime (async API: shoal_iallreduce & co., docs/runtime.md).
      {"SHOAL_CYCLE_TIME_MS", "1", "Async runtime: milliseconds that new submissions wait after the previous negotiation round with requests of this rank pending began (so that they share a round), and how often a waiting background thread looks whether a peer began one.", K::Number, 0, 10000},
      {"SHOAL_FUSION_THRESHOLD", "134217728", "Async runtime: bytes of ready allreduces fused into one collective; 0 disables fusion.", K::Integer, 0, kMaxBytes},
      {"SHOAL_CACHE_CAPACITY", "1024", "Async runtime: response-cache entries (steady-state steps cost one bitwise allreduce); 0 disables the cache.", K::Integer, 0, 1 << 20},
      {"SHOAL_TIMELINE", "", "Rank 0 writes a Chrome-trace JSON timeline of blocking calls and the async runtime (chrome://tracing, Perfetto) to this path."},
      {"SHOAL_STALL_CHECK_S", "60", "Async runtime: rank 0 warns about tensors some ranks submitted and others not for this long (names, missing ranks); 0 = off.", K::Number, 0, kMaxSeconds},
      {"SHOAL_STALL_SHUTDOWN_S", "0", "Async runtime: such a stall becomes an error on every rank after this long; 0 = off.", K::Number, 0, kMaxSeconds},
      // Bindings (read by the Python package, docs/python.md).
      {"SHOAL_LIBRARY", "", "Python: path of the libshoal.so to load; else the wheel's copy, else the system's."},
      // Tests.
      {"SHOAL_CONFORMANCE_REQUIRE", "", "Tests: test_conformance fails unless every compressor named here (commas or spaces) is registered, so CI can insist that a plugin was found."},
  };
  return variables;
}

static const Variable& find(const char* name) {
  for (const Variable& v : table())
    if (std::strcmp(v.name, name) == 0) return v;
  fail(SHOAL_ERR_INTERNAL, "config variable {} is not declared in lib/core/config.cc", name);
}

namespace {

// Shortest text that reads back as the same double: 4096, 0.001, 1e+15.
std::string number(double value) {
  if (value == static_cast<double>(static_cast<long long>(value)) && value < 1e15 && value > -1e15)
    return std::to_string(static_cast<long long>(value));
  return fmt::format("{}", value);
}

bool isChoice(const Variable& v, const std::string& text) {
  if (v.choices == nullptr) return false;
  std::string_view list(v.choices);
  for (size_t start = 0; start <= list.size();) {
    size_t comma = list.find(',', start);
    if (comma == std::string_view::npos) comma = list.size();
    if (list.substr(start, comma - start) == text) return true;
    start = comma + 1;
  }
  return false;
}

[[noreturn]] void badValue(const Variable& v, const std::string& text, const char* why) {
  fail(SHOAL_ERR_INVALID_ARGUMENT, "{}='{}' {}: it must be {}", v.name, text, why, describeRange(v));
}

// Whole numbers: optional sign, digits only (no "0x", no "1e3", no spaces).
long long parseWhole(const Variable& v, const std::string& text) {
  long long value = 0;
  const char* begin = text.data();
  const char* end = begin + text.size();
  if (begin != end && *begin == '+') ++begin;
  auto [stop, ec] = std::from_chars(begin, end, value);
  if (begin == end || ec == std::errc::result_out_of_range) badValue(v, text, "is out of range");
  if (ec != std::errc() || stop != end) badValue(v, text, "is not a whole number");
  if (value < v.min || value > v.max) badValue(v, text, "is out of range");
  return value;
}

double parseDecimal(const Variable& v, const std::string& text) {
  errno = 0;
  char* end = nullptr;
  double value = std::strtod(text.c_str(), &end);
  if (text.empty() || *end != '\0' || std::isspace(static_cast<unsigned char>(text[0])))
    badValue(v, text, "is not a number");
  if (!std::isfinite(value) || errno == ERANGE)
    badValue(v, text, "is not a finite number (there is no 'no deadline' or infinite setting)");
  if (value < v.min || value > v.max) badValue(v, text, "is out of range");
  return value;
}

// Checks text against v's kind and range; returns normally when it is fine.
void check(const Variable& v, const std::string& text) {
  switch (v.kind) {
    case Kind::Text:
      return;
    case Kind::Choice:
      if (!isChoice(v, text)) badValue(v, text, "is not a valid choice");
      return;
    case Kind::Integer:
      if (!isChoice(v, text)) parseWhole(v, text);
      return;
    case Kind::Number:
      if (!isChoice(v, text)) parseDecimal(v, text);
      return;
  }
}

}  // namespace

std::string describeRange(const Variable& v) {
  std::string words = v.choices ? v.choices : "";
  for (char& c : words)
    if (c == ',') c = '|';
  switch (v.kind) {
    case Kind::Text:
      return "text";
    case Kind::Choice:
      return "one of " + words;
    case Kind::Integer:
    case Kind::Number: {
      std::string range = fmt::format("{} from {} to {}", v.kind == Kind::Integer ? "an integer" : "a number",
                                      number(v.min), number(v.max));
      return words.empty() ? range : words + " or " + range;
    }
  }
  return "text";
}

void checkEnvironment() {
  for (const Variable& v : table()) {
    const char* value = std::getenv(v.name);
    if (value != nullptr && value[0] != '\0') check(v, value);
  }
}

long long parseInteger(const char* name, const std::string& text, long long min, long long max) {
  Variable v{name, "", "", Kind::Integer, static_cast<double>(min), static_cast<double>(max)};
  return parseWhole(v, text);
}

std::optional<std::string> getRaw(const char* name) {
  find(name);
  const char* value = std::getenv(name);
  if (value == nullptr || value[0] == '\0') return std::nullopt;
  return std::string(value);
}

std::string getString(const char* name) {
  const Variable& v = find(name);
  const char* value = std::getenv(name);
  // Choices are checked by checkEnvironment (shoal_comm_init), not here: the logger reads
  // SHOAL_LOG_LEVEL from any thread, where an exception would end the process.
  return (value != nullptr && value[0] != '\0') ? std::string(value) : std::string(v.defaultValue);
}

long long getInt(const char* name) {
  const Variable& v = find(name);
  std::string text = getString(name);
  if (v.kind == Kind::Integer) return parseWhole(v, text);
  // A row without a kind (kind Text): any whole number; give it a kind and range to check more.
  Variable any{v.name, "", "", Kind::Integer, -9.2e18, 9.2e18};
  return parseWhole(any, text);
}

double getDouble(const char* name) {
  const Variable& v = find(name);
  std::string text = getString(name);
  if (v.kind == Kind::Number) return parseDecimal(v, text);
  Variable any{v.name, "", "", Kind::Number, -1.7e308, 1.7e308};  // a row without a kind: any finite number
  return parseDecimal(any, text);
}

bool getBool(const char* name) {
  std::string text = getString(name);
  if (text == "1" || text == "true" || text == "yes" || text == "on") return true;
  if (text == "0" || text == "false" || text == "no" || text == "off" || text.empty()) return false;
  fail(SHOAL_ERR_INVALID_ARGUMENT, "{}='{}' is not a boolean; use 1 or 0", name, text);
}

void print(std::FILE* out, bool markdown) {
  if (markdown) {
    std::fprintf(out, "| Variable | Default | Values | Meaning |\n|---|---|---|---|\n");
    for (const Variable& v : table())
      std::fprintf(out, "| `%s` | %s | %s | %s |\n", v.name, v.defaultValue[0] ? v.defaultValue : "(unset)",
                   describeRange(v).c_str(), v.help);
    return;
  }
  for (const Variable& v : table()) {
    const char* current = std::getenv(v.name);
    std::fprintf(out, "%-22s default=%-8s current=%-10s %s\n", v.name, v.defaultValue[0] ? v.defaultValue : "(unset)",
                 current ? current : "(unset)", v.help);
  }
}

}  // namespace shoal::config
