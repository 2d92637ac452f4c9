// Rank discovery from the config struct and launchers' variables; the order
// of precedence is in discovery.h.
#include "bootstrap/discovery.h"

#include <cstdlib>

#include "core/config.h"
#include "core/error.h"

namespace shoal {
namespace {

// A rank travels in 16 bits of the transport tag (kMaxRanks in lib/transport/transport.h; config.cc says the same).
constexpr long long kMaxRank = (1 << 16) - 1;
constexpr long long kMaxWorld = 1 << 16;

struct Source {
  const char* launcher;
  const char* rank;  // nullptr: this launcher gives no such variable
  const char* size;
};

constexpr Source kSources[] = {
    {"shoalrun", "SHOAL_RANK", "SHOAL_WORLD_SIZE"},
    {"torchrun", "RANK", "WORLD_SIZE"},
    {"Open MPI", "OMPI_COMM_WORLD_RANK", "OMPI_COMM_WORLD_SIZE"},
    {"MPICH/Intel MPI", "PMI_RANK", "PMI_SIZE"},
    {"PMIx", "PMIX_RANK", nullptr},
    {"Slurm", "SLURM_PROCID", "SLURM_NTASKS"},
};

std::optional<std::string> env(const char* name) {
  const char* value = name ? std::getenv(name) : nullptr;
  if (value == nullptr || value[0] == '\0') return std::nullopt;
  return std::string(value);
}

// The first source's value of a variable, strictly parsed.
std::optional<long long> first(const char* Source::*field, long long min, long long max, std::string& from) {
  for (const Source& source : kSources) {
    if (auto text = env(source.*field)) {
      from = source.*field;
      return config::parseInteger(source.*field, *text, min, max);
    }
  }
  return std::nullopt;
}

std::string bracketed(const std::string& host) {
  return host.find(':') != std::string::npos && host.front() != '[' ? "[" + host + "]" : host;
}

}  // namespace

Discovery discoverRanks(int configRank, int configSize, const char* configStore) {
  Discovery found;
  std::optional<long long> rank, size;
  if (configRank >= 0) {
    rank = configRank;
    found.rankFrom = "config.rank";
  } else {
    rank = first(&Source::rank, 0, kMaxRank, found.rankFrom);
  }
  if (configSize >= 0) {
    if (configSize < 1) fail(SHOAL_ERR_INVALID_ARGUMENT, "config.world_size is 0: it must be >= 1, or -1 for the environment");
    size = configSize;
    found.sizeFrom = "config.world_size";
  } else {
    size = first(&Source::size, 1, kMaxWorld, found.sizeFrom);
  }
  // torchrun's per-host variables: not needed, but a malformed one means a broken launch.
  auto localRank = env("LOCAL_RANK");
  auto localSize = env("LOCAL_WORLD_SIZE");
  long long localRankValue = localRank ? config::parseInteger("LOCAL_RANK", *localRank, 0, kMaxRank) : 0;
  long long localSizeValue = localSize ? config::parseInteger("LOCAL_WORLD_SIZE", *localSize, 1, kMaxWorld) : 0;
  if (localRank && localSize && localRankValue >= localSizeValue)
    fail(SHOAL_ERR_INVALID_ARGUMENT, "LOCAL_RANK={} is not below LOCAL_WORLD_SIZE={}: the launcher's variables are "
         "inconsistent", localRankValue, localSizeValue);

  if (configStore != nullptr) {
    found.store = configStore;
    found.storeFrom = "config.store";
  } else if (auto url = config::getRaw("SHOAL_STORE")) {
    found.store = *url;
    found.storeFrom = "SHOAL_STORE";
  }

  if (!rank) {
    if (size && *size > 1)
      fail(SHOAL_ERR_INVALID_ARGUMENT,
           "{} says the job has {} ranks, but no rank variable is set (SHOAL_RANK, RANK, OMPI_COMM_WORLD_RANK, "
           "PMI_RANK, PMIX_RANK or SLURM_PROCID): refusing to run alone as rank 0; launch with shoalrun, torchrun, "
           "mpirun or srun, or set SHOAL_RANK",
           found.sizeFrom, *size);
    if (found.store)
      fail(SHOAL_ERR_INVALID_ARGUMENT,
           "a rendezvous store is set ({} = {}) but no rank variable is (SHOAL_RANK, RANK, OMPI_COMM_WORLD_RANK, "
           "PMI_RANK, PMIX_RANK or SLURM_PROCID): refusing to run alone as rank 0; set SHOAL_RANK and "
           "SHOAL_WORLD_SIZE, or unset the store for a single process",
           found.storeFrom, *found.store);
    found.sizeFrom.clear();
    return found;  // a plain process on its own: a world of one
  }
  if (!size)
    fail(SHOAL_ERR_INVALID_ARGUMENT,
         "the rank is set ({}={}) but the world size is not: set SHOAL_WORLD_SIZE (or the launcher's WORLD_SIZE, "
         "OMPI_COMM_WORLD_SIZE, PMI_SIZE, SLURM_NTASKS) to the number of ranks",
         found.rankFrom, *rank);
  if (*rank >= *size)
    fail(SHOAL_ERR_INVALID_ARGUMENT, "rank {} (from {}) is outside the world of {} ranks (from {}): it must be 0..{}",
         *rank, found.rankFrom, *size, found.sizeFrom, *size - 1);
  found.rank = static_cast<int>(*rank);
  found.worldSize = static_cast<int>(*size);
  // torchrun's rule, only for a job of several ranks (a world of one needs no rendezvous, and a
  // stray MASTER_ADDR in a plain process's environment must not make it look for one).
  if (!found.store && found.worldSize > 1) {
    auto addr = env("MASTER_ADDR");
    auto port = env("MASTER_PORT");
    if (addr && port) {
      long long torchPort = config::parseInteger("MASTER_PORT", *port, 1, 65534);
      found.store = "tcp://" + bracketed(*addr) + ":" + std::to_string(torchPort + 1);
      found.storeFrom = "MASTER_ADDR and MASTER_PORT (torchrun; shoal uses MASTER_PORT + 1)";
    }
  }
  return found;
}

}  // namespace shoal
