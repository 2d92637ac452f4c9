// What fp16, bf16 and topk say about CUDA tensors before touching a device
// (so these run on any machine, with or without the CUDA build): the tables
// declare SHOAL_CAP_CUDA exactly in the CUDA build; a call mixing host and
// CUDA tensors, or CUDA tensors of two devices, is refused with a message that
// names both; a build without CUDA refuses CUDA tensors; topk refuses a CUDA
// tensor beyond 2^32 - 1 elements.
#include <gtest/gtest.h>

#include <string>
#include <vector>

#include "shoal/compressor.h"
#include "shoal/shoal.h"

namespace {

struct Call {
  const shoal_compressor_t* table = nullptr;
  void* instance = nullptr;
  std::vector<void*> states;
  std::vector<shoal_compress_tensor_t> tensors;
  char error[512] = {};

  Call(const char* name, std::vector<shoal_tensor_t> inputs) {
    EXPECT_EQ(shoal_compressor_lookup(name, &table), SHOAL_OK);
    shoal_compressor_params_t params{};
    params.struct_size = sizeof params;
    params.error_text = error;
    params.error_text_size = sizeof error;
    EXPECT_EQ(table->create(&params, &instance), SHOAL_OK) << error;
    states.assign(inputs.size(), nullptr);
    for (size_t t = 0; t < inputs.size(); ++t) {
      shoal_compress_tensor_t tensor{};
      tensor.input = tensor.output = inputs[t];
      tensor.name = "g";
      tensor.state = &states[t];
      tensors.push_back(tensor);
    }
  }
  ~Call() { table->destroy(instance); }

  shoal_status_t start(std::string* text) {
    shoal_compress_op_t op{};
    op.struct_size = sizeof op;
    op.world_size = 2;
    op.op = SHOAL_SUM;
    op.num_tensors = static_cast<int>(tensors.size());
    op.tensors = tensors.data();
    op.error_text = error;
    op.error_text_size = sizeof error;
    void* opState = nullptr;
    shoal_status_t status = table->start(instance, &op, &opState);
    *text = error;
    if (status == SHOAL_OK) table->finish(instance, opState);
    return status;
  }
};

float hostData[8];
// A CUDA tensor that is never dereferenced: every check below refuses before any device work.
shoal_tensor_t cudaTensor(size_t count, int device) {
  shoal_tensor_t tensor = shoal_tensor_1d(reinterpret_cast<void*>(0x1000), count, SHOAL_F32);
  tensor.memory = SHOAL_MEMORY_CUDA;
  tensor.device = device;
  return tensor;
}
shoal_tensor_t hostTensor() { return shoal_tensor_1d(hostData, 8, SHOAL_F32); }

bool mentions(const std::string& text, const std::string& part) { return text.find(part) != std::string::npos; }

TEST(GpuCompressorChecks, CapsFollowTheBuild) {
  for (const char* name : {"fp16", "bf16", "topk"}) {
    const shoal_compressor_t* table = nullptr;
    ASSERT_EQ(shoal_compressor_lookup(name, &table), SHOAL_OK);
    EXPECT_NE(table->caps & SHOAL_CAP_HOST, 0u) << name;
#if SHOAL_WITH_CUDA
    EXPECT_NE(table->caps & SHOAL_CAP_CUDA, 0u) << name << " has CUDA kernels in this build";
#else
    EXPECT_EQ(table->caps & SHOAL_CAP_CUDA, 0u) << name << " has no CUDA kernels in this build";
#endif
  }
}

TEST(GpuCompressorChecks, MixedMemoryIsRefused) {
  for (const char* name : {"fp16", "bf16", "topk"}) {
    std::string text;
    Call mixed(name, {hostTensor(), cudaTensor(8, 0)});
    EXPECT_EQ(mixed.start(&text), SHOAL_ERR_INVALID_ARGUMENT) << name;
    EXPECT_TRUE(mentions(text, "host") && mentions(text, "CUDA") && mentions(text, "tensor 1")) << name << ": " << text;
#if SHOAL_WITH_CUDA
    Call twoDevices(name, {cudaTensor(8, 0), cudaTensor(8, 1)});
    EXPECT_EQ(twoDevices.start(&text), SHOAL_ERR_INVALID_ARGUMENT) << name;
    EXPECT_TRUE(mentions(text, "device 1") && mentions(text, "device 0")) << name << ": " << text;
#endif
  }
}

#if SHOAL_WITH_CUDA
TEST(GpuCompressorChecks, TopkRefusesHugeCudaTensors) {
  std::string text;
  Call huge("topk", {cudaTensor(size_t(1) << 32, 0)});
  EXPECT_EQ(huge.start(&text), SHOAL_ERR_UNSUPPORTED);
  EXPECT_TRUE(mentions(text, "2^32 - 1")) << text;
}
#else
TEST(GpuCompressorChecks, CudaTensorsNeedTheCudaBuild) {
  for (const char* name : {"fp16", "bf16", "topk"}) {
    std::string text;
    Call call(name, {cudaTensor(8, 0)});
    EXPECT_EQ(call.start(&text), SHOAL_ERR_UNSUPPORTED) << name;
    EXPECT_TRUE(mentions(text, "SHOAL_WITH_CUDA")) << name << ": " << text;
  }
}
#endif

}  // namespace
