/* shoal — the compressor plugin ABI.
 *
 * The only header a compressor plugin needs (it includes shoal/shoal.h for the
 * dtype, op, status and tensor types). A compressor is a versioned table of
 * function pointers, shoal_compressor_t. Built-in compressors and external
 * plugins use the same table: an external plugin is a shared library named
 * libshoal-compressor-<name>.so, found on SHOAL_PLUGIN_PATH, that exports
 *
 *     SHOAL_COMPRESSOR_EXPORT const shoal_compressor_t *shoal_compressor_plugin_v1(void);
 *
 * How a compressed allreduce runs: a short conversation of ROUNDS.
 *   1. The driver calls start() with the operation: the input tensors (a fused
 *      group may hold several), where the outputs go, the world size and rank.
 *   2. It calls round() with round->index = 0. The compressor encodes and asks
 *      for one round of collectives by filling round->payloads (for example an
 *      index bitmap to OR and sketch cells to sum), or writes the outputs and
 *      sets round->done.
 *   3. The driver runs every requested payload's collective (allreduce in
 *      place in the payload's buffer; allgatherv into driver-owned memory
 *      described in the payload) and calls round() again with index + 1 and
 *      the same payloads, now holding the results. Repeat until done.
 *   4. finish() releases what start() allocated.
 * Homomorphic payloads (sums of encodings are encodings of the sum) are plain
 * allreduces: they travel through ring/tree with no decoding per hop.
 *
 * Ranks must make the same requests in the same order: the driver checks that
 * every rank uses the same compressor, options and tensor shapes (a hash
 * allreduced in round 0) and fails on every rank otherwise.
 *
 * Threading: a compressor instance is used by one thread at a time.
 * Memory: a compressor without the SHOAL_CAP_CUDA capability is never given
 * CUDA tensors (the call fails on every rank instead: shoal never stages CUDA
 * tensors through host memory). With SHOAL_CAP_CUDA, the payloads of an op on
 * CUDA tensors live in device memory on the input's device, work is ordered
 * on input.stream, and the driver runs each payload's collective over NCCL on
 * that stream (allgatherv results land in driver-owned device memory; the
 * gathered counts and displacements stay host arrays). When round() is called
 * again, the previous round's collectives have completed.
 */
#ifndef SHOAL_COMPRESSOR_H
#define SHOAL_COMPRESSOR_H

#include <stddef.h>
#include <stdint.h>

#include "shoal/shoal.h"

#ifdef __cplusplus
extern "C" {
#endif

/* Bumped only for incompatible changes; fields are appended, never reordered.
 * The registry refuses a plugin built against a newer version than its own. */
#define SHOAL_COMPRESSOR_ABI_VERSION 1

#if defined(__GNUC__)
#define SHOAL_COMPRESSOR_EXPORT __attribute__((visibility("default")))
#else
#define SHOAL_COMPRESSOR_EXPORT
#endif

/* Capabilities (shoal_compressor_t.caps, a bit set). */
#define SHOAL_CAP_HOST ((uint64_t)1 << 0)        /* runs on host tensors */
#define SHOAL_CAP_CUDA ((uint64_t)1 << 1)        /* runs on CUDA tensors */
#define SHOAL_CAP_LOSSLESS ((uint64_t)1 << 2)    /* output == the exact reduction, bit for bit */
#define SHOAL_CAP_STATEFUL ((uint64_t)1 << 3)    /* may keep per-tensor state; when its options need state,
                                                    start() refuses unnamed tensors (name == NULL) */
#define SHOAL_CAP_HOMOMORPHIC ((uint64_t)1 << 4) /* its payloads are reduced without decoding */
/* Reads shapes: it views a tensor of ndim >= 2 as a matrix [shape[0], product
 * of the rest] (powersgd), and a 1-D tensor travels densely. Where the driver
 * cuts a tensor into shards (the hierarchical compressed allreduce compresses
 * each rank's shard of its host's sum across hosts, docs/groups.md), it cuts
 * such a tensor by whole rows: the compressor sees [rows_i, shape[1], ...], a
 * matrix with the tensor's columns. Without the bit, shards are 1-D (ndim 1,
 * the element count), whatever the tensor's shape. The bit came after ABI 1
 * was published without a version bump: a plugin built before it has the bit
 * clear and keeps getting 1-D shards, as it always did. */
#define SHOAL_CAP_MATRIX ((uint64_t)1 << 5)

/* What the compressor promises about its output, checked by the conformance
 * suite (tests/compressors/). x_r is rank r's input, n the world size, and
 * exact the exact sum (divided by n for SHOAL_AVG). */
typedef enum shoal_error_kind {
  SHOAL_ERROR_EXACT = 0,          /* out == exact, bit for bit (lossless) */
  SHOAL_ERROR_RELATIVE = 1,       /* |out_i - exact_i| <= error_bound * n * sum_r |x_r,i| per element */
  SHOAL_ERROR_FEEDBACK = 2        /* lossy with error feedback: out + e_new == g + e_old (see state) */
} shoal_error_kind_t;

/* ---- what the driver hands the compressor ---------------------------------- */

/* A message to the log of the application (level: 0 error, 1 warn, 2 info, 3 debug). */
typedef void (*shoal_log_fn)(int level, const char *message);

/* Options arrive parsed from "k=v,k=v" (SHOAL_COMPRESSOR_OPTS or a per-call
 * option). Keys and values are valid during create() only: copy what you keep.
 * Refuse an unknown key or a bad value by returning SHOAL_ERR_INVALID_ARGUMENT
 * with text in error_text. */
typedef struct shoal_compressor_params {
  size_t struct_size;
  int num_options;
  const char *const *keys;
  const char *const *values;
  shoal_log_fn log;
  char *error_text;          /* out: why create() failed; error_text_size bytes */
  size_t error_text_size;
} shoal_compressor_params_t;

/* One tensor of a compressed operation. */
typedef struct shoal_compress_tensor {
  shoal_tensor_t input;      /* this rank's data; read only */
  shoal_tensor_t output;     /* where the reduced result goes; may equal input (in place) */
  const char *name;          /* the tensor's name, or NULL for an unnamed tensor */
  /* Per-tensor state the driver keeps between operations, keyed by name
   * (NULL for unnamed tensors). *state is NULL the first time; the compressor
   * may store a pointer there; the driver calls destroy_tensor_state() on it
   * when the communicator is destroyed. */
  void **state;
} shoal_compress_tensor_t;

typedef struct shoal_compress_op {
  size_t struct_size;
  int rank;
  int world_size;
  shoal_op_t op;              /* SHOAL_SUM or SHOAL_AVG */
  int num_tensors;
  shoal_compress_tensor_t *tensors;
  uint64_t step;              /* how many operations this communicator has compressed before */
  char *error_text;           /* out: why a call failed; error_text_size bytes */
  size_t error_text_size;
} shoal_compress_op_t;

/* ---- what the compressor asks of the driver -------------------------------- */

typedef enum shoal_collective {
  SHOAL_COLLECTIVE_ALLREDUCE = 0, /* buffer[0..count) reduced in place with op, on every rank */
  SHOAL_COLLECTIVE_ALLGATHERV = 1 /* every rank's buffer[0..count) gathered, counts may differ */
} shoal_collective_t;

typedef struct shoal_payload {
  shoal_collective_t collective;
  shoal_dtype_t dtype;
  shoal_op_t op;              /* allreduce only: any op valid for dtype (e.g. SHOAL_BOR on u64) */
  void *buffer;               /* compressor-owned, stays valid until the next round() call */
  size_t count;               /* elements of dtype */
  /* Filled by the driver for an allgatherv, valid during the next round() call:
   * rank r's elements are gathered[displs[r] .. displs[r] + counts[r]).
   * gathered is aligned for dtype (at least 16 bytes). */
  const void *gathered;
  const size_t *gathered_counts;
  const size_t *gathered_displs;
} shoal_payload_t;

#define SHOAL_MAX_ROUND_PAYLOADS 4

typedef struct shoal_round {
  size_t struct_size;
  int index;                  /* in: 0, 1, 2, ... */
  /* in (index > 0): the previous round's payloads, now reduced or gathered.
   * out: the payloads of the next round, run together; 0 with done = 1. */
  int num_payloads;
  shoal_payload_t payloads[SHOAL_MAX_ROUND_PAYLOADS];
  int done;                   /* out: 1 once every output is written */
} shoal_round_t;

/* ---- the table --------------------------------------------------------------- */

typedef struct shoal_compressor {
  uint32_t abi_version;       /* SHOAL_COMPRESSOR_ABI_VERSION the plugin was built with */
  uint32_t struct_size;       /* sizeof(shoal_compressor_t) the plugin was built with */
  const char *name;           /* unique, [a-z0-9_]+, e.g. "fp16"; selects it in SHOAL_COMPRESSOR */
  const char *description;    /* one line */
  const char *options_help;   /* "k=<int> ...: meaning; ..." for --list-compressors; may be "" */
  uint64_t caps;              /* SHOAL_CAP_* */
  shoal_error_kind_t error_kind;
  double error_bound;         /* for SHOAL_ERROR_RELATIVE */
  /* Which dtypes it compresses (bit (1 << dtype)); others go uncompressed. */
  uint32_t dtypes;

  /* An instance for one option set; *instance is opaque to shoal. */
  shoal_status_t (*create)(const shoal_compressor_params_t *params, void **instance);
  void (*destroy)(void *instance);
  /* Begin one operation; *op_state (may stay NULL) is passed to round() and finish(). */
  shoal_status_t (*start)(void *instance, shoal_compress_op_t *op, void **op_state);
  shoal_status_t (*round)(void *instance, void *op_state, shoal_compress_op_t *op, shoal_round_t *round);
  /* Always called after start() succeeded, also when a round failed. */
  void (*finish)(void *instance, void *op_state);
  /* Frees what the compressor stored in a tensor's *state; NULL if it stores nothing. */
  void (*destroy_tensor_state)(void *instance, void *state);
  /* Optional (NULL if stateless): serialise a tensor's state for checkpoints
   * and tests. With buffer == NULL, writes the size needed to *bytes. The
   * layout is the compressor's own, documented in its header; for an error-
   * feedback compressor it starts with the error vector, in the tensor's dtype. */
  shoal_status_t (*save_tensor_state)(void *instance, const void *state, void *buffer, size_t *bytes);
  /* Optional: the inverse; *state may be NULL (creates it) or an existing state. */
  shoal_status_t (*load_tensor_state)(void *instance, void **state, const void *buffer, size_t bytes);
} shoal_compressor_t;

/* The table of a registered compressor (built-in or a plugin on
 * SHOAL_PLUGIN_PATH), e.g. to read its declared error bound. Implemented by
 * libshoal, not by plugins. SHOAL_ERR_NOT_FOUND lists the available names. */
shoal_status_t shoal_compressor_lookup(const char *name, const shoal_compressor_t **table);

/* The entry symbol of an external plugin (one per shared library). */
typedef const shoal_compressor_t *(*shoal_compressor_plugin_fn)(void);
SHOAL_COMPRESSOR_EXPORT const shoal_compressor_t *shoal_compressor_plugin_v1(void);
#define SHOAL_COMPRESSOR_PLUGIN_SYMBOL "shoal_compressor_plugin_v1"

#ifdef __cplusplus
}
#endif
#endif /* SHOAL_COMPRESSOR_H */
