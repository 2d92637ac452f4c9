/* shoal — status codes. Every shoal call returns one of these; 0 is success,
 * negative values are errors. shoal_status_string() names the code;
 * shoal_last_error() (shoal.h) carries the text that says what to fix. */
#ifndef SHOAL_STATUS_H
#define SHOAL_STATUS_H

#ifdef __cplusplus
extern "C" {
#endif

typedef enum shoal_status {
  SHOAL_OK = 0,
  SHOAL_ERR_INVALID_ARGUMENT = -1, /* a bad pointer, size, dtype/op pair, root, or a finalized communicator */
  SHOAL_ERR_TIMEOUT = -2,          /* a wait passed SHOAL_TIMEOUT_S */
  SHOAL_ERR_REMOTE = -3,           /* a peer died, vanished or aborted the communicator */
  SHOAL_ERR_MISMATCH = -4,         /* ranks called the same collective with different arguments */
  SHOAL_ERR_SYSTEM = -5,           /* the OS or the transport library failed */
  SHOAL_ERR_NOT_FOUND = -6,        /* an unknown name (compressor, algorithm, store scheme) */
  SHOAL_ERR_UNSUPPORTED = -7,      /* valid, but not available in this build or on this memory kind */
  SHOAL_ERR_NO_MEMORY = -8,
  SHOAL_ERR_INTERNAL = -9          /* a bug in shoal: please report it with the text */
} shoal_status_t;

/* Static text naming the code, e.g. "SHOAL_ERR_TIMEOUT: a wait passed its deadline". Never NULL. */
const char *shoal_status_string(shoal_status_t status);

#ifdef __cplusplus
}
#endif
#endif /* SHOAL_STATUS_H */
