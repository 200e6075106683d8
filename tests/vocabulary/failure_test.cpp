// The one failure classification (LibTorch-free text rules).
#include <gtest/gtest.h>

#include <array>
#include <cstdint>
#include <limits>
#include <ostream>
#include <string>
#include <string_view>

#include "autobatch/vocabulary/failure.h"

namespace autobatch {

// GoogleTest prints kinds by name ("rethrow"), not as bytes. PrintTo is GoogleTest's hook name.
// NOLINTNEXTLINE(readability-identifier-naming)
void PrintTo(FailureKind kind, std::ostream* os) { *os << toString(kind); }

namespace {
// Named after the file: the test executables compile several files as one unit (UNITY_BUILD).
namespace failure_test {

constexpr FailureContext kPlain{};
constexpr FailureContext kNearLimit{true, false};
constexpr FailureContext kAfterOom{false, true};
constexpr std::array<FailureContext, 3> kAll{kPlain, kNearLimit, kAfterOom};

// What LibTorch 2.11 throws for a failed C10_CUDA_CHECK
// (c10::AcceleratorError::what_without_backtrace()), exactly: produced by calling
// c10::cuda::c10_cuda_check_implementation(2, ..., true) of the shipped libc10_cuda.so (PyPI
// torch 2.11.0+cu130) on a machine without a GPU, cudaGetDeviceCount preloaded to report one
// device. Every such message carries the DSA hint, which names "device-side assertions".
constexpr const char* kCudaOutOfMemory =
    "CUDA error: out of memory\n"
    "Search for `cudaErrorMemoryAllocation' in "
    "https://docs.nvidia.com/cuda/cuda-runtime-api/group__CUDART__TYPES.html for more "
    "information.\n"
    "CUDA kernel errors might be asynchronously reported at some other API call, so the stacktrace "
    "below might be incorrect.\n"
    "For debugging consider passing CUDA_LAUNCH_BLOCKING=1\n"
    "Compile with `TORCH_USE_CUDA_DSA` to enable device-side assertions.\n";

// The same message for any cudaError_t: "CUDA error: " + cudaGetErrorString(e), then the hint
// lines (cudaGetErrorName(e) in the first). Checked against kCudaOutOfMemory below.
std::string cudaCheckMessage(std::string_view error_string, std::string_view error_name) {
  return "CUDA error: " + std::string(error_string) + "\nSearch for `" + std::string(error_name) +
         "' in https://docs.nvidia.com/cuda/cuda-runtime-api/group__CUDART__TYPES.html for more "
         "information.\nCUDA kernel errors might be asynchronously reported at some other API "
         "call, so the stacktrace below might be incorrect.\nFor debugging consider passing "
         "CUDA_LAUNCH_BLOCKING=1\nCompile with `TORCH_USE_CUDA_DSA` to enable device-side "
         "assertions.\n";
}

// TorchScript's wrapping of an exception raised inside forward (the type is lost).
std::string wrappedByTorchScript(std::string_view message) {
  return "The following operation failed in the TorchScript interpreter.\n"
         "Traceback of TorchScript (most recent call last):\n"
         "  File \"<string>\", line 3, in forward\n"
         "RuntimeError: " +
         std::string(message) + "\n";
}

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

// The bytes in use when the allocation was refused bound the failed phase's peak from below, and
// the search steers by it: a parse that took the capacity or the reserved figure instead, or that
// dropped the rounding of "7.50 GiB", would make the bound too high and the search skip a batch
// that fits.
TEST(FailureTest, InUseBytesAtTheRefusalAreALowerBound) {
  const auto cuda = classifyFailure(
      ExceptionType::kOutOfMemoryError,
      "CUDA out of memory. Tried to allocate 20.00 MiB. GPU 0 has a total capacity of 79.19 GiB of "
      "which 3.25 MiB is free. Including non-PyTorch memory, this process has 79.18 GiB memory in "
      "use. Of the allocated memory 7.50 GiB is allocated by PyTorch, and 1.25 GiB is reserved by "
      "PyTorch but unallocated.",
      kPlain);
  EXPECT_EQ(cuda.failed_in_use_bytes, 8047694970);  // floor(7.50 GiB - 0.005 GiB)
  const auto budget = classifyFailure(
      ExceptionType::kOutOfMemoryError,
      "CPU budget allocator: out of memory: tried to allocate 4096 bytes with 123456 bytes in use "
      "under a limit of 125000 bytes (--memory-limit)",
      kPlain);
  EXPECT_EQ(budget.failed_in_use_bytes, 123456);
  const auto guard = classifyFailure(
      ExceptionType::kOutOfMemoryError,
      "CPU budget allocator: out of memory: tried to allocate 4096 bytes with 77 bytes of tensors "
      "in use, but the process would come within 64 MiB of its cgroup limit",
      kPlain);
  EXPECT_EQ(guard.failed_in_use_bytes, 77);
  EXPECT_EQ(classifyFailure(ExceptionType::kOutOfMemoryError, "Tried to allocate 20.00 MiB", kPlain)
                .failed_in_use_bytes,
            0);
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

// Catches: "out of memory" matched anywhere in any error's text (a step's own "my token cache:
// out of memory slots" taken for out of memory makes find() answer 7 where 5495 fits). The
// phrase counts on a line naming what ran out; an OutOfMemoryError counts whatever it says.
TEST(FailureTest, OutOfMemoryWordsCountOnlyWhereTheyNameWhatRanOut) {
  for (const char* text : {"my token cache: out of memory slots, call cache.reset()",
                           "RuntimeError: out of memory", "queue is out of memory budget"}) {
    for (const auto& context : kAll) {
      EXPECT_EQ(classifyFailure(ExceptionType::kOther, text, context).kind, FailureKind::kRethrow)
          << text;
    }
    EXPECT_EQ(classifyFailure(ExceptionType::kOutOfMemoryError, text, kPlain).kind,
              FailureKind::kOutOfMemory)
        << text;
  }
  for (const char* text :
       {"CUDA out of memory. Tried to allocate 2.00 MiB", "HIP out of memory. Tried to allocate",
        "MPS backend out of memory (MPS allocated: 1.00 GB)", "XPU out of memory.",
        "NCCL error: unhandled cuda error\nLast error:\nCuda failure 'out of memory'",
        "Triton Error [CUDA]: out of memory",
        "CPU budget allocator: out of memory: tried to allocate 64 bytes", "hipErrorOutOfMemory"}) {
    EXPECT_EQ(classifyFailure(ExceptionType::kOther, text, kPlain).kind, FailureKind::kOutOfMemory)
        << text;
  }
  EXPECT_EQ(classifyFailure(ExceptionType::kOther,
                            wrappedByTorchScript("CPU budget allocator: out of memory: tried to "
                                                 "allocate 64 bytes"),
                            kPlain)
                .kind,
            FailureKind::kOutOfMemory);
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

// Issue 15, fault 2. Catches: searching the whole text for "device-side assert", which matches
// the DSA hint line of every CUDA runtime error and rethrew this out of memory as fatal.
TEST(FailureTest, CudaRuntimeOutOfMemoryWithHintLinesIsOutOfMemory) {
  EXPECT_EQ(cudaCheckMessage("out of memory", "cudaErrorMemoryAllocation"), kCudaOutOfMemory);
  // Also: as c10::Error::what() gives it (the backtrace appended; the first lines of the same
  // run's, the library path shortened), as TorchScript wraps it, under CUDA_LAUNCH_BLOCKING=1 (no
  // asynchronous-report lines), and from a check made with device assertions off (the "explicitly
  // omitted" line, which names device-side assertions too).
  const std::string with_backtrace =
      std::string(kCudaOutOfMemory) +
      "Exception raised from fn at f.cpp:7 (most recent call first):\n"
      "frame #0: c10::Error::Error(c10::SourceLocation, std::__cxx11::basic_string<char, "
      "std::char_traits<char>, std::allocator<char> >) + 0x9d (0x7fc60f28505d in "
      ".../torch/lib/libc10.so)\n"
      "frame #1: <unknown function> + 0xc114 (0x7fc60f31e114 in .../torch/lib/libc10_cuda.so)\n";
  const std::string blocking =
      "CUDA error: out of memory\n"
      "Search for `cudaErrorMemoryAllocation' in "
      "https://docs.nvidia.com/cuda/cuda-runtime-api/group__CUDART__TYPES.html for more "
      "information.\n"
      "Compile with `TORCH_USE_CUDA_DSA` to enable device-side assertions.\n";
  const std::string omitted =
      "CUDA error: out of memory\n"
      "Search for `cudaErrorMemoryAllocation' in "
      "https://docs.nvidia.com/cuda/cuda-runtime-api/group__CUDART__TYPES.html for more "
      "information.\n"
      "CUDA kernel errors might be asynchronously reported at some other API call, so the "
      "stacktrace below might be incorrect.\n"
      "For debugging consider passing CUDA_LAUNCH_BLOCKING=1\n"
      "Device-side assertions were explicitly omitted for this error check; the error probably "
      "arose while initializing the DSA handlers.";
  struct Case {
    std::string text;
    std::string reason;
  };
  for (const Case& k :
       {Case{kCudaOutOfMemory, "CUDA error: out of memory"},
        Case{with_backtrace, "CUDA error: out of memory"},
        Case{wrappedByTorchScript(kCudaOutOfMemory), "RuntimeError: CUDA error: out of memory"},
        Case{blocking, "CUDA error: out of memory"}, Case{omitted, "CUDA error: out of memory"}}) {
    for (const auto& context : kAll) {
      const auto c = classifyFailure(ExceptionType::kOther, k.text, context);
      EXPECT_EQ(c.kind, FailureKind::kOutOfMemory) << k.text;
      EXPECT_EQ(c.reason, k.reason);
      EXPECT_EQ(c.failed_request_bytes, 0);
    }
  }
}

// Issue 15, fault 2. Catches: the DSA hint line read as a fatal device-side assert, which turned
// this kernel launch limit into an exception.
TEST(FailureTest, CudaInvalidConfigurationWithHintLinesIsSizeLimit) {
  const std::string text =
      "CUDA error: invalid configuration argument\n"
      "Search for `cudaErrorInvalidConfiguration' in "
      "https://docs.nvidia.com/cuda/cuda-runtime-api/group__CUDART__TYPES.html for more "
      "information.\n"
      "CUDA kernel errors might be asynchronously reported at some other API call, so the "
      "stacktrace below might be incorrect.\n"
      "For debugging consider passing CUDA_LAUNCH_BLOCKING=1\n"
      "Compile with `TORCH_USE_CUDA_DSA` to enable device-side assertions.\n";
  EXPECT_EQ(cudaCheckMessage("invalid configuration argument", "cudaErrorInvalidConfiguration"),
            text);
  const auto c = classifyFailure(ExceptionType::kOther, text, kPlain);
  EXPECT_EQ(c.kind, FailureKind::kSizeLimit);
  EXPECT_EQ(c.reason, "CUDA error: invalid configuration argument");
}

// Issue 15, fault 2, the other side. Catches an over-eager fix: the fatal needles dropped, or the
// hint lines dropped together with the error line, letting a corrupted context count as out of
// memory (after a larger OOM, with an OOM-typed exception). The reason names the fatal line, also
// inside TorchScript's wrapping (the old code gave its first line).
TEST(FailureTest, FatalCudaErrorsWithTheirFullTextsStayFatal) {
  struct Fatal {
    const char* error_string;  // cudaGetErrorString
    const char* error_name;    // cudaGetErrorName
  };
  for (const Fatal& f :
       {Fatal{"an illegal memory access was encountered", "cudaErrorIllegalAddress"},
        Fatal{"device-side assert triggered", "cudaErrorAssert"},
        Fatal{"misaligned address", "cudaErrorMisalignedAddress"},
        Fatal{"unspecified launch failure", "cudaErrorLaunchFailure"},
        Fatal{"an illegal instruction was encountered", "cudaErrorIllegalInstruction"},
        Fatal{"uncorrectable ECC error encountered", "cudaErrorECCUncorrectable"}}) {
    const std::string text = cudaCheckMessage(f.error_string, f.error_name);
    const std::string line = std::string("CUDA error: ") + f.error_string;
    for (const auto type : {ExceptionType::kOther, ExceptionType::kOutOfMemoryError}) {
      const auto c = classifyFailure(type, text, kAfterOom);
      EXPECT_EQ(c.kind, FailureKind::kRethrow) << text;
      EXPECT_EQ(c.reason, line);
    }
    const auto wrapped =
        classifyFailure(ExceptionType::kOther, wrappedByTorchScript(text), kNearLimit);
    EXPECT_EQ(wrapped.kind, FailureKind::kRethrow);
    EXPECT_EQ(wrapped.reason, "RuntimeError: " + line);
  }
}

// Issue 15, fault 3. Catches: only cuDNN 8's CUDNN_STATUS_ALLOC_FAILED known. cuDNN 9's
// cudnnGetErrorString (libcudnn_graph.so.9, 9.19) prints these names; AT_CUDNN_CHECK prefixes
// "cuDNN error: ".
TEST(FailureTest, CudnnNineAllocationFailuresAreOutOfMemory) {
  for (const char* text : {"cuDNN error: CUDNN_STATUS_INTERNAL_ERROR_HOST_ALLOCATION_FAILED",
                           "cuDNN error: CUDNN_STATUS_INTERNAL_ERROR_DEVICE_ALLOCATION_FAILED",
                           "cuDNN error: CUDNN_STATUS_ALLOC_FAILED"}) {
    const auto c = classifyFailure(ExceptionType::kOther, text, kPlain);
    EXPECT_EQ(c.kind, FailureKind::kOutOfMemory) << text;
    EXPECT_EQ(c.reason, text);
  }
  const auto wrapped = classifyFailure(
      ExceptionType::kOther,
      wrappedByTorchScript("cuDNN error: CUDNN_STATUS_INTERNAL_ERROR_DEVICE_ALLOCATION_FAILED"),
      kPlain);
  EXPECT_EQ(wrapped.kind, FailureKind::kOutOfMemory);
  EXPECT_EQ(wrapped.reason,
            "RuntimeError: cuDNN error: CUDNN_STATUS_INTERNAL_ERROR_DEVICE_ALLOCATION_FAILED");
}

// Issue 15, fault 3. Catches: "CUDNN_STATUS_NOT_SUPPORTED" matched as a substring, which made
// every cuDNN 9 CUDNN_STATUS_NOT_SUPPORTED_* code (an install, dtype or layout fault) a size
// limit. All fourteen codes of cudnn_graph.h (cuDNN 9.19); the reason names the code, also when
// TorchScript's wrapping comes first, and no context turns them into out of memory.
TEST(FailureTest, SuffixedCudnnNotSupportedCodesAreRethrownNamingTheCode) {
  for (const char* code :
       {"CUDNN_STATUS_NOT_SUPPORTED_GRAPH_PATTERN", "CUDNN_STATUS_NOT_SUPPORTED_SHAPE",
        "CUDNN_STATUS_NOT_SUPPORTED_DATA_TYPE", "CUDNN_STATUS_NOT_SUPPORTED_LAYOUT",
        "CUDNN_STATUS_NOT_SUPPORTED_INCOMPATIBLE_CUDA_DRIVER",
        "CUDNN_STATUS_NOT_SUPPORTED_INCOMPATIBLE_CUDART",
        "CUDNN_STATUS_NOT_SUPPORTED_ARCH_MISMATCH",
        "CUDNN_STATUS_NOT_SUPPORTED_RUNTIME_PREREQUISITE_MISSING",
        "CUDNN_STATUS_NOT_SUPPORTED_SUBLIBRARY_UNAVAILABLE",
        "CUDNN_STATUS_NOT_SUPPORTED_SHARED_MEMORY_INSUFFICIENT",
        "CUDNN_STATUS_NOT_SUPPORTED_PADDING", "CUDNN_STATUS_NOT_SUPPORTED_BAD_LAUNCH_PARAM",
        "CUDNN_STATUS_NOT_SUPPORTED_CUDA_GRAPH_NATIVE_API",
        "CUDNN_STATUS_NOT_SUPPORTED_INVALID_DYNAMIC_SHAPE"}) {
    const std::string text = std::string("cuDNN error: ") + code;
    for (const auto& context : kAll) {
      const auto c = classifyFailure(ExceptionType::kOther, wrappedByTorchScript(text), context);
      EXPECT_EQ(c.kind, FailureKind::kRethrow) << code;
      EXPECT_EQ(c.reason, "RuntimeError: " + text);
    }
  }
  // The bare code (AT_CUDNN_CHECK's full text for it) is still a size limit.
  const char* bare =
      "cuDNN error: CUDNN_STATUS_NOT_SUPPORTED. This error may appear if you passed in a "
      "non-contiguous input.";
  const auto c = classifyFailure(ExceptionType::kOther, wrappedByTorchScript(bare), kPlain);
  EXPECT_EQ(c.kind, FailureKind::kSizeLimit);
  EXPECT_EQ(c.reason, std::string("RuntimeError: ") + bare);
}

// Issue 15, fault 3: status codes match as whole identifiers. Catches: a case-insensitive
// substring search, which called a model error that merely names a longer identifier out of
// memory.
TEST(FailureTest, StatusCodesMatchOnlyAsWholeIdentifiers) {
  for (const char* text : {"NameError: name 'CUFFT_ALLOC_FAILED_COUNT' is not defined",
                           "undefined value my_cudaErrorMemoryAllocation",
                           "Unknown builtin op: cublas_status_alloc_failed"}) {
    const auto c = classifyFailure(ExceptionType::kOther, text, kPlain);
    EXPECT_EQ(c.kind, FailureKind::kRethrow) << text;
    EXPECT_EQ(c.reason, text);
  }
  // Punctuation around a code does not hide it.
  const auto c = classifyFailure(ExceptionType::kOther,
                                 "CUDA error: (CUBLAS_STATUS_ALLOC_FAILED) in cublasLt", kPlain);
  EXPECT_EQ(c.kind, FailureKind::kOutOfMemory);
  EXPECT_EQ(c.reason, "CUDA error: (CUBLAS_STATUS_ALLOC_FAILED) in cublasLt");
}

// Issue 15, fault 3. Catches: these rethrown as model errors (a search that ended on a memory
// shortage) or taken as plain out of memory (a broken install reported as "nothing fits"). Texts
// from libtorch_cuda.so (2.11); cublasCreate's through TORCH_CUDABLAS_CHECK ("CUDA error: ").
TEST(FailureTest, AmbiguousLibraryFailuresArePossibleOutOfMemory) {
  EXPECT_EQ(toString(FailureKind::kPossibleOutOfMemory), "possible-out-of-memory");
  EXPECT_EQ(toString(FailureKind::kOutOfMemory), "out-of-memory");
  EXPECT_EQ(toString(FailureKind::kSizeLimit), "size-limit");
  EXPECT_EQ(toString(FailureKind::kRethrow), "rethrow");
  for (const char* text : {"GET was unable to find an engine to execute this computation",
                           "FIND was unable to find an engine to execute this computation",
                           "Unable to find a valid cuDNN algorithm to run convolution",
                           "CUDA error: CUBLAS_STATUS_NOT_INITIALIZED when calling "
                           "`cublasCreate(handle)`"}) {
    for (const auto& context : kAll) {
      const auto c = classifyFailure(ExceptionType::kOther, text, context);
      EXPECT_EQ(c.kind, FailureKind::kPossibleOutOfMemory) << text;
      EXPECT_EQ(c.reason, text);
      EXPECT_EQ(c.failed_request_bytes, 0);
    }
    const auto wrapped = classifyFailure(ExceptionType::kOther, wrappedByTorchScript(text), kPlain);
    EXPECT_EQ(wrapped.kind, FailureKind::kPossibleOutOfMemory) << text;
    EXPECT_EQ(wrapped.reason, std::string("RuntimeError: ") + text);
    // The rules before it win: an OOM-typed exception is out of memory, a fatal error is fatal.
    EXPECT_EQ(classifyFailure(ExceptionType::kOutOfMemoryError, text, kPlain).kind,
              FailureKind::kOutOfMemory);
    EXPECT_EQ(classifyFailure(ExceptionType::kOther,
                              std::string(text) + "\nCUDA error: an illegal memory access was "
                                                  "encountered",
                              kPlain)
                  .kind,
              FailureKind::kRethrow);
  }
  // The same status from another call is not cublasCreate's.
  EXPECT_EQ(classifyFailure(ExceptionType::kOther,
                            "CUDA error: CUBLAS_STATUS_NOT_INITIALIZED when calling "
                            "`cublasSetStream(handle, stream)`",
                            kPlain)
                .kind,
            FailureKind::kRethrow);
}

// Issue 15, fault 3. Catches: the INT_MAX element limits of ATen's CUDA kernels missing (the
// search ended with a model error at a batch that only crossed 2^31 elements). Texts from
// libtorch_cuda.so (2.11); upsample's ends with the sizes. LayerNorm's normalized shape does not
// grow with the batch: a model error.
TEST(FailureTest, IntMaxElementLimitsAreSizeLimit) {
  for (const char* text :
       {"upsample_bilinear2d_nhwc only supports input tensors with less than INT_MAX elements, "
        "but got [64, 256, 512, 512]",
        "upsample_nearest_nhwc only supports grad_output tensors with less than INT_MAX elements, "
        "but got [64, 128, 1024, 512]",
        "cub sort does not support sorting more than INT_MAX elements",
        "cub unique does not support more than INT_MAX elements",
        "The dimension being sorted can not have more than INT_MAX elements."}) {
    const auto c = classifyFailure(ExceptionType::kOther, text, kPlain);
    EXPECT_EQ(c.kind, FailureKind::kSizeLimit) << text;
    EXPECT_EQ(c.reason, text);
  }
  const char* layer_norm =
      "Normalized shape should have less than INT_MAX elements,   file a support request to "
      "support bigger normalized shapes";
  EXPECT_EQ(classifyFailure(ExceptionType::kOther, layer_norm, kPlain).kind, FailureKind::kRethrow);
}

// Issue 15, fault 3. Catches: cuBLAS's int32 argument checks missing, and a loose "must be
// non-negative and less than" needle that would call the model error "dim must be non-negative
// and less than input dimensions" (libtorch_cuda.so) a size limit. The full texts of
// CUDABLAS_NONNEGINT_CHECK / CUDABLAS_POSINT_CHECK (ATen/cuda/CUDABlas.cpp, 2.11); a value within
// int range (negative: a bug) is not a size limit.
TEST(FailureTest, CublasArgumentLimitsAreSizeLimitInTheirFullForm) {
  for (const char* text :
       {"at::cuda::blas::gemm<float> argument m must be non-negative and less than 2147483647 but "
        "got 3221225472",
        "at::cuda::blas::gemm<at::BFloat16> argument k must be non-negative and less than "
        "2147483647 but got 2147483648",
        "at::cuda::blas::bgemm<at::Half> argument num_batches must be non-negative and less than "
        "2147483647 but got 4294967296",
        "at::cuda::blas::gemm<double> argument ldc must be positive and less than 2147483647 but "
        "got 99999999999999999999999"}) {
    const auto c = classifyFailure(ExceptionType::kOther, wrappedByTorchScript(text), kPlain);
    EXPECT_EQ(c.kind, FailureKind::kSizeLimit) << text;
    EXPECT_EQ(c.reason, std::string("RuntimeError: ") + text);
  }
  for (const char* text :
       {"dim must be non-negative and less than input dimensions",
        "at::cuda::blas::gemm<float> argument m must be non-negative and less than 2147483647 but "
        "got -1",
        "at::cuda::blas::gemm<float> argument lda must be positive and less than 2147483647 but "
        "got 0",
        "index 5 must be non-negative and less than 2147483647 but got 3221225472"}) {
    const auto c = classifyFailure(ExceptionType::kOther, text, kAfterOom);
    EXPECT_EQ(c.kind, FailureKind::kRethrow) << text;
    EXPECT_EQ(c.reason, text);
  }
}

// The trial runner's poisoned-device check reads the same lines. Catches: the whole text searched,
// which called every CUDA runtime error (this out of memory included) a sticky fatal error.
TEST(FailureTest, IsFatalDeviceErrorIgnoresHintLines) {
  EXPECT_FALSE(isFatalDeviceError(std::string_view(kCudaOutOfMemory)));
  EXPECT_FALSE(isFatalDeviceError(
      cudaCheckMessage("invalid configuration argument", "cudaErrorInvalidConfiguration")));
  EXPECT_TRUE(isFatalDeviceError(
      cudaCheckMessage("an illegal memory access was encountered", "cudaErrorIllegalAddress")));
  EXPECT_TRUE(isFatalDeviceError(
      wrappedByTorchScript(cudaCheckMessage("device-side assert triggered", "cudaErrorAssert"))));
}

// Issue 27, row 13: sizes past 2^63 - 1 bytes.
// ATen's size arithmetic overflowing (computeStorageNbytes, 2.11's text) is a tensor no memory
// holds: out of memory at that batch, not a model error (--check-batch 1099511627776 at
// 3x1024x1024 was exit 1). And a request written near 2^63 (c10's "you tried to allocate
// 9223372036854775807 bytes", a double of 2^63 once parsed) reads as INT64_MAX: llround of it is
// undefined and gave INT64_MIN, a negative request.
TEST(FailureTest, SizesPastInt64AreOutOfMemoryAndParseWithoutWrapping) {
  const std::string overflow =
      "Storage size calculation overflowed with sizes=[1099511627776, 3, 1024, 1024]";
  for (const auto& context : kAll) {
    EXPECT_EQ(classifyFailure(ExceptionType::kOther, overflow, context).kind,
              FailureKind::kOutOfMemory);
    EXPECT_EQ(classifyFailure(ExceptionType::kOther, wrappedByTorchScript(overflow), context).kind,
              FailureKind::kOutOfMemory);
  }
  const auto huge = classifyFailure(
      ExceptionType::kOther,
      "[enforce fail at alloc_cpu.cpp:127] err == 0. DefaultCPUAllocator: can't allocate memory: "
      "you tried to allocate 9223372036854775807 bytes. Error code 12 (Cannot allocate memory)",
      kNearLimit);
  EXPECT_EQ(huge.kind, FailureKind::kOutOfMemory);
  EXPECT_EQ(huge.failed_request_bytes, std::numeric_limits<std::int64_t>::max());
  const auto in_use = classifyFailure(
      ExceptionType::kOutOfMemoryError,
      "out of memory: the inputs of micro-batch 1 would allocate 9223372036854775807 bytes with "
      "9223372036854775807 bytes in use",
      kPlain);
  EXPECT_EQ(in_use.failed_in_use_bytes, std::numeric_limits<std::int64_t>::max());
}

}  // namespace failure_test
}  // namespace
}  // namespace autobatch
