// C entry points around compression: statistics, per-tensor state for
// checkpoints, and the list of compressors.
#include <cstring>

#include "api/export.h"
#include "api/guard.h"
#include "api/versioned.h"
#include "plugin/driver.h"
#include "comm/communicator.h"
#include "shoal/compressor.h"
#include "core/config.h"
#include "plugin/registry.h"


using namespace shoal;

namespace {

// The instance for (compressor, options) and the named tensor's state slot;
// options NULL means SHOAL_COMPRESSOR_OPTS, as in a call.
plugin::CompressorInstance& instanceFor(shoal_comm& comm, const char* call, const char* compressor,
                                        const char* options) {
  if (compressor == nullptr) fail(SHOAL_ERR_INVALID_ARGUMENT, "{}: compressor is NULL; name one, e.g. \"topk\"", call);
  std::string resolved = options ? options : config::getString("SHOAL_COMPRESSOR_OPTS");
  return comm.compressors->get(compressor, resolved);
}

}  // namespace

SHOAL_EXPORT shoal_status_t shoal_last_compress_stats(shoal_comm_t comm, shoal_compress_stats_t* stats) {
  return guarded(comm, [&] {
    shoal_comm& c = usableComm(comm, "shoal_last_compress_stats");
    shoal_compress_stats_t result = SHOAL_COMPRESS_STATS_INIT;
    result.compressor = c.lastStats.compressor.c_str();
    result.input_bytes = c.lastStats.inputBytes;
    result.payload_bytes = c.lastStats.payloadBytes;
    result.wire_bytes = c.lastStats.wireBytes;
    result.rounds = c.lastStats.rounds;
    writeVersioned("shoal_last_compress_stats", "stats", stats, result);
  });
}

SHOAL_EXPORT shoal_status_t shoal_compressor_state_save(shoal_comm_t comm, const char* compressor,
                                                        const char* compressor_options, const char* name,
                                                        void* buffer, size_t* bytes) {
  return guarded(comm, [&] {
    const char* call = "shoal_compressor_state_save";
    shoal_comm& c = usableComm(comm, call);
    if (name == nullptr || bytes == nullptr) fail(SHOAL_ERR_INVALID_ARGUMENT, "{}: name and bytes must not be NULL", call);
    plugin::CompressorInstance& instance = instanceFor(c, call, compressor, compressor_options);
    if (instance.table().save_tensor_state == nullptr)
      fail(SHOAL_ERR_UNSUPPORTED, "{}: compressor {} keeps no per-tensor state", call, compressor);
    void* state = instance.findState(name);
    if (state == nullptr)
      fail(SHOAL_ERR_NOT_FOUND, "{}: compressor {} has no state for tensor '{}' yet", call, compressor, name);
    shoal_status_t status = instance.table().save_tensor_state(instance.handle(), state, buffer, bytes);
    if (status != SHOAL_OK) fail(status, "{}: compressor {} could not save the state of '{}'", call, compressor, name);
  });
}

SHOAL_EXPORT shoal_status_t shoal_compressor_state_load(shoal_comm_t comm, const char* compressor,
                                                        const char* compressor_options, const char* name,
                                                        const void* buffer, size_t bytes) {
  return guarded(comm, [&] {
    const char* call = "shoal_compressor_state_load";
    shoal_comm& c = usableComm(comm, call);
    if (name == nullptr || (buffer == nullptr && bytes > 0))
      fail(SHOAL_ERR_INVALID_ARGUMENT, "{}: name and buffer must not be NULL", call);
    plugin::CompressorInstance& instance = instanceFor(c, call, compressor, compressor_options);
    if (instance.table().load_tensor_state == nullptr)
      fail(SHOAL_ERR_UNSUPPORTED, "{}: compressor {} keeps no per-tensor state", call, compressor);
    shoal_status_t status = instance.table().load_tensor_state(instance.handle(), instance.stateOf(name), buffer, bytes);
    if (status != SHOAL_OK)
      fail(status, "{}: compressor {} refused the state of '{}' ({} bytes)", call, compressor, name, bytes);
  });
}

SHOAL_EXPORT shoal_status_t shoal_compressors_print(FILE* out) {
  return guarded(nullptr, [&] {
    if (out == nullptr) fail(SHOAL_ERR_INVALID_ARGUMENT, "shoal_compressors_print: out is NULL");
    const plugin::Registry& registry = plugin::Registry::current();
    for (const plugin::Entry& entry : registry.entries()) {
      const shoal_compressor_t& t = *entry.table;
      std::fprintf(out, "%-10s %s%s\n", t.name, t.description ? t.description : "",
                   entry.origin == "built-in" ? "" : (" [" + entry.origin + "]").c_str());
      if (t.options_help && t.options_help[0]) std::fprintf(out, "%-10s options: %s\n", "", t.options_help);
    }
    for (const std::string& refusal : registry.refusals()) std::fprintf(out, "refused: %s\n", refusal.c_str());
  });
}

SHOAL_EXPORT shoal_status_t shoal_compressor_lookup(const char* name, const shoal_compressor_t** table) {
  return guarded(nullptr, [&] {
    if (name == nullptr || table == nullptr)
      fail(SHOAL_ERR_INVALID_ARGUMENT, "shoal_compressor_lookup: name and table must not be NULL");
    *table = plugin::Registry::current().find(name).table;
  });
}
