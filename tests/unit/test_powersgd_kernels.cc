// The CPU kernels of the PowerSGD step (compressors/powersgd/powersgd_kernels.h)
// against straightforward references on odd shapes (37 x 53, r = 1..8 and 11),
// and the engine's phases (powersgd_engine.h) with and without the M workspace.
//
// Tolerance: a sum of n products computed in f32 in any order is within
// n * 2^-24 * sum |terms| of the exact sum (plus one rounding of each product);
// the tests allow n * 2^-23 * sum |terms| against a double reference, which a
// kernel that drops, repeats or misplaces a term misses by orders of magnitude.
#include <algorithm>
#include <cmath>
#include <cstdint>
#include <cstring>
#include <vector>

#include <gtest/gtest.h>

#include "compressors/powersgd/powersgd_engine.h"
#include "compressors/powersgd/powersgd_kernels.h"
#include "compressors/powersgd/powersgd_math.h"
#include "core/numeric/element_ops.h"

namespace {

using namespace shoal::powersgd;

constexpr double kUnit = 0x1.0p-23;

// Uniform in [-1, 1) from (a, i).
float uniform(uint64_t a, uint64_t i) {
  return static_cast<float>(static_cast<double>(splitmix64(splitmix64(a) ^ i) >> 11) * 0x1.0p-52 - 1.0);
}

std::vector<float> randomVector(size_t n, uint64_t key) {
  std::vector<float> v(n);
  for (size_t i = 0; i < n; ++i) v[i] = uniform(key, i);
  return v;
}

// |got - sum| within terms * 2^-23 * sum of |terms|.
void expectSum(float got, double sum, double absSum, size_t terms, const char* what) {
  const double tolerance = static_cast<double>(terms) * kUnit * absSum + 1e-30;
  EXPECT_LE(std::fabs(static_cast<double>(got) - sum), tolerance) << what << ": " << got << " vs " << sum;
}

const int kRanks[] = {1, 2, 3, 4, 5, 6, 7, 8, 11};

TEST(PowerSgdKernels, FactorDotsMatchDoubleAndDoNotDependOnChunking) {
  for (size_t cols : {1, 3, 7, 8, 9, 53, 64, 100})
    for (int r : kRanks) {
      const std::vector<float> m = randomVector(cols, 1000 + cols);
      const std::vector<float> qt = randomVector(cols * r, 2000 + cols * 16 + r);
      std::vector<float> p(r);
      kernels::factorDots(m.data(), cols, qt.data(), r, p.data());
      for (int k = 0; k < r; ++k) {
        double sum = 0, absSum = 0;
        for (size_t j = 0; j < cols; ++j) {
          const double term = double(m[j]) * double(qt[k * cols + j]);
          sum += term, absSum += std::fabs(term);
        }
        expectSum(p[k], sum, absSum, cols, "P = M Q");
        float alone = 0;  // the same column as a factor of one column: the same bits
        kernels::factorDots(m.data(), cols, qt.data() + k * cols, 1, &alone);
        EXPECT_EQ(std::memcmp(&alone, &p[k], sizeof alone), 0) << "cols " << cols << " r " << r << " k " << k;
      }
    }
}

TEST(PowerSgdKernels, AccumulateRowsMatchesDoubleAndBlockingKeepsTheBits) {
  const size_t rows = 37, cols = 53;
  for (int r : kRanks) {
    const std::vector<float> m = randomVector(rows * cols, 3000 + r);
    const std::vector<float> p = randomVector(rows * r, 4000 + r);
    std::vector<float> all(r * cols, 0.0f), oneByOne(r * cols, 0.0f), byFours(r * cols, 0.0f);
    kernels::accumulateRows(m.data(), rows, cols, p.data(), r, all.data());
    for (size_t i = 0; i < rows; ++i)
      kernels::accumulateRows(m.data() + i * cols, 1, cols, p.data() + i * r, r, oneByOne.data());
    for (size_t i = 0; i < rows; i += 4) {  // as the engine calls it
      const size_t count = std::min<size_t>(4, rows - i);
      kernels::accumulateRows(m.data() + i * cols, count, cols, p.data() + i * r, r, byFours.data());
    }
    EXPECT_EQ(std::memcmp(all.data(), oneByOne.data(), all.size() * 4), 0) << "r " << r;
    EXPECT_EQ(std::memcmp(all.data(), byFours.data(), all.size() * 4), 0) << "r " << r;
    for (int k = 0; k < r; ++k)
      for (size_t j = 0; j < cols; ++j) {
        double sum = 0, absSum = 0;
        for (size_t i = 0; i < rows; ++i) {
          const double term = double(p[i * r + k]) * double(m[i * cols + j]);
          sum += term, absSum += std::fabs(term);
        }
        expectSum(all[k * cols + j], sum, absSum, rows, "Q = Mt P");
      }
  }
}

TEST(PowerSgdKernels, ProductRowIsThePlainLoopBitForBit) {
  const size_t cols = 53;
  for (int r : kRanks) {
    const std::vector<float> p = randomVector(r, 5000 + r);
    const std::vector<float> qt = randomVector(r * cols, 6000 + r);
    std::vector<float> a(cols, 123.0f), plain(cols, 0.0f);
    kernels::productRow(p.data(), qt.data(), r, cols, a.data());
    for (int k = 0; k < r; ++k)  // the loop the step had before the kernels
      for (size_t j = 0; j < cols; ++j) plain[j] += p[k] * qt[k * cols + j];
    EXPECT_EQ(std::memcmp(a.data(), plain.data(), cols * 4), 0) << "r " << r;
    for (size_t j = 0; j < cols; ++j) {
      double sum = 0, absSum = 0;
      for (int k = 0; k < r; ++k) {
        const double term = double(p[k]) * double(qt[k * cols + j]);
        sum += term, absSum += std::fabs(term);
      }
      expectSum(a[j], sum, absSum, r, "A = P Qt");
    }
  }
}

TEST(PowerSgdKernels, TransposesRoundTrip) {
  const std::vector<float> f = randomVector(53 * 3, 7);
  std::vector<float> ft(f.size()), back(f.size());
  kernels::toColumns(f.data(), 53, 3, ft.data());
  EXPECT_EQ(ft[2 * 53 + 5], f[5 * 3 + 2]);
  kernels::fromColumns(ft.data(), 53, 3, back.data());
  EXPECT_EQ(back, f);
}

// One rank's step through the engine's phases (world size 1: no allreduce
// between them), with the M workspace (as the plan runs it) or without (as
// the compressor does).
struct OneStep {
  std::vector<float> p, q, out;
  std::vector<uint8_t> error;
  std::vector<float> qUsed;  // the warm-start Q that P = M Q used
  std::vector<float> pOrthonormal;
};

OneStep runStep(const Options& options, const Shape& shape, shoal_dtype_t dtype, const std::vector<uint8_t>& grad,
                MatrixState state, bool workspace, bool inPlace) {
  const Layout layout = makeLayout({shape});
  OneStep step;
  std::vector<uint8_t> g = grad, outBytes(grad.size());
  const void* inputs[1] = {g.data()};
  void* outputs[1] = {inPlace ? static_cast<void*>(g.data()) : outBytes.data()};
  MatrixState* states[1] = {&state};
  const uint64_t keys[1] = {nameHash("m")};
  const StepIo io{1, &dtype, inputs, outputs, states, keys};
  std::vector<float> pbuf(layout.pBufferElems()), qbuf(layout.qElems), mbuf(workspace ? layout.mElems : 0);
  float* m = workspace ? mbuf.data() : nullptr;
  phaseP(options, layout, false, io, pbuf.data(), m);
  step.p = pbuf;
  step.qUsed = state.q;
  phaseQ(options, layout, false, io, pbuf.data(), m, qbuf.data());
  step.pOrthonormal = pbuf;
  step.q = qbuf;
  finishStep(options, layout, false, io, pbuf.data(), qbuf.data(), m, 1, SHOAL_AVG);
  const std::vector<uint8_t>& written = inPlace ? g : outBytes;
  step.out.resize(shape.count);
  for (size_t i = 0; i < shape.count; ++i) {
    if (dtype == SHOAL_F32) std::memcpy(&step.out[i], written.data() + 4 * i, 4);
    else step.out[i] = shoal::ops::widen(reinterpret_cast<const shoal::ops::BFloat16*>(written.data())[i]);
  }
  step.error = state.error;
  return step;
}

float elementAsFloat(shoal_dtype_t dtype, const std::vector<uint8_t>& bytes, size_t i) {
  if (dtype == SHOAL_F32) {
    float v;
    std::memcpy(&v, bytes.data() + 4 * i, 4);
    return v;
  }
  return shoal::ops::widen(reinterpret_cast<const shoal::ops::BFloat16*>(bytes.data())[i]);
}

std::vector<uint8_t> asDtype(shoal_dtype_t dtype, const std::vector<float>& values) {
  std::vector<uint8_t> bytes(values.size() * (dtype == SHOAL_F32 ? 4 : 2));
  for (size_t i = 0; i < values.size(); ++i) {
    if (dtype == SHOAL_F32) std::memcpy(bytes.data() + 4 * i, &values[i], 4);
    else reinterpret_cast<shoal::ops::BFloat16*>(bytes.data())[i] = shoal::ops::narrow<shoal::ops::BFloat16>(values[i]);
  }
  return bytes;
}

TEST(PowerSgdKernels, EngineStepMatchesReferenceWithAndWithoutWorkspace) {
  const size_t rows = 37, cols = 53;
  for (shoal_dtype_t dtype : {SHOAL_F32, SHOAL_BF16})
    for (bool ef : {true, false})
      for (int r = 1; r <= 8; ++r) {
        SCOPED_TRACE(testing::Message() << shoal_dtype_name(dtype) << " ef " << ef << " r " << r);
        Options options;
        options.rank = r;
        options.ef = ef;
        options.minCompressionRate = 0;
        const Shape shape = shapeOf(rows, cols, r, 0.0, false);
        ASSERT_EQ(shape.r, r);
        MatrixState state;
        ASSERT_EQ(checkState(state, shape, dtype), "");
        const std::vector<uint8_t> grad = asDtype(dtype, randomVector(rows * cols, 8000 + r));
        if (ef) state.error = asDtype(dtype, randomVector(rows * cols, 9000 + r));  // an earlier step's error
        const OneStep workspace = runStep(options, shape, dtype, grad, state, true, false);
        const OneStep formed = runStep(options, shape, dtype, grad, state, false, false);
        const OneStep inPlace = runStep(options, shape, dtype, grad, state, false, true);
        for (const OneStep* other : {&formed, &inPlace}) {  // the plan's and the compressor's bits
          EXPECT_EQ(other->p, workspace.p);
          EXPECT_EQ(other->q, workspace.q);
          EXPECT_EQ(other->out, workspace.out);
          EXPECT_EQ(other->error, workspace.error);
        }
        // M = g + e_old as the step forms it (in f32 from the dtype's values).
        std::vector<float> mat(rows * cols);
        for (size_t i = 0; i < mat.size(); ++i)
          mat[i] = elementAsFloat(dtype, grad, i) + (ef ? elementAsFloat(dtype, state.error, i) : 0.0f);
        const OneStep& s = formed;
        // The engine's products are the kernels' bits (whatever code the engine's build dispatched to).
        std::vector<float> qtUsed(cols * r), pKernel(rows * r), qtKernel(cols * r, 0.0f), qKernel(cols * r);
        kernels::toColumns(s.qUsed.data(), cols, r, qtUsed.data());
        for (size_t i = 0; i < rows; ++i)
          kernels::factorDots(mat.data() + i * cols, cols, qtUsed.data(), r, pKernel.data() + i * r);
        EXPECT_EQ(std::memcmp(pKernel.data(), s.p.data(), pKernel.size() * 4), 0) << "P is not the kernel's";
        kernels::accumulateRows(mat.data(), rows, cols, s.pOrthonormal.data(), r, qtKernel.data());
        kernels::fromColumns(qtKernel.data(), cols, r, qKernel.data());
        EXPECT_EQ(std::memcmp(qKernel.data(), s.q.data(), qKernel.size() * 4), 0) << "Q is not the kernel's";
        if (dtype == SHOAL_F32) {
          std::vector<float> qt(cols * r), a(cols);
          kernels::toColumns(s.q.data(), cols, r, qt.data());  // n = 1: the kept Q is the sum
          for (size_t i = 0; i < rows; ++i) {
            kernels::productRow(s.pOrthonormal.data() + i * r, qt.data(), r, cols, a.data());
            ASSERT_EQ(std::memcmp(a.data(), s.out.data() + i * cols, cols * 4), 0) << "A's row " << i;
          }
        }
        for (size_t i = 0; i < rows; ++i)
          for (int k = 0; k < r; ++k) {
            double sum = 0, absSum = 0;
            for (size_t j = 0; j < cols; ++j) {
              const double term = double(mat[i * cols + j]) * double(s.qUsed[j * r + k]);
              sum += term, absSum += std::fabs(term);
            }
            expectSum(s.p[i * r + k], sum, absSum, cols, "P = M Q");
          }
        for (size_t j = 0; j < cols; ++j)
          for (int k = 0; k < r; ++k) {
            double sum = 0, absSum = 0;
            for (size_t i = 0; i < rows; ++i) {
              const double term = double(mat[i * cols + j]) * double(s.pOrthonormal[i * r + k]);
              sum += term, absSum += std::fabs(term);
            }
            expectSum(s.q[j * r + k], sum, absSum, rows, "Q = Mt P");
          }
        // out = A = P Qᵀ (n = 1) and e_new = M - A (ef; else 0), within A's f32
        // rounding and the dtype's rounding of the stored values (bf16: 2^-8).
        const double stored = dtype == SHOAL_F32 ? 0.0 : 0x1.0p-8;
        for (size_t i = 0; i < rows; ++i)
          for (size_t j = 0; j < cols; ++j) {
            double sum = 0, absSum = 0;
            for (int k = 0; k < r; ++k) {
              const double term = double(s.pOrthonormal[i * r + k]) * double(s.q[j * r + k]);
              sum += term, absSum += std::fabs(term);
            }
            const double productError = r * kUnit * absSum;
            ASSERT_LE(std::fabs(s.out[i * cols + j] - sum), (1 + stored) * productError + stored * std::fabs(sum) + 1e-30)
                << "out at " << i << "," << j;
            const double error = elementAsFloat(dtype, s.error, i * cols + j);
            const double expected = ef ? double(mat[i * cols + j]) - sum : 0.0;
            ASSERT_LE(std::fabs(error - expected), 2 * productError + (2 * kUnit + stored) * std::fabs(expected) + 1e-30)
                << "error at " << i << "," << j;
          }
      }
}

}  // namespace
