#include "runtime/timeline.h"

#include <cerrno>
#include <cstring>
#include <mutex>
#include <set>

#include <fmt/format.h>

#include "core/log.h"

namespace shoal::runtime {
namespace {

std::string jsonEscape(const std::string& text) {
  std::string out;
  for (unsigned char c : text) {
    if (c == '"' || c == '\\') {
      out += '\\';
      out += static_cast<char>(c);
    } else if (c < 0x20) {
      out += fmt::format("\\u{:04x}", c);
    } else {
      out += static_cast<char>(c);
    }
  }
  return out;
}

double micros(Clock::duration d) { return std::chrono::duration<double, std::micro>(d).count(); }

// The timeline paths open in this process: two communicators (say a world and
// a split) must not write one file at once.
struct OpenPaths {
  std::mutex mutex;
  std::set<std::string> paths;
  static OpenPaths& get() {
    static OpenPaths* open = new OpenPaths;  // leaked: engines may close timelines during exit
    return *open;
  }
};

std::string withSuffix(const std::string& path, int n) {
  const std::string ending = ".json";
  if (path.size() > ending.size() && path.compare(path.size() - ending.size(), ending.size(), ending) == 0)
    return fmt::format("{}.{}{}", path.substr(0, path.size() - ending.size()), n, ending);
  return fmt::format("{}.{}", path, n);
}

std::string claim(const std::string& requested) {
  OpenPaths& open = OpenPaths::get();
  std::lock_guard<std::mutex> lock(open.mutex);
  std::string path = requested;
  for (int n = 1; open.paths.count(path) != 0; ++n) path = withSuffix(requested, n);
  open.paths.insert(path);
  return path;
}

void release(const std::string& path) {
  OpenPaths& open = OpenPaths::get();
  std::lock_guard<std::mutex> lock(open.mutex);
  open.paths.erase(path);
}

}  // namespace

Timeline::Timeline(const std::string& requested) : path_(claim(requested)), origin_(Clock::now()) {
  if (path_ != requested)
    SHOAL_LOG_INFO("SHOAL_TIMELINE={} is written by another communicator of this process; this one writes {}",
                   requested, path_);
  file_ = std::fopen(path_.c_str(), "w");
  if (file_ == nullptr) {
    const int error = errno;
    release(path_);
    fail(SHOAL_ERR_SYSTEM, "SHOAL_TIMELINE={}: cannot open the file for writing: {}; give a writable path",
         path_, std::strerror(error));
  }
  std::fputs("[\n", file_);
  event(R"({"name": "process_name", "ph": "M", "pid": 0, "args": {"name": "shoal rank 0"}})");
}

Timeline::~Timeline() {
  std::fputs("\n]\n", file_);
  std::fclose(file_);
  release(path_);
}

void Timeline::event(const std::string& json) {
  if (!first_) std::fputs(",\n", file_);
  first_ = false;
  std::fputs(json.c_str(), file_);
}

int Timeline::rowOf(const std::string& tensor) {
  auto [it, inserted] = rows_.try_emplace(tensor, static_cast<int>(rows_.size()) + 1);
  if (inserted)
    event(fmt::format(R"({{"name": "thread_name", "ph": "M", "pid": 0, "tid": {}, "args": {{"name": "{}"}}}})",
                      it->second, jsonEscape(tensor)));
  return it->second;
}

void Timeline::span(const std::string& tensor, const char* phase, Clock::time_point begin, Clock::time_point end,
                    const std::string& args) {
  int row = rowOf(tensor);
  if (begin < origin_) begin = origin_;  // submitted before the runtime started
  if (end < begin) end = begin;
  event(fmt::format(R"({{"name": "{}", "ph": "X", "pid": 0, "tid": {}, "ts": {:.3f}, "dur": {:.3f}, "args": {{{}}}}})",
                    phase, row, micros(begin - origin_), micros(end - begin), args));
}

void Timeline::flush() { std::fflush(file_); }

}  // namespace shoal::runtime
