// Allreduce sweep on MPI_Allreduce (MPI_FLOAT, MPI_SUM), for comparison with
// shoal. Launch with mpirun, e.g.
//   mpirun --allow-run-as-root --oversubscribe -np 4 mpi_allreduce -b 4K -e 256M -f 4
//   mpirun ... --mca pml ob1 --mca btl tcp,self -np 4 mpi_allreduce ...
// Out of place by default (MPI_IN_PLACE with --inplace). Timing and output
// conventions are described in peer_common.h.
// Skip the deprecated C++ bindings (they only add warnings).
#define OMPI_SKIP_MPICXX 1
#define MPICH_SKIP_MPICXX 1
#include <mpi.h>

#include <cinttypes>

#include "peer_common.h"

namespace {

float* alloc_floats(size_t count) {
  void* p = nullptr;
  // Page-aligned, like the Gloo peer; +1 so count 0 still allocates.
  if (posix_memalign(&p, 4096, count * sizeof(float) + 1) != 0) return nullptr;
  std::memset(p, 0, count * sizeof(float));  // fault the pages in now
  return static_cast<float*>(p);
}

}  // namespace

int main(int argc, char** argv) {
  MPI_Init(&argc, &argv);
  int rank = 0, nranks = 1;
  MPI_Comm_rank(MPI_COMM_WORLD, &rank);
  MPI_Comm_size(MPI_COMM_WORLD, &nranks);

  peers::Options o;
  if (!peers::parse_args(argc, argv, &o, /*gloo=*/false)) {
    MPI_Finalize();
    return 2;
  }
  if (rank == 0) {
    char lib[MPI_MAX_LIBRARY_VERSION_STRING];
    int len = 0;
    MPI_Get_library_version(lib, &len);
    // First line of the (multi-line) version string is enough.
    std::string first(lib, static_cast<size_t>(len));
    first = first.substr(0, first.find('\n'));
    std::printf("# %s\n", first.c_str());
    peers::print_header("MPI_Allreduce", nranks, o,
                        o.inplace ? "in-place" : "out-of-place");
  }

  int64_t total_wrong = 0;
  int rc = 0;
  for (size_t bytes : peers::sweep_sizes(o)) {
    const size_t count = bytes / sizeof(float);
    if (count > static_cast<size_t>(INT32_MAX)) break;  // MPI counts are int
    const int icount = static_cast<int>(count);
    float* in = o.inplace ? nullptr : alloc_floats(count);
    float* out = alloc_floats(count);
    if (!out || (!o.inplace && !in)) {
      std::fprintf(stderr, "rank %d: out of memory at %zu bytes\n", rank, bytes);
      MPI_Abort(MPI_COMM_WORLD, 3);
    }
    const void* send = o.inplace ? MPI_IN_PLACE : static_cast<const void*>(in);

    // Timed loop inputs; see the in-place note in gloo_allreduce.cc.
    peers::fill_input(o.inplace ? out : in, count, rank);
    for (int i = 0; i < o.warmup; ++i)
      MPI_Allreduce(send, out, icount, MPI_FLOAT, MPI_SUM, MPI_COMM_WORLD);

    std::vector<double> per_iter;
    MPI_Barrier(MPI_COMM_WORLD);
    double mean_us = peers::time_loop(
        o.iters,
        [&] { MPI_Allreduce(send, out, icount, MPI_FLOAT, MPI_SUM, MPI_COMM_WORLD); },
        o.percentiles ? &per_iter : nullptr);
    double time_us = 0;
    MPI_Reduce(&mean_us, &time_us, 1, MPI_DOUBLE, MPI_MAX, 0, MPI_COMM_WORLD);

    int64_t wrong = -1;
    if (o.check) {
      peers::fill_input(o.inplace ? out : in, count, rank);
      MPI_Barrier(MPI_COMM_WORLD);
      MPI_Allreduce(send, out, icount, MPI_FLOAT, MPI_SUM, MPI_COMM_WORLD);
      int64_t local = peers::count_wrong(out, count, nranks);
      wrong = 0;
      MPI_Reduce(&local, &wrong, 1, MPI_INT64_T, MPI_SUM, 0, MPI_COMM_WORLD);
      total_wrong += wrong;
    }
    if (rank == 0) {
      if (o.percentiles) peers::print_percentiles(bytes, per_iter);
      peers::print_row(bytes, nranks, time_us, wrong);
    }
    std::free(in);
    std::free(out);
  }
  if (rank == 0) {
    std::printf("# Out of bounds values : %" PRId64 " %s\n", total_wrong,
                total_wrong == 0 ? "OK" : "FAILED");
    rc = total_wrong == 0 ? 0 : 1;
  }
  MPI_Bcast(&rc, 1, MPI_INT, 0, MPI_COMM_WORLD);
  MPI_Finalize();
  return rc;
}
