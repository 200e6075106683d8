#include "autobatch/vocabulary/units.h"

#include <array>
#include <cctype>
#include <charconv>
#include <cmath>
#include <cstdio>
#include <limits>
#include <sstream>
#include <utility>

#include "autobatch/vocabulary/error.h"

namespace autobatch {
namespace {

constexpr std::int64_t kKilo = 1000;
constexpr std::size_t kMaxFractionDigits = 18;
constexpr std::array<std::pair<std::string_view, std::int64_t>, 9> kUnits{{
    {"b", 1},
    {"kb", kKilo},
    {"mb", kKilo* kKilo},
    {"gb", kKilo* kKilo* kKilo},
    {"tb", kKilo* kKilo* kKilo* kKilo},
    {"kib", std::int64_t{1} << 10},
    {"mib", std::int64_t{1} << 20},
    {"gib", std::int64_t{1} << 30},
    {"tib", std::int64_t{1} << 40},
}};

[[noreturn]] void fail(std::string_view what, std::string_view text, std::string_view why) {
  throw Error(std::string(what) +
              ": expected a byte size such as 24GiB, 24GB, 512MiB or 1073741824B, but got '" +
              std::string(text) + "' (" + std::string(why) + ")");
}

bool isDigit(char c) { return std::isdigit(static_cast<unsigned char>(c)) != 0; }

}  // namespace

std::int64_t parseBytes(std::string_view text, std::string_view what) {
  std::size_t i = 0;
  if (text.empty()) fail(what, text, "empty");
  if (text[0] == '-' || text[0] == '+') fail(what, text, "a size has no sign");
  constexpr auto kMax = std::numeric_limits<std::int64_t>::max();
  std::int64_t whole = 0;
  std::size_t digits = 0;
  for (; i < text.size() && isDigit(text[i]); ++i, ++digits) {
    const auto d = static_cast<std::int64_t>(text[i] - '0');
    if (whole > (kMax - d) / 10) fail(what, text, "larger than 2^63 - 1 bytes");
    whole = whole * 10 + d;
  }
  // The fraction is kept as an exact integer over 10^k: "0.3KB" is 300 bytes, not 299.
  std::uint64_t fraction = 0;
  std::uint64_t fraction_scale = 1;
  if (i < text.size() && text[i] == '.') {
    ++i;
    std::size_t fraction_digits = 0;
    for (; i < text.size() && isDigit(text[i]); ++i, ++fraction_digits) {
      if (fraction_digits == kMaxFractionDigits)
        fail(what, text, "more than 18 digits after the decimal point");
      fraction = fraction * 10 + static_cast<std::uint64_t>(text[i] - '0');
      fraction_scale *= 10;
    }
    if (fraction_digits == 0) fail(what, text, "no digit after the decimal point");
  }
  if (digits == 0) fail(what, text, "no number");
  const std::string_view number = text.substr(0, i);
  while (i < text.size() && text[i] == ' ') ++i;
  std::string unit;
  for (; i < text.size(); ++i) {
    unit += static_cast<char>(std::tolower(static_cast<unsigned char>(text[i])));
  }
  std::int64_t multiplier = 0;
  if (unit.empty()) {
    // "--margin 5" read as 5 bytes (issue 27, row 18): a bare number could mean bytes, a
    // percentage or a forgotten unit, so only 0, the same in every reading, goes without one.
    if (whole != 0 || fraction != 0) {
      // "1.5B" would be a fraction of a byte: no bytes suggestion then.
      fail(what, text,
           "a number without a unit is ambiguous: add the unit, such as " + std::string(number) +
               "MiB" + (fraction == 0 ? ", or " + std::string(number) + "B for bytes" : ""));
    }
    multiplier = 1;
  }
  for (const auto& [name, value] : kUnits) {
    if (unit == name) multiplier = value;
  }
  if (multiplier == 0) {
    if (unit.find_first_of('e') == 0 && unit.size() > 1 && isDigit(unit[1])) {
      fail(what, text, "exponents are not accepted: write the unit instead");
    }
    fail(what, text,
         "unknown unit '" + unit + "': valid units are B, KB, MB, GB, TB, KiB, MiB, GiB, TiB");
  }
  // "0.5B" is a fraction of a byte: almost always a forgotten unit, never a size to round
  // silently ("--memory-limit 1.5" would become 1 byte; UnitsTest.MalformedSizesSayWhatIsWrong).
  if (multiplier == 1 && fraction != 0) {
    fail(what, text, "a fraction of a byte: add the unit, such as " + std::string(number) + "GiB");
  }
  if (whole > kMax / multiplier) fail(what, text, "larger than 2^63 - 1 bytes");
  // floor(fraction * multiplier / scale) without overflow: fraction, scale < 10^18, multiplier
  // < 2^41, so the product needs 128 bits.
  __extension__ using Wide = unsigned __int128;
  const auto fraction_bytes = static_cast<std::int64_t>(
      static_cast<Wide>(fraction) * static_cast<Wide>(multiplier) / fraction_scale);
  if (whole * multiplier > kMax - fraction_bytes) fail(what, text, "larger than 2^63 - 1 bytes");
  return whole * multiplier + fraction_bytes;
}

std::int64_t parseInteger(std::string_view text, std::string_view what, std::int64_t min,
                          std::int64_t max) {
  std::int64_t value = 0;
  const char* end = text.data() + text.size();
  const auto [ptr, ec] = std::from_chars(text.data(), end, value);
  if (text.empty() || ec != std::errc() || ptr != end || value < min || value > max) {
    throw Error(std::string(what) + ": expected a whole number in [" + std::to_string(min) + ", " +
                std::to_string(max) + "], but got '" + std::string(text) + "'");
  }
  return value;
}

double parseDecimal(std::string_view text, std::string_view what, double min, double max) {
  double value = 0.0;
  const char* end = text.data() + text.size();
  const auto [ptr, ec] = std::from_chars(text.data(), end, value);
  if (text.empty() || ec != std::errc() || ptr != end || !std::isfinite(value) || value < min ||
      value > max) {
    std::ostringstream range;
    range << "[" << min << ", " << max << "]";
    throw Error(std::string(what) + ": expected a number in " + range.str() + ", but got '" +
                std::string(text) + "'");
  }
  return value;
}

std::string formatBytes(std::int64_t bytes) {
  // Up to EiB: sizes near 2^63 bytes (an input too large to allocate) read "8.00 EiB".
  static constexpr std::array<const char*, 7> kNames{"B", "KiB", "MiB", "GiB", "TiB", "PiB", "EiB"};
  const bool negative = bytes < 0;
  auto value = static_cast<double>(negative ? -bytes : bytes);
  std::size_t unit = 0;
  while (value >= 1024.0 && unit + 1 < kNames.size()) {
    value /= 1024.0;
    ++unit;
  }
  std::array<char, 48> buffer{};
  if (unit == 0) {
    std::snprintf(buffer.data(), buffer.size(), "%s%lld B", negative ? "-" : "",
                  static_cast<long long>(negative ? -bytes : bytes));
  } else {
    std::snprintf(buffer.data(), buffer.size(), "%s%.2f %s", negative ? "-" : "", value,
                  kNames[unit]);
  }
  return buffer.data();
}

}  // namespace autobatch
