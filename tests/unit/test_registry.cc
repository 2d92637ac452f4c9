// The compressor registry (lib/plugin/registry.{h,cc}): which plugin files on
// SHOAL_PLUGIN_PATH are loaded or refused, and why; lookups by name; table
// validation; option parsing.
//
// The plugins are tiny C files written and compiled (cc -shared) at test time
// into a fresh temporary folder, one broken in each way the registry must
// catch, plus good ones. They are built against this checkout's include/
// (SHOAL_SOURCE_DIR), as an external plugin would be.
#include <dlfcn.h>
#include <stdlib.h>

#include <cstddef>
#include <cstdio>
#include <cstdlib>
#include <filesystem>
#include <fstream>
#include <functional>
#include <string>
#include <vector>

#include <gtest/gtest.h>

#include "core/error.h"
#include "plugin/registry.h"

namespace shoal::plugin {
namespace {

namespace fs = std::filesystem;

// ---- plugins built at test time ---------------------------------------------

// One plugin source: every @KEY@ is replaced per variant.
constexpr const char* kPluginTemplate = R"(#include <shoal/compressor.h>
#include <stddef.h>

static shoal_status_t create(const shoal_compressor_params_t *params, void **instance) {
  (void)params;
  *instance = NULL;
  return SHOAL_OK;
}
static void destroy(void *instance) { (void)instance; }
static shoal_status_t start(void *instance, shoal_compress_op_t *op, void **state) {
  (void)instance; (void)op;
  *state = NULL;
  return SHOAL_OK;
}
__attribute__((unused)) static shoal_status_t round_fn(void *instance, void *state, shoal_compress_op_t *op,
                                                      shoal_round_t *round) {
  (void)instance; (void)state; (void)op;
  round->done = 1;
  return SHOAL_OK;
}
static void finish(void *instance, void *state) { (void)instance; (void)state; }

static const shoal_compressor_t table = {
    @ABI@, sizeof(shoal_compressor_t), @NAME@, "a test plugin", "", SHOAL_CAP_HOST, SHOAL_ERROR_EXACT, 0.0,
    1u << SHOAL_F32, create, destroy, start, @ROUND@, finish, NULL, NULL, NULL,
};

@EXPORT@ const shoal_compressor_t *@SYMBOL@(void) { return &table; }
)";

struct PluginSpec {
  std::string file;  // the part after libshoal-compressor-, before .so
  std::string name = "\"good_one\"";
  std::string abi = "SHOAL_COMPRESSOR_ABI_VERSION";
  std::string round = "round_fn";
  std::string exportMacro = "SHOAL_COMPRESSOR_EXPORT";
  std::string symbol = "shoal_compressor_plugin_v1";
};

std::string replaceAll(std::string text, const std::string& from, const std::string& to) {
  for (size_t at = text.find(from); at != std::string::npos; at = text.find(from, at + to.size()))
    text.replace(at, from.size(), to);
  return text;
}

std::string readFile(const fs::path& path) {
  std::ifstream in(path);
  return std::string(std::istreambuf_iterator<char>(in), std::istreambuf_iterator<char>());
}

// Compiles spec into dir/libshoal-compressor-<file>.so; "" on success, else the compiler's output.
std::string buildPlugin(const fs::path& dir, const PluginSpec& spec) {
  std::string source = kPluginTemplate;
  source = replaceAll(source, "@ABI@", spec.abi);
  source = replaceAll(source, "@NAME@", spec.name);
  source = replaceAll(source, "@ROUND@", spec.round);
  source = replaceAll(source, "@EXPORT@", spec.exportMacro);
  source = replaceAll(source, "@SYMBOL@", spec.symbol);
  fs::path sourcePath = dir / ("src_" + spec.file + ".c");
  std::ofstream(sourcePath) << source;
  fs::path output = dir / ("libshoal-compressor-" + spec.file + ".so");
  fs::path log = dir / ("src_" + spec.file + ".log");
  const char* compiler = std::getenv("CC");
  // -fvisibility=hidden, as plugin builds should use: only SHOAL_COMPRESSOR_EXPORT leaves the .so.
  std::string command = std::string(compiler && compiler[0] ? compiler : "cc") +
                        " -std=c11 -shared -fPIC -fvisibility=hidden -Wall -Werror -I'" SHOAL_SOURCE_DIR "/include' -o '" +
                        output.string() + "' '" + sourcePath.string() + "' > '" + log.string() + "' 2>&1";
  if (std::system(command.c_str()) != 0) return command + "\n" + readFile(log);
  return "";
}

// The plugins of the folder test, and the reason each bad one must be refused for.
struct Expected {
  PluginSpec spec;
  std::string reason;  // "" = loads
};

std::vector<Expected> folderPlugins() {
  std::vector<Expected> plugins;
  auto add = [&](const std::string& file, const std::string& reason, const std::function<void(PluginSpec&)>& edit) {
    PluginSpec spec;
    spec.file = file;
    edit(spec);
    plugins.push_back({spec, reason});
  };
  add("good", "", [](PluginSpec&) {});
  // Sorts after "good": the same name from a second file loses to the first.
  add("good_copy", "its name 'good_one' is already taken by ", [](PluginSpec&) {});
  add("noname", "it has no name", [](PluginSpec& s) { s.name = "NULL"; });
  add("emptyname", "it has no name", [](PluginSpec& s) { s.name = "\"\""; });
  add("badname", "its name 'Bad-Name' is not [a-z0-9_]+", [](PluginSpec& s) { s.name = "\"Bad-Name\""; });
  add("noround", "its function round() is missing (NULL)", [](PluginSpec& s) {
    s.name = "\"noround\"";
    s.round = "NULL";
  });
  add("newabi", "newer than this shoal's", [](PluginSpec& s) {
    s.name = "\"newabi\"";
    s.abi = "SHOAL_COMPRESSOR_ABI_VERSION + 1";
  });
  add("dupfp16", "its name 'fp16' is already taken by built-in", [](PluginSpec& s) { s.name = "\"fp16\""; });
  // (An entry point defined without SHOAL_COMPRESSOR_EXPORT is still exported:
  // compressor.h declares it with default visibility, so that mistake cannot happen.)
  add("wrongsymbol", "it does not export shoal_compressor_plugin_v1()", [](PluginSpec& s) {
    s.name = "\"wrongsymbol\"";
    s.symbol = "shoal_compressor_plugin_v0";
  });
  add("second", "", [](PluginSpec& s) { s.name = "\"second_good\""; });
  return plugins;
}

class RegistryPluginTest : public ::testing::Test {
 protected:
  static void SetUpTestSuite() {
    char pattern[] = "/tmp/shoal-test-registry.XXXXXX";
    ASSERT_NE(mkdtemp(pattern), nullptr);
    dir_ = pattern;
    for (const Expected& plugin : folderPlugins()) {
      std::string problem = buildPlugin(dir_, plugin.spec);
      ASSERT_EQ(problem, "") << "cannot compile test plugin " << plugin.spec.file;
    }
    // Files the registry must ignore or refuse without a compiler's help.
    std::ofstream(dir_ / "libshoal-compressor-garbage.so") << "not an ELF file\n";
    std::ofstream(dir_ / "libother.so") << "ignored: not libshoal-compressor-*\n";
    std::ofstream(dir_ / "libshoal-compressor-readme.txt") << "ignored: not *.so\n";
    const char* previous = std::getenv("SHOAL_PLUGIN_PATH");
    hadPath_ = previous != nullptr;
    if (previous) previousPath_ = previous;
  }

  static void TearDownTestSuite() {
    if (hadPath_) setenv("SHOAL_PLUGIN_PATH", previousPath_.c_str(), 1);
    else unsetenv("SHOAL_PLUGIN_PATH");
    std::error_code ignored;
    if (!dir_.empty()) fs::remove_all(dir_, ignored);
  }

  void TearDown() override {
    if (hadPath_) setenv("SHOAL_PLUGIN_PATH", previousPath_.c_str(), 1);
    else unsetenv("SHOAL_PLUGIN_PATH");
  }

  static const Registry& registryFor(const std::string& path) {
    setenv("SHOAL_PLUGIN_PATH", path.c_str(), 1);
    return Registry::current();
  }

  static std::string file(const std::string& stem) { return (dir_ / ("libshoal-compressor-" + stem + ".so")).string(); }

  static std::string joined(const std::vector<std::string>& lines) {
    std::string text;
    for (const std::string& line : lines) text += line + "\n";
    return text;
  }

  static inline fs::path dir_;
  static inline bool hadPath_ = false;
  static inline std::string previousPath_;
};

const Entry* findEntry(const Registry& registry, const std::string& name) {
  for (const Entry& entry : registry.entries())
    if (name == entry.table->name) return &entry;
  return nullptr;
}

TEST_F(RegistryPluginTest, LoadsGoodPluginsAfterTheBuiltIns) {
  const Registry& registry = registryFor(dir_.string());
  const size_t builtins = builtinCompressors().size();
  ASSERT_EQ(registry.entries().size(), builtins + 2) << joined(registry.refusals());
  for (size_t i = 0; i < builtins; ++i) {
    EXPECT_EQ(registry.entries()[i].table, builtinCompressors()[i]);
    EXPECT_EQ(registry.entries()[i].origin, "built-in");
  }
  const Entry* good = findEntry(registry, "good_one");
  ASSERT_NE(good, nullptr);
  EXPECT_EQ(good->origin, file("good"));
  EXPECT_STREQ(good->table->description, "a test plugin");
  const Entry* second = findEntry(registry, "second_good");
  ASSERT_NE(second, nullptr);
  EXPECT_EQ(second->origin, file("second"));
  EXPECT_EQ(&registry.find("good_one"), good);
  EXPECT_EQ(registry.find("fp16").origin, "built-in") << "a plugin must never replace a built-in";
}

TEST_F(RegistryPluginTest, RefusesEachBadPluginNamingItsFileAndTheReason) {
  const Registry& registry = registryFor(dir_.string());
  const std::string refusals = joined(registry.refusals());
  for (const Expected& plugin : folderPlugins()) {
    const std::string prefix = file(plugin.spec.file) + ": ";
    size_t found = 0;
    std::string line;
    for (const std::string& refusal : registry.refusals())
      if (refusal.rfind(prefix, 0) == 0) {
        ++found;
        line = refusal;
      }
    if (plugin.reason.empty()) {
      EXPECT_EQ(found, 0u) << plugin.spec.file << " was refused: " << line;
      continue;
    }
    ASSERT_EQ(found, 1u) << plugin.spec.file << " should be refused once; refusals:\n" << refusals;
    EXPECT_NE(line.find(plugin.reason), std::string::npos) << "expected '" << plugin.reason << "' in: " << line;
  }
  // The duplicate names the file it lost to; the one that was not loaded at all says why.
  EXPECT_NE(refusals.find(file("good_copy") + ": its name 'good_one' is already taken by " + file("good")),
            std::string::npos)
      << refusals;
  EXPECT_NE(refusals.find(file("newabi") + ": it was built for compressor ABI " +
                          std::to_string(SHOAL_COMPRESSOR_ABI_VERSION + 1)),
            std::string::npos)
      << refusals;
  EXPECT_NE(refusals.find(file("garbage") + ": cannot be loaded: "), std::string::npos) << refusals;
  // Files whose names do not match libshoal-compressor-*.so are not plugins: neither loaded nor refused.
  EXPECT_EQ(refusals.find("libother.so"), std::string::npos) << refusals;
  EXPECT_EQ(refusals.find("readme.txt"), std::string::npos) << refusals;
  // 9 bad .so files built above + garbage.
  EXPECT_EQ(registry.refusals().size(), 9u) << refusals;
  // Refused plugins are not selectable.
  for (const char* name : {"noround", "newabi", "wrongsymbol", "Bad-Name"})
    EXPECT_EQ(findEntry(registry, name), nullptr) << name;
}

TEST_F(RegistryPluginTest, UnknownNameListsTheAvailableOnesAndTheRefusals) {
  const Registry& registry = registryFor(dir_.string());
  try {
    registry.find("nosuch");
    FAIL() << "find(\"nosuch\") did not throw";
  } catch (const Error& e) {
    EXPECT_EQ(e.status(), SHOAL_ERR_NOT_FOUND);
    std::string text = e.what();
    EXPECT_NE(text.find("'nosuch'"), std::string::npos) << text;
    std::string available;
    for (const Entry& entry : registry.entries())
      available += std::string(available.empty() ? "" : ", ") + entry.table->name;
    EXPECT_NE(text.find("available: " + available), std::string::npos) << text;
    EXPECT_NE(text.find("good_one"), std::string::npos) << text;
    // So that a user whose plugin was refused learns why from the failed lookup.
    EXPECT_NE(text.find("refused " + file("noround") + ": its function round() is missing"), std::string::npos)
        << text;
  }
}

TEST_F(RegistryPluginTest, FollowsChangesOfThePath) {
  const Registry& without = registryFor("");
  EXPECT_EQ(without.entries().size(), builtinCompressors().size());
  EXPECT_TRUE(without.refusals().empty()) << joined(without.refusals());
  EXPECT_EQ(findEntry(without, "good_one"), nullptr);

  // Empty items of the path are skipped; an unreadable folder is refused, not fatal.
  const std::string missing = (dir_ / "no-such-folder").string();
  const Registry& with = registryFor("::" + missing + ":" + dir_.string() + ":");
  EXPECT_NE(findEntry(with, "good_one"), nullptr);
  const std::string refusals = joined(with.refusals());
  EXPECT_NE(refusals.find(missing + ": SHOAL_PLUGIN_PATH names a folder that cannot be read"), std::string::npos)
      << refusals;

  // The same folder twice (also spelled differently): scanned once, nothing refused twice.
  const size_t refusedOnce = registryFor(dir_.string()).refusals().size();
  const Registry& twice = registryFor(dir_.string() + ":" + dir_.string() + "/.");
  EXPECT_EQ(twice.entries().size(), builtinCompressors().size() + 2);
  EXPECT_EQ(twice.refusals().size(), refusedOnce) << joined(twice.refusals());

  // Back to no plugins: the earlier registries' tables stay valid (plugins are never unloaded).
  const Registry& again = registryFor("");
  EXPECT_EQ(findEntry(again, "good_one"), nullptr);
  const Entry* good = findEntry(with, "good_one");
  ASSERT_NE(good, nullptr);
  EXPECT_STREQ(good->table->name, "good_one");
}

// ---- validateTable on hand-made tables -----------------------------------------

shoal_status_t fakeCreate(const shoal_compressor_params_t*, void**) { return SHOAL_OK; }
void fakeDestroy(void*) {}
shoal_status_t fakeStart(void*, shoal_compress_op_t*, void**) { return SHOAL_OK; }
shoal_status_t fakeRound(void*, void*, shoal_compress_op_t*, shoal_round_t*) { return SHOAL_OK; }
void fakeFinish(void*, void*) {}

shoal_compressor_t validTable() {
  shoal_compressor_t table{};
  table.abi_version = SHOAL_COMPRESSOR_ABI_VERSION;
  table.struct_size = sizeof(shoal_compressor_t);
  table.name = "hand_made_1";
  table.description = "";
  table.options_help = "";
  table.caps = SHOAL_CAP_HOST;
  table.error_kind = SHOAL_ERROR_EXACT;
  table.dtypes = 1u << SHOAL_F32;
  table.create = fakeCreate;
  table.destroy = fakeDestroy;
  table.start = fakeStart;
  table.round = fakeRound;
  table.finish = fakeFinish;
  return table;
}

std::string problemWith(const std::function<void(shoal_compressor_t&)>& edit) {
  shoal_compressor_t table = validTable();
  edit(table);
  return validateTable(&table);
}

TEST(RegistryValidateTable, AcceptsAValidTable) {
  EXPECT_EQ(problemWith([](shoal_compressor_t&) {}), "");
  // Optional parts may be missing.
  EXPECT_EQ(problemWith([](shoal_compressor_t& t) {
              t.description = nullptr;
              t.options_help = nullptr;
              t.destroy_tensor_state = nullptr;
              t.save_tensor_state = nullptr;
              t.load_tensor_state = nullptr;
            }),
            "");
  EXPECT_EQ(problemWith([](shoal_compressor_t& t) { t.caps = SHOAL_CAP_CUDA; }), "");
  // An older table that ends after destroy_tensor_state is still complete.
  EXPECT_EQ(problemWith([](shoal_compressor_t& t) {
              t.struct_size = offsetof(shoal_compressor_t, destroy_tensor_state) + sizeof(void*);
            }),
            "");
}

TEST(RegistryValidateTable, EveryBuiltInIsValid) {
  for (const shoal_compressor_t* table : builtinCompressors()) {
    ASSERT_NE(table, nullptr);
    EXPECT_EQ(validateTable(table), "") << table->name;
  }
}

TEST(RegistryValidateTable, NamesWhatIsWrong) {
  EXPECT_EQ(validateTable(nullptr), "its entry point returned NULL");
  EXPECT_EQ(problemWith([](shoal_compressor_t& t) { t.abi_version = 0; }),
            "its abi_version is 0; set it to SHOAL_COMPRESSOR_ABI_VERSION");
  EXPECT_NE(problemWith([](shoal_compressor_t& t) { t.abi_version = SHOAL_COMPRESSOR_ABI_VERSION + 1; })
                .find("newer than this shoal's " + std::to_string(SHOAL_COMPRESSOR_ABI_VERSION)),
            std::string::npos);
  EXPECT_NE(problemWith([](shoal_compressor_t& t) { t.struct_size = 16; }).find("struct_size 16 is too small"),
            std::string::npos);
  EXPECT_NE(problemWith([](shoal_compressor_t& t) {
              t.struct_size = offsetof(shoal_compressor_t, destroy_tensor_state);
            }).find("lacks functions"),
            std::string::npos);
  EXPECT_EQ(problemWith([](shoal_compressor_t& t) { t.name = nullptr; }), "it has no name");
  EXPECT_EQ(problemWith([](shoal_compressor_t& t) { t.name = ""; }), "it has no name");
  for (const char* bad : {"Upper", "with-dash", "with space", "dot.name", "slash/name", "caf\xc3\xa9"})
    EXPECT_EQ(problemWith([&](shoal_compressor_t& t) { t.name = bad; }),
              std::string("its name '") + bad + "' is not [a-z0-9_]+");
  for (const char* good : {"a", "0", "snake_case_9", "_"})
    EXPECT_EQ(problemWith([&](shoal_compressor_t& t) { t.name = good; }), "") << good;
  EXPECT_EQ(problemWith([](shoal_compressor_t& t) { t.create = nullptr; }), "its function create() is missing (NULL)");
  EXPECT_EQ(problemWith([](shoal_compressor_t& t) { t.destroy = nullptr; }), "its function destroy() is missing (NULL)");
  EXPECT_EQ(problemWith([](shoal_compressor_t& t) { t.start = nullptr; }), "its function start() is missing (NULL)");
  EXPECT_EQ(problemWith([](shoal_compressor_t& t) { t.round = nullptr; }), "its function round() is missing (NULL)");
  EXPECT_EQ(problemWith([](shoal_compressor_t& t) { t.finish = nullptr; }), "its function finish() is missing (NULL)");
  EXPECT_EQ(problemWith([](shoal_compressor_t& t) { t.caps = SHOAL_CAP_LOSSLESS | SHOAL_CAP_HOMOMORPHIC; }),
            "its caps name no memory kind (SHOAL_CAP_HOST or SHOAL_CAP_CUDA)");
}

// ---- parseOptions -----------------------------------------------------------------

ParsedOptions parsed(const std::string& text) { return parseOptions(text); }

Error parseError(const std::string& text) {
  try {
    parseOptions(text);
  } catch (const Error& e) {
    return e;
  }
  ADD_FAILURE() << "parseOptions(\"" << text << "\") did not throw";
  return Error(SHOAL_OK, "");
}

using Pairs = std::vector<std::pair<std::string, std::string>>;
Pairs pairs(const ParsedOptions& options) {
  EXPECT_EQ(options.keys.size(), options.values.size());
  Pairs result;
  for (size_t i = 0; i < options.keys.size() && i < options.values.size(); ++i)
    result.emplace_back(options.keys[i], options.values[i]);
  return result;
}

TEST(RegistryParseOptions, AcceptsKeyValueLists) {
  EXPECT_EQ(pairs(parsed("")), Pairs{});
  EXPECT_EQ(pairs(parsed("k=1")), (Pairs{{"k", "1"}}));
  EXPECT_EQ(pairs(parsed("k=1,ratio=2")), (Pairs{{"k", "1"}, {"ratio", "2"}}));
  // Order is kept, so a compressor sees options as written.
  EXPECT_EQ(pairs(parsed("z=1,a=2")), (Pairs{{"z", "1"}, {"a", "2"}}));
  // Empty items (a trailing, leading or doubled comma) are skipped.
  EXPECT_EQ(pairs(parsed("k=1,")), (Pairs{{"k", "1"}}));
  EXPECT_EQ(pairs(parsed(",k=1")), (Pairs{{"k", "1"}}));
  EXPECT_EQ(pairs(parsed("k=1,,ratio=2")), (Pairs{{"k", "1"}, {"ratio", "2"}}));
  EXPECT_EQ(pairs(parsed(",")), Pairs{});
  // The value is everything after the first '=', possibly empty; the compressor judges it.
  EXPECT_EQ(pairs(parsed("k=")), (Pairs{{"k", ""}}));
  EXPECT_EQ(pairs(parsed("expr=a=b")), (Pairs{{"expr", "a=b"}}));
}

TEST(RegistryParseOptions, RefusesMalformedItemsWithText) {
  for (const char* text : {"k", "=1", "k=1,ratio", "k=1,=2", "="}) {
    Error e = parseError(text);
    EXPECT_EQ(e.status(), SHOAL_ERR_INVALID_ARGUMENT) << text;
    EXPECT_NE(std::string(e.what()).find("is not key=value"), std::string::npos) << text << ": " << e.what();
    EXPECT_NE(std::string(e.what()).find(std::string("'") + text + "'"), std::string::npos)
        << "the message should quote the whole option text: " << e.what();
  }
  Error twice = parseError("k=1,k=2");
  EXPECT_EQ(twice.status(), SHOAL_ERR_INVALID_ARGUMENT);
  EXPECT_NE(std::string(twice.what()).find("'k' is given twice"), std::string::npos) << twice.what();
  Error twiceApart = parseError("k=1,ratio=2,k=1");
  EXPECT_EQ(twiceApart.status(), SHOAL_ERR_INVALID_ARGUMENT);
}

}  // namespace
}  // namespace shoal::plugin
