// Names of status codes, dtypes and ops, and parsing of the names shoal-bench
// and nccl-tests use.
#include <cstring>
#include <string>

#include "api/export.h"
#include "api/guard.h"
#include "comm/communicator.h"
#include "collectives/common/reducer.h"

namespace {

struct DtypeName {
  shoal_dtype_t dtype;
  const char* name;      // the canonical name, as nccl-tests prints it
  const char* aliases[3];
};
const DtypeName kDtypes[] = {
    {SHOAL_F16, "half", {"f16", "float16", "fp16"}},  {SHOAL_BF16, "bfloat16", {"bf16", "bfloat", nullptr}},
    {SHOAL_F32, "float", {"f32", "float32", "fp32"}}, {SHOAL_F64, "double", {"f64", "float64", "fp64"}},
    {SHOAL_I8, "int8", {"i8", "char", nullptr}},       {SHOAL_U8, "uint8", {"u8", nullptr, nullptr}},
    {SHOAL_I32, "int32", {"i32", "int", nullptr}},     {SHOAL_U32, "uint32", {"u32", nullptr, nullptr}},
    {SHOAL_I64, "int64", {"i64", nullptr, nullptr}},   {SHOAL_U64, "uint64", {"u64", nullptr, nullptr}},
};
const char* const kOps[] = {"sum", "avg", "prod", "min", "max", "band", "bor", "bxor"};

}  // namespace


SHOAL_EXPORT const char* shoal_status_string(shoal_status_t status) {
  switch (status) {
    case SHOAL_OK: return "SHOAL_OK: success";
    case SHOAL_ERR_INVALID_ARGUMENT: return "SHOAL_ERR_INVALID_ARGUMENT: an argument is invalid";
    case SHOAL_ERR_TIMEOUT: return "SHOAL_ERR_TIMEOUT: a wait passed its deadline (SHOAL_TIMEOUT_S)";
    case SHOAL_ERR_REMOTE: return "SHOAL_ERR_REMOTE: a peer failed, exited or aborted the communicator";
    case SHOAL_ERR_MISMATCH: return "SHOAL_ERR_MISMATCH: ranks called a collective with different arguments";
    case SHOAL_ERR_SYSTEM: return "SHOAL_ERR_SYSTEM: the operating system or transport library failed";
    case SHOAL_ERR_NOT_FOUND: return "SHOAL_ERR_NOT_FOUND: an unknown name";
    case SHOAL_ERR_UNSUPPORTED: return "SHOAL_ERR_UNSUPPORTED: not available in this build or memory kind";
    case SHOAL_ERR_NO_MEMORY: return "SHOAL_ERR_NO_MEMORY: out of memory";
    case SHOAL_ERR_INTERNAL: return "SHOAL_ERR_INTERNAL: an internal error (a bug in shoal)";
  }
  return "unknown shoal_status_t";
}

SHOAL_EXPORT size_t shoal_dtype_size(shoal_dtype_t dtype) { return shoal::dtypeSize(dtype); }

SHOAL_EXPORT const char* shoal_dtype_name(shoal_dtype_t dtype) {
  for (const DtypeName& entry : kDtypes)
    if (entry.dtype == dtype) return entry.name;
  return "invalid";
}

SHOAL_EXPORT const char* shoal_op_name(shoal_op_t op) {
  return (op >= 0 && op < SHOAL_OP_COUNT) ? kOps[op] : "invalid";
}

SHOAL_EXPORT shoal_status_t shoal_dtype_from_name(const char* name, shoal_dtype_t* dtype) {
  return shoal::guarded(nullptr, [&] {
    if (name == nullptr || dtype == nullptr)
      shoal::fail(SHOAL_ERR_INVALID_ARGUMENT, "shoal_dtype_from_name: name and dtype must not be NULL");
    std::string known;
    for (const DtypeName& entry : kDtypes) {
      bool match = std::strcmp(name, entry.name) == 0;
      for (const char* alias : entry.aliases) match = match || (alias && std::strcmp(name, alias) == 0);
      if (match) return void(*dtype = entry.dtype);
      known += std::string(known.empty() ? "" : ", ") + entry.name;
    }
    shoal::fail(SHOAL_ERR_NOT_FOUND, "unknown dtype '{}'; use one of {}", name, known);
  });
}

SHOAL_EXPORT shoal_status_t shoal_op_from_name(const char* name, shoal_op_t* op) {
  return shoal::guarded(nullptr, [&] {
    if (name == nullptr || op == nullptr)
      shoal::fail(SHOAL_ERR_INVALID_ARGUMENT, "shoal_op_from_name: name and op must not be NULL");
    for (int i = 0; i < SHOAL_OP_COUNT; ++i)
      if (std::strcmp(name, kOps[i]) == 0) return void(*op = static_cast<shoal_op_t>(i));
    shoal::fail(SHOAL_ERR_NOT_FOUND, "unknown op '{}'; use sum, avg, prod, min, max, band, bor or bxor", name);
  });
}
