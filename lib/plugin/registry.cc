#include "plugin/registry.h"

#include <dirent.h>
#include <dlfcn.h>
#include <limits.h>
#include <stdlib.h>

#include <algorithm>
#include <cstddef>
#include <cstring>
#include <memory>
#include <mutex>

#include "core/config.h"
#include "core/error.h"
#include "core/log.h"

namespace shoal::plugin {
namespace {

constexpr const char* kPluginPrefix = "libshoal-compressor-";
constexpr const char* kPluginSuffix = ".so";

bool validName(const char* name) {
  if (name == nullptr || name[0] == '\0') return false;
  for (const char* c = name; *c; ++c)
    if (!((*c >= 'a' && *c <= 'z') || (*c >= '0' && *c <= '9') || *c == '_')) return false;
  return true;
}

}  // namespace

std::string validateTable(const shoal_compressor_t* table) {
  if (table == nullptr) return "its entry point returned NULL";
  if (table->abi_version > SHOAL_COMPRESSOR_ABI_VERSION)
    return fmt::format("it was built for compressor ABI {}, newer than this shoal's {}; rebuild it against this "
                       "shoal's headers",
                       table->abi_version, SHOAL_COMPRESSOR_ABI_VERSION);
  if (table->abi_version == 0) return "its abi_version is 0; set it to SHOAL_COMPRESSOR_ABI_VERSION";
  if (table->struct_size < offsetof(shoal_compressor_t, destroy_tensor_state) + sizeof(void*))
    return fmt::format("its struct_size {} is too small for ABI {}: it lacks functions", table->struct_size,
                       table->abi_version);
  if (table->name == nullptr || table->name[0] == '\0') return "it has no name";
  if (!validName(table->name)) return fmt::format("its name '{}' is not [a-z0-9_]+", table->name);
  struct Required { const void* function; const char* name; };
  const Required required[] = {{reinterpret_cast<const void*>(table->create), "create"},
                               {reinterpret_cast<const void*>(table->destroy), "destroy"},
                               {reinterpret_cast<const void*>(table->start), "start"},
                               {reinterpret_cast<const void*>(table->round), "round"},
                               {reinterpret_cast<const void*>(table->finish), "finish"}};
  for (const Required& r : required)
    if (r.function == nullptr) return fmt::format("its function {}() is missing (NULL)", r.name);
  if ((table->caps & (SHOAL_CAP_HOST | SHOAL_CAP_CUDA)) == 0)
    return "its caps name no memory kind (SHOAL_CAP_HOST or SHOAL_CAP_CUDA)";
  return "";
}

Registry::Registry(const std::string& pluginPath) {
  for (const shoal_compressor_t* table : builtinCompressors()) add(table, "built-in");
  std::vector<std::string> scanned;
  size_t begin = 0;
  while (begin <= pluginPath.size()) {
    size_t end = pluginPath.find(':', begin);
    if (end == std::string::npos) end = pluginPath.size();
    std::string directory = pluginPath.substr(begin, end - begin);
    begin = end + 1;
    if (directory.empty()) continue;
    char resolved[PATH_MAX];
    std::string real = realpath(directory.c_str(), resolved) ? std::string(resolved) : directory;
    if (std::find(scanned.begin(), scanned.end(), real) != scanned.end()) continue;  // listed twice
    scanned.push_back(real);
    DIR* dir = opendir(directory.c_str());
    if (dir == nullptr) {
      refusals_.push_back(fmt::format("{}: SHOAL_PLUGIN_PATH names a folder that cannot be read: {}", directory,
                                      std::strerror(errno)));
      continue;
    }
    std::vector<std::string> files;
    while (dirent* item = readdir(dir)) {
      std::string file = item->d_name;
      if (file.rfind(kPluginPrefix, 0) == 0 && file.size() > std::strlen(kPluginSuffix) &&
          file.compare(file.size() - std::strlen(kPluginSuffix), std::string::npos, kPluginSuffix) == 0)
        files.push_back(directory + "/" + file);
    }
    closedir(dir);
    std::sort(files.begin(), files.end());  // a stable order decides which duplicate loses
    for (const std::string& file : files) loadPlugin(file);
  }
  for (const std::string& refusal : refusals_) SHOAL_LOG_WARN("compressor plugin refused: {}", refusal);
}

void Registry::add(const shoal_compressor_t* table, const std::string& origin) {
  std::string problem = validateTable(table);
  if (!problem.empty()) {
    refusals_.push_back(fmt::format("{}: {}", origin, problem));
    return;
  }
  for (const Entry& entry : entries_)
    if (std::strcmp(entry.table->name, table->name) == 0) {
      refusals_.push_back(fmt::format("{}: its name '{}' is already taken by {}", origin, table->name, entry.origin));
      return;
    }
  entries_.push_back({table, origin});
}

void Registry::loadPlugin(const std::string& file) {
  // Never dlclose'd: tables and their functions must outlive every communicator.
  void* handle = dlopen(file.c_str(), RTLD_NOW | RTLD_LOCAL);
  if (handle == nullptr) {
    refusals_.push_back(fmt::format("{}: cannot be loaded: {}", file, dlerror()));
    return;
  }
  auto entry = reinterpret_cast<shoal_compressor_plugin_fn>(dlsym(handle, SHOAL_COMPRESSOR_PLUGIN_SYMBOL));
  if (entry == nullptr) {
    refusals_.push_back(fmt::format("{}: it does not export {}()", file, SHOAL_COMPRESSOR_PLUGIN_SYMBOL));
    return;
  }
  add(entry(), file);
}

const Registry& Registry::current() {
  static std::mutex mutex;
  static std::string loadedPath;
  static std::unique_ptr<Registry> registry;
  static std::vector<std::unique_ptr<Registry>> retired;  // earlier registries stay valid for their users
  std::lock_guard<std::mutex> lock(mutex);
  std::string path = config::getString("SHOAL_PLUGIN_PATH");
  if (!registry || path != loadedPath) {
    if (registry) retired.push_back(std::move(registry));
    registry.reset(new Registry(path));
    loadedPath = path;
  }
  return *registry;
}

const Entry& Registry::find(const std::string& name) const {
  std::string available;
  for (const Entry& entry : entries_) {
    if (name == entry.table->name) return entry;
    available += std::string(available.empty() ? "" : ", ") + entry.table->name;
  }
  std::string refused;
  for (const std::string& refusal : refusals_) refused += "; refused " + refusal;
  fail(SHOAL_ERR_NOT_FOUND, "unknown compressor '{}'; available: {}{}", name, available, refused);
}

ParsedOptions parseOptions(const std::string& text) {
  ParsedOptions parsed;
  size_t begin = 0;
  while (begin < text.size()) {
    size_t end = text.find(',', begin);
    if (end == std::string::npos) end = text.size();
    std::string item = text.substr(begin, end - begin);
    begin = end + 1;
    if (item.empty()) continue;
    size_t equals = item.find('=');
    if (equals == std::string::npos || equals == 0)
      fail(SHOAL_ERR_INVALID_ARGUMENT, "compressor option '{}' in '{}' is not key=value", item, text);
    auto trim = [](std::string text) {
      size_t first = text.find_first_not_of(" \t"), last = text.find_last_not_of(" \t");
      return first == std::string::npos ? std::string() : text.substr(first, last - first + 1);
    };
    std::string key = trim(item.substr(0, equals));
    if (key.empty()) fail(SHOAL_ERR_INVALID_ARGUMENT, "compressor option '{}' in '{}' has no key", item, text);
    if (std::find(parsed.keys.begin(), parsed.keys.end(), key) != parsed.keys.end())
      fail(SHOAL_ERR_INVALID_ARGUMENT, "compressor option '{}' is given twice in '{}'", key, text);
    parsed.keys.push_back(key);
    parsed.values.push_back(trim(item.substr(equals + 1)));
  }
  return parsed;
}

}  // namespace shoal::plugin
