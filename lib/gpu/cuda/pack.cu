// One batched-copy kernel for pack and unpack (see pack.h). The bytes to copy
// are cut into fixed chunks spread over the grid, so one huge tensor and many
// tiny ones balance alike; a chunk finds its first tensor by binary search
// over the running end offsets and copies every tensor piece it covers.
#include "gpu/cuda/pack.h"
#include "gpu/cuda/pack_math.h"

#include <cuda_runtime.h>

#include <cstdint>
#include <vector>

#include "gpu/cuda/stream_memory.h"

namespace shoal::cuda {
namespace {

constexpr size_t kChunkBytes = 64 * 1024;
constexpr int kThreads = 256;
constexpr size_t kMaxBlocks = 16384;

// One tensor's copy. `end` is the running end in the packed buffer
// (offset + bytes), so entries are sorted by it.
struct CopyEntry {
  const unsigned char* source;
  unsigned char* destination;
  size_t end;
};

struct InlineTable {
  CopyEntry entries[kInlineEntries];
  size_t count;
  __device__ const CopyEntry& operator[](size_t i) const { return entries[i]; }
};

struct DeviceTable {
  const CopyEntry* entries;
  size_t count;
  __device__ const CopyEntry& operator[](size_t i) const { return entries[i]; }
};

// The block copies `bytes` bytes in words of Word once both pointers are aligned to it.
template <typename Word>
__device__ void copyWords(unsigned char* destination, const unsigned char* source, size_t bytes) {
  const size_t misalignment = reinterpret_cast<uintptr_t>(source) % sizeof(Word);
  size_t head = misalignment == 0 ? 0 : sizeof(Word) - misalignment;
  if (head > bytes) head = bytes;
  for (size_t i = threadIdx.x; i < head; i += blockDim.x) destination[i] = source[i];
  const size_t words = (bytes - head) / sizeof(Word);
  const Word* sourceWords = reinterpret_cast<const Word*>(source + head);
  Word* destinationWords = reinterpret_cast<Word*>(destination + head);
  for (size_t i = threadIdx.x; i < words; i += blockDim.x) destinationWords[i] = sourceWords[i];
  for (size_t i = head + words * sizeof(Word) + threadIdx.x; i < bytes; i += blockDim.x) destination[i] = source[i];
}

__device__ void copyPiece(unsigned char* destination, const unsigned char* source, size_t bytes) {
  const uintptr_t distance = reinterpret_cast<uintptr_t>(source) - reinterpret_cast<uintptr_t>(destination);
  if (distance % 16 == 0) copyWords<uint4>(destination, source, bytes);
  else if (distance % 4 == 0) copyWords<uint32_t>(destination, source, bytes);
  else copyWords<unsigned char>(destination, source, bytes);
}

template <typename Table>
__global__ void batchedCopy(Table table, size_t totalBytes) {
  const size_t chunks = (totalBytes + kChunkBytes - 1) / kChunkBytes;
  for (size_t chunk = blockIdx.x; chunk < chunks; chunk += gridDim.x) {
    const size_t chunkStart = chunk * kChunkBytes;
    const size_t chunkEnd = chunkStart + kChunkBytes < totalBytes ? chunkStart + kChunkBytes : totalBytes;
    for (size_t e = firstEntryEndingAfter(table, table.count, chunkStart); e < table.count; ++e) {
      const CopyEntry& entry = table[e];
      const size_t entryStart = e == 0 ? 0 : table[e - 1].end;
      if (entryStart >= chunkEnd) break;
      const Piece piece = pieceOf(entryStart, entry.end, chunkStart, chunkEnd);
      if (piece.bytes > 0)
        copyPiece(entry.destination + piece.offsetInEntry, entry.source + piece.offsetInEntry, piece.bytes);
    }
  }
}

size_t blocksFor(size_t totalBytes) {
  size_t chunks = (totalBytes + kChunkBytes - 1) / kChunkBytes;
  return chunks < kMaxBlocks ? chunks : kMaxBlocks;
}

// One launch for the copies of `entries` (their `end`s are running offsets in the packed buffer).
const char* launchCopy(const std::vector<CopyEntry>& entries, void* stream) {
  const size_t total = entries.empty() ? 0 : entries.back().end;
  if (total == 0) return nullptr;
  auto cudaStream = static_cast<cudaStream_t>(stream);
  const unsigned blocks = static_cast<unsigned>(blocksFor(total));
  if (entries.size() <= kInlineEntries) {
    InlineTable table{};
    for (size_t i = 0; i < entries.size(); ++i) table.entries[i] = entries[i];
    table.count = entries.size();
    batchedCopy<<<blocks, kThreads, 0, cudaStream>>>(table, total);
    return lastLaunchError();
  }
  void* deviceEntries = nullptr;
  const size_t tableBytes = entries.size() * sizeof(CopyEntry);
  if (const char* error = allocAsync(&deviceEntries, tableBytes, stream)) return error;
  if (const char* error = copyAsync(deviceEntries, entries.data(), tableBytes, stream)) {
    freeAsync(deviceEntries, stream);
    return error;
  }
  batchedCopy<<<blocks, kThreads, 0, cudaStream>>>(
      DeviceTable{static_cast<const CopyEntry*>(deviceEntries), entries.size()}, total);
  const char* launchError = lastLaunchError();
  const char* freeError = freeAsync(deviceEntries, stream);
  return launchError ? launchError : freeError;
}

// Tensor i's copy into (toPacked) or out of its slice of packed.
std::vector<CopyEntry> entriesFor(const void* const* tensors, const size_t* bytes, size_t count, void* packed,
                                  bool toPacked) {
  std::vector<CopyEntry> entries(count);
  size_t offset = 0;
  for (size_t i = 0; i < count; ++i) {
    auto* tensor = static_cast<unsigned char*>(const_cast<void*>(tensors[i]));
    auto* slice = static_cast<unsigned char*>(packed) + offset;
    entries[i].source = toPacked ? tensor : slice;
    entries[i].destination = toPacked ? slice : tensor;
    offset += bytes[i];
    entries[i].end = offset;
  }
  return entries;
}

}  // namespace

size_t packedBytes(const size_t* bytes, size_t count) {
  size_t total = 0;
  for (size_t i = 0; i < count; ++i) total += bytes[i];
  return total;
}

const char* packTensors(const void* const* tensors, const size_t* bytes, size_t count, void* packed, void* stream) {
  return launchCopy(entriesFor(tensors, bytes, count, packed, true), stream);
}

const char* unpackTensors(const void* packed, void* const* tensors, const size_t* bytes, size_t count, void* stream) {
  return launchCopy(entriesFor(const_cast<const void* const*>(tensors), bytes, count, const_cast<void*>(packed), false),
                    stream);
}

}  // namespace shoal::cuda
