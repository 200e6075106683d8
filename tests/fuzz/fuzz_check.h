// The fuzz targets' property checks: a violated property prints the property and the input, then
// aborts, so libFuzzer keeps the input as a reproducer (build-fuzz/artifacts/).
#pragma once

#include <cstdio>
#include <cstdlib>
#include <string_view>

namespace autobatch::fuzz {

[[noreturn]] inline void violated(const char* property, std::string_view input) {
  std::fprintf(stderr, "property violated: %s\ninput: '%.*s'\n", property,
               static_cast<int>(input.size()), input.data());
  std::abort();
}

inline void check(bool ok, const char* property, std::string_view input) {
  if (!ok) violated(property, input);
}

}  // namespace autobatch::fuzz
