// What the API layer adds to every communicator the comm layer makes
// (shoal_comm_init, shoal_comm_split): the layers above lib/comm/.
#pragma once

#include "comm/communicator.h"
#include "plugin/driver.h"
#include "runtime/engine.h"

namespace shoal {

inline void attachUpperLayers(shoal_comm& comm) {
  comm.compressors.reset(new plugin::CompressorCache);  // reads SHOAL_COMPRESSOR* once, now
  comm.engine.reset(new runtime::Engine(comm));          // its thread starts with the first async call
}

}  // namespace shoal
