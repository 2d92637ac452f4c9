// memory://name: threads of one process share a key space by name. The
// registry holds weak references, so the key space lives exactly as long as
// some Store for that name does and a later job reusing the name starts empty.
#include <condition_variable>
#include <map>
#include <mutex>

#include "bootstrap/store.h"

namespace shoal::detail {
namespace {

struct Space {
  std::mutex mutex;
  std::condition_variable changed;
  std::map<std::string, Bytes> values;
};

std::shared_ptr<Space> openSpace(const std::string& name) {
  static std::mutex registryMutex;
  static auto* registry = new std::map<std::string, std::weak_ptr<Space>>();  // leaked: outlives static dtors
  std::lock_guard<std::mutex> lock(registryMutex);
  for (auto it = registry->begin(); it != registry->end();) it = it->second.expired() ? registry->erase(it) : ++it;
  std::weak_ptr<Space>& slot = (*registry)[name];
  std::shared_ptr<Space> space = slot.lock();
  if (!space) {
    space = std::make_shared<Space>();
    slot = space;
  }
  return space;
}

class MemoryStore : public Store {
 public:
  MemoryStore(std::shared_ptr<Space> space, std::string url) : space_(std::move(space)), url_(std::move(url)) {}

  void set(const std::string& key, const Bytes& value) override {
    {
      std::lock_guard<std::mutex> lock(space_->mutex);
      space_->values[key] = value;
    }
    space_->changed.notify_all();
  }

  Bytes get(const std::string& key, Deadline deadline) override {
    Clock::time_point start = Clock::now();
    std::unique_lock<std::mutex> lock(space_->mutex);
    if (!space_->changed.wait_until(lock, deadline, [&] { return space_->values.count(key) > 0; }))
      failTimeout({key}, url_, start);
    return space_->values[key];
  }

  void wait(const std::vector<std::string>& keys, Deadline deadline) override {
    Clock::time_point start = Clock::now();
    std::unique_lock<std::mutex> lock(space_->mutex);
    auto allPresent = [&] {
      for (const std::string& key : keys)
        if (space_->values.count(key) == 0) return false;
      return true;
    };
    if (space_->changed.wait_until(lock, deadline, allPresent)) return;
    std::vector<std::string> missing;
    for (const std::string& key : keys)
      if (space_->values.count(key) == 0) missing.push_back(key);
    failTimeout(missing, url_, start);
  }

  int64_t add(const std::string& key, int64_t delta) override {
    int64_t sum = 0;
    {
      std::lock_guard<std::mutex> lock(space_->mutex);
      auto it = space_->values.find(key);
      sum = addCounter(key, it == space_->values.end() ? nullptr : &it->second, delta);
      space_->values[key] = counterBytes(sum);
    }
    space_->changed.notify_all();
    return sum;
  }

 private:
  std::shared_ptr<Space> space_;
  std::string url_;
};

}  // namespace

std::unique_ptr<Store> makeMemoryStore(const std::string& name, const std::string& url) {
  return std::make_unique<MemoryStore>(openSpace(name), url);
}

}  // namespace shoal::detail
