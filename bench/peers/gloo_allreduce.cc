// Allreduce sweep on Gloo (Debian libgloo-dev), for comparison with shoal.
//
// One process per rank; rendezvous through a FileStore directory, TCP
// transport bound to --host (127.0.0.1 by default). Example, 2 ranks:
//   d=$(mktemp -d)
//   gloo_allreduce --rank 0 --size 2 --store-dir $d -b 4K -e 256M -f 4 &
//   gloo_allreduce --rank 1 --size 2 --store-dir $d -b 4K -e 256M -f 4
// The store directory must be fresh for every job (keys are never removed).
//
// --algo selects the implementation:
//   ring, ring_chunked, halving_doubling, bcube  old class-based API
//                                                (in place, one object per size)
//   new_ring, new_bcube                          gloo::allreduce(AllreduceOptions)
//                                                (out of place unless --inplace)
// Timing and output conventions are described in peer_common.h.
//
// Loopback caveat: this Gloo sets TCP_NODELAY on its pair sockets but not
// TCP_QUICKACK, and offers no option for it. Occasional ~40 ms delayed-ACK
// stalls are therefore possible, e.g. ring_chunked at 16 KiB with 2 ranks:
// p50 0.37 ms, p90 44 ms. Use -p to see the per-iteration spread.
#include <sys/socket.h>

#include <climits>

#include <memory>
#include <stdexcept>

#include <gloo/allreduce.h>
#include <gloo/allreduce_bcube.h>
#include <gloo/allreduce_halving_doubling.h>
#include <gloo/allreduce_ring.h>
#include <gloo/allreduce_ring_chunked.h>
#include <gloo/barrier.h>
#include <gloo/rendezvous/context.h>
#include <gloo/rendezvous/file_store.h>
#include <gloo/transport/tcp/device.h>

#include "peer_common.h"

namespace {

using Ctx = std::shared_ptr<gloo::Context>;

// Page-aligned so every implementation starts from the same alignment.
struct FloatBuf {
  float* p = nullptr;
  explicit FloatBuf(size_t count) {
    if (posix_memalign(reinterpret_cast<void**>(&p), 4096,
                       count * sizeof(float) + 1) != 0) {
      throw std::runtime_error("out of memory");
    }
    std::memset(p, 0, count * sizeof(float));  // fault the pages in now
  }
  ~FloatBuf() { std::free(p); }
  FloatBuf(const FloatBuf&) = delete;
  FloatBuf& operator=(const FloatBuf&) = delete;
};

void barrier(const Ctx& ctx) {
  gloo::BarrierOptions opts(ctx);
  gloo::barrier(opts);
}

// Reduces one double across ranks with the new API (used for timings and
// error counts, outside the timed region).
double allreduce_scalar(const Ctx& ctx, double v, bool take_max) {
  gloo::AllreduceOptions opts(ctx);
  opts.setOutput(&v, 1);
  if (take_max) {
    opts.setReduceFunction([](void* c, const void* a, const void* b, size_t n) {
      auto* cc = static_cast<double*>(c);
      auto* aa = static_cast<const double*>(a);
      auto* bb = static_cast<const double*>(b);
      for (size_t i = 0; i < n; ++i) cc[i] = aa[i] > bb[i] ? aa[i] : bb[i];
    });
  } else {
    opts.setReduceFunction([](void* c, const void* a, const void* b, size_t n) {
      auto* cc = static_cast<double*>(c);
      auto* aa = static_cast<const double*>(a);
      auto* bb = static_cast<const double*>(b);
      for (size_t i = 0; i < n; ++i) cc[i] = aa[i] + bb[i];
    });
  }
  opts.setTag(0x5e7);  // distinct from the benchmarked collective's tag
  gloo::allreduce(opts);
  return v;
}

// A ready-to-run allreduce of one size; hides old API vs new API.
class Runner {
 public:
  virtual ~Runner() = default;
  virtual void run() = 0;
  // Buffer that holds the input before run().
  virtual float* input() = 0;
  // Buffer that holds the result after run().
  virtual float* output() = 0;
};

// Old API: the algorithm object owns its scratch buffers and pairs' slots,
// so it is built once per size and run repeatedly, as Gloo intends.
template <typename Algo>
class OldApiRunner : public Runner {
 public:
  OldApiRunner(const Ctx& ctx, size_t count) : buf_(count) {
    std::vector<float*> ptrs{buf_.p};
    algo_ = std::make_unique<Algo>(ctx, ptrs, static_cast<int>(count));
  }
  void run() override { algo_->run(); }
  float* input() override { return buf_.p; }
  float* output() override { return buf_.p; }

 private:
  FloatBuf buf_;
  std::unique_ptr<Algo> algo_;
};

// New API: options (with their unbound buffers) are built once per size and
// reused; only one collective is in flight, so a fixed tag is fine.
class NewApiRunner : public Runner {
 public:
  NewApiRunner(const Ctx& ctx, size_t count,
               gloo::AllreduceOptions::Algorithm algorithm, bool inplace)
      : out_(count), opts_(ctx) {
    if (!inplace) {
      in_ = std::make_unique<FloatBuf>(count);
      opts_.setInput(in_->p, count);
    }
    opts_.setOutput(out_.p, count);
    opts_.setAlgorithm(algorithm);
    opts_.setReduceFunction(
        static_cast<void (*)(void*, const void*, const void*, size_t)>(
            &gloo::sum<float>));
    opts_.setTag(1);
  }
  void run() override { gloo::allreduce(opts_); }
  float* input() override { return in_ ? in_->p : out_.p; }
  float* output() override { return out_.p; }

 private:
  std::unique_ptr<FloatBuf> in_;
  FloatBuf out_;
  gloo::AllreduceOptions opts_;
};

std::unique_ptr<Runner> make_runner(const std::string& algo, const Ctx& ctx,
                                    size_t count, bool inplace) {
  using A = gloo::AllreduceOptions::Algorithm;
  if (algo == "ring")
    return std::make_unique<OldApiRunner<gloo::AllreduceRing<float>>>(ctx, count);
  if (algo == "ring_chunked")
    return std::make_unique<OldApiRunner<gloo::AllreduceRingChunked<float>>>(ctx, count);
  if (algo == "halving_doubling")
    return std::make_unique<OldApiRunner<gloo::AllreduceHalvingDoubling<float>>>(ctx, count);
  if (algo == "bcube")
    return std::make_unique<OldApiRunner<gloo::AllreduceBcube<float>>>(ctx, count);
  if (algo == "new_ring")
    return std::make_unique<NewApiRunner>(ctx, count, A::RING, inplace);
  if (algo == "new_bcube")
    return std::make_unique<NewApiRunner>(ctx, count, A::BCUBE, inplace);
  return nullptr;
}

bool is_old_api(const std::string& algo) {
  return algo.rfind("new_", 0) != 0;
}

}  // namespace

int main(int argc, char** argv) {
  peers::Options o;
  if (!peers::parse_args(argc, argv, &o, /*gloo=*/true)) return 2;
  const char* known[] = {"ring", "ring_chunked", "halving_doubling", "bcube",
                         "new_ring", "new_bcube"};
  bool ok = false;
  for (const char* k : known) ok = ok || o.algo == k;
  if (!ok) {
    std::fprintf(stderr, "%s: unknown --algo '%s'\n", argv[0], o.algo.c_str());
    return 2;
  }

  try {
    gloo::transport::tcp::attr attr;
    attr.hostname = o.host;
    attr.ai_family = AF_INET;  // "localhost" may resolve to ::1 first
    auto dev = gloo::transport::tcp::CreateDevice(attr);

    gloo::rendezvous::FileStore store(o.store_dir);
    auto rctx = std::make_shared<gloo::rendezvous::Context>(o.rank, o.size);
    // Large sizes on an oversubscribed box can exceed Gloo's 30 s default.
    rctx->setTimeout(std::chrono::seconds(o.timeout_s));
    rctx->connectFullMesh(store, dev);
    Ctx ctx = rctx;

    const bool inplace = is_old_api(o.algo) || o.inplace;
    if (o.rank == 0) {
      std::string what = "gloo " + o.algo;
      peers::print_header(what.c_str(), o.size, o,
                          inplace ? "in-place" : "out-of-place");
    }

    int64_t total_wrong = 0;
    for (size_t bytes : peers::sweep_sizes(o)) {
      const size_t count = bytes / sizeof(float);
      if (is_old_api(o.algo) && count > static_cast<size_t>(INT_MAX)) {
        if (o.rank == 0) std::printf("# stopping: old API counts are int\n");
        break;
      }
      auto runner = make_runner(o.algo, ctx, count, o.inplace);

      // Inputs for the timed loop. In place, the values grow by a factor of
      // n per iteration (possibly to inf); float add speed does not depend
      // on that, and correctness is checked separately below.
      peers::fill_input(runner->input(), count, o.rank);
      for (int i = 0; i < o.warmup; ++i) runner->run();

      std::vector<double> per_iter;
      barrier(ctx);
      const double mean_us = peers::time_loop(
          o.iters, [&] { runner->run(); }, o.percentiles ? &per_iter : nullptr);
      const double time_us = allreduce_scalar(ctx, mean_us, /*take_max=*/true);

      int64_t wrong = -1;
      if (o.check) {
        peers::fill_input(runner->input(), count, o.rank);
        barrier(ctx);
        runner->run();
        const double local = static_cast<double>(
            peers::count_wrong(runner->output(), count, o.size));
        wrong = static_cast<int64_t>(allreduce_scalar(ctx, local, false));
        total_wrong += wrong;
      }
      if (o.rank == 0) {
        if (o.percentiles) peers::print_percentiles(bytes, per_iter);
        peers::print_row(bytes, o.size, time_us, wrong);
      }
      runner.reset();
      barrier(ctx);  // keep ranks in step between sizes
    }
    if (o.rank == 0) {
      std::printf("# Out of bounds values : %" PRId64 " %s\n", total_wrong,
                  total_wrong == 0 ? "OK" : "FAILED");
    }
    return total_wrong == 0 ? 0 : 1;
  } catch (const std::exception& e) {
    std::fprintf(stderr, "gloo_allreduce rank %d: %s\n", o.rank, e.what());
    return 3;
  }
}
