// The call's tag word (lib/comm/agree.cc): a communicator keeps the last
// signature it hashed and its word, so the same call again costs a
// comparison. Every field's change must still give the word of the new
// signature, and the scopes that declare calls restore what they replaced.
#include <gtest/gtest.h>

#include <string>
#include <vector>

#include "comm/agree.h"
#include "comm/communicator.h"

namespace {

using shoal::CallKind;
using shoal::CallScope;
using shoal::CallSignature;
using shoal::currentCallWord;
using shoal::refreshCallWord;
using shoal::signatureOf;

TEST(CallWordMemo, EveryChangedFieldGivesTheNewSignaturesWord) {
  // Texts in storage of their own: equal bytes at other addresses, and
  // other bytes of the same length.
  const std::string shm = "shm", shmAgain = "shm", tre = "tre", topk = "topk", ratio = "ratio=0.01";
  const CallSignature base = signatureOf(CallKind::Allreduce, SHOAL_F32, SHOAL_SUM, 6, -1, shm);
  std::vector<CallSignature> calls;
  auto add = [&](auto change) {
    CallSignature signature = base;
    change(signature);
    calls.push_back(signature);
    calls.push_back(base);  // and back
  };
  add([](CallSignature& s) { s.kind = CallKind::Broadcast; });
  add([](CallSignature& s) { s.dtype = SHOAL_F64; });
  add([](CallSignature& s) { s.op = SHOAL_MAX; });
  add([](CallSignature& s) { s.root = 1; });
  add([](CallSignature& s) { s.count = 7; });
  add([](CallSignature& s) { s.layout = 12345; });
  add([&](CallSignature& s) { s.algorithm = tre; });
  add([&](CallSignature& s) { s.algorithm = shmAgain; });
  add([](CallSignature& s) { s.compressed = true; });
  add([&](CallSignature& s) {
    s.compressed = true;
    s.compressor = topk;
  });
  add([&](CallSignature& s) {
    s.compressed = true;
    s.compressor = topk;
    s.options = ratio;
  });
  shoal_comm comm;
  for (size_t i = 0; i < calls.size(); ++i) {
    comm.call = calls[i];
    refreshCallWord(comm);
    EXPECT_EQ(currentCallWord(comm), calls[i].word()) << "call " << i << ": " << calls[i].describe();
    EXPECT_EQ(currentCallWord(comm), calls[i].word()) << "call " << i << " asked again";
  }
  // The hash tells the changes apart (the word's fields and its 7-bit digest).
  EXPECT_NE(calls[0].word(), base.word());
  EXPECT_NE(calls[8].word(), base.word()) << "count 7";
  EXPECT_EQ(calls[14].word(), base.word()) << "the same algorithm text elsewhere";
}

TEST(CallScope, NestedScopesRestoreTheEnclosingCallAndTheOutermostNoCall) {
  shoal_comm comm;
  const CallSignature none = comm.call;
  const CallSignature outer = signatureOf(CallKind::Allreduce, SHOAL_F32, SHOAL_SUM, 6, -1, "shm");
  const CallSignature inner = signatureOf(CallKind::Internal, -1, -1, 0, -1, "cuda-route-agreement");
  {
    CallScope first(comm, outer);
    EXPECT_EQ(currentCallWord(comm), outer.word());
    comm.call.compressed = true;  // the driver adds its decision to the running call
    refreshCallWord(comm);
    const uint32_t decided = currentCallWord(comm);
    {
      CallScope second(comm, inner);
      EXPECT_EQ(comm.call.digest(), inner.digest());
      EXPECT_EQ(currentCallWord(comm), inner.word());
    }
    EXPECT_TRUE(comm.call.compressed) << "the enclosing call as it was, decision included";
    EXPECT_EQ(comm.call.count, 6u);
    EXPECT_EQ(currentCallWord(comm), decided);
  }
  EXPECT_EQ(comm.call.digest(), none.digest());
  EXPECT_EQ(currentCallWord(comm), none.word());
  EXPECT_EQ(comm.callScopes, 0);
}

}  // namespace
