#!/usr/bin/env bash
# AddressSanitizer + UndefinedBehaviorSanitizer over the LibTorch-free tests (search, planner,
# units, input specs, archive metadata, failure classification, names), built with clang-14 in
# their own build tree (AUTOBATCH_WITH_TORCH=OFF). Any report fails the run
# (-fno-sanitize-recover=all). Then (unless AUTOBATCH_SANITIZE_TORCH=0) the CPU trial-runner and
# fault tests (budget allocator) linked with LibTorch, under ASan + UBSan: LibTorch is not
# instrumented, so its RTTI cannot be checked (-fno-sanitize=vptr,function) and its duplicated
# globals are not ODR errors (detect_odr_violation=0). No GPU code runs under ASan (cudaMalloc
# fails under it): only the cpu label, and not the tests that cap RLIMIT_DATA (ASan's shadow
# memory needs far more address space than such a cap leaves).
# Variables: AUTOBATCH_SANITIZE_DIR (default build-sanitize/), AUTOBATCH_JOBS.
set -euo pipefail
here="$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)"
. "$here/env.sh"
t0=$SECONDS
dir="${AUTOBATCH_SANITIZE_DIR:-$AUTOBATCH_ROOT/build-sanitize}"
jobs="${AUTOBATCH_JOBS:-$(nproc)}"
flags="-fsanitize=address,undefined -fno-sanitize-recover=all -fno-omit-frame-pointer -g -O1"
export ASAN_OPTIONS="detect_leaks=1:abort_on_error=0:strict_string_checks=1:detect_stack_use_after_return=1"
export UBSAN_OPTIONS="print_stacktrace=1:halt_on_error=1"

autobatch_clang_configure "sanitize: configure core" "$dir/core" "$flags" "$flags" \
  -DAUTOBATCH_WITH_TORCH=OFF -DAUTOBATCH_BUILD_TESTS=ON -DAUTOBATCH_WERROR=ON -DAUTOBATCH_TEST_CXX_FLAGS=
autobatch_timed "sanitize: build core" cmake --build "$dir/core" -j "$jobs"
autobatch_timed "sanitize: ctest core (ASan+UBSan)" \
  ctest --test-dir "$dir/core" --output-on-failure -j "$jobs"

if [ "${AUTOBATCH_SANITIZE_TORCH:-1}" = 1 ]; then
  torch_prefix="$(autobatch_torch_prefix)"
  tflags="-fsanitize=address,undefined -fno-sanitize=vptr,function -fno-sanitize-recover=all -fno-omit-frame-pointer -g -O1"
  autobatch_clang_configure "sanitize: configure torch" "$dir/torch" "$tflags" "$tflags" \
    -DCMAKE_PREFIX_PATH="$torch_prefix" -DAUTOBATCH_BUILD_TESTS=ON -DAUTOBATCH_PYTHON="$AUTOBATCH_PYTHON" \
    -DAUTOBATCH_TEST_CXX_FLAGS=
  autobatch_timed "sanitize: build torch tests" cmake --build "$dir/torch" -j "$jobs" \
    --target runner_tests
  # LibTorch's own allocations are not instrumented and some of its one-time globals are never
  # freed: leaks are checked by the budget allocator's count in the tests themselves. A real
  # allocator failure must come back as std::bad_alloc, not an ASan abort.
  ASAN_OPTIONS="detect_odr_violation=0:detect_leaks=0:alloc_dealloc_mismatch=0:allocator_may_return_null=1" \
    autobatch_timed "sanitize: torch CPU tests (ASan+UBSan)" \
    ctest --test-dir "$dir/torch" --output-on-failure -j "$jobs" -L cpu \
    -R '^(TrialRunnerTest|ClassifyExceptionTest|FaultTest|FindMaxBatchTest)' -E 'RlimitData|RealAllocator|ChildProcess'
fi
echo "[time] sanitize.sh total: $((SECONDS - t0)) s"
