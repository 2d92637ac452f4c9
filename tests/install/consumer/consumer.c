/* Consumer of the installed shoal: uses only <shoal/shoal.h> and libshoal.
 * Exits non-zero, printing shoal_last_error, on any failure. */
#include <shoal/shoal.h>

#include <stdio.h>
#include <string.h>

#define COUNT 16

static int failures = 0;

#define CHECK(cond, ...)                                    \
  do {                                                      \
    if (!(cond)) {                                          \
      fprintf(stderr, "consumer: %s:%d: check failed: %s: ", \
              __FILE__, __LINE__, #cond);                   \
      fprintf(stderr, __VA_ARGS__);                         \
      fprintf(stderr, "\n");                                \
      ++failures;                                           \
    }                                                       \
  } while (0)

/* A shoal call that must succeed; on failure print the code and the text. */
#define CHECK_OK(comm, call)                                              \
  do {                                                                    \
    shoal_status_t st_ = (call);                                          \
    CHECK(st_ == SHOAL_OK, "%s returned %d (%s): %s", #call, (int)st_,    \
          shoal_status_string(st_), shoal_last_error(comm));              \
  } while (0)

int main(void) {
  /* Helpers that need no communicator. */
  const char *ok = shoal_status_string(SHOAL_OK);
  CHECK(ok != NULL && ok[0] != '\0', "shoal_status_string(SHOAL_OK) is empty");
  const char *timeout = shoal_status_string(SHOAL_ERR_TIMEOUT);
  CHECK(timeout != NULL && strstr(timeout, "TIMEOUT") != NULL,
        "shoal_status_string(SHOAL_ERR_TIMEOUT) = \"%s\"", timeout ? timeout : "(null)");
  CHECK(shoal_dtype_size(SHOAL_F32) == 4, "shoal_dtype_size(SHOAL_F32) = %zu",
        shoal_dtype_size(SHOAL_F32));
  CHECK(shoal_dtype_size(SHOAL_F64) == 8, "shoal_dtype_size(SHOAL_F64) = %zu",
        shoal_dtype_size(SHOAL_F64));
  const char *name = shoal_dtype_name(SHOAL_F32);
  CHECK(name != NULL && strcmp(name, "float") == 0, "shoal_dtype_name(SHOAL_F32) = \"%s\"",
        name ? name : "(null)");

  /* A one-rank communicator over an in-process store. */
  shoal_config_t cfg = SHOAL_CONFIG_INIT;
  cfg.rank = 0;
  cfg.world_size = 1;
  cfg.store = "memory://consumer";
  shoal_comm_t comm = NULL;
  shoal_status_t st = shoal_comm_init_config(&cfg, &comm);
  if (st != SHOAL_OK || comm == NULL) {
    fprintf(stderr, "consumer: shoal_comm_init_config returned %d (%s): %s\n", (int)st,
            shoal_status_string(st), shoal_last_error(NULL));
    return 1;
  }

  int rank = -1, size = -1;
  CHECK_OK(comm, shoal_comm_rank(comm, &rank));
  CHECK_OK(comm, shoal_comm_size(comm, &size));
  CHECK(rank == 0 && size == 1, "rank %d size %d, expected 0 and 1", rank, size);

  /* Sum over one rank is the identity, out of place and in place. */
  float send[COUNT], recv[COUNT], inplace[COUNT];
  for (int i = 0; i < COUNT; ++i) {
    send[i] = 0.5f * (float)i - 3.0f;
    recv[i] = -1234.0f;
    inplace[i] = send[i];
  }
  CHECK_OK(comm, shoal_allreduce(comm, send, recv, COUNT, SHOAL_F32, SHOAL_SUM));
  CHECK_OK(comm, shoal_allreduce(comm, inplace, inplace, COUNT, SHOAL_F32, SHOAL_SUM));
  /* Report only the first wrong element of each buffer. */
  for (int i = 0; i < COUNT; ++i) {
    if (recv[i] != send[i]) {
      CHECK(recv[i] == send[i], "allreduce out of place: [%d] = %g, expected %g", i,
            (double)recv[i], (double)send[i]);
      break;
    }
  }
  for (int i = 0; i < COUNT; ++i) {
    if (inplace[i] != send[i]) {
      CHECK(inplace[i] == send[i], "allreduce in place: [%d] = %g, expected %g", i,
            (double)inplace[i], (double)send[i]);
      break;
    }
  }

  /* comm is gone after destroy: report its error through the thread's text. */
  st = shoal_comm_destroy(comm);
  CHECK(st == SHOAL_OK, "shoal_comm_destroy returned %d (%s): %s", (int)st,
        shoal_status_string(st), shoal_last_error(NULL));

  if (failures != 0) {
    fprintf(stderr, "consumer: %d check(s) failed\n", failures);
    return 1;
  }
  printf("consumer: OK\n");
  return 0;
}
