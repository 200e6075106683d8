#!/usr/bin/env bash
# Fuzzes the LibTorch-free parsers (tests/fuzz/parsers_fuzz.cpp: input specs, sizes and numbers,
# archive metadata) with libFuzzer + ASan + UBSan (clang-14) for at most SECONDS (default 60), then
# the zip member parser of model archives (tests/fuzz/zip_members_fuzz.cpp) for a third of that.
# Starts from the seeds in tests/fuzz/corpus/ (kept unchanged: the run works on a temporary copy).
# A crash or a violated property fails the run; the reproducer is kept in build-fuzz/artifacts/.
# Usage: scripts/fuzz.sh [SECONDS]
set -euo pipefail
here="$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)"
. "$here/env.sh"
t0=$SECONDS
seconds="${1:-60}"
dir="${AUTOBATCH_FUZZ_DIR:-$AUTOBATCH_ROOT/build-fuzz}"
flags="-fsanitize=fuzzer-no-link,address,undefined -fno-sanitize-recover=all -g -O1"
mkdir -p "$dir/artifacts"
autobatch_clang_configure "fuzz: configure" "$dir" "$flags" "-fsanitize=address,undefined" \
  -DAUTOBATCH_WITH_TORCH=OFF -DAUTOBATCH_FUZZ=ON -DAUTOBATCH_WERROR=ON
autobatch_timed "fuzz: build" cmake --build "$dir" -j "${AUTOBATCH_JOBS:-$(nproc)}" --target parsers_fuzz
corpus="$(mktemp -d)"
trap 'rm -rf "$corpus"' EXIT
cp "$AUTOBATCH_ROOT"/tests/fuzz/corpus/* "$corpus/"
autobatch_timed "fuzz: run ${seconds} s" "$dir/tests/parsers_fuzz" "$corpus" \
  -max_total_time="$seconds" -max_len=4096 -timeout=10 -rss_limit_mb=2048 -print_final_stats=1 \
  -artifact_prefix="$dir/artifacts/"
# The zip member parser (tests/fuzz/zip_members_fuzz.cpp) from the zip-* seeds, a third of the time
# more (at least 10 s): archives are read at every offset, so short runs already cover it.
zip_corpus="$corpus/zip"  # removed with $corpus
mkdir "$zip_corpus"
cp "$AUTOBATCH_ROOT"/tests/fuzz/corpus/zip-* "$zip_corpus/"
autobatch_timed "fuzz: build zip" cmake --build "$dir" -j "${AUTOBATCH_JOBS:-$(nproc)}" \
  --target zip_members_fuzz
zip_seconds=$(( seconds / 3 > 10 ? seconds / 3 : 10 ))
autobatch_timed "fuzz: run zip ${zip_seconds} s" "$dir/tests/zip_members_fuzz" "$zip_corpus" \
  -max_total_time="$zip_seconds" -max_len=4096 -timeout=10 -rss_limit_mb=2048 \
  -print_final_stats=1 -artifact_prefix="$dir/artifacts/zip-"
echo "[time] fuzz.sh total: $((SECONDS - t0)) s"
