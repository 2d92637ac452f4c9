// Drives a compressor's table through its rounds for tests: every simulated
// rank has its own instance (or shares one the test made), its own tensors and
// its own tensor states, and all ranks run in one thread, in lockstep. Between
// rounds this file stands in for the driver's collectives (lib/plugin/driver.cc):
// an allreduce combines every rank's payload with shoal's own Reducer, in rank
// order; an allgatherv concatenates them in rank order with counts and offsets
// laid out as the driver lays them out. A test then reads each rank's outputs.
//
// Tensor states live as long as the object and are kept across operations by
// tensor position, so a test can step a stateful compressor (error feedback,
// warm start) several times. Two hooks let a test look inside:
// - a RoundObserver sees each rank's round right after round() returned, with
//   the payloads as that rank wrote them (before any reduction);
// - a Hook sees each delivered payload (the reduced or gathered bytes) and may
//   rewrite it, as a buggy or hostile rank could: every rank then reads the
//   same bytes, as after a real collective.
//
// The tensors live in host vectors unless the test places them in memory of
// its own (placeTensors: tests/cuda/cuda_test_util.h's deviceMemory() is CUDA
// device memory); payloads then live there too, and the collectives here
// read and write them through the memory's copy. Used by the compressor unit
// tests, the CUDA compressor tests and, through tests/fuzz/lockstep.h, the
// fuzz targets: header-only, no test framework, no CUDA header.
#pragma once

#include <algorithm>
#include <cstdint>
#include <cstdio>
#include <cstring>
#include <functional>
#include <string>
#include <utility>
#include <vector>

#include "collectives/common/reducer.h"
#include "shoal/compressor.h"
#include "shoal/shoal.h"

namespace shoal::compressors {
const shoal_compressor_t* none();
const shoal_compressor_t* fp16();
const shoal_compressor_t* bf16();
const shoal_compressor_t* topk();
const shoal_compressor_t* sketch();
const shoal_compressor_t* powersgd();
}  // namespace shoal::compressors

namespace shoal::test {

// What one round's collective delivered, before the ranks read it.
struct Delivered {
  int round = 0;    // the round that asked for it
  int payload = 0;  // its position in that round
  shoal_collective_t collective = SHOAL_COLLECTIVE_ALLREDUCE;
  shoal_dtype_t dtype = SHOAL_U8;
  shoal_op_t op = SHOAL_SUM;    // allreduce only
  std::vector<uint8_t> bytes;   // the reduced buffer, or the gathered words
  std::vector<size_t> counts;   // allgatherv: elements per rank (the hook may change them)
};

using Hook = std::function<void(Delivered&)>;
using RoundObserver = std::function<void(int rank, const shoal_round_t& round)>;

// Memory a test provides for the tensors (and so the payloads) instead of host
// vectors: the kind, device and stream the tensors name, and how to allocate,
// release and copy it. copy(to, from, bytes) takes either side in host memory
// or this memory (as cudaMemcpyDefault does) and returns once the copy and
// all work queued before it are done.
struct TensorMemory {
  shoal_memory_t kind = SHOAL_MEMORY_CUDA;
  int device = 0;
  void* stream = nullptr;
  std::function<void*(size_t bytes)> allocate;
  std::function<void(void* data)> release;
  std::function<void(void* to, const void* from, size_t bytes)> copy;
};

// "k=v,k=v" as the pairs CompressorRounds::create() takes.
inline std::vector<std::pair<std::string, std::string>> optionPairs(const std::string& text) {
  std::vector<std::pair<std::string, std::string>> pairs;
  for (size_t pos = 0; pos < text.size();) {
    size_t comma = text.find(',', pos);
    if (comma == std::string::npos) comma = text.size();
    const std::string pair = text.substr(pos, comma - pos);
    const size_t equals = pair.find('=');
    if (!pair.empty()) pairs.emplace_back(pair.substr(0, equals), equals == std::string::npos ? "" : pair.substr(equals + 1));
    pos = comma + 1;
  }
  return pairs;
}

class CompressorRounds {
 public:
  struct TensorSpec {
    shoal_dtype_t dtype = SHOAL_F32;
    std::vector<int64_t> shape;  // {} is a scalar; {n} a vector; {rows, cols} a matrix
    std::string name;            // "" for an unnamed tensor
  };
  using Fill = std::function<void(int rank, int tensor, void* data)>;

  CompressorRounds(const shoal_compressor_t* table, int world) : table_(table), ranks_(world) {}
  CompressorRounds(const CompressorRounds&) = delete;
  CompressorRounds& operator=(const CompressorRounds&) = delete;

  ~CompressorRounds() {
    endOperation();
    for (Rank& rank : ranks_)
      for (void* state : rank.states)
        if (state != nullptr && table_->destroy_tensor_state) table_->destroy_tensor_state(rank.instance, state);
    for (Rank& rank : ranks_)
      if (rank.instance != nullptr && rank.ownsInstance) table_->destroy(rank.instance);
    for (Rank& rank : ranks_) releasePlaced(rank, /*gatheredToo=*/true);
  }

  // Puts every later start()'s tensors (inputs filled on the host, then
  // copied) into `memory`; outputs are copied back when an operation ends.
  // Call before the first start().
  void placeTensors(TensorMemory memory) { memory_ = std::move(memory); }

  // Creates every rank's instance with options "k=v" pairs; error(r) says why one failed.
  shoal_status_t create(const std::vector<std::pair<std::string, std::string>>& options) {
    std::vector<const char*> keys, values;
    for (const auto& kv : options) {
      keys.push_back(kv.first.c_str());
      values.push_back(kv.second.c_str());
    }
    for (int r = 0; r < world(); ++r) {
      Rank& rank = ranks_[r];
      shoal_compressor_params_t params{};
      params.struct_size = sizeof params;
      params.num_options = static_cast<int>(options.size());
      params.keys = keys.data();
      params.values = values.data();
      params.error_text = rank.error;
      params.error_text_size = sizeof rank.error;
      if (shoal_status_t status = table_->create(&params, &rank.instance); status != SHOAL_OK) {
        failedRank_ = r;
        return status;
      }
      rank.ownsInstance = true;
    }
    return SHOAL_OK;
  }

  // Runs rank r on instances[r], which the test created and destroys (the
  // same instance may serve several ranks). Call before the first operation.
  void useInstances(const std::vector<void*>& instances) {
    for (int r = 0; r < world(); ++r) {
      ranks_[r].instance = instances[r];
      ranks_[r].ownsInstance = false;
    }
  }

  // One operation over tensors; fill(rank, t, data) writes rank r's input of
  // tensor t (outputs start as 0xa5 bytes). A start() that fails on a rank
  // finishes the ranks already started.
  shoal_status_t start(const std::vector<TensorSpec>& specs, shoal_op_t op, uint64_t step, const Fill& fill) {
    endOperation();
    specs_ = specs;
    rounds_ = -1;
    statuses_.assign(world(), SHOAL_OK);
    outputsPlaced_ = placed();
    for (int r = 0; r < world(); ++r) {
      Rank& rank = ranks_[r];
      rank.states.resize(specs.size(), nullptr);
      rank.in.assign(specs.size(), {});
      rank.out.assign(specs.size(), {});
      rank.tensors.assign(specs.size(), shoal_compress_tensor_t{});
      releasePlaced(rank, /*gatheredToo=*/false);
      for (size_t t = 0; t < specs.size(); ++t) {
        size_t count = 1;
        for (int64_t d : specs[t].shape) count *= static_cast<size_t>(d);
        const size_t bytes = count * shoal_dtype_size(specs[t].dtype);
        rank.in[t].assign(bytes + 16, 0);  // + 16: never an empty vector's NULL data
        rank.out[t].assign(bytes + 16, 0xa5);
        if (fill) fill(r, static_cast<int>(t), rank.in[t].data());
        shoal_compress_tensor_t& tensor = rank.tensors[t];
        tensor.input = shoal_tensor_1d(rank.in[t].data(), count, specs[t].dtype);
        tensor.input.ndim = static_cast<int>(specs[t].shape.size());
        for (size_t d = 0; d < specs[t].shape.size(); ++d) tensor.input.shape[d] = specs[t].shape[d];
        tensor.output = tensor.input;
        tensor.output.data = rank.out[t].data();
        if (placed()) {
          rank.placedIn.push_back(place(rank.in[t]));
          rank.placedOut.push_back(place(rank.out[t]));
          tensor.input.data = rank.placedIn.back();
          tensor.output.data = rank.placedOut.back();
          for (shoal_tensor_t* side : {&tensor.input, &tensor.output}) {
            side->memory = memory_.kind;
            side->device = memory_.device;
            side->stream = memory_.stream;
          }
        }
        tensor.name = specs[t].name.empty() ? nullptr : specs[t].name.c_str();
        tensor.state = &rank.states[t];
      }
      rank.op = shoal_compress_op_t{};
      rank.op.struct_size = sizeof rank.op;
      rank.op.rank = r;
      rank.op.world_size = world();
      rank.op.op = op;
      rank.op.num_tensors = static_cast<int>(specs.size());
      rank.op.tensors = rank.tensors.data();
      rank.op.step = step;
      rank.op.error_text = rank.error;
      rank.op.error_text_size = sizeof rank.error;
      rank.error[0] = '\0';
      if (shoal_status_t status = table_->start(rank.instance, &rank.op, &rank.opState); status != SHOAL_OK) {
        failedRank_ = r;
        statuses_[r] = status;
        endOperation();
        return status;
      }
      rank.started = true;
      rank.round = shoal_round_t{};
      rank.round.struct_size = sizeof rank.round;
    }
    return SHOAL_OK;
  }

  // Runs rounds until every rank is done or a round fails on some rank: then
  // every rank still runs that round (status(r) and error(r) say how each
  // ended; run returns the first failure). Either way every rank's finish()
  // runs. hook sees each round's delivered payloads. maxRounds bounds a
  // compressor that never finishes.
  shoal_status_t run(const Hook& hook = nullptr, int maxRounds = 16) {
    statuses_.assign(world(), SHOAL_OK);
    for (int index = 0; index < maxRounds; ++index) {
      int done = 0;
      shoal_status_t failure = SHOAL_OK;
      for (int r = 0; r < world(); ++r) {
        Rank& rank = ranks_[r];
        rank.round.index = index;
        rank.round.done = 0;
        statuses_[r] = table_->round(rank.instance, rank.opState, &rank.op, &rank.round);
        if (statuses_[r] != SHOAL_OK && failure == SHOAL_OK) {
          failure = statuses_[r];
          failedRank_ = r;
        }
        if (statuses_[r] == SHOAL_OK && observer_) observer_(r, rank.round);
        done += rank.round.done ? 1 : 0;
      }
      if (failure != SHOAL_OK) {
        endOperation();
        return failure;
      }
      if (done == world()) {
        rounds_ = index;
        endOperation();
        return SHOAL_OK;
      }
      if (done != 0) return lockstepFailure("some ranks are done and others are not");
      if (shoal_status_t status = deliver(index, hook); status != SHOAL_OK) return status;
    }
    return lockstepFailure("no end after the round limit");
  }

  // start() and run() in one: a whole compressed allreduce.
  shoal_status_t allreduce(const std::vector<TensorSpec>& specs, shoal_op_t op, uint64_t step, const Fill& fill,
                           const Hook& hook = nullptr) {
    if (shoal_status_t status = start(specs, op, step, fill); status != SHOAL_OK) return status;
    return run(hook);
  }

  // Sees every rank's round from now on (nullptr: none).
  void observe(RoundObserver observer) { observer_ = std::move(observer); }

  int world() const { return static_cast<int>(ranks_.size()); }
  // The collective rounds the last finished operation asked for (the index of
  // its done round); -1 while none finished.
  int rounds() const { return rounds_; }
  int failedRank() const { return failedRank_; }
  shoal_status_t status(int rank) const { return statuses_[rank]; }
  const char* error(int rank) const { return ranks_[rank].error; }
  void* instance(int rank) const { return ranks_[rank].instance; }
  void* state(int rank, int t) const { return ranks_[rank].states[t]; }
  const void* output(int rank, int t) const { return ranks_[rank].out[t].data(); }
  const void* input(int rank, int t) const { return ranks_[rank].in[t].data(); }

  // Rank r's output (or input) of tensor t as elements of T (T must match its dtype's size).
  template <typename T>
  std::vector<T> outputAs(int rank, int t) const {
    return elementsOf<T>(ranks_[rank].out[t], t);
  }
  template <typename T>
  std::vector<T> inputAs(int rank, int t) const {
    return elementsOf<T>(ranks_[rank].in[t], t);
  }

  // The bytes of a payload as a rank wrote them (count elements of its dtype),
  // wherever they live: for a RoundObserver of placed tensors.
  std::vector<uint8_t> payloadBytes(const shoal_payload_t& payload) const {
    return readBytes(payload.buffer, payload.count * shoal_dtype_size(payload.dtype));
  }

 private:
  struct Rank {
    void* instance = nullptr;
    bool ownsInstance = false;
    void* opState = nullptr;
    bool started = false;
    shoal_compress_op_t op{};
    shoal_round_t round{};
    std::vector<std::vector<uint8_t>> in, out;
    std::vector<shoal_compress_tensor_t> tensors;
    std::vector<void*> states;
    // allgatherv results, valid during the next round (as the driver's)
    std::vector<uint8_t> gathered[SHOAL_MAX_ROUND_PAYLOADS];
    std::vector<size_t> counts[SHOAL_MAX_ROUND_PAYLOADS], displs[SHOAL_MAX_ROUND_PAYLOADS];
    // With placeTensors: the tensors in the test's memory, and the gathered copies there
    std::vector<void*> placedIn, placedOut;
    void* placedGathered[SHOAL_MAX_ROUND_PAYLOADS] = {};
    char error[512] = {};
  };

  bool placed() const { return static_cast<bool>(memory_.allocate); }

  // A copy of `host` in the test's memory.
  void* place(const std::vector<uint8_t>& host) {
    void* data = memory_.allocate(host.size());
    memory_.copy(data, host.data(), host.size());
    return data;
  }

  void releasePlaced(Rank& rank, bool gatheredToo) {
    if (!placed()) return;
    for (void* data : rank.placedIn) memory_.release(data);
    for (void* data : rank.placedOut) memory_.release(data);
    rank.placedIn.clear();
    rank.placedOut.clear();
    if (!gatheredToo) return;
    for (void*& data : rank.placedGathered) {
      if (data != nullptr) memory_.release(data);
      data = nullptr;
    }
  }

  std::vector<uint8_t> readBytes(const void* data, size_t bytes) const {
    std::vector<uint8_t> host(bytes);
    if (bytes == 0) return host;
    if (placed()) memory_.copy(host.data(), data, bytes);
    else std::memcpy(host.data(), data, bytes);
    return host;
  }

  void writeBytes(void* data, const std::vector<uint8_t>& host) const {
    if (host.empty()) return;
    if (placed()) memory_.copy(data, host.data(), host.size());
    else std::memcpy(data, host.data(), host.size());
  }

  template <typename T>
  std::vector<T> elementsOf(const std::vector<uint8_t>& bytes, int t) const {
    size_t count = 1;
    for (int64_t d : specs_[t].shape) count *= static_cast<size_t>(d);
    std::vector<T> elements(count);
    if (count > 0) std::memcpy(elements.data(), bytes.data(), count * sizeof(T));
    return elements;
  }

  void endOperation() {
    for (Rank& rank : ranks_) {
      if (rank.started) table_->finish(rank.instance, rank.opState);
      rank.started = false;
      rank.opState = nullptr;
    }
    // Placed outputs come back to the host vectors that output() and outputAs() read.
    if (outputsPlaced_)
      for (Rank& rank : ranks_)
        for (size_t t = 0; t < rank.placedOut.size(); ++t)
          memory_.copy(rank.out[t].data(), rank.placedOut[t], rank.out[t].size());
    outputsPlaced_ = false;
  }

  shoal_status_t lockstepFailure(const char* why) {
    std::snprintf(ranks_[0].error, sizeof ranks_[0].error, "compressor rounds: %s", why);
    failedRank_ = 0;
    endOperation();
    return SHOAL_ERR_INTERNAL;
  }

  // The collectives of round `index`: every rank's payload p combined (or
  // gathered), shown to the hook, then copied back to every rank.
  shoal_status_t deliver(int index, const Hook& hook) {
    const int n = world();
    const shoal_round_t& first = ranks_[0].round;
    if (first.num_payloads < 1 || first.num_payloads > SHOAL_MAX_ROUND_PAYLOADS)
      return lockstepFailure("a round asked for no payload or too many");
    for (int p = 0; p < first.num_payloads; ++p) {
      const shoal_payload_t& mine = first.payloads[p];
      const size_t element = shoal_dtype_size(mine.dtype);
      if (element == 0) return lockstepFailure("a payload with an unknown dtype");
      for (int r = 1; r < n; ++r) {
        const shoal_payload_t& other = ranks_[r].round.payloads[p];
        if (ranks_[r].round.num_payloads != first.num_payloads || other.collective != mine.collective ||
            other.dtype != mine.dtype ||
            (mine.collective == SHOAL_COLLECTIVE_ALLREDUCE && (other.count != mine.count || other.op != mine.op)))
          return lockstepFailure("ranks asked for different payloads");
      }
      Delivered d;
      d.round = index;
      d.payload = p;
      d.collective = mine.collective;
      d.dtype = mine.dtype;
      d.op = mine.op;
      if (mine.collective == SHOAL_COLLECTIVE_ALLREDUCE) {
        if (!isValidDtypeOp(mine.dtype, mine.op)) return lockstepFailure("an allreduce op invalid for its dtype");
        d.bytes = payloadBytes(mine);
        Reducer reducer(mine.dtype, mine.op);
        for (int r = 1; r < n; ++r)
          if (mine.count > 0)
            reducer.combine(d.bytes.data(), payloadBytes(ranks_[r].round.payloads[p]).data(), mine.count);
        if (mine.op == SHOAL_AVG) reducer.finish(d.bytes.data(), mine.count, n);
        if (hook) hook(d);
        d.bytes.resize(mine.count * element);  // an allreduce result has the size that was sent
        for (Rank& rank : ranks_) writeBytes(rank.round.payloads[p].buffer, d.bytes);
      } else {
        for (Rank& rank : ranks_) {
          const shoal_payload_t& theirs = rank.round.payloads[p];
          d.counts.push_back(theirs.count);
          const std::vector<uint8_t> bytes = payloadBytes(theirs);
          d.bytes.insert(d.bytes.end(), bytes.begin(), bytes.end());
        }
        if (hook) hook(d);
        d.counts.resize(n, 0);
        // The driver sizes the gathered buffer from the counts it received.
        size_t total = 0;
        std::vector<size_t> displs(n);
        for (int r = 0; r < n; ++r) {
          displs[r] = total;
          total += d.counts[r];
        }
        d.bytes.resize(total * element + 16, 0);
        for (Rank& rank : ranks_) {
          rank.gathered[p] = d.bytes;
          rank.counts[p] = d.counts;
          rank.displs[p] = displs;
          shoal_payload_t& theirs = rank.round.payloads[p];
          theirs.gathered = rank.gathered[p].data();
          if (placed()) {  // gathered where the payload is, as the driver does
            if (rank.placedGathered[p] != nullptr) memory_.release(rank.placedGathered[p]);
            rank.placedGathered[p] = place(rank.gathered[p]);
            theirs.gathered = rank.placedGathered[p];
          }
          theirs.gathered_counts = rank.counts[p].data();
          theirs.gathered_displs = rank.displs[p].data();
        }
      }
    }
    return SHOAL_OK;
  }

  const shoal_compressor_t* table_;
  std::vector<Rank> ranks_;
  std::vector<TensorSpec> specs_;
  RoundObserver observer_;
  TensorMemory memory_;         // no allocate: host vectors
  bool outputsPlaced_ = false;  // placed outputs not yet copied back
  int rounds_ = -1;
  int failedRank_ = -1;
  std::vector<shoal_status_t> statuses_;
};

}  // namespace shoal::test
