// libFuzzer target for the LibTorch-free parsers that read user and archive text: input specs
// (parseInputSpec/parseInputSpecs), sizes and numbers (parseBytes, parseInteger, parseDecimal)
// and the archive's metadata (parseModelMetadata). Every input goes to every parser.
//
// Properties checked (a violation aborts, which libFuzzer reports as a crash):
// - only autobatch::Error escapes a parser; any other exception is a bug;
// - a parsed spec is valid (dimensions >= 1, one sample's bytes fit int64, a non-empty range,
//   bool in [0, 2), no range on floating dtypes) and its toString() parses back to the same spec;
// - parseInputSpecs of the joined toString()s gives the same list;
// - parseBytes is >= 0 and its decimal text with the unit B parses back to the same value;
// - parseInteger stays in [min, max] and round-trips; parseDecimal is finite and in [min, max];
// - parseModelMetadata gives at least one input, and toJson() of it parses back to the same;
// - readCgroupMemoryLimits (the input as /proc/self/cgroup and as mountinfo text, over a tree that
//   does not exist) throws nothing and finds no limit; parseMemoryStat gives figures in
//   [0, 2^59].
// Built by scripts/fuzz.sh (CMake option AUTOBATCH_FUZZ, clang's -fsanitize=fuzzer).
#include <cmath>
#include <cstddef>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <exception>
#include <limits>
#include <string>
#include <string_view>
#include <vector>

#include "autobatch/vocabulary/error.h"
#include "autobatch/vocabulary/input_spec.h"
#include "autobatch/vocabulary/model_metadata.h"
#include "autobatch/vocabulary/units.h"
#include "fuzz_check.h"
#include "memory/process_memory.h"

namespace {

using autobatch::Error;

using autobatch::fuzz::check;
using autobatch::fuzz::violated;

// Runs `parse`; an autobatch::Error is an accepted outcome, any other exception is a bug.
template <typename F>
void guarded(const char* name, std::string_view input, F&& parse) {
  try {
    parse();
  } catch (const Error&) {
  } catch (const std::exception& e) {
    std::fprintf(stderr, "%s threw a non-autobatch exception: %s\n", name, e.what());
    violated("only autobatch::Error escapes", input);
  }
}

void checkSpec(const autobatch::InputSpec& spec, std::string_view input) {
  std::int64_t bytes = autobatch::elementBytes(spec.dtype);
  for (const auto d : spec.sample_shape) {
    check(d >= 1, "every dimension >= 1", input);
    check(bytes <= std::numeric_limits<std::int64_t>::max() / d, "one sample fits int64", input);
    bytes *= d;
  }
  check(spec.low < spec.high, "a non-empty range", input);
  if (!autobatch::isIntegral(spec.dtype)) {
    check(spec.low == 0 && spec.high == 2, "no range on a floating dtype", input);
  }
  if (spec.dtype == autobatch::DType::kBool) {
    check(spec.low >= 0 && spec.high <= 2, "bool range inside [0, 2)", input);
  }
  const std::string text = autobatch::toString(spec);
  autobatch::InputSpec again;
  try {
    again = autobatch::parseInputSpec(text);
  } catch (const Error& e) {
    std::fprintf(stderr, "toString gave '%s', which fails: %s\n", text.c_str(), e.what());
    violated("toString(spec) parses back", input);
  }
  check(again == spec, "toString(spec) parses back to the same spec", input);
}

}  // namespace

extern "C" int LLVMFuzzerTestOneInput(const std::uint8_t* data, std::size_t size) {
  const std::string_view input(reinterpret_cast<const char*>(data), size);

  guarded("readCgroupMemoryLimits", input, [&] {
    const std::string text(input);
    const auto levels =
        autobatch::detail::readCgroupMemoryLimits(text, text, "/nonexistent-autobatch-fuzz-root");
    check(levels.empty(), "no limit read from a tree that does not exist", input);
  });
  for (const int version : {1, 2}) {
    const auto figures = autobatch::detail::parseMemoryStat(input.data(), input.size(), version);
    check(figures.file_bytes >= 0 && figures.file_bytes <= (std::int64_t{1} << 59) &&
              figures.mapped_file_bytes >= 0 &&
              figures.mapped_file_bytes <= (std::int64_t{1} << 58),
          "memory.stat figures in range", input);
  }

  guarded("parseInputSpecs", input, [&] {
    const auto specs = autobatch::parseInputSpecs(input);
    check(!specs.empty(), "parseInputSpecs returns one spec or more", input);
    std::string joined;
    for (const auto& spec : specs) {
      checkSpec(spec, input);
      joined += (joined.empty() ? "" : ",") + autobatch::toString(spec);
    }
    check(autobatch::parseInputSpecs(joined) == specs, "joined specs parse back", input);
  });
  guarded("parseInputSpec", input, [&] { checkSpec(autobatch::parseInputSpec(input), input); });

  guarded("parseBytes", input, [&] {
    const std::int64_t bytes = autobatch::parseBytes(input, "--memory-limit");
    check(bytes >= 0, "parseBytes >= 0", input);
    check(autobatch::parseBytes(std::to_string(bytes) + "B") == bytes, "bytes round-trip", input);
    check(!autobatch::formatBytes(bytes).empty(), "formatBytes prints", input);
  });

  guarded("parseInteger", input, [&] {
    constexpr std::int64_t kMin = 1;
    constexpr std::int64_t kMax = std::int64_t{1} << 40;
    const std::int64_t n = autobatch::parseInteger(input, "--target-batch", kMin, kMax);
    check(n >= kMin && n <= kMax, "parseInteger in [min, max]", input);
    check(autobatch::parseInteger(std::to_string(n), "n", kMin, kMax) == n, "integer round-trip",
          input);
  });
  guarded("parseInteger (full range)", input, [&] {
    (void)autobatch::parseInteger(input, "--seed", std::numeric_limits<std::int64_t>::min(),
                                  std::numeric_limits<std::int64_t>::max());
  });

  guarded("parseDecimal", input, [&] {
    const double x = autobatch::parseDecimal(input, "--tolerance", 0.0, 1e7);
    check(std::isfinite(x) && x >= 0.0 && x <= 1e7, "parseDecimal finite in [min, max]", input);
  });

  guarded("parseModelMetadata", input, [&] {
    const auto metadata = autobatch::parseModelMetadata(input, "fuzz.pt");
    check(!metadata.inputs.empty(), "metadata has inputs", input);
    for (const auto& spec : metadata.inputs) checkSpec(spec, input);
    check(autobatch::parseModelMetadata(autobatch::toJson(metadata), "again") == metadata,
          "toJson(metadata) parses back", input);
  });
  return 0;
}
