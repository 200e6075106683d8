// classifyException: the LibTorch half of the failure classification
// (src/probes/failure_torch.cpp), on live exceptions of each type LibTorch and the standard library
// throw (moved from tests/probes/trial_runner_test.cpp, issue 28).
#include <c10/util/Exception.h>
#include <gtest/gtest.h>

#include <exception>
#include <new>
#include <stdexcept>

#include "autobatch/vocabulary/failure.h"

namespace autobatch {
namespace {
// Named after the file: the test executables compile several files as one unit (UNITY_BUILD).
namespace failure_torch_test {

// Catches a classifyException that takes the wrong ExceptionType from a live exception: a
// c10::OutOfMemoryError read as plain text (its request size lost), std::bad_alloc counted as out
// of memory without evidence, or a non-std exception (throw 42) classified instead of rethrown.
TEST(ClassifyExceptionTest, SyntheticExceptionsOfEachType) {
  auto classify = [](auto thrower, FailureContext context = {}) {
    try {
      thrower();
    } catch (...) {
      return classifyException(std::current_exception(), context);
    }
    return FailureClass{};
  };
  const auto oom = classify([] {
    TORCH_CHECK_WITH(OutOfMemoryError, false, "CUDA out of memory. Tried to allocate 1.50 KiB");
  });
  EXPECT_EQ(oom.kind, FailureKind::kOutOfMemory);
  EXPECT_EQ(oom.failed_request_bytes, 1536);
  EXPECT_EQ(classify([] { throw std::bad_alloc(); }).kind, FailureKind::kRethrow);
  EXPECT_EQ(classify([] { throw std::bad_alloc(); }, {false, true}).kind,
            FailureKind::kOutOfMemory);
  EXPECT_EQ(classify([] { TORCH_CHECK(false, "CUDNN_STATUS_NOT_SUPPORTED"); }).kind,
            FailureKind::kSizeLimit);
  EXPECT_EQ(classify([] { throw std::runtime_error("RuntimeError: CUDA out of memory."); }).kind,
            FailureKind::kOutOfMemory);
  EXPECT_EQ(classify([] { TORCH_CHECK(false, "Expected 4-dimensional input"); }).kind,
            FailureKind::kRethrow);
  EXPECT_EQ(classify([] { throw 42; }, {true, true}).kind, FailureKind::kRethrow);
}

}  // namespace failure_torch_test
}  // namespace
}  // namespace autobatch
