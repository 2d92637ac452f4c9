// The PowerSGD plan of include/shoal/lowrank.h: its step equals the powersgd
// compressor's bit for bit (one tensor through shoal_allreduce_tensor on real
// communicators; several tensors through the compressor table against the
// split phases, ranks simulated in one thread); same-shape grouping of the
// layout; exactness for low-rank sums, error-feedback conservation and
// bit-identical Q on every rank, in f32, f16 and bf16; state save/load resumes
// bit for bit; bad arguments are refused with a message; the header is C11.
#include <gtest/gtest.h>

#include <cstddef>
#include <cstdint>

#include <cmath>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <fstream>
#include <mutex>
#include <string>
#include <vector>

#include "core/numeric/element_ops.h"
#include "compressors/powersgd/powersgd_engine.h"
#include "harness/compressor_rounds.h"
#include "harness/dtype_model.h"
#include "harness/harness.h"
#include "shoal/compressor.h"
#include "shoal/lowrank.h"
#include "shoal/shoal.h"

namespace {

using shoal::test::CompressorRounds;
using shoal::test::runRanks;

using shoal::test::mix64;  // splitmix64 (harness/dtype_model.h)

float uniform(uint64_t a, uint64_t b, uint64_t c, uint64_t i) {
  uint64_t h = mix64(a ^ mix64(b * 1000003u ^ mix64(c * 7919u ^ mix64(i))));
  return static_cast<float>(double(h >> 11) * 0x1.0p-52 - 1.0);
}

size_t elementBytes(shoal_dtype_t dtype) { return dtype == SHOAL_F32 ? 4 : 2; }

float toFloat(shoal_dtype_t dtype, const uint8_t* data, size_t i) {
  using namespace shoal::ops;
  if (dtype == SHOAL_F16) return widen(reinterpret_cast<const Half*>(data)[i]);
  if (dtype == SHOAL_BF16) return widen(reinterpret_cast<const BFloat16*>(data)[i]);
  return reinterpret_cast<const float*>(data)[i];
}

// A gradient in dtype: rank-k sums over ranks (g_w = sum_j u_wj v_jᵀ, v_j shared)
// or, with k = 0, full-rank noise.
std::vector<uint8_t> gradient(shoal_dtype_t dtype, int rank, int step, size_t rows, size_t cols, int k) {
  std::vector<float> g(rows * cols, 0.0f);
  if (k == 0)
    for (size_t i = 0; i < g.size(); ++i) g[i] = uniform(5, rank, step, i);
  for (int j = 0; j < k; ++j)
    for (size_t i = 0; i < rows; ++i) {
      float u = uniform(42, 1 + rank, 100 * step + j, i);
      for (size_t c = 0; c < cols; ++c) g[i * cols + c] += u * uniform(43, 7, 100 * step + j, c);
    }
  std::vector<uint8_t> bytes(g.size() * elementBytes(dtype));
  for (size_t i = 0; i < g.size(); ++i) {
    using namespace shoal::ops;
    if (dtype == SHOAL_F16) reinterpret_cast<Half*>(bytes.data())[i] = narrow<Half>(g[i]);
    else if (dtype == SHOAL_BF16) reinterpret_cast<BFloat16*>(bytes.data())[i] = narrow<BFloat16>(g[i]);
    else reinterpret_cast<float*>(bytes.data())[i] = g[i];
  }
  return bytes;
}

shoal_lowrank_plan_t makePlan(const std::vector<shoal_lowrank_matrix_t>& matrices, const shoal_lowrank_config_t& c) {
  shoal_lowrank_plan_t plan = nullptr;
  EXPECT_EQ(shoal_lowrank_plan_create(matrices.data(), static_cast<int>(matrices.size()), &c, &plan), SHOAL_OK)
      << shoal_last_error(nullptr);
  return plan;
}

std::vector<uint8_t> planState(shoal_lowrank_plan_t plan) {
  size_t bytes = 0;
  EXPECT_EQ(shoal_lowrank_state_save(plan, nullptr, &bytes), SHOAL_OK) << shoal_last_error(nullptr);
  std::vector<uint8_t> state(bytes);
  EXPECT_EQ(shoal_lowrank_state_save(plan, state.data(), &bytes), SHOAL_OK) << shoal_last_error(nullptr);
  return state;
}

// Matrix i's blob inside a plan state (header of 3 words, then u64 size + blob each).
std::vector<uint8_t> matrixBlob(const std::vector<uint8_t>& state, size_t index) {
  size_t offset = 24;
  for (size_t i = 0;; ++i) {
    uint64_t size = 0;
    std::memcpy(&size, state.data() + offset, 8);
    if (i == index) return std::vector<uint8_t>(state.begin() + offset + 8, state.begin() + offset + 8 + size);
    offset += 8 + size;
  }
}

std::vector<uint8_t> compressorState(shoal_comm_t comm, const char* options, const char* name) {
  size_t bytes = 0;
  EXPECT_EQ(shoal_compressor_state_save(comm, "powersgd", options, name, nullptr, &bytes), SHOAL_OK)
      << shoal_last_error(comm);
  std::vector<uint8_t> state(bytes);
  EXPECT_EQ(shoal_compressor_state_save(comm, "powersgd", options, name, state.data(), &bytes), SHOAL_OK)
      << shoal_last_error(comm);
  return state;
}

class PlanDtype : public ::testing::TestWithParam<shoal_dtype_t> {};

// One matrix: shoal_lowrank_step and shoal_allreduce_tensor with "powersgd" give
// the same output bits and the same state, step after step (a plain step first:
// start_iter 1), on 3 real communicators.
TEST_P(PlanDtype, StepEqualsCompressorBitForBit) {
  const shoal_dtype_t dtype = GetParam();
  const int n = 3;
  const size_t rows = 48, cols = 40;
  const char* options = "rank=3,start_iter=1,seed=11";
  runRanks(n, [&](int rank, shoal_comm_t comm) {
    shoal_lowrank_config_t config = SHOAL_LOWRANK_CONFIG_INIT;
    config.rank = 3;
    config.start_iter = 1;
    config.seed = 11;
    config.dtype = dtype;
    shoal_lowrank_plan_t plan = makePlan({{int64_t(rows), int64_t(cols), 0, 0, "layer.w"}}, config);
    ASSERT_NE(plan, nullptr);
    for (int step = 0; step < 4; ++step) {
      std::vector<uint8_t> g = gradient(dtype, rank, step, rows, cols, 0);
      std::vector<uint8_t> viaCompressor(g.size()), viaPlan(g.size());
      shoal_tensor_t in = shoal_tensor_1d(g.data(), rows * cols, dtype);
      in.ndim = 2;
      in.shape[0] = int64_t(rows);
      in.shape[1] = int64_t(cols);
      shoal_tensor_t out = in;
      out.data = viaCompressor.data();
      shoal_allreduce_options_t opts = SHOAL_ALLREDUCE_OPTIONS_INIT;
      opts.name = "layer.w";
      opts.compressor = "powersgd";
      opts.compressor_options = options;
      opts.compress_min_bytes = 0;
      ASSERT_EQ(shoal_allreduce_tensor(comm, &in, &out, SHOAL_AVG, &opts), SHOAL_OK) << shoal_last_error(comm);
      const void* grads[] = {g.data()};
      void* outs[] = {viaPlan.data()};
      ASSERT_EQ(shoal_lowrank_step(plan, comm, grads, outs, SHOAL_AVG), SHOAL_OK) << shoal_last_error(comm);
      ASSERT_EQ(std::memcmp(viaCompressor.data(), viaPlan.data(), g.size()), 0) << "step " << step;
      EXPECT_EQ(matrixBlob(planState(plan), 0), compressorState(comm, options, "layer.w")) << "step " << step;
    }
    shoal_lowrank_plan_destroy(plan);
  });
}

// Low-rank sums come out exact (to the dtype's rounding), every rank holds the
// same Q bits after every step, and error feedback conserves the signal:
// out + e_new == g + e_old (avg), read through shoal_lowrank_state_save.
TEST_P(PlanDtype, ExactConservingAndQIdentical) {
  const shoal_dtype_t dtype = GetParam();
  const int n = 3;
  const size_t rows = 40, cols = 24;
  const double unit = dtype == SHOAL_F32 ? 1e-6 : dtype == SHOAL_F16 ? 1e-3 : 8e-3;
  std::mutex mutex;
  std::vector<std::vector<std::vector<uint8_t>>> qs(4, std::vector<std::vector<uint8_t>>(n));
  runRanks(n, [&](int rank, shoal_comm_t comm) {
    shoal_lowrank_config_t config = SHOAL_LOWRANK_CONFIG_INIT;
    config.dtype = dtype;
    shoal_lowrank_plan_t plan = makePlan({{int64_t(rows), int64_t(cols), 0, 0, "exact"}}, config);
    ASSERT_NE(plan, nullptr);
    const size_t bytes = rows * cols * elementBytes(dtype);
    for (int step = 0; step < 4; ++step) {
      // Steps 0, 1: rank-2 sums (exact); steps 2, 3: full rank (conservation only).
      const int k = step < 2 ? 2 : 0;
      std::vector<uint8_t> g = gradient(dtype, rank, step, rows, cols, k), out(g.size());
      std::vector<uint8_t> before = planState(plan);
      const void* grads[] = {g.data()};
      void* outs[] = {out.data()};
      ASSERT_EQ(shoal_lowrank_step(plan, comm, grads, outs, SHOAL_AVG), SHOAL_OK) << shoal_last_error(comm);
      std::vector<uint8_t> after = planState(plan);
      const std::vector<uint8_t> eOld = matrixBlob(before, 0), eNew = matrixBlob(after, 0);
      for (size_t i = 0; i < rows * cols; ++i) {
        const double o = toFloat(dtype, out.data(), i), en = toFloat(dtype, eNew.data(), i);
        const double gi = toFloat(dtype, g.data(), i), eo = toFloat(dtype, eOld.data(), i);
        ASSERT_NEAR(o + en, gi + eo, 4 * unit * (std::fabs(o) + std::fabs(en) + std::fabs(gi) + std::fabs(eo)) + 1e-12)
            << "step " << step << " i " << i;
      }
      if (k > 0) {
        double scale = 0, worst = 0;
        for (size_t i = 0; i < rows * cols; ++i) {
          double want = 0;
          for (int w = 0; w < n; ++w) {
            std::vector<uint8_t> gw = gradient(dtype, w, step, rows, cols, k);
            want += toFloat(dtype, gw.data(), i);
          }
          want /= n;
          // Step 1 carries step 0's residual (tiny for an exact step 0).
          scale = std::max(scale, std::fabs(want));
          worst = std::max(worst, std::fabs(toFloat(dtype, out.data(), i) - want));
        }
        EXPECT_LE(worst, 16 * unit * scale) << "step " << step;
      }
      std::lock_guard<std::mutex> lock(mutex);
      const std::vector<uint8_t> blob = matrixBlob(after, 0);
      qs[step][rank].assign(blob.begin() + bytes, blob.end());  // Q and the trailer
    }
    shoal_lowrank_plan_destroy(plan);
  });
  for (int step = 0; step < 4; ++step)
    for (int w = 1; w < n; ++w) EXPECT_EQ(qs[step][w], qs[step][0]) << "step " << step << " rank " << w;
}

// Save after two steps, run a third; a fresh plan that loads the saved state
// runs the same third step to the same bits (output and state).
TEST_P(PlanDtype, StateSaveLoadResumesBitIdentically) {
  const shoal_dtype_t dtype = GetParam();
  const int n = 2;
  runRanks(n, [&](int rank, shoal_comm_t comm) {
    shoal_lowrank_config_t config = SHOAL_LOWRANK_CONFIG_INIT;
    config.dtype = dtype;
    config.rank = 2;
    config.start_iter = 1;
    const std::vector<shoal_lowrank_matrix_t> matrices = {
        {32, 20, 0, 0, "a"}, {16, 1, 0, SHOAL_LOWRANK_DENSE, "bias"}, {32, 20, 0, 0, "b"}};
    shoal_lowrank_plan_t plan = makePlan(matrices, config);
    ASSERT_NE(plan, nullptr);
    auto step = [&](shoal_lowrank_plan_t p, int s, std::vector<std::vector<uint8_t>>& outs) {
      std::vector<std::vector<uint8_t>> g(matrices.size());
      std::vector<const void*> grads;
      std::vector<void*> outputs;
      outs.assign(matrices.size(), {});
      for (size_t m = 0; m < matrices.size(); ++m) {
        g[m] = gradient(dtype, rank, 10 * s + int(m), size_t(matrices[m].rows), size_t(matrices[m].cols), 0);
        outs[m].assign(g[m].size(), 0);
        grads.push_back(g[m].data());
        outputs.push_back(outs[m].data());
      }
      ASSERT_EQ(shoal_lowrank_step(p, comm, grads.data(), outputs.data(), SHOAL_SUM), SHOAL_OK)
          << shoal_last_error(comm);
    };
    std::vector<std::vector<uint8_t>> outs, resumedOuts;
    step(plan, 0, outs);
    step(plan, 1, outs);
    const std::vector<uint8_t> saved = planState(plan);
    shoal_lowrank_sizes_t sizes = SHOAL_LOWRANK_SIZES_INIT;
    ASSERT_EQ(shoal_lowrank_plan_sizes(plan, &sizes), SHOAL_OK);
    EXPECT_EQ(sizes.state_bytes, saved.size());
    step(plan, 2, outs);
    shoal_lowrank_plan_t resumed = makePlan(matrices, config);
    ASSERT_EQ(shoal_lowrank_state_load(resumed, saved.data(), saved.size()), SHOAL_OK) << shoal_last_error(nullptr);
    EXPECT_EQ(planState(resumed), saved);
    step(resumed, 2, resumedOuts);
    EXPECT_EQ(outs, resumedOuts);
    EXPECT_EQ(planState(resumed), planState(plan));
    shoal_lowrank_plan_destroy(plan);
    shoal_lowrank_plan_destroy(resumed);
  });
}

INSTANTIATE_TEST_SUITE_P(Dtypes, PlanDtype, ::testing::Values(SHOAL_F32, SHOAL_F16, SHOAL_BF16),
                         [](const auto& info) { return std::string(shoal_dtype_name(info.param)); });

// Several tensors in one compressor call (the table driven by
// harness/compressor_rounds.h) and the plan's split phases, 2 ranks simulated
// in one thread with the same sums: the same payloads and outputs, bit for bit.
// Two same-shape matrices are adjacent in P whatever their order in the call.
TEST(LowrankPlan, SplitPhasesEqualTheCompressorTable) {
  const shoal_compressor_t* table = nullptr;
  ASSERT_EQ(shoal_compressor_lookup("powersgd", &table), SHOAL_OK) << shoal_last_error(nullptr);
  const int n = 2, count = 4;
  const size_t rows[count] = {40, 10, 30, 40}, cols[count] = {24, 1, 20, 24};
  const char* names[count] = {"t/a", "t/bias", "t/b", "t/c"};
  std::vector<shoal_lowrank_matrix_t> matrices;
  std::vector<CompressorRounds::TensorSpec> specs;
  for (int t = 0; t < count; ++t) {
    matrices.push_back({int64_t(rows[t]), int64_t(cols[t]), 0, cols[t] == 1 ? SHOAL_LOWRANK_DENSE : 0u, names[t]});
    specs.push_back({SHOAL_F32, cols[t] > 1 ? std::vector<int64_t>{int64_t(rows[t]), int64_t(cols[t])}
                                            : std::vector<int64_t>{int64_t(rows[t])}, names[t]});
  }
  shoal_lowrank_config_t config = SHOAL_LOWRANK_CONFIG_INIT;
  config.rank = 2;
  struct Side {  // one rank's plan, stepped beside the table
    shoal_lowrank_plan_t plan = nullptr;
    std::vector<float> pbuf, qbuf;
    std::vector<std::vector<float>> out;
  };
  std::vector<Side> sides(n);
  for (Side& side : sides) {
    side.plan = makePlan(matrices, config);
    shoal_lowrank_sizes_t sizes = SHOAL_LOWRANK_SIZES_INIT;
    ASSERT_EQ(shoal_lowrank_plan_sizes(side.plan, &sizes), SHOAL_OK);
    EXPECT_EQ(sizes.compressed, 3u);
    EXPECT_EQ(sizes.dense_elems, 10u);
    EXPECT_EQ(sizes.p_elems, 40 * 24 * 2 + 10 + 30 * 20u);  // plain steps: every tensor densely
    EXPECT_EQ(sizes.q_elems, (24 + 20 + 24) * 2u);
    side.pbuf.resize(sizes.p_elems);
    side.qbuf.resize(sizes.q_elems);
  }
  CompressorRounds rounds(table, n);
  ASSERT_EQ(rounds.create({{"rank", "2"}}), SHOAL_OK) << rounds.error(rounds.failedRank());
  int step = 0;
  // After the table's round on rank w, the plan's phase on rank w: the same buffer.
  rounds.observe([&](int w, const shoal_round_t& round) {
    Side& side = sides[w];
    if (round.index == 0) {
      std::vector<const void*> grads;
      for (int t = 0; t < count; ++t) grads.push_back(rounds.input(w, t));
      size_t pCount = 0;
      ASSERT_EQ(shoal_lowrank_phase_p(side.plan, grads.data(), side.pbuf.data(), &pCount), SHOAL_OK)
          << shoal_last_error(nullptr);
      ASSERT_EQ(round.payloads[0].count, pCount);
      ASSERT_EQ(std::memcmp(round.payloads[0].buffer, side.pbuf.data(), pCount * 4), 0) << "step " << step;
    } else if (round.index == 1) {
      size_t qCount = 0;
      ASSERT_EQ(shoal_lowrank_phase_q(side.plan, side.pbuf.data(), side.qbuf.data(), &qCount), SHOAL_OK)
          << shoal_last_error(nullptr);
      ASSERT_EQ(round.payloads[0].count, qCount);
      ASSERT_EQ(std::memcmp(round.payloads[0].buffer, side.qbuf.data(), qCount * 4), 0) << "step " << step;
    } else {
      ASSERT_EQ(round.done, 1);
      side.out.assign(count, {});
      std::vector<void*> outs;
      for (int t = 0; t < count; ++t) {
        side.out[t].assign(rows[t] * cols[t], -2.0f);
        outs.push_back(side.out[t].data());
      }
      ASSERT_EQ(shoal_lowrank_finish(side.plan, side.pbuf.data(), side.qbuf.data(), outs.data(), n, SHOAL_AVG),
                SHOAL_OK)
          << shoal_last_error(nullptr);
    }
  });
  // The table's payload was summed over the ranks in rank order (as shoal's
  // Reducer does: rank 0's values, then each next rank's added): sum the
  // plans' buffers the same way.
  auto sumThePlans = [&](shoal::test::Delivered& delivered) {
    const size_t elems = delivered.bytes.size() / 4;
    if (delivered.round == 0) EXPECT_EQ(elems, (40 + 30 + 40) * 2 + 10u);
    auto buffer = [&](Side& side) { return delivered.round == 0 ? side.pbuf.data() : side.qbuf.data(); };
    std::vector<float> sum(buffer(sides[0]), buffer(sides[0]) + elems);
    for (int w = 1; w < n; ++w)
      for (size_t i = 0; i < elems; ++i) sum[i] += buffer(sides[w])[i];
    for (Side& side : sides) std::memcpy(buffer(side), sum.data(), elems * 4);
  };
  for (step = 0; step < 3; ++step) {
    auto fill = [&](int w, int t, void* data) {
      std::vector<uint8_t> g = gradient(SHOAL_F32, w, 10 * step + t, rows[t], cols[t], t == 3 ? 0 : 1);
      std::memcpy(data, g.data(), g.size());
    };
    ASSERT_EQ(rounds.allreduce(specs, SHOAL_AVG, uint64_t(step), fill, sumThePlans), SHOAL_OK)
        << rounds.error(rounds.failedRank());
    ASSERT_EQ(rounds.rounds(), 2);
    for (int w = 0; w < n; ++w) {
      for (int t = 0; t < count; ++t)
        EXPECT_EQ(rounds.outputAs<float>(w, t), sides[w].out[t]) << "step " << step << " rank " << w << " tensor " << t;
      // The rank-1 matrices (a, b) and the dense bias are exact up to rounding.
      for (int t : {0, 1, 2}) {
        const std::vector<float> in0 = rounds.inputAs<float>(0, t), in1 = rounds.inputAs<float>(1, t);
        double worst = 0, scale = 0;
        for (size_t i = 0; i < rows[t] * cols[t]; ++i) {
          const double want = (double(in0[i]) + double(in1[i])) / 2;
          scale = std::max(scale, std::fabs(want));
          worst = std::max(worst, std::fabs(sides[w].out[t][i] - want));
        }
        EXPECT_LE(worst, 1e-4 * scale) << "step " << step << " tensor " << t;
      }
    }
  }
  for (Side& side : sides) shoal_lowrank_plan_destroy(side.plan);
}

// Same-shape matrices are adjacent in P, Q and M, in order of first appearance;
// dense ones follow the P blocks.
TEST(LowrankPlan, LayoutGroupsSameShapes) {
  using namespace shoal::powersgd;
  const std::vector<Shape> shapes = {shapeOf(40, 24, 4, 2.0, false), shapeOf(16, 1, 4, 2.0, true),
                                     shapeOf(30, 20, 4, 2.0, false), shapeOf(40, 24, 4, 2.0, false),
                                     shapeOf(4, 4, 4, 2.0, false)};
  EXPECT_EQ(shapes[0].r, 4);
  EXPECT_EQ(shapes[1].r, 0);
  EXPECT_EQ(shapes[4].r, 0);  // 4x4 would not shrink
  const Layout layout = makeLayout(shapes);
  ASSERT_EQ(layout.groups.size(), 2u);
  EXPECT_EQ(layout.groups[0].members, (std::vector<int>{0, 3}));
  EXPECT_EQ(layout.groups[1].members, (std::vector<int>{2}));
  EXPECT_EQ(layout.entries[0].pOffset, 0u);
  EXPECT_EQ(layout.entries[3].pOffset, 40u * 4);
  EXPECT_EQ(layout.entries[2].pOffset, 80u * 4);
  EXPECT_EQ(layout.entries[3].qOffset, 24u * 4);
  EXPECT_EQ(layout.entries[3].mOffset, 40u * 24);
  EXPECT_EQ(layout.pElems, (40u + 40 + 30) * 4);
  EXPECT_EQ(layout.entries[1].pOffset, layout.pElems);
  EXPECT_EQ(layout.entries[4].pOffset, layout.pElems + 16);
  EXPECT_EQ(layout.denseElems, 16u + 16);
  EXPECT_EQ(layout.plainElems, 40u * 24 * 2 + 16 + 600 + 16);
}

// Zero gradients: zeros out, no NaN, through the plan.
TEST(LowrankPlan, ZeroGradientsGiveZeros) {
  shoal_lowrank_config_t config = SHOAL_LOWRANK_CONFIG_INIT;
  shoal_lowrank_plan_t plan = makePlan({{64, 48, 0, 0, "zero"}}, config);
  ASSERT_NE(plan, nullptr);
  std::vector<float> g(64 * 48, 0.0f), out(64 * 48, 3.0f), pbuf, qbuf;
  shoal_lowrank_sizes_t sizes = SHOAL_LOWRANK_SIZES_INIT;
  ASSERT_EQ(shoal_lowrank_plan_sizes(plan, &sizes), SHOAL_OK);
  pbuf.resize(sizes.p_elems);
  qbuf.resize(sizes.q_elems);
  for (int step = 0; step < 2; ++step) {
    const void* grads[] = {g.data()};
    void* outs[] = {out.data()};
    size_t pCount = 0, qCount = 0;
    ASSERT_EQ(shoal_lowrank_phase_p(plan, grads, pbuf.data(), &pCount), SHOAL_OK);
    ASSERT_EQ(shoal_lowrank_phase_q(plan, pbuf.data(), qbuf.data(), &qCount), SHOAL_OK);
    ASSERT_EQ(shoal_lowrank_finish(plan, pbuf.data(), qbuf.data(), outs, 1, SHOAL_AVG), SHOAL_OK);
    for (float x : out) ASSERT_EQ(x, 0.0f);
  }
  shoal_lowrank_plan_destroy(plan);
}

// An older caller's config: its struct_size is where one of the fields ends
// or that end padded to the struct's alignment (the older sizeof: here a
// version ending at `device`, 52 bytes of fields, 56 with padding); the fields
// beyond take the defaults. A size inside a field is refused.
TEST(LowrankPlan, OlderConfigSizesAreReadUpToTheirFields) {
  shoal_lowrank_matrix_t m = {8, 8, 0, 0, nullptr};
  shoal_lowrank_config_t config = SHOAL_LOWRANK_CONFIG_INIT;
  config.stream = reinterpret_cast<void*>(uintptr_t(0x1234));  // beyond both older sizes: must not be read
  // A version ending at dtype: `memory` beyond it holds a value checkConfig
  // refuses, so reading past struct_size would fail the call.
  config.memory = static_cast<shoal_memory_t>(7);
  config.struct_size = offsetof(shoal_lowrank_config_t, memory);
  shoal_lowrank_plan_t older = nullptr;
  EXPECT_EQ(shoal_lowrank_plan_create(&m, 1, &config, &older), SHOAL_OK) << shoal_last_error(nullptr);
  shoal_lowrank_plan_destroy(older);
  config.memory = SHOAL_MEMORY_HOST;
  for (size_t size : {offsetof(shoal_lowrank_config_t, stream) - 4, offsetof(shoal_lowrank_config_t, stream)}) {
    config.struct_size = size;
    shoal_lowrank_plan_t plan = nullptr;
    EXPECT_EQ(shoal_lowrank_plan_create(&m, 1, &config, &plan), SHOAL_OK)
        << "struct_size " << size << ": " << shoal_last_error(nullptr);
    shoal_lowrank_plan_destroy(plan);
  }
  config.struct_size = offsetof(shoal_lowrank_config_t, stream) + 4;
  shoal_lowrank_plan_t plan = nullptr;
  EXPECT_EQ(shoal_lowrank_plan_create(&m, 1, &config, &plan), SHOAL_ERR_INVALID_ARGUMENT);
  EXPECT_NE(std::string(shoal_last_error(nullptr)).find("SHOAL_LOWRANK_CONFIG_INIT"), std::string::npos)
      << shoal_last_error(nullptr);
  EXPECT_EQ(plan, nullptr);
}

TEST(LowrankPlan, BadArgumentsAreRefused) {
  shoal_lowrank_plan_t plan = nullptr;
  shoal_lowrank_matrix_t m = {8, 8, 0, 0, nullptr};
  shoal_lowrank_config_t config = SHOAL_LOWRANK_CONFIG_INIT;
  auto refused = [](shoal_status_t status, const char* needle) {
    EXPECT_EQ(status, SHOAL_ERR_INVALID_ARGUMENT);
    EXPECT_NE(std::string(shoal_last_error(nullptr)).find(needle), std::string::npos) << shoal_last_error(nullptr);
  };
  refused(shoal_lowrank_plan_create(nullptr, 1, &config, &plan), "matrices is NULL");
  refused(shoal_lowrank_plan_create(&m, 0, &config, &plan), "num_matrices");
  config.rank = 0;
  refused(shoal_lowrank_plan_create(&m, 1, &config, &plan), "rank");
  config = SHOAL_LOWRANK_CONFIG_INIT;
  config.dtype = SHOAL_I32;
  refused(shoal_lowrank_plan_create(&m, 1, &config, &plan), "dtype");
  config = SHOAL_LOWRANK_CONFIG_INIT;
  config.min_compression_rate = -1;
  refused(shoal_lowrank_plan_create(&m, 1, &config, &plan), "min_compression_rate");
  config = SHOAL_LOWRANK_CONFIG_INIT;
  shoal_lowrank_matrix_t bad = {-1, 8, 0, 0, nullptr};
  refused(shoal_lowrank_plan_create(&bad, 1, &config, &plan), "extents");
  bad = {8, 8, 0, 4u, nullptr};
  refused(shoal_lowrank_plan_create(&bad, 1, &config, &plan), "flags");
  EXPECT_EQ(plan, nullptr);

  ASSERT_EQ(shoal_lowrank_plan_create(&m, 1, nullptr, &plan), SHOAL_OK) << shoal_last_error(nullptr);
  std::vector<float> g(64, 1.0f), pbuf(64), qbuf(64);
  const void* grads[] = {g.data()};
  void* outs[] = {g.data()};
  size_t count = 0;
  refused(shoal_lowrank_phase_q(plan, pbuf.data(), qbuf.data(), &count), "out of order");
  refused(shoal_lowrank_finish(plan, pbuf.data(), qbuf.data(), outs, 1, SHOAL_AVG), "out of order");
  const void* nullGrads[] = {nullptr};
  refused(shoal_lowrank_phase_p(plan, nullGrads, pbuf.data(), &count), "grads[0] is NULL");
  ASSERT_EQ(shoal_lowrank_phase_p(plan, grads, pbuf.data(), &count), SHOAL_OK);
  refused(shoal_lowrank_finish(plan, pbuf.data(), qbuf.data(), outs, 1, SHOAL_AVG), "out of order");
  // A state from another plan (other shape) is refused; so is garbage.
  shoal_lowrank_plan_t other = nullptr;
  shoal_lowrank_matrix_t big = {16, 16, 0, 0, nullptr};
  ASSERT_EQ(shoal_lowrank_plan_create(&big, 1, nullptr, &other), SHOAL_OK);
  const std::vector<uint8_t> otherState = planState(other);
  refused(shoal_lowrank_state_load(plan, otherState.data(), otherState.size()), "matrix 0");
  const std::vector<uint8_t> garbage(64, 7);
  refused(shoal_lowrank_state_load(plan, garbage.data(), garbage.size()), "not a plan state");
  EXPECT_EQ(shoal_lowrank_step(plan, nullptr, grads, outs, SHOAL_AVG), SHOAL_ERR_INVALID_ARGUMENT);
  shoal_lowrank_plan_destroy(other);
  shoal_lowrank_plan_destroy(plan);
  shoal_lowrank_plan_destroy(nullptr);
}

// Ranks with different plans are refused on every rank by the first step (no
// hang, no wrong result), and the communicator still works afterwards.
TEST(LowrankPlan, DifferentPlansAcrossRanksAreRefused) {
  runRanks(3, [&](int rank, shoal_comm_t comm) {
    shoal_lowrank_config_t config = SHOAL_LOWRANK_CONFIG_INIT;
    const int64_t cols = rank == 2 ? 40 : 48;  // rank 2 disagrees on a shape
    shoal_lowrank_plan_t plan = makePlan({{64, cols, 0, 0, "w"}}, config);
    ASSERT_NE(plan, nullptr);
    std::vector<float> g(size_t(64 * cols), 1.0f);
    const void* grads[] = {g.data()};
    void* outs[] = {g.data()};
    EXPECT_EQ(shoal_lowrank_step(plan, comm, grads, outs, SHOAL_AVG), SHOAL_ERR_MISMATCH);
    EXPECT_NE(std::string(shoal_last_error(comm)).find("plans differ"), std::string::npos) << shoal_last_error(comm);
    float x = 1.0f;
    EXPECT_EQ(shoal_allreduce(comm, &x, &x, 1, SHOAL_F32, SHOAL_SUM), SHOAL_OK) << shoal_last_error(comm);
    EXPECT_EQ(x, 3.0f);
    shoal_lowrank_plan_destroy(plan);
  });
}

// A CUDA plan needs the GPU build, and a device: otherwise a clear error, no plan.
TEST(LowrankPlan, CudaPlanWithoutCudaIsRefused) {
  shoal_lowrank_matrix_t m = {64, 48, 0, 0, "w"};
  shoal_lowrank_config_t config = SHOAL_LOWRANK_CONFIG_INIT;
  config.memory = SHOAL_MEMORY_CUDA;
  shoal_lowrank_plan_t plan = nullptr;
  const shoal_status_t status = shoal_lowrank_plan_create(&m, 1, &config, &plan);
#if SHOAL_WITH_CUDA
  if (status == SHOAL_OK) {  // a device is present: tests/cuda covers the plan there
    shoal_lowrank_plan_destroy(plan);
    GTEST_SKIP() << "a CUDA device is present";
  }
  EXPECT_EQ(status, SHOAL_ERR_INTERNAL);
  EXPECT_NE(std::string(shoal_last_error(nullptr)).find("CUDA"), std::string::npos) << shoal_last_error(nullptr);
#else
  EXPECT_EQ(status, SHOAL_ERR_UNSUPPORTED);
  EXPECT_NE(std::string(shoal_last_error(nullptr)).find("built with CUDA"), std::string::npos)
      << shoal_last_error(nullptr);
#endif
  EXPECT_EQ(plan, nullptr);
}

// include/shoal/lowrank.h is C11: a small C program using the plan API compiles
// with -std=c11 -pedantic -Werror (skipped when no C compiler is on PATH).
TEST(LowrankPlan, HeaderIsC11) {
  if (std::system("cc --version > /dev/null 2>&1") != 0) GTEST_SKIP() << "no C compiler (cc) on PATH";
  const std::string dir = ::testing::TempDir();
  const std::string source = dir + "/lowrank_plan_c.c";
  std::ofstream(source) << "#include <shoal/lowrank.h>\n"
                           "int use(shoal_comm_t comm, const void *const *g, void *const *o) {\n"
                           "  shoal_lowrank_matrix_t m = {64, 48, 0, 0, \"w\"};\n"
                           "  shoal_lowrank_config_t c = SHOAL_LOWRANK_CONFIG_INIT;\n"
                           "  shoal_lowrank_sizes_t s = SHOAL_LOWRANK_SIZES_INIT;\n"
                           "  shoal_lowrank_plan_t plan = NULL;\n"
                           "  if (shoal_lowrank_plan_create(&m, 1, &c, &plan) != SHOAL_OK) return 1;\n"
                           "  shoal_lowrank_plan_sizes(plan, &s);\n"
                           "  shoal_status_t st = shoal_lowrank_step(plan, comm, g, o, SHOAL_AVG);\n"
                           "  shoal_lowrank_plan_destroy(plan);\n"
                           "  return st == SHOAL_OK ? (int)s.p_elems : -1;\n"
                           "}\n";
  const std::string command = "cc -std=c11 -pedantic -Wall -Wextra -Werror -fsyntax-only -I" SHOAL_SOURCE_DIR
                              "/include " + source + " 2>&1";
  EXPECT_EQ(std::system(command.c_str()), 0) << command;
}

}  // namespace
