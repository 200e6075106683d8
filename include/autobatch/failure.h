// autobatch/failure.h — what an exception raised during a trial means: the ONE classification.
//
// A trial that throws is either out of memory (a result: the batch does not fit), at a kernel's
// hard size limit (a result: never "does not fit", never silently shrunk), or anything else
// (a model error or a fatal device error: rethrown unchanged by the trial runner).
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
  kRethrow,      ///< a model or fatal device error: leaves the runner unchanged
};

/// "out-of-memory", "size-limit", "rethrow".
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
  /// The line of the message that decided it (trimmed, at most 1000 characters); for kRethrow the
  /// first line of the message.
  std::string reason;
  /// Bytes of the failed allocation when the message tells ("Tried to allocate 2.00 GiB",
  /// "tried to allocate 4096 bytes"), else 0.
  std::int64_t failed_request_bytes = 0;
};

/// The classification rules, in order:
/// 1. kNonStd -> rethrow.
/// 2. Fatal device errors -> rethrow, even inside an OOM-typed message: "illegal memory access",
///    "misaligned address", "unspecified launch failure", "device-side assert", "illegal
///    instruction", "uncorrectable ECC" (case-insensitive).
/// 3. kOutOfMemoryError, or a message naming an allocation failure -> out of memory: "out of
///    memory" (the caching allocator's "CUDA out of memory", "CUDA error: out of memory", the CPU
///    budget allocator's text, and these texts inside TorchScript's wrapped std::runtime_error),
///    "cudaErrorMemoryAllocation", "CUBLAS_STATUS_ALLOC_FAILED", "CUDNN_STATUS_ALLOC_FAILED",
///    "CUFFT_ALLOC_FAILED", "CUSOLVER_STATUS_ALLOC_FAILED", "CUSPARSE_STATUS_ALLOC_FAILED"
///    (case-insensitive).
/// 4. Hard size limits -> size limit: "CUDNN_STATUS_NOT_SUPPORTED", "invalid configuration
///    argument", "canUse32BitIndexMath", "32-bit index", "int32 index".
/// 5. Only when context.process_limit_near or context.after_larger_oom -> out of memory:
///    kBadAlloc, "can't allocate memory" (DefaultCPUAllocator), "Cannot allocate memory",
///    "std::bad_alloc", "could not create a primitive" / "could not execute a primitive" (oneDNN).
/// 6. Everything else -> rethrow.
FailureClass classifyFailure(ExceptionType type, std::string_view message,
                             const FailureContext& context);

/// classifyFailure for a caught exception: finds its ExceptionType (c10::OutOfMemoryError,
/// std::bad_alloc, std::exception, other) and its what(). `error` must not be null.
/// Implemented in the LibTorch part of the library.
FailureClass classifyException(const std::exception_ptr& error, const FailureContext& context);

}  // namespace autobatch
