#include "core/config.h"

#include <cerrno>
#include <cstdlib>
#include <cstring>

#include "core/error.h"

namespace shoal::config {

const std::vector<Variable>& table() {
  static const std::vector<Variable> variables = {
      // Launch and rendezvous (set by shoalrun, mpirun -x, or by hand).
      {"SHOAL_RANK", "", "This process's rank; else OMPI_COMM_WORLD_RANK or SLURM_PROCID."},
      {"SHOAL_WORLD_SIZE", "", "Number of ranks; else OMPI_COMM_WORLD_SIZE or SLURM_NTASKS."},
      {"SHOAL_STORE", "", "Rendezvous store: tcp://host:port (rank 0 serves), file:///shared/dir, memory://name."},
      {"SHOAL_LOCAL_RANK", "", "Rank within this machine (set by shoalrun; informational)."},
      {"SHOAL_LOCAL_SIZE", "", "Ranks on this machine (set by shoalrun; informational)."},
      {"SHOAL_TOKEN", "", "Job token every tcp store connection must present; shoalrun makes a fresh one."},
      // Behaviour.
      {"SHOAL_TIMEOUT_S", "300", "Deadline in seconds of every wait; a dead or stalled peer becomes an error after it."},
      {"SHOAL_ALGO", "auto", "Allreduce algorithm: auto, ring, tree, doubling or aggregate (shoal-aggd, see SHOAL_AGGREGATOR) (broadcast: tree or chain, chosen by size unless ring/tree)."},
      {"SHOAL_AGGREGATOR", "", "SHOAL_ALGO=aggregate: tcp://host:port[,tcp://host:port...] of shoal-aggd aggregators; several shard each tensor (docs/aggregation.md)."},
      {"SHOAL_TREE_MAX_BYTES", "65536", "auto: allreduce messages up to this size use recursive doubling, larger ones the ring; broadcasts the tree, larger ones the chain."},
      {"SHOAL_SEGMENT_BYTES", "262144", "Pipelining segment of ring and chain algorithms, in bytes."},
      {"SHOAL_SPIN_ROUNDS", "auto", "Idle polls before a waiting rank yields its core (auto: 2000, or 20 when ranks outnumber cores)."},
      // Compression.
      {"SHOAL_COMPRESSOR", "none", "Compressor for allreduce (sum/avg of float tensors): none or a name from shoalrun --list-compressors."},
      {"SHOAL_COMPRESSOR_OPTS", "", "Options of the compressor, k=v,k=v (see shoalrun --list-compressors)."},
      {"SHOAL_COMPRESS_MIN_BYTES", "65536", "Tensors smaller than this many bytes go uncompressed."},
      {"SHOAL_PLUGIN_PATH", "", "Colon-separated folders searched for libshoal-compressor-<name>.so plugins."},
      {"SHOAL_LOG_LEVEL", "warn", "Logging: error, warn, info or debug."},
      // Runtime (async API: shoal_iallreduce & co., docs/runtime.md).
      {"SHOAL_CYCLE_TIME_MS", "1", "Async runtime: milliseconds between negotiation cycles of the background thread."},
      {"SHOAL_FUSION_THRESHOLD", "134217728", "Async runtime: bytes of ready allreduces fused into one collective; 0 disables fusion."},
      {"SHOAL_CACHE_CAPACITY", "1024", "Async runtime: response-cache entries (steady-state steps cost one bitwise allreduce); 0 disables the cache."},
      {"SHOAL_TIMELINE", "", "Async runtime: rank 0 writes a Chrome-trace JSON timeline (chrome://tracing, Perfetto) to this path."},
      {"SHOAL_STALL_CHECK_S", "60", "Async runtime: rank 0 warns about tensors some ranks submitted and others not for this long (names, missing ranks); 0 = off."},
      {"SHOAL_STALL_SHUTDOWN_S", "0", "Async runtime: such a stall becomes an error on every rank after this long; 0 = off."},
      // Bindings (read by the Python package, docs/python.md).
      {"SHOAL_LIBRARY", "", "Python: path of the libshoal.so to load; else the wheel's copy, else the system's."},
  };
  return variables;
}

static const Variable& find(const char* name) {
  for (const Variable& v : table())
    if (std::strcmp(v.name, name) == 0) return v;
  fail(SHOAL_ERR_INTERNAL, "config variable {} is not declared in lib/core/config.cc", name);
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
  return (value != nullptr && value[0] != '\0') ? std::string(value) : std::string(v.defaultValue);
}

long long getInt(const char* name) {
  std::string text = getString(name);
  errno = 0;
  char* end = nullptr;
  long long value = std::strtoll(text.c_str(), &end, 10);
  if (text.empty() || errno != 0 || *end != '\0')
    fail(SHOAL_ERR_INVALID_ARGUMENT, "{}='{}' is not an integer; set it to a whole number", name, text);
  return value;
}

double getDouble(const char* name) {
  std::string text = getString(name);
  errno = 0;
  char* end = nullptr;
  double value = std::strtod(text.c_str(), &end);
  if (text.empty() || errno != 0 || *end != '\0')
    fail(SHOAL_ERR_INVALID_ARGUMENT, "{}='{}' is not a number; set it to e.g. 30 or 0.5", name, text);
  return value;
}

bool getBool(const char* name) {
  std::string text = getString(name);
  if (text == "1" || text == "true" || text == "yes" || text == "on") return true;
  if (text == "0" || text == "false" || text == "no" || text == "off" || text.empty()) return false;
  fail(SHOAL_ERR_INVALID_ARGUMENT, "{}='{}' is not a boolean; use 1 or 0", name, text);
}

void print(std::FILE* out, bool markdown) {
  if (markdown) {
    std::fprintf(out, "| Variable | Default | Meaning |\n|---|---|---|\n");
    for (const Variable& v : table())
      std::fprintf(out, "| `%s` | %s | %s |\n", v.name, v.defaultValue[0] ? v.defaultValue : "(unset)", v.help);
    return;
  }
  for (const Variable& v : table()) {
    const char* current = std::getenv(v.name);
    std::fprintf(out, "%-22s default=%-8s current=%-10s %s\n", v.name, v.defaultValue[0] ? v.defaultValue : "(unset)",
                 current ? current : "(unset)", v.help);
  }
}

}  // namespace shoal::config
