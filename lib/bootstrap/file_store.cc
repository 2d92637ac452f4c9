// file:///dir: one file per key in a directory every rank can see. Values
// appear by rename, so a reader never sees a half-written value; add() holds
// an flock on a per-key lock file. Readers poll, because inotify does not
// work across machines on a shared file system.
#include <fcntl.h>
#include <sys/file.h>
#include <sys/stat.h>
#include <unistd.h>

#include <atomic>
#include <cctype>
#include <cerrno>
#include <cstring>
#include <optional>
#include <thread>

#include "bootstrap/store.h"

namespace shoal::detail {
namespace {

constexpr size_t kMaxEncodedKey = 240;  // file names stop at 255 bytes

// Percent-encoding keeps names readable ("ucx%2Faddr%2F3") and free of '/'.
std::string encode(const std::string& text) {
  std::string out;
  for (unsigned char c : text) {
    if (std::isalnum(c) || c == '-' || c == '_' || c == '.')
      out += static_cast<char>(c);
    else
      out += fmt::format("%{:02X}", c);
  }
  return out;
}

std::string systemError() { return std::strerror(errno); }

void makeDirectories(const std::string& dir, const std::string& url) {
  for (size_t pos = 1; pos <= dir.size(); ++pos) {
    if (pos != dir.size() && dir[pos] != '/') continue;
    std::string prefix = dir.substr(0, pos);
    if (mkdir(prefix.c_str(), 0777) != 0 && errno != EEXIST)  // EEXIST: another rank won the race
      fail(SHOAL_ERR_SYSTEM, "file store {}: cannot create directory {}: {}", url, prefix, systemError());
  }
  struct stat info {};
  if (stat(dir.c_str(), &info) != 0 || !S_ISDIR(info.st_mode))
    fail(SHOAL_ERR_SYSTEM, "file store {}: {} is not a directory", url, dir);
}

class FileStore : public Store {
 public:
  FileStore(std::string dir, std::string url) : dir_(std::move(dir)), url_(std::move(url)) {
    makeDirectories(dir_, url_);
    char host[256] = {};
    gethostname(host, sizeof host - 1);
    // Unique per machine, process and call: ranks on different hosts may share a pid.
    tempPrefix_ = dir_ + "/t_" + encode(host) + "_" + std::to_string(getpid()) + "_";
  }

  void set(const std::string& key, const Bytes& value) override {
    static std::atomic<uint64_t> counter{0};
    std::string path = pathFor("v_", key);
    std::string temp = tempPrefix_ + std::to_string(counter++);
    int fd = open(temp.c_str(), O_WRONLY | O_CREAT | O_EXCL | O_CLOEXEC, 0644);
    if (fd < 0) fail(SHOAL_ERR_SYSTEM, "file store {}: cannot create {}: {}", url_, temp, systemError());
    size_t done = 0;
    while (done < value.size()) {
      ssize_t n = write(fd, value.data() + done, value.size() - done);
      if (n < 0 && errno == EINTR) continue;
      if (n < 0) {
        std::string why = systemError();
        close(fd);
        unlink(temp.c_str());
        fail(SHOAL_ERR_SYSTEM, "file store {}: cannot write {}: {}", url_, temp, why);
      }
      done += static_cast<size_t>(n);
    }
    if (close(fd) != 0 || rename(temp.c_str(), path.c_str()) != 0) {
      std::string why = systemError();
      unlink(temp.c_str());
      fail(SHOAL_ERR_SYSTEM, "file store {}: cannot write key '{}' to {}: {}", url_, key, path, why);
    }
  }

  Bytes get(const std::string& key, Deadline deadline) override {
    Clock::time_point start = Clock::now();
    std::string path = pathFor("v_", key);
    for (auto pause = std::chrono::milliseconds(1);; pause = std::min(pause * 2, std::chrono::milliseconds(20))) {
      if (std::optional<Bytes> value = read(path)) return *value;
      if (Clock::now() >= deadline) failTimeout({key}, url_, start);
      sleepUntilBefore(pause, deadline);
    }
  }

  void wait(const std::vector<std::string>& keys, Deadline deadline) override {
    Clock::time_point start = Clock::now();
    std::vector<std::string> missing = keys;
    for (auto pause = std::chrono::milliseconds(1);; pause = std::min(pause * 2, std::chrono::milliseconds(20))) {
      std::erase_if(missing, [&](const std::string& key) { return access(pathFor("v_", key).c_str(), F_OK) == 0; });
      if (missing.empty()) return;
      if (Clock::now() >= deadline) failTimeout(missing, url_, start);
      sleepUntilBefore(pause, deadline);
    }
  }

  int64_t add(const std::string& key, int64_t delta) override {
    std::string lockPath = pathFor("l_", key);
    // Lock files stay: removing one would let two ranks lock different inodes of the same name.
    int lockFd = open(lockPath.c_str(), O_RDWR | O_CREAT | O_CLOEXEC, 0644);
    if (lockFd < 0)
      fail(SHOAL_ERR_SYSTEM, "file store {}: cannot open lock file {}: {}", url_, lockPath, systemError());
    int rc;
    while ((rc = flock(lockFd, LOCK_EX)) != 0 && errno == EINTR) {
    }
    if (rc != 0) {
      std::string why = systemError();
      close(lockFd);
      fail(SHOAL_ERR_SYSTEM, "file store {}: cannot lock {}: {}", url_, lockPath, why);
    }
    try {
      std::optional<Bytes> current = read(pathFor("v_", key));
      int64_t sum = addCounter(key, current ? &*current : nullptr, delta);
      set(key, counterBytes(sum));
      close(lockFd);  // releases the flock
      return sum;
    } catch (...) {
      close(lockFd);
      throw;
    }
  }

 private:
  std::string pathFor(const char* prefix, const std::string& key) const {
    std::string name = encode(key);
    if (name.size() > kMaxEncodedKey)
      fail(SHOAL_ERR_INVALID_ARGUMENT, "store key '{}' is too long for a file store ({} bytes once encoded, limit {})",
           key, name.size(), kMaxEncodedKey);
    return dir_ + "/" + prefix + name;
  }

  std::optional<Bytes> read(const std::string& path) const {
    int fd = open(path.c_str(), O_RDONLY | O_CLOEXEC);
    if (fd < 0) {
      if (errno == ENOENT) return std::nullopt;
      fail(SHOAL_ERR_SYSTEM, "file store {}: cannot open {}: {}", url_, path, systemError());
    }
    Bytes value;
    uint8_t chunk[65536];
    for (;;) {
      ssize_t n = ::read(fd, chunk, sizeof chunk);
      if (n < 0 && errno == EINTR) continue;
      if (n < 0) {
        std::string why = systemError();
        close(fd);
        fail(SHOAL_ERR_SYSTEM, "file store {}: cannot read {}: {}", url_, path, why);
      }
      if (n == 0) break;
      value.insert(value.end(), chunk, chunk + n);
    }
    close(fd);
    return value;
  }

  static void sleepUntilBefore(std::chrono::milliseconds pause, Deadline deadline) {
    Clock::time_point wake = Clock::now() + pause;
    std::this_thread::sleep_until(std::min(wake, deadline));
  }

  std::string dir_;
  std::string url_;
  std::string tempPrefix_;
};

}  // namespace

std::unique_ptr<Store> makeFileStore(const std::string& dir, const std::string& url) {
  return std::make_unique<FileStore>(dir, url);
}

}  // namespace shoal::detail
