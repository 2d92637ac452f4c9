// C entry points of the communicator's life cycle and of error text. The
// communicator itself is made in lib/comm/communicator.cc; this layer adds
// what sits above it: the compressor cache (lib/plugin) and the async engine
// (lib/runtime).
#include <cstring>
#include <memory>

#include "api/attach.h"
#include "api/export.h"
#include "api/guard.h"
#include "api/versioned.h"
#include "comm/communicator.h"
#include "core/config.h"
#include "plugin/driver.h"
#include "runtime/engine.h"

using shoal::guarded;

SHOAL_EXPORT shoal_status_t shoal_comm_init_config(const shoal_config_t* config,
                                                                             shoal_comm_t* comm) {
  return guarded(nullptr, [&] {
    if (comm == nullptr) shoal::fail(SHOAL_ERR_INVALID_ARGUMENT, "shoal_comm_init: comm (the out-parameter) is NULL");
    *comm = nullptr;
    // A shorter struct (an older caller) keeps the defaults of the fields it lacks.
    const shoal_config_t resolved =
        shoal::readVersioned<shoal_config_t>("shoal_comm_init_config", "config", config, SHOAL_CONFIG_INIT);
    std::unique_ptr<shoal_comm> made = shoal::createComm(resolved);
    shoal::attachUpperLayers(*made);
    *comm = made.release();
  });
}

SHOAL_EXPORT shoal_status_t shoal_comm_init(shoal_comm_t* comm) {
  return shoal_comm_init_config(nullptr, comm);
}

SHOAL_EXPORT shoal_status_t shoal_comm_finalize(shoal_comm_t comm) {
  return guarded(comm, [&] {
    if (comm == nullptr) shoal::fail(SHOAL_ERR_INVALID_ARGUMENT, "shoal_comm_finalize: comm is NULL");
    if (comm->finalized) shoal::fail(SHOAL_ERR_INVALID_ARGUMENT, "shoal_comm_finalize: already finalized");
    comm->finalized = true;
    if (comm->engine) comm->engine->shutdown();
    shoal::releaseConnections(*comm);
  });
}

SHOAL_EXPORT shoal_status_t shoal_comm_destroy(shoal_comm_t comm) {
  return guarded(nullptr, [&] {
    if (comm == nullptr) return;
    if (comm->engine) comm->engine->shutdown();
    shoal::releaseConnections(*comm);
    delete comm;
  });
}

SHOAL_EXPORT shoal_status_t shoal_comm_rank(shoal_comm_t comm, int* rank) {
  return guarded(comm, [&] {
    shoal_comm& c = shoal::usableComm(comm, "shoal_comm_rank");
    if (rank == nullptr) shoal::fail(SHOAL_ERR_INVALID_ARGUMENT, "shoal_comm_rank: rank (the out-parameter) is NULL");
    *rank = c.rank;
  });
}

SHOAL_EXPORT shoal_status_t shoal_comm_size(shoal_comm_t comm, int* size) {
  return guarded(comm, [&] {
    shoal_comm& c = shoal::usableComm(comm, "shoal_comm_size");
    if (size == nullptr) shoal::fail(SHOAL_ERR_INVALID_ARGUMENT, "shoal_comm_size: size (the out-parameter) is NULL");
    *size = c.size;
  });
}

SHOAL_EXPORT const char* shoal_last_error(shoal_comm_t comm) {
  return comm != nullptr ? comm->lastError.c_str() : shoal::threadLastError().c_str();
}

SHOAL_EXPORT shoal_status_t shoal_config_print(FILE* out, int markdown) {
  return guarded(nullptr, [&] {
    if (out == nullptr) shoal::fail(SHOAL_ERR_INVALID_ARGUMENT, "shoal_config_print: out is NULL");
    shoal::config::print(out, markdown != 0);
  });
}

