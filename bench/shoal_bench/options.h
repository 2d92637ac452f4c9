// shoal-bench's command line: nccl-tests' flags with nccl-tests' meanings (-b -e -f -i -n -w -c
// -d -o -r -a -J), plus shoal's own as long options (--algo, --compressor, --shape, ...).
#pragma once

#include <shoal/compressor.h>
#include <shoal/shoal.h>

#include <cstdint>
#include <string>
#include <vector>

#include "colls.h"

namespace bench {

// nccl-tests' -a: which rank's time the table reports (each rank times its own mean per
// iteration; busbw follows the time reported).
enum class Average { Rank0 = 0, Mean = 1, Min = 2, Max = 3 };
const char *averageName(Average a);  // "the slowest rank's mean time per iteration", ...

struct Tensor {
  std::string name;
  std::vector<int64_t> shape;
  size_t elements() const;
};

// One row of the table under --shape: a matrix, or a named set (resnet50: 161 tensors) whose
// tensors are all allreduced once per iteration.
struct ShapeRow {
  std::string label;  // "1024x4096" or "resnet50"
  std::vector<Tensor> tensors;
};

struct Options {
  const CollTest *coll = &kAllreduce;
  size_t minBytes = size_t{32} << 20, maxBytes = size_t{32} << 20, stepFactor = 2, stepBytes = 0;
  int iters = 20, warmup = 5, root = 0;
  int check = 1;  // -c: verified iterations per size and mode, from fresh inputs (0: none)
  Average average = Average::Mean;
  shoal_dtype_t dtype = SHOAL_F32;  // -d
  shoal_op_t op = SHOAL_SUM;        // -o
  const char *algorithm = nullptr;  // --algo; NULL: SHOAL_ALGO or the library's default
  const char *jsonPath = nullptr;   // -J
  shoal_memory_t memory = SHOAL_MEMORY_HOST;
  std::vector<ShapeRow> shapes;     // --shape; empty: the -b/-e sweep of 1-D buffers
  // Allreduce only:
  const char *compressor = nullptr;           // --compressor; NULL: SHOAL_COMPRESSOR, else none
  const shoal_compressor_t *table = nullptr;  // the compressor's, when one is active
  const char *copts = nullptr;                // NULL: SHOAL_COMPRESSOR_OPTS
  long long compressMinBytes = 0;             // --min-bytes
  double density = 1, overlap = 0;
  std::vector<std::string> args;  // argv, for the JSON report
};

// Exits with status 0 after -h, --version or --list-compressors, and with 2 (after text
// printed by the process the launcher calls rank 0) on a usage error.
Options parseArgs(int argc, char **argv);

// A usage error, printed once: by `rank` 0, or before the communicator exists (rank < 0) by
// the process the launcher's variables call rank 0. Exits with status 2.
[[noreturn]] __attribute__((format(printf, 2, 3))) void usageError(int rank, const char *fmt, ...);

}  // namespace bench
