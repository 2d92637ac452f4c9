// makeStore: URL parsing and the helpers every backend shares (counter
// encoding, timeout text).
#include "bootstrap/store.h"

#include <algorithm>
#include <cctype>
#include <charconv>
#include <string_view>

namespace shoal {
namespace {

constexpr const char* kValidForms = "tcp://host:port (rank 0 serves), file:///absolute/shared/dir, memory://name";

[[noreturn]] void badUrl(const std::string& url, const std::string& why) {
  fail(SHOAL_ERR_INVALID_ARGUMENT, "bad store URL '{}' (SHOAL_STORE): {}; valid forms are {}", url, why, kValidForms);
}

std::string lower(std::string text) {
  std::transform(text.begin(), text.end(), text.begin(), [](unsigned char c) { return std::tolower(c); });
  return text;
}

std::unique_ptr<Store> makeTcp(const StoreOptions& options, std::string rest) {
  const std::string& url = options.url;
  if (!rest.empty() && rest.back() == '/') rest.pop_back();
  std::string host;
  std::string port;
  if (!rest.empty() && rest[0] == '[') {  // [v6-address]:port
    size_t close = rest.find(']');
    if (close == std::string::npos || close + 1 >= rest.size() || rest[close + 1] != ':')
      badUrl(url, "an IPv6 host needs the form [address]:port");
    host = rest.substr(1, close - 1);
    port = rest.substr(close + 2);
  } else {
    size_t colon = rest.rfind(':');
    if (colon == std::string::npos) badUrl(url, "a tcp store needs a port, e.g. tcp://node01:29500");
    host = rest.substr(0, colon);
    port = rest.substr(colon + 1);
    if (host.find(':') != std::string::npos) badUrl(url, "write an IPv6 host in brackets, e.g. tcp://[::1]:29500");
  }
  if (host.empty()) badUrl(url, "the host is empty");
  for (unsigned char c : host)
    if (std::isspace(c) || c == '/' || c == '@' || c == '?' || c == '#')
      badUrl(url, "the host has a character not allowed there");
  int value = 0;
  auto [end, ec] = std::from_chars(port.data(), port.data() + port.size(), value);
  if (port.empty() || port.size() > 5 || ec != std::errc() || end != port.data() + port.size() || value < 1 ||
      value > 65535)
    badUrl(url, fmt::format("the port '{}' is not a number from 1 to 65535", port));
  return detail::makeTcpStore(host, value, options);
}

}  // namespace

std::unique_ptr<Store> makeStore(const StoreOptions& options) {
  const std::string& url = options.url;
  if (url.empty()) fail(SHOAL_ERR_INVALID_ARGUMENT, "no store URL given: set SHOAL_STORE to one of {}", kValidForms);
  if (options.worldSize < 1 || options.rank < 0 || options.rank >= options.worldSize)
    fail(SHOAL_ERR_INVALID_ARGUMENT, "store {}: rank {} is not in 0..{} (world size {})", url, options.rank,
         options.worldSize - 1, options.worldSize);
  if (!(options.timeoutS > 0))
    fail(SHOAL_ERR_INVALID_ARGUMENT, "store {}: the timeout must be a positive number of seconds, not {}", url,
         options.timeoutS);
  size_t sep = url.find("://");
  if (sep == std::string::npos || sep == 0) badUrl(url, "it has no scheme");
  std::string scheme = lower(url.substr(0, sep));
  std::string rest = url.substr(sep + 3);
  if (scheme == "memory") {
    if (rest.empty()) badUrl(url, "a memory store needs a name, e.g. memory://job1");
    return detail::makeMemoryStore(rest, url);
  }
  if (scheme == "file") {
    if (rest.empty() || rest[0] != '/')
      badUrl(url, "a file store needs an absolute directory, e.g. file:///shared/dir (three slashes)");
    while (rest.size() > 1 && rest.back() == '/') rest.pop_back();
    return detail::makeFileStore(rest, url);
  }
  if (scheme == "tcp") return makeTcp(options, rest);
  fail(SHOAL_ERR_NOT_FOUND,
       "unknown store scheme '{}' in '{}' (SHOAL_STORE): the schemes are tcp, file and memory ({})", scheme, url,
       kValidForms);
}

namespace detail {

int64_t addCounter(const std::string& key, const Bytes* current, int64_t delta) {
  int64_t value = 0;
  if (current != nullptr) {
    const char* begin = reinterpret_cast<const char*>(current->data());
    const char* end = begin + current->size();
    auto [stop, ec] = std::from_chars(begin, end, value);
    if (current->empty() || ec != std::errc() || stop != end)
      fail(SHOAL_ERR_INVALID_ARGUMENT,
           "store key '{}' holds a value that is not an integer, so add() cannot update it; use add() only on keys "
           "that nothing else sets",
           key);
  }
  int64_t sum = 0;
  if (__builtin_add_overflow(value, delta, &sum))
    fail(SHOAL_ERR_INVALID_ARGUMENT, "store add() on key '{}' overflows: {} + {}", key, value, delta);
  return sum;
}

Bytes counterBytes(int64_t value) {
  std::string text = std::to_string(value);
  return Bytes(text.begin(), text.end());
}

void failTimeout(const std::vector<std::string>& missing, const std::string& url, Clock::time_point start) {
  double waited = std::chrono::duration<double>(Clock::now() - start).count();
  std::string keys;
  constexpr size_t kNamed = 8;  // a 1000-rank job must not print 1000 keys
  for (size_t i = 0; i < missing.size() && i < kNamed; ++i) keys += fmt::format("{}'{}'", i ? ", " : "", missing[i]);
  if (missing.size() > kNamed) keys += fmt::format(" and {} more", missing.size() - kNamed);
  // Keys conventionally end in "/<rank>"; naming the rank tells the user whom to look at.
  std::vector<std::string> ranks;
  for (const std::string& key : missing) {
    size_t slash = key.rfind('/');
    std::string_view tail = slash == std::string::npos ? std::string_view() : std::string_view(key).substr(slash + 1);
    if (tail.empty() || !std::all_of(tail.begin(), tail.end(), [](unsigned char c) { return std::isdigit(c); })) {
      ranks.clear();
      break;
    }
    if (std::find(ranks.begin(), ranks.end(), tail) == ranks.end()) ranks.emplace_back(tail);
  }
  std::string who = "are all ranks";
  if (ranks.size() == 1) who = "is rank " + ranks[0];
  if (ranks.size() > 1 && ranks.size() <= kNamed) {
    who = "are ranks " + ranks[0];
    for (size_t i = 1; i < ranks.size(); ++i) who += ", " + ranks[i];
  }
  fail(SHOAL_ERR_TIMEOUT, "timed out after {:.{}f} s waiting for store key(s) {} at {}: {} running and using the same "
       "SHOAL_STORE?", waited, waited < 10 ? 1 : 0, keys, url, who);
}

}  // namespace detail
}  // namespace shoal
