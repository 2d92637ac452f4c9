// The async runtime's pure pieces: the negotiation decision, the response
// cache, the announcement encoding and fusion planning.
#include <gtest/gtest.h>

#include <memory>

#include "runtime/fusion.h"
#include "runtime/negotiation.h"
#include "runtime/stall.h"

namespace shoal::runtime {
namespace {

Metadata allreduce(shoal_dtype_t dtype, std::vector<int64_t> shape, const char* compressor = "none") {
  Metadata m;
  m.kind = OpKind::Allreduce;
  m.dtype = dtype;
  m.shape = std::move(shape);
  m.compressor = compressor;
  return m;
}

TEST(Negotiation, ReadyNamesRunInRankZerosOrderOthersArePartial) {
  Metadata m = allreduce(SHOAL_F32, {4});
  std::vector<std::vector<Announcement>> perRank = {
      {{"b", m, 0.1}, {"a", m, 0.2}, {"only0", m, 3.0}},
      {{"a", m, 0.1}, {"c", m, 0.0}, {"b", m, 0.1}},
  };
  Verdict v = decide(perRank);
  EXPECT_EQ(v.ready, (std::vector<std::string>{"b", "a"}));
  EXPECT_TRUE(v.errors.empty());
  ASSERT_EQ(v.partial.size(), 2u);
  EXPECT_EQ(v.partial[0].name, "only0");
  EXPECT_EQ(v.partial[0].submitted, std::vector<int>{0});
  EXPECT_EQ(v.partial[0].missing, std::vector<int>{1});
  EXPECT_DOUBLE_EQ(v.partial[0].ageS, 3.0);
  EXPECT_EQ(v.partial[1].name, "c");
  EXPECT_EQ(v.partial[1].missing, std::vector<int>{0});
}

TEST(Negotiation, DisagreementIsAnErrorNamingTheFields) {
  std::vector<std::vector<Announcement>> perRank = {
      {{"w", allreduce(SHOAL_F32, {3, 4}), 0}},
      {{"w", allreduce(SHOAL_F32, {3, 4}), 0}},
      {{"w", allreduce(SHOAL_F64, {4, 4}, "fp16"), 0}},
  };
  Verdict v = decide(perRank);
  EXPECT_TRUE(v.ready.empty());
  ASSERT_EQ(v.errors.size(), 1u);
  const std::string& text = v.errors[0].second;
  EXPECT_NE(text.find("tensor 'w'"), std::string::npos) << text;
  EXPECT_NE(text.find("rank 2 submitted"), std::string::npos) << text;
  EXPECT_NE(text.find("dtype float vs double"), std::string::npos) << text;
  EXPECT_NE(text.find("shape [3, 4] vs [4, 4]"), std::string::npos) << text;
  EXPECT_NE(text.find("compressor none vs fp16"), std::string::npos) << text;
}

TEST(Negotiation, AnnouncementsSurviveEncoding) {
  Metadata m = allreduce(SHOAL_BF16, {2, 3, 5}, "powersgd");
  m.options = "rank=4";
  m.minBytes = 77;
  m.op = SHOAL_AVG;
  Metadata b;
  b.kind = OpKind::Broadcast;
  b.root = 3;
  b.dtype = SHOAL_U8;
  Metadata call;
  call.kind = OpKind::Blocking;
  call.call = "shoal_barrier";
  std::vector<Announcement> in = {{"x", m, 1.5}, {"y/z", b, 0}, {kBlockingName, call, 0.25}};
  std::string bytes = encodeAnnouncements(in);
  std::vector<Announcement> out = decodeAnnouncements(reinterpret_cast<const uint8_t*>(bytes.data()), bytes.size());
  ASSERT_EQ(out.size(), in.size());
  for (size_t i = 0; i < in.size(); ++i) {
    EXPECT_EQ(out[i].name, in[i].name);
    EXPECT_TRUE(out[i].meta == in[i].meta) << i;
    EXPECT_NEAR(out[i].ageS, in[i].ageS, 1e-6);
  }
  EXPECT_THROW(decodeAnnouncements(reinterpret_cast<const uint8_t*>(bytes.data()), bytes.size() - 3), Error);
}

TEST(ResponseCache, HitsNeedEqualMetadataAndEvictionIsLeastRecentlyUsed) {
  ResponseCache cache(2);
  Metadata m = allreduce(SHOAL_F32, {4});
  cache.put("a", "a", m, 1);
  cache.put("b", "b", m, 2);
  EXPECT_EQ(cache.lookup("a", m), 0);
  EXPECT_EQ(cache.lookup("b", m), 1);
  EXPECT_EQ(cache.lookup("a", allreduce(SHOAL_F32, {5})), -1) << "other metadata: not a hit";
  cache.touch(0, 3);  // a used more recently than b
  cache.put("c", "c", m, 4);
  EXPECT_EQ(cache.slots(), 2u);
  EXPECT_EQ(cache.lookup("b", m), -1) << "b was the least recently used";
  EXPECT_EQ(cache.lookup("c", m), 1) << "c takes b's slot";
  EXPECT_EQ(cache.lookup("a", m), 0);
  cache.put("a", "a", allreduce(SHOAL_F32, {9}), 5);  // renegotiated with new metadata: same slot
  EXPECT_EQ(cache.lookup("a", allreduce(SHOAL_F32, {9})), 0);
  ResponseCache none(0);
  none.put("a", "a", m, 1);
  EXPECT_EQ(none.slots(), 0u);
  EXPECT_EQ(none.lookup("a", m), -1);
  // Blocking calls share a name but get an entry per C call.
  Metadata barrier, allreduceCall;
  barrier.kind = allreduceCall.kind = OpKind::Blocking;
  barrier.call = "shoal_barrier";
  allreduceCall.call = "shoal_allreduce";
  ResponseCache calls(4);
  calls.put(cacheKey(kBlockingName, barrier), kBlockingName, barrier, 1);
  calls.put(cacheKey(kBlockingName, allreduceCall), kBlockingName, allreduceCall, 2);
  EXPECT_EQ(calls.lookup(cacheKey(kBlockingName, barrier), barrier), 0);
  EXPECT_EQ(calls.lookup(cacheKey(kBlockingName, allreduceCall), allreduceCall), 1);
  EXPECT_EQ(calls.nameAt(1), kBlockingName);
}

std::vector<Ready> readyOf(const std::vector<Metadata>& metas, const std::vector<bool>& compress) {
  std::vector<Ready> ready;
  for (size_t i = 0; i < metas.size(); ++i) {
    auto r = std::make_shared<Request>();
    r->name = "t" + std::to_string(i);
    r->meta = metas[i];
    ready.push_back({r, compress[i], Clock::now()});
  }
  return ready;
}

std::vector<std::vector<std::string>> namesOf(const std::vector<Group>& groups) {
  std::vector<std::vector<std::string>> out;
  for (const Group& g : groups) {
    out.emplace_back();
    for (const Ready* r : g.members) out.back().push_back(r->request->name);
  }
  return out;
}

TEST(Fusion, GroupsBySameDtypeOpAndCompressionUpToTheThreshold) {
  Metadata f = allreduce(SHOAL_F32, {10});            // 40 bytes
  Metadata d = allreduce(SHOAL_F64, {10});            // 80 bytes
  Metadata fp16 = allreduce(SHOAL_F32, {10}, "fp16"); // 40 bytes, compressed
  Metadata bcast;
  bcast.kind = OpKind::Broadcast;
  bcast.shape = {10};
  std::vector<Metadata> metas = {f, d, fp16, f, bcast, fp16, f, f};
  std::vector<bool> compress = {false, false, true, false, false, true, false, false};
  std::vector<Ready> ready = readyOf(metas, compress);
  auto groups = namesOf(planGroups(ready, 120));
  // f32 tensors: t0 t3 t6 (120 bytes), then t7 starts a new group.
  std::vector<std::vector<std::string>> expected = {{"t0", "t3", "t6"}, {"t1"}, {"t2", "t5"}, {"t4"}, {"t7"}};
  EXPECT_EQ(groups, expected);
  std::vector<Ready> again = readyOf(metas, compress);
  EXPECT_EQ(planGroups(again, 0).size(), metas.size()) << "threshold 0: no fusion";
}

TEST(Stall, ProbeIntervalFollowsTheShortestLimit) {
  StallSettings settings;
  settings.checkS = 60;
  settings.shutdownS = 0;
  settings.blockingTimeoutS = 300;
  EXPECT_DOUBLE_EQ(StallInspector(settings, 0).probeIntervalS(), 5.0);
  settings.checkS = 0.4;
  EXPECT_DOUBLE_EQ(StallInspector(settings, 0).probeIntervalS(), 0.1);
  Partial p;
  p.name = "g";
  p.submitted = {0, 2};
  p.missing = {1};
  p.ageS = 61;
  EXPECT_EQ(describeStalls({&p}), "'g' (missing ranks 1; submitted by 0, 2; waiting 61.0 s)");
  settings.shutdownS = 30;
  auto fatal = StallInspector(settings, 1).inspect({p});
  ASSERT_TRUE(fatal.has_value());
  EXPECT_NE(fatal->find("SHOAL_STALL_SHUTDOWN_S"), std::string::npos);
  p.ageS = 10;
  EXPECT_FALSE(StallInspector(settings, 1).inspect({p}).has_value());
}

}  // namespace
}  // namespace shoal::runtime
