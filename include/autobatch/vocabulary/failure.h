// autobatch/vocabulary/failure.h — what an exception raised during a trial means: the ONE
// classification.
//
// A trial that throws is either out of memory (a result: the batch does not fit), possibly out of
// memory (a library failure that memory exhaustion and a model or install fault both cause: the
// trial runner decides it by evidence), at a kernel's hard size limit (a result: never "does not
// fit", never silently shrunk), or anything else (a model error, an install fault or a fatal device
// error: rethrown unchanged by the trial runner).
// The text rules are LibTorch-free (classifyFailure); classifyException maps a live exception
// (c10::OutOfMemoryError, std::bad_alloc, other std::exception, non-std) onto them and is
// implemented in the LibTorch part of the library.
// Thread safety: pure functions.
#pragma once

#include <cstdint>
#include <exception>
#include <string>
#include <string_view>

namespace autobatch {

/// What the trial runner does with a failure.
enum class FailureKind {
  kOutOfMemory,  ///< the batch does not fit (TrialOutcome::kOutOfMemory)
  kSizeLimit,    ///< a kernel's hard size limit (TrialOutcome::kSizeLimit)
  kRethrow,      ///< a model, install or fatal device error: leaves the runner unchanged
  /// A cuDNN / cuBLAS failure that memory exhaustion causes as often as a model or install fault
  /// (classifyFailure rule 4). The text cannot tell them apart; the trial runner decides by
  /// evidence: it empties the cache and re-runs, as a trial of its own, the largest batch already
  /// seen to fit. If that re-run fits, the failure was out of memory (the failed trial counts as
  /// TrialOutcome::kOutOfMemory); if the same error comes back there, it is the model's or the
  /// install's and is rethrown (exit 1). When nothing has fitted yet it is taken as out of memory.
  kPossibleOutOfMemory,
};

/// "out-of-memory", "size-limit", "rethrow", "possible-out-of-memory".
std::string_view toString(FailureKind kind);

/// The type of the exception object, as far as classification cares.
enum class ExceptionType {
  kOutOfMemoryError,  ///< c10::OutOfMemoryError (caching allocator, CPU budget allocator)
  kBadAlloc,          ///< std::bad_alloc (operator new failed)
  kOther,             ///< any other std::exception (c10::Error, std::runtime_error, ...)
  kNonStd,            ///< not derived from std::exception: always rethrown
};

/// When the ambiguous signs of exhaustion count as out of memory.
struct FailureContext {
  /// A process limit (RLIMIT_DATA, RLIMIT_AS, a cgroup limit) is set and the trial came near it:
  /// the failed request's size is known (a refused R-byte request shows the process was within R
  /// of its limit, whatever the tensors counted), or the trial's tensor peak plus the request
  /// reached half of the headroom the limit left at start. Without a process limit, an allocation
  /// failure is out of memory only after a larger OOM (an absurd request is a model error).
  bool process_limit_near = false;
  /// The previous trial ran out of memory at a larger micro-batch than this one.
  bool after_larger_oom = false;
};

/// A classified failure.
struct FailureClass {
  FailureKind kind = FailureKind::kRethrow;
  /// The line of the message that decided it (trimmed, at most 1000 characters): for kRethrow the
  /// line naming the fatal device error or the cuDNN status code (rules 2 and 5), else the first
  /// line of the message. Never one of PyTorch's hint lines.
  std::string reason;
  /// Bytes of the failed allocation when the message tells ("Tried to allocate 2.00 GiB",
  /// "tried to allocate 4096 bytes"), else 0.
  std::int64_t failed_request_bytes = 0;
  /// Bytes held by tensors when the allocation was refused, as a lower bound, when the message
  /// tells: the CPU budget allocator's "with N bytes in use" (exact), c10's CUDA "Of the allocated
  /// memory 7.50 GiB is allocated by PyTorch" (less half of the last digit's unit); else 0.
  std::int64_t failed_in_use_bytes = 0;
};

/// The classification rules, in order. They look at the message's own lines only: PyTorch's
/// standard hint lines are dropped first, since every CUDA runtime error carries them whatever the
/// error ("Compile with `TORCH_USE_CUDA_DSA` to enable device-side assertions.", "CUDA kernel
/// errors might be asynchronously reported ...", "For debugging consider passing
/// CUDA_LAUNCH_BLOCKING=1", "Search for `cudaError...' in https://... for more information.",
/// "Device-side assertions were explicitly omitted ...", and the other lines c10's
/// c10_cuda_check_implementation appends; LibTorch 2.11, libc10_cuda.so).
/// Phrases match as substrings; status codes (CUDNN_STATUS_..., CUBLAS_STATUS_..., cudaError...)
/// match as whole identifiers only, case-sensitively: CUDNN_STATUS_NOT_SUPPORTED does not match
/// CUDNN_STATUS_NOT_SUPPORTED_ARCH_MISMATCH.
/// 1. kNonStd -> rethrow.
/// 2. Fatal device errors -> rethrow, even inside an OOM-typed message: "illegal memory access",
///    "misaligned address", "unspecified launch failure", "device-side assert", "illegal
///    instruction", "uncorrectable ECC" (case-insensitive).
/// 3. kOutOfMemoryError, or a message naming an allocation failure -> out of memory: "out of
///    memory" (case-insensitive) on a line that names what ran out: the word CUDA, Cuda, cuda,
///    HIP, MPS, XPU or NCCL, or "allocator" in any case (the caching allocator's "CUDA out of
///    memory", "CUDA error: out of memory", the CPU budget allocator's text, and these texts
///    inside TorchScript's wrapped std::runtime_error; a step's own "cache: out of memory slots"
///    is not: a review of stop 54); the codes cudaErrorMemoryAllocation, hipErrorOutOfMemory,
///    CUBLAS_STATUS_ALLOC_FAILED,
///    CUDNN_STATUS_INTERNAL_ERROR_HOST_ALLOCATION_FAILED,
///    CUDNN_STATUS_INTERNAL_ERROR_DEVICE_ALLOCATION_FAILED (cuDNN 9), CUDNN_STATUS_ALLOC_FAILED
///    (its deprecated alias), CUFFT_ALLOC_FAILED, CUSOLVER_STATUS_ALLOC_FAILED,
///    CUSPARSE_STATUS_ALLOC_FAILED.
/// 4. Failures that exhaustion causes as often as a model or install fault -> possible out of
///    memory (see FailureKind::kPossibleOutOfMemory): "GET was unable to find an engine to execute
///    this computation", "FIND was unable to find an engine to execute this computation" (cuDNN v8
///    API), "Unable to find a valid cuDNN algorithm to run convolution" (cuDNN v7 API),
///    "CUBLAS_STATUS_NOT_INITIALIZED when calling `cublasCreate(handle)`".
/// 5. cuDNN 9's CUDNN_STATUS_NOT_SUPPORTED_* codes (_ARCH_MISMATCH, _DATA_TYPE, _SUBLIBRARY_
///    UNAVAILABLE, _INCOMPATIBLE_CUDA_DRIVER, ...: install, dtype or layout faults) -> rethrow, the
///    reason being the line that names the code.
/// 6. Hard size limits -> size limit: the bare code CUDNN_STATUS_NOT_SUPPORTED; "invalid
///    configuration argument", "canUse32BitIndexMath", "32-bit index", "int32 index", "tensors
///    with less than INT_MAX elements" (upsampling), "more than INT_MAX elements" (cub scans,
///    sorts, unique); cuBLAS's argument checks in their full form, "at::cuda::blas::<fn> argument
///    <name> must be non-negative and less than 2147483647 but got <N>" (or "must be positive")
///    with N above 2147483647.
/// 7. Only when context.process_limit_near or context.after_larger_oom -> out of memory:
///    kBadAlloc, "can't allocate memory" (DefaultCPUAllocator), "Cannot allocate memory",
///    "std::bad_alloc", "could not create a primitive" / "could not execute a primitive" (oneDNN).
/// 8. Everything else -> rethrow.
FailureClass classifyFailure(ExceptionType type, std::string_view message,
                             const FailureContext& context);

/// A caught exception as classification sees it: its type and its what().
struct RaisedError {
  ExceptionType type = ExceptionType::kNonStd;
  std::string message;
};

/// The ExceptionType and what() of a caught exception (c10::OutOfMemoryError, std::bad_alloc,
/// std::exception, other: "non-standard exception"). `error` must not be null.
/// Implemented in the LibTorch part of the library.
RaisedError describeException(const std::exception_ptr& error);

/// classifyFailure for a caught exception: finds its ExceptionType (c10::OutOfMemoryError,
/// std::bad_alloc, std::exception, other) and its what(). `error` must not be null.
/// Implemented in the LibTorch part of the library.
FailureClass classifyException(const std::exception_ptr& error, const FailureContext& context);

/// True when the message's own lines (hint lines dropped) name a fatal device error (rule 2): a
/// sticky CUDA error after which every device call of the process fails again. The trial runner
/// then makes no more device calls (docs/trial_runner.md, "a poisoned device").
bool isFatalDeviceError(std::string_view message);
/// isFatalDeviceError for a caught exception's what(); false for a non-std exception. `error`
/// must not be null. Implemented in the LibTorch part of the library.
bool isFatalDeviceError(const std::exception_ptr& error);

/// `message` without the C++ backtrace LibTorch appends to its errors: everything from the first
/// "\nException raised from " or "\nframe #" line on (users need the message, not the frames;
/// issue 27, row 13: 27 frames in stderr and the JSON). Pure.
std::string withoutBacktrace(std::string message);

}  // namespace autobatch
