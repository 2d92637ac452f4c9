/* shoal — low-rank training helpers: a PowerSGD plan for users who drive the
 * compression themselves, and the Pufferfish pieces (DESIGN.md §7.3).
 *
 * Pure C11.
 *
 * PowerSGD plan (the powersgd compressor's step, for a fixed list of matrices):
 * create it once from matrix descriptors, then per training step either call
 * shoal_lowrank_step (both allreduces on a communicator), or the three split
 * phases around your own two SUM allreduces of f32 buffers (to overlap them
 * with other work, or to run them on another transport):
 *
 *     shoal_lowrank_phase_p(plan, grads, p_buf, &p_count);   // M = g + e, P = M Q
 *     allreduce SUM of p_buf[0 .. p_count)
 *     shoal_lowrank_phase_q(plan, p_buf, q_buf, &q_count);   // P orthonormal, Q = M^T P
 *     if (q_count) allreduce SUM of q_buf[0 .. q_count)
 *     shoal_lowrank_finish(plan, p_buf, q_buf, outputs, world_size, SHOAL_AVG);
 *
 * The plan's step is the compressor's: for the same matrices (names, shapes,
 * dtype, options) and inputs it gives the same output bits and the same state
 * as shoal_allreduce_tensor with compressor "powersgd" on one call holding the
 * same tensors (docs/lowrank.md). A plan is used by one thread at a time;
 * every rank must create the same plan and call the same phases.
 *
 * CUDA plans (config.memory = SHOAL_MEMORY_CUDA, GPU build): gradients,
 * outputs, p_buf and q_buf are device memory; the phases are enqueued on
 * config.stream and return before the work is done (run your allreduces on
 * that stream, e.g. ncclAllReduce). The plan keeps its state on the device.
 * shoal_lowrank_step takes host plans only (SHOAL_ERR_UNSUPPORTED otherwise).
 *
 * Pufferfish trains pre-factorized layers: after a full-rank
 * warm-up, a weight W [rows, cols] (a conv weight [out, in, kh, kw] viewed as
 * [out, in*kh*kw]) is replaced by two factors U' [rows, r] and V' [cols, r]
 * with W ~= U' V'^T. The factor gradients are then small enough to be
 * allreduced uncompressed, all of them in one fused call.
 *
 *  - shoal_fused_allreduce: one uncompressed allreduce of many tensors;
 *  - shoal_lowrank_factorize: the truncated SVD that builds U' and V';
 *  - shoal_lowrank_rank: Pufferfish's choice of r.
 *
 * Conventions as in shoal.h: status codes, shoal_last_error(comm) for the
 * text (comm == NULL: the calling thread's last error, used by the local
 * helpers below), the caller owns every buffer.
 */
#ifndef SHOAL_LOWRANK_H
#define SHOAL_LOWRANK_H

#include <stdint.h>

#include "shoal/shoal.h"
#include "shoal/status.h"

#ifdef __cplusplus
extern "C" {
#endif

/* ---- PowerSGD plan ------------------------------------------------------ */

typedef struct shoal_lowrank_plan *shoal_lowrank_plan_t;

#define SHOAL_LOWRANK_DENSE 1u /* shoal_lowrank_matrix_t.flags: never compress this one */

/* One gradient, viewed as a row-major matrix [rows, cols] (a conv weight
 * [out, in, kh, kw]: rows = out, cols = in*kh*kw; a vector or scalar: rows =
 * its count, cols = 1, flags SHOAL_LOWRANK_DENSE, as the compressor routes 1-D
 * tensors). Compressed at rank r = min(rows, cols, rank) iff
 * (rows + cols) * r * min_compression_rate < rows * cols and not
 * SHOAL_LOWRANK_DENSE; otherwise it rides densely with P. */
typedef struct shoal_lowrank_matrix {
  int64_t rows;
  int64_t cols;      /* rows * cols may be 0 (an empty gradient, left alone) */
  int32_t rank;      /* 0: the config's rank; else 1..1024 */
  uint32_t flags;    /* SHOAL_LOWRANK_DENSE or 0 */
  const char *name;  /* keys the RNG of its first Q, as a tensor name does for the compressor
                        (same name, seed, shape -> same Q); NULL: its index in decimal ("0", "1", ...).
                        Copied at creation. */
} shoal_lowrank_matrix_t;

typedef struct shoal_lowrank_config {
  size_t struct_size;
  int32_t rank;                /* 1..1024 (default 4) */
  int32_t error_feedback;      /* 0 or 1 (default 1) */
  double min_compression_rate; /* >= 0 (default 2, PyTorch's) */
  uint64_t start_iter;         /* steps before this one are plain allreduces (default 0) */
  uint64_t seed;               /* of the first Q (default 0) */
  shoal_dtype_t dtype;         /* of every gradient: SHOAL_F32 (default), SHOAL_F16 or SHOAL_BF16;
                                  the factor math runs in f32 for all three */
  shoal_memory_t memory;       /* where gradients, outputs and the split phases' buffers live:
                                  SHOAL_MEMORY_HOST (default) or SHOAL_MEMORY_CUDA (GPU build) */
  int device;                  /* CUDA: the device ordinal */
  void *stream;                /* CUDA: the cudaStream_t every phase is enqueued on; NULL = default */
} shoal_lowrank_config_t;

#define SHOAL_LOWRANK_CONFIG_INIT {sizeof(shoal_lowrank_config_t), 4, 1, 2.0, 0, 0, SHOAL_F32, SHOAL_MEMORY_HOST, 0, NULL}

typedef struct shoal_lowrank_sizes {
  size_t struct_size;
  size_t p_elems;          /* f32 elements of the P buffer of the split phases: P blocks + dense
                              part, or every gradient densely in plain steps, whichever is larger */
  size_t q_elems;          /* f32 elements of the Q buffer */
  size_t compressed;       /* how many matrices are compressed */
  size_t dense_elems;      /* elements that ride densely in compressed steps */
  size_t workspace_bytes;  /* what the plan holds for M = g + e (f32) */
  size_t state_bytes;      /* shoal_lowrank_state_save's size */
} shoal_lowrank_sizes_t;

#define SHOAL_LOWRANK_SIZES_INIT {sizeof(shoal_lowrank_sizes_t), 0, 0, 0, 0, 0, 0}

/* Creates a plan for num_matrices matrices (>= 1). config NULL: the defaults.
 * Local; errors through shoal_last_error(NULL): SHOAL_ERR_INVALID_ARGUMENT for
 * a NULL pointer, a negative extent, a rank outside 0..1024, unknown flags, or
 * a config value out of range (the text names it); SHOAL_ERR_UNSUPPORTED for a
 * CUDA plan in a build without CUDA. */
shoal_status_t shoal_lowrank_plan_create(const shoal_lowrank_matrix_t *matrices, int num_matrices,
                                         const shoal_lowrank_config_t *config, shoal_lowrank_plan_t *plan);
void shoal_lowrank_plan_destroy(shoal_lowrank_plan_t plan); /* NULL: nothing */

/* sizes must come from SHOAL_LOWRANK_SIZES_INIT. */
shoal_status_t shoal_lowrank_plan_sizes(shoal_lowrank_plan_t plan, shoal_lowrank_sizes_t *sizes);

/* One step on comm: grads[i] and outputs[i] (may be equal: in place) hold
 * matrix i's rows * cols elements of the config's dtype; op SHOAL_SUM or
 * SHOAL_AVG. Two allreduces (P with the dense part, then Q), or one in a
 * plain step (before start_iter) or when nothing is compressed. The plan
 * holds the buffers. The first step also checks (one small allreduce) that
 * every rank has the same plan: SHOAL_ERR_INVALID_ARGUMENT on every rank
 * otherwise. Errors as for shoal_allreduce, through shoal_last_error(comm);
 * the plan is then ready for the next step. */
shoal_status_t shoal_lowrank_step(shoal_lowrank_plan_t plan, shoal_comm_t comm, const void *const *grads,
                                  void *const *outputs, shoal_op_t op);

/* The split phases, in this order, once per step (errors through
 * shoal_last_error(NULL)). phase_p always begins a step (one left unfinished
 * is abandoned; the error vectors change only in finish); phase_q or finish
 * called out of order is refused and the plan then expects phase_p.
 *  phase_p: reads grads, writes p_buf[0 .. *p_count) (p_buf holds p_elems);
 *           allreduce it with SUM on every rank. *p_count may be 0 (every
 *           matrix empty): skip the allreduce.
 *  phase_q: p_buf summed; orthonormalizes P in p_buf and writes
 *           q_buf[0 .. *q_count) (q_buf holds q_elems; may be NULL when
 *           q_elems is 0); allreduce it with SUM. *q_count == 0 (plain step,
 *           nothing compressed): no Q allreduce.
 *  finish:  p_buf as phase_q left it, q_buf summed; writes outputs (may be
 *           the grads), updates the error and Q, and counts the step.
 *           world_size: how many ranks summed; op SHOAL_SUM or SHOAL_AVG. */
shoal_status_t shoal_lowrank_phase_p(shoal_lowrank_plan_t plan, const void *const *grads, float *p_buf,
                                     size_t *p_count);
shoal_status_t shoal_lowrank_phase_q(shoal_lowrank_plan_t plan, float *p_buf, float *q_buf, size_t *q_count);
shoal_status_t shoal_lowrank_finish(shoal_lowrank_plan_t plan, const float *p_buf, const float *q_buf,
                                    void *const *outputs, int world_size, shoal_op_t op);

/* The plan's state (every matrix's error vector and warm-start Q, and the step
 * count) for checkpoints: save, then load into a plan created with the same
 * matrices and config, resumes bit for bit. buffer == NULL: *bytes gets the
 * size (also in shoal_lowrank_sizes_t.state_bytes). Between steps only.
 * Layout (native byte order): u64 magic "SHOALPLN", u64 matrices, u64 steps,
 * then per matrix u64 bytes and the powersgd compressor's tensor state. */
shoal_status_t shoal_lowrank_state_save(shoal_lowrank_plan_t plan, void *buffer, size_t *bytes);
shoal_status_t shoal_lowrank_state_load(shoal_lowrank_plan_t plan, const void *buffer, size_t bytes);

/* ---- Pufferfish --------------------------------------------------------- */

/* In-place allreduce of num_tensors host tensors with SHOAL_SUM or SHOAL_AVG,
 * as ONE uncompressed collective: the tensors are copied (in the given order)
 * into one flat buffer, allreduced, and copied back. No compressor runs
 * (SHOAL_COMPRESSOR is ignored); the call takes one sequence number, like any
 * other collective, and every rank must pass the same list (same count, dtype
 * and element count per tensor, in the same order).
 *
 * Result: element for element what one shoal_allreduce per tensor gives, up
 * to rounding: the reduction algorithm splits the fused buffer into blocks at
 * other boundaries than it would split each tensor, so the order in which the
 * ranks' contributions to one element are combined can differ, and a
 * floating-point sum can differ in the last bit (integer types and sums that
 * are exact, e.g. of integer-valued floats, are bitwise equal). Within one
 * fused call every rank gets the same bits.
 *
 * All tensors must share one dtype, live in host memory (CUDA tensors:
 * SHOAL_ERR_UNSUPPORTED), and be non-NULL unless empty. Empty tensors
 * (an extent of 0) are allowed and left as they are. The fused buffer is
 * scratch memory of the communicator, reused across calls.
 *
 * Errors: SHOAL_ERR_INVALID_ARGUMENT for tensors == NULL, num_tensors <= 0,
 * mixed dtypes, an op other than SUM/AVG, a bad ndim or negative extent, a
 * NULL data pointer of a non-empty tensor, or a total size that overflows;
 * collective failures as for shoal_allreduce. */
shoal_status_t shoal_fused_allreduce(shoal_comm_t comm, const shoal_tensor_t *tensors, int num_tensors,
                                     shoal_op_t op);

/* Truncated SVD of the row-major matrix w [rows, cols] (LAPACK sgesdd, f32):
 * w = U S V^T, and with r = rank,
 *   u_out [rows, r] = U[:, :r] diag(sqrt(S[:r]))   (row-major)
 *   v_out [cols, r] = V[:, :r] diag(sqrt(S[:r]))   (row-major)
 * so that w ~= u_out v_out^T, the best rank-r approximation in the Frobenius
 * norm: ||w - u_out v_out^T||_F = sqrt(sum_{i >= r} S[i]^2) up to rounding.
 * singular_values_out (may be NULL) receives all min(rows, cols) singular
 * values, in descending order. w is not modified.
 *
 * Local (no communication, no communicator); errors are reported through
 * shoal_last_error(NULL). Requirements: rows >= 1, cols >= 1,
 * 1 <= rank <= min(rows, cols), w, u_out, v_out non-NULL, rows * cols
 * addressable (SHOAL_ERR_INVALID_ARGUMENT otherwise); a non-finite element of w
 * or an SVD that does not converge: SHOAL_ERR_INVALID_ARGUMENT with the text.
 * Cost: a full SVD, O(rows * cols * min(rows, cols)), and workspace of about
 * 4 * (rows * cols + 2 * min^2 + max * min) bytes: meant for the one-off
 * switch from full rank to low rank, not for every step. */
shoal_status_t shoal_lowrank_factorize(const float *w, int64_t rows, int64_t cols, int64_t rank, float *u_out,
                                       float *v_out, float *singular_values_out);

/* Pufferfish's rank for a [rows, cols] weight: max(1, min(rows, cols) / rank_factor)
 * (integer division; Pufferfish uses rank_factor 4). Returns 0 for rows < 1,
 * cols < 1 or rank_factor < 1. */
int64_t shoal_lowrank_rank(int64_t rows, int64_t cols, int64_t rank_factor);

#ifdef __cplusplus
}
#endif
#endif /* SHOAL_LOWRANK_H */
