// Tests that need a real allocator failure re-run their own binary as a child process whose data
// segment is capped with setrlimit(RLIMIT_DATA): these helpers are both halves of that.
#pragma once

#include <gtest/gtest.h>
#include <sys/resource.h>
#include <sys/wait.h>
#include <unistd.h>

#include <array>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <fstream>
#include <iostream>
#include <string>

namespace autobatch::testing {

/// In the child: caps RLIMIT_DATA at the process's VmData now plus `headroom_bytes`; false when
/// setrlimit refused (a hard limit already lower).
inline bool capDataSegment(std::int64_t headroom_bytes) {
  std::ifstream status("/proc/self/status");
  std::string line;
  std::int64_t vm_data = 0;
  while (std::getline(status, line)) {
    if (line.rfind("VmData:", 0) == 0) vm_data = std::stoll(line.substr(7)) * 1024;
  }
  const auto cap = static_cast<rlim_t>(vm_data + headroom_bytes);
  const struct rlimit limit_data { cap, cap };
  return setrlimit(RLIMIT_DATA, &limit_data) == 0;
}

/// In the parent: runs this test binary again with `env_name`=`env_value` and only test
/// `test_name`, and expects that one test to run and pass (a filter that matches nothing would
/// also exit 0) and the child to exit by itself (not killed, e.g. by a cgroup's OOM killer).
/// `output`, when given, receives what the child printed.
inline void expectChildPasses(const std::string& env_name, const std::string& test_name,
                              const std::string& env_value = "1",
                              std::string* output_out = nullptr) {
  std::array<char, 4096> self{};
  const ssize_t n = readlink("/proc/self/exe", self.data(), self.size() - 1);
  ASSERT_GT(n, 0);
  const std::string command = env_name + "='" + env_value + "' '" + std::string(self.data()) +
                              "' --gtest_filter=" + test_name + " 2>&1";
  FILE* pipe = popen(command.c_str(), "r");
  ASSERT_NE(pipe, nullptr) << command;
  std::string output;
  std::array<char, 4096> chunk{};
  while (std::fgets(chunk.data(), static_cast<int>(chunk.size()), pipe) != nullptr) {
    output += chunk.data();
  }
  const int status = pclose(pipe);
  std::cout << output;
  if (output_out != nullptr) *output_out = output;
  ASSERT_TRUE(WIFEXITED(status)) << command << ": killed by signal "
                                 << (WIFSIGNALED(status) ? WTERMSIG(status) : 0);
  EXPECT_EQ(WEXITSTATUS(status), 0)
      << command
      << (WEXITSTATUS(status) > 128 ? ": the child was killed (the shell's 128 + signal)" : "");
  EXPECT_NE(output.find("[  PASSED  ] 1 test."), std::string::npos) << command;
}

}  // namespace autobatch::testing
