// shoal-bench's output: nccl-tests' table (size count type redop root, then time algbw busbw
// #wrong for out-of-place and in-place; with a compressor also ratio, sent and paybw) and its -J
// JSON document (version 3: config, results[].out_of_place/in_place, out_of_bounds,
// average_bus_bandwidth), with shoal's keys added.
#pragma once

#include <cstdint>
#include <cstdio>
#include <string>
#include <vector>

#include "options.h"

namespace bench {

struct Result {  // one mode (out-of-place or in-place) of one row, combined over ranks
  double time = 0;  // us, the one -a chose
  double timeRank0 = 0, timeAvg = 0, timeMin = 0, timeMax = 0;
  double algBw = 0, busBw = 0;  // GB/s from the uncompressed size (effective with a compressor)
  int64_t wrong = -1;           // -1 = not checked
  // With a compressor: uncompressed / payload bytes, payload and wire bytes per rank and
  // iteration (wire -1: unknown, some call went uncompressed), the payload's bus bandwidth.
  double ratio = 0, payloadBytes = 0, wireBytes = -1, payBusBw = 0;
};

struct Row {
  std::string shape;  // --shape's label, "" for the size sweep
  size_t tensors = 1;
  size_t size = 0, count = 0;
  Result res[2];  // out-of-place, in-place
};

struct RankPlace {
  int pid;
  std::string host;
};

// What the report says about the run as a whole.
struct RunInfo {
  const Options *options;
  int nranks;
  std::string algorithm;
  const char *opName;
  std::vector<RankPlace> ranks;
  std::string startTime;
  bool compressorColumns() const { return options->table != nullptr; }
};

std::string nowText();  // "2026-12-01 10:00:00", as nccl-tests' start_time

void printHeader(const RunInfo &run);
void printShapeNote(const Row &row);
void printRow(const RunInfo &run, const Row &row);
void printFooter(const RunInfo &run, int64_t wrong, double avgBusBw, double avgPayBusBw);
// Returns false (errno set) when the file could not be written completely.
bool writeJson(FILE *f, const RunInfo &run, const std::vector<Row> &rows, int64_t wrong, double avgBusBw,
               double avgPayBusBw);

}  // namespace bench
