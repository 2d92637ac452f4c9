/* shoal — collective communication with compressors inside the collective.
 *
 * Pure C11, no CUDA headers. Conventions:
 *  - every call returns shoal_status_t (0 = OK, negative = error) and writes its
 *    results through out-parameters; the caller owns every buffer it passes;
 *  - shoal_last_error(comm) returns the text of the last error on that
 *    communicator (or, with comm == NULL, of the calling thread), naming the
 *    argument at fault and the fix;
 *  - collectives are blocking and collective: every rank of the communicator
 *    must call them in the same order with matching count, dtype and op.
 *    A rank that disagrees, dies or stalls turns into an error on every rank
 *    within SHOAL_TIMEOUT_S seconds, never a hang;
 *  - send == recv means in place.
 */
#ifndef SHOAL_SHOAL_H
#define SHOAL_SHOAL_H

#include <stddef.h>
#include <stdint.h>
#include <stdio.h>

#include "shoal/status.h"

#ifdef __cplusplus
extern "C" {
#endif

/* The one place the version is written: CMakeLists.txt and pyproject.toml read it from here. */
#define SHOAL_VERSION_MAJOR 0
#define SHOAL_VERSION_MINOR 1
#define SHOAL_VERSION_PATCH 0
/* The version as one number, major * 10000 + minor * 100 + patch (NCCL's NCCL_VERSION_CODE). */
#define SHOAL_VERSION_CODE (SHOAL_VERSION_MAJOR * 10000 + SHOAL_VERSION_MINOR * 100 + SHOAL_VERSION_PATCH)

typedef enum shoal_dtype {
  SHOAL_F16 = 0, /* IEEE binary16 */
  SHOAL_BF16,    /* bfloat16 */
  SHOAL_F32,
  SHOAL_F64,
  SHOAL_I8,
  SHOAL_U8,
  SHOAL_I32,
  SHOAL_U32,
  SHOAL_I64,
  SHOAL_U64,
  SHOAL_DTYPE_COUNT
} shoal_dtype_t;

/* f16/bf16 are widened to f32 to combine and rounded once per hop.
 * avg is sum followed by one division by the world size (integer division,
 * truncating toward zero, for integer types). band/bor/bxor: integer types only. */
typedef enum shoal_op {
  SHOAL_SUM = 0,
  SHOAL_AVG,
  SHOAL_PROD,
  SHOAL_MIN,
  SHOAL_MAX,
  SHOAL_BAND,
  SHOAL_BOR,
  SHOAL_BXOR,
  SHOAL_OP_COUNT
} shoal_op_t;

typedef struct shoal_comm *shoal_comm_t;

/* Where a tensor's memory lives. */
typedef enum shoal_memory {
  SHOAL_MEMORY_HOST = 0,
  SHOAL_MEMORY_CUDA = 1 /* device memory; needs a CUDA-enabled build */
} shoal_memory_t;

#define SHOAL_MAX_DIMS 8

/* A tensor: data, dtype and shape (row-major, contiguous). Shapes matter to
 * compressors: PowerSGD views a tensor as a matrix [shape[0], prod(rest)]. */
typedef struct shoal_tensor {
  void *data;
  shoal_dtype_t dtype;
  int ndim;                       /* 0 (a scalar) .. SHOAL_MAX_DIMS */
  int64_t shape[SHOAL_MAX_DIMS];
  shoal_memory_t memory;
  int device;                     /* CUDA device ordinal (memory == SHOAL_MEMORY_CUDA) */
  void *stream;                   /* cudaStream_t for CUDA tensors; NULL = the default stream */
} shoal_tensor_t;

/* A 1-D host tensor of count elements. */
static inline shoal_tensor_t shoal_tensor_1d(void *data, size_t count, shoal_dtype_t dtype) {
  shoal_tensor_t tensor = {data, dtype, 1, {(int64_t)count, 0, 0, 0, 0, 0, 0, 0}, SHOAL_MEMORY_HOST, 0, NULL};
  return tensor;
}

/* The same as shoal_tensor_1d, exported for bindings that cannot call inline functions. */
shoal_status_t shoal_tensor_init(shoal_tensor_t *tensor, void *data, size_t count, shoal_dtype_t dtype);

/* Explicit communicator configuration. Always start from SHOAL_CONFIG_INIT:
 * struct_size lets later versions append fields without breaking callers.
 * A field left at its "unset" value (-1 / NULL / negative) is read from the
 * environment (SHOAL_RANK, SHOAL_WORLD_SIZE, SHOAL_STORE, SHOAL_TOKEN,
 * SHOAL_TIMEOUT_S, SHOAL_ALGO), or from OMPI_COMM_WORLD_* / SLURM_* for rank
 * and size. */
typedef struct shoal_config {
  size_t struct_size;    /* sizeof(shoal_config_t) as the caller compiled it */
  int rank;              /* this process's rank, 0 <= rank < world_size; -1 = from env */
  int world_size;        /* number of ranks; -1 = from env */
  const char *store;     /* rendezvous: "tcp://host:port", "file:///dir", "memory://name"; NULL = env */
  const char *token;     /* job token presented to a tcp store; NULL = env SHOAL_TOKEN */
  double timeout_s;      /* deadline of every wait; <= 0 = env SHOAL_TIMEOUT_S */
  const char *algorithm; /* "auto", "ring" or "tree"; NULL = env SHOAL_ALGO */
} shoal_config_t;

#define SHOAL_CONFIG_INIT {sizeof(shoal_config_t), -1, -1, NULL, NULL, -1.0, NULL}

/* ---- communicator ------------------------------------------------------ */

/* Collective over all ranks: rendezvous through the store, connect the
 * transport, agree on the configuration. */
shoal_status_t shoal_comm_init(shoal_comm_t *comm); /* everything from the environment */
shoal_status_t shoal_comm_init_config(const shoal_config_t *config, shoal_comm_t *comm);

/* Releases the transport; later calls on comm return SHOAL_ERR_INVALID_ARGUMENT.
 * The handle stays valid until shoal_comm_destroy. Local: no communication. */
shoal_status_t shoal_comm_finalize(shoal_comm_t comm);
/* Finalizes if needed and frees the handle. NULL is accepted. */
shoal_status_t shoal_comm_destroy(shoal_comm_t comm);

shoal_status_t shoal_comm_rank(shoal_comm_t comm, int *rank);
shoal_status_t shoal_comm_size(shoal_comm_t comm, int *size);

/* ---- sub-communicators ------------------------------------------------- */

/* The color that leaves a rank out of every new communicator (NCCL_SPLIT_NOCOLOR). */
#define SHOAL_SPLIT_UNDEFINED (-1)

/* Collective over every rank of comm (MPI_Comm_split, ncclCommSplit): ranks
 * that pass the same color >= 0 form a new communicator, ranked by (key,
 * rank in comm); a rank passing SHOAL_SPLIT_UNDEFINED gets *newcomm = NULL.
 * The new communicator has its own connections and store keys, keeps comm's
 * algorithm, timeout and segment settings, and lives independently of comm:
 * both may be used (one call at a time each) and destroyed in any order.
 * A rank that fails during the split (dies, times out) fails it on every
 * rank, and comm with it. docs/groups.md. */
shoal_status_t shoal_comm_split(shoal_comm_t comm, int color, int key, shoal_comm_t *newcomm);
/* Collective over every rank of comm (torch's new_group, Horovod's process
 * sets): the n distinct ranks of comm listed in `ranks` form a new
 * communicator, ranked in list order; ranks not listed get *newcomm = NULL.
 * Every rank must pass the same list, else every rank fails with
 * SHOAL_ERR_MISMATCH. */
shoal_status_t shoal_comm_create_group(shoal_comm_t comm, const int *ranks, int n, shoal_comm_t *newcomm);

/* Text of the last error on comm; comm == NULL gives the calling thread's
 * last error (e.g. from a failed init). Never NULL; "" when none. */
const char *shoal_last_error(shoal_comm_t comm);

/* ---- collectives on host memory ----------------------------------------- */

shoal_status_t shoal_allreduce(shoal_comm_t comm, const void *sendbuf, void *recvbuf,
                               size_t count, shoal_dtype_t dtype, shoal_op_t op);

/* recvbuf holds world_size * sendcount elements, rank r's at r * sendcount. */
shoal_status_t shoal_allgather(shoal_comm_t comm, const void *sendbuf, void *recvbuf,
                               size_t sendcount, shoal_dtype_t dtype);

/* Rank r contributes recvcounts[r] elements (sendcount must equal it), placed
 * at recvbuf + displs[r] elements. displs == NULL packs them contiguously. */
shoal_status_t shoal_allgatherv(shoal_comm_t comm, const void *sendbuf, size_t sendcount,
                                void *recvbuf, const size_t *recvcounts, const size_t *displs,
                                shoal_dtype_t dtype);

/* Root's sendbuf is copied to every rank's recvbuf (sendbuf is only read on root). */
shoal_status_t shoal_broadcast(shoal_comm_t comm, const void *sendbuf, void *recvbuf,
                               size_t count, shoal_dtype_t dtype, int root);

/* sendbuf holds world_size * recvcount elements; rank r receives the reduction
 * of block r. In place: recvbuf == sendbuf + rank * recvcount elements. */
shoal_status_t shoal_reduce_scatter(shoal_comm_t comm, const void *sendbuf, void *recvbuf,
                                    size_t recvcount, shoal_dtype_t dtype, shoal_op_t op);

shoal_status_t shoal_barrier(shoal_comm_t comm);

/* ---- alltoall, reduce, gather, scatter, point-to-point (docs/collectives.md) */

/* Rank r sends block p of sendbuf (count elements at p * count) to rank p and
 * receives rank p's block r into block p of recvbuf. In place: sendbuf == recvbuf. */
shoal_status_t shoal_alltoall(shoal_comm_t comm, const void *sendbuf, void *recvbuf, size_t count,
                              shoal_dtype_t dtype);
/* sendcounts[p] elements at sdispls[p] go to rank p; recvcounts[p] from rank p
 * land at rdispls[p] (elements; NULL displacements pack the blocks). Every
 * rank's recvcounts[p] must equal rank p's sendcounts[r]: a disagreement is
 * SHOAL_ERR_MISMATCH on every rank. In place: sendbuf == recvbuf. */
shoal_status_t shoal_alltoallv(shoal_comm_t comm, const void *sendbuf, const size_t *sendcounts,
                               const size_t *sdispls, void *recvbuf, const size_t *recvcounts,
                               const size_t *rdispls, shoal_dtype_t dtype);
/* Root's recvbuf gets the reduction of every rank's sendbuf (recvbuf is only
 * written on root and may be NULL elsewhere). In place on root: sendbuf == recvbuf. */
shoal_status_t shoal_reduce(shoal_comm_t comm, const void *sendbuf, void *recvbuf, size_t count,
                            shoal_dtype_t dtype, shoal_op_t op, int root);
/* Root's recvbuf gets every rank's sendcount elements, rank r's at r * sendcount.
 * In place on root: sendbuf == recvbuf + root * sendcount elements. */
shoal_status_t shoal_gather(shoal_comm_t comm, const void *sendbuf, void *recvbuf, size_t sendcount,
                            shoal_dtype_t dtype, int root);
/* Rank r's sendcount elements land at recvbuf + displs[r] on root; recvcounts,
 * displs and recvbuf are read on root only (displs NULL packs). */
shoal_status_t shoal_gatherv(shoal_comm_t comm, const void *sendbuf, size_t sendcount, void *recvbuf,
                             const size_t *recvcounts, const size_t *displs, shoal_dtype_t dtype,
                             int root);
/* Block r of root's sendbuf (recvcount elements at r * recvcount) goes to rank r.
 * In place on root: recvbuf == sendbuf + root * recvcount elements. */
shoal_status_t shoal_scatter(shoal_comm_t comm, const void *sendbuf, void *recvbuf, size_t recvcount,
                             shoal_dtype_t dtype, int root);
/* sendcounts[r] elements at displs[r] of root's sendbuf go to rank r (read on root only). */
shoal_status_t shoal_scatterv(shoal_comm_t comm, const void *sendbuf, const size_t *sendcounts,
                              const size_t *displs, void *recvbuf, size_t recvcount,
                              shoal_dtype_t dtype, int root);

/* Point-to-point with tags 0..SHOAL_TAG_MAX, within the communicator's
 * deadline. Not collective: only the two ranks call. A send returns once its
 * receive has the data (both sides fail if count or dtype differ), so two
 * ranks that exchange must post both directions in one shoal_sendrecv_many.
 * Messages between two ranks with one tag arrive in the order sent.
 * A call this rank refuses (a bad peer, tag, count, dtype or buffer) fails the
 * communicator, so its peer fails at once (SHOAL_ERR_REMOTE with the reason)
 * rather than at its deadline; create a new communicator after it. */
#define SHOAL_TAG_MAX ((1 << 25) - 1)
shoal_status_t shoal_send(shoal_comm_t comm, const void *buf, size_t count, shoal_dtype_t dtype,
                          int peer, int tag);
shoal_status_t shoal_recv(shoal_comm_t comm, void *buf, size_t count, shoal_dtype_t dtype,
                          int peer, int tag);
typedef enum { SHOAL_P2P_SEND = 0, SHOAL_P2P_RECV = 1 } shoal_p2p_kind_t;
typedef struct {
  shoal_p2p_kind_t kind;
  int peer;
  int tag;
  void *buf; /* read by a send, written by a receive */
  size_t count;
  shoal_dtype_t dtype;
} shoal_p2p_t;
/* Posts all n operations at once and completes them all (pipeline stages,
 * halo exchanges): no order among them can deadlock. */
shoal_status_t shoal_sendrecv_many(shoal_comm_t comm, const shoal_p2p_t *ops, int n);

/* ---- allreduce with options: compression, names ------------------------- */

/* Per-call options; start from SHOAL_ALLREDUCE_OPTIONS_INIT. */
typedef struct shoal_allreduce_options {
  size_t struct_size;
  const char *name;              /* names the tensor: keys compressor state (error feedback, warm
                                    starts). NULL = unnamed: a stateful compressor then keys the
                                    state by output buffer, dtype and shape (docs/reliability-agreement.md) */
  const char *compressor;        /* NULL = SHOAL_COMPRESSOR (default "none"); "none" = uncompressed */
  const char *compressor_options;/* "k=v,..."; NULL = SHOAL_COMPRESSOR_OPTS if the compressor is
                                    SHOAL_COMPRESSOR's, else none */
  long long compress_min_bytes;  /* smaller tensors go uncompressed; < 0 = SHOAL_COMPRESS_MIN_BYTES */
} shoal_allreduce_options_t;

#define SHOAL_ALLREDUCE_OPTIONS_INIT {sizeof(shoal_allreduce_options_t), NULL, NULL, NULL, -1}

/* Allreduce of a tensor with SHOAL_SUM or SHOAL_AVG (other ops never compress),
 * through the selected compressor. output may equal input (in place).
 * Host or CUDA memory (see "collectives on tensors" below); compressing CUDA
 * tensors needs a compressor with SHOAL_CAP_CUDA (never staged through host).
 * shoal_allreduce() is this call with a 1-D unnamed tensor and default options. */
shoal_status_t shoal_allreduce_tensor(shoal_comm_t comm, const shoal_tensor_t *input, const shoal_tensor_t *output,
                                      shoal_op_t op, const shoal_allreduce_options_t *options);

/* ---- collectives on tensors: host or CUDA memory ------------------------- */
/* Tensors may live in host or CUDA memory (a CUDA-enabled build with NCCL):
 * CUDA tensors travel over NCCL, ordered on the input tensor's stream, and the
 * call returns once the work is complete. Every tensor of a call has the same
 * memory kind and device, and every rank makes the call with the same kind;
 * otherwise (or with no usable device, or in a build without CUDA) the call
 * fails on every rank with the reason: SHOAL_ERR_INVALID_ARGUMENT for bad
 * arguments, SHOAL_ERR_UNSUPPORTED where this build or machine cannot. */

/* output holds world_size x input's elements, rank r's at r x count. */
shoal_status_t shoal_allgather_tensor(shoal_comm_t comm, const shoal_tensor_t *input, const shoal_tensor_t *output);
/* In place: root's tensor is copied into every rank's tensor. */
shoal_status_t shoal_broadcast_tensor(shoal_comm_t comm, const shoal_tensor_t *tensor, int root);
/* input holds world_size x output's elements; rank r's output gets the
 * reduction of block r (shoal_reduce_scatter's meaning). In place: output's
 * data is input's data + rank x output's elements. CUDA tensors take
 * ncclReduceScatter: sum, avg, prod, min, max (NCCL has no bitwise reduction). */
shoal_status_t shoal_reduce_scatter_tensor(shoal_comm_t comm, const shoal_tensor_t *input,
                                           const shoal_tensor_t *output, shoal_op_t op);

/* Tensor forms of alltoall(v), reduce, gather(v), scatter(v) and grouped
 * point-to-point (docs/collectives.md): the raw-pointer calls' meaning, counts
 * in elements, the tensors' dtype for all. CUDA tensors travel over NCCL
 * (ncclReduce; grouped ncclSend/ncclRecv for the others). A tensor that only
 * root reads or writes (reduce/gather output, scatter input) may be NULL on
 * other ranks. The per-rank counts of the v forms must agree between every
 * pair of ranks: SHOAL_ERR_MISMATCH on every rank otherwise. */
/* input holds world_size blocks of input elements / world_size; output as many. */
shoal_status_t shoal_alltoall_tensor(shoal_comm_t comm, const shoal_tensor_t *input, const shoal_tensor_t *output);
shoal_status_t shoal_alltoallv_tensor(shoal_comm_t comm, const shoal_tensor_t *input, const size_t *sendcounts,
                                      const size_t *sdispls, const shoal_tensor_t *output,
                                      const size_t *recvcounts, const size_t *rdispls);
/* CUDA tensors: sum, avg, prod, min, max (NCCL has no bitwise reduction). */
shoal_status_t shoal_reduce_tensor(shoal_comm_t comm, const shoal_tensor_t *input, const shoal_tensor_t *output,
                                   shoal_op_t op, int root);
/* Root's output holds world_size x input's elements. */
shoal_status_t shoal_gather_tensor(shoal_comm_t comm, const shoal_tensor_t *input, const shoal_tensor_t *output,
                                   int root);
shoal_status_t shoal_gatherv_tensor(shoal_comm_t comm, const shoal_tensor_t *input, const shoal_tensor_t *output,
                                    const size_t *recvcounts, const size_t *displs, int root);
/* Root's input holds world_size x output's elements. */
shoal_status_t shoal_scatter_tensor(shoal_comm_t comm, const shoal_tensor_t *input, const shoal_tensor_t *output,
                                    int root);
shoal_status_t shoal_scatterv_tensor(shoal_comm_t comm, const shoal_tensor_t *input, const size_t *sendcounts,
                                     const size_t *displs, const shoal_tensor_t *output, int root);
/* shoal_sendrecv_many with tensors: all of one memory kind per call, and a
 * send and its receive of one kind (MISMATCH on both sides otherwise). CUDA
 * tensors use a two-rank NCCL communicator per peer, made by both on their
 * first CUDA exchange. A call this rank refuses (no CUDA build or device, a
 * host pointer, a bad argument, as for shoal_send) fails the communicator,
 * so its peers fail at once rather than at their deadline. */
typedef struct {
  shoal_p2p_kind_t kind;
  int peer;
  int tag;
  shoal_tensor_t tensor; /* read by a send, written by a receive */
} shoal_p2p_tensor_t;
shoal_status_t shoal_sendrecv_many_tensor(shoal_comm_t comm, const shoal_p2p_tensor_t *ops, int n);

/* What the last compressed call on comm did (for benchmarks and logs). */
typedef struct shoal_compress_stats {
  size_t struct_size;
  const char *compressor;        /* the compressor that ran ("none" if the call went uncompressed) */
  uint64_t input_bytes;          /* this rank's uncompressed bytes */
  uint64_t payload_bytes;        /* bytes of every payload this rank handed to collectives */
  uint64_t wire_bytes;           /* bytes this rank sent for the call (transport, NCCL, its shared-memory slots) */
  int rounds;                    /* collective rounds the compressor asked for */
} shoal_compress_stats_t;

#define SHOAL_COMPRESS_STATS_INIT {sizeof(shoal_compress_stats_t), NULL, 0, 0, 0, 0}

shoal_status_t shoal_last_compress_stats(shoal_comm_t comm, shoal_compress_stats_t *stats);

/* A named tensor's compressor state (e.g. the error-feedback residual), as the
 * compressor's save_tensor_state() lays it out (see its documentation), for
 * checkpoints and tests. buffer == NULL: *bytes gets the size needed.
 * SHOAL_ERR_NOT_FOUND when the compressor holds no state for that name. */
shoal_status_t shoal_compressor_state_save(shoal_comm_t comm, const char *compressor, const char *compressor_options,
                                           const char *name, void *buffer, size_t *bytes);
shoal_status_t shoal_compressor_state_load(shoal_comm_t comm, const char *compressor, const char *compressor_options,
                                           const char *name, const void *buffer, size_t bytes);

/* Writes one line per available compressor ("name  description  options") into
 * out; includes plugins found on SHOAL_PLUGIN_PATH. */
shoal_status_t shoal_compressors_print(FILE *out);

/* ---- helpers ------------------------------------------------------------ */

size_t shoal_dtype_size(shoal_dtype_t dtype);      /* 0 for an invalid dtype */
const char *shoal_dtype_name(shoal_dtype_t dtype); /* "float", "half", ...; "invalid" */
const char *shoal_op_name(shoal_op_t op);          /* "sum", ...; "invalid" */
/* Parse names as shoal-bench and nccl-tests spell them ("float", "f32", "half", "sum", ...). */
shoal_status_t shoal_dtype_from_name(const char *name, shoal_dtype_t *dtype);
shoal_status_t shoal_op_from_name(const char *name, shoal_op_t *op);

/* The loaded library's SHOAL_VERSION_CODE (it may differ from the header's). */
shoal_status_t shoal_get_version(int *version);
/* 1 when the loaded library was built with feature, else 0 (also for an
 * unknown name or NULL): "cuda" (CUDA tensors and kernels), "nccl" (the NCCL
 * transport CUDA tensors travel over). Bindings ask it (Horovod's cuda_built). */
int shoal_built_with(const char *feature);
/* sizeof a public struct by its typedef name ("shoal_tensor_t", "shoal_config_t",
 * "shoal_allreduce_options_t", ...), for bindings that mirror them; 0 for an unknown name. */
size_t shoal_struct_size(const char *name);

/* Prints every SHOAL_* variable with its default, current value and help.
 * markdown != 0 prints a Markdown table (the README's table is made this way). */
shoal_status_t shoal_config_print(FILE *out, int markdown);

/* ==== async runtime: named, negotiated, fused collectives ================
 *
 * Horovod-style (docs/runtime.md). Submitting only enqueues a request; one
 * background thread per communicator owns all communication. Each cycle
 * (SHOAL_CYCLE_TIME_MS) the ranks agree which NAMED tensors every rank has
 * submitted, in one order (ranks may submit in different orders), fuse ready
 * allreduces with the same dtype/op/compressor up to SHOAL_FUSION_THRESHOLD
 * bytes, run them, and complete the requests.
 *
 *  - Names identify a tensor across ranks; every rank must submit a name with
 *    the same collective, dtype, shape, op, root and compressor, else every
 *    rank's request for it fails with SHOAL_ERR_MISMATCH naming what differs.
 *    A name still in flight on this rank cannot be submitted again
 *    (SHOAL_ERR_INVALID_ARGUMENT).
 *  - The caller keeps input and output memory valid and untouched until the
 *    request completes (also after a shoal_wait that timed out).
 *  - The first async call on a communicator (or shoal_async_start) starts the
 *    runtime: a collective step, so every rank must make it after the same
 *    blocking calls. From then on blocking calls (shoal_allreduce, ...) are
 *    handed to the runtime and negotiated too, so they may be mixed with
 *    async requests; make them from one thread at a time.
 *  - A dead rank, a failed collective or SHOAL_STALL_SHUTDOWN_S turns every
 *    pending and later request into an error with text, never a hang.
 *  - shoal_comm_finalize/destroy stop the runtime on every rank: requests
 *    still pending anywhere fail.
 */

typedef struct shoal_request *shoal_request_t;

/* Per-call options of shoal_iallreduce; start from SHOAL_ASYNC_OPTIONS_INIT.
 * Averaging: pass op = SHOAL_AVG. */
typedef struct shoal_async_options {
  size_t struct_size;
  const char *compressor;         /* NULL = SHOAL_COMPRESSOR; "none" = uncompressed */
  const char *compressor_options; /* "k=v,..."; NULL = SHOAL_COMPRESSOR_OPTS if the compressor is
                                     SHOAL_COMPRESSOR's, else none */
  long long compress_min_bytes;   /* smaller tensors go uncompressed; < 0 = SHOAL_COMPRESS_MIN_BYTES */
} shoal_async_options_t;

#define SHOAL_ASYNC_OPTIONS_INIT {sizeof(shoal_async_options_t), NULL, NULL, -1}

/* Starts the runtime now (optional: the first async call does it). Collective. */
shoal_status_t shoal_async_start(shoal_comm_t comm);

/* Allreduce of a named tensor (output may equal input). Any op valid for
 * the dtype; only SHOAL_SUM/SHOAL_AVG of dtypes the compressor takes compress.
 * shoal_iallreduce, shoal_iallgather, shoal_ibroadcast and shoal_ialltoall take host tensors,
 * and in a CUDA build CUDA tensors too: never fused, run one by one over NCCL
 * on the input tensor's stream, complete (on the device) when the request is;
 * the stream rules are in docs/gpu.md. A build without CUDA refuses them
 * (SHOAL_ERR_UNSUPPORTED). */
shoal_status_t shoal_iallreduce(shoal_comm_t comm, const char *name, const shoal_tensor_t *input,
                                const shoal_tensor_t *output, shoal_op_t op, const shoal_async_options_t *options,
                                shoal_request_t *request);
/* Every rank's input (same dtype and shape on every rank) into output, which
 * holds world_size x the input's elements, rank r's at r x count. */
shoal_status_t shoal_iallgather(shoal_comm_t comm, const char *name, const shoal_tensor_t *input, void *output,
                                shoal_request_t *request);
/* Root's tensor->data is copied into every rank's tensor->data. */
shoal_status_t shoal_ibroadcast(shoal_comm_t comm, const char *name, const shoal_tensor_t *tensor, int root,
                                shoal_request_t *request);
/* Reduce-scatter of a named tensor (Horovod's reducescatter, run by the
 * runtime in order with the other requests; not fused): input, of the same
 * dtype and shape on every rank, is reduced with op (any op valid for the
 * dtype; SHOAL_AVG divides by the world size) and rank r's output gets its
 * share of input's first dimension: rows / world_size rows, one more on the
 * first rows % world_size ranks, rank r's starting at row
 * r * (rows / world_size) + min(r, rows % world_size). output holds exactly
 * that share's elements (any shape); input is not modified. The even form of
 * shoal_reduce_scatter is the case rows % world_size == 0. Ranks that have
 * joined (shoal_join) cannot stand in for it: SHOAL_ERR_UNSUPPORTED on its
 * submitters. CUDA input and output (a CUDA build; both on one device) run
 * over NCCL on the input's stream, complete when the request is; a build
 * without CUDA refuses them (SHOAL_ERR_UNSUPPORTED). */
shoal_status_t shoal_ireduce_scatter(shoal_comm_t comm, const char *name, const shoal_tensor_t *input,
                                     const shoal_tensor_t *output, shoal_op_t op, shoal_request_t *request);

/* Alltoall of a named host tensor (Horovod's alltoall, run by the runtime in
 * order with the other requests): sendcounts[p] elements of input, in order,
 * go to rank p; sendcounts == NULL splits input evenly (its element count a
 * multiple of the world size; then every rank must pass the same shape).
 * CUDA input (a CUDA build): the result is device memory on its device.
 * What arrives is held by the request until shoal_request_free:
 * shoal_request_alltoall_result gives it. Every rank must submit the name
 * with the same dtype and both with or both without sendcounts. */
shoal_status_t shoal_ialltoall(shoal_comm_t comm, const char *name, const shoal_tensor_t *input,
                               const size_t *sendcounts, shoal_request_t *request);
/* A completed alltoall request's result: *data and *count the received
 * elements (rank 0's first, in rank order); recvcounts (world_size entries,
 * may be NULL) how many came from each rank. */
shoal_status_t shoal_request_alltoall_result(shoal_request_t request, const void **data, size_t *count,
                                             size_t *recvcounts);
/* Copies a completed alltoall request's result (all of it, as
 * shoal_request_alltoall_result gives it) into dst, which holds capacity
 * bytes (at least the result's). For a CUDA result dst is any memory CUDA
 * addresses (device or host); the copy is ordered on the input's stream and
 * complete on return. Lets a binding fill its own tensor without CUDA. */
shoal_status_t shoal_request_alltoall_copy(shoal_request_t request, void *dst, size_t capacity);

/* *done = 1 once the request completed; then returns its status (its text:
 * shoal_request_error). While pending: *done = 0 and SHOAL_OK. */
shoal_status_t shoal_test(shoal_request_t request, int *done);
/* Waits until the request completes or timeout_s passes (<= 0 or INFINITY:
 * the communicator's SHOAL_TIMEOUT_S, since every wait has a deadline; NaN is
 * SHOAL_ERR_INVALID_ARGUMENT); returns its status, or SHOAL_ERR_TIMEOUT with
 * the request still pending. */
shoal_status_t shoal_wait(shoal_request_t request, double timeout_s);
/* Waits for all count requests within one deadline; returns SHOAL_OK or the
 * first failing request's status (shoal_last_error(NULL) names it). */
shoal_status_t shoal_wait_all(shoal_request_t *requests, int count, double timeout_s);
/* The text of a failed request; "" while pending or after success. */
const char *shoal_request_error(shoal_request_t request);
/* Frees a completed request (SHOAL_ERR_INVALID_ARGUMENT while pending). NULL is accepted. */
shoal_status_t shoal_request_free(shoal_request_t request);

/* What the runtime did so far (benchmarks, tests). */
typedef struct shoal_async_stats {
  size_t struct_size;
  uint64_t cycles;            /* negotiation cycles (each one small bitwise allreduce) */
  uint64_t full_rounds;       /* cycles that also allgathered request metadata (uncached names, stall probes) */
  uint64_t cache_hits;        /* requests made ready by the response cache's bits alone */
  uint64_t tensors;           /* requests that ran */
  uint64_t groups;            /* collectives (or compressor operations) they ran in; fused groups count once */
  double negotiation_us;      /* time spent negotiating, summed over cycles */
} shoal_async_stats_t;

#define SHOAL_ASYNC_STATS_INIT {sizeof(shoal_async_stats_t), 0, 0, 0, 0, 0, 0.0}

shoal_status_t shoal_async_stats(shoal_comm_t comm, shoal_async_stats_t *stats);

/* Horovod's join, for uneven data: a rank that ran out of batches calls it and
 * blocks while its runtime keeps taking part in the other ranks' named
 * allreduces with zeros (sum and average only; average divides by the world
 * size), until every rank has joined. *last_rank (may be NULL) is the rank that
 * joined last. Allgather, broadcast, alltoall, reduce-scatter, other ops and
 * blocking calls submitted while some rank has joined fail on their submitters
 * (SHOAL_ERR_UNSUPPORTED), and the joined ranks' shoal_join returns the same
 * error once all joined.
 * timeout_s as in shoal_wait; on SHOAL_ERR_TIMEOUT this rank stays joined and
 * a later shoal_join keeps waiting. Starts the async runtime if needed. */
shoal_status_t shoal_join(shoal_comm_t comm, double timeout_s, int *last_rank);

#ifdef __cplusplus
}
#endif
#endif /* SHOAL_SHOAL_H */
