#include "core/log.h"

#include <unistd.h>

#include <cstdio>

#include "core/config.h"

namespace shoal::log {

Level threshold() {
  static const Level level = [] {
    std::string name = config::getString("SHOAL_LOG_LEVEL");
    if (name == "error") return Level::Error;
    if (name == "info") return Level::Info;
    if (name == "debug") return Level::Debug;
    return Level::Warn;
  }();
  return level;
}

void write(Level level, const std::string& text) {
  static const char* names[] = {"ERROR", "WARN", "INFO", "DEBUG"};
  std::fprintf(stderr, "shoal %s [pid %d] %s\n", names[static_cast<int>(level)], static_cast<int>(getpid()),
               text.c_str());
}

}  // namespace shoal::log
