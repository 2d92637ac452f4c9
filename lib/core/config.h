// The one table of every SHOAL_* environment variable. Code reads variables
// only through these functions, so `shoalrun --print-config` and the README
// table list everything shoal understands.
//
// Each variable has a kind and, for numbers, a range: a value that is
// malformed or out of range is an error naming the variable, the value and
// what it may be, both when a getter reads it and when shoal_comm_init checks
// the whole environment (checkEnvironment).
#pragma once

#include <cstdio>
#include <optional>
#include <string>
#include <vector>

namespace shoal::config {

enum class Kind {
  Text,     // any text; its reader checks it (a URL, a compressor name, a path)
  Integer,  // a whole number in [min, max]
  Number,   // a finite decimal number in [min, max]
  Choice,   // one of the comma-separated words in `choices`
};

struct Variable {
  const char* name;           // "SHOAL_TIMEOUT_S"
  const char* defaultValue;   // as text; "" = unset
  const char* help;           // one line
  Kind kind = Kind::Text;
  double min = 0;             // Integer and Number: the allowed range, both ends included
  double max = 0;
  // Choice: the allowed words. Integer and Number: an optional word also
  // allowed in place of a number ("auto"), which the reader handles.
  const char* choices = nullptr;
};

const std::vector<Variable>& table();

// The value from the environment, else the table's default. Throws
// Error(SHOAL_ERR_INTERNAL) for a name missing from the table (a shoal bug).
std::string getString(const char* name);
// Unset and empty both give nullopt (no default applied).
std::optional<std::string> getRaw(const char* name);
// Parsed values, checked against the table: a malformed or out-of-range value
// is Error(SHOAL_ERR_INVALID_ARGUMENT) naming the variable, the value and the range.
long long getInt(const char* name);
double getDouble(const char* name);
bool getBool(const char* name);

// Checks every variable of the table that is set in the environment; throws
// for the first bad one. shoal_comm_init calls it, so a typo fails at once.
void checkEnvironment();

// Strict parsing for variables outside the table (launchers' OMPI_*, SLURM_*,
// RANK, PMI_*): a whole number in [min, max], else INVALID_ARGUMENT naming
// the variable, the value and the range.
long long parseInteger(const char* name, const std::string& text, long long min, long long max);

// "an integer from 0 to 65535", "auto or an integer from 0 to ...", "one of error, warn".
std::string describeRange(const Variable& variable);

void print(std::FILE* out, bool markdown);

}  // namespace shoal::config
