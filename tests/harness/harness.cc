#include "harness/harness.h"

#include <gtest/gtest.h>
#include <unistd.h>

#include <atomic>
#include <thread>
#include <vector>

namespace shoal::test {

std::string freshMemoryStore() {
  static std::atomic<int> counter{0};
  return "memory://test-" + std::to_string(getpid()) + "-" + std::to_string(counter++);
}

void runRanks(int worldSize, const std::function<void(int rank, shoal_comm_t comm)>& body,
              const RankOptions& options) {
  std::string store = freshMemoryStore();
  std::vector<std::thread> threads;
  for (int rank = 0; rank < worldSize; ++rank) {
    threads.emplace_back([&, rank] {
      shoal_config_t config = SHOAL_CONFIG_INIT;
      config.rank = rank;
      config.world_size = worldSize;
      config.store = store.c_str();
      config.timeout_s = options.timeoutS;
      config.algorithm = options.algorithm;
      shoal_comm_t comm = nullptr;
      shoal_status_t status = shoal_comm_init_config(&config, &comm);
      if (status != SHOAL_OK) {
        ADD_FAILURE() << "rank " << rank << ": shoal_comm_init_config: " << shoal_status_string(status) << ": "
                      << shoal_last_error(nullptr);
        return;
      }
      body(rank, comm);
      shoal_comm_destroy(comm);
    });
  }
  for (std::thread& thread : threads) thread.join();
}

}  // namespace shoal::test
