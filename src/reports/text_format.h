// reports/text_format.h — the few text formats the reports use, with the standard library only
// (internal; not installed).
//
// Contract: each helper writes the bytes fmt 9 writes for the format named in its comment, so the
// reports need no fmt (the Python extension is built where only a C++20 compiler without
// std::format is found) and their text, golden outputs included, stays as it was. Widths count
// bytes: fmt counts display columns (a code point, two for a wide East Asian one), which is the
// same for ASCII, the only text the reports pad. Header-only, LibTorch-free. Thread safety: pure
// functions.
#pragma once

#include <array>
#include <charconv>
#include <cmath>
#include <cstddef>
#include <cstdio>
#include <string>
#include <string_view>
#include <system_error>
#include <type_traits>

namespace autobatch::detail {

/// A double as fmt's "{}" writes it: the shortest decimal that reads back as the same double, in
/// fixed notation when its decimal exponent is in [-4, 16), else as d[.ddd]e±XX (at least two
/// exponent digits). 0.1 -> "0.1", 1.0 -> "1", 1e-05 -> "1e-05", 0.0001 -> "0.0001",
/// 1e15 -> "1000000000000000", 1e16 -> "1e+16", -0.0 -> "-0", NaN -> "nan" ("-nan" with the sign
/// bit), infinity -> "inf" / "-inf". Method: std::to_chars's shortest round-trip digits in
/// scientific form, laid out by fmt's rule (fmt 9, format.h, do_write_float: exp_lower -4,
/// exp_upper 16); std::to_chars without a format chooses by length instead (1e15 -> "1e+15").
inline std::string shortest(double value) {
  if (std::isnan(value)) return std::signbit(value) ? "-nan" : "nan";
  if (std::isinf(value)) return value < 0 ? "-inf" : "inf";
  // Longest shortest form: "-d.dddddddddddddddde-308", 24 characters.
  std::array<char, 32> buffer{};
  const auto [end, ec] = std::to_chars(buffer.data(), buffer.data() + buffer.size(), value,
                                       std::chars_format::scientific);
  if (ec != std::errc()) return "?";  // cannot happen: the buffer holds any double
  const std::string_view scientific(buffer.data(), static_cast<std::size_t>(end - buffer.data()));
  const std::size_t e = scientific.find('e');
  const bool negative = scientific.front() == '-';
  std::string digits;  // the significant digits, without sign and point
  for (const char c : scientific.substr(0, e)) {
    if (c >= '0' && c <= '9') digits += c;
  }
  int exponent = 0;  // the decimal exponent of the first digit
  std::from_chars(scientific.data() + e + 1 + (scientific[e + 1] == '+' ? 1 : 0),
                  scientific.data() + scientific.size(), exponent);
  if (exponent < -4 || exponent >= 16) return std::string(scientific);  // fmt's layout, too
  const auto count = static_cast<int>(digits.size());
  std::string text = negative ? "-" : "";
  if (exponent >= count - 1) {  // 1234e5 -> 123400000
    text += digits;
    text.append(static_cast<std::size_t>(exponent - (count - 1)), '0');
  } else if (exponent >= 0) {  // 1234e-2 -> 12.34
    const std::size_t integral = static_cast<std::size_t>(exponent) + 1;
    text += digits.substr(0, integral);
    text += '.';
    text += digits.substr(integral);
  } else {  // 1234e-6 -> 0.001234
    text += "0.";
    text.append(static_cast<std::size_t>(-exponent - 1), '0');
    text += digits;
  }
  return text;
}

/// `value` with `precision` digits after the point, as fmt's "{:.Nf}" (N = precision >= 0):
/// rounded from the double's exact value, half to even; 2.25 -> "2.2" (precision 1),
/// -0.04 -> "-0.0", NaN -> "nan", infinity -> "inf".
inline std::string fixed(double value, int precision) {
  // %f rounds the exact binary value as fmt does; a double is at most 309 integral digits.
  std::array<char, 400> buffer{};
  const int n = std::snprintf(buffer.data(), buffer.size(), "%.*f", precision, value);
  if (n < 0) return "?";
  if (static_cast<std::size_t>(n) < buffer.size()) {
    return {buffer.data(), static_cast<std::size_t>(n)};
  }
  std::string text(static_cast<std::size_t>(n) + 1, '\0');  // a very large precision
  std::snprintf(text.data(), text.size(), "%.*f", precision, value);
  text.pop_back();
  return text;
}

/// fixed() with a sign always written, as fmt's "{:+.Nf}": 2.46 -> "+2.5", -0.04 -> "-0.0",
/// 0.0 -> "+0.0" (precision 1).
inline std::string signedFixed(double value, int precision) {
  const std::string text = fixed(value, precision);
  return text.front() == '-' ? text : "+" + text;
}

/// Appends one part of cat(): strings, string views, C strings and chars as they are; bool as
/// "true" / "false"; other integers in decimal (std::to_string); double as shortest(). float is
/// refused at compile time: fmt writes a float's own shortest digits (0.1f -> "0.1"), not those
/// of the double it converts to ("0.10000000149011612").
template <typename T>
void appendPart(std::string& out, const T& part) {
  if constexpr (std::is_same_v<T, bool>) {
    out += part ? "true" : "false";
  } else if constexpr (std::is_same_v<T, char>) {
    out += part;
  } else if constexpr (std::is_integral_v<T>) {
    out += std::to_string(part);
  } else if constexpr (std::is_same_v<T, double>) {
    out += shortest(part);
  } else {
    static_assert(!std::is_floating_point_v<T>, "cat(): convert to double, or use fixed()");
    out += std::string_view(part);
  }
}

/// The parts one after the other, each as appendPart() writes it: fmt's "{}{}..." of them.
/// cat("x = ", 3, ", y = ", 0.5) -> "x = 3, y = 0.5".
template <typename... T>
std::string cat(const T&... parts) {
  std::string out;
  (appendPart(out, parts), ...);
  return out;
}

/// cat(value), padded with spaces on the left to `width` bytes; longer text is left whole. fmt's
/// "{:>N}" (N = width): right(42, 5) -> "   42".
template <typename T>
std::string right(const T& value, std::size_t width) {
  std::string text = cat(value);
  if (text.size() < width) text.insert(0, width - text.size(), ' ');
  return text;
}

/// cat(value), padded with spaces on the right to `width` bytes; longer text is left whole. fmt's
/// "{:<N}" (N = width): left("fits", 6) -> "fits  ".
template <typename T>
std::string left(const T& value, std::size_t width) {
  std::string text = cat(value);
  if (text.size() < width) text.append(width - text.size(), ' ');
  return text;
}

/// The items of `range`, each as cat() writes it, with `separator` between them; "" for none.
/// fmt's "{}" of fmt::join(range, separator): join(std::vector{1, 2, 3}, ", ") -> "1, 2, 3".
template <typename Range>
std::string join(const Range& range, std::string_view separator) {
  std::string out;
  bool first = true;
  for (const auto& item : range) {
    if (!first) out += separator;
    first = false;
    appendPart(out, item);
  }
  return out;
}

}  // namespace autobatch::detail
