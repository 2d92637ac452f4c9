// Strict parsing of SHOAL_* variables (lib/core/config.cc) and rank discovery
// from launchers' variables (lib/bootstrap/discovery.cc), over the environment.
#include <gtest/gtest.h>

#include <cstdlib>
#include <functional>
#include <map>
#include <optional>
#include <string>

#include "bootstrap/discovery.h"
#include "core/config.h"
#include "core/error.h"

namespace shoal {
namespace {

// Every variable discovery or the config table reads; each test starts with all unset.
const char* const kManaged[] = {
    "SHOAL_RANK", "SHOAL_WORLD_SIZE", "SHOAL_STORE", "SHOAL_TIMEOUT_S", "SHOAL_SEGMENT_BYTES", "SHOAL_LOG_LEVEL",
    "SHOAL_COMPRESS_MIN_BYTES", "SHOAL_SPIN_ROUNDS", "SHOAL_ALGO", "SHOAL_STALL_CHECK_S", "RANK", "WORLD_SIZE",
    "LOCAL_RANK", "LOCAL_WORLD_SIZE", "MASTER_ADDR", "MASTER_PORT", "OMPI_COMM_WORLD_RANK", "OMPI_COMM_WORLD_SIZE",
    "PMI_RANK", "PMI_SIZE", "PMIX_RANK", "SLURM_PROCID", "SLURM_NTASKS"};

class Environment : public ::testing::Test {
 protected:
  void SetUp() override {
    for (const char* name : kManaged) {
      if (const char* value = std::getenv(name)) saved_[name] = value;
      unsetenv(name);
    }
  }
  void TearDown() override {
    for (const char* name : kManaged) unsetenv(name);
    for (auto& [name, value] : saved_) setenv(name.c_str(), value.c_str(), 1);
  }
  static void set(const char* name, const char* value) { setenv(name, value, 1); }

  // The error text of f, or "" (and a test failure) when it does not throw INVALID_ARGUMENT.
  static std::string errorOf(const std::function<void()>& f) {
    try {
      f();
    } catch (const Error& e) {
      EXPECT_EQ(e.status(), SHOAL_ERR_INVALID_ARGUMENT) << e.what();
      return e.what();
    }
    ADD_FAILURE() << "no error";
    return "";
  }

 private:
  std::map<std::string, std::string> saved_;
};

bool has(const std::string& text, const std::string& part) { return text.find(part) != std::string::npos; }

// ---- strict parsing ---------------------------------------------------------

TEST_F(Environment, TheIssuesBadValuesAreErrorsNamingVariableValueAndRange) {
  struct Case {
    const char* name;
    const char* value;
    const char* range;  // part of the text that states what is allowed
  };
  const Case cases[] = {
      {"SHOAL_TIMEOUT_S", "inf", "from 0.001 to 31536000"},
      {"SHOAL_TIMEOUT_S", "1e10", "from 0.001 to 31536000"},
      {"SHOAL_TIMEOUT_S", "nan", "from 0.001 to 31536000"},
      {"SHOAL_TIMEOUT_S", "0", "from 0.001"},
      {"SHOAL_SEGMENT_BYTES", "1", "from 4096 to 1073741824"},
      {"SHOAL_SEGMENT_BYTES", "3", "from 4096"},
      {"SHOAL_SEGMENT_BYTES", "64k", "integer"},
      {"SHOAL_RANK", "4294967296", "from 0 to 65535"},
      {"SHOAL_RANK", "-1", "from 0"},
      {"SHOAL_WORLD_SIZE", "-2", "from 1 to 65536"},
      {"SHOAL_LOG_LEVEL", "loud", "one of error|warn|info|debug"},
      {"SHOAL_COMPRESS_MIN_BYTES", "-1", "from 0"},
      {"SHOAL_SPIN_ROUNDS", "lots", "auto or an integer"},
      {"SHOAL_ALGO", "fastest", "one of auto|ring|tree|doubling"},
      {"SHOAL_STALL_CHECK_S", "-5", "from 0"},
  };
  for (const Case& c : cases) {
    set(c.name, c.value);
    std::string text = errorOf([] { config::checkEnvironment(); });
    EXPECT_TRUE(has(text, c.name)) << c.name << "=" << c.value << ": " << text;
    EXPECT_TRUE(has(text, std::string("'") + c.value + "'")) << text;
    EXPECT_TRUE(has(text, c.range)) << text;
    unsetenv(c.name);
  }
}

TEST_F(Environment, GettersCheckTheRangeToo) {
  set("SHOAL_SEGMENT_BYTES", "3");
  EXPECT_TRUE(has(errorOf([] { config::getInt("SHOAL_SEGMENT_BYTES"); }), "SHOAL_SEGMENT_BYTES"));
  set("SHOAL_TIMEOUT_S", "inf");
  EXPECT_TRUE(has(errorOf([] { config::getDouble("SHOAL_TIMEOUT_S"); }), "no 'no deadline'"));
}

TEST_F(Environment, GoodValuesAndWordsPass) {
  set("SHOAL_TIMEOUT_S", "0.5");
  set("SHOAL_SEGMENT_BYTES", "+65536");
  set("SHOAL_SPIN_ROUNDS", "auto");
  set("SHOAL_LOG_LEVEL", "debug");
  set("SHOAL_STALL_CHECK_S", "0");
  EXPECT_NO_THROW(config::checkEnvironment());
  EXPECT_EQ(config::getInt("SHOAL_SEGMENT_BYTES"), 65536);
  EXPECT_DOUBLE_EQ(config::getDouble("SHOAL_TIMEOUT_S"), 0.5);
  unsetenv("SHOAL_SEGMENT_BYTES");
  EXPECT_EQ(config::getInt("SHOAL_SEGMENT_BYTES"), 262144);  // the default
}

TEST_F(Environment, EveryDefaultIsWithinItsOwnRange) {
  for (const config::Variable& v : config::table()) {
    if (v.defaultValue[0] == '\0') continue;
    setenv(v.name, v.defaultValue, 1);
    EXPECT_NO_THROW(config::checkEnvironment()) << v.name << "=" << v.defaultValue;
    unsetenv(v.name);
  }
}

TEST(Deadline, HugeAndInfiniteSecondsSaturateInsteadOfOverflowing) {
  EXPECT_GT(deadlineAfter(1e10), Clock::now() + std::chrono::hours(24 * 365));
  EXPECT_GT(deadlineAfter(INFINITY), Clock::now() + std::chrono::hours(24 * 365));
}

// ---- rank discovery ---------------------------------------------------------

TEST_F(Environment, APlainProcessIsAWorldOfOne) {
  Discovery d = discoverRanks(-1, -1, nullptr);
  EXPECT_EQ(d.rank, 0);
  EXPECT_EQ(d.worldSize, 1);
  EXPECT_FALSE(d.store);
}

TEST_F(Environment, EachLaunchersVariables) {
  struct Launcher {
    const char* rank;
    const char* size;
  };
  const Launcher launchers[] = {{"SHOAL_RANK", "SHOAL_WORLD_SIZE"}, {"RANK", "WORLD_SIZE"},
                                {"OMPI_COMM_WORLD_RANK", "OMPI_COMM_WORLD_SIZE"}, {"PMI_RANK", "PMI_SIZE"},
                                {"SLURM_PROCID", "SLURM_NTASKS"}};
  for (const Launcher& l : launchers) {
    set(l.rank, "2");
    set(l.size, "3");
    Discovery d = discoverRanks(-1, -1, nullptr);
    EXPECT_EQ(d.rank, 2) << l.rank;
    EXPECT_EQ(d.worldSize, 3) << l.size;
    EXPECT_EQ(d.rankFrom, l.rank);
    unsetenv(l.rank);
    unsetenv(l.size);
  }
}

TEST_F(Environment, PmixRankTakesItsSizeFromTheOtherLaunchers) {
  set("PMIX_RANK", "1");
  set("SLURM_NTASKS", "4");
  Discovery d = discoverRanks(-1, -1, nullptr);
  EXPECT_EQ(d.rank, 1);
  EXPECT_EQ(d.worldSize, 4);
  EXPECT_EQ(d.sizeFrom, "SLURM_NTASKS");
  unsetenv("SLURM_NTASKS");
  EXPECT_TRUE(has(errorOf([] { discoverRanks(-1, -1, nullptr); }), "world size is not"));
}

TEST_F(Environment, PrecedenceShoalThenTorchrunThenMpiThenSlurm) {
  set("SLURM_PROCID", "0");
  set("SLURM_NTASKS", "2");  // the allocation's task, around torchrun
  set("PMI_RANK", "1");
  set("PMI_SIZE", "8");
  EXPECT_EQ(discoverRanks(-1, -1, nullptr).rankFrom, "PMI_RANK");
  set("OMPI_COMM_WORLD_RANK", "2");
  set("OMPI_COMM_WORLD_SIZE", "8");
  EXPECT_EQ(discoverRanks(-1, -1, nullptr).rankFrom, "OMPI_COMM_WORLD_RANK");
  set("RANK", "3");
  set("WORLD_SIZE", "8");
  Discovery d = discoverRanks(-1, -1, nullptr);
  EXPECT_EQ(d.rank, 3);
  EXPECT_EQ(d.rankFrom, "RANK");
  set("SHOAL_RANK", "4");
  EXPECT_EQ(discoverRanks(-1, -1, nullptr).rank, 4);
  EXPECT_EQ(discoverRanks(5, -1, nullptr).rank, 5);  // the config struct beats them all
}

TEST_F(Environment, ASizeOrAStoreWithoutARankIsAnError) {
  set("WORLD_SIZE", "4");
  std::string text = errorOf([] { discoverRanks(-1, -1, nullptr); });
  EXPECT_TRUE(has(text, "WORLD_SIZE says the job has 4 ranks") && has(text, "refusing to run alone")) << text;
  unsetenv("WORLD_SIZE");
  set("SHOAL_STORE", "tcp://127.0.0.1:29500");
  text = errorOf([] { discoverRanks(-1, -1, nullptr); });
  EXPECT_TRUE(has(text, "SHOAL_STORE") && has(text, "refusing to run alone")) << text;
}

TEST_F(Environment, MalformedLauncherValuesAreErrorsByName) {
  set("RANK", "one");
  set("WORLD_SIZE", "2");
  EXPECT_TRUE(has(errorOf([] { discoverRanks(-1, -1, nullptr); }), "RANK='one'"));
  set("RANK", "2");
  EXPECT_TRUE(has(errorOf([] { discoverRanks(-1, -1, nullptr); }), "outside the world of 2"));
  set("RANK", "0");
  set("LOCAL_RANK", "3");
  set("LOCAL_WORLD_SIZE", "2");
  EXPECT_TRUE(has(errorOf([] { discoverRanks(-1, -1, nullptr); }), "LOCAL_RANK=3"));
}

TEST_F(Environment, TorchrunsStoreIsMasterPortPlusOne) {
  set("RANK", "0");
  set("WORLD_SIZE", "2");
  set("MASTER_ADDR", "node07");
  set("MASTER_PORT", "29500");
  Discovery d = discoverRanks(-1, -1, nullptr);
  ASSERT_TRUE(d.store);
  EXPECT_EQ(*d.store, "tcp://node07:29501");
  set("MASTER_ADDR", "fd00::7");
  EXPECT_EQ(*discoverRanks(-1, -1, nullptr).store, "tcp://[fd00::7]:29501");
  set("SHOAL_STORE", "file:///shared/job");  // SHOAL_STORE wins
  EXPECT_EQ(*discoverRanks(-1, -1, nullptr).store, "file:///shared/job");
  unsetenv("SHOAL_STORE");
  set("MASTER_PORT", "65535");  // no room for + 1
  EXPECT_TRUE(has(errorOf([] { discoverRanks(-1, -1, nullptr); }), "MASTER_PORT='65535'"));
  // A world of one needs no store, and a stray MASTER_ADDR does not make a plain process look for one.
  set("MASTER_PORT", "29500");
  set("WORLD_SIZE", "1");
  EXPECT_FALSE(discoverRanks(-1, -1, nullptr).store);
  unsetenv("RANK");
  unsetenv("WORLD_SIZE");
  EXPECT_FALSE(discoverRanks(-1, -1, nullptr).store);
}

// Threads can outlive main() (a tcp store server thread reads the config table to log until the
// registry's destructor stops it at exit), so the table must outlive static destruction. An
// exit handler registered before the table exists runs after the table's own destructor would:
// under ASan a destroyed table is a heap-use-after-free there, and the child exits non-zero.
// (A fresh process, "threadsafe" style: no earlier test has built the table yet.)
TEST(ConfigTable, ReadableAfterStaticDestruction) {
  GTEST_FLAG_SET(death_test_style, "threadsafe");
  EXPECT_EXIT(
      {
        std::atexit([] { (void)config::getString("SHOAL_LOG_LEVEL"); });
        (void)config::getString("SHOAL_LOG_LEVEL");  // builds the table now, after the handler
        std::exit(0);
      },
      testing::ExitedWithCode(0), "");
}

}  // namespace
}  // namespace shoal
