// Store backends: threads act as ranks on memory, file and tcp stores.
#include <arpa/inet.h>
#include <netinet/in.h>
#include <poll.h>
#include <sys/resource.h>
#include <sys/socket.h>
#include <unistd.h>

#include <algorithm>
#include <atomic>
#include <cstdlib>
#include <filesystem>
#include <functional>
#include <numeric>
#include <thread>

#include <gtest/gtest.h>

#include "bootstrap/store.h"
#include "harness/forked_job.h"

namespace shoal {
namespace {

using namespace std::chrono_literals;

constexpr int kRanks = 4;
constexpr double kShort = 0.3;  // deadline of the waits meant to time out
constexpr double kSlack = 0.5;  // how late a timeout may fire

Bytes bytes(const std::string& text) { return Bytes(text.begin(), text.end()); }
std::string text(const Bytes& value) { return std::string(value.begin(), value.end()); }
double since(Clock::time_point start) { return std::chrono::duration<double>(Clock::now() - start).count(); }

// The Error f throws; a failure (and a blank Error) when it throws none.
Error errorFrom(const std::function<void()>& f) {
  try {
    f();
  } catch (const Error& e) {
    return e;
  }
  ADD_FAILURE() << "expected a shoal::Error";
  return Error(SHOAL_OK, "");
}

bool contains(const std::string& haystack, const std::string& needle) {
  return haystack.find(needle) != std::string::npos;
}

std::unique_ptr<Store> openStore(const std::string& url, int rank, int world = kRanks, const std::string& token = "t0k",
                                 double timeoutS = 5) {
  StoreOptions options;
  options.url = url;
  options.rank = rank;
  options.worldSize = world;
  options.token = token;
  options.timeoutS = timeoutS;
  return makeStore(options);
}

// Runs fn(rank) on kRanks threads and joins them; a shoal::Error in a thread fails the test.
void runRanks(const std::function<void(int)>& fn, int ranks = kRanks) {
  std::vector<std::thread> threads;
  for (int rank = 0; rank < ranks; ++rank)
    threads.emplace_back([&, rank] {
      try {
        fn(rank);
      } catch (const Error& e) {
        ADD_FAILURE() << "rank " << rank << ": " << e.what();
      }
    });
  for (auto& t : threads) t.join();
}

enum class Backend { Memory, File, Tcp };

class StoreTest : public ::testing::TestWithParam<Backend> {
 protected:
  void SetUp() override {
    static std::atomic<int> counter{0};
    if (GetParam() == Backend::Memory) url_ = "memory://test" + std::to_string(counter++);
    if (GetParam() == Backend::File) {
      char dir[] = "/tmp/shoal-store-test-XXXXXX";
      ASSERT_NE(mkdtemp(dir), nullptr);
      dir_ = dir;
      url_ = "file://" + dir_ + "/sub";  // the store creates missing directories
    }
    if (GetParam() == Backend::Tcp) url_ = "tcp://127.0.0.1:" + std::to_string(test::freeLoopbackPort());
  }
  void TearDown() override {
    if (!dir_.empty()) std::filesystem::remove_all(dir_);
  }
  // Rank 0 first, so that a tcp server is up before the others connect.
  std::vector<std::unique_ptr<Store>> openAll() {
    std::vector<std::unique_ptr<Store>> stores;
    for (int rank = 0; rank < kRanks; ++rank) stores.push_back(openStore(url_, rank));
    return stores;
  }

  std::string url_;
  std::string dir_;
};

TEST_P(StoreTest, RanksExchangeValues) {
  // Each thread opens its own store, in any order: tcp clients must wait for rank 0's server.
  std::vector<std::unique_ptr<Store>> stores(kRanks);
  runRanks([&](int rank) {
    if (rank == 0) std::this_thread::sleep_for(50ms);
    stores[rank] = openStore(url_, rank);
    Store& store = *stores[rank];
    store.set("addr/" + std::to_string(rank), Bytes{uint8_t(rank), 0, 255, uint8_t(rank)});
    std::vector<std::string> keys;
    for (int r = 0; r < kRanks; ++r) keys.push_back("addr/" + std::to_string(r));
    store.wait(keys, deadlineAfter(5));
    for (int r = 0; r < kRanks; ++r)
      EXPECT_EQ(store.get(keys[r], deadlineAfter(5)), (Bytes{uint8_t(r), 0, 255, uint8_t(r)}));
    store.add("arrived", 1);
  });
  EXPECT_EQ(text(stores[2]->get("arrived", deadlineAfter(5))), std::to_string(kRanks));
}

TEST_P(StoreTest, GetOfMissingKeyTimesOut) {
  auto store = openStore(url_, 0, 1);
  Clock::time_point start = Clock::now();
  Error e = errorFrom([&] { store->get("peer/7", deadlineAfter(kShort)); });
  double waited = since(start);
  EXPECT_EQ(e.status(), SHOAL_ERR_TIMEOUT) << e.what();
  EXPECT_GE(waited, kShort);
  EXPECT_LT(waited, kShort + kSlack);
  EXPECT_TRUE(contains(e.what(), "'peer/7'")) << e.what();
  EXPECT_TRUE(contains(e.what(), url_)) << e.what();
  EXPECT_TRUE(contains(e.what(), "is rank 7 running")) << e.what();
}

TEST_P(StoreTest, WaitNamesOnlyTheMissingKeys) {
  auto stores = openAll();
  stores[1]->set("a/1", bytes("x"));
  Clock::time_point start = Clock::now();
  Error e = errorFrom([&] { stores[0]->wait({"a/1", "a/2", "a/3"}, deadlineAfter(kShort)); });
  EXPECT_EQ(e.status(), SHOAL_ERR_TIMEOUT) << e.what();
  EXPECT_LT(since(start), kShort + kSlack);
  EXPECT_TRUE(contains(e.what(), "'a/2', 'a/3'")) << e.what();
  EXPECT_FALSE(contains(e.what(), "'a/1'")) << e.what();
  EXPECT_TRUE(contains(e.what(), "are ranks 2, 3 running")) << e.what();
}

TEST_P(StoreTest, GetWaitsForALaterSet) {
  auto stores = openAll();
  std::thread writer([&] {
    std::this_thread::sleep_for(150ms);
    stores[3]->set("late", bytes("value"));
  });
  Clock::time_point start = Clock::now();
  EXPECT_EQ(text(stores[0]->get("late", deadlineAfter(5))), "value");
  EXPECT_GE(since(start), 0.1);
  stores[1]->wait({"late"}, deadlineAfter(5));
  writer.join();
}

TEST_P(StoreTest, AddIsAtomic) {
  auto stores = openAll();
  std::vector<std::vector<int64_t>> seen(kRanks);
  runRanks([&](int rank) {
    for (int i = 0; i < 100; ++i) seen[rank].push_back(stores[rank]->add("counter", 1));
  });
  std::vector<int64_t> all;
  for (auto& s : seen) all.insert(all.end(), s.begin(), s.end());
  std::sort(all.begin(), all.end());
  std::vector<int64_t> expected(kRanks * 100);
  std::iota(expected.begin(), expected.end(), 1);
  EXPECT_EQ(all, expected);  // every add saw a distinct total
  EXPECT_EQ(text(stores[0]->get("counter", deadlineAfter(1))), "400");
  EXPECT_EQ(stores[1]->add("counter", -450), -50);
  EXPECT_EQ(stores[1]->add("fresh", 0), 0);
}

TEST_P(StoreTest, AddOnANonIntegerIsAnError) {
  auto store = openStore(url_, 0, 1);
  store->set("name", bytes("not a number"));
  Error e = errorFrom([&] { store->add("name", 1); });
  EXPECT_EQ(e.status(), SHOAL_ERR_INVALID_ARGUMENT);
  EXPECT_TRUE(contains(e.what(), "'name'")) << e.what();
  EXPECT_EQ(store->add("ok", 2), 2);  // the store still works
}

TEST_P(StoreTest, SetOverwritesAndKeepsAnyBytes) {
  auto stores = openAll();
  const std::string key = "odd key/with %2F, dots.. and\n a newline";
  stores[0]->set(key, Bytes{});
  EXPECT_EQ(stores[1]->get(key, deadlineAfter(1)), Bytes{});
  Bytes big(1 << 20);
  for (size_t i = 0; i < big.size(); ++i) big[i] = static_cast<uint8_t>(i * 131 + (i >> 9));
  stores[2]->set(key, big);
  EXPECT_EQ(stores[3]->get(key, deadlineAfter(5)), big);
  stores[2]->set(key, bytes("small"));
  EXPECT_EQ(text(stores[0]->get(key, deadlineAfter(1))), "small");
  // Keys whose escaped forms could collide stay distinct.
  stores[0]->set("a/b", bytes("1"));
  stores[0]->set("a%2Fb", bytes("2"));
  EXPECT_EQ(text(stores[1]->get("a/b", deadlineAfter(1))), "1");
  EXPECT_EQ(text(stores[1]->get("a%2Fb", deadlineAfter(1))), "2");
}

// A reader racing a writer must see whole values only.
TEST_P(StoreTest, ReadersNeverSeeHalfWrittenValues) {
  auto stores = openAll();
  stores[0]->set("v", Bytes(65536, 0));
  std::atomic<bool> done{false};
  std::thread writer([&] {
    for (int i = 1; i <= 50; ++i) stores[0]->set("v", Bytes(65536, static_cast<uint8_t>(i)));
    done = true;
  });
  int reads = 0;
  while (!done || reads == 0) {
    Bytes value = stores[1]->get("v", deadlineAfter(1));
    ASSERT_EQ(value.size(), 65536u);
    ASSERT_EQ(std::count(value.begin(), value.end(), value[0]), 65536) << "torn value";
    ++reads;
  }
  writer.join();
}

std::string backendName(const ::testing::TestParamInfo<Backend>& info) {
  return info.param == Backend::Memory ? "memory" : info.param == Backend::File ? "file" : "tcp";
}

INSTANTIATE_TEST_SUITE_P(Backends, StoreTest, ::testing::Values(Backend::Memory, Backend::File, Backend::Tcp),
                         backendName);

TEST(StoreUrl, MalformedUrlsAreInvalidArguments) {
  for (std::string url : {"", "nonsense", "://x", "memory://", "file://relative/dir", "file://host/dir", "tcp://host",
                          "tcp://:29500", "tcp://host:", "tcp://host:0", "tcp://host:65536", "tcp://host:29a0",
                          "tcp://host:-1", "tcp://[::1]29500", "tcp://::1:29500", "tcp://a b:1"}) {
    Error e = errorFrom([&] { openStore(url, 0, 1); });
    EXPECT_EQ(e.status(), SHOAL_ERR_INVALID_ARGUMENT) << url << ": " << e.what();
    if (!url.empty()) {
      EXPECT_TRUE(contains(e.what(), "'" + url + "'")) << e.what();
    }
    EXPECT_TRUE(contains(e.what(), "tcp://host:port")) << e.what();
  }
}

TEST(StoreUrl, UnknownSchemesAreNotFound) {
  for (std::string url : {"udp://host:1", "redis://host:6379", "files:///tmp"}) {
    Error e = errorFrom([&] { openStore(url, 0, 1); });
    EXPECT_EQ(e.status(), SHOAL_ERR_NOT_FOUND) << url << ": " << e.what();
    EXPECT_TRUE(contains(e.what(), url)) << e.what();
    for (const char* scheme : {"tcp://", "file://", "memory://"}) EXPECT_TRUE(contains(e.what(), scheme)) << e.what();
  }
}

TEST(StoreUrl, BadRankOrTimeoutIsInvalid) {
  EXPECT_EQ(errorFrom([] { openStore("memory://x", 4, 4); }).status(), SHOAL_ERR_INVALID_ARGUMENT);
  EXPECT_EQ(errorFrom([] { openStore("memory://x", -1, 4); }).status(), SHOAL_ERR_INVALID_ARGUMENT);
  EXPECT_EQ(errorFrom([] { openStore("memory://x", 0, 1, "t", 0); }).status(), SHOAL_ERR_INVALID_ARGUMENT);
}

TEST(MemoryStore, NamesAreSeparateAndDroppedWhenUnused) {
  auto a = openStore("memory://drop-test", 0);
  auto b = openStore("MEMORY://drop-test", 1);  // schemes are case-insensitive, names are not
  auto other = openStore("memory://drop-test-2", 0);
  a->set("k", bytes("v"));
  EXPECT_EQ(text(b->get("k", deadlineAfter(1))), "v");
  EXPECT_EQ(errorFrom([&] { other->get("k", deadlineAfter(0.05)); }).status(), SHOAL_ERR_TIMEOUT);
  a.reset();
  EXPECT_EQ(text(b->get("k", deadlineAfter(1))), "v");  // still one user
  b.reset();
  auto again = openStore("memory://drop-test", 0);
  EXPECT_EQ(errorFrom([&] { again->get("k", deadlineAfter(0.05)); }).status(), SHOAL_ERR_TIMEOUT);
}

class TcpStoreTest : public ::testing::Test {
 protected:
  std::string url_ = "tcp://127.0.0.1:" + std::to_string(test::freeLoopbackPort());
};

TEST_F(TcpStoreTest, WrongTokenIsRefusedAndServerKeepsServing) {
  auto server = openStore(url_, 0, 3, "right");
  Clock::time_point start = Clock::now();
  ::testing::internal::CaptureStderr();
  Error e = errorFrom([&] { openStore(url_, 1, 3, "wrong"); });
  std::string log = ::testing::internal::GetCapturedStderr();
  EXPECT_LT(since(start), 2.0);  // refused at once, not retried until the timeout
  // The server names the peer but never the expected token.
  EXPECT_TRUE(contains(log, "wrong job token") && contains(log, "127.0.0.1:")) << log;
  EXPECT_FALSE(contains(log, "right")) << log;
  EXPECT_EQ(e.status(), SHOAL_ERR_INVALID_ARGUMENT) << e.what();
  EXPECT_TRUE(contains(e.what(), "refused the job token")) << e.what();
  EXPECT_TRUE(contains(e.what(), "SHOAL_TOKEN")) << e.what();
  EXPECT_FALSE(contains(e.what(), "right")) << e.what();
  auto good = openStore(url_, 2, 3, "right");
  good->set("k", bytes("v"));
  EXPECT_EQ(text(server->get("k", deadlineAfter(1))), "v");
  // A token that shares a prefix with the real one is still wrong.
  EXPECT_EQ(errorFrom([&] { openStore(url_, 1, 3, "righ"); }).status(), SHOAL_ERR_INVALID_ARGUMENT);
  EXPECT_EQ(errorFrom([&] { openStore(url_, 1, 3, "rightt"); }).status(), SHOAL_ERR_INVALID_ARGUMENT);
}

TEST_F(TcpStoreTest, EmptyTokenIsRefused) {
  for (int rank : {0, 1}) {
    Error e = errorFrom([&] { openStore(url_, rank, 2, ""); });
    EXPECT_EQ(e.status(), SHOAL_ERR_INVALID_ARGUMENT) << e.what();
    EXPECT_TRUE(contains(e.what(), "SHOAL_TOKEN")) << e.what();
  }
}

TEST_F(TcpStoreTest, ClientWithoutServerTimesOut) {
  Clock::time_point start = Clock::now();
  Error e = errorFrom([&] { openStore(url_, 1, 2, "t", kShort); });
  double waited = since(start);
  EXPECT_EQ(e.status(), SHOAL_ERR_TIMEOUT) << e.what();
  EXPECT_GE(waited, kShort);  // kept trying until the deadline
  EXPECT_LT(waited, kShort + kSlack);
  EXPECT_TRUE(contains(e.what(), url_)) << e.what();
}

TEST_F(TcpStoreTest, ClientWaitsForALateServer) {
  std::unique_ptr<Store> client;
  std::thread early([&] {
    try {
      client = openStore(url_, 1, 2, "t", 3);
    } catch (const Error& e) {
      ADD_FAILURE() << e.what();
    }
  });
  std::this_thread::sleep_for(300ms);
  auto server = openStore(url_, 0, 2, "t");
  early.join();
  ASSERT_NE(client, nullptr);
  client->set("k", bytes("v"));
  EXPECT_EQ(text(server->get("k", deadlineAfter(1))), "v");
}

// A raw TCP connection to port on loopback (-1 when refused).
int rawConnect(int port) {
  int fd = socket(AF_INET, SOCK_STREAM | SOCK_CLOEXEC, 0);
  sockaddr_in addr{};
  addr.sin_family = AF_INET;
  addr.sin_port = htons(static_cast<uint16_t>(port));
  addr.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
  if (connect(fd, reinterpret_cast<sockaddr*>(&addr), sizeof addr) != 0) {
    close(fd);
    return -1;
  }
  return fd;
}

int listenRaw(int port) {
  int fd = socket(AF_INET, SOCK_STREAM | SOCK_CLOEXEC, 0);
  int one = 1;
  setsockopt(fd, SOL_SOCKET, SO_REUSEADDR, &one, sizeof one);
  sockaddr_in addr{};
  addr.sin_family = AF_INET;
  addr.sin_port = htons(static_cast<uint16_t>(port));
  addr.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
  EXPECT_EQ(bind(fd, reinterpret_cast<sockaddr*>(&addr), sizeof addr), 0);
  EXPECT_EQ(listen(fd, 16), 0);
  return fd;
}

int portOf(const std::string& url) { return std::stoi(url.substr(url.rfind(':') + 1)); }

// Rank 0's process going away (emulated by a fake server that accepts the handshake, then
// closes everything) wakes a waiting client at once, and later calls fail fast.
TEST_F(TcpStoreTest, ServerGoingAwayWakesAWaitingClient) {
  int listener = listenRaw(portOf(url_));
  Clock::time_point stopped;
  std::thread fake([&] {
    int fd = accept(listener, nullptr, nullptr);
    uint8_t hello[4096];
    EXPECT_GT(recv(fd, hello, sizeof hello, 0), 0);
    const uint8_t ok[] = {1, 0, 0, 0, 0};  // a frame of one byte: status OK
    EXPECT_EQ(send(fd, ok, sizeof ok, MSG_NOSIGNAL), 5);
    std::this_thread::sleep_for(200ms);
    close(fd);
    close(listener);
    stopped = Clock::now();
  });
  auto client = openStore(url_, 1, 2);
  Error e = errorFrom([&] { client->get("never", deadlineAfter(10)); });
  Clock::time_point failed = Clock::now();
  fake.join();
  EXPECT_EQ(e.status(), SHOAL_ERR_REMOTE) << e.what();
  // The closed connection wakes the client at once, not when its current wait slice ends.
  EXPECT_LT(std::chrono::duration<double>(failed - stopped).count(), 0.4);
  Clock::time_point start = Clock::now();
  EXPECT_EQ(errorFrom([&] { client->set("k", bytes("v")); }).status(), SHOAL_ERR_REMOTE);
  EXPECT_LT(since(start), 1.0);
}

TEST_F(TcpStoreTest, PortInUseIsASystemError) {
  int other = listenRaw(portOf(url_));  // another process's service, as far as the store can tell
  Error e = errorFrom([&] { openStore(url_, 0, 2); });
  EXPECT_EQ(e.status(), SHOAL_ERR_SYSTEM) << e.what();
  EXPECT_TRUE(contains(e.what(), "SHOAL_STORE")) << e.what();
  close(other);
}

// Several communicators of one process on one tcp store: rank 0's stores share one server.
TEST_F(TcpStoreTest, SecondStoreOnTheSamePortSharesTheServer) {
  auto first = openStore(url_, 0, 2);
  auto second = openStore(url_, 0, 2);
  auto client = openStore(url_, 1, 2);
  first->set("a", bytes("1"));
  EXPECT_EQ(text(second->get("a", deadlineAfter(1))), "1");
  EXPECT_EQ(text(client->get("a", deadlineAfter(1))), "1");
  first.reset();  // the server stays for the others
  client->set("b", bytes("2"));
  EXPECT_EQ(text(second->get("b", deadlineAfter(1))), "2");
  // Another job's token on a port this process serves is refused while the server is in use.
  EXPECT_EQ(errorFrom([&] { openStore(url_, 0, 2, "another-job"); }).status(), SHOAL_ERR_INVALID_ARGUMENT);
}

// Create and destroy stores the way create/destroy cycles of communicators do, ranks racing:
// a client that connected to rank 0's server just before rank 0 let go of it keeps working.
TEST_F(TcpStoreTest, CreateDestroyCyclesNeverLoseTheConnection) {
  constexpr int kCycles = 100;
  runRanks(
      [&](int rank) {
        for (int cycle = 0; cycle < kCycles; ++cycle) {
          auto store = openStore(url_, rank, 2);
          std::string key = "c" + std::to_string(cycle) + "/";
          store->set(key + std::to_string(rank), bytes("x"));
          store->wait({key + "0", key + "1"}, deadlineAfter(5));
          store->add(key + "done", 1);
        }
      },
      2);
}

// After everyone lets go, the server stops and frees the port (after kIdleLinger).
TEST_F(TcpStoreTest, AnUnusedServerFreesThePort) {
  { auto store = openStore(url_, 0, 1); }
  Clock::time_point released = Clock::now();
  int fd = -1;
  while ((fd = rawConnect(portOf(url_))) >= 0 && since(released) < 5) {
    close(fd);
    std::this_thread::sleep_for(50ms);
  }
  EXPECT_LT(fd, 0) << "the port still accepts connections 5 s after the last user left";
  EXPECT_GE(since(released), 0.9);  // kIdleLinger: it did not stop at once
  if (fd >= 0) close(fd);
}

TEST_F(TcpStoreTest, AConnectionThatNeverSendsIsClosedAfterTheHandshakeDeadline) {
  auto server = openStore(url_, 0, 1);
  int fd = rawConnect(portOf(url_));
  ASSERT_GE(fd, 0);
  Clock::time_point start = Clock::now();
  pollfd p{fd, POLLIN, 0};
  ASSERT_EQ(poll(&p, 1, 9000), 1) << "still open after 9 s";
  char byte;
  EXPECT_LE(recv(fd, &byte, 1, 0), 0);  // closed: EOF or reset
  EXPECT_GE(since(start), 4.5);
  EXPECT_LT(since(start), 7.0);
  close(fd);
}

// 1,100 connections that never present the token: the server keeps at most kMaxUnverified of
// them (so it never runs out of descriptors), a real rank still gets in, and the log stays short.
TEST_F(TcpStoreTest, AFloodOfSilentConnectionsCannotStopTheStore) {
  constexpr int kFlood = 1100;
  rlimit limit{};
  getrlimit(RLIMIT_NOFILE, &limit);
  if (limit.rlim_cur < 3 * kFlood) {
    limit.rlim_cur = std::min<rlim_t>(limit.rlim_max, 3 * kFlood);
    setrlimit(RLIMIT_NOFILE, &limit);
  }
  ASSERT_GE(limit.rlim_cur, rlim_t{2 * kFlood + 200}) << "this test needs " << 2 * kFlood + 200 << " descriptors";
  auto server = openStore(url_, 0, 2);
  ::testing::internal::CaptureStderr();
  std::vector<int> flood;
  for (int i = 0; i < kFlood; ++i) {
    int fd = rawConnect(portOf(url_));
    if (fd >= 0) flood.push_back(fd);
  }
  auto client = openStore(url_, 1, 2);
  client->set("k", bytes("v"));
  EXPECT_EQ(text(server->get("k", deadlineAfter(2))), "v");
  // Our own descriptors: the flood's client ends plus what the server still holds open.
  std::this_thread::sleep_for(300ms);
  size_t open = std::distance(std::filesystem::directory_iterator("/proc/self/fd"), std::filesystem::directory_iterator());
  EXPECT_LT(open, flood.size() + 64 + 40) << "the server holds more than 64 unverified connections";
  for (int fd : flood) close(fd);
  std::string log = ::testing::internal::GetCapturedStderr();
  EXPECT_GE(flood.size(), size_t{kFlood});
  EXPECT_LE(std::count(log.begin(), log.end(), '\n'), 6) << log;  // kWarnBurst lines, then counting
}

// Port scanners and crashed peers must not take the server down.
TEST_F(TcpStoreTest, ServerSurvivesGarbageAndAbruptPeers) {
  auto server = openStore(url_, 0, 2);
  int port = std::stoi(url_.substr(url_.rfind(':') + 1));
  auto rawConnect = [&] {
    int fd = shoal::rawConnect(port);
    EXPECT_GE(fd, 0);
    return fd;
  };
  const char http[] = "GET / HTTP/1.0\r\n\r\n";
  const uint8_t huge[] = {0xff, 0xff, 0xff, 0x7f, 1, 2, 3};
  int idle = rawConnect();  // stays open and silent throughout
  int fd = rawConnect();
  close(fd);
  fd = rawConnect();
  send(fd, http, sizeof http - 1, MSG_NOSIGNAL);
  char buf[16];
  EXPECT_LE(recv(fd, buf, sizeof buf, 0), 0);  // the server hangs up
  close(fd);
  fd = rawConnect();
  send(fd, huge, sizeof huge, MSG_NOSIGNAL);
  EXPECT_LE(recv(fd, buf, sizeof buf, 0), 0);
  close(fd);
  auto client = openStore(url_, 1, 2);
  client->set("k", bytes("v"));
  EXPECT_EQ(text(server->get("k", deadlineAfter(1))), "v");
  // A client that leaves in the middle of a wait.
  std::thread leaver([&] {
    auto quitter = openStore(url_, 1, 2);
    EXPECT_EQ(errorFrom([&] { quitter->wait({"never"}, deadlineAfter(0.1)); }).status(), SHOAL_ERR_TIMEOUT);
  });
  leaver.join();
  client->set("k2", bytes("v2"));
  EXPECT_EQ(text(server->get("k2", deadlineAfter(1))), "v2");
  close(idle);
}

TEST(FileStore, RejectsKeysTooLongForAFileName) {
  char dir[] = "/tmp/shoal-store-test-XXXXXX";
  ASSERT_NE(mkdtemp(dir), nullptr);
  auto store = openStore(std::string("file://") + dir, 0, 1);
  store->set(std::string(200, 'k'), bytes("fine"));
  EXPECT_EQ(errorFrom([&] { store->set(std::string(100, '/'), bytes("x")); }).status(), SHOAL_ERR_INVALID_ARGUMENT);
  // Only the value file is left: temporary files were renamed away.
  EXPECT_EQ(std::distance(std::filesystem::directory_iterator(dir), std::filesystem::directory_iterator()), 1);
  std::filesystem::remove_all(dir);
}

}  // namespace
}  // namespace shoal
