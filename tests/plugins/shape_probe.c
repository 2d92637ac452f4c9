/* shape_probe: a test-only compressor plugin that records the shape of every
 * tensor the driver hands it (tests/multiproc/test_hierarchical_caps.cc).
 *
 * It compresses nothing: one f32 sum allreduce of the values, as no
 * compression would. Each named tensor's state is the shape it was given last;
 * save_tensor_state writes it as int64 {ndim, shape[0], ..., shape[ndim-1]},
 * so a test reads through the public API what the compressor saw.
 *
 * Built twice from this file (tests/CMakeLists.txt):
 *   - "shape_probe": caps without SHOAL_CAP_MATRIX, as every plugin built
 *     before the bit existed (ABI 1): it must keep seeing 1-D shards;
 *   - "shape_probe_rows" (-DSHAPE_PROBE_ROWS): with SHOAL_CAP_MATRIX, it must
 *     see blocks of whole rows of a matrix.
 */
#include <shoal/compressor.h>

#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#ifdef SHAPE_PROBE_ROWS
#define PROBE_NAME "shape_probe_rows"
#define PROBE_CAPS \
  (SHOAL_CAP_HOST | SHOAL_CAP_LOSSLESS | SHOAL_CAP_HOMOMORPHIC | SHOAL_CAP_STATEFUL | SHOAL_CAP_MATRIX)
#else
#define PROBE_NAME "shape_probe"
#define PROBE_CAPS (SHOAL_CAP_HOST | SHOAL_CAP_LOSSLESS | SHOAL_CAP_HOMOMORPHIC | SHOAL_CAP_STATEFUL)
#endif

typedef struct probe_shape {
  int64_t ndim;
  int64_t shape[SHOAL_MAX_DIMS];
} probe_shape_t;

typedef struct probe_op {
  float *values; /* every tensor's input, one after another */
  size_t count;
} probe_op_t;

static size_t elements_of(const shoal_tensor_t *tensor) {
  size_t count = 1;
  for (int d = 0; d < tensor->ndim; ++d) count *= (size_t)tensor->shape[d];
  return count;
}

static shoal_status_t refuse(shoal_compress_op_t *op, const char *why) {
  if (op->error_text && op->error_text_size) snprintf(op->error_text, op->error_text_size, "%s: %s", PROBE_NAME, why);
  return SHOAL_ERR_INVALID_ARGUMENT;
}

static shoal_status_t probe_create(const shoal_compressor_params_t *params, void **instance) {
  if (params->num_options > 0) {
    if (params->error_text && params->error_text_size)
      snprintf(params->error_text, params->error_text_size, "%s takes no options", PROBE_NAME);
    return SHOAL_ERR_INVALID_ARGUMENT;
  }
  *instance = malloc(1);
  return *instance ? SHOAL_OK : SHOAL_ERR_INTERNAL;
}

static void probe_destroy(void *instance) { free(instance); }

static shoal_status_t probe_start(void *instance, shoal_compress_op_t *op, void **op_state) {
  (void)instance;
  size_t total = 0;
  for (int t = 0; t < op->num_tensors; ++t) {
    const shoal_compress_tensor_t *tensor = &op->tensors[t];
    if (tensor->input.dtype != SHOAL_F32 || tensor->input.memory != SHOAL_MEMORY_HOST)
      return refuse(op, "host f32 tensors only");
    total += elements_of(&tensor->input);
  }
  probe_op_t *state = calloc(1, sizeof *state);
  if (state == NULL) return SHOAL_ERR_INTERNAL;
  state->count = total;
  state->values = malloc((total ? total : 1) * sizeof(float));
  if (state->values == NULL) {
    free(state);
    return SHOAL_ERR_INTERNAL;
  }
  size_t offset = 0;
  for (int t = 0; t < op->num_tensors; ++t) {
    const shoal_compress_tensor_t *tensor = &op->tensors[t];
    const size_t count = elements_of(&tensor->input);
    memcpy(state->values + offset, tensor->input.data, count * sizeof(float));
    offset += count;
    if (tensor->name == NULL || tensor->state == NULL) continue;
    if (*tensor->state == NULL) *tensor->state = calloc(1, sizeof(probe_shape_t));
    probe_shape_t *seen = *tensor->state;
    if (seen == NULL) continue;
    seen->ndim = tensor->input.ndim;
    for (int d = 0; d < tensor->input.ndim; ++d) seen->shape[d] = tensor->input.shape[d];
  }
  *op_state = state;
  return SHOAL_OK;
}

static shoal_status_t probe_round(void *instance, void *op_state, shoal_compress_op_t *op, shoal_round_t *round) {
  (void)instance;
  probe_op_t *state = op_state;
  if (round->index == 0 && state->count > 0) {
    round->num_payloads = 1;
    shoal_payload_t *payload = &round->payloads[0];
    memset(payload, 0, sizeof *payload);
    payload->collective = SHOAL_COLLECTIVE_ALLREDUCE;
    payload->dtype = SHOAL_F32;
    payload->op = SHOAL_SUM;
    payload->buffer = state->values;
    payload->count = state->count;
    return SHOAL_OK;
  }
  size_t offset = 0;
  for (int t = 0; t < op->num_tensors; ++t) {
    const size_t count = elements_of(&op->tensors[t].input);
    float *out = op->tensors[t].output.data;
    for (size_t i = 0; i < count; ++i)
      out[i] = op->op == SHOAL_AVG ? state->values[offset + i] / (float)op->world_size : state->values[offset + i];
    offset += count;
  }
  round->num_payloads = 0;
  round->done = 1;
  return SHOAL_OK;
}

static void probe_finish(void *instance, void *op_state) {
  (void)instance;
  probe_op_t *state = op_state;
  if (state == NULL) return;
  free(state->values);
  free(state);
}

static void probe_destroy_tensor_state(void *instance, void *state) {
  (void)instance;
  free(state);
}

static shoal_status_t probe_save_tensor_state(void *instance, const void *state, void *buffer, size_t *bytes) {
  (void)instance;
  const probe_shape_t *seen = state;
  const size_t needed = (size_t)(1 + seen->ndim) * sizeof(int64_t);
  if (buffer == NULL) {
    *bytes = needed;
    return SHOAL_OK;
  }
  if (*bytes < needed) return SHOAL_ERR_INVALID_ARGUMENT;
  memcpy(buffer, seen, needed); /* ndim, then shape[0..ndim) */
  *bytes = needed;
  return SHOAL_OK;
}

/* The inverse, so that save and load come together as the conformance rules ask. */
static shoal_status_t probe_load_tensor_state(void *instance, void **state, const void *buffer, size_t bytes) {
  (void)instance;
  int64_t ndim = 0;
  if (bytes < sizeof ndim) return SHOAL_ERR_INVALID_ARGUMENT;
  memcpy(&ndim, buffer, sizeof ndim);
  if (ndim < 0 || ndim > SHOAL_MAX_DIMS || bytes != (size_t)(1 + ndim) * sizeof(int64_t))
    return SHOAL_ERR_INVALID_ARGUMENT;
  if (*state == NULL) *state = calloc(1, sizeof(probe_shape_t));
  if (*state == NULL) return SHOAL_ERR_INTERNAL;
  memcpy(*state, buffer, bytes);
  return SHOAL_OK;
}

static const shoal_compressor_t kProbe = {
    .abi_version = 1, /* the ABI the bit was added to without a bump */
    .struct_size = sizeof(shoal_compressor_t),
    .name = PROBE_NAME,
    .description = "test only: records the shapes it is given; compresses nothing",
    .options_help = "",
    .caps = PROBE_CAPS,
    .error_kind = SHOAL_ERROR_EXACT,
    .error_bound = 0.0,
    .dtypes = 1u << SHOAL_F32,
    .create = probe_create,
    .destroy = probe_destroy,
    .start = probe_start,
    .round = probe_round,
    .finish = probe_finish,
    .destroy_tensor_state = probe_destroy_tensor_state,
    .save_tensor_state = probe_save_tensor_state,
    .load_tensor_state = probe_load_tensor_state,
};

SHOAL_COMPRESSOR_EXPORT const shoal_compressor_t *shoal_compressor_plugin_v1(void) { return &kProbe; }
