// shoal-aggd: the software in-network aggregator (docs/aggregation.md).
//
//   SHOAL_TOKEN=<job token> shoal-aggd --listen 0.0.0.0:29600
//
// Ranks started with SHOAL_ALGO=aggregate SHOAL_AGGREGATOR=tcp://host:29600
// send their allreduce payloads here in fixed-size slots; the aggregator adds
// each slot as the ranks' copies arrive and streams the sum back to all of them.
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <string>

#include "aggregator.h"

namespace {

const char* kUsage =
    "usage: shoal-aggd --listen HOST:PORT [--slot-bytes N] [--pool-slots N] [--timeout-s S]\n"
    "\n"
    "Adds the allreduce payloads of shoal ranks (SHOAL_ALGO=aggregate, SHOAL_AGGREGATOR=tcp://HOST:PORT)\n"
    "slot by slot, without decoding them, and streams every completed slot back to every rank.\n"
    "  --listen HOST:PORT  where to listen (port 0: any free port; the chosen one is printed)\n"
    "  --slot-bytes N      bytes per slot (default 262144); ranks learn it when they connect\n"
    "  --pool-slots N      slots held at once over every job (default 256): memory is N x slot-bytes\n"
    "  --timeout-s S       a slot some rank never sends fails its communicator after S seconds\n"
    "                      (default SHOAL_TIMEOUT_S, else 300)\n"
    "Every connection must present SHOAL_TOKEN (export the same token to the job and to shoal-aggd).\n";

long long number(const char* flag, const char* text) {
  char* end = nullptr;
  long long value = std::strtoll(text, &end, 10);
  if (*text == '\0' || *end != '\0' || value < 0) {
    std::fprintf(stderr, "shoal-aggd: %s wants a whole number, not '%s'\n", flag, text);
    std::exit(2);
  }
  return value;
}

}  // namespace

int main(int argc, char** argv) {
  using namespace shoal::aggregate;
  AggregatorOptions options;
  const char* timeout = std::getenv("SHOAL_TIMEOUT_S");
  if (timeout && *timeout) options.timeoutS = std::atof(timeout);
  const char* token = std::getenv("SHOAL_TOKEN");
  options.token = token ? token : "";
  bool listenGiven = false;
  for (int i = 1; i < argc; ++i) {
    std::string arg = argv[i];
    if (arg == "-h" || arg == "--help") {
      std::fputs(kUsage, stdout);
      return 0;
    }
    if (i + 1 >= argc) {
      std::fprintf(stderr, "shoal-aggd: %s needs a value\n%s", arg.c_str(), kUsage);
      return 2;
    }
    const char* value = argv[++i];
    try {
      if (arg == "--listen") {
        options.listen = parseHostPort(value, "--listen");
        listenGiven = true;
      } else if (arg == "--slot-bytes") {
        options.slotBytes = static_cast<uint32_t>(std::min<long long>(number("--slot-bytes", value), 1ll << 31));
      } else if (arg == "--pool-slots") {
        options.poolSlots = static_cast<size_t>(number("--pool-slots", value));
      } else if (arg == "--timeout-s") {
        options.timeoutS = std::atof(value);
      } else {
        std::fprintf(stderr, "shoal-aggd: unknown option %s\n%s", arg.c_str(), kUsage);
        return 2;
      }
    } catch (const shoal::Error& error) {
      std::fprintf(stderr, "shoal-aggd: %s\n", error.what());
      return 2;
    }
  }
  if (!listenGiven) {
    std::fprintf(stderr, "shoal-aggd: --listen HOST:PORT is required\n%s", kUsage);
    return 2;
  }
  try {
    Aggregator aggregator(options);
    std::printf("shoal-aggd: listening on %s:%d (slot %u bytes, pool %zu slots, timeout %g s)\n",
                options.listen.host.c_str(), aggregator.port(), options.slotBytes, options.poolSlots,
                options.timeoutS);
    std::fflush(stdout);
    aggregator.serve();
  } catch (const shoal::Error& error) {
    std::fprintf(stderr, "shoal-aggd: %s\n", error.what());
    return 1;
  }
}
