/* qint8 — an example out-of-tree shoal compressor plugin, in plain C11.
 *
 * Block-scaled integer quantization whose integer codes are summed
 * homomorphically by an ordinary allreduce (no decoding per hop). See
 * README.md in this folder for how to build and load it and for the
 * derivation of its error bound; the short version:
 *
 *   round 0  each rank: per block of `block` elements, m = max |x|
 *            -> allreduce(f32, MAX) of the block maxima: every rank now holds
 *               the same M_b = max over ranks and over the block of |x|.
 *   round 1  each rank: q = round_half_away_from_zero(x / M_b * L), |q| <= L,
 *            with L = floor(127 / n) levels per rank (n = world size), so the
 *            sum of n codes fits an int8 at every hop of any reduction order
 *            -> allreduce(i8, SUM) of the codes.
 *   round 2  out = S * M_b / L (divided by n for SHOAL_AVG); done.
 *
 * Wire: n <= 127: 1 byte per element + 4 bytes per block (3.94x smaller than
 * f32 at block=256). n >= 128: int8 levels would be 0, so the codes travel as
 * int32 with L = floor((2^31 - 1) / n) (no compression; logged once).
 * n == 1: the output is a copy of the input (exact, no rounds).
 *
 * Every rank decodes the same integers with the same scales, so all ranks get
 * bit-identical results, run after run.
 *
 * The only thing this file takes from shoal is its headers: it calls no
 * libshoal function, so the .so has no libshoal dependency at all.
 */
#include <shoal/compressor.h>

#include <math.h> /* INFINITY, NAN, isnan, isfinite: macros, no libm needed */
#include <stdarg.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#define QINT8_NAME "qint8"
#define QINT8_DEFAULT_BLOCK 256
#define QINT8_MAX_BLOCK (1L << 30)
/* n <= this: int8 codes; beyond it int8 would leave 0 levels per rank. */
#define QINT8_MAX_I8_RANKS 127

typedef struct qint8_instance {
  size_t block;
  shoal_log_fn log;
  int warned_wide; /* logged the "no compression beyond 127 ranks" note */
} qint8_instance_t;

typedef struct qint8_op_state {
  size_t total_count;  /* elements over every tensor */
  size_t total_blocks; /* blocks over every tensor (blocks never span tensors) */
  float *scales;       /* [total_blocks]: local max |x|, then the global M_b */
  void *codes;         /* [total_count] int8_t or int32_t */
  shoal_dtype_t code_dtype;
  int64_t levels;      /* L */
} qint8_op_state_t;

#if defined(__GNUC__)
__attribute__((format(printf, 3, 4)))
#endif
static void set_error(char *text, size_t size, const char *format, ...) {
  if (text == NULL || size == 0) return;
  va_list args;
  va_start(args, format);
  vsnprintf(text, size, format, args);
  va_end(args);
}

static size_t element_count(const shoal_tensor_t *tensor) {
  size_t count = 1;
  for (int d = 0; d < tensor->ndim; ++d) count *= (size_t)tensor->shape[d];
  return count;
}

static size_t block_count(size_t count, size_t block) { return count / block + (count % block != 0); }

/* ---- options ------------------------------------------------------------- */

/* Digits only (no sign, no spaces), 1 <= value <= max. */
static int parse_size(const char *text, long max, size_t *value) {
  if (text == NULL || text[0] == '\0') return 0;
  long result = 0;
  for (const char *c = text; *c; ++c) {
    if (*c < '0' || *c > '9') return 0;
    result = result * 10 + (*c - '0');
    if (result > max) return 0;
  }
  if (result < 1) return 0;
  *value = (size_t)result;
  return 1;
}

static shoal_status_t qint8_create(const shoal_compressor_params_t *params, void **instance) {
  size_t block = QINT8_DEFAULT_BLOCK;
  for (int i = 0; i < params->num_options; ++i) {
    const char *key = params->keys[i];
    const char *value = params->values[i];
    if (strcmp(key, "block") == 0) {
      if (!parse_size(value, QINT8_MAX_BLOCK, &block)) {
        set_error(params->error_text, params->error_text_size,
                  "block='%s' is not a whole number from 1 to %ld (elements per scale)", value, QINT8_MAX_BLOCK);
        return SHOAL_ERR_INVALID_ARGUMENT;
      }
    } else {
      set_error(params->error_text, params->error_text_size, "unknown option '%s'; qint8 takes only block=<int>",
                key);
      return SHOAL_ERR_INVALID_ARGUMENT;
    }
  }
  qint8_instance_t *self = calloc(1, sizeof *self);
  if (self == NULL) {
    set_error(params->error_text, params->error_text_size, "out of memory");
    return SHOAL_ERR_NO_MEMORY;
  }
  self->block = block;
  /* Read a params field only if the caller's struct_size says it is there (ABI habit). */
  self->log = params->struct_size >= offsetof(shoal_compressor_params_t, log) + sizeof(shoal_log_fn) ? params->log
                                                                                                      : NULL;
  *instance = self;
  return SHOAL_OK;
}

static void qint8_destroy(void *instance) { free(instance); }

/* ---- one operation ------------------------------------------------------- */

static void qint8_finish(void *instance, void *op_state) {
  (void)instance;
  qint8_op_state_t *state = op_state;
  if (state == NULL) return;
  free(state->scales);
  free(state->codes);
  free(state);
}

static shoal_status_t qint8_start(void *instance, shoal_compress_op_t *op, void **op_state) {
  qint8_instance_t *self = instance;
  *op_state = NULL;
  if (op->op != SHOAL_SUM && op->op != SHOAL_AVG) {
    set_error(op->error_text, op->error_text_size, "qint8 reduces with sum or avg only, not op %d", (int)op->op);
    return SHOAL_ERR_UNSUPPORTED;
  }
  if (op->world_size < 1) {
    set_error(op->error_text, op->error_text_size, "world size %d", op->world_size);
    return SHOAL_ERR_INVALID_ARGUMENT;
  }
  qint8_op_state_t *state = calloc(1, sizeof *state);
  if (state == NULL) return SHOAL_ERR_NO_MEMORY;
  for (int t = 0; t < op->num_tensors; ++t) {
    const shoal_compress_tensor_t *tensor = &op->tensors[t];
    if (tensor->input.dtype != SHOAL_F32 || tensor->output.dtype != SHOAL_F32 ||
        tensor->input.memory != SHOAL_MEMORY_HOST || tensor->output.memory != SHOAL_MEMORY_HOST) {
      set_error(op->error_text, op->error_text_size, "tensor %d: qint8 takes host f32 tensors only", t);
      free(state);
      return SHOAL_ERR_UNSUPPORTED;
    }
    size_t count = element_count(&tensor->input);
    state->total_count += count;
    state->total_blocks += block_count(count, self->block);
  }
  if (op->world_size <= QINT8_MAX_I8_RANKS) {
    state->code_dtype = SHOAL_I8;
    state->levels = QINT8_MAX_I8_RANKS / op->world_size;
  } else {
    state->code_dtype = SHOAL_I32;
    state->levels = INT32_MAX / op->world_size;
    if (!self->warned_wide && self->log != NULL) {
      self->log(1, "qint8: more than 127 ranks: int8 sums would overflow, so codes travel as int32 "
                   "(no compression)");
      self->warned_wide = 1;
    }
  }
  if (op->world_size > 1) {
    size_t code_size = state->code_dtype == SHOAL_I8 ? 1 : 4;
    state->scales = malloc(state->total_blocks ? state->total_blocks * sizeof(float) : 1);
    state->codes = malloc(state->total_count ? state->total_count * code_size : 1);
    if (state->scales == NULL || state->codes == NULL) {
      set_error(op->error_text, op->error_text_size, "out of memory for %zu elements", state->total_count);
      qint8_finish(instance, state);
      return SHOAL_ERR_NO_MEMORY;
    }
  }
  *op_state = state;
  return SHOAL_OK;
}

/* Round half away from zero, without libm and without the t + 0.5 trap
 * (0.49999999999999994 + 0.5 == 1.0 in double): t - trunc(t) is exact. */
static int64_t round_half_away(double t) {
  int64_t whole = (int64_t)t; /* truncates toward zero */
  double fraction = t - (double)whole;
  if (fraction >= 0.5) return whole + 1;
  if (fraction <= -0.5) return whole - 1;
  return whole;
}

/* Round 0: the local maximum |x| of every block. NaN becomes +inf so that a
 * MAX reduction carries it whatever the order of comparisons. */
static void local_maxima(const qint8_instance_t *self, const shoal_compress_op_t *op, float *scales) {
  size_t b = 0;
  for (int t = 0; t < op->num_tensors; ++t) {
    const float *x = op->tensors[t].input.data;
    size_t count = element_count(&op->tensors[t].input);
    for (size_t begin = 0; begin < count; begin += self->block, ++b) {
      size_t end = count - begin < self->block ? count : begin + self->block;
      float m = 0.0f;
      for (size_t i = begin; i < end; ++i) {
        float a = x[i] < 0 ? -x[i] : x[i];
        if (isnan(a)) a = INFINITY;
        if (a > m) m = a;
      }
      scales[b] = m;
    }
  }
}

static int finite_positive(float m) { return m > 0.0f && isfinite(m); }

/* Round 1: codes from the shared block maxima. The maxima came from the
 * peers: a block maximum below this rank's own |x| was not made by the MAX
 * (it would also scale |x| past the int64 range), so it is refused with text
 * instead of quantized. Returns 0, or the tensor whose block is malformed + 1. */
static int quantize(const qint8_instance_t *self, const shoal_compress_op_t *op, qint8_op_state_t *state) {
  size_t b = 0, offset = 0;
  const int64_t levels = state->levels;
  for (int t = 0; t < op->num_tensors; ++t) {
    const float *x = op->tensors[t].input.data;
    size_t count = element_count(&op->tensors[t].input);
    for (size_t begin = 0; begin < count; begin += self->block, ++b) {
      size_t end = count - begin < self->block ? count : begin + self->block;
      float m = state->scales[b];
      /* A zero block sends zeros; a non-finite one too (it decodes to NaN),
       * and its NaN or inf inputs are never converted to integers. */
      int usable = finite_positive(m);
      double inverse = usable ? (double)levels / (double)m : 0.0;
      for (size_t i = begin; usable && i < end; ++i)
        if (!(fabsf(x[i]) <= m)) return t + 1;
      for (size_t i = begin; i < end; ++i) {
        int64_t q = usable ? round_half_away((double)x[i] * inverse) : 0;
        if (q > levels) q = levels; /* |x| <= m, so only rounding of the product gets here */
        if (q < -levels) q = -levels;
        if (state->code_dtype == SHOAL_I8) ((int8_t *)state->codes)[offset + i] = (int8_t)q;
        else ((int32_t *)state->codes)[offset + i] = (int32_t)q;
      }
    }
    offset += count;
  }
  return 0;
}

/* Round 2: out = S * M_b / L (/ n for avg). */
static void dequantize(const qint8_instance_t *self, const shoal_compress_op_t *op, const qint8_op_state_t *state) {
  size_t b = 0, offset = 0;
  for (int t = 0; t < op->num_tensors; ++t) {
    float *out = op->tensors[t].output.data;
    size_t count = element_count(&op->tensors[t].output);
    for (size_t begin = 0; begin < count; begin += self->block, ++b) {
      size_t end = count - begin < self->block ? count : begin + self->block;
      float m = state->scales[b];
      int finite = isfinite(m);
      double step = (double)m / (double)state->levels;
      if (op->op == SHOAL_AVG) step /= (double)op->world_size;
      for (size_t i = begin; i < end; ++i) {
        int64_t sum = state->code_dtype == SHOAL_I8 ? ((const int8_t *)state->codes)[offset + i]
                                                     : ((const int32_t *)state->codes)[offset + i];
        out[i] = finite ? (float)((double)sum * step) : NAN;
      }
    }
    offset += count;
  }
}

static void copy_through(const shoal_compress_op_t *op) {
  for (int t = 0; t < op->num_tensors; ++t) {
    const shoal_compress_tensor_t *tensor = &op->tensors[t];
    if (tensor->output.data != tensor->input.data)
      memmove(tensor->output.data, tensor->input.data, element_count(&tensor->input) * sizeof(float));
  }
}

static shoal_payload_t allreduce_payload(shoal_dtype_t dtype, shoal_op_t reduce, void *buffer, size_t count) {
  shoal_payload_t payload;
  memset(&payload, 0, sizeof payload);
  payload.collective = SHOAL_COLLECTIVE_ALLREDUCE;
  payload.dtype = dtype;
  payload.op = reduce;
  payload.buffer = buffer;
  payload.count = count;
  return payload;
}

static shoal_status_t qint8_round(void *instance, void *op_state, shoal_compress_op_t *op, shoal_round_t *round) {
  const qint8_instance_t *self = instance;
  qint8_op_state_t *state = op_state;
  switch (round->index) {
    case 0:
      if (op->world_size == 1) { /* nothing to agree on: exact copy */
        copy_through(op);
        round->num_payloads = 0;
        round->done = 1;
        return SHOAL_OK;
      }
      local_maxima(self, op, state->scales);
      round->num_payloads = 1;
      round->payloads[0] = allreduce_payload(SHOAL_F32, SHOAL_MAX, state->scales, state->total_blocks);
      return SHOAL_OK;
    case 1: {
      int bad = quantize(self, op, state);
      if (bad) {
        set_error(op->error_text, op->error_text_size,
                  "qint8: malformed payload after round 0, tensor %d: a block maximum is below this rank's own "
                  "|x| (a rank sent corrupted data)",
                  bad - 1);
        return SHOAL_ERR_INTERNAL;
      }
      round->num_payloads = 1;
      /* SUM, also for SHOAL_AVG: integer avg would truncate; we divide on decode. */
      round->payloads[0] = allreduce_payload(state->code_dtype, SHOAL_SUM, state->codes, state->total_count);
      return SHOAL_OK;
    }
    case 2:
      dequantize(self, op, state);
      round->num_payloads = 0;
      round->done = 1;
      return SHOAL_OK;
    default:
      set_error(op->error_text, op->error_text_size, "qint8 was called for round %d after it was done", round->index);
      return SHOAL_ERR_INTERNAL;
  }
}

/* ---- the table ------------------------------------------------------------- */

static const shoal_compressor_t qint8_table = {
    .abi_version = SHOAL_COMPRESSOR_ABI_VERSION,
    .struct_size = sizeof(shoal_compressor_t),
    .name = QINT8_NAME,
    .description = "example plugin: per-block scale + int8 codes summed in int8 (~3.9x smaller than f32 "
                   "for up to 127 ranks); error <= n*M_b/(2*floor(127/n)) with M_b the block's max |x|",
    .options_help = "block=<int>: elements per shared scale (default 256)",
    .caps = SHOAL_CAP_HOST | SHOAL_CAP_HOMOMORPHIC,
    /* The ABI's per-element form, |out_i - exact_i| <= bound * n * sum_r |x_r,i|,
     * is the only one it has. A linear quantizer rounds an element much smaller
     * than its block's max to 0, so the tightest true constant is 1/2 (n >= 2;
     * n == 1 is an exact copy), plus 2^-20 for floating-point rounding. See
     * README.md: the meaningful promise is relative to the block max. */
    .error_kind = SHOAL_ERROR_RELATIVE,
    .error_bound = 0.5 + 1.0 / 1048576.0,
    .dtypes = 1u << SHOAL_F32,
    .create = qint8_create,
    .destroy = qint8_destroy,
    .start = qint8_start,
    .round = qint8_round,
    .finish = qint8_finish,
    .destroy_tensor_state = NULL,
    .save_tensor_state = NULL,
    .load_tensor_state = NULL,
};

/* The one symbol the registry looks up (SHOAL_COMPRESSOR_PLUGIN_SYMBOL). */
SHOAL_COMPRESSOR_EXPORT const shoal_compressor_t *shoal_compressor_plugin_v1(void);
SHOAL_COMPRESSOR_EXPORT const shoal_compressor_t *shoal_compressor_plugin_v1(void) { return &qint8_table; }
