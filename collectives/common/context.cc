#include "collectives/common/context.h"

#include "collectives/common/ring.h"

namespace shoal {
namespace {

void chooseSegment(Blocks& blocks, size_t elementSize, size_t segmentBytes, uint64_t tagsPerSegment) {
  size_t segment = std::max(elementSize, segmentBytes / elementSize * elementSize);
  // Keep (segments per block) x (tags per segment) within the sub-tag budget.
  uint64_t maxSegments = std::max<uint64_t>(1, kSubTagLimit / (2 * std::max<uint64_t>(tagsPerSegment, 1)));
  size_t largest = blocks.maxBytes();
  if (largest / segment >= maxSegments) {
    size_t elements = (largest / elementSize + maxSegments - 1) / maxSegments;
    segment = std::max(segment, elements * elementSize);
  }
  blocks.segment = segment;
}

}  // namespace

Blocks splitEvenly(size_t count, size_t elementSize, int parts, size_t segmentBytes, uint64_t tagsPerSegment) {
  Blocks blocks;
  blocks.offset.resize(parts);
  blocks.bytes.resize(parts);
  for (int b = 0; b < parts; ++b) {
    ring::Block block = ring::blockOf(count, parts, b);  // the device ring's split too
    blocks.offset[b] = block.offset * elementSize;
    blocks.bytes[b] = block.count * elementSize;
  }
  chooseSegment(blocks, elementSize, segmentBytes, tagsPerSegment);
  return blocks;
}

Blocks blocksFrom(const size_t* counts, const size_t* displacements, size_t elementSize, int parts,
                  size_t segmentBytes, uint64_t tagsPerSegment) {
  Blocks blocks;
  blocks.offset.resize(parts);
  blocks.bytes.resize(parts);
  size_t packed = 0;
  for (int b = 0; b < parts; ++b) {
    blocks.offset[b] = (displacements ? displacements[b] : packed) * elementSize;
    blocks.bytes[b] = counts[b] * elementSize;
    packed += counts[b];
  }
  chooseSegment(blocks, elementSize, segmentBytes, tagsPerSegment);
  return blocks;
}

}  // namespace shoal
