// The powersgd built-in compressor (compressors/powersgd), through
// shoal_allreduce_tensor with 2-D tensors: exactness for low-rank sums, error
// feedback conservation, bit-identical Q on every rank, dense routing of 1-D
// and small tensors, zero matrices, start_iter, state save/load, options; and
// the small kernels of powersgd_math.h directly.
#include <algorithm>
#include <barrier>
#include <cmath>
#include <cstring>
#include <string>
#include <vector>

#include <gtest/gtest.h>

#include "compressors/powersgd/powersgd_math.h"
#include "harness/compressor_rounds.h"
#include "harness/dtype_model.h"
#include "harness/harness.h"
#include "shoal/compressor.h"
#include "shoal/shoal.h"

namespace {

using shoal::test::CompressorRounds;
using shoal::test::runRanks;

using shoal::test::mix64;  // splitmix64 (harness/dtype_model.h)

// Uniform in [-1, 1) from (seed, a, b, i).
float uniform(uint64_t seed, uint64_t a, uint64_t b, uint64_t i) {
  uint64_t h = mix64(seed ^ mix64(a * 1000003u ^ mix64(b * 7919u ^ mix64(i))));
  return static_cast<float>(double(h >> 11) * 0x1.0p-52 - 1.0);
}

shoal_tensor_t matrix(float* data, size_t rows, size_t cols) {
  shoal_tensor_t t = shoal_tensor_1d(data, rows * cols, SHOAL_F32);
  t.ndim = 2;
  t.shape[0] = static_cast<int64_t>(rows);
  t.shape[1] = static_cast<int64_t>(cols);
  return t;
}

shoal_status_t reduce(shoal_comm_t comm, const char* name, const char* options, const shoal_tensor_t& in,
                      const shoal_tensor_t& out, shoal_op_t op = SHOAL_AVG) {
  shoal_allreduce_options_t opts = SHOAL_ALLREDUCE_OPTIONS_INIT;
  opts.name = name;
  opts.compressor = "powersgd";
  opts.compressor_options = options;
  opts.compress_min_bytes = 0;
  return shoal_allreduce_tensor(comm, &in, &out, op, &opts);
}

// The saved state (f32 tensors): error[count], Q[cols * r], trailer {count, cols, r, flags, dtype}.
struct Saved {
  std::vector<uint8_t> bytes;
  std::vector<float> error, q;
  uint64_t count = 0, cols = 0, r = 0, flags = 0, dtype = 0;
};

Saved save(shoal_comm_t comm, const char* options, const char* name) {
  Saved s;
  size_t bytes = 0;
  EXPECT_EQ(shoal_compressor_state_save(comm, "powersgd", options, name, nullptr, &bytes), SHOAL_OK)
      << shoal_last_error(comm);
  s.bytes.resize(bytes);
  EXPECT_EQ(shoal_compressor_state_save(comm, "powersgd", options, name, s.bytes.data(), &bytes), SHOAL_OK)
      << shoal_last_error(comm);
  if (bytes < 40) {
    ADD_FAILURE() << "state of " << bytes << " bytes";
    return s;
  }
  uint64_t trailer[5];
  std::memcpy(trailer, s.bytes.data() + bytes - 40, 40);
  s.count = trailer[0], s.cols = trailer[1], s.r = trailer[2], s.flags = trailer[3], s.dtype = trailer[4];
  EXPECT_EQ(s.dtype, static_cast<uint64_t>(SHOAL_F32));
  EXPECT_EQ(bytes, 4 * (s.count + s.cols * s.r) + 40);
  s.error.resize(s.count);
  s.q.resize(s.cols * s.r);
  if (s.count > 0) std::memcpy(s.error.data(), s.bytes.data(), 4 * s.count);
  if (!s.q.empty()) std::memcpy(s.q.data(), s.bytes.data() + 4 * s.count, 4 * s.q.size());
  return s;
}

double maxAbs(const std::vector<double>& v) {
  double m = 0;
  for (double x : v) m = std::max(m, std::fabs(x));
  return m;
}

// ---- powersgd_math.h ---------------------------------------------------------------------

TEST(PowerSgdMath, UniformIsInRangeAndKeyed) {
  using namespace shoal::powersgd;
  for (uint64_t i = 0; i < 10000; ++i) {
    float u = uniformAt(7, 11, 0, i);
    ASSERT_GE(u, -1.0f);
    ASSERT_LT(u, 1.0f);
  }
  EXPECT_EQ(uniformAt(1, 2, 3, 4), uniformAt(1, 2, 3, 4));
  EXPECT_NE(uniformAt(1, 2, 3, 4), uniformAt(2, 2, 3, 4));
  EXPECT_NE(uniformAt(1, 2, 3, 4), uniformAt(1, 2, 4, 4));
}

TEST(PowerSgdMath, GramSchmidtOrthonormalAndZeroGuard) {
  using namespace shoal::powersgd;
  const size_t rows = 50;
  const int r = 4;
  std::vector<float> f(rows * r);
  // Columns: random a, 2a (dependent), zero, random b.
  for (size_t i = 0; i < rows; ++i) {
    f[i * r + 0] = uniform(1, 0, 0, i);
    f[i * r + 1] = 2 * f[i * r + 0];
    f[i * r + 2] = 0;
    f[i * r + 3] = uniform(1, 0, 3, i);
  }
  EXPECT_EQ(orthogonalize(f.data(), rows, r), 2);
  for (float x : f) ASSERT_TRUE(std::isfinite(x));
  for (size_t i = 0; i < rows; ++i) {
    EXPECT_EQ(f[i * r + 1], 0.0f);
    EXPECT_EQ(f[i * r + 2], 0.0f);
  }
  EXPECT_NEAR(columnDot(f.data(), rows, r, 0, 0), 1.0, 1e-6);
  EXPECT_NEAR(columnDot(f.data(), rows, r, 3, 3), 1.0, 1e-6);
  EXPECT_NEAR(columnDot(f.data(), rows, r, 0, 3), 0.0, 1e-6);
  // An all-zero matrix stays zero.
  std::vector<float> z(rows * r, 0.0f);
  EXPECT_EQ(orthogonalize(z.data(), rows, r), 0);
  for (float x : z) ASSERT_EQ(x, 0.0f);
}

TEST(PowerSgdMath, ShouldCompressFollowsPyTorch) {
  using namespace shoal::powersgd;
  EXPECT_TRUE(shouldCompress(64, 48, 4, 2.0));    // 112*4*2 = 896 < 3072
  EXPECT_FALSE(shouldCompress(4, 4, 4, 2.0));     // 64 >= 16
  EXPECT_FALSE(shouldCompress(16, 16, 4, 2.0));   // 256 >= 256
  EXPECT_TRUE(shouldCompress(16, 16, 4, 0.5));
}

// ---- through the collective ----------------------------------------------------------------

// Per-rank gradients whose sum has rank `k`: g_w = sum_j u_wj v_jᵀ with v_j shared.
std::vector<float> lowRankGradient(int rank, int step, size_t rows, size_t cols, int k) {
  std::vector<float> g(rows * cols, 0.0f);
  for (int j = 0; j < k; ++j)
    for (size_t i = 0; i < rows; ++i) {
      float u = uniform(42, 1 + rank, 100 * step + j, i);
      for (size_t c = 0; c < cols; ++c) g[i * cols + c] += u * uniform(43, 7, 100 * step + j, c);
    }
  return g;
}

// The exact sum over ranks, in double.
std::vector<double> exactSum(int n, int step, size_t rows, size_t cols, int k) {
  std::vector<double> sum(rows * cols, 0.0);
  for (int w = 0; w < n; ++w) {
    std::vector<float> g = lowRankGradient(w, step, rows, cols, k);
    for (size_t i = 0; i < g.size(); ++i) sum[i] += g[i];
  }
  return sum;
}

// Rank <= r summed gradients: P = M_sum Q spans M_sum's column space (Q random), so
// P Pᵀ M_sum = M_sum and the result is exact up to rounding, every step, from the
// first on (with error feedback the residuals sum to ~0, so the sum stays rank k).
TEST(PowerSgd, ExactForLowRankSums) {
  const int n = 3;
  const size_t rows = 40, cols = 24;
  for (int k : {1, 2, 4}) {
    for (shoal_op_t op : {SHOAL_AVG, SHOAL_SUM}) {
      runRanks(n, [&](int rank, shoal_comm_t comm) {
        std::string name = "exact/" + std::to_string(k) + "/" + shoal_op_name(op);
        for (int step = 0; step < 3; ++step) {
          std::vector<float> g = lowRankGradient(rank, step, rows, cols, k), out(rows * cols, -7.0f);
          shoal_tensor_t in = matrix(g.data(), rows, cols), o = matrix(out.data(), rows, cols);
          ASSERT_EQ(reduce(comm, name.c_str(), "rank=4", in, o, op), SHOAL_OK) << shoal_last_error(comm);
          std::vector<double> want = exactSum(n, step, rows, cols, k);
          if (op == SHOAL_AVG)
            for (double& x : want) x /= n;
          const double tolerance = 1e-4 * maxAbs(want);
          for (size_t i = 0; i < out.size(); ++i)
            ASSERT_NEAR(out[i], want[i], tolerance) << "k " << k << " step " << step << " element " << i;
        }
        // The tensor was compressed: Q [cols x 4] is kept.
        Saved s = save(comm, "rank=4", name.c_str());
        EXPECT_EQ(s.cols, cols);
        EXPECT_EQ(s.r, 4u);
      });
    }
  }
}

// A rank-5 sum at rank 4 is not exact (the compression is real).
TEST(PowerSgd, ApproximatesHigherRank) {
  const int n = 2;
  const size_t rows = 40, cols = 24;
  runRanks(n, [&](int rank, shoal_comm_t comm) {
    std::vector<float> g = lowRankGradient(rank, 0, rows, cols, 8), out(rows * cols);
    shoal_tensor_t in = matrix(g.data(), rows, cols), o = matrix(out.data(), rows, cols);
    ASSERT_EQ(reduce(comm, "approx", "rank=4", in, o), SHOAL_OK) << shoal_last_error(comm);
    std::vector<double> want = exactSum(n, 0, rows, cols, 8);
    double worst = 0;
    for (size_t i = 0; i < out.size(); ++i) worst = std::max(worst, std::fabs(out[i] - want[i] / n));
    EXPECT_GT(worst, 1e-3 * maxAbs(want) / n);
  });
}

// Error feedback: per rank, out + e_new == g + e_old (avg: e_new = M - out); so
// n * out == sum_w (g_w + e_old_w - e_new_w). And Q is bit-identical on all ranks.
TEST(PowerSgd, ErrorFeedbackConservesAndQIsIdentical) {
  const int n = 3;
  const size_t rows = 48, cols = 30;
  std::vector<std::vector<float>> q(n);
  std::vector<std::vector<float>> outs(n);
  std::barrier sync(n);
  runRanks(n, [&](int rank, shoal_comm_t comm) {
    for (int step = 0; step < 4; ++step) {
      std::vector<float> g(rows * cols), out(rows * cols);
      for (size_t i = 0; i < g.size(); ++i) g[i] = uniform(5, rank, step, i);
      shoal_tensor_t in = matrix(g.data(), rows, cols), o = matrix(out.data(), rows, cols);
      for (shoal_op_t op : {SHOAL_AVG, SHOAL_SUM}) {
        const char* name = op == SHOAL_AVG ? "ef/avg" : "ef/sum";
        std::vector<float> eOld(rows * cols, 0.0f);
        if (step > 0) eOld = save(comm, "rank=2", name).error;
        ASSERT_EQ(reduce(comm, name, "rank=2", in, o, op), SHOAL_OK) << shoal_last_error(comm);
        Saved after = save(comm, "rank=2", name);
        ASSERT_EQ(after.error.size(), g.size());
        const float scale = op == SHOAL_SUM ? static_cast<float>(n) : 1.0f;
        for (size_t i = 0; i < g.size(); ++i) {
          double lhs = double(out[i]) / scale + after.error[i], rhs = double(g[i]) + eOld[i];
          ASSERT_NEAR(lhs, rhs, 1e-5 * (std::fabs(g[i]) + std::fabs(eOld[i]) + std::fabs(after.error[i]) + 1e-3))
              << "step " << step << " element " << i;
        }
        bool anyError = false;
        for (float e : after.error) anyError |= e != 0.0f;
        EXPECT_TRUE(anyError) << "a random 48x30 matrix at rank 2 leaves a residual";
        q[rank] = after.q;
        outs[rank] = out;
        sync.arrive_and_wait();
        EXPECT_EQ(after.q.size(), cols * 2);
        EXPECT_EQ(std::memcmp(q[rank].data(), q[0].data(), q[0].size() * 4), 0) << "Q differs from rank 0's";
        EXPECT_EQ(std::memcmp(outs[rank].data(), outs[0].data(), outs[0].size() * 4), 0) << "output differs";
        for (float x : after.q) ASSERT_TRUE(std::isfinite(x));
        sync.arrive_and_wait();
      }
    }
  });
}

// 1-D tensors and matrices that would not shrink ride densely: the exact result
// (integer-valued inputs, so any summation order is exact), no residual, no Q.
TEST(PowerSgd, DenseRouting) {
  const int n = 3;
  runRanks(n, [&](int rank, shoal_comm_t comm) {
    struct Shape { const char* name; size_t rows, cols; int ndim; };
    for (Shape shape : {Shape{"dense/1d", 1000, 1, 1}, Shape{"dense/4x4", 4, 4, 2}, Shape{"dense/16x16", 16, 16, 2},
                        Shape{"dense/3x500", 3, 500, 2}}) {
      const size_t count = shape.rows * shape.cols;
      for (int step = 0; step < 2; ++step) {
        std::vector<float> g(count), out(count);
        for (size_t i = 0; i < count; ++i) g[i] = std::floor(uniform(9, rank, step, i) * 64);
        shoal_tensor_t in = shape.ndim == 1 ? shoal_tensor_1d(g.data(), count, SHOAL_F32)
                                            : matrix(g.data(), shape.rows, shape.cols);
        shoal_tensor_t o = in;
        o.data = out.data();
        ASSERT_EQ(reduce(comm, shape.name, "rank=4", in, o, SHOAL_SUM), SHOAL_OK) << shoal_last_error(comm);
        for (size_t i = 0; i < count; ++i) {
          float want = 0;
          for (int w = 0; w < n; ++w) want += std::floor(uniform(9, w, step, i) * 64);
          ASSERT_EQ(out[i], want) << shape.name << " element " << i;
        }
        Saved s = save(comm, "rank=4", shape.name);
        EXPECT_EQ(s.count, count);
        EXPECT_EQ(s.cols * s.r, 0u) << shape.name << " should not be compressed";
        for (float e : s.error) ASSERT_EQ(e, 0.0f);
      }
    }
  });
}

// Zero gradients give zeros (no NaN from the zero columns of P and Q); the Q that
// went to zero is redrawn, so a later low-rank gradient is exact again.
TEST(PowerSgd, ZeroMatrices) {
  const int n = 2;
  const size_t rows = 64, cols = 48;
  runRanks(n, [&](int rank, shoal_comm_t comm) {
    for (int step = 0; step < 3; ++step) {
      std::vector<float> g(rows * cols, 0.0f), out(rows * cols, 5.0f);
      shoal_tensor_t in = matrix(g.data(), rows, cols), o = matrix(out.data(), rows, cols);
      ASSERT_EQ(reduce(comm, "zeros", "rank=4", in, o), SHOAL_OK) << shoal_last_error(comm);
      for (float x : out) ASSERT_EQ(x, 0.0f);
    }
    Saved s = save(comm, "rank=4", "zeros");
    for (float x : s.q) ASSERT_TRUE(std::isfinite(x));
    for (float x : s.error) ASSERT_EQ(x, 0.0f);
    std::vector<float> g = lowRankGradient(rank, 9, rows, cols, 2), out(rows * cols);
    shoal_tensor_t in = matrix(g.data(), rows, cols), o = matrix(out.data(), rows, cols);
    ASSERT_EQ(reduce(comm, "zeros", "rank=4", in, o), SHOAL_OK) << shoal_last_error(comm);
    std::vector<double> want = exactSum(n, 9, rows, cols, 2);
    for (size_t i = 0; i < out.size(); ++i) ASSERT_NEAR(out[i], want[i] / n, 1e-4 * maxAbs(want) / n) << i;
  });
}

// Before start_iter (counted in compressed calls on the communicator): plain
// allreduce, exact, error untouched; from then on compressed.
TEST(PowerSgd, StartIter) {
  const int n = 2;
  const size_t rows = 40, cols = 24;
  runRanks(n, [&](int rank, shoal_comm_t comm) {
    for (int step = 0; step < 3; ++step) {
      std::vector<float> g(rows * cols), out(rows * cols);
      for (size_t i = 0; i < g.size(); ++i) g[i] = std::floor(uniform(11, rank, step, i) * 64);
      shoal_tensor_t in = matrix(g.data(), rows, cols), o = matrix(out.data(), rows, cols);
      ASSERT_EQ(reduce(comm, "start", "rank=1,start_iter=2", in, o, SHOAL_SUM), SHOAL_OK) << shoal_last_error(comm);
      bool exact = true;
      for (size_t i = 0; i < g.size(); ++i) {
        float want = 0;
        for (int w = 0; w < n; ++w) want += std::floor(uniform(11, w, step, i) * 64);
        exact &= out[i] == want;
      }
      Saved s = save(comm, "rank=1,start_iter=2", "start");
      bool errorZero = std::all_of(s.error.begin(), s.error.end(), [](float e) { return e == 0.0f; });
      if (step < 2) {
        EXPECT_TRUE(exact) << "step " << step << " is before start_iter: plain allreduce";
        EXPECT_TRUE(errorZero) << "step " << step;
      } else {
        EXPECT_FALSE(exact) << "step 2 is compressed at rank 1";
        EXPECT_FALSE(errorZero);
      }
    }
  });
}

// Saving every rank's state and loading it under another name resumes bit for bit.
TEST(PowerSgd, SaveLoadResumesBitIdentically) {
  const int n = 2;
  const size_t rows = 36, cols = 20;
  runRanks(n, [&](int rank, shoal_comm_t comm) {
    auto step = [&](const char* name, int s, std::vector<float>& out) {
      std::vector<float> g(rows * cols);
      for (size_t i = 0; i < g.size(); ++i) g[i] = uniform(13, rank, s, i);
      out.assign(rows * cols, 0.0f);
      shoal_tensor_t in = matrix(g.data(), rows, cols), o = matrix(out.data(), rows, cols);
      ASSERT_EQ(reduce(comm, name, "rank=2,seed=9", in, o), SHOAL_OK) << shoal_last_error(comm);
    };
    std::vector<float> a, b;
    step("resume/a", 0, a);
    step("resume/a", 1, a);
    Saved saved = save(comm, "rank=2,seed=9", "resume/a");
    ASSERT_EQ(shoal_compressor_state_load(comm, "powersgd", "rank=2,seed=9", "resume/b", saved.bytes.data(),
                                          saved.bytes.size()),
              SHOAL_OK)
        << shoal_last_error(comm);
    step("resume/a", 2, a);
    step("resume/b", 2, b);
    EXPECT_EQ(std::memcmp(a.data(), b.data(), a.size() * 4), 0) << "resumed output differs";
    Saved sa = save(comm, "rank=2,seed=9", "resume/a"), sb = save(comm, "rank=2,seed=9", "resume/b");
    EXPECT_EQ(sa.bytes, sb.bytes) << "resumed state differs";
    // A state of the wrong size is refused.
    std::vector<uint8_t> junk(17);
    EXPECT_NE(shoal_compressor_state_load(comm, "powersgd", "rank=2,seed=9", "resume/c", junk.data(), junk.size()),
              SHOAL_OK);
  });
}

TEST(PowerSgd, RefusesBadOptions) {
  runRanks(2, [&](int, shoal_comm_t comm) {
    std::vector<float> g(64 * 32, 1.0f);
    shoal_tensor_t t = matrix(g.data(), 64, 32);
    for (const char* bad : {"rank=0", "rank=abc", "rank=5000", "ef=2", "start_iter=-1", "min_compression_rate=-1",
                            "min_compression_rate=x", "seed=-3", "bogus=1"}) {
      shoal_status_t status = reduce(comm, "bad", bad, t, t);
      EXPECT_EQ(status, SHOAL_ERR_INVALID_ARGUMENT) << bad;
      std::string key(bad, std::strchr(bad, '=') - bad);
      EXPECT_NE(std::string(shoal_last_error(comm)).find(key), std::string::npos)
          << bad << ": " << shoal_last_error(comm);
    }
    // Unnamed: keyed by output buffer, dtype and shape (issue 13.2), no longer refused.
    EXPECT_EQ(reduce(comm, nullptr, "rank=2", t, t), SHOAL_OK) << shoal_last_error(comm);
    EXPECT_EQ(reduce(comm, "good", "rank=2,ef=0,start_iter=0,min_compression_rate=1.5,seed=3", t, t), SHOAL_OK)
        << shoal_last_error(comm);
  });
}

// The table driven directly, ranks simulated in one thread (harness/compressor_rounds.h:
// allreduce = sum in rank order): a fused call of three tensors, two compressed and one
// dense, in one P payload [P_a | P_b | dense] and one Q payload [Q_a | Q_b], done after
// round 2; rank-1 sums come out exact, the dense tensor exactly.
TEST(PowerSgd, FusedTensorsThroughTheTable) {
  const shoal_compressor_t* table = nullptr;
  ASSERT_EQ(shoal_compressor_lookup("powersgd", &table), SHOAL_OK) << shoal_last_error(nullptr);
  const int n = 2, tensors = 3;
  const size_t rows[tensors] = {40, 10, 30}, cols[tensors] = {24, 1, 20};
  const std::vector<CompressorRounds::TensorSpec> specs = {
      {SHOAL_F32, {40, 24}, "fused/a"}, {SHOAL_F32, {10}, "fused/bias"}, {SHOAL_F32, {30, 20}, "fused/b"}};
  CompressorRounds rounds(table, n);
  ASSERT_EQ(rounds.create({{"rank", "4"}}), SHOAL_OK) << rounds.error(rounds.failedRank());
  const size_t expectedCount[2] = {40 * 4 + 30 * 4 + 10, 24 * 4 + 20 * 4};
  rounds.observe([&](int rank, const shoal_round_t& round) {
    ASSERT_EQ(round.done, round.index == 2 ? 1 : 0) << "rank " << rank << " round " << round.index;
    if (round.index == 2) return;
    ASSERT_EQ(round.num_payloads, 1);
    EXPECT_EQ(round.payloads[0].collective, SHOAL_COLLECTIVE_ALLREDUCE);
    EXPECT_EQ(round.payloads[0].dtype, SHOAL_F32);
    EXPECT_EQ(round.payloads[0].count, expectedCount[round.index]);
  });
  for (int step = 0; step < 2; ++step) {
    auto input = [&](int rank, int t) {
      return cols[t] > 1 ? lowRankGradient(rank, 10 * step + t, rows[t], cols[t], 1)
                         : std::vector<float>(rows[t], float(rank + 1 + t));
    };
    auto fill = [&](int rank, int t, void* data) {
      const std::vector<float> g = input(rank, t);
      std::memcpy(data, g.data(), g.size() * sizeof(float));
    };
    ASSERT_EQ(rounds.allreduce(specs, SHOAL_AVG, uint64_t(step), fill), SHOAL_OK)
        << rounds.error(rounds.failedRank());
    ASSERT_EQ(rounds.rounds(), 2);
    for (int t = 0; t < tensors; ++t) {
      std::vector<double> want(rows[t] * cols[t], 0.0);
      for (int r = 0; r < n; ++r) {
        const std::vector<float> g = input(r, t);
        for (size_t i = 0; i < want.size(); ++i) want[i] += g[i] / double(n);
      }
      for (int r = 0; r < n; ++r) {
        const std::vector<float> out = rounds.outputAs<float>(r, t);
        for (size_t i = 0; i < want.size(); ++i)
          ASSERT_NEAR(out[i], want[i], 1e-4 * maxAbs(want)) << "step " << step << " tensor " << t;
      }
    }
  }
}

}  // namespace
