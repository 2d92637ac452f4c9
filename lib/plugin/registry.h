// The compressor registry: built-ins from one explicit table (builtin.cc) and
// external plugins, libshoal-compressor-<name>.so on SHOAL_PLUGIN_PATH, each
// exporting the one entry symbol of include/shoal/compressor.h.
#pragma once

#include <string>
#include <vector>

#include "shoal/compressor.h"

namespace shoal::plugin {

struct Entry {
  const shoal_compressor_t* table;
  std::string origin;  // "built-in" or the plugin's file
};

// Built-in compressors, in listing order.
const std::vector<const shoal_compressor_t*>& builtinCompressors();

// Why a table is unusable ("" when it is fine), e.g. "it has no name".
std::string validateTable(const shoal_compressor_t* table);

class Registry {
 public:
  // The registry for the current SHOAL_PLUGIN_PATH (rescanned when it changes).
  static const Registry& current();
  // Throws Error(SHOAL_ERR_NOT_FOUND) naming the available compressors and
  // any plugin that was refused (with the reason).
  const Entry& find(const std::string& name) const;
  const std::vector<Entry>& entries() const { return entries_; }
  // One line per plugin file refused: "<file>: <reason>".
  const std::vector<std::string>& refusals() const { return refusals_; }

 private:
  explicit Registry(const std::string& pluginPath);
  void add(const shoal_compressor_t* table, const std::string& origin);
  void loadPlugin(const std::string& file);

  std::vector<Entry> entries_;
  std::vector<std::string> refusals_;
};

// "k=v,k=v" -> keys and values. Throws Error(SHOAL_ERR_INVALID_ARGUMENT) for
// an entry without '=' or with an empty key, or a key given twice.
struct ParsedOptions {
  std::vector<std::string> keys;
  std::vector<std::string> values;
};
ParsedOptions parseOptions(const std::string& text);

}  // namespace shoal::plugin
