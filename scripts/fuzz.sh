#!/usr/bin/env bash
# Fuzzes the LibTorch-free parsers (tests/fuzz/parsers_fuzz.cpp: input specs, sizes and numbers,
# archive metadata) with libFuzzer + ASan + UBSan (clang-14) for at most SECONDS (default 60).
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
echo "[time] fuzz.sh total: $((SECONDS - t0)) s"
