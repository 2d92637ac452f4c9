#include "runtime/timeline.h"

#include <cerrno>
#include <cstring>

#include <fmt/format.h>

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

}  // namespace

Timeline::Timeline(const std::string& path) : origin_(Clock::now()) {
  file_ = std::fopen(path.c_str(), "w");
  if (file_ == nullptr)
    fail(SHOAL_ERR_SYSTEM, "SHOAL_TIMELINE={}: cannot open the file for writing: {}; give a writable path",
         path, std::strerror(errno));
  std::fputs("[\n", file_);
  event(R"({"name": "process_name", "ph": "M", "pid": 0, "args": {"name": "shoal rank 0"}})");
}

Timeline::~Timeline() {
  std::fputs("\n]\n", file_);
  std::fclose(file_);
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
