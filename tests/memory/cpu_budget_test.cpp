// The CPU budget backend's heap trim between trials (src/memory/cpu_budget.cpp, releaseCaches):
// glibc's free pages go back to the kernel where the process's own room binds (no
// --memory-limit, or one above half of what the process can use: the guard compares the resident
// set with the kernel's limit), and stay where a smaller explicit limit binds (trimming there only
// cost 20-60 ms a trial, issue 44).
#include <gtest/gtest.h>
#include <torch/torch.h>
#include <unistd.h>

#include <cstdint>
#include <fstream>
#include <vector>

#include "memory/memory_backend.h"

namespace autobatch {
namespace {
// Named after the file: the test executables compile several files as one unit (UNITY_BUILD).
namespace cpu_budget_test {

constexpr std::int64_t kMiB = std::int64_t{1} << 20;

/// This process's resident bytes (/proc/self/statm's second field, pages).
std::int64_t residentBytes() {
  std::ifstream statm("/proc/self/statm");
  std::int64_t size = 0;
  std::int64_t resident = 0;
  statm >> size >> resident;
  return resident * sysconf(_SC_PAGESIZE);
}

/// Leaves about 96 MiB of free pages inside glibc's heap: 24,576 tensors of 4 KiB (below
/// malloc's mmap threshold, so they come from the heap), every 64th kept alive so that free() can
/// give nothing back from the heap's top. Returns the tensors kept.
std::vector<torch::Tensor> fragmentHeap() {
  std::vector<torch::Tensor> all;
  all.reserve(24576);
  for (int i = 0; i < 24576; ++i) all.push_back(torch::ones({1024}));  // 4 KiB, touched
  std::vector<torch::Tensor> kept;
  for (int i = 0; i < 24576; i += 64) kept.push_back(all[static_cast<std::size_t>(i)]);
  all.clear();
  return kept;
}

/// Resident bytes given back by the backend's releaseCaches() after fragmentHeap().
std::int64_t releasedBytes(detail::MemoryBackend& backend) {
  const auto kept = fragmentHeap();
  const std::int64_t before = residentBytes();
  backend.releaseCaches();
  return before - residentBytes();
}

// Catches a releaseCaches that always trims (the cost this rule removes) and one that never does
// (the guard's resident set would then carry a trial's freed chunks into the next).
TEST(CpuBudgetBackendTest, TrimsTheHeapOnlyWhereTheProcessRoomBinds) {
  {
    // 512 MiB on a machine whose room is gigabytes: the explicit limit binds.
    auto backend = detail::makeCpuBudgetBackend(512 * kMiB, 0);
    backend->finishSetup(0);
    EXPECT_LT(releasedBytes(*backend), 16 * kMiB);
  }
  {
    auto backend = detail::makeCpuBudgetBackend(0, 0);  // the process's room binds
    backend->finishSetup(0);
    EXPECT_GT(releasedBytes(*backend), 64 * kMiB);
  }
}

}  // namespace cpu_budget_test
}  // namespace
}  // namespace autobatch
