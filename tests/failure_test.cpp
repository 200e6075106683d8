// The one failure classification (LibTorch-free text rules).
#include <gtest/gtest.h>

#include "autobatch/failure.h"

namespace autobatch {
namespace {

constexpr FailureContext kPlain{};
constexpr FailureContext kNearLimit{true, false};
constexpr FailureContext kAfterOom{false, true};

TEST(FailureTest, OutOfMemoryTypeIsOutOfMemoryWithRequestBytes) {
  const auto c = classifyFailure(
      ExceptionType::kOutOfMemoryError,
      "CUDA out of memory. Tried to allocate 2.00 GiB. GPU 0 has a total capacity of 79.1 GiB",
      kPlain);
  EXPECT_EQ(c.kind, FailureKind::kOutOfMemory);
  EXPECT_EQ(c.failed_request_bytes, 2LL << 30);
  EXPECT_EQ(c.reason.rfind("CUDA out of memory.", 0), 0U);
  const auto budget = classifyFailure(
      ExceptionType::kOutOfMemoryError,
      "CPU budget allocator: out of memory: tried to allocate 4096 bytes with 10 bytes in use",
      kPlain);
  EXPECT_EQ(budget.failed_request_bytes, 4096);
  EXPECT_EQ(classifyFailure(ExceptionType::kOutOfMemoryError, "Tried to allocate 20.00 MiB", kPlain)
                .failed_request_bytes,
            20LL << 20);
}

TEST(FailureTest, TorchScriptWrappedOutOfMemoryIsRecognised) {
  const std::string wrapped =
      "The following operation failed in the TorchScript interpreter.\n"
      "Traceback of TorchScript (most recent call last):\n"
      "  File \"<string>\", line 3, in forward\n"
      "RuntimeError: CUDA out of memory. Tried to allocate 512.00 KiB.\n";
  const auto c = classifyFailure(ExceptionType::kOther, wrapped, kPlain);
  EXPECT_EQ(c.kind, FailureKind::kOutOfMemory);
  EXPECT_EQ(c.reason, "RuntimeError: CUDA out of memory. Tried to allocate 512.00 KiB.");
  EXPECT_EQ(c.failed_request_bytes, 512 * 1024);
}

TEST(FailureTest, LibraryAllocationFailuresAreOutOfMemory) {
  for (const char* text :
       {"CUDA error: out of memory\nCUDA kernel errors might be asynchronously reported",
        "CUDA error: CUBLAS_STATUS_ALLOC_FAILED when calling `cublasCreate(handle)`",
        "cuDNN error: CUDNN_STATUS_ALLOC_FAILED", "cudaErrorMemoryAllocation",
        "cuFFT error: CUFFT_ALLOC_FAILED", "cusolver error: CUSOLVER_STATUS_ALLOC_FAILED"}) {
    EXPECT_EQ(classifyFailure(ExceptionType::kOther, text, kPlain).kind, FailureKind::kOutOfMemory)
        << text;
  }
}

TEST(FailureTest, KernelSizeLimitsAreSizeLimit) {
  for (const char* text : {"cuDNN error: CUDNN_STATUS_NOT_SUPPORTED. This error may appear if "
                           "you passed in a non-contiguous input.",
                           "CUDA error: invalid configuration argument",
                           "Expected canUse32BitIndexMath(input) to be true, but got false."}) {
    const auto c = classifyFailure(ExceptionType::kOther, text, kPlain);
    EXPECT_EQ(c.kind, FailureKind::kSizeLimit) << text;
    EXPECT_EQ(c.failed_request_bytes, 0);
  }
}

TEST(FailureTest, FatalDeviceErrorsAreRethrownEvenWithOomWords) {
  for (const char* text :
       {"CUDA error: an illegal memory access was encountered", "CUDA error: misaligned address",
        "CUDA error: device-side assert "
        "triggered",
        "CUDA error: unspecified launch failure (out of memory?)"}) {
    EXPECT_EQ(classifyFailure(ExceptionType::kOther, text, kAfterOom).kind, FailureKind::kRethrow)
        << text;
  }
}

TEST(FailureTest, ModelErrorsAreRethrownWithTheirFirstLine) {
  const auto c = classifyFailure(
      ExceptionType::kOther,
      "mat1 and mat2 shapes cannot be multiplied (4x3 and 5x40)\nException raised from ...",
      kNearLimit);
  EXPECT_EQ(c.kind, FailureKind::kRethrow);
  EXPECT_EQ(c.reason, "mat1 and mat2 shapes cannot be multiplied (4x3 and 5x40)");
  EXPECT_EQ(classifyFailure(ExceptionType::kNonStd, "out of memory", kAfterOom).kind,
            FailureKind::kRethrow);
}

TEST(FailureTest, ExhaustionSignsCountOnlyNearALimitOrAfterAnOom) {
  const char* cpu =
      "DefaultCPUAllocator: can't allocate memory: you tried to allocate 1048576 "
      "bytes. Error code 12 (Cannot allocate memory)";
  EXPECT_EQ(classifyFailure(ExceptionType::kOther, cpu, kPlain).kind, FailureKind::kRethrow);
  const auto near = classifyFailure(ExceptionType::kOther, cpu, kNearLimit);
  EXPECT_EQ(near.kind, FailureKind::kOutOfMemory);
  EXPECT_EQ(near.failed_request_bytes, 1048576);
  EXPECT_EQ(classifyFailure(ExceptionType::kBadAlloc, "std::bad_alloc", kPlain).kind,
            FailureKind::kRethrow);
  EXPECT_EQ(classifyFailure(ExceptionType::kBadAlloc, "std::bad_alloc", kAfterOom).kind,
            FailureKind::kOutOfMemory);
  // oneDNN under RLIMIT_DATA (both seen in the benchmark): creating and executing a primitive.
  for (const char* onednn : {"could not create a primitive", "could not execute a primitive"}) {
    EXPECT_EQ(classifyFailure(ExceptionType::kOther, onednn, kPlain).kind, FailureKind::kRethrow);
    EXPECT_EQ(classifyFailure(ExceptionType::kOther, onednn, kAfterOom).kind,
              FailureKind::kOutOfMemory);
    EXPECT_EQ(classifyFailure(ExceptionType::kOther, onednn, kNearLimit).kind,
              FailureKind::kOutOfMemory);
  }
  EXPECT_EQ(classifyFailure(ExceptionType::kOther, "shape mismatch", kNearLimit).kind,
            FailureKind::kRethrow);
}

}  // namespace
}  // namespace autobatch
