// Minimal leveled logging to stderr, level from SHOAL_LOG_LEVEL.
#pragma once

#include <fmt/format.h>

namespace shoal::log {

enum class Level { Error = 0, Warn = 1, Info = 2, Debug = 3 };

Level threshold();
void write(Level level, const std::string& text);

template <typename... Args>
void at(Level level, fmt::format_string<Args...> format, Args&&... args) {
  if (level <= threshold()) write(level, fmt::format(format, std::forward<Args>(args)...));
}

}  // namespace shoal::log

#define SHOAL_LOG_ERROR(...) ::shoal::log::at(::shoal::log::Level::Error, __VA_ARGS__)
#define SHOAL_LOG_WARN(...) ::shoal::log::at(::shoal::log::Level::Warn, __VA_ARGS__)
#define SHOAL_LOG_INFO(...) ::shoal::log::at(::shoal::log::Level::Info, __VA_ARGS__)
#define SHOAL_LOG_DEBUG(...) ::shoal::log::at(::shoal::log::Level::Debug, __VA_ARGS__)
