// libFuzzer target for the result cache's entry reader (parseCachedResult,
// autobatch/run/result_cache.h): a file in the cache folder is text anyone could have written.
//
// Properties checked (a violation aborts, which libFuzzer reports as a crash):
// - only autobatch::Error escapes the reader; any other exception is a bug;
// - an entry it accepts holds what a search stores: status found, 1 <= safe <= max <= 2^40,
//   0 <= accumulation max <= max, limit >= 0, margin in [0, limit) with a limit, trials >= 0,
//   seconds finite and >= 0, this run's key;
// - what a hit does with an accepted entry (the plan for a target, the confirming request, the
//   search result) throws nothing but autobatch::Error and asks for no batch above the entry's.
// The seeds (tests/fuzz/corpus/cache_entry/) use the key below.
// Built by scripts/fuzz.sh (CMake option AUTOBATCH_FUZZ, clang's -fsanitize=fuzzer).
#include <cmath>
#include <cstddef>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <exception>
#include <string_view>

#include "autobatch/run/result_cache.h"
#include "autobatch/vocabulary/error.h"
#include "fuzz_check.h"

namespace {

using autobatch::fuzz::check;
using autobatch::fuzz::violated;

autobatch::CacheKey fuzzKey() {
  autobatch::CacheKey key;
  key.hash = "0123456789abcdef0123456789abcdef01234567";
  key.fields = {{"model_sha1", "abc"}, {"inputs", "float32:64"}};
  return key;
}

void checkEntry(const autobatch::CachedResult& r, std::string_view input) {
  check(r.status == "found", "status found", input);
  check(r.key == fuzzKey().hash, "this run's key", input);
  check(r.safe_micro_batch >= 1 && r.safe_micro_batch <= r.max_micro_batch &&
            r.max_micro_batch <= (std::int64_t{1} << 40),
        "1 <= safe <= max <= 2^40", input);
  check(r.accumulation_max_micro_batch >= 0 && r.accumulation_max_micro_batch <= r.max_micro_batch,
        "0 <= accumulation max <= max", input);
  check(r.memory_limit_bytes >= 0 && r.margin_bytes >= 0 &&
            (r.memory_limit_bytes == 0 || r.margin_bytes < r.memory_limit_bytes),
        "limit >= 0, margin in [0, limit)", input);
  check(r.trials >= 0 && std::isfinite(r.search_s) && r.search_s >= 0.0, "counts >= 0", input);
}

// What a hit does with the entry, for a target that accumulates and one that does not.
void useEntry(const autobatch::CachedResult& r, std::string_view input) {
  for (const std::int64_t target : {std::int64_t{0}, std::int64_t{7}, std::int64_t{1} << 40}) {
    autobatch::SearchOptions options;
    options.target_batch = target;
    try {
      const autobatch::TrialRequest request = autobatch::confirmRequest(r, options, 1);
      check(request.micro_batch_size >= 1 && request.micro_batch_size <= r.safe_micro_batch,
            "the confirming trial asks for at most the safe batch", input);
      (void)autobatch::searchResultFromCache(r, options, std::nullopt);
    } catch (const autobatch::Error&) {
    }
  }
}

}  // namespace

extern "C" int LLVMFuzzerTestOneInput(const std::uint8_t* data, std::size_t size) {
  const std::string_view input(reinterpret_cast<const char*>(data), size);
  try {
    const autobatch::CachedResult r = autobatch::parseCachedResult(input, fuzzKey());
    checkEntry(r, input);
    useEntry(r, input);
  } catch (const autobatch::Error&) {
  } catch (const std::exception& e) {
    std::fprintf(stderr, "parseCachedResult threw a non-autobatch exception: %s\n", e.what());
    violated("only autobatch::Error escapes", input);
  }
  return 0;
}
