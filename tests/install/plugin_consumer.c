/* Runs the example compressor plugin (compressors/example_plugin, "qint8")
 * through an installed shoal, as an application would:
 *
 *   SHOAL_PLUGIN_PATH=<plugin build dir> shoalrun -np 3 plugin_consumer
 *
 * Started by tests/install/run_plugin_test.sh. Every rank checks, against the
 * exact sum computed here in double precision:
 *   - the bound the plugin declares in its table (read with
 *     shoal_compressor_lookup), in the ABI's per-element form;
 *   - the block bound its README promises, n * M_b * (1/(2L) + 2^-23) with
 *     M_b the block's max |x| over all ranks and L = floor(127 / n);
 *   - that every rank holds bit-identical results;
 *   - that shoal_last_compress_stats names qint8 and counts the payload bytes
 *     of the scheme (1 byte per element + 4 per block), fewer than the input;
 *   - zero blocks, a non-finite block (NaN out), avg in place, and refused
 *     options.
 * Prints "plugin consumer: PASS" and exits 0, or exits 1 naming what failed.
 */
#include <shoal/compressor.h>
#include <shoal/shoal.h>

#include <float.h>
#include <math.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#define COUNT 1000   /* not a multiple of the block sizes used: the last block is short */
#define MAX_RANKS 127 /* the int8 path; beyond it the plugin sends int32 */

static int failures = 0;
static int my_rank = -1;

#define CHECK(cond, ...)                                                             \
  do {                                                                               \
    if (!(cond)) {                                                                   \
      fprintf(stderr, "plugin consumer [rank %d]: %s:%d: check failed: %s: ", my_rank, \
              __FILE__, __LINE__, #cond);                                            \
      fprintf(stderr, __VA_ARGS__);                                                  \
      fprintf(stderr, "\n");                                                         \
      ++failures;                                                                    \
    }                                                                                \
  } while (0)

#define CHECK_OK(comm, call)                                                \
  do {                                                                      \
    shoal_status_t st_ = (call);                                            \
    CHECK(st_ == SHOAL_OK, "%s returned %d (%s): %s", #call, (int)st_,      \
          shoal_status_string(st_), shoal_last_error(comm));                \
  } while (0)

/* Rank r's element i: a deterministic value of magnitude up to
 * scale(block) with a sign and size that vary per rank and element.
 * Block 2 (of 256) is zero on every rank; elements i % 17 == 0 are zero on rank 0. */
static float input_value(int rank, size_t i) {
  static const float scales[] = {1.0f, 1e-3f, 0.0f, 250.0f};
  uint32_t h = (uint32_t)(i * 2654435761u) ^ (uint32_t)(rank * 40503u + 17u);
  h ^= h >> 13;
  h *= 0x5bd1e995u;
  h ^= h >> 15;
  float unit = (float)(h % 20001u) / 10000.0f - 1.0f; /* [-1, 1] in steps of 1e-4 */
  if (rank == 0 && i % 17 == 0) unit = 0.0f;
  /* A few tiny elements next to large ones: the block bound, not a relative one, holds there. */
  if (i % 29 == 3) unit *= 1e-5f;
  return unit * scales[(i / 256) % 4];
}

static double block_bound_factor(int world_size) {
  int levels = 127 / world_size;
  return 1.0 / (2.0 * levels) + ldexp(1.0, -23);
}

/* Checks out against the inputs of every rank, element by element. */
static void check_result(const char *what, const float *out, int world_size, size_t block, int average,
                         const shoal_compressor_t *table) {
  double worst_declared = 0.0, worst_block = 0.0;
  for (size_t i = 0; i < COUNT; ++i) {
    double exact = 0.0, sum_abs = 0.0, block_max = 0.0;
    size_t begin = i / block * block, end = begin + block < COUNT ? begin + block : COUNT;
    for (int r = 0; r < world_size; ++r) {
      double x = input_value(r, i);
      exact += x;
      sum_abs += fabs(x);
      for (size_t j = begin; j < end; ++j)
        if (fabs((double)input_value(r, j)) > block_max) block_max = fabs((double)input_value(r, j));
    }
    if (average) exact /= world_size;
    double error = fabs((double)out[i] - exact);
    /* The declared, ABI-form bound: |out - exact| <= bound * n * sum_r |x_r,i|. */
    double declared = table->error_bound * world_size * sum_abs;
    /* The README's block bound (the scheme's real promise). */
    double blockwise = (average ? 1.0 : (double)world_size) * block_max * block_bound_factor(world_size);
    if (!(error <= declared) || !(error <= blockwise)) {
      CHECK(error <= declared && error <= blockwise,
            "%s: element %zu: out %.9g, exact %.9g, error %.3g > declared bound %.3g or block bound %.3g", what, i,
            (double)out[i], exact, error, declared, blockwise);
      return; /* one report per call is enough */
    }
    if (sum_abs > 0 && error / declared > worst_declared) worst_declared = error / declared;
    if (block_max > 0 && error / blockwise > worst_block) worst_block = error / blockwise;
    if (block_max == 0.0) CHECK(out[i] == 0.0f, "%s: element %zu of an all-zero block is %g", what, i, (double)out[i]);
  }
  if (my_rank == 0)
    printf("plugin consumer: %s: worst error / declared bound %.3f, / block bound %.3f\n", what, worst_declared,
           worst_block);
}

/* Every rank must hold the same bits. */
static void check_identical(shoal_comm_t comm, const char *what, const float *out, int world_size) {
  float *all = malloc(sizeof(float) * COUNT * (size_t)world_size);
  if (all == NULL) {
    CHECK(all != NULL, "out of memory");
    return;
  }
  CHECK_OK(comm, shoal_allgather(comm, out, all, COUNT, SHOAL_F32));
  for (int r = 0; r < world_size; ++r)
    CHECK(memcmp(all + (size_t)r * COUNT, out, sizeof(float) * COUNT) == 0, "%s: rank %d's result differs from rank %d's",
          what, r, my_rank);
  free(all);
}

static shoal_status_t qint8_allreduce(shoal_comm_t comm, const float *in, float *out, shoal_op_t op,
                                      const char *options) {
  shoal_tensor_t input = shoal_tensor_1d((void *)in, COUNT, SHOAL_F32);
  shoal_tensor_t output = shoal_tensor_1d(out, COUNT, SHOAL_F32);
  shoal_allreduce_options_t call = SHOAL_ALLREDUCE_OPTIONS_INIT;
  call.compressor = "qint8";
  call.compressor_options = options;
  call.compress_min_bytes = 0;
  return shoal_allreduce_tensor(comm, &input, &output, op, &call);
}

int main(void) {
  /* The plugin's table, as registered from SHOAL_PLUGIN_PATH. */
  const shoal_compressor_t *table = NULL;
  shoal_status_t st = shoal_compressor_lookup("qint8", &table);
  if (st != SHOAL_OK || table == NULL) {
    fprintf(stderr, "plugin consumer: shoal_compressor_lookup(\"qint8\") returned %d (%s): %s\n", (int)st,
            shoal_status_string(st), shoal_last_error(NULL));
    return 1;
  }

  shoal_comm_t comm = NULL;
  st = shoal_comm_init(&comm);
  if (st != SHOAL_OK || comm == NULL) {
    fprintf(stderr, "plugin consumer: shoal_comm_init returned %d (%s): %s\n", (int)st, shoal_status_string(st),
            shoal_last_error(NULL));
    return 1;
  }
  int world_size = 0;
  CHECK_OK(comm, shoal_comm_rank(comm, &my_rank));
  CHECK_OK(comm, shoal_comm_size(comm, &world_size));
  if (world_size < 2 || world_size > MAX_RANKS) {
    fprintf(stderr, "plugin consumer: run with 2 to %d ranks (got %d): one rank is an exact copy\n", MAX_RANKS,
            world_size);
    return 1;
  }

  CHECK(strcmp(table->name, "qint8") == 0, "table name '%s'", table->name);
  CHECK(table->abi_version == SHOAL_COMPRESSOR_ABI_VERSION, "abi_version %u", (unsigned)table->abi_version);
  CHECK(table->error_kind == SHOAL_ERROR_RELATIVE, "error_kind %d", (int)table->error_kind);
  CHECK(table->error_bound > 0 && table->error_bound < 1, "error_bound %g", table->error_bound);
  CHECK((table->caps & SHOAL_CAP_HOST) && (table->caps & SHOAL_CAP_HOMOMORPHIC) && !(table->caps & SHOAL_CAP_LOSSLESS),
        "caps %#llx", (unsigned long long)table->caps);
  CHECK(table->dtypes == (1u << SHOAL_F32), "dtypes %#x", (unsigned)table->dtypes);

  static float in[COUNT], out[COUNT];
  for (size_t i = 0; i < COUNT; ++i) {
    in[i] = input_value(my_rank, i);
    out[i] = -12345.0f;
  }

  /* 1. Sum, out of place, default options (block=256). */
  CHECK_OK(comm, qint8_allreduce(comm, in, out, SHOAL_SUM, ""));
  check_result("sum, block=256", out, world_size, 256, 0, table);
  check_identical(comm, "sum, block=256", out, world_size);
  for (size_t i = 0; i < COUNT; ++i) CHECK(in[i] == input_value(my_rank, i), "input %zu was modified", i);

  shoal_compress_stats_t stats = SHOAL_COMPRESS_STATS_INIT;
  CHECK_OK(comm, shoal_last_compress_stats(comm, &stats));
  const uint64_t blocks = (COUNT + 255) / 256;
  CHECK(stats.compressor != NULL && strcmp(stats.compressor, "qint8") == 0, "stats name '%s'",
        stats.compressor ? stats.compressor : "(null)");
  CHECK(stats.input_bytes == sizeof(float) * COUNT, "input_bytes %llu", (unsigned long long)stats.input_bytes);
  CHECK(stats.payload_bytes == COUNT + 4 * blocks, "payload_bytes %llu, expected %llu (1 B/element + 4 B/block)",
        (unsigned long long)stats.payload_bytes, (unsigned long long)(COUNT + 4 * blocks));
  CHECK(stats.payload_bytes < stats.input_bytes, "payload %llu >= input %llu bytes",
        (unsigned long long)stats.payload_bytes, (unsigned long long)stats.input_bytes);
  CHECK(stats.rounds == 2, "rounds %d, expected 2 (scales, codes)", stats.rounds);
  if (my_rank == 0)
    printf("plugin consumer: stats: %s, input %llu B, payload %llu B, wire %llu B, %d rounds\n", stats.compressor,
           (unsigned long long)stats.input_bytes, (unsigned long long)stats.payload_bytes,
           (unsigned long long)stats.wire_bytes, stats.rounds);

  /* 2. Avg, in place, block=64. */
  memcpy(out, in, sizeof in);
  CHECK_OK(comm, qint8_allreduce(comm, out, out, SHOAL_AVG, "block=64"));
  check_result("avg in place, block=64", out, world_size, 64, 1, table);
  check_identical(comm, "avg in place, block=64", out, world_size);

  /* 3. A non-finite input poisons its block (NaN out on every rank), nothing else. */
  memcpy(out, in, sizeof in);
  float *poisoned = malloc(sizeof in);
  CHECK(poisoned != NULL, "out of memory");
  if (poisoned != NULL) {
    memcpy(poisoned, in, sizeof in);
    if (my_rank == 1) poisoned[300] = INFINITY; /* block 1 of 256 */
    CHECK_OK(comm, qint8_allreduce(comm, poisoned, out, SHOAL_SUM, ""));
    for (size_t i = 0; i < COUNT; ++i) {
      int in_block_1 = i >= 256 && i < 512;
      if (in_block_1 != (isnan(out[i]) != 0)) {
        CHECK(in_block_1 == (isnan(out[i]) != 0), "non-finite input: element %zu is %g", i, (double)out[i]);
        break;
      }
    }
    free(poisoned);
  }

  /* 4. Options are refused with text, before any communication, on every rank. */
  st = qint8_allreduce(comm, in, out, SHOAL_SUM, "block=0");
  CHECK(st == SHOAL_ERR_INVALID_ARGUMENT, "block=0: status %d", (int)st);
  CHECK(strstr(shoal_last_error(comm), "block='0'") != NULL, "block=0: text '%s'", shoal_last_error(comm));
  st = qint8_allreduce(comm, in, out, SHOAL_SUM, "bits=4");
  CHECK(st == SHOAL_ERR_INVALID_ARGUMENT, "bits=4: status %d", (int)st);
  CHECK(strstr(shoal_last_error(comm), "unknown option 'bits'") != NULL, "bits=4: text '%s'",
        shoal_last_error(comm));

  /* 5. The communicator is still good after refused options. */
  CHECK_OK(comm, qint8_allreduce(comm, in, out, SHOAL_SUM, "block=256"));
  check_result("sum after refusals", out, world_size, 256, 0, table);

  CHECK_OK(comm, shoal_comm_destroy(comm));
  if (failures) {
    fprintf(stderr, "plugin consumer [rank %d]: %d check(s) failed\n", my_rank, failures);
    return 1;
  }
  printf("plugin consumer: PASS\n");
  return 0;
}
