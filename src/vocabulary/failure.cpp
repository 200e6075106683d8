#include "autobatch/vocabulary/failure.h"

#include <algorithm>
#include <array>
#include <cctype>
#include <charconv>
#include <cmath>
#include <cstdint>
#include <limits>
#include <optional>
#include <system_error>
#include <vector>

namespace autobatch {
namespace {

// The process guard's refusal names two cgroup folders: about 500 characters here.
constexpr std::size_t kMaxReason = 1000;

bool contains(std::string_view haystack, std::string_view needle) {
  return haystack.find(needle) != std::string_view::npos;
}

std::string lower(std::string_view s) {
  std::string out(s);
  for (auto& c : out) c = static_cast<char>(std::tolower(static_cast<unsigned char>(c)));
  return out;
}

std::string trimmed(std::string_view s) {
  while (!s.empty() && std::isspace(static_cast<unsigned char>(s.front())) != 0) s.remove_prefix(1);
  while (!s.empty() && std::isspace(static_cast<unsigned char>(s.back())) != 0) s.remove_suffix(1);
  std::string out(s.substr(0, kMaxReason));
  return out;
}

// A size written at `pos` of lower-cased `text` ("2.00 gib", "4096 bytes"): its value in bytes
// and the rounding of the figure as written (half its last digit's unit; 0 for a whole count of
// bytes). nullopt when no number followed by a unit is there.
struct WrittenSize {
  double bytes = 0.0;
  double rounding = 0.0;
};
std::optional<WrittenSize> sizeAt(const std::string& text, std::size_t pos) {
  std::size_t end = pos;
  std::size_t decimals = 0;
  bool point = false;
  while (end < text.size() && ((text[end] >= '0' && text[end] <= '9') || text[end] == '.')) {
    if (text[end] == '.') {
      point = true;
    } else if (point) {
      ++decimals;
    }
    ++end;
  }
  if (end == pos) return std::nullopt;
  double value = 0.0;
  try {
    value = std::stod(text.substr(pos, end - pos));
  } catch (const std::exception&) {
    return std::nullopt;
  }
  pos = end;
  while (pos < text.size() && text[pos] == ' ') ++pos;
  const std::string_view unit = std::string_view(text).substr(pos);
  double scale = 0.0;
  if (unit.starts_with("kib") || unit.starts_with("kb")) {
    scale = 1024.0;
  } else if (unit.starts_with("mib") || unit.starts_with("mb")) {
    scale = 1024.0 * 1024.0;
  } else if (unit.starts_with("gib") || unit.starts_with("gb")) {
    scale = 1024.0 * 1024.0 * 1024.0;
  } else if (unit.starts_with("tib") || unit.starts_with("tb")) {
    scale = 1024.0 * 1024.0 * 1024.0 * 1024.0;
  } else if (unit.starts_with("b")) {
    scale = 1.0;
  }
  if (scale <= 0.0) return std::nullopt;
  const double rounding =
      scale == 1.0 ? 0.0 : 0.5 * scale * std::pow(10.0, -static_cast<double>(decimals));
  return WrittenSize{value * scale, rounding};
}

// "allocate 2.00 GiB" / "allocate 4096 bytes" -> bytes; 0 when absent. The first "allocate "
// followed by a number and a unit counts ("can't allocate memory: you tried to allocate 4 bytes").
std::int64_t parseRequestBytes(std::string_view message) {
  const std::string text = lower(message);
  for (std::size_t at = text.find("allocate "); at != std::string::npos;
       at = text.find("allocate ", at + 1)) {
    if (const auto size = sizeAt(text, at + 9)) {
      // 2^63 and above do not convert (llround of it is undefined): "you tried to allocate
      // 9223372036854775807 bytes" reads as a double of 2^63.
      if (size->bytes >= 9223372036854775807.0) return std::numeric_limits<std::int64_t>::max();
      return static_cast<std::int64_t>(std::llround(size->bytes));
    }
  }
  return 0;
}

// Bytes held by tensors when the allocation was refused, as a lower bound; 0 when the message does
// not tell. The CPU budget allocator's "... bytes with N bytes in use" / "with N bytes of tensors
// in use" (exact), and c10's CUDA message "Of the allocated memory 7.50 GiB is allocated by
// PyTorch" (CUDACachingAllocator.cpp, format_size with two decimals: less half a unit of the last
// digit, so it stays a lower bound).
std::int64_t parseInUseBytes(std::string_view message) {
  const std::string text = lower(message);
  for (const std::string_view key :
       {std::string_view(" bytes with "), std::string_view("of the allocated memory ")}) {
    const std::size_t at = text.find(key);
    if (at == std::string::npos) continue;
    const auto size = sizeAt(text, at + key.size());
    if (!size) continue;
    const bool cuda = key.starts_with("of ");
    if (cuda && text.find(" is allocated by pytorch", at) == std::string::npos) continue;
    if (!cuda && text.find(" in use", at) == std::string::npos) continue;
    const double bytes = std::floor(size->bytes - size->rounding);
    if (bytes >= 9223372036854775807.0) return std::numeric_limits<std::int64_t>::max();
    return std::max<std::int64_t>(0, static_cast<std::int64_t>(bytes));
  }
  return 0;
}

bool isIdentifierChar(char c) {
  return std::isalnum(static_cast<unsigned char>(c)) != 0 || c == '_';
}

// Where `code` occurs in `text` as a whole identifier (no identifier character on either side);
// npos when it does not.
std::size_t findIdentifier(std::string_view text, std::string_view code) {
  for (std::size_t at = text.find(code); at != std::string_view::npos;
       at = text.find(code, at + 1)) {
    const std::size_t end = at + code.size();
    if ((at == 0 || !isIdentifierChar(text[at - 1])) &&
        (end == text.size() || !isIdentifierChar(text[end]))) {
      return at;
    }
  }
  return std::string_view::npos;
}

// The lines PyTorch appends to an error message whatever the error. c10_cuda_check_implementation
// (c10/cuda/CUDAException.cpp) builds every C10_CUDA_CHECK message as "CUDA error: <text>", then
// get_cuda_error_help ("Search for `<cudaError name>' in <url> for more information.", or "GPU
// device may be out of range, ..."), get_cuda_check_suffix (the two asynchronous-report lines,
// absent under CUDA_LAUNCH_BLOCKING=1), then the device-side assertion line (the
// TORCH_USE_CUDA_DSA hint in release builds, the "explicitly omitted" line where assertions are
// not checked). Texts from libc10_cuda.so of LibTorch 2.11; the three lines of DSA-enabled builds
// (c10/cuda/CUDADeviceAssertionHost.cpp) and newer c10's CUDA_LOG_FILE hint from the sources.
// They name device-side assertions and cudaError codes: matched, they made every CUDA runtime
// error look fatal (issue 15). Matched at the start of a line (after blanks).
constexpr std::array<std::string_view, 10> kHintLinePrefixes{
    "Compile with `TORCH_USE_CUDA_DSA` to enable device-side assertions",
    "CUDA kernel errors might be asynchronously reported at some other API call",
    "For debugging consider passing CUDA_LAUNCH_BLOCKING=1",
    "Device-side assertions were explicitly omitted for this error check",
    "Device-side assertion tracking was not enabled by user",
    "Device-side assertions disabled because not all devices support managed memory",
    "Looking for device-side assertion failure information",
    "GPU device may be out of range, do you have enough GPUs?",
    "For more detailed error information, run with CUDA_LOG_FILE=stderr",
    "Search for `",
};

bool isHintLine(std::string_view line) {
  while (!line.empty() && std::isspace(static_cast<unsigned char>(line.front())) != 0) {
    line.remove_prefix(1);
  }
  for (const auto prefix : kHintLinePrefixes) {
    if (!line.starts_with(prefix)) continue;
    if (prefix == "Search for `") return contains(line, "' in https://");
    return true;
  }
  return false;
}

// The message's own lines: all but PyTorch's hint lines.
std::vector<std::string_view> errorLines(std::string_view message) {
  std::vector<std::string_view> lines;
  std::size_t start = 0;
  while (start <= message.size()) {
    std::size_t end = message.find('\n', start);
    if (end == std::string_view::npos) end = message.size();
    const std::string_view line = message.substr(start, end - start);
    if (!isHintLine(line)) lines.push_back(line);
    start = end + 1;
  }
  return lines;
}

std::string firstLine(const std::vector<std::string_view>& lines) {
  for (const auto line : lines) {
    std::string out = trimmed(line);
    if (!out.empty()) return out;
  }
  return {};
}

enum class Match {
  kPhrase,            // a substring
  kPhraseIgnoreCase,  // a substring, case-insensitively
  kCode,              // a whole identifier, case-sensitively: a library status code
};

struct Needle {
  std::string_view text;
  Match match;
};

bool matches(std::string_view line, const Needle& needle) {
  switch (needle.match) {
    case Match::kPhrase:
      return contains(line, needle.text);
    case Match::kPhraseIgnoreCase:
      return contains(lower(line), lower(needle.text));
    case Match::kCode:
      return findIdentifier(line, needle.text) != std::string_view::npos;
  }
  return false;
}

// The line holding the first of `needles` (in their order) that any line holds.
template <std::size_t N>
std::optional<std::string_view> lineWithAny(const std::vector<std::string_view>& lines,
                                            const std::array<Needle, N>& needles) {
  for (const auto& needle : needles) {
    for (const auto line : lines) {
      if (matches(line, needle)) return line;
    }
  }
  return std::nullopt;
}

constexpr std::array<Needle, 6> kFatal{{
    {"illegal memory access", Match::kPhraseIgnoreCase},
    {"misaligned address", Match::kPhraseIgnoreCase},
    {"unspecified launch failure", Match::kPhraseIgnoreCase},
    {"device-side assert", Match::kPhraseIgnoreCase},
    {"illegal instruction", Match::kPhraseIgnoreCase},
    {"uncorrectable ECC", Match::kPhraseIgnoreCase},
}};
// cuDNN 9 (cudnn_graph.h; cudnnGetErrorString prints the enumerator's name) reports allocation
// failures as CUDNN_STATUS_INTERNAL_ERROR_{HOST,DEVICE}_ALLOCATION_FAILED;
// CUDNN_STATUS_ALLOC_FAILED is the deprecated alias of the host one, the name cuDNN 8 printed.
// ATen's "Storage size calculation overflowed with sizes=[...]" (computeStorageNbytes): a tensor
// whose bytes pass 2^63 - 1 does not fit in any memory, so it is out of memory at that batch, not
// a model error (issue 27, row 13: --check-batch 1099511627776 at 3x1024x1024 was exit 1).
// The phrase "out of memory" counts only on a line that names what ran out: a step's own
// RuntimeError "my token cache: out of memory slots" taken for out of memory made a search answer
// 7 where 5495 fits (FailureTest.OutOfMemoryWordsCountOnlyWhereTheyNameWhatRanOut). What ran out:
// CUDA ("CUDA out of memory", C10_CUDA_CHECK's "CUDA error: out of memory", NCCL's "Cuda failure
// 'out of memory'", Triton's "[CUDA]"), ROCm's HIP, MPS, XPU, or an allocator (the CPU budget
// allocator's "CPU budget allocator: out of memory", c10's caching allocators). An
// OutOfMemoryError counts whatever its text.
constexpr std::array<std::string_view, 7> kOutOfMemoryProducers{
    {"CUDA", "Cuda", "cuda", "HIP", "MPS", "XPU", "NCCL"}};

std::optional<std::string_view> lineWithProducedOutOfMemory(
    const std::vector<std::string_view>& lines) {
  for (const auto line : lines) {
    const std::string low = lower(line);
    if (!contains(low, "out of memory")) continue;
    if (contains(low, "allocator")) return line;
    for (const auto producer : kOutOfMemoryProducers) {
      if (findIdentifier(line, producer) != std::string_view::npos) return line;
    }
  }
  return std::nullopt;
}

constexpr std::array<Needle, 10> kOutOfMemory{{
    {"hipErrorOutOfMemory", Match::kCode},
    {"Storage size calculation overflowed", Match::kPhrase},
    {"cudaErrorMemoryAllocation", Match::kCode},
    {"CUBLAS_STATUS_ALLOC_FAILED", Match::kCode},
    {"CUDNN_STATUS_INTERNAL_ERROR_HOST_ALLOCATION_FAILED", Match::kCode},
    {"CUDNN_STATUS_INTERNAL_ERROR_DEVICE_ALLOCATION_FAILED", Match::kCode},
    {"CUDNN_STATUS_ALLOC_FAILED", Match::kCode},
    {"CUFFT_ALLOC_FAILED", Match::kCode},
    {"CUSOLVER_STATUS_ALLOC_FAILED", Match::kCode},
    {"CUSPARSE_STATUS_ALLOC_FAILED", Match::kCode},
}};
// ATen's texts (libtorch_cuda.so, 2.11). The cuDNN v8 API's convolution raises GET / FIND when no
// engine ran: engines that failed with OutOfMemoryError (their workspace) were skipped, and so
// were engines the install or the dtype cannot run. The v7 API's search likewise. cublasCreate
// fails when the device has no room left for the handle, and on a broken install.
constexpr std::array<Needle, 4> kPossibleOutOfMemory{{
    {"GET was unable to find an engine to execute this computation", Match::kPhrase},
    {"FIND was unable to find an engine to execute this computation", Match::kPhrase},
    {"Unable to find a valid cuDNN algorithm to run convolution", Match::kPhrase},
    {"CUBLAS_STATUS_NOT_INITIALIZED when calling `cublasCreate(handle)`", Match::kPhrase},
}};
// The bare CUDNN_STATUS_NOT_SUPPORTED only (cuDNN's answer past 2^31 elements): the suffixed
// codes are install, dtype and layout faults (lineWithSuffixedNotSupported). INT_MAX texts from
// libtorch_cuda.so: upsample_* "only supports input tensors with less than INT_MAX elements, but
// got [sizes]"; "cub sort does not support sorting more than INT_MAX elements", "cub unique does
// not support more than INT_MAX elements" (InclusiveSumByKey, run_length_encode, reduce alike);
// "The dimension being sorted can not have more than INT_MAX elements." Not LayerNorm's
// "Normalized shape should have less than INT_MAX elements": that shape does not grow with the
// batch.
constexpr std::array<Needle, 7> kSizeLimit{{
    {"CUDNN_STATUS_NOT_SUPPORTED", Match::kCode},
    {"invalid configuration argument", Match::kPhrase},
    {"canUse32BitIndexMath", Match::kPhrase},
    {"32-bit index", Match::kPhrase},
    {"int32 index", Match::kPhrase},
    {"tensors with less than INT_MAX elements", Match::kPhrase},
    {"more than INT_MAX elements", Match::kPhrase},
}};
// oneDNN reports a failed allocation as a failure to create or to execute a primitive (both seen
// under RLIMIT_DATA in the benchmark, docs/benchmarks.md).
constexpr std::array<Needle, 5> kExhaustion{{
    {"can't allocate memory", Match::kPhrase},
    {"Cannot allocate memory", Match::kPhrase},
    {"std::bad_alloc", Match::kPhrase},
    {"could not create a primitive", Match::kPhrase},
    {"could not execute a primitive", Match::kPhrase},
}};

// The line naming one of cuDNN 9's CUDNN_STATUS_NOT_SUPPORTED_<suffix> codes (cudnn_graph.h:
// _GRAPH_PATTERN, _SHAPE, _DATA_TYPE, _LAYOUT, _INCOMPATIBLE_CUDA_DRIVER, _INCOMPATIBLE_CUDART,
// _ARCH_MISMATCH, _RUNTIME_PREREQUISITE_MISSING, _SUBLIBRARY_UNAVAILABLE,
// _SHARED_MEMORY_INSUFFICIENT, _PADDING, _BAD_LAUNCH_PARAM, _CUDA_GRAPH_NATIVE_API,
// _INVALID_DYNAMIC_SHAPE).
std::optional<std::string_view> lineWithSuffixedNotSupported(
    const std::vector<std::string_view>& lines) {
  constexpr std::string_view kPrefix = "CUDNN_STATUS_NOT_SUPPORTED_";
  for (const auto line : lines) {
    for (std::size_t at = line.find(kPrefix); at != std::string_view::npos;
         at = line.find(kPrefix, at + 1)) {
      if (at == 0 || !isIdentifierChar(line[at - 1])) return line;
    }
  }
  return std::nullopt;
}

// cuBLAS's argument checks in full (CUDABLAS_NONNEGINT_CHECK / CUDABLAS_POSINT_CHECK,
// ATen/cuda/CUDABlas.cpp): "at::cuda::blas::gemm<float> argument m must be non-negative and less
// than 2147483647 but got 3221225472" (likewise n, k, num_batches; lda, ldb, ldc, incx, incy "must
// be positive"). A size limit only where the value got is above INT_MAX, as a growing batch makes
// it; a negative value is a bug, not a size.
bool isCublasArgumentLimit(std::string_view line) {
  constexpr std::string_view kFunction = "at::cuda::blas::";
  constexpr std::string_view kLimit = " and less than 2147483647 but got ";
  const std::size_t at = line.find(kFunction);
  if (at == std::string_view::npos) return false;
  const std::size_t limit = line.find(kLimit, at);
  if (limit == std::string_view::npos) return false;
  const std::string_view check = line.substr(at, limit - at);
  if (!contains(check, " argument ") ||
      !(check.ends_with(" must be non-negative") || check.ends_with(" must be positive"))) {
    return false;
  }
  const std::string_view got = line.substr(limit + kLimit.size());
  std::size_t digits = 0;
  while (digits < got.size() && got[digits] >= '0' && got[digits] <= '9') ++digits;
  std::uint64_t value = 0;
  const auto parsed = std::from_chars(got.data(), got.data() + digits, value);
  // More digits than a uint64 holds is past the limit too.
  return digits > 0 && (parsed.ec == std::errc::result_out_of_range ||
                        (parsed.ec == std::errc() && value > std::uint64_t{2147483647}));
}

}  // namespace

std::string_view toString(FailureKind kind) {
  switch (kind) {
    case FailureKind::kOutOfMemory:
      return "out-of-memory";
    case FailureKind::kSizeLimit:
      return "size-limit";
    case FailureKind::kRethrow:
      return "rethrow";
    case FailureKind::kPossibleOutOfMemory:
      return "possible-out-of-memory";
  }
  return "unknown";
}

FailureClass classifyFailure(ExceptionType type, std::string_view message,
                             const FailureContext& context) {
  const std::vector<std::string_view> lines = errorLines(message);
  FailureClass result;
  result.reason = firstLine(lines);
  if (type == ExceptionType::kNonStd) return result;
  if (const auto line = lineWithAny(lines, kFatal)) {
    result.reason = trimmed(*line);
    return result;
  }

  auto oom_line = lineWithProducedOutOfMemory(lines);
  if (!oom_line) oom_line = lineWithAny(lines, kOutOfMemory);
  if (type == ExceptionType::kOutOfMemoryError || oom_line) {
    result.kind = FailureKind::kOutOfMemory;
    if (oom_line) result.reason = trimmed(*oom_line);
    result.failed_request_bytes = parseRequestBytes(message);
    result.failed_in_use_bytes = parseInUseBytes(message);
    return result;
  }
  if (const auto line = lineWithAny(lines, kPossibleOutOfMemory)) {
    result.kind = FailureKind::kPossibleOutOfMemory;
    result.reason = trimmed(*line);
    return result;
  }
  if (const auto line = lineWithSuffixedNotSupported(lines)) {
    result.reason = trimmed(*line);
    return result;
  }
  if (const auto line = lineWithAny(lines, kSizeLimit)) {
    result.kind = FailureKind::kSizeLimit;
    result.reason = trimmed(*line);
    return result;
  }
  for (const auto line : lines) {
    if (isCublasArgumentLimit(line)) {
      result.kind = FailureKind::kSizeLimit;
      result.reason = trimmed(line);
      return result;
    }
  }
  if (context.process_limit_near || context.after_larger_oom) {
    if (type == ExceptionType::kBadAlloc) {
      result.kind = FailureKind::kOutOfMemory;
      result.reason = "std::bad_alloc: " + result.reason;
      return result;
    }
    if (const auto line = lineWithAny(lines, kExhaustion)) {
      result.kind = FailureKind::kOutOfMemory;
      result.reason = trimmed(*line);
      result.failed_request_bytes = parseRequestBytes(message);
      return result;
    }
  }
  return result;
}

bool isFatalDeviceError(std::string_view message) {
  return lineWithAny(errorLines(message), kFatal).has_value();
}

std::string withoutBacktrace(std::string message) {
  for (const char* start : {"\nException raised from ", "\nframe #"}) {
    if (const auto at = message.find(start); at != std::string::npos) message.erase(at);
  }
  return message;
}

}  // namespace autobatch
