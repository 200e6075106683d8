#!/usr/bin/env bash
# The Python package against the newest torch on the package index (issue 29 item 6; CI runs it
# after scripts/test.sh): a second environment from requirements-newest.txt, kept beside the first
# and keyed by a hash of that file (created once: about 5 GB, a few minutes), the package installed
# into it with pip install --no-build-isolation, the `autobatch` executable included
# (AUTOBATCH_WITH_TORCH=ON: test_export.py runs it; its own build tree, build-newest/, compiled
# against that torch: minutes the first time, seconds with a warm ccache), then the package's
# pytest suite with that Python (its fast tier and the distributed runs below), then a subset
# of the pt2 export's tests (below). Prints each phase's time; exits non-zero on any failure.
# Variables: AUTOBATCH_ENV_ROOT (scripts/env.sh), AUTOBATCH_JOBS (default: cores).
set -euo pipefail
here="$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)"
# shellcheck source=scripts/env.sh
. "$here/env.sh"
t0=$SECONDS
req="$AUTOBATCH_ROOT/requirements-newest.txt"
venv="$AUTOBATCH_ENV_ROOT/venv-newest-$(sha256sum "$req" | cut -c1-12)"
py="$venv/bin/python"
build="$AUTOBATCH_ROOT/build-newest"

make_env() {
  if [ -f "$venv/.autobatch-complete" ]; then
    echo "test_newest: environment ready at $venv"
    return
  fi
  rm -rf "$venv"  # an interrupted install is never taken as ready (the marker is written last)
  mkdir -p "$(dirname "$venv")"
  echo "test_newest: creating $venv from requirements-newest.txt (torch's CUDA wheel, about 5 GB)"
  python3 -m venv "$venv"
  "$py" -m pip install -q --upgrade pip
  "$py" -m pip install -q --progress-bar off -r "$req"
  touch "$venv/.autobatch-complete"
}

install_package() {
  local log="$build.pip-install.log"
  mkdir -p "$build"
  # ccache shares what it can with the first build: the same build type and flags (scripts/build.sh;
  # GCC 12 at -O3, the wheel's default Release, warns falsely (-Wrestrict) inside std::string, and
  # -Werror is on here), while the files that include LibTorch's headers are compiled anew.
  if ! CCACHE_BASEDIR="$AUTOBATCH_ROOT" CCACHE_NOHASHDIR=1 \
       CMAKE_BUILD_PARALLEL_LEVEL="${AUTOBATCH_JOBS:-$(nproc)}" \
       "$py" -m pip install --no-build-isolation --no-deps --force-reinstall \
       -C build-dir="$build" -C cmake.build-type=RelWithDebInfo -C cmake.define.AUTOBATCH_WERROR=ON \
       -C cmake.define.AUTOBATCH_WITH_TORCH=ON \
       "$AUTOBATCH_ROOT" >"$log" 2>&1; then
    tail -n 60 "$log"
    return 1
  fi
  "$py" -c 'import torch, autobatch; print("test_newest: autobatch", autobatch.__version__,
             "built against torch", torch.__version__)'
}

# The fast tier of the suite, and of the slow tier (torchrun jobs) the runs that call this torch's
# distributed API (FSDP2's fully_shard, DDP, gloo's collectives) on a job that fits: the slow
# tier's other cases (a rank that fails, ranks that differ) test autobatch's own agreement
# logic, which the slow tier runs against the torch of requirements.txt.
NEWEST_SLOW=(
  "test_sharded.py::test_emulated_peaks_match_each_real_gloo_rank"
  "test_sharded.py::test_the_ranks_of_a_job_size_agree_and_verify_or_all_end[ok]"
  "test_ddp.py::test_the_ranks_of_a_ddp_job_size_agree_and_verify_or_all_end[ok]"
)
# Of the fast tier, the files whose checks are autobatch's own logic whatever the torch (the result
# cache's keys, hostile arguments, the race's bookkeeping, the doors' verdicts against the user's
# loop, which the fast tier runs against requirements.txt's torch: find's, measuring's and
# replay's exactness in fresh processes run here) are left to that tier: 152 s of this run.
NEWEST_LEFT_OUT=(test_cache.py test_hostile.py test_race.py test_doors.py)
run_tests() {
  # From the build tree, so that nothing is written into the checkout.
  local tests="$AUTOBATCH_ROOT/tests/python" slow=() files=() f
  for id in "${NEWEST_SLOW[@]}"; do slow+=("$tests/$id"); done
  for f in "$tests"/test_*.py; do
    [[ " ${NEWEST_LEFT_OUT[*]} " == *" $(basename "$f") "* ]] || files+=("$f")
  done
  (cd "$build" && "$py" -m pytest -q -p no:cacheprovider -m "not slow" "${files[@]}" &&
     "$py" -m pytest -q -p no:cacheprovider "${slow[@]}")
}

# The pt2 export against this torch (issue 41 item 2, issue 42 item 3): a subset of
# tests/python/pt2_export_test.py of at most 120 s (112 s of checks on 2 cores with torch 2.15,
# docs/formats.md): the joint graph and its gradients, a conv net with BatchNorm run at batches 1
# to 20, fused attention, the gradient check's refusal, a model that does not export, and the
# lifetimes patch's model with its memory check and the refusal of the patch left out (tied
# weights, 17 s, are left to the torch of requirements.txt). The
# memory check runs this torch's `autobatch` executable (built above). The export's patches of
# Inductor are checked by name and signature before each export (_export/_inductor_patches.py).
PT2_SUBSET=mlp,conv_stays_dynamic,attention_stays_fused,wrong_gradients_refused,does_not_export,eager_buffers:lifetimes
run_pt2_subset() {
  (cd "$build" && AUTOBATCH_CLI="$build/bin/autobatch" "$py" \
     "$AUTOBATCH_ROOT/tests/python/pt2_export_test.py" --workdir "$build/tmp/pt2-export" \
     --only "$PT2_SUBSET")
}

autobatch_timed "newest torch: environment" make_env
autobatch_timed "newest torch: package" install_package
autobatch_timed "newest torch: pytest" run_tests
autobatch_timed "newest torch: pt2 export subset" run_pt2_subset
echo "[time] test_newest.sh total: $((SECONDS - t0)) s"
