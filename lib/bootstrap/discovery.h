// Rank discovery: which rank this process is, how many there are, and where
// the rendezvous store is, from the caller's config or a launcher's
// environment. The order of precedence (docs/reliability-store.md):
//
//   1. the config struct (rank, world_size, store), when set;
//   2. SHOAL_RANK, SHOAL_WORLD_SIZE, SHOAL_STORE (shoalrun, or by hand);
//   3. torchrun: RANK, WORLD_SIZE (LOCAL_RANK, LOCAL_WORLD_SIZE checked only);
//   4. Open MPI: OMPI_COMM_WORLD_RANK, OMPI_COMM_WORLD_SIZE;
//   5. MPICH/Hydra and Intel MPI: PMI_RANK, PMI_SIZE;
//   6. PMIx: PMIX_RANK (PMIx exports no size: it comes from the others);
//   7. Slurm: SLURM_PROCID, SLURM_NTASKS.
//
// Rank and size each come from the first source that sets them. Slurm is last
// because the other launchers often run inside an allocation (torchrun or
// mpirun under srun), where SLURM_PROCID names the launcher's task, not the rank.
#pragma once

#include <optional>
#include <string>

namespace shoal {

struct Discovery {
  int rank = 0;
  int worldSize = 1;
  std::string rankFrom;   // the variable (or "config.rank") the rank came from; "" = a world of one
  std::string sizeFrom;
  // The store URL from config.store or SHOAL_STORE or, when those are unset
  // and the world has several ranks, torchrun's MASTER_ADDR and MASTER_PORT:
  // tcp://MASTER_ADDR:<MASTER_PORT + 1> (torch's own store listens on
  // MASTER_PORT). nullopt when none applies.
  std::optional<std::string> store;
  std::string storeFrom;
};

// configRank / configSize: the config struct's fields (negative = unset);
// configStore: nullptr = unset. Throws Error(SHOAL_ERR_INVALID_ARGUMENT) with
// text for a malformed or out-of-range value, a rank outside the world, a world
// of several ranks (or a store) with no rank, and a rank with no world size.
Discovery discoverRanks(int configRank, int configSize, const char* configStore);

}  // namespace shoal
