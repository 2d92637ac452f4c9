// The built-in compressors: one explicit table (no static self-registration,
// which linkers drop from static libraries). Each compressor's file defines
// its table with the same layout an external plugin exports.
#include "plugin/registry.h"

namespace shoal::compressors {
const shoal_compressor_t* none();
const shoal_compressor_t* fp16();
const shoal_compressor_t* bf16();
const shoal_compressor_t* topk();
const shoal_compressor_t* sketch();
const shoal_compressor_t* powersgd();
}  // namespace shoal::compressors

namespace shoal::plugin {

const std::vector<const shoal_compressor_t*>& builtinCompressors() {
  static const std::vector<const shoal_compressor_t*> table = {
      compressors::none(),
      compressors::fp16(),
      compressors::bf16(),
      compressors::topk(),
      compressors::sketch(),
      compressors::powersgd(),
  };
  return table;
}

}  // namespace shoal::plugin
