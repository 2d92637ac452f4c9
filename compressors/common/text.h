// printf-style text for the compressor ABI's error_text buffers and log
// callback, shared by the built-in compressors.
#pragma once

#include <cstdarg>
#include <cstdio>

#include "shoal/compressor.h"

namespace shoal::compressors {

// Writes into a caller's error_text buffer (NULL or size 0: nothing).
__attribute__((format(printf, 3, 4))) inline void writeText(char* text, size_t size, const char* format, ...) {
  if (text == nullptr || size == 0) return;
  va_list args;
  va_start(args, format);
  std::vsnprintf(text, size, format, args);
  va_end(args);
}

// Sends one line to the application's log (level: 0 error, 1 warn, 2 info, 3 debug); NULL log: dropped.
__attribute__((format(printf, 3, 4))) inline void logText(shoal_log_fn log, int level, const char* format, ...) {
  if (log == nullptr) return;
  char text[256];
  va_list args;
  va_start(args, format);
  std::vsnprintf(text, sizeof text, format, args);
  va_end(args);
  log(level, text);
}

}  // namespace shoal::compressors
