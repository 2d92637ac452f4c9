/* shoal — low-rank training helpers (Pufferfish, DESIGN.md §7.3).
 *
 * Pure C11. Pufferfish trains pre-factorized layers: after a full-rank
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
