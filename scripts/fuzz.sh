#!/usr/bin/env bash
# Fuzzes the LibTorch-free parsers (tests/fuzz/parsers_fuzz.cpp: input specs, sizes and numbers,
# archive metadata; tests/fuzz/cache_entry_fuzz.cpp: the result cache's entries;
# tests/fuzz/zip_members_fuzz.cpp: the zip member parser of model archives) with libFuzzer +
# ASan + UBSan (clang-14) for at most SECONDS (default 60) each.
# Starts from the seeds in tests/fuzz/corpus/ and tests/fuzz/corpus/<target>/ (kept unchanged:
# each run works on a temporary copy).
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
autobatch_timed "fuzz: build" cmake --build "$dir" -j "${AUTOBATCH_JOBS:-$(nproc)}" \
  --target parsers_fuzz cache_entry_fuzz zip_members_fuzz
corpus="$(mktemp -d)"
trap 'rm -rf "$corpus"' EXIT
# fuzz TARGET SEEDS_DIR: SECONDS of TARGET over a fresh copy of the files in SEEDS_DIR.
fuzz() {
  rm -rf "${corpus:?}"/*
  find "$2" -maxdepth 1 -type f -exec cp {} "$corpus/" \;
  autobatch_timed "fuzz: $1 ${seconds} s" "$dir/tests/$1" "$corpus" \
    -max_total_time="$seconds" -max_len=4096 -timeout=10 -rss_limit_mb=2048 -print_final_stats=1 \
    -artifact_prefix="$dir/artifacts/$1-"
}
fuzz parsers_fuzz "$AUTOBATCH_ROOT/tests/fuzz/corpus"
fuzz cache_entry_fuzz "$AUTOBATCH_ROOT/tests/fuzz/corpus/cache_entry"
fuzz zip_members_fuzz "$AUTOBATCH_ROOT/tests/fuzz/corpus/zip_members"
echo "[time] fuzz.sh total: $((SECONDS - t0)) s"
