#include "autobatch/failure.h"

#include <array>
#include <cctype>
#include <cmath>
#include <optional>

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

// The line of `message` holding `needle`, case-insensitively (or the first non-empty line when
// needle is empty).
std::string lineWith(std::string_view message, std::string_view needle) {
  std::size_t start = 0;
  std::string first;
  while (start <= message.size()) {
    std::size_t end = message.find('\n', start);
    if (end == std::string_view::npos) end = message.size();
    const std::string_view line = message.substr(start, end - start);
    if (first.empty()) first = trimmed(line);
    if (!needle.empty() && contains(lower(line), lower(needle))) return trimmed(line);
    start = end + 1;
  }
  return first;
}

// "allocate 2.00 GiB" / "allocate 4096 bytes" -> bytes; 0 when absent. The first "allocate "
// followed by a number and a unit counts ("can't allocate memory: you tried to allocate 4 bytes").
std::int64_t parseRequestBytes(std::string_view message) {
  const std::string text = lower(message);
  for (std::size_t at = text.find("allocate "); at != std::string::npos;
       at = text.find("allocate ", at + 1)) {
    std::size_t pos = at + 9;
    std::size_t end = pos;
    while (end < text.size() && ((text[end] >= '0' && text[end] <= '9') || text[end] == '.')) {
      ++end;
    }
    if (end == pos) continue;
    double value = 0.0;
    try {
      value = std::stod(text.substr(pos, end - pos));
    } catch (const std::exception&) {
      continue;
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
    if (scale > 0.0) return static_cast<std::int64_t>(std::llround(value * scale));
  }
  return 0;
}

constexpr std::array<std::string_view, 6> kFatal{"illegal memory access",      "misaligned address",
                                                 "unspecified launch failure", "device-side assert",
                                                 "illegal instruction",        "uncorrectable ECC"};
constexpr std::array<std::string_view, 7> kOutOfMemory{"out of memory",
                                                       "cudaErrorMemoryAllocation",
                                                       "CUBLAS_STATUS_ALLOC_FAILED",
                                                       "CUDNN_STATUS_ALLOC_FAILED",
                                                       "CUFFT_ALLOC_FAILED",
                                                       "CUSOLVER_STATUS_ALLOC_FAILED",
                                                       "CUSPARSE_STATUS_ALLOC_FAILED"};
constexpr std::array<std::string_view, 5> kSizeLimit{
    "CUDNN_STATUS_NOT_SUPPORTED", "invalid configuration argument", "canUse32BitIndexMath",
    "32-bit index", "int32 index"};
// oneDNN reports a failed allocation as a failure to create or to execute a primitive (both seen
// under RLIMIT_DATA in the benchmark, docs/benchmarks.md).
constexpr std::array<std::string_view, 5> kExhaustion{
    "can't allocate memory", "Cannot allocate memory", "std::bad_alloc",
    "could not create a primitive", "could not execute a primitive"};

template <std::size_t N>
std::optional<std::string_view> findAny(std::string_view message,
                                        const std::array<std::string_view, N>& needles,
                                        bool case_insensitive = false) {
  const std::string folded = case_insensitive ? lower(message) : std::string();
  for (const auto needle : needles) {
    if (case_insensitive ? contains(folded, lower(needle)) : contains(message, needle)) {
      return needle;
    }
  }
  return std::nullopt;
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
  }
  return "unknown";
}

FailureClass classifyFailure(ExceptionType type, std::string_view message,
                             const FailureContext& context) {
  FailureClass result;
  result.reason = lineWith(message, {});
  if (type == ExceptionType::kNonStd) return result;
  if (findAny(message, kFatal, /*case_insensitive=*/true)) return result;

  if (type == ExceptionType::kOutOfMemoryError) {
    result.kind = FailureKind::kOutOfMemory;
    const auto needle = findAny(message, kOutOfMemory, true);
    result.reason = lineWith(message, needle ? *needle : std::string_view{});
    result.failed_request_bytes = parseRequestBytes(message);
    return result;
  }
  if (const auto needle = findAny(message, kOutOfMemory, true)) {
    result.kind = FailureKind::kOutOfMemory;
    result.reason = lineWith(message, *needle);
    result.failed_request_bytes = parseRequestBytes(message);
    return result;
  }
  if (const auto needle = findAny(message, kSizeLimit)) {
    result.kind = FailureKind::kSizeLimit;
    result.reason = lineWith(message, *needle);
    return result;
  }
  if (context.process_limit_near || context.after_larger_oom) {
    if (type == ExceptionType::kBadAlloc) {
      result.kind = FailureKind::kOutOfMemory;
      result.reason = "std::bad_alloc: " + result.reason;
      return result;
    }
    if (const auto needle = findAny(message, kExhaustion)) {
      result.kind = FailureKind::kOutOfMemory;
      result.reason = lineWith(message, *needle);
      result.failed_request_bytes = parseRequestBytes(message);
      return result;
    }
  }
  return result;
}

}  // namespace autobatch
