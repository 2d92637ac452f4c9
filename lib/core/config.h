// The one table of every SHOAL_* environment variable. Code reads variables
// only through these functions, so `shoalrun --print-config` and the README
// table list everything shoal understands.
#pragma once

#include <cstdio>
#include <optional>
#include <string>
#include <vector>

namespace shoal::config {

struct Variable {
  const char* name;           // "SHOAL_TIMEOUT_S"
  const char* defaultValue;   // as text; "" = unset
  const char* help;           // one line
};

const std::vector<Variable>& table();

// The value from the environment, else the table's default. Throws
// Error(SHOAL_ERR_INTERNAL) for a name missing from the table (a shoal bug).
std::string getString(const char* name);
// Unset and empty both give nullopt (no default applied).
std::optional<std::string> getRaw(const char* name);
// Parsed values; a malformed value is Error(SHOAL_ERR_INVALID_ARGUMENT) naming the variable.
long long getInt(const char* name);
double getDouble(const char* name);
bool getBool(const char* name);

void print(std::FILE* out, bool markdown);

}  // namespace shoal::config
