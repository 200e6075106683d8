// Internal: enum <-> name tables for the CLI's flag values. Not installed.
#pragma once

#include <array>
#include <string>
#include <string_view>
#include <utility>
#include <vector>

#include "autobatch/vocabulary/error.h"

namespace autobatch::detail {

template <typename E>
using NameEntry = std::pair<E, std::string_view>;

/// The name of `value` in `table` (the first entry with that value).
template <typename E, std::size_t N>
constexpr std::string_view nameOf(const std::array<NameEntry<E>, N>& table, E value) {
  for (const auto& [v, name] : table) {
    if (v == value) return name;
  }
  return "unknown";
}

/// The value named `given` in `table`; aliases are extra entries. The valid names listed in the
/// error are the canonical ones (the first name of each value).
/// Throws: autobatch::Error "unknown <what> 'x': expected one of a, b, c".
template <typename E, std::size_t N>
E parseName(const std::array<NameEntry<E>, N>& table, std::string_view what,
            std::string_view given) {
  for (const auto& [v, name] : table) {
    if (name == given) return v;
  }
  std::string valid;
  for (const auto& [v, name] : table) {
    if (nameOf(table, v) != name) continue;  // an alias
    if (!valid.empty()) valid += ", ";
    valid += name;
  }
  throw Error("unknown " + std::string(what) + " '" + std::string(given) + "': expected one of " +
              valid);
}

/// The canonical names of `table`, in its order (aliases left out): what the Python package
/// reads through autobatch._core instead of spelling them again.
template <typename E, std::size_t N>
std::vector<std::string_view> canonicalNames(const std::array<NameEntry<E>, N>& table) {
  std::vector<std::string_view> names;
  for (const auto& [v, name] : table) {
    if (nameOf(table, v) == name) names.push_back(name);
  }
  return names;
}

}  // namespace autobatch::detail
