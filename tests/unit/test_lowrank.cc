// shoal_fused_allreduce, shoal_lowrank_factorize and shoal_lowrank_rank (include/shoal/lowrank.h).
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <cstring>
#include <random>
#include <vector>

#include "harness/harness.h"
#include "shoal/lowrank.h"

namespace {

using shoal::test::runRanks;

shoal_tensor_t hostTensor(float* data, std::initializer_list<int64_t> shape) {
  shoal_tensor_t tensor = shoal_tensor_1d(data, 0, SHOAL_F32);
  tensor.ndim = static_cast<int>(shape.size());
  int d = 0;
  for (int64_t extent : shape) tensor.shape[d++] = extent;
  return tensor;
}

// Shapes of one fused call: matrices, conv-like 4-D, vectors, a scalar and empty tensors.
const std::vector<std::vector<int64_t>> kShapes = {
    {7, 5}, {0}, {3, 2, 3, 3}, {1}, {}, {4, 0, 2}, {1000}, {300, 201}, {17}, {0}};

size_t elementsOf(const std::vector<int64_t>& shape) {
  size_t n = 1;
  for (int64_t e : shape) n *= static_cast<size_t>(e);
  return n;
}

// Small integer-valued data: every partial sum is exact in f32, so the sum does
// not depend on the order in which ranks are combined (which differs between
// the fused buffer's blocks and the per-tensor calls' blocks), and avg =
// exact sum / n rounded once. With arbitrary floats only rounding-level
// agreement is promised (lowrank.h).
float valueAt(int rank, int tensor, size_t i) {
  return static_cast<float>(static_cast<int>((rank * 131 + tensor * 17 + i * 7) % 97) - 48);
}

class FusedAllreduce : public ::testing::TestWithParam<std::tuple<int, shoal_op_t, const char*>> {};

TEST_P(FusedAllreduce, EqualsPerTensorAllreduces) {
  const auto [ranks, op, algorithm] = GetParam();
  shoal::test::RankOptions options;
  options.algorithm = algorithm;
  runRanks(ranks, [&, ranks = ranks, op = op](int rank, shoal_comm_t comm) {
    std::vector<std::vector<float>> fused(kShapes.size()), single(kShapes.size());
    std::vector<shoal_tensor_t> tensors;
    for (size_t t = 0; t < kShapes.size(); ++t) {
      size_t n = elementsOf(kShapes[t]);
      fused[t].resize(n);
      for (size_t i = 0; i < n; ++i) fused[t][i] = valueAt(rank, static_cast<int>(t), i);
      single[t] = fused[t];
      shoal_tensor_t tensor = shoal_tensor_1d(fused[t].data(), n, SHOAL_F32);
      tensor.ndim = static_cast<int>(kShapes[t].size());
      for (size_t d = 0; d < kShapes[t].size(); ++d) tensor.shape[d] = kShapes[t][d];
      tensors.push_back(tensor);
    }
    ASSERT_EQ(shoal_fused_allreduce(comm, tensors.data(), static_cast<int>(tensors.size()), op), SHOAL_OK)
        << shoal_last_error(comm);
    for (size_t t = 0; t < kShapes.size(); ++t)
      ASSERT_EQ(shoal_allreduce(comm, single[t].data(), single[t].data(), single[t].size(), SHOAL_F32, op), SHOAL_OK)
          << shoal_last_error(comm);
    for (size_t t = 0; t < kShapes.size(); ++t) {
      ASSERT_EQ(fused[t].size(), single[t].size());
      ASSERT_TRUE(fused[t].empty() || std::memcmp(fused[t].data(), single[t].data(), fused[t].size() * sizeof(float)) == 0)
          << "tensor " << t << " on rank " << rank << " of " << ranks;
      // And the expected value itself.
      for (size_t i = 0; i < fused[t].size(); ++i) {
        double sum = 0;
        for (int r = 0; r < ranks; ++r) sum += valueAt(r, static_cast<int>(t), i);
        float expected = op == SHOAL_SUM ? static_cast<float>(sum) : static_cast<float>(sum) / ranks;
        ASSERT_EQ(fused[t][i], expected) << "tensor " << t << " element " << i;
      }
    }
  }, options);
}

INSTANTIATE_TEST_SUITE_P(RanksOps, FusedAllreduce,
                         ::testing::Combine(::testing::Values(1, 2, 3, 5), ::testing::Values(SHOAL_SUM, SHOAL_AVG),
                                            ::testing::Values("auto", "ring", "tree")));

TEST(FusedAllreduceTest, IntegerDtypeAndRepeatedCalls) {
  runRanks(3, [](int rank, shoal_comm_t comm) {
    std::vector<int32_t> a(10, rank + 1), b(3, 10 * (rank + 1));
    shoal_tensor_t tensors[2] = {shoal_tensor_1d(a.data(), a.size(), SHOAL_I32),
                                 shoal_tensor_1d(b.data(), b.size(), SHOAL_I32)};
    for (int call = 0; call < 3; ++call) ASSERT_EQ(shoal_fused_allreduce(comm, tensors, 2, SHOAL_AVG), SHOAL_OK);
    for (int32_t x : a) EXPECT_EQ(x, 2);
    for (int32_t x : b) EXPECT_EQ(x, 20);
  });
}

TEST(FusedAllreduceTest, BadArgumentsAreRefused) {
  runRanks(2, [](int rank, shoal_comm_t comm) {
    (void)rank;
    std::vector<float> f(4, 1.0f);
    std::vector<double> d(4, 1.0);
    shoal_tensor_t good = shoal_tensor_1d(f.data(), f.size(), SHOAL_F32);
    EXPECT_EQ(shoal_fused_allreduce(comm, nullptr, 1, SHOAL_SUM), SHOAL_ERR_INVALID_ARGUMENT);
    EXPECT_NE(std::strstr(shoal_last_error(comm), "tensors is NULL"), nullptr) << shoal_last_error(comm);
    EXPECT_EQ(shoal_fused_allreduce(comm, &good, 0, SHOAL_SUM), SHOAL_ERR_INVALID_ARGUMENT);
    EXPECT_NE(std::strstr(shoal_last_error(comm), "num_tensors"), nullptr);
    EXPECT_EQ(shoal_fused_allreduce(comm, &good, -3, SHOAL_SUM), SHOAL_ERR_INVALID_ARGUMENT);
    EXPECT_EQ(shoal_fused_allreduce(comm, &good, 1, SHOAL_MAX), SHOAL_ERR_INVALID_ARGUMENT);
    EXPECT_NE(std::strstr(shoal_last_error(comm), "SHOAL_SUM or SHOAL_AVG"), nullptr);
    shoal_tensor_t mixed[2] = {good, shoal_tensor_1d(d.data(), d.size(), SHOAL_F64)};
    EXPECT_EQ(shoal_fused_allreduce(comm, mixed, 2, SHOAL_SUM), SHOAL_ERR_INVALID_ARGUMENT);
    EXPECT_NE(std::strstr(shoal_last_error(comm), "share a dtype"), nullptr) << shoal_last_error(comm);
    shoal_tensor_t cuda = good;
    cuda.memory = SHOAL_MEMORY_CUDA;
    EXPECT_EQ(shoal_fused_allreduce(comm, &cuda, 1, SHOAL_SUM), SHOAL_ERR_UNSUPPORTED);
    shoal_tensor_t null_data = shoal_tensor_1d(nullptr, 4, SHOAL_F32);
    EXPECT_EQ(shoal_fused_allreduce(comm, &null_data, 1, SHOAL_SUM), SHOAL_ERR_INVALID_ARGUMENT);
    shoal_tensor_t negative = good;
    negative.shape[0] = -1;
    EXPECT_EQ(shoal_fused_allreduce(comm, &negative, 1, SHOAL_SUM), SHOAL_ERR_INVALID_ARGUMENT);
    shoal_tensor_t huge = hostTensor(f.data(), {int64_t(1) << 40, int64_t(1) << 40});
    EXPECT_EQ(shoal_fused_allreduce(comm, &huge, 1, SHOAL_SUM), SHOAL_ERR_INVALID_ARGUMENT);
    EXPECT_NE(std::strstr(shoal_last_error(comm), "overflow"), nullptr) << shoal_last_error(comm);
    shoal_tensor_t halves[2] = {hostTensor(f.data(), {int64_t(1) << 61}), hostTensor(f.data(), {int64_t(1) << 61})};
    EXPECT_EQ(shoal_fused_allreduce(comm, halves, 2, SHOAL_SUM), SHOAL_ERR_INVALID_ARGUMENT);
    // Refusals take a sequence number on every rank alike: the communicator still works.
    ASSERT_EQ(shoal_fused_allreduce(comm, &good, 1, SHOAL_SUM), SHOAL_OK) << shoal_last_error(comm);
    for (float x : f) EXPECT_EQ(x, 2.0f);
  });
}

// ---- factorize ------------------------------------------------------------------

std::vector<float> randomMatrix(int64_t rows, int64_t cols, unsigned seed) {
  std::mt19937 rng(seed);
  std::normal_distribution<float> normal;
  std::vector<float> w(static_cast<size_t>(rows * cols));
  for (float& x : w) x = normal(rng);
  return w;
}

double frobenius(const std::vector<float>& a) {
  double sum = 0;
  for (float x : a) sum += double(x) * x;
  return std::sqrt(sum);
}

// w - u vᵀ (u [rows x r], v [cols x r]), in double.
std::vector<float> residual(const std::vector<float>& w, const std::vector<float>& u, const std::vector<float>& v,
                            int64_t rows, int64_t cols, int64_t r) {
  std::vector<float> out(w.size());
  for (int64_t i = 0; i < rows; ++i)
    for (int64_t j = 0; j < cols; ++j) {
      double acc = 0;
      for (int64_t k = 0; k < r; ++k) acc += double(u[i * r + k]) * v[j * r + k];
      out[i * cols + j] = static_cast<float>(w[i * cols + j] - acc);
    }
  return out;
}

struct Shape {
  int64_t rows, cols;
};

class Factorize : public ::testing::TestWithParam<Shape> {};

TEST_P(Factorize, FullRankReconstructs) {
  const auto [rows, cols] = GetParam();
  const int64_t k = std::min(rows, cols);
  auto w = randomMatrix(rows, cols, 1);
  std::vector<float> u(rows * k), v(cols * k), s(k);
  ASSERT_EQ(shoal_lowrank_factorize(w.data(), rows, cols, k, u.data(), v.data(), s.data()), SHOAL_OK)
      << shoal_last_error(nullptr);
  EXPECT_LT(frobenius(residual(w, u, v, rows, cols, k)), 1e-4 * frobenius(w) * std::sqrt(double(k)));
  EXPECT_LT(frobenius(residual(w, u, v, rows, cols, k)), 1e-4 * frobenius(w) * 4);
  for (int64_t i = 1; i < k; ++i) EXPECT_GE(s[i - 1], s[i]) << i;
  EXPECT_GE(s[k - 1], 0.0f);
}

TEST_P(Factorize, TruncationErrorIsTheTailOfTheSpectrum) {
  const auto [rows, cols] = GetParam();
  const int64_t k = std::min(rows, cols);
  auto w = randomMatrix(rows, cols, 2);
  for (int64_t r : {int64_t(1), shoal_lowrank_rank(rows, cols, 4), k / 2 + 1}) {
    std::vector<float> u(rows * r), v(cols * r), s(k);
    ASSERT_EQ(shoal_lowrank_factorize(w.data(), rows, cols, r, u.data(), v.data(), s.data()), SHOAL_OK)
        << shoal_last_error(nullptr);
    double tail = 0;
    for (int64_t i = r; i < k; ++i) tail += double(s[i]) * s[i];
    tail = std::sqrt(tail);
    double error = frobenius(residual(w, u, v, rows, cols, r));
    EXPECT_NEAR(error, tail, 1e-4 * frobenius(w) + 1e-5) << "rank " << r;
    // Frobenius norm of w is the whole spectrum.
    double all = 0;
    for (float x : s) all += double(x) * x;
    EXPECT_NEAR(std::sqrt(all), frobenius(w), 1e-4 * frobenius(w));
  }
}

TEST_P(Factorize, SingularValuesOptionalAndInputUntouched) {
  const auto [rows, cols] = GetParam();
  auto w = randomMatrix(rows, cols, 3);
  auto copy = w;
  std::vector<float> u(rows), v(cols);
  ASSERT_EQ(shoal_lowrank_factorize(w.data(), rows, cols, 1, u.data(), v.data(), nullptr), SHOAL_OK);
  EXPECT_EQ(w, copy);
}

INSTANTIATE_TEST_SUITE_P(Shapes, Factorize,
                         ::testing::Values(Shape{1, 1}, Shape{8, 8}, Shape{64, 27}, Shape{27, 64}, Shape{128, 576},
                                           Shape{1, 9}, Shape{9, 1}));

TEST(FactorizeTest, ExactLowRankMatrixIsRecoveredAtItsRank) {
  const int64_t rows = 40, cols = 30, r = 3;
  auto a = randomMatrix(rows, r, 4), b = randomMatrix(cols, r, 5);
  std::vector<float> w(rows * cols);
  for (int64_t i = 0; i < rows; ++i)
    for (int64_t j = 0; j < cols; ++j) {
      double acc = 0;
      for (int64_t k = 0; k < r; ++k) acc += double(a[i * r + k]) * b[j * r + k];
      w[i * cols + j] = static_cast<float>(acc);
    }
  std::vector<float> u(rows * r), v(cols * r), s(std::min(rows, cols));
  ASSERT_EQ(shoal_lowrank_factorize(w.data(), rows, cols, r, u.data(), v.data(), s.data()), SHOAL_OK);
  EXPECT_LT(frobenius(residual(w, u, v, rows, cols, r)), 1e-4 * frobenius(w));
  EXPECT_LT(s[r], 1e-4 * s[0]);
}

TEST(FactorizeTest, FactorsCarryRootOfSingularValues) {
  // diag(9, 4, 1): u' and v' columns are ±sqrt(s) e_i.
  std::vector<float> w = {9, 0, 0, 0, 4, 0, 0, 0, 1};
  std::vector<float> u(9), v(9), s(3);
  ASSERT_EQ(shoal_lowrank_factorize(w.data(), 3, 3, 3, u.data(), v.data(), s.data()), SHOAL_OK);
  EXPECT_NEAR(s[0], 9, 1e-5);
  EXPECT_NEAR(s[1], 4, 1e-5);
  EXPECT_NEAR(s[2], 1, 1e-5);
  EXPECT_NEAR(std::fabs(u[0 * 3 + 0]), 3, 1e-5);
  EXPECT_NEAR(std::fabs(v[0 * 3 + 0]), 3, 1e-5);
  EXPECT_NEAR(std::fabs(u[1 * 3 + 1]), 2, 1e-5);
  EXPECT_NEAR(std::fabs(v[2 * 3 + 2]), 1, 1e-5);
}

TEST(FactorizeTest, BadArgumentsAreRefused) {
  std::vector<float> w(12, 1.0f), u(12), v(12), s(3);
  EXPECT_EQ(shoal_lowrank_factorize(nullptr, 3, 4, 1, u.data(), v.data(), s.data()), SHOAL_ERR_INVALID_ARGUMENT);
  EXPECT_NE(std::strstr(shoal_last_error(nullptr), "w, u_out and v_out"), nullptr) << shoal_last_error(nullptr);
  EXPECT_EQ(shoal_lowrank_factorize(w.data(), 3, 4, 1, nullptr, v.data(), s.data()), SHOAL_ERR_INVALID_ARGUMENT);
  EXPECT_EQ(shoal_lowrank_factorize(w.data(), 3, 4, 1, u.data(), nullptr, s.data()), SHOAL_ERR_INVALID_ARGUMENT);
  EXPECT_EQ(shoal_lowrank_factorize(w.data(), 0, 4, 1, u.data(), v.data(), s.data()), SHOAL_ERR_INVALID_ARGUMENT);
  EXPECT_EQ(shoal_lowrank_factorize(w.data(), 3, -1, 1, u.data(), v.data(), s.data()), SHOAL_ERR_INVALID_ARGUMENT);
  EXPECT_EQ(shoal_lowrank_factorize(w.data(), 3, 4, 0, u.data(), v.data(), s.data()), SHOAL_ERR_INVALID_ARGUMENT);
  EXPECT_EQ(shoal_lowrank_factorize(w.data(), 3, 4, 4, u.data(), v.data(), s.data()), SHOAL_ERR_INVALID_ARGUMENT);
  EXPECT_NE(std::strstr(shoal_last_error(nullptr), "min(rows, cols) = 3"), nullptr) << shoal_last_error(nullptr);
  EXPECT_EQ(shoal_lowrank_factorize(w.data(), int64_t(1) << 40, 4, 1, u.data(), v.data(), s.data()),
            SHOAL_ERR_INVALID_ARGUMENT);
  w[5] = NAN;
  EXPECT_EQ(shoal_lowrank_factorize(w.data(), 3, 4, 1, u.data(), v.data(), s.data()), SHOAL_ERR_INVALID_ARGUMENT);
  EXPECT_NE(std::strstr(shoal_last_error(nullptr), "w[5]"), nullptr) << shoal_last_error(nullptr);
}

TEST(LowrankRank, PufferfishRule) {
  EXPECT_EQ(shoal_lowrank_rank(64, 576, 4), 16);
  EXPECT_EQ(shoal_lowrank_rank(2048, 512, 4), 128);
  EXPECT_EQ(shoal_lowrank_rank(3, 100, 4), 1);  // max(1, 0)
  EXPECT_EQ(shoal_lowrank_rank(7, 9, 1), 7);
  EXPECT_EQ(shoal_lowrank_rank(0, 9, 4), 0);
  EXPECT_EQ(shoal_lowrank_rank(9, 9, 0), 0);
}

}  // namespace
