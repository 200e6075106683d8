#!/usr/bin/env bash
# Sets up a fresh machine for autobatch; idempotent: on a ready machine it installs nothing and
# takes seconds.
#   1. Debian packages the build needs (only the missing ones are installed).
#   2. The project's Python environment from requirements.txt (torch==2.11.0 is our LibTorch),
#      kept outside the clone (see scripts/env.sh) and keyed by a hash of requirements.txt.
#   3. The real models of scripts/export_models.py, into models/ (ignored), when that script exists.
# Variables: AUTOBATCH_VENV, AUTOBATCH_ENV_ROOT, Torch_DIR (see scripts/env.sh);
#   AUTOBATCH_SKIP_APT=1 skips step 1 (a machine where you cannot be root and have the packages).
set -euo pipefail
# shellcheck source=scripts/env.sh
. "$(dirname "${BASH_SOURCE[0]}")/env.sh"

debs=(cmake ninja-build ccache g++ python3-venv libspdlog-dev libfmt-dev libcxxopts-dev libgtest-dev
      libgmock-dev nlohmann-json3-dev zlib1g-dev clang-14 libclang-rt-14-dev clang-format clang-tidy)

install_debs() {
  local missing=()
  for p in "${debs[@]}"; do
    dpkg-query -W -f='${Status}' "$p" 2>/dev/null | grep -q 'install ok installed' || missing+=("$p")
  done
  [ ${#missing[@]} -eq 0 ] && { echo "bootstrap: Debian packages present"; return; }
  echo "bootstrap: installing Debian packages (a minute or two): ${missing[*]}"
  local sudo=""
  [ "$(id -u)" -eq 0 ] || sudo="sudo"
  $sudo apt-get update -qq
  DEBIAN_FRONTEND=noninteractive $sudo apt-get install -y -qq --no-install-recommends "${missing[@]}"
}

install_venv() {
  if [ -f "$AUTOBATCH_VENV/.autobatch-complete" ]; then
    echo "bootstrap: Python environment ready at $AUTOBATCH_VENV"
    return
  fi
  # The marker is written last, so an interrupted install is never taken as ready: start over.
  rm -rf "$AUTOBATCH_VENV"
  mkdir -p "$(dirname "$AUTOBATCH_VENV")"
  echo "bootstrap: creating the Python environment at $AUTOBATCH_VENV"
  python3 -m venv "$AUTOBATCH_VENV"
  # pip's own lines show the progress (Collecting, Downloading NAME (SIZE), Installing); its bars
  # only on a terminal, so a log gets one line per package.
  local bar=off
  [ -t 1 ] && bar=on
  "$AUTOBATCH_PYTHON" -m pip install -q --upgrade pip
  echo "bootstrap: pip install -r requirements.txt: torch 2.11.0 with its CUDA libraries, about" \
       "5 GB to download and unpack: 1 to 3 minutes on a fresh machine"
  "$AUTOBATCH_PYTHON" -m pip install --progress-bar "$bar" -r "$AUTOBATCH_ROOT/requirements.txt"
  touch "$AUTOBATCH_VENV/.autobatch-complete"
}

t0=$SECONDS
[ "${AUTOBATCH_SKIP_APT:-0}" = 1 ] || autobatch_timed "bootstrap: Debian packages" install_debs
autobatch_timed "bootstrap: Python environment" install_venv
# The export scripts and the environment decide the models: when none of them changed since the
# last complete export, skip Python altogether (importing torch alone takes seconds).
export_models() {
  local models="$AUTOBATCH_ROOT/models" stamp
  # the export's code: the modules of the _export subpackage (autobatch_export.SOURCES)
  stamp="$(cat "$AUTOBATCH_ROOT/scripts/export_models.py" "$AUTOBATCH_ROOT/scripts/autobatch_export.py" \
           "$AUTOBATCH_ROOT"/src/python/autobatch/_export/*.py \
           "$AUTOBATCH_ROOT/requirements.txt" | sha256sum | cut -c1-16)"
  if [ "$(cat "$models/.complete" 2>/dev/null)" = "$stamp" ]; then
    echo "bootstrap: models ready in $models"
    return
  fi
  echo "bootstrap: exporting the real models into $models (seconds each)"
  "$AUTOBATCH_PYTHON" "$AUTOBATCH_ROOT/scripts/export_models.py" --out "$models"
  echo "$stamp" >"$models/.complete"
}
autobatch_timed "bootstrap: models" export_models
echo "[time] bootstrap total: $((SECONDS - t0)) s"
